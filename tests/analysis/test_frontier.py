"""The frontier of finished baselines (tst_jax/analysis/frontier.py): the final losses of
baselines of several lengths, interpolated between them, with bounds past their ends; the
equal-loss speed-up of a run read off it. The same through compare's and the sweep's tables:
tests/tools/test_compare.py."""

import pytest

from tst_jax.analysis.frontier import Frontier


def test_frontier_interpolates_between_lengths_and_bounds_past_its_ends():
  f = Frontier.of([(10.0, 4.0, "b10"), (20.0, 3.0, "b20"), (40.0, 2.5, "b40")])
  assert f.loss_at(15.0) == pytest.approx(3.5) and f.loss_at(20.0) == 3.0
  assert f.loss_at(9.0) is None and f.loss_at(41.0) is None
  # 3.4 lies 60% of the way from b10's 4.0 to b20's 3.0: 16 FLOPs, over a run of 10.
  equal = f.equal_loss(3.4, 10.0)
  assert (equal.speedup, equal.bound, equal.flops) == (pytest.approx(1.6), "=", pytest.approx(16))
  assert f.equal_loss(2.0, 10.0).text() == "> 4.00x"         # below the longest baseline
  assert f.equal_loss(4.5, 10.0).text() == "≤ 1.00x"         # above the shortest
  assert f.equal_loss(4.0, 20.0).text() == "≤ 0.50x"
  one = Frontier.of([(10.0, 4.0, "b10"), (10.0, 4.2, "b10s1")])     # two seeds, one length
  assert one.points == ((10.0, pytest.approx(4.1), "b10 + b10s1"),) and one.holds("b10s1")
  assert one.equal_loss(3.0, 10.0).speedup is None
  assert one.equal_loss(3.0, 10.0).text() == "needs baselines of two or more lengths"


def test_a_run_slightly_below_the_shortest_baselines_flops_is_compared_with_it():
  # tst.equal_flops='batch' runs attention over L/S positions: ~1% fewer FLOPs per step.
  f = Frontier.of([(100.0, 4.0, "b"), (200.0, 3.0, "b2")])
  assert f.loss_at(98.75) == 4.0 and f.loss_at(90.0) is None
  assert f.equal_loss(3.9, 98.75).speedup == pytest.approx(110 / 98.75)
