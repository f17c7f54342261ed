"""A run's record (tst_jax/run/workdir.py): one reader and writer per file, one
"same run?" check whose message is the same for a config, a store and a checkpoint, and a
workdir in a bucket read and written as a local one."""

import json

import pytest

from tests.fixtures.corpus import CORPUS
from tst_jax import fileio
from tst_jax.data import get_tokenizer, prepare as prepare_lib
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError, DataError
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib


@pytest.fixture(params=["local", "bucket"])
def rundir(request, tmp_path):
  """A run's folder on the local disk, or gs://<bucket>/run in the emulator."""
  if request.param == "local":
    return RunDir(tmp_path)
  return RunDir(request.getfixturevalue("bucket") + "/run")


def test_metrics_read_back_and_resume_drops_the_lines_after_the_checkpoint(rundir):
  assert workdir_lib.read_metrics(rundir) == []
  lines = [dict(step=s, loss=10.0 - s) for s in range(1, 6)] + [dict(step=5, eval_loss=3.5)]
  with workdir_lib.open_metrics(rundir, 0) as f:
    for r in lines:
      f.write(json.dumps(r) + "\n")
  assert workdir_lib.read_metrics(rundir) == lines
  assert workdir_lib.final_eval(rundir, 5) == 3.5 and workdir_lib.final_eval(rundir, 4) is None
  with workdir_lib.open_metrics(rundir, 3) as f:   # resumed from the checkpoint of step 3
    f.write(json.dumps(dict(step=4, loss=1.0)) + "\n")
  assert workdir_lib.read_metrics(rundir) == lines[:3] + [dict(step=4, loss=1.0)]
  with workdir_lib.open_metrics(rundir, 0):   # run again with no checkpoint: from step 1
    pass
  assert workdir_lib.read_metrics(rundir) == []


def test_records_read_back_as_written(rundir):
  assert workdir_lib.read_summary(rundir) is None and workdir_lib.read_store(rundir) is None
  workdir_lib.write_summary(rundir, dict(steps=8, final_eval_loss=3.25))
  workdir_lib.write_store(rundir, "f" * 64, "/stores/a", 1234)
  assert workdir_lib.read_summary(rundir) == dict(steps=8, final_eval_loss=3.25)
  assert workdir_lib.train_tokens(rundir) == 1234
  assert fileio.listdir(rundir.root) == ["store.json", "summary.json"]


def test_a_store_json_without_its_token_count_is_counted_in_the_store(tmp_path):
  """A run whose store.json names its store but not its tokens still compares: the count
  comes from the store, and None where that store is gone."""
  source = tmp_path / "docs.jsonl"
  source.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in CORPUS))
  store = prepare_lib.prepare(f"jsonl:{source}", str(tmp_path / "store"), vocab_size=280,
                              workers=1, progress=False)
  rundir = RunDir(tmp_path / "run")
  fileio.makedirs(rundir.root)
  fileio.write_json(rundir.store, dict(fingerprint="f" * 64, directory=store))
  assert workdir_lib.train_tokens(rundir) == len(TokenStore(store).train) > 0
  fileio.write_json(rundir.store, dict(fingerprint="f" * 64, directory=str(tmp_path / "gone")))
  assert workdir_lib.train_tokens(rundir) is None


def test_checkpoint_steps_are_the_complete_ones(rundir):
  """Locally a step's folder appears whole, by a rename; in a bucket Orbax's commit file,
  written last, marks it complete."""
  done = workdir_lib.ORBAX_COMMIT if rundir.remote else "state/x"
  for step, name in ((2, done), (4, done), (6, "state/_METADATA"), (8, "meta/metadata")):
    path = fileio.join(rundir.checkpoint(step), name)
    fileio.makedirs(fileio.dirname(path))
    fileio.write_text(path, "")
  assert workdir_lib.checkpoint_steps(rundir) == ([2, 4] if rundir.remote else [2, 4, 6])


def test_the_runs_tokenizer_is_copied_beside_its_records_once(rundir, tmp_path_factory):
  """The tools read the run's own copy of its store's tokenizer; a copy of another
  tokenizer there is refused, not replaced."""
  stores = tmp_path_factory.mktemp("stores")
  tok = get_tokenizer("bpe", folder=str(stores / "a"), vocab_size=280, train_docs=CORPUS)
  workdir_lib.write_tokenizer(rundir, tok)
  workdir_lib.write_tokenizer(rundir, tok)          # a resumed run finds its own copy
  assert fileio.listdir(rundir.root) == ["tokenizer.json"]
  assert workdir_lib.read_tokenizer(rundir, 280).fingerprint() == tok.fingerprint()
  other = get_tokenizer("bpe", folder=str(stores / "b"), vocab_size=300, train_docs=CORPUS)
  with pytest.raises(DataError, match=f"^{rundir.tokenizer_json}: exists and differs"):
    workdir_lib.write_tokenizer(rundir, other)


@pytest.mark.parametrize("what,differs", [("config", "sections ['tst'] differ"),
                                          ("token store", "A there, B here")])
def test_one_same_run_check_with_one_message(tmp_path, what, differs):
  with pytest.raises(ConfigError) as e:
    workdir_lib.check_same_run(str(tmp_path), what, differs, force=False)
  assert e.value.field == "--workdir"
  assert str(e.value) == (f"--workdir: {tmp_path} holds a run of another {what}: {differs}; "
                          "use another --workdir, or --config.train.force_resume=True to "
                          "resume anyway")
  workdir_lib.check_same_run(str(tmp_path), what, differs, force=True)
  workdir_lib.check_same_run(str(tmp_path), what, None, force=False)
