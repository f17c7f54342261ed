"""The source-format registry (tst_jax/data/formats.py): a format registered only here, CSV
files whose `text` column holds the documents, trains a tiny two-phase run, is refused before
a run with one line where its glob matches nothing, and gives a store whose fingerprint
changes when a file's text or what the format records changes."""

import csv
import json
import os

import numpy as np
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import errors
from tst_jax.data import file_readers, formats, load_documents, prepare, sources
from tst_jax.data.store import TokenStore
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import workdir as workdir_lib


def csv_texts(path: str, field: str):
  """Yields the `field` column of each row of a CSV file with a header."""
  with file_readers.open_text(path) as f:
    for row in csv.DictReader(f):
      yield row[field]


@pytest.fixture
def csv_format():
  formats.register("csv", formats.glob_format(csv_texts, "csv", fingerprint=lambda glob: dict(
      dialect=os.environ.get("TEST_CSV_DIALECT", "excel"))))
  yield
  formats.unregister("csv")


def write_csv(path, docs: list[str]):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "text"])
    writer.writerows(enumerate(docs))


def stdlib_pieces(max_bytes: int) -> list[str]:
  """Returns the stdlib's first `max_bytes` of text in documents of at most 8 kB, each a CSV
  field that Python's csv reads without raising its limit."""
  return [p for d in load_documents("builtin:pystdlib", max_bytes=max_bytes)
          for p in sources.pieces(d, 8192) if p.strip()]


def test_a_format_registered_in_a_test_file_trains_a_short_run(tmp_path, csv_format):
  """Four steps, two a phase, on one CSV file of 100 kB; the store records the source."""
  write_csv(f"{tmp_path}/corpus/a.csv", stdlib_pieces(100_000))
  source = f"csv:{tmp_path}/corpus/*.csv"
  summary = cli.run(tiny_config(steps=4, data=dict(source=source),
                                train=dict(checkpoint_every=0, eval_every=100)),
                    str(tmp_path / "run"))
  assert np.isfinite(summary["final_eval_loss"])
  assert TokenStore(RunDir(tmp_path / "run").data).manifest["sources"]["source"] == source


@pytest.mark.slow
def test_a_format_registered_in_a_test_file_trains_end_to_end(tmp_path, csv_format):
  docs = stdlib_pieces(300_000)
  write_csv(f"{tmp_path}/corpus/a.csv", docs[:len(docs) // 2])
  write_csv(f"{tmp_path}/corpus/b.csv", docs[len(docs) // 2:])
  source = f"csv:{tmp_path}/corpus/*.csv"
  assert load_documents(source) == docs
  workdir = tmp_path / "run"
  summary = cli.run(tiny_config(data=dict(source=source)), str(workdir))
  assert np.isfinite(summary["final_eval_loss"])
  records = workdir_lib.read_metrics(RunDir(workdir))
  assert [r["phase"] for r in records if "loss" in r] == ["tst"] * 6 + ["ntp"] * 6
  store = TokenStore(RunDir(workdir).data)
  assert store.manifest["sources"]["source"] == source
  assert store.manifest["sources"]["input_shards"] == 2 and store.manifest["sources"][
      "dialect"] == "excel"
  assert workdir_lib.read_store(RunDir(workdir))["fingerprint"] == store.fingerprint


def test_a_glob_of_a_registered_format_that_matches_nothing_is_one_line(tmp_path, capsys,
                                                                         csv_format):
  config = tiny_config(data=dict(source=f"csv:{tmp_path}/none/*.csv"))
  with pytest.raises(SystemExit) as stop:
    errors.main(cli.run, config, str(tmp_path / "run"))
  assert stop.value.code == 2 and not os.path.exists(tmp_path / "run")
  assert capsys.readouterr().err == (
      f"error: config.data.source: '{tmp_path}/none/*.csv' matches no files: give a glob of "
      "csv files, e.g. 'csv:/data/corpus/**/*.csv'\n")
  with pytest.raises(ValueError, match=r"expected 'builtin:pystdlib', .* 'seqio:<task or mixture>"
                                       r"\[:<split>\]' or 'csv:<glob>'$"):
    sources.input_shards("tsv:corpus/*.tsv")


def test_the_store_of_a_registered_format_changes_with_a_file_and_its_record(
    tmp_path, csv_format, monkeypatch):
  docs = stdlib_pieces(60_000)
  write_csv(f"{tmp_path}/corpus/a.csv", docs)
  source = f"csv:{tmp_path}/corpus/*.csv"

  def fingerprint(out: str) -> str:
    prepare.prepare(source, f"{tmp_path}/{out}", vocab_size=300, workers=1, progress=False)
    with open(f"{tmp_path}/{out}/manifest.json") as f:
      return json.load(f)["fingerprint"]

  first = fingerprint("s1")
  assert fingerprint("s2") == first   # the same corpus, wherever it is prepared
  write_csv(f"{tmp_path}/corpus/a.csv", docs[:-1] + [docs[-1] + "# one more line\n"])
  edited = fingerprint("s3")
  monkeypatch.setenv("TEST_CSV_DIALECT", "excel-tab")
  assert len({first, edited, fingerprint("s4")}) == 3


def test_a_feature_of_token_ids_is_decoded_by_its_vocabulary_or_refused_in_one_line():
  """tfds and seqio examples: text as it is; token ids through the feature's vocabulary;
  ids with none (a tfds feature) one DataError naming the feature; a missing feature too."""
  shard = formats.InputShard("tfds", ("lm1b", "train"), 0, text_field="ids")
  assert formats._feature(dict(ids=b"hello"), shard) == b"hello"
  ids = np.array([3, 1, 2])
  assert formats._feature(dict(ids=ids), shard, lambda x: "-".join(map(str, x))) == "3-1-2"
  with pytest.raises(errors.DataError, match="feature 'ids' is not text .ndarray. and names "
                     "no vocabulary"):
    formats._feature(dict(ids=ids), shard)
  with pytest.raises(errors.DataError, match="have no feature 'ids'.*they have text"):
    formats._feature(dict(text=b"x"), shard)
