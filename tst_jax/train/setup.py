"""What a run builds before its first step: the Trainer of its steps, the run's directory with
its config.json checked against the run's, the token store, the checkpoints, the evaluator, the
state the first step starts from and each phase's batches."""

from __future__ import annotations

import logging
from typing import Callable

import jax
import numpy as np
from flax import nnx

from tst_jax import data as data_lib
from tst_jax import fileio
from tst_jax.data import run_data
from tst_jax.errors import ConfigError
from tst_jax.models import mtp as mtp_lib
from tst_jax.parallel import distributed, mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules
from tst_jax.rundir import RunDir
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax.config import record as record_lib, spec as spec_lib
from tst_jax.train import trained_run
from tst_jax.train import step as step_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax.train.evaluate import Evaluator
from tst_jax.config.sections import SAME_RUN, same_run_fields

try:
  from tst_jax.train import downstream
except ImportError:   # lm-eval, an optional dependency: train.eval_tasks needs it
  downstream = None

log = logging.getLogger("tst_jax")


class Setup:
  """What a run builds once, before its first step (`Setup.create`): the Trainer of its
  steps (mesh, optimizer, model graph, shardings), its data and its evaluator; it opens the
  run's checkpoints (`open_checkpoints`)."""

  def __init__(self, spec: spec_lib.RunSpec, rundir: RunDir, trainer: step_lib.Trainer,
               data: run_data.RunData, data_block: tuple[int, int]):
    self.spec, self.rundir, self.trainer, self.data = spec, rundir, trainer, data
    self.data_block = data_block          # (index, count): the batch rows this process loads
    shape = (spec.data.batch_size, spec.data.seq_len + 1)
    self.evaluate = Evaluator(
        trainer, data.eval_windows, data_block[1],
        {name: held.windows(*shape) for name, held in data.eval_sets.items()},
        eos_id=data.tokenizer.eos_id, bags=self._bag_windows(),
        token_bytes=data.held_out.token_bytes(*shape),
        set_bytes={name: held.token_bytes(*shape) for name, held in data.eval_sets.items()})

  def load_tasks(self):
    """Returns train.eval_tasks' tasks loaded for the run (downstream.InRun), None without
    them: every process scores them, on its part of the parameters. A task lm-eval cannot
    load is a ConfigError before the first step."""
    if not self.spec.train.eval_tasks:
      return None
    if downstream is None:
      raise ConfigError("train.eval_tasks", "needs lm-eval: pip install -e '.[eval]' (or pip "
                        "install lm-eval)")
    return downstream.InRun(self.spec, self.trainer, self.data.tokenizer, self.rundir)

  def _bag_windows(self) -> dict:
    """Returns each tst phase's held-out windows for eval_bag_loss, of its S·L + 1 tokens in
    its batches' rows, from the held-out split(s) eval_loss reads. A split too short for one
    batch of them is said once, and that phase logs no eval_bag_loss."""
    bags = {}
    for phase in (p for p in self.spec.plan.phases if p.is_tst):
      bags[phase] = self.data.held_out.windows(phase.batch_size, phase.window)
      if not bags[phase] and distributed.is_primary():
        log.warning("no eval_bag_loss in phase %s S=%d: its held-out split holds fewer than "
                    "one batch of %d windows of %d tokens", phase.name, phase.bag_size,
                    phase.batch_size, phase.window)
    return bags

  @classmethod
  def create(cls, spec: spec_lib.RunSpec, rundir: RunDir, devices=None, *,
             record: bool = True) -> Setup:
    """In order: the Trainer (checked against the mesh), the workdir (a run of
    another config refused), the token store (`_data`) and its passes (train.max_passes),
    then, with `record` (training, not an eval), the workdir's config.json."""
    if spec.resolved is None:
      raise ValueError("Setup needs a spec with `auto` resolved: spec.on_platform()")
    trainer = step_lib.Trainer.of(spec, devices)
    trainer.check()
    fileio.makedirs(rundir.root)
    _check_workdir_config(spec, rundir)
    block = mesh_lib.process_batch_block(trainer.batch_sharding)
    say = print if distributed.is_primary() else (lambda text: None)
    with distributed.primary_first("prepare_data"):   # process 0 prepares the store
      data = _data(spec, rundir, block, say)
    where, count, passes = max(((w, n, sum(x)) for w, n, x in data.train_tokens.passes(
        spec.plan)), key=lambda e: e[2])
    if spec.train.max_passes and passes > spec.train.max_passes:
      raise ConfigError("train.max_passes", f"the run would read the {count:,} training "
                        f"tokens of {where} {passes:.3g} times, more "
                        f"than {spec.train.max_passes:g}: give it fewer steps or a larger "
                        "train.max_passes, or more data in a new --workdir (this one keeps "
                        "its token store)")
    if record and distributed.is_primary():
      record_lib.write_config(rundir, spec.to_json())
    return cls(spec, rundir, trainer, data, block)

  def open_checkpoints(self, before_save: Callable[[], None] | None = None
                       ) -> ckpt_lib.RunCheckpoints:
    """Opens the run's checkpoints, on its token store. `before_save` runs before each save."""
    return ckpt_lib.RunCheckpoints(
        self.rundir.checkpoints, self.spec, self.data.fingerprint, self.data.directory,
        ckpt_lib.abstract_with_shardings(self.trainer.abstract, self.trainer.shardings),
        before_save=before_save)

  def restore_or_init(self, emergency: bool = True) -> tuple[step_lib.TrainState, int]:
    """Returns (state, step): the latest checkpoint that restores, an emergency one of this
    workdir's run first where `emergency`, else a fresh sharded init at step 0, holding the
    weights of config.init_from_hf when set. The checkpoints are opened for this alone: the
    loop opens them again, with the step log to sync before each save, which needs the step
    restored."""
    checkpoints = self.open_checkpoints()
    try:
      restored = checkpoints.restore_latest(self._reached() if emergency else 0)
    finally:
      checkpoints.close()
    if restored is not None:
      return restored
    if self.spec.run.init_from_hf:
      return self.init_from_hf(), 0
    return self.trainer.init_state(self.spec.run.seed), 0

  def _reached(self) -> int:
    """Returns the last step goodput.jsonl records, which it does before each checkpoint:
    how far the run of this workdir got (0 for a new one), read only where the run keeps
    emergency checkpoints, whose steps it bounds."""
    if not self.spec.train.local_checkpoint_every or not fileio.exists(self.rundir.goodput):
      return 0
    return max((r["step"] for r in workdir_lib.read_goodput(self.rundir)), default=0)

  def init_from_hf(self) -> step_lib.TrainState:
    """Returns a step-0 TrainState holding the weights of the Hugging Face folder init_from_hf,
    sharded as the run's state, with a fresh optimizer state. Multi-token prediction heads,
    which no Hugging Face model has, start as a fresh init draws them."""
    try:
      host = trained_run.hf_params(self.spec.run.init_from_hf, self.spec.model, self.spec.family)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError("init_from_hf", f"{e}") from e
    model_only = nnx.Not(nnx.PathContains(mtp_lib.ATTR))
    shardings = nnx.split_state(self.trainer.shardings.params, model_only, ...)[0]
    params = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
        host, shardings)
    if self.spec.mtp.on:
      params = nnx.merge_state(params, self.trainer.init_params(
          self.spec.run.seed, nnx.PathContains(mtp_lib.ATTR)))
    with axis_rules(self.trainer.mesh, self.spec.run.logical_axis_rules):
      return jax.jit(lambda p: step_lib.fresh_state(p, self.trainer.tx),
                     out_shardings=self.trainer.shardings)(params)

  def batches(self, phase, first_step: int):
    """Host-local batches of `phase` starting at global step `first_step`, as global arrays."""
    plan = self.spec.plan
    if self.data.mixture is not None:
      iterator = self.data.mixture.batches(
          plan.phases, plan.phases.index(phase), seed=self.spec.run.seed,
          process_index=self.data_block[0], process_count=self.data_block[1])
    else:
      iterator = data_lib.make_batches(
          self.data.train, batch_size=phase.batch_size, window=phase.window,
          start_pos=plan.data_start(phase), seed=self.spec.run.seed, num_batches=phase.steps,
          process_index=self.data_block[0], process_count=self.data_block[1])
    if first_step > phase.first_step:   # exact resume: the iterator state is the batch index
      iterator.set_state({**iterator.get_state(), "next_index": first_step - phase.first_step})
    for local in iterator:
      yield jax.make_array_from_process_local_data(self.trainer.batch_sharding, local,
                                                   (phase.batch_size, phase.window))


def _data(spec: spec_lib.RunSpec, rundir: RunDir, block: tuple[int, int], say
          ) -> run_data.RunData:
  """Returns the run's data with this process's rows of the eval batches (`block`), in order:
  its token stores opened, or prepared, and refused where the run trained on others; their
  tokenizer and eval windows, the batches checked against them; then, by process 0, the
  tokenizer's copy and store.json, which the run trains on from now on."""
  d, vocab = spec.data, spec.model.vocab_size
  stores = run_data.open_stores(d, rundir, vocab, say)
  workdir_lib.check_store(rundir, stores, spec.train.force_resume)
  data = run_data.load_data(d, stores, rundir, vocab, block, say)
  data.check_batches(d, spec.plan.phases)
  if d.tst_mixture:        # one HeldOut draws both evals' windows, from the main mixture
    main = "data.mixture" if d.mixture else "data.source"
    say(f"data: eval_bag_loss reads the held-out split of {main}, as eval_loss does, not "
        "data.tst_mixture's")
  if distributed.is_primary():
    workdir_lib.write_tokenizer(rundir, data.tokenizer)
    workdir_lib.write_store(rundir, data.fingerprint, data.directory, data.train_tokens.count)
  return data


def _check_workdir_config(spec, rundir: RunDir):
  """Refuse to resume a workdir of another run: one that differs in a field of
  sections.SAME_RUN, its config.json read back through the sections' declarations. The loop's
  cadences and policies may change; train.steps may not, since they place the phases and the
  learning-rate schedule of the steps already trained. A field added after the run was
  written compares with the value such a run had."""
  if not fileio.exists(rundir.config):
    return
  saved = record_lib.read_config(rundir)
  there, here = same_run_fields(saved), spec.same_run()
  changed = [k for k in there.keys() | here.keys() if there.get(k) != here.get(k)]
  diff = [s for s in SAME_RUN if "." not in s and any(k.partition(".")[0] == s for k in changed)]
  moved = [f"{k} {there[k]} there, {here[k]} here" for k in SAME_RUN if k in changed]
  differs = "; ".join(([f"sections {diff} differ"] if diff else []) + moved)
  if moved:
    differs += (" (a run cannot be extended or shortened: its phases and learning-rate "
                "schedule are fixed by its steps)")
  workdir_lib.check_same_run(rundir.root, "config", differs, spec.train.force_resume)
