"""Emergency checkpoints on 2 CPU processes, each a host with its own cache folder: one process
SIGKILLed without a signal it could catch, both started again. With every host's copy there the
run resumes from the newest emergency checkpoint, past the last persistent one, also where
each process restarts on the other's host (pods placed anew); with one host's copy gone (a new
machine) it falls back to the persistent checkpoint in the bucket. Either way metrics.jsonl
ends with the records of an uninterrupted run: each step once, equal but for its times. S3
checkpoints go through one machine's disk, so the S3 run has one process."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.processes import finish, free_port
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib

# The tiny run (4 tst + 4 ntp steps): persistent checkpoints at the phase ends alone (4, 8),
# an emergency one after every step.
FLAGS = ["--config.train.steps=8", "--config.data.batch_size=8", "--config.mesh.data=1",
         "--config.mesh.fsdp=-1", "--config.train.checkpoint_every=0",
         "--config.train.local_checkpoint_every=1",
         "--config.distributed.heartbeat_timeout_s=10"]
KILLED_AFTER = 6          # both hosts hold this step's emergency copy when one is killed
MEASURED = ("step_s", "data_tokens_per_s", "equivalent_tokens_per_s", "mfu",
            "memory_bytes_in_use", "memory_peak_bytes", "goodput")


def _launch(workdir: str, hosts, logs, tag: str, processes: int,
            placed: tuple = (0, 1)) -> list[subprocess.Popen]:
  """Starts the run's processes, process i on host placed[i] with its cache folder
  ($XDG_CACHE_HOME), where the emergency checkpoints go by default; 4 CPU devices in all."""
  port, procs = free_port(), []
  for i in range(processes):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_env.fast_compile_flags(),
               XDG_CACHE_HOME=str(hosts / f"host{placed[i]}"))
    cmd = [sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG,
           "--workdir", workdir, *FLAGS, f"--config.distributed.cpu_devices={4 // processes}"]
    if processes > 1:
      cmd += [f"--config.distributed.coordinator_address=localhost:{port}",
              f"--config.distributed.num_processes={processes}",
              f"--config.distributed.process_id={i}"]
    with open(logs / f"{tag}_{i}.log", "w") as log:
      procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT))
  return procs


def _emergency_steps(host) -> set[int]:
  return {int(name) for folder, _, names in os.walk(host) if "local_checkpoints" in folder
          for name in names + [os.path.basename(folder)] if name.isdigit()}


def _unmeasured(records: list[dict]) -> list[dict]:
  return [{k: "measured" if k.split("/")[0] in MEASURED else v for k, v in r.items()}
          for r in records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, list[dict]]:
  """metrics.jsonl of the run never killed, on 2 processes and on 1."""
  out = {}
  for processes in (2, 1):
    folder = tmp_path_factory.mktemp(f"uninterrupted{processes}")
    finish(_launch(str(folder / "run"), folder, folder, "run", processes), folder, "run")
    out[processes] = workdir_lib.read_metrics(RunDir(str(folder / "run")))
  return out


def _kill_and_restart(workdir: str, tmp_path, processes: int, lose_host: bool,
                      placed: tuple = (0, 1)) -> str:
  """Runs until every host holds the emergency copy of KILLED_AFTER, SIGKILLs the last process,
  then the others as a cluster's restart does; with `lose_host` empties its cache folder (a
  new machine). Starts them all again to the end, process i on host placed[i]; returns
  process 0's log of that start."""
  hosts = [tmp_path / f"host{i}" for i in range(processes)]
  procs = _launch(workdir, tmp_path, tmp_path, "first", processes)
  deadline = time.time() + 420
  while time.time() < deadline and all(p.poll() is None for p in procs) and not all(
      KILLED_AFTER in _emergency_steps(h) for h in hosts):
    time.sleep(0.05)
  if not all(p.poll() is None for p in procs):
    finish(procs, tmp_path, "first")
    pytest.fail(f"the run ended before step {KILLED_AFTER}")
  for p in reversed(procs):
    p.send_signal(signal.SIGKILL)
    p.wait()
  if lose_host:
    shutil.rmtree(hosts[-1])
  finish(_launch(workdir, tmp_path, tmp_path, "restarted", processes, placed), tmp_path,
         "restarted")
  return (tmp_path / "restarted_0.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("placed", [(0, 1), (1, 0)], ids=["same_hosts", "hosts_swapped"])
def test_a_killed_process_resumes_from_the_emergency_checkpoints(placed, tmp_path,
                                                                 uninterrupted):
  workdir = str(tmp_path / "run")
  out = _kill_and_restart(workdir, tmp_path, 2, lose_host=False, placed=placed)
  restored = int(out.split("restored the emergency checkpoint of step ")[1].split()[0])
  assert restored >= KILLED_AFTER and "(the latest in" in out and "step 4)" in out
  assert f"resuming {workdir} at step {restored}" in out
  records = workdir_lib.read_metrics(RunDir(workdir))
  assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))   # each step once
  assert _unmeasured(records) == _unmeasured(uninterrupted[2])
  # the finished run's last checkpoint is persistent: the hosts' copies are deleted
  assert not any(_emergency_steps(tmp_path / f"host{i}") for i in range(2))


@pytest.mark.slow
@pytest.mark.parametrize("store,processes", [("gs", 2), ("s3", 1)])
def test_a_host_whose_copy_is_gone_falls_back_to_the_bucket(store, processes, tmp_path,
                                                            uninterrupted, request):
  workdir = request.getfixturevalue("bucket" if store == "gs" else "s3_bucket") + "/run"
  out = _kill_and_restart(workdir, tmp_path, processes, lose_host=True)
  assert "emergency" not in out and f"resuming {workdir} at step 4" in out
  records = workdir_lib.read_metrics(RunDir(workdir))
  assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))
  assert _unmeasured(records) == _unmeasured(uninterrupted[processes])
