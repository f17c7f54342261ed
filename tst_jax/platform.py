"""Per-platform defaults: what `auto` means for attention, the fused loss and MoE experts.

Each choice is the implementation measured fastest on that platform, never the one we hope is
fastest: docs/performance.md has the measurements. Platforms without a measurement get the
plain XLA path and say so. A run resolves them once with `resolve`, prints them in its plan and
records them in config.json and summary.json. Library code that meets `auto` calls the same
functions.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax

from tst_jax.errors import ConfigError
from tst_jax.kernels import (gemm_measured, grouped_matmul, moe_dispatch, splash_attention,
                             tokamax_tuning)

# The config fields `auto` resolves on a platform: how a run computes, not what it computes.
# A workdir resumes, evaluates and loads on another platform with its own choices.
PLATFORM_FIELDS = ("model.attention_impl", "model.expert_impl", "model.dispatch_impl",
                   "model.expert_fuse_gate_up", "loss.impl")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
LOSS_IMPLS = ("auto", "naive", "xla", "pallas")
EXPERT_IMPLS = ("auto", "ragged", "gmm", "capacity", "blocked", "dense")
FUSE_GATE_UP = ("auto", "on", "off")
GROUPED_GEMMS = ("gmm", "capacity")   # the expert_impls whose grouped GEMMs run on tokamax
DISPATCH_IMPLS = ("auto",) + moe_dispatch.IMPLS

# loss.impl=auto: the fastest forward and backward at the paper's shapes. TPU is not measured,
# so it gets the pure-XLA path.
_LOSS = {"gpu": ("pallas", "fastest on H100: 63 ms vs xla 74, naive 81 (docs/performance.md)"),
         "cpu": ("xla", "fastest on CPU (docs/kernels.md); pallas only runs interpreted"),
         "tpu": ("xla", "Pallas TPU kernel not yet measured against it")}
# model.expert_impl=auto: the fastest MoE step. On CPU ragged_dot is a masked dense matmul over
# every expert.
_EXPERTS = {"cpu": ("blocked", "CPU expands ragged_dot over every expert (docs/performance.md)"),
            "gpu": ("gmm", "grouped GEMMs on tokamax's kernels: 1.42x faster than blocked at "
                           "the 10B-A1B layer shapes (0.161 vs 0.228 s), 1.39x on "
                           "qwen3_moe_gpu_small (0.282 vs 0.392 s); H100 (docs/performance.md)"),
            "tpu": ("ragged", "grouped matmul, native on TPU")}
# model.dispatch_impl=auto: how MoE dispatch and combine move rows (moe_dispatch.IMPLS).
_DISPATCH = {"gpu": ("pallas", "the Pallas kernels' one pass: qwen3_moe_gpu_small's step 0.182 s "
                               "vs 0.250 with XLA's gathers (dispatch+combine 18 vs 95 ms), the "
                               "10B-A1B shapes 0.120 vs 0.132 s; H200 (docs/performance.md)"),
             "cpu": ("gather", "XLA gathers on CPU; the Pallas kernels only run interpreted"),
             "tpu": ("gather", "XLA gathers on TPU; the Pallas kernels are Triton's")}
FUSES_GATE_UP = ("gmm", "ragged", "capacity")   # the expert_impls with grouped GEMMs to fuse
# model.expert_fuse_gate_up=auto: on where a train step measured gate and up fused faster than
# split, per GPU: (fused s, split s, where measured). A layer alone does not decide it: the
# MoE lab's fastest dispatch alone made the step slower (docs/performance.md). None measured.
_FUSED_STEP: dict[str, tuple[float, float, str]] = {}
GPU_EXTRA = "pip install 'tst-jax[gpu]' -c constraints-gpu.txt"
_NO_TOKAMAX = ("blocked", "gmm needs tokamax on a GPU (XLA's GPU ragged_dot expands to dense and "
                          f"ran out of memory): {GPU_EXTRA}")
# A plan for a named GPU, made where none runs, resolves what a GPU install with the gpu extra
# runs, as launch/Dockerfile.gpu installs it, whatever this machine has installed.
_PLANNED_GPU = (f"planned for a GPU with the gpu extra ({GPU_EXTRA}; "
                "launch/Dockerfile.gpu installs it): tokamax's grouped GEMMs")


def _pins(**configs) -> tuple[tuple[str, str, str], ...]:
  """`grouped_matmul.Kernels.pinned` from product_kernel=config keywords."""
  return tuple((key.split("_")[0], key.split("_")[1], json.dumps(config, sort_keys=True))
               for key, config in configs.items())


# expert_impl=gmm on a GPU: tokamax's kernel for each product of the grouped GEMM and its tile
# config, from tokamax 0.0.17's own autotuning tables (tokamax/data/autotuning/<device>/: the
# Mosaic kernel's pallas_mosaic_gpu_ragged_dot.json, the Triton kernel's triton_ragged_dot.json)
# at the entries nearest the 10B-A1B layer's GEMMs: F 768, 128 experts, 131072 rows (D 2048
# there, 1024 here). The second kernel is the fallback where the first raises
# NotImplementedError, as Mosaic's dW does on sm100. Fields left out are tokamax's defaults.
# The lab's measurements on a GPU, where there are some (gemm_measured.json), come first.
_SM90_PINS = _pins(
    forward_mosaic=dict(block_m=128, block_n=64, block_k=128, num_stages=4, split_k=1,
                        persistent=True, grid_minor_dim=1, grid_tile_width=8),
    forward_triton=dict(block_m=128, block_n=128, block_k=32, split_k=1, num_warps=4,
                        num_stages=4),
    dx_mosaic=dict(block_m=128, block_n=64, block_k=128, num_stages=2, split_k=1,
                   persistent=False, grid_minor_dim=0, grid_tile_width=1),
    dx_triton=dict(block_m=128, block_n=128, block_k=32, split_k=1, num_warps=4, num_stages=4),
    dw_triton=dict(block_m=128, block_n=256, block_k=32, split_k=1, num_warps=8, num_stages=5),
    dw_mosaic=dict(block_m=128, block_n=64, block_k=128, num_stages=2, split_k=1,
                   persistent=False, grid_minor_dim=0, grid_tile_width=2))
_SM90_KERNELS = grouped_matmul.Kernels(forward=("mosaic", "triton"), dx=("mosaic", "triton"),
                                       dw=("triton", "mosaic"), pinned=_SM90_PINS)
_SM90_WHY = ("dW on Triton (622 TFLOP/s vs Mosaic's 108), forward and dX on Mosaic (428 vs "
             "384, 296 vs 173); configs pinned from the same entries")
_GMM_KERNELS = {
    "H100": (_SM90_KERNELS, "tokamax's H100 tables at F 768, 128 experts: " + _SM90_WHY),
    "H200": (_SM90_KERNELS, "the H100's entry: tokamax ships no H200 table, and the H200 is "
                            "sm_90 as the H100, with more memory bandwidth; its tables at F "
                            "768, 128 experts: " + _SM90_WHY),
    # tokamax ships Mosaic tables for the B200 and reads them itself, so forward and dX keep
    # its choice. Its Triton kernel reads none there: dW's config is the B200 entry of
    # pallas_triton_ragged_dot.json, the table 0.0.17 still ships under the kernel's old name.
    # The TFLOP/s below are the entries at each call's output dtype: none in the forward, the
    # model's bf16 in dX and dW. Their entries with none read dX 1100 vs 125, dW 1057.
    "B200": (grouped_matmul.Kernels(
        forward=("mosaic", "triton"), dx=("mosaic", "triton"), dw=("triton", "mosaic"),
        pinned=_pins(dw_triton=dict(block_m=256, block_n=256, block_k=32, split_k=1,
                                    num_warps=8, num_stages=5))),
             "tokamax's B200 tables at F 768, 128 experts: forward and dX on Mosaic (844 vs "
             "Triton's 282, 1040 vs 129 TFLOP/s) with tokamax's own configs, dW on Triton "
             "(977; Mosaic has no sm100 dW) with its config pinned"),
}
GMM_MIN_TOKAMAX = (0, 0, 17)   # the oldest seen working with jax 0.11.2

# Dense bf16 peak FLOP/s per device, from vendor datasheets: what MFU divides by.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "B200": 2250e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12,
              "TPU v6e": 918e12}


# Memory bandwidth per device in bytes/s, from vendor datasheets: the MoE lab's memory floor.
PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12}


def _lookup(table: dict, device_kind: str):
  for name, value in sorted(table.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in device_kind.lower():
      return value
  return None


def peak_bandwidth(device_kind: str) -> float | None:
  """Returns the datasheet memory bandwidth of one device of `device_kind`, None where unknown."""
  return _lookup(PEAK_BANDWIDTH, device_kind)


def peak_flops(device_kind: str) -> float | None:
  """Returns the bf16 peak FLOP/s of one device of `device_kind`, None where the table lacks it."""
  return _lookup(PEAK_FLOPS, device_kind)


def mfu(flops_per_step: float, step_s: float, devices: int, peak: float | None) -> float | None:
  """Returns model FLOPs utilisation: FLOP/s achieved over `devices` x `peak`, None without a peak."""
  if not peak or step_s <= 0:
    return None
  return flops_per_step / step_s / (devices * peak)


def memory_in_use(devices=None) -> dict:
  """Returns the bytes in use and their peak, the largest over `devices`, None where unreported.

  `devices` defaults to this process's. CPU backends report no memory_stats.
  """
  stats = [d.memory_stats() or {} for d in (devices or jax.local_devices())]
  largest = lambda key: max((s[key] for s in stats if key in s), default=None)
  return dict(memory_bytes_in_use=largest("bytes_in_use"),
              memory_peak_bytes=largest("peak_bytes_in_use"))


def _platform(platform: str | None) -> str:
  return platform or jax.default_backend()


# L from which XLA attention's [B, H, L, L] scores are what a TPU step holds most of; shorter
# sequences keep XLA attention there. Not measured on a TPU: where MaxText's TPU default is.
SPLASH_FROM_LENGTH = 1024


def attention_impl(requested: str | None, dtype: str, head_dim: int,
                   platform: str | None = None, lengths=(), document_mask: bool = False
                   ) -> tuple[str, str]:
  """Picks the implementation for jax.nn.dot_product_attention and says why. On TPU, `lengths`
  (each phase's L) and `document_mask` decide whether splash attention is worth its kernels."""
  if requested not in (None, "auto"):
    return requested, "set in the config"
  platform = _platform(platform)
  if platform == "tpu":
    return _tpu_attention(lengths, document_mask)
  if platform != "gpu":
    return "xla", f"XLA attention on {platform}"
  why_not = cudnn_unavailable(dtype, head_dim, platform)
  return ("xla", why_not) if why_not else ("cudnn", "cuDNN flash attention (GPU, 16-bit "
                                                       "compute)")


def _tpu_attention(lengths, document_mask: bool) -> tuple[str, str]:
  """Splash attention where a document mask or L >= SPLASH_FROM_LENGTH makes XLA's [L, L]
  scores the cost and the kernels can tile L, as the paper's TPU users (MaxText) run; else XLA."""
  not_measured = "not measured on a TPU: the choice MaxText makes there"
  why_not = splash_unavailable(lengths, "tpu") if lengths else "the sequence lengths are unknown"
  worth = document_mask or any(n >= SPLASH_FROM_LENGTH for n in lengths)
  if why_not is None and worth:
    what = ("a document mask" if document_mask else
            f"L {max(lengths)} >= {SPLASH_FROM_LENGTH}")
    return "splash", (f"splash attention (Pallas TPU kernels, no [L, L] scores kept) for "
                      f"{what}; {not_measured}")
  return "xla", ("XLA attention on tpu: " + (why_not if why_not else
                 f"L {max(lengths)} < {SPLASH_FROM_LENGTH} and no document mask, where its "
                 f"[L, L] scores are small") + f" ({not_measured})")


def cudnn_unavailable(dtype: str, head_dim: int, platform: str | None = None) -> str | None:
  """Says why cuDNN flash attention cannot run here, or returns None when it can."""
  platform = _platform(platform)
  if platform != "gpu":
    return f"cuDNN flash attention needs a GPU, this is {platform}"
  if str(dtype) not in ("bfloat16", "float16"):
    return f"cuDNN flash attention needs bfloat16/float16, model.dtype is {dtype}"
  if head_dim > 128 or head_dim % 8:
    return f"cuDNN flash attention needs head_dim <= 128 and % 8 == 0, got {head_dim}"
  return None


def splash_unavailable(lengths, platform: str | None = None) -> str | None:
  """Says why splash attention cannot run here over sequences of these L, or None when it can."""
  platform = _platform(platform)
  if platform != "tpu":
    return f"splash attention runs Pallas TPU kernels, this is {platform}"
  odd = sorted({n for n in lengths if splash_attention.block_for(n) is None})
  return f"splash attention needs L a multiple of 128, got {odd}" if odd else None


def loss_impl(requested: str, platform: str | None = None) -> tuple[str, str]:
  """Picks naive, xla or pallas for `loss.impl` and says why."""
  if requested != "auto":
    return requested, "set in the config"
  return _LOSS.get(_platform(platform), _LOSS["tpu"])


def grouped_matmul_backend(platform: str | None = None, device_kind: str | None = None
                           ) -> tuple[str, grouped_matmul.Kernels, str]:
  """Picks the grouped GEMM under `model.expert_impl=gmm`: xla or tokamax, its kernels, the reason.

  A tokamax older than GMM_MIN_TOKAMAX is a ConfigError naming it.
  """
  platform = _platform(platform)
  version = grouped_matmul.tokamax_version() if platform == "gpu" else None
  if version is None:
    return "xla", grouped_matmul.Kernels(), (f"jax.lax.ragged_dot on {platform}" + (
        f"; {GPU_EXTRA} for tokamax's kernels" if platform == "gpu" else ""))
  if _version_tuple(version) < GMM_MIN_TOKAMAX:
    need = ".".join(map(str, GMM_MIN_TOKAMAX))
    raise ConfigError("model.expert_impl", f"gmm on a GPU needs tokamax >= {need} (with jax "
                      f">= 0.11.2), tokamax {version} is installed: pip install -U "
                      "'tst-jax[gpu]' -c constraints-gpu.txt")
  kind = device_kind or jax.devices()[0].device_kind
  kernels, why = next((v for name, v in _GMM_KERNELS.items() if name.lower() in kind.lower()),
                      (grouped_matmul.Kernels(), f"no kernel table for {kind}: tokamax's own "
                                                 "kernels and configs"))
  kernels, measured = _measured_order(kernels, gemm_measured.pass_times(kind))
  installed = grouped_matmul.tokamax_kernels()
  named = {n for k in kernels[:3] for n in k or grouped_matmul.TOKAMAX_ORDER}
  missing = sorted(named - installed) if installed else []
  if missing:
    kernels = kernels.within(installed)
    cause = (grouped_matmul.triton_unavailable() or "tokamax registered no Triton kernel"
             if "triton" in missing else "not registered by this tokamax")
    why += f"; {', '.join(missing)} not used: {cause}"
  passes = "; ".join(_pass_line(kernels, product, kind) for product in grouped_matmul.PRODUCTS)
  return "tokamax", kernels, (f"tokamax {version} on {kind}: {passes} ({why}{measured}); "
                              f"{gemm_measured.describe(kind)}")


def _measured_order(kernels: grouped_matmul.Kernels, times: dict) -> tuple:
  """Returns `kernels` with each product's kernels in the order the lab measured them, fastest
  first, and the words for it ('' where nothing was measured)."""
  said = []
  for product, per_kernel in times.items():
    ranked = sorted(per_kernel, key=per_kernel.get)
    rest = tuple(k for k in kernels.order(product) or () if k not in ranked)
    kernels = kernels._replace(**{product: tuple(ranked) + rest})
    said.append(f"{product} {ranked[0]}: " + " vs ".join(
        f"{k} {per_kernel[k]:.3g} ms" for k in ranked))
  return kernels, ("; measured fastest by the MoE lab: " + ", ".join(said)) if said else ""


def _pass_line(kernels: grouped_matmul.Kernels, product: str, kind: str) -> str:
  """Says a product's kernels in tokamax's order, each with where its config comes from."""
  def source(kernel):
    tuned = gemm_measured.tuned_count(kind, product, kernel)
    if kernels.config(product, kernel) is not None:
      return f"tuned at {tuned} shapes, else pinned" if tuned else "pinned"
    mine = f"tuned at {tuned} shapes, else " if tuned else ""
    if tokamax_tuning.directory() is not None:
      return mine + "autotuned by tokamax once per shape"
    table = grouped_matmul.tokamax_table(kernel, kind)
    return mine + {True: "tokamax's table where it lists the shape, else its heuristic tile",
                   False: "fallback: tokamax's heuristic tile"}.get(table, "tokamax's")
  order = kernels.order(product)
  if not order:
    return f"{product} tokamax's own kernel and config"
  return f"{product} " + " then ".join(f"{k} [{source(k)}]" for k in order)


def _version_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def expert_impl(requested: str, platform: str | None = None,
                device_kind: str | None = None, planned: bool = False) -> tuple[str, str]:
  """Picks ragged, gmm, blocked or dense for `model.expert_impl` and says why.

  `planned` resolves for a platform this process does not run on, as a plan for a named
  accelerator does: a GPU there has the gpu extra installed.
  """
  platform = _platform(platform)
  planned_gpu = planned and platform == "gpu"
  if requested == "auto":
    requested, why = _EXPERTS.get(platform, _EXPERTS["tpu"])
    if requested != "gmm":
      return requested, why
    if grouped_matmul.tokamax_version() is None and not planned_gpu:
      return _NO_TOKAMAX
  else:
    why = "set in the config"
  if requested in GROUPED_GEMMS and planned_gpu:
    return requested, f"{why}; {_PLANNED_GPU}"
  if requested in GROUPED_GEMMS:
    backend, _, how = grouped_matmul_backend(platform, device_kind)
    return requested, f"{why}; grouped GEMM backend {backend}: {how}"
  return requested, why


def fuse_gate_up(requested: str, experts: str, platform: str | None = None,
                 device_kind: str | None = None) -> tuple[str, str]:
  """Picks on or off for `model.expert_fuse_gate_up` under expert_impl `experts`, and says why."""
  platform = _platform(platform)
  if requested == "on" and experts not in FUSES_GATE_UP:
    raise ConfigError("model.expert_fuse_gate_up", f"fuses the grouped GEMMs of expert_impl "
                      f"{', '.join(FUSES_GATE_UP)}; this run's is {experts}")
  if requested != "auto":
    return requested, "set in the config"
  if experts not in FUSES_GATE_UP:
    return "off", f"expert_impl {experts} has no grouped GEMM to fuse"
  kind = device_kind or platform
  measured = _lookup(_FUSED_STEP, kind) if platform == "gpu" else None
  if measured is None:
    return "off", (f"no train step measured gate and up fused against split on {kind}: "
                   "gpu.sh moe_lab steps both (docs/performance.md)")
  fused, split, where = measured
  return ("on" if fused < split else "off"), (f"a train step took {fused:.3f} s fused, "
                                              f"{split:.3f} s split ({where})")

def dispatch_impl(requested: str, platform: str | None = None) -> tuple[str, str]:
  """Picks how MoE dispatch and combine move rows, `model.dispatch_impl`, and says why."""
  platform = _platform(platform)
  if requested == "pallas" and platform == "tpu":
    raise ConfigError("model.dispatch_impl", "pallas runs Triton kernels, on a GPU (or "
                      "interpreted on CPU); choose another on a TPU")
  if requested != "auto":
    return requested, "set in the config"
  return _DISPATCH.get(platform, _DISPATCH["tpu"])


@dataclasses.dataclass(frozen=True)
class Resolved:
  """The concrete choices of one run, with their reasons."""
  platform: str
  device_kind: str
  choices: dict        # config field -> value, reason

  def to_json(self) -> dict:
    return dict(platform=self.platform, device_kind=self.device_kind,
                **{k: dict(value=v, reason=r) for k, (v, r) in self.choices.items()})

  @classmethod
  def from_json(cls, record: dict) -> Resolved:
    """Reads the choices back from a `to_json` record, such as a run's plan.json."""
    choices = {k: (c["value"], c["reason"]) for k, c in record.items()
               if k not in ("platform", "device_kind")}
    return cls(record["platform"], record["device_kind"], choices)

  def line(self) -> str:
    parts = "; ".join(f"{k}={v} ({r})" for k, (v, r) in self.choices.items())
    return f"platform {self.platform} ({self.device_kind}): {parts}"


def resolve(model_cfg, loss: str, platform: str | None = None, lengths=(),
            document_mask: bool = False) -> Resolved:
  """Resolves every `auto` of a model config and `loss.impl` on `platform`, by default this one;
  `lengths` (each phase's L) and `document_mask` are the run's, which the attention reads.

  Another platform is planned for, as a plan for a named accelerator does: a GPU then counts as
  one with the gpu extra installed.
  """
  platform = _platform(platform)
  here = platform == jax.default_backend()
  kind = jax.devices()[0].device_kind if here else platform
  choices = {
      "model.attention_impl": attention_impl(model_cfg.attention_impl, model_cfg.dtype,
                                             model_cfg.head_dim, platform, lengths,
                                             document_mask),
      "loss.impl": loss_impl(loss, platform),
  }
  if hasattr(model_cfg, "expert_impl"):
    choices["model.expert_impl"] = expert_impl(model_cfg.expert_impl, platform, kind,
                                               planned=not here)
    choices["model.expert_fuse_gate_up"] = fuse_gate_up(
        model_cfg.expert_fuse_gate_up, choices["model.expert_impl"][0], platform, kind)
    choices["model.dispatch_impl"] = dispatch_impl(model_cfg.dispatch_impl, platform)
  return Resolved(platform, kind, choices)


def has_auto(model_cfg) -> bool:
  """Says whether a model config leaves any of its PLATFORM_FIELDS at `auto`."""
  return any(getattr(model_cfg, f.split(".")[1], None) == "auto" for f in PLATFORM_FIELDS
             if f.startswith("model."))


def unresolved(section, name: str):
  """Returns config section `name`, model or loss, with its PLATFORM_FIELDS back at `auto`."""
  fields = {f.split(".")[1]: "auto" for f in PLATFORM_FIELDS if f.startswith(name + ".")
            and hasattr(section, f.split(".")[1])}
  return dataclasses.replace(section, **fields)


def portable(model_cfg):
  """Returns `model_cfg` with each `auto` kernel set to one that every platform runs.

  That is XLA attention, dense experts unfused and XLA's gathers, for what does not depend on the kernel, such as the
  parameters' shapes. It does not ask the platform: the first question starts JAX's backend,
  and the XLA flags, the emulated devices of a fit check and jax.distributed must all come
  before that.
  """
  fields = {"attention_impl": "xla", "expert_impl": "dense", "dispatch_impl": "gather",
            "expert_fuse_gate_up": "off"}
  return dataclasses.replace(model_cfg, **{f: v for f, v in fields.items()
                                           if getattr(model_cfg, f, None) == "auto"})


def resolved_model(model_cfg, resolved: Resolved | None = None):
  """Returns `model_cfg` with the model's `auto` fields as `resolved` chose them.

  `resolved` defaults to resolving here and now, for a model built outside a run. A run's spec
  resolves once, in `on_platform`.
  """
  resolved = resolved or resolve(model_cfg, "naive")
  return dataclasses.replace(model_cfg, **{f.split(".")[1]: value for f, (value, _) in
                                           resolved.choices.items() if f.startswith("model.")})
