"""The run plan: config validation, phases (tst for round(r*T) steps, then ntp), tokens, FLOPs."""

from __future__ import annotations

import dataclasses
import json

from tst_jax import losses, models
from tst_jax.superposition import MODES

EQUAL_FLOPS = ("seq", "batch")


class ConfigError(ValueError):
  """A bad run config, raised before anything is trained or written."""


def _require(ok: bool, field: str, message: str):
  if not ok:
    raise ConfigError(f"config.{field}: {message}")


def validate(config) -> None:
  """Check every field the trainer relies on; one clear message naming the field."""
  tst, data, train, opt = config.tst, config.data, config.train, config.optimizer
  _require(isinstance(tst.bag_size, int) and tst.bag_size >= 1, "tst.bag_size",
           f"must be an integer >= 1, got {tst.bag_size!r}")
  _require(0.0 <= tst.ratio <= 1.0, "tst.ratio", f"must be in [0, 1], got {tst.ratio}")
  _require(tst.mode in MODES, "tst.mode", f"must be one of {MODES}, got {tst.mode!r}")
  _require(tst.equal_flops in EQUAL_FLOPS, "tst.equal_flops",
           f"must be one of {EQUAL_FLOPS}, got {tst.equal_flops!r}")
  try:
    losses.bag_weights(tst.weighting, tst.bag_size)
  except ValueError as e:
    raise ConfigError(f"config.tst.weighting: {e}") from None
  _require(tst.variant in losses.VARIANTS, "tst.variant",
           f"must be one of {losses.VARIANTS}, got {tst.variant!r}")
  _require(train.steps >= 1, "train.steps", f"must be >= 1, got {train.steps}")
  _require(train.nan_policy in ("stop", "skip"), "train.nan_policy",
           f"must be 'stop' or 'skip', got {train.nan_policy!r}")
  _require(data.seq_len >= 1 and data.batch_size >= 1, "data.seq_len/batch_size",
           "must be >= 1")
  if tst.equal_flops == "batch" and tst.mode != "output_only":
    _require(data.seq_len % tst.bag_size == 0, "data.seq_len",
             f"{data.seq_len} must be divisible by tst.bag_size {tst.bag_size} when "
             "tst.equal_flops='batch' (the model sees seq_len / bag_size bags)")
  _require(opt.grad_accum >= 1 and data.batch_size % opt.grad_accum == 0,
           "optimizer.grad_accum",
           f"{opt.grad_accum} must be >= 1 and divide data.batch_size {data.batch_size}")
  _require(0.0 <= opt.decay_fraction <= 1.0, "optimizer.decay_fraction",
           f"must be in [0, 1], got {opt.decay_fraction}")
  _require(opt.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
  _require(opt.lr > 0, "optimizer.lr", f"must be > 0, got {opt.lr}")
  try:
    models.model_config(config.model)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.model: {e}") from None


@dataclasses.dataclass(frozen=True)
class Phase:
  name: str            # "tst" (token superposition) or "ntp" (next-token prediction)
  first_step: int      # global optimizer step at which the phase starts
  steps: int
  bag_size: int        # S (1 for ntp)
  mode: str            # full | input_only | output_only (ntp: "ntp")
  latent_seq_len: int  # positions the model sees
  data_seq_len: int    # data tokens per row (window = data_seq_len + 1)
  batch_size: int
  flops_per_step: float

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

  def to_json(self) -> dict:
    phases = [p.to_json() for p in self.phases]
    return dict(params_total=self.params_total, params_active=self.params_active,
                total_steps=self.total_steps,
                data_tokens_total=sum(p["data_tokens"] for p in phases),
                equivalent_tokens_total=sum(p["equivalent_tokens"] for p in phases),
                flops_total=sum(p["flops_per_step"] * p["steps"] for p in phases),
                phases=phases)


def make_plan(config) -> Plan:
  """Phases of the run from the config (validated first). r = 0 or S = 1 is the baseline."""
  validate(config)
  model_cfg = models.model_config(config.model)
  family = models.module_for(model_cfg)
  total, active = family.param_counts(model_cfg)
  tst, data = config.tst, config.data
  seq, batch, s = data.seq_len, data.batch_size, tst.bag_size
  steps_total = config.train.steps
  tst_steps = round(tst.ratio * steps_total) if s > 1 else 0

  def phase(name, first, steps, bag, mode, latent, data_len, rows):
    flops = family.flops_per_token(model_cfg, latent) * latent * rows
    return Phase(name, first, steps, bag, mode, latent, data_len, rows, flops)

  phases = []
  if tst_steps:
    if tst.mode == "output_only":      # single tokens in, next bag out: data = latent
      phases.append(phase("tst", 0, tst_steps, s, tst.mode, seq, seq, batch))
    elif tst.equal_flops == "seq":     # the paper's choice: data sequence S * L
      phases.append(phase("tst", 0, tst_steps, s, tst.mode, seq, s * seq, batch))
    else:                              # S x the batch of L-token rows, L / S bags each
      phases.append(phase("tst", 0, tst_steps, s, tst.mode, seq // s, seq, s * batch))
  if steps_total - tst_steps:
    phases.append(phase("ntp", tst_steps, steps_total - tst_steps, 1, "ntp", seq, seq, batch))
  return Plan(total, active, tuple(phases))


def format_plan(plan: Plan, resolved=None) -> str:
  """A readable table (and the platform's resolved defaults) then the plan as JSON."""
  def human(x):
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6),
                        ("K", 1e3)):
      if abs(x) >= scale:
        return f"{x / scale:.3g}{unit}"
    return f"{x:g}"

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
  lines.append(json.dumps(summary))
  return "\n".join(lines)
