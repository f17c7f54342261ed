"""Checkpoints in a bucket Orbax cannot write, s3://, kept through a folder on this machine.

Orbax writes a step's arrays with TensorStore, which reaches gs:// but is handed a local
file path for any other URL. For an s3:// checkpoint folder, Orbax writes to a local mirror
instead, and each step it finishes is uploaded through fileio, the fsspec client of every
other file of the run: its files first, then the commit file, so that a step in the bucket is
complete exactly when that file is there, as Orbax marks one in gs://. The steps Orbax's
preservation policy deleted are deleted in the bucket too, their commit file first. A run that
starts again, or a tool that reads a run, first makes the mirror hold exactly the bucket's
complete steps.
"""

from __future__ import annotations

import hashlib
import os
import threading

import jax

from tst_jax import fileio
from tst_jax.errors import WorkdirError
from tst_jax.run import workdir as workdir_lib

MIRRORED = ("s3",)     # the stores whose checkpoints Orbax writes through a local mirror


def mirrored(directory: str) -> bool:
  """Says whether the checkpoint folder `directory` is written through a local mirror."""
  return fileio.protocol(directory) in MIRRORED


def readable(directory: str) -> str:
  """Returns the folder Orbax reads the checkpoints of `directory` from: itself, or for a
  mirrored store its local mirror, brought up to the bucket's complete steps."""
  if not mirrored(directory):
    return directory
  mirror = Mirror(directory)
  mirror.pull()
  return mirror.local


class Mirror:
  """The local folder Orbax writes the checkpoints of the bucket folder `remote` to."""

  def __init__(self, remote: str):
    if jax.process_count() > 1:
      raise WorkdirError(f"{remote}: a run of {jax.process_count()} processes cannot keep "
                         f"its checkpoints in {fileio.protocol(remote)}://, where each step "
                         "goes through one machine's disk; use a gs:// --workdir, or a folder "
                         "every host mounts")
    self.remote = remote
    key = hashlib.sha256(remote.encode()).hexdigest()[:16]
    self.local = fileio.user_cache("checkpoints", key)
    self._upload, self._failure = None, None

  def pull(self):
    """Makes the local folder hold exactly the complete steps of the bucket: downloads those it
    lacks, deletes any other, such as a step whose upload never finished."""
    complete = workdir_lib.complete_steps(self.remote, remote=True)
    os.makedirs(self.local, exist_ok=True)
    for name in os.listdir(self.local):
      if not (name.isdigit() and int(name) in complete):
        _remove(os.path.join(self.local, name))
    fs, at = fileio.filesystem(self.remote)
    for step in complete:
      if not os.path.isdir(os.path.join(self.local, str(step))):
        partial = os.path.join(self.local, f"{step}.download")
        fs.get(f"{at}/{step}/", partial + "/", recursive=True)
        os.replace(partial, os.path.join(self.local, str(step)))

  def upload_when_written(self, step: int, manager):
    """Uploads `step` from a thread once Orbax's `manager` has finished writing it, then
    deletes the bucket's steps the manager no longer keeps. `wait` joins it."""
    self.wait()

    def upload():
      try:
        manager.wait_until_finished()
        self.push(step, keep=set(manager.all_steps()))
      except Exception as e:   # pylint: disable=broad-except  raised again by `wait`
        self._failure = e
    self._upload = threading.Thread(target=upload, name="tst_jax-checkpoint-upload",
                                    daemon=True)
    self._upload.start()

  def wait(self):
    """Waits for the upload under way, raising its error."""
    if self._upload is not None:
      self._upload.join()
      self._upload = None
    failure, self._failure = self._failure, None
    if failure is not None:
      raise failure

  def push(self, step: int, keep: set[int]):
    """Uploads the finished local `step`, its commit file last, and deletes the bucket's
    complete steps outside `keep`."""
    folder, remote = os.path.join(self.local, str(step)), fileio.join(self.remote, str(step))
    fileio.rmtree(remote)     # what an upload cut short left there
    files = sorted(os.path.relpath(os.path.join(d, f), folder)
                   for d, _, names in os.walk(folder) for f in names)
    files = [f for f in files if f != workdir_lib.ORBAX_COMMIT]
    fs, at = fileio.filesystem(remote)
    fs.put([os.path.join(folder, f) for f in files], [f"{at}/{f}" for f in files])
    fileio.write_text(fileio.join(remote, workdir_lib.ORBAX_COMMIT),
                      f"Checkpoint of step {step}: every file was uploaded before this one.")
    for old in workdir_lib.complete_steps(self.remote, remote=True):
      if old not in keep:
        fileio.remove(fileio.join(self.remote, str(old), workdir_lib.ORBAX_COMMIT))
        fileio.rmtree(fileio.join(self.remote, str(old)))


def _remove(path: str):
  if os.path.isdir(path):
    fileio.rmtree(path)
  else:
    fileio.remove(path)
