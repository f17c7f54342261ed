"""The two-phase run: phase 1 (tst) for round(r*T) steps, handoff checkpoint, phase 2 (ntp).

`run` checks the config and builds a `Setup` (mesh, model graph, optimizer, data,
checkpoints); `train` is the loop. Runs resume from their workdir: the latest checkpoint
holds the train state and the data position, and the global step alone decides the phase.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tst_jax import data as data_lib
from tst_jax import fileio
from tst_jax import superposition as sp
from tst_jax.data import run_data
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.parallel import distributed, mesh as mesh_lib, xla_flags
from tst_jax.parallel.logical import axis_rules
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax.train import fit
from tst_jax.train import metrics as metrics_lib
from tst_jax.train import spec as spec_lib, step as step_lib, trained_run
from tst_jax.train.console import Console
from tst_jax.train.plan import Plan, PlanRecord, format_plan
from tst_jax.train.preemption import Preempted, PreemptionGuard

log = logging.getLogger("tst_jax")
# Config sections that must match to resume a workdir (logging cadences may change).
RESUME_KEYS = ("seed", "model", "tst", "data", "optimizer", "loss")


def run(config, workdir: str, mode: str = "train", accelerator: str = "") -> dict:
  """Entry point of `main.py`: mode is train (default), plan or eval; a plan with an
  `accelerator` also compiles both phases' steps on the mesh's devices and says if they fit."""
  checked = spec_lib.check(config)             # every field, once, before anything starts
  if accelerator and mode != "plan":
    raise ConfigError("--accelerator", "only with --mode plan (it checks that a run fits)")
  if accelerator:
    fit.emulate_devices(fit.mesh_devices(checked.mesh))   # CPU devices, before JAX starts
  flags = xla_flags.apply(checked.mesh, checked.distributed,   # XLA reads them as it starts
                          fit.layer_param_bytes(checked.model),
                          platform="cpu" if accelerator else None)   # the fit compiles on CPU
  distributed.initialize(checked.distributed)  # before anything touches a device
  spec = checked.on_platform()            # what `auto` means here, printed and recorded
  if mode == "plan":
    print(flags.line())
    fitted = fit.check(checked, accelerator) if accelerator else None
    tokens = run_data.training_tokens(spec.data, workdir or None)
    print(*([fitted.table()] if fitted else []),
          format_plan(spec.plan, spec.resolved, tokens=tokens), sep="\n")
    return spec.plan.to_json() | (dict(fit=fitted.to_json()) if fitted else {})
  if flags.applied and distributed.is_primary():
    print(flags.line())
  if mode not in ("train", "eval"):
    raise ConfigError("--mode", f"must be train, plan or eval, got {mode!r}")
  if not workdir:
    raise ConfigError("--workdir", "required for train and eval: give a new directory, or a "
                      "run's to resume it")
  spec.check_devices(jax.device_count())
  spec.check_paths()
  check_workdir(workdir)
  try:
    setup = Setup(spec, workdir)
    result = setup.evaluate_latest() if mode == "eval" else train(setup)
  except jax.errors.JaxRuntimeError as e:
    distributed.stop_if_peer_lost(e)   # several processes: another died; exits 2
    raise
  distributed.finished()          # the other processes' watchdogs stop waiting for this one
  return result


def train(s: Setup) -> dict:
  """Trains the phases of `s.plan` from the latest checkpoint (or step 0) to the end; returns
  the summary, or {preempted_at_step} after a preemption checkpoint."""
  cfg, plan = s.spec.train, s.plan
  state, start = s.restore_or_init()
  primary = distributed.is_primary()
  console = Console(plan.total_steps, start, enabled=primary,
                    bar=cfg.progress_bar and sys.stdout.isatty())
  tokens = run_data.TrainTokens.of(s.data.train)
  if primary:                         # <workdir>/plan.json, before the first step
    PlanRecord(plan, tokens, s.resolved).write(s.workdir)
  console.print(format_plan(plan, s.resolved, with_json=False, tokens=tokens) if start == 0
                else f"resuming {s.workdir} at step {start} of {plan.total_steps}")
  writer = (metrics_lib.MetricsWriter(s.workdir, resume_step=start or None) if primary
            else _NoWriter())                         # process 0 writes the files
  step_log = StepLog(plan, cfg, writer, console, s.checkpoints)
  guard = PreemptionGuard()
  t0 = time.time()
  try:
    for phase in plan.phases:
      if start >= phase.last_step:
        continue
      if phase.first_step > 0 and start == phase.first_step:
        state = s.handoff(state, phase, console)
      train_step, batches = s.train_step(phase), s.batches(phase, max(start, phase.first_step))
      for step in range(max(start, phase.first_step), phase.last_step):
        state, metrics = train_step(state, next(batches))
        step_log.step(step + 1, phase, metrics)       # fetched one step late (async dispatch)
        done = step + 1
        if done % cfg.eval_every == 0 or done == phase.last_step:
          step_log.flush()
          loss = s.evaluate(state.params)
          writer.write(dict(step=done, phase=phase.name, eval_loss=loss, **plan.tokens_at(done)))
          console.eval(done, loss)
        stop = guard.should_stop(done)                # agreed by every process
        s.save(state, done, force=stop or done == phase.last_step)
        if stop:
          step_log.flush()
          raise Preempted(done)
      step_log.flush()
      start = phase.last_step
    s.checkpoints.wait()
    summary = metrics_lib.summarize(
        s.workdir, plan, s.evaluate(state.params), write=primary,
        unigram_entropy=s.data.unigram_entropy, seconds_this_session=time.time() - t0,
        resolved=s.resolved.to_json())
    log.info("summary of process %d: %s", jax.process_index(), json.dumps(summary))
    console.final(summary, s.workdir, s.spec.reference)
    return summary
  except Preempted as stop:
    s.checkpoints.wait()
    console.print(f"preempted: checkpoint of step {stop.step} written to "
                  f"{s.checkpoints.directory}; run the same command again to resume")
    return dict(preempted_at_step=stop.step)
  finally:   # also after an error, which stays the one reported
    _close(guard, console, writer, s.checkpoints, raising=sys.exc_info()[0] is None)


def _close(*closables, raising: bool):
  """Finish pending checkpoint writes and flush the metrics (also after an error)."""
  for c in closables:
    try:
      c.close()
    except Exception as e:  # pylint: disable=broad-except
      if raising:
        raise
      log.warning("while stopping after an error: %s: %s", type(e).__name__, e)


class Setup:
  """What a run builds once, before its first step: the plan, mesh, model graph, optimizer,
  shardings, data and checkpoints (`auto` fields resolved for this platform)."""

  def __init__(self, spec: spec_lib.RunSpec, workdir: str, devices=None):
    if spec.resolved is None:
      spec = spec.on_platform()                # `auto` -> this platform's choice
    self.spec, self.workdir, self.plan = spec, os.path.abspath(workdir), spec.plan
    self.resolved, self.model_cfg = spec.resolved, spec.model
    self.layout = layout = step_lib.Layout.of(spec, devices)
    layout.check()
    self.mesh, self.rules, self.tx = layout.mesh, spec.rules, layout.tx
    self.graphdef, self.shardings = layout.graphdef, layout.shardings
    self.abstract_state = ckpt_lib.abstract_with_shardings(layout.abstract, self.shardings)
    self.batch_sharding = layout.batch_sharding
    self.data_block = mesh_lib.process_batch_block(self.batch_sharding)  # rows this process loads
    os.makedirs(self.workdir, exist_ok=True)
    _check_workdir_config(spec, self.workdir)
    say = print if distributed.is_primary() else (lambda text: None)
    with distributed.primary_first("prepare_data"):   # process 0 prepares the store
      self.data = run_data.prepare_data(spec.data, self.workdir, self.model_cfg.vocab_size,
                                        self.data_block, say=say,
                                        force_resume=spec.train.force_resume)
    handoffs = [p.first_step for p in self.plan.phases[1:]]
    self.checkpoints = ckpt_lib.Checkpoints(
        os.path.join(self.workdir, "checkpoints"), keep=spec.train.keep_checkpoints,
        keep_steps=handoffs, every=spec.train.checkpoint_every)
    self._eval_step = jax.jit(step_lib.make_eval_step(self.graphdef),
                              in_shardings=(self.shardings.params, self.batch_sharding))

  def restore_or_init(self):
    """(state, step): the latest checkpoint that restores, or a fresh sharded init at step 0
    (the weights of config.init_from_hf when set)."""
    latest = self.checkpoints.latest_step()
    if latest is None and self.spec.init_from_hf:
      return self.init_from_hf(), 0
    if latest is None:
      return step_lib.init_state(self.model_cfg, self.tx, self.spec.seed, self.mesh,
                                 self.rules), 0
    for step in sorted(self.checkpoints.all_steps(), reverse=True):
      self.checkpoints.check_shapes(step, self.abstract_state)
      try:
        state, meta = self.checkpoints.restore(step, self.abstract_state)
      except Exception as e:  # a truncated or corrupted step: fall back to the previous one
        log.warning("checkpoint %d in %s cannot be restored (%s: %s); trying the previous one",
                    step, self.checkpoints.directory, type(e).__name__, str(e)[:300])
        continue
      self.check_data_of(step, meta)
      return state, step
    raise ConfigError(f"no checkpoint in {self.checkpoints.directory} can be restored")

  def init_from_hf(self):
    """A step-0 TrainState holding the weights of the Hugging Face folder init_from_hf
    (sharded as the run's state), with a fresh optimizer state."""
    try:
      host = trained_run.hf_params(self.spec.init_from_hf, self.model_cfg, self.spec.family)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError("init_from_hf", f"{e}") from e
    params = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
        host, self.shardings.params)
    fresh = lambda p: step_lib.TrainState(jnp.zeros((), jnp.int32), p, self.tx.init(p))
    with axis_rules(self.mesh, self.rules):
      return jax.jit(fresh, out_shardings=self.shardings)(params)

  def check_data_of(self, step: int, meta: dict):
    """A checkpoint continues only on the token store it was trained on (its manifest's
    fingerprint is in the checkpoint's metadata)."""
    saved = meta.get("data_fingerprint")
    if saved and saved != self.data.fingerprint and not self.spec.train.force_resume:
      raise DataError(
          f"{self.checkpoints.directory}/{step}: this checkpoint was trained on the token store "
          f"with fingerprint {saved[:12]}, not on {self.data.train.directory} "
          f"({self.data.fingerprint[:12]}): give data.source that store, or "
          "--config.train.force_resume=True to continue on this one")

  def save(self, state, step: int, *, force: bool = False):
    phase = self.plan.phase_at(max(step - 1, 0))
    meta = dict(step=step, phase=phase.name, phase_step=step - phase.first_step,
                data_start_pos=self.plan.data_start(phase), window=phase.window,
                data_fingerprint=self.data.fingerprint)
    self.checkpoints.save(step, state, meta, force=force)

  def batches(self, phase, first_step: int):
    """Host-local batches of `phase` starting at global step `first_step`, as global arrays."""
    iterator = data_lib.make_batches(
        self.data.train, batch_size=phase.batch_size, window=phase.window,
        start_pos=self.plan.data_start(phase), seed=self.spec.seed, num_batches=phase.steps,
        process_index=self.data_block[0], process_count=self.data_block[1])
    if first_step > phase.first_step:   # exact resume: the iterator state is the batch index
      iterator.set_state({**iterator.get_state(), "next_index": first_step - phase.first_step})
    for local in iterator:
      yield jax.make_array_from_process_local_data(self.batch_sharding, local,
                                                   (phase.batch_size, phase.window))

  def train_step(self, phase):
    """The jitted train step of `phase`, its loss built from the phase's own settings."""
    return self.layout.train_step(phase)

  def handoff(self, state, phase, console):
    """Phase switch: save, then restore that checkpoint (params, optimizer state, step,
    data position) and continue with the plain next-token step."""
    self.save(state, phase.first_step, force=True)
    self.checkpoints.wait()
    state, meta = self.checkpoints.restore(phase.first_step, self.abstract_state)
    reinit = self.spec.tst.reinit_at_switch and not phase.is_tst   # at the switch to ntp
    console.print(f"phase switch at step {phase.first_step}: restored the {meta['phase']} "
                  f"checkpoint, now {phase.name}"
                  + (f" S={phase.bag_size}" if phase.is_tst else "")
                  + (" with a fresh embedding and LM head (reinit_at_switch)" if reinit else ""))
    return self.reinit_embedding_and_head(state) if reinit else state

  def reinit_embedding_and_head(self, state):
    """The paper's randomisation ablation: fresh embedding and LM head (and their Adam
    moments) at the start of phase 2."""
    fresh = step_lib.init_state(self.model_cfg, self.tx, self.spec.seed + 1, self.mesh,
                                self.rules)
    return state.replace(params=sp.switch_to_next_token(state.params, fresh.params),
                         opt_state=sp.switch_to_next_token(state.opt_state, fresh.opt_state))

  def evaluate(self, params) -> float:
    """Held-out next-token loss (nats/token) on the same validation windows every time."""
    total, count = 0.0, 0.0
    for window in self.data.eval_windows:
      batch = jax.make_array_from_process_local_data(
          self.batch_sharding, window, (len(window) * self.data_block[1], window.shape[1]))
      with axis_rules(self.mesh, self.rules):
        s, n = self._eval_step(params, batch)
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)

  def evaluate_latest(self) -> dict:
    state, step = self.restore_or_init()
    result = dict(step=step, eval_loss=self.evaluate(state.params))
    print(json.dumps(result))
    return result


class StepLog:
  """A step's metrics, fetched one step late (so the host never waits on the device): the
  non-finite guard on every step, a metrics.jsonl line and a console line per log_every."""

  def __init__(self, plan: Plan, cfg, writer, console: Console, checkpoints):
    self.plan, self.cfg, self.writer, self.console = plan, cfg, writer, console
    self.checkpoints = checkpoints
    self.pending, self.t_last, self.nan_skips = None, time.time(), 0

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
    logged = step % self.cfg.log_every == 0 or step == phase.last_step
    rate = 0.0
    if logged:
      now = time.time()
      steps = min(self.cfg.log_every, step - phase.first_step) or 1
      rate = phase.data_tokens_per_step * steps / max(now - self.t_last, 1e-9)
      self.t_last = now
      self.writer.write(dict(step=step, phase=phase.name, bag_size=phase.bag_size, **metrics,
                             **self.plan.tokens_at(step), data_tokens_per_s=rate))
    self.console.step(step, phase, metrics, rate, logged)

  def non_finite(self, step: int, metrics: dict):
    """train.nan_policy: the update was not applied; skip (up to max_nan_skips) or stop."""
    self.nan_skips += 1
    bad = "loss" if not np.isfinite(metrics["loss"]) else "grad_norm"
    if self.cfg.nan_policy != "skip" or self.nan_skips > self.cfg.max_nan_skips:
      raise FloatingPointError(
          f"non-finite {bad} ({metrics[bad]}) at step {step}; the update was not applied. "
          f"Last good checkpoint: step {self.checkpoints.latest_step()} in "
          f"{self.checkpoints.directory} (train.nan_policy={self.cfg.nan_policy!r}, "
          f"{self.nan_skips} non-finite steps)")
    log.warning("step %d: non-finite %s, batch skipped (%d of at most %d)", step, bad,
                self.nan_skips, self.cfg.max_nan_skips)


class _NoWriter:
  """The metrics sink of processes other than 0."""
  def write(self, record):
    del record

  def close(self):
    pass


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


def check_workdir(workdir: str):
  """The workdir is a directory this process may write to, or can be made as one (it is
  made later, once the config has passed every check)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"--workdir {workdir}: is a file, not a directory: give a new "
                       "directory, or a run's directory to resume it")
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise WorkdirError(f"--workdir {workdir}: {existing} is a file, so the workdir cannot be "
                       "made: give another directory")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise WorkdirError(f"--workdir {workdir}: {existing} is not writable: fix its permissions "
                       "or give another directory")


def _check_workdir_config(spec, workdir: str):
  """Write config.json (the checked config, `auto` fields resolved) on the first run; refuse
  to resume a workdir of another config (its sections read back through their declarations,
  so a run written before a field was added compares with that field's old value)."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = spec_lib.sections_of(json.load(f))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
      raise DataError(f"{path}: cannot be read ({e}); it records the config of this workdir's "
                      "run: restore it, or use another --workdir") from None
    saved["seed"] = saved["run"].seed
    diff = [k for k in RESUME_KEYS if saved[k] != getattr(spec, k)]
    if diff and not spec.train.force_resume:
      raise ConfigError(
          f"workdir {workdir} holds a run of a different config (sections {diff} differ); "
          "use another --workdir, or --config.train.force_resume=True to resume anyway")
  if distributed.is_primary():
    fileio.write_json(path, spec.to_json(), sort_keys=True)
