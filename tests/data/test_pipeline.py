"""Tests for tst_jax.data: sources, tokenizers, the token stream and its shuffled windows."""

import collections
import math
import os
import sysconfig

import numpy as np
import pytest

from tests.fixtures.reference import TokenStream
from tst_jax.data import (
    WindowSource, eval_windows, get_tokenizer, load_documents, make_batches,
    split_documents, unigram_entropy)
from tst_jax.data import pipeline
from tst_jax.data.sources import pieces

CORPUS = [
    "def add(a, b):\n  return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import numpy as np\nx = np.zeros((3, 4))\nprint(x.shape)\n",
    "Grüße aus Köln — ünïcödé ✓ and 日本語のテキスト 😀\n",
    "for i in range(10):\n    print(i * i)\n" * 2,
    "class Foo:\n  def __init__(self):\n    self.x = 1\n",
] * 4


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("bpe"))
  get_tokenizer("bpe", workdir=workdir, vocab_size=300, train_docs=CORPUS)
  return workdir


@pytest.fixture(scope="module")
def tok(bpe_dir):
  return get_tokenizer("bpe", workdir=bpe_dir, vocab_size=300, train_docs=None)


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


# --- sources ---------------------------------------------------------------------------------


def stdlib_py_files():
  root = sysconfig.get_paths()["stdlib"]
  found = []
  for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x not in ("site-packages", "dist-packages")]
    found += [os.path.join(d, f) for f in files if f.endswith(".py")]
  return sorted(found)


def test_pystdlib_reads_sorted_stdlib_files_up_to_max_bytes():
  paths = stdlib_py_files()
  docs = load_documents("builtin:pystdlib", max_bytes=300_000)
  assert len(docs) > 10
  assert sum(len(d.encode()) for d in docs) <= 300_000 + 3 * len(docs)  # U+FFFD is 3 bytes.
  texts = []
  for p in paths[:len(docs) + 20]:
    with open(p, "rb") as f:
      texts.append(f.read().decode("utf-8", errors="replace"))
  texts = [t for t in texts if t.strip()]
  assert docs[:-1] == texts[:len(docs) - 1] and texts[len(docs) - 1].startswith(docs[-1])
  assert len(paths) > 500 and "os.py" in {os.path.basename(p) for p in paths}


def test_text_glob_recursive_sorted_replaces_bad_bytes_and_skips_blank(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "b.txt").write_text("second")
  (tmp_path / "a.txt").write_bytes(b"first \xff\xfe end")
  (tmp_path / "sub" / "c.txt").write_text("third")
  (tmp_path / "blank.txt").write_text("  \n\t ")
  docs = load_documents(f"text:{tmp_path}/**/*.txt")
  assert docs == ["first \ufffd\ufffd end", "second", "third"]
  assert load_documents(f"text:{tmp_path}/**/*.txt", max_bytes=7) == ["first \ufffd"]


def test_source_errors(tmp_path):
  with pytest.raises(ValueError, match="unknown data.source"):
    load_documents("hf:wikitext")
  with pytest.raises(ValueError, match="matched no files"):
    load_documents(f"text:{tmp_path}/*.nothing")
  (tmp_path / "blank.txt").write_text("   \n")
  with pytest.raises(ValueError, match="empty corpus"):
    load_documents(f"text:{tmp_path}/*.txt")


def test_tfds_missing_extra_is_a_clear_error():
  try:
    import tensorflow_datasets  # noqa: F401
    pytest.skip("tensorflow_datasets is installed")
  except ImportError:
    pass
  with pytest.raises(ValueError, match=r"tst-jax\[tfds\]"):
    load_documents("tfds:lm1b")


def test_split_is_deterministic_disjoint_and_complete():
  docs = [f"document number {i}\n" for i in range(200)]
  train, val = split_documents(docs, 0.1, seed=3)
  assert (train, val) == split_documents(docs, 0.1, seed=3)
  assert set(train).isdisjoint(val) and sorted(train + val) == sorted(docs)
  assert 5 <= len(val) <= 40
  assert split_documents(docs, 0.1, seed=4) != (train, val)
  # The decision is per document: a shuffled corpus splits the same documents off.
  train2, val2 = split_documents(docs[::-1], 0.1, seed=3)
  assert set(val2) == set(val)
  # Tiny corpora still get one document on each side.
  assert [len(x) for x in split_documents(["a", "b"], 0.01, seed=0)] == [1, 1]
  assert split_documents(docs, 0.0, seed=0) == (docs, [])
  for bad in (1.0, -0.1):
    with pytest.raises(ValueError, match="val_fraction"):
      split_documents(docs, bad, seed=0)


def test_held_out_pieces_represent_a_corpus_of_few_huge_documents():
  """Four ~100 KB documents, each on its own topic: holding out whole documents puts one
  topic in the held-out set; pieces of <= 512 bytes give it about the training split's mix
  (total variation 0.13 from sampling 65 pieces, against 1.0)."""
  rng = np.random.default_rng(0)
  docs = ["".join(" ".join(rng.choice([f"{t}{k}" for k in range(20)], 8)) + "\n"
                  for _ in range(3000)) for t in "abcd"]

  def topic_shares(texts):
    words = " ".join(texts).split()
    return np.array([sum(w[0] == t for w in words) for t in "abcd"]) / len(words)

  for piece_bytes, close in ((0, False), (512, True)):
    train, val = split_documents(docs, 0.1, seed=0, piece_bytes=piece_bytes)
    assert sorted("".join(train + val)) == sorted("".join(docs))
    distance = 0.5 * np.abs(topic_shares(train) - topic_shares(val)).sum()
    assert (distance < 0.2) == close, (piece_bytes, distance)
  assert 40 <= len(val) <= 100 and max(len(v.encode()) for v in val) <= 512
  assert split_documents(docs, 0.1, seed=0, piece_bytes=512) == (train, val)
  # A document with no held-out piece stays whole; pieces concatenate back to the document.
  assert split_documents(["x\n" * 10, "y\n" * 10], 0.5, 0, piece_bytes=1024) == (
      split_documents(["x\n" * 10, "y\n" * 10], 0.5, 0))
  assert "".join(pieces(docs[0], 1000)) == docs[0]
  # A piece repeated in 200 files (a shared table) is held out in about 10% of them.
  table = "".join(f"    {k:#06x}: LETTER {k}\n" for k in range(20))
  files = [f"# file {i:03d}\n" + "x = 1\n" * 60 + table for i in range(200)]
  assert len({pieces(f, 512)[-1] for f in files}) == 1     # the same last piece in every file
  _, val = split_documents(files, 0.1, seed=0, piece_bytes=512)
  assert 8 <= sum(v.endswith(table[-40:]) for v in val) <= 40


# --- tokenizer -------------------------------------------------------------------------------


def test_bpe_round_trips_any_text(tok):
  rng = np.random.default_rng(0)
  texts = ["", "hello world", "  leading and trailing  \n", "日本語 😀 Grüße\r\n\t",
           "<|endoftext|> is text here",
           bytes(rng.integers(0, 256, 500, dtype=np.uint8)).decode("latin1"),
           "".join(chr(c) for c in rng.integers(0x20, 0x2FFFF, 200) if not 0xD800 <= c < 0xE000)]
  for t in texts:
    ids = tok.encode(t)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == t
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
  assert tok.eos_id not in tok.encode("a <|endoftext|> b")  # documents never fake an EOS.
  assert tok.decode([tok.eos_id]) == "<|endoftext|>"
  assert tok.vocab_size == 300


def test_bpe_is_cached_and_checks_vocab(bpe_dir, tok):
  path = os.path.join(bpe_dir, "tokenizer.json")
  assert tok.path == path
  mtime = os.stat(path).st_mtime_ns
  again = get_tokenizer("bpe", workdir=bpe_dir, vocab_size=300, train_docs=["other text"] * 9)
  assert os.stat(path).st_mtime_ns == mtime
  assert again.encode("def add(a, b)") == tok.encode("def add(a, b)")
  with pytest.raises(ValueError, match="another config"):
    get_tokenizer("bpe", workdir=bpe_dir, vocab_size=512, train_docs=CORPUS)


def test_tokenizer_json_file_is_loaded_and_copied(bpe_dir, tmp_path):
  src = os.path.join(bpe_dir, "tokenizer.json")
  loaded = get_tokenizer(src, workdir=str(tmp_path / "run"), vocab_size=0)
  assert loaded.path == str(tmp_path / "run" / "tokenizer.json") and os.path.isfile(loaded.path)
  assert loaded.decode([loaded.eos_id]) == "<|endoftext|>"
  assert get_tokenizer(src, workdir=str(tmp_path / "run"), vocab_size=0).path == loaded.path
  loaded.save(str(tmp_path / "saved.json"))
  resaved = get_tokenizer(str(tmp_path / "saved.json"), workdir=None, vocab_size=0)
  assert resaved.encode("x = 1  # 😀") == loaded.encode("x = 1  # 😀")
  with pytest.raises(ValueError, match="does not exist"):
    get_tokenizer(str(tmp_path / "nope.json"), workdir=None, vocab_size=0)
  other = get_tokenizer("bpe", workdir=str(tmp_path / "other"), vocab_size=280, train_docs=CORPUS)
  with pytest.raises(ValueError, match="differs"):
    get_tokenizer(other.path, workdir=str(tmp_path / "run"), vocab_size=0)


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
