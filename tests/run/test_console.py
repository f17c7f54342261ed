"""What a user watches: main.py's console off a terminal, and the bar on one."""

import dataclasses
import io
import json
import math
import os
import re
import subprocess
import sys

import pytest

from tst_jax.configlib import load_config
from tst_jax.rundir import RunDir
from tst_jax.run import console as console_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax import cli
from tst_jax.config import defaults, sections, spec as spec_lib
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config

CMD = [sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


@pytest.mark.slow
def test_console_off_a_terminal_is_one_line_per_log_and_no_library_logs(tmp_path):
  """The data lines, the plan table, a line per logged step (step, phase, loss, tokens/s,
  ETA), each eval, the switch and the final block, all matching metrics.jsonl and
  summary.json; stderr holds no absl/orbax INFO lines and stdout no carriage returns.
  --verbosity=0 brings the library INFO logs back."""
  workdir = tmp_path / "run"
  result = subprocess.run(CMD + ["--workdir", str(workdir)], env=ENV, capture_output=True,
                          text=True, check=True)
  out = result.stdout
  assert "\r" not in out
  assert not [l for l in result.stderr.splitlines() if re.match(r"[IW]\d{4} ", l)], result.stderr
  lines = out.splitlines()
  assert lines[0].startswith(f"data: tokenizing builtin:pystdlib into {workdir}/data")
  assert re.match(r"data: [\d,]+ training and [\d,]+ held-out tokens in ", lines[1])
  assert lines[2].startswith("parameters: ") and not any(l.startswith("{") for l in lines)
  records = workdir_lib.read_metrics(RunDir(workdir))
  train = [r for r in records if "loss" in r]
  steps = [l for l in lines if l.startswith("step ")]
  assert len(steps) == len(train) == 12
  for line, r in zip(steps, train):
    phase = "tst S=2" if r["phase"] == "tst" else "ntp"
    equiv = r" \(\S+ equiv\)" if r["phase"] == "tst" else ""   # S x fewer positions than tokens
    assert re.fullmatch(rf"step +{r['step']}/12  {phase} +loss {r['loss']:.4f}  \S+ tok/s"
                        rf"{equiv}  \d+ ms/step  ETA \d+(m\d\ds|s)", line), line   # no MFU on CPU
  evals = [r for r in records if "eval_loss" in r]
  assert [l for l in lines if l.startswith("eval ")] == [
      f"eval  step {r['step']}: held-out next-token loss {r['eval_loss']:.4f}, "
      f"{r['eval_bpb']:.4f} bits/byte"
      + (f"; held-out bag loss {r['eval_bag_loss']:.4f} (the tst S=2 task, whose floor is up "
         f"to {math.log(2):.4f}, its targets' entropy)"
         if r["phase"] == "tst" else "") for r in evals]
  assert "phase switch at step 6: restored the tst checkpoint, now ntp" in lines
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["data"] == f"builtin:pystdlib@{sys.version_info[0]}.{sys.version_info[1]}"
  final = lines[lines.index(next(l for l in lines if l.startswith("done: "))):]
  assert final[0].startswith("done: 12 steps (") and final[0].endswith(
      f"held-out loss {summary['final_eval_loss']:.4f}, {summary['final_eval_bpb']:.4f} "
      f"bits/byte (end of phase 1: {summary['phase1_end_eval_loss']:.4f}; its held-out bag loss "
      f"{summary['phase1_end_eval_bag_loss']:.4f}, whose floor is up to {math.log(2):.4f}, its "
      "targets' entropy)")
  assert summary["phase1_bag_floor"] == pytest.approx(math.log(2))
  assert final[3] == console_lib.tensorboard_line(f"{workdir}/tensorboard")
  assert "the same command resumes" in final[4]
  # Resumed (finished): one line saying so instead of the plan, then the final block.
  again = subprocess.run(CMD + ["--workdir", str(workdir), "--mode", "eval", "--verbosity=0"],
                         env=ENV, capture_output=True, text=True, check=True)
  assert json.loads(again.stdout.splitlines()[-1])["step"] == 12
  assert re.search(r"^I\d{4} .*(orbax|checkpoint)", again.stderr, re.M), again.stderr[-2000:]


def test_bar_on_a_terminal_writes_other_lines_above_it(monkeypatch):
  out = io.StringIO()
  monkeypatch.setattr(sys, "stdout", out)
  plan = spec_lib.check(tiny_config()).plan
  console = console_lib.Console(plan.total_steps, 0, bar=True)
  for step in range(1, 5):
    console.step(step, plan.phases[0], dict(loss=5.0 + step), dict(data_tokens_per_s=1e3),
                 logged=True)
  console.eval(4, {"eval_loss": 4.5, "eval_bpb": 1.25, "eval_loss/old": 4.75,
                   "eval_bag_loss": 5.25}, plan.phases[0])
  console.close()
  text = out.getvalue()
  assert ("eval  step 4: held-out next-token loss 4.5000, 1.2500 bits/byte; old 4.7500, bytes "
          "unknown; held-out bag loss 5.2500 (the tst S=2 task, whose floor is up to 0.6931, "
          "its targets' entropy)\n") in text
  assert "tst S=2" in text and "loss=9.000" in text and "4/12" in text
  assert not re.search(r"^step ", text, re.M)          # no per-step lines with a bar
  assert console_lib.duration(3725) == "1h02m" and console_lib.duration(65) == "1m05s"


def test_step_line_carries_speed_mfu_and_memory_on_one_line(capsys):
  plan = spec_lib.check(tiny_config()).plan
  console = console_lib.Console(plan.total_steps, 0, bar=False)
  speed = dict(step_s=0.25, data_tokens_per_s=2048e3, equivalent_tokens_per_s=1024e3, mfu=0.412,
               memory_bytes_in_use=12.3e9, memory_peak_bytes=14.04e9)
  console.step(4, plan.phases[0], dict(loss=5.0), speed, logged=True)
  out = capsys.readouterr().out
  assert out.count("\n") == 1
  assert re.fullmatch(r"step  4/12  tst S=2  loss 5.0000  2.0M tok/s \(1.0M equiv\)  "
                      r"250 ms/step  MFU 41.2%  mem 12.3/14.0 GB  ETA \d+s\n", out), out


def test_final_block_sets_a_measured_reference_beside_the_runs_loss(capsys):
  """The run's difference from the reference only where the run is the one it was measured
  for, on the data it was measured on: the demo's stdlib of another Python is other data, a
  run of other steps or another optimizer another run. Otherwise the block says which
  differs, and the command to measure it carries the run's own overrides but its tst."""
  console = console_lib.Console(300, 0, enabled=True, bar=False)
  config = tiny_config(steps=300)
  run = spec_lib.check(config).same_run()
  reference = sections.Reference("the equal-FLOPs baseline (r = 0)", 3.718,
                                 "docs/demo.md: 2-core CPU, 2026-11-24",
                                 "python main.py --config configs/demo.py:baseline",
                                 "builtin:pystdlib@3.11", defaults.as_written(config))
  summary = dict(steps=300, seconds_this_session=134.0, final_eval_loss=4.3882,
                 phase1_end_eval_loss=6.1232, unigram_entropy=6.421, data="builtin:pystdlib@3.11")
  head = ("  the equal-FLOPs baseline (r = 0): held-out loss 3.7180, measured for this config as "
          "written (docs/demo.md: 2-core CPU, 2026-11-24)")

  def final_lines(summary=summary, reference=reference, run=run):
    console.final(summary, RunDir("/tmp/w"), reference, run)
    return capsys.readouterr().out.splitlines()[1:3]

  assert final_lines() == [head + "; this run +0.6702 from it",
                           "  measure it: python main.py --config configs/demo.py:baseline"]
  assert final_lines(dict(summary, data="builtin:pystdlib@3.13")) == [
      head + " on other data, builtin:pystdlib@3.11; this run read builtin:pystdlib@3.13: no "
      "difference printed",
      "  measure it on this data: python main.py --config configs/demo.py:baseline"]
  assert final_lines(reference=dataclasses.replace(reference, data="")) == [
      head + " on data it does not name (config.reference.data): no difference printed",
      "  measure it on this data: python main.py --config configs/demo.py:baseline"]
  other = tiny_config(steps=20, bag_size=4, optimizer=dict(name="muon"),
                      data=dict(source="tokens:s3://b/my store"))
  assert final_lines(run=spec_lib.check(other).same_run()) == [
      head + "; this run differs in data.source 'tokens:s3://b/my store', not "
      "'builtin:pystdlib', optimizer.name 'muon', not 'adamw', train.steps 20, not 300, 1 more: "
      "no difference printed",
      "  measure it for this run: python main.py --config configs/demo.py:baseline "
      "'--config.data.source=tokens:s3://b/my store' --config.optimizer.name=muon "
      "--config.train.steps=20"]
  assert final_lines(reference=dataclasses.replace(reference, run="")) == [
      head + "; for a run it does not record (config.reference.run): no difference printed",
      "  measure it for this run: python main.py --config configs/demo.py:baseline"]
  console.final(summary, RunDir("/tmp/w"), sections.Reference("", 0.0, "", ""), run)
  assert "measure it" not in capsys.readouterr().out
  over_seeds = dataclasses.replace(reference, loss=3.7021, loss_sd=0.0432, seeds=3)
  assert final_lines(reference=over_seeds)[0] == (
      "  the equal-FLOPs baseline (r = 0): held-out loss 3.7021 ± 0.0432 (the mean and sd over "
      "3 seeds), measured for this config as written (docs/demo.md: 2-core CPU, 2026-11-24); "
      "this run +0.6861 from it")


def test_the_demo_prints_its_difference_only_as_written():
  """configs/demo.py's reference (its baseline's loss, and the baseline arm's, TST's) is for
  the config as written: --config.train.steps=20 differs in one field and its measure
  command runs the baseline at 20 steps."""
  for arg in ("", ":baseline"):
    config = load_config(os.path.join(ROOT, "configs", "demo.py") + arg)
    spec = spec_lib.check(config).on_platform()
    assert spec.reference.name and spec.reference.differences(spec.same_run()) == []
    config.train.steps = 20
    spec = spec_lib.check(config).on_platform()
    assert spec.reference.differences(spec.same_run()) == ["train.steps 20, not 300"]
    assert spec.reference.command_for(spec.same_run()).endswith(" --config.train.steps=20")


@pytest.mark.slow
def test_a_run_of_other_steps_than_its_references_prints_no_difference(tmp_path, capsys):
  """The tiny run of 4 steps with a reference measured for its 12: the block says why."""
  config = tiny_config(steps=4)
  config.reference.update(name="the baseline", loss=5.0, data="builtin:pystdlib@3.11",
                          command="python main.py --config x.py:baseline",
                          run=defaults.as_written(tiny_config(steps=12)))
  summary = cli.run(config, str(tmp_path))
  out = capsys.readouterr().out
  assert "this run differs in train.steps 4, not 12: no difference printed" in out
  assert "  measure it for this run: python main.py --config x.py:baseline "\
         "--config.train.steps=4\n" in out
  assert " from it" not in out and summary["steps"] == 4


def test_counts_read_with_si_suffixes_up_to_yotta():
  human = console_lib.human
  # The paper's 3B baseline of 36k steps: 1.53e21 FLOPs, 1.53Z (not 1.53e+03E).
  assert [human(x) for x in (1.5297e21, 8.4983e20, 7.397e21, 2.5e24)] == [
      "1.53Z", "850E", "7.4Z", "2.5Y"]
  assert [human(x) for x in (999.7e18, 999.4e18, 999.6, 1234, 0.5, None)] == [
      "1Z", "999E", "1K", "1.23K", "0.5", "--"]


def test_the_demos_reference_names_the_data_it_was_measured_on():
  """Both arms' references: Python 3.11's stdlib, the demo's data there and nowhere else."""
  for arg in ("", ":baseline"):
    reference = spec_lib.check(load_config(os.path.join(ROOT, "configs", "demo.py") + arg)
                               ).reference
    assert reference.name and reference.data == "builtin:pystdlib@3.11"


def test_the_tensorboard_hint_names_the_install_it_needs(monkeypatch):
  """No extra installs TensorBoard: where it is missing, the run's last lines say to."""
  specs = {"tensorboard": None}
  monkeypatch.setattr(console_lib.importlib.util, "find_spec", specs.get)
  assert console_lib.tensorboard_line("/r/tensorboard") == (
      "  tensorboard --logdir /r/tensorboard   (pip install tensorboard first: tst-jax writes "
      "the files, it does not show them)")
  specs["tensorboard"] = object()
  assert console_lib.tensorboard_line("/r/tensorboard") == "  tensorboard --logdir /r/tensorboard"
