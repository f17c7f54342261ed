"""One token stream per split, cut into B lanes read as overlapping windows through Grain.

Letters: B global batch size (= number of lanes), P lane length in tokens, W window length
(the trainer's data length + 1), N stream length.

Row b of every batch reads lane b, a contiguous 1/B of the shuffled stream (Transformer-XL
style batching). Window k starts at lane position `start_pos + k*(W-1)`, so consecutive windows
share exactly one token and every token is a target once. Because the position is shared by
all rows and windows of different lengths read the same lanes, phase 1 (W1 = S*L+1) can hand
over to phase 2 (W2 = L+1) at `lane_position(start_pos, steps, W1)` without skipping or
repeating a token. Positions wrap modulo P (a new epoch over the same lanes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
from collections.abc import Sequence

import grain
import numpy as np
from absl import logging

from tst_jax.data.tokenizer import Tokenizer

_ENDLESS = 2**40  # Length reported to Grain when no number of batches is given.
_ENCODE_CHUNK_CHARS = 4_000_000  # Text per encode_batch call: bounds the memory of its results.


@dataclasses.dataclass(frozen=True, eq=False)
class TokenStream:
  """All documents of a split, each followed by EOS, concatenated in a seeded order."""

  tokens: np.ndarray  # (N,) int32
  num_docs: int
  vocab_size: int

  def __len__(self) -> int:
    return len(self.tokens)

  @classmethod
  def build(cls, docs: Sequence[str], tokenizer: Tokenizer, seed: int,
            cache_path: str | None = None) -> TokenStream:
    """Tokenizes `docs` (shuffled by `seed`) into one stream, reusing `cache_path` if it matches.

    The cache is `cache_path` (.npy) plus `<name>.meta.json` next to it; it is reused only
    when the fingerprint of (docs, seed, tokenizer) matches, and rebuilt otherwise.
    """
    if not docs:
      raise ValueError("TokenStream.build got no documents")
    if cache_path is not None:
      if not cache_path.endswith(".npy"):
        cache_path += ".npy"
      meta_path = cache_path[:-len(".npy")] + ".meta.json"
      fingerprint = _fingerprint(docs, seed, tokenizer)
      stream = _load_cache(cache_path, meta_path, fingerprint)
      if stream is not None:
        return stream

    order = np.random.default_rng(seed).permutation(len(docs))
    chunks, batch, batch_chars = [], [], 0
    for n, i in enumerate(order):
      batch.append(docs[i])
      batch_chars += len(docs[i])
      if batch_chars >= _ENCODE_CHUNK_CHARS or n == len(order) - 1:
        ids = tokenizer.encode_batch(batch)
        flat = itertools.chain.from_iterable(x + [tokenizer.eos_id] for x in ids)
        chunks.append(np.fromiter(flat, dtype=np.int32))
        batch, batch_chars = [], 0
    stream = cls(np.concatenate(chunks), len(docs), tokenizer.vocab_size)

    if cache_path is not None:
      os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
      tmp = cache_path[:-len(".npy")] + ".tmp.npy"
      np.save(tmp, stream.tokens)
      os.replace(tmp, cache_path)
      meta = {"num_docs": stream.num_docs, "num_tokens": len(stream), "seed": seed,
              "vocab_size": stream.vocab_size, "fingerprint": fingerprint}
      with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
      os.replace(meta_path + ".tmp", meta_path)
    return stream


def _fingerprint(docs: Sequence[str], seed: int, tokenizer: Tokenizer) -> str:
  h = hashlib.sha256(f"seed={seed};docs={len(docs)};tok={tokenizer.fingerprint()}".encode())
  for d in docs:
    b = d.encode("utf-8", errors="surrogatepass")
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def _load_cache(cache_path: str, meta_path: str, fingerprint: str) -> TokenStream | None:
  if not (os.path.isfile(cache_path) and os.path.isfile(meta_path)):
    return None
  with open(meta_path) as f:
    meta = json.load(f)
  if meta.get("fingerprint") != fingerprint:
    logging.info("Token cache %s is for other documents or tokenizer; rebuilding.", cache_path)
    return None
  tokens = np.load(cache_path)
  if tokens.dtype != np.int32 or tokens.shape != (meta["num_tokens"],):
    logging.warning("Token cache %s is damaged; rebuilding.", cache_path)
    return None
  return TokenStream(tokens, meta["num_docs"], meta["vocab_size"])


def lane_position(start_pos: int, steps: int, window: int) -> int:
  """Lane position after reading `steps` windows of length `window` from `start_pos`."""
  return start_pos + steps * (window - 1)


class WindowSource:
  """Grain random-access source: item k is the int32 [B_local, W] batch of window k.

  Row b is lane b (of this process's rows) at positions [p, p + W) with
  p = start_pos + k*(W-1), modulo the lane length P. `len()` is `num_batches`, or
  practically endless when that is None.
  """

  def __init__(self, stream: TokenStream | np.ndarray, batch_size: int, window: int,
               start_pos: int = 0, *, process_index: int = 0, process_count: int = 1,
               num_batches: int | None = None):
    tokens = stream.tokens if isinstance(stream, TokenStream) else np.asarray(stream)
    if window < 2:
      raise ValueError(f"window must be >= 2 (inputs + shifted targets), got {window}")
    if batch_size < 1 or start_pos < 0:
      raise ValueError(f"need batch_size >= 1 and start_pos >= 0, got {batch_size}, {start_pos}")
    if batch_size % process_count:
      raise ValueError(
          f"batch_size {batch_size} is not divisible by the number of processes {process_count}")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    lane_len = len(tokens) // batch_size
    if lane_len < window:
      raise ValueError(
          f"corpus too small for batch_size x window: {len(tokens)} tokens < "
          f"{batch_size} x {window} = {batch_size * window}; use more data or a smaller batch")
    rows = batch_size // process_count
    lanes_BxP = tokens[:batch_size * lane_len].reshape(batch_size, lane_len)
    self.lanes_bxP = lanes_BxP[process_index * rows:(process_index + 1) * rows]  # a view
    self.batch_size, self.window, self.start_pos = batch_size, window, start_pos
    self.lane_len = lane_len
    self.num_batches = num_batches

  def __len__(self) -> int:
    return _ENDLESS if self.num_batches is None else self.num_batches

  def __getitem__(self, k: int) -> np.ndarray:
    k = int(k)
    if not 0 <= k < len(self):
      raise IndexError(f"window {k} out of range [0, {len(self)})")
    w, p = self.window, lane_position(self.start_pos, k, self.window) % self.lane_len
    if p + w <= self.lane_len:
      return np.array(self.lanes_bxP[:, p:p + w])
    return self.lanes_bxP[:, (p + np.arange(w)) % self.lane_len]

  def epoch_of(self, k: int) -> int:
    """How many times the lanes wrapped before the last token of window k (0: all fresh)."""
    return (lane_position(self.start_pos, k, self.window) + self.window - 1) // self.lane_len

  def fresh_batches(self) -> int:
    """Number of windows from start_pos before any token repeats (epoch_of(k) == 0)."""
    return max(0, (self.lane_len - self.window - self.start_pos) // (self.window - 1) + 1)

  def __repr__(self) -> str:
    return (f"WindowSource(batch_size={self.batch_size}, window={self.window}, "
            f"start_pos={self.start_pos}, lane_len={self.lane_len}, rows={len(self.lanes_bxP)})")


def make_batches(stream: TokenStream, *, batch_size: int, window: int, start_pos: int,
                 process_index: int = 0, process_count: int = 1,
                 read_options: grain.ReadOptions | None = None) -> grain.DatasetIterator:
  """Endless iterator of this process's int32 [batch_size // process_count, window] batches.

  Lane order, no shuffling. `get_state()` / `set_state()` resume exactly; equivalently, batch
  k of the iterator is `WindowSource(...)[k]`. By default one thread prefetches two batches.
  """
  source = WindowSource(stream, batch_size, window, start_pos,
                        process_index=process_index, process_count=process_count)
  read_options = read_options or grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
  return iter(grain.MapDataset.source(source).to_iter_dataset(read_options))


def eval_windows(val_stream: TokenStream, *, batch_size: int, window: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[np.ndarray]:
  """The first `num_batches` int32 [B_local, W] windows of the held-out stream, the same every eval.

  Never repeats a token: returns fewer batches (with a warning) if the stream runs out.
  """
  source = WindowSource(val_stream, batch_size, window,
                        process_index=process_index, process_count=process_count)
  n = min(num_batches, source.fresh_batches())
  if n < num_batches:
    logging.warning("Validation stream has only %d windows of %d x %d tokens (asked for %d).",
                    n, batch_size, window, num_batches)
  return [source[k] for k in range(n)]


def unigram_entropy(stream: TokenStream | np.ndarray) -> float:
  """Entropy (nats/token) of the stream's token frequencies: the loss of a unigram model."""
  tokens = stream.tokens if isinstance(stream, TokenStream) else np.asarray(stream)
  counts = np.bincount(tokens.ravel())
  p = counts[counts > 0] / tokens.size
  return float(-(p * np.log(p)).sum())
