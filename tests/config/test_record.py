"""The config and plan records of a workdir (tst_jax/config/record.py): config.json and plan.json
read back as written, on a disk, in a bucket and in fsspec's memory store; a missing or
unreadable config.json is one error naming it; a run without plan.json gives its config's
plan."""

import dataclasses

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import fileio
from tst_jax.config import record, spec as spec_lib
from tst_jax.config.plan import PlanRecord
from tst_jax.data.run_data import TrainTokens
from tst_jax.errors import DataError, WorkdirError
from tst_jax.rundir import RunDir


def test_config_and_plan_read_back_as_written(root):
  spec = spec_lib.check(tiny_config(steps=6))
  rundir = RunDir(root)
  fileio.makedirs(root)
  assert record.read_config_json(rundir) is None and record.read_plan(rundir) is None
  record.write_config(rundir, spec.to_json())
  tokens = TrainTokens(12_345, True, "the store /s")
  record.write_plan(rundir, PlanRecord(spec.plan, tokens))
  assert record.read_config_json(rundir) == fileio.read_json(rundir.config)
  sections = record.read_config(rundir)
  assert sections["tst"] == spec.tst and sections["model"] == spec.model
  assert record.read_plan(rundir) == PlanRecord(spec.plan, tokens)
  assert record.plan_and_tokens(rundir) == (spec.plan, 12_345)
  assert fileio.listdir(root) == ["config.json", "plan.json"]


def test_a_missing_or_unreadable_config_json_is_one_error_naming_it(tmp_path):
  rundir = RunDir(tmp_path)
  with pytest.raises(WorkdirError, match=f"^{rundir.config} does not exist: {tmp_path} is not"):
    record.read_config(rundir)
  fileio.write_text(rundir.config, "{not json")
  with pytest.raises(DataError, match=f"^{rundir.config}: cannot be read as JSON"):
    record.read_config(rundir)
  fileio.write_json(rundir.config, dict(tst=dict(bag_size=0)))
  with pytest.raises(DataError, match=f"^{rundir.config}: cannot be read .*restore it from a copy"):
    record.read_config(rundir)


def test_a_run_without_plan_json_gives_its_configs_plan(tmp_path):
  """Its config's plan with uniform bag weights, or the plan it was started with; a run with
  neither record is one error."""
  config = tiny_config(steps=6, tst=dict(weighting="power"))
  spec = spec_lib.check(config)
  rundir = RunDir(tmp_path)
  with pytest.raises(DataError, match="has no plan.json or config.json"):
    record.plan_and_tokens(rundir)
  record.write_config(rundir, spec.to_json())
  config.tst.weighting = "uniform"
  uniform = spec_lib.check(config).plan
  assert uniform != spec.plan
  assert record.plan_and_tokens(rundir) == (uniform, None)
  started = dataclasses.replace(spec.plan)
  assert record.plan_and_tokens(rundir, started=started) == (started, None)
