"""train.tracker: the tracker gets metrics.jsonl's records of both phases, the plan as config
and the phase switch; a resumed run continues its tracker run; a missing package is one line."""

import glob
import json
import subprocess
import sys
import uuid

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import tracker as tracker_lib, workdir as workdir_lib


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)   # import wandb raises ImportError
  with pytest.raises(ConfigError, match=r"^config.train.tracker: wandb is not installed: pip "
                                        r"install wandb, or train.tracker=none$"):
    tracker_lib.wandb(RunDir(tmp_path), None, {})


def test_trackio_gets_both_phases_the_plan_and_the_switch_and_resumes(tmp_path, monkeypatch):
  """trackio itself, in its local mode: its runs live in TRACKIO_DIR (tests/conftest.py puts
  that in a temporary folder), read back through its own API."""
  trackio = pytest.importorskip("trackio", reason="trackio is not installed (it is in [test])")
  project = f"tst-jax-test-{uuid.uuid4().hex[:8]}"
  monkeypatch.setenv("TRACKIO_PROJECT", project)
  config = tiny_config(steps=8, train=dict(tracker="trackio", checkpoint_every=0))
  try:
    cli.run(config, str(tmp_path))
    (run,) = trackio.Api().runs(project)
    assert run.name == workdir_lib.read_tracker(RunDir(tmp_path))["id"] == tmp_path.name
    assert [p["name"] for p in run.config["plan"]["phases"]] == ["tst", "ntp"]
    assert run.config["config"]["train"]["tracker"] == "trackio"
    _same_records_and_switch(trackio.SQLiteStorage.get_logs(project, run.name),
                             RunDir(tmp_path), switch_at=5)
    # Run again, longer: the same trackio run continues, with the new steps after the old.
    with config.unlocked():
      config.train.steps = 10
    config.train.force_resume = True
    cli.run(config, str(tmp_path))
    (again,) = trackio.Api().runs(project)
    assert again.name == run.name
    logs = trackio.SQLiteStorage.get_logs(project, run.name)
    _same_records_and_switch(logs, RunDir(tmp_path), switch_at=5)
  finally:
    trackio.delete_project(project, force=True)


def _same_records_and_switch(logged: list[dict], rundir: RunDir, switch_at: int):
  """Asserts that a tracker logged metrics.jsonl's train losses of both phases and its eval
  steps, in order, and one phase switch, at step `switch_at`."""
  records = workdir_lib.read_metrics(rundir)
  assert [(v["step"], v["loss"]) for v in logged if "loss" in v] == [
      (r["step"], r["loss"]) for r in records if "loss" in r]
  assert [v["step"] for v in logged if "eval_loss" in v] == [
      r["step"] for r in records if "eval_loss" in r]
  assert [v["step"] for v in logged if "phase_switch" in v] == [switch_at]


def _wandb_records(run_dir: str) -> list[dict]:
  """Returns the records of the offline run under `run_dir`, as wandb's own reader of its
  transaction log gives them (`wandb leet inspect --json`), one dict per record."""
  (path,) = glob.glob(f"{run_dir}/wandb/offline-run-*/run-*.wandb")
  result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                          capture_output=True, text=True, timeout=120, check=True)
  return [json.loads(line) for line in result.stdout.splitlines()]


def test_wandb_offline_run_holds_both_phases_and_the_config(tmp_path, monkeypatch):
  pytest.importorskip("wandb", reason="wandb is not installed (it is in [test])")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  cli.run(tiny_config(steps=8, train=dict(tracker="wandb", checkpoint_every=0)), str(tmp_path))
  records = _wandb_records(str(tmp_path))
  history = [dict(r["history"]["item"], step=r["history"]["step"]["num"])
             for r in records if r["type"] == "history"]
  config = {}
  for r in records:
    if r["type"] in ("run", "config"):
      config.update((r["run"]["config"] if r["type"] == "run" else r["config"])["update"])
  _same_records_and_switch(history, RunDir(tmp_path), switch_at=5)
  assert [p["name"] for p in config["plan"]["phases"]] == ["tst", "ntp"]
  assert config["config"]["train"]["tracker"] == "wandb"
