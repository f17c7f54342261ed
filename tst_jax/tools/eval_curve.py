"""A finished run read back from its workdir: its held-out loss curve (metrics.jsonl) and its
plan (plan.json; rebuilt from config.json for a run written before runs recorded one)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tst_jax import errors
from tst_jax.train import workdir as workdir_lib
from tst_jax.train.plan import Plan


@dataclasses.dataclass
class EvalCurve:
  """A finished run's held-out loss curve and plan; its FLOPs, tokens and passes are the
  plan's."""
  name: str
  workdir: str
  steps: np.ndarray         # eval steps
  loss: np.ndarray          # held-out next-token loss at those steps
  data_tokens: np.ndarray
  plan: Plan
  train_tokens: int | None = None   # of the store it read (None: unknown)

  @property
  def r(self) -> float:
    return self.plan.ratio

  @property
  def S(self) -> int:
    """The bag size of its first phase (1: a baseline)."""
    return self.plan.phases[0].bag_size

  @property
  def total_steps(self) -> int:
    return self.plan.total_steps

  @property
  def final_loss(self) -> float:
    return float(self.loss[-1])

  @property
  def is_baseline(self) -> bool:
    return not any(p.is_tst for p in self.plan.phases)

  def flops_at(self, step):
    """Training FLOPs after `step` (fractional steps allowed) optimizer steps."""
    return self.plan.flops_at(step)

  @property
  def flops(self) -> np.ndarray:
    return self.flops_at(self.steps)

  @property
  def total_flops(self) -> float:
    return self.plan.flops_total

  @property
  def total_data_tokens(self) -> int:
    return self.plan.data_tokens_total

  @property
  def passes(self) -> float | None:
    """How many times the run read its training tokens (None: the store is unknown)."""
    return sum(self.plan.passes(self.train_tokens)) if self.train_tokens else None


def load_run(workdir: str, name: str | None = None) -> EvalCurve:
  """A run directory of `main.py` -> its eval curve and plan; an unfinished run is an
  error."""
  if not os.path.isfile(workdir_lib.path(workdir, workdir_lib.METRICS)):
    raise errors.DataError(f"{workdir}: has no metrics.jsonl: give run directories of main.py")
  plan, train_tokens = workdir_lib.plan_and_tokens(workdir)
  evals = {}
  for record in workdir_lib.read_metrics(workdir):
    if "eval_loss" in record:
      evals[record["step"]] = record      # the last line of a step wins (resumed runs)
  if not evals:
    raise errors.DataError(f"{workdir}/metrics.jsonl: has no eval lines: give runs that "
                           "reached their first eval")
  rows = [evals[s] for s in sorted(evals)]
  if rows[-1]["step"] != plan.total_steps:
    raise errors.DataError(
        f"{workdir}: unfinished (its last eval is at step {rows[-1]['step']} of "
        f"{plan.total_steps}): compare finished runs, whose learning rate has decayed; "
        "the same command resumes it")
  return EvalCurve(name or os.path.basename(os.path.normpath(workdir)), workdir,
                   np.array([r["step"] for r in rows], float),
                   np.array([r["eval_loss"] for r in rows]),
                   np.array([r["data_tokens"] for r in rows], float), plan,
                   train_tokens=train_tokens)
