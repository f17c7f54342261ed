"""Files a run appends to, metrics.jsonl and TensorBoard's events, on a local disk or in a bucket.

An object cannot be appended to. In a bucket new bytes are uploaded as an object of their own
under `PARTS` and joined to the file's end by the store: GCS composes two objects into one in
a single atomic call, so each upload costs the new bytes only and the file is always whole,
holding every byte up to its last upload. The compose carries the generation of the file it
read, so a compose that gcsfs retries after a lost answer cannot join the new bytes twice. A
store without compose, such as S3 through fsspec, gets the file rewritten whole.

Uploads are at most one per `every_s`: GCS takes about one write per second to one object
name, and the run asks for one with `flush` before each checkpoint. They run on the thread
that writes. A failed upload keeps its bytes: when due it is logged and tried again later, and
at `flush` it is one PathError. The file's size after the last upload tells whether a failed
try went through after all, so no byte is sent twice.
"""

from __future__ import annotations

import logging
import posixpath
import time
import uuid

from tst_jax import fileio

log = logging.getLogger("tst_jax")

APPEND_EVERY_S = 10.0        # a bucket file's uploads are this far apart at the most often
COMPOSE_PROTOCOLS = ("gs", "gcs")
# The folder beside a file where its new bytes wait to be composed onto it. The parts' names
# hold no "tfevents", so TensorBoard never reads one that a killed run left behind.
PARTS = ".parts"


class Appender:
  """Appends bytes to `path`: a local file flushed at each write, or an object uploaded when
  `every_s` has passed since the last upload and at each `flush`. `parts` is the folder of
  the uploads on their way, `PARTS` beside the file unless given."""

  def __init__(self, path: str, *, every_s: float | None = None, clock=time.monotonic,
               parts: str | None = None):
    self.path, self.clock = path, clock
    self.every_s = APPEND_EVERY_S if every_s is None else every_s
    if fileio.local_path(path) is not None:
      self._local, self._fs = open(path, "ab"), None
      return
    self._local = None
    self._fs, self._object = fileio.filesystem(path)
    self._parts = (fileio.filesystem(parts)[1] if parts is not None
                   else posixpath.join(posixpath.dirname(self._object), PARTS))
    self._size = object_size(self._fs, self._object)   # once every upload so far is in
    self._pending, self._last = [], clock()

  def write(self, data: bytes | str):
    """Appends `data`: written through at once locally, uploaded when due in a bucket."""
    data = data.encode() if isinstance(data, str) else data
    if self._local is not None:
      self._local.write(data)
      self._local.flush()
      return
    self._pending.append(data)
    if self.clock() - self._last < self.every_s:
      return
    try:
      self._upload()
    except Exception as e:   # pylint: disable=broad-except
      self._last = self.clock()
      log.warning("%s: an upload failed, tried again in %g s and at the next flush: %s",
                  self.path, self.every_s, fileio.reason(e, self.path))

  def flush(self):
    """Makes every byte written so far part of the file, or raises one PathError and keeps
    the bytes for the next try."""
    if self._local is not None:
      self._local.flush()
      return
    try:
      self._upload()
    except fileio.PathError:
      raise
    except Exception as e:   # pylint: disable=broad-except
      raise fileio.PathError(f"{self.path} cannot be appended to: "
                             f"{fileio.reason(e, self.path)}") from e

  def _upload(self):
    if not self._pending:
      return
    data = b"".join(self._pending)
    self._pending = [data]
    self._size = append_object(self._fs, self._object, data, size=self._size,
                               parts=self._parts)
    self._pending, self._last = [], self.clock()

  def close(self):
    self.flush()
    if self._local is not None:
      self._local.close()

  def abandon(self):
    """Closes without uploading the bytes not yet in the file: after its store failed, for a
    run that stops, whose resumption drops them anyway."""
    self._pending = []
    if self._local is not None:
      self._local.close()

  def __enter__(self) -> Appender:
    return self

  def __exit__(self, *exc):
    self.close()


def append_object(fs, name: str, data: bytes, *, size: int | None = None,
                  parts: str | None = None) -> int:
  """Appends `data` to object `name` of filesystem `fs`, which it creates if absent, and
  returns the object's new size.

  `size` is the object's size before `data` as the caller last knew it. Bytes found past it
  are taken for the first bytes of `data` from a try that failed yet went through, and are
  not sent again. A GCS part goes to the folder `parts`, `PARTS` beside `name` unless given.
  """
  info = _info(fs, name)
  found = int(info["size"]) if info else 0
  if size is not None:
    if not size <= found <= size + len(data):
      raise fileio.PathError(f"{_url(fs, name)} holds {found} bytes, not the {size} this "
                             "run's uploads left: another writer changed it")
    data = data[found - size:]
  if not data:
    return found
  if not set(_protocols(fs)) & set(COMPOSE_PROTOCOLS):
    fs.pipe_file(name, (fs.cat_file(name) if found else b"") + data)
    return found + len(data)
  try:
    if info is None:
      fs.pipe_file(name, data, mode="create")
    else:
      part = posixpath.join(parts or posixpath.join(posixpath.dirname(name), PARTS),
                            uuid.uuid4().hex)
      fs.pipe_file(part, data)
      try:
        _compose(fs, name, part, info["generation"])
      finally:
        fs.rm_file(part)
  except FileExistsError:   # HTTP 412: the object is no longer the one read above
    if object_size(fs, name) != found + len(data):
      raise fileio.PathError(f"{_url(fs, name)} changed while this run appended to it: "
                             "another writer holds it") from None
  return found + len(data)


def _compose(fs, name: str, part: str, generation: str):
  """Joins object `part` to the end of object `name` in one GCS compose, which GCS refuses
  with HTTP 412, gcsfs's FileExistsError, unless `name` is still at `generation`."""
  bucket, key, _ = fs.split_path(name)
  fs.call("POST", "b/{}/o/{}/compose", bucket, key, ifGenerationMatch=generation,
          headers={"Content-Type": "application/json"},
          json={"sourceObjects": [{"name": key}, {"name": fs.split_path(part)[1]}],
                "kind": "storage#composeRequest",
                "destination": {"name": key, "bucket": bucket}})
  fs.invalidate_cache(name)


def object_size(fs, name: str) -> int:
  """Returns the size of object `name` as the store has it now, 0 where there is none."""
  info = _info(fs, name)
  return int(info["size"]) if info else 0


def _info(fs, name: str) -> dict | None:
  """Returns the store's record of object `name` now, not a cached one, None where there is
  none. A GCS object's record holds its generation."""
  fs.invalidate_cache(name)
  try:
    return fs.info(name)
  except FileNotFoundError:
    return None


def _url(fs, name: str) -> str:
  return f"{_protocols(fs)[0]}://{name}"


def _protocols(fs) -> tuple:
  protocol = fs.protocol
  return (protocol,) if isinstance(protocol, str) else tuple(protocol)
