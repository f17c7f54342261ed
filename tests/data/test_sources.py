"""tst_jax.data.sources: the corpus sources (the stdlib, text globs, tfds), and the seeded
train/held-out split, by whole documents or by pieces of them."""

import importlib
import json
import os
import pickle
import sys
import sysconfig

import numpy as np
import pytest
import zstandard

from tests.fixtures.corpus import CORPUS, bad_files
from tst_jax.data import load_documents, sources, split_documents
from tst_jax.data.sources import BadFile, pieces


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


def test_tfds_missing_extra_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)   # installed or not: missing
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


def _store_under(monkeypatch, scheme: str, files: dict[str, bytes]):
  """Registers fsspec's memory store under `scheme`, holding `files`, in place of the real
  client: the Hub or S3 read without network or the package."""
  from fsspec.implementations.memory import MemoryFileSystem   # pylint: disable=import-outside-toplevel

  class Fake(MemoryFileSystem):
    protocol = (scheme,)
    store, pseudo_dirs = {}, [""]

    @classmethod
    def _strip_protocol(cls, path):
      return super()._strip_protocol(str(path).removeprefix(f"{scheme}://"))

  registry = importlib.import_module("fsspec.registry")      # fsspec.registry is a read-only view
  monkeypatch.setitem(registry._registry, scheme, Fake)     # pylint: disable=protected-access
  fs = Fake(skip_instance_cache=True)
  for path, data in files.items():
    fs.pipe_file(path, data)
  return Fake


@pytest.mark.parametrize("scheme", ["hf", "s3"])
def test_hub_and_s3_globs_go_through_fsspec_by_their_scheme(monkeypatch, scheme):
  """jsonl:hf://... and jsonl:s3://... list and read through the filesystem fsspec names for
  the scheme (for hf://, huggingface_hub's HfFileSystem), here replaced by a memory store: what
  is tested is the dispatch and the reading, not the Hub or S3."""
  import fsspec   # pylint: disable=import-outside-toplevel
  if scheme == "hf":
    assert fsspec.get_filesystem_class("hf").__name__ == "HfFileSystem"   # imports, no network
  body = "".join(json.dumps({"text": d}) + "\n" for d in CORPUS).encode()
  root = "datasets/org/corpus/data" if scheme == "hf" else "bucket/data"
  first = body.split(b"\n")[0] + b"\n"
  _store_under(monkeypatch, scheme, {f"{root}/b.jsonl": body, f"{root}/sub/a.jsonl": first,
                                     f"{root}/notes.txt": b"x"})
  docs = load_documents(f"jsonl:{scheme}://{root}/**/*.jsonl")
  assert docs == CORPUS + CORPUS[:1]


def test_a_bucket_or_store_that_cannot_be_read_is_one_line(bucket, monkeypatch):
  from tst_jax import fileio   # pylint: disable=import-outside-toplevel
  with pytest.raises(fileio.PathError, match=f"^data.source {bucket}/nope/\\*.jsonl: "
                     f"{bucket}/nope does not exist$"):
    load_documents(f"jsonl:{bucket}/nope/*.jsonl")
  with pytest.raises(fileio.PathError, match="there is no bucket gs://tst-no-such-bucket"):
    load_documents("parquet:gs://tst-no-such-bucket/x/*.parquet")
  monkeypatch.setattr(fileio, "glob_files", lambda p: (_ for _ in ()).throw(
      PermissionError("Forbidden")))
  with pytest.raises(fileio.PathError, match="cannot be listed: permission denied"):
    load_documents(f"jsonl:{bucket}/x/*.jsonl")


def test_a_glob_that_matches_nothing_here_bounds_no_tokens(tmp_path):
  """A plan made where the data is not (a launcher's machine) counts the tokens as unknown,
  not as zero, which its passes would divide by."""
  assert sources.token_bound(f"jsonl:{tmp_path}/none/*.jsonl") is None
  (tmp_path / "a.jsonl").write_text('{"text": "four"}\n')
  assert sources.token_bound(f"jsonl:{tmp_path}/*.jsonl") == 17 + 2
