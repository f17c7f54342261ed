"""Per-platform defaults: what `auto` means for attention, the fused loss and MoE experts.

Each choice is the implementation measured fastest on that platform, never the one we hope is
fastest: docs/performance.md has the measurements. Platforms without a measurement get the
plain XLA path and say so. A run resolves them once with `resolve`, prints them in its plan and
records them in config.json and summary.json. Library code that meets `auto` calls the same
functions.
"""

from __future__ import annotations

import dataclasses
import re

import jax

from tst_jax.errors import ConfigError
from tst_jax.kernels import grouped_matmul, moe_dispatch, splash_attention, tokamax_tuning

# The config fields `auto` resolves on a platform: how a run computes, not what it computes.
# A workdir resumes, evaluates and loads on another platform with its own choices.
PLATFORM_FIELDS = ("model.attention_impl", "model.expert_impl", "model.dispatch_impl",
                   "loss.impl")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
LOSS_IMPLS = ("auto", "naive", "xla", "pallas")
EXPERT_IMPLS = ("auto", "ragged", "gmm", "blocked", "dense")
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
FUSES_GATE_UP = ("gmm", "ragged")   # the expert_impls that take model.expert_fuse_gate_up
_NO_TOKAMAX = ("blocked", "gmm needs tokamax on a GPU (XLA's GPU ragged_dot expands to dense and "
                          "ran out of memory): pip install 'tst-jax[gpu]' -c constraints-gpu.txt")
# expert_impl=gmm on a GPU: tokamax's kernel for each product of the grouped GEMM, chosen from
# tokamax's own H100 autotuning tables. The second kernel is the fallback where the first
# raises NotImplementedError, as Mosaic does on sm100 for all but the forward.
_GMM_KERNELS = {"H100": (
    grouped_matmul.Kernels(forward=("mosaic", "triton"), dx=("mosaic", "triton"),
                           dw=("triton", "mosaic")),
    "tokamax's H100 tables: dW on Triton (393-595 TFLOP/s vs Mosaic 108-281), forward and dX "
    "on Mosaic (ahead at 5 of 7 and 6 of 8 shapes)")}
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


def attention_impl(requested: str | None, dtype: str, head_dim: int,
                   platform: str | None = None) -> tuple[str, str]:
  """Picks the implementation for jax.nn.dot_product_attention and says why."""
  if requested not in (None, "auto"):
    return requested, "set in the config"
  platform = _platform(platform)
  if platform == "tpu":
    return "xla", ("XLA attention on tpu: splash (Pallas TPU kernels, attention_impl=splash) is "
                   "not yet measured faster on a TPU")
  if platform != "gpu":
    return "xla", f"XLA attention on {platform}"
  why_not = cudnn_unavailable(dtype, head_dim, platform)
  return ("xla", why_not) if why_not else ("cudnn", "cuDNN flash attention (GPU, 16-bit "
                                                       "compute)")


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
        "; pip install 'tst-jax[gpu]' for tokamax's kernels" if platform == "gpu" else ""))
  if _version_tuple(version) < GMM_MIN_TOKAMAX:
    need = ".".join(map(str, GMM_MIN_TOKAMAX))
    raise ConfigError("model.expert_impl", f"gmm on a GPU needs tokamax >= {need} (with jax "
                      f">= 0.11.2), tokamax {version} is installed: pip install -U "
                      "'tst-jax[gpu]' -c constraints-gpu.txt")
  kind = device_kind or jax.devices()[0].device_kind
  kernels, why = next((v for name, v in _GMM_KERNELS.items() if name.lower() in kind.lower()),
                      (grouped_matmul.Kernels(), f"tokamax's default kernels (none measured on "
                                                 f"{kind})"))
  installed = grouped_matmul.tokamax_kernels()
  missing = sorted({n for k in kernels if k for n in k} - installed) if installed else []
  if missing:
    kernels = kernels.within(installed)
    why += (f"; {', '.join(missing)} not used: not installed (tokamax's Triton kernels "
            "need the jax-triton and triton packages)")
  return "tokamax", kernels, (f"tokamax {version}: {kernels.line()} ({why}); "
                              f"{tokamax_tuning.describe()}")


def _version_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def expert_impl(requested: str, platform: str | None = None,
                device_kind: str | None = None) -> tuple[str, str]:
  """Picks ragged, gmm, blocked or dense for `model.expert_impl` and says why."""
  platform = _platform(platform)
  if requested == "auto":
    requested, why = _EXPERTS.get(platform, _EXPERTS["tpu"])
    if requested != "gmm":
      return requested, why
    if grouped_matmul.tokamax_version() is None:
      return _NO_TOKAMAX
  else:
    why = "set in the config"
  if requested == "gmm":
    backend, _, how = grouped_matmul_backend(platform, device_kind)
    return requested, f"{why}; grouped GEMM backend {backend}: {how}"
  return requested, why

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


def resolve(model_cfg, loss: str, platform: str | None = None) -> Resolved:
  """Resolves every `auto` of a model config and `loss.impl` on `platform`, by default this one."""
  platform = _platform(platform)
  kind = jax.devices()[0].device_kind if platform == jax.default_backend() else platform
  choices = {
      "model.attention_impl": attention_impl(model_cfg.attention_impl, model_cfg.dtype,
                                             model_cfg.head_dim, platform),
      "loss.impl": loss_impl(loss, platform),
  }
  if hasattr(model_cfg, "expert_impl"):
    choices["model.expert_impl"] = expert_impl(model_cfg.expert_impl, platform, kind)
    experts = choices["model.expert_impl"][0]
    if getattr(model_cfg, "expert_fuse_gate_up", False) and experts not in FUSES_GATE_UP:
      raise ConfigError("model.expert_fuse_gate_up", f"fuses the grouped GEMMs of expert_impl "
                        f"{' or '.join(FUSES_GATE_UP)}; this run's is {experts} "
                        f"({choices['model.expert_impl'][1]})")
    choices["model.dispatch_impl"] = dispatch_impl(model_cfg.dispatch_impl, platform)
  return Resolved(platform, kind, choices)


def unresolved(section, name: str):
  """Returns config section `name`, model or loss, with its PLATFORM_FIELDS back at `auto`."""
  fields = {f.split(".")[1]: "auto" for f in PLATFORM_FIELDS if f.startswith(name + ".")
            and hasattr(section, f.split(".")[1])}
  return dataclasses.replace(section, **fields)


def portable(model_cfg):
  """Returns `model_cfg` with each `auto` kernel set to one that every platform runs.

  That is XLA attention, dense experts and XLA's gathers, for what does not depend on the kernel, such as the
  parameters' shapes. It does not ask the platform: the first question starts JAX's backend,
  and the XLA flags, the emulated devices of a fit check and jax.distributed must all come
  before that.
  """
  fields = {"attention_impl": "xla", "expert_impl": "dense", "dispatch_impl": "gather"}
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
