"""One token stream per split, read through Grain as overlapping windows in shuffled order.

Letters: B global batch size, W window length, the trainer's data length + 1, N stream length.

Window i of a phase starts at stream position `start_pos + i*(W-1)` modulo N, so consecutive
windows share one token and every token is a target once per pass. Batches draw the phase's
windows in a seeded shuffled order rather than document order, so batches are not correlated
over time. Yet a phase of k batches reads exactly the region from start_pos to
start_pos + k*B*(W-1). Phase 2 with W2 = L+1 starts right where phase 1 with W1 = S*L+1
stopped, at `Plan.data_start`, without skipping or repeating a token.
"""

from __future__ import annotations

import logging

import grain
import numpy as np

from tst_jax.data.store import StoreSplit

log = logging.getLogger("tst_jax")

_ENDLESS = 2**40  # Length reported to Grain when no number of batches is given.
_MAX_BLOCK = 2**20  # Windows shuffled together: bounds the permutation's memory to 8 MiB.


Stream = np.ndarray | StoreSplit  # what the readers below accept: a store split is read in place


class WindowSource:
  """Grain random-access source: item k is the int32 [B_local, W] batch k.

  Window i starts at stream position `start_pos + i*(W-1)` modulo N. Global row r of batch k
  is window perm(k*B + r). perm is a seeded shuffle of window indices within blocks of at most
  2**20 windows that cross neither the end of a pass, N // (W-1) windows, nor the end of the
  `num_batches * B` windows of the source. So the source reads exactly the region of the
  stream that the unshuffled windows would, and batch k is a pure function of stream, seed,
  start_pos and k. With `shuffle=False` row r of batch k is window k*B + r. This process's
  rows are the global rows p*B_local to (p+1)*B_local. `len()` is `num_batches`, or practically
  endless when that is None.
  """

  def __init__(self, stream: Stream, batch_size: int, window: int,
               start_pos: int = 0, *, seed: int = 0, process_index: int = 0,
               process_count: int = 1, num_batches: int | None = None, shuffle: bool = True):
    tokens = _tokens(stream)
    if window < 2:
      raise ValueError(f"window must be >= 2 (inputs + shifted targets), got {window}")
    if batch_size < 1 or start_pos < 0:
      raise ValueError(f"need batch_size >= 1 and start_pos >= 0, got {batch_size}, {start_pos}")
    if batch_size % process_count:
      raise ValueError(
          f"batch_size {batch_size} is not divisible by the number of processes {process_count}")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if num_batches is not None and num_batches < 0:
      raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    if len(tokens) < batch_size * window:
      raise ValueError(
          f"corpus too small for batch_size x window: {len(tokens)} tokens < "
          f"{batch_size} x {window} = {batch_size * window}; use more data or a smaller batch")
    self.tokens = tokens
    self.batch_size, self.window, self.start_pos = batch_size, window, start_pos
    self.seed, self.shuffle, self.num_batches = seed, shuffle, num_batches
    rows = batch_size // process_count
    self.rows = np.arange(process_index * rows, (process_index + 1) * rows)  # global rows
    self.pass_windows = len(tokens) // (window - 1)  # windows per pass, at least batch_size
    self.block = min(self.pass_windows, _MAX_BLOCK)
    self._end = _ENDLESS * batch_size if num_batches is None else num_batches * batch_size
    self._cached = (None, None)  # block id and its permutation, replaced as a whole

  def __len__(self) -> int:
    return _ENDLESS if self.num_batches is None else self.num_batches

  def __getitem__(self, k: int) -> np.ndarray:
    k = int(k)
    if not 0 <= k < len(self):
      raise IndexError(f"batch {k} out of range [0, {len(self)})")
    return self.windows(k * self.batch_size + self.rows)

  def windows(self, slots: np.ndarray) -> np.ndarray:
    """int32 [len(slots), W]: the window read at each (flattened) slot of the batches."""
    index_b = self.window_index(slots)
    starts_b = (self.start_pos + index_b * (self.window - 1)) % len(self.tokens)
    return _gather(self.tokens, starts_b, self.window)

  def window_index(self, i: np.ndarray) -> np.ndarray:
    """Returns perm(i), the window read at flattened slot i of the batches, as int64."""
    i = np.asarray(i, dtype=np.int64)
    if not self.shuffle:
      return i
    out = np.empty_like(i)
    n_pass, block = self.pass_windows, self.block
    epoch, j = np.divmod(i, n_pass)
    c = j // block  # block within the pass
    for e, cc in sorted(set(zip(epoch.tolist(), c.tolist()))):
      lo = e * n_pass + cc * block
      size = min(block, n_pass - cc * block, self._end - lo)
      at = (epoch == e) & (c == cc)
      out[at] = lo + self._permutation(e * -(-n_pass // block) + cc, size)[i[at] - lo]
    return out

  def _permutation(self, block_id: int, size: int) -> np.ndarray:
    cached_id, perm = self._cached
    if cached_id != (block_id, size):
      perm = np.random.default_rng([self.seed, block_id]).permutation(size)
      self._cached = ((block_id, size), perm)
    return perm

  def epoch_of(self, k: int) -> int:
    """Counts how often positions wrapped before the last token of batch k's windows."""
    last = self.window_index(k * self.batch_size + np.arange(self.batch_size)).max()
    return int((self.start_pos + (last + 1) * (self.window - 1)) // len(self.tokens))

  def fresh_batches(self) -> int:
    """Counts the batches from start_pos before any token repeats, where epoch_of(k) == 0."""
    n, w = len(self.tokens), self.window
    fresh = max(0, (n - w - self.start_pos) // (w - 1) + 1)  # windows that end before N
    end = min(self.pass_windows, self._end)  # fresh <= pass_windows, so only pass 0 matters
    if fresh >= end:
      first_stale = end
    elif not self.shuffle:
      first_stale = fresh
    else:  # blocks below `fresh` map onto themselves, so search the block that holds it
      lo = fresh // self.block * self.block
      stale = np.flatnonzero(self.window_index(np.arange(lo, min(lo + self.block, end))) >= fresh)
      first_stale = lo + int(stale[0])
    return first_stale // self.batch_size

  def __repr__(self) -> str:
    return (f"WindowSource(batch_size={self.batch_size}, window={self.window}, "
            f"start_pos={self.start_pos}, seed={self.seed}, shuffle={self.shuffle}, "
            f"tokens={len(self.tokens)}, rows={len(self.rows)})")


def _tokens(stream: Stream) -> np.ndarray | StoreSplit:
  """Returns the tokens of an in-memory stream or array, or a memory-mapped store split as is."""
  if isinstance(stream, StoreSplit):
    return stream
  return np.asarray(stream)


def _gather(tokens: np.ndarray | StoreSplit, starts_b: np.ndarray, window: int) -> np.ndarray:
  """Reads int32 [b, W] rows tokens[s : s + W] for each start s, wrapping around the stream."""
  if isinstance(tokens, StoreSplit):   # reads only these windows, across shards if need be
    return tokens.gather(starts_b, window)
  if (starts_b + window <= len(tokens)).all():
    return np.stack([tokens[s:s + window] for s in starts_b.tolist()])
  return tokens[(starts_b[:, None] + np.arange(window)) % len(tokens)]


def make_batches(stream: Stream, *, batch_size: int, window: int, start_pos: int,
                 seed: int = 0, num_batches: int | None = None, process_index: int = 0,
                 process_count: int = 1,
                 read_options: grain.ReadOptions | None = None) -> grain.DatasetIterator:
  """Iterates this process's int32 [batch_size // process_count, window] batches.

  Windows come in seeded shuffled order from the region of `num_batches` batches after
  `start_pos`, endless when None. `get_state()` and `set_state()` resume exactly, and batch k
  of the iterator is `WindowSource(...)[k]`.
  """
  source = WindowSource(stream, batch_size, window, start_pos, seed=seed,
                        num_batches=num_batches, process_index=process_index,
                        process_count=process_count)
  return batches_of(source, read_options)


def batches_of(source, read_options: grain.ReadOptions | None = None) -> grain.DatasetIterator:
  """Iterator over the batches of a random-access `source` (item k: batch k), resumable by
  `set_state`. By default one thread prefetches two batches."""
  read_options = read_options or grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
  return iter(grain.MapDataset.source(source).to_iter_dataset(read_options))


def eval_windows(val_stream: Stream, *, batch_size: int, window: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[np.ndarray]:
  """Returns `num_batches` int32 [B_local, W] batches of held-out windows, the same every eval.

  The windows are spread evenly over the whole validation stream, so every held-out document
  region is represented. They never overlap by more than the one shared target token. Returns
  fewer batches, with a warning, if the stream is too short for all of them.
  """
  source = WindowSource(val_stream, batch_size, window, shuffle=False,
                        process_index=process_index, process_count=process_count)
  n = min(num_batches, source.fresh_batches())
  if n < num_batches:
    log.warning("the held-out split holds %d of the %d batches of %d windows of %d tokens "
                "asked for: a larger val_fraction when preparing holds out more", n,
                num_batches, batch_size, window)
  tokens = _tokens(val_stream)
  count = n * batch_size                                # windows in all, globally
  stride = max(window - 1, (len(tokens) - window) // max(count - 1, 1))
  starts = (np.arange(count) * stride).reshape(n, batch_size)      # [n batches, B]
  rows = batch_size // process_count
  starts = starts[:, process_index * rows:(process_index + 1) * rows]
  return [_gather(tokens, row_starts, window).astype(np.int32) for row_starts in starts]


def unigram_entropy(stream: np.ndarray) -> float:
  """Returns the entropy in nats per token of the stream's token frequencies: a unigram loss."""
  tokens = np.asarray(stream)
  counts = np.bincount(tokens.ravel())
  p = counts[counts > 0] / tokens.size
  return float(-(p * np.log(p)).sum())
