"""Equal-loss speed-up and Δ at equal FLOPs against finished baselines, on synthetic runs with
known answers; the H100 case of 2026-11-25, where the mid-curve method printed 1.73x."""

import json
import os
import re
import shlex

import numpy as np
import pytest

from tests.fixtures.brought_back import write_point
from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import configlib, errors, fileio
from tst_jax.analysis.frontier import Frontier
from tst_jax.rundir import RunDir
from tst_jax.tools import arms as arms_lib, compare, sweep
from tst_jax.tools.eval_curve import load_run
from tst_jax.config import plan as plan_lib, record as record_lib, spec as spec_lib
from tst_jax.run import metrics as metrics_lib


def _fake_run(path, config, evals, train_tokens=None, plan=None):
  """A run directory as main.py left it before it wrote plan.json: config.json, eval lines of
  metrics.jsonl, (step, eval_loss) or (step, eval_loss, {more fields}), and, with
  `train_tokens`, the store.json that names its store's training tokens; with `plan`, also
  the plan.json of that plan, as main.py leaves it now."""
  path.mkdir()
  (path / "config.json").write_text(config.to_json_best_effort())
  if plan is not None:
    record_lib.write_plan(RunDir(path), plan_lib.PlanRecord(plan))
  plan = plan or spec_lib.check(config).plan
  lines = []
  for step, loss, *more in evals:
    data = sum(min(max(step - p.first_step, 0), p.steps) * p.data_tokens_per_step
               for p in plan.phases)
    lines.append(json.dumps(dict(step=step, phase=plan.phase_at(step - 1).name, eval_loss=loss,
                                 data_tokens=data, equivalent_tokens=0, **dict(*more))))
  (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  fileio.write_json(str(path / "summary.json"),
                    metrics_lib.summarize(RunDir(path), plan, evals[-1][1], write=False))
  if train_tokens:
    (path / "store.json").write_text(json.dumps(dict(fingerprint="f", directory="gone",
                                                     train_tokens=train_tokens)))
  return str(path), plan


# The H100 case (../shared/gpu/2026-11-25-h100.md, configs/gpu_small.py, seed 0): baselines of
# 2k, 3k and 4k steps end at 1.9132, 1.7812 and 1.7372; the 4k run's curve is at 2.0106 at
# 2k steps' FLOPs (its learning rate not yet decayed). Here in tenths of the steps.
H100_BASELINES = {20: [(10, 2.45), (20, 1.9132)],
                  30: [(10, 2.46), (20, 2.0300), (30, 1.7812)],
                  40: [(10, 2.47), (20, 2.0106), (30, 1.9300), (40, 1.7372)]}
H100_ARMS = {"tst": (4, 1.8729), "s2": (2, 1.8330), "s16": (16, 1.9132), "r1.0": (4, 4.0264)}


def _h100_runs(tmp_path):
  runs = []
  for steps, evals in H100_BASELINES.items():
    name = "baseline" if steps == 20 else f"baseline+{steps // 10}k"
    path, _ = _fake_run(tmp_path / name, tiny_config(steps=steps, ratio=0.0), evals)
    runs.append((name, 0, load_run(path)))
  for arm, (bag, final) in H100_ARMS.items():
    ratio = 1.0 if arm == "r1.0" else 0.3
    path, _ = _fake_run(tmp_path / arm, tiny_config(steps=20, ratio=ratio, bag_size=bag),
                        [(10, 4.5), (20, final)])
    runs.append((arm, 0, load_run(path)))
  return runs


def test_h100_case_speedup_against_finished_baselines_not_the_long_curve(tmp_path):
  runs = _h100_runs(tmp_path)
  arms, per_run, notes = arms_lib.summarize_arms(runs, order=["baseline", "tst"])
  arms = {a["arm"]: a for a in arms}
  tst = arms["tst"]
  # 1.8729 is 30.5% of the way from 1.9132 (2k) to 1.7812 (3k) in loss: in log FLOPs,
  # 2k x 1.5^0.305 = 2.264k steps' FLOPs (a line in FLOPs would give 2.305k, 1.15x).
  assert tst["speedup"]["mean"] == pytest.approx(2 * 1.5 ** (0.0403 / 0.132) / 2, abs=0.001)
  assert tst["speedup"]["mean"] == pytest.approx(1.13, abs=0.01)
  assert tst["delta_equal_flops"]["mean"] == pytest.approx(-0.040, abs=0.001)
  assert arms["s2"]["speedup"]["mean"] == pytest.approx(1.28, abs=0.01)
  assert arms_lib.speedup_text(arms["baseline"]) == "1.00x (a baseline)"
  assert {r["run"]: r["speedup"] for r in per_run}["baseline"] == 1.0
  assert arms_lib.speedup_text(arms["s16"]) == "≤ 1.00x (1 seed)"   # equal to the 2k baseline
  assert arms_lib.speedup_text(arms["r1.0"]) == "≤ 1.00x (1 seed)"
  assert notes == []
  # The naive method disagrees: on baseline+4k's curve (undecayed at 2k steps) 1.8729 is
  # reached at 32.96 of 40 steps, "1.65x".
  long = next(run for arm, _, run in runs if arm == "baseline+4k")
  naive = np.interp(-1.8729, -long.loss, long.steps) / 20
  assert naive > 1.6
  table = arms_lib.format_arms(list(arms.values()), per_run)
  tst_rows = [line for line in table.splitlines() if line.startswith("| tst |")]
  assert len(tst_rows) == 2
  for line in tst_rows:       # no speed-up above 1.25x anywhere in tst's rows
    assert _speedups(line.split("|")[-2]) and max(_speedups(line.split("|")[-2])) <= 1.25
  assert "1.13x (1 seed)" in tst_rows[0] and "-0.0403" in tst_rows[0]
  # Three lengths: the power law through them is a second estimate, within 10% here.
  tst_run = next(r for r in per_run if r["run"] == "tst")
  assert tst_run["speedup_fit"] == pytest.approx(1.10, abs=0.01) and not tst_run["warnings"]
  # The same through the compare command's table and JSON.
  out = tmp_path / "out"
  assert compare.main(["--runs", ",".join(run.workdir for _, _, run in runs),
                       "--out", str(out)]) == 0
  rows = {r["run"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
  assert rows["tst"]["speedup"] == pytest.approx(1.132, abs=0.005)
  assert rows["tst"]["delta_equal_flops"] == pytest.approx(-0.0403, abs=0.0005)
  assert rows["baseline"]["speedup_text"] == "1.00x"
  line = next(l for l in (out / "compare.md").read_text().splitlines()
              if l.startswith("| tst |"))
  assert max(_speedups(line.split("|")[-3])) <= 1.25 and "1.13x" in line   # the speed-up cell


def _speedups(text: str) -> list[float]:
  """Every number of a speed-up cell: '1.30 ± 0.01x [1.29, 1.31] (2 seeds)' -> 1.30, 0.01,
  1.29, 1.31 (not the seed count)."""
  return [float(x) for x in re.findall(r"\d+\.\d+", text)]


def test_unfinished_runs_and_non_finite_losses_are_not_compared(tmp_path):
  short, _ = _fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0), [(4, 5.0), (8, 4.0)])
  cut, _ = _fake_run(tmp_path / "b16", tiny_config(steps=16, ratio=0.0), [(4, 5.0), (8, 4.2)])
  with pytest.raises(ValueError, match="unfinished .*step 8 of 16"):
    load_run(cut)
  nan, _ = _fake_run(tmp_path / "nan", tiny_config(steps=8, ratio=0.5), [(4, 6.0), (8, "NaN")])
  long, _ = _fake_run(tmp_path / "b12", tiny_config(steps=12, ratio=0.0), [(4, 5.0), (12, 3.0)])
  runs = [load_run(d) for d in (short, long, nan)]
  rows = {r["run"]: r for r in compare.compare(runs)[0]}
  assert rows["nan"]["speedup"] is None and rows["nan"]["delta_equal_flops"] is None
  assert rows["nan"]["speedup_text"] == "its final loss is not finite"
  f = Frontier.of([(8.0, 4.0, "a"), (12.0, float("nan"), "b"), (16.0, 3.0, "c")])
  assert f.names == ["a", "c"] and f.dropped[0][2:] == ("b", "")


def test_one_baseline_length_at_equal_flops_gives_a_bound_and_the_arms_to_add_name_lengths(
    tmp_path):
  """The synthetic H100 pair: TST below its one equal-FLOPs baseline is more than 1x."""
  runs = [r for r in _h100_runs(tmp_path) if r[0] in ("baseline", "tst")]
  arms, _, _ = arms_lib.summarize_arms(runs)
  tst = {a["arm"]: a for a in arms}["tst"]
  assert tst["delta_equal_flops"]["mean"] == pytest.approx(-0.0403)
  assert arms_lib.speedup_text(tst) == "> 1.00x (1 seed)"
  assert compare.lengths_to_add(2000) == ["baseline+3k", "baseline+4k"]
  assert compare.lengths_to_add(300) == ["baseline+0.45k", "baseline+0.6k"]


def test_over_seeds_mean_sd_and_bounds(tmp_path):
  # Per seed baselines of 8 and 16 steps; tst ends at 3.5 (seed 0) and 3.4 (seed 1).
  base = {0: {8: 4.0, 16: 3.0}, 1: {8: 4.2, 16: 3.2}}
  finals = {"tst": {0: 3.5, 1: 3.4}, "best": {0: 2.0, 1: 4.5}}
  runs = []
  for seed, by_steps in base.items():
    for steps, final in by_steps.items():
      path, _ = _fake_run(tmp_path / f"b{steps}s{seed}", tiny_config(steps=steps, ratio=0.0),
                          [(4, 5.0), (steps, final)])
      runs.append(("baseline" if steps == 8 else "baseline+16", seed, load_run(path)))
  for arm, by_seed in finals.items():
    for seed, final in by_seed.items():
      path, _ = _fake_run(tmp_path / f"{arm}{seed}", tiny_config(steps=8, ratio=0.5),
                          [(4, 6.0), (8, final)])
      runs.append((arm, seed, load_run(path)))
  arms, per_run, _ = arms_lib.summarize_arms(runs)
  arms = {a["arm"]: a for a in arms}
  # Seed 0: 3.5 is halfway from 4.0 (8 steps) to 3.0 (16): in log FLOPs 8 x 2^0.5 steps,
  # 1.414x. Seed 1: 3.4 is 80% of the way from 4.2 to 3.2: 2^0.8 = 1.741x. Δ at 8 steps:
  # -0.5 and -0.8.
  low, high = 2 ** 0.5, 2 ** 0.8
  assert arms["tst"]["speedup"] == pytest.approx(
      dict(mean=(low + high) / 2, sd=(high - low) / 2**0.5, min=low, max=high, n=2))
  assert arms["tst"]["delta_equal_flops"] == pytest.approx(
      dict(mean=-0.65, sd=0.3 / 2**0.5, min=-0.8, max=-0.5, n=2))
  assert arms_lib.speedup_text(arms["tst"]) == "1.58 ± 0.23x [1.41, 1.74] (2 seeds)"
  # The paired Δ's standard error: sd / sqrt(n) = (0.3 / sqrt 2) / sqrt 2 = 0.15.
  assert arms_lib.delta_text(arms["tst"]) == "-0.6500 ± 0.2121 [-0.8000, -0.5000] (se 0.1500)"
  # best: seed 0 below the 16-step baseline (> 2x), seed 1 above the 8-step one (≤ 1x).
  assert arms_lib.speedup_text(arms["best"]) == "≤ 1.00x (1 seed), > 2.00x (1 seed)"
  assert arms_lib.speedup_text(arms["baseline+16"]) == "1.00x (a baseline)"
  table = arms_lib.format_arms(list(arms.values()), per_run)
  assert "| tst | 0.5 | 2 | 8 |" in table and "3.4500 ± 0.0707 [3.4000, 3.5000]" in table


def test_a_longer_baseline_that_ends_higher_is_left_out_and_named(tmp_path):
  # The H100's C-headers corpus: 2k, 3k and 4k baselines end at 0.9305, 0.8734 and 0.9378
  # (the 4k one read its 21.8M tokens 6 times); TST (2k) ends at 0.8550, below all three.
  runs = []
  for steps, final in ((20, 0.9305), (30, 0.8734), (40, 0.9378)):
    path, _ = _fake_run(tmp_path / f"b{steps}", tiny_config(steps=steps, ratio=0.0),
                        [(10, 1.5), (steps, final)], train_tokens=427)
    runs.append(("baseline", 0, load_run(path)))
  path, _ = _fake_run(tmp_path / "tst", tiny_config(steps=20, ratio=0.3, bag_size=4),
                      [(10, 4.0), (20, 0.8550)], train_tokens=427)
  runs.append(("tst", 0, load_run(path)))
  _, per_run, notes = arms_lib.summarize_arms(runs)
  rows = {r["run"]: r for r in per_run}
  # 40 steps of 4 x 16 tokens read a 427-token store 6.0 times.
  assert rows["b40"]["passes"] == pytest.approx(40 * 64 / 427)
  assert notes == ["seed 0: b40 ends at 0.9378, above the shorter b30: left out of the "
                   "frontier (it read its training tokens 6.0 times)"]
  assert rows["b40"]["speedup"] is None and "left out" in rows["b40"]["speedup_text"]
  # Below every baseline of the frontier (20 and 30 steps): a lower bound of 30/20, not 40/20.
  assert rows["tst"]["speedup_text"] == "> 1.50x"


def test_compare_command_tables_json_and_plot(tmp_path, capsys):
  short, plan8 = _fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0),
                           [(4, 5.0), (8, 4.0, dict(eval_bpb=1.25))], train_tokens=1024)
  long, _ = _fake_run(tmp_path / "b16", tiny_config(steps=16, ratio=0.0),
                      [(4, 5.0), (8, 4.2), (12, 3.6), (16, 3.0)], train_tokens=1024)
  # TST of 8 steps (4 at S = 2 read 2x the data: 12 baseline steps' worth) ending at 3.4.
  tst, _ = _fake_run(tmp_path / "t", tiny_config(steps=8, ratio=0.5, bag_size=2),
                     [(2, 6.5, dict(eval_bag_loss=6.0)), (4, 6.0, dict(eval_bag_loss=5.5)),
                      (8, 3.4)], train_tokens=1024)
  out = tmp_path / "out"
  assert compare.main(["--runs", f"{short},{long},{tst}", "--out", str(out)]) == 0
  result = json.loads((out / "compare.json").read_text())
  rows = {r["run"]: r for r in result["rows"]}
  per_step = plan8.phases[0].flops_per_step
  assert [f["run"] for f in result["frontier"]] == ["b8", "b16"]
  # Frontier (8 steps, 4.0), (16, 3.0): 3.4 is 60% of the way, in log FLOPs at 8 x 2^0.6 =
  # 12.13 steps -> 1.52x (a line in FLOPs: 12.8 steps, 1.60x); Δ at 8 steps' FLOPs -0.6.
  assert rows["t"]["equal_loss_flops"] == pytest.approx(8 * 2 ** 0.6 * per_step)
  assert rows["t"]["speedup"] == pytest.approx(2 ** 0.6) and rows["t"]["speedup_bound"] == "="
  assert rows["t"]["delta_equal_flops"] == pytest.approx(-0.6)
  assert rows["b8"]["speedup_text"] == "1.00x" and rows["b16"]["speedup"] == 1.0
  # Equal data on b16's curve: the TST run read 4 x 4 x 32 + 4 x 4 x 16 = 768 tokens, b16's
  # 12 steps' worth, where its curve is at 3.6 (mid-run: not a speed-up).
  assert rows["t"]["data_tokens"] == 768 and rows["t"]["passes"] == pytest.approx(0.75)
  assert rows["t"]["curve"] == "b16" and rows["t"]["curve_loss_at_equal_data"] == pytest.approx(3.6)
  printed = capsys.readouterr().out
  assert "| t | 0.5 | 2 | 8 |" in printed and "| -0.6000 | 1.52x | -- |" in printed
  # Phase 1's held-out bag loss at its end, the switch; a baseline has none.
  assert rows["t"]["phase1_bag_loss"] == 5.5 and rows["b8"]["phase1_bag_loss"] is None
  assert "| 3.4000 | bytes unknown | 5.5000 | -0.6000 |" in printed
  assert "| 4.0000 | 1.2500 | -- | " in printed and rows["b8"]["final_bpb"] == 1.25
  assert "mid-run" in printed and "finished" in result["method"]
  assert (out / "compare.png").stat().st_size > 0 and (out / "compare.md").exists()


def test_rank_bpb_orders_runs_of_other_tokenizers_by_bits_per_byte(tmp_path, capsys):
  """--rank bpb: the rows lowest bits per byte first, those whose bytes are unknown last. A
  TST run of another tokenizer, which no baseline matches, is ranked too, with no Δ and no
  speed-up; compared by loss it is an error."""
  base, _ = _fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0),
                      [(4, 5.0), (8, 4.0, dict(eval_bpb=1.25))])
  other = tiny_config(steps=8, ratio=0.5, bag_size=2,
                      data=dict(tokenizer="/tok/other.json"), model=dict(vocab_size=600))
  tst, _ = _fake_run(tmp_path / "t", other, [(4, 6.0), (8, 4.4, dict(eval_bpb=1.125))])
  unknown, _ = _fake_run(tmp_path / "u", tiny_config(steps=8, ratio=0.0), [(4, 5.0), (8, 3.9)])
  out = tmp_path / "out"
  with pytest.raises(errors.DataError, match="t: no baseline among the runs matches it"):
    compare.main(["--runs", f"{base},{tst},{unknown}", "--out", str(out)])
  assert compare.main(["--runs", f"{base},{tst},{unknown}", "--out", str(out),
                       "--rank", "bpb"]) == 0
  rows = json.loads((out / "compare.json").read_text())["rows"]
  assert [r["run"] for r in rows] == ["t", "b8", "u"]
  assert rows[0]["speedup"] is None and rows[0]["delta_equal_flops"] is None
  printed = capsys.readouterr().out
  assert printed.index("| t |") < printed.index("| b8 |") < printed.index("| u |")
  assert "| 3.9000 | bytes unknown |" in printed and "| 4.4000 | 1.1250 |" in printed
  assert [r["run"] for r in compare.ranked(rows, "loss")] == ["u", "b8", "t"]


def test_runs_without_data_tokens_plot_without_a_library_warning(tmp_path, capsys):
  """Eval lines that count no data tokens leave the equal-data panel nothing to put on its log
  axis: the axis stays linear, and matplotlib prints no 'Data has no positive values' into the
  table (tests/tools/conftest.py makes any warning fail)."""
  run, _ = _fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0), [(4, 5.0), (8, 4.0)],
                     train_tokens=1024)
  metrics = tmp_path / "b8" / "metrics.jsonl"
  lines = [dict(json.loads(line), data_tokens=0) for line in metrics.read_text().splitlines()]
  metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
  assert compare.main(["--runs", run, "--out", str(tmp_path / "out")]) == 0
  err = capsys.readouterr().err
  assert "Warning" not in err and (tmp_path / "out" / "compare.png").stat().st_size > 0


def test_runs_in_a_bucket_compare_as_on_the_disk(tmp_path, bucket):
  """The same finished runs read from the emulator's bucket give the same table, written
  there by --out gs://..."""
  dirs = [_fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0), [(4, 5.0), (8, 4.0)],
                    train_tokens=1024)[0],
          _fake_run(tmp_path / "b16", tiny_config(steps=16, ratio=0.0),
                    [(4, 5.0), (8, 4.2), (12, 3.6), (16, 3.0)], train_tokens=1024)[0],
          _fake_run(tmp_path / "t", tiny_config(steps=8, ratio=0.5, bag_size=2),
                    [(4, 6.0), (8, 3.4)], train_tokens=1024)[0]]
  fs, root = fileio.filesystem(bucket)
  remote = []
  for d in dirs:
    fs.put(d + "/", f"{root}/runs/{os.path.basename(d)}", recursive=True)
    remote.append(fileio.join(bucket, "runs", os.path.basename(d)))
  here, there = str(tmp_path / "here"), fileio.join(bucket, "report")
  for runs, out in ((dirs, here), (remote, there)):
    assert compare.main(["--runs", ",".join(runs), "--out", out]) == 0
  assert fileio.listdir(there) == sorted(os.listdir(here)) == [
      "compare.json", "compare.md", "compare.png"]
  here, there = (fileio.read_json(fileio.join(o, "compare.json")) for o in (here, there))
  assert there == here and [r["run"] for r in there["rows"]] == ["b8", "b16", "t"]
  assert compare.run_names([fileio.join(bucket, "a", "t"), str(tmp_path / "b" / "t")]) == [
      "a/t", "b/t"]


def test_a_run_is_read_from_its_plan_json_not_from_its_config(tmp_path):
  """plan.json is the run's record: a config.json that would give another plan (a baseline of
  16 steps) is not read; without plan.json (a run written before it) config.json is."""
  recorded = spec_lib.check(tiny_config(steps=8, ratio=0.5, bag_size=2,
                                        tst=dict(weighting="power"))).plan
  path, _ = _fake_run(tmp_path / "t", tiny_config(steps=16, ratio=0.0), [(4, 5.0), (8, 3.5)],
                      train_tokens=1024, plan=recorded)
  run = load_run(path)
  assert run.plan == recorded and run.plan.phases[0].weighting == "power"
  assert (run.r, run.S, run.total_steps, run.is_baseline) == (0.5, 2, 8, False)
  # 4 steps of 4 x 32 tokens (S = 2), then 4 of 4 x 16, at equal FLOPs per step.
  assert run.total_data_tokens == 4 * 4 * 32 + 4 * 4 * 16
  assert run.passes == pytest.approx(768 / 1024)
  assert run.total_flops == pytest.approx(8 * recorded.phases[1].flops_per_step)
  assert run.flops_at(6) == pytest.approx(6 * recorded.phases[1].flops_per_step)
  os.remove(RunDir(path).plan)
  with pytest.raises(ValueError, match="unfinished .*step 8 of 16"):
    load_run(path)


# The paper's Table 1 (final held-out losses on DCLM; the MoE on FineWeb-Edu + DCLM): runs of
# each config arm, with its plan's FLOPs, ending at the paper's loss.
TABLE_1 = {
    "llama_3b": {"20k,baseline": 2.808, "36k,baseline": 2.677, "50k,baseline": 2.640,
                 "20k": 2.676},
    "llama_270m": {"20k,baseline": 3.212, "100k,baseline": 3.092, "20k": 3.142},
    "qwen3_moe_10b_a1b": {"baseline": 2.252, "": 2.236},
}


def _paper_runs(tmp_path, model: str) -> dict[str, str]:
  """Finished run directories of `model`'s Table 1 rows (config.json, plan.json,
  metrics.jsonl, summary.json), named by arm; plans are arithmetic, nothing is built."""
  dirs = {}
  for arm, final in TABLE_1[model].items():
    config = configlib.load_config(os.path.join(ROOT, "configs", f"{model}.py:{arm}"))
    plan = spec_lib.check(config).plan
    name = f"{model}_{arm.replace(',', '_') or 'tst'}"
    dirs[arm], _ = _fake_run(tmp_path / name, config, [(plan.total_steps // 2, final + 0.3),
                                                       (plan.total_steps, final)], plan=plan)
  return dirs


def _compare_rows(tmp_path, dirs, capsys) -> tuple[dict, str]:
  out = tmp_path / "out"
  assert compare.main(["--runs", ",".join(dirs), "--out", str(out)]) == 0
  result = json.loads((out / "compare.json").read_text())
  return {r["run"]: r for r in result["rows"]}, capsys.readouterr().out


def test_paper_table_1_at_3b_the_tst_run_matches_the_36k_baseline(tmp_path, capsys):
  dirs = _paper_runs(tmp_path, "llama_3b")
  rows, printed = _compare_rows(tmp_path, dirs.values(), capsys)
  tst = rows["llama_3b_20k"]
  # 2.676 lies 2.7% of the way from 2.677 (36k) to 2.640 (50k): 36k x (50/36)^0.027 steps.
  assert tst["speedup"] == pytest.approx(36 * (50 / 36) ** (0.001 / 0.037) / 20, abs=1e-3)
  assert tst["speedup_text"] == "1.82x" and tst["warnings"] == []
  assert tst["speedup_fit"] == pytest.approx(1.82, abs=0.05)
  assert tst["delta_equal_flops"] == pytest.approx(2.676 - 2.808)    # Table 1's Δ: -0.132
  assert "| llama_3b_20k | 0.3 | 6 | 20000 | 850E |" in printed
  # The Δ/slope model from the 20k-36k segment, s = -0.131 / ln 1.8: 1.81x, against the 1.82x
  # measured, whose equal loss lies just past the 36k baseline.
  assert tst["slope"] == pytest.approx(-0.131 / np.log(1.8))
  assert tst["speedup_predicted_text"] == "1.81x"


def test_paper_table_1_at_270m_log_flops_and_the_wide_bracket(tmp_path, capsys):
  dirs = _paper_runs(tmp_path, "llama_270m")
  rows, printed = _compare_rows(tmp_path, dirs.values(), capsys)
  tst = rows["llama_270m_20k"]
  # 3.142 is 58% of the way from 3.212 (20k) to 3.092 (100k): in log FLOPs 20k x 5^0.583 =
  # 51.1k steps, 2.56x; a line in FLOPs, the naive reading, gives 66.7k steps, 3.33x.
  naive = (20 + 80 * 0.07 / 0.12) / 20
  assert naive == pytest.approx(3.33, abs=0.01)
  assert tst["speedup"] == pytest.approx(5 ** (0.07 / 0.12), abs=1e-3) and tst["speedup"] < 2.7
  assert tst["speedup_text"] == "2.56x (see the warnings)"
  assert tst["warnings"] == ["its baselines are 5.0x apart in FLOPs, wider than 2x: train "
                             "them: the command that trained llama_270m_20k once per arm, "
                             "'baseline,45k', added to its --config's arms (c.py:2k becomes "
                             "c.py:2k,baseline,45k), each in a new --workdir, then add those "
                             "folders to --runs"]
  assert "llama_270m_20k: its baselines are 5.0x apart" in printed
  # One segment, 20k-100k: the Δ/slope model is the log-FLOPs interpolation itself.
  assert tst["speedup_predicted"] == pytest.approx(tst["speedup"])


def test_paper_table_1_at_10b_a1b_one_baseline_gives_a_lower_bound(tmp_path, capsys):
  dirs = _paper_runs(tmp_path, "qwen3_moe_10b_a1b")
  rows, printed = _compare_rows(tmp_path, dirs.values(), capsys)
  tst = rows["qwen3_moe_10b_a1b_tst"]
  assert tst["speedup_text"] == "> 2.50x" and tst["speedup_bound"] == ">"
  assert tst["speedup"] == pytest.approx(125_000 / 49_983)
  assert "| > 2.50x |" in printed and "needs baselines" not in printed
  # Its FLOPs lie below the baseline's: Δ at equal FLOPs is at most its loss minus that.
  assert tst["delta_text"] == "≤ -0.0160"


def test_a_baseline_of_another_model_is_left_out_and_named(tmp_path, capsys):
  small = _paper_runs(tmp_path, "llama_270m")
  big = _paper_runs(tmp_path, "llama_3b")
  runs = [big["20k"], big["36k,baseline"], big["50k,baseline"], small["20k,baseline"]]
  rows, printed = _compare_rows(tmp_path, runs, capsys)
  assert rows["llama_3b_20k"]["frontier"] == ["llama_3b_36k_baseline", "llama_3b_50k_baseline"]
  assert ("Note: llama_270m_20k_baseline is not a baseline of llama_3b_20k: model.dim differs "
          "(576, not 2048) and 8 more") in printed
  # One of its own baselines and two of another model: never "needs two lengths".
  rows, _ = _compare_rows(tmp_path, [big["20k"], big["50k,baseline"], small["20k,baseline"],
                                     small["100k,baseline"]], capsys)
  assert rows["llama_3b_20k"]["speedup_text"] == (
      "one matching baseline length, 2 other baselines left out (see the notes): train them: "
      "the command that trained llama_3b_20k once per arm, 'baseline,30k', 'baseline,40k', "
      "added to its --config's arms (c.py:2k becomes c.py:2k,baseline,30k), each in a new "
      "--workdir, then add those folders to --runs")
  # With no baseline of its model left, the command stops with one line.
  with pytest.raises(errors.DataError, match=r"^llama_3b_20k: no baseline among the runs "
                     r"matches it: llama_270m_20k_baseline is not a baseline of llama_3b_20k: "
                     r"model\.dim differs .* \(1 more left out\)$"):
    compare.main(["--runs", ",".join([big["20k"], small["20k,baseline"],
                                      small["100k,baseline"]]), "--out", str(tmp_path / "o")])


def test_an_equal_flops_batch_run_is_compared_by_its_own_flops(tmp_path, capsys):
  """tst.equal_flops='batch' at 270M, S = 4: phase 1 attends over L/4 positions, 21% fewer
  FLOPs per step, so the run has fewer FLOPs than the 20k baseline. Its speed-up divides by
  its own FLOPs; its Δ is a bound against the 20k baseline, which had more compute."""
  dirs = _paper_runs(tmp_path, "llama_270m")
  config = configlib.load_config(os.path.join(ROOT, "configs", "llama_270m.py:20k,s4"))
  config.tst.equal_flops = "batch"
  plan = spec_lib.check(config).plan
  tst, ntp = plan.phases
  assert 1 - tst.flops_per_step / ntp.flops_per_step == pytest.approx(0.21, abs=0.01)
  batch, _ = _fake_run(tmp_path / "batch", config, [(10_000, 3.5), (20_000, 3.15)], plan=plan)
  rows, _ = _compare_rows(tmp_path, [dirs["20k,baseline"], dirs["100k,baseline"], batch],
                          capsys)
  row = rows["batch"]
  base = next(r for r in rows.values() if r["run"] == "llama_270m_20k_baseline")
  assert row["flops"] < base["flops"] * 0.95
  assert row["delta_text"] == "≤ -0.0620" and row["delta_bound"] == "≤"
  reach = 20_000 * 5 ** (0.062 / 0.12) * ntp.flops_per_step
  assert row["speedup"] == pytest.approx(reach / plan.flops_total, rel=1e-6)
  assert row["delta_equal_flops"] is None       # not an exact Δ: the sweep's mean leaves it out
  runs = [(arm, 0, load_run(d)) for arm, d in (("baseline", dirs["20k,baseline"]),
                                                ("baseline+100k", dirs["100k,baseline"]),
                                                ("batch", batch))]
  arms, _, _ = arms_lib.summarize_arms(runs)
  assert arms_lib.delta_text({a["arm"]: a for a in arms}["batch"]) == "≤ -0.0620"


def test_a_row_the_power_law_disagrees_with_is_flagged(tmp_path):
  """tests/analysis/test_frontier.py's case as runs: baselines of 10, 20 and 80 steps."""
  runs = []
  for steps, final in ((10, 4.0), (20, 3.0), (80, 2.7)):
    path, _ = _fake_run(tmp_path / f"b{steps}", tiny_config(steps=steps, ratio=0.0),
                        [(steps, final)])
    runs.append(load_run(path))
  path, _ = _fake_run(tmp_path / "t", tiny_config(steps=10, ratio=0.5), [(10, 2.8)])
  runs.append(load_run(path))
  rows, notes = compare.compare(runs)
  row = rows[-1]
  assert row["speedup_text"] == "5.04x (see the warnings)" and compare.fit_text(row) == "3.24x"
  assert notes[0].startswith("t: its baselines are 4.0x apart in FLOPs, wider than 2x: train "
                             "them: the command that trained t once per arm, 'baseline,0.04k',")
  assert notes[1:] == [
                   "t: the power law fitted to the baselines gives 3.24x, more than 10% from "
                   "5.04x"]
  # The sweep's tables say the same in the sweep's terms: the arm to add to --arms.
  assert compare.run_row(runs[-1], compare.frontier_of(runs[:-1]))["warnings"][0].endswith(
      "wider than 2x: add --arms baseline+0.04k")



def test_the_predicted_speed_up_takes_the_slope_next_to_the_run_not_the_naive_ones(tmp_path):
  """exp(Δ / s) with s the slope of the finished baselines' final losses between the two
  lengths next to the run, toward its equal loss. Baselines of 10, 20 and 40 steps end at
  3.0, 2.7 and 2.55: slopes -0.3 / ln 2 and -0.15 / ln 2 per e-fold. The naive slopes, over
  the whole frontier or along the longest baseline's undecayed curve (3.2 at 10 steps, 2.95 at
  20), predict other speed-ups; the model's agrees with the measurement where the equal loss
  lies in the run's own segment, and parts from it where the frontier bends before it."""
  runs = []
  curves = {10: [(10, 3.0)], 20: [(10, 3.3), (20, 2.7)], 40: [(10, 3.2), (20, 2.95), (40, 2.55)]}
  for steps, evals in curves.items():
    path, _ = _fake_run(tmp_path / f"b{steps}", tiny_config(steps=steps, ratio=0.0), evals)
    runs.append(load_run(path))
  arms = {"ahead": (10, 2.85), "far_ahead": (10, 2.6), "behind": (20, 2.8)}
  for name, (steps, final) in arms.items():
    path, _ = _fake_run(tmp_path / name, tiny_config(steps=steps, ratio=0.5),
                        [(steps, final)])
    runs.append(load_run(path))
  rows = {r["run"]: r for r in compare.compare(runs)[0]}
  near, far = -0.3 / np.log(2), -0.15 / np.log(2)
  ahead = rows["ahead"]                                   # Δ = -0.15, in the first segment
  assert ahead["slope"] == pytest.approx(near) and ahead["slope_bracket"] == (
      pytest.approx(runs[0].total_flops), pytest.approx(runs[1].total_flops))
  assert ahead["speedup_predicted"] == pytest.approx(np.exp(-0.15 / near))
  assert ahead["speedup_predicted"] == pytest.approx(ahead["speedup"]) == pytest.approx(2 ** 0.5)
  naive_global = np.exp(-0.15 / ((2.55 - 3.0) / np.log(4)))
  naive_curve = np.exp(-0.15 / ((2.95 - 3.2) / np.log(2)))
  for naive in (naive_global, naive_curve):
    assert abs(naive - ahead["speedup_predicted"]) > 0.09
  far_ahead = rows["far_ahead"]          # Δ = -0.4: its equal loss lies in the flatter segment
  assert far_ahead["speedup_predicted"] == pytest.approx(np.exp(-0.4 / near))      # 2.52x
  assert far_ahead["speedup"] == pytest.approx(2 * 2 ** (0.1 / 0.15))             # 3.17x
  behind = rows["behind"]                # Δ = +0.1 at 20 steps: toward the shorter baseline
  assert behind["slope"] == pytest.approx(near) and behind["slope"] != pytest.approx(far)
  assert behind["speedup_predicted"] == pytest.approx(behind["speedup"])
  assert behind["speedup_predicted_text"] == "0.79x"
  assert all(rows[f"b{s}"]["speedup_predicted"] is None for s in curves)
  table = compare.format_table(list(rows.values()))
  assert "| -0.4328 | 1.41x |" in table and "| -0.4328 | 2.52x |" in table


def test_a_hint_is_a_command_the_user_can_run_and_nothing_lands_in_the_current_folder(
    tmp_path, capsys, monkeypatch):
  """A 1k-step TST run (--set train.steps=1000) above its one baseline of 2k ('baseline+2k'),
  made by the sweep: its row names the sweep command that trains the baselines it needs, for
  its seed, with the sweep's --set but the steps, which the arms set. compare with no --out
  prints the table and writes nothing; with --out it says where it wrote."""
  config = os.path.join(ROOT, "configs", "gpu_small.py")
  sweep_dir = tmp_path / "sweep"
  runs = []
  for arm, sets, evals in (("baseline+2k", ["data.seed=0"], {1000: 4.0, 2000: 3.5}),
                           ("tst", ["data.seed=0", "train.steps=1000"], {500: 4.2, 1000: 3.6})):
    point = sweep.Point(f"{arm.replace('+', '-')}_seed1", {}, 1, False, arm)
    path = write_point(str(sweep_dir), config, point, sets, evals)
    fileio.write_json(RunDir(path).sweep_point, dict(
        name=point.name, config=point.config_arg(config), overrides=point.overrides(sets),
        arm=arm, seed=1))
    runs.append(path)
  monkeypatch.chdir(sweep_dir)
  before = sorted(os.listdir("."))
  assert compare.main(["--runs", ",".join(runs)]) == 0
  printed = capsys.readouterr().out
  assert sorted(os.listdir(".")) == before and "nothing written: --out DIR writes" in printed
  command = (f"python -m tst_jax.tools.sweep --config {config} --workdir {sweep_dir} --arms "
             "baseline+1.5k,baseline+2k --seeds 1 --set data.seed=0")
  assert f"train them with {command}, then add their folders to --runs" in printed, printed
  # The hint runs as it is: the sweep lists the baselines it would train.
  assert sweep.main(shlex.split(command)[3:] + ["--dry_run"]) == 0
  listed = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in listed] == ["baseline-1.5k_seed1", "baseline-2k_seed1"]
  out = tmp_path / "report"
  assert compare.main(["--runs", ",".join(runs), "--out", str(out)]) == 0
  assert capsys.readouterr().out.endswith(
      f"\nwrote {out}/compare.md, {out}/compare.json, {out}/compare.png\n")
