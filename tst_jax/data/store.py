"""A prepared token store: its manifest, and the memory-mapped reader of its splits.

Layout of a store folder (written by `python -m tst_jax.data.prepare`):
  manifest.json             written last: the store exists once it does (see `read_manifest`)
  tokenizer.json            the tokenizer the tokens were made with (or tokenizer.model)
  train-00000.bin, ...      raw little-endian uint16 (vocab <= 65536) or uint32 tokens
  val-00000.bin, ...
  val-00000.bytes.bin, ...  uint32 per held-out token: the UTF-8 bytes of text under it, 0
                            under EOS (a store prepared before they were recorded has none)
Each split is one stream: its shards concatenated in order. Stream position p of a split is
token p - offset of the shard that holds it.

A store in a bucket (gs://..., any fsspec URL) is read in place too: each batch's windows are
fetched by range requests, all at once, and nothing is copied to the local disk.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from tst_jax import fileio
from tst_jax.errors import DataError
from tst_jax.data.tokenizer import Tokenizer, get_tokenizer

FORMAT = "tst-jax token store"
VERSION = 2              # 2: the held-out split may cut documents (request.val_piece_bytes)
READS = (1, 2)           # a version-1 store is a whole-document split: val_piece_bytes 0
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
BYTES_DTYPE = "uint32"          # the bytes under a held-out token: a long one can pass 65535
BYTES_SUFFIX = ".bytes.bin"     # of a held-out shard's bytes file, val-00000.bytes.bin


def token_dtype(vocab_size: int) -> str:
  return "uint16" if vocab_size <= 2**16 else "uint32"


def fingerprint(manifest: dict) -> str:
  """sha256 of the manifest's content but its creation time: the same for the same corpus,
  request and tokenizer wherever and whenever the store is prepared (each shard's sha256 is in
  it), so it names the data a run was trained on without reading the shards."""
  body = {k: v for k, v in manifest.items() if k not in ("fingerprint", "created")}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def data_name(manifest: dict) -> str:
  """Names the data a store holds, as a config.reference records it: the store's fingerprint,
  or builtin:pystdlib@<major.minor> for the standard library of the Python that prepared it."""
  read = manifest.get("sources", {})
  if read.get("python"):
    return f"{read['source']}@{read['python']}"
  return manifest["fingerprint"]


def read_manifest(directory: str) -> dict:
  """Reads the manifest of the store in `directory`, checked for format, version and fingerprint."""
  path = fileio.join(directory, MANIFEST)
  if not fileio.isfile(path):
    fileio.check_reachable(directory, "the token store")   # a bucket that refuses says why
    raise DataError(f"{directory} is not a prepared token store (no {MANIFEST}); make one "
                    "with python -m tst_jax.data.prepare --out=" + directory)
  try:
    manifest = json.loads(fileio.read_text(path))
  except ValueError as e:
    raise DataError(f"{path} is not valid JSON ({e})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise DataError(f"{path} is not a {FORMAT} manifest")
  if manifest.get("version") not in READS:
    raise DataError(f"{path} has format version {manifest.get('version')}, this tst-jax reads "
                    f"versions {READS}: prepare the store again with this version")
  if manifest.get("fingerprint") != fingerprint(manifest):
    raise DataError(f"{path} was edited after it was written (its fingerprint does not match)")
  if manifest["version"] == 1:    # written before pieces: its split held out whole documents
    manifest["request"].setdefault("val_piece_bytes", 0)
  return manifest


class StoreSplit:
  """One split of a store as a read-only stream of N tokens, memory-mapped shard by shard, or
  read by range requests from a bucket; with `token_bytes`, the held-out split's stream of
  the UTF-8 bytes under each of its tokens, read alike.

  Nothing is read at open but the file sizes. `gather` reads the windows asked for, which may
  span shards and wrap around the end. Picklable: the maps and the bucket's client reopen lazily.
  """

  def __init__(self, directory: str, manifest: dict, split: str, sizes: dict[str, int],
               token_bytes: bool = False):
    """`sizes` gives {path: bytes} of the store's shards that exist (`fileio.sizes`)."""
    entry = manifest["splits"][split]
    self.directory, self.split = directory, split
    self.dtype = np.dtype(BYTES_DTYPE if token_bytes else manifest["dtype"])
    self.files = [fileio.join(directory, s["bytes_file" if token_bytes else "file"])
                  for s in entry["shards"]]
    self.remote = fileio.local_path(directory) is None   # read by range requests, not mapped
    counts = np.array([s["tokens"] for s in entry["shards"]], dtype=np.int64)
    self.ends = np.cumsum(counts)            # shard i holds positions [ends[i-1], ends[i])
    self.num_docs, self.vocab_size = entry["docs"], manifest["tokenizer"]["vocab_size"]
    for path, count in zip(self.files, counts.tolist()):
      if path not in sizes:
        raise DataError(f"shard {path} of the store {directory} is missing")
      size = sizes[path]
      if size != count * self.dtype.itemsize:
        raise DataError(f"shard {path} has {size} bytes, its manifest says {count} "
                        f"{self.dtype} tokens ({count * self.dtype.itemsize} bytes): it is "
                        "truncated or from another store; prepare the store again")
    self._maps = self._fs = self._keys = None

  def __len__(self) -> int:
    return int(self.ends[-1]) if len(self.ends) else 0

  def __getstate__(self):
    return {**self.__dict__, "_maps": None, "_fs": None}

  def _shards(self) -> list[np.ndarray]:
    if self._maps is None:
      self._maps = [np.memmap(p, dtype=self.dtype, mode="r") if os.path.getsize(p)
                    else np.zeros(0, self.dtype) for p in self.files]   # (no map of 0 bytes)
    return self._maps

  def _pieces(self, start: int, length: int) -> list[tuple[int, int, int]]:
    """Returns (shard, first token in it, count) of each piece of positions start, ...,
    start + length - 1 (modulo N), in order."""
    n, pieces = len(self), []
    pos = start % n
    while length > 0:
      i = int(np.searchsorted(self.ends, pos, side="right"))
      lo = int(self.ends[i - 1]) if i else 0
      count = min(length, int(self.ends[i]) - pos)
      pieces.append((i, pos - lo, count))
      length -= count
      pos = (pos + count) % n
    return pieces

  def read(self, start: int, length: int) -> np.ndarray:
    """int32 tokens at stream positions start, ..., start + length - 1 (modulo N)."""
    if self.remote:
      return self.gather(np.array([start]), length)[0]
    maps = self._shards()
    pieces = [maps[i][a:a + count] for i, a, count in self._pieces(start, length)]
    return np.concatenate(pieces).astype(np.int32) if len(pieces) > 1 else pieces[0].astype(
        np.int32)

  def gather(self, starts_b: np.ndarray, window: int) -> np.ndarray:
    """int32 [b, W]: the window of `window` tokens at each start."""
    if self.remote:
      return self._fetch(np.asarray(starts_b).tolist(), window)
    return np.stack([self.read(s, window) for s in np.asarray(starts_b).tolist()])

  def _fetch(self, starts: list[int], window: int) -> np.ndarray:
    """Reads windows from a bucket: one range request per piece, sent together."""
    if self._fs is None:
      self._fs = fileio.filesystem(self.files[0])[0]
      self._keys = [fileio.filesystem(f)[1] for f in self.files]
    rows = [self._pieces(s, window) for s in starts]
    flat = [p for row in rows for p in row]
    size = self.dtype.itemsize
    blobs = iter(self._fs.cat_ranges([self._keys[i] for i, _, _ in flat],
                                     [a * size for _, a, _ in flat],
                                     [(a + count) * size for _, a, count in flat],
                                     on_error="raise"))
    return np.stack([np.concatenate([np.frombuffer(next(blobs), self.dtype) for _ in row])
                     for row in rows]).astype(np.int32)

  def __repr__(self) -> str:
    return f"StoreSplit({self.directory!r}, {self.split}, tokens={len(self)})"


class TokenStore:
  """A prepared store opened for reading, local or in a bucket: manifest checked and shards
  sized, nothing scanned."""

  def __init__(self, directory: str):
    self.directory = fileio.absolute(directory)
    self.manifest = read_manifest(self.directory)
    self.fingerprint = self.manifest["fingerprint"]
    self.data_name = data_name(self.manifest)
    shards = [shard for split in SPLITS for shard in self.manifest["splits"][split]["shards"]]
    sizes = fileio.sizes([fileio.join(self.directory, shard[key]) for shard in shards
                          for key in ("file", "bytes_file") if key in shard])
    self.train = StoreSplit(self.directory, self.manifest, "train", sizes)
    self.val = StoreSplit(self.directory, self.manifest, "val", sizes)
    self.val_bytes = (StoreSplit(self.directory, self.manifest, "val", sizes, token_bytes=True)
                      if "bytes" in self.manifest["splits"]["val"] else None)
    self.unigram_entropy = self.manifest["splits"]["train"]["unigram_entropy"]
    tok = self.manifest["tokenizer"]
    self.tokenizer_path = fileio.join(self.directory, tok["file"])
    self.vocab_size = tok["vocab_size"]

  def tokenizer(self) -> Tokenizer:
    """Loads the store's tokenizer, checked against the manifest."""
    tok = get_tokenizer(self.tokenizer_path, folder=None, vocab_size=0)
    if tok.fingerprint() != self.manifest["tokenizer"]["fingerprint"]:
      raise DataError(f"{self.tokenizer_path} is not the tokenizer the store {self.directory} "
                      "was made with (its fingerprint differs from the manifest's); prepare the "
                      "store again")
    return tok

  @property
  def val_text_bytes(self) -> int | None:
    """Counts the UTF-8 bytes of the held-out split's text, None where the store does not
    record them (prepared before stores did)."""
    return self.manifest["splits"]["val"].get("bytes")

  def __repr__(self) -> str:
    return f"TokenStore({self.directory!r}, train={len(self.train)}, val={len(self.val)})"


# Held-out windows of the paper configs' length (L = 2048, W = L + 1) below which prepare warns,
# and how many a larger --val_fraction should give: 64 is a run's default eval (4 batches of 16).
LONG_WINDOW, FEW_WINDOWS, EVAL_WINDOWS = 2049, 16, 64


def summary_line(manifest: dict, out: str, seconds: float) -> str:
  """Says what a store holds, as prepare's last line before its JSON: documents, text, tokens
  per split, and the held-out windows of a short and a long run."""
  splits, text = manifest["splits"], manifest["sources"]["text_bytes"]
  val = splits["val"]["tokens"]
  return (f"prepared {out}: {sum(s['docs'] for s in splits.values()):,} documents, "
          f"{text / 1e6:.1f} MB of text, {splits['train']['tokens']:,} training and {val:,} "
          f"held-out tokens ({val // 129:,} windows of 129 tokens, {val // LONG_WINDOW:,} of "
          f"{LONG_WINDOW:,}), in {seconds:.1f} s")


def held_out_warning(val_tokens: int, val_fraction: float) -> str:
  """Says when the held-out split is too small to evaluate a run of the paper's length, with
  the --val_fraction that would hold out about EVAL_WINDOWS of its windows; '' otherwise."""
  windows = val_tokens // LONG_WINDOW
  if windows >= FEW_WINDOWS:
    return ""
  wanted = min(0.5, val_fraction * EVAL_WINDOWS * LONG_WINDOW / max(val_tokens, 1))
  return (f"the held-out split holds {val_tokens:,} tokens, {windows} windows of "
          f"{LONG_WINDOW:,} (L = 2048), where a run's eval reads data.eval_batches x "
          f"data.batch_size windows (64 by default): prepare again into a new --out with "
          f"--val_fraction={wanted:.2g} for about {EVAL_WINDOWS}, or evaluate with shorter "
          "windows")


def prepared_lines(out: str, seconds: float, val_fraction: float) -> list[str]:
  """Returns what prepare prints of the store it made in `out`: its summary line, a warning
  where its held-out split is small, and last the store as one JSON line."""
  manifest = read_manifest(out)
  warning = held_out_warning(manifest["splits"]["val"]["tokens"], val_fraction)
  return [summary_line(manifest, out, seconds)] + ([f"warning: {warning}"] if warning else []) + [
      json.dumps(dict(out=out, fingerprint=manifest["fingerprint"], dtype=manifest["dtype"],
                      **{f"{s}_tokens": manifest["splits"][s]["tokens"] for s in SPLITS},
                      skipped_files=len(manifest["sources"].get("skipped", []))))]
