"""The tracker registry (tst_jax/run/sinks.py): a tracker registered only here passes the
config check, gets every record metrics.jsonl gets in a tiny two-phase run, and a resumed run
continues its run; a name not registered is one ConfigError naming the field."""

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax.run import sinks, workdir as workdir_lib


class Recorder:
  """A tracker that keeps what it is given: the run id it continues, records, closes."""
  opened = []

  def __init__(self, rundir, run_id, config):
    self.continued, self.config, self.records, self.closed = run_id, config, [], 0
    self.run_id = run_id or f"recorder-{len(Recorder.opened)}"
    Recorder.opened.append(self)

  def write(self, record):
    self.records.append(record)

  def close(self):
    self.closed += 1


@pytest.fixture
def recorder():
  Recorder.opened = []
  sinks.register("recorder", Recorder)
  yield Recorder.opened
  sinks.unregister("recorder")


def test_a_tracker_registered_in_a_test_file_gets_every_record_of_a_short_run(tmp_path,
                                                                               recorder):
  """Four steps, two a phase: the tracker's run gets metrics.jsonl's records and the config."""
  cli.run(tiny_config(steps=4, train=dict(tracker="recorder", checkpoint_every=0,
                                          eval_every=100)), str(tmp_path))
  (run,) = recorder
  assert run.records == workdir_lib.read_metrics(RunDir(tmp_path)) and run.closed == 1
  assert [r["phase"] for r in run.records if "loss" in r] == ["tst", "tst", "ntp", "ntp"]
  assert run.config["config"]["train"]["tracker"] == "recorder"


@pytest.mark.slow
def test_a_tracker_registered_in_a_test_file_gets_every_record_and_resumes(tmp_path, recorder):
  config = tiny_config(steps=8, train=dict(tracker="recorder", checkpoint_every=0))
  assert spec_lib.check(config).train.tracker == "recorder"
  cli.run(config, str(tmp_path))
  (first,) = recorder
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  assert first.records == records and first.closed == 1 and first.continued is None
  assert {r["phase"] for r in records if "loss" in r} == {"tst", "ntp"}
  assert [p["name"] for p in first.config["plan"]["phases"]] == ["tst", "ntp"]
  assert first.config["config"]["train"]["tracker"] == "recorder"
  assert workdir_lib.read_tracker(RunDir(tmp_path)) == dict(tracker="recorder", id="recorder-0")
  # Run again, longer: the tracker's run continues, and gets the records after the restart.
  with config.unlocked():
    config.train.steps = 10
  config.train.force_resume = True
  cli.run(config, str(tmp_path))
  second = recorder[1]
  assert second.continued == second.run_id == "recorder-0" and second.closed == 1
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  assert second.records == records[len(records) - len(second.records):]
  assert [r["step"] for r in second.records if "loss" in r] == [9, 10]


def test_a_tracker_not_registered_is_refused_naming_the_registered_ones(recorder):
  config = tiny_config(train=dict(tracker="mlflow"))
  with pytest.raises(ConfigError, match=r"^config.train.tracker: must be one of \('none', "
                                        r"'wandb', 'trackio', 'recorder'\), got 'mlflow'$"):
    spec_lib.check(config)
  with pytest.raises(ValueError, match="tracker 'recorder' is registered already"):
    sinks.register("recorder", sinks.TRACKERS["wandb"])
