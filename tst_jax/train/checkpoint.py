"""Orbax checkpoints of the train state plus a JSON record of the phase and data position."""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from typing import Any, Callable, NamedTuple

import jax
import orbax.checkpoint as ocp
import tensorstore as ts
from absl import logging as absl_logging
from orbax.checkpoint import checkpoint_managers as policies
from orbax.checkpoint.checkpoint_managers import save_decision_policy

from tst_jax import fileio
from tst_jax.errors import ConfigError, StoreError, in_chain
from tst_jax.parallel import distributed
from tst_jax.run import workdir as workdir_lib
from tst_jax.config.spec import RunSpec
from tst_jax.train import checkpoint_mirror, local_checkpoint

log = logging.getLogger("tst_jax")
# A save that waits this long for the previous one to finish writing is said once, in our
# words: a run's steps stand still that long, and train.checkpoint_every is the remedy.
SLOW_SAVE_S = 10.0


class _OrbaxWarningsToTheLog(logging.Filter):
  """Shows Orbax's warnings as its info lines, with --verbosity=0 only: they tell of its own
  choices ("Waiting for previous save to complete took 1.3 seconds"), never of a run that
  fails, which raises. The slow save that matters is said once by Checkpoints.save."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno != logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname:
      return True
    record.levelno, record.levelname = logging.INFO, "INFO"
    return absl_logging.get_absl_logger().isEnabledFor(logging.INFO)


_ORBAX_FILTER = _OrbaxWarningsToTheLog()


def quiet_storage(directory: str):
  """Keeps the libraries under a checkpoint folder from printing lines of a run that is fine.

  Orbax's warnings go to the log (`_OrbaxWarningsToTheLog`). TensorStore, which writes the
  arrays, logs `E... google_auth_provider.cc] Could not find the credentials file` at its
  first request to a bucket wherever it goes on to a VM's own credentials, or to none for
  an emulator: it is asked once per bucket here, its stderr captured, and that line goes to
  the log. A bucket these credentials cannot write was refused before, in one line
  (RunDir.check_writable)."""
  absl_logging.get_absl_logger().addFilter(_ORBAX_FILTER)   # once: a filter is added once
  if fileio.protocol(directory) == "gs":
    _ask_tensorstore_credentials(directory.split("://", 1)[1].split("/", 1)[0])


@functools.cache
def _ask_tensorstore_credentials(bucket: str):
  """Reads a missing object of `bucket` through TensorStore, whose first request looks for
  credentials, with stderr captured: its lines about them go to the log, any other to stderr."""
  with _stderr_captured() as lines:
    try:
      ts.KvStore.open(dict(driver="gcs", bucket=bucket)).result().read(
          ".tst_jax_credentials_probe").result()
    except Exception:  # pylint: disable=broad-except  Orbax's own request says what fails
      pass
  for line in lines:
    if "google_auth_provider" in line:
      log.info("TensorStore: %s", line)
    else:
      sys.stderr.write(line + "\n")


@contextlib.contextmanager
def _stderr_captured():
  """Yields a list that holds, once the block ends, the lines written to file descriptor 2 in
  it: by C++ libraries too, which Python's sys.stderr does not see."""
  lines = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as f:
    os.dup2(f.fileno(), 2)
    try:
      yield lines
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      f.seek(0)
      lines += f.read().decode("utf-8", "replace").splitlines()


class SaveClock:
  """train.checkpoint_minutes: whether `minutes` have passed since the last save.

  Every process must save at the same step, and their clocks differ: with several processes
  they agree every `agree_every` steps, a save being due when any process's clock says so
  (one all-gather, as the preemption guard's fallback). `clock`: seconds, a fake in tests.
  """
  # Not Orbax's ContinuousCheckpointingPolicy, which saves at a run's first step, skips a step
  # while the last save writes and asks the primary host every step (test_checkpoint).

  def __init__(self, minutes: float, *, clock=time.monotonic, agree_every: int = 10):
    self.minutes, self.clock, self.agree_every = minutes, clock, agree_every
    self.last = clock()

  def due(self, step: int) -> bool:
    """Says whether a save is due, the same on every process. Call it once per step on each."""
    if not self.minutes:
      return False
    late = self.clock() - self.last >= 60 * self.minutes
    if jax.process_count() == 1:
      return late
    return step % self.agree_every == 0 and distributed.any_process(late)

  def saved(self):
    self.last = self.clock()


class _Step(NamedTuple):
  """A step as Orbax's save policies read it, their PolicyCheckpointInfo."""
  step: int
  time: datetime.datetime
  metrics: dict | None = None


class Checkpoints:
  """Saves periodically, keeps the latest N plus the phase handoffs, restores the latest or a step.

  Each step directory holds the TrainState as "state" and a small JSON as "meta": the phase,
  its step, the stream position where it started and the token store's fingerprint. A restart
  rebuilds the data position from the global step through the plan, so it continues with the
  very next batch. The meta records it for reading and checks. `before_save` runs before each
  save: the loop uploads the metrics logged so far there, so that a run killed after a save
  resumes with every line up to it.
  """

  def __init__(self, directory: str, *, keep: int, keep_steps=(), every: int = 0,
               clock: SaveClock | None = None, before_save: Callable[[], None] | None = None):
    self.directory = fileio.absolute(directory)   # a bucket's URL: Orbax writes it itself
    # ... except where TensorStore cannot reach it: then through a local mirror
    self.mirror = (checkpoint_mirror.Mirror(self.directory)
                   if checkpoint_mirror.mirrored(self.directory) else None)
    if self.mirror is not None:
      self.mirror.pull()
    quiet_storage(self.directory)
    self.said_slow = False
    self.before_save = before_save or (lambda: None)
    self.clock = clock or SaveClock(0.0)
    # The step cadence and the preemption save: Orbax's policies, which `_policy_saves` asks.
    self.policy = policies.AnySavePolicy(
        ([policies.FixedIntervalPolicy(every)] if every else [])
        + [save_decision_policy.PreemptionCheckpointingPolicy()])
    self.multiprocessing = ocp.options.MultiprocessingOptions()
    preserve = policies.AnyPreservationPolicy(
        [policies.LatestN(keep), policies.CustomSteps(list(keep_steps))])
    self.manager = ocp.CheckpointManager(
        self.mirror.local if self.mirror is not None else self.directory,
        item_handlers=dict(state=ocp.StandardCheckpointHandler(),
                           meta=ocp.JsonCheckpointHandler()),
        options=ocp.CheckpointManagerOptions(preservation_policy=preserve, create=True,
                                             multiprocessing_options=self.multiprocessing))
    # The last step whose write has finished, known without asking a store that may have
    # failed, and the step being written.
    self.complete, self._writing = self.manager.latest_step(), None

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state, meta: dict, *, force: bool = False,
           preempted: bool = False) -> bool:
    """Saves at the step cadence, when the clock is due or once `preempted`, unless this step
    exists. `force` saves at any step.
    """
    timed = self.clock.due(step)          # before any return: every process asks each step
    if step in self.manager.all_steps():
      return False
    if not (force or timed or self._policy_saves(step, preempted)):
      return False
    t0 = time.monotonic()
    self.wait()   # the previous write, which Orbax's save would wait for
    if time.monotonic() - t0 >= SLOW_SAVE_S and not self.said_slow:
      self.said_slow = True
      log.warning("checkpoint of step %d: waited %.0f s for the previous one to finish writing "
                  "to %s; a larger train.checkpoint_every saves less often", step,
                  time.monotonic() - t0, self.directory)
    self.before_save()
    with self._write_faults():    # also reports a failure of the previous async write
      saved = self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    if saved:
      self._writing = step
      if self.mirror is not None:
        self.mirror.upload_when_written(step, self.manager)
    self.clock.saved()
    return saved

  def _policy_saves(self, step: int, preempted: bool) -> bool:
    """Asks Orbax's save policy about `step`, told of a preemption by the run's guard.

    Not through CheckpointManager.should_save, which refuses a step below the latest one and
    hears of a preemption from JAX's service alone, absent from a single process. Neither policy
    reads the saved steps.
    """
    context = save_decision_policy.DecisionContext(
        is_saving_in_progress=self.manager.is_saving_in_progress(),
        reached_preemption=preempted, multiprocessing_options=self.multiprocessing)
    now = datetime.datetime.now(datetime.timezone.utc)
    return self.policy.should_save(_Step(step, now), [], context=context)

  def restore(self, step: int, abstract_state):
    """Restores the state and meta of `step`. `abstract_state` carries shapes, dtypes, shardings."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored.state, restored.meta

  def check_shapes(self, step: int, abstract_state):
    """Refuses a checkpoint whose shapes differ from the model's, naming the parameter."""
    try:
      saved = _leaf_shapes(self.manager.item_metadata(step)["state"])
    except Exception:  # unreadable metadata: restore() reports it and falls back
      return
    for name, shape in _leaf_shapes(abstract_state).items():
      if name in saved and saved[name] != shape:
        raise ConfigError("model", f"does not fit checkpoint {step} in {self.directory}: "
                          f"{name} has shape {saved[name]} there but {shape} in this config")

  def wait(self):
    with self._write_faults():
      self.manager.wait_until_finished()
      if self.mirror is not None:
        self.mirror.wait()
    if self._writing is not None:
      self.complete, self._writing = self._writing, None

  def last_complete(self) -> str:
    """Says which checkpoint is the last complete one, without asking the store."""
    return (f"step {self.complete} in {self.directory} is the last complete checkpoint"
            if self.complete is not None else "there is no complete checkpoint yet")

  def close(self):
    try:
      self.wait()
    finally:
      self.manager.close()

  @contextlib.contextmanager
  def _write_faults(self):
    """Turns a checkpoint write that fails on the file system or in its store into a
    StoreError.

    Full disks, permissions and a bucket that stopped answering are such failures. The error
    names the last complete checkpoint, which is left as it was: orbax writes each step into a
    temporary folder and renames it once complete, or in a bucket marks it complete last.
    """
    try:
      yield
    except Exception as e:  # orbax re-raises the background write's error, maybe wrapped
      cause = in_chain(e, lambda c: isinstance(c, OSError)) or fileio.store_error(e)
      if cause is None:
        raise
      where = getattr(cause, "filename", None) or self.directory
      why = getattr(cause, "strerror", None) or fileio.reason(cause, self.directory)
      raise StoreError(
          f"{where}: a checkpoint write failed ({why}); {self.last_complete()}: free space, "
          "fix permissions or wait for the store to answer, then run the same command again "
          "to resume from it") from e


class RunCheckpoints(Checkpoints):
  """A run's checkpoints: each step saved with its phase, data position and token store, and
  the latest one that restores, on the store it was trained on."""

  def __init__(self, directory: str, spec: RunSpec, fingerprint: str, store_directory: str,
               abstract_state, before_save: Callable[[], None] | None = None):
    super().__init__(directory, keep=spec.train.keep_checkpoints,
                     keep_steps=[p.first_step for p in spec.plan.phases[1:]],
                     every=spec.train.checkpoint_every,
                     clock=SaveClock(spec.train.checkpoint_minutes), before_save=before_save)
    self.plan, self.force_resume = spec.plan, spec.train.force_resume
    self.fingerprint, self.store_directory = fingerprint, store_directory
    self.abstract_state = abstract_state
    self.local = None           # emergency checkpoints, on this host
    if spec.train.local_checkpoint_every:
      # a step's config and token store name its run
      run_key = hashlib.sha256(json.dumps([spec.same_run(), fingerprint], sort_keys=True,
                                          default=str).encode()).hexdigest()[:16]
      self.local = local_checkpoint.LocalCheckpoints(
          spec.train.local_checkpoint_dir, self.directory, run_key,
          spec.train.local_checkpoint_every)

  def save_step(self, state, step: int, *, force: bool = False, preempted: bool = False) -> bool:
    """Saves `state` after `step` steps with the phase and data position it reached."""
    phase = self.plan.phase_at(max(step - 1, 0))
    meta = dict(step=step, phase=phase.name, phase_step=step - phase.first_step,
                data_start_pos=self.plan.data_start(phase), window=phase.window,
                data_fingerprint=self.fingerprint)
    saved = self.save(step, state, meta, force=force, preempted=preempted)
    if (not saved and self.local is not None and self.local.due(step)
        and step not in self.manager.all_steps()):     # a handoff's step is persistent
      self.before_save()
      self.local.save(step, state)
    return saved

  def restore_latest(self, reached: int = 0) -> tuple[Any, int] | None:
    """Returns (state, step) of the latest checkpoint that restores, None where there is none.
    An emergency checkpoint newer than the latest persistent one comes first, where the
    workdir records that the run `reached` its step: a copy past it is of a workdir made
    again. A truncated or corrupted step falls back to the one before."""
    local = self._restore_local(reached)
    if local is not None:
      return local
    if self.latest_step() is None:
      return None
    for step in sorted(self.all_steps(), reverse=True):
      self.check_shapes(step, self.abstract_state)
      try:
        state, meta = self.restore(step, self.abstract_state)
      except Exception as e:  # pylint: disable=broad-except
        log.warning("checkpoint %d in %s cannot be restored (%s: %s); trying the previous one",
                    step, self.directory, type(e).__name__, str(e)[:300])
        continue
      self._check_store(step, meta)
      return state, step
    raise ConfigError("--workdir", f"no checkpoint in {self.directory} can be restored")

  def wait_last(self):
    """Waits for the run's last checkpoint, then deletes the emergency copies it outdates."""
    self.wait()
    if self.local is not None:
      self.local.clear()

  def close(self):
    if self.local is not None:
      self.local.wait()
    super().close()

  def _restore_local(self, reached: int) -> tuple[Any, int] | None:
    """Returns (state, step) of the newest emergency checkpoint every process finds on its
    host, newer than the latest persistent one and no later than `reached`, that restores;
    else None, on every process."""
    if self.local is None or not reached:
      return None
    persistent = self.latest_step()
    restored = self.local.restore_newest(persistent, reached, self.abstract_state)
    if restored is None:
      return None
    state, step = restored
    if distributed.is_primary():
      print(f"restored the emergency checkpoint of step {step} from {self.local.root} on "
            f"each host (the latest in {self.directory}: "
            f"{'none' if persistent is None else f'step {persistent}'})")
    return state, step

  def _check_store(self, step: int, meta: dict):
    """Refuses a checkpoint trained on another token store: its fingerprint is in its meta."""
    saved = meta.get("data_fingerprint")
    differs = saved and saved != self.fingerprint and (
        f"fingerprint {saved[:12]} there, {self.store_directory} "
        f"({self.fingerprint[:12]}) here")
    workdir_lib.check_same_run(f"{self.directory}/{step}", "token store", differs,
                               self.force_resume)


def abstract_with_shardings(abstract_state, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract_state, shardings)


def _leaf_shapes(tree) -> dict[str, tuple]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
          for path, leaf in flat if hasattr(leaf, "shape")}
