"""A run's config, checked once into a frozen, typed spec: the one home of every field's rule.

`check(config)` checks every field and combination (no device needed) and builds, once, what
the rest of a run reads: the model's config dataclass, the plan, the data settings. Then
`spec.on_platform()` resolves each `auto` for the platform, and a train or eval run adds
`check_devices` (the mesh, the kernels) and `check_paths` (the files). A bad field is a
`ConfigError(field, message)` before anything is built.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from typing import Any

import ml_collections

from tst_jax import losses, models, platform
from tst_jax.data.run_data import DataSpec, check_paths as check_data_paths
from tst_jax.errors import ConfigError
from tst_jax.kernels import fp8
from tst_jax.parallel import distributed, mesh as mesh_lib
from tst_jax.superposition import MODES
from tst_jax.train.plan import EQUAL_FLOPS, Plan, bag_schedule, make_plan


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
# it must be). check() reports the first failure as 'config.<field>: must be ..., got ...'.
FIELDS = {
    "seed": _integer(0),
    "init_from_hf": _STR,
    "data.source": _STR,
    "data.max_bytes": _integer(0),
    "data.tokenizer": _STR,
    "data.text_field": _STR,
    "data.seed": _integer(-1),                  # -1: the run's seed
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
    "reference.name": _STR,
    "reference.loss": _number(0),
    "reference.measured": _STR,
    "reference.command": _STR,
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
    raise ConfigError(field, message)


@dataclasses.dataclass(frozen=True)
class TstSpec:
  """config.tst: phase 1's settings (the plan makes each phase's own from them)."""
  bag_size: int            # S
  ratio: float             # r: round(r·T) phase-1 steps
  mode: str                # full | input_only | output_only
  weighting: str           # uniform | power | exponential | first | fitted:<F.json>
  variant: str             # mce | alt
  equal_flops: str         # seq | batch
  reinit_at_switch: bool   # the randomisation ablation
  schedule: str            # phase 1's stages: '' (one) | halve | 'S1,S2,...' (plan.bag_schedule)


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """config.loss."""
  impl: str                # naive | xla | pallas (auto before `on_platform`)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """config.optimizer: AdamW and one WSD schedule over both phases."""
  lr: float
  b1: float
  b2: float
  eps: float
  weight_decay: float
  grad_clip: float
  warmup_steps: int
  decay_fraction: float
  final_lr_fraction: float
  grad_accum: int


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """config.train: the loop's cadences and policies."""
  steps: int               # T, both phases
  log_every: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  progress_bar: bool
  force_resume: bool
  nan_policy: str          # stop | skip
  max_nan_skips: int


@dataclasses.dataclass(frozen=True)
class ReferenceSpec:
  """config.reference: a measured result the run's final block prints beside its own."""
  name: str                # "" : none
  loss: float
  measured: str
  command: str


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """config.mesh: axis sizes (-1 fills), and the slices the data axis spans over DCN."""
  data: int
  fsdp: int
  tensor: int
  expert: int
  dcn_data: int


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
  """config.distributed: multi-process runs (docs/distributed.md)."""
  mode: str
  coordinator_address: str
  num_processes: int
  process_id: int
  local_device_ids: str
  cpu_devices: int
  timeout_s: int
  heartbeat_timeout_s: int


# Fields added after runs were written, with the value that reproduces such a run: a config
# (or a workdir's config.json) without one ran with it.
ADDED_FIELDS = {"tst.schedule": "", "data.val_piece_bytes": 0,
                "model.matmul_precision": "default", "reference.name": "",
                "reference.loss": 0.0, "reference.measured": "", "reference.command": ""}
ADDED_SECTIONS = ("reference",)     # sections added whole: created empty, then filled above


def with_added_fields(config):
  """`config` (a ConfigDict, or config.json's dict) with every ADDED_FIELDS entry it lacks."""
  new = {} if isinstance(config, dict) else ml_collections.ConfigDict()
  for section in ADDED_SECTIONS:
    if section not in config:
      _set(config, section, copy.copy(new))
  for field, value in ADDED_FIELDS.items():
    section, name = field.split(".")
    if section in config and name not in config[section]:
      _set(config[section], name, value)
  return config


def _set(node, name, value):
  if isinstance(node, dict):
    node[name] = value
  else:
    with node.unlocked():
      node[name] = value


def _section(cls, config, name: str):
  """config.<name> as `cls`, its fields checked by FIELDS already."""
  node = config[name]
  for f in dataclasses.fields(cls):
    _require(f.name in node, f"{name}.{f.name}", "is missing (a config.json of an older "
             "tst-jax?): every field is in tst_jax/train/defaults.py")
  return cls(**{f.name: node[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A checked run: what every later step reads instead of the ConfigDict.

  `config` is the run config as checked (frozen; once on a platform, its `auto` fields hold
  what they resolved to: that is what config.json records), `model` the family's config
  dataclass, `plan` the phases (each the one source of its batches and loss), `data` the data
  settings, `resolved` each `auto` choice with its reason (None before `on_platform`).
  """
  config: ml_collections.FrozenConfigDict
  model: Any               # LlamaConfig | MoEConfig
  plan: Plan
  data: DataSpec
  tst: TstSpec
  loss: LossSpec
  optimizer: OptimizerSpec
  train: TrainSpec
  mesh: MeshSpec
  distributed: DistributedSpec
  reference: ReferenceSpec
  rules: tuple             # logical_axis_rules: (logical name, mesh axes) pairs
  seed: int
  init_from_hf: str
  resolved: platform.Resolved | None = None

  @property
  def family(self) -> str:
    return self.config.model.family

  def on_platform(self, name: str | None = None) -> RunSpec:
    """This spec with every `auto` resolved on platform `name` (default: this process's)."""
    resolved = platform.resolve(self.model, self.config.loss.impl, name)
    config = platform.apply(ml_collections.ConfigDict(self.config), resolved)
    model = dataclasses.replace(self.model, **{
        f.split(".")[1]: v for f, (v, _) in resolved.choices.items() if f.startswith("model.")})
    return dataclasses.replace(self, config=ml_collections.FrozenConfigDict(config),
                               model=model, loss=LossSpec(config.loss.impl), resolved=resolved)

  def check_devices(self, num_devices: int) -> None:
    """What this machine can run: the platform's kernels and libraries, the mesh over
    `num_devices`."""
    if self.model.attention_impl == "cudnn":
      why_not = platform.cudnn_unavailable(self.model.dtype, self.model.head_dim)
      _require(why_not is None, "model.attention_impl", f"'cudnn': {why_not}; use 'auto'")
    if self.model.attention_impl == "splash":
      why_not = platform.splash_unavailable([p.latent_seq_len for p in self.plan.phases])
      _require(why_not is None, "model.attention_impl", f"'splash': {why_not}; use 'auto'")
    if self.model.matmul_precision == "fp8":
      why_not = fp8.unavailable()
      _require(why_not is None, "model.matmul_precision", str(why_not))
    sizes = mesh_lib.mesh_shape(self.mesh, num_devices)
    _require(sizes["data"] % self.mesh.dcn_data == 0, "mesh.dcn_data",
             f"{self.mesh.dcn_data} must divide the data axis ({sizes['data']})")

  def check_paths(self) -> None:
    """The files a train or eval run reads exist (plan mode does not need them)."""
    check_data_paths(self.data)
    if self.init_from_hf:
      _require(os.path.isdir(self.init_from_hf), "init_from_hf",
               f"{self.init_from_hf!r} is not a folder: give a Hugging Face model folder "
               "(e.g. one written by python -m tst_jax.tools.export), or '' to start from scratch")


def check(config) -> RunSpec:
  """Check every field of the run config and their combinations, before anything is built;
  the first problem is a ConfigError naming the field. Nothing here touches a device."""
  config = with_added_fields(copy.deepcopy(config))
  for field, (ok, must) in FIELDS.items():
    section, _, name = field.rpartition(".")
    node = config[section] if section else config
    if name in node:     # a missing field is named when its section is built below
      _require(ok(node[name]), field, f"must be {must}, got {node[name]!r}")
  for name, (ok, must) in MODEL_FIELDS.items():
    if name in config.model:
      _require(ok(config.model[name]), f"model.{name}", f"must be {must}, got "
               f"{config.model[name]!r}")
  try:
    model = models.model_config(config.model)
  except ConfigError:
    raise
  except (TypeError, ValueError) as e:   # e.g. a field of the wrong type for its dataclass
    raise ConfigError("model", str(e)) from None
  _check_rules(config.logical_axis_rules)
  tst, data, opt = config.tst, config.data, config.optimizer
  try:
    stages = bag_schedule(tst)
  except ValueError as e:
    raise ConfigError("tst.schedule", str(e)) from None
  for s in stages:
    try:
      losses.bag_weights(tst.weighting, s)
    except (ValueError, TypeError) as e:
      raise ConfigError("tst.weighting", str(e)) from None
    if tst.equal_flops == "batch" and tst.mode != "output_only":
      _require(data.seq_len % s == 0, "data.seq_len",
               f"{data.seq_len} must be divisible by tst.bag_size {s} when "
               "tst.equal_flops='batch' (the model sees seq_len / bag_size bags)")
  _require(data.batch_size % opt.grad_accum == 0, "optimizer.grad_accum",
           f"{opt.grad_accum} must divide data.batch_size {data.batch_size}")
  if data.tokenizer == "bpe":
    _require(model.vocab_size >= 257, "model.vocab_size",
             f"{model.vocab_size} is too small for data.tokenizer='bpe', which needs "
             "256 byte tokens + EOS: use >= 257")
  elif data.tokenizer:
    _require(data.tokenizer.endswith((".json", ".model")), "data.tokenizer",
             f"{data.tokenizer!r} is not 'bpe', a tokenizer.json or a SentencePiece .model")
  tst = _section(TstSpec, config, "tst")
  train = _section(TrainSpec, config, "train")
  return RunSpec(
      config=ml_collections.FrozenConfigDict(config), model=model,
      plan=make_plan(model, tst, data.seq_len, data.batch_size, train.steps),
      data=DataSpec.of(data, config.seed), tst=tst, loss=_section(LossSpec, config, "loss"),
      optimizer=_section(OptimizerSpec, config, "optimizer"), train=train,
      mesh=_section(MeshSpec, config, "mesh"),
      distributed=_section(DistributedSpec, config, "distributed"),
      reference=_section(ReferenceSpec, config, "reference"),
      rules=tuple((k, v) for k, v in config.logical_axis_rules), seed=config.seed,
      init_from_hf=config.init_from_hf)


def build(config, num_devices: int | None = None) -> RunSpec:
  """`check(config)` on this platform; with `num_devices`, also the devices' checks."""
  spec = check(config).on_platform()
  if num_devices is not None:
    spec.check_devices(num_devices)
  return spec


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
