"""Text corpora by name, streamed per input shard, and the held-out split by document hash.

What each source format reads is in data/formats.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

from tst_jax import fileio
from tst_jax.data import formats
from tst_jax.data.file_readers import BadFile   # noqa: F401  (sources.BadFile, as callers name it)
from tst_jax.data.formats import InputShard
from tst_jax.errors import ConfigError, DataError


def input_shards(source: str, text_field: str = "text", imports: str = ""
                 ) -> list[InputShard]:
  """Lists the input shards of `source`, `<format>:<argument>` of formats.FORMATS, in corpus
  order, which is sorted path order, once the modules of `imports` (data.imports) are."""
  formats.import_modules(imports)
  name, format_, argument = formats.parse(source)
  return [dataclasses.replace(shard, imports=imports)
          for shard in format_.shards(name, argument, text_field)]


def raw_documents(shard: InputShard) -> Iterator[bytes | str]:
  """Yields the documents of one input shard as read, bytes or str, blank ones included, in
  any process: it imports the shard's data.imports first."""
  formats.import_modules(shard.imports)
  return formats.FORMATS[shard.kind].documents(shard)


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


def load_documents(source: str, max_bytes: int | None = None, text_field: str = "text",
                   imports: str = "") -> list[str]:
  """Returns the documents of `source` as strings, in a deterministic order.

  All are held in memory, for small corpora and references. `prepare` streams the same
  documents per shard. Files are read in sorted path order. Bytes that are not UTF-8 are
  decoded with errors="replace", so each bad byte becomes U+FFFD rather than the document being
  dropped. Empty and whitespace-only documents are skipped. With `max_bytes`, reading stops
  once that many bytes of text were taken, and the document crossing the limit is cut there.
  """
  check_max_bytes(max_bytes)
  shards = input_shards(source, text_field, imports)
  docs = [d for s, b in zip(shards, byte_budgets(shards, max_bytes)) if b != 0
          for d in shard_documents(s, b)]
  if not docs:
    raise DataError(f"data.source {source!r} gave an empty corpus (no non-whitespace documents)")
  return docs


def token_bound(source: str, max_bytes: int | None = None) -> int | None:
  """Bounds the tokens `source` gives, without reading it, or returns None where unknown.

  A token of a byte-level BPE or a SentencePiece model covers at least one byte, so the bound
  is the bytes of text plus two per document for EOS and a SentencePiece dummy prefix.
  `max_bytes` caps the bytes. Its format's `sizes` gives the bytes: unknown for compressed
  files, Parquet, tfds and seqio, and where the glob matches nothing here. A store that cannot be reached, or has no such bucket, is
  one ConfigError naming the source and why, as the check before a run says it.
  """
  try:
    _, format_, argument = formats.parse(source)
  except DataError:
    return None
  try:
    files = format_.sizes(argument)
  except fileio.PathError:
    raise
  except Exception as e:   # pylint: disable=broad-except  # any store client's error
    cause = fileio.store_error(e) or (e if isinstance(e, FileNotFoundError) else None)
    if cause is None:
      raise
    raise ConfigError("data.source", f"{source!r} cannot be listed: "
                      f"{fileio.reason(cause, argument)}") from None
  if not files:   # unknown, or nothing matched here: a plan made where the data is not
    return None
  size = sum(files.values())
  return min(size, max_bytes or size) + 2 * len(files)


def fingerprint(source: str) -> dict:
  """Returns what the corpus of `source` depends on that its name does not say, as its format
  records it: the Python of builtin:pystdlib."""
  _, format_, argument = formats.parse(source)
  return format_.fingerprint(argument)


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
