"""Two processes (jax.distributed, gloo, 4 CPU devices each) train with FSDP over all 8
devices, checkpoint, get killed, restart and resume: the same losses as one process. When
only one is killed, the other stops within a bounded time instead of hanging."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.processes import finish, free_port
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import workdir as workdir_lib

# The tiny run (4 tst + 4 ntp steps, checkpoints every 2), parameters sharded over 8 devices.
FIELDS = dict(steps=8, data=dict(batch_size=8))
FLAGS = ["--config.train.steps=8", "--config.data.batch_size=8", "--config.mesh.data=1",
         "--config.mesh.fsdp=-1", "--verbosity=0"]   # INFO: each process logs its summary


def _launch(workdir, cache, logs, tag, extra=()):
  """Start processes 0 and 1 of one run; each sees 4 CPU devices, the mesh spans all 8."""
  port = free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=subprocess_env.fast_compile_flags())
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))     # the restart reuses them
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  procs = []
  for i in range(2):
    cmd = [sys.executable, os.path.join(ROOT, "main.py"),
           "--config", TINY_CONFIG, "--workdir", str(workdir),
           *FLAGS, f"--config.distributed.coordinator_address=localhost:{port}",
           "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
           "--config.distributed.cpu_devices=4", *extra]
    log = open(logs / f"{tag}_{i}.log", "w")
    procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
  return procs


def _steps(workdir):
  ckpt = workdir / "checkpoints"
  return sorted(int(d) for d in os.listdir(ckpt) if d.isdigit()) if ckpt.exists() else []


@pytest.mark.slow
def test_two_processes_checkpoint_resume_and_match_one_process(tmp_path):
  workdir, cache, logs = tmp_path / "run", tmp_path / "xla_cache", tmp_path
  procs = _launch(workdir, cache, logs, "first")
  deadline = time.time() + 420
  while time.time() < deadline and all(p.poll() is None for p in procs) and not _steps(workdir):
    time.sleep(0.05)
  for p in procs:            # stop both as soon as the first checkpoint (step 2) is written
    p.kill()
    p.wait()
  assert 0 < max(_steps(workdir), default=0) < 8, _steps(workdir)

  finish(_launch(workdir, cache, logs, "resumed"), logs, "resumed")
  summaries = [json.loads(line.split(f"summary of process {i}: ")[1]) for i in range(2)
               for line in (logs / f"resumed_{i}.log").read_text().splitlines()
               if f"summary of process {i}: " in line]

  expected = cli.run(tiny_config(mesh=dict(data=1), **FIELDS), str(tmp_path / "one"))
  records = workdir_lib.read_metrics(RunDir(workdir))
  losses = {r["step"]: r["loss"] for r in records if "loss" in r}
  reference = {r["step"]: r["loss"] for r in workdir_lib.read_metrics(
      RunDir(tmp_path / "one")) if "loss" in r}
  assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))  # each step once
  assert sorted(losses) == sorted(reference)
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [reference[s] for s in sorted(reference)], rtol=0, atol=1e-4)
  assert len(summaries) == 2
  for summary in summaries:   # both processes evaluate the same model
    np.testing.assert_allclose(summary["final_eval_loss"], expected["final_eval_loss"],
                               atol=1e-4)
  assert {4, 8} <= set(_steps(workdir))          # the phase handoff and the final checkpoint


def _losses(workdir):
  return {r["step"]: r["loss"] for r in workdir_lib.read_metrics(RunDir(workdir))
          if "loss" in r}


@pytest.fixture(scope="module")
def two_process_reference(tmp_path_factory):
  """The uninterrupted two-process run's losses."""
  base = tmp_path_factory.mktemp("reference")
  finish(_launch(base / "run", base / "xla_cache", base, "reference"), base, "reference")
  return _losses(base / "run")


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_killing_one_process_stops_the_other_and_both_resume(tmp_path, two_process_reference,
                                                              victim):
  """SIGKILL one process after the first checkpoint: the other exits within the heartbeat
  timeout (10 s here) instead of blocking in its next collective: with one `error:` line
  (exit 2) when process 1 died, from the collective that failed or else from the watchdog; when the coordinator (process 0) died,
  JAX's client aborts at once with its own 'another task died' message. Restarting both
  resumes from the checkpoint, loss for loss as the uninterrupted run."""
  workdir, cache, logs = tmp_path / "run", tmp_path / "xla_cache", tmp_path
  heartbeat = ["--config.distributed.heartbeat_timeout_s=10"]
  procs = _launch(workdir, cache, logs, "first", heartbeat)
  deadline = time.time() + 420
  while time.time() < deadline and all(p.poll() is None for p in procs) and not _steps(workdir):
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs) and 0 < max(_steps(workdir)) < 8
  procs[victim].kill()
  killed_at = time.time()
  survivor = procs[1 - victim]
  try:
    survivor.wait(timeout=60)
  except subprocess.TimeoutExpired:
    survivor.kill()
    pytest.fail("the surviving process still runs 60 s after the other was killed")
  waited = time.time() - killed_at
  procs[victim].wait()
  log = (logs / f"first_{1 - victim}.log").read_text()
  if victim == 1:
    assert survivor.returncode == 2 and waited < 20, (survivor.returncode, waited)
    line = next((l for l in log.splitlines() if l.startswith("error: process 0 of 2: ")), "")
    assert ("a collective with the other processes failed" in line or
            "process 1 has not been heard from for 10 s" in line), log[-3000:]
    assert line.endswith("start every process again to resume from the last checkpoint")
  else:
    assert survivor.returncode != 0 and waited < 20, (survivor.returncode, waited)
    assert "another task died" in log, log[-3000:]
  print(f"victim {victim}: the other process exited ({survivor.returncode}) {waited:.1f} s "
        "after the kill")

  finish(_launch(workdir, cache, logs, "resumed", heartbeat), logs, "resumed")
  assert _losses(workdir) == two_process_reference
  steps = [r["step"] for r in workdir_lib.read_metrics(RunDir(workdir)) if "loss" in r]
  assert steps == list(range(1, 9))
