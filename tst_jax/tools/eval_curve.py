"""A finished run read back from its workdir: its held-out loss curve from metrics.jsonl, its
plan from plan.json or else config.json, and what a baseline must share with it."""

from __future__ import annotations

import dataclasses

import numpy as np

from tst_jax import errors, fileio, schema
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.config import record as record_lib
from tst_jax.config.plan import Plan

# Config fields a baseline may differ in from the run it is compared with: the TST and MTP
# settings, the step count, the seed, and what changes how a run is computed but not what it
# learns.
FREE_FIELDS = ("seed", "tst.", "mtp.", "train.", "reference.", "mesh.", "distributed.",
               "logical_axis_rules", "loss.impl", "model.attention_impl", "model.remat",
               "model.expert_impl", "model.dispatch_impl", "optimizer.grad_accum")
# Fields that choose the token store: the store's fingerprint replaces them when both runs
# have one (the same store may sit at another path).
STORE_FIELDS = ("data.source", "data.tokenizer", "data.max_bytes", "data.text_field",
                "data.val_fraction", "data.val_piece_bytes", "data.seed")
FINGERPRINT = "the token store's fingerprint"


@dataclasses.dataclass
class EvalCurve:
  """A finished run's held-out loss curve and plan, which gives its FLOPs, tokens and passes."""
  name: str
  workdir: str
  steps: np.ndarray         # eval steps
  loss: np.ndarray          # held-out next-token loss at those steps
  data_tokens: np.ndarray
  plan: Plan
  train_tokens: int | None = None   # of the store it read (None: unknown)
  identity: dict = dataclasses.field(default_factory=dict)   # `identity_of` its workdir
  phase1_bag_loss: float | None = None   # the last eval_bag_loss: phase 1's task at its end
  final_bpb: float | None = None         # bits per byte of the final eval (None: bytes unknown)

  @property
  def r(self) -> float:
    return self.plan.ratio

  @property
  def S(self) -> int:
    """Bag size of its first phase, 1 for a baseline."""
    return self.plan.phases[0].bag_size

  @property
  def total_steps(self) -> int:
    return self.plan.total_steps

  @property
  def final_loss(self) -> float:
    return float(self.loss[-1])

  @property
  def is_baseline(self) -> bool:
    return self.plan.is_baseline

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
    """Times the run read its training tokens, None when the store is unknown."""
    return sum(self.plan.passes(self.train_tokens)) if self.train_tokens else None


def differs(run: EvalCurve, other: EvalCurve) -> str:
  """'' when `run` may be a baseline of `other`, else the first field in which they differ,
  with both values and how many more differ."""
  a, b = run.identity, other.identity
  if a.get(FINGERPRINT) and b.get(FINGERPRINT):
    a, b = ({k: v for k, v in d.items() if k not in STORE_FIELDS} for d in (a, b))
  fields = [k for k in a if k in b and a[k] != b[k]]
  if not fields:
    return ""
  more = f" and {len(fields) - 1} more" if len(fields) > 1 else ""
  return f"{fields[0]} differs ({a[fields[0]]!r}, not {b[fields[0]]!r}){more}"


def identity_of(rundir: RunDir, plan: Plan) -> dict:
  """Returns what a baseline must share with a run: every field of its config.json but FREE_FIELDS,
  its store's fingerprint and its model's parameter counts."""
  fingerprint = (workdir_lib.read_store(rundir) or {}).get("fingerprint")
  return config_identity(record_lib.read_config_json(rundir) or {}, plan, fingerprint)


def config_identity(config: dict, plan: Plan, fingerprint: str | None = None) -> dict:
  """Returns `identity_of` a run of the `config` record (config.json's contents) and `plan`."""
  flat = {k: v for k, v in schema.dotted(config).items() if not k.startswith(FREE_FIELDS)}
  if fingerprint:
    flat[FINGERPRINT] = fingerprint
  return flat | {"parameters": plan.params_total, "active parameters": plan.params_active}


def load_run(workdir: str, name: str | None = None) -> EvalCurve:
  """Reads the eval curve and plan of the run directory of `main.py` that the user named
  `workdir`. An unfinished run is an error."""
  fileio.check_readable(workdir, "the run")
  rundir = RunDir(workdir)
  if not fileio.isfile(rundir.metrics):
    raise errors.DataError(f"{workdir}: has no metrics.jsonl: give run directories of main.py")
  plan, train_tokens = record_lib.plan_and_tokens(rundir)
  evals = {}
  for record in workdir_lib.read_metrics(rundir):
    if "eval_loss" in record:
      evals[record["step"]] = record      # the last line of a step wins (resumed runs)
  if not evals:
    raise errors.DataError(f"{rundir.metrics}: has no eval lines: give runs that reached "
                           "their first eval")
  rows = [evals[s] for s in sorted(evals)]
  if rows[-1]["step"] != plan.total_steps:
    raise errors.DataError(
        f"{workdir}: unfinished (its last eval is at step {rows[-1]['step']} of "
        f"{plan.total_steps}): compare finished runs, whose learning rate has decayed; "
        "the same command resumes it")
  bags = [r["eval_bag_loss"] for r in rows if "eval_bag_loss" in r]
  return EvalCurve(name or rundir.name, workdir,
                   np.array([r["step"] for r in rows], float),
                   np.array([r["eval_loss"] for r in rows]),
                   np.array([r["data_tokens"] for r in rows], float), plan,
                   train_tokens=train_tokens, identity=identity_of(rundir, plan),
                   phase1_bag_loss=bags[-1] if bags else None,
                   final_bpb=rows[-1].get("eval_bpb"))
