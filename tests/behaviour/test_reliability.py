"""Reliability: the NaN/Inf guard, corrupted checkpoints, preemption signals, failed
checkpoint writes, a kill during the phase-switch checkpoint."""

import errno
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import errors, models
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax import optim
from tst_jax.train import step as step_lib
from tst_jax.train.setup import Setup
from tst_jax.run import goodput, workdir as workdir_lib


def test_non_finite_step_leaves_state_untouched(monkeypatch):
  config = tiny_config()
  model_cfg = models.model_config(config.model)
  tx, schedule = optim.make_optimizer(config.optimizer, 10)
  graphdef, _ = step_lib.abstract_model(model_cfg)
  state = step_lib.init_fn(model_cfg, tx)(jax.random.key(0))
  ntp = spec_lib.check(config).plan.phases[-1]
  ntp_loss = step_lib.loss

  def loss(model, window, phase, loss_cfg, documents=None):   # NaN where token 0 starts it
    value, aux = ntp_loss(model, window, phase, loss_cfg, documents)
    return jnp.where(window[0, 0] == 0, jnp.nan, value), aux

  monkeypatch.setattr(step_lib, "loss", loss)
  train_step = jax.jit(step_lib.make_train_step(graphdef, ntp, config.loss, tx, schedule))
  good = jax.random.randint(jax.random.key(1), (4, 17), 1, 512)
  state, _ = train_step(state, good)           # step 0 has lr 0 (warmup): move past it
  bad = good.at[0, 0].set(0)
  after_bad, metrics = train_step(state, bad)
  assert not metrics["finite"]
  for a, b in zip(jax.tree.leaves((after_bad.params, after_bad.opt_state)),
                  jax.tree.leaves((state.params, state.opt_state))):
    np.testing.assert_array_equal(a, b)
  after_good, metrics = train_step(state, good)
  assert metrics["finite"]
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after_good.params),
                                                      jax.tree.leaves(state.params)))


@pytest.mark.parametrize("policy,count", [("stop", 1), ("skip", 4)])
def test_divergence_stops_with_step_metric_and_last_good_checkpoint(tmp_path, policy, count):
  config = tiny_config(optimizer=dict(lr=1e30), train=dict(nan_policy=policy))
  with pytest.raises(FloatingPointError, match=r"non-finite (loss|grad_norm) .* at step \d+; "
                     r"the update was not applied. Last good checkpoint: step \d+ in .*"
                     rf"{count} non-finite steps"):
    cli.run(config, str(tmp_path))
  run = Setup.create(spec_lib.build(config), RunDir(tmp_path))
  state, step = run.restore_or_init()
  assert step > 0 and all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))


CMD = [sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG]
ENV = subprocess_env.one_cpu_device()


def _losses(workdir):
  return {r["step"]: r["loss"] for r in workdir_lib.read_metrics(RunDir(workdir))
          if "loss" in r}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The tiny two-phase run (6 tst + 6 ntp steps) without interruption, as a subprocess."""
  workdir = tmp_path_factory.mktemp("full")
  subprocess.run(CMD + ["--workdir", str(workdir)], check=True, env=ENV, capture_output=True)
  return _losses(workdir)


def _start_and_wait(workdir, until_step):
  """Start a run and return once metrics.jsonl has a train line of `until_step` or later."""
  proc = subprocess.Popen(CMD + ["--workdir", str(workdir)], env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  path = workdir / "metrics.jsonl"
  while time.time() < deadline and proc.poll() is None:
    if path.exists() and any(step >= until_step for step in _losses(workdir)):
      return proc
    time.sleep(0.02)
  raise AssertionError(f"run ended or stalled before step {until_step}: {proc.poll()}")


@pytest.mark.slow
@pytest.mark.parametrize("interruptions", [
    [(signal.SIGKILL, 5), (signal.SIGTERM, 7)], [(signal.SIGTERM, 5)]],
    ids=["kill5_term7", "term5"])
def test_interrupted_run_resumes_bit_identically(tmp_path, uninterrupted, interruptions):
  """Killed (SIGKILL: loses the steps since the last checkpoint) or preempted (SIGTERM:
  checkpoints the step it finishes and exits 0) around the phase switch at step 6, restarted
  after each: the loss trajectory equals the uninterrupted run's bit for bit. One run takes
  both signals in turn, which saves a restart. The killed run's lock is taken over with a
  line; the preempted run releases its own."""
  killed = False
  for sig, until_step in interruptions:
    # Past the steps an earlier run already logged, so that their lines do not count.
    done = max(_losses(tmp_path), default=0) if (tmp_path / "metrics.jsonl").exists() else 0
    proc = _start_and_wait(tmp_path, max(until_step, done + 1))
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    assert ("from a dead run: pid" in out) == killed, out
    killed = sig == signal.SIGKILL
    assert os.path.exists(RunDir(tmp_path).lock) == killed
    if sig == signal.SIGTERM:
      assert proc.returncode == 0, out
      assert "preempted: checkpoint of step" in out
  subprocess.run(CMD + ["--workdir", str(tmp_path)], check=True, env=ENV, capture_output=True)
  assert _losses(tmp_path) == uninterrupted
  steps = [r["step"] for r in workdir_lib.read_metrics(RunDir(tmp_path)) if "loss" in r]
  assert steps == list(range(1, 13)) and not os.path.exists(RunDir(tmp_path).lock)
  # goodput.jsonl: a session per start, a preempted one ended with no step to train again.
  run = goodput.read_account(RunDir(tmp_path))
  assert [s.ended for s in run.sessions] == [
      None if sig == signal.SIGKILL else "preempted" for sig, _ in interruptions] + ["finished"]
  assert all(s.seconds["lost"] == 0 for s in run.sessions if s.ended == "preempted")
  assert sum(run.seconds.values()) == pytest.approx(run.wall, rel=0.02)


def test_second_signal_exits_at_once():
  code = ("import os, signal, time\n"
          "from tst_jax.train.preemption import PreemptionGuard\n"
          "g = PreemptionGuard()\n"
          # the sleep runs the handler: CPython runs it at a later instruction, not at once
          "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.01)\n"
          "assert g.requested and g.should_stop()\n"
          "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); print('not reached')\n")
  result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
  assert result.returncode == 128 + signal.SIGTERM
  assert "exiting now" in result.stderr and "not reached" not in result.stdout


# The in-process runs below share one config, tiny_config(steps=8), so that they share its
# compiled programs too (the persistent compilation cache of conftest.py).
@pytest.mark.slow
def test_corrupted_latest_checkpoint_falls_back_to_previous(tmp_path, caplog):
  config = tiny_config(steps=8)
  cli.run(config, str(tmp_path))
  latest = tmp_path / "checkpoints" / "8" / "state"
  victims = [p for p in latest.rglob("*") if p.is_file() and p.stat().st_size > 64]
  for p in victims:                      # truncate the array data of the latest step
    with open(p, "r+b") as f:
      f.truncate(p.stat().st_size // 3)
  run = Setup.create(spec_lib.build(config), RunDir(tmp_path))
  with caplog.at_level("WARNING", logger="tst_jax"):
    state, step = run.restore_or_init()
  assert step == 6
  assert "checkpoint 8" in caplog.text and "cannot be restored" in caplog.text


@pytest.mark.slow
def test_checkpoint_of_another_shape_names_the_parameter(tmp_path):
  cli.run(tiny_config(steps=8), str(tmp_path))
  before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  wider = tiny_config(steps=8, model=dict(ffw_dim=96), train=dict(force_resume=True))
  with pytest.raises(ValueError, match=r"params/blocks/ffw/\w+_proj/value has shape "
                                       r"\(2, (32, 64|64, 32)\) there but"):
    cli.run(wider, str(tmp_path))
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


@pytest.mark.slow
@pytest.mark.parametrize("code,reason", [(errno.ENOSPC, "No space left on device"),
                                         (errno.EACCES, "Permission denied")])
def test_failed_checkpoint_write_stops_clearly_and_resumes_from_the_last_complete(
    tmp_path, monkeypatch, code, reason):
  """The write of checkpoint 6 fails in orbax's background commit (as on a full disk or a
  lost permission): the run stops with one clear error naming the intact checkpoint 4, and
  the same command resumes from it, step for step as a run without the fault."""
  config = tiny_config(steps=8)       # checkpoints 2, 4 (phase switch), 6, 8
  reference = tmp_path / "reference"
  cli.run(config, str(reference))
  real_write = json_checkpoint_handler.JsonCheckpointHandler._save_fn

  async def failing_write(self, meta, directory):
    if meta["step"] == 6:
      raise OSError(code, reason, str(directory / "meta"))
    return await real_write(self, meta, directory)

  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", failing_write)
  workdir = tmp_path / "run"
  with pytest.raises(errors.StoreError, match=rf"a checkpoint write failed \({reason}\); "
                     r"step 4 in .* is the last complete checkpoint: .* resume") as e:
    cli.run(config, str(workdir))
  assert errors.one_line(e.value).startswith(f"error: {workdir}/checkpoints/6.orbax-checkpoint")
  complete = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert complete == [2, 4]
  monkeypatch.undo()
  cli.run(config, str(workdir))
  assert _losses(workdir) == _losses(reference)


def test_kill_during_the_phase_switch_checkpoint_resumes_into_phase_2(tmp_path, uninterrupted):
  """SIGKILL while checkpoint 6 (the end of phase 1) is being written: the restart resumes
  from checkpoint 4, redoes steps 5-6 and switches phase as the uninterrupted run did."""
  kill_at_switch = (
      "import os, runpy, signal, sys\n"
      "from orbax.checkpoint._src.handlers import json_checkpoint_handler as h\n"
      "real_write = h.JsonCheckpointHandler._save_fn\n"
      "async def killed(self, meta, directory):\n"
      "  if meta['step'] == 6:\n"
      "    os.kill(os.getpid(), signal.SIGKILL)\n"
      "  return await real_write(self, meta, directory)\n"
      "h.JsonCheckpointHandler._save_fn = killed\n"
      "sys.argv = sys.argv[1:]\n"
      "runpy.run_path(sys.argv[0], run_name='__main__')\n")
  killed = subprocess.run([sys.executable, "-c", kill_at_switch, *CMD[1:], "--workdir",
                           str(tmp_path)], env=ENV, capture_output=True, text=True)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
  names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  assert "6" not in names and any(n.startswith("6.orbax-checkpoint-tmp") for n in names), names
  subprocess.run(CMD + ["--workdir", str(tmp_path)], check=True, env=ENV, capture_output=True)
  assert _losses(tmp_path) == uninterrupted
  phases = {r["step"]: r["phase"] for r in workdir_lib.read_metrics(RunDir(tmp_path))
            if "loss" in r}
  assert [phases[s] for s in range(1, 13)] == ["tst"] * 6 + ["ntp"] * 6
