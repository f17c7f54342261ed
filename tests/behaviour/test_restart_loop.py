"""The restart loop a JobSet runs, here on 2 CPU processes: each pod's command and environment
read from the rendered manifest, SIGKILLed and started again several times as JobSet
recreates the set, resuming from the workdir each time. Each step is logged once and
metrics.jsonl ends with every record of an uninterrupted run.

Where the kernel lets a user make namespaces (`unshare`), each pod runs as a container does:
its command is process 1 of its own PID namespace, under the pod's host name, both the same
at every restart."""

import functools
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import jobspec
from launch.gke import render
from tests.fixtures import subprocess_env
from tests.fixtures.processes import finish, free_port
from tests.fixtures.paths import ROOT
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib

# The tiny run (4 tst + 4 ntp steps, checkpoints every 2) over 2 processes of 2 CPU devices.
OVERRIDES = ["--config.train.steps=8", "--config.data.batch_size=8", "--config.mesh.data=1",
             "--config.mesh.fsdp=-1", "--config.distributed.cpu_devices=2",
             "--config.distributed.heartbeat_timeout_s=10"]
# The step whose record each start waits for before one pod is killed: before the first
# checkpoint, between two, and in the second phase.
KILL_AFTER = [1, 3, 5]
# Fields measured by the clock or the allocator, goodput's among them: they differ between
# any two runs.
MEASURED = ("step_s", "data_tokens_per_s", "equivalent_tokens_per_s", "mfu",
            "memory_bytes_in_use", "memory_peak_bytes", "goodput")
# A pod's own PID and UTS namespaces; the forked command dies with `unshare`.
POD = ["unshare", "--user", "--map-root-user", "--pid", "--mount-proc", "--uts", "--kill-child"]


def _manifest() -> dict:
  """The JobSet of the tiny run on 2 GPU hosts, as `python -m launch.gke.render` writes it,
  restarted once per step of KILL_AFTER."""
  [manifest] = render.render(render.parse_args([
      "--config", "tests/fixtures/tiny_config.py", "--platform=gpu", "--gpu_type=h100",
      "--num_hosts=2", "--workdir", "gs://tst-runs/restarts", "--image", "img:1",
      f"--max_restarts={len(KILL_AFTER)}", "--no_validate", *OVERRIDES]))
  return manifest


@functools.cache
def _pods_are_containers() -> bool:
  """Whether `unshare` gives a command PID 1 under a host name and /etc/hosts of its own."""
  try:
    out = subprocess.run([*POD, "sh", "-c", 'hostname pod && mount --bind /etc/hosts '
                          '/etc/hosts && echo "$$ $(hostname)"'],
                         capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return out.returncode == 0 and out.stdout.split() == ["1", "pod"]


def _start_pods(manifest: dict, mount, logs, tag: str) -> list[subprocess.Popen]:
  """Starts every pod of `manifest` as a process here, as the cluster runs them: the
  container's command in its working directory with its environment, the completion index as
  the process id, in a PID namespace of its own under the pod's host name where
  `_pods_are_containers`. What only a cluster gives is replaced: the bucket's mount (/gcs)
  by `mount`, pod 0's DNS name by 127.0.0.1 on a free port, the GPUs by CPU devices."""
  job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
  [container] = render.pod_template(manifest)["spec"]["containers"]
  assert container["workingDir"] == jobspec.CONTAINER_REPO
  address = f"127.0.0.1:{free_port()}"
  procs = []
  for index in range(job["completions"]):
    env = dict(os.environ, XLA_FLAGS=subprocess_env.fast_compile_flags())
    for var in container["env"]:
      if "valueFrom" in var:
        assert var["valueFrom"] == {"fieldRef": {"fieldPath": jobspec.COMPLETION_INDEX}}
      env[var["name"]] = str(index) if "valueFrom" in var else var["value"]
    assert env.pop("JAX_PLATFORMS") == "cuda" and env["JAX_NUM_PROCESSES"] == "2"
    # Pod i of an Indexed Job is the host <job>-<i>; pod 0's is the coordinator's address.
    host = f"{manifest['metadata']['name']}-{jobspec.REPLICATED_JOB}-0-{index}"
    if index == 0:
      assert env["JAX_COORDINATOR_ADDRESS"].startswith(f"{host}.")
    env.update(JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=address)
    command = [sys.executable if arg == "python" else
               arg.replace(f"{jobspec.GCS_MOUNT_ROOT}/", f"{mount}/")
               for arg in container["command"]]
    if _pods_are_containers():   # the pod's /etc/hosts names it, as the kubelet writes it
      hosts = logs / f"hosts_{index}"
      hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {host}\n")
      command = [*POD, "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && '
                 'exec "$@"', host, str(hosts), *command]
    with open(logs / f"{tag}_{index}.log", "w") as log:
      procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT))
  return procs


def _logged_steps(workdir) -> list[int]:
  return [r["step"] for r in workdir_lib.read_metrics(RunDir(workdir)) if "loss" in r]


def _unmeasured(records: list[dict]) -> list[dict]:
  return [{k: "measured" if k.split("/")[0] in MEASURED else v for k, v in r.items()}
          for r in records]


@pytest.mark.slow
def test_the_jobsets_command_killed_and_restarted_resumes_and_logs_each_record_once(tmp_path):
  """Three restarts, each after a pod is SIGKILLed: before the first checkpoint (the run
  starts over), between two checkpoints (steps are trained again) and in the second phase.
  The other pod is killed as JobSet deletes it. The fourth start finishes, and metrics.jsonl
  holds every record of the uninterrupted run once, equal but for its times."""
  manifest = _manifest()
  [container] = render.pod_template(manifest)["spec"]["containers"]
  workdir_arg = container["command"][container["command"].index("--workdir") + 1]
  assert workdir_arg == f"{jobspec.GCS_MOUNT_ROOT}/tst-runs/restarts"
  started = time.time()

  reference = tmp_path / "reference"
  finish(_start_pods(manifest, reference, tmp_path, "reference"), tmp_path, "reference")
  expected = workdir_lib.read_metrics(RunDir(reference / "tst-runs" / "restarts"))
  assert _logged_steps(reference / "tst-runs" / "restarts") == list(range(1, 9))

  mount = tmp_path / "gcs"
  workdir = mount / "tst-runs" / "restarts"
  for restart in range(manifest["spec"]["failurePolicy"]["maxRestarts"]):
    step, tag = KILL_AFTER[restart], f"start{restart}"
    procs = _start_pods(manifest, mount, tmp_path, tag)
    deadline = time.time() + 420
    while time.time() < deadline and all(p.poll() is None for p in procs) and (
        max(_logged_steps(workdir) if workdir.exists() else [], default=0) < step):
      time.sleep(0.05)
    if not all(p.poll() is None for p in procs):
      finish(procs, tmp_path, tag)        # fails with the logs where a pod failed
      pytest.fail(f"{tag} finished before it logged step {step}")
    victim = procs[restart % 2]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in procs:              # JobSet deletes the set's other pods and recreates them all
      p.send_signal(signal.SIGKILL)
      p.wait()
  finish(_start_pods(manifest, mount, tmp_path, "last"), tmp_path, "last")

  records = workdir_lib.read_metrics(RunDir(workdir))
  assert _logged_steps(workdir) == list(range(1, 9))          # each step once
  assert _unmeasured(records) == _unmeasured(expected)        # and no record lost
  print(f"pods as containers: {_pods_are_containers()}; the reference run and "
        f"{len(KILL_AFTER)} restarts: {time.time() - started:.0f} s")
