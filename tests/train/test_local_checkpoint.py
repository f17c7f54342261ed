"""Emergency checkpoints (train.local_checkpoint_every) of one process here: each shard of a
sharded train state written and read back bit for bit, the steps kept, what a killed write
leaves ignored, a copy of another run, another mesh or a workdir made again never restored,
the run's checkpoints resuming from the newest of both kinds, and a write that fails. Two
processes, SIGKILLed and placed anew: behaviour/test_emergency_checkpoints.py."""

import errno
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.fixtures.tiny import tiny_config
from tst_jax.config import spec as spec_lib
from tst_jax import fileio
from tst_jax.errors import ConfigError
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
  restored, step = local.restore_newest(None, 4, _abstract(state))
  assert step == 4
  for key, leaf in state.items():
    assert restored[key].dtype == leaf.dtype and restored[key].sharding == leaf.sharding
    np.testing.assert_array_equal(np.asarray(restored[key]).reshape(-1).view(np.uint8),
                                  np.asarray(leaf).reshape(-1).view(np.uint8))
  # the file holds each distinct shard once: w's 8 blocks of 8 floats, h once, step once
  assert os.path.getsize(os.path.join(local.directory, "4", local_lib.SHARDS)) == 64 * 4 + 16 * 2 + 4


def test_the_newest_steps_are_kept_and_a_killed_write_or_delete_is_no_step(tmp_path):
  state, local = _state(), _local(tmp_path)
  for step in (2, 4, 6, 8):
    local.save(step, state)
  local.wait()
  assert local.steps() == [8, 6, 4]                     # local_lib.KEEP of them
  for cut in ("10.partial", "4.deleting"):              # a write, a delete killed midway
    os.makedirs(os.path.join(local.directory, cut), exist_ok=True)
  assert local.steps() == [8, 6, 4] and sorted(local.held()) == [4, 6, 8]
  # a run resumed from an older checkpoint: its copies replace the newer ones at once
  local.save(5, state)
  local.wait()
  assert sorted(os.listdir(local.directory)) == ["4", "5"]


def test_a_copy_of_another_run_or_another_mesh_is_not_restored(tmp_path, caplog):
  state = _state()
  writer = _local(tmp_path, run="run-a")
  writer.save(2, state)
  writer.wait()
  assert _local(tmp_path, run="run-b").restore_newest(None, 2, _abstract(state)) is None
  assert "written by another run" in caplog.text
  other_mesh = _abstract(_state((2, 4)))
  assert _local(tmp_path).restore_newest(None, 2, other_mesh) is None
  assert _local(tmp_path).restore_newest(2, 2, _abstract(state)) is None    # not newer
  assert _local(tmp_path).restore_newest(None, 1, _abstract(state)) is None  # not reached
  assert _local(tmp_path).restore_newest(None, 2, _abstract(state))[1] == 2


def test_the_step_restored_is_the_newest_every_process_offers(monkeypatch):
  """Two processes' newest steps: the newest both hold, whichever each holds more; none
  where one host's disk is empty (a new machine)."""
  other = {"steps": [3, 2]}

  def gather(x):
    theirs = np.full_like(np.asarray(x), -1)
    theirs[:len(other["steps"])] = other["steps"]
    return np.stack([np.asarray(x), theirs])
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", gather)
  assert local_lib._common([4, 3, 2]) == [3, 2]
  other["steps"] = []
  assert local_lib._common([4, 3, 2]) == []


def _setup(tmp_path, **train):
  config = tiny_config(train=dict(local_checkpoint_dir=str(tmp_path / "local"), **train))
  return Setup.create(spec_lib.build(config), RunDir(tmp_path / "run"))


def _reached(setup, step: int):
  """Writes the goodput.jsonl line a run writes before each checkpoint of `step`."""
  fileio.write_text(setup.rundir.goodput, json.dumps(dict(
      session=1.0, kind="step", time=2.0, step=step, seconds={})) + "\n")


def test_a_run_resumes_from_the_newest_of_both_kinds(tmp_path, capsys):
  """Persistent checkpoints every 4 steps, emergency ones every 1: killed after step 6, the run
  resumes from the emergency copy of step 6; once step 8 is persistent, from that. Its eval
  reads the workdir's checkpoints alone."""
  setup = _setup(tmp_path, checkpoint_every=4, local_checkpoint_every=1)
  state, _ = setup.restore_or_init()
  states = {}
  checkpoints = setup.open_checkpoints()
  for step in range(1, 7):
    states[step] = jax.tree.map(lambda x, s=step: x + s, state)
    checkpoints.save_step(states[step], step)
  checkpoints.close()
  assert checkpoints.all_steps() == [4] and checkpoints.local.steps() == [6, 5, 3]
  _reached(setup, 6)

  restored, step = setup.restore_or_init()
  assert step == 6 and "restored the emergency checkpoint of step 6" in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(states[6])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert setup.restore_or_init(emergency=False)[1] == 4

  checkpoints = setup.open_checkpoints()
  for step in (7, 8):
    checkpoints.save_step(states[6], step)
  checkpoints.close()
  assert setup.restore_or_init()[1] == 8 and checkpoints.all_steps() == [4, 8]
  assert "emergency" not in capsys.readouterr().out
  checkpoints.wait_last()
  assert not os.path.exists(checkpoints.local.root)


def test_a_workdir_made_again_does_not_resume_from_its_predecessors_copies(tmp_path):
  """The same config in a workdir deleted and made again: the copies of the first run, of
  the same workdir path, are past what the new workdir records."""
  setup = _setup(tmp_path, checkpoint_every=100, local_checkpoint_every=1)
  state, _ = setup.restore_or_init()
  checkpoints = setup.open_checkpoints()
  checkpoints.save_step(state, 3)
  checkpoints.close()
  _reached(setup, 3)
  assert setup.restore_or_init()[1] == 3
  fileio.rmtree(setup.rundir.root)
  again = _setup(tmp_path, checkpoint_every=100, local_checkpoint_every=1)
  assert again.restore_or_init()[1] == 0


def test_emergency_checkpoints_are_off_by_default(tmp_path):
  setup = _setup(tmp_path)
  assert setup.spec.train.local_checkpoint_every == 0
  assert setup.open_checkpoints().local is None
  assert not os.path.exists(tmp_path / "local")


def test_a_folder_it_cannot_make_is_one_line_and_a_write_that_fails_a_warning(
    tmp_path, monkeypatch, caplog):
  """A file where train.local_checkpoint_dir goes is a ConfigError before the first step; a
  write that fails later (a full disk) is said once, and the run and its next copies go on."""
  (tmp_path / "local").write_text("a file where the folder goes")
  with pytest.raises(ConfigError, match="train.local_checkpoint_dir: cannot make"):
    _setup(tmp_path, local_checkpoint_every=1).open_checkpoints()
  (tmp_path / "local").unlink()
  setup = _setup(tmp_path, checkpoint_every=100, local_checkpoint_every=1)
  state, _ = setup.restore_or_init()
  checkpoints = setup.open_checkpoints()

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")
  with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="tst_jax"):
    m.setattr(local_lib.os, "fsync", full)
    for step in (1, 2):
      checkpoints.save_step(state, step)
    checkpoints.local.wait()
  assert caplog.text.count("emergency checkpoint of step") == 1
  assert "No space left on device" in caplog.text and checkpoints.local.steps() == []
  checkpoints.save_step(state, 3)
  checkpoints.close()
  assert checkpoints.local.steps() == [3]
