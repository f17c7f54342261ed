"""Preemption on several processes: every process stops at the same step, without a
collective per step (the single-process signal path: behaviour/test_reliability)."""

import os
import signal
import socket
import subprocess
import sys

import jax
import pytest
from jax.experimental import multihost_utils

from tests.fixtures.paths import ROOT
from tst_jax.train.preemption import PreemptionGuard


@pytest.fixture
def two_processes(monkeypatch):
  """A fake two-process world that counts the all-gathers."""
  gathers = []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda x: gathers.append(int(x)) or [int(x), 0])
  return gathers


def test_service_path_asks_the_sync_point_each_step_and_gathers_nothing(two_processes,
                                                                        monkeypatch):
  asked = []
  monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point",
                      lambda step: asked.append(step) or step == 57)
  guard = PreemptionGuard()
  try:
    assert guard.service
    assert signal.getsignal(signal.SIGTERM) is not guard._handle   # left to JAX's notifier
    stops = [step for step in range(1, 101) if guard.should_stop(step)]
  finally:
    guard.close()
  assert stops == [57] and asked == list(range(1, 101)) and two_processes == []


def test_without_the_service_processes_agree_every_k_steps(two_processes):
  jax.config.update("jax_enable_preemption_service", False)
  guard = PreemptionGuard(agree_every=10)
  try:
    assert not guard.service
    stops = []
    for step in range(1, 101):
      if step == 33:
        guard.requested = True           # as the signal handler does
      if guard.should_stop(step):
        stops.append(step)
        break
  finally:
    guard.close()
    jax.config.update("jax_enable_preemption_service", True)
  assert stops == [40]
  assert len(two_processes) == 4         # steps 10, 20, 30, 40: one all-gather per 10 steps


WORKER = """
import signal, sys, os, time
import jax
from jax.experimental import multihost_utils
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from tst_jax.train.preemption import PreemptionGuard
gathers = []
real_gather = multihost_utils.process_allgather
multihost_utils.process_allgather = lambda x: gathers.append(1) or real_gather(x)
guard = PreemptionGuard()
for step in range(1, 400):
  if step == 5 and jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGTERM)   # only process 1 is preempted
  time.sleep(0.05)                         # a training step
  if guard.should_stop(step):
    print("STOP", step, "GATHERS", len(gathers), flush=True)
    break
else:
  print("NO STOP", flush=True)
guard.close()
"""


def test_two_real_processes_stop_at_the_same_step(tmp_path):
  """jax.distributed on CPU: SIGTERM to one process stops both at one step, after it."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, f"localhost:{port}", str(i)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for i in range(2)]
  outs = [p.communicate(timeout=120)[0] for p in procs]
  lines = [next((l for l in out.splitlines() if "STOP" in l), out[-2000:]) for out in outs]
  assert all(p.returncode == 0 for p in procs), outs
  assert lines[0] == lines[1] and lines[0].startswith("STOP"), lines
  step, gathers = int(lines[0].split()[1]), int(lines[0].split()[3])
  assert step > 5 and gathers == 0, lines
