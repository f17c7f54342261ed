"""Tests for the prepared token store: prepare (sources, shards, resume) and the in-place reader."""

import gzip
import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests.fixtures.corpus import bad_files, prepared_before_bytes
from tests.fixtures.reference import TokenStream
from tests.fixtures.tiny import tiny_config
from tst_jax import errors, fileio
from tst_jax.data import (
    DataError, TokenStore, WindowSource, eval_windows, load_documents, make_batches,
    split_documents)
from tst_jax.data import output_shards, prepare as prepare_lib
from tst_jax.data import store as store_lib
from tst_jax.data import run_data, section
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax.data.sources import BadFile
from tst_jax.errors import ConfigError

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega def return import class for while if else").split()


def make_docs(n, seed=0):
  """n documents of a few dozen words each, all different."""
  rng = np.random.default_rng(seed)
  return [f"doc {i}: " + " ".join(rng.choice(WORDS, rng.integers(5, 60))) + "\n"
          for i in range(n)]


def write_text_files(folder, docs):
  os.makedirs(folder, exist_ok=True)
  for i, d in enumerate(docs):
    with open(os.path.join(folder, f"{i:04d}.txt"), "w", encoding="utf-8") as f:
      f.write(d)
  return f"text:{folder}/*.txt"


def write_jsonl(folder, docs, parts=3, field="text"):
  """docs in `parts` files: plain .jsonl, .jsonl.gz and .jsonl.zst, in that (sorted) order."""
  import zstandard  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  names = ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"]
  for k, chunk in enumerate(np.array_split(np.arange(len(docs)), parts)):
    body = "".join(json.dumps({field: docs[i], "id": int(i)}) + "\n" for i in chunk).encode()
    path = os.path.join(folder, names[k % 3].replace(".", f"{k}.", 1))
    if path.endswith(".gz"):
      body = gzip.compress(body)
    elif path.endswith(".zst"):
      body = zstandard.ZstdCompressor().compress(body)
    with open(path, "wb") as f:
      f.write(body)
  return f"jsonl:{folder}/*.jsonl*"


def prepare(source, out, **kw):
  kw = dict(vocab_size=300, seed=1, val_fraction=0.1, workers=1, progress=False) | kw
  return TokenStore(prepare_lib.prepare(source, str(out), **kw))


def shard_bytes(directory):
  return {f: open(os.path.join(directory, f), "rb").read() for f in sorted(os.listdir(directory))
          if f.endswith(".bin")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  docs = make_docs(120)
  return docs, write_text_files(str(root / "txt"), docs), root


@pytest.fixture(scope="module")
def one_shard(corpus, tmp_path_factory):
  _, source, _ = corpus
  return prepare(source, tmp_path_factory.mktemp("store") / "s")


def in_ram(source, store, seed=1, val_fraction=0.1):
  """Today's in-memory streams of the same corpus, with the store's tokenizer."""
  train, val = split_documents(load_documents(source), val_fraction, seed)
  tok = store.tokenizer()
  return TokenStream.build(train, tok, seed), TokenStream.build(val, tok, seed)


# --- what prepare writes ---------------------------------------------------------------------


def test_store_equals_the_in_ram_stream(corpus, one_shard):
  _, source, _ = corpus
  train, val = in_ram(source, one_shard)
  assert one_shard.manifest["dtype"] == "uint16" and len(one_shard.train.files) == 1
  assert np.array_equal(one_shard.train.read(0, len(one_shard.train)), train.tokens)
  assert np.array_equal(one_shard.val.read(0, len(one_shard.val)), val.tokens)
  m = one_shard.manifest
  assert m["splits"]["train"]["tokens"] == len(train) and m["splits"]["val"]["docs"] == val.num_docs
  assert m["tokenizer"]["vocab_size"] == 300 and m["seed"] == 1
  counts = np.bincount(train.tokens)
  p = counts[counts > 0] / len(train)
  assert one_shard.unigram_entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)


def test_the_held_out_split_records_the_bytes_of_text_under_each_token(corpus, one_shard,
                                                                        tmp_path):
  """Each held-out token carries the UTF-8 bytes of text under it, EOS none: for this ASCII
  corpus and a byte-level BPE, the length of its text. The manifest's total is the held-out
  documents' bytes; the training split records none. A store as a prepare before bytes were
  recorded left it reads the same tokens, its bytes unknown."""
  _, source, _ = corpus
  tok = one_shard.tokenizer()
  tokens = one_shard.val.read(0, len(one_shard.val))
  under = one_shard.val_bytes.read(0, len(one_shard.val))
  assert under.tolist() == [0 if t == tok.eos_id else len(tok.decode([t]).encode())
                            for t in tokens.tolist()]
  _, val_docs = split_documents(load_documents(source), 0.1, 1)
  assert one_shard.val_text_bytes == sum(len(d.encode()) for d in val_docs) == under.sum()
  assert "bytes" not in one_shard.manifest["splits"]["train"]
  old = TokenStore(prepared_before_bytes(one_shard.directory, str(tmp_path / "old")))
  assert old.val_bytes is None and old.val_text_bytes is None
  assert np.array_equal(old.val.read(0, len(old.val)), tokens)


def test_a_held_out_document_moved_there_by_the_plan_has_its_bytes(tmp_path):
  """With no document's hash below val_fraction, the one of the least hash moves to the
  held-out split (output_shards.plan): pass 1 counted the bytes under its tokens too, in
  whichever of the three input shards it is."""
  docs = make_docs(30, seed=4)
  source = write_jsonl(str(tmp_path / "src"), docs)
  store = prepare(source, tmp_path / "s", val_fraction=1e-9)
  _, val = split_documents(load_documents(source), 1e-9, 1)
  assert len(val) == 1 and store.val.num_docs == 1
  assert store.val_text_bytes == len(val[0].encode()) == store.val_bytes.read(
      0, len(store.val)).sum()


def test_first_batches_and_eval_windows_are_identical_either_way(corpus, one_shard):
  _, source, _ = corpus
  train, val = in_ram(source, one_shard)
  kw = dict(batch_size=4, window=9, start_pos=5, seed=3, num_batches=40)
  a, b = make_batches(train, **kw), make_batches(one_shard.train, **kw)
  for _ in range(40):
    x, y = next(a), next(b)
    assert x.dtype == y.dtype == np.int32 and np.array_equal(x, y)
  ev = dict(batch_size=4, window=9, num_batches=3)
  for x, y in zip(eval_windows(val, **ev), eval_windows(one_shard.val, **ev), strict=True):
    assert np.array_equal(x, y)


def test_windows_across_shard_boundaries(corpus, tmp_path):
  docs, source, _ = corpus
  store = prepare(source, tmp_path / "s", shard_tokens=97)
  assert len(store.train.files) > 5
  whole = np.concatenate([np.fromfile(f, np.uint16) for f in store.train.files]).astype(np.int32)
  assert len(whole) == len(store.train)
  n = len(whole)
  for start in [0, 96, 97, 98, 500, n - 3, n - 1, n, 2 * n + 7]:
    expected = whole[(start + np.arange(150)) % n]
    assert np.array_equal(store.train.read(start, 150), expected)
  # Documents are all there once, each followed by EOS, whatever the sharding.
  tok = store.tokenizer()
  pieces = np.split(whole, np.flatnonzero(whole == tok.eos_id) + 1)[:-1]
  ram_train, _ = in_ram(source, store)
  ram_pieces = np.split(ram_train.tokens, np.flatnonzero(ram_train.tokens == tok.eos_id) + 1)[:-1]
  assert sorted(p.tolist() for p in pieces) == sorted(p.tolist() for p in ram_pieces)
  src_store, src_ram = WindowSource(store.train, 4, 33, 11, seed=2), WindowSource(whole, 4, 33, 11,
                                                                                seed=2)
  for k in range(30):
    assert np.array_equal(src_store[k], src_ram[k])


def test_two_processes_rows_concatenate_to_the_global_batch(corpus, tmp_path):
  _, source, _ = corpus
  store = prepare(source, tmp_path / "s", shard_tokens=120)
  kw = dict(batch_size=6, window=17, start_pos=3, seed=4, num_batches=20)
  whole = make_batches(store.train, **kw)
  p0 = make_batches(store.train, process_index=0, process_count=2, **kw)
  p1 = make_batches(store.train, process_index=1, process_count=2, **kw)
  for _ in range(20):
    assert np.array_equal(np.concatenate([next(p0), next(p1)]), next(whole))
  ev = dict(batch_size=6, window=17, num_batches=2)
  halves = [eval_windows(store.val, process_index=i, process_count=2, **ev) for i in (0, 1)]
  for a, b, g in zip(*halves, eval_windows(store.val, **ev), strict=True):
    assert np.array_equal(np.concatenate([a, b]), g)


def test_jsonl_gz_zst_and_parquet_give_the_text_files_documents(corpus, tmp_path):
  docs, source, _ = corpus
  expected = load_documents(source)
  jsonl = write_jsonl(str(tmp_path / "j"), docs)
  assert load_documents(jsonl) == expected
  pq = pytest.importorskip("pyarrow.parquet")
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  os.makedirs(tmp_path / "p")
  for k, chunk in enumerate(np.array_split(np.arange(len(docs)), 2)):
    pq.write_table(pa.table({"body": [docs[i] for i in chunk]}), tmp_path / "p" / f"{k}.parquet")
  assert load_documents(f"parquet:{tmp_path}/p/*.parquet", text_field="body") == expected
  # One prepare per format: the same tokens.
  a = prepare(jsonl, tmp_path / "sj", tokenizer=prepare_store_tokenizer(corpus, tmp_path))
  b = prepare(f"parquet:{tmp_path}/p/*.parquet", tmp_path / "sp", text_field="body",
              tokenizer=a.tokenizer_path)
  assert shard_bytes(a.directory) == shard_bytes(b.directory)


def prepare_store_tokenizer(corpus, tmp_path):
  """A tokenizer.json file (trained by preparing the text files once)."""
  _, source, _ = corpus
  return prepare(source, tmp_path / "tok").tokenizer_path


def test_interrupted_prepare_resumes_to_identical_shards(corpus, tmp_path, monkeypatch):
  docs, _, _ = corpus
  source = write_jsonl(str(tmp_path / "j"), docs)
  reference = prepare(source, tmp_path / "ref", shard_tokens=400)
  assert len(reference.train.files) > 2

  real_tokenize, real_write = prepare_lib._tokenize_shard, output_shards.write

  def tokenize_then_die(job):
    if job[0][0] == 2:                     # the third input shard
      raise KeyboardInterrupt
    return real_tokenize(job)

  def write_then_die(job):
    if job[1] == 2:                        # output shard 2 of a split
      raise KeyboardInterrupt
    return real_write(job)

  out = tmp_path / "s"
  for broken in [(prepare_lib, "_tokenize_shard", tokenize_then_die),
                 (output_shards, "write", write_then_die)]:
    monkeypatch.setattr(*broken)
    with pytest.raises(KeyboardInterrupt):
      prepare(source, out, shard_tokens=400)
    monkeypatch.undo()
    assert not os.path.exists(out / store_lib.MANIFEST)
    with pytest.raises(DataError, match="not a prepared token store"):
      TokenStore(str(out))
  (out / "work" / "in-00002.bin.tmp").write_bytes(b"half")      # a half-written file
  done_before = sorted(os.listdir(out / "work"))
  assert "in-00000.done.json" in done_before and "train-00000.done.json" in done_before
  resumed = prepare(source, out, shard_tokens=400)
  assert shard_bytes(resumed.directory) == shard_bytes(reference.directory)
  assert resumed.fingerprint == reference.fingerprint
  assert sorted(os.listdir(out)) == sorted(os.listdir(reference.directory))   # no work left
  again = prepare(source, out, shard_tokens=400)                  # idempotent: nothing rewritten
  assert again.fingerprint == reference.fingerprint


def test_prepare_with_two_workers_writes_the_same_store(corpus, tmp_path):
  docs, _, _ = corpus
  source = write_jsonl(str(tmp_path / "j"), docs)
  one = prepare(source, tmp_path / "one", shard_tokens=400)
  two = prepare(source, tmp_path / "two", shard_tokens=400, workers=2)
  assert shard_bytes(one.directory) == shard_bytes(two.directory)


def test_uint32_tokens_when_the_vocab_does_not_fit_uint16():
  assert store_lib.token_dtype(2**16) == "uint16" and store_lib.token_dtype(2**16 + 1) == "uint32"


# --- bad input: a clear error naming the file, nothing lost ----------------------------------


def test_missing_or_truncated_shard(one_shard, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(one_shard.directory, copy)
  shard = copy / "train-00000.bin"
  shard.write_bytes(shard.read_bytes()[:-2])
  with pytest.raises(DataError, match=f"shard {shard} has .* truncated"):
    TokenStore(str(copy))
  os.remove(shard)
  with pytest.raises(DataError, match=f"shard {shard} of the store .* is missing"):
    TokenStore(str(copy))


def test_manifest_of_another_version_or_edited(one_shard, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(one_shard.directory, copy)
  path = copy / store_lib.MANIFEST
  manifest = json.loads(path.read_text())
  path.write_text(json.dumps({**manifest, "version": 99}))
  with pytest.raises(DataError, match=f"{path} has format version 99"):
    TokenStore(str(copy))
  manifest["splits"]["train"]["tokens"] += 1
  path.write_text(json.dumps(manifest))
  with pytest.raises(DataError, match="edited after it was written"):
    TokenStore(str(copy))


def test_a_store_names_its_data_for_a_reference(one_shard, tmp_path, monkeypatch):
  """builtin:pystdlib names the Python whose stdlib it read (a store of another Python is
  other data, and another fingerprint); any other store is its fingerprint, as is a
  stdlib store prepared before its manifest recorded the Python."""
  assert one_shard.data_name == one_shard.fingerprint and len(one_shard.fingerprint) == 64
  stdlib = prepare("builtin:pystdlib", tmp_path / "a", max_bytes=30_000)
  assert stdlib.data_name == "builtin:pystdlib@%d.%d" % sys.version_info[:2]
  assert stdlib.manifest["sources"]["python"] == "%d.%d" % sys.version_info[:2]
  monkeypatch.setattr(sys, "version_info", (3, 99, 0))
  other = prepare("builtin:pystdlib", tmp_path / "b", max_bytes=30_000)
  assert other.data_name == "builtin:pystdlib@3.99" and other.fingerprint != stdlib.fingerprint
  unrecorded = dict(stdlib.manifest, sources={k: v for k, v in stdlib.manifest["sources"].items()
                                              if k != "python"})
  assert store_lib.data_name(unrecorded) == stdlib.fingerprint


def test_a_version_1_store_reads_as_a_whole_document_split(one_shard, corpus, tmp_path):
  copy = tmp_path / "v1"
  shutil.copytree(one_shard.directory, copy)
  path = copy / store_lib.MANIFEST
  manifest = json.loads(path.read_text())
  assert manifest["version"] == 2 and manifest["request"]["val_piece_bytes"] == 0
  del manifest["request"]["val_piece_bytes"]
  manifest["version"] = 1
  manifest["fingerprint"] = store_lib.fingerprint(manifest)
  path.write_text(json.dumps(manifest))
  assert TokenStore(str(copy)).manifest["request"]["val_piece_bytes"] == 0
  _, source, _ = corpus    # prepare finds it is the same store (a whole-document split)
  assert prepare(source, copy).fingerprint == manifest["fingerprint"]
  with pytest.raises(DataError, match="val_piece_bytes: 0 there, 64 asked"):
    prepare(source, copy, val_piece_bytes=64)


def test_store_of_pieces_equals_the_in_ram_split(tmp_path):
  rng = np.random.default_rng(5)
  docs = make_docs(30) + ["".join(f"long {k}: " + " ".join(rng.choice(WORDS, 9)) + "\n"
                                  for k in range(300)) for _ in range(3)]
  source = write_text_files(str(tmp_path / "txt"), docs)
  store = prepare(source, tmp_path / "s", val_piece_bytes=256)
  train, val = split_documents(load_documents(source), 0.1, 1, piece_bytes=256)
  assert len(val) > 10 and store.manifest["splits"]["val"]["docs"] == len(val)
  tok = store.tokenizer()
  for split, texts in ((store.train, train), (store.val, val)):
    assert np.array_equal(split.read(0, len(split)), TokenStream.build(texts, tok, 1).tokens)


def test_store_of_another_tokenizer(one_shard, corpus, tmp_path):
  _, source, _ = corpus
  other = prepare(source, tmp_path / "other", vocab_size=320).tokenizer_path
  config = tiny_config()
  config.data.source = f"tokens:{one_shard.directory}"
  config.data.tokenizer = other
  config.data.seq_len, config.data.batch_size = 8, 2
  with pytest.raises(ConfigError, match="is not the tokenizer of the store"):
    run_data.prepare_data(_data(config), RunDir(tmp_path / "w"), 512, (0, 1))
  copy = tmp_path / "copy"
  shutil.copytree(one_shard.directory, copy)
  shutil.copyfile(other, copy / "tokenizer.json")
  with pytest.raises(DataError, match="not the tokenizer the store"):
    TokenStore(str(copy)).tokenizer()


def test_trainer_reads_a_store_in_place_and_refuses_another(one_shard, corpus, tmp_path,
                                                            caplog):
  _, source, _ = corpus
  config = tiny_config()
  config.data.source = f"tokens:{one_shard.directory}"
  config.data.seq_len, config.data.batch_size, config.data.eval_batches = 8, 2, 2
  rundir = RunDir(tmp_path / "w")
  before = shard_bytes(one_shard.directory)
  stores = run_data.open_stores(_data(config), rundir, 512)
  workdir_lib.check_store(rundir, stores, force=False)     # a new run trains on any store
  fileio.makedirs(rundir.root)
  with caplog.at_level("WARNING", logger="tst_jax"):
    data = run_data.load_data(_data(config), stores, rundir, 512, (0, 1))
  # The model's 512 ids against the store's 300: a warning, not a silent waste.
  assert ("model.vocab_size 512 is larger than the 300 tokens of the tokenizer of the store "
          f"{one_shard.directory}: 212 rows") in caplog.text
  assert data.train.directory == one_shard.directory and data.fingerprint == one_shard.fingerprint
  workdir_lib.write_store(rundir, data.fingerprint, data.train.directory, len(data.train))
  assert len(data.eval_windows) == 2 and not os.path.exists(rundir.data)
  # Held-out windows of another width (a tst phase's S·L + 1) are drawn as the eval's are;
  # a width no batch of which fits in the split gives none.
  wide = data.held_out.windows(2, 4 * 8 + 1)
  for got, want in zip(wide, eval_windows(one_shard.val, batch_size=2, window=33,
                                          num_batches=2), strict=True):
    assert np.array_equal(got, want)
  assert data.held_out.windows(2, len(one_shard.val)) == []
  assert data.tokenizer.fingerprint() == one_shard.tokenizer().fingerprint()
  with pytest.raises(ConfigError, match="has 300 tokens, more than the model's 299"):
    run_data.prepare_data(_data(config), rundir, 299, (0, 1))
  other = prepare(source, tmp_path / "other", seed=2)
  config.data.source = f"tokens:{other.directory}"
  with pytest.raises(ConfigError, match="holds a run of another token store"):
    workdir_lib.check_store(rundir, run_data.open_stores(_data(config), rundir, 512),
                            force=False)
  assert shard_bytes(one_shard.directory) == before


def test_a_store_under_home_is_read_alike_by_plan_check_and_trainer(one_shard, tmp_path,
                                                                     monkeypatch):
  """`tokens:~/...`: the plan's token count, the path check and the trainer all expand ~ (the
  trainer once opened the literal '~/...' that the check had accepted)."""
  monkeypatch.setenv("HOME", str(tmp_path))
  shutil.copytree(one_shard.directory, tmp_path / "store")
  config = tiny_config()
  config.data.update(source="tokens:~/store", seq_len=8, batch_size=2, eval_batches=2)
  d = _data(config)
  section.check_paths(d)
  assert run_data.training_tokens(d).count == len(one_shard.train)
  data = run_data.prepare_data(d, RunDir(tmp_path / "w"), 512, (0, 1))
  assert data.train.directory == str(tmp_path / "store")
  assert data.fingerprint == one_shard.fingerprint


@pytest.mark.slow
def test_a_checkpoint_resumes_only_on_its_store(one_shard, corpus, tmp_path):
  """The store's fingerprint is in each checkpoint's metadata: a store prepared again in the
  same folder (same tokenizer, other seed) with the workdir's store.json gone is still one
  clear error on resume, and nothing is written; force_resume continues."""
  _, source, _ = corpus
  store = tmp_path / "store"
  shutil.copytree(one_shard.directory, store)
  config = tiny_config(steps=4, ratio=0.5)
  config.data.update(source=f"tokens:{store}", tokenizer="", seq_len=8, batch_size=2,
                     eval_batches=1)
  config.model.vocab_size = 300
  workdir = tmp_path / "w"
  cli.run(config, str(workdir))
  os.remove(RunDir(workdir).store)
  tokenizer = shutil.copy(store / "tokenizer.json", tmp_path / "tokenizer.json")
  shutil.rmtree(store)
  other = prepare(source, store, seed=2, tokenizer=str(tokenizer))   # same tokenizer
  before = sorted(os.listdir(workdir / "checkpoints"))
  with pytest.raises(ConfigError, match=r"checkpoints/4 holds a run of another token store: "
                     rf"fingerprint {one_shard.fingerprint[:12]} there, {store} "
                     rf"\({other.fingerprint[:12]}\) here; use another --workdir"):
    cli.run(config, str(workdir))
  assert sorted(os.listdir(workdir / "checkpoints")) == before
  config.train.force_resume = True
  assert cli.run(config, str(workdir))["steps"] == 4


def test_empty_source_and_missing_jsonl_field(tmp_path):
  blank = write_text_files(str(tmp_path / "blank"), [" \n", "\t"])
  with pytest.raises(DataError, match="empty corpus"):
    prepare(blank, tmp_path / "s1")
  with pytest.raises(DataError, match="empty corpus"):
    prepare(blank, tmp_path / "s2", tokenizer=prepare_lib_tokenizer(tmp_path))
  folder = tmp_path / "j"
  os.makedirs(folder)
  (folder / "x.jsonl").write_text('{"text": "fine"}\n{"content": "no text field"}\n')
  with pytest.raises(DataError, match=f"{folder}/x.jsonl:2: no string field 'text'") as e:
    prepare(f"jsonl:{folder}/*.jsonl", tmp_path / "s3", tokenizer=prepare_lib_tokenizer(tmp_path))
  # The flag of each command that reads a corpus: main.py has no --text_field.
  assert "--config.data.text_field=NAME (main.py), --text_field=NAME (prepare)" in str(e.value)
  (folder / "x.jsonl").write_text('{"text": "fine"}\nnot json\n')
  with pytest.raises(DataError, match=f"{folder}/x.jsonl:2: not a JSON line"):
    load_documents(f"jsonl:{folder}/*.jsonl")


def test_a_bad_input_file_stops_prepare_and_the_rerun_resumes(corpus, tmp_path, monkeypatch):
  """A truncated .jsonl.gz among good files: a BadFile naming it, the input shards read before
  it kept; once it is whole again, the rerun reads the rest only and writes the store that a
  prepare in one go writes."""
  docs, _, _ = corpus
  source = write_jsonl(str(tmp_path / "j"), docs)   # a0.jsonl, b1.jsonl.gz, c2.jsonl.zst
  tok = prepare_lib_tokenizer(tmp_path)
  reference = prepare(source, tmp_path / "ref", tokenizer=tok)
  gz = tmp_path / "j" / "b1.jsonl.gz"
  whole = gz.read_bytes()
  gz.write_bytes(whole[:len(whole) // 2])
  out = tmp_path / "s"
  with pytest.raises(BadFile, match=f"^{gz}: cannot be read to its end \\(EOFError"):
    prepare(source, out, tokenizer=tok)
  done = [n for n in os.listdir(out / "work") if n.endswith(".done.json")]
  assert done == ["in-00000.done.json"]
  gz.write_bytes(whole)
  read, real = [], prepare_lib._tokenize_shard
  monkeypatch.setattr(prepare_lib, "_tokenize_shard", lambda job: read.append(job[0][0]) or
                      real(job))
  resumed = prepare(source, out, tokenizer=tok)
  assert read == [1, 2]
  assert shard_bytes(resumed.directory) == shard_bytes(reference.directory)
  assert resumed.fingerprint == reference.fingerprint


def test_skip_bad_files_leaves_them_out_and_the_manifest_lists_them(corpus, tmp_path,
                                                                    monkeypatch, caplog):
  """Broken files after the good ones: the store holds the good files' shards exactly, each
  broken file is named in the log and the manifest. One of them mended before the rerun of
  an interrupted prepare: the output shards planned without it are written again."""
  docs, _, _ = corpus
  folder = tmp_path / "j"
  source = write_jsonl(str(folder), docs)
  tok = prepare_lib_tokenizer(tmp_path)
  reference = prepare(source, tmp_path / "ref", tokenizer=tok, shard_tokens=400)
  bad = [p for name, p in sorted(bad_files(folder).items()) if ".jsonl" in name]
  with caplog.at_level("WARNING", logger="tst_jax"):
    store = prepare(source, tmp_path / "s", tokenizer=tok, shard_tokens=400, skip_bad_files=True)
  assert shard_bytes(store.directory) == shard_bytes(reference.directory)
  skipped = store.manifest["sources"]["skipped"]
  assert [r["file"] for r in skipped] == bad and "EOFError" in skipped[2]["reason"]
  assert "skipped" not in reference.manifest["sources"]
  assert all(f"left out {p}: cannot be read" in caplog.text for p in bad)
  assert "left out 3 bad files" in caplog.text
  real_write = output_shards.write

  def write_then_die(job):
    if job[1] == 2:                        # output shard 2 of a split
      raise KeyboardInterrupt
    return real_write(job)

  monkeypatch.setattr(output_shards, "write", write_then_die)
  out = tmp_path / "again"
  with pytest.raises(KeyboardInterrupt):
    prepare(source, out, tokenizer=tok, shard_tokens=400, skip_bad_files=True)
  monkeypatch.undo()
  assert os.path.exists(out / "train-00000.bin")
  whole = folder / "b1.jsonl.gz"
  shutil.copy(whole, bad[2])               # truncated.jsonl.gz reads to its end now
  resumed = prepare(source, out, tokenizer=tok, shard_tokens=400, skip_bad_files=True)
  fresh = prepare(source, tmp_path / "fresh", tokenizer=tok, shard_tokens=400,
                  skip_bad_files=True)
  assert len(resumed.manifest["sources"]["skipped"]) == 2
  assert shard_bytes(resumed.directory) == shard_bytes(fresh.directory)
  assert resumed.fingerprint == fresh.fingerprint != store.fingerprint


def prepare_lib_tokenizer(tmp_path):
  path = tmp_path / "bpe" / "tokenizer.json"
  if not path.exists():
    prepare(write_text_files(str(tmp_path / "bpe_docs"), make_docs(30)), tmp_path / "bpe")
  return str(path)


def test_output_folder_holding_something_else(one_shard, corpus, tmp_path):
  _, source, _ = corpus
  with pytest.raises(DataError, match="holds another store .*seed: 1 there, 5 asked"):
    prepare(source, one_shard.directory, seed=5)
  assert TokenStore(one_shard.directory).fingerprint == one_shard.fingerprint
  mine = tmp_path / "mine"
  os.makedirs(mine)
  (mine / "notes.txt").write_text("keep me")
  with pytest.raises(DataError, match="not empty and holds no store"):
    prepare(source, mine)
  assert os.listdir(mine) == ["notes.txt"]


def test_cli_prints_the_store_or_one_error_line(corpus, tmp_path, capsys):
  _, source, _ = corpus
  out = tmp_path / "s"
  argv = [f"--source={source}", f"--out={out}", "--vocab_size=300", "--workers=1"]
  assert prepare_lib.main(argv) == 0
  said = capsys.readouterr()
  summary, last = said.out.strip().splitlines()[-2:]
  printed = json.loads(last)
  store = TokenStore(str(out))
  assert printed["fingerprint"] == store.fingerprint
  val = printed["val_tokens"]
  assert summary.startswith(f"prepared {out}: ") and (
      f"{printed['train_tokens']:,} training and {val:,} held-out tokens "
      f"({val // 129:,} windows of 129 tokens, {val // 2049:,} of 2,049)") in summary
  # A held-out split too small for an eval of the paper's length says so, with a fraction.
  [warning] = [line for line in said.err.splitlines() if line.startswith("warning: ")]
  assert val < 16 * 2049 and warning.startswith(
      f"warning: the held-out split holds {val:,} tokens, {val // 2049} windows of 2,049")
  wanted = float(warning.split("--val_fraction=")[1].split()[0])
  assert abs(wanted - 0.02 * 64 * 2049 / val) < 0.01 * wanted or wanted == 0.5
  assert store_lib.held_out_warning(16 * 2049, 0.02) == ""
  assert "4 windows of 2,049 " in store_lib.held_out_warning(4 * 2049, 0.02)
  assert "--val_fraction=0.32 for about 64" in store_lib.held_out_warning(4 * 2049, 0.02)
  with pytest.raises(SystemExit) as stop:
    errors.main(prepare_lib.main, [f"--source=text:{tmp_path}/none/*.txt", f"--out={tmp_path}/t",
                                   "--vocab_size=300"])
  assert stop.value.code == 2 and capsys.readouterr().err == (
      f"error: data.source 'text:{tmp_path}/none/*.txt' matched no files\n")
  bad = bad_files(tmp_path / "bad")["truncated.jsonl.gz"]
  argv = [f"--source=jsonl:{bad}", f"--out={tmp_path}/b", "--vocab_size=300", "--workers=1"]
  with pytest.raises(SystemExit) as stop:
    errors.main(prepare_lib.main, argv)
  printed = capsys.readouterr().err
  assert printed.startswith(f"error: {bad}: cannot be read to its end") and printed.count("\n") == 1
  assert not os.path.exists(f"{tmp_path}/t") and not os.path.exists(f"{tmp_path}/b")
  good = [f"--source=jsonl:{tmp_path}/bad/*.jsonl*", f"--out={tmp_path}/g", "--vocab_size=300",
          "--workers=1", "--skip_bad_files"]
  (tmp_path / "bad" / "ok.jsonl").write_text("".join(json.dumps({"text": d}) + "\n"
                                                     for d in make_docs(40)))
  assert prepare_lib.main(good) == 0
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["skipped_files"] == 3


def _data(config):
  """A tiny config's data settings as the trainer's spec makes them."""
  return spec_lib.check(config).data
