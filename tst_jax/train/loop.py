"""The two-phase run: phase 1 (tst) for round(r*T) steps, handoff checkpoint, phase 2 (ntp).

Runs resume from their workdir: the latest checkpoint holds the train state and the data
position, and the global step alone decides the phase.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from tst_jax import checkpoints_io, platform
from tst_jax import data as data_lib
from tst_jax.data import prepare as prepare_lib
from tst_jax import models
from tst_jax.parallel import distributed, mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax.train import metrics as metrics_lib
from tst_jax.train import optim, plan as plan_lib, step as step_lib
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.train.plan import Plan, format_plan, make_plan
from tst_jax.train.preemption import Preempted, PreemptionGuard

log = logging.getLogger("tst_jax")
# Config sections that must match to resume a workdir (logging cadences may change).
RESUME_KEYS = ("seed", "model", "tst", "data", "optimizer", "loss")
STORE_FILE = "store.json"   # the fingerprint of the token store a workdir trains on


def run(config, workdir: str, mode: str = "train") -> dict:
  """Entry point of `main.py`: mode is train (default), plan or eval."""
  plan_lib.validate(config)                    # every field, before anything starts
  distributed.initialize(config.distributed)   # before anything touches a device
  plan = make_plan(config)
  resolved = platform.resolve(config)     # what `auto` means here, printed and recorded
  if mode == "plan":
    print(format_plan(plan, resolved))
    return plan.to_json()
  if mode not in ("train", "eval"):
    raise ConfigError(f"--mode: must be train, plan or eval, got {mode!r}")
  if not workdir:
    raise ConfigError("--workdir: required for train and eval: give a new directory, or a "
                      "run's to resume it")
  plan_lib.validate(config, num_devices=jax.device_count())
  plan_lib.check_paths(config)
  check_workdir(workdir)
  run = Run(config, workdir, plan, resolved=resolved)
  result = run.evaluate_latest() if mode == "eval" else run.train()
  distributed.finished()          # the other processes' watchdogs stop waiting for this one
  return result


class Run:
  """Everything one training run holds: data, mesh, model graph, optimizer, checkpoints."""

  def __init__(self, config, workdir: str, plan: Plan, devices=None, resolved=None):
    self.resolved = resolved or platform.resolve(config)   # `auto` -> this platform's choice
    config = platform.apply(config, self.resolved)
    self.config, self.workdir, self.plan = config, os.path.abspath(workdir), plan
    self.model_cfg = models.model_config(config.model)
    self.mesh = mesh_lib.make_mesh(config.mesh, devices)
    self.rules = tuple((k, v) for k, v in config.logical_axis_rules)
    self.tx, self.schedule = optim.make_optimizer(config.optimizer, plan.total_steps)
    self.graphdef, _ = step_lib.abstract_model(self.model_cfg)
    abstract, self.shardings = step_lib.state_shardings(self.model_cfg, self.tx, self.mesh,
                                                        self.rules)
    self.abstract_state = ckpt_lib.abstract_with_shardings(abstract, self.shardings)
    self.batch_sharding = mesh_lib.batch_sharding(self.mesh, self.rules, 2)
    _check_parallel(config, plan, self.batch_sharding, abstract, self.shardings)
    self.data_block = mesh_lib.process_batch_block(self.batch_sharding)  # rows this process loads
    os.makedirs(self.workdir, exist_ok=True)
    _check_workdir_config(config, self.workdir)
    with distributed.primary_first("prepare_data"):   # process 0 prepares the store
      self.data = prepare_data(config, self.workdir, self.model_cfg.vocab_size,
                               self.data_block)
    handoffs = [p.first_step for p in plan.phases[1:]]
    self.checkpoints = ckpt_lib.Checkpoints(
        os.path.join(self.workdir, "checkpoints"), keep=config.train.keep_checkpoints,
        keep_steps=handoffs, every=config.train.checkpoint_every)
    eval_step = step_lib.make_eval_step(self.graphdef)
    self._eval_step = jax.jit(eval_step, in_shardings=(self.shardings.params,
                                                       self.batch_sharding))

  # -- state -------------------------------------------------------------------------------
  def restore_or_init(self):
    """(state, step): the latest checkpoint, or a fresh sharded init at step 0."""
    latest = self.checkpoints.latest_step()
    if latest is None and self.config.init_from_hf:
      return self.init_from_hf(self.config.init_from_hf), 0
    if latest is None:
      return step_lib.init_state(self.model_cfg, self.tx, self.config.seed, self.mesh,
                                 self.rules), 0
    for step in sorted(self.checkpoints.all_steps(), reverse=True):
      self.checkpoints.check_shapes(step, self.abstract_state)
      try:
        state, _ = self.checkpoints.restore(step, self.abstract_state)
        return state, step
      except Exception as e:  # a truncated or corrupted step: fall back to the previous one
        log.warning("checkpoint %d in %s cannot be restored (%s: %s); trying the previous one",
                    step, self.checkpoints.directory, type(e).__name__, str(e)[:300])
    raise ConfigError(f"no checkpoint in {self.checkpoints.directory} can be restored")

  def init_from_hf(self, path: str):
    """A step-0 state holding the weights of a Hugging Face folder, fresh optimizer state."""
    try:
      host = checkpoints_io.hf_params(path, self.model_cfg, self.config.model.family)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError(f"config.init_from_hf: {e}") from e
    params = jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
        host, self.shardings.params)
    fresh = lambda p: step_lib.TrainState(jnp.zeros((), jnp.int32), p, self.tx.init(p))
    with axis_rules(self.mesh, self.rules):
      return jax.jit(fresh, out_shardings=self.shardings)(params)

  def save(self, state, step: int, *, force: bool = False):
    phase = self.plan.phase_at(max(step - 1, 0))
    meta = dict(step=step, phase=phase.name, phase_step=step - phase.first_step,
                data_start_pos=self.data_start(phase), window=phase.window,
                data_fingerprint=self.data.fingerprint)
    self.checkpoints.save(step, state, meta, force=force)

  # -- data --------------------------------------------------------------------------------
  def data_start(self, phase) -> int:
    """Stream position where `phase` starts: right where the previous phases stopped."""
    pos = 0
    for p in self.plan.phases:
      if p is phase:
        return pos
      pos = data_lib.stream_position(pos, p.steps, p.batch_size, p.window)
    raise ValueError(phase)

  def batches(self, phase, first_step: int):
    """Host-local batches of `phase` starting at global step `first_step`, as global arrays."""
    iterator = data_lib.make_batches(
        self.data.train, batch_size=phase.batch_size, window=phase.window,
        start_pos=self.data_start(phase), seed=self.config.seed, num_batches=phase.steps,
        process_index=self.data_block[0], process_count=self.data_block[1])
    if first_step > phase.first_step:   # exact resume: the iterator state is the batch index
      iterator.set_state({**iterator.get_state(), "next_index": first_step - phase.first_step})
    for local in iterator:
      yield jax.make_array_from_process_local_data(self.batch_sharding, local,
                                                   (phase.batch_size, phase.window))

  # -- evaluation --------------------------------------------------------------------------
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

  # -- training ----------------------------------------------------------------------------
  def train(self) -> dict:
    cfg = self.config.train
    self.nan_skips = 0
    state, start = self.restore_or_init()
    writer = (metrics_lib.MetricsWriter(self.workdir, resume_step=start if start else None)
              if distributed.is_primary() else _NoWriter())   # process 0 writes the files
    if start == 0:
      log.info("%s", format_plan(self.plan, self.resolved))
    bar = tqdm.tqdm(total=self.plan.total_steps, initial=start, unit="step",
                    disable=not (cfg.progress_bar and distributed.is_primary()),
                    mininterval=1.0)
    self.preemption = PreemptionGuard()
    try:
      result = self.train_phases(state, start, writer, bar)
    except BaseException:   # the first error is the one reported: close without raising
      self.close(writer, bar, raising=False)
      raise
    self.close(writer, bar)
    return result

  def train_phases(self, state, start: int, writer, bar) -> dict:
    t_start = time.time()
    try:
      for phase in self.plan.phases:
        if start >= phase.last_step:
          continue
        if phase.first_step > 0 and start == phase.first_step:
          state = self.handoff(state, phase)
        state = self.train_phase(state, phase, max(start, phase.first_step), writer, bar)
        start = phase.last_step
      self.checkpoints.wait()
      return self.summarize(self.evaluate(state.params), time.time() - t_start)
    except Preempted as stop:
      self.checkpoints.wait()
      print(f"preempted: checkpoint of step {stop.step} written to {self.checkpoints.directory};"
            " run the same command again to resume", flush=True)
      return dict(preempted_at_step=stop.step)

  def close(self, writer, bar, raising: bool = True):
    """Finish pending checkpoint writes and flush the metrics (also after an error)."""
    try:
      self.preemption.close()
      bar.close()
      writer.close()
      self.checkpoints.close()
    except Exception as e:  # pylint: disable=broad-except
      if raising:
        raise
      log.warning("while stopping after an error: %s: %s", type(e).__name__, e)

  def handoff(self, state, phase):
    """Phase switch: save, then restore that checkpoint (params, optimizer state, step,
    data position) and continue with the plain next-token step."""
    self.save(state, phase.first_step, force=True)
    self.checkpoints.wait()
    state, meta = self.checkpoints.restore(phase.first_step, self.abstract_state)
    log.info("phase switch at step %d: restored the %s checkpoint, starting %s",
             phase.first_step, meta["phase"], phase.name)
    if self.config.tst.reinit_at_switch:
      state = self.reinit_embedding_and_head(state)
    return state

  def reinit_embedding_and_head(self, state):
    """The paper's randomisation ablation: fresh embedding and LM head (and their Adam
    moments) at the start of phase 2."""
    fresh = step_lib.init_state(self.model_cfg, self.tx, self.config.seed + 1, self.mesh,
                                self.rules)

    def is_io(path):
      return any(str(getattr(k, "key", "")) in ("embed", "lm_head") for k in path)

    params = jax.tree_util.tree_map_with_path(
        lambda path, old, new: new if is_io(path) else old, state.params, fresh.params)
    opt_state = jax.tree_util.tree_map_with_path(
        lambda path, old, new: new if is_io(path) else old, state.opt_state, fresh.opt_state)
    return state.replace(params=params, opt_state=opt_state)

  def train_phase(self, state, phase, first: int, writer, bar):
    cfg, tst = self.config.train, self.config.tst
    loss_fn = (step_lib.tst_loss_fn(tst, self.config.loss) if phase.name == "tst"
               else step_lib.ntp_loss_fn(self.config.loss))
    train_step = step_lib.jit_step(
        step_lib.make_train_step(self.graphdef, loss_fn, self.tx, self.schedule,
                                 self.config.optimizer.grad_accum),
        self.shardings, self.batch_sharding, self.mesh, self.rules)
    bar.set_description(f"phase {phase.name}" + (f" S={phase.bag_size}" if phase.bag_size > 1
                                                 else ""))
    pending, t_last, step = None, time.time(), first
    batches = self.batches(phase, first)
    for step in range(first, phase.last_step):
      state, metrics = train_step(state, next(batches))
      if pending is not None:          # metrics are fetched one step late (async dispatch)
        t_last = self.log_step(*pending, writer, bar, t_last)
      pending = (step + 1, phase, metrics)
      done = step + 1
      if done % cfg.eval_every == 0 or done == phase.last_step:
        t_last = self.log_step(*pending, writer, bar, t_last)
        pending = None
        writer.write(dict(step=done, phase=phase.name, eval_loss=self.evaluate(state.params),
                          **self.tokens_at(done)))
      stop = self.preemption.should_stop(done)  # agreed by every process
      self.save(state, done, force=stop or done == phase.last_step)
      if stop:
        if pending is not None:
          self.log_step(*pending, writer, bar, t_last)
        raise Preempted(done)
    if pending is not None:
      self.log_step(*pending, writer, bar, t_last)
    return state

  def log_step(self, step, phase, metrics, writer, bar, t_last):
    metrics = _scalars(jax.device_get(metrics))
    if not metrics.pop("finite"):
      self.nan_skips += 1
      bad = "loss" if not np.isfinite(metrics["loss"]) else "grad_norm"
      if (self.config.train.nan_policy != "skip"
          or self.nan_skips > self.config.train.max_nan_skips):
        raise FloatingPointError(
            f"non-finite {bad} ({metrics[bad]}) at step {step}; the update was not applied. "
            f"Last good checkpoint: step {self.checkpoints.latest_step()} in "
            f"{self.checkpoints.directory} (train.nan_policy={self.config.train.nan_policy!r}, "
            f"{self.nan_skips} non-finite steps)")
      log.warning("step %d: non-finite %s, batch skipped (%d of at most %d)", step, bad,
                  self.nan_skips, self.config.train.max_nan_skips)
    now = time.time()
    bar.update(step - bar.n)
    bar.set_postfix(loss=f"{metrics['loss']:.3f}", refresh=False)
    if step % self.config.train.log_every and step != phase.last_step:
      return t_last
    elapsed = now - t_last
    steps_done = min(self.config.train.log_every, step - phase.first_step) or 1
    record = dict(step=step, phase=phase.name, bag_size=phase.bag_size, **metrics,
                  **self.tokens_at(step),
                  data_tokens_per_s=phase.data_tokens_per_step * steps_done / max(elapsed, 1e-9))
    writer.write(record)
    return now

  def tokens_at(self, step: int) -> dict:
    data = equivalent = 0
    for p in self.plan.phases:
      n = min(max(step - p.first_step, 0), p.steps)
      data += n * p.data_tokens_per_step
      equivalent += n * p.equivalent_tokens_per_step
    return dict(data_tokens=data, equivalent_tokens=equivalent)

  def summarize(self, final_eval: float, seconds: float) -> dict:
    records = metrics_lib.read(os.path.join(self.workdir, "metrics.jsonl"))
    evals = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    switch = self.plan.phases[0].last_step if len(self.plan.phases) > 1 else None
    summary = dict(final_eval_loss=final_eval, steps=self.plan.total_steps,
                   unigram_entropy=self.data.unigram_entropy, seconds_this_session=seconds,
                   phase1_end_eval_loss=evals.get(switch), **self.tokens_at(
                       self.plan.total_steps),
                   resolved=self.resolved.to_json())
    if distributed.is_primary():
      with open(os.path.join(self.workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
      metrics_lib.plot_losses(os.path.join(self.workdir, "metrics.jsonl"),
                              os.path.join(self.workdir, "loss.png"), switch_step=switch)
    print(json.dumps(summary))
    return summary


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


class Data:
  def __init__(self, tokenizer, train, val, eval_windows, unigram_entropy, fingerprint):
    self.tokenizer, self.train, self.val = tokenizer, train, val
    self.eval_windows, self.unigram_entropy = eval_windows, unigram_entropy
    self.fingerprint = fingerprint   # of the token store: a workdir resumes on the same one


def prepare_data(config, workdir: str, model_vocab: int, block=None) -> Data:
  """The run's token store (`tokens:DIR` read in place, any other source prepared once into
  <workdir>/data), its tokenizer (copied to the workdir for export), and the eval windows.
  Nothing here reads more of the store than the eval windows.

  `block` (index, count): this process's rows of the eval batches (default: by process).
  """
  d = config.data
  plan_lib.check_paths(config)
  store = _open_store(config, workdir, model_vocab)
  _check_store_of_workdir(workdir, store, config.train.force_resume)
  tokenizer = store.tokenizer(workdir)
  _check_vocab(tokenizer.vocab_size, model_vocab, f"the store {store.directory}")
  index, count = block or (jax.process_index(), jax.process_count())
  windows = []
  if len(store.val) >= d.batch_size * (d.seq_len + 1):
    windows = data_lib.eval_windows(store.val, batch_size=d.batch_size, window=d.seq_len + 1,
                                    num_batches=d.eval_batches,
                                    process_index=index, process_count=count)
  if not windows:
    raise ConfigError(f"config.data.val_fraction: the held-out split of {store.directory} has "
                      f"{len(store.val)} tokens, too few for one {d.batch_size} x "
                      f"{d.seq_len + 1} eval batch")
  if jax.process_index() == 0:    # the store this workdir trains on, from now on
    _write_json(os.path.join(workdir, STORE_FILE),
                dict(fingerprint=store.fingerprint, directory=store.directory))
  return Data(tokenizer, store.train, store.val, windows, store.unigram_entropy,
              store.fingerprint)


def _open_store(config, workdir: str, model_vocab: int) -> data_lib.TokenStore:
  """`tokens:DIR` as it is (its tokenizer must be the config's, if one is named), or the
  store of data.source prepared into <workdir>/data (reused when already there)."""
  d = config.data
  named = None
  if d.tokenizer not in ("", "bpe"):    # a file: checked before anything is tokenized
    named = data_lib.get_tokenizer(d.tokenizer, workdir=None, vocab_size=0)
    _check_vocab(named.vocab_size, model_vocab, repr(d.tokenizer))
  if d.source.startswith("tokens:"):
    store = data_lib.TokenStore(d.source[len("tokens:"):])
    if named is not None and named.fingerprint() != store.manifest["tokenizer"]["fingerprint"]:
      raise ConfigError(f"config.data.tokenizer {d.tokenizer!r} is not the tokenizer of the "
                        f"store {store.directory} (its manifest names another); leave "
                        "data.tokenizer empty to use the store's own")
    return store
  out = prepare_lib.prepare(d.source, os.path.join(workdir, "data"), tokenizer=d.tokenizer,
                            vocab_size=model_vocab, seed=data_seed(config),
                            val_fraction=d.val_fraction, max_bytes=d.max_bytes or None,
                            text_field=d.text_field, workers=1, progress=False)
  return data_lib.TokenStore(out)


def _check_vocab(vocab_size: int, model_vocab: int, what: str):
  if vocab_size > model_vocab:
    raise ConfigError(f"config.model.vocab_size: the tokenizer of {what} has {vocab_size} "
                      f"tokens, more than the model's {model_vocab}")


def _check_store_of_workdir(workdir: str, store, force: bool):
  """Refuse to resume a workdir on another store than the one it was trained on."""
  path = os.path.join(workdir, STORE_FILE)
  if not os.path.exists(path) or force:
    return
  with open(path) as f:
    saved = json.load(f)
  if saved["fingerprint"] != store.fingerprint:
    raise ConfigError(
        f"workdir {workdir} was trained on the token store {saved['directory']} (fingerprint "
        f"{saved['fingerprint'][:12]}), not on {store.directory} ({store.fingerprint[:12]}); "
        "use another --workdir, or --config.train.force_resume=True to resume anyway")


def data_seed(config) -> int:
  """The seed of the held-out split and the token streams: data.seed, else the run's seed.
  Runs of several seeds with one data.seed share one tokenized corpus and held-out set."""
  return config.data.seed if config.data.seed >= 0 else config.seed


def _check_parallel(config, plan: Plan, batch_sharding, abstract_state, shardings):
  """Before compiling: every batch and parameter divides over the mesh axes that shard it."""
  accum = config.optimizer.grad_accum
  for p in plan.phases:
    mesh_lib.check_batch(p.batch_size // accum, batch_sharding,
                         f"config.data.batch_size: phase {p.name}'s {p.batch_size // accum} rows"
                         + (f" per micro-batch (grad_accum={accum})" if accum > 1 else ""))
  mesh_lib.check_batch(config.data.batch_size, batch_sharding,
                       f"config.data.batch_size: the eval batch's {config.data.batch_size} rows")
  mesh_lib.check_divisible(abstract_state.params, shardings.params)


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


def _check_workdir_config(config, workdir: str):
  """Write config.json on the first run; refuse to resume a workdir of another config."""
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    try:
      with open(path) as f:
        saved = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
      raise DataError(f"{path}: cannot be read ({e}); it records the config of this workdir's "
                      "run: restore it, or use another --workdir") from None
    diff = [k for k in RESUME_KEYS if saved.get(k) != current.get(k)]
    if diff and not config.train.force_resume:
      raise ConfigError(
          f"workdir {workdir} holds a run of a different config (sections {diff} differ); "
          "use another --workdir, or --config.train.force_resume=True to resume anyway")
  if jax.process_index() == 0:
    _write_json(path, current)


def _write_json(path: str, obj: dict):
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)
