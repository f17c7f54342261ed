"""tst_jax.data.tokenizer: the byte-level BPE (round trips, cached per config) and a
tokenizer.json file (loaded, copied into the workdir, refused when it differs)."""

import os

import numpy as np
import pytest

from tests.fixtures.corpus import CORPUS
from tst_jax.data import get_tokenizer
from tst_jax.data.tokenizer import token_bytes


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
  again = get_tokenizer("bpe", folder=bpe_dir, vocab_size=300, train_docs=["other text"] * 9)
  assert os.stat(path).st_mtime_ns == mtime
  assert again.encode("def add(a, b)") == tok.encode("def add(a, b)")
  with pytest.raises(ValueError, match="another config"):
    get_tokenizer("bpe", folder=bpe_dir, vocab_size=512, train_docs=CORPUS)


def test_tokenizer_json_file_is_loaded_and_copied(bpe_dir, tmp_path):
  src = os.path.join(bpe_dir, "tokenizer.json")
  loaded = get_tokenizer(src, folder=str(tmp_path / "run"), vocab_size=0)
  assert loaded.path == str(tmp_path / "run" / "tokenizer.json") and os.path.isfile(loaded.path)
  assert loaded.decode([loaded.eos_id]) == "<|endoftext|>"
  assert get_tokenizer(src, folder=str(tmp_path / "run"), vocab_size=0).path == loaded.path
  loaded.save(str(tmp_path / "saved.json"))
  resaved = get_tokenizer(str(tmp_path / "saved.json"), folder=None, vocab_size=0)
  assert resaved.encode("x = 1  # 😀") == loaded.encode("x = 1  # 😀")
  with pytest.raises(ValueError, match="does not exist"):
    get_tokenizer(str(tmp_path / "nope.json"), folder=None, vocab_size=0)
  other = get_tokenizer("bpe", folder=str(tmp_path / "other"), vocab_size=280, train_docs=CORPUS)
  with pytest.raises(ValueError, match="differs"):
    get_tokenizer(other.path, folder=str(tmp_path / "run"), vocab_size=0)


def test_a_tokenizer_and_a_workdir_in_a_bucket(bpe_dir, tok, bucket):
  """tokenizer.json read from the bucket and copied into a workdir there; a bpe trained for a
  workdir in the bucket is cached there and loaded back; a different file there is refused."""
  from tst_jax import fileio   # pylint: disable=import-outside-toplevel
  with open(os.path.join(bpe_dir, "tokenizer.json"), "rb") as f:
    fileio.write_bytes(f"{bucket}/tok/tokenizer.json", f.read())
  loaded = get_tokenizer(f"{bucket}/tok/tokenizer.json", folder=f"{bucket}/run", vocab_size=0)
  assert loaded.path == f"{bucket}/run/tokenizer.json" and loaded.fingerprint() == tok.fingerprint()
  assert fileio.read_bytes(loaded.path) == fileio.read_bytes(f"{bucket}/tok/tokenizer.json")
  trained = get_tokenizer("bpe", folder=f"{bucket}/bpe", vocab_size=280, train_docs=CORPUS)
  again = get_tokenizer("bpe", folder=f"{bucket}/bpe", vocab_size=280, train_docs=None)
  assert again.fingerprint() == trained.fingerprint() and again.path == f"{bucket}/bpe/tokenizer.json"
  with pytest.raises(ValueError, match="differs"):
    get_tokenizer(trained.path, folder=f"{bucket}/run", vocab_size=0)


def test_encode_with_bytes_gives_each_token_the_bytes_of_text_under_it(tok):
  """The ids of `encode`, and under each token the UTF-8 bytes of its text, which sum to the
  text's: a token of whole characters holds exactly its own, and a character cut into several
  byte-level tokens counts under the last of them (their offsets go back)."""
  texts = CORPUS[:6] + ["ü😀x", "  \n\t"]
  for text, (ids, under) in zip(texts, tok.encode_with_bytes(texts), strict=True):
    assert ids == tok.encode(text) and under.dtype == np.uint32
    assert under.sum() == len(text.encode("utf-8"))
    for token, n in zip(ids, under):
      piece = tok.decode([token])
      if "\ufffd" not in piece:
        assert n == len(piece.encode("utf-8"))
  assert token_bytes(np.array([0, 3, 3, 1, 7]), 9).tolist() == [3, 0, 0, 4, 2]
  assert token_bytes(np.array([2, 5]), 5).tolist() == [5, 0]
  assert token_bytes(np.zeros(0, np.int64), 4).tolist() == []
