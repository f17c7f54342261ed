"""Starting several processes (tst_jax/parallel/distributed.py): from the config and the
environment, one process when nothing is asked, and a clear error when asked too late (two real
processes: tests/behaviour/test_multiprocess.py)."""

import jax
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.parallel import distributed
from tst_jax.config import spec as spec_lib


def test_distributed_initialize_from_config_and_env(monkeypatch):
  cfg = tiny_config().distributed
  assert distributed.initialize(cfg) is False         # auto, nothing asked: one process
  assert distributed.is_primary()
  distributed.barrier("noop")                         # a no-op with one process
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  settings = distributed._settings(cfg)  # pylint: disable=protected-access
  assert (settings["num_processes"], settings["process_id"]) == (2, 1)
  with pytest.raises(RuntimeError, match="must start before any JAX computation"):
    distributed.initialize(cfg)                       # asked for, but JAX already runs here
  with pytest.raises(ValueError, match="config.distributed.mode: must be one of"):
    spec_lib.check(tiny_config(distributed=dict(mode="sometimes")))  # checked before it starts


@pytest.mark.parametrize("version, processes, off", [
    ("0.12.1", 2, True), ("0.10.2", 2, False), ("0.12.1", 1, False)])
def test_the_compilation_cache_is_off_for_cpu_processes_of_jax_0_12(version, processes, off,
                                                                   monkeypatch, caplog):
  """jax 0.12.1's CPU processes hang on steps from the persistent cache (docs/distributed.md):
  a multi-process CPU run of jax 0.12 or later turns it off and says so; others keep it."""
  monkeypatch.setattr(jax, "__version__", version)
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", True)
  try:
    distributed._no_cached_cpu_collectives()
    assert jax.config.jax_enable_compilation_cache is not off
    assert ("persistent compilation cache is off" in caplog.text) is off
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
