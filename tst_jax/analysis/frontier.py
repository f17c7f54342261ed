"""The equal-loss speed-up, measured as the paper measures it: against finished baselines.

A baseline run of T steps decays its learning rate over its last steps (WSD), so its loss
at the end is well below the loss a longer baseline passes through at the same FLOPs. The
honest reference for "how much compute does the baseline need to reach this loss" is
therefore the *frontier* of finished baselines: the final losses of baseline runs of several
lengths, against their total FLOPs, linearly interpolated between lengths.

  speed-up(run)      = F_frontier(final loss of the run) / FLOPs of the run
  Δ at equal FLOPs   = final loss of the run - L_frontier(FLOPs of the run)

A loss below the longest baseline's gives a lower bound (> F_max / F), a loss at or above
the shortest's an upper bound (≤ F_min / F); one baseline length gives no speed-up at all
("needs baselines of two or more lengths"), and a longer baseline that ends above a shorter
one is left out (named in the reports). Nothing here falls back to the middle of a longer
run's curve: at 13.2 PFLOPs the undecayed 4k-step curve of configs/gpu_small.py is at 2.0106
where the finished 2k-step run is at 1.9132, and reading the speed-up off that curve printed
1.73x where the frontier gives 1.15x (../docs/results.md, H100 2026-11-25).

`Trend` fits the speed-up against tokens per parameter (a line in log tokens per parameter)
over the points of `python -m tst_jax.tools.ladder`, for the plan's prediction.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

LENGTHS_NEEDED = "needs baselines of two or more lengths"
# A run up to this fraction below the shortest baseline's FLOPs is compared with that baseline
# (tst.equal_flops='batch' runs attention over L/S positions: about 1% fewer FLOPs); the
# baseline then had the more compute. Above the longest baseline nothing is extrapolated.
BELOW_SHORTEST = 0.05


@dataclasses.dataclass(frozen=True)
class EqualLoss:
  """The frontier's answer for one run: `speedup` is exact when `bound` is '=', a lower bound
  for '>' (the run ends below every baseline), an upper bound for '≤' (at or above the
  shortest); None with a `note` when there is no answer."""
  speedup: float | None
  bound: str = "="
  flops: float | None = None      # the frontier's FLOPs to the run's loss (or the bound's)
  note: str = ""

  def text(self) -> str:
    if self.speedup is None:
      return self.note
    return ("" if self.bound == "=" else self.bound + " ") + f"{self.speedup:.2f}x"


@dataclasses.dataclass(frozen=True)
class Frontier:
  """Finished baselines (FLOPs, final loss, name) sorted by FLOPs, each ending below every
  shorter one; `dropped` holds those that did not (FLOPs, loss, name, the shorter one they
  end above): a longer baseline that ends higher (its data repeated, say) says nothing about
  what more compute buys, and is left out of the interpolation."""
  points: tuple[tuple[float, float, str], ...]   # (FLOPs, loss, names joined by ' + ')
  dropped: tuple[tuple[float, float, str, str], ...] = ()

  @classmethod
  def of(cls, runs) -> Frontier:
    """From (flops, final_loss, name) triples; runs of equal FLOPs (seeds) are averaged."""
    by_flops: dict[float, list] = {}
    for flops, loss, name in runs:
      by_flops.setdefault(float(flops), []).append((float(loss), name))
    points, dropped = [], []
    for f, v in sorted(by_flops.items()):
      loss, name = float(np.mean([l for l, _ in v])), " + ".join(n for _, n in v)
      if not math.isfinite(loss):
        dropped.append((f, loss, name, ""))
      elif points and loss >= points[-1][1]:
        dropped.append((f, loss, name, points[-1][2]))
      else:
        points.append((f, loss, name))
    return cls(tuple(points), tuple(dropped))

  @property
  def flops(self) -> np.ndarray:
    return np.array([p[0] for p in self.points])

  @property
  def losses(self) -> np.ndarray:
    return np.array([p[1] for p in self.points])

  @property
  def names(self) -> list[str]:
    return [p[2] for p in self.points]

  def holds(self, name: str) -> bool:
    """Is the run `name` one of the frontier's points (alone or among seeds averaged)?"""
    return any(name in p[2].split(" + ") for p in self.points)

  def loss_at(self, flops: float) -> float | None:
    """The baselines' final loss at `flops`, interpolated between lengths; None above the
    longest or more than BELOW_SHORTEST below the shortest."""
    if not self.points:
      return None
    x, lo, hi = float(flops), self.flops[0], self.flops[-1]
    if x < lo * (1 - BELOW_SHORTEST) or x > hi * (1 + 1e-9):
      return None
    return float(np.interp(min(max(x, lo), hi), self.flops, self.losses))

  def equal_loss(self, loss: float, flops: float) -> EqualLoss:
    """FLOPs at which the frontier reaches `loss`, over the run's `flops`."""
    if not math.isfinite(loss):
      return EqualLoss(None, note="its final loss is not finite")
    if len(self.points) < 2:
      return EqualLoss(None, note=LENGTHS_NEEDED)
    x, y = self.flops, self.losses
    below = np.nonzero(y <= loss)[0]
    if below.size == 0:
      return EqualLoss(x[-1] / flops, ">", float(x[-1]))
    i = int(below[0])
    if i == 0:
      return EqualLoss(x[0] / flops, "≤", float(x[0]))
    reach = x[i - 1] + (x[i] - x[i - 1]) * (y[i - 1] - loss) / (y[i - 1] - y[i])
    return EqualLoss(float(reach / flops), "=", float(reach))


def spread(values) -> dict | None:
  """mean, sd (n - 1; None for one value), min, max and n of `values`; None if empty."""
  v = np.asarray(list(values), dtype=np.float64)
  if not v.size:
    return None
  return dict(mean=float(v.mean()), sd=float(v.std(ddof=1)) if v.size > 1 else None,
              min=float(v.min()), max=float(v.max()), n=int(v.size))


@dataclasses.dataclass(frozen=True)
class Trend:
  """speed-up ≈ a + b · ln(tokens per parameter), least squares over the points of one
  recipe: valid over the tokens per parameter it was measured on, for models of about its
  size (within a factor SIZE_RANGE: where TST pays depends on the size too)."""
  a: float
  b: float
  low: float             # tokens per parameter: the measured range
  high: float
  params: float          # active parameters of the recipe the points were measured on
  points: tuple          # (tokens per parameter, speed-up, label)
  source: str            # command, device, date: where the points come from

  SIZE_RANGE = 2.0

  @classmethod
  def fit(cls, points, params: float, source: str = "") -> Trend | None:
    """From (tokens per parameter, speed-up, label) points of a `params`-parameter recipe;
    None with fewer than two distinct tokens per parameter."""
    x = np.log([p[0] for p in points])
    if len(set(np.round(x, 9))) < 2:
      return None
    b, a = np.polyfit(x, [p[1] for p in points], 1)
    return cls(float(a), float(b), float(np.exp(x.min())), float(np.exp(x.max())),
               float(params), tuple((float(p[0]), float(p[1]), str(p[2])) for p in points),
               source)

  def covers_size(self, params: float) -> bool:
    return self.params / self.SIZE_RANGE <= params <= self.params * self.SIZE_RANGE

  def predict(self, tokens_per_param: float, params: float | None = None) -> float | None:
    """The fitted speed-up; None outside the measured range, or for a model of `params`
    parameters far from the recipe's."""
    if params is not None and not self.covers_size(params):
      return None
    if not self.low * (1 - 1e-9) <= tokens_per_param <= self.high * (1 + 1e-9):
      return None
    return self.a + self.b * math.log(tokens_per_param)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def load(cls, path: str) -> Trend:
    with open(path) as f:
      record = json.load(f)
    return cls(**{k: record[k] for k in ("a", "b", "low", "high", "params", "source")},
               points=tuple(tuple(p) for p in record["points"]))
