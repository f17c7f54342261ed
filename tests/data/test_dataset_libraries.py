"""tfds: and seqio: sources through the real libraries, as their users have them: a seqio Task
over local text files (its preprocessors applied, token ids decoded), a Mixture drawn by its
rates, a TFDS dataset built here as ArrayRecord; each trains a tiny two-phase run, and a name
or split that is not there is one line. Skipped where the extra is not installed ([seqio],
[tfds]); .ci/run's every-extras run has both."""

import importlib
import os
import re
import sys

import numpy as np
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import cli, errors
from tst_jax.data import load_documents, prepare
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir

ALPHA = [f"alpha line {i}: " + "the quick brown fox jumps over the lazy dog. " * 4
         for i in range(300)]
BETA = [f"beta line {i}: " + "pack my box with five dozen liquor jugs. " * 4 for i in range(300)]

# The module a user names in data.imports: it registers the Tasks and the Mixture, as a t5x
# user's tasks.py does. `{tag}` keeps names apart from any other test's in this process.
TASKS = '''
import functools
import seqio
import tensorflow as tf

def to_text(dataset):
  return dataset.map(lambda line: {{"text": tf.strings.upper(line)}})

def to_targets(dataset):
  return dataset.map(lambda line: {{"targets": line}})

TEXT = {{"text": seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False, dtype=tf.string,
                              rank=0)}}
for name, path in (("alpha", {alpha!r}), ("beta", {beta!r})):
  seqio.TaskRegistry.add(
      f"{tag}_{{name}}", seqio.TextLineDataSource({{"train": path, "validation": path}}),
      preprocessors=[to_text], output_features=TEXT)
seqio.TaskRegistry.add(
    "{tag}_bytes", seqio.TextLineDataSource({{"train": {alpha!r}}}),
    preprocessors=[to_targets, seqio.preprocessors.tokenize],
    output_features={{"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=False)}})
seqio.MixtureRegistry.add("{tag}_mix", [("{tag}_alpha", 3), ("{tag}_beta", 1)])
'''


@pytest.fixture(scope="module")
def seqio_tasks(tmp_path_factory):
  """Writes the corpus files and the module that registers the seqio Tasks and Mixture over
  them, on sys.path (spawned workers inherit it); returns (module name, tag)."""
  pytest.importorskip("seqio")
  folder = tmp_path_factory.mktemp("seqio")
  for name, lines in (("alpha", ALPHA), ("beta", BETA)):
    (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")
  tag = f"tst_{os.getpid()}"
  module = f"{tag}_tasks"
  (folder / f"{module}.py").write_text(TASKS.format(
      tag=tag, alpha=str(folder / "alpha.txt"), beta=str(folder / "beta.txt")))
  sys.path.insert(0, str(folder))
  yield module, tag
  sys.path.remove(str(folder))


def test_a_seqio_task_reads_its_preprocessed_examples(seqio_tasks):
  module, tag = seqio_tasks
  assert load_documents(f"seqio:{tag}_alpha", imports=module) == [a.upper() for a in ALPHA]
  # a Task that tokenizes: its ids are decoded with the feature's vocabulary, back to text
  assert load_documents(f"seqio:{tag}_bytes", text_field="targets", imports=module) == ALPHA


def test_a_seqio_mixture_is_seqios_draw_by_its_rates(seqio_tasks):
  """Alpha at rate 3, beta at 1: seqio draws alpha three times as often, and its default
  sample_fn stops at the first Task to end, alpha's 300 lines."""
  module, tag = seqio_tasks
  docs = load_documents(f"seqio:{tag}_mix", imports=module)
  alpha = [d for d in docs if d.startswith("ALPHA")]
  assert alpha == [a.upper() for a in ALPHA]
  assert 60 <= len(docs) - len(alpha) <= 140     # 100 expected: binomial sd about 8.7
  assert docs == load_documents(f"seqio:{tag}_mix", imports=module)   # seeded: the same draw


def test_unknown_seqio_names_splits_features_and_modules_are_one_line(seqio_tasks):
  module, tag = seqio_tasks
  with pytest.raises(ConfigError, match=rf"no seqio Task or Mixture '{tag}_alpa' is registered "
                                        rf"\(close: {tag}_alpha.*\): name the module"):
    load_documents(f"seqio:{tag}_alpa", imports=module)
  with pytest.raises(ConfigError, match=rf"Task '{tag}_bytes' has no split 'validation': its "
                                        "splits are train$"):
    load_documents(f"seqio:{tag}_bytes:validation", imports=module)
  with pytest.raises(ValueError, match=r"have no feature 'body' \(data.text_field\); they have "
                                       "text$"):
    load_documents(f"seqio:{tag}_alpha", text_field="body", imports=module)
  with pytest.raises(ConfigError, match=r"module 'no_such_tasks_module' does not import: "
                                        "ModuleNotFoundError"):
    load_documents(f"seqio:{tag}_alpha", imports="no_such_tasks_module")


def test_a_seqio_mixture_trains_a_tiny_run_and_a_wrong_name_stops_it_in_one_line(
    seqio_tasks, tmp_path, capsys):
  module, tag = seqio_tasks
  config = tiny_config(data=dict(source=f"seqio:{tag}_mix", imports=module, max_bytes=0))
  summary = cli.run(config, str(tmp_path / "run"))
  assert np.isfinite(summary["final_eval_loss"])
  assert TokenStore(RunDir(tmp_path / "run").data).manifest["sources"]["source"] == (
      f"seqio:{tag}_mix")
  config = tiny_config(data=dict(source=f"seqio:{tag}_mixx", imports=module))
  with pytest.raises(SystemExit) as stop:
    errors.main(cli.run, config, str(tmp_path / "bad"))
  assert stop.value.code == 2 and not os.path.exists(tmp_path / "bad")
  [line] = capsys.readouterr().err.splitlines()
  assert re.fullmatch(rf"error: config.data.source: no seqio Task or Mixture '{tag}_mixx' is "
                      rf"registered \(close: {tag}_mix(, \w+)*\): name the module that "
                      "registers it in data.imports", line), line


def test_prepare_workers_import_the_modules_that_register_the_tasks(seqio_tasks, tmp_path):
  """prepare's workers are spawned processes, which know no Task until they import
  data.imports: the store equals the one written in this process."""
  module, tag = seqio_tasks
  stores = [prepare.prepare(f"seqio:{tag}_beta", str(tmp_path / f"w{n}"), vocab_size=300,
                            imports=module, workers=n, progress=False) for n in (1, 2)]
  assert TokenStore(stores[0]).fingerprint == TokenStore(stores[1]).fingerprint


TFDS_BUILDER = '''
import numpy as np
import tensorflow_datasets as tfds

class {name}(tfds.core.GeneratorBasedBuilder):
  """Two splits of short documents, written as ArrayRecord."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({{"text": tfds.features.Text(), "id": np.int64}}))

  def _split_generators(self, dl_manager):
    return {{"train": self._generate_examples({train!r}),
            "validation": self._generate_examples({validation!r})}}

  def _generate_examples(self, docs):
    for i, doc in enumerate(docs):
      yield i, {{"text": doc, "id": i}}
'''


@pytest.fixture(scope="module")
def tfds_dataset(tmp_path_factory):
  """Builds a TFDS dataset into a temporary data_dir, as ArrayRecord; returns its name and
  data_dir. Its builder's package is on the path only while it is built: a reader finds the
  dataset by its files, as a user's run does one prepared elsewhere."""
  pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("tensorflow")   # TFDS writes its examples through TensorFlow
  folder = tmp_path_factory.mktemp("tfds")
  package, name = f"tst_tfds_{os.getpid()}", f"TstTinyText{os.getpid()}"
  (folder / package).mkdir()
  (folder / package / "__init__.py").write_text(TFDS_BUILDER.format(
      name=name, train=ALPHA + BETA, validation=BETA[:50]))
  sys.path.insert(0, str(folder))
  try:
    builder = getattr(importlib.import_module(package), name)(
        data_dir=str(folder / "data"), file_format="array_record")
  finally:
    sys.path.remove(str(folder))
  builder.download_and_prepare(download_dir=str(folder / "downloads"))
  return builder.name, str(folder / "data")


def test_a_tfds_dataset_reads_its_split_and_trains_a_tiny_run(tfds_dataset, tmp_path,
                                                                monkeypatch):
  name, data_dir = tfds_dataset
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  docs = load_documents(f"tfds:{name}")
  assert sorted(docs) == sorted(ALPHA + BETA) and docs != ALPHA + BETA   # in TFDS's shuffled order
  assert sorted(load_documents(f"tfds:{name}:validation")) == sorted(BETA[:50])
  summary = cli.run(tiny_config(data=dict(source=f"tfds:{name}", max_bytes=0)),
                    str(tmp_path / "run"))
  assert np.isfinite(summary["final_eval_loss"])


def test_a_tfds_split_or_dataset_that_is_not_there_is_one_line(tfds_dataset, tmp_path,
                                                                 monkeypatch, capsys):
  name, data_dir = tfds_dataset
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  config = tiny_config(data=dict(source=f"tfds:{name}:test"))
  with pytest.raises(SystemExit) as stop:
    errors.main(cli.run, config, str(tmp_path / "run"))
  assert stop.value.code == 2 and not os.path.exists(tmp_path / "run")
  assert capsys.readouterr().err.splitlines() == [
      f"error: config.data.source: TFDS dataset {name!r} has no split 'test': its splits are "
      "train, validation"]
  with pytest.raises(ConfigError, match=r"'tfds:no_such_dataset_xyz' is not a TFDS dataset here"):
    load_documents("tfds:no_such_dataset_xyz")
