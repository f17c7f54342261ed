"""What a user watches: the plan, one line per log_every (a bar on a terminal), each eval, the
phase switch and a final block. Only process 0 prints, and main.py keeps library INFO logs off."""

from __future__ import annotations

import importlib.util
import sys
import time

import tqdm

from tst_jax import losses
from tst_jax.rundir import RunDir


def duration(seconds: float) -> str:
  seconds = int(round(seconds))
  h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def human(x: float | None) -> str:
  """Formats a count with a unit suffix K, M, B = 1e9, T, ..., Y, as every table prints tokens,
  parameters and FLOPs. None is '--'."""
  if x is None:
    return "--"
  for unit, scale in (("Y", 1e24), ("Z", 1e21), ("E", 1e18), ("P", 1e15), ("T", 1e12),
                      ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(x) >= scale * (1 - 5e-4):   # 999.7E is 1e+03E at three digits: 1Z
      return f"{x / scale:.3g}{unit}"
  return f"{x:g}"


def rate(x: float) -> str:
  for unit, scale in (("M", 1e6), ("k", 1e3)):
    if x >= scale:
      return f"{x / scale:.1f}{unit}"
  return f"{x:.0f}"


class Console:
  """Prints to stdout. `bar`, on a terminal with train.progress_bar, turns the per-step lines into
  a tqdm bar, with the other lines written above it."""

  def __init__(self, total_steps: int, start: int, *, enabled: bool = True,
               bar: bool | None = None):
    self.total, self.start, self.enabled = total_steps, start, enabled
    self.t0 = time.time()
    use_bar = enabled and (sys.stdout.isatty() if bar is None else bar)
    self.bar = (tqdm.tqdm(total=total_steps, initial=start, unit="step", mininterval=1.0,
                          file=sys.stdout) if use_bar else None)

  def print(self, text: str):
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.write(text, file=sys.stdout)
    else:
      print(text, flush=True)

  def step(self, step: int, phase, metrics: dict, speed: dict, logged: bool):
    """Every step's metrics (bar) and, on a logged step, one line without a bar.

    `speed` holds a logged step's `loop.step_speed` and memory, where null values stay off
    the line.
    """
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      self.bar.set_description(_phase_name(phase), refresh=False)
      self.bar.set_postfix(loss=f"{metrics['loss']:.3f}", refresh=False)
      return
    if logged:
      done = step - self.start
      eta = (time.time() - self.t0) / max(done, 1) * (self.total - step)
      width = len(str(self.total))
      print(f"step {step:>{width}}/{self.total}  {_phase_name(phase):<8} loss "
            f"{metrics['loss']:.4f}  {_speed(speed)}  ETA {duration(eta)}", flush=True)

  def eval(self, step: int, record: dict, phase=None):
    """Prints an eval's `record` (`Evaluator.record`): the held-out loss, each set of
    data.eval_sets by name, and in a tst `phase` its held-out bag loss with its floor: a bag
    of distinct tokens scores at least its targets' entropy, where a next-token loss's is 0."""
    names = [k.partition("/")[2] for k in record if k.startswith("eval_loss/")]
    line = (f"eval  step {step}: held-out next-token loss {_with_bpb(record, '')}"
            + "".join(f"; {name} {_with_bpb(record, '/' + name)}" for name in names))
    if "eval_bag_loss" in record:
      line += (f"; held-out bag loss {record['eval_bag_loss']:.4f} (the {_phase_name(phase)} "
               f"task{_floor(losses.bag_floor(phase.weighting, phase.variant, phase.bag_size))})")
    self.print(line)

  def tasks(self, step: int, record: dict, seconds: float):
    """Prints the scores of train.eval_tasks (`downstream.task_metrics`), their standard
    errors left to metrics.jsonl."""
    scores = {}
    for key, value in record.items():
      _, task, metric = key.split("/", 2) if key.count("/") >= 2 else ("", key, "")
      if "_stderr" not in metric and key != "tasks/paper_average":
        scores.setdefault(task, []).append(f"{metric} {value:.4f}")
    line = "; ".join(f"{task} {', '.join(parts)}" for task, parts in scores.items())
    if "tasks/paper_average" in record:
      line += f"; the paper's average {record['tasks/paper_average']:.4f}"
    self.print(f"tasks step {step} ({duration(seconds)}): {line}")

  def final(self, summary: dict, rundir: RunDir, reference=None, run: dict | None = None):
    """Held-out loss (beside `reference`'s, a config.reference, when it names one, for the run
    whose same-run fields are `run`), where the files are, how to resume or look at it."""
    self.close()
    lines = [f"done: {summary['steps']} steps ({duration(summary['seconds_this_session'])} "
             f"this session); held-out loss " + _with_bpb(dict(
                 eval_loss=summary["final_eval_loss"], eval_bpb=summary.get("final_eval_bpb")),
                 "")]
    if summary.get("phase1_end_eval_loss") is not None:
      lines[-1] += f" (end of phase 1: {summary['phase1_end_eval_loss']:.4f}"
      if summary.get("phase1_end_eval_bag_loss") is not None:
        lines[-1] += (f"; its held-out bag loss {summary['phase1_end_eval_bag_loss']:.4f}"
                      + _floor(summary.get("phase1_bag_floor") or 0.0))
      lines[-1] += ")"
    if reference is not None and reference.name:
      lines += _reference_lines(reference, summary, run or {})
    lines += [f"  unigram entropy of the data: {summary['unigram_entropy']:.3f} nats",
              f"  metrics: {rundir.metrics}, plot: {rundir.loss_plot}",
              tensorboard_line(rundir.tensorboard),
              f"  checkpoints: {rundir.checkpoints} (the same command "
              "resumes from the latest)"]
    self.print("\n".join(lines))

  def close(self):
    if self.bar is not None:
      self.bar.close()
      self.bar = None


def _reference_lines(reference, summary: dict, run: dict) -> list[str]:
  """The reference's loss, and the run's difference from it where the run is the one it was
  measured for, on the same data: another run's or other data's loss is no yardstick.
  Otherwise the lines say why, and how to measure it for this run."""
  spread = (f" ± {reference.loss_sd:.4f} (the mean and sd over {reference.seeds} seeds)"
            if reference.seeds > 1 else "")
  head = (f"  {reference.name}: held-out loss {reference.loss:.4f}{spread}, measured for this "
          f"config as written ({reference.measured})")
  differs = reference.differences(run) if reference.run else []
  same_data = reference.data and reference.data == summary.get("data")
  if same_data and reference.run and not differs:
    return [f"{head}; this run {summary['final_eval_loss'] - reference.loss:+.4f} from it",
            f"  measure it: {reference.command}"]
  why = "" if same_data else (
      f" on other data, {reference.data}; this run read {summary.get('data')}"
      if reference.data else " on data it does not name (config.reference.data)")
  if not reference.run:
    why += "; for a run it does not record (config.reference.run)"
  elif differs:
    shown = differs[:3] + ([f"{len(differs) - 3} more"] if len(differs) > 3 else [])
    why += f"; this run differs in {', '.join(shown)}"
  return [f"{head}{why}: no difference printed",
          f"  measure it {'for this run' if differs or not reference.run else 'on this data'}: "
          f"{reference.command_for(run)}"]


def _with_bpb(record: dict, suffix: str) -> str:
  """Formats the held-out loss eval_loss<suffix> of an eval's record with its bits per byte,
  or 'bytes unknown' where the store does not record them."""
  bpb = record.get(f"eval_bpb{suffix}")
  return (f"{record[f'eval_loss{suffix}']:.4f}, "
          + ("bytes unknown" if bpb is None else f"{bpb:.4f} bits/byte"))


def _speed(speed: dict) -> str:
  """Returns the step time, tokens per second, MFU and memory of a logged step, on one line."""
  data, equivalent = speed.get("data_tokens_per_s", 0.0), speed.get("equivalent_tokens_per_s")
  parts = [f"{rate(data)} tok/s"]
  if equivalent is not None and round(equivalent) != round(data):
    parts[-1] += f" ({rate(equivalent)} equiv)"
  if speed.get("step_s") is not None:
    parts.append(f"{speed['step_s'] * 1e3:.0f} ms/step")
  if speed.get("mfu") is not None:
    parts.append(f"MFU {speed['mfu']:.1%}")
  if speed.get("memory_bytes_in_use") is not None:
    peak = speed.get("memory_peak_bytes") or speed["memory_bytes_in_use"]
    parts.append(f"mem {speed['memory_bytes_in_use'] / 1e9:.1f}/{peak / 1e9:.1f} GB")
  return "  ".join(parts)


def _floor(floor: float) -> str:
  """Says the floor of a bag loss beside it, since its scale is not a next-token loss's."""
  return f", whose floor is up to {floor:.4f}, its targets' entropy" if floor > 0 else ""


def _phase_name(phase) -> str:
  return phase.name + (f" S={phase.bag_size}" if phase.bag_size > 1 else "")


def tensorboard_line(folder: str) -> str:
  """Says how to look at the run's TensorBoard files: the command, and the install it needs
  where TensorBoard is not installed (tst-jax writes the files with tensorboardX)."""
  line = f"  tensorboard --logdir {folder}"
  if importlib.util.find_spec("tensorboard") is None:
    line += "   (pip install tensorboard first: tst-jax writes the files, it does not show them)"
  return line
