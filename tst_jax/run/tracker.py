"""Hosted trackers beside metrics.jsonl: train.tracker=wandb or trackio gets the same records.

The tracker's run holds the plan and config as its config, every metrics.jsonl record's
numbers at its step, and the phase switch as a `phase_switch` event. A resumed run continues
the tracker's run that its tracker.json names. A missing package or login stops the run
before its first step with one line that says how to fix it. After that, a tracker error is a
warning and the run goes on without the tracker. `hosted` makes the sink opener of a tracker
from the function that starts its run; run/sinks.py lists them.
"""

from __future__ import annotations

import importlib
import logging
import os

from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir

log = logging.getLogger("tst_jax")

PROJECT = "tst-jax"             # WANDB_PROJECT or TRACKIO_PROJECT overrides it


def require(name: str):
  """Imports package `name`, or raises train.tracker's one line that says how to install it."""
  try:
    return importlib.import_module(name)
  except ImportError:
    raise ConfigError("train.tracker", f"{name} is not installed: pip install {name}, or "
                      "train.tracker=none") from None


def _start_wandb(rundir: RunDir, run_id: str | None, config: dict):
  wandb = require("wandb")
  try:
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT),   # a local folder:
                     dir=None if rundir.remote else rundir.root,         # wandb's own files
                     name=rundir.name, id=run_id,
                     resume="allow", config=config)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("train.tracker", f"wandb did not start ({type(e).__name__}: {e}): run "
                      "`wandb login`, or set WANDB_MODE=offline") from None
  return run.id, lambda values, step: run.log(values, step=step), run.finish


def _start_trackio(rundir: RunDir, run_id: str | None, config: dict):
  trackio = require("trackio")
  name = run_id or rundir.name
  try:
    trackio.init(project=os.environ.get("TRACKIO_PROJECT", PROJECT), name=name, config=config,
                 resume="allow")
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("train.tracker", f"trackio did not start ({type(e).__name__}: {e}): "
                      "check TRACKIO_SPACE_ID and `huggingface-cli login`, or "
                      "train.tracker=none") from None
  return name, lambda values, step: trackio.log(values, step=step), trackio.finish


class Tracker:
  """Sends metrics.jsonl's records to tracker `name`'s run, started by `start` (`hosted`'s),
  which returns the run's id, `log(values, step)` and `finish()`."""

  def __init__(self, name: str, start, rundir: RunDir, run_id: str | None, config: dict):
    self.name, self.phase = name, None
    self.run_id, self.log_fn, self.finish_fn = start(rundir, run_id, config)

  def write(self, record: dict):
    """Logs the record's numbers at its step, and a phase_switch event where the phase changes."""
    if self.log_fn is None:
      return
    values = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))
              and not isinstance(v, bool)}
    phase = record.get("phase")
    if phase is not None and self.phase not in (None, phase):
      values["phase_switch"] = 1
    self.phase = phase or self.phase
    self._safely(self.log_fn, values, record["step"])

  def close(self):
    if self.finish_fn is not None:
      self._safely(self.finish_fn)
      self.log_fn = self.finish_fn = None

  def _safely(self, fn, *args):
    try:
      fn(*args)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("train.tracker=%s failed (%s: %s); the run goes on without it, metrics.jsonl "
                  "has every record", self.name, type(e).__name__, e)
      self.log_fn = self.finish_fn = None


def hosted(name: str, start):
  """Returns the sink opener of hosted tracker `name`, whose `start(rundir, run_id, config)`
  starts its run, or continues run `run_id` where tracker.json names one, and returns the run's
  id, `log(values, step)` and `finish()`."""
  return lambda rundir, run_id, config: Tracker(name, start, rundir, run_id, config)


wandb = hosted("wandb", _start_wandb)
trackio = hosted("trackio", _start_trackio)
