"""Per-platform defaults: what `auto` means for attention, the fused loss and MoE experts.

Each choice is the implementation measured fastest on that platform (docs/performance.md,
benchmarks/gpu.sh), never the one we hope is fastest; platforms without a measurement get
the plain XLA path and say so. A run resolves them once (`resolve`), prints them in its plan
and records them in config.json and summary.json; library code that meets `auto` calls the
same functions.
"""

from __future__ import annotations

import copy
import dataclasses

import jax

from tst_jax.kernels import grouped_matmul, splash_attention

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
# model.expert_impl=auto: on CPU ragged_dot is a masked dense matmul over every expert.
_EXPERTS = {"cpu": ("blocked", "CPU expands ragged_dot over every expert (docs/performance.md)"),
            "gpu": ("blocked", "measured on H100 (docs/performance.md); ragged_dot not yet faster"),
            "tpu": ("ragged", "grouped matmul, native on TPU")}


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


def grouped_matmul_backend(platform: str | None = None) -> tuple[str, str]:
  """(xla | tokamax, the reason): the grouped GEMM under `model.expert_impl=gmm`."""
  platform = _platform(platform)
  if platform == "gpu" and grouped_matmul.tokamax_available():
    return "tokamax", ("tokamax.ragged_dot's Mosaic GPU / Triton kernels: XLA's GPU ragged_dot "
                       "expands to dense (not yet measured against blocked: docs/performance.md)")
  return "xla", (f"jax.lax.ragged_dot on {platform}" + (
      "; pip install 'tst-jax[gpu]' for tokamax's kernels" if platform == "gpu" else ""))


def expert_impl(requested: str, platform: str | None = None) -> tuple[str, str]:
  """(ragged | gmm | blocked | dense, the reason) for `model.expert_impl`."""
  if requested == "gmm":
    backend, why = grouped_matmul_backend(platform)
    return requested, f"set in the config; grouped GEMM backend {backend}: {why}"
  if requested != "auto":
    return requested, "set in the config"
  return _EXPERTS.get(_platform(platform), _EXPERTS["tpu"])


@dataclasses.dataclass(frozen=True)
class Resolved:
  """The concrete choices of one run, with their reasons."""
  platform: str
  device_kind: str
  choices: dict        # config field -> (value, reason)

  def to_json(self) -> dict:
    return dict(platform=self.platform, device_kind=self.device_kind,
                **{k: dict(value=v, reason=r) for k, (v, r) in self.choices.items()})

  def line(self) -> str:
    parts = "; ".join(f"{k}={v} ({r})" for k, (v, r) in self.choices.items())
    return f"platform {self.platform} ({self.device_kind}): {parts}"


def resolve(model_cfg, loss: str, platform: str | None = None) -> Resolved:
  """Resolve every `auto` of a run (its model config dataclass and `loss.impl`) on
  `platform` (default: the one this process runs on)."""
  platform = _platform(platform)
  choices = {
      "model.attention_impl": attention_impl(model_cfg.attention_impl, model_cfg.dtype,
                                             model_cfg.head_dim, platform),
      "loss.impl": loss_impl(loss, platform),
  }
  if hasattr(model_cfg, "expert_impl"):
    choices["model.expert_impl"] = expert_impl(model_cfg.expert_impl, platform)
  kind = jax.devices()[0].device_kind if platform == jax.default_backend() else platform
  return Resolved(platform, kind, choices)


def apply(config, resolved: Resolved):
  """A copy of `config` with the resolved values in place of `auto`."""
  config = copy.deepcopy(config)
  with config.unlocked():
    for field, (value, _) in resolved.choices.items():
      section, name = field.split(".")
      config[section][name] = value
  return config
