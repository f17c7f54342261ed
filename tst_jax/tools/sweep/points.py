"""A sweep's points: a grid of config overrides or named arms, times seeds, each a run."""

from __future__ import annotations

import dataclasses
import re

from tst_jax import configlib, fileio
from tst_jax.rundir import RunDir
from tst_jax.config import spec as spec_lib

RATIO, BAG = "tst.ratio", "tst.bag_size"
# A point's seconds beside its FLOPs, for budgets: start, compilation, evals and checkpoints
# per wave of points at once, and tokenizing a corpus like gpu_small's once, with a margin.
OVERHEAD_S, PREPARE_S = 30.0, 40.0


@dataclasses.dataclass(frozen=True)
class Point:
  name: str
  grid: dict            # this point's grid values, key -> string
  seed: int
  baseline: bool
  arm: str = ""         # a config arg ('+' for ','), for --arms

  def config_arg(self, config: str) -> str:
    """'path[:arg]' plus this point's arm: configs/x.py:s8,r0.5."""
    if not self.arm:
      return config
    path, _, arg = config.partition(":")
    return f"{path}:{','.join(filter(None, [arg, self.arm.replace('+', ',')]))}"

  def overrides(self, base: list[str]) -> list[str]:
    """--set overrides, then the grid's, then the seed (and r = 0 for the baseline)."""
    extra = [f"{RATIO}=0.0"] if self.baseline else []
    return [*base, *(f"{k}={v}" for k, v in self.grid.items()), *extra, f"seed={self.seed}"]


def point_dir(workdir: str, name: str) -> RunDir:
  """Returns the run directory of the point `name` in the sweep's folder `workdir`."""
  return RunDir(fileio.join(workdir, name))


def make_points(grid: str, seeds: list[int], include_baseline: bool) -> list[Point]:
  points = []
  for seed in seeds:
    if include_baseline:
      points.append(Point(f"baseline_seed{seed}", {}, seed, True))
    for overrides in configlib.parse_grid(grid) if grid.strip() else []:
      values = dict(configlib.parse_override(o) for o in overrides)
      parts = [f"{k.split('.')[-1]}{v}" for k, v in values.items()] + [f"seed{seed}"]
      points.append(Point(re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)), values, seed,
                          False))
  return points


def make_arm_points(arms: list[str], seeds: list[int]) -> list[Point]:
  """Arm-major: every seed of the first arm, then the next arm (so with --parallel the first
  arms, e.g. baseline and tst, finish first)."""
  return [Point(re.sub(r"[^A-Za-z0-9._-]+", "-", f"{arm}_seed{seed}"), {}, seed, False, arm)
          for arm in arms for seed in seeds]


def estimate_s(plans, parallel: int, rate: float, overhead_s: float,
               prepare_s: float = 0.0) -> float:
  """Seconds to train runs of `plans`, `parallel` at a time on one device: their FLOPs at
  `rate` (FLOP/s of the device, shared by the runs at once), `overhead_s` per wave of runs
  (start, compilation, evals, checkpoints) and `prepare_s` once (tokenizing the corpus)."""
  waves = -(-len(plans) // max(parallel, 1))
  return prepare_s + waves * overhead_s + sum(p.flops_total for p in plans) / rate


def resolve(config_arg: str, overrides: list[str]):
  """(config, its checked RunSpec) of 'path[:arg]' with `overrides` applied. An override of a
  field an arm of `config_arg` sets is refused (configlib.refuse_arm_overrides)."""
  config = configlib.load_config(config_arg)
  configlib.refuse_arm_overrides(config_arg, overrides)
  config = configlib.apply_overrides(config, overrides)
  return config, spec_lib.check(config)
