"""Launchers: TPU slice arithmetic, XManager dry-run job specs, GKE JobSet manifests (parsed)."""

import argparse
import json
import os
import subprocess
import sys

import pytest
import yaml
from kubernetes import client as k8s

from launch import jobspec, xm_launch
from launch.gke import render
from tests.fixtures.paths import ROOT

MOE = "configs/qwen3_moe_10b_a1b.py"
CONFIG = MOE if os.path.exists(os.path.join(ROOT, MOE)) else "configs/llama_600m.py"
DATA = ["--config.data.source=text:gs://tst-data/dclm/**/*.txt",
        "--config.data.tokenizer=gs://tst-data/llama3/tokenizer.json"]


def _run(*argv) -> str:
  out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def _command(argv: list[str]) -> argparse.Namespace:
  """main.py's command line, parsed: --config, --workdir and the --config.* overrides."""
  assert argv[:2] == ["python", "main.py"], argv
  parser = argparse.ArgumentParser()
  parser.add_argument("--config", required=True)
  parser.add_argument("--workdir", required=True)
  args, rest = parser.parse_known_args(argv[2:])
  assert all(a.startswith("--config.") and "=" in a for a in rest), rest
  args.overrides = dict(a[len("--config."):].split("=", 1) for a in rest)
  return args


def _env(env_list) -> dict:
  return {e["name"]: e.get("value", e.get("valueFrom")) for e in env_list}


def _k8s_model(obj: dict, kind: str):
  """Deserialize into the kubernetes client's model (required fields checked) and back: an
  unknown or misspelt field would be dropped and the round trip would differ."""
  api = k8s.ApiClient()
  try:                                  # kubernetes >= 35: (text, type, content_type)
    model = api.deserialize(json.dumps(obj), kind, "application/json")
  except TypeError:                     # older clients: (response, type)
    model = api.deserialize(argparse.Namespace(data=json.dumps(obj)), kind)
  assert api.sanitize_for_serialization(model) == obj
  return model


@pytest.mark.parametrize("tpu_type, hosts, per_host, topology", [
    ("v5p-8", 1, 4, "2x2x1"),
    ("v5p-32", 4, 4, "2x2x4"),
    ("v5p-128", 16, 4, "4x4x4"),     # 128 TensorCores = 64 chips (2 per chip) = 16 hosts of 4
    ("v5p-256", 32, 4, "4x4x8"),
    ("v4-16", 2, 4, "2x2x2"),
    ("v5litepod-8", 1, 8, "2x4"),    # v5e and v6e count chips
    ("v6e-64", 16, 4, "8x8"),
])
def test_tpu_slices(tpu_type, hosts, per_host, topology):
  target = jobspec.tpu_target(tpu_type)
  assert (target.hosts, target.per_host, target.topology) == (hosts, per_host, topology)
  dims = [int(d) for d in topology.split("x")]
  assert target.devices == hosts * per_host == dims[0] * dims[1] * (dims[2] if len(dims) > 2 else 1)


@pytest.mark.parametrize("bad", ["v5p-6", "v9-8", "v5p", "v5p-96"])
def test_tpu_bad_types(bad):
  with pytest.raises(ValueError):
    jobspec.tpu_target(bad)


def test_xm_dry_run_b200():
  """The issue's command: 8 B200 hosts, 8 GPUs each, main.py with the config, jax.distributed
  env pointing at pod 0."""
  specs = json.loads(_run("launch/xm_launch.py", "--config", CONFIG, "--platform=gpu",
                          "--gpu_type=b200", "--num_hosts=8", "--dry_run"))
  assert len(specs) == 1
  spec = specs[0]
  assert spec["hosts"] == 8 and spec["platform"] == "gpu"
  assert spec["accelerator"]["type"] == "b200"
  assert spec["accelerator"]["gke_accelerator"] == "nvidia-b200"
  assert spec["accelerator"]["count_per_host"] == 8 and spec["accelerator"]["devices"] == 64
  assert spec["image"] and spec["dockerfile"] == "launch/Dockerfile.gpu"
  command = _command(spec["command"])
  assert command.config == CONFIG and command.workdir == spec["container_workdir"]
  env = _env(spec["env"])
  assert env["JAX_NUM_PROCESSES"] == "8" and env["JAX_PLATFORMS"] == "cuda"
  assert env["JAX_COORDINATOR_ADDRESS"] == (
      f"{spec['name']}-{jobspec.REPLICATED_JOB}-0-0.{spec['name']}:{jobspec.COORDINATOR_PORT}")
  assert env["JAX_PROCESS_ID"] == {"fieldRef": {"fieldPath": jobspec.COMPLETION_INDEX}}


def test_xm_grid_work_units():
  """--grid: one work unit per point, each its own workdir, name and overrides, and the
  overrides really set those fields of the config main.py will load."""
  from tst_jax import configlib
  args = xm_launch.parse_args(["--config", "configs/demo.py", "--platform=tpu",
                               "--tpu_type=v5p-128", "--workdir", "gs://tst-runs/sweep",
                               "--grid", "tst.ratio=0.1,0.3;tst.bag_size=4,6",
                               "--config.train.steps=50", "--config.data.batch_size=64",
                               "--dry_run"])
  specs = xm_launch.build_specs(args)
  assert len(specs) == 4
  assert len({s["name"] for s in specs}) == len({s["workdir"] for s in specs}) == 4
  seen = set()
  for spec in specs:
    assert spec["hosts"] == 16 and spec["accelerator"]["topology"] == "4x4x4"
    assert _env(spec["env"]) == {"JAX_PLATFORMS": "tpu"}   # TPU slices are auto-detected
    command = _command(spec["command"])
    assert command.workdir.startswith("/gcs/tst-runs/sweep/")
    config = configlib.apply_overrides(configlib.load_config(command.config),
                                       [f"{k}={v}" for k, v in command.overrides.items()])
    assert config.train.steps == 50 and config.data.batch_size == 64
    seen.add((config.tst.ratio, config.tst.bag_size))
  assert seen == {(0.1, 4), (0.1, 6), (0.3, 4), (0.3, 6)}


def test_bad_override_fails_before_launch():
  args = xm_launch.parse_args(["--config", "configs/demo.py", "--platform=gpu",
                               "--gpu_type=h100", "--config.tst.bag_sise=4", "--dry_run"])
  with pytest.raises(ValueError, match="bag_size"):
    xm_launch.build_specs(args)


def test_batch_must_split_over_devices():
  args = xm_launch.parse_args(["--config", "configs/demo.py", "--platform=tpu",
                               "--tpu_type=v5p-128", "--dry_run"])   # demo: 16 rows, 64 chips
  with pytest.raises(ValueError, match="batch shards"):
    xm_launch.build_specs(args)


def test_paper_config_needs_data_to_launch():
  args = xm_launch.parse_args(["--config", "configs/llama_600m.py", "--platform=gpu",
                               "--gpu_type=h100", "--workdir", "gs://tst-runs/x"])
  with pytest.raises(ValueError, match="data.source"):
    xm_launch.build_specs(args)


def test_gke_v5p_128_manifest():
  """The CLI's YAML for a v5p-128: one Indexed job of 16 pods x 4 chips on the 4x4x4 slice."""
  docs = list(yaml.safe_load_all(_run(
      "-m", "launch.gke.render", "--config", "configs/llama_600m.py", "--platform", "tpu",
      "--tpu_type", "v5p-128", "--workdir", "gs://tst-runs/llama", "--image", "img:1",
      *DATA)))
  assert len(docs) == 1
  manifest = docs[0]
  assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and manifest["kind"] == "JobSet"
  assert manifest["metadata"]["annotations"][
      "alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
  spec = manifest["spec"]
  assert spec["failurePolicy"]["maxRestarts"] >= 1          # restart, resume from the workdir
  [replicated] = spec["replicatedJobs"]
  assert replicated["replicas"] == 1                        # one slice
  job = _k8s_model(replicated["template"], "V1JobTemplateSpec").spec
  assert job.parallelism == job.completions == 16 and job.completion_mode == "Indexed"
  assert job.backoff_limit == 0                             # any failure restarts the set
  pod = job.template.spec
  assert pod.node_selector == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                               "cloud.google.com/gke-tpu-topology": "4x4x4"}
  assert pod.restart_policy == "Never" and pod.termination_grace_period_seconds >= 60
  [container] = pod.containers
  assert container.resources.limits == container.resources.requests == {"google.com/tpu": "4"}
  assert 16 * int(container.resources.limits["google.com/tpu"]) == 64     # chips of v5p-128
  command = _command(container.command)
  assert command.config == "configs/llama_600m.py" and command.workdir == "/gcs/tst-runs/llama"
  assert command.overrides["data.source"] == "text:/gcs/tst-data/dclm/**/*.txt"
  # Both buckets are mounted where the command reads them.
  mounts = {m.mount_path: m.name for m in container.volume_mounts}
  buckets = {v.name: v.csi.volume_attributes["bucketName"] for v in pod.volumes if v.csi}
  assert {p: buckets[n] for p, n in mounts.items()} == {"/gcs/tst-runs": "tst-runs",
                                                         "/gcs/tst-data": "tst-data"}
  assert job.template.metadata.annotations["gke-gcsfuse/volumes"] == "true"


def test_gke_b200_manifest():
  """8 B200 hosts: nvidia.com/gpu 8 per pod, the coordinator is pod 0's DNS name in the
  JobSet's headless service, the process id is the job completion index."""
  args = render.parse_args(["--config", CONFIG, "--platform", "gpu", "--gpu_type", "b200",
                            "--num_hosts", "8", "--workdir", "gs://tst-runs/moe",
                            "--image", "img:1", "--service_account", "tst-ksa", *DATA])
  [manifest] = render.render(args)
  spec = manifest["spec"]
  assert spec["network"]["enableDNSHostnames"] is True
  [replicated] = spec["replicatedJobs"]
  job = _k8s_model(replicated["template"], "V1JobTemplateSpec").spec
  assert job.parallelism == job.completions == 8 and job.completion_mode == "Indexed"
  pod = job.template.spec
  assert pod.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-b200"}
  assert pod.service_account_name == "tst-ksa"
  [container] = pod.containers
  assert container.resources.limits == {"nvidia.com/gpu": "8"}
  assert _command(container.command).config == CONFIG
  env = {e.name: e for e in container.env}
  subdomain = spec["network"].get("subdomain", manifest["metadata"]["name"])
  pod0 = f"{manifest['metadata']['name']}-{replicated['name']}-0-0.{subdomain}"
  assert env["JAX_COORDINATOR_ADDRESS"].value == f"{pod0}:{jobspec.COORDINATOR_PORT}"
  assert int(env["JAX_NUM_PROCESSES"].value) == job.parallelism
  assert env["JAX_PROCESS_ID"].value_from.field_ref.field_path == (
      "metadata.annotations['batch.kubernetes.io/job-completion-index']")
  assert any(v.empty_dir and v.empty_dir.medium == "Memory" for v in pod.volumes)   # /dev/shm


def test_gcs_paths():
  assert jobspec.to_mounted("text:gs://my-data/a/*.txt") == ("text:/gcs/my-data/a/*.txt",
                                                             ["my-data"])
  assert jobspec.container_workdir("gs://tst-runs/a/b/") == ("/gcs/tst-runs/a/b", ["tst-runs"])
  assert jobspec.container_workdir("/mnt/filestore/run") == ("/mnt/filestore/run", [])
  for bad in ("gs://x/run", "runs/relative", "gs://UPPER/run"):
    with pytest.raises(ValueError):
      jobspec.container_workdir(bad)
  assert len(jobspec.run_name("a" * 80, "ratio0.1")) <= 40


def test_xmanager_launch_with_fakes(tmp_path, monkeypatch):
  """The real launch path with XManager's packaging and the Kubernetes API replaced by fakes:
  one JobSet per work unit, with the built image. Skipped unless xmanager is installed."""
  pytest.importorskip("xmanager")
  from unittest import mock
  from xmanager.xm_local import executables

  monkeypatch.setenv("HOME", str(tmp_path))                 # XManager's local database
  created = []

  class FakeApi:
    def create_namespaced_custom_object(self, **kwargs):
      created.append(kwargs)

  def fake_package(self, packageables):
    del self
    assert packageables[0].executable_spec.dockerfile.endswith("launch/Dockerfile.gpu")
    return [executables.GoogleContainerRegistryImage(name="tst", image_path="reg/tst:7")]

  args = xm_launch.parse_args(["--config", "configs/demo.py", "--platform=gpu",
                               "--gpu_type=h100", "--num_hosts=2", "--workdir",
                               "gs://tst-runs/x", "--grid", "tst.ratio=0.1,0.3"])
  with mock.patch("kubernetes.client.CustomObjectsApi", FakeApi), \
       mock.patch("kubernetes.config.load_incluster_config"), \
       mock.patch("xmanager.xm_local.experiment.LocalExperiment.package", fake_package):
    xm_launch.launch(args, xm_launch.build_specs(args))
  assert len(created) == 2 and {c["plural"] for c in created} == {"jobsets"}
  for call in created:
    pod = render.pod_template(call["body"])["spec"]
    assert pod["containers"][0]["image"] == "reg/tst:7"
