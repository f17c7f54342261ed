"""What a run builds before its first step: the Trainer of its steps, the workdir (its config.json
checked against the run's), the token store and the checkpoints; and what the loop asks of
them (restore or init, batches, the phase switch, save, evaluate)."""

from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np

from tst_jax import data as data_lib
from tst_jax import platform
from tst_jax import superposition as sp
from tst_jax.data import run_data
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.parallel import distributed, mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax.train import spec as spec_lib, step as step_lib, trained_run
from tst_jax.train import workdir as workdir_lib

log = logging.getLogger("tst_jax")
# Config sections that must match to resume a workdir (logging cadences may change).
RESUME_KEYS = ("seed", "model", "tst", "data", "optimizer", "loss")


class Setup:
  """What a run builds once, before its first step (`Setup.create`): the Trainer of its
  steps (mesh, optimizer, model graph, shardings), its data and its checkpoints."""

  def __init__(self, spec: spec_lib.RunSpec, workdir: str, trainer: step_lib.Trainer,
               data: run_data.RunData, data_block: tuple[int, int]):
    self.spec, self.workdir, self.trainer, self.data = spec, workdir, trainer, data
    self.data_block = data_block          # (index, count): the batch rows this process loads
    self.abstract_state = ckpt_lib.abstract_with_shardings(trainer.abstract, trainer.shardings)
    handoffs = [p.first_step for p in spec.plan.phases[1:]]
    self.checkpoints = ckpt_lib.Checkpoints(
        workdir_lib.path(workdir, workdir_lib.CHECKPOINTS), keep=spec.train.keep_checkpoints,
        keep_steps=handoffs, every=spec.train.checkpoint_every)
    self._eval_step = jax.jit(step_lib.make_eval_step(trainer.graphdef),
                              in_shardings=(trainer.shardings.params, trainer.batch_sharding))

  @classmethod
  def create(cls, spec: spec_lib.RunSpec, workdir: str, devices=None, *,
             record: bool = True) -> Setup:
    """In order: the Trainer (checked against the mesh), the workdir (a run of
    another config refused), the token store (prepared once, by process 0) with this
    process's rows and its passes (train.max_passes), then, with `record` (training, not an
    eval), the workdir's config.json."""
    if spec.resolved is None:
      raise ValueError("Setup needs a spec with `auto` resolved: spec.on_platform()")
    trainer = step_lib.Trainer.of(spec, devices)
    trainer.check()
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    _check_workdir_config(spec, workdir)
    block = mesh_lib.process_batch_block(trainer.batch_sharding)
    say = print if distributed.is_primary() else (lambda text: None)
    with distributed.primary_first("prepare_data"):   # process 0 prepares the store
      data = run_data.prepare_data(
          spec.data, workdir, spec.model.vocab_size, block, say=say,
          check_store=lambda store: workdir_lib.check_store(workdir, store,
                                                            spec.train.force_resume))
      if distributed.is_primary():   # the store this workdir trains on, from now on
        workdir_lib.write_store(workdir, data.fingerprint, data.train.directory,
                                len(data.train))
    passes = sum(spec.plan.passes(len(data.train)))
    if spec.train.max_passes and passes > spec.train.max_passes:
      raise ConfigError("train.max_passes", f"the run would read the {len(data.train):,} "
                        f"training tokens of {data.train.directory} {passes:.3g} times, more "
                        f"than {spec.train.max_passes:g}: give it fewer steps or a larger "
                        "train.max_passes, or more data in a new --workdir (this one keeps "
                        "its token store)")
    if record and distributed.is_primary():
      workdir_lib.write_config(workdir, spec.to_json())
    return cls(spec, workdir, trainer, data, block)

  def restore_or_init(self):
    """(state, step): the latest checkpoint that restores, or a fresh sharded init at step 0
    (the weights of config.init_from_hf when set)."""
    latest = self.checkpoints.latest_step()
    if latest is None and self.spec.run.init_from_hf:
      return self.init_from_hf(), 0
    if latest is None:
      return self.trainer.init_state(self.spec.run.seed), 0
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
    raise ConfigError("--workdir", f"no checkpoint in {self.checkpoints.directory} "
                      "can be restored")

  def init_from_hf(self):
    """A step-0 TrainState holding the weights of the Hugging Face folder init_from_hf
    (sharded as the run's state), with a fresh optimizer state."""
    try:
      host = trained_run.hf_params(self.spec.run.init_from_hf, self.spec.model, self.spec.family)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError("init_from_hf", f"{e}") from e
    params = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
        host, self.trainer.shardings.params)
    with axis_rules(self.trainer.mesh, self.spec.run.logical_axis_rules):
      return jax.jit(lambda p: step_lib.fresh_state(p, self.trainer.tx),
                     out_shardings=self.trainer.shardings)(params)

  def check_data_of(self, step: int, meta: dict):
    """A checkpoint continues only on the token store it was trained on (its manifest's
    fingerprint is in the checkpoint's metadata)."""
    saved = meta.get("data_fingerprint")
    differs = saved and saved != self.data.fingerprint and (
        f"fingerprint {saved[:12]} there, {self.data.train.directory} "
        f"({self.data.fingerprint[:12]}) here")
    workdir_lib.check_same_run(f"{self.checkpoints.directory}/{step}", "token store", differs,
                               self.spec.train.force_resume)

  def save(self, state, step: int, *, force: bool = False):
    phase = self.spec.plan.phase_at(max(step - 1, 0))
    meta = dict(step=step, phase=phase.name, phase_step=step - phase.first_step,
                data_start_pos=self.spec.plan.data_start(phase), window=phase.window,
                data_fingerprint=self.data.fingerprint)
    self.checkpoints.save(step, state, meta, force=force)

  def batches(self, phase, first_step: int):
    """Host-local batches of `phase` starting at global step `first_step`, as global arrays."""
    iterator = data_lib.make_batches(
        self.data.train, batch_size=phase.batch_size, window=phase.window,
        start_pos=self.spec.plan.data_start(phase), seed=self.spec.run.seed,
        num_batches=phase.steps, process_index=self.data_block[0], process_count=self.data_block[1])
    if first_step > phase.first_step:   # exact resume: the iterator state is the batch index
      iterator.set_state({**iterator.get_state(), "next_index": first_step - phase.first_step})
    for local in iterator:
      yield jax.make_array_from_process_local_data(self.trainer.batch_sharding, local,
                                                   (phase.batch_size, phase.window))

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
    fresh = self.trainer.init_state(self.spec.run.seed + 1)
    return state.replace(params=sp.switch_to_next_token(state.params, fresh.params),
                         opt_state=sp.switch_to_next_token(state.opt_state, fresh.opt_state))

  def evaluate(self, params) -> float:
    """Held-out next-token loss (nats/token) on the same validation windows every time."""
    total, count = 0.0, 0.0
    for window in self.data.eval_windows:
      batch = jax.make_array_from_process_local_data(
          self.trainer.batch_sharding, window, (len(window) * self.data_block[1], window.shape[1]))
      with axis_rules(self.trainer.mesh, self.spec.run.logical_axis_rules):
        s, n = self._eval_step(params, batch)
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)

  def evaluate_latest(self) -> dict:
    state, step = self.restore_or_init()
    result = dict(step=step, eval_loss=self.evaluate(state.params))
    print(json.dumps(result))
    return result


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
  """Refuse to resume a workdir of another config: its config.json read back through the
  sections' declarations (a run written before a field was added compares with that
  field's old value), the platform's own choices (platform.PLATFORM_FIELDS) aside."""
  path = workdir_lib.path(workdir, workdir_lib.CONFIG)
  if not os.path.exists(path):
    return
  try:
    saved = workdir_lib.read_config(workdir)
  except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
    raise DataError(f"{path}: cannot be read ({e}); it records the config of this workdir's "
                    "run: restore it, or use another --workdir") from None
  saved["seed"] = saved["run"].seed
  ours = {k: spec.run.seed if k == "seed" else getattr(spec, k) for k in RESUME_KEYS}
  diff = [k for k in RESUME_KEYS if _comparable(k, saved[k]) != _comparable(k, ours[k])]
  workdir_lib.check_same_run(workdir, "config", diff and f"sections {diff} differ",
                             spec.train.force_resume)


def _comparable(name: str, section):
  return platform.unresolved(section, name) if name in ("model", "loss") else section
