"""prepare with its input or its store in a bucket (the GCS emulator): the store written there
holds the shards a local prepare writes, the manifest comes last, a resumed prepare keeps the
shards already written, and tokens:gs://... reads the windows a local store gives."""

import gzip
import json
import os
import pickle

import numpy as np
import pytest

from tests.fixtures.corpus import bad_files
from tst_jax import errors, fileio
from tst_jax.data import TokenStore, make_batches, output_shards, prepare as prepare_lib
from tst_jax.data.sources import BadFile

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi".split()


def _docs(n: int) -> list[str]:
  rng = np.random.default_rng(0)
  return [f"doc {i}: " + " ".join(rng.choice(WORDS, rng.integers(5, 60))) + "\n"
          for i in range(n)]


def _jsonl_files(folder: str, docs: list[str], parts: int = 3) -> dict[str, bytes]:
  """Writes `docs` as `parts` JSON-lines files, the middle one gzipped, into a local folder or
  a bucket. Returns {name: bytes}."""
  fileio.makedirs(folder)
  files = {}
  for k, chunk in enumerate(np.array_split(np.arange(len(docs)), parts)):
    body = "".join(json.dumps({"text": docs[i]}) + "\n" for i in chunk).encode()
    name = f"part{k}.jsonl.gz" if k == 1 else f"part{k}.jsonl"
    files[name] = gzip.compress(body, mtime=0) if k == 1 else body
    fileio.write_bytes(fileio.join(folder, name), files[name])
  return files


def _prepare(source: str, out: str, tok: str, **kw) -> TokenStore:
  kw = dict(seed=1, val_fraction=0.1, workers=1, progress=False, shard_tokens=600) | kw
  return TokenStore(prepare_lib.prepare(source, out, tokenizer=tok, **kw))


@pytest.fixture(scope="module")
def local_store(tmp_path_factory):
  """A store prepared on the local disk from local files, and its tokenizer.json."""
  root = tmp_path_factory.mktemp("local")
  docs = _docs(150)
  _jsonl_files(str(root / "src"), docs)
  tok = TokenStore(prepare_lib.prepare(f"jsonl:{root}/src/*.jsonl*", str(root / "bpe"),
                                       vocab_size=300, workers=1, progress=False)).tokenizer_path
  return docs, _prepare(f"jsonl:{root}/src/*.jsonl*", str(root / "store"), tok), tok


def _shards(store: TokenStore) -> dict[str, bytes]:
  """Returns every shard of `store` by name: its tokens, and the bytes under its held-out ones."""
  return {fileio.basename(f): fileio.read_bytes(f)
          for split in (store.train, store.val, store.val_bytes) for f in split.files}


def test_prepare_into_a_bucket_writes_the_local_store_and_resumes(local_store, bucket,
                                                                  monkeypatch, tmp_path):
  """From files in the bucket into the bucket: the shards of the local prepare, byte for byte,
  and nothing else left there or in the local work folder. Interrupted after two output
  shards: no manifest, and the rerun writes only the shards that were missing."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  docs, local, tok = local_store
  _jsonl_files(f"{bucket}/src", docs)
  source, out = f"jsonl:{bucket}/src/*.jsonl*", f"{bucket}/store"
  real_write, written = output_shards.write, []

  def write_then_die(job):
    if len(written) == 2:
      raise KeyboardInterrupt
    written.append(job[:2])
    return real_write(job)
  monkeypatch.setattr(output_shards, "write", write_then_die)
  with pytest.raises(KeyboardInterrupt):
    _prepare(source, out, tok)
  assert not fileio.exists(f"{out}/manifest.json") and fileio.exists(f"{out}/prepare.json")
  assert sorted(n for n in fileio.listdir(out) if n.endswith(".bin")) == [
      "train-00000.bin", "train-00001.bin"]
  monkeypatch.setattr(output_shards, "write", real_write)
  moved = []
  monkeypatch.setattr(fileio, "move_in", lambda a, b: moved.append(fileio.basename(b)) or
                      fileio.write_bytes(b, open(a, "rb").read()) or os.remove(a))
  store = _prepare(source, out, tok)
  assert len(local.train.files) > 2 and "train-00000.bin" not in moved
  assert sorted(moved) == sorted(set(_shards(local)) - {"train-00000.bin", "train-00001.bin"})
  assert _shards(store) == _shards(local)
  assert store.manifest["splits"] == local.manifest["splits"]
  assert store.manifest["tokenizer"] == local.manifest["tokenizer"]
  assert sorted(fileio.listdir(out)) == sorted(["manifest.json", "tokenizer.json",
                                                *_shards(local)])
  assert os.listdir(tmp_path / "cache" / "tst_jax" / "prepare") == []


def test_tokens_from_a_bucket_are_the_local_stores_windows(local_store, bucket):
  """The windows read by range requests from the bucket equal the memory-mapped local ones,
  across shard ends and the wrap around the end, through Grain and after pickling."""
  _, local, _ = local_store
  for name, shard in _shards(local).items():
    fileio.write_bytes(f"{bucket}/s/{name}", shard)
  for name in ("manifest.json", "tokenizer.json"):
    fileio.write_bytes(f"{bucket}/s/{name}", fileio.read_bytes(fileio.join(local.directory, name)))
  remote = TokenStore(f"{bucket}/s")
  assert remote.fingerprint == local.fingerprint and len(remote.train) == len(local.train)
  n = len(local.train)
  ends = local.train.ends.tolist()
  starts = np.array([0, ends[0] - 5, ends[1] - 1, n - 3, n - 40, 123, 2 * n + 7])
  want = local.train.gather(starts, 65)
  assert (remote.train.gather(starts, 65) == want).all() and want.dtype == np.int32
  assert (pickle.loads(pickle.dumps(remote.train)).gather(starts, 65) == want).all()
  assert (remote.val.read(len(local.val) - 2, 9) == local.val.read(len(local.val) - 2, 9)).all()
  assert (remote.val_bytes.gather(starts[:3], 17) == local.val_bytes.gather(starts[:3], 17)).all()
  kw = dict(batch_size=4, window=33, start_pos=5, seed=3, num_batches=6)
  for a, b in zip(make_batches(remote.train, **kw), make_batches(local.train, **kw)):
    assert (a == b).all()
  assert remote.tokenizer().fingerprint() == local.tokenizer().fingerprint()


def test_bad_files_in_a_bucket_stop_prepare_or_are_left_out(local_store, bucket, tmp_path,
                                                            monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  docs, _, tok = local_store
  _jsonl_files(f"{bucket}/src", docs[:60])
  bad = {}
  for name, path in sorted(bad_files(tmp_path / "bad").items()):
    if ".jsonl" in name:
      bad[name] = f"{bucket}/src/{name}"
      fileio.write_bytes(bad[name], open(path, "rb").read())
  source = f"jsonl:{bucket}/src/*.jsonl*"
  with pytest.raises(BadFile, match=f"^{bad['cut.jsonl.zst']}: cannot be read to its end"):
    _prepare(source, str(tmp_path / "stopped"), tok)
  store = _prepare(source, f"{bucket}/store", tok, skip_bad_files=True)
  assert [r["file"] for r in store.manifest["sources"]["skipped"]] == sorted(bad.values())
  assert store.manifest["splits"]["train"]["docs"] + store.manifest["splits"]["val"]["docs"] == 60


def test_cli_names_a_missing_bucket_in_one_line(local_store, tmp_path, capsys):
  _, _, tok = local_store
  argv = [f"--source=jsonl:{tmp_path}/none.jsonl", "--out=gs://tst-no-such-bucket/s",
          f"--tokenizer={tok}", "--workers=1"]
  (tmp_path / "none.jsonl").write_text('{"text": "a document"}\n')
  pytest.importorskip("gcsfs")
  with pytest.raises(SystemExit) as stop:
    errors.main(prepare_lib.main, argv)
  assert stop.value.code == 2 and capsys.readouterr().err == (
      "error: --out gs://tst-no-such-bucket/s cannot be written: no such bucket or folder\n")
