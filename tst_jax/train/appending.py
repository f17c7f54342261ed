"""Files a run appends to, metrics.jsonl and TensorBoard's events, on a local disk or in a bucket.

An object cannot be appended to. In a bucket new bytes are uploaded as an object of their own
and joined to the file's end by the store: GCS composes two objects into one in a single
atomic call, so each upload costs the new bytes only and the file is always whole, holding
every line up to its last upload. A store without compose, such as S3 through fsspec, gets
the file rewritten whole. Uploads are at most one per `every_s`: GCS takes about one write
per second to one object name, and the run asks for one with `flush` before each checkpoint.
"""

from __future__ import annotations

import time
import uuid

from tst_jax import fileio

APPEND_EVERY_S = 10.0        # a bucket file's uploads are this far apart at the most often
COMPOSE_PROTOCOLS = ("gs", "gcs")


class Appender:
  """Appends bytes to `path`: a local file flushed at each write, or an object uploaded when
  `every_s` has passed since the last upload and at each `flush`."""

  def __init__(self, path: str, *, every_s: float = APPEND_EVERY_S, clock=time.monotonic):
    self.path, self.every_s, self.clock = path, every_s, clock
    if not fileio.is_url(path):
      self._local, self._fs = open(path, "ab"), None
      return
    self._local = None
    self._fs, self._object = fileio.filesystem(path)
    self._pending, self._last = [], clock()

  def write(self, data: bytes | str):
    """Appends `data`: written through at once locally, uploaded when due in a bucket."""
    data = data.encode() if isinstance(data, str) else data
    if self._local is not None:
      self._local.write(data)
      self._local.flush()
      return
    self._pending.append(data)
    if self.clock() - self._last >= self.every_s:
      self.flush()

  def flush(self):
    """Makes every byte written so far part of the file."""
    if self._local is not None:
      self._local.flush()
      return
    if not self._pending:
      return
    data, self._pending = b"".join(self._pending), []
    append_object(self._fs, self._object, data)
    self._last = self.clock()

  def close(self):
    self.flush()
    if self._local is not None:
      self._local.close()

  def __enter__(self) -> Appender:
    return self

  def __exit__(self, *exc):
    self.close()


def append_object(fs, name: str, data: bytes):
  """Appends `data` to object `name` of filesystem `fs`, which it creates if absent."""
  if not fs.exists(name):
    fs.pipe_file(name, data)
    return
  if set(_protocols(fs)) & set(COMPOSE_PROTOCOLS):
    part = f"{name}.part-{uuid.uuid4().hex}"
    fs.pipe_file(part, data)
    try:
      fs.merge(name, [name, part])
    finally:
      fs.rm_file(part)
    return
  fs.pipe_file(name, fs.cat_file(name) + data)


def _protocols(fs) -> tuple:
  protocol = fs.protocol
  return (protocol,) if isinstance(protocol, str) else tuple(protocol)
