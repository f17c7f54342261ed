"""Metrics sinks: metrics.jsonl, TensorBoard events, and the end-of-run loss plot."""

from __future__ import annotations

import io
import json
import math
import sys

from tst_jax import fileio
from tst_jax.train import appending, workdir as workdir_lib


def _summary_writer():
  """Imports tensorboardX's SummaryWriter without importing torch.

  tensorboardX imports torch where it is installed only to accept torch tensors, which this
  run never logs, and torch takes seconds to import at every start.
  """
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter   # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None   # makes `import torch` raise ImportError, which it handles
  try:
    from tensorboardX import SummaryWriter   # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class _AppendingEvents:
  """tensorboardX's writer factory for a workdir in a bucket: its event file appended to as
  metrics.jsonl is, where its own writer would upload the whole file at each flush."""

  def open(self, path: str) -> appending.Appender:
    return appending.Appender(path)

  def directory_check(self, path: str):
    del path   # a bucket has no folders to make


def _tensorboard(directory: str):
  """Returns a SummaryWriter into `directory`, None where tensorboardX is not installed."""
  try:
    summary_writer = _summary_writer()
  except ImportError:   # TensorBoard output is optional
    return None
  if fileio.is_url(directory):
    from tensorboardX import record_writer   # pylint: disable=import-outside-toplevel
    record_writer.register_writer_factory(fileio.protocol(directory), _AppendingEvents())
  return summary_writer(directory)


class MetricsWriter:
  """Appends one JSON object per line to <workdir>/metrics.jsonl and mirrors scalars to
  TensorBoard and to `tracker`, a tracker.Tracker. On resume, lines past the restored step are
  dropped first, so the file reads as one uninterrupted run. Locally each line is written
  through, in a bucket uploaded as appending.Appender says, and all of them at `sync`."""

  def __init__(self, workdir: str, resume_step: int | None, tracker=None):
    self.tracker = tracker
    self.file = workdir_lib.open_metrics(workdir, resume_step)
    self.tb = _tensorboard(workdir_lib.path(workdir, workdir_lib.TENSORBOARD))

  def write(self, record: dict):
    self.file.write(json.dumps(record) + "\n")
    if self.tracker is not None:
      self.tracker.write(record)
    if self.tb is not None:
      for key, value in record.items():
        if isinstance(value, (int, float)) and key != "step" and math.isfinite(value):
          self.tb.add_scalar(key, value, record["step"])

  def sync(self):
    """Makes every line written so far part of metrics.jsonl and the TensorBoard events, also
    in a bucket."""
    self.file.flush()
    if self.tb is not None:
      self.tb.flush()

  def close(self):
    self.file.close()
    if self.tracker is not None:
      self.tracker.close()
    if self.tb is not None:
      self.tb.close()


def summarize(workdir: str, plan, final_eval: float, write: bool = True, **fields) -> dict:
  """Returns the run's summary: final held-out loss, the phase-1-end eval, steps, token counts
  and `fields`. With `write`, also writes <workdir>/summary.json and the plot <workdir>/loss.png."""
  records = workdir_lib.read_metrics(workdir)
  evals = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
  tst = [p for p in plan.phases if p.is_tst]     # phase 1: one or more tst phases
  switch = tst[-1].last_step if tst and len(tst) < len(plan.phases) else None
  summary = dict(final_eval_loss=final_eval, steps=plan.total_steps,
                 phase1_end_eval_loss=evals.get(switch), **fields,
                 **plan.tokens_at(plan.total_steps))
  if write:
    workdir_lib.write_summary(workdir, summary)
    plot_losses(records, workdir_lib.path(workdir, workdir_lib.LOSS_PLOT), switch_step=switch)
  return summary


def plot_losses(records: list[dict], out_path: str, switch_step: int | None = None):
  """Plots metrics.jsonl's train and eval loss vs step and vs data tokens, the switch marked."""
  from matplotlib.figure import Figure   # no pyplot: leaves notebooks' backends alone

  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
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
    if switch_step is not None:
      switch = [r[x_key] for r in train if r["step"] == switch_step]
      if switch:
        ax.axvline(switch[0], color="gray", ls="--", label="phase switch")
    ax.set_xlabel(label)
    ax.set_ylabel("loss (nats)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle("Token-Superposition Training: phase 1 (tst) then phase 2 (ntp)")
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100)
  fileio.write_bytes(out_path, png.getvalue())
