"""The documents of one input file, local or in a bucket: JSON lines, plain, .gz or .zst, and
Parquet. A file that cannot be read to its end is one BadFile naming it."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
import zlib
from collections.abc import Iterator

from tst_jax import fileio
from tst_jax.errors import DataError

_READ_BYTES = 1 << 16  # compressed bytes read at a time from a .zst file

# The field's flag in each command that reads a corpus: a run's config, or prepare's.
TEXT_FIELD_FLAGS = "--config.data.text_field=NAME (main.py), --text_field=NAME (prepare)"


class BadFile(DataError):
  """An input file that cannot be read to its end: truncated, corrupt or of another format.
  `prepare --skip_bad_files` leaves such a file out, and any other DataError stops it."""

  def __init__(self, path: str, reason: str, line: int | None = None):
    self.path, self.reason, self.line = path, reason, line
    where = path if line is None else f"{path}:{line}"
    super().__init__(f"{where}: {reason}; replace the file and run again (what is prepared is "
                     "kept), or leave such files out: python -m tst_jax.data.prepare "
                     "--skip_bad_files")

  def __reduce__(self):   # picklable across prepare's worker processes with its arguments
    return type(self), (self.path, self.reason, self.line)

  def record(self) -> dict:
    """Names the file and what is wrong with it, as a store's manifest lists a file left out."""
    return dict(file=self.path,
                reason=self.reason if self.line is None else f"line {self.line}: {self.reason}")


@contextlib.contextmanager
def open_text(path: str) -> Iterator[io.TextIOBase]:
  """Opens plain, .gz and .zst files as text, local or through fsspec, for a `with` block.
  The block closes the file, a .gz file's own too: gzip leaves open a file it was handed."""
  if path.endswith(".gz"):
    with fileio.open(path, "rb") as raw, gzip.open(raw, "rt", encoding="utf-8",
                                                   errors="replace") as text:
      yield text
    return
  with _open_text(path) as text:
    yield text


def _open_text(path: str) -> io.TextIOBase:
  if path.endswith(".zst"):
    try:
      import zstandard  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise DataError(f"{path}: .zst input needs zstandard: pip install zstandard") from e
    return io.TextIOWrapper(io.BufferedReader(_ZstdReader(path, zstandard)), encoding="utf-8",
                            errors="replace")
  return fileio.open(path, "r", encoding="utf-8", errors="replace")


class _ZstdReader(io.RawIOBase):
  """The decompressed bytes of every frame of a .zst file. A file that ends inside a frame
  raises EOFError, as gzip does: zstandard's stream_reader ends there without a word."""

  def __init__(self, path: str, zstandard):
    super().__init__()
    self._file, self._zstd = fileio.open(path, "rb"), zstandard.ZstdDecompressor()
    self._frame, self._out, self._at = None, b"", 0

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while self._at == len(self._out):
      data = self._frame.unused_data if self._frame is not None and self._frame.eof else b""
      data = data or self._file.read(_READ_BYTES)
      if not data:
        if self._frame is not None and not self._frame.eof:
          raise EOFError("the file ends inside a zstd frame")
        return 0
      if self._frame is None or self._frame.eof:
        self._frame = self._zstd.decompressobj()
      self._out, self._at = self._frame.decompress(data), 0
    n = min(len(buffer), len(self._out) - self._at)
    buffer[:n] = self._out[self._at:self._at + n]
    self._at += n
    return n

  def close(self):
    self._file.close()
    super().close()


def whole_file(path: str, docs: Iterator[str]) -> Iterator[str]:
  """Yields the documents of one file. A file that cannot be read to its end raises one
  BadFile naming it, whichever decompressor or reader found the fault."""
  try:
    yield from docs
  except read_errors() as e:
    raise BadFile(path, f"cannot be read to its end ({type(e).__name__}: {e}): the file is "
                  "truncated, corrupt or of another format") from None


def read_errors() -> tuple[type[BaseException], ...]:
  """The exceptions of a file that is truncated or corrupt, of the readers loaded so far."""
  errors = [EOFError, zlib.error, gzip.BadGzipFile]
  for module, name in (("zstandard", "ZstdError"), ("pyarrow", "ArrowException")):
    if module in sys.modules:
      errors.append(getattr(sys.modules[module], name))
  return tuple(errors)


def jsonl_texts(path: str, field: str) -> Iterator[str]:
  """Yields the `field` of every JSON line.

  A line that is not a JSON object holding a string `field` is an error naming the file and
  line. That is a wrong --text_field or another format far more often than one odd record, and
  skipping would silently drop the corpus.
  """
  with open_text(path) as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise BadFile(path, f"not a JSON line ({e})", line_no) from None
      text = record.get(field) if isinstance(record, dict) else None
      if not isinstance(text, str):
        keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{path}:{line_no}: no string field {field!r} (has {keys}); "
                        f"name the field that holds the document: {TEXT_FIELD_FLAGS}")
      yield text


def parquet_texts(path: str, field: str) -> Iterator[str]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError(f"{path}: Parquet input needs pyarrow: pip install 'tst-jax[parquet]'") from e
  with fileio.open(path, "rb") as raw:    # random access: Parquet reads its footer first
    yield from _parquet_column(pq.ParquetFile(raw), path, field)


def _parquet_column(f, path: str, field: str) -> Iterator[str]:
  if field not in f.schema_arrow.names:
    raise DataError(f"{path}: no column {field!r} (has {f.schema_arrow.names[:8]}); "
                    f"name the column that holds the document: {TEXT_FIELD_FLAGS}")
  row = 0
  for batch in f.iter_batches(columns=[field], batch_size=1024):
    for text in batch.column(0).to_pylist():
      if not isinstance(text, str):
        raise DataError(f"{path}: row {row} of column {field!r} is {text!r}, not a string")
      row += 1
      yield text


def read_file(path: str) -> bytes:
  return fileio.read_bytes(path)
