"""The speed-up ladder: its arms, its end-to-end run at tiny shapes, the fitted trend, the
plan's prediction from it, and the sweep's deadline that lets it resume across calls."""

import json
import math
import os

import pytest

from tests.fixtures.brought_back import write_point
from tests.fixtures.paths import TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import fileio
from tst_jax.analysis.frontier import Frontier, Trend
from tst_jax.tools import ladder, sweep
from tst_jax.train import outlook, spec as spec_lib



def test_ladder_arms_and_their_order():
  tst, base = ladder.ladder_arms(["1k", "2k", "4k"], [1, 1.5, 2])
  assert tst == ["1k", "2k", "4k"]
  assert base == [f"baseline+{k}" for k in ("1k", "1.5k", "2k", "3k", "4k", "6k", "8k")]
  assert ladder.run_order(tst, base) == [
      "1k", "baseline+1k", "baseline+1.5k", "baseline+2k", "2k", "baseline+3k", "baseline+4k",
      "4k", "baseline+6k", "baseline+8k"]
  assert ladder.ladder_arms(["2k"], [1], "s2")[0] == ["s2+2k"]
  with pytest.raises(ValueError, match="--lengths"):
    ladder.ladder_arms(["2000"], [1])


def test_trend_fit_and_prediction_inside_its_range_only():
  points = [(0.5, 0.8, "a"), (1.0, 1.0, "b"), (2.0, 1.2, "c")]
  trend = Trend.fit(points, 1e6, "test")
  assert trend.b == pytest.approx(0.2 / math.log(2)) and trend.a == pytest.approx(1.0)
  assert trend.predict(1.0) == pytest.approx(1.0)
  assert trend.predict(math.sqrt(2)) == pytest.approx(1.1)
  assert trend.predict(0.49) is None and trend.predict(2.1) is None
  assert Trend.fit(points[:1], 1e6, "one x") is None
  assert trend.predict(1.0, 2e6) == pytest.approx(1.0) and trend.predict(1.0, 2.1e6) is None
  assert trend.predict(1.0, 0.5e6) is not None and trend.predict(1.0, 0.49e6) is None


def test_the_plan_predicts_from_the_trend_and_says_when_it_cannot(tmp_path, monkeypatch):
  plan = spec_lib.check(tiny_config(steps=12, ratio=0.5)).plan
  x = plan.tokens_per_param
  assert x == pytest.approx(12 * 4 * 16 / plan.params_active)
  trend = Trend.fit([(x / 2, 0.9, "a"), (x * 2, 1.3, "b")], plan.params_active, "test")
  path = tmp_path / "speedup_trend.json"
  path.write_text(json.dumps(trend.to_json()))
  monkeypatch.setattr(outlook, "TREND_FILE", str(path))
  outlook.measured_trend.cache_clear()
  try:
    assert Trend.load(str(path)) == trend
    text = outlook.format_plan(plan)
    assert "predicted 1.10x by the trend of 2 measured runs" in text
    assert outlook.BEHIND_WARNING not in text      # the trend says 1.10x, whatever the rule
    assert plan.ntp_tokens_per_param < outlook.PAYS_FROM_NTP_TOKENS_PER_PARAM
    behind = Trend.fit([(x / 2, 0.7, "a"), (x * 2, 0.9, "b")], plan.params_active, "test")
    assert "trend predicts 0.80x" in outlook.behind_baseline_warning(plan, behind)
    longer = spec_lib.check(tiny_config(steps=60, ratio=0.5)).plan
    assert "not predicted: outside the measured range" in outlook.format_plan(longer)
    baseline = spec_lib.check(tiny_config(steps=12, ratio=0.0)).plan
    assert "where TST pays" not in outlook.format_plan(baseline)
  finally:
    outlook.measured_trend.cache_clear()


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
  # Again: every run is finished, nothing trains, the same report.
  assert ladder.main(args) == 0
  assert "finished, skipped" in capsys.readouterr().out
  assert json.loads((tmp_path / "ladder.json").read_text())["points"] == result["points"]


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
  or says none fits."""
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
          "--plan_only", "--rate", str(plan.flops_total / 10)]
  # The next rung's missing points: the 8-step TST run and a 16-step baseline, 30 s in all
  # of FLOPs, one wave of overhead.
  need = 10 + 20 + sweep.OVERHEAD_S
  assert ladder.main(args + ["--budget_s", str(need + 1), "--parallel", "2"]) == 0
  out = capsys.readouterr().out
  result = fileio.read_json(fileio.join(work, "ladder.json"))
  (point,) = result["points"]
  frontier = Frontier.of([(4, 2.0, "b4"), (8, 1.8, "b8")])
  assert point["run"] == "0.004k_seed0"
  assert point["speedup"] == pytest.approx(frontier.equal_loss(1.9, 4).speedup)
  assert result["unfinished"] == ["0.008k_seed0", "baseline-0.016k_seed0"]
  assert f"Next call: LENGTHS=0.008k (rungs at 0.008k: 0.008k_seed0, baseline-0.016k_seed0; " \
         f"about {need:.0f} s of {need + 1:.0f})" in out
  assert ladder.main(args + ["--budget_s", str(need - 1), "--parallel", "2"]) == 0
  assert "No rung's missing points fit" in capsys.readouterr().out
