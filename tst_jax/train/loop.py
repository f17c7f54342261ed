"""The two-phase run's loop: phase 1 (tst) for round(r*T) steps, the handoff checkpoint,
phase 2 (ntp), from the latest checkpoint of the workdir to the end.

`train(setup)` reads top to bottom: for each phase its jitted step and batches, each step's
metrics fetched one step late, the eval and checkpoint cadence, the preemption stop. The
global step alone decides the phase, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import sys
import time

import jax
import numpy as np

from tst_jax import fileio, platform
from tst_jax.errors import StoreError, UserError
from tst_jax.parallel import distributed
from tst_jax.rundir import RunDir
from tst_jax.run import goodput as goodput_lib, metrics as metrics_lib, step_profile
from tst_jax.run.console import Console
from tst_jax.train.checkpoint import RunCheckpoints
from tst_jax.train.handoff import handoff
from tst_jax.config import record as record_lib
from tst_jax.config.outlook import format_plan
from tst_jax.config.plan import Plan, PlanRecord
from tst_jax.train.preemption import Preempted, PreemptionGuard
from tst_jax.train.setup import Setup
from tst_jax.run import lock as lock_lib, workdir as workdir_lib

log = logging.getLogger("tst_jax")


def train(setup: Setup, lock: lock_lib.Lock | None = None,
          ledger: goodput_lib.Ledger | None = None) -> dict:
  """Trains the run's phases from the latest checkpoint or step 0 to the end, stopping at the
  step after `lock`, the workdir's, is lost. `ledger` times the session from its start, which
  goodput.jsonl records. Returns the summary, or {preempted_at_step} after a preemption
  checkpoint."""
  plan = setup.spec.plan
  ledger = ledger or goodput_lib.Ledger()
  ledger.switch("checkpoint_restore")
  state, start = setup.restore_or_init()
  # A resumed run's restore, or a new run's init, which is part of its startup.
  ledger.switch("startup", charge="checkpoint_restore" if start else "startup")
  s = _open_session(setup, start, ledger)
  console, step_log, checkpoints = s.console, s.step_log, s.checkpoints
  tasks = setup.load_tasks()          # train.eval_tasks: loaded, or refused, before step 1
  t0 = time.time()
  ledger.switch("step")
  try:
    for phase in plan.phases:
      if start >= phase.last_step:
        continue
      if phase.first_step > 0 and start == phase.first_step:
        with ledger.timed("checkpoint_restore"):    # a save, then its restore
          state = handoff(state, phase, checkpoints, setup.trainer, console)
      train_step = setup.trainer.train_step(phase, setup.data.tokenizer.eos_id)
      batches = ledger.iterate("data", setup.batches(phase, max(start, phase.first_step)))
      for step in range(max(start, phase.first_step), phase.last_step):
        state, metrics = s.window.call(train_step, state, next(batches), step + 1)
        if lock is not None:
          lock.check()                                # a run that lost its workdir stops here
        step_log.step(step + 1, phase, metrics)       # fetched one step late (async dispatch)
        done = step + 1
        _evaluate_due(setup, state, phase, done, step_log, tasks)
        stop = s.guard.should_stop(done)              # agreed by every process
        with ledger.timed("checkpoint_save"):
          checkpoints.save_step(state, done, force=done == phase.last_step, preempted=stop)
        if stop:
          step_log.flush()
          raise Preempted(done)
      step_log.flush()
      start = phase.last_step
    with ledger.timed("checkpoint_save"):
      checkpoints.wait_last()
    with ledger.timed("eval"):
      summary = _finish(setup, state, console, s.primary, t0)
    _session_end(s.goodput, step_log.fetched, "finished", console)
    return summary
  except Preempted as stop:
    return _preempted(s, stop.step)
  except StoreError:
    raise
  except Exception as e:  # pylint: disable=broad-except  a store's failure, of any client
    stopped = _store_stopped(e, checkpoints)
    if stopped is None:
      raise
    raise stopped from e
  finally:
    _close_session(s)


@dataclasses.dataclass(frozen=True)
class _Session:
  """What one session of `train` opens beside its state, closed by `_close_session`."""
  primary: bool
  console: Console
  writer: metrics_lib.MetricsWriter | _NoWriter
  goodput: goodput_lib.SessionLog
  step_log: StepLog
  checkpoints: RunCheckpoints
  guard: PreemptionGuard
  window: step_profile.Window
  ledger: goodput_lib.Ledger


def _preempted(s: _Session, step: int) -> dict:
  """Waits for the preemption checkpoint of `step`, says how to resume, and returns the
  summary of a preempted session."""
  with s.ledger.timed("checkpoint_save"):
    s.checkpoints.wait()
  s.console.print(f"preempted: checkpoint of step {step} written to "
                  f"{s.checkpoints.directory}; run the same command again to resume")
  _session_end(s.goodput, step, "preempted", s.console)
  return dict(preempted_at_step=step)


def _open_session(setup: Setup, start: int, ledger: goodput_lib.Ledger) -> _Session:
  """Opens the console, the metrics writer (after the plan's lines), the goodput log, the
  step log, the checkpoints, the preemption guard and the profile window of a session."""
  settings, plan = setup.spec.train, setup.spec.plan
  primary = distributed.is_primary()
  console = Console(plan.total_steps, start, enabled=primary,
                    bar=settings.progress_bar and sys.stdout.isatty())
  writer = _announce(setup, start, console, primary)
  goodput = goodput_lib.SessionLog(ledger, setup.rundir if primary else None, start,
                                   plan.total_steps)
  step_log = StepLog(plan, settings, writer, console, setup.rundir, start, goodput)
  # A checkpoint's lines are in metrics.jsonl before it is saved.
  checkpoints = setup.open_checkpoints(before_save=step_log.sync)
  return _Session(primary, console, writer, goodput, step_log, checkpoints, PreemptionGuard(),
                  _profile_window(setup, console, primary), ledger)


def _close_session(s: _Session):
  """Closes what `_open_session` opened, also after an error, which stays the one reported (a
  helper called from `finally` sees it in sys.exc_info); a failed store is asked nothing more."""
  error = sys.exc_info()[1]
  failed = isinstance(error, StoreError)
  ended = ([functools.partial(s.goodput.end, s.step_log.fetched,
                              f"stopped by {type(error).__name__}")]
           if error is not None and not failed else [])
  _close(*ended, s.window.close, s.guard.close, s.console.close,
         functools.partial(s.writer.close, upload=not failed),
         functools.partial(s.goodput.close, upload=not failed), s.ledger.close,
         *([] if failed else [s.checkpoints.close]), raising=error is None)


def _session_end(session: goodput_lib.SessionLog, step: int, how: str, console: Console):
  """Writes the session's last line to goodput.jsonl and prints where its time went."""
  seconds = session.end(step, how)
  log.info("goodput of process %d: %s", jax.process_index(), json.dumps(seconds))
  console.print(goodput_lib.session_line(seconds))


def _store_stopped(e: Exception, checkpoints) -> StoreError | None:
  """Returns the one error of a run whose workdir's disk or bucket failed under it, naming its
  last complete checkpoint; None for an error of another kind."""
  cause = fileio.store_error(e)
  if cause is None:
    return None
  what = (str(e) if isinstance(e, UserError)
          else f"{checkpoints.directory}: {fileio.reason(cause, checkpoints.directory)}")
  return StoreError(f"{what}; {checkpoints.last_complete()}: run the same command again to "
                    "resume from it once the store answers")


def _announce(setup: Setup, start: int, console: Console, primary: bool
              ) -> metrics_lib.MetricsWriter | _NoWriter:
  """Writes plan.json, prints the plan, or the step a resumed run starts after, and returns the
  metrics writer: process 0's, with train.tracker's run, or one that writes nothing."""
  plan, tokens = setup.spec.plan, setup.data.train_tokens
  record = PlanRecord(plan, tokens, setup.spec.resolved)
  if primary:                         # <workdir>/plan.json, before the first step
    record_lib.write_plan(setup.rundir, record)
  console.print(format_plan(plan, setup.spec.resolved, with_json=False, tokens=tokens) if start == 0
                else f"resuming {setup.rundir} at step {start} of {plan.total_steps}")
  return _writer(setup, start, record) if primary else _NoWriter()


def _finish(setup: Setup, state, console: Console, primary: bool, t0: float) -> dict:
  """Returns the summary of a run past its last step, its final held-out loss measured now;
  process 0 writes it, with the loss plot, and every process logs and prints it."""
  final = setup.evaluate(state.params)
  summary = metrics_lib.summarize(
      setup.rundir, setup.spec.plan, final, write=primary,
      final_eval_bpb=setup.evaluate.bits_per_byte(final),
      unigram_entropy=setup.data.unigram_entropy, data=setup.data.data_name,
      seconds_this_session=time.time() - t0,
      resolved=setup.spec.resolved.to_json())
  log.info("summary of process %d: %s", jax.process_index(), json.dumps(summary))
  console.final(summary, setup.rundir, setup.spec.reference, setup.spec.same_run())
  return summary


def _writer(setup: Setup, start: int, record: PlanRecord) -> metrics_lib.MetricsWriter:
  """Returns the metrics sink of process 0, with train.tracker's run."""
  config = dict(config=setup.spec.to_json(), plan=record.to_json())
  return metrics_lib.MetricsWriter(setup.rundir, resume_step=start,
                                   tracker=setup.spec.train.tracker, config=config)


def _evaluate_due(setup: Setup, state, phase, done: int, step_log: StepLog, tasks):
  """Runs the evals due after step `done`: the held-out losses every train.eval_every steps and
  at the phase's end, train.eval_tasks where `tasks` are due."""
  if done % setup.spec.train.eval_every == 0 or done == phase.last_step:
    _evaluate(setup, state, phase, done, step_log)
  if tasks is not None and tasks.due(done, phase):
    _score_tasks(tasks, setup, state, phase, done, step_log)


def _evaluate(setup: Setup, state, phase, done: int, step_log: StepLog):
  """Writes and prints the held-out losses after step `done`, its time kept out of step_s."""
  with step_log.aside("eval"):
    record = setup.evaluate.record(state.params, phase)
    step_log.writer.write(dict(step=done, phase=phase.name, **record,
                               **setup.spec.plan.tokens_at(done)))
    step_log.console.eval(done, record, phase)


def _score_tasks(tasks, setup: Setup, state, phase, done: int, step_log: StepLog):
  """Writes and prints the scores of train.eval_tasks after step `done` (`tasks`, a
  downstream.InRun), lm-eval's results in the run's lm_eval/step_<done>.json, their time
  kept out of step_s. A scoring that fails is said in one line, and training goes on."""
  with step_log.aside("eval"):
    t0 = time.time()
    try:
      record, results = tasks(state.params, done, phase)
    except Exception as e:  # pylint: disable=broad-except
      # lm-eval's tasks are its code and data: a request it cannot score (a continuation
      # longer than data.seq_len) costs that step's scores, not the run.
      log.warning("tasks step %d: not scored: %s: %s", done, type(e).__name__, e)
      step_log.console.print(f"tasks step {done}: not scored: {type(e).__name__}: "
                             f"{' '.join(str(e).split())}")
      return
    seconds = time.time() - t0
    step_log.writer.write(dict(step=done, phase=phase.name, **record, tasks_s=seconds,
                               **setup.spec.plan.tokens_at(done)))
    if distributed.is_primary():
      tasks.write(results, done)
    step_log.console.tasks(done, record, seconds)


def _profile_window(setup: Setup, console: Console, primary: bool) -> step_profile.Window:
  """Returns train.profile_steps' window, traced on process 0 into the run's profile/."""
  window = step_profile.profile_window(setup.spec.train.profile_steps) if primary else None
  traced = setup.rundir.trace_dir() if window else ""

  def done(profile: step_profile.StepProfile):
    workdir_lib.write_profile(setup.rundir, profile.table(), profile.to_json(), traced)
    console.print(f"profile of steps {window[0]} to {sum(window) - 1}, ms per step:\n"
                  f"{profile.table()}\n  trace and table: {setup.rundir.profile}")

  return step_profile.Window(window, traced, done, console.print)


def _close(*closes, raising: bool):
  """Calls each of `closes`: finish pending checkpoint writes and flush the metrics, also after
  an error."""
  for close in closes:
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      if raising:
        raise
      log.warning("while stopping after an error: %s: %s", type(e).__name__, e)


class StepLog:
  """A step's metrics, fetched one step late (so the host never waits on the device): the
  non-finite guard on every step, a metrics.jsonl line and a console line per log_every,
  with the interval's goodput from `session`. The run started after step `start`, restored
  from its checkpoint when not 0."""

  def __init__(self, plan: Plan, settings, writer, console: Console, rundir: RunDir,
               start: int, session: goodput_lib.SessionLog):
    self.plan, self.settings, self.writer, self.console = plan, settings, writer, console
    self.rundir, self.session = rundir, session
    self.checkpointed = start or None   # the last good checkpoint's step, which a stop names
    self.pending, self.fetched, self.t_last, self.nan_skips = None, start, time.time(), 0
    self.peak = platform.peak_flops(jax.devices()[0].device_kind)

  def step(self, step: int, phase, metrics):
    self.flush()
    self.pending = (step, phase, metrics)

  def flush(self):
    if self.pending is None:
      return
    step, phase, metrics = self.pending
    self.pending = None
    metrics = _scalars(jax.device_get(metrics))
    if not metrics.pop("finite"):
      self.non_finite(step, metrics)
    self.fetched = step
    logged = step % self.settings.log_every == 0 or step == phase.last_step
    speed = {}
    if logged:
      now = time.time()
      steps = min(self.settings.log_every, step - phase.first_step) or 1
      speed = dict(step_speed(phase, (now - self.t_last) / steps, self.peak,
                              jax.device_count()), **platform.memory_in_use())
      self.t_last = now
      self.writer.write(dict(step=step, phase=phase.name, bag_size=phase.bag_size, **metrics,
                             **self.plan.tokens_at(step), **speed,
                             **self.session.interval(step)))
    self.console.step(step, phase, metrics, speed, logged)

  def sync(self):
    """Writes the pending step's line and makes every line part of metrics.jsonl and
    goodput.jsonl, before the checkpoint of that step is saved."""
    with self.session.ledger.timed("step"):   # the wait for the step's end is the step's
      self.flush()
    self.writer.sync()
    self.session.sync(self.fetched)
    self.checkpointed = self.fetched

  @contextlib.contextmanager
  def aside(self, category: str):
    """Runs a block that is no step, after the pending step's line: its time is kept out of
    step_s and spent on `category` of the goodput ledger."""
    self.flush()
    t0 = time.time()
    try:
      with self.session.ledger.timed(category):
        yield
    finally:
      self.t_last += time.time() - t0

  def non_finite(self, step: int, metrics: dict):
    """Skips a step whose update was not applied, up to max_nan_skips, or stops, by nan_policy."""
    self.nan_skips += 1
    bad = "loss" if not np.isfinite(metrics["loss"]) else "grad_norm"
    if self.settings.nan_policy != "skip" or self.nan_skips > self.settings.max_nan_skips:
      raise FloatingPointError(
          f"non-finite {bad} ({metrics[bad]}) at step {step}; the update was not applied. "
          f"Last good checkpoint: step {self.checkpointed} in {self.rundir.checkpoints} "
          f"(train.nan_policy={self.settings.nan_policy!r}, {self.nan_skips} non-finite "
          "steps)")
    log.warning("step %d: non-finite %s, batch skipped (%d of at most %d)", step, bad,
                self.nan_skips, self.settings.max_nan_skips)


def step_speed(phase, step_s: float, peak: float | None, devices: int) -> dict:
  """Returns a step's time, its data and equivalent tokens per second and its MFU."""
  step_s = max(step_s, 1e-9)
  return dict(step_s=step_s, data_tokens_per_s=phase.data_tokens_per_step / step_s,
              equivalent_tokens_per_s=phase.equivalent_tokens_per_step / step_s,
              mfu=platform.mfu(phase.flops_per_step, step_s, devices, peak))


class _NoWriter:
  """The metrics sink of processes other than 0."""
  def write(self, record):
    del record

  def sync(self):
    pass

  def close(self, upload: bool = True):
    del upload


def _scalars(metrics: dict) -> dict:
  """Flatten vector metrics (e.g. per-expert load [E]) into one scalar per entry."""
  flat = {}
  for key, value in metrics.items():
    value = np.asarray(value)
    if value.ndim:
      flat.update({f"{key}/{i}": float(x) for i, x in enumerate(value.reshape(-1))})
    else:
      flat[key] = float(value)
  return flat
