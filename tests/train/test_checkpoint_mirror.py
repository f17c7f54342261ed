"""Checkpoints in s3:// through a local mirror (train/checkpoint_mirror.py), against moto's S3
server: a step is complete in the bucket only once its commit file, uploaded last, is there;
an upload cut short leaves no complete step and a restart forgets it; the steps Orbax stops
keeping go from the bucket, their commit file first; a fresh machine restores the bucket's
steps; and a run of several processes is refused in one line."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tst_jax import errors, fileio
from tst_jax.errors import WorkdirError
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import checkpoint as ckpt_lib, checkpoint_mirror


def _state(step: int) -> dict:
  return {"w": jnp.arange(4.0) * step, "b": jnp.full((2, 3), float(step))}


def _complete(folder: str) -> list[int]:
  return workdir_lib.complete_steps(folder, remote=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """A machine's cache of its own: the mirror of a checkpoint folder lives there."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return tmp_path / "cache"


def test_steps_go_to_the_bucket_and_a_fresh_machine_restores_them(s3_bucket, cache, tmp_path,
                                                                   monkeypatch):
  folder = fileio.join(s3_bucket, "run", "checkpoints")
  checkpoints = ckpt_lib.Checkpoints(folder, keep=2)
  for step in (1, 2, 3):
    assert checkpoints.save(step, _state(step), dict(step=step), force=True)
  checkpoints.close()
  # Orbax keeps the latest 2: step 1 is gone from the bucket too, commit file and all.
  assert _complete(folder) == [2, 3] and fileio.listdir(folder) == ["2", "3"]
  for step in (2, 3):
    names = fileio.listdir(fileio.join(folder, str(step)))
    assert {"state", "meta", workdir_lib.ORBAX_COMMIT} <= set(names), names

  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another_machine"))
  again = ckpt_lib.Checkpoints(folder, keep=2)
  assert again.all_steps() == [2, 3] and again.latest_step() == 3
  state, meta = again.restore(3, jax.tree.map(jnp.zeros_like, _state(0)))
  again.close()
  assert meta == dict(step=3)
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(_state(3))):
    np.testing.assert_array_equal(got, want)


def test_an_upload_cut_short_leaves_no_complete_step_and_a_restart_forgets_it(
    s3_bucket, cache, monkeypatch):
  """The upload of step 2 stops after its first files, as a killed run's would: step 2 is
  not complete in the bucket, the next start restores step 1 and drops the local step 2, and
  a later save of step 2 replaces the half-uploaded files."""
  folder = fileio.join(s3_bucket, "checkpoints")
  checkpoints = ckpt_lib.Checkpoints(folder, keep=5)
  checkpoints.save(1, _state(1), dict(step=1), force=True)
  checkpoints.wait()
  fs, _ = fileio.filesystem(folder)
  real_put = fs.put    # the filesystem fileio gets for the folder: fsspec keeps one

  def put_half(local, remote, *args, **kw):
    real_put(local[:2], remote[:2], *args, **kw)
    raise ConnectionResetError(104, "the connection was reset")
  monkeypatch.setattr(fs, "put", put_half)
  checkpoints.save(2, _state(2), dict(step=2), force=True)
  with pytest.raises(errors.StoreError, match=r"a checkpoint write failed .*step 1 in "
                     f"{folder} is the last complete checkpoint"):
    checkpoints.wait()
  checkpoints.close()
  monkeypatch.undo()
  monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
  assert fileio.exists(fileio.join(folder, "2")) and _complete(folder) == [1]
  assert sorted(os.listdir(checkpoint_mirror.Mirror(folder).local)) == ["1", "2"]

  restarted = ckpt_lib.Checkpoints(folder, keep=5)
  assert restarted.all_steps() == [1]
  assert sorted(os.listdir(restarted.mirror.local)) == ["1"]
  restarted.save(2, _state(20), dict(step=2), force=True)
  restarted.close()
  assert _complete(folder) == [1, 2]
  state, _ = ckpt_lib.Checkpoints(folder, keep=5).restore(
      2, jax.tree.map(jnp.zeros_like, _state(0)))
  np.testing.assert_array_equal(state["w"], _state(20)["w"])


def test_the_commit_file_goes_up_last_and_comes_down_first(s3_bucket, cache, monkeypatch):
  """The order of the writes and deletes in the bucket: a reader between any two of them
  sees a step complete only when all its files are there."""
  folder = fileio.join(s3_bucket, "checkpoints")
  steps = ckpt_lib.Checkpoints(folder, keep=1)
  steps.save(1, _state(1), dict(step=1), force=True)
  steps.wait()
  seen = []
  real_write, real_remove = fileio.write_text, fileio.remove
  fs, _ = fileio.filesystem(folder)
  real_put = fs.put

  def put(local, remote, *args, **kw):
    seen.append(("put", len(remote), _complete(folder)))
    return real_put(local, remote, *args, **kw)

  def write_text(path, text):
    seen.append(("commit", fileio.basename(fileio.dirname(path)), _complete(folder)))
    return real_write(path, text)

  def remove(path):
    seen.append(("uncommit", fileio.basename(fileio.dirname(path)), _complete(folder)))
    return real_remove(path)
  monkeypatch.setattr(fs, "put", put)
  monkeypatch.setattr(fileio, "write_text", write_text)
  monkeypatch.setattr(fileio, "remove", remove)
  steps.save(2, _state(2), dict(step=2), force=True)
  steps.close()
  assert [s[0] for s in seen] == ["put", "commit", "uncommit"], seen
  assert seen[0][1] > 5 and seen[0][2] == [1]            # step 2's files, before it counts
  assert seen[1][1:] == ("2", [1]) and seen[2][1:] == ("1", [1, 2])
  assert _complete(folder) == [2] and fileio.listdir(folder) == ["2"]


def test_a_run_of_several_processes_is_refused_in_one_line(monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(WorkdirError) as e:
    checkpoint_mirror.Mirror("s3://bucket/run/checkpoints")
  assert errors.one_line(e.value) == (
      "error: s3://bucket/run/checkpoints: a run of 2 processes cannot keep its checkpoints "
      "in s3://, where each step goes through one machine's disk; use a gs:// --workdir, or a "
      "folder every host mounts")
