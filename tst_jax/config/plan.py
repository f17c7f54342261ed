"""The run plan: phases (tst for round(r*T) steps, as several tst phases of decreasing S with
tst.schedule, then ntp), their tokens, FLOPs and stream regions, and plan.json's record."""

from __future__ import annotations

import dataclasses

import numpy as np

from tst_jax import models, platform
from tst_jax import superposition as sp
from tst_jax.data.run_data import TrainTokens
from tst_jax.models import mtp as mtp_lib

EQUAL_FLOPS = ("seq", "batch")


def bag_schedule(tst) -> tuple[int, ...]:
  """S of each tst phase of phase 1, from tst.schedule: '' is the paper's hard switch, one
  tst phase of tst.bag_size. 'halve' is S, S/2, S/4, ... down to 2, and 'S1,S2,...' gives
  them, decreasing, each >= 2, S1 = tst.bag_size. Each gets an equal share of the round(r*T)
  phase-1 steps at the same FLOPs per step, and ntp with S = 1 follows."""
  text = tst.schedule.strip()
  if text in ("", "halve"):
    bag_sizes = [tst.bag_size]
    while text and bag_sizes[-1] // 2 >= 2:
      bag_sizes.append(bag_sizes[-1] // 2)
    return tuple(bag_sizes)
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() for p in parts):
    raise ValueError(f"must be '', 'halve' or a comma list of bag sizes, got {text!r}")
  bag_sizes = tuple(int(p) for p in parts)
  if (bag_sizes[0] != tst.bag_size or any(b >= a for a, b in zip(bag_sizes, bag_sizes[1:]))
      or bag_sizes[-1] < 2):
    raise ValueError(f"{text!r}: the bag sizes must start at tst.bag_size ({tst.bag_size}), "
                     "decrease, and stay >= 2 (S = 1 is the ntp phase that follows)")
  return bag_sizes


def _shares(steps: int, parts: int) -> list[int]:
  """`steps` shared by `parts` as equally as can be (the first ones get one more)."""
  return [steps // parts + (k < steps % parts) for k in range(parts)]


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase's settings: the single source of its batches (window, rows) and its loss
  (bag size, mode, weighting, variant, and the tokens of multi-token prediction)."""
  name: str            # "tst" (token superposition) or "ntp" (next-token prediction)
  first_step: int      # global optimizer step at which the phase starts
  steps: int
  bag_size: int        # S (1 for ntp)
  mode: str            # full | input_only | output_only (ntp: "ntp")
  latent_seq_len: int  # L, positions the model sees
  batch_size: int      # B, global rows
  flops_per_step: float
  weighting: str = "uniform"   # the MCE's bag weighting (tst)
  variant: str = "mce"         # a loss variant of losses.VARIANTS (tst)
  mtp_k: int = 1               # tokens predicted per position, the next included (ntp; 1: no MTP)
  mtp_weight: float = 0.0      # λ of the further tokens' mean CE (models/mtp.py)
  mtp_flops_per_step: float = 0.0   # the MTP heads' share of flops_per_step

  def __post_init__(self):
    if (self.mode == "ntp") != (self.bag_size == 1):
      raise ValueError(f"phase {self.name}: mode {self.mode!r} with S={self.bag_size}: the "
                       "ntp phase and only it has S = 1")
    if self.mtp_k > 1 and self.mode != "ntp":
      raise ValueError(f"phase {self.name}: multi-token prediction runs in the ntp phase only")

  @property
  def is_tst(self) -> bool:
    return self.mode != "ntp"

  @property
  def data_seq_len(self) -> int:
    """T, data tokens per row (window W = T + 1): what the phase's view reads."""
    return sp.data_length(self.latent_seq_len, self.bag_size, self.mode)

  @property
  def window(self) -> int:
    return self.data_seq_len + 1

  @property
  def last_step(self) -> int:
    return self.first_step + self.steps

  @property
  def data_tokens_per_step(self) -> int:
    return self.batch_size * self.data_seq_len

  @property
  def equivalent_tokens_per_step(self) -> int:
    """Model positions per step (tokens or s-tokens: the paper's 'equivalent tokens')."""
    return self.batch_size * self.latent_seq_len

  @property
  def data_tokens(self) -> int:
    """Of the whole phase: the length of its region of the training stream."""
    return self.steps * self.data_tokens_per_step

  @property
  def equivalent_tokens(self) -> int:
    return self.steps * self.equivalent_tokens_per_step

  def to_json(self) -> dict:
    """Every field (`from_json` reads them back) and the counts derived from them."""
    return dict(name=self.name, first_step=self.first_step, steps=self.steps,
                bag_size=self.bag_size, mode=self.mode, weighting=self.weighting,
                variant=self.variant, mtp_k=self.mtp_k, mtp_weight=self.mtp_weight,
                mtp_flops_per_step=self.mtp_flops_per_step,
                latent_seq_len=self.latent_seq_len,
                data_seq_len=self.data_seq_len, batch_size=self.batch_size,
                data_tokens=self.data_tokens, equivalent_tokens=self.equivalent_tokens,
                flops_per_step=self.flops_per_step)

  @classmethod
  def from_json(cls, record: dict) -> Phase:
    """Reads a phase back from its `to_json` record, ignoring the derived counts in it. A
    field a record written before it existed lacks takes its default."""
    return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})


@dataclasses.dataclass(frozen=True)
class Plan:
  params_total: int      # the model's, which export keeps
  params_active: int
  phases: tuple[Phase, ...]
  ratio: float = 0.0     # r, tst.ratio: the share of the steps in phase 1, 0 without one
  params_mtp: int = 0    # the MTP heads', which only training uses
  mtp_kind: str = ""     # mtp.kind of the heads, '' without MTP

  @property
  def is_baseline(self) -> bool:
    """Says whether the run is plain next-token training: no tst phase and no multi-token
    prediction."""
    return all(not p.is_tst and p.mtp_k == 1 for p in self.phases)

  @property
  def total_steps(self) -> int:
    return sum(p.steps for p in self.phases)

  @property
  def switch_step(self) -> int | None:
    """Returns the global step of the switch to next-token training, where a tst phase ends
    and an ntp phase starts; None without one."""
    return next((b.first_step for a, b in zip(self.phases, self.phases[1:])
                 if a.is_tst and not b.is_tst), None)

  def phase_at(self, step: int) -> Phase:
    for phase in self.phases:
      if step < phase.last_step:
        return phase
    return self.phases[-1]

  def data_start(self, phase: Phase) -> int:
    """Stream position where `phase` starts: right where the previous phases stopped (each
    reads steps x B x T tokens). The one home of a phase's start in the stream."""
    earlier = self.phases[:self.phases.index(phase)]
    return sum(p.data_tokens for p in earlier)

  def tokens_at(self, step: int) -> dict:
    """Data tokens and equivalent tokens (model positions) consumed by the end of `step`."""
    done = [(min(max(step - p.first_step, 0), p.steps), p) for p in self.phases]
    return dict(data_tokens=sum(n * p.data_tokens_per_step for n, p in done),
                equivalent_tokens=sum(n * p.equivalent_tokens_per_step for n, p in done))

  def flops_at(self, step):
    """Training FLOPs after `step` optimizer steps (fractional steps, and arrays of them)."""
    step = np.asarray(step, dtype=np.float64)
    return sum(np.clip(step - p.first_step, 0, p.steps) * p.flops_per_step
               for p in self.phases)

  @property
  def flops_total(self) -> float:
    return float(self.flops_at(self.total_steps))

  @property
  def data_tokens_total(self) -> int:
    return self.tokens_at(self.total_steps)["data_tokens"]

  @property
  def equivalent_tokens_total(self) -> int:
    return self.tokens_at(self.total_steps)["equivalent_tokens"]

  def passes(self, train_tokens: int) -> list[float]:
    """Returns how many times each phase reads `train_tokens` training tokens: its data tokens
    over theirs. The run's passes are their sum."""
    return [p.data_tokens / train_tokens for p in self.phases]

  @property
  def tokens_per_param(self) -> float:
    """Model positions of the whole run (B x L per step) per active parameter."""
    return self.equivalent_tokens_total / max(self.params_active, 1)

  @property
  def ntp_tokens_per_param(self) -> float | None:
    """Next-token tokens, B x L per step, after the last tst phase, per active parameter.
    None for a baseline, which has no tst phase."""
    if not any(p.is_tst for p in self.phases):
      return None
    ntp = sum(p.equivalent_tokens for p in self.phases if not p.is_tst)
    return ntp / max(self.params_active, 1)

  def to_json(self) -> dict:
    """Every field (`from_json` reads them back), each phase with its region of the training
    stream (data_start, data_tokens), and the totals."""
    return dict(params_total=self.params_total, params_active=self.params_active,
                params_mtp=self.params_mtp, mtp_kind=self.mtp_kind,
                ratio=self.ratio, total_steps=self.total_steps,
                data_tokens_total=self.data_tokens_total,
                equivalent_tokens_total=self.equivalent_tokens_total,
                flops_total=self.flops_total, tokens_per_param=self.tokens_per_param,
                ntp_tokens_per_param=self.ntp_tokens_per_param,
                phases=[dict(p.to_json(), data_start=self.data_start(p)) for p in self.phases])

  @classmethod
  def from_json(cls, record: dict) -> Plan:
    """Reads a plan back from its `to_json` record. A sweep_point.json without first_step and
    ratio gets phases that follow each other, and r as the share of the steps in tst phases."""
    phases, first = [], 0
    for p in record["phases"]:
      phases.append(Phase.from_json({"first_step": first, **p}))
      first += p["steps"]
    tst_share = sum(p.steps for p in phases if p.is_tst) / max(first, 1)
    return cls(record["params_total"], record["params_active"], tuple(phases),
               record.get("ratio", tst_share), record.get("params_mtp", 0),
               record.get("mtp_kind", ""))


def make_plan(model_cfg: models.ModelConfig, tst, seq_len: int, batch_size: int,
              total_steps: int, mtp: mtp_lib.Mtp | None = None) -> Plan:
  """Phases of a run of `total_steps` (T) from the model's config dataclass, the tst section
  (checked) and the data's L and B. r = 0 or S = 1 is the baseline.

  With multi-token prediction (`mtp`, config.mtp) the ntp phase predicts k tokens a position,
  and its FLOPs per step grow by the heads'. Under mtp.equal_flops the phase runs fewer steps,
  round(steps x base / MTP FLOPs per step), so that the run costs what it would without MTP.
  Fewer steps and not fewer rows: the batch keeps its shape on the mesh and its
  learning-rate-to-batch relation, and the steps round far finer than B rows would.
  """
  total, active = model_cfg.param_counts()
  seq, batch = seq_len, batch_size
  steps_total = total_steps
  tst_steps = round(tst.ratio * steps_total) if tst.bag_size > 1 else 0
  mtp = mtp if mtp is not None and mtp.on else None

  def phase(name, first, steps, bag, mode, latent, rows, **loss):
    flops = model_cfg.flops_per_token(latent) * latent * rows
    if loss.get("mtp_k", 1) > 1:
      loss["mtp_flops_per_step"] = mtp_lib.flops_per_token(model_cfg, mtp, latent) * latent * rows
      flops += loss["mtp_flops_per_step"]
    if mode != "ntp":
      loss = dict(weighting=tst.weighting, variant=tst.variant)
    return Phase(name, first, steps, bag, mode, latent, rows, flops, **loss)

  phases, first = [], 0
  bag_sizes = bag_schedule(tst)   # one tst phase each (its own S, data region and step)
  for bag, steps in zip(bag_sizes, _shares(tst_steps, len(bag_sizes))):
    if not steps:
      continue
    if tst.equal_flops == "batch" and tst.mode != "output_only":
      phases.append(phase("tst", first, steps, bag, tst.mode, seq // bag, bag * batch))
    else:   # the paper's choice: L positions of S-token bags, a data sequence of S x L
      phases.append(phase("tst", first, steps, bag, tst.mode, seq, batch))
    first += steps
  ntp_steps = steps_total - tst_steps
  if ntp_steps and mtp is not None:
    ntp = phase("ntp", tst_steps, ntp_steps, 1, "ntp", seq, batch, mtp_k=mtp.k,
                mtp_weight=mtp.loss_weight)
    if mtp.equal_flops:
      base = ntp.flops_per_step - ntp.mtp_flops_per_step
      ntp = dataclasses.replace(ntp, steps=max(1, round(ntp_steps * base / ntp.flops_per_step)))
    phases.append(ntp)
  elif ntp_steps:
    phases.append(phase("ntp", tst_steps, ntp_steps, 1, "ntp", seq, batch))
  return Plan(total, active, tuple(phases), float(tst.ratio) if tst_steps else 0.0,
              mtp_lib.param_count(model_cfg, mtp) if mtp else 0, mtp.kind if mtp else "")


@dataclasses.dataclass(frozen=True)
class PlanRecord:
  """What a run's plan.json holds (process 0 writes it as the run starts, and again on
  resume): the plan, the training tokens of the store it reads (the passes over them) and
  the resolved `auto` choices. `from_json` reads it back typed."""
  plan: Plan
  tokens: TrainTokens | None = None          # None: not known before the data is tokenized
  resolved: platform.Resolved | None = None  # None: not on a platform yet

  def to_json(self) -> dict:
    data = None
    if self.tokens is not None:
      each = self.plan.passes(self.tokens.count)
      data = dict(train_tokens=self.tokens.count, exact=self.tokens.exact,
                  where=self.tokens.where, passes=each, passes_total=sum(each))
      if self.tokens.mixture is not None:     # each source's store: its passes
        data["sources"] = [dict(source=w, train_tokens=n, passes=x, passes_total=sum(x))
                           for w, n, x in self.tokens.passes(self.plan)]
      stages = self.tokens.stage_passes(self.plan)
      if stages:     # data.mixture_stages: what each stage reads of each source
        data["stages"] = [dict(first_step=read.stage.first_step, steps=read.steps,
                               phases=[self.plan.phases[i].name for i in read.phases],
                               weights={e.source: e.weight for e in read.stage.entries},
                               tokens=read.tokens, passes=passes)
                          for read, passes in stages]
    return self.plan.to_json() | dict(
        data=data, resolved=self.resolved.to_json() if self.resolved else None)

  @classmethod
  def from_json(cls, record: dict) -> PlanRecord:
    data, resolved = record.get("data"), record.get("resolved")
    return cls(Plan.from_json(record),
               TrainTokens(data["train_tokens"], data["exact"], data["where"]) if data else None,
               platform.Resolved.from_json(resolved) if resolved else None)
