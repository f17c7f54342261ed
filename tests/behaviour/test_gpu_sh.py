"""benchmarks/gpu.sh, dry: with `python3` and `timeout` faked on PATH, every section runs the
commands it names, and every train-step run's config file and overrides are valid (a typo in
a field would cost a GPU session its run)."""

import importlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT
from tst_jax import configlib, platform
from tst_jax.kernels import moe_dispatch


def _dry_run(tmp_path, sections, **env):
  """The python3 calls gpu.sh makes, with python3 faked: it records its arguments and prints
  one JSON line (the table script's call aside), as each run does."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "calls.txt"
  fake = (f'printf "%q " "$@" >> {log}; echo >> {log}; cat > /dev/null; '
          'case "$*" in *--winner*) echo --config.model.dispatch_impl=gather '
          '--config.model.expert_fuse_gate_up=${@: -1}; exit;; *--table*|*--record*) exit;; '
          'esac; '
          '[ "$1" = benchmarks/gpu_table.py ] || echo \'{"fake": 1}\'')
  for name, body in (("python3", fake),
                     ("timeout", 'while [ "${1#-}" != "$1" ]; do shift 2; done; shift; '
                                 'exec "$@"')):
    path = bin_dir / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), str(tmp_path / "out"),
                  sections], check=True, capture_output=True, text=True, timeout=60,
                 env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
                          WHEELS=str(tmp_path / "no_wheels"),
                          WHEELS_PEER=str(tmp_path / "no_wheels"), **env))
  return [shlex.split(line) for line in log.read_text().splitlines() if line.strip()]


def _check_step_configs(calls):
  """Every train-step call's config file loads and takes its overrides (a typo raises)."""
  for call in calls:
    if call and call[0] == "benchmarks/step.py":
      config_file = call[call.index("--config") + 1]
      config = configlib.load_config(os.path.join(ROOT, config_file))
      overrides = [a[len("--config."):] for a in call if a.startswith("--config.")]
      configlib.apply_overrides(config, overrides)   # raises on an unknown field


def test_every_section_runs_valid_commands(tmp_path):
  calls = _dry_run(tmp_path, "all")
  scripts = [c[0] for c in calls if c and c[0] != "-"]
  assert scripts.count("benchmarks/step.py") == 9 + 2 + 6 + 2
  assert scripts.count("benchmarks/grouped_matmul.py") == 1
  assert scripts.count("benchmarks/loss_tiles.py") == 2
  _check_step_configs(calls)
  assert not any("--smoke" in c for c in calls)   # quick is not part of all
  profiles = [c for c in calls if "--profile" in c]
  assert len(profiles) == 2 and all("configs/qwen3_moe" in " ".join(c) for c in profiles)
  (gemm,) = [c for c in calls if c[0] == "benchmarks/grouped_matmul.py"]
  assert "tokamax:triton/triton/triton" in gemm[gemm.index("--backends") + 1]


@pytest.mark.parametrize("sections,steps", [("moe", 6), ("moe,profile", 8), ("gemm", 0)])
def test_a_section_runs_alone(tmp_path, sections, steps):
  calls = _dry_run(tmp_path, sections)
  assert sum(c[0] == "benchmarks/step.py" for c in calls) == steps


@pytest.mark.parametrize("script", ["gpu_small.sh", "ladder.sh", "gpu_budget.sh"])
def test_the_outer_timeout_leaves_the_sweep_its_grace(script):
  """The scripts give the sweep a deadline of LEFT seconds and kill it at LEFT + extra: at its
  deadline the sweep asks its trainers to checkpoint and waits up to GRACE_S for them, then
  writes its report, so extra must hold GRACE_S and the report; the seconds kept from the
  script's total must hold extra and the kill's own delay, then the packing. The numbers are
  benchmarks/sweep_common.sh's, which both scripts source."""
  from tst_jax.tools.sweep import run as sweep_run   # pylint: disable=import-outside-toplevel
  common = open(os.path.join(ROOT, "benchmarks", "sweep_common.sh")).read()
  kept, extra, kill = (int(re.search(rf"^{name}=(\d+)$", common, re.M).group(1))
                       for name in ("KEEP_S", "OUTER_EXTRA_S", "KILL_S"))
  assert "LEFT=$(( TOTAL_S - ($(date +%s) - START) - KEEP_S ))" in common
  text = open(os.path.join(ROOT, "benchmarks", script)).read()
  assert '. "$(dirname "$0")/sweep_common.sh"' in text and "\nsweep_left\n" in text
  assert 'timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S ))' in text
  assert "--deadline_s \"$LEFT\"" in text
  assert extra >= sweep_run.GRACE_S + 20, (extra, sweep_run.GRACE_S)
  assert kept >= extra + kill + 10, (kept, extra, kill)


@pytest.mark.parametrize("given, want", [(None, "off"), ("/tmp/kept", "/tmp/kept")])
def test_the_sweeps_run_tokamax_tables_unless_a_tuning_folder_is_named(tmp_path, given, want):
  """A bare lent machine would autotune every MoE shape before the ladder's first step: on an
  H200 (2026-11-27) that took the whole 200 s deadline. sweep_start turns tuning off, as
  gpu.sh's rows do, and keeps a folder the caller names."""
  env = {k: v for k, v in os.environ.items() if k != "TST_JAX_TOKAMAX_TUNING"}
  env.update(WHEELS=str(tmp_path / "none"), SOURCE="text:x")
  if given:
    env["TST_JAX_TOKAMAX_TUNING"] = given
  out = subprocess.run(["bash", "-c", '. benchmarks/sweep_common.sh && sweep_start "$1" && '
                        'echo "$TST_JAX_TOKAMAX_TUNING"', "-", str(tmp_path / "out")],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=True)
  assert out.stdout.strip().splitlines()[-1] == want


QUICK_ROWS = ["env", "recipe", "b10", "profile", "d270", "d270_docs", "d600", "gemm",
              "gemm_tuned"]


@pytest.mark.parametrize("tiny", [False, True])
def test_quick_runs_its_rows_in_order_each_tagged_and_bounded(tmp_path, tiny):
  """`quick` on the GPU and as the CPU dry run (TINY=1): the same calls in the same order,
  tiny shapes the one difference; every config and override valid; each run's JSON line lands
  in gpu.jsonl tagged with its row, then its exit status and bound; the table comes last."""
  calls = _dry_run(tmp_path, "quick", **({"TINY": "1"} if tiny else {}))
  scripts = [c[0] for c in calls if c[0] != "-"]
  assert scripts == ["benchmarks/step.py"] * 6 + ["benchmarks/grouped_matmul.py"] * 2 + [
      "benchmarks/gpu_table.py"]
  _check_step_configs(calls)
  steps = [c for c in calls if c[0] == "benchmarks/step.py"]
  assert [c[c.index("--config") + 1].split("/")[1] for c in steps] == [
      "qwen3_moe_gpu_small.py", "qwen3_moe_10b_a1b.py", "qwen3_moe_gpu_small.py",
      "llama_270m.py", "llama_270m.py", "llama_600m.py"]
  assert [c[c.index("--phase") + 1] for c in steps] == ["both", "ntp", "ntp", "both", "ntp",
                                                        "ntp"]
  assert all(("--config.model.dim=32" in c) == tiny for c in steps)
  assert not any("expert_impl" in a or "remat" in a for c in steps for a in c)   # defaults
  assert ["--profile" in c for c in steps] == [False, False, True, False, False, False]
  assert ["--config.data.document_mask=True" in c for c in steps] == [False] * 4 + [True, False]
  lines = [json.loads(line) for line in open(tmp_path / "out" / "gpu.jsonl")]
  assert [r["row"] for r in lines if "fake" in r] == QUICK_ROWS
  assert [r["row"] for r in lines if "rc" in r] == QUICK_ROWS
  assert all(r["rc"] == 0 and r["bound_s"] > 0 for r in lines if "rc" in r)
  assert sorted(os.listdir(tmp_path / "out")) == ["gpu.jsonl", "quick.md", "quick_log.txt"]


def test_quick_bounds_hold_the_call():
  """Each run of `quick` has a bound in seconds; with the wheels' install and the environment
  line they sum to at most QUICK_S, under the 8 minutes of one call with the table after."""
  text = open(os.path.join(ROOT, "benchmarks", "gpu.sh")).read()
  quick = text.split("if want quick; then", 1)[1].split("\nfi\n", 1)[0]
  bounds = dict(re.findall(r"^\s*bounded (\w+) (\d+) ", text.split("if want")[0] + quick,
                           re.M))
  assert set(bounds) == set(QUICK_ROWS[:-1]), bounds
  bounds["install"] = re.search(r"^INSTALL_S=(\d+)$", text, re.M).group(1)
  quick_s = int(re.search(r"QUICK_S=\$\{QUICK_S:-\$\(\( (\d+) \* SCALE", text).group(1))
  assert sum(map(int, bounds.values())) <= quick_s <= 8 * 60 - 10
  assert "limit=$(( END - t0 - 5 ))" in text   # none runs past its section's end
  assert "END=$(( $(date +%s) + QUICK_S ))" in quick
  assert 'bounded gemm_tuned "${QUICK_TUNE_S:-60}"' in text


def test_peer_runs_grug_where_its_wheels_are_then_the_torch_peer(tmp_path):
  """`peer`, alone: without ./.whl_peer only the torch peer runs; the Grug peer needs its
  wheels, and neither is part of `all` or quick."""
  calls = [c for c in _dry_run(tmp_path, "peer") if c[0] != "-"]
  assert [c[0] for c in calls] == ["benchmarks/peer_torch.py"]
  (tmp_path / "all").mkdir()
  assert not any(c[0].startswith("benchmarks/peer") for c in _dry_run(tmp_path / "all", "all"))


@pytest.mark.parametrize("tiny", [False, True])
def test_moe_lab_runs_the_lab_then_the_step_with_its_winner(tmp_path, tiny):
  """`moe_lab`: the lab (tiny shapes under TINY=1), its table into lab.md, then the recipe's
  step as the whole layer the lab found fastest, with gate and up fused and split, then the
  record of its measurements; each bounded, the bounds and the install within one call of 5
  minutes."""
  calls = [c for c in _dry_run(tmp_path, "moe_lab", **({"TINY": "1"} if tiny else {}))
           if c[0] != "-"]   # the environment's line
  assert [c[0] for c in calls] == (["benchmarks/moe_lab.py"] * 3 + ["benchmarks/step.py"]
                                   + ["benchmarks/moe_lab.py", "benchmarks/step.py"]
                                   + ["benchmarks/moe_lab.py"])
  assert ("--tiny" in calls[0]) == tiny and "--table" in calls[1]
  assert calls[2][-2:] == ["--fuse", "on"] and calls[4][-2:] == ["--fuse", "off"]
  assert calls[3][-2:] == ["--config.model.dispatch_impl=gather",
                           "--config.model.expert_fuse_gate_up=on"]
  assert calls[5][-1] == "--config.model.expert_fuse_gate_up=off"
  assert "--record" in calls[6] and calls[6][-1] == str(tmp_path / "out" / "gemm_measured.json")
  _check_step_configs(calls)
  lines = [json.loads(line) for line in open(tmp_path / "out" / "gpu.jsonl")]
  assert [r["row"] for r in lines if "rc" in r] == ["env", "lab", "lab_step_fuse_on",
                                                    "lab_step_fuse_off"]
  text = open(os.path.join(ROOT, "benchmarks", "gpu.sh")).read()
  lab = text.split("if want moe_lab; then", 1)[1].split("\nfi\n", 1)[0]
  bounds = [int(b) for b in re.findall(r"^\s*bounded \S+ (\d+) ", lab, re.M)]
  bounds[-1] *= 2   # the step's, once fused and once split
  lab_s = int(re.search(r"LAB_S=\$\{LAB_S:-\$\(\( (\d+) \* SCALE", text).group(1))
  install_s = int(re.search(r"^INSTALL_S=(\d+)$", text, re.M).group(1))
  budget = int(re.search(r"moe_lab.py --budget_s (\d+)", text).group(1))
  assert budget + 30 <= bounds[0] and sum(bounds) <= lab_s and lab_s + install_s <= 5 * 60
  assert "END=$(( $(date +%s) + LAB_S ))" in lab


@pytest.mark.parametrize("tiny", [False, True])
def test_search_runs_the_labs_bounded_search_then_records_it(tmp_path, tiny):
  """`search`, never part of `all`: the lab's tuning search of the recipe's grouped GEMM calls
  within SEARCH_S, then the record of what it found into OUT_DIR's gemm_measured.json."""
  calls = [c for c in _dry_run(tmp_path, "search", **({"TINY": "1"} if tiny else {}))
           if c[0] != "-"]
  assert [c[0] for c in calls] == ["benchmarks/moe_lab.py"] * 2
  assert "--search" in calls[0] and ("--tiny" in calls[0]) == tiny and "--record" in calls[1]
  lines = [json.loads(line) for line in open(tmp_path / "out" / "gpu.jsonl")]
  ends = {r["row"]: r for r in lines if "rc" in r}
  assert list(ends) == ["env", "search"] and ends["search"]["bound_s"] > 60
  (tmp_path / "all").mkdir()
  assert not any("--search" in c for c in _dry_run(tmp_path / "all", "all"))


@pytest.mark.slow
def test_moe_lab_runs_for_real_at_tiny_shapes_on_cpu(tmp_path):
  """The CPU dry run of `moe_lab` (TINY=1), in CI's every-extras run: the lab's rows, its table,
  the step with its winner fused and split, and the record, which finds no GPU's measurements
  to write, for real (about 3 minutes on 2 busy cores, most of it compiling)."""
  out = tmp_path / "out"
  run = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), str(out),
                        "moe_lab"], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, TINY="1", JAX_PLATFORMS="cpu",
                                XLA_FLAGS=subprocess_env.fast_compile_flags(),
                                PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"))
  assert run.returncode == 0, run.stderr[-2000:]
  lines = [json.loads(line) for line in open(out / "gpu.jsonl")]
  ends = {r["row"]: r for r in lines if "rc" in r}
  assert list(ends) == ["env", "lab", "lab_step_fuse_on", "lab_step_fuse_off"]
  assert all(r["rc"] == 0 for r in ends.values())
  lab = [r for r in lines if r.get("lab") and "ms" in r]
  assert {r["piece"] for r in lab} >= {"router", "sort", "dispatch", "combine", "experts",
                                       "layer"}
  assert {r["impl"] for r in lab if r["piece"] == "layer"} >= {"capacity/gather",
                                                               "gmm/gather+fuse_gate_up"}
  (winner,) = [r["winners"]["tiny"]["layer"] for r in lines if r.get("piece") == "winners"]
  steps = [r for r in lines if str(r.get("row")).startswith("lab_step") and "step_s" in r]
  assert "| tiny | combine | pallas |" in (out / "lab.md").read_text()
  experts, dispatch = winner.split("+")[0].split("/")
  assert dispatch in moe_dispatch.IMPLS
  assert {(s["expert_impl"], s["dispatch_impl"]) for s in steps} == {(experts, dispatch)}
  fusing = experts in platform.FUSES_GATE_UP
  assert [s["expert_fuse_gate_up"] for s in steps] == (["on", "off"] if fusing else ["off"] * 2)
  assert "nothing to record: no GPU measurements" in (out / "quick_log.txt").read_text()
  assert not (out / "gemm_measured.json").exists()


def _step(row, phase, **kw):
  return dict(dict(row=row, phase=phase, step_s=0.2, mfu=0.2, compile_s=20.0,
                   peak_bytes_in_use=20e9, expert_impl="gmm", remat="save_experts"), **kw)


def test_the_quick_table_has_a_row_per_run_and_says_what_did_not_finish():
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  gpu_table = importlib.import_module("gpu_table")
  profile = dict(step_ms=200.0, ms_per_step={"dispatch+combine": 30.0, "matmul forward": 40.0,
                                             "matmul backward": 60.0, "other ops": 50.0})
  lines = [dict(row="env", env=True), _step("recipe", "tst"), _step("recipe", "ntp", mfu=0.26),
           dict(row="recipe", rc=0, wall_s=70, bound_s=110),
           _step("profile", "ntp", profile=profile),
           dict(row="b10", rc=124, wall_s=80, bound_s=80),
           dict(row="gemm", backend="tokamax", fwd_bwd_ms=10.0, fwd_bwd_tflops=500.0,
                fwd_bwd_of_peak=0.505, compile_s=3.0, rows=131009, kernels="forward mosaic"),
           dict(row="gemm_tuned", skipped="no time left of QUICK_S=470")]
  text = gpu_table.table(lines)
  rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
  assert len(rows) == 1 + 4
  assert "| 0.200 | 20.0% | 20.0 | 20.0 |" in rows[1] and rows[1].endswith(">= 25%: missed |")
  assert rows[2].endswith(">= 25%: met |")
  assert "dispatch+combine 15.0%, matmuls 50.0%" in rows[3] and "<= 10%: missed" in rows[3]
  assert "50.5% of peak" in rows[4] and ">= 50%: met" in rows[4]
  assert "- b10: timed out after 80 s of its 80 s" in text
  assert "- gemm_tuned: skipped, no time left" in text
  assert text.splitlines()[-1] == "2 runs, 150 s in all"


@pytest.mark.slow
def test_quick_runs_for_real_at_tiny_shapes_on_cpu(tmp_path):
  """The CPU dry run of `quick`: the real commands at tiny shapes (TINY=1), each writing its
  JSON line (the tokamax rows say it is not installed), and the table last (minutes on CPU)."""
  out = tmp_path / "out"
  run = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), str(out), "quick"],
                       capture_output=True, text=True, timeout=1800,
                       env=dict(os.environ, TINY="1", JAX_PLATFORMS="cpu",   # one device
                                XLA_FLAGS=subprocess_env.fast_compile_flags(),
                                PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"))
  assert run.returncode == 0, run.stderr[-2000:]
  lines = [json.loads(line) for line in open(out / "gpu.jsonl")]
  ends = {r["row"]: r for r in lines if "rc" in r}
  assert list(ends) == QUICK_ROWS and all(r["rc"] == 0 for r in ends.values()), ends
  timed = [(r["row"], r["phase"]) for r in lines if "step_s" in r]
  assert timed == [("recipe", "tst"), ("recipe", "ntp"), ("b10", "ntp"), ("profile", "ntp"),
                   ("d270", "tst"), ("d270", "ntp"), ("d270_docs", "ntp"), ("d600", "ntp")]
  assert [r for r in lines if r.get("row") == "profile" and "profile" in r]
  assert [r["backend"] for r in lines if r.get("row") == "gemm" and "backend" in r] == [
      "xla", "tokamax"]
  table = run.stdout.split("| row |", 1)[1]
  assert table.count("\n| ") == 8 + 3 and (out / "quick.md").exists()   # steps, GEMMs


def test_gpu_small_refuses_arms_that_cannot_finish_in_its_budget(tmp_path):
  """gpu_small.sh at 1000 FLOP/s: the tiny arms' plan FLOPs need far more than the call's
  seconds, so it stops before any corpus or training with one line that names the rate."""
  run = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_small.sh"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CONFIG="tests/fixtures/tiny_config.py",
                                ARMS="baseline,tst", RATE="1000", TOTAL_S="300",
                                WORKDIR=str(tmp_path / "w"), SOURCE="builtin:pystdlib",
                                WHEELS=str(tmp_path / "no_wheels"),
                                PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"))
  assert run.returncode == 2, run.stderr[-2000:]
  (line,) = [x for x in run.stderr.splitlines() if x.strip()]
  assert line.startswith("budget: 2 of 2 points to train") and "at an assumed 1e+03 FLOP/s" in line
  assert "ask fewer arms or seeds, or more time" in line
  assert not os.path.exists(tmp_path / "w") or not any(
      n.startswith("data_") for n in os.listdir(tmp_path / "w"))
  assert "sweep:" not in run.stdout


@pytest.mark.slow
def test_ladder_sh_plan_only_names_the_call_that_adds_the_most(tmp_path):
  """`ladder.sh --plan_only` on a machine with no GPU: every named ladder's report from its
  finished points and the one call that adds the most, at the measured rates; a GPU call that
  names no ladder is refused."""
  env = dict(os.environ, WORKDIR=str(tmp_path / "w"), WHEELS=str(tmp_path / "no_wheels"),
             PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
  script = os.path.join(ROOT, "benchmarks", "ladder.sh")
  out = subprocess.run(["bash", script, "--plan_only", str(tmp_path / "out")], env=env,
                       check=True, capture_output=True, text=True, timeout=300).stdout
  assert re.search(r"Next call: LADDER=moe POINTS=baseline-0\.5k_seed0,baseline-2k_seed0,"
                   r"2k_seed0 \(about \d+ s of \d+; completes 1k seed 0\)", out)
  assert sorted(os.listdir(tmp_path / "out")) == sorted(
      [f"{n}_ladder.{x}" for n in ("moe", "dense") for x in ("md", "json", "png")]
      + ["env.json", "ladder.txt"])
  refused = subprocess.run(["bash", script, str(tmp_path / "out2")], env=env,
                           capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2 and "a GPU call names its ladder" in refused.stderr


def test_the_labs_step_is_its_fastest_whole_layer_not_its_fastest_piece():
  """On an H200 (2026-11-27, twice) the dispatch fastest alone (unrolled) made the step slower
  (0.267 against 0.180 s), and gate and up fused made the layer 22% faster: the step the lab
  runs is its fastest whole layer's expert_impl and dispatch, fused or split as asked, or as
  the layer was. Without layer rows, the fastest dispatch alone."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    moe_lab = importlib.import_module("moe_lab")
  finally:
    sys.path.pop(0)
  row = lambda piece, impl, ms: dict(lab=True, shape="recipe", piece=piece, impl=impl,
                                     mode="fwd_bwd", ms=ms)
  rows = [row("dispatch", "unrolled", 1.32), row("combine", "unrolled", 0.55),
          row("dispatch", "pallas", 1.60), row("combine", "pallas", 0.84),
          row("layer", "gmm/pallas", 11.49), row("layer", "gmm/pallas+fuse_gate_up", 8.98),
          row("layer", "capacity/pallas", 9.40)]
  found = moe_lab.winners(rows)
  assert found["recipe"]["dispatch"] == "unrolled"
  assert found["recipe"]["layer"] == "gmm/pallas+fuse_gate_up"
  assert moe_lab.step_args(found) == ("--config.model.expert_impl=gmm --config.model."
                                      "dispatch_impl=pallas --config.model.expert_fuse_gate_up="
                                      "on")
  assert moe_lab.step_args(found, "off").endswith("expert_fuse_gate_up=off")
  blocked = moe_lab.winners(rows[:4] + [row("layer", "blocked/pallas", 5.0)])
  assert moe_lab.step_args(blocked, "on").endswith("expert_impl=blocked --config.model."
                                                   "dispatch_impl=pallas --config.model."
                                                   "expert_fuse_gate_up=off")
  no_layers = moe_lab.winners(rows[:4])
  assert moe_lab.step_args(no_layers) == "--config.model.dispatch_impl=unrolled"
  assert moe_lab.step_args({}) == "--config.model.dispatch_impl=gather"
