"""Emergency checkpoints: each process's own shards of the train state, written often to a disk
of its host, beside the persistent checkpoints in the workdir.

A host that dies without a signal loses every step since the last persistent checkpoint, which
for a large model is written rarely. Every train.local_checkpoint_every steps each process
copies the shards it holds to host memory and writes them from a thread to
<train.local_checkpoint_dir>/<the workdir's key>/process_<i>_of_<n>/<step>/: one file of the
shards' bytes and a JSON of where each lies, in a folder written under a temporary name and
renamed once complete. A restart resumes from the newest step that every process finds on its
host, where it is newer than the newest persistent checkpoint; a process restarted on the host
of another (pods placed anew) reads that one's copy, and the shards move to their devices. A
host whose copy is gone (a new machine) makes every process fall back to the persistent one.

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
from jax.sharding import Mesh, NamedSharding

from tst_jax import fileio
from tst_jax.errors import ConfigError
from tst_jax.parallel import distributed

log = logging.getLogger("tst_jax")
# A process finishes its copy of step k only after every other process finished k - 2 (each
# waits for its previous write at its next save, and the steps between are collectives), so
# the newest three of each process always hold a step common to all.
KEEP = 3
SHARDS, INDEX = "shards.bin", "index.json"
_GATHERED = 8       # the newest steps each process offers when they agree on one


def default_folder() -> str:
  """Returns the folder train.local_checkpoint_dir '' means: in this user's cache."""
  return fileio.user_cache("local_checkpoints")


class LocalCheckpoints:
  """This process's emergency checkpoints of the run in `workdir`, kept in `folder` on its host,
  which it makes: one it cannot is a ConfigError.

  `run_key` says which run wrote a step: a step of another run of the same workdir (a
  different config or token store) is never restored.
  """

  def __init__(self, folder: str, workdir: str, run_key: str, every: int):
    key = hashlib.sha256(fileio.absolute(workdir).encode()).hexdigest()[:16]
    self.root = os.path.join(os.path.abspath(os.path.expanduser(folder or default_folder())), key)
    self.own = f"process_{jax.process_index()}_of_{jax.process_count()}"
    self.directory = os.path.join(self.root, self.own)
    self.run_key, self.every = run_key, every
    self._writer, self._failure, self._said = None, None, set()
    try:
      os.makedirs(self.directory, exist_ok=True)
    except OSError as e:
      raise ConfigError("train.local_checkpoint_dir", f"cannot make {self.directory} on this "
                        f"host ({e.strerror or e})") from None

  def due(self, step: int) -> bool:
    """Says whether a copy is due after `step`."""
    return bool(self.every) and step % self.every == 0

  def steps(self, folder: str | None = None) -> list[int]:
    """Returns the complete steps in `folder`, this process's by default, newest first; none
    where it cannot be listed."""
    try:
      names = os.listdir(folder or self.directory)
    except OSError:
      return []
    return sorted((int(n) for n in names if n.isascii() and n.isdigit()), reverse=True)

  def held(self) -> dict[int, str]:
    """Returns each step a copy on this host holds, with the folder of the first such copy:
    this process's, then those of the run's other processes that ran on this host."""
    try:
      others = sorted(n for n in os.listdir(self.root) if n != self.own
                      and n.startswith("process_") and not n.endswith((".partial", ".deleting"))
                      and n.rpartition("_of_")[2] == str(jax.process_count()))
    except OSError:
      others = []
    found = {}
    for name in [self.own, *others]:
      for step in self.steps(os.path.join(self.root, name)):
        found.setdefault(step, os.path.join(self.root, name))
    return found

  def save(self, step: int, state):
    """Copies this process's shards of `state` to host memory and writes them from a thread;
    the previous write is waited for first."""
    self.wait()
    shards = [(path, _unique_shards(leaf)) for path, leaf in _leaves(state)]
    for _, pieces in shards:           # every transfer under way before the first is read
      for _, shard in pieces:
        shard.data.copy_to_host_async()
    host = [(path, [(where, np.asarray(shard.data)) for where, shard in pieces])
            for path, pieces in shards]
    self._writer = threading.Thread(target=self._write, args=(step, host), daemon=True,
                                    name="tst_jax-local-checkpoint")
    self._writer.start()

  def _write(self, step: int, host: list):
    """Writes `host`'s shards as step `step`, renamed into place once complete, then deletes
    every step but it and the KEEP - 1 newest before it, and what killed writes left."""
    try:
      os.makedirs(self.directory, exist_ok=True)   # also where it was deleted under the run
      final = os.path.join(self.directory, str(step))
      partial = f"{final}.partial"
      _write_folder(partial, host, dict(step=step, run=self.run_key))
      if os.path.exists(final):
        _remove(final)
      os.rename(partial, final)
      _fsync_folder(self.directory)
      steps = self.steps()
      for old in set(steps) - {step, *[s for s in steps if s < step][:KEEP - 1]}:
        _remove(os.path.join(self.directory, str(old)))
      for name in os.listdir(self.directory):        # what killed writes and deletes left
        if name.endswith((".partial", ".deleting")):
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    except Exception as e:  # pylint: disable=broad-except  said by `wait`
      self._failure = (step, e)

  def wait(self):
    """Waits for the write under way. One that failed is a warning, once for each kind of
    failure: the run goes on, its persistent checkpoints unharmed, and a restart falls back
    to them until a copy is complete on every host."""
    if self._writer is not None:
      self._writer.join()
      self._writer = None
    failure, self._failure = self._failure, None
    if failure is not None and type(failure[1]) not in self._said:
      self._said.add(type(failure[1]))
      log.warning("emergency checkpoint of step %d not written to %s (%s: %s); the run goes "
                  "on, and a restart resumes from the workdir's checkpoints until a copy is "
                  "written", failure[0], self.directory, type(failure[1]).__name__,
                  failure[1])

  def clear(self):
    """Deletes the run's copies on this host, its other processes' too (those of a process
    that ran here before a restart placed it elsewhere), once the run's last checkpoint is
    persistent. Every process must call it."""
    self.wait()
    distributed.barrier("tst_jax-local-checkpoints-written")   # no write under way anywhere
    try:
      _remove(self.root)
    except OSError:        # another process of this host deleted it first
      pass

  def restore_newest(self, newer_than: int | None, reached: int, abstract_state):
    """Returns (state, step) of the newest step past `newer_than`, and no later than
    `reached`, that every process finds a copy of on its host and restores; None on every
    process where none does. Every process must call it."""
    held = self.held()
    offered = [s for s in held if s <= reached and (newer_than is None or s > newer_than)]
    for step in _common(sorted(offered, reverse=True)[:_GATHERED]):
      state = self._restore(step, held[step], abstract_state)
      if state is not None:
        return state, step
    return None

  def _restore(self, step: int, folder: str, abstract_state):
    """Returns the state of `step` in the process folder `folder` with `abstract_state`'s
    shapes, dtypes and shardings, or None on every process where any cannot read its part.
    The shards move between processes only once every process has read its own."""
    try:
      index = _read_index(os.path.join(folder, str(step)), self.run_key)
      origin, why = int(os.path.basename(folder).split("_")[1]), None   # who wrote it
    except (OSError, ValueError, KeyError) as e:
      index, origin, why = None, -1, f"{type(e).__name__}: {e}"
    origins = [int(o) for o in distributed.gather(np.array([origin])).reshape(-1)]
    arrays, moved = None, None
    if index is not None:
      try:
        if sorted(origins) != list(range(jax.process_count())):
          raise ValueError(f"the hosts hold the copies of processes {origins}, not one each")
        moved = _devices_holding(origins)
        arrays = _load(os.path.join(folder, str(step)), index, abstract_state, moved)
      except Exception as e:  # pylint: disable=broad-except  every process must agree below
        why = f"{type(e).__name__}: {e}"
    if distributed.any_process(arrays is None):
      if why is not None:
        log.warning("emergency checkpoint %d in %s does not restore (%s)", step, folder, why)
      return None
    if moved is not None:     # across processes: JAX sends each shard where it belongs
      for i, (_, leaf) in enumerate(_leaves(abstract_state)):
        arrays[i] = jax.device_put(arrays[i], leaf.sharding)   # one leaf twice at a time
    return jax.tree.unflatten(jax.tree.structure(abstract_state), arrays)


def _write_folder(folder: str, host: list, header: dict):
  """Writes the new folder `folder`: `host`'s shards, one after another in SHARDS, and INDEX,
  `header` with where each shard lies; both files and the folder synced to the disk."""
  shutil.rmtree(folder, ignore_errors=True)     # what a killed write left
  os.makedirs(folder)
  index, offset = [], 0
  with open(os.path.join(folder, SHARDS), "wb") as f:
    for path, pieces in host:
      for where, data in pieces:
        f.write(data.reshape(-1).view(np.uint8))
        index.append(dict(leaf=path, index=where, shape=list(data.shape), dtype=str(data.dtype),
                          offset=offset))
        offset += data.nbytes
    f.flush()
    os.fsync(f.fileno())
  with open(os.path.join(folder, INDEX), "w") as f:
    json.dump(dict(header, shards=index), f)
    f.flush()
    os.fsync(f.fileno())
  _fsync_folder(folder)


def _read_index(step_folder: str, run_key: str) -> dict:
  """Returns the index of the copy in `step_folder`: each leaf's shards by their index."""
  with open(os.path.join(step_folder, INDEX)) as f:
    saved = json.load(f)
  if saved["run"] != run_key:
    raise ValueError("written by another run of this workdir")
  index = {}
  for entry in saved["shards"]:
    index.setdefault(entry["leaf"], {})[tuple(map(tuple, entry["index"]))] = entry
  return index


def _load(step_folder: str, index: dict, abstract_state, moved: dict | None) -> list:
  """Returns the leaves of `abstract_state` from `index`'s shards in `step_folder`, each on
  this process's devices: with its own sharding, or, where `moved` says which device holds
  which one's shards, laid out on those devices."""
  data = np.memmap(os.path.join(step_folder, SHARDS), np.uint8, mode="r")
  arrays = []
  for path, leaf in _leaves(abstract_state):
    held_on = leaf.sharding if moved is None else _on_devices(leaf.sharding, moved)
    pieces = []
    for device, where in held_on.addressable_devices_indices_map(leaf.shape).items():
      entry = index[path][_index(where, leaf.shape)]
      if entry["dtype"] != str(leaf.dtype):
        raise ValueError(f"{path} is {entry['dtype']} there, {leaf.dtype} here")
      dtype = np.dtype(leaf.dtype)
      raw = data[entry["offset"]:entry["offset"] + int(np.prod(entry["shape"])) * dtype.itemsize]
      pieces.append(jax.device_put(raw.view(dtype).reshape(entry["shape"]), device))
    arrays.append(jax.make_array_from_single_device_arrays(leaf.shape, held_on, pieces))
  return arrays


def _devices_holding(origins: list[int]) -> dict | None:
  """Returns, for each device, the device that holds its shards when process p holds the copy
  of process origins[p] (the same local position on each); None when each holds its own."""
  if origins == list(range(len(origins))):
    return None
  local = {}
  for device in sorted(jax.devices(), key=lambda d: d.id):
    local.setdefault(device.process_index, []).append(device)
  return {written: now for p, origin in enumerate(origins)
          for written, now in zip(local[origin], local[p])}


def _on_devices(sharding, moved: dict) -> NamedSharding:
  """Returns `sharding` with each device of its mesh replaced by the one `moved` names."""
  if not isinstance(sharding, NamedSharding):
    raise ValueError(f"a {type(sharding).__name__} cannot be laid out on other devices")
  devices = np.vectorize(moved.__getitem__, otypes=[object])(sharding.mesh.devices)
  return NamedSharding(Mesh(devices, sharding.mesh.axis_names), sharding.spec)


def _common(steps: list[int]) -> list[int]:
  """Returns the steps of `steps` (at most _GATHERED) that every process offers, newest first.
  Every process must call it."""
  padded = np.full(_GATHERED, -1, np.int64)
  padded[:len(steps)] = steps
  rows = distributed.gather(padded)
  common = set.intersection(*(set(int(s) for s in row if s >= 0) for row in rows))
  return sorted(common, reverse=True)


def _remove(path: str):
  """Deletes the folder `path`, renamed first so that a kill midway leaves no step's name."""
  doomed = f"{path}.deleting"
  shutil.rmtree(doomed, ignore_errors=True)
  os.rename(path, doomed)
  shutil.rmtree(doomed, ignore_errors=True)


def _fsync_folder(path: str):
  """Makes the names in folder `path` durable, as a rename is once its folder is synced."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _leaves(tree) -> list[tuple[str, object]]:
  """Returns the leaves of `tree` with their paths as strings."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def _unique_shards(array: jax.Array) -> list[tuple[tuple, object]]:
  """Returns (index, shard) for one of this process's shards of `array` per distinct index:
  replicas once."""
  seen = {}
  for shard in array.addressable_shards:
    seen.setdefault(_index(shard.index, array.shape), shard)
  return list(seen.items())


def _index(where: tuple, shape: tuple) -> tuple:
  """Returns a shard's index into an array of `shape`, a tuple of slices whose None means the
  axis's end, as ((start, stop), ...)."""
  return tuple((s.start or 0, n if s.stop is None else s.stop) for s, n in zip(where, shape))
