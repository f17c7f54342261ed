"""The equal-loss speed-up, measured as the paper measures it: against finished baselines.

A baseline run of T steps decays its learning rate over its last steps (WSD), so its loss
at the end is well below the loss a longer baseline passes through at the same FLOPs. The
honest reference for "how much compute does the baseline need to reach this loss" is
therefore the *frontier* of finished baselines: the final losses of baseline runs of several
lengths against their total FLOPs, interpolated between lengths in log FLOPs.

  speed-up(run)      = F_frontier(final loss of the run) / FLOPs of the run
  Δ at equal FLOPs   = final loss of the run - L_frontier(FLOPs of the run)

Loss against compute is convex, so a straight line in FLOPs between two baselines lies above
the curve and overstates the speed-up. A straight line in log FLOPs follows a power law
closely. The paper's 270M baselines of 20k and 100k steps give 3.33x in FLOPs and 2.56x in
log FLOPs. Two baselines more than WIDE_BRACKET apart in FLOPs around a run get a warning.
With three or more lengths a power law L(F) = E + A·F^(−α) is fitted as a second estimate,
and a run where the two differ by more than FIT_DISAGREES is flagged.

The Δ/slope model predicts the speed-up from Δ alone: near the run the frontier is a line in
log FLOPs of slope s = dL/d ln F, and a gain Δ is worth the compute that moves the baseline by
Δ along it, k = exp(Δ / s). `Frontier.slope_at` takes s from the two finished lengths next to
the run, on the side where the run's equal loss lies. Where the equal-loss point lies in that
same segment the model and the measurement agree; where it lies further, the frontier's bend
is what tells them apart.

Past the frontier's ends the answer is a bound: a loss below the longest baseline's gives
> F_max / F, a loss at or above the shortest's ≤ F_min / F. One baseline length bounds a run
that ends at or below it with fewer FLOPs, or below it with as many, by > F_base / F, as
for the paper's 10B-A1B pair, and one that ends above it with as many FLOPs or more by
≤ F_base / F. Otherwise it gives no speed-up. A longer baseline that ends above a shorter one
is left out and named in the reports. Nothing here reads the middle of a longer run's curve,
which lies well above a finished run's end at the same FLOPs because its learning rate has
not decayed.

`Trend` fits the speed-up as a line in log tokens per parameter over the points of
`python -m tst_jax.tools.ladder`, for the plan's prediction.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from tst_jax import fileio
from tst_jax.analysis import mutual_info

LENGTHS_NEEDED = "needs baselines of two or more lengths"
WIDE_BRACKET = 2.0      # bracketing baselines further apart in FLOPs: the row is warned
FIT_DISAGREES = 0.10    # the power law's speed-up this far from the interpolation: flagged
ALPHA_RANGE = (-4.0, -0.01)   # the power law's exponents searched: F^-4 to F^-0.01


@dataclasses.dataclass(frozen=True)
class EqualLoss:
  """The frontier's answer for one run: `speedup` is exact when `bound` is '=', a lower bound
  for '>', an upper bound for '≤', and None with a `note` when there is no answer. `fit` is the
  power law's speed-up, `bracket` the FLOPs of the two baselines around the run."""
  speedup: float | None
  bound: str = "="
  flops: float | None = None      # the frontier's FLOPs to the run's loss or to the bound
  note: str = ""
  fit: float | None = None
  bracket: tuple[float, float] | None = None

  def text(self) -> str:
    if self.speedup is None:
      return self.note
    return ("" if self.bound == "=" else self.bound + " ") + f"{self.speedup:.2f}x"

  @property
  def wide(self) -> bool:
    """Are the two baselines around the run more than WIDE_BRACKET apart in FLOPs?"""
    return self.bracket is not None and self.bracket[1] > WIDE_BRACKET * self.bracket[0]

  @property
  def fit_disagrees(self) -> bool:
    return (self.fit is not None and self.speedup is not None and
            abs(self.fit / self.speedup - 1) > FIT_DISAGREES)


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """L(F) = E + A·(F / scale)^(−alpha), least squares over three or more baselines."""
  E: float
  A: float
  alpha: float
  scale: float

  @classmethod
  def fit(cls, flops, losses) -> PowerLaw | None:
    """Fits the law by least squares with mutual_info's fit of C0 + a·d^k, d = F / scale.

    None with fewer than three points, with A <= 0, or with the exponent at the searched
    range's edge, where the points are not a power law."""
    x, y = np.asarray(flops, np.float64), np.asarray(losses, np.float64)
    if x.size < 3:
      return None
    fit = mutual_info.fit_power_law(x / x[0], y, k_range=ALPHA_RANGE)
    if fit["a"] <= 0 or not ALPHA_RANGE[0] + 1e-6 < fit["k"] < ALPHA_RANGE[1] - 1e-6:
      return None
    return cls(fit["C0"], fit["a"], -fit["k"], float(x[0]))

  def loss(self, flops: float) -> float:
    return self.E + self.A * (flops / self.scale) ** -self.alpha

  def flops_to(self, loss: float) -> float | None:
    """Returns the FLOPs at which the law reaches `loss`, None at or below its floor E."""
    if loss <= self.E:
      return None
    return self.scale * ((loss - self.E) / self.A) ** (-1 / self.alpha)


@dataclasses.dataclass(frozen=True)
class Frontier:
  """Finished baselines as (FLOPs, final loss, name) sorted by FLOPs, each ending below every
  shorter one.

  A longer baseline that ends higher, say because its data repeated, says nothing about what
  more compute buys. `dropped` holds those with the shorter one they end above.
  `flops_per_step` is the baselines' own, to name the step count of a baseline to add."""
  points: tuple[tuple[float, float, str], ...]   # (FLOPs, loss, names joined by ' + ')
  dropped: tuple[tuple[float, float, str, str], ...] = ()
  flops_per_step: float | None = None

  @classmethod
  def of(cls, runs, flops_per_step: float | None = None) -> Frontier:
    """Builds the frontier of (flops, final_loss, name) triples, averaging seeds of equal FLOPs."""
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
    return cls(tuple(points), tuple(dropped), flops_per_step)

  @property
  def flops(self) -> np.ndarray:
    return np.array([p[0] for p in self.points])

  @property
  def losses(self) -> np.ndarray:
    return np.array([p[1] for p in self.points])

  @property
  def names(self) -> list[str]:
    return [p[2] for p in self.points]

  @functools.cached_property
  def law(self) -> PowerLaw | None:
    return PowerLaw.fit(self.flops, self.losses)

  def holds(self, name: str) -> bool:
    """Is the run `name` one of the frontier's points (alone or among seeds averaged)?"""
    return any(name in p[2].split(" + ") for p in self.points)

  def loss_at(self, flops: float) -> float | None:
    """Interpolates the baselines' final loss at `flops` in log FLOPs, None outside the frontier."""
    if not self.points:
      return None
    x, lo, hi = float(flops), self.flops[0], self.flops[-1]
    if x < lo * (1 - 1e-9) or x > hi * (1 + 1e-9):
      return None
    return float(np.interp(np.log(min(max(x, lo), hi)), np.log(self.flops), self.losses))

  def delta(self, loss: float, flops: float) -> tuple[float | None, str]:
    """Returns Δ at equal FLOPs with '=' or the kind of bound.

    Below the shortest baseline's FLOPs Δ is measured against that baseline, which had more
    compute, so the true Δ is at most that: '≤'. A tst.equal_flops='batch' run is one, since
    its phase 1 attends over L/S positions at fewer FLOPs per step. Past the longest baseline
    Δ is at least that: '≥'."""
    if not self.points or not math.isfinite(loss):
      return None, "="
    at = self.loss_at(flops)
    if at is not None:
      return loss - at, "="
    if flops < self.flops[0]:
      return loss - float(self.losses[0]), "≤"
    return loss - float(self.losses[-1]), "≥"

  def slope_at(self, flops: float, delta: float) -> Slope | None:
    """Returns the slope next to `flops` toward a run's equal loss, None under two lengths.

    A run ahead (Δ < 0) reaches its loss at more FLOPs: the segment from the last length at or
    below `flops` to the next. A run behind reaches it at fewer: the segment ending at the
    first length at or above. Past an end, the end segment, marked extrapolated."""
    if len(self.points) < 2:
      return None
    x, y = self.flops, self.losses
    if delta < 0:
      i = int(np.searchsorted(x, flops * (1 + 1e-9), side="right"))   # first length above
    else:
      i = int(np.searchsorted(x, flops * (1 - 1e-9), side="left"))    # first at or above
    j = min(max(i, 1), len(x) - 1)
    value = float((y[j] - y[j - 1]) / math.log(x[j] / x[j - 1]))
    return Slope(value, (float(x[j - 1]), float(x[j])), extrapolated=j != i)

  def equal_loss(self, loss: float, flops: float) -> EqualLoss:
    """FLOPs at which the frontier reaches `loss`, over the run's `flops`."""
    if not math.isfinite(loss):
      return EqualLoss(None, note="its final loss is not finite")
    if len(self.points) < 2:
      return self._one_length(loss, flops)
    x, y = self.flops, self.losses
    below = np.nonzero(y <= loss)[0]
    if below.size == 0:
      return EqualLoss(x[-1] / flops, ">", float(x[-1]))
    i = int(below[0])
    if i == 0:
      return EqualLoss(x[0] / flops, "≤", float(x[0]))
    t = (y[i - 1] - loss) / (y[i - 1] - y[i])
    reach = float(np.exp(np.log(x[i - 1]) + t * np.log(x[i] / x[i - 1])))
    law = self.law
    fit = law.flops_to(loss) if law else None
    return EqualLoss(reach / flops, "=", reach, fit=None if fit is None else fit / flops,
                     bracket=(float(x[i - 1]), float(x[i])))

  def _one_length(self, loss: float, flops: float) -> EqualLoss:
    """A bound from one baseline length where the run ends below it with as many FLOPs or
    fewer, or above it with as many or more, else why there is no answer."""
    if self.points:
      (x, y, _), = self.points
      if loss <= y and flops < x or loss < y and flops <= x:
        return EqualLoss(x / flops, ">", x)
      if loss > y and flops >= x:
        return EqualLoss(x / flops, "≤", x)
    if self.dropped:
      return EqualLoss(None, note=f"one baseline length left, {len(self.dropped)} left out "
                       "(see the notes)")
    return EqualLoss(None, note=LENGTHS_NEEDED)


@dataclasses.dataclass(frozen=True)
class Slope:
  """The finished baselines' loss slope per e-fold of compute, dL/d ln F, between the two
  lengths `bracket` (FLOPs); `extrapolated` when the run's equal loss lies past the frontier's
  end, so that the segment is the end one, not the one around the equal-loss point."""
  value: float
  bracket: tuple[float, float]
  extrapolated: bool = False

  def speedup(self, delta: float) -> float:
    """Predicts the equal-loss speed-up of a run `delta` from the frontier: exp(Δ / s)."""
    return math.exp(delta / self.value)

  def text(self, delta: float) -> str:
    return ("~" if self.extrapolated else "") + f"{self.speedup(delta):.2f}x"


def spread(values) -> dict | None:
  """Returns mean, sd with n - 1, min, max and n of `values`, None if empty.
  sd is None for one value."""
  v = np.asarray(list(values), dtype=np.float64)
  if not v.size:
    return None
  return dict(mean=float(v.mean()), sd=float(v.std(ddof=1)) if v.size > 1 else None,
              min=float(v.min()), max=float(v.max()), n=int(v.size))


@dataclasses.dataclass(frozen=True)
class Trend:
  """speed-up ≈ a + b · ln(tokens per parameter), least squares over the points of one TST
  arm of one recipe. It holds over the tokens per parameter it was measured on, for models like
  the recipe's: within a factor SIZE_RANGE of its active parameters, dense or sparse as it, at
  its bag size, since where TST pays depends on all three."""
  a: float
  b: float
  low: float             # tokens per parameter: the measured range
  high: float
  params: float          # active parameters of the recipe the points were measured on
  points: tuple          # (tokens per parameter, speed-up, label)
  source: str            # command, device, date: where the points come from
  bag_size: int          # S of the TST arm
  params_total: float    # all parameters: more than `params` for an MoE

  SIZE_RANGE = 2.0

  @classmethod
  def fit(cls, points, params: float, source: str = "", bag_size: int = 0,
          params_total: float | None = None) -> Trend | None:
    """Fits (tokens per parameter, speed-up, label) points of a `params`-parameter recipe, None
    with fewer than two distinct tokens per parameter."""
    x = np.log([p[0] for p in points])
    if len(set(np.round(x, 9))) < 2:
      return None
    b, a = np.polyfit(x, [p[1] for p in points], 1)
    return cls(float(a), float(b), float(np.exp(x.min())), float(np.exp(x.max())),
               float(params), tuple((float(p[0]), float(p[1]), str(p[2])) for p in points),
               source, int(bag_size), float(params if params_total is None else params_total))

  def covers_size(self, params: float) -> bool:
    return self.params / self.SIZE_RANGE <= params <= self.params * self.SIZE_RANGE

  def covers(self, params: float, params_total: float, bag_size: int) -> bool:
    """Was the trend measured on a model like this one, at its bag size?"""
    sparse = params_total > params
    return (self.covers_size(params) and sparse == (self.params_total > self.params)
            and bag_size == self.bag_size)

  def predict(self, tokens_per_param: float, params: float | None = None) -> float | None:
    """Predicts the speed-up, None outside the measured range or for a model of `params`
    parameters far from the recipe's."""
    if params is not None and not self.covers_size(params):
      return None
    if not self.inside(tokens_per_param):
      return None
    return self.a + self.b * math.log(tokens_per_param)

  def inside(self, tokens_per_param: float) -> bool:
    return self.low * (1 - 1e-9) <= tokens_per_param <= self.high * (1 + 1e-9)

  def pays_from(self) -> float | None:
    """Returns the tokens per parameter where the fit crosses 1x, from which TST pays, None
    where the fit does not grow with length."""
    return math.exp((1 - self.a) / self.b) if self.b > 0 else None

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict) -> Trend:
    return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name != "points"},
               points=tuple(tuple(p) for p in record["points"]))

  @classmethod
  def load_all(cls, path: str) -> list[Trend]:
    """Reads a trends file: {"trends": [...]}, one per TST arm and recipe measured."""
    return [cls.from_json(r) for r in fileio.read_json(path)["trends"]]
