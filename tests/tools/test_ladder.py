"""The speed-up ladders: their rungs and corpora, the calls that finish them within a budget,
the named ladders' sizes, the tables and trends rebuilt from brought-back points alone (the
committed MoE points and synthetic ones), the plan's outlook from a trend, the end-to-end run
at tiny shapes, and the sweep's deadline that lets a call stop in time."""

import json
import math
import os
import pathlib
import statistics

import numpy as np
import pytest

from tests.fixtures.brought_back import write_point
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import fileio
from tst_jax.analysis.frontier import Frontier, Trend
from tst_jax.tools import ladder, ladder_plan, ladder_tables, sweep
from tst_jax.config import outlook, spec as spec_lib

DEVICE_SOURCE = "data.source=text:/opt/torch/.venv/lib/python3.12/site-packages/**/*.py"


def test_a_rung_names_its_arms_as_the_sweep_does():
  """TST arms first, then the baselines shortest first; the config's own length is left out of
  a name, so that a rung at it is the config's `tst` and `baseline`."""
  assert ladder_plan.rung_arms("2k", ("tst", "s4"), (1, 1.5, 2), 1000) == (
      ["2k", "s4+2k"], ["baseline+2k", "baseline+3k", "baseline+4k"])
  assert ladder_plan.rung_arms("1k", ("tst",), (1, 2), 1000) == (["tst"],
                                                                 ["baseline", "baseline+2k"])
  assert ladder_plan.rung_arms("4k", ("tst",), (1, 2), 1000, "400mb") == (
      ["4k+400mb"], ["baseline+4k+400mb", "baseline+8k+400mb"])
  with pytest.raises(ValueError, match="--lengths"):
    ladder_plan.rung_arms("2000", ("tst",), (1,), 1000)


def test_a_rung_gets_a_corpus_its_largest_run_reads_at_most_the_planned_passes():
  per_token = ladder_plan.BYTES_PER_TOKEN / (1 - 0.02)
  fits = 100e6 / per_token * ladder_plan.PLANNED_PASSES     # tokens 100 MB holds at the passes
  assert ladder_plan.corpus_bytes(fits * 0.99, 100e6, 0.02) == 100e6     # the config's
  size = ladder_plan.corpus_bytes(fits * 3.1, 100e6, 0.02)
  assert size == 350e6 and size % ladder_plan.CORPUS_STEP == 0
  assert fits * 3.1 / (size / per_token) <= ladder_plan.PLANNED_PASSES
  assert ladder_plan.prepare_s(100e6) == sweep.PREPARE_S
  assert ladder_plan.prepare_s(400e6) == 2 * sweep.PREPARE_S


def test_calls_fill_in_rung_order_within_the_budget_and_name_the_runs_too_long():
  """Every run costs its rung's seconds, a call 10 more: a call takes the next runs while
  they fit, a rung completes with its last run, and a run that fits no call alone is named
  with its seconds and keeps its rung from completing."""
  rungs = [ladder_plan.Rung(n, 0, (f"t{n}",), (f"b{n}x1", f"b{n}x2"), 100e6)
           for n in ("1k", "2k", "4k")]
  cost = {"1k": 20, "2k": 40, "4k": 100}
  seconds = lambda names: 10 + sum(cost[n[1:].split("_")[0].split("x")[0]] for n in names)
  missing = {p for r in rungs for p in r.points} - {"t1k_seed0"}
  calls, too_long = ladder_plan.pack_calls(rungs, missing, seconds, 95)
  assert [c.points for c in calls] == [
      ("b1kx1_seed0", "b1kx2_seed0", "t2k_seed0"), ("b2kx1_seed0", "b2kx2_seed0")]
  assert [c.seconds for c in calls] == [90, 90]
  assert [c.completes for c in calls] == [("1k seed 0",), ("2k seed 0",)]
  assert too_long == [(p, 110) for p in rungs[2].points]
  calls, too_long = ladder_plan.pack_calls(rungs, missing, seconds, 1000)
  assert len(calls) == 1 and calls[0].completes == ("1k seed 0", "2k seed 0", "4k seed 0")


def test_the_call_that_completes_the_most_rungs_is_named():
  call = lambda n, done: ladder_plan.Call(tuple(f"p{i}" for i in range(n)), 100.0,
                                         tuple(f"r{i}" for i in range(done)))
  assert ladder_plan.best_call({"moe": call(3, 1), "dense": call(1, 0)}) == "moe"
  assert ladder_plan.best_call({"moe": call(1, 0), "dense": call(1, 1)}) == "dense"
  assert ladder_plan.best_call({"moe": call(2, 1), "dense": call(3, 1)}) == "dense"
  assert ladder_plan.best_call({"moe": call(2, 1), "dense": call(2, 1)}) == "moe"
  assert ladder_plan.best_call({"moe": None, "dense": None}) is None


def test_a_delta_inside_twice_the_seed_spread_asks_for_a_second_seed():
  sd = ladder_plan.SEED_SD
  assert ladder_plan.needs_second_seed(1.9 * sd) and not ladder_plan.needs_second_seed(-2 * sd)
  assert not ladder_plan.needs_second_seed(None)
  assert ladder_plan.noise_text([sd]).startswith("within noise")
  assert ladder_plan.noise_text([-0.08]).startswith("outside noise")
  assert ladder_plan.noise_text([-0.08, -0.081]) == "2 seeds, Δ -0.0805 ± 0.0007: outside noise"
  assert ladder_plan.noise_text([0.01, -0.012]).endswith("within noise")


def test_the_named_ladders_sit_at_their_tokens_per_parameter_on_corpora_they_fit(monkeypatch):
  """moe at about 0.6, 1.2 and 2.4 tokens per active parameter, dense at 2, 4 and 8 with S = 2
  and S = 4; no run reads its rung's corpus more than the planned passes at the measured
  bytes per token; each ladder has a measured rate."""
  monkeypatch.chdir(ROOT)
  expect = {"moe": ((0.6, 1.2, 2.4), {4}), "dense": ((2, 4, 8), {2, 4})}
  for name, (spots, sizes) in expect.items():
    lad = ladder_plan.LADDERS[name]
    assert lad.rate and lad.rate > 1e13
    rungs, plans = ladder.make_rungs(lad, [0], [])
    assert len(rungs) == len(spots)
    for rung, spot in zip(rungs, spots):
      tst = rung.points[:len(rung.tst)]
      assert plans[tst[0]].tokens_per_param == pytest.approx(spot, rel=0.03), (name, rung)
      assert {plans[p].phases[0].bag_size for p in tst} == sizes
      tokens = rung.corpus_bytes / ladder_plan.BYTES_PER_TOKEN * 0.98
      most = max(plans[p].data_tokens_total for p in rung.points)
      assert most <= ladder_plan.PLANNED_PASSES * tokens, (name, rung)


# Per point of the MoE ladder but the committed one-call pair (baseline 2.4011, tst 2.4726 on
# an H200): the 1k and 2k rungs share the config's corpus and one frontier of baselines at
# 0.5k, 1k, 2k and 4k; the 4k rung has its own, on 200 MB.
MOE_LOSSES = {"baseline-0.5k_seed0": 2.60, "baseline-2k_seed0": 2.25, "2k_seed0": 2.20,
              "baseline-4k_seed0": 2.12,
              "4k-200mb_seed0": 2.095, "baseline-4k-200mb_seed0": 2.10,  # Δ -0.005: noise
              "baseline-2k-200mb_seed0": 2.26, "baseline-8k-200mb_seed0": 2.00}
ONE_CALL = "docs/gpu/2026-11-26-h200/science/runs"     # baseline 2.4011, tst 2.4726 (H200)


def test_the_tables_and_trends_are_rebuilt_from_brought_back_points_alone(tmp_path, monkeypatch,
                                                                          capsys):
  """The MoE ladder from the committed one-call points and synthetic records of every other
  run. Each TST run is measured against the baselines on its corpus: the 1k and 2k rungs share
  the config's, so their frontier holds 0.5k, 1k, 2k and 4k. Its Δ and speed-up are that
  frontier's, the predicted speed-up exp(Δ / s) of the segment next to it, the S = 4 trend the
  least-squares line through the exact ones, merged into the shipped trends. The 1k run, behind
  its own baseline, gets an exact speed-up below 1 from the half-length baseline. The 4k run,
  inside the noise, gets a second seed planned."""
  monkeypatch.chdir(ROOT)
  back = str(tmp_path / "back")
  lad = ladder_plan.LADDERS["moe"]
  rungs, plans = ladder.make_rungs(lad, [0], [DEVICE_SOURCE])
  losses = dict(MOE_LOSSES)
  for rung in rungs:
    for point in sweep.make_arm_points(list(rung.arms), [0]):
      if point.name in losses and not os.path.isdir(os.path.join(back, point.name)):
        steps = plans[point.name].total_steps
        write_point(back, lad.config, point, [DEVICE_SOURCE],
                    {steps // 2: losses[point.name] + 0.4, steps: losses[point.name]})
  losses |= {name: fileio.read_json(os.path.join(ROOT, ONE_CALL, name, "summary.json"))[
      "final_eval_loss"] for name in ("baseline_seed0", "tst_seed0")}
  assert sorted(losses) == sorted({p for r in rungs for p in r.points})
  work = tmp_path / "w"
  args = ["--ladder", "moe", "--workdir", str(work), "--plan_only", "--budget_s", "270",
          "--finished", back, "--set", DEVICE_SOURCE]
  assert ladder.main(args) == 0
  out = capsys.readouterr().out
  result = json.loads((work / "moe" / "ladder.json").read_text())
  points = {p["run"]: p for p in result["points"]}
  assert sorted(points) == sorted(r.points[0] for r in rungs)
  corpus_of = {p: r.corpus_bytes for r in rungs for p in r.points}
  exact = []
  for name, p in points.items():
    frontier = Frontier.of([(plans[b].flops_total, losses[b], b) for b in losses
                            if b.startswith("baseline") and corpus_of[b] == corpus_of[name]])
    flops = plans[name].flops_total
    delta = losses[name] - frontier.loss_at(flops)
    slope = frontier.slope_at(flops, delta)
    equal = frontier.equal_loss(losses[name], flops)
    assert p["delta_equal_flops"] == pytest.approx(delta)
    assert (p["speedup"], p["speedup_bound"]) == (pytest.approx(equal.speedup), equal.bound)
    assert p["slope"] == pytest.approx(slope.value)
    assert p["speedup_predicted"] == pytest.approx(math.exp(delta / slope.value))
    assert p["tokens_per_param"] == pytest.approx(plans[name].tokens_per_param)
    assert p["rung_done"]
    if equal.bound == "=":
      exact.append((plans[name].tokens_per_param, p["speedup"]))
  one = points["tst_seed0"]    # 2.4726: between the 0.5k (2.60) and 1k (2.4011) baselines
  tst, base = losses["tst_seed0"], losses["baseline_seed0"]
  assert one["speedup"] == pytest.approx(0.5 * 2 ** ((2.60 - tst) / (2.60 - base)))
  assert one["slope"] == pytest.approx((base - 2.60) / math.log(2))
  mid = points["2k_seed0"]     # 2.20: Δ -0.05 at 2k, equal loss before the 4k baseline
  assert mid["speedup"] == pytest.approx(2 ** (0.05 / 0.13))
  assert mid["speedup_predicted"] == pytest.approx(mid["speedup"])    # the same segment
  assert points["4k-200mb_seed0"]["speedup"] == pytest.approx(2 ** (0.005 / 0.10))
  assert points["4k-200mb_seed0"]["noise"].startswith("within noise")
  assert mid["noise"].startswith("outside noise")
  (trend,) = result["trends"]
  assert len(exact) == 3
  b, a = np.polyfit(np.log([x for x, _ in exact]), [y for _, y in exact], 1)
  assert (trend["a"], trend["b"], trend["bag_size"]) == (pytest.approx(a), pytest.approx(b), 4)
  assert trend["params_total"] > trend["params"]          # an MoE's
  shipped = json.loads((work / "speedup_trends.json").read_text())["trends"]
  assert [t["params"] for t in shipped] == [t.params for t in outlook.measured_trends()] + [
      trend["params"]]
  seed1 = [p.replace("_seed0", "_seed1") for p in rungs[2].points]
  assert result["unfinished"] == seed1
  md = (work / "moe" / "ladder.md").read_text()
  assert "Second seeds planned (a one-seed Δ inside the noise): 4k seed 1." in md
  assert "Next call: LADDER=moe POINTS=4k-200mb_seed1 (about" in out
  assert "Too long for one call of 270 s, each alone: baseline-8k-200mb_seed1 (about" in md
  assert f"| {one['slope']:+.4f} | {one['speedup_predicted_text']} | 0.78x |" in md
  assert "| 1k | tst | 4 | 0.598 | 0 | 2.4726 | +0.0715 | 0.78x |" in md   # per rung


def test_the_first_trend_is_counted_in_calls_until_rungs_finish_at_two_lengths():
  rungs = [ladder_plan.Rung(n, 0, (f"t{n}",), (f"b{n}",), 100e6) for n in ("1k", "2k", "4k")]
  call = lambda *p: ladder_plan.Call(p, 100.0, ())
  missing = {"b1k_seed0", "t2k_seed0", "b2k_seed0", "t4k_seed0", "b4k_seed0"}
  calls = [call("b1k_seed0", "t2k_seed0"), call("b2k_seed0"), call("t4k_seed0", "b4k_seed0")]
  assert ladder_plan.first_trend_calls(rungs, missing, calls) == 2
  assert ladder_plan.first_trend_calls(rungs, missing - {"b2k_seed0"}, calls) == 1
  assert ladder_plan.first_trend_calls(rungs, {"t4k_seed0"}, calls) == 0
  assert ladder_plan.first_trend_calls(rungs, missing, calls[:1]) is None
  assert "needs 2 calls of 300 s: 1-2 above" in ladder_plan.trend_text(rungs, missing, calls, 300)
  assert "needs more than these calls" in ladder_plan.trend_text(rungs, missing, [], 300)


def _point(length, seed, delta, speedup, predicted, tokens=1.2, done=True):
  return dict(length=length, arm=length, seed=seed, S=4, tokens_per_param=tokens,
              final_loss=2.0 + delta, delta_equal_flops=delta, delta_text=f"{delta:+.4f}",
              speedup_text=speedup, speedup_predicted_text=predicted, rung_done=done)


def test_a_rungs_row_holds_its_seeds_delta_as_mean_and_sd_and_each_speed_up():
  points = [_point("2k", 1, -0.031, "1.12x", "1.10x"), _point("2k", 0, -0.020, "1.08x", "1.06x"),
            _point("1k", 0, 0.0715, "≤ 1.00x", "--", tokens=0.598, done=False)]
  rows = ladder_tables.rung_rows(points)
  assert [r["length"] for r in rows] == ["1k", "2k"]
  assert rows[0]["delta_text"] == "+0.0715" and not rows[0]["finished"]
  assert rows[1]["seeds"] == [0, 1] and rows[1]["finished"]
  mean, sd = statistics.mean([-0.031, -0.020]), statistics.stdev([-0.031, -0.020])
  assert rows[1]["delta_text"] == f"{mean:+.4f} ± {sd:.4f}"
  assert rows[1]["speedup_text"] == "1.08x / 1.12x" and rows[1]["predicted_text"] == "1.06x / 1.10x"
  table = ladder_tables.format_rungs(points)
  assert "| 2k | 2k | 4 | 1.2 | 0, 1 | 1.9800 / 1.9690 | -0.0255 ± 0.0078 |" in table
  assert table.splitlines()[2].endswith("| baselines missing |")


def test_a_sweep_kept_as_its_results_json_counts_as_finished_runs(tmp_path, monkeypatch):
  """The dense ladder's 2k rung is the H100 sweep of docs/results.md, kept as its
  results.json: tst (S = 2) and s4 against baselines of 2k, 3k and 4k, 1.28x and 1.13x, the
  Δ/slope model agreeing (the equal loss lies in the 2k-3k segment). A row whose FLOPs today's
  config does not reproduce is no run of it."""
  monkeypatch.chdir(ROOT)
  lad = ladder_plan.LADDERS["dense"]
  rungs, _ = ladder.make_rungs(lad, [0], [])
  runs = ladder.finished_runs(str(tmp_path), lad, rungs)
  assert sorted(r[2].name for r in runs) == ["baseline-3k_seed0", "baseline-4k_seed0",
                                             "baseline_seed0", "s4_seed0", "tst_seed0"]
  points = {p["run"]: p for p in ladder.ladder_points(runs, rungs)[0]}
  assert points["tst_seed0"]["speedup_text"] == "1.28x"
  assert points["s4_seed0"]["speedup_text"] == "1.13x"
  for p in points.values():
    assert p["speedup_predicted"] == pytest.approx(p["speedup"], rel=1e-9)
  record = json.loads(pathlib.Path(lad.results[0]).read_text())
  for row in record["runs"]:
    row["flops"] *= 1.01
  odd = tmp_path / "results.json"
  odd.write_text(json.dumps(record))
  assert ladder.results_runs(str(odd), lad, rungs) == []


def test_a_gpu_call_refuses_points_that_do_not_fit_before_anything_runs(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(ladder, "train", lambda *a: pytest.fail("trained"))
  rungs, _ = ladder.make_rungs(ladder_plan.LADDERS["moe"], [0], [])
  longest = rungs[-1].points[-1]
  with pytest.raises(SystemExit, match=r"budget: 1 points need about \d+ s .* more than the "
                                       r"call's 270 s"):
    ladder.main(["--ladder", "moe", "--workdir", str(tmp_path), "--points", longest,
                 "--budget_s", "270"])


def test_trend_fit_prediction_and_where_it_crosses_one():
  points = [(0.5, 0.8, "a"), (1.0, 1.0, "b"), (2.0, 1.2, "c")]
  trend = Trend.fit(points, 1e6, "test", bag_size=2)
  assert trend.b == pytest.approx(0.2 / math.log(2)) and trend.a == pytest.approx(1.0)
  assert trend.predict(1.0) == pytest.approx(1.0)
  assert trend.predict(math.sqrt(2)) == pytest.approx(1.1)
  assert trend.predict(0.49) is None and trend.predict(2.1) is None
  assert trend.pays_from() == pytest.approx(1.0)
  assert Trend.fit(points[:1], 1e6, "one x") is None
  assert trend.predict(1.0, 2e6) == pytest.approx(1.0) and trend.predict(1.0, 2.1e6) is None
  assert trend.predict(1.0, 0.5e6) is not None and trend.predict(1.0, 0.49e6) is None
  assert trend.covers(1.5e6, 1.5e6, 2) and not trend.covers(1.5e6, 1.5e6, 4)
  assert not trend.covers(1.5e6, 6e6, 2)                  # an MoE: not the dense recipe's
  falling = Trend.fit([(1, 1.1, "a"), (2, 1.0, "b")], 1e6, "test")
  assert falling.pays_from() is None


def test_the_plan_says_where_a_trend_of_its_kind_expects_tst_to_pay(tmp_path, monkeypatch):
  """A trend of the plan's model and bag size predicts inside its range and says from which
  length TST pays; outside its range the plan claims nothing, neither a speed-up nor a
  warning; a trend of another bag size is not the plan's."""
  plan = spec_lib.check(tiny_config(steps=12, ratio=0.5)).plan
  x = plan.tokens_per_param
  assert x == pytest.approx(12 * 4 * 16 / plan.params_active)
  fit = lambda y0, y1, S=2: Trend.fit([(x / 2, y0, "a"), (x * 2, y1, "b")],
                                      plan.params_active, "test", S)
  trend, other_s = fit(0.9, 1.3), fit(0.5, 0.6, S=4)
  path = tmp_path / "speedup_trends.json"
  path.write_text(json.dumps(dict(trends=[other_s.to_json(), trend.to_json()])))
  monkeypatch.setattr(outlook, "TREND_FILE", str(path))
  outlook.measured_trends.cache_clear()
  try:
    assert Trend.load_all(str(path)) == [other_s, trend]
    assert outlook.trend_for(plan, outlook.measured_trends()) == trend
    text = outlook.format_plan(plan)
    pays = trend.pays_from()                          # 1.10x at x: 1x at x / 2^0.5
    assert pays == pytest.approx(x / 2 ** 0.5)
    assert (f"where TST pays: this run reads {x:.3g} tokens per parameter, where the "
            "equal-loss speed-up is predicted 1.10x by the trend of 2 measured runs") in text
    assert (f"it reaches 1x at {pays:.3g} tokens per parameter, {12 / 2 ** 0.5:,.0f} steps of "
            "this run's batch (docs/results.md)") in text
    assert outlook.BEHIND_WARNING not in text      # the trend says 1.10x, whatever the rule
    assert plan.ntp_tokens_per_param < outlook.PAYS_FROM_NTP_TOKENS_PER_PARAM
    assert "trend predicts 0.80x" in outlook.behind_baseline_warning(plan, fit(0.7, 0.9))
    short = spec_lib.check(tiny_config(steps=2, ratio=0.5)).plan     # below the range:
    text = outlook.format_plan(short)                                 # nothing claimed
    assert "not predicted: outside the measured range" in text
    assert outlook.BEHIND_WARNING not in text
    longer = spec_lib.check(tiny_config(steps=60, ratio=0.5)).plan
    text = outlook.format_plan(longer)
    assert "not predicted: outside the measured range" in text
    assert outlook.BEHIND_WARNING not in text      # past where the trend crosses 1x
    s4 = spec_lib.check(tiny_config(steps=12, ratio=0.5, bag_size=3)).plan
    assert "no measured trend of a model like this one" in outlook.format_plan(s4)
    baseline = spec_lib.check(tiny_config(steps=12, ratio=0.0)).plan
    assert "where TST pays" not in outlook.format_plan(baseline)
  finally:
    outlook.measured_trends.cache_clear()


@pytest.mark.slow
def test_ladder_end_to_end_at_tiny_shapes(tmp_path, capsys):
  """TST at 4 and 8 steps, baselines of 4, 8 and 16: the speed-ups and tokens per parameter
  in ladder.json are those of the frontier of the runs' own final losses."""
  args = ["--config", TINY_CONFIG, "--workdir", str(tmp_path), "--lengths", "0.004k,0.008k",
          "--baseline_factors", "1,2", "--set", "data.seed=0",
          "--set", "train.checkpoint_every=100"]
  assert ladder.main(args) == 0
  result = json.loads((tmp_path / "ladder.json").read_text())
  finals = {}
  for name in os.listdir(tmp_path):
    if os.path.isfile(tmp_path / name / "summary.json"):
      summary = json.loads((tmp_path / name / "summary.json").read_text())
      finals[name] = (summary["steps"], summary["final_eval_loss"])
  assert sorted(finals) == ["0.004k_seed0", "0.008k_seed0", "baseline-0.004k_seed0",
                            "baseline-0.008k_seed0", "baseline-0.016k_seed0"]
  params = spec_lib.check(tiny_config()).plan.params_active
  frontier = Frontier.of([(steps, loss, n) for n, (steps, loss) in finals.items()
                          if n.startswith("baseline")])           # every step: equal FLOPs
  points = {p["run"]: p for p in result["points"]}
  assert sorted(points) == ["0.004k_seed0", "0.008k_seed0"]
  for name, point in points.items():
    steps, loss = finals[name]
    assert point["tokens_per_param"] == pytest.approx(steps * 4 * 16 / params)
    expected = frontier.equal_loss(loss, steps)
    assert (point["speedup"], point["speedup_bound"]) == (pytest.approx(expected.speedup),
                                                          expected.bound)
    assert point["delta_equal_flops"] == pytest.approx(loss - frontier.loss_at(steps))
  assert (tmp_path / "ladder.png").stat().st_size > 0
  assert "The speed-up ladder" in capsys.readouterr().out
  # Again: a Δ this small is inside the seed noise, so the same command trains the second
  # seed of each such rung; once more, nothing trains and the report stays.
  within = [p["length"] for p in result["points"] if p["noise"].startswith("within noise")]
  assert within and "Second seeds planned" in (tmp_path / "ladder.md").read_text()
  assert ladder.main(args) == 0
  again = json.loads((tmp_path / "ladder.json").read_text())
  assert {p["length"] for p in again["points"] if p["seed"] == 1} == set(within)
  assert ladder.main(args) == 0
  assert "finished, skipped" in capsys.readouterr().out
  assert json.loads((tmp_path / "ladder.json").read_text())["points"] == again["points"]


FAKE_TRAINER = """
import signal, sys, time, pathlib
workdir = sys.argv[sys.argv.index("--workdir") + 1]
def stop(*_):
  pathlib.Path(workdir, "checkpointed").write_text("yes")
  sys.exit(0)
if "guarded" in sys.argv[0]:    # past start-up: the trainer's preemption guard is installed
  signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


@pytest.mark.parametrize("trainer", [pytest.param("guarded", marks=pytest.mark.slow), "starting"])
def test_sweep_deadline_stops_the_running_point_and_starts_no_other(trainer, tmp_path,
                                                                   monkeypatch, capsys):
  """At the deadline the running trainer gets SIGTERM: past its start-up it checkpoints and
  exits 0, before that SIGTERM ends it; either way the point is 'interrupted' (resumable),
  not failed, and the points after it do not start."""
  fake = tmp_path / f"{trainer}_main.py"
  fake.write_text(FAKE_TRAINER)
  monkeypatch.setattr(sweep.run, "_MAIN", str(fake))
  work = tmp_path / "w"
  _, spec = sweep.resolve(TINY_CONFIG, ["data.seed=0"])
  sweep.run.prepare_shared_data(str(work), spec)      # so that the deadline is the trainer's
  deadline = "8" if trainer == "guarded" else "2"    # time to install its handler, or not
  args = ["--config", TINY_CONFIG, "--workdir", str(work), "--arms", "baseline,tst",
          "--seeds", "0", "--deadline_s", deadline, "--set", "data.seed=0"]
  assert sweep.main(args) == 0
  out = capsys.readouterr().out
  assert "baseline_seed0: interrupted at the deadline" in out and "FAILED" not in out
  assert "tst_seed0: not started" in out
  assert "unfinished at the deadline: baseline_seed0, tst_seed0" in out
  assert (work / "baseline_seed0" / "checkpointed").exists() == (trainer == "guarded")
  meta = json.loads((work / "baseline_seed0" / "sweep_point.json").read_text())
  assert meta["status"] == "interrupted"


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_a_ladder_grows_from_points_brought_back_and_says_what_one_call_adds(
    where, tmp_path, capsys, request):
  """The rung at 4 steps finished on another machine (records only) is brought in, to a
  folder or a bucket: its speed-up is the frontier's of the brought-back baselines; the report
  lists the points still missing and the one call that completes the next rung in the budget,
  or the calls each missing run needs."""
  back = tmp_path / "back"
  work = (fileio.join(request.getfixturevalue("bucket"), "w") if where == "bucket"
          else str(tmp_path / "w"))
  losses = {"0.004k": 1.9, "baseline+0.004k": 2.0, "baseline+0.008k": 1.8}
  for point in sweep.make_arm_points(list(losses), [0]):
    steps = 8 if point.arm == "baseline+0.008k" else 4
    write_point(str(back), TINY_CONFIG, point, [], {steps // 2: 3.0, steps: losses[point.arm]})
  plan = spec_lib.check(tiny_config(steps=8)).plan     # the missing 8-step TST run
  args = ["--config", TINY_CONFIG, "--workdir", work, "--lengths",
          "0.004k,0.008k", "--baseline_factors", "1,2", "--finished", str(back),
          "--plan_only", "--rate", str(plan.flops_total / 10), "--parallel", "2"]
  # The next rung's missing points: the 8-step TST run and a 16-step baseline, 30 s in all
  # of FLOPs, one wave of overhead, the corpus tokenized once.
  need = 10 + 20 + sweep.OVERHEAD_S + sweep.PREPARE_S
  assert ladder.main(args + ["--budget_s", str(need + 1)]) == 0
  out = capsys.readouterr().out
  result = fileio.read_json(fileio.join(work, "ladder.json"))
  (point,) = result["points"]
  frontier = Frontier.of([(4, 2.0, "b4"), (8, 1.8, "b8")])
  assert point["run"] == "0.004k_seed0"
  assert point["speedup"] == pytest.approx(frontier.equal_loss(1.9, 4).speedup)
  assert result["unfinished"] == ["0.008k_seed0", "baseline-0.016k_seed0"]
  assert (f"Next call: POINTS=0.008k_seed0,baseline-0.016k_seed0 (about {need:.0f} s of "
          f"{need + 1:.0f}; completes 0.008k seed 0)") in out
  assert ladder.main(args + ["--budget_s", str(need - 1)]) == 0
  out = capsys.readouterr().out
  assert "1. POINTS=0.008k_seed0: about" in out and "2. POINTS=baseline-0.016k_seed0" in out
  assert "Next call: POINTS=0.008k_seed0 (about" in out
  assert ladder.main(args + ["--budget_s", "50"]) == 0
  assert "Too long for one call of 50 s, each alone: 0.008k_seed0 (about" in (
      capsys.readouterr().out)
