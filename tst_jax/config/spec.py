"""A run's config, checked once into a frozen, typed spec.

`check(config)` parses every section named in SECTIONS by its declaration in tst_jax/schema.py,
which holds each field's default, rule and doc. It checks their combinations without a
device and builds the plan once. Then `spec.on_platform()` resolves each `auto` for
the platform, and a train or eval run adds `check_devices` (the mesh, the kernels) and
`check_paths` (the files). A bad field is a `ConfigError(field, message)` before anything is
built. Code after `check` reads the typed sections only.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

from tst_jax import fileio, losses, models, platform, schema
from tst_jax.data.mixture import RunMixture
from tst_jax.data.section import (Data, check_fields as check_data_fields,
                                  check_paths as check_data_paths)
from tst_jax.errors import ConfigError
from tst_jax.kernels import fp8
from tst_jax.models.mtp import Mtp
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.parallel.distributed import Distributed
from tst_jax.parallel.mesh import MeshShape
from tst_jax.run import step_profile
from tst_jax.config.plan import Plan, bag_schedule, make_plan
from tst_jax.config.sections import (Loss, Optimizer, Reference, Run, Train, Tst,
                                    same_run_fields)

# Every section of a run config but the top level (`Run`) and the model (the family's config
# dataclass, models.model_config): its name and its declaration (tst_jax/schema.py).
SECTIONS = {"data": Data, "tst": Tst, "loss": Loss, "mtp": Mtp, "optimizer": Optimizer,
            "train": Train, "reference": Reference, "mesh": MeshShape,
            "distributed": Distributed}


def _require(ok: bool, field: str, message: str):
  if not ok:
    raise ConfigError(field, message)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A checked run: its typed sections, what every later step reads.

  `model` is the family's config dataclass, `plan` the phases (each the one source of its
  batches and loss), `resolved` each `auto` choice with its reason (None before
  `on_platform`, after which the sections hold the resolved values).
  """
  run: Run
  model: models.ModelConfig   # the config dataclass of a family of models.FAMILIES
  data: Data
  tst: Tst
  loss: Loss
  mtp: Mtp
  optimizer: Optimizer
  train: Train
  reference: Reference
  mesh: MeshShape
  distributed: Distributed
  plan: Plan
  resolved: platform.Resolved | None = None

  @property
  def family(self) -> str:
    return models.family_of(self.model)

  def to_json(self) -> dict:
    """Returns the run's config as it runs, for config.json: every section's fields, with `auto`
    fields as resolved once on a platform."""
    record = dict(schema.values(self.run),
                  model=dict(family=self.family, **schema.values(self.model)))
    return record | {name: schema.values(getattr(self, name)) for name in SECTIONS}

  def same_run(self) -> dict:
    """Returns the fields that make this run the run it is: sections.same_run_fields."""
    return same_run_fields({name: getattr(self, name) for name in ("run", "model", *SECTIONS)})

  def on_platform(self, name: str | None = None) -> RunSpec:
    """Returns this spec with every `auto` resolved on platform `name`, by default the local one."""
    resolved = platform.resolve(self.model, self.loss.impl, name,
                                [p.latent_seq_len for p in self.plan.phases],
                                self.data.document_mask)
    return dataclasses.replace(self, model=platform.resolved_model(self.model, resolved),
                               loss=Loss(resolved.choices["loss.impl"][0]), resolved=resolved)

  def check_devices(self, num_devices: int) -> None:
    """Checks what this machine can run: the platform's kernels and libraries, and the mesh over
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

  def check_fields(self) -> None:
    """Checks what the run will read without reading it: its data fields set, each source of a
    known form, the buckets named as GCS names them. A launcher checks this where it cannot
    see the data; `check_paths` adds the files themselves."""
    check_data_fields(self.data)

  def check_paths(self) -> None:
    """Checks that the files a train or eval run reads exist, and lm-eval for
    train.eval_tasks. Plan mode does not need them."""
    check_data_paths(self.data)   # check_data_fields first
    if self.train.eval_tasks:
      _require(importlib.util.find_spec("lm_eval") is not None, "train.eval_tasks",
               "needs lm-eval: pip install -e '.[eval]' (or pip install lm-eval)")
    include = self.train.eval_tasks_include
    _require(not include or fileio.local_path(include) is not None and fileio.isdir(include),
             "train.eval_tasks_include", f"{include!r} is not a local folder: give the folder "
             "of lm-eval task YAMLs (lm-eval reads them from the disk)")
    if self.run.init_from_hf:
      _require(os.path.isdir(self.run.init_from_hf), "init_from_hf",
               f"{self.run.init_from_hf!r} is not a folder: give a Hugging Face model folder "
               "(e.g. one written by python -m tst_jax.tools.export), or '' to start from scratch")


def help_text() -> str:
  """Every field of a run config: name, default, doc and rule (`main.py --help-config`)."""
  lines = ["Every field of a run config (set one with --config.<section>.<field>=VALUE):", ""]
  lines += schema.help_lines(Run, "")
  lines += ["", f"{'model.family':<34} {repr('llama'):<20} the model family: "
            f"{models.FAMILY.must} (base_config(family, preset) sets it with a preset)"]
  for family in models.FAMILIES:
    lines += ["", f"model (family {family}; a preset gives the sizes):"]
    lines += schema.help_lines(models.FAMILIES[family].config, "model")
  for name, cls in SECTIONS.items():
    lines += ["", cls.__doc__.splitlines()[0]] + schema.help_lines(cls, name)
  return "\n".join(lines)


def sections_of(config) -> dict:
  """Every section of a run config (a ConfigDict, or config.json's dict) typed, each field
  checked by its rule. A field added after `config` was written gets the value such a
  run had. Keys: "run", "model" and SECTIONS'."""
  run = schema.parse(Run, config, "", sections=("model", *SECTIONS))
  try:
    model = models.model_config(config["model"])
  except ConfigError:
    raise
  except (TypeError, ValueError) as e:   # e.g. a field of the wrong type for its dataclass
    raise ConfigError("model", str(e)) from None
  typed = dict(run=run, model=model)
  for name, cls in SECTIONS.items():
    node = config[name] if name in config else {}     # a section added since: its defaults
    typed[name] = schema.parse(cls, node, name, **({"run_seed": run.seed}
                                                    if cls is Data else {}))
  return typed


def check(config) -> RunSpec:
  """Checks every field of the run config and their combinations, before anything is built.
  The first problem is a ConfigError naming the field. Nothing here touches a device."""
  typed = sections_of(config)
  model, tst, data, opt = typed["model"], typed["tst"], typed["data"], typed["optimizer"]
  try:
    bag_sizes = bag_schedule(tst)
  except ValueError as e:
    raise ConfigError("tst.schedule", str(e)) from None
  for bag_size in bag_sizes:
    try:
      weights = losses.bag_weights(tst.weighting, bag_size)
    except (ValueError, TypeError) as e:
      raise ConfigError("tst.weighting", str(e)) from None
    _require(losses.VARIANTS[tst.variant].weighted
             or len(set(weights[weights > 0].tolist())) == 1,
             "tst.variant", f"{tst.variant!r} reads only which weights are zero: "
             f"tst.weighting={tst.weighting!r} would be ignored; use 'uniform' or 'first' "
             "with it, or tst.variant='mce'")
    if tst.equal_flops == "batch" and tst.mode != "output_only":
      _require(data.seq_len % bag_size == 0, "data.seq_len",
               f"{data.seq_len} must be divisible by tst.bag_size {bag_size} when "
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
  _check_mtp(typed["mtp"], model, data)
  plan = make_plan(model, tst, data.seq_len, data.batch_size, typed["train"].steps,
                   typed["mtp"])
  _check_mtp_phase(typed["mtp"], plan, tst, typed["train"].steps)
  _check_profile_window(typed["train"].profile_steps, plan)
  _check_stages(data, plan)
  _check_eval_tasks(typed["train"], plan)
  return RunSpec(plan=plan, **typed)


def _check_mtp(mtp, model, data):
  """Refuses multi-token prediction with more tokens than a window holds, or of a kind the
  model family cannot carry."""
  if not mtp.on:
    return
  _require(mtp.k <= data.seq_len, "mtp.k",
           f"{mtp.k} tokens a position is more than the window's data.seq_len {data.seq_len}")
  mtp.check(model)


def _check_mtp_phase(mtp, plan, tst, steps):
  """Refuses multi-token prediction in a plan without a next-token phase: one whose phase 1,
  round(tst.ratio x train.steps) steps, takes every step."""
  _require(not mtp.on or any(p.mtp_k > 1 for p in plan.phases), "mtp.k",
           f"{mtp.k} needs a next-token phase, and the plan has none: tst.ratio={tst.ratio:g} "
           f"of train.steps={steps} gives phase 1 every step, and MTP runs after phase 1, "
           "never on bags: lower tst.ratio or give more steps")


def _check_eval_tasks(train, plan):
  """Refuses train.eval_tasks' other fields without tasks, and tasks in a run with no
  next-token phase, whose model predicts bags only (docs/evaluation.md)."""
  for name, unset in (("eval_tasks_every", 0), ("eval_tasks_include", ""),
                      ("eval_tasks_limit", 0)):
    _require(getattr(train, name) == unset or train.eval_tasks, f"train.{name}",
             "needs train.eval_tasks: the lm-eval tasks to score")
  _require(not train.eval_tasks or any(not p.is_tst for p in plan.phases), "train.eval_tasks",
           "the run has no next-token phase (tst.ratio=1), and a phase-1 model, which "
           "predicts bags, is not scored on next-token tasks")


def _check_profile_window(text: str, plan):
  """Refuses a train.profile_steps window past the run's end or across a phase switch."""
  window = step_profile.profile_window(text)
  if window is None:
    return
  first, last = window[0], window[0] + window[1] - 1
  _require(last <= plan.total_steps, "train.profile_steps",
           f"steps {first} to {last} go past the run's {plan.total_steps} steps")
  phase = plan.phase_at(first - 1)
  _require(last <= phase.last_step, "train.profile_steps",
           f"steps {first} to {last} cross the switch from {phase.name} after step "
           f"{phase.last_step}: a trace profiles one phase's step")


def _check_stages(data, plan):
  """Refuses a stage of data.mixture_stages that starts after the run's last step."""
  for stage in RunMixture.of(data).stages:
    _require(stage.first_step < plan.total_steps, "data.mixture_stages",
             f"the stage at step {stage.first_step} starts after the run's last step "
             f"({plan.total_steps} steps): it would read nothing")


def build(config, num_devices: int | None = None) -> RunSpec:
  """Runs `check(config)` on this platform, and with `num_devices` the devices' checks too."""
  spec = check(config).on_platform()
  if num_devices is not None:
    spec.check_devices(num_devices)
  return spec
