"""Multi-process runs (one per host, see docs/distributed.md): jax.distributed, barriers."""

from __future__ import annotations

import contextlib
import logging
import os

import jax
from jax._src import xla_bridge  # backends_are_initialized: no public equivalent
from jax.experimental import multihost_utils

from tst_jax.errors import ConfigError

log = logging.getLogger("tst_jax")
MODES = ("auto", "on", "off")


def _settings(cfg) -> dict:
  """Config fields, falling back to JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
  JAX_PROCESS_ID; None where neither sets them (left to cluster auto-detection)."""
  env = os.environ
  address = cfg.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
  count = cfg.num_processes or int(env.get("JAX_NUM_PROCESSES", 0)) or None
  index = cfg.process_id if cfg.process_id >= 0 else int(env.get("JAX_PROCESS_ID", -1))
  ids = cfg.local_device_ids or env.get("JAX_LOCAL_DEVICE_IDS", "")
  return dict(coordinator_address=address, num_processes=count,
              process_id=None if index < 0 else index,
              local_device_ids=[int(i) for i in ids.split(",")] if ids else None)


def initialize(cfg) -> bool:
  """Start jax.distributed for a multi-process run (config section `distributed`).

  Must run before anything touches a JAX device. mode 'off': never. 'on': always (the
  missing fields auto-detected on Cloud TPU, GKE, Slurm, Open MPI). 'auto': when the config
  or environment names a coordinator or more than one process, else try cluster
  auto-detection and stay single-process if there is no cluster. Returns True if started.
  """
  if cfg.mode not in MODES:
    raise ConfigError(f"config.distributed.mode: must be one of {MODES}, got {cfg.mode!r}")
  if cfg.cpu_devices:
    if not xla_bridge.backends_are_initialized():
      jax.config.update("jax_num_cpu_devices", cfg.cpu_devices)
    elif jax.local_device_count("cpu") != cfg.cpu_devices:
      raise RuntimeError(f"config.distributed.cpu_devices={cfg.cpu_devices} but JAX already "
                         f"started with {jax.local_device_count('cpu')} CPU devices")
  if cfg.mode == "off" or jax.distributed.is_initialized():
    return jax.distributed.is_initialized()
  settings = _settings(cfg)
  requested = (cfg.mode == "on" or settings["coordinator_address"] is not None
               or (settings["num_processes"] or 1) > 1)
  if xla_bridge.backends_are_initialized():
    if requested:
      raise RuntimeError("config.distributed: jax.distributed must start before any JAX "
                         "computation; call tst_jax.parallel.distributed.initialize first")
    return False   # already running single-process (tests, notebooks)
  try:
    jax.distributed.initialize(**settings, initialization_timeout=cfg.timeout_s,
                               heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)
  except ValueError as e:
    if requested or "should be defined" not in str(e):
      raise ConfigError(f"config.distributed: {e} (set coordinator_address, num_processes "
                       "and process_id, or the JAX_* variables; see docs/distributed.md)") from e
    return False   # 'auto' and no cluster found: a single process
  log.info("jax.distributed: process %d of %d, %d local / %d global devices",
           jax.process_index(), jax.process_count(), jax.local_device_count(),
           jax.device_count())
  return True


def is_primary() -> bool:
  """Process 0 writes the run's files (metrics, plots, config, summary)."""
  return jax.process_index() == 0


def barrier(name: str):
  """Block until every process reaches the barrier `name` (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def primary_first(name: str):
  """Process 0 runs the block first (it builds caches such as the tokenizer), then the rest."""
  if not is_primary():
    barrier(name)
  yield
  if is_primary():
    barrier(name)
