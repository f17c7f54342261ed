"""The run plan: phases (tst for round(r*T) steps, in stages of decreasing S with
tst.schedule, then ntp), their tokens and FLOPs, and the warning of a run too short for TST."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from tst_jax import models
from tst_jax import superposition as sp
from tst_jax.analysis.frontier import Trend
from tst_jax.train.console import human

EQUAL_FLOPS = ("seq", "batch")


def bag_schedule(tst) -> tuple[int, ...]:
  """S of each stage of phase 1, from tst.schedule: '' is the paper's hard switch, one stage
  of tst.bag_size; 'halve' is S, S/2, S/4, ... down to 2; 'S1,S2,...' (decreasing, each >= 2,
  S1 = tst.bag_size) gives them. Each stage is a tst phase of an equal share of the round(r*T)
  phase-1 steps at the same FLOPs per step; ntp (S = 1) follows."""
  spec = tst.schedule.strip()
  s = tst.bag_size
  if spec in ("", "halve"):
    stages = [s]
    while spec and stages[-1] // 2 >= 2:
      stages.append(stages[-1] // 2)
    return tuple(stages)
  parts = [p.strip() for p in spec.split(",")]
  if not all(p.isdigit() for p in parts):
    raise ValueError(f"must be '', 'halve' or a comma list of bag sizes, got {spec!r}")
  stages = tuple(int(p) for p in parts)
  if stages[0] != s or any(b >= a for a, b in zip(stages, stages[1:])) or stages[-1] < 2:
    raise ValueError(f"{spec!r}: the bag sizes must start at tst.bag_size ({s}), decrease, "
                     "and stay >= 2 (S = 1 is the ntp phase that follows)")
  return stages


def _stage_steps(steps: int, stages: int) -> list[int]:
  """`steps` shared by `stages` as equally as can be (the first ones get one more)."""
  return [steps // stages + (k < steps % stages) for k in range(stages)]


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase's settings: the single source of its batches (window, rows) and its loss
  (bag size, mode, weighting, variant)."""
  name: str            # "tst" (token superposition) or "ntp" (next-token prediction)
  first_step: int      # global optimizer step at which the phase starts
  steps: int
  bag_size: int        # S (1 for ntp)
  mode: str            # full | input_only | output_only (ntp: "ntp")
  latent_seq_len: int  # L, positions the model sees
  batch_size: int      # B, global rows
  flops_per_step: float
  weighting: str = "uniform"   # the MCE's bag weighting (tst)
  variant: str = "mce"         # mce | alt (tst)

  def __post_init__(self):
    if (self.mode == "ntp") != (self.bag_size == 1):
      raise ValueError(f"phase {self.name}: mode {self.mode!r} with S={self.bag_size}: the "
                       "ntp phase and only it has S = 1")

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

  def to_json(self) -> dict:
    return dict(name=self.name, steps=self.steps, bag_size=self.bag_size, mode=self.mode,
                weighting=self.weighting, variant=self.variant,
                latent_seq_len=self.latent_seq_len, data_seq_len=self.data_seq_len,
                batch_size=self.batch_size, data_tokens=self.steps * self.data_tokens_per_step,
                equivalent_tokens=self.steps * self.equivalent_tokens_per_step,
                flops_per_step=self.flops_per_step)


@dataclasses.dataclass(frozen=True)
class Plan:
  params_total: int
  params_active: int
  phases: tuple[Phase, ...]

  @property
  def total_steps(self) -> int:
    return sum(p.steps for p in self.phases)

  def phase_at(self, step: int) -> Phase:
    for phase in self.phases:
      if step < phase.last_step:
        return phase
    return self.phases[-1]

  def data_start(self, phase: Phase) -> int:
    """Stream position where `phase` starts: right where the previous phases stopped (each
    reads steps x B x T tokens). The one home of a phase's start in the stream."""
    earlier = self.phases[:self.phases.index(phase)]
    return sum(p.steps * p.data_tokens_per_step for p in earlier)

  def tokens_at(self, step: int) -> dict:
    """Data tokens and equivalent tokens (model positions) consumed by the end of `step`."""
    done = [(min(max(step - p.first_step, 0), p.steps), p) for p in self.phases]
    return dict(data_tokens=sum(n * p.data_tokens_per_step for n, p in done),
                equivalent_tokens=sum(n * p.equivalent_tokens_per_step for n, p in done))

  def to_json(self) -> dict:
    phases = [p.to_json() for p in self.phases]
    return dict(params_total=self.params_total, params_active=self.params_active,
                total_steps=self.total_steps,
                data_tokens_total=sum(p["data_tokens"] for p in phases),
                equivalent_tokens_total=sum(p["equivalent_tokens"] for p in phases),
                flops_total=sum(p["flops_per_step"] * p["steps"] for p in phases),
                phases=phases)


def make_plan(model_cfg, tst, seq_len: int, batch_size: int, total_steps: int) -> Plan:
  """Phases of a run of `total_steps` (T) from the model's config dataclass, the tst section
  (checked) and the data's L and B. r = 0 or S = 1 is the baseline."""
  family = models.module_for(model_cfg)
  total, active = family.param_counts(model_cfg)
  seq, batch, s = seq_len, batch_size, tst.bag_size
  steps_total = total_steps
  tst_steps = round(tst.ratio * steps_total) if s > 1 else 0

  def phase(name, first, steps, bag, mode, latent, rows):
    flops = family.flops_per_token(model_cfg, latent) * latent * rows
    loss = dict(weighting=tst.weighting, variant=tst.variant) if mode != "ntp" else {}
    return Phase(name, first, steps, bag, mode, latent, rows, flops, **loss)

  phases, first = [], 0
  stages = bag_schedule(tst)     # one tst phase per stage (its own S, data region and step)
  for bag, steps in zip(stages, _stage_steps(tst_steps, len(stages))):
    if not steps:
      continue
    if tst.equal_flops == "batch" and tst.mode != "output_only":
      phases.append(phase("tst", first, steps, bag, tst.mode, seq // bag, bag * batch))
    else:   # the paper's choice: L positions of S-token bags, a data sequence of S x L
      phases.append(phase("tst", first, steps, bag, tst.mode, seq, batch))
    first += steps
  if steps_total - tst_steps:
    phases.append(phase("ntp", tst_steps, steps_total - tst_steps, 1, "ntp", seq, batch))
  return Plan(total, active, tuple(phases))


# Where TST starts to pay (docs/results.md, "Where TST starts to pay"): its next-token phase
# must see this many tokens per active parameter to catch up with the baseline. At GPU scale
# (33.6M parameters) TST crossed its baseline 600-700 next-token steps after the switch
# (0.59-0.68 tokens per parameter) and ended 0.05 nats ahead; every CPU-scale run (1-2M
# parameters, <= 0.35 per parameter) ended behind. One crossing measured: the GPU ladder that
# would refine it is still to be run (the command is in docs/results.md).
PAYS_FROM_NTP_TOKENS_PER_PARAM = 0.7
BEHIND_WARNING = "at this length TST is expected to end behind its baseline: docs/results.md"
# The measured trend of the equal-loss speed-up against tokens per parameter
# (`python -m tst_jax.tools.ladder`; docs/results.md, "The speed-up ladder").
TREND_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speedup_trend.json")


def ntp_tokens_per_param(plan: Plan) -> float | None:
  """Next-token tokens (B x L per step) after the last tst phase, per active parameter; None
  for a run with no tst phase (a baseline)."""
  if not any(p.is_tst for p in plan.phases):
    return None
  ntp = sum(p.steps * p.equivalent_tokens_per_step for p in plan.phases if not p.is_tst)
  return ntp / max(plan.params_active, 1)


def tokens_per_param(plan: Plan) -> float:
  """Model positions of the whole run (B x L per step) per active parameter."""
  return plan.tokens_at(plan.total_steps)["equivalent_tokens"] / max(plan.params_active, 1)


def behind_baseline_warning(plan: Plan, trend: Trend | None = None) -> str | None:
  """The warning of a TST run too short for TST to pay: where the measured `trend` covers
  the run, when it predicts a speed-up below 1; elsewhere by the rule of its next-token
  phase (PAYS_FROM_NTP_TOKENS_PER_PARAM)."""
  ratio = ntp_tokens_per_param(plan)
  if ratio is None:
    return None
  predicted = trend.predict(tokens_per_param(plan)) if trend else None
  if predicted is not None:
    return None if predicted >= 1 else (f"warning: {BEHIND_WARNING} (the measured trend "
                                        f"predicts {predicted:.2f}x at this length)")
  if ratio >= PAYS_FROM_NTP_TOKENS_PER_PARAM:
    return None
  return (f"warning: {BEHIND_WARNING} (its next-token phase sees {ratio:.2g} tokens per "
          f"parameter; TST has paid from about {PAYS_FROM_NTP_TOKENS_PER_PARAM:g})")


@functools.cache
def measured_trend() -> Trend | None:
  """The shipped fit of the ladder's points (None when there is none)."""
  return Trend.load(TREND_FILE) if os.path.isfile(TREND_FILE) else None


def pays_line(plan: Plan, trend: Trend | None) -> str | None:
  """For a TST run: its tokens per parameter and the speed-up the measured trend predicts
  there, or why it predicts none."""
  if ntp_tokens_per_param(plan) is None:
    return None
  x = tokens_per_param(plan)
  line = f"where TST pays: {x:.3g} tokens per parameter; equal-loss speed-up "
  if trend is None:
    return line + "not predicted (no measured trend: python -m tst_jax.tools.ladder)"
  predicted = trend.predict(x)
  if predicted is None:
    return line + (f"not predicted: outside the measured range ({trend.low:.3g} to "
                   f"{trend.high:.3g} tokens per parameter, docs/results.md)")
  return line + (f"predicted {predicted:.2f}x by the trend of {len(trend.points)} measured "
                 f"runs ({trend.low:.3g} to {trend.high:.3g} tokens per parameter, "
                 "docs/results.md)")


def passes(plan: Plan, train_tokens: int) -> list[float]:
  """How many times each phase reads the training tokens (its data tokens over theirs)."""
  return [p.steps * p.data_tokens_per_step / train_tokens for p in plan.phases]


def data_lines(plan: Plan, tokens) -> list[str]:
  """The passes over the training data (`tokens`: run_data.TrainTokens, None when unknown)
  and a warning when the run reads any of its tokens more than once."""
  if tokens is None:
    return ["data: training tokens counted once data.source is tokenized (the run's plan "
            "then says how many times it reads them)"]
  each = passes(plan, tokens.count)
  total, at_least = sum(each), "" if tokens.exact else ">= "
  per_phase = ", ".join(f"{_label(p)} {at_least}{x:.3g}" for p, x in zip(plan.phases, each))
  lines = [f"data: {'' if tokens.exact else 'at most '}{human(tokens.count)} training tokens "
           f"({tokens.where}); passes over them: {per_phase}, the run {at_least}{total:.3g}"]
  if total > 1:
    lines.append(f"warning: the data repeats: the run reads its training tokens "
                 f"{'at least ' if at_least else ''}{total:.3g} times; a repeated token teaches "
                 "less than a new one (docs/data.md, 'Passes over the data')")
  return lines


def _label(phase: Phase) -> str:
  return phase.name + (f" S={phase.bag_size}" if phase.is_tst else "")


def format_plan(plan: Plan, resolved=None, with_json: bool = True, tokens=None) -> str:
  """A readable table, the platform's resolved defaults, the passes over the data (`tokens`:
  run_data.TrainTokens) and what to expect of TST at this length, then the plan as JSON."""
  lines = [f"parameters: {human(plan.params_total)} total, {human(plan.params_active)} active",
           f"{'phase':<6}{'steps':>9}{'S':>4}{'mode':>13}{'latent L':>10}{'data L':>8}"
           f"{'batch':>7}{'data tok/step':>15}{'data tokens':>13}{'equiv tokens':>14}"
           f"{'FLOPs/step':>12}"]
  for p in plan.phases:
    j = p.to_json()
    lines.append(f"{p.name:<6}{p.steps:>9}{p.bag_size:>4}{p.mode:>13}{p.latent_seq_len:>10}"
                 f"{p.data_seq_len:>8}{p.batch_size:>7}{human(p.data_tokens_per_step):>15}"
                 f"{human(j['data_tokens']):>13}{human(j['equivalent_tokens']):>14}"
                 f"{human(p.flops_per_step):>12}")
  summary = plan.to_json()
  lines.append(f"total: {plan.total_steps} steps, {human(summary['data_tokens_total'])} data "
               f"tokens, {human(summary['equivalent_tokens_total'])} equivalent tokens, "
               f"{human(summary['flops_total'])} FLOPs")
  if resolved is not None:
    lines.append(resolved.line())
  lines += data_lines(plan, tokens)
  trend = measured_trend()
  lines += filter(None, [pays_line(plan, trend), behind_baseline_warning(plan, trend)])
  if with_json:
    if tokens is not None:
      summary["data"] = dict(train_tokens=tokens.count, exact=tokens.exact,
                             passes=passes(plan, tokens.count))
    lines.append(json.dumps(summary))
  return "\n".join(lines)
