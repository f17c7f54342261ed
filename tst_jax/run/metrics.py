"""The run's metrics writer: each record to metrics.jsonl, TensorBoard's event file and
train.tracker's sink (run/sinks.py), and at the end the summary and the loss plot."""

from __future__ import annotations

import json
import math
import socket
import struct
import sys
import time

from tst_jax import fileio, losses
from tst_jax.rundir import RunDir
from tst_jax.run import appending, sinks, workdir as workdir_lib


def _tensorboardx():
  """Imports tensorboardX's summary and event modules without importing torch, or raises
  ImportError where tensorboardX is not installed.

  tensorboardX imports torch where it is installed only to accept torch tensors, which this
  run never logs, and torch takes seconds to import at every start.
  """
  blocked = "torch" not in sys.modules
  if blocked:
    sys.modules["torch"] = None   # makes `import torch` raise ImportError, which it handles
  try:
    from tensorboardX import record_writer, summary   # pylint: disable=import-outside-toplevel
    from tensorboardX.proto import event_pb2           # pylint: disable=import-outside-toplevel
  finally:
    if blocked:
      del sys.modules["torch"]
  return record_writer, summary, event_pb2


class _EventFile:
  """Writes TensorBoard's event file into `directory` on the calling thread, through an
  appending.Appender as metrics.jsonl is, so `sync` holds for both.

  tensorboardX's SummaryWriter hands its events to a thread of its own through a queue of ten:
  an upload error kills that thread and the next add then waits for good, and its flush does
  not wait for the queue. The file starts with a SessionLog START at `purge_step`, the run's
  first step, from which on TensorBoard hides what earlier files logged.
  """

  def __init__(self, modules, directory: str, parts: str, purge_step: int):
    self._records, self._summary, self._events = modules   # _tensorboardx()'s
    fileio.makedirs(directory)
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
    self.out = appending.Appender(fileio.join(directory, name), parts=parts)
    self._add(self._events.Event(file_version="brain.Event:2"))
    self._add(self._events.Event(step=purge_step, session_log=self._events.SessionLog(
        status=self._events.SessionLog.START)))

  def scalar(self, tag: str, value: float, step: int):
    self._add(self._events.Event(step=step, summary=self._summary.scalar(tag, value)))

  def _add(self, event):
    """Appends `event` as one TFRecord: length, its checksum, the data, the data's checksum."""
    event.wall_time = time.time()
    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    crc = self._records.masked_crc32c
    self.out.write(header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data)))


def _tensorboard(rundir: RunDir, purge_step: int) -> _EventFile | None:
  """Returns the run's TensorBoard event file, None where tensorboardX is not installed."""
  try:
    modules = _tensorboardx()
  except ImportError:   # TensorBoard output is optional
    return None
  return _EventFile(modules, rundir.tensorboard, rundir.parts, purge_step)


def _tracker(rundir: RunDir, name: str, config: dict) -> sinks.Sink | None:
  """Opens tracker `name` of sinks.TRACKERS with the run's `config`, continuing the tracker's
  run that tracker.json names, and records the run it logs to there; None for none."""
  opener = sinks.TRACKERS[name]
  if opener is None:
    return None
  record = workdir_lib.read_tracker(rundir) or {}
  sink = opener(rundir, record.get("id") if record.get("tracker") == name else None, config)
  if sink.run_id is not None:
    workdir_lib.write_tracker(rundir, dict(tracker=name, id=sink.run_id))
  return sink


class MetricsWriter:
  """Appends one JSON object per line to the run's metrics.jsonl and mirrors scalars to
  TensorBoard and to `tracker`, a name of sinks.TRACKERS, whose run gets `config`. The run
  starts after step `resume_step`, 0 on a first start: lines past it that an earlier attempt
  logged are dropped first, so the file reads as one uninterrupted run, and TensorBoard hides
  that attempt's events past it. Both files are written on the calling thread: locally each
  line and event is written through, in a bucket uploaded as appending.Appender says, and all
  of them at `sync`."""

  def __init__(self, rundir: RunDir, resume_step: int, tracker: str = "none",
               config: dict | None = None):
    self.tracker = _tracker(rundir, tracker, config or {})
    self.file = workdir_lib.open_metrics(rundir, resume_step)
    self.tb = _tensorboard(rundir, resume_step + 1)

  def write(self, record: dict):
    self.file.write(json.dumps(record) + "\n")
    if self.tracker is not None:
      self.tracker.write(record)
    if self.tb is not None:
      for key, value in record.items():
        if isinstance(value, (int, float)) and key != "step" and math.isfinite(value):
          self.tb.scalar(key, value, record["step"])

  def sync(self):
    """Makes every line and event written so far part of metrics.jsonl and the TensorBoard
    event file, also in a bucket, or raises one PathError."""
    self.file.flush()
    if self.tb is not None:
      self.tb.out.flush()

  def close(self, upload: bool = True):
    """Closes metrics.jsonl, the event file and the tracker, each even where one before failed.
    Without `upload`, after the workdir's store failed, the lines and events not yet in the
    files are dropped: a resumed run drops every line past its checkpoint."""
    end = "close" if upload else "abandon"
    try:
      getattr(self.file, end)()
    finally:
      try:
        if self.tb is not None:
          getattr(self.tb.out, end)()
      finally:
        if self.tracker is not None:
          self.tracker.close()


def summarize(rundir: RunDir, plan, final_eval: float, write: bool = True, **fields) -> dict:
  """Returns the run's summary: final held-out loss, the phase-1-end evals (next-token, and
  the bag loss of its task with that task's floor, losses.bag_floor), steps, token counts and
  `fields`. With `write`, also writes
  summary.json and the plot loss.png."""
  records = workdir_lib.read_metrics(rundir)
  evals = {r["step"]: r for r in records if "eval_loss" in r}
  tst = [p for p in plan.phases if p.is_tst]     # phase 1: one or more tst phases
  switch = tst[-1].last_step if tst and len(tst) < len(plan.phases) else None
  summary = dict(final_eval_loss=final_eval, steps=plan.total_steps,
                 phase1_end_eval_loss=evals.get(switch, {}).get("eval_loss"),
                 phase1_end_eval_bag_loss=evals.get(switch, {}).get("eval_bag_loss"),
                 phase1_bag_floor=(losses.bag_floor(tst[-1].weighting, tst[-1].variant,
                                                    tst[-1].bag_size) if tst else None),
                 **fields, **plan.tokens_at(plan.total_steps))
  if write:
    workdir_lib.write_summary(rundir, summary)
    plot_losses(records, rundir.loss_plot, switch_step=switch)
  return summary


def plot_losses(records: list[dict], out_path: str, switch_step: int | None = None):
  """Plots metrics.jsonl's train and eval losses vs step and vs data tokens, the switch
  marked: the held-out next-token loss, and in phase 1 the held-out bag loss of its task."""
  from matplotlib.figure import Figure   # no pyplot: leaves notebooks' backends alone

  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  bags = [r for r in records if "eval_bag_loss" in r]
  fig = Figure(figsize=(12, 4.5))
  axes = fig.subplots(1, 2)
  for ax, x_key, label in ((axes[0], "step", "step"), (axes[1], "data_tokens", "data tokens")):
    for phase, color in (("tst", "tab:orange"), ("ntp", "tab:blue")):
      rows = [r for r in train if r["phase"] == phase]
      if rows:
        ax.plot([r[x_key] for r in rows], [r["loss"] for r in rows], color=color, alpha=0.6,
                label=f"train loss ({'MCE, bags' if phase == 'tst' else 'next-token CE'})")
    if evals:
      ax.plot([r[x_key] for r in evals], [r["eval_loss"] for r in evals], "k.-",
              label="held-out next-token loss")
    if bags:
      ax.plot([r[x_key] for r in bags], [r["eval_bag_loss"] for r in bags], "s--",
              color="tab:red", ms=4, label="held-out bag loss (MCE, phase 1's task)")
    if switch_step is not None:
      switch = [r[x_key] for r in train if r["step"] == switch_step]
      if switch:
        ax.axvline(switch[0], color="gray", ls="--", label="phase switch")
    ax.set_xlabel(label)
    ax.set_ylabel("loss (nats)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8, loc="upper right")
  fig.suptitle("Token-Superposition Training: phase 1 (tst) then phase 2 (ntp)")
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
