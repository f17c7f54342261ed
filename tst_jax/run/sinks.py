"""The tracker registry: the names train.tracker accepts, each with the function that opens
its `Sink`, which gets every record beside metrics.jsonl and TensorBoard's event file
(run/metrics.py writes all three).

`TRACKERS` maps each name to a function `open(rundir, run_id, config)` that returns the
`Sink` of a run, and `none` to None; the field's choices are its names. `register` adds one,
so a new tracker is one file and a line here, or one `register` call in the user's code
(docs/architecture.md).
"""

from __future__ import annotations

from typing import Callable, Protocol

from tst_jax import schema
from tst_jax.rundir import RunDir
from tst_jax.run import tracker


class Sink(Protocol):
  """What the run asks of a tracker's run."""

  run_id: str | None   # the run a resumed run continues: tracker.json records it

  def write(self, record: dict) -> None:
    """Takes one record of metrics.jsonl: its step, phase and numbers."""

  def close(self) -> None:
    """Ends the tracker's run, as the run ends or stops."""


# open(rundir, run_id, config): run_id is the tracker's run that tracker.json names, None on
# a first start; config is the run's config and plan, as config.json and plan.json hold them.
Opener = Callable[[RunDir, "str | None", dict], Sink]

TRACKERS: dict[str, Opener | None] = {"none": None, "wandb": tracker.wandb,
                                      "trackio": tracker.trackio}


def register(name: str, opener: Opener, *, replace: bool = False) -> None:
  """Adds tracker `name`: train.tracker may name it from then on (schema.register's rule)."""
  schema.register(TRACKERS, "tracker", name, opener, replace=replace)


def unregister(name: str) -> None:
  """Removes tracker `name`, as a test that registered one does after it."""
  del TRACKERS[name]
