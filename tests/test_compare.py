"""Equal-FLOPs / equal-data / equal-loss comparisons on synthetic eval curves with known answers."""

import json

import numpy as np
import pytest

from tests.tiny import tiny_config
from tst_jax.tools import compare
from tst_jax.train import spec as spec_lib


def _fake_run(path, config, evals):
  """A run directory as main.py leaves it: config.json and eval lines of metrics.jsonl."""
  path.mkdir()
  (path / "config.json").write_text(config.to_json_best_effort())
  plan = spec_lib.check(config).plan
  lines = []
  for step, loss in evals:
    data = sum(min(max(step - p.first_step, 0), p.steps) * p.data_tokens_per_step
               for p in plan.phases)
    lines.append(json.dumps(dict(step=step, phase=plan.phase_at(step - 1).name, eval_loss=loss,
                                 data_tokens=data, equivalent_tokens=0)))
  (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  return str(path), plan


def test_crossing_interpolates_linearly():
  x, y = np.array([4.0, 8, 12, 16]), np.array([5.0, 4, 3, 2.5])
  assert compare.crossing(x, y, 3.5) == (10.0, "")
  assert compare.crossing(x, y, 3.0) == (12.0, "")
  assert compare.crossing(x, y, 2.0) == (None, "not reached")
  assert compare.crossing(x, y, 6.0) == (4.0, "at or before the first eval")
  # The first crossing counts, even if the curve goes back up later.
  assert compare.crossing(x, np.array([5.0, 3, 4, 2]), 3.5) == (7.0, "")


def test_equal_loss_speedup_on_known_curves(tmp_path, capsys):
  # Baseline: 16 steps, eval every 4 steps, loss 5, 4, 3, 2.5.
  base_dir, base_plan = _fake_run(tmp_path / "base", tiny_config(steps=16, ratio=0.0),
                                  [(4, 5.0), (8, 4.0), (12, 3.0), (16, 2.5)])
  # TST run of 8 steps (4 TST + 4 NTP) ending at 3.5: the baseline needs 10 steps
  # (halfway between its evals at 8 and 12), a 1.25x speedup in steps and FLOPs.
  tst_dir, tst_plan = _fake_run(tmp_path / "tst", tiny_config(steps=8, ratio=0.5, bag_size=4),
                                [(4, 6.0), (8, 3.5)])
  # A run better than the baseline ever gets: not reached, speedup > 16/8.
  best_dir, _ = _fake_run(tmp_path / "best", tiny_config(steps=8, ratio=0.5, bag_size=2),
                          [(4, 6.0), (8, 2.0)])
  out = tmp_path / "out"
  assert compare.main(["--runs", f"{tst_dir},{best_dir}", "--baseline", base_dir,
                       "--out", str(out)]) == 0
  result = json.loads((out / "compare.json").read_text())
  assert result["baseline"] == "base"
  tst, best = result["rows"]
  per_step = base_plan.phases[0].flops_per_step
  assert tst_plan.phases[0].flops_per_step == per_step          # equal FLOPs per step
  assert tst["baseline_steps_to_equal_loss"] == pytest.approx(10.0)
  assert tst["baseline_flops_to_equal_loss"] == pytest.approx(10 * per_step)
  assert tst["speedup_steps"] == pytest.approx(1.25)
  assert tst["speedup_flops"] == pytest.approx(1.25)
  # Equal FLOPs: the baseline had 4.0 at 8 steps' FLOPs. Equal data: the TST run read
  # 4 steps x 4 rows x 64 tokens + 4 x 4 x 16 = 20 baseline steps' worth: not covered.
  assert tst["baseline_loss_at_equal_flops"] == pytest.approx(4.0)
  assert tst["data_tokens"] == 4 * 4 * 64 + 4 * 4 * 16
  assert tst["baseline_loss_at_equal_data"] is None
  assert (tst["r"], tst["S"]) == (0.5, 4)
  assert best["baseline_steps_to_equal_loss"] is None
  assert best["speedup_lower_bound"] == pytest.approx(2.0)
  printed = capsys.readouterr().out
  assert "not reached in 16 steps" in printed and "1.25x steps, 1.25x FLOPs" in printed
  assert (out / "compare.png").stat().st_size > 0 and (out / "compare.md").exists()


def test_equal_data_and_the_baseline_frontier(tmp_path):
  # Two baselines of 8 and 16 steps (final losses 4.0 and 3.0), a TST run of 8 steps
  # (S = 2 doubles the data of its 4 TST steps: 12 steps' worth) ending at 3.4.
  short, plan8 = _fake_run(tmp_path / "b8", tiny_config(steps=8, ratio=0.0),
                           [(4, 5.0), (8, 4.0)])
  long, _ = _fake_run(tmp_path / "b16", tiny_config(steps=16, ratio=0.0),
                      [(4, 5.0), (8, 4.2), (12, 3.6), (16, 3.0)])
  tst, _ = _fake_run(tmp_path / "t", tiny_config(steps=8, ratio=0.5, bag_size=2),
                     [(4, 6.0), (8, 3.4)])
  runs = [compare.load_run(d) for d in (long, short, tst)]
  rows = compare.compare(runs, runs[0])
  row = {r["run"]: r for r in rows}["t"]
  assert row["baseline_loss_at_equal_data"] == pytest.approx(3.6)     # b16 at 12 steps
  # Frontier of final losses: (8 steps, 4.0), (16 steps, 3.0) -> 3.4 at 12.8 steps.
  assert row["frontier_flops_to_equal_loss"] == pytest.approx(
      12.8 * plan8.phases[0].flops_per_step)
  assert row["frontier_speedup_flops"] == pytest.approx(12.8 / 8)


def test_arms_mean_spread_and_equal_loss_speedup_over_seeds(tmp_path):
  # Per seed a 16-step baseline; each arm ends at a hand-picked loss on each seed.
  base = {0: [(4, 5.0), (8, 4.0), (12, 3.0), (16, 2.5)],
          1: [(4, 5.0), (8, 4.2), (12, 3.2), (16, 2.6)]}
  finals = {"tst": {0: 3.5, 1: 2.9}, "s4": {0: 2.0, 1: 3.2}, "best": {0: 2.0}}
  runs = []
  for seed, evals in base.items():
    path, _ = _fake_run(tmp_path / f"base{seed}", tiny_config(steps=16, ratio=0.0), evals)
    runs.append(("baseline", seed, compare.load_run(path)))
  for arm, by_seed in finals.items():
    for seed, final in by_seed.items():
      config = tiny_config(steps=16, ratio=0.5, bag_size=4 if arm == "s4" else 2)
      path, _ = _fake_run(tmp_path / f"{arm}{seed}", config, [(8, 6.0), (16, final)])
      runs.append((arm, seed, compare.load_run(path)))
  arms, per_run = compare.summarize_arms(runs, order=["baseline", "tst"])
  arms = {a["arm"]: a for a in arms}
  assert list(arms) == ["baseline", "tst", "best", "s4"]
  assert arms["baseline"]["reference"] and compare.speedup_text(arms["baseline"]) == "reference"
  # tst: final 3.5 and 2.9 -> mean 3.2, sd sqrt(2 * 0.3^2 / 1), min 2.9, max 3.5.
  assert arms["tst"]["final_loss"] == pytest.approx(
      dict(mean=3.2, sd=0.3 * 2**0.5, min=2.9, max=3.5, n=2))
  # Equal FLOPs (16 steps each): the baselines end at 2.5 and 2.6 -> deltas 1.0 and 0.3.
  assert arms["tst"]["delta_equal_flops"] == pytest.approx(
      dict(mean=0.65, sd=0.7 / 2**0.5, min=0.3, max=1.0, n=2))
  # Equal loss: seed 0's baseline reaches 3.5 at step 10 (halfway from 4.0 at 8 to 3.0 at
  # 12), seed 1's reaches 2.9 at step 14 (halfway from 3.2 at 12 to 2.6 at 16); every step
  # has the same FLOPs, so the speed-ups are 10/16 and 14/16.
  assert arms["tst"]["speedup_flops"] == pytest.approx(
      dict(mean=0.75, sd=0.25 / 2**0.5, min=0.625, max=0.875, n=2))
  assert arms["tst"]["not_reached"] == 0
  flops = {r["run"]: r for r in per_run}["tst0"]["baseline_flops_to_equal_loss"]
  assert flops == pytest.approx(10 * spec_lib.check(tiny_config(steps=16)).plan.phases[0].flops_per_step)
  # s4: seed 0 ends below anything its baseline reached (not reached, > 16/16); seed 1 at
  # 3.2, which its baseline reaches exactly at its eval of step 12.
  assert arms["s4"]["speedup_flops"] == pytest.approx(
      dict(mean=0.75, sd=None, min=0.75, max=0.75, n=1))
  assert arms["s4"]["not_reached"] == 1 and arms["s4"]["speedup_lower_bound"]["min"] == 1.0
  assert compare.speedup_text(arms["s4"]) == "0.75x, not reached in 1 seed(s) (> 1.00x)"
  assert compare.speedup_text(arms["best"]) == "not reached (> 1.00x)"
  assert arms["best"]["final_loss"]["sd"] is None and arms["best"]["seeds"] == [0]
  table = compare.format_arms(list(arms.values()), per_run)
  assert "| tst | 0.5 | 2 | 16 |" in table and "3.2000 ± 0.4243 [2.9000, 3.5000]" in table
