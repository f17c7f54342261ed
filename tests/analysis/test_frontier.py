"""The frontier of finished baselines (tst_jax/analysis/frontier.py): the final losses of
baselines of several lengths, interpolated between them in log FLOPs, with bounds past their
ends and from one baseline; the power law through three or more; the Δ/slope model's slope.
The same through compare's and the sweep's tables, and the paper's Table 1:
tests/tools/test_compare.py."""

import math

import numpy as np
import pytest

from tst_jax.analysis.frontier import Frontier, PowerLaw


def test_frontier_interpolates_between_lengths_in_log_flops_and_bounds_past_its_ends():
  f = Frontier.of([(10.0, 4.0, "b10"), (20.0, 3.0, "b20"), (40.0, 2.5, "b40")])
  # 15 FLOPs lie log(1.5) / log(2) = 58.5% of the way from b10 to b20 in log FLOPs.
  assert f.loss_at(15.0) == pytest.approx(4.0 - math.log2(1.5)) and f.loss_at(20.0) == 3.0
  assert f.loss_at(9.0) is None and f.loss_at(41.0) is None
  # 3.4 lies 60% of the way from b10's 4.0 to b20's 3.0: 10 x 2^0.6 FLOPs, over a run of 10.
  equal = f.equal_loss(3.4, 10.0)
  assert (equal.speedup, equal.bound, equal.flops) == (
      pytest.approx(2 ** 0.6), "=", pytest.approx(10 * 2 ** 0.6))
  assert f.equal_loss(2.0, 10.0).text() == "> 4.00x"         # below the longest baseline
  assert f.equal_loss(4.5, 10.0).text() == "≤ 1.00x"         # above the shortest
  assert f.equal_loss(4.0, 20.0).text() == "≤ 0.50x"
  one = Frontier.of([(10.0, 4.0, "b10"), (10.0, 4.2, "b10s1")])     # two seeds, one length
  assert one.points == ((10.0, pytest.approx(4.1), "b10 + b10s1"),) and one.holds("b10s1")
  assert one.equal_loss(3.0, 10.0).text() == "> 1.00x"          # below it at equal FLOPs
  assert one.equal_loss(3.0, 12.0).speedup is None                # below it with more FLOPs
  assert one.equal_loss(3.0, 12.0).text() == "needs baselines of two or more lengths"


def test_the_slope_is_the_segment_toward_the_equal_loss_and_the_end_one_past_the_ends():
  f = Frontier.of([(10.0, 4.0, "b10"), (20.0, 3.0, "b20"), (40.0, 2.5, "b40")])
  first, second = -1 / math.log(2), -0.5 / math.log(2)
  assert f.slope_at(15.0, -0.1).value == pytest.approx(first)     # inside a segment
  assert f.slope_at(15.0, +0.1).value == pytest.approx(first)
  ahead, behind = f.slope_at(20.0, -0.1), f.slope_at(20.0, +0.1)  # at a length: the side
  assert (ahead.value, ahead.bracket) == (pytest.approx(second), (20.0, 40.0))
  assert (behind.value, behind.bracket) == (pytest.approx(first), (10.0, 20.0))
  assert not ahead.extrapolated and not behind.extrapolated
  past, before = f.slope_at(40.0, -0.1), f.slope_at(10.0, +0.1)   # toward no segment
  assert past.bracket == (20.0, 40.0) and past.extrapolated
  assert before.bracket == (10.0, 20.0) and before.extrapolated
  assert before.text(0.5) == f"~{math.exp(0.5 / first):.2f}x"
  # k = exp(Δ / s) is the measured speed-up while the equal loss stays in the segment.
  assert f.slope_at(10.0, -0.6).speedup(-0.6) == pytest.approx(f.equal_loss(3.4, 10.0).speedup)
  assert Frontier.of([(10.0, 4.0, "b10")]).slope_at(10.0, -0.1) is None


def test_a_run_below_the_shortest_baselines_flops_gets_a_bound_on_its_delta():
  # tst.equal_flops='batch' runs cost fewer FLOPs per step than their baseline (attention over
  # L/S positions in phase 1). Its speed-up divides by its own FLOPs; its Δ is measured
  # against the shortest baseline, which had more compute: at most that.
  f = Frontier.of([(100.0, 4.0, "b"), (200.0, 3.0, "b2")])
  assert f.loss_at(94.0) is None
  assert f.delta(3.9, 94.0) == (pytest.approx(-0.1), "≤")
  assert f.delta(3.5, 150.0) == (pytest.approx(3.5 - (4.0 - math.log2(1.5))), "=")
  assert f.delta(2.9, 250.0) == (pytest.approx(-0.1), "≥")
  assert f.equal_loss(3.5, 94.0).speedup == pytest.approx(100 * 2 ** 0.5 / 94)


def test_one_baseline_bounds_the_speedup_when_the_run_is_on_the_right_side_of_it():
  # The paper's 10B-A1B pair (Table 1): a baseline of 125,000 steps ends at 2.252, TST at
  # 2.236 after 49,983 steps of the same FLOPs per step: > 125,000 / 49,983 = 2.50x.
  one = Frontier.of([(125_000.0, 2.252, "baseline")])
  assert one.equal_loss(2.236, 49_983.0).text() == "> 2.50x"
  assert one.equal_loss(2.300, 200_000.0).text() == "≤ 0.62x"     # above it, more FLOPs
  # Equal FLOPs, as an equal-FLOPs arm beside its one baseline: above it is at most 1x (an
  # H200 run of configs/qwen3_moe_one_call.py, 2.4726 against 2.4011), below it more than 1x.
  assert one.equal_loss(2.300, 125_000.0).text() == "≤ 1.00x"
  assert one.equal_loss(2.236, 125_000.0).text() == "> 1.00x"
  for loss, flops in ((2.300, 49_983.0), (2.236, 200_000.0)):     # no bound either way
    assert one.equal_loss(loss, flops).text() == "needs baselines of two or more lengths"
  # Two lengths given, the longer ending higher: one is left, and the message says so.
  dropped = Frontier.of([(10.0, 3.0, "b10"), (20.0, 3.1, "b20")])
  assert dropped.equal_loss(3.05, 8.0).text() == "one baseline length left, 1 left out (see the notes)"


def _law(flops):
  """Chinchilla's data term at a fixed model size: L = E + B·D^-0.28 (Hoffmann et al.)."""
  return 1.9 + 410.7 * np.asarray(flops, np.float64) ** -0.28


@pytest.mark.parametrize("apart", [2.0, 5.0])
def test_against_an_analytic_power_law_log_flops_is_close_and_a_line_in_flops_is_not(apart):
  """Baselines `apart` x in FLOPs on L(F) = E + B·F^-0.28; a run of F0 FLOPs that reaches the
  law's loss at k·F0 has speed-up k. Log FLOPs stays within 2% over a 2x bracket, where a
  line in FLOPs is 8% high; over 5x the error grows to 10% (the wide-bracket warning), a
  third baseline at 2F brings it to 2% and 3% in the two brackets, and the power law fitted
  through the three is exact."""
  f0 = 1e18
  f = Frontier.of([(f0, _law(f0), "b1"), (apart * f0, _law(apart * f0), "b2")])
  ks = np.linspace(1.05, apart * 0.98, 25)
  log_err = [f.equal_loss(_law(k * f0), f0).speedup / k - 1 for k in ks]
  t = [(_law(f0) - _law(k * f0)) / (_law(f0) - _law(apart * f0)) for k in ks]
  line_err = [(1 + ti * (apart - 1)) / k - 1 for ti, k in zip(t, ks)]
  if apart == 2.0:
    assert max(np.abs(log_err)) < 0.02 and max(line_err) > 0.07
    assert not f.equal_loss(_law(1.5 * f0), f0).wide
    return
  assert f.equal_loss(_law(2.2 * f0), f0).wide and max(line_err) > 0.4
  assert 0.05 < max(np.abs(log_err)) < 0.10
  three = Frontier.of([(f0, _law(f0), "b1"), (2 * f0, _law(2 * f0), "b2"),
                       (5 * f0, _law(5 * f0), "b5")])
  for k in np.linspace(1.05, 1.95, 10):
    assert abs(three.equal_loss(_law(k * f0), f0).speedup / k - 1) < 0.02
  for k in np.linspace(2.05, 4.9, 20):     # the 2.5x bracket from 2F to 5F: 3% at worst
    assert abs(three.equal_loss(_law(k * f0), f0).speedup / k - 1) < 0.031
  for k in np.linspace(1.05, 4.9, 25):
    assert three.equal_loss(_law(k * f0), f0).fit == pytest.approx(k, rel=1e-3)
  law = three.law
  assert (law.alpha, law.E) == (pytest.approx(0.28, abs=0.01), pytest.approx(1.9, abs=0.01))


def test_a_power_law_needs_three_points_that_fit_one():
  assert PowerLaw.fit([1.0, 2.0], [3.0, 2.5]) is None
  assert PowerLaw.fit([1.0, 2.0, 4.0], [3.0, 2.5, 2.6]) is None     # not decreasing
  law = PowerLaw.fit([1.0, 2.0, 4.0], [3.0, 2.5, 2.25])              # 2 + 1·F^-1
  assert (law.E, law.A, law.alpha) == (pytest.approx(2.0, abs=1e-3), pytest.approx(1.0, abs=1e-3),
                                       pytest.approx(1.0, abs=1e-3))
  assert law.flops_to(1.99) is None and law.flops_to(2.5) == pytest.approx(2.0, rel=1e-3)


def test_a_run_where_the_power_law_and_the_interpolation_disagree_is_flagged():
  # Baselines falling fast, then flat: 2.8 lies 2/3 of the way from 3.0 (2 FLOPs) to 2.7 (8),
  # 2 x 4^(2/3) = 5.04 FLOPs in log FLOPs; the power law through the three (E = 2.68) has the
  # curve flatten sooner and reaches 2.8 at 3.24x, not 5.04x.
  f = Frontier.of([(1.0, 4.0, "b1"), (2.0, 3.0, "b2"), (8.0, 2.7, "b8")])
  equal = f.equal_loss(2.8, 1.0)
  assert equal.speedup == pytest.approx(2 * 4 ** (2 / 3)) and equal.wide
  assert equal.fit == pytest.approx(3.24, abs=0.01) and equal.fit_disagrees
  close = Frontier.of([(1.0, _law(1.0), "b1"), (2.0, _law(2.0), "b2"), (4.0, _law(4.0), "b4")])
  assert not close.equal_loss(_law(1.5), 1.0).fit_disagrees

