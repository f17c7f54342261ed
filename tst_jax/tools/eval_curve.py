"""A finished run read back from its workdir: its held-out loss curve (metrics.jsonl) and its
plan (plan.json; rebuilt from config.json for a run written before runs recorded one)."""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import numpy as np

from tst_jax import errors
from tst_jax.data import run_data
from tst_jax.train import spec as spec_lib
from tst_jax.train.plan import Plan, PlanRecord


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


def run_record(workdir: str, started: Plan | None = None) -> tuple[Plan, int | None]:
  """(the run's plan, its store's training tokens or None), from its plan.json; for a run
  that has not written one, the plan it was `started` with (a sweep's point), else its
  config.json checked again (a run written before runs recorded their plan), and store.json."""
  record = PlanRecord.read(workdir)
  if record is not None:
    return record.plan, (record.tokens.count if record.tokens and record.tokens.exact
                         else run_data.workdir_train_tokens(workdir))
  return started or _plan_of_config(workdir), run_data.workdir_train_tokens(workdir)


def _plan_of_config(workdir: str) -> Plan:
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise errors.DataError(f"{workdir}: has no plan.json or config.json: give run directories "
                           "of main.py")
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.tst.weighting = "uniform"
  return spec_lib.check(config).plan


def load_run(workdir: str, name: str | None = None) -> EvalCurve:
  """A run directory of `main.py` -> its eval curve and plan; an unfinished run is an
  error."""
  if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
    raise errors.DataError(f"{workdir}: has no metrics.jsonl: give run directories of main.py")
  plan, train_tokens = run_record(workdir)
  evals = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in filter(str.strip, f):
      record = json.loads(line)
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
