"""Multi-GPU XLA flags, NVIDIA JAX-Toolbox's for FSDP, put in XLA_FLAGS before the backend starts.

XLA reads XLA_FLAGS once, when the first backend starts, and a later change does nothing. So
`train.cli.run` decides before anything touches a device or jax.distributed starts. It decides
from what it can know without starting a backend: JAX_PLATFORMS, the GPUs `nvidia-smi -L` lists
within CUDA_VISIBLE_DEVICES and `distributed.local_device_ids`, the number of processes, and
the config's mesh. Flags are set only for a GPU run over more than one device, and never when
XLA_FLAGS is in the environment, even empty, since the user's are then used as they are.

The flag names come from the GPU performance guide in JAX-Toolbox's rosetta docs
and XLA's GPU optimization levels page, openxla.org/xla/gpu_optimization_levels. The docs
explain each one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pkgutil
import shutil
import subprocess

from jax._src import xla_bridge  # backends_are_initialized: no public equivalent

# flag, value, what it does. A value of None is the combine threshold: one layer's bytes.
FSDP_FLAGS = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true",
     "schedule collectives early and compute in between, so they overlap"),
    ("xla_gpu_enable_pipelined_all_gather", "true",
     "all-gather the next layer's weights during this layer's compute (scanned layers)"),
    ("xla_gpu_enable_pipelined_reduce_scatter", "true",
     "reduce-scatter a layer's gradients during the next layer's backward"),
    ("xla_gpu_enable_pipelined_all_reduce", "true",
     "the same for all-reduces (data-parallel gradients, replicated norm scales)"),
    ("xla_gpu_enable_while_loop_double_buffering", "true",
     "unroll the layer loop by two, so a collective can cross the loop boundary"),
    ("xla_gpu_all_gather_combine_threshold_bytes", None,
     "combine a layer's all-gathers into one, up to one layer's float32 weights"),
    ("xla_gpu_reduce_scatter_combine_threshold_bytes", None,
     "combine a layer's gradient reduce-scatters, up to one layer's float32 weights"),
    ("xla_gpu_all_reduce_combine_threshold_bytes", None,
     "combine all-reduces, up to one layer's float32 weights"),
)


@dataclasses.dataclass(frozen=True)
class Decision:
  """The flags this run adds to XLA_FLAGS, maybe none, and why."""
  flags: dict          # flag name -> value
  reason: str
  applied: bool = False   # written into os.environ["XLA_FLAGS"] by `apply`

  def line(self) -> str:
    if not self.flags:
      return f"XLA_FLAGS: none added ({self.reason})"
    text = " ".join(f"--{k}={v}" for k, v in self.flags.items())
    return f"XLA_FLAGS{'' if self.applied else ' (not set here)'}: {text} ({self.reason})"


def recommended(platform: str, num_devices: int, layer_bytes: int) -> dict[str, str]:
  """Returns the flags a run on `num_devices` of `platform` gets: none unless GPU and > 1."""
  if platform != "gpu" or num_devices <= 1:
    return {}
  threshold = str(max(int(layer_bytes), 1))
  return {name: threshold if value is None else value for name, value, _ in FSDP_FLAGS}


def decide(environ, *, platform: str, num_devices: int, layer_bytes: int) -> Decision:
  """Returns what `apply` does for this environment, platform and device count: pure."""
  if "XLA_FLAGS" in environ:   # even empty: `XLA_FLAGS= python main.py ...` turns them off
    return Decision({}, "XLA_FLAGS is set by the user and used as it is")
  flags = recommended(platform, num_devices, layer_bytes)
  if not flags:
    where = f"1 {platform}" if platform == "gpu" else platform
    return Decision({}, f"{where}: the multi-GPU flags are for GPU runs over more than one "
                        "device")
  return Decision(flags, f"{num_devices} GPUs: NVIDIA JAX-Toolbox's FSDP flags, combine "
                         f"thresholds = one layer's float32 weights, {layer_bytes / 2**20:.1f} MiB")


def local_gpus(environ, local_device_ids: str = "") -> int:
  """Counts the NVIDIA GPUs this process will use, without starting a JAX backend.

  `nvidia-smi -L` lists them, within CUDA_VISIBLE_DEVICES and the config's local_device_ids.
  Without a driver there are 0.
  """
  if local_device_ids:
    return len(local_device_ids.split(","))
  visible = environ.get("CUDA_VISIBLE_DEVICES")
  smi = shutil.which("nvidia-smi")
  if visible is not None:
    return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
  if smi is None:
    return 0
  try:
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return 0
  return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


# A GPU profile needs XLA's command buffers off. With them on, as XLA defaults, a trace shows
# each captured run of kernels as one op, command_buffer_N, and the step profile cannot say
# what ran.
COMMAND_BUFFERS_OFF = "--xla_gpu_enable_command_buffer="   # the empty list, meaning none


def command_buffers_off(environ=os.environ) -> bool:
  """Says whether XLA_FLAGS turns XLA's GPU command buffers off."""
  return any(f.rstrip("'\"") == COMMAND_BUFFERS_OFF
             for f in environ.get("XLA_FLAGS", "").split())


def for_profile(environ=os.environ) -> str:
  """Adds COMMAND_BUFFERS_OFF to XLA_FLAGS before the backend starts, and says what it did.

  Call it after `apply`, which reads a set XLA_FLAGS as the user's. A flag the user set for
  command buffers is kept. It holds for the whole process, so every step runs without command
  buffers.
  """
  current = environ.get("XLA_FLAGS", "")
  if "xla_gpu_enable_command_buffer" in current:
    return f"XLA_FLAGS: command buffers as the user set them ({current})"
  if xla_bridge.backends_are_initialized():
    return ("XLA_FLAGS: command buffers left on: the JAX backend had already started (set "
            f"XLA_FLAGS={COMMAND_BUFFERS_OFF} yourself)")
  environ["XLA_FLAGS"] = f"{current} {COMMAND_BUFFERS_OFF}".strip()
  return (f"XLA_FLAGS += {COMMAND_BUFFERS_OFF} (XLA's GPU command buffers off, so that the "
          "profile sees every kernel)")


def _installed(prefix: str) -> bool:
  return any(m.name.startswith(prefix) for m in pkgutil.iter_modules())


def _cuda_plugin() -> bool:
  return _installed("jax_cuda")


def run_platform(environ, gpus: int) -> str:
  """Guesses the platform JAX will pick: JAX_PLATFORMS's first entry, else gpu or tpu, else cpu.

  gpu needs NVIDIA GPUs and a CUDA plugin for jaxlib, tpu needs libtpu.
  """
  first = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
  if first:
    return "gpu" if first in ("cuda", "gpu") else first
  if gpus and _cuda_plugin():
    return "gpu"
  return "tpu" if _installed("libtpu") else "cpu"


def run_devices(mesh_cfg, local: int, processes: int) -> int:
  """Counts the devices the run's mesh uses: local times processes, unless every axis is given.

  `mesh.data=1` gives a one-device run on a host of 8.
  """
  axes = [int(getattr(mesh_cfg, a)) for a in ("data", "fsdp", "tensor", "expert")]
  total = local * max(processes, 1)
  return total if -1 in axes else min(math.prod(axes), total)


def process_count(distributed_cfg, environ) -> int:
  """Counts the run's processes, as far as the config and the usual launcher variables say."""
  for value in (distributed_cfg.num_processes, environ.get("JAX_NUM_PROCESSES"),
                environ.get("SLURM_NTASKS"), environ.get("OMPI_COMM_WORLD_SIZE")):
    if value and int(value) > 0:
      return int(value)
  return 1


def apply(mesh_cfg, distributed_cfg, layer_bytes: int, environ=os.environ,
          platform: str | None = None) -> Decision:
  """Decides and, for a multi-GPU run, sets environ["XLA_FLAGS"].

  Call it before anything starts a JAX backend, since after that nothing is set. `platform` is
  the one this process will use where the caller has chosen it, by default read from the
  machine.
  """
  gpus = local_gpus(environ, distributed_cfg.local_device_ids)
  platform = platform or run_platform(environ, gpus)
  local = gpus if platform == "gpu" else 1
  decision = decide(environ, platform=platform, layer_bytes=layer_bytes,
                    num_devices=run_devices(mesh_cfg, local, process_count(distributed_cfg,
                                                                           environ)))
  if not decision.flags:
    return decision
  if xla_bridge.backends_are_initialized():
    return dataclasses.replace(decision, reason=decision.reason + "; not set: the JAX backend "
                               "had already started, set them in XLA_FLAGS yourself")
  environ["XLA_FLAGS"] = " ".join(f"--{k}={v}" for k, v in decision.flags.items())
  return dataclasses.replace(decision, applied=True)
