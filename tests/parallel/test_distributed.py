"""Starting several processes (tst_jax/parallel/distributed.py): from the config and the
environment, one process when nothing is asked, and a clear error when asked too late (two real
processes: tests/behaviour/test_multiprocess.py)."""

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
