"""Text corpora by name, streamed per input shard, and the held-out split by document hash.

Sources are text files, JSONL, Parquet, the builtin stdlib corpus, tfds and seqio.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import io
import json
import os
import sys
import sysconfig
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from tst_jax.errors import DataError

_SKIP_DIRS = ("site-packages", "dist-packages")
_GROUP_BYTES = 64 << 20  # text:/builtin: files are grouped into input shards of about this size
_READ_BYTES = 1 << 16  # compressed bytes read at a time from a .zst file
SOURCE_FORMS = ("'builtin:pystdlib', 'text:<glob>', 'jsonl:<glob>', 'parquet:<glob>', "
                "'tfds:<name>[:<split>]' or 'seqio:<task>[:<split>]'")


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


@dataclasses.dataclass(frozen=True)
class InputShard:
  """One unit of work of `prepare`: a group of text files, one JSONL or Parquet file, or a
  whole tfds or seqio split. `num_bytes` on disk drives the progress bar."""
  kind: str                 # text | jsonl | parquet | tfds | seqio
  paths: tuple[str, ...]    # files, one document each for text:, or tfds's name and split
  num_bytes: int
  text_field: str = "text"

  @property
  def name(self) -> str:
    return self.paths[0] if len(self.paths) == 1 else f"{self.paths[0]} (+{len(self.paths) - 1})"


def input_shards(source: str, text_field: str = "text") -> list[InputShard]:
  """Lists the input shards of `source` in corpus order, which is sorted path order.

  Sources:
    builtin:pystdlib         every *.py file of this Python's stdlib, the offline default.
    text:<glob>              text files matched by the glob, one document per file. `**` recurses.
    jsonl:<glob>             JSON lines, .jsonl, .jsonl.gz or .jsonl.zst: each `text_field`.
    parquet:<glob>           Parquet files, the `text_field` column.
    tfds:<name>[:<split>]    the `text` feature of a TFDS dataset, split train by default.
    seqio:<task>[:<split>]   the `text` feature of a SeqIO task's raw source.
  """
  kind, _, arg = source.partition(":")
  if kind == "builtin" and arg == "pystdlib":
    return _grouped(_stdlib_files())
  if kind in ("text", "jsonl", "parquet") and arg:
    matches = glob.glob(os.path.expanduser(arg), recursive=True)
    paths = sorted(p for p in matches if os.path.isfile(p))
    if not paths:
      raise DataError(f"data.source {source!r} matched no files")
    if kind == "text":
      return _grouped(paths)
    return [InputShard(kind, (p,), os.path.getsize(p), text_field) for p in paths]
  if kind in ("tfds", "seqio") and arg:
    name, _, split = arg.partition(":")
    return [InputShard(kind, (name, split or "train"), 0)]
  raise DataError(f"unknown data.source {source!r}: expected {SOURCE_FORMS}")


def pystdlib_version() -> str:
  """Returns this Python's major.minor: builtin:pystdlib reads its standard library, which
  differs from one version to the next."""
  return "%d.%d" % sys.version_info[:2]


def raw_documents(shard: InputShard) -> Iterator[bytes | str]:
  """Yields the documents of one input shard as read, bytes or str, blank ones included."""
  if shard.kind == "text":
    return (_read_file(p) for p in shard.paths)
  if shard.kind == "jsonl":
    return _whole_file(shard.paths[0], _jsonl_texts(shard.paths[0], shard.text_field))
  if shard.kind == "parquet":
    return _whole_file(shard.paths[0], _parquet_texts(shard.paths[0], shard.text_field))
  if shard.kind == "tfds":
    return _tfds_texts(*shard.paths)
  return _seqio_texts(*shard.paths)


def shard_documents(shard: InputShard, max_bytes: int | None = None) -> Iterator[str]:
  """Yields the decoded, non-blank documents of one shard, cut after `max_bytes` as `take` does."""
  return (text for text, _ in take(raw_documents(shard), max_bytes))


def byte_budgets(shards: list[InputShard], max_bytes: int | None,
                 bad: list[dict] | None = None) -> list[int | None]:
  """Returns the bytes of text each shard gives when the whole corpus is cut after `max_bytes`.

  `shard_documents(shards[i], budgets[i])` are then exactly that cut corpus's documents of
  shard i. Reads the corpus up to `max_bytes` only, and returns all None without a limit.
  Given a list `bad`, a BadFile gives 0 bytes and its record is appended there, else it raises.
  """
  if max_bytes is None:
    return [None] * len(shards)
  budgets, left = [], max_bytes
  for shard in shards:
    try:
      used = sum(n for _, n in take(raw_documents(shard), left)) if left else 0
    except BadFile as e:
      if bad is None:
        raise
      bad.append(e.record())
      used = 0
    budgets.append(used)
    left -= used
  return budgets


def load_documents(source: str, max_bytes: int | None = None, text_field: str = "text"
                   ) -> list[str]:
  """Returns the documents of `source` as strings, in a deterministic order.

  All are held in memory, for small corpora and references. `prepare` streams the same
  documents per shard. Files are read in sorted path order. Bytes that are not UTF-8 are
  decoded with errors="replace", so each bad byte becomes U+FFFD rather than the document being
  dropped. Empty and whitespace-only documents are skipped. With `max_bytes`, reading stops
  once that many bytes of text were taken, and the document crossing the limit is cut there.
  """
  check_max_bytes(max_bytes)
  shards = input_shards(source, text_field)
  docs = [d for s, b in zip(shards, byte_budgets(shards, max_bytes)) if b != 0
          for d in shard_documents(s, b)]
  if not docs:
    raise DataError(f"data.source {source!r} gave an empty corpus (no non-whitespace documents)")
  return docs


def token_bound(source: str, max_bytes: int | None = None) -> int | None:
  """Bounds the tokens `source` gives, without reading it, or returns None where unknown.

  A token of a byte-level BPE or a SentencePiece model covers at least one byte, so the bound
  is the bytes of text plus two per document for EOS and a SentencePiece dummy prefix.
  `max_bytes` caps the bytes. The size is unknown for compressed files, Parquet, tfds and seqio.
  """
  kind, _, pattern = source.partition(":")
  if kind == "builtin" and pattern == "pystdlib":
    paths = _stdlib_files()
  elif kind in ("text", "jsonl") and pattern:      # JSON escapes only make a file longer
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(p))
    if kind == "jsonl" and any(p.endswith((".gz", ".zst")) for p in paths):
      return None
  else:
    return None
  size = sum(os.path.getsize(p) for p in paths)
  return min(size, max_bytes or size) + 2 * len(paths)


def check_max_bytes(max_bytes: int | None):
  if max_bytes is not None and max_bytes <= 0:
    raise ValueError(f"max_bytes must be positive, got {max_bytes}")


def split_documents(docs: list[str], val_fraction: float, seed: int, piece_bytes: int = 0
                    ) -> tuple[list[str], list[str]]:
  """Splits `docs` into train and val, each in the original order.

  `pieces` cuts each document into pieces, whole with piece_bytes=0. A piece goes to val when a
  stable hash of the seed, its document and its place in it falls below `val_fraction`, so the
  split depends on neither the corpus order nor its size, and identical documents land on the
  same side. A held-out piece is one val document. `segments` joins the training pieces between
  them back into one training document. With val_fraction > 0 and at least 2 such documents,
  each side gets at least one, by moving the extreme hash over.
  """
  check_val_fraction(val_fraction)
  parts = [seg for d in docs for seg in segments(d, seed, val_fraction, piece_bytes)]
  u = np.array([h for _, h in parts], dtype=np.float64)
  is_val = u < val_fraction
  if val_fraction > 0 and len(parts) >= 2:
    if not is_val.any():
      is_val[np.argmin(u)] = True
    if is_val.all():
      is_val[np.argmax(u)] = False
  train = [d for (d, _), v in zip(parts, is_val) if not v]
  val = [d for (d, _), v in zip(parts, is_val) if v]
  return train, val


def pieces(doc: str, piece_bytes: int) -> list[str]:
  """Cuts `doc` at line ends into pieces of at most `piece_bytes` UTF-8 bytes.

  A longer line is cut every piece_bytes characters. Returns [doc] when piece_bytes is 0 or doc
  fits in one piece. The pieces concatenate back to doc.
  """
  if not piece_bytes or len(doc) <= piece_bytes // 4 or _nbytes(doc) <= piece_bytes:
    return [doc]
  out, current, size = [], [], 0
  for line in doc.splitlines(keepends=True):
    for k in range(0, len(line), piece_bytes):
      part = line[k:k + piece_bytes]
      n = _nbytes(part)
      if current and size + n > piece_bytes:
        out.append("".join(current))
        current, size = [], 0
      current.append(part)
      size += n
  if current:
    out.append("".join(current))
  return out


def segments(doc: str, seed: int, val_fraction: float, piece_bytes: int
             ) -> list[tuple[str, float]]:
  """Yields the text and hash of each document that `doc` gives the split.

  Each held-out piece, whose hash is below val_fraction, stands alone. Each run of consecutive
  training pieces is joined and takes the least hash of the run. A document of one piece keeps
  its hash unit_hash(seed, doc). Piece k of a longer one hashes the seed, the document's sha256
  and k, not its text. A piece repeated across many files, such as the stdlib's codec tables,
  is then held out in about val_fraction of them, as the training stream holds it, rather than
  in all or none of its copies, which would make the held-out split easier than training.
  """
  parts = pieces(doc, piece_bytes)
  if len(parts) == 1:
    return [(doc, unit_hash(seed, doc))]
  digest = hashlib.sha256(doc.encode("utf-8", errors="surrogatepass")).hexdigest()
  out, run, run_u = [], [], 1.0
  for k, part in enumerate(parts):
    u = unit_hash(seed, f"{digest}\0{k}")
    if u < val_fraction:
      if run:
        out.append(("".join(run), run_u))
      out.append((part, u))
      run, run_u = [], 1.0
    else:
      run.append(part)
      run_u = min(run_u, u)
  if run:
    out.append(("".join(run), run_u))
  return out if len(out) > 1 else [(doc, out[0][1])]


def _nbytes(text: str) -> int:
  return len(text.encode("utf-8", errors="surrogatepass"))


def check_val_fraction(val_fraction: float):
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")


def unit_hash(seed: int, doc: str) -> float:
  """Returns a number in [0, 1) fixed by seed and doc, the same on every machine and Python."""
  h = hashlib.sha256(f"{seed}\0".encode() + doc.encode("utf-8", errors="surrogatepass"))
  return int.from_bytes(h.digest()[:8], "big") / 2.0**64


def take(raw: Iterable[bytes | str], max_bytes: int | None) -> Iterator[tuple[str, int]]:
  """Yields each document's text and bytes taken, blank ones skipped, cut after `max_bytes`."""
  total = 0
  for item in raw:
    data = item.encode("utf-8", errors="replace") if isinstance(item, str) else item
    if max_bytes is not None and total + len(data) > max_bytes:
      data = data[:max_bytes - total]
    text = data.decode("utf-8", errors="replace")
    if text.strip():
      yield text, len(data)
      total += len(data)
    if max_bytes is not None and total >= max_bytes:
      return


def _grouped(paths: list[str]) -> list[InputShard]:
  """Groups consecutive files, one document each, into shards of about _GROUP_BYTES."""
  shards, group, size = [], [], 0
  for p in paths:
    group.append(p)
    size += os.path.getsize(p)
    if size >= _GROUP_BYTES:
      shards.append(InputShard("text", tuple(group), size))
      group, size = [], 0
  if group:
    shards.append(InputShard("text", tuple(group), size))
  return shards


def _stdlib_files() -> list[str]:
  root = sysconfig.get_paths()["stdlib"]
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
    paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
  return sorted(paths)


def _read_file(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _open_text(path: str) -> io.TextIOBase:
  """Opens plain, .gz and .zst files as text. zstd needs the `data` extra."""
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8", errors="replace")
  if path.endswith(".zst"):
    try:
      import zstandard  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise DataError(f"{path}: .zst input needs zstandard: pip install zstandard") from e
    return io.TextIOWrapper(io.BufferedReader(_ZstdReader(path, zstandard)), encoding="utf-8",
                            errors="replace")
  return open(path, encoding="utf-8", errors="replace")


class _ZstdReader(io.RawIOBase):
  """The decompressed bytes of every frame of a .zst file. A file that ends inside a frame
  raises EOFError, as gzip does: zstandard's stream_reader ends there without a word."""

  def __init__(self, path: str, zstandard):
    super().__init__()
    self._file, self._zstd = open(path, "rb"), zstandard.ZstdDecompressor()
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


def _whole_file(path: str, docs: Iterator[str]) -> Iterator[str]:
  """Yields the documents of one file. A file that cannot be read to its end raises one
  BadFile naming it, whichever decompressor or reader found the fault."""
  try:
    yield from docs
  except _read_errors() as e:
    raise BadFile(path, f"cannot be read to its end ({type(e).__name__}: {e}): the file is "
                  "truncated, corrupt or of another format") from None


def _read_errors() -> tuple[type[BaseException], ...]:
  """The exceptions of a file that is truncated or corrupt, of the readers loaded so far."""
  errors = [EOFError, zlib.error, gzip.BadGzipFile]
  for module, name in (("zstandard", "ZstdError"), ("pyarrow", "ArrowException")):
    if module in sys.modules:
      errors.append(getattr(sys.modules[module], name))
  return tuple(errors)


def _jsonl_texts(path: str, field: str) -> Iterator[str]:
  """Yields the `field` of every JSON line.

  A line that is not a JSON object holding a string `field` is an error naming the file and
  line. That is a wrong --text_field or another format far more often than one odd record, and
  skipping would silently drop the corpus.
  """
  with _open_text(path) as f:
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
                        "set --text_field to the field that holds the document")
      yield text


def _parquet_texts(path: str, field: str) -> Iterator[str]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError(f"{path}: Parquet input needs pyarrow: pip install 'tst-jax[parquet]'") from e
  f = pq.ParquetFile(path)
  if field not in f.schema_arrow.names:
    raise DataError(f"{path}: no column {field!r} (has {f.schema_arrow.names[:8]}); "
                    "set --text_field to the column that holds the document")
  row = 0
  for batch in f.iter_batches(columns=[field], batch_size=1024):
    for text in batch.column(0).to_pylist():
      if not isinstance(text, str):
        raise DataError(f"{path}: row {row} of column {field!r} is {text!r}, not a string")
      row += 1
      yield text


def _tfds_texts(name: str, split: str) -> Iterator[bytes]:
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(
        f"data.source 'tfds:{name}' needs tensorflow-datasets: pip install 'tst-jax[tfds]'") from e
  source = tfds.data_source(name, split=split)   # ArrayRecord, read without TensorFlow
  for i in range(len(source)):
    yield source[i]["text"]


def _seqio_texts(task: str, split: str) -> Iterator[bytes]:
  try:
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(f"data.source 'seqio:{task}' needs seqio: pip install 'tst-jax[seqio]'") from e
  ds = seqio.get_mixture_or_task(task).source.get_dataset(split=split, shuffle=False)
  for ex in ds.as_numpy_iterator():
    yield ex["text"]
