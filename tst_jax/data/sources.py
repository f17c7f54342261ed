"""Text corpora by name (builtin:pystdlib, text:<glob>, tfds:, seqio:) and a held-out split."""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from collections.abc import Iterable, Iterator

import numpy as np

_SKIP_DIRS = ("site-packages", "dist-packages")


def load_documents(source: str, max_bytes: int | None = None) -> list[str]:
  """Returns the documents of `source` as strings, in a deterministic order.

  Sources:
    builtin:pystdlib         every *.py file of this Python's stdlib (the offline default).
    text:<glob>              text files matched by the glob (`**` recurses), one document per file.
    tfds:<name>[:<split>]    the `text` feature of a TFDS dataset (split defaults to train).
    seqio:<task>[:<split>]   the `text` feature of a SeqIO task's raw source.

  Files are read in sorted path order. Bytes that are not UTF-8 are decoded with
  errors="replace" (each bad byte becomes U+FFFD) rather than dropping the document;
  empty and whitespace-only documents are skipped. With `max_bytes`, reading stops once
  that many bytes of text were taken: the document crossing the limit is cut there.
  """
  if max_bytes is not None and max_bytes <= 0:
    raise ValueError(f"max_bytes must be positive, got {max_bytes}")
  kind, _, arg = source.partition(":")
  if kind == "builtin" and arg == "pystdlib":
    raw = (_read_file(p) for p in _stdlib_files())
  elif kind == "text" and arg:
    matches = glob.glob(os.path.expanduser(arg), recursive=True)
    paths = sorted(p for p in matches if os.path.isfile(p))
    if not paths:
      raise ValueError(f"data.source {source!r} matched no files")
    raw = (_read_file(p) for p in paths)
  elif kind == "tfds" and arg:
    raw = _tfds_texts(*_name_split(arg))
  elif kind == "seqio" and arg:
    raw = _seqio_texts(*_name_split(arg))
  else:
    raise ValueError(
        f"unknown data.source {source!r}: expected 'builtin:pystdlib', 'text:<glob>', "
        "'tfds:<name>[:<split>]' or 'seqio:<task>[:<split>]'")
  docs = _take(raw, max_bytes)
  if not docs:
    raise ValueError(f"data.source {source!r} gave an empty corpus (no non-whitespace documents)")
  return docs


def split_documents(docs: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
  """Splits `docs` into (train, val), each in the original order.

  A document goes to val when a stable hash of (seed, its content) falls below
  `val_fraction`, so the split does not depend on the corpus order or size and identical
  documents land on the same side. With val_fraction > 0 and >= 2 documents, each side
  gets at least one document (the extreme hash is moved over).
  """
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
  u = np.array([_unit_hash(seed, d) for d in docs], dtype=np.float64)
  is_val = u < val_fraction
  if val_fraction > 0 and len(docs) >= 2:
    if not is_val.any():
      is_val[np.argmin(u)] = True
    if is_val.all():
      is_val[np.argmax(u)] = False
  train = [d for d, v in zip(docs, is_val) if not v]
  val = [d for d, v in zip(docs, is_val) if v]
  return train, val


def _unit_hash(seed: int, doc: str) -> float:
  """A number in [0, 1) fixed by (seed, doc), the same on every machine and Python."""
  h = hashlib.sha256(f"{seed}\0".encode() + doc.encode("utf-8", errors="surrogatepass"))
  return int.from_bytes(h.digest()[:8], "big") / 2.0**64


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


def _take(raw: Iterable[bytes | str], max_bytes: int | None) -> list[str]:
  """Decodes documents, skips blank ones, and stops after `max_bytes` bytes of text."""
  docs, total = [], 0
  for item in raw:
    data = item.encode("utf-8", errors="replace") if isinstance(item, str) else item
    if max_bytes is not None and total + len(data) > max_bytes:
      data = data[:max_bytes - total]
    text = data.decode("utf-8", errors="replace")
    if text.strip():
      docs.append(text)
      total += len(data)
    if max_bytes is not None and total >= max_bytes:
      break
  return docs


def _name_split(arg: str) -> tuple[str, str]:
  name, _, split = arg.partition(":")
  return name, split or "train"


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
