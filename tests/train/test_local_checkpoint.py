"""Emergency checkpoints (train.local_checkpoint_every) of one process here: each shard of a
sharded train state written and read back bit for bit, what a killed write leaves ignored, a
copy of another run or another mesh never restored, and the run's checkpoints resuming from
the newest of both kinds. Two processes, SIGKILLed: behaviour/test_emergency_checkpoints.py."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.fixtures.tiny import tiny_config
from tst_jax.config import spec as spec_lib
from tst_jax.errors import StoreError
from tst_jax.rundir import RunDir
from tst_jax.train import local_checkpoint as local_lib
from tst_jax.train.setup import Setup


def _state(mesh_shape=(4, 2)):
  """A state of float32, bfloat16 and int32 leaves, sharded, replicated and scalar."""
  mesh = jax.make_mesh(mesh_shape, ("a", "b"))
  values = dict(w=np.arange(64, dtype=np.float32).reshape(8, 8) / 7,
                h=(np.arange(16, dtype=np.float32) - 3.3).astype(jnp.bfloat16),
                step=np.int32(5))
  specs = dict(w=P("a", "b"), h=P(None), step=P())
  return {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in values.items()}


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def _local(tmp_path, run="run-a", every=2):
  return local_lib.LocalCheckpoints(str(tmp_path / "local"), str(tmp_path / "workdir"), run,
                                    every)


def test_each_shard_is_written_and_read_back_bit_for_bit_on_its_devices(tmp_path):
  state, local = _state(), _local(tmp_path)
  local.save(4, state)
  local.wait()
  restored = local.restore(4, _abstract(state))
  for key, leaf in state.items():
    assert restored[key].dtype == leaf.dtype and restored[key].sharding == leaf.sharding
    np.testing.assert_array_equal(np.asarray(restored[key]).reshape(-1).view(np.uint8),
                                  np.asarray(leaf).reshape(-1).view(np.uint8))
  # the file holds each distinct shard once: w's 8 blocks of 8 floats, h once, step once
  assert os.path.getsize(os.path.join(local.directory, "4", local_lib.SHARDS)) == 64 * 4 + 16 * 2 + 4


def test_the_newest_steps_are_kept_and_a_killed_write_is_no_step(tmp_path):
  state, local = _state(), _local(tmp_path)
  for step in (2, 4, 6):
    local.save(step, state)
  local.wait()
  assert local.steps() == [6, 4]                       # local_lib.KEEP of them
  os.makedirs(os.path.join(local.directory, "8.partial"))   # a write killed before its rename
  assert local.steps() == [6, 4] and local.newest_on_every_process() == 6
  local.save(8, state)
  local.wait()
  assert sorted(os.listdir(local.directory)) == ["6", "8"]


def test_a_copy_of_another_run_or_another_mesh_is_not_restored(tmp_path, caplog):
  state = _state()
  writer = _local(tmp_path, run="run-a")
  writer.save(2, state)
  writer.wait()
  assert _local(tmp_path, run="run-b").restore(2, _abstract(state)) is None
  assert "written by another run" in caplog.text
  assert _local(tmp_path).restore(2, _abstract(_state((2, 4)))) is None   # other shards
  assert _local(tmp_path).restore(2, _abstract(state)) is not None


def test_every_process_must_hold_the_step(tmp_path, monkeypatch):
  """Two processes' newest steps: the newest both hold complete, whichever each holds more."""
  state, local = _state(), _local(tmp_path, every=1)
  for step in (3, 4):
    local.save(step, state)
  local.wait()
  other = {"steps": [3, 2, -1]}
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda x: np.stack([x, np.asarray(other["steps"])]))
  assert local.newest_on_every_process() == 3
  other["steps"] = [-1, -1, -1]                          # a new host: its disk is empty
  assert local.newest_on_every_process() is None


def _setup(tmp_path, **train):
  config = tiny_config(train=dict(local_checkpoint_dir=str(tmp_path / "local"), **train))
  return Setup.create(spec_lib.build(config), RunDir(tmp_path / "run"))


def test_a_run_resumes_from_the_newest_of_both_kinds(tmp_path, capsys):
  """Persistent checkpoints every 4 steps, emergency ones every 1: killed after step 6, the run
  resumes from the emergency copy of step 6; once step 8 is persistent, from that."""
  setup = _setup(tmp_path, checkpoint_every=4, local_checkpoint_every=1)
  state, _ = setup.restore_or_init()
  states = {}
  checkpoints = setup.open_checkpoints()
  for step in range(1, 7):
    states[step] = jax.tree.map(lambda x, s=step: x + s, state)
    checkpoints.save_step(states[step], step)
  checkpoints.close()
  assert checkpoints.all_steps() == [4] and checkpoints.local.steps() == [6, 5]

  restored, step = setup.restore_or_init()
  assert step == 6 and "restored the emergency checkpoint of step 6" in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(states[6])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  checkpoints = setup.open_checkpoints()
  for step in (7, 8):
    checkpoints.save_step(states[6], step)
  checkpoints.close()
  assert setup.restore_or_init()[1] == 8 and checkpoints.all_steps() == [4, 8]
  assert "emergency" not in capsys.readouterr().out


def test_emergency_checkpoints_are_off_by_default(tmp_path):
  setup = _setup(tmp_path)
  assert setup.spec.train.local_checkpoint_every == 0
  assert setup.open_checkpoints().local is None
  assert not os.path.exists(tmp_path / "local")


def test_a_write_that_fails_stops_the_run_in_one_line_naming_the_folder(tmp_path):
  setup = _setup(tmp_path, checkpoint_every=100, local_checkpoint_every=1)
  (tmp_path / "local").write_text("a file where the folder goes")
  state, _ = setup.restore_or_init()
  checkpoints = setup.open_checkpoints()
  checkpoints.save_step(state, 1)
  with pytest.raises(StoreError) as e:
    checkpoints.save_step(state, 2)      # the next save waits for the write that failed
  assert str(tmp_path / "local") in str(e.value) and "emergency checkpoint" in str(e.value)
  assert "\n" not in str(e.value)
