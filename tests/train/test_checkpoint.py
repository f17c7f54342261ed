"""Checkpoints by the clock (train.checkpoint_minutes), with a fake clock: saves at least every
N minutes besides the step cadence, and every process of a multi-process run agrees on the
step. Where Orbax's own save policies and CheckpointManager.should_save would save other steps.
The step cadence, handoffs and restore: train/test_loop.py, behaviour/test_reliability.py."""

import datetime
import logging
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from absl import logging as absl_logging
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies
from orbax.checkpoint.checkpoint_managers import save_decision_policy

from tests.fixtures.tiny import tiny_config
from tst_jax.rundir import RunDir
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax.config import spec as spec_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax.train.preemption import PreemptionGuard
from tst_jax.train.setup import Setup


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_saves_when_the_minutes_have_passed_and_after_a_cadence_save(tmp_path):
  """One minute, 25 s a step: due at steps 3 (75 s), then 60 s after each save, which the
  step cadence (every 4) also resets."""
  clock = FakeClock()
  checkpoints = ckpt_lib.Checkpoints(str(tmp_path), keep=20, every=4,
                                     clock=ckpt_lib.SaveClock(1.0, clock=clock))
  state = {"w": jnp.arange(3.0)}
  saved = []
  for step in range(1, 15):
    clock.now += 25.0
    if checkpoints.save(step, state, dict(step=step)):
      saved.append(step)
  checkpoints.close()
  # 3 (75 s), 4 (cadence), 7 (75 s after 4), 8, 11, 12; never a second save of one step
  assert saved == [3, 4, 7, 8, 11, 12]
  assert checkpoints.all_steps() == saved


def test_orbax_continuous_policy_saves_other_steps_than_the_clock():
  """Orbax's ContinuousCheckpointingPolicy on the clock of the test above, beside the same
  cadence: it saves at step 1, a run's first step, where SaveClock waits the minute, and says
  no while the last save is still writing, where SaveClock waits for that write and saves."""
  policy = policies.ContinuousCheckpointingPolicy(minimum_interval_secs=60)
  start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
  at = lambda step: ckpt_lib._Step(step, start + datetime.timedelta(seconds=25 * step))

  def context(writing):
    return save_decision_policy.DecisionContext(
        is_saving_in_progress=writing, reached_preemption=False,
        multiprocessing_options=ocp.options.MultiprocessingOptions())
  saved = []
  for step in range(1, 15):
    if step % 4 == 0 or policy.should_save(at(step), [at(s) for s in saved],
                                           context=context(False)):
      saved.append(step)
  assert saved == [1, 4, 7, 8, 11, 12]                     # the clock's: [3, 4, 7, 8, 11, 12]
  assert not policy.should_save(at(7), [at(4)], context=context(True))


def test_should_save_of_orbax_refuses_a_step_below_the_latest(tmp_path):
  """A run resumed before its latest step, which did not restore, saves the steps up to it on
  its cadence; CheckpointManager.should_save, under the same FixedIntervalPolicy, refuses them."""
  checkpoints = ckpt_lib.Checkpoints(str(tmp_path), keep=20, every=1)
  state = {"w": jnp.arange(3.0)}
  for step in (2, 4):
    checkpoints.save(step, state, dict(step=step))
  assert checkpoints.save(3, state, dict(step=3))
  checkpoints.close()
  manager = ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(
      save_decision_policy=policies.FixedIntervalPolicy(1)))
  assert manager.all_steps() == [2, 3, 4] and not manager.should_save(3)
  assert manager.should_save(5)
  manager.close()


def test_a_preemption_saves_off_the_cadence_where_orbax_hears_of_none(tmp_path):
  """A single process's SIGTERM reaches the run's guard, which tells the policy; Orbax's own
  reached_preemption listens to JAX's preemption service only, which a single process lacks."""
  checkpoints = ckpt_lib.Checkpoints(str(tmp_path), keep=20, every=4)
  guard = PreemptionGuard()
  try:
    guard.requested = True               # as the SIGTERM handler does
    stop = guard.should_stop(5)
  finally:
    guard.close()
  assert stop and not checkpoints.manager.reached_preemption(5)
  state = {"w": jnp.arange(3.0)}
  assert not checkpoints.save(5, state, dict(step=5))
  assert checkpoints.save(5, state, dict(step=5), preempted=stop)
  checkpoints.close()
  assert checkpoints.all_steps() == [5]


def test_off_by_default():
  clock = FakeClock()
  timer = ckpt_lib.SaveClock(0.0, clock=clock)
  clock.now = 1e9
  assert not timer.due(10)


@pytest.fixture
def two_processes(monkeypatch):
  """A fake two-process world whose other process reports `other[0]`; counts the
  all-gathers."""
  gathers, other = [], [0]
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda x: gathers.append(int(x)) or [int(x), other[0]])
  return gathers, other


def test_processes_agree_every_k_steps_when_any_clock_is_due(two_processes):
  gathers, other = two_processes
  clock = FakeClock()
  timer = ckpt_lib.SaveClock(1.0, clock=clock, agree_every=10)
  due = []
  for step in range(1, 41):
    clock.now += 5.0                       # this process: due from step 12 (60 s)
    if timer.due(step):
      due.append(step)
      timer.saved()
  # agreed at 20 (this clock) and 40; step 12 alone would differ between processes
  assert due == [20, 40] and len(gathers) == 4
  clock.now, timer.last, other[0] = 0.0, 0.0, 1   # this clock not due, the other's is
  assert not timer.due(45) and timer.due(50)


def test_a_runs_setup_saves_by_train_checkpoint_minutes(tmp_path):
  """The run's own save path: train.checkpoint_minutes=1 and a step cadence of 100, with
  `before_save` run before each save, and only then."""
  config = tiny_config(train=dict(checkpoint_minutes=1.0, checkpoint_every=100))
  setup = Setup.create(spec_lib.build(config), RunDir(tmp_path), record=False)
  before = []          # the complete checkpoints as each save begins
  checkpoints = setup.open_checkpoints(
      before_save=lambda: before.append(workdir_lib.checkpoint_steps(setup.rundir)))
  clock = FakeClock()
  checkpoints.clock.clock = clock
  checkpoints.clock.saved()
  state = {"w": jnp.arange(3.0)}
  for step, seconds in ((1, 30.0), (2, 61.0), (3, 90.0), (4, 125.0)):
    clock.now = seconds
    checkpoints.save_step(state, step)
  checkpoints.close()
  assert checkpoints.all_steps() == [2, 4] and before == [[], [2]]


def test_orbax_warnings_go_to_the_log_and_a_slow_save_is_said_once(tmp_path, monkeypatch,
                                                                   caplog):
  """Orbax's own warnings ("Waiting for previous save to complete took ...") show with
  --verbosity=0 only, as info lines; a save that waits for the previous one is said once in
  our words."""
  shown = []
  absl_logger = absl_logging.get_absl_logger()
  handler = logging.Handler()
  handler.emit = shown.append
  absl_logger.addHandler(handler)
  before = absl_logger.level
  try:
    checkpoints = ckpt_lib.Checkpoints(str(tmp_path), keep=20, every=1)
    orbax_file = os.path.join(os.path.dirname(ocp.__file__), "checkpoint_manager.py")
    for level in (logging.WARNING, logging.INFO):
      absl_logger.setLevel(level)
      absl_logger.handle(logging.LogRecord("absl", logging.WARNING, orbax_file, 1, "Waiting for "
                                           "previous save to complete took 3.1 seconds.", (),
                                           None))
    assert [(r.levelname, r.getMessage()) for r in shown] == [
        ("INFO", "Waiting for previous save to complete took 3.1 seconds.")]
  finally:
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(before)
  monkeypatch.setattr(ckpt_lib, "SLOW_SAVE_S", 0.0)
  with caplog.at_level(logging.WARNING, logger="tst_jax"):
    for step in (1, 2):
      checkpoints.save(step, {"w": jnp.arange(3.0)}, dict(step=step))
    checkpoints.close()
  said = [r.getMessage() for r in caplog.records if r.name == "tst_jax"]
  assert len(said) == 1 and said[0].startswith("checkpoint of step 1: waited 0 s for the "
                                               "previous one to finish writing to "), said
