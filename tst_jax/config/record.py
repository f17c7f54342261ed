"""The config and plan records of a workdir: the one reader and writer of config.json and of
plan.json, and a finished run's plan read back. The run's other files are run/workdir.py's."""

from __future__ import annotations

import ml_collections

from tst_jax import fileio
from tst_jax.errors import DataError, WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.config import spec as spec_lib
from tst_jax.config.plan import Plan, PlanRecord
from tst_jax.run.workdir import read_json, train_tokens


def write_config(rundir: RunDir, config: dict):
  """Writes config.json: the run's config as `RunSpec.to_json` gives it."""
  fileio.write_json(rundir.config, config, sort_keys=True)


def read_config_json(rundir: RunDir) -> dict | None:
  """Returns config.json as written, None where the run has not written one."""
  return read_json(rundir, rundir.config)


def read_config(rundir: RunDir) -> dict:
  """Returns the typed sections of the run in `rundir`, read from its config.json. A workdir
  without one is a WorkdirError, a config.json that does not check a DataError naming it."""
  config = read_json(rundir, rundir.config)
  if config is None:
    raise WorkdirError(f"{rundir.config} does not exist: {rundir} is not a tst_jax run "
                       "directory")
  try:
    return spec_lib.sections_of(config)
  except (ValueError, KeyError, TypeError) as e:   # a field that does not check, a section lost
    raise DataError(f"{rundir.config}: cannot be read ({e}); it records the config of the run "
                    f"in {rundir}: restore it from a copy, or use another --workdir") from None


def write_plan(rundir: RunDir, record: PlanRecord):
  """Writes plan.json, as the run starts and again on each resume."""
  fileio.write_json(rundir.plan, record.to_json())


def read_plan(rundir: RunDir) -> PlanRecord | None:
  """Returns the run's plan.json, or None where the run has not written one."""
  record = read_json(rundir, rundir.plan)
  return None if record is None else PlanRecord.from_json(record)


def plan_and_tokens(rundir: RunDir, started: Plan | None = None) -> tuple[Plan, int | None]:
  """Returns the run's plan and its store's training tokens or None.

  A run that has not written plan.json yet gives the plan it was `started` with, as a sweep's
  point does. A run without plan.json gives the plan of its config.json.
  """
  record = read_plan(rundir)
  if record is not None:
    return record.plan, (record.tokens.count if record.tokens and record.tokens.exact
                         else train_tokens(rundir))
  return started or _older_plan(rundir), train_tokens(rundir)


# A reader for runs without plan.json, so that they still compare and evaluate.

def _older_plan(rundir: RunDir) -> Plan:
  """Returns the plan of a run without plan.json: its config, checked."""
  config = read_json(rundir, rundir.config)
  if config is None:
    raise DataError(f"{rundir}: has no plan.json or config.json: give run directories "
                    "of main.py")
  config = ml_collections.ConfigDict(config)
  config.tst.weighting = "uniform"
  return spec_lib.check(config).plan
