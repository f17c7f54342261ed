"""tst_jax.data.pipeline: the token stream (the tests' in-memory reference of a store's split),
its shuffled windows, batches, process slices and eval windows."""

import collections
import math

import numpy as np
import pytest

from tests.fixtures.corpus import CORPUS
from tests.fixtures.reference import TokenStream
from tst_jax.data import WindowSource, eval_windows, make_batches, unigram_entropy
from tst_jax.data import pipeline


def slow_window(tokens, pos, window):
  """tokens[pos : pos + window], wrapping around the stream, as a plain list."""
  return [int(tokens[(pos + t) % len(tokens)]) for t in range(window)]


def slow_perm(i, pass_windows, end, seed, max_block=2**20):
  """The window read at slot i: a seeded permutation within blocks of a pass (and of `end`)."""
  block = min(pass_windows, max_block)
  epoch, j = divmod(i, pass_windows)
  lo = epoch * pass_windows + j // block * block
  size = min(block, (epoch + 1) * pass_windows - lo, end - lo)
  block_id = epoch * -(-pass_windows // block) + j // block
  order = np.random.default_rng([seed, block_id]).permutation(size).tolist()
  return lo + order[i - lo]


# --- token stream ----------------------------------------------------------------------------


def test_token_stream_holds_every_document_once(tok):
  docs = CORPUS[:6]
  stream = TokenStream.build(docs, tok, seed=1)
  assert stream.tokens.dtype == np.int32 and len(stream) == len(stream.tokens)
  # Split at EOS: the pieces are exactly the documents' encodings, in some order.
  cuts = np.flatnonzero(stream.tokens == tok.eos_id)
  assert cuts[-1] == len(stream) - 1 and len(cuts) == len(docs)
  pieces = [p.tolist() for p in np.split(stream.tokens, cuts + 1)[:-1]]
  assert sorted(p[:-1] for p in pieces) == sorted(tok.encode(d) for d in docs)
  reseeded = TokenStream.build(docs, tok, seed=2)
  assert sorted(reseeded.tokens.tolist()) == sorted(stream.tokens.tolist())
  assert not np.array_equal(reseeded.tokens, stream.tokens)


def test_unigram_entropy_matches_direct_count():
  tokens = np.random.default_rng(0).zipf(1.5, 5000).astype(np.int32) % 97
  counts = collections.Counter(tokens.tolist())
  expected = -sum(c / 5000 * math.log(c / 5000) for c in counts.values())
  assert unigram_entropy(tokens) == pytest.approx(expected, rel=1e-12)
  assert unigram_entropy(np.zeros(10, np.int32)) == 0.0


# --- windows ---------------------------------------------------------------------------------

TOKENS = np.random.default_rng(0).integers(0, 1000, 1003).astype(np.int32)
POSITIONS = np.arange(1003, dtype=np.int32)  # token = its position: a row names its window


def window_starts(batches, start_pos, window, n=1003):
  """Window indices i (start = start_pos + i*(W-1)) of the rows of POSITIONS batches, in order."""
  return [((int(row[0]) - start_pos) % n) // (window - 1) for b in batches for row in b]


@pytest.mark.parametrize("max_block,num_batches", [(2**20, None), (8, None), (8, 5), (8, 12)])
def test_windows_match_slow_reference(monkeypatch, max_block, num_batches):
  monkeypatch.setattr(pipeline, "_MAX_BLOCK", max_block)
  src = WindowSource(TOKENS, 4, 33, start_pos=5, seed=7, num_batches=num_batches)
  end = math.inf if num_batches is None else 4 * num_batches
  for k in ([0, 1, 2, 6, 7, 8, 20] if num_batches is None else range(num_batches)):  # k > 7: pass 2
    window_BxW = src[k]
    assert window_BxW.dtype == np.int32 and window_BxW.shape == (4, 33)
    expected = [slow_window(TOKENS, 5 + slow_perm(4 * k + r, 1003 // 32, end, 7, max_block) * 32,
                            33) for r in range(4)]
    np.testing.assert_array_equal(window_BxW, expected)


@pytest.mark.parametrize("start_pos", [0, 100, 2000])
@pytest.mark.parametrize("max_block", [2**20, 8])
def test_one_pass_reads_every_window_once(monkeypatch, start_pos, max_block):
  monkeypatch.setattr(pipeline, "_MAX_BLOCK", max_block)
  src = WindowSource(POSITIONS, 4, 33, start_pos=start_pos, seed=3)
  fresh = src.fresh_batches()
  seen = window_starts([src[k] for k in range(fresh)], start_pos, 33)
  assert len(set(seen)) == len(seen) == 4 * fresh
  assert all(src.epoch_of(k) == 0 for k in range(fresh)) and src.epoch_of(fresh) >= 1
  pass_windows = 1003 // 32
  slots = window_starts([src[k] for k in range(pass_windows // 4 + 1)], start_pos, 33)
  assert sorted(slots[:pass_windows]) == list(range(pass_windows))
  # Fresh windows are exactly those that end before the stream does.
  fresh_windows = [i for i in range(pass_windows) if start_pos + i * 32 + 33 <= 1003]
  assert set(seen) <= set(fresh_windows) and fresh <= len(fresh_windows) // 4
  if start_pos == 0:
    assert fresh == pass_windows // 4 == 7
  if start_pos == 2000:
    assert fresh == 0 and src.epoch_of(0) == 2


def test_batches_are_shuffled_and_seeded():
  a, b = (WindowSource(POSITIONS, 4, 33, seed=s) for s in (0, 1))
  order_a = window_starts([a[k] for k in range(7)], 0, 33)
  order_b = window_starts([b[k] for k in range(7)], 0, 33)
  assert order_a != order_b and order_a != sorted(order_a)
  np.testing.assert_array_equal(WindowSource(POSITIONS, 4, 33, seed=0)[3], a[3])


def test_phase_switch_reads_disjoint_regions_that_tile_the_stream():
  """k1 batches of W1, then k2 of W2 from where the first stopped (k1·B·(W1-1), as
  Plan.data_start): the targets tile the stream prefix."""
  b, k1, w1, k2, w2 = 4, 3, 17, 9, 9
  phase1 = WindowSource(POSITIONS, b, w1, seed=5, num_batches=k1)
  start2 = k1 * b * (w1 - 1)
  phase2 = WindowSource(POSITIONS, b, w2, start2, seed=5, num_batches=k2)
  rows1 = sorted((r.tolist() for k in range(k1) for r in phase1[k]), key=lambda r: r[0])
  rows2 = sorted((r.tolist() for k in range(k2) for r in phase2[k]), key=lambda r: r[0])
  assert rows1[-1][-1] == start2 == rows2[0][0]  # phase 2 starts on phase 1's last token
  targets = [t for r in rows1 + rows2 for t in r[1:]]
  total = k1 * b * (w1 - 1) + k2 * b * (w2 - 1)
  assert targets == list(range(1, total + 1))
  assert [phase1.epoch_of(k) for k in range(k1)] == [0] * k1 and phase1.fresh_batches() == k1


def test_process_slices_concatenate_to_the_global_batch():
  full = WindowSource(TOKENS, 4, 20, start_pos=3, seed=2)
  for count in (2, 4):
    for k in range(3):
      parts = [WindowSource(TOKENS, 4, 20, 3, seed=2, process_index=i, process_count=count)[k]
               for i in range(count)]
      np.testing.assert_array_equal(np.concatenate(parts), full[k])
  with pytest.raises(ValueError, match="not divisible"):
    make_batches(TOKENS, batch_size=4, window=20, start_pos=0, process_count=3)


def test_iterator_matches_source_and_resumes_exactly():
  src = WindowSource(TOKENS, 4, 40, start_pos=11, seed=9)
  it = make_batches(TOKENS, batch_size=4, window=40, start_pos=11, seed=9)
  first = [next(it) for _ in range(3)]
  state = it.get_state()
  rest = [next(it) for _ in range(8)]  # runs past the end of the pass (25 windows).
  for k, b in enumerate(first + rest):
    np.testing.assert_array_equal(b, src[k])
  fresh = make_batches(TOKENS, batch_size=4, window=40, start_pos=11, seed=9)
  fresh.set_state(state)
  for b in rest:
    np.testing.assert_array_equal(next(fresh), b)
  assert len(list(make_batches(TOKENS, batch_size=4, window=40, start_pos=11,
                               num_batches=5))) == 5


def test_eval_windows_spread_over_the_stream_fixed_and_never_repeat_tokens():
  a = eval_windows(TOKENS, batch_size=4, window=50, num_batches=100)
  b = eval_windows(TOKENS, batch_size=4, window=50, num_batches=100)
  assert len(a) == 5  # (1003 - 50) // 49 + 1 = 20 windows fit without wrapping.
  starts = []
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
    for row in x:                              # locate each window in the stream
      hits = [p for p in range(len(TOKENS) - 49) if np.array_equal(TOKENS[p:p + 50], row)]
      starts.append(hits[0])
  assert np.all(np.diff(starts) >= 49)         # at most the one shared target token
  assert starts[0] == 0 and starts[-1] >= len(TOKENS) - 50 - 49   # the whole stream
  few = eval_windows(TOKENS, batch_size=4, window=50, num_batches=2)
  assert np.diff([p for p in range(len(TOKENS) - 49)
                  if any(np.array_equal(TOKENS[p:p + 50], r) for r in few[1])]).min() > 49
  half = eval_windows(TOKENS, batch_size=4, window=50, num_batches=2, process_index=1,
                      process_count=2)
  np.testing.assert_array_equal(half[1], few[1][2:])


def test_corpus_too_small_is_a_clear_error():
  with pytest.raises(ValueError, match=r"corpus too small for batch_size x window: 1003 tokens"):
    WindowSource(TOKENS, 8, 126)
