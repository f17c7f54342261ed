"""tst_jax.data.file_readers: the documents of one file, local or in the emulator's bucket, and
a file that does not read to its end as one BadFile naming it."""

import json
import os
import pickle

import pytest
import zstandard

from tests.fixtures.corpus import CORPUS, bad_files
from tst_jax import fileio
from tst_jax.data import load_documents
from tst_jax.data.file_readers import BadFile


@pytest.fixture(params=["local", "gcs"])
def folder(request, tmp_path):
  """An empty folder on the local disk or in a new emulator bucket."""
  if request.param == "local":
    return str(tmp_path / "files")
  return request.getfixturevalue("bucket") + "/files"


def _put(local_paths: dict[str, str], folder: str) -> dict[str, str]:
  """Copies local files into `folder`, returning their paths there by name."""
  fileio.makedirs(folder)
  out = {}
  for name, path in local_paths.items():
    out[name] = fileio.join(folder, name)
    with open(path, "rb") as f:
      fileio.write_bytes(out[name], f.read())
  return out


def test_a_file_that_does_not_read_to_its_end_is_one_bad_file_error(folder, tmp_path):
  """Each broken file is a BadFile naming it, whatever library found the fault, in a bucket as
  on disk; a .zst of several frames reads whole, and one cut at a frame boundary is caught."""
  for name, path in _put(bad_files(tmp_path / "bad"), folder).items():
    kind = "parquet" if name.endswith(".parquet") else "jsonl"
    with pytest.raises(BadFile) as caught:
      load_documents(f"{kind}:{path}")
    assert caught.value.path == path and str(caught.value).startswith(f"{path}: cannot be read")
    assert "--skip_bad_files" in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))      # as prepare's workers send it
    assert (again.path, str(again)) == (path, str(caught.value))
  body = "".join(json.dumps({"text": d}) + "\n" for d in CORPUS).encode()
  frames = b"".join(zstandard.ZstdCompressor().compress(body[k:k + 100])
                    for k in range(0, len(body), 100))
  fileio.write_bytes(fileio.join(folder, "frames.jsonl.zst"), frames)
  assert load_documents(f"jsonl:{folder}/frames.jsonl.zst") == CORPUS
  fileio.write_text(fileio.join(folder, "x.jsonl"), '{"text": "fine"}\nnot json\n')
  with pytest.raises(BadFile, match=f"{folder}/x.jsonl:2: not a JSON line") as caught:
    load_documents(f"jsonl:{folder}/x.jsonl")
  assert caught.value.record()["reason"].startswith("line 2: not a JSON line")


def test_every_format_reads_the_same_documents_from_a_bucket(bucket, tmp_path):
  """JSON lines plain, .gz and .zst, Parquet and text files: the documents read from the bucket
  are those read from the same files on disk, in the same order."""
  pq = pytest.importorskip("pyarrow.parquet")
  import gzip   # pylint: disable=import-outside-toplevel
  import pyarrow as pa   # pylint: disable=import-outside-toplevel
  local = tmp_path / "local"
  local.mkdir()
  body = "".join(json.dumps({"text": d}) + "\n" for d in CORPUS).encode()
  (local / "a.jsonl").write_bytes(body)
  (local / "b.jsonl.gz").write_bytes(gzip.compress(body))
  (local / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
  pq.write_table(pa.table({"text": CORPUS}), local / "d.parquet", row_group_size=3)
  for i, doc in enumerate(CORPUS[:5]):
    (local / f"t{i}.txt").write_text(doc)
  remote = fileio.join(bucket, "corpus")
  _put({n: str(local / n) for n in sorted(os.listdir(local))}, remote)
  for source in ("jsonl:{}/*.jsonl*", "parquet:{}/*.parquet", "text:{}/*.txt"):
    docs = load_documents(source.format(remote))
    assert docs == load_documents(source.format(local))
    assert docs == (CORPUS * 3 if "jsonl" in source else CORPUS if "parquet" in source
                    else CORPUS[:5])
