"""Will a run fit? Both phases' train steps compiled ahead of time on emulated devices.

`python main.py --config configs/llama_3b.py --mode plan --config.mesh.fsdp=64
--accelerator=b200` builds the run's mesh over that many CPU devices. It lowers and compiles the
same jitted train step the loop runs, `step.Trainer.train_step`, from abstract arrays with shardings, so nothing is
allocated, and prints per device:
- parameters and optimizer state, exact from the shapes and shardings,
- the activations the backward pass keeps at the config's remat, exact from the residuals JAX
  saves on one device's rows,
- XLA's own temporaries and peak from `compiled.memory_analysis()`.
XLA:CPU compiles the plain-XLA kernels, where attention materialises its scores and there is
no cuDNN flash attention or Pallas loss. It also schedules memory differently from XLA:GPU and
TPU, so its temporaries are an upper bound there, not a GPU number.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax._src import ad_checkpoint   # saved_residuals: public only as a printer
from jax._src import xla_bridge      # backends_are_initialized: no public equivalent

from tst_jax import models
from tst_jax.models import experts
from tst_jax.errors import ConfigError
from tst_jax.parallel import mesh as mesh_lib, xla_flags
from tst_jax.train import local_checkpoint, step as step_lib

GB = 1e9
# HBM per device, datasheet decimal GB. B200 is DGX B200's 1,440 GB over 8 GPUs.
HBM_GB = {"h100": 80, "h200": 141, "b200": 180, "v4": 32, "v5p": 95, "v5e": 16, "v6e": 32}
# GPU runs get XLA_PYTHON_CLIENT_MEM_FRACTION of it, and JAX preallocates 75% by default.
DEFAULT_GPU_FRACTION = 0.75


def accelerator_budget(accelerator: str, environ=os.environ) -> tuple[float, str]:
  """Returns the bytes a step may use on one device of `accelerator`, and how that was decided."""
  if accelerator not in HBM_GB:
    raise ConfigError("--accelerator", f"must be one of {tuple(HBM_GB)}, got {accelerator!r}")
  hbm = HBM_GB[accelerator] * GB
  if accelerator.startswith("v"):
    return hbm, f"{HBM_GB[accelerator]} GB HBM"
  text = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or str(DEFAULT_GPU_FRACTION)
  try:
    fraction = float(text)
  except ValueError:
    raise ConfigError("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{text!r} is not a number") from None
  return hbm * fraction, (f"{HBM_GB[accelerator]} GB HBM x XLA_PYTHON_CLIENT_MEM_FRACTION "
                          f"{fraction:g}")


def mesh_devices(mesh_cfg) -> int:
  """Counts the devices the fit check emulates: the product of the mesh axes, every one given."""
  sizes = [int(getattr(mesh_cfg, a)) for a in mesh_lib.MESH_AXES]
  if -1 in sizes:
    raise ConfigError("mesh", "give every axis for a fit check, e.g. "
                      "--config.mesh.data=1 --config.mesh.fsdp=64 (the run's device count)")
  return math.prod(sizes)


def emulate_devices(n: int):
  """Makes the backend, not yet started, compile on `n` CPU devices. Nothing runs on them."""
  if xla_bridge.backends_are_initialized():
    if jax.device_count("cpu") < n:
      raise ConfigError("mesh", f"a fit check on {n} devices needs them before JAX "
                        f"starts; this process already has {jax.device_count('cpu')} CPU devices")
    return
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", n)


def layer_param_bytes(model_cfg: models.ModelConfig) -> int:
  """Returns the bytes of one decoder layer's float32 parameters, the mean over layers.

  That is all parameters but the embedding, the head and the final norm. A MoE's sparse layers
  are larger than the mean.
  """
  total, _ = model_cfg.param_counts()
  io = model_cfg.vocab_size * model_cfg.dim * (1 if model_cfg.tie_embeddings else 2)
  return 4 * (total - io - model_cfg.dim) // model_cfg.n_layers


def _shard_bytes(abstract_tree, shardings) -> int:
  leaves = jax.tree.leaves(abstract_tree)
  specs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
  return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize for x, s in zip(leaves, specs))


def activation_bytes(graphdef, params, phase, loss_cfg, rows: int, flash_len: int = 0) -> int:
  """Counts the bytes per device that the backward pass keeps from the forward at the remat.

  The count comes from JAX's saved residuals of the loss on `rows`, one device's rows of a
  micro-batch, traced without the mesh. Every residual that follows the tokens, [B, ...] or
  flattened to [B·L, ...] or to the experts' [N·P, ...], is then one device's, and those that
  do not, weights that FSDP gathers, are whole, as each device holds them. With
  mesh.tensor > 1 heads, F and V are split further, so this is then an upper bound.
  `flash_len` is L when the target runs cuDNN flash attention, which keeps its softmax
  statistics but no L x L scores. Residuals with two axes of that length are then left out,
  and the small float32 statistics [layers, B, H, L] are counted.
  """
  def loss(params, window):
    return step_lib.objective(nnx.merge(graphdef, params), window, phase, loss_cfg)[0]
  window = jax.ShapeDtypeStruct((rows, phase.window), jnp.int32)
  total = 0
  for aval, source in ad_checkpoint.saved_residuals(loss, params, window):
    if "from the argument" in source:   # parameters and the batch: counted elsewhere
      continue
    if flash_len and list(aval.shape).count(flash_len) >= 2:
      aval = jax.ShapeDtypeStruct(aval.shape[:-1], jnp.float32)   # scores -> statistics
    total += math.prod(aval.shape) * aval.dtype.itemsize
  return total


def target_platform(accelerator: str) -> str:
  """Returns the JAX platform of `accelerator`: tpu for v5p, v5e, v6e, gpu for h100, h200, b200."""
  return "tpu" if accelerator.startswith("v") else "gpu"


@dataclasses.dataclass(frozen=True)
class PhaseFit:
  phase: str
  params: int            # bytes per device, exact
  opt_state: int         # bytes per device, exact
  activations: int       # bytes per device kept for the backward pass at model.remat
  xla_temp: int | None   # XLA:CPU's temporaries of the compiled step, activations included
  xla_peak: int | None   # arguments + outputs - aliased + temporaries, on XLA:CPU
  compile_s: float       # None above and 0 here: a check that did not compile

  @property
  def estimate(self) -> int:
    """Adds params, optimizer, gradients and activations: a GPU step's floor before workspace."""
    return 2 * self.params + self.opt_state + self.activations


@dataclasses.dataclass(frozen=True)
class Fit:
  accelerator: str
  devices: int
  mesh: dict
  remat: str
  flash: bool            # activations counted as cuDNN flash attention keeps them on GPU
  budget: float
  budget_note: str
  phases: tuple[PhaseFit, ...]
  advice: tuple[str, ...]
  gpu_xla_flags: str     # what a GPU run over this mesh puts in XLA_FLAGS
  local_every: int = 0   # train.local_checkpoint_every: 0 copies nothing, so costs nothing

  @property
  def local_copy(self) -> int:
    """Returns the bytes per device of one emergency checkpoint, 0 without them: the
    parameters and optimizer state, which its host holds in memory while writing them."""
    return max(p.params + p.opt_state for p in self.phases) if self.local_every else 0

  @property
  def fits(self) -> bool:
    return all(p.estimate <= self.budget for p in self.phases)

  def to_json(self) -> dict:
    return dict(accelerator=self.accelerator, devices=self.devices, mesh=self.mesh,
                remat=self.remat, flash_attention=self.flash, budget_bytes=self.budget,
                fits=self.fits,
                phases=[dataclasses.asdict(p) | dict(estimate=p.estimate) for p in self.phases],
                advice=list(self.advice), gpu_xla_flags=self.gpu_xla_flags,
                local_checkpoint_bytes=self.local_copy)

  def table(self) -> str:
    g = lambda b: "--" if b is None else f"{b / GB:.2f}"
    lines = [f"fit on {self.devices} x {self.accelerator} (budget {self.budget / GB:.1f} GB per "
             f"device: {self.budget_note}), mesh {self.mesh}, remat={self.remat}; GB per device:",
             f"{'phase':<6}{'params':>9}{'grads':>9}{'opt':>9}{'activ.':>9}{'estimate':>10}"
             f"{'fits':>6}{'XLA:CPU temp':>14}{'XLA:CPU peak':>14}{'compile s':>11}"]
    for p in self.phases:
      lines.append(f"{p.phase:<6}{g(p.params):>9}{g(p.params):>9}{g(p.opt_state):>9}"
                   f"{g(p.activations):>9}{g(p.estimate):>10}"
                   f"{'yes' if p.estimate <= self.budget else 'NO':>6}{g(p.xla_temp):>14}"
                   f"{g(p.xla_peak):>14}{p.compile_s:>11.1f}")
    lines.append("estimate = params + grads + optimizer state (exact, from shapes and "
                 "shardings) + activations kept for the backward (JAX's saved residuals"
                 + (", with flash attention's softmax statistics in place of the [L, L] "
                    "scores, as cuDNN and splash keep them" if self.flash else "") + "); "
                 "XLA:CPU columns come from compiling for CPU (plain-XLA attention with its "
                 "[B, H, L, L] scores, no fused kernels, CPU memory scheduling): an upper bound, "
                 "not what XLA:GPU/TPU allocate")
    if self.local_every:
      lines.append(
          f"emergency checkpoints every {self.local_every} steps: {g(self.local_copy)} GB per "
          "device (parameters and optimizer state) in its host's memory while written, and "
          f"up to {local_checkpoint.KEEP + 1} such copies on the host's disk "
          f"({local_checkpoint.KEEP} kept, one being written; train.local_checkpoint_dir), "
          "beside the HBM above")
    lines += [f"advice: {a}" for a in self.advice]
    if self.gpu_xla_flags and not self.accelerator.startswith("v"):
      lines.append(f"a GPU run over this mesh sets XLA_FLAGS={self.gpu_xla_flags}")
    return "\n".join(lines)


def advise(fit_phases, budget: float, remat: str, grad_accum: int, rows: int,
           batch_shards: int, fsdp: int, full_activations: int) -> tuple[str, ...]:
  """Says which knob to turn when a phase does not fit, with the estimate it gives."""
  worst = max(fit_phases, key=lambda p: p.estimate)
  if worst.estimate <= budget:
    return ("fits: " + ", ".join(f"{p.phase} {p.estimate / GB:.1f} GB" for p in fit_phases)
            + f" of {budget / GB:.1f} GB",)
  state = 2 * worst.params + worst.opt_state
  out = []
  if state > budget:
    need = math.ceil(fsdp * state / (0.5 * budget))
    out.append(f"parameters, gradients and Adam state alone are {state / GB:.1f} GB: shard "
               f"them over more devices (config.mesh.fsdp >= {need} keeps them under half the "
               "budget)")
  if remat != "full":
    out.append(f"model.remat=full: keeps only each layer's input for the backward: "
               f"activations {worst.activations / GB:.1f} -> {full_activations / GB:.1f} GB, "
               f"estimate {(state + full_activations) / GB:.1f} GB")
  per_device_rows = rows // grad_accum // batch_shards
  if per_device_rows > 1:
    k = 2
    while k * grad_accum * batch_shards <= rows and (
        state + worst.activations / k > budget) and per_device_rows // k > 1:
      k *= 2
    rows_k = per_device_rows // k
    out.append(f"optimizer.grad_accum={grad_accum * k}: {rows_k} row{'s' * (rows_k != 1)} per "
               f"device per micro-batch, activations / {k}, estimate "
               f"{(state + worst.activations / k) / GB:.1f} GB")
  out.append("or data.batch_size smaller (activations scale with rows per device)")
  return tuple(out)


def _xla_memory(step, state, window, compile_steps: bool) -> tuple[int | None, int | None, float]:
  """Lowers `step` and, with `compile_steps`, compiles it: returns XLA:CPU's temporaries and
  peak per device and the seconds both took (None, None and 0 lowered only)."""
  t0 = time.perf_counter()
  lowered = step.lower(state, window)
  if not compile_steps:
    return None, None, 0.0
  memory = lowered.compile().memory_analysis()
  return (int(memory.temp_size_in_bytes),
          int(memory.argument_size_in_bytes + memory.output_size_in_bytes
              - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
          time.perf_counter() - t0)


def check(spec, accelerator: str, target, devices=None, compile_steps: bool = True,
          environ=os.environ) -> Fit:
  """Compiles both phases' train steps from abstract arrays and measures each device's memory.

  `spec` is resolved on this CPU platform, for its mesh on `devices`, by default the first
  mesh-size CPU devices. The memory is what each device holds on `accelerator`. `target` is
  the same spec resolved for the accelerator's platform, which says whether its attention is
  flash attention and which experts' layout the activations are counted on. Without
  `compile_steps` the steps are lowered only: the estimate, which decides the fit, is the same,
  and XLA:CPU's columns are left out. `environ` is the run's environment, where
  XLA_PYTHON_CLIENT_MEM_FRACTION sets a GPU's budget.
  """
  budget, note = accelerator_budget(accelerator, environ)
  # What `auto` chose on the target: cuDNN's and splash's kernels keep no [L, L] scores.
  flash = target.model.attention_impl in ("cudnn", "splash")
  plan = spec.plan
  n = mesh_devices(spec.mesh)
  model_cfg = spec.model
  trainer = step_lib.Trainer.of(spec, list(devices or jax.devices()[:n]))
  trainer.check()
  abstract, shardings = trainer.abstract, trainer.shardings
  # The residuals of the target's experts: XLA:CPU's blocked layout pads each expert's rows.
  kept = lambda remat: step_lib.abstract_model(dataclasses.replace(
      model_cfg, remat=remat, **{f: getattr(target.model, f) for f in ("expert_impl",)
                                 if hasattr(model_cfg, f)}), spec.mtp)[0]
  graphdef = kept(model_cfg.remat)
  batch_sharding, mesh, params = trainer.batch_sharding, trainer.mesh, abstract.params
  shards = mesh_lib.shards(batch_sharding, 0)
  accum = spec.optimizer.grad_accum
  # One device's rows of a micro-batch, times the devices whose tokens its experts lay out
  # under expert parallelism: there the experts' residuals are exact and the rest an upper bound.
  group = experts.group_devices(mesh, spec.run.logical_axis_rules)
  rows = lambda phase: phase.batch_size // accum // shards * group
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       abstract, shardings)
  results = []
  for phase in plan.phases:
    step = trainer.train_step(phase, eos_id=0)   # shapes only: any EOS id compiles the same
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32,
                                  sharding=batch_sharding)
    results.append(PhaseFit(
        phase.name, _shard_bytes(abstract.params, shardings.params),
        _shard_bytes(abstract.opt_state, shardings.opt_state),
        activation_bytes(graphdef, params, phase, spec.loss, rows(phase),
                         flash and phase.latent_seq_len),
        *_xla_memory(step, state, window, compile_steps)))
  sizes = dict(zip(mesh_lib.MESH_AXES, (int(s) for s in mesh.devices.shape)))
  full_activations = max(activation_bytes(kept("full"), params, p, spec.loss, rows(p),
                                          flash and p.latent_seq_len)
                         for p in plan.phases)
  gpu_flags = xla_flags.recommended("gpu", n, layer_param_bytes(model_cfg))
  return Fit(accelerator, n, sizes, model_cfg.remat, flash, budget, note, tuple(results),
             advise(results, budget, model_cfg.remat, accum,
                    max(p.batch_size for p in plan.phases), shards, sizes["fsdp"],
                    full_activations),
             " ".join(f"--{k}={v}" for k, v in gpu_flags.items()),
             spec.train.local_checkpoint_every)
