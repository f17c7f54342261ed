"""A run's workdir (tst_jax/train/workdir.py): one name, reader and writer per file, and one
"same run?" check whose message is the same for a config, a store and a checkpoint."""

import json

import pytest

from tst_jax.errors import ConfigError
from tst_jax.train import workdir as workdir_lib


def test_metrics_read_back_and_resume_drops_the_lines_after_the_checkpoint(tmp_path):
  workdir = str(tmp_path)
  assert workdir_lib.read_metrics(workdir) == []
  lines = [dict(step=s, loss=10.0 - s) for s in range(1, 6)] + [dict(step=5, eval_loss=3.5)]
  with workdir_lib.open_metrics(workdir, None) as f:
    f.writelines(json.dumps(r) + "\n" for r in lines)
  assert workdir_lib.read_metrics(workdir) == lines
  assert workdir_lib.final_eval(workdir, 5) == 3.5 and workdir_lib.final_eval(workdir, 4) is None
  with workdir_lib.open_metrics(workdir, 3) as f:   # resumed from the checkpoint of step 3
    f.write(json.dumps(dict(step=4, loss=1.0)) + "\n")
  assert workdir_lib.read_metrics(workdir) == lines[:3] + [dict(step=4, loss=1.0)]


def test_records_read_back_as_written(tmp_path):
  workdir = str(tmp_path)
  assert workdir_lib.read_summary(workdir) is None and workdir_lib.read_store(workdir) is None
  workdir_lib.write_summary(workdir, dict(steps=8, final_eval_loss=3.25))
  workdir_lib.write_store(workdir, "f" * 64, "/stores/a", 1234)
  assert workdir_lib.read_summary(workdir) == dict(steps=8, final_eval_loss=3.25)
  assert workdir_lib.train_tokens(workdir) == 1234
  assert (tmp_path / workdir_lib.STORE).is_file() and (tmp_path / workdir_lib.SUMMARY).is_file()


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
