"""The speed-up ladders planned as runs within budgets of bounded seconds, and the budgets that
finish them.

A ladder is a config's TST arms at several lengths. Each length is a rung: the TST runs of
that many steps and baselines of the length times each factor, on one corpus large enough that
no run of the rung reads it more than PLANNED_PASSES times (an `<N>mb` arm part where the
config's is too small). Where each budget starts on a machine that keeps nothing, every run
must finish inside one budget: its FLOPs at the ladder's rate, the sweep's overhead per wave
of runs, and tokenizing each rung's corpus once. The missing runs are packed into budgets in
rung order, and of the ladders' next budgets the one that completes the most rungs is the one
to run. Where each ladder's rate was measured: docs/results.md ("The rates").
"""

from __future__ import annotations

import dataclasses
import math

from tst_jax.tools.sweep.points import OVERHEAD_S, PREPARE_S, estimate_s, make_arm_points
from tst_jax.config import defaults

# No run of a rung reads its corpus more than this many times: as many as the measured rungs
# read theirs (gpu_small's s4 at 2k: 2.2; docs/results.md). A corpus read more often teaches
# less per token, and TST, which reads S times as much in phase 1, loses more.
PLANNED_PASSES = 2.5
# Bytes of text per token of site-packages *.py under its 8192-token BPE, both splits: 100 MB
# gave 29.3M tokens, 200 MB 59.0M (the prepared.json files under docs/gpu/).
BYTES_PER_TOKEN = 3.4
PREPARED_BYTES = 200e6    # the corpus PREPARE_S holds; a larger one takes proportionally longer
CORPUS_STEP = 50e6        # a sized corpus is a whole number of these bytes
# The seed spread of Δ at equal FLOPs on gpu_small, the larger of the two measured (S = 4:
# 0.0078; S = 2: 0.0011; docs/results.md). A point whose |Δ| is under twice it needs a second
# seed before its Δ says anything.
SEED_SD = 0.0078


@dataclasses.dataclass(frozen=True)
class Ladder:
  """A config's TST arms at several lengths, and where its finished runs come from."""
  name: str
  config: str                      # config file[:arg]
  lengths: tuple[str, ...]         # TST run lengths, '<N>k'
  tst_arms: tuple[str, ...] = ("tst",)   # the TST arms at every length ('tst': the config's)
  factors: tuple[float, ...] = (1.0, 2.0)  # baselines of each length times these
  rate: float | None = None        # FLOP/s its runs get together on the device, measured
  parallel: int = 3                # runs at once
  finished: tuple[str, ...] = ()   # folders of finished runs brought back
  results: tuple[str, ...] = ()    # sweeps' results.json whose runs' records were not kept
  sized: bool = True               # give each rung a corpus for PLANNED_PASSES


# The named ladders, each at the rate measured for its config (docs/results.md, "The rates").
LADDERS = {
    # qwen3_moe_one_call (27.4M active parameters) at 0.6, 1.2 and 2.4 tokens per active
    # parameter, lengths doubling so that a rung's 2x baseline is the next rung's own where
    # their corpora match (1k and 2k read the config's 100 MB, 4k 200 MB), and a baseline of
    # half the length so that a TST run behind its own baseline still gets an exact speed-up.
    # At its rate each rung's TST run with its own baseline, and each baseline alone, fits the
    # ladder's share of one budget (tests/behaviour/test_gpu_budget.py): every budget
    # completes a point. The `finished` folder holds the 1k rung's runs.
    "moe": Ladder("moe", "configs/qwen3_moe_one_call.py", ("1k", "2k", "4k"),
                  factors=(0.5, 1.0, 2.0), rate=83e12,
                  finished=("docs/gpu/2026-11-26-h200/science",)),
    # gpu_small (33.6M parameters) at 2, 3.9 and 7.8 tokens per parameter, S = 2 and S = 4;
    # the 2k rung's runs are kept as their sweep's results.json.
    "dense": Ladder("dense", "configs/gpu_small.py", ("2k", "4k", "8k"), ("tst", "s4"),
                    rate=160e12, parallel=4,
                    results=("docs/gpu/2026-11-25-h100/science_py_results.json",)),
}


@dataclasses.dataclass(frozen=True)
class Rung:
  """A length of a ladder for one seed: the runs its speed-ups need, TST runs first."""
  length: str
  seed: int
  tst: tuple[str, ...]             # arms
  baselines: tuple[str, ...]
  corpus_bytes: float              # of the corpus its runs read

  @property
  def arms(self) -> tuple[str, ...]:
    return self.tst + self.baselines

  @property
  def points(self) -> list[str]:
    return [p.name for p in make_arm_points(list(self.arms), [self.seed])]

  @property
  def label(self) -> str:
    return f"{self.length} seed {self.seed}"


@dataclasses.dataclass(frozen=True)
class Call:
  """Runs that one call trains, its estimated seconds and the rungs it completes."""
  points: tuple[str, ...]
  seconds: float
  completes: tuple[str, ...]


def rung_arms(length: str, tst_arms, factors, default_steps: int, corpus_part: str = ""
              ) -> tuple[list[str], list[str]]:
  """Names the (TST arms, baseline arms) of one rung as `--arms` spells them: the baseline of
  the rung's own length first, the pair that measures Δ at equal FLOPs, then the others
  shortest first. A length equal to the config's own steps is left out of a name, so that
  'tst' is the run the config makes."""
  steps = defaults.arm_steps(length)
  if not steps:
    raise ValueError(f"--lengths: {length!r}: give lengths as <N>k (2k, 1.5k, 0.45k)")

  def arm(base: str, n: int) -> str:
    parts = [] if base == "tst" and n != default_steps else [base]
    parts += [] if n == default_steps else [defaults.steps_arm(n)]
    return "+".join(parts + ([corpus_part] if corpus_part else []))

  base = sorted({round(steps * f) for f in factors}, key=lambda n: (n != steps, n))
  return [arm(a, steps) for a in tst_arms], [arm("baseline", n) for n in base]


def corpus_bytes(most_tokens: float, config_bytes: float, val_fraction: float) -> float:
  """Sizes the corpus of a rung whose largest run reads `most_tokens` data tokens: the
  config's bytes, or whole CORPUS_STEPs enough that it reads them at most PLANNED_PASSES
  times."""
  need = most_tokens / PLANNED_PASSES * BYTES_PER_TOKEN / (1 - val_fraction)
  return config_bytes if need <= config_bytes else math.ceil(need / CORPUS_STEP) * CORPUS_STEP


def prepare_s(corpus: float) -> float:
  """Estimates the seconds to tokenize a corpus of `corpus` bytes on a fresh machine."""
  return PREPARE_S * max(1.0, corpus / PREPARED_BYTES)


def call_seconds(points: list[str], rung_of: dict, plan_of: dict, parallel: int,
                 rate: float) -> float:
  """Estimates the seconds one call takes to train `points`: their FLOPs at `rate`, the
  sweep's overhead per wave, and tokenizing the corpus of each rung they belong to."""
  corpora = {rung_of[p].corpus_bytes for p in points}
  return (sum(prepare_s(c) for c in corpora)
          + estimate_s([plan_of[p] for p in points], parallel, rate, OVERHEAD_S))


def pack_calls(rungs: list[Rung], missing: set[str], seconds, budget_s: float
               ) -> tuple[list[Call], list[tuple[str, float]]]:
  """Packs every missing run of `rungs`, in order, into calls within `budget_s` by
  `seconds(points)`. Returns the calls and the runs too long for any call, with their seconds
  alone. A call takes the next runs while they fit, so that the shortest rungs complete first."""
  calls, current, too_long = [], [], []
  order = list(dict.fromkeys(p for r in rungs for p in r.points if p in missing))
  for point in order:
    if seconds([point]) > budget_s:
      too_long.append((point, seconds([point])))
      continue
    if current and seconds(current + [point]) > budget_s:
      calls.append(current)
      current = []
    current.append(point)
  calls += [current] if current else []
  blocked = {r.label for r in rungs if any(p in dict(too_long) for p in r.points)}
  out, done = [], set()
  for points in calls:
    done |= set(points)
    completes = tuple(r.label for r in rungs if r.label not in blocked
                      and any(p in points for p in r.points)
                      and all(p in done or p not in missing for p in r.points))
    out.append(Call(tuple(points), seconds(points), completes))
  return out, too_long


def first_trend_calls(rungs: list[Rung], missing: set[str], calls: list[Call]) -> int | None:
  """Counts the first of `calls` after which finished rungs stand at two lengths, the fewest a
  trend is fitted over: 0 when they do already, None when `calls` do not get there."""
  done: set[str] = set()
  for n, call in enumerate([None, *calls]):
    done |= set(call.points if call else ())
    lengths = {r.length for r in rungs if all(p in done or p not in missing for p in r.points)}
    if len(lengths) >= 2:
      return n
  return None


def trend_text(rungs: list[Rung], missing: set[str], calls: list[Call], budget_s: float) -> str:
  """Says how many calls of `budget_s` seconds the first trend needs."""
  n = first_trend_calls(rungs, missing, calls)
  exact = "exact where each TST run's loss lies within its baselines'"
  if n == 0:
    return f"Finished rungs stand at two lengths or more: the trend is fitted, {exact}."
  if n is None:
    return ("The first trend, finished rungs at two lengths, needs more than these calls: a "
            "faster step or longer calls.")
  return (f"The first trend, finished rungs at two lengths ({exact}), needs {n} call"
          f"{'s' if n > 1 else ''} of {budget_s:.0f} s: {'1' if n == 1 else f'1-{n}'} above.")


def best_call(next_calls: dict[str, Call | None]) -> str | None:
  """Names the ladder whose next call adds the most: the most rungs completed, then the most
  runs trained; the first ladder listed on a tie."""
  best = None
  for name, call in next_calls.items():
    if call is not None and (best is None or _value(call) > _value(next_calls[best])):
      best = name
  return best


def _value(call: Call) -> tuple[int, int]:
  return len(call.completes), len(call.points)


def needs_second_seed(delta: float | None) -> bool:
  """Is a one-seed Δ within twice the measured seed spread, so that it says nothing alone?"""
  return delta is not None and abs(delta) < 2 * SEED_SD


def noise_text(deltas: list[float]) -> str:
  """Says whether a point's Δ, over its seeds, stands out of the seed noise of gpu_small."""
  if not deltas:
    return "--"
  if len(deltas) == 1:
    return (f"within noise: Δ inside ±2 × {SEED_SD:g}, a second seed is planned"
            if needs_second_seed(deltas[0]) else f"outside noise: Δ beyond ±2 × {SEED_SD:g}")
  mean = sum(deltas) / len(deltas)
  sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1))
  inside = abs(mean) < 2 * max(sd, SEED_SD)
  return (f"{len(deltas)} seeds, Δ {mean:+.4f} ± {sd:.4f}: "
          + ("within noise" if inside else "outside noise"))
