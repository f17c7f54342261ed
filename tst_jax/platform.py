"""Per-platform defaults: what `auto` means for attention, the fused loss and MoE experts.

Each choice is the implementation measured fastest on that platform (docs/performance.md,
benchmarks/gpu.sh), never the one we hope is fastest; platforms without a measurement get
the plain XLA path and say so. A run resolves them once (`resolve`), prints them in its plan
and records them in config.json and summary.json; library code that meets `auto` calls the
same functions.
"""

from __future__ import annotations

import dataclasses
import re

import jax

from tst_jax.errors import ConfigError
from tst_jax.kernels import grouped_matmul, splash_attention, tokamax_tuning

# The config fields `auto` resolves on a platform: how a run computes, not what it computes
# (a workdir resumes, evaluates and loads on another platform with its own choices).
PLATFORM_FIELDS = ("model.attention_impl", "model.expert_impl", "loss.impl")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
LOSS_IMPLS = ("auto", "naive", "xla", "pallas")
EXPERT_IMPLS = ("auto", "ragged", "gmm", "blocked", "dense")

# loss.impl=auto, from measurements at the paper's shapes (N=16384, D=2048, V=128256, bf16):
# H100 forward+backward pallas 63 ms, xla 74 ms, naive 81 ms (pallas also fastest in the
# 270M step); CPU (docs/kernels.md) xla beats naive, pallas only runs interpreted. TPU is
# not measured: the pure-XLA path until it is.
_LOSS = {"gpu": ("pallas", "fastest on H100: 63 ms vs xla 74, naive 81 (docs/performance.md)"),
         "cpu": ("xla", "fastest on CPU (docs/kernels.md); pallas only runs interpreted"),
         "tpu": ("xla", "Pallas TPU kernel not yet measured against it")}
# model.expert_impl=auto, from step times (docs/performance.md). H100, jax 0.11.2, tokamax 0.0.17,
# 2026-11-25: gmm (tokamax's kernels) 0.161 s vs blocked 0.228 s at the 10B-A1B layer shapes
# (4 layers, 8 x 2048), 0.282 vs 0.392 s on configs/qwen3_moe_gpu_small.py; XLA's ragged ran
# out of memory. On CPU ragged_dot is a masked dense matmul over every expert.
_EXPERTS = {"cpu": ("blocked", "CPU expands ragged_dot over every expert (docs/performance.md)"),
            "gpu": ("gmm", "grouped GEMMs on tokamax's kernels: 1.42x faster than blocked at "
                           "the 10B-A1B layer shapes (0.161 vs 0.228 s), 1.39x on "
                           "qwen3_moe_gpu_small (0.282 vs 0.392 s); H100, 2026-11-25"),
            "tpu": ("ragged", "grouped matmul, native on TPU")}
_NO_TOKAMAX = ("blocked", "gmm needs tokamax on a GPU (XLA's GPU ragged_dot expands to dense and "
                          "ran out of memory): pip install 'tst-jax[gpu]' -c constraints-gpu.txt")
# expert_impl=gmm on a GPU: tokamax's kernel for each product of the grouped GEMM
# (`implementation=`; the second is the fallback where the first raises NotImplementedError,
# as Mosaic does on sm100 for all but the forward). From tokamax's own H100 autotuning tables
# (tokamax/data/autotuning/nvidia_h100_80gb_hbm3/pallas_{mosaic_gpu,triton}_ragged_dot.json,
# openxla/tokamax at 783ea95; the best configuration of each shape, bf16, 4k-262k rows, 8-256
# experts), TFLOP/s at the shapes both kernels list:
#   forward  Mosaic 290-462, Triton 44-649: Mosaic ahead at 5 of 7 (a tie, 419 vs 421, and the
#            8-expert shape aside; at K = 1024, E = 256: 372 vs 139)
#   dX       Mosaic 178-408, Triton 144-399: Mosaic ahead at 6 of 8 (at F = 768, E = 128:
#            296 vs 164)
#   dW       Triton 393-595, Mosaic 108-281: Triton ahead at all 9, 3.4-5.1x at 128-256
#            experts (at F = 768, E = 128: 551 vs 108); the MoE recipe's profile showed
#            Mosaic's dW at ~100 TFLOP/s (2026-11-25)
_GMM_KERNELS = {"H100": (
    grouped_matmul.Kernels(forward=("mosaic", "triton"), dx=("mosaic", "triton"),
                           dw=("triton", "mosaic")),
    "tokamax's H100 tables: dW on Triton (393-595 TFLOP/s vs Mosaic 108-281), forward and dX "
    "on Mosaic (ahead at 5 of 7 and 6 of 8 shapes)")}
GMM_MIN_TOKAMAX = (0, 0, 17)   # seen working with jax 0.11.2; 0.0.12 fails under it

def _platform(platform: str | None) -> str:
  return platform or jax.default_backend()


def attention_impl(requested: str | None, dtype: str, head_dim: int,
                   platform: str | None = None) -> tuple[str, str]:
  """(implementation for jax.nn.dot_product_attention, the reason)."""
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
  """Why cuDNN flash attention cannot run here (None: it can)."""
  platform = _platform(platform)
  if platform != "gpu":
    return f"cuDNN flash attention needs a GPU, this is {platform}"
  if str(dtype) not in ("bfloat16", "float16"):
    return f"cuDNN flash attention needs bfloat16/float16, model.dtype is {dtype}"
  if head_dim > 128 or head_dim % 8:
    return f"cuDNN flash attention needs head_dim <= 128 and % 8 == 0, got {head_dim}"
  return None


def splash_unavailable(lengths, platform: str | None = None) -> str | None:
  """Why splash attention cannot run here over sequences of these L (None: it can)."""
  platform = _platform(platform)
  if platform != "tpu":
    return f"splash attention runs Pallas TPU kernels, this is {platform}"
  odd = sorted({n for n in lengths if splash_attention.block_for(n) is None})
  return f"splash attention needs L a multiple of 128, got {odd}" if odd else None


def loss_impl(requested: str, platform: str | None = None) -> tuple[str, str]:
  """(naive | xla | pallas, the reason) for `loss.impl`."""
  if requested != "auto":
    return requested, "set in the config"
  return _LOSS.get(_platform(platform), _LOSS["tpu"])


def grouped_matmul_backend(platform: str | None = None, device_kind: str | None = None
                           ) -> tuple[str, grouped_matmul.Kernels, str]:
  """(xla | tokamax, tokamax's kernel per product, the reason): the grouped GEMM under
  `model.expert_impl=gmm`. A tokamax older than GMM_MIN_TOKAMAX is a ConfigError naming it."""
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
  return "tokamax", kernels, (f"tokamax {version}: {kernels.line()} ({why}); "
                              f"{tokamax_tuning.describe()}")


def _version_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def expert_impl(requested: str, platform: str | None = None,
                device_kind: str | None = None) -> tuple[str, str]:
  """(ragged | gmm | blocked | dense, the reason) for `model.expert_impl`."""
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

@dataclasses.dataclass(frozen=True)
class Resolved:
  """The concrete choices of one run, with their reasons."""
  platform: str
  device_kind: str
  choices: dict        # config field -> (value, reason)

  def to_json(self) -> dict:
    return dict(platform=self.platform, device_kind=self.device_kind,
                **{k: dict(value=v, reason=r) for k, (v, r) in self.choices.items()})

  @classmethod
  def from_json(cls, record: dict) -> Resolved:
    """The choices of a `to_json` record (a run's plan.json)."""
    choices = {k: (c["value"], c["reason"]) for k, c in record.items()
               if k not in ("platform", "device_kind")}
    return cls(record["platform"], record["device_kind"], choices)

  def line(self) -> str:
    parts = "; ".join(f"{k}={v} ({r})" for k, (v, r) in self.choices.items())
    return f"platform {self.platform} ({self.device_kind}): {parts}"


def resolve(model_cfg, loss: str, platform: str | None = None) -> Resolved:
  """Resolve every `auto` of a run (its model config dataclass and `loss.impl`) on
  `platform` (default: the one this process runs on)."""
  platform = _platform(platform)
  kind = jax.devices()[0].device_kind if platform == jax.default_backend() else platform
  choices = {
      "model.attention_impl": attention_impl(model_cfg.attention_impl, model_cfg.dtype,
                                             model_cfg.head_dim, platform),
      "loss.impl": loss_impl(loss, platform),
  }
  if hasattr(model_cfg, "expert_impl"):
    choices["model.expert_impl"] = expert_impl(model_cfg.expert_impl, platform, kind)
  return Resolved(platform, kind, choices)


def unresolved(section, name: str):
  """Config section `name` (model or loss) with its PLATFORM_FIELDS back at `auto`."""
  fields = {f.split(".")[1]: "auto" for f in PLATFORM_FIELDS if f.startswith(name + ".")
            and hasattr(section, f.split(".")[1])}
  return dataclasses.replace(section, **fields)


def portable(model_cfg):
  """`model_cfg` with each `auto` kernel set to one that every platform runs (XLA attention,
  dense experts), for what does not depend on the kernel, such as the parameters' shapes,
  without asking the platform: its first question starts JAX's backend, and the XLA flags, the
  emulated devices of a fit check and jax.distributed must all come before that."""
  fields = {"attention_impl": "xla", "expert_impl": "dense"}
  return dataclasses.replace(model_cfg, **{f: v for f, v in fields.items()
                                           if getattr(model_cfg, f, None) == "auto"})


def resolved_model(model_cfg, resolved: Resolved | None = None):
  """`model_cfg` with the model's `auto` fields as `resolved` chose them (default: resolved
  here and now, for a model built outside a run; a run's spec resolves once, `on_platform`)."""
  resolved = resolved or resolve(model_cfg, "naive")
  return dataclasses.replace(model_cfg, **{f.split(".")[1]: value for f, (value, _) in
                                           resolved.choices.items() if f.startswith("model.")})
