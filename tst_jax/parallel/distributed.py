"""Multi-process runs, one per host: jax.distributed, barriers, a watchdog."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time

import jax
import numpy as np
from jax._src import distributed as distributed_state  # its client: the key-value store
from jax._src import xla_bridge  # backends_are_initialized: no public equivalent
from jax.experimental import multihost_utils

from tst_jax import schema
from tst_jax.errors import EXIT_STATUS, ConfigError

log = logging.getLogger("tst_jax")
MODES = ("auto", "on", "off")
_DEVICE_IDS = schema.Rule(
    lambda v: isinstance(v, str) and (not v or all(p.strip().isdigit() for p in v.split(","))),
    "a comma list of device numbers, or ''", str)


@dataclasses.dataclass(frozen=True)
class Distributed:
  """config.distributed: multi-process runs."""
  mode: str = schema.field("auto", schema.one_of(MODES), "auto: on if a coordinator or "
                           "cluster is found | on | off")
  coordinator_address: str = schema.field("", schema.STRING, "host:port of process 0 (\"\": "
                                          "$JAX_COORDINATOR_ADDRESS)")
  num_processes: int = schema.field(0, schema.integer(0), "0: $JAX_NUM_PROCESSES or detected")
  process_id: int = schema.field(-1, schema.integer(-1), "-1: $JAX_PROCESS_ID or detected")
  local_device_ids: str = schema.field("", _DEVICE_IDS, "comma list of this process's "
                                       "accelerators (\"\": all visible)")
  cpu_devices: int = schema.field(0, schema.integer(0), ">0: this many CPU devices per process "
                                  "(tests, CPU clusters)")
  timeout_s: int = schema.field(300, schema.integer(1), "seconds to wait for every process to "
                                "join")
  heartbeat_timeout_s: int = schema.field(100, schema.integer(1), "a process silent this long is "
                                          "dead: the others stop")


def _settings(dist) -> dict:
  """Returns config fields, else JAX_* variables, else None for cluster auto-detection."""
  env = os.environ
  address = dist.coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
  count = dist.num_processes or int(env.get("JAX_NUM_PROCESSES", 0)) or None
  index = dist.process_id if dist.process_id >= 0 else int(env.get("JAX_PROCESS_ID", -1))
  ids = dist.local_device_ids or env.get("JAX_LOCAL_DEVICE_IDS", "")
  return dict(coordinator_address=address, num_processes=count,
              process_id=None if index < 0 else index,
              local_device_ids=[int(i) for i in ids.split(",")] if ids else None)


def initialize(dist: Distributed) -> bool:
  """Starts jax.distributed for a multi-process run, from the checked `distributed` section.

  Must run before anything touches a JAX device. mode 'off' never starts it. 'on' always does,
  with the missing fields auto-detected on Cloud TPU, GKE, Slurm and Open MPI. 'auto' starts
  it when the config or environment names a coordinator or more than one process, else tries
  cluster auto-detection and stays single-process if there is no cluster. Returns True if
  started.
  """
  if dist.cpu_devices:
    if not xla_bridge.backends_are_initialized():
      jax.config.update("jax_num_cpu_devices", dist.cpu_devices)
    elif jax.local_device_count("cpu") != dist.cpu_devices:
      raise RuntimeError(f"config.distributed.cpu_devices={dist.cpu_devices} but JAX already "
                         f"started with {jax.local_device_count('cpu')} CPU devices")
  if dist.mode == "off" or jax.distributed.is_initialized():
    return jax.distributed.is_initialized()
  settings = _settings(dist)
  requested = (dist.mode == "on" or settings["coordinator_address"] is not None
               or (settings["num_processes"] or 1) > 1)
  if xla_bridge.backends_are_initialized():
    if requested:
      raise RuntimeError("config.distributed: jax.distributed must start before any JAX "
                         "computation; call tst_jax.parallel.distributed.initialize first")
    return False   # already running single-process, as tests and notebooks do
  try:
    # JAX's own heartbeat aborts with a C++ stack trace, so the watchdog gets time to go first.
    jax.distributed.initialize(**settings, initialization_timeout=dist.timeout_s,
                               heartbeat_timeout_seconds=2 * dist.heartbeat_timeout_s + 10)
  except ValueError as e:
    if requested or "should be defined" not in str(e):
      raise ConfigError("distributed", f"{e} (set coordinator_address, num_processes "
                       "and process_id, or the JAX_* variables; see docs/distributed.md)") from e
    return False   # 'auto' and no cluster found, so a single process
  log.info("jax.distributed: process %d of %d, %d local / %d global devices",
           jax.process_index(), jax.process_count(), jax.local_device_count(),
           jax.device_count())
  _no_cached_cpu_collectives()
  Watchdog(dist.heartbeat_timeout_s).start()
  return True


def _no_cached_cpu_collectives():
  """Turns JAX's persistent compilation cache off for a multi-process run on CPU with jax 0.12
  or later: there its processes hang in their first collective when their steps come from the
  cache (jax 0.12.1; jax 0.10.2 runs them; docs/distributed.md)."""
  version = tuple(int(p) for p in jax.__version__.split(".")[:2] if p.isdigit())
  if (jax.process_count() > 1 and version >= (0, 12) and jax.default_backend() == "cpu"
      and jax.config.jax_enable_compilation_cache):
    jax.config.update("jax_enable_compilation_cache", False)
    log.warning("jax %s on CPU with %d processes: the persistent compilation cache is off, "
                "since processes whose steps come from it hang in their first collective",
                jax.__version__, jax.process_count())


class Watchdog(threading.Thread):
  """Ends this process with one `error:` line and exit 2 when another process of the run died.

  Without it the process would wait forever in a collective the dead one never joins. Every
  process bumps its own key in the coordination service's key-value store every timeout/4
  seconds and reads the others'. A key unchanged for `timeout_s`, or a coordinator that no
  longer answers, means the run cannot go on. A process that ends normally marks its key 'done'
  in `finished`, so the others do not wait for it.
  """

  PREFIX = "tst_jax/alive/"

  def __init__(self, timeout_s: float):
    super().__init__(name="tst_jax-watchdog", daemon=True)
    self.timeout_s = timeout_s
    self.client = distributed_state.global_state.client

  def run(self):
    me, beat, seen, failures = jax.process_index(), 0, {}, 0
    while threading.main_thread().is_alive():   # not while exiting, since others may then stop
      try:
        self.client.key_value_set(f"{self.PREFIX}{me}", str(beat), allow_overwrite=True)
        values = dict(self.client.key_value_dir_get(self.PREFIX))
        failures = 0
      except Exception as e:  # pylint: disable=broad-except
        failures += 1
        if failures * self.timeout_s / 4 >= self.timeout_s / 2:
          _stop(f"the coordinator (process 0) does not answer ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}): it died or hangs")
        time.sleep(self.timeout_s / 4)
        continue
      now, beat = time.monotonic(), beat + 1
      for key, value in values.items():
        other = int(key.rsplit("/", 1)[-1])
        if other == me or value == "done":
          continue
        if seen.get(other, (None,))[0] != value:
          seen[other] = (value, now)
        elif now - seen[other][1] > self.timeout_s:
          _stop(f"process {other} has not been heard from for {self.timeout_s} s "
                "(distributed.heartbeat_timeout_s): it died or hangs")
      time.sleep(self.timeout_s / 4)


def finished():
  """Tells the other processes' watchdogs that this one ends normally."""
  client = distributed_state.global_state.client
  if jax.process_count() > 1 and client is not None:
    client.key_value_set(f"{Watchdog.PREFIX}{jax.process_index()}", "done",
                         allow_overwrite=True)


def stop_if_peer_lost(e: BaseException):
  """Exits with one `error:` line when a collective failed because another process died.

  In a multi-process run, a runtime failure such as a closed Gloo or NCCL connection means a
  dead process. Exiting now, with code 2, beats JAX's exit-time shutdown waiting on the dead
  process and aborting. Otherwise returns.
  """
  if jax.process_count() > 1 and isinstance(e, jax.errors.JaxRuntimeError):
    _stop(f"a collective with the other processes failed ({type(e).__name__}: "
          f"{' '.join(str(e).split())[:200]}): another process died or hangs")


def _stop(why: str):
  sys.stderr.write(f"error: process {jax.process_index()} of {jax.process_count()}: {why}, "
                   "so this one stops: see the other processes' logs, then start every "
                   "process again to resume from the last checkpoint\n")
  sys.stderr.flush()
  os._exit(EXIT_STATUS)   # no Python cleanup, which would wait on the other process


def is_primary() -> bool:
  """Says whether this process writes the run's files: process 0 does."""
  return jax.process_index() == 0


def gather(values: np.ndarray) -> np.ndarray:
  """Returns every process's `values`, one row each: one all-gather (none with one process).
  Every process must call it at the same points."""
  values = np.asarray(values)
  if jax.process_count() == 1:
    return values[None]
  return np.asarray(multihost_utils.process_allgather(values)).reshape(
      jax.process_count(), *values.shape)


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any. Every process must call it at the same
  points."""
  return bool(np.max(gather(np.int32(flag))))


def barrier(name: str):
  """Blocks until every process reaches the barrier `name`, a no-op with one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def primary_first(name: str):
  """Runs the block on process 0 first, which builds caches such as the tokenizer, then the rest."""
  if not is_primary():
    barrier(name)
  yield
  if is_primary():
    barrier(name)
