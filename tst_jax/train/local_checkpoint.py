"""Emergency checkpoints: each process's own shards of the train state, written often to a disk
of its host, beside the persistent checkpoints in the workdir.

A host that dies without a signal loses every step since the last persistent checkpoint, which
for a large model is written rarely. Every train.local_checkpoint_every steps each process
copies the shards it holds to host memory and writes them from a thread to
<train.local_checkpoint_dir>/<run>/process_<i>_of_<n>/<step>/: one file of the shards' bytes
and a JSON of where each lies, in a folder written under a temporary name and renamed once
complete. A restart resumes from the newest step every process holds complete, where it is
newer than the newest persistent checkpoint. A process whose copy is gone (a new host), or
does not fit the run's shardings (another mesh), makes every process fall back to the
persistent one.

Not Orbax's emergency.CheckpointManager: docs/reliability.md says what it does and why it does
not fit these checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from tst_jax import fileio
from tst_jax.parallel import distributed

log = logging.getLogger("tst_jax")
KEEP = 2           # the newest complete step stays while the next one is written
SHARDS, INDEX = "shards.bin", "index.json"


def default_folder() -> str:
  """Returns the folder train.local_checkpoint_dir '' means: in this user's cache."""
  return fileio.user_cache("local_checkpoints")


class LocalCheckpoints:
  """This process's emergency checkpoints of the run in `workdir`, kept in `folder` on its host.

  `run_key` says which run wrote a step: a step of another run of the same workdir (a
  different config or token store) is never restored.
  """

  def __init__(self, folder: str, workdir: str, run_key: str, every: int):
    key = hashlib.sha256(fileio.absolute(workdir).encode()).hexdigest()[:16]
    self.directory = os.path.join(os.path.abspath(os.path.expanduser(folder or default_folder())),
                                  key, f"process_{jax.process_index()}_of_{jax.process_count()}")
    self.run_key, self.every = run_key, every
    self._writer, self._failure = None, None

  def due(self, step: int) -> bool:
    return bool(self.every) and step % self.every == 0

  def steps(self) -> list[int]:
    """Returns this process's complete steps, newest first."""
    if not os.path.isdir(self.directory):
      return []
    return sorted((int(n) for n in os.listdir(self.directory) if n.isdigit()), reverse=True)

  def save(self, step: int, state):
    """Copies this process's shards of `state` to host memory and writes them from a thread;
    the previous write is waited for first."""
    self.wait()
    leaves = _leaves(state)
    host = [(path, [(_index(s.index, leaf.shape), np.asarray(s.data))
                    for s in _unique_shards(leaf)],
             str(leaf.dtype)) for path, leaf in leaves]
    self._writer = threading.Thread(target=self._write, args=(step, host), daemon=True,
                                    name="tst_jax-local-checkpoint")
    self._writer.start()

  def _write(self, step: int, host: list):
    try:
      os.makedirs(self.directory, exist_ok=True)
      final = os.path.join(self.directory, str(step))
      partial = f"{final}.partial"
      shutil.rmtree(partial, ignore_errors=True)     # what a killed write left
      os.makedirs(partial)
      index, offset = [], 0
      with open(os.path.join(partial, SHARDS), "wb") as f:
        for path, shards, dtype in host:
          for where, data in shards:
            f.write(data.tobytes())
            index.append(dict(leaf=path, index=where, shape=list(data.shape), dtype=dtype,
                              offset=offset))
            offset += data.nbytes
        f.flush()
        os.fsync(f.fileno())
      with open(os.path.join(partial, INDEX), "w") as f:
        json.dump(dict(step=step, run=self.run_key, shards=index), f)
        f.flush()
        os.fsync(f.fileno())
      shutil.rmtree(final, ignore_errors=True)
      os.rename(partial, final)
      for old in self.steps()[KEEP:]:
        shutil.rmtree(os.path.join(self.directory, str(old)), ignore_errors=True)
    except Exception as e:  # pylint: disable=broad-except  raised again by `wait`
      self._failure = e

  def wait(self):
    """Waits for the write under way, raising its error."""
    if self._writer is not None:
      self._writer.join()
      self._writer = None
    failure, self._failure = self._failure, None
    if failure is not None:
      raise OSError(None, f"the emergency checkpoint's write: {type(failure).__name__}: "
                    f"{failure}", self.directory) from failure

  def clear(self):
    """Deletes this process's copies, once the run's last checkpoint is persistent."""
    self.wait()
    shutil.rmtree(self.directory, ignore_errors=True)

  def newest_on_every_process(self) -> int | None:
    """Returns the newest step every process holds complete, the same on each; None if none.
    Every process must call it."""
    mine = self.steps()[:KEEP + 1]
    if jax.process_count() == 1:
      return mine[0] if mine else None
    padded = np.full(KEEP + 1, -1, np.int64)
    padded[:len(mine)] = mine
    everyone = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, KEEP + 1)
    common = set.intersection(*(set(int(s) for s in row if s >= 0) for row in everyone))
    return max(common) if common else None

  def restore(self, step: int, abstract_state):
    """Returns the state of `step` with `abstract_state`'s shapes, dtypes and shardings, or None
    on every process when any process's copy does not hold its shards. Every process must
    call it."""
    try:
      state, why = self._read(step, abstract_state), None
    except (OSError, ValueError, KeyError) as e:
      state, why = None, f"{type(e).__name__}: {e}"
    if distributed.any_process(state is None):
      if why is not None:
        log.warning("emergency checkpoint %d in %s does not restore (%s)", step,
                    self.directory, why)
      return None
    return state

  def _read(self, step: int, abstract_state):
    folder = os.path.join(self.directory, str(step))
    with open(os.path.join(folder, INDEX)) as f:
      saved = json.load(f)
    if saved["run"] != self.run_key:
      raise ValueError("written by another run of this workdir")
    by_leaf = {}
    for entry in saved["shards"]:
      by_leaf.setdefault(entry["leaf"], {})[tuple(map(tuple, entry["index"]))] = entry
    data = np.memmap(os.path.join(folder, SHARDS), np.uint8, mode="r")
    arrays = []
    for path, leaf in _leaves(abstract_state):
      pieces = []
      for device, where in leaf.sharding.addressable_devices_indices_map(leaf.shape).items():
        entry = by_leaf[path][_index(where, leaf.shape)]
        if entry["dtype"] != str(leaf.dtype):
          raise ValueError(f"{path} is {entry['dtype']} there, {leaf.dtype} here")
        dtype = np.dtype(leaf.dtype)
        size = int(np.prod(entry["shape"])) * dtype.itemsize
        raw = data[entry["offset"]:entry["offset"] + size]
        pieces.append(jax.device_put(raw.view(dtype).reshape(entry["shape"]), device))
      arrays.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree.unflatten(jax.tree.structure(abstract_state), arrays)


def _leaves(tree) -> list[tuple[str, object]]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def _unique_shards(array: jax.Array) -> list:
  """Returns one of this process's shards of `array` per distinct index: replicas once."""
  seen = {}
  for shard in array.addressable_shards:
    seen.setdefault(_index(shard.index, array.shape), shard)
  return list(seen.values())


def _index(where: tuple, shape: tuple) -> tuple:
  """Returns a shard's index into an array of `shape`, a tuple of slices whose None means the
  axis's end, as ((start, stop), ...)."""
  return tuple((s.start or 0, n if s.stop is None else s.stop) for s, n in zip(where, shape))
