"""Goodput: where a session's wall time went, and a run's over every session of its workdir.

A `Ledger` is the clock of one session, from the start of its process: at each moment the
session spends its time on one category, a block `timed` under another switches it, so the
categories add up to the session's wall time. JAX's compile events on the loop's thread
(tracing, lowering, the backend compile or a persistent cache's read) are taken out of the
category they fell in and counted as compile. `SessionLog` writes the ledger's totals to
goodput.jsonl, which a resume never truncates, as the run starts, at each logged step, before
each checkpoint and at the session's end; it gives metrics.jsonl each interval's split.
`account` reads goodput.jsonl back across sessions: a session's step time past the checkpoint
a later session resumed from was lost to the restart, and the time from one session's last
record to the next one's start the run was down.

Not ml-goodput-measurement, the library MaxText uses: its recorder writes and its calculator
reads every event through Google Cloud Logging's API, it imports google-cloud-storage and
-monitoring, and it has no compile or evaluation category. This module reads and writes the
workdir alone, local or in a bucket, on any platform.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from typing import Iterable, Iterator

import jax

from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.run.console import duration

# What a session's time is spent on, as the ledger counts it.
CATEGORIES = ("step", "compile", "data", "checkpoint_save", "checkpoint_restore", "eval",
              "startup")
# What `account` adds across sessions: steps trained again, and the time between sessions.
LOST, DOWN = "lost", "down"
LABELS = dict(step="productive steps", compile="compilation", data="data waits",
              checkpoint_save="checkpoint saves", checkpoint_restore="checkpoint restores",
              eval="evaluation", startup="startup", lost="lost to restarts",
              down="between sessions")
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def _union(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
  """Returns the seconds of [lo, hi] that `spans` cover, each second once."""
  covered, reach = 0.0, lo
  for start, end in sorted(spans):
    start, end = max(start, reach), min(end, hi)
    if end > start:
      covered, reach = covered + end - start, end
  return covered


class Ledger:
  """The wall time of one session by category, from `start`, the process's start where known
  (`lock.process_start`), else now. Listens to JAX's compile events until `close`."""

  def __init__(self, start: float | None = None):
    now = time.time()
    self.start = min(start, now) if start is not None else now
    self.seconds = dict.fromkeys(CATEGORIES, 0.0)
    self.current, self.since = "startup", self.start
    self._spans: list[tuple[float, float]] = []     # compile spans on this thread since `since`
    self._thread = threading.get_ident()
    self._listening = True
    jax.monitoring.register_event_time_span_listener(self._compiled)

  def _compiled(self, event: str, start: float, end: float, **_):
    if event in COMPILE_EVENTS and threading.get_ident() == self._thread:
      self._spans.append((start, end))

  def switch(self, category: str, charge: str | None = None) -> str:
    """Charges the time since the last switch to `charge`, by default the current category,
    its compile spans to compile, and spends the time from now on `category`. Returns the
    category it left."""
    now = time.time()
    compiled = _union(self._spans, self.since, now)
    self._spans = []
    self.seconds[charge or self.current] += now - self.since - compiled
    self.seconds["compile"] += compiled
    left, self.current, self.since = self.current, category, now
    return left

  @contextlib.contextmanager
  def timed(self, category: str):
    """Spends the block's time on `category`, then goes back to the category before."""
    left = self.switch(category)
    try:
      yield
    finally:
      self.switch(left)

  def iterate(self, category: str, items: Iterable) -> Iterator:
    """Yields the items of `items`, the wait for each spent on `category`."""
    iterator = iter(items)
    while True:
      with self.timed(category):
        try:
          item = next(iterator)
        except StopIteration:
          return
      yield item

  def totals(self) -> tuple[float, dict]:
    """Returns (now, the seconds of each category up to now), which add up to now - start."""
    self.switch(self.current)
    return self.since, dict(self.seconds)

  def close(self):
    """Stops listening to JAX's compile events."""
    if self._listening:
      self._listening = False
      jax.monitoring.unregister_event_time_span_listener(self._compiled)


def share(part: float, whole: float) -> float | None:
  """Returns part / whole, the share of a time; None for a whole of no time."""
  return part / whole if whole > 0 else None


def split_fields(seconds: dict) -> dict:
  """Returns metrics.jsonl's fields of an interval's `seconds` by category: goodput, its
  productive share, and goodput/<category>_s."""
  return dict(goodput=share(seconds["step"], sum(seconds.values())),
              **{f"goodput/{k}_s": seconds[k] for k in CATEGORIES})


class SessionLog:
  """One session's lines in goodput.jsonl, written where `rundir` is given (process 0): its
  start at step `start_step` of `total_steps`, the ledger's totals at each `record`, and its
  end. Every line holds the session (its start), the time, the last step done and the
  seconds of each category since the session's start."""

  def __init__(self, ledger: Ledger, rundir: RunDir | None, start_step: int, total_steps: int):
    self.ledger, self.out = ledger, None
    self.last = dict.fromkeys(CATEGORIES, 0.0)    # the totals at the last interval
    if rundir is not None:
      self.out = workdir_lib.open_goodput(rundir)
      self.out.write("\n")     # a line a killed session left unfinished stays one line
    self.record(start_step, "start", total_steps=total_steps)

  def record(self, step: int, kind: str = "step", **extra) -> dict:
    """Writes the ledger's totals after `step` steps and returns them."""
    now, seconds = self.ledger.totals()
    if self.out is not None:
      self.out.write(json.dumps(dict(session=self.ledger.start, kind=kind, time=now, step=step,
                                     seconds=seconds, **extra)) + "\n")
    return seconds

  def interval(self, step: int) -> dict:
    """Records the totals after `step` and returns metrics.jsonl's split of the time since
    the last interval (`split_fields`)."""
    seconds = self.record(step)
    since = {k: seconds[k] - self.last[k] for k in CATEGORIES}
    self.last = seconds
    return split_fields(since)

  def sync(self, step: int):
    """Records the totals after `step` and makes every line part of goodput.jsonl, before the
    checkpoint of `step` is saved."""
    self.record(step)
    if self.out is not None:
      self.out.flush()

  def end(self, step: int, how: str) -> dict:
    """Writes the session's last line, ended `how` after `step` steps, and returns its
    totals."""
    return self.record(step, "end", ended=how)

  def close(self, upload: bool = True):
    """Closes goodput.jsonl; without `upload`, after the workdir's store failed, the lines not
    yet in a bucket's file are dropped."""
    if self.out is not None and upload:
      self.out.close()
    elif self.out is not None:
      self.out.abandon()


def session_line(seconds: dict) -> str:
  """Says a session's goodput and where the rest went, in one line."""
  total = sum(seconds.values())
  parts = ", ".join(f"{LABELS[k]} {duration(v)}" for k, v in seconds.items()
                    if k != "step" and v >= 0.5)
  productive = share(seconds["step"], total) or 0.0
  return (f"goodput: {productive:.1%} of this session's {duration(total)} was training steps"
          + (f"; {parts}" if parts else ""))


@dataclasses.dataclass(frozen=True)
class Session:
  """One session read back: its start, its last record's time, the steps it started after
  and reached, its seconds by category (`lost` among them), and how it ended: None where it
  wrote no end (killed, or still running)."""
  start: float
  end: float
  first_step: int
  last_step: int
  seconds: dict
  ended: str | None

  @property
  def wall(self) -> float:
    return self.end - self.start

  @property
  def goodput(self) -> float:
    return share(self.seconds["step"], self.wall) or 0.0


@dataclasses.dataclass(frozen=True)
class Account:
  """A run's wall time, from its first session's start to its last record, by category over
  every session, the time between them (`down`) included: the parts add up to `wall`."""
  sessions: list[Session]
  seconds: dict
  total_steps: int | None

  @property
  def wall(self) -> float:
    return self.sessions[-1].end - self.sessions[0].start

  @property
  def goodput(self) -> float:
    return share(self.seconds["step"], self.wall) or 0.0

  @property
  def retrained(self) -> int:
    """Counts the steps trained more than once."""
    return sum(s.last_step for s in self.sessions) - self.sessions[-1].last_step - sum(
        s.first_step for s in self.sessions[1:])


def account(records: list[dict]) -> Account:
  """Returns the run's account of goodput.jsonl's `records`. The steps a session trained past
  the step a later session resumed from were trained again: their step time is lost."""
  by_session: dict[float, list[dict]] = {}
  for r in records:
    by_session.setdefault(r["session"], []).append(r)
  starts = sorted(by_session)
  sessions = []
  for i, start in enumerate(starts):
    lines = by_session[start]
    first, last = lines[0], lines[-1]
    seconds = dict(dict.fromkeys(CATEGORIES, 0.0), **last["seconds"])
    later = [by_session[s][0]["step"] for s in starts[i + 1:]]
    resumed = min(later) if later else last["step"]
    if resumed < last["step"]:
      before = [r["seconds"]["step"] for r in lines if r["step"] <= resumed]
      lost = seconds["step"] - (before[-1] if before else 0.0)
    else:
      lost = 0.0
    seconds["step"] -= lost
    seconds[LOST] = lost
    sessions.append(Session(start, last["time"], first["step"], last["step"], seconds,
                            last.get("ended")))
  total = {k: sum(s.seconds[k] for s in sessions) for k in (*CATEGORIES, LOST)}
  total[DOWN] = sum(max(b.start - a.end, 0.0) for a, b in zip(sessions, sessions[1:]))
  steps = [r["total_steps"] for r in records if "total_steps" in r]
  return Account(sessions, total, steps[-1] if steps else None)


def read_account(rundir: RunDir) -> Account:
  """Returns the account of the run in `rundir`, from its goodput.jsonl."""
  return account(workdir_lib.read_goodput(rundir))


def report(run: Account, where: str) -> str:
  """Returns the tool's text: the split of the run's wall time, then each session."""
  fmt = _unit(run.wall)
  rows = [("wall time", run.wall)] + [(f"  {LABELS[k]}", v) for k, v in run.seconds.items()]
  width = max(len(name) for name, _ in rows)
  lines = [f"goodput of {where}: {run.goodput:.1%} of its {fmt(run.wall)} of wall time was "
           f"training steps, over {len(run.sessions)} "
           f"session{'s' if len(run.sessions) > 1 else ''}"]
  for name, value in rows:
    lines.append(f"{name:<{width}}  {fmt(value):>10}  {share(value, run.wall) or 0.0:6.1%}")
    if name.strip() == LABELS[LOST] and run.retrained:
      lines[-1] += f"  ({run.retrained} steps trained again)"
  lines.append(f"{'  sum of the parts':<{width}}  {fmt(sum(run.seconds.values())):>10}")
  lines.append("")
  lines.append("session  started (UTC)        steps            wall  goodput  ended")
  for number, s in enumerate(run.sessions, 1):
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.start))
    steps = f"{s.first_step} -> {s.last_step}"
    ended = s.ended or "no end record: killed, or still running"
    lines.append(f"{number:>7}  {started}  {steps:<13}  {fmt(s.wall):>10}  "
                 f"{s.goodput:7.1%}  {ended}")
  if run.total_steps is not None:
    lines.append(f"steps done: {run.sessions[-1].last_step} of {run.total_steps}")
  return "\n".join(lines)


def _unit(wall: float):
  """Returns the format of every duration of a report whose wall time is `wall`: seconds up
  to two hours, else hours, one unit for the whole table."""
  if wall < 2 * 3600:
    return lambda x: f"{x:.1f} s"
  return lambda x: f"{x / 3600:.2f} h"
