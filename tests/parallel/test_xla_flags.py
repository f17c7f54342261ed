"""The multi-GPU XLA flags (tst_jax/parallel/xla_flags.py): set only for a GPU run over several
devices without the user's own; read from the machine without starting a backend; none for a
fit check's CPU compile; every name one this jaxlib's XLA knows."""

import os
import subprocess
import sys

import jax
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.parallel import mesh as mesh_lib, xla_flags
from tst_jax import cli
from tst_jax.config import spec as spec_lib


MESH = dict(data=1, fsdp=-1, tensor=1, expert=1, dcn_data=1)


def mesh(**axes):
  """A run spec's mesh section with `axes` changed."""
  return mesh_lib.MeshShape(**(MESH | axes))


DIST = tiny_config().distributed


@pytest.mark.parametrize("platform,devices,env,want", [
    ("gpu", 8, {}, True),
    ("gpu", 1, {}, False),                                  # one GPU: nothing to overlap
    ("cpu", 8, {}, False),
    ("tpu", 8, {}, False),
    ("gpu", 8, {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}, False),   # the user's are kept
    ("gpu", 8, {"XLA_FLAGS": ""}, False),                       # empty: the way to say none
])
def test_flags_only_for_multi_gpu_without_user_flags(platform, devices, env, want):
  d = xla_flags.decide(env, platform=platform, num_devices=devices, layer_bytes=1 << 20)
  assert bool(d.flags) == want
  if want:
    assert d.flags["xla_gpu_enable_latency_hiding_scheduler"] == "true"
    assert d.flags["xla_gpu_all_gather_combine_threshold_bytes"] == str(1 << 20)
    assert set(d.flags) == {name for name, _, _ in xla_flags.FSDP_FLAGS}


def test_apply_reads_the_machine_without_starting_a_backend(monkeypatch):
  """nvidia-smi's GPUs, JAX_PLATFORMS, the process count and the mesh decide; with the
  backend already started (as here) nothing is written, and the line says so."""
  jax.devices()   # started here too when this test runs alone
  assert xla_flags.local_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
  assert xla_flags.local_gpus({}, "0,1,2") == 3   # distributed.local_device_ids
  monkeypatch.setattr(xla_flags, "local_gpus", lambda environ, ids="": 8)
  monkeypatch.setattr(xla_flags, "_cuda_plugin", lambda: True)
  env = {}
  d = xla_flags.apply(mesh(), DIST, 1 << 20, environ=env)
  assert d.flags and not d.applied and "XLA_FLAGS" not in env and "already" in d.line()
  assert not xla_flags.apply(mesh(), DIST, 1, environ={"JAX_PLATFORMS": "cpu"}).flags
  assert not xla_flags.apply(mesh(fsdp=1), DIST, 1, environ={}).flags   # one device
  assert xla_flags.run_devices(mesh(), 8, 2) == 16 and xla_flags.run_devices(
      mesh(fsdp=4), 8, 1) == 4


@pytest.mark.slow
def test_a_fit_check_on_a_gpu_host_sets_no_gpu_flags(monkeypatch, capsys):
  """--accelerator compiles on emulated CPU devices: on a host with 8 GPUs and the CUDA plugin
  the plan adds no XLA_FLAGS (GPU flags would be set for a CPU compile)."""
  monkeypatch.setattr(xla_flags, "local_gpus", lambda environ, ids="": 8)
  monkeypatch.setattr(xla_flags, "_cuda_plugin", lambda: True)
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  jax.devices()   # the backend has started, as in the test process's other plans
  config = tiny_config(steps=4)
  config.mesh.update(data=1, fsdp=2)
  assert xla_flags.apply(spec_lib.check(config).mesh, DIST, 1 << 20, environ={}).flags   # a run
  cli.run(config, "", mode="plan", accelerator="h100")
  assert capsys.readouterr().out.startswith("XLA_FLAGS: none added (cpu")
  assert "XLA_FLAGS" not in os.environ


def test_flags_reach_xla_before_the_backend_starts():
  """In a fresh process: set after `import jax` but before any device use, every flag name
  is one this jaxlib's XLA knows (an unknown name aborts at backend start), and XLA_FLAGS
  set then is read (the CPU device count it also holds takes effect)."""
  flags = " ".join(f"--{k}={v}" for k, v in xla_flags.recommended("gpu", 8, 1 << 20).items())
  code = ("import os, jax\n"
          f"os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3 {flags}'\n"
          "print(jax.device_count())\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], env=env | {"JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "3", out.stderr[-2000:]
