"""The run plan: config validation, phases (tst for round(r*T) steps, in stages of decreasing S
with tst.schedule, then ntp), tokens, FLOPs, and the warning of a run too short for TST."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os

from tst_jax import losses, models, platform
from tst_jax.errors import ConfigError
from tst_jax.parallel import distributed, mesh as mesh_lib
from tst_jax import superposition as sp
from tst_jax.superposition import MODES

EQUAL_FLOPS = ("seq", "batch")


def _integer(lo: int, hi: int | None = None):
  ok = lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo
                  and (hi is None or v <= hi))
  return ok, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")


def _number(lo: float, hi: float = math.inf, *, open_lo=False, open_hi=False):
  def ok(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      return False
    return (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
  interval = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
  return ok, (f"a number > {lo:g}" if hi == math.inf and open_lo
              else f"a number >= {lo:g}" if hi == math.inf else f"a number in {interval}")


def _one_of(options):
  return (lambda v: isinstance(v, str) and v in options), f"one of {tuple(options)}"


_BOOL = (lambda v: isinstance(v, bool)), "True or False"
_STR = (lambda v: isinstance(v, str)), "a string"
_MESH_AXIS = (lambda v: isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1),
              "an integer >= 1, or -1 (all remaining devices)")

# Every field of the run config but the model's (its dataclass checks those) -> (check, what
# it must be). validate() reports the first failure as 'config.<field>: must be ..., got ...'.
FIELDS = {
    "seed": _integer(0),
    "init_from_hf": _STR,
    "data.source": _STR,
    "data.max_bytes": _integer(0),
    "data.tokenizer": _STR,
    "data.val_fraction": _number(0, 1, open_lo=True, open_hi=True),
    "data.val_piece_bytes": _integer(0),
    "data.seq_len": _integer(1),
    "data.batch_size": _integer(1),
    "data.eval_batches": _integer(1),
    "tst.bag_size": _integer(1),
    "tst.ratio": _number(0, 1),
    "tst.mode": _one_of(MODES),
    "tst.weighting": _STR,
    "tst.variant": _one_of(losses.VARIANTS),
    "tst.equal_flops": _one_of(EQUAL_FLOPS),
    "tst.reinit_at_switch": _BOOL,
    "tst.schedule": _STR,
    "loss.impl": _one_of(platform.LOSS_IMPLS),
    "optimizer.lr": _number(0, open_lo=True),
    "optimizer.b1": _number(0, 1, open_hi=True),
    "optimizer.b2": _number(0, 1, open_hi=True),
    "optimizer.eps": _number(0, open_lo=True),
    "optimizer.weight_decay": _number(0),
    "optimizer.grad_clip": _number(0, open_lo=True),
    "optimizer.warmup_steps": _integer(0),
    "optimizer.decay_fraction": _number(0, 1),
    "optimizer.final_lr_fraction": _number(0, 1),
    "optimizer.grad_accum": _integer(1),
    "train.steps": _integer(1),
    "train.log_every": _integer(1),
    "train.eval_every": _integer(1),
    "train.checkpoint_every": _integer(0),
    "train.keep_checkpoints": _integer(1),
    "train.progress_bar": _BOOL,
    "train.force_resume": _BOOL,
    "train.nan_policy": _one_of(("stop", "skip")),
    "train.max_nan_skips": _integer(0),
    "mesh.data": _MESH_AXIS,
    "mesh.fsdp": _MESH_AXIS,
    "mesh.tensor": _MESH_AXIS,
    "mesh.expert": _MESH_AXIS,
    "mesh.dcn_data": _integer(1),
    "distributed.mode": _one_of(distributed.MODES),
    "distributed.coordinator_address": _STR,
    "distributed.num_processes": _integer(0),
    "distributed.process_id": _integer(-1),
    "distributed.local_device_ids": (
        lambda v: isinstance(v, str) and (not v or all(p.strip().isdigit() for p in v.split(","))),
        "a comma list of device numbers, or ''"),
    "distributed.cpu_devices": _integer(0),
    "distributed.timeout_s": _integer(1),
    "distributed.heartbeat_timeout_s": _integer(1),
}
# Numeric model fields its dataclass does not range-check (MoE fields only where present).
MODEL_FIELDS = {
    "rope_theta": _number(0, open_lo=True),
    "norm_eps": _number(0, open_lo=True),
    "init_std": _number(0, open_lo=True),
    "tie_embeddings": _BOOL,
    "aux_loss_coef": _number(0),
    "router_z_loss_coef": _number(0),
    "norm_topk_prob": _BOOL,
    "rope_scaling": (
        lambda v: v is None or (isinstance(v, (tuple, list)) and len(v) == 4
                                and all(_number(0, open_lo=True)[0](x) for x in v)),
        "None or 4 numbers > 0 (factor, low_freq_factor, high_freq_factor, original_len)"),
}


def _require(ok: bool, field: str, message: str):
  if not ok:
    raise ConfigError(f"config.{field}: {message}")




def validate(config, num_devices: int | None = None) -> None:
  """Check every field of the run config and their combinations, before anything is built;
  the first problem is a ConfigError naming the field. With `num_devices`, also what this
  machine can run: the mesh against that many devices, the platform's kernels."""
  for field, (ok, must) in FIELDS.items():
    section, _, name = field.rpartition(".")
    node = config[section] if section else config
    if name in node:     # fields newer than an old run's config.json are not checked
      _require(ok(node[name]), field, f"must be {must}, got {node[name]!r}")
  for name, (ok, must) in MODEL_FIELDS.items():
    if name in config.model:
      _require(ok(config.model[name]), f"model.{name}", f"must be {must}, got "
               f"{config.model[name]!r}")
  try:
    models.model_config(config.model)
  except (ValueError, TypeError) as e:
    field, _, rest = str(e).partition(" ")   # 'model.<name> <what is wrong>'
    named = field.startswith("model.") and field[-1].isalnum()
    raise ConfigError(f"config.{field}: {rest}" if named else f"config.model: {e}") from None
  _check_rules(config.logical_axis_rules)
  tst, data, opt = config.tst, config.data, config.optimizer
  try:
    stages = bag_schedule(tst)
  except ValueError as e:
    raise ConfigError(f"config.tst.schedule: {e}") from None
  for s in stages:
    try:
      losses.bag_weights(tst.weighting, s)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"config.tst.weighting: {e}") from None
    if tst.equal_flops == "batch" and tst.mode != "output_only":
      _require(data.seq_len % s == 0, "data.seq_len",
               f"{data.seq_len} must be divisible by tst.bag_size {s} when "
               "tst.equal_flops='batch' (the model sees seq_len / bag_size bags)")
  _require(data.batch_size % opt.grad_accum == 0, "optimizer.grad_accum",
           f"{opt.grad_accum} must divide data.batch_size {data.batch_size}")
  if data.tokenizer == "bpe":
    _require(config.model.vocab_size >= 257, "model.vocab_size",
             f"{config.model.vocab_size} is too small for data.tokenizer='bpe', which needs "
             "256 byte tokens + EOS: use >= 257")
  elif data.tokenizer:
    _require(data.tokenizer.endswith((".json", ".model")), "data.tokenizer",
             f"{data.tokenizer!r} is not 'bpe', a tokenizer.json or a SentencePiece .model")
  if num_devices is not None:
    model_cfg = models.model_config(config.model)
    if model_cfg.attention_impl == "cudnn":
      why_not = platform.cudnn_unavailable(model_cfg.dtype, model_cfg.head_dim)
      _require(why_not is None, "model.attention_impl", f"'cudnn': {why_not}; use 'auto'")
    sizes = mesh_lib.mesh_shape(config.mesh, num_devices)
    _require(sizes["data"] % config.mesh.dcn_data == 0, "mesh.dcn_data",
             f"{config.mesh.dcn_data} must divide the data axis ({sizes['data']})")


def _check_rules(rules):
  """logical_axis_rules: (logical name, None | mesh axis | tuple of mesh axes) pairs."""
  def axes_ok(target):
    names = (target,) if isinstance(target, str) else target
    return target is None or (isinstance(names, (tuple, list))
                              and all(n in mesh_lib.MESH_AXES for n in names))
  for rule in rules if isinstance(rules, (tuple, list)) else [None]:
    _require(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
             and axes_ok(rule[1]), "logical_axis_rules",
             f"each rule must be (logical name, None | a mesh axis of {mesh_lib.MESH_AXES} | "
             f"a tuple of them), got {rule!r}")


def missing_data_fields(d) -> list[str]:
  """The fields of config.data a run needs but leaves empty (a tokens: store has a tokenizer)."""
  needed = ("source",) if d.source.startswith("tokens:") else ("source", "tokenizer")
  return [f for f in needed if not d[f]]


def check_paths(config) -> None:
  """The files a train or eval run reads exist (plan mode does not need them)."""
  d = config.data
  for field in missing_data_fields(d):
    _require(False, f"data.{field}", "is empty: set it (the paper configs need a token store of "
             "your copy of the data, or the data and the Llama-3 tokenizer.json; see the "
             "config's docstring)")
  kind, _, pattern = d.source.partition(":")
  if kind in ("text", "jsonl", "parquet"):
    matches = glob.iglob(os.path.expanduser(pattern), recursive=True)
    _require(any(os.path.isfile(p) for p in matches), "data.source",
             f"{pattern!r} matches no files: give a glob of {kind} files, e.g. "
             f"'{kind}:/data/corpus/**/*.{dict(text='txt').get(kind, kind)}'")
  if kind == "tokens":
    _require(os.path.isfile(os.path.join(os.path.expanduser(pattern), "manifest.json")),
             "data.source", f"{pattern!r} is not a token store (no manifest.json): make one "
             "with python -m tst_jax.data.prepare --out=DIR (docs/data.md)")
  if d.tokenizer not in ("", "bpe"):     # "" only with a store, which has its own
    _require(os.path.isfile(d.tokenizer), "data.tokenizer",
             f"file {d.tokenizer!r} does not exist: give the path of a tokenizer.json or .model, "
             "or 'bpe' to train one on the data")
  if config.init_from_hf:
    _require(os.path.isdir(config.init_from_hf), "init_from_hf",
             f"{config.init_from_hf!r} is not a folder: give a Hugging Face model folder "
             "(e.g. one written by python -m tst_jax.tools.export), or '' to start from scratch")


def bag_schedule(tst) -> tuple[int, ...]:
  """S of each stage of phase 1, from tst.schedule: '' is the paper's hard switch, one stage
  of tst.bag_size; 'halve' is S, S/2, S/4, ... down to 2; 'S1,S2,...' (decreasing, each >= 2,
  S1 = tst.bag_size) gives them. Each stage is a tst phase of an equal share of the round(r*T)
  phase-1 steps at the same FLOPs per step; ntp (S = 1) follows."""
  spec = tst.schedule.strip() if "schedule" in tst else ""   # an old run's config.json
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


def _data_length(latent_len: int, bag_size: int, mode: str) -> int:
  """T of a phase: L for ntp, else what its superposition mode reads."""
  return latent_len if mode == "ntp" else sp.data_length(latent_len, bag_size, mode)


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
  data_seq_len: int    # T, data tokens per row (window W = T + 1)
  batch_size: int      # B, global rows
  flops_per_step: float
  weighting: str = "uniform"   # the MCE's bag weighting (tst)
  variant: str = "mce"         # mce | alt (tst)

  def __post_init__(self):
    want = _data_length(self.latent_seq_len, self.bag_size, self.mode)
    if self.data_seq_len != want or (self.mode == "ntp") != (self.bag_size == 1):
      raise ValueError(f"phase {self.name}: {self.data_seq_len} data tokens per row for "
                       f"L={self.latent_seq_len}, S={self.bag_size}, mode {self.mode!r}; "
                       f"that mode reads {want}")

  @property
  def is_tst(self) -> bool:
    return self.mode != "ntp"

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
    reads steps x B x T tokens, as data.stream_position)."""
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

  def phase(name, first, steps, bag, mode, latent, rows):
    flops = family.flops_per_token(model_cfg, latent) * latent * rows
    loss = dict(weighting=tst.weighting, variant=tst.variant) if mode != "ntp" else {}
    return Phase(name, first, steps, bag, mode, latent, _data_length(latent, bag, mode), rows,
                 flops, **loss)

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


def ntp_tokens_per_param(plan: Plan) -> float | None:
  """Next-token tokens (B x L per step) after the last tst phase, per active parameter; None
  for a run with no tst phase (a baseline)."""
  if not any(p.is_tst for p in plan.phases):
    return None
  ntp = sum(p.steps * p.equivalent_tokens_per_step for p in plan.phases if not p.is_tst)
  return ntp / max(plan.params_active, 1)


def behind_baseline_warning(plan: Plan) -> str | None:
  """The warning of a TST run too short for TST to pay (PAYS_FROM_NTP_TOKENS_PER_PARAM)."""
  ratio = ntp_tokens_per_param(plan)
  if ratio is None or ratio >= PAYS_FROM_NTP_TOKENS_PER_PARAM:
    return None
  return (f"warning: {BEHIND_WARNING} (its next-token phase sees {ratio:.2g} tokens per "
          f"parameter; TST has paid from about {PAYS_FROM_NTP_TOKENS_PER_PARAM:g})")


def format_plan(plan: Plan, resolved=None, with_json: bool = True) -> str:
  """A readable table (and the platform's resolved defaults), then the plan as JSON."""
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
  warning = behind_baseline_warning(plan)
  if warning:
    lines.append(warning)
  if with_json:
    lines.append(json.dumps(summary))
  return "\n".join(lines)
