"""Launchers: TPU slice arithmetic, the checks a unit passes before it launches (the trainer's,
fit check included), XManager dry-run job specs, GKE JobSet manifests (parsed, and checked
against the pinned JobSet release's schema), the image's build context, and every launcher
command the docs show."""

import argparse
import ast
import fnmatch
import glob
import json
import os
import re
import shlex
import importlib.util
import subprocess
import sys

import pytest
import yaml
from kubernetes import client as k8s

from launch import jobspec, xm_launch
from launch.gke import render
from tests.fixtures.paths import ROOT, TESTDATA
from tst_jax import configlib, fileio
from tst_jax.errors import ConfigError, UserError

MOE = "configs/qwen3_moe_10b_a1b.py"
DATA = ["--config.data.source=text:gs://tst-data/dclm/**/*.txt",
        "--config.data.tokenizer=gs://tst-data/llama3/tokenizer.json"]
MIXTURE = ("--config.data.mixture=tokens:gs://tst-data/tok/fineweb=0.5,"
           "tokens:gs://tst-data/tok/dclm=0.5")
# The launchers' fit check emulates the target's devices before JAX starts: a target of more
# devices than this process has (8, tests/conftest.py) runs as its own process.
ENV = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}


FIND_SPEC = importlib.util.find_spec


def _run(*argv) -> subprocess.CompletedProcess:
  out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


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


def test_xm_dry_run_of_two_b200_hosts_with_a_mixture():
  """2 B200 hosts, 8 GPUs each, main.py with the config and its data.mixture (which the
  trainer accepts without data.source), jax.distributed env pointing at pod 0, and the fit
  check on the 16 GPUs: it fits, and says so on stderr."""
  out = _run("launch/xm_launch.py", "--config", "configs/llama_270m.py", "--platform=gpu",
             "--gpu_type=b200", "--num_hosts=2", "--workdir", "gs://tst-runs/moe", "--dry_run",
             MIXTURE)
  [spec] = json.loads(out.stdout)
  assert spec["hosts"] == 2 and spec["platform"] == "gpu"
  assert spec["accelerator"]["type"] == "b200"
  assert spec["accelerator"]["gke_accelerator"] == "nvidia-b200"
  assert spec["accelerator"]["count_per_host"] == 8 and spec["accelerator"]["devices"] == 16
  assert spec["image"] and spec["dockerfile"] == "launch/Dockerfile.gpu"
  command = _command(spec["command"])
  assert command.config == "configs/llama_270m.py"
  assert command.workdir == spec["container_workdir"]
  assert command.overrides["data.mixture"] == ("tokens:/gcs/tst-data/tok/fineweb=0.5,"
                                               "tokens:/gcs/tst-data/tok/dclm=0.5")
  env = _env(spec["env"])
  assert env["JAX_NUM_PROCESSES"] == "2" and env["JAX_PLATFORMS"] == "cuda"
  assert env["JAX_COORDINATOR_ADDRESS"] == (
      f"{spec['name']}-{jobspec.REPLICATED_JOB}-0-0.{spec['name']}:{jobspec.COORDINATOR_PORT}")
  assert env["JAX_PROCESS_ID"] == {"fieldRef": {"fieldPath": jobspec.COMPLETION_INDEX}}
  fit = spec["fit"]
  assert fit["fits"] and fit["devices"] == 16 and fit["accelerator"] == "b200"
  assert fit["mesh"] == {"data": 1, "fsdp": 16, "tensor": 1, "expert": 1}
  assert out.stderr.strip() == f"xm_launch: {spec['name']}: {jobspec.fit_summary(fit)}"


@pytest.mark.slow
def test_xm_grid_work_units():
  """--grid: one work unit per point, each its own workdir, name and overrides, and the
  overrides really set those fields of the config main.py will load."""
  from tst_jax import configlib
  specs = json.loads(_run(
      "launch/xm_launch.py", "--config", "configs/demo.py", "--platform=tpu",
      "--tpu_type=v5p-128", "--workdir", "gs://tst-runs/sweep", "--grid",
      "tst.ratio=0.1,0.3;tst.bag_size=4,6", "--config.train.steps=50",
      "--config.data.batch_size=64", "--dry_run").stdout)
  assert len(specs) == 4
  assert len({s["name"] for s in specs}) == len({s["workdir"] for s in specs}) == 4
  seen = set()
  for spec in specs:
    assert spec["hosts"] == 16 and spec["accelerator"]["topology"] == "4x4x4"
    assert _env(spec["env"]) == {"JAX_PLATFORMS": "tpu"}   # TPU slices are auto-detected
    assert spec["fit"]["fits"] and spec["fit"]["accelerator"] == "v5p"
    command = _command(spec["command"])
    assert command.workdir.startswith("/gcs/tst-runs/sweep/")
    config = configlib.apply_overrides(configlib.load_config(command.config),
                                       [f"{k}={v}" for k, v in command.overrides.items()])
    assert config.train.steps == 50 and config.data.batch_size == 64
    seen.add((config.tst.ratio, config.tst.bag_size))
  assert seen == {(0.1, 4), (0.1, 6), (0.3, 4), (0.3, 6)}


def _specs(*argv):
  """xm_launch's job specs of `argv`, a dry run on one H100 host: 8 devices, as this process."""
  return xm_launch.build_specs(xm_launch.parse_args(
      ["--platform=gpu", "--gpu_type=h100", "--workdir", "gs://tst-runs/x", "--dry_run",
       *argv]))


def test_a_unit_is_checked_as_its_run_checks_itself():
  """Each is one error before anything launches, naming what main.py's would name."""
  with pytest.raises(ConfigError, match="bag_size"):          # a misspelt field
    _specs("--config", "configs/demo.py", "--config.tst.bag_sise=4")
  with pytest.raises(ConfigError, match="config.data.source: is empty"):
    _specs("--config", "configs/llama_600m.py")
  with pytest.raises(ConfigError, match=r"config.data.source: 'bogus:/x' is not a source"):
    _specs("--config", "configs/demo.py", "--config.data.source=bogus:/x")
  with pytest.raises(ConfigError, match="data.mixture: .*'BUCKET' is not a GCS bucket name"):
    _specs("--config", "configs/demo.py",
           "--config.data.mixture=tokens:gs://BUCKET/a=0.5,tokens:gs://ok-bucket/b=0.5")
  with pytest.raises(fileio.PathError, match="'BUCKET' is not a GCS bucket name"):
    _specs("--config", "configs/demo.py", "--workdir", "gs://BUCKET/moe_tst")
  with pytest.raises(ConfigError, match=r"phase tst's 12 rows .* 8"):   # the batch over 8 GPUs
    _specs("--config", "configs/demo.py", "--config.data.batch_size=12")
  with pytest.raises(ConfigError, match=r"^--config.train.steps: train.steps=30 and the arm "
                     r"'2k' .* both set train.steps"):
    _specs("--config", "configs/demo.py:2k", "--config.train.steps=30")
  with pytest.raises(ConfigError, match=r"^--grid: tst.bag_size=4 and the arm 's8'"):
    _specs("--config", "configs/demo.py:s8", "--grid", "tst.bag_size=4,6")
  [spec] = _specs("--config", "configs/demo.py", MIXTURE)    # a mixture is data: no error
  assert spec["fit"]["fits"] and spec["gcs_buckets"] == ["tst-runs", "tst-data"]


def test_a_unit_that_does_not_fit_is_one_line_with_the_fit_checks_advice(capsys):
  """The 270M recipe on one host of 8 H100s: 128 rows of 2048 per GPU, far past 60 GB."""
  assert xm_launch.main(["--config", "configs/llama_270m.py", "--platform=gpu",
                         "--gpu_type=h100", "--workdir", "gs://tst-runs/x", "--dry_run",
                         *DATA]) == 2
  out, err = capsys.readouterr()
  assert not out and err.splitlines() == [err.strip()], err
  assert err.startswith("error: configs/llama_270m.py --config.data.source=") and (
      "fit on 8 x h100, 60.0 GB per device" in err and "does NOT fit" in err), err
  assert "model.remat=full" in err and "optimizer.grad_accum=" in err, err


def test_gke_v5p_128_manifest():
  """The CLI's YAML for a v5p-128: one Indexed job of 16 pods x 4 chips on the 4x4x4 slice."""
  docs = list(yaml.safe_load_all(_run(
      "-m", "launch.gke.render", "--config", "configs/llama_600m.py", "--platform", "tpu",
      "--tpu_type", "v5p-128", "--workdir", "gs://tst-runs/llama", "--image", "img:1",
      *DATA).stdout))
  assert len(docs) == 1
  manifest = docs[0]
  _check_jobset(manifest)
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
  assert {p: buckets[n] for p, n in mounts.items() if n in buckets} == {
      "/gcs/tst-runs": "tst-runs", "/gcs/tst-data": "tst-data"}
  # Emergency checkpoints go to the node's disk, which a restarted pod on that node finds.
  [node] = [v for v in pod.volumes if v.host_path]
  assert mounts["/tst-jax-local"] == node.name and node.host_path.type == "DirectoryOrCreate"
  assert command.overrides["train.local_checkpoint_dir"] == "/tst-jax-local"
  assert job.template.metadata.annotations == {        # the sidecar unthrottled, as xpk's
      "gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0",
      "gke-gcsfuse/memory-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0"}
  # The slice's pods are on the host network, where Workload Identity gives a pod no token
  # unless each bucket's volume opts in to the pod's service account.
  assert pod.host_network is True
  assert {v.csi.volume_attributes.get("hostNetworkPodKSA") for v in pod.volumes if v.csi} == {
      "true"}


@pytest.mark.slow
def test_gke_b200_manifest_of_the_moe_recipe_as_its_docstring_writes_it():
  """The render command of configs/qwen3_moe_10b_a1b.py's docstring, its mixture included:
  8 B200 hosts, nvidia.com/gpu 8 per pod, the coordinator is pod 0's DNS name in the JobSet's
  headless service, the process id is the job completion index; its fit check on stderr."""
  [argv] = [a for w, a in documented_launch_commands() if w == MOE]
  out = _run("-m", *argv, "--format", "json")
  manifest = json.loads(out.stdout)
  _check_jobset(manifest)
  assert re.fullmatch(r"render: qwen3-moe-10b-a1b: fit on 64 x b200, 135.0 GB per device: "
                      r"tst \d+\.\d, ntp \d+\.\d GB \(fits, .*\)\n", out.stderr), out.stderr
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
  assert _command(container.command).config == MOE
  env = {e.name: e for e in container.env}
  subdomain = spec["network"].get("subdomain", manifest["metadata"]["name"])
  pod0 = f"{manifest['metadata']['name']}-{replicated['name']}-0-0.{subdomain}"
  assert env["JAX_COORDINATOR_ADDRESS"].value == f"{pod0}:{jobspec.COORDINATOR_PORT}"
  assert int(env["JAX_NUM_PROCESSES"].value) == job.parallelism
  assert env["JAX_PROCESS_ID"].value_from.field_ref.field_path == (
      "metadata.annotations['batch.kubernetes.io/job-completion-index']")
  assert any(v.empty_dir and v.empty_dir.medium == "Memory" for v in pod.volumes)   # /dev/shm


@pytest.mark.parametrize("flags, count", [([], render.MAX_RESTARTS), (["--max_restarts", "3"], 3),
                                          (["--max_restarts=0"], 0)])
def test_the_restart_count_is_the_jobsets_and_xmanager_launches_with_it(flags, count):
  """--max_restarts sets the rendered JobSet's failurePolicy.maxRestarts, a field of the
  JobSet CRD's schema, and XManager's dry-run spec of each unit; 0 is a run that never
  restarts. tests/behaviour/test_restart_loop.py runs the loop it starts."""
  base = ["--config", "configs/demo.py", "--platform=gpu", "--gpu_type=h100", "--num_hosts=2",
          "--workdir", "gs://tst-runs/x", "--no_validate", *flags]
  [manifest] = render.render(render.parse_args([*base, "--image", "img:1"]))
  _check_jobset(manifest)
  assert manifest["spec"]["failurePolicy"] == {"maxRestarts": count}
  specs = xm_launch.build_specs(xm_launch.parse_args([*base, "--dry_run", "--grid",
                                                      "tst.ratio=0.1,0.3"]))
  assert [s["max_restarts"] for s in specs] == [count, count]


def test_gcs_paths():
  assert jobspec.to_mounted("text:gs://my-data/a/*.txt") == ("text:/gcs/my-data/a/*.txt",
                                                             ["my-data"])
  assert jobspec.container_workdir("gs://tst-runs/a/b/") == ("/gcs/tst-runs/a/b", ["tst-runs"])
  with pytest.raises(ValueError, match="not a gs:// bucket, and the launchers mount Cloud"):
    jobspec.container_workdir("/mnt/filestore/run")   # each pod would write into its container
  for bad in ("gs://x/run", "runs/relative", "gs://UPPER/run", "s3://b/run"):
    with pytest.raises((ValueError, UserError)):
      jobspec.container_workdir(bad)
  with pytest.raises(UserError, match="'Data' is not a GCS bucket name"):
    jobspec.to_mounted("text:gs://Data/a/*.txt")
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
                               "--gpu_type=h100", "--num_hosts=1", "--workdir",
                               "gs://tst-runs/x", "--grid", "tst.ratio=0.1,0.3",
                               "--max_restarts=4"])
  with mock.patch("kubernetes.client.CustomObjectsApi", FakeApi), \
       mock.patch("kubernetes.config.load_incluster_config"), \
       mock.patch("xmanager.xm_local.experiment.LocalExperiment.package", fake_package):
    xm_launch.launch(args, xm_launch.build_specs(args))
  assert len(created) == 2 and {c["plural"] for c in created} == {"jobsets"}
  for call in created:
    pod = render.pod_template(call["body"])["spec"]
    assert pod["containers"][0]["image"] == "reg/tst:7"
    assert call["body"]["spec"]["failurePolicy"] == {"maxRestarts": 4}   # its restart policy


def _check_against_schema(value, schema: dict, where: str) -> list[str]:
  """Lists where `value` breaks an OpenAPI v3 schema as a CRD's structural schema reads it:
  a field it does not declare (the API server would drop it), a wrong type, a value outside
  an enum, a required field missing."""
  if schema.get("x-kubernetes-preserve-unknown-fields"):
    return []
  kind = schema.get("type")
  types = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
  if kind in types and (not isinstance(value, types[kind]) or
                        kind == "integer" and isinstance(value, bool)):
    return [f"{where}: {value!r} is not a {kind}"]
  if "enum" in schema and value not in schema["enum"]:
    return [f"{where}: {value!r} is not one of {schema['enum']}"]
  problems = []
  if kind == "object" and "properties" in schema:
    problems += [f"{where}.{k}: not a field" for k in value if k not in schema["properties"]]
    problems += [f"{where}.{k}: required" for k in schema.get("required", []) if k not in value]
    for k, v in value.items():
      if k in schema["properties"]:
        problems += _check_against_schema(v, schema["properties"][k], f"{where}.{k}")
  elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
    for k, v in value.items():
      problems += _check_against_schema(v, schema["additionalProperties"], f"{where}.{k}")
  elif kind == "array":
    for i, v in enumerate(value):
      problems += _check_against_schema(v, schema["items"], f"{where}[{i}]")
  return problems


def _check_jobset(manifest: dict):
  """The JobSet as the pinned release's CRD reads it, its Job template as Kubernetes does."""
  path = os.path.join(TESTDATA, "jobset", f"{render.JOBSET_VERSION}_spec_schema.yaml")
  with open(path) as f:
    schema = yaml.safe_load(f)
  assert manifest["apiVersion"] == schema["apiVersion"] == render.JOBSET_API
  assert _check_against_schema(manifest["spec"], schema["spec"], "spec") == []
  for replicated in manifest["spec"]["replicatedJobs"]:
    _k8s_model(replicated["template"], "V1JobTemplateSpec")
  _k8s_model(manifest["metadata"], "V1ObjectMeta")


def test_the_schema_check_refuses_what_the_jobset_crd_would_drop():
  """The check above can fail: a misspelt field, a wrong type and a bad enum are caught."""
  with open(os.path.join(TESTDATA, "jobset", f"{render.JOBSET_VERSION}_spec_schema.yaml")) as f:
    schema = yaml.safe_load(f)["spec"]
  good = dict(failurePolicy=dict(maxRestarts=3), network=dict(enableDNSHostnames=True),
              replicatedJobs=[dict(name="w", replicas=1, template=dict(spec={}))])
  assert _check_against_schema(good, schema, "spec") == []
  bad = dict(failurePolicy=dict(maxRestart=3, restartStrategy="Sometimes"),
             network=dict(enableDNSHostnames="yes"), replicatedJobs=[dict(replicas=1)])
  assert sorted(_check_against_schema(bad, schema, "spec")) == [
      "spec.failurePolicy.maxRestart: not a field",
      "spec.failurePolicy.restartStrategy: 'Sometimes' is not one of "
      "['Recreate', 'BlockingRecreate', 'InPlaceRestart']",
      "spec.network.enableDNSHostnames: 'yes' is not a boolean",
      "spec.replicatedJobs[0].name: required", "spec.replicatedJobs[0].template: required"]


def _docker_context(dockerignore: str) -> set[str]:
  """The files of the repository (git's, tracked and untracked but not ignored) that a build
  from its root sends to Docker, by `dockerignore`'s patterns: Docker's rules for the forms
  the file uses (a path or glob from the root, '**/' for any depth, '!' to keep)."""
  files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  with open(dockerignore) as f:
    patterns = [p.strip() for p in f if p.strip() and not p.startswith("#")]

  def ignored(path: str) -> bool:
    out = False
    for pattern in patterns:
      keep, pattern = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
      parts = path.split("/")
      prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
      if pattern.startswith("**/"):
        hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
      else:
        hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
      if hit:
        out = not keep
    return out
  return {f for f in files if os.path.exists(os.path.join(ROOT, f)) and not ignored(f)}


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_the_image_build_context_holds_what_the_dockerfile_copies(platform):
  """Each COPY source is in the context, the package and configs are, and nothing of a run,
  a virtual environment or git is: the image is the code at /app."""
  dockerfile = os.path.join(ROOT, "launch", f"Dockerfile.{platform}")
  context = _docker_context(dockerfile + ".dockerignore")
  with open(dockerfile) as f:
    copies = [line.split()[1:-1] for line in f if line.startswith("COPY ")]
  for sources in copies:
    for source in sources:
      assert source == "." or source in context, f"COPY {source}: not in the build context"
  for needed in ("main.py", "pyproject.toml", "README.md", "tst_jax/__init__.py",
                 "configs/qwen3_moe_10b_a1b.py", "tst_jax/config/speedup_trends.json"):
    assert needed in context, needed
  assert not [f for f in context if f.startswith((".git/", ".venv/", "runs/"))
              or "__pycache__" in f or f.endswith(".pyc")]
  assert sum(os.path.getsize(os.path.join(ROOT, f)) for f in context) < 100e6


@pytest.mark.parametrize("cuda", ["cuda12", "cuda13"])
def test_the_gpu_image_installs_the_gpu_extras_kernels_with_the_jax_of_its_cuda(cuda):
  """launch/Dockerfile.gpu installs pyproject's gpu-kernels (tokamax, jax-triton, qwix: what
  [gpu] adds to CUDA 12's JAX) under constraints-gpu.txt, with jax[JAX_CUDA], cuda12 by
  default, and its build fails unless tokamax imports: the image runs expert_impl=gmm on
  tokamax, as a plan for a GPU resolves it (tests/test_platform.py)."""
  with open(os.path.join(ROOT, "launch", "Dockerfile.gpu")) as f:
    text = f.read().replace("\\\n", " ")
  assert re.search(r"^ARG JAX_CUDA=cuda12$", text, re.M)
  runs = [line.replace("${JAX_CUDA}", cuda) for line in text.splitlines()
          if line.startswith("RUN ")]
  installs = [shlex.split(r)[1:] for r in runs if " pip install " in f" {r} " and "-e" in r]
  assert installs[0] == ["pip", "install", f"jax[{cuda}]", "-e", ".[gpu-kernels]", "-c",
                         "constraints-gpu.txt"], installs
  imported = re.search(r"python -c \"import ([\w, ]+);", runs[-1])
  assert imported and "tokamax" in imported.group(1).split(", ") and "'jax-triton'" in runs[-1]


def documented_launch_commands() -> list[tuple[str, list[str]]]:
  """Every launcher command the docs show, as (where, argv): the code blocks of README.md and
  docs/, and the docstrings of launch/ and the config files; continuation lines joined, a
  pipe into kubectl cut off."""
  texts = {}
  for path in [os.path.join(ROOT, "README.md"),
               *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]:
    with open(path) as f:
      texts[os.path.relpath(path, ROOT)] = "\n".join(re.findall(r"```[^\n]*\n(.*?)```",
                                                                f.read(), re.S))
  for path in [*glob.glob(os.path.join(ROOT, "launch", "**", "*.py"), recursive=True),
               *glob.glob(os.path.join(ROOT, "configs", "*.py"))]:
    with open(path) as f:
      texts[os.path.relpath(path, ROOT)] = ast.get_docstring(ast.parse(f.read())) or ""
  found = []
  for where, text in texts.items():
    text = re.sub(r"\\\\?\n", " ", text)   # shell continuations, written with one or two backslashes
    for match in re.finditer(r"^\s*python (launch/xm_launch\.py|-m launch\.gke\.render) "
                             r"[^\n|]*", text, re.M):
      argv = shlex.split(match.group(0), comments=True)[1:]
      found.append((where, argv[1:] if argv[0] == "-m" else argv))
  return found


@pytest.mark.slow
def test_every_documented_launch_command_passes_its_checks():
  """Each command as the docs write it, the real launches as dry runs (the same checks), in
  one process of the largest target's devices: it renders, or prints its specs, and its
  units fit."""
  commands = documented_launch_commands()
  where = {w for w, _ in commands}
  commands = list({json.dumps(argv): (w, argv) for w, argv in commands}.values())   # once each
  assert {"docs/launch.md", "launch/xm_launch.py", "launch/gke/render.py",
          "configs/qwen3_moe_10b_a1b.py"} <= where, where
  assert len(commands) >= 4
  script = """
import contextlib, io, json, sys
from launch import jobspec, xm_launch
from launch.gke import render
from tst_jax.train import fit
results, commands = [], json.loads(sys.argv[1])
targets = [jobspec.target_from_args((xm_launch if a[0].endswith('.py') else render)
                                    .parse_args(a[1:])) for a in commands]
fit.emulate_devices(max(t.devices for t in targets))
for argv in commands:
  tool = xm_launch if argv[0].endswith('.py') else render
  args = argv[1:] + (['--dry_run'] if tool is xm_launch and '--dry_run' not in argv else [])
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = tool.main(args)
  results.append(dict(rc=rc, out=out.getvalue(), err=err.getvalue()))
print(json.dumps(results))
"""
  out = _run("-c", script, json.dumps([argv for _, argv in commands]))
  failures = []
  for (where, argv), result in zip(commands, json.loads(out.stdout.splitlines()[-1])):
    line = f"{where}: {shlex.join(argv)}"
    if result["rc"] != 0:
      failures.append(f"{line}\n  {result['err'].strip()}")
      continue
    docs = (json.loads(result["out"]) if "xm_launch" in argv[0] else
            list(yaml.safe_load_all(result["out"])))
    assert docs and "does NOT fit" not in result["err"] and "fit on " in result["err"], line
  assert not failures, "\n".join(failures)


def test_a_run_and_its_baseline_get_jobsets_of_their_own_names():
  assert jobspec.config_name("configs/llama_3b.py") == "llama_3b"
  assert jobspec.run_name(jobspec.config_name("configs/llama_3b.py:20k,baseline")) == \
      "llama-3b-20k-baseline"
  assert jobspec.run_name(jobspec.config_name("configs/llama_3b.py:20k")) == "llama-3b-20k"


def test_a_topology_hint_is_a_shape_of_the_slices_chips():
  with pytest.raises(ValueError, match=r"48 chips is not a power of two: .* \(e\.g\. 3x4x4\)"):
    jobspec.tpu_target("v5p-96")
  assert jobspec.tpu_target("v5p-96", "2x4x6").topology == "2x4x6"
  assert jobspec._shape_of(6, 3) == "2x3x1"   # pylint: disable=protected-access


@pytest.mark.parametrize("argv, message", [
    (["--env", "NCCL_DEBUG"], "error: python -m launch.gke.render: --env takes KEY=VALUE"),
    (["--tpu_type", "v5p-128", "--platform", "cpu"], "error: python -m launch.gke.render: "
     "argument --platform: invalid choice: 'cpu'"),
    (["--max_restarts", "-1"], "error: python -m launch.gke.render: argument --max_restarts: "
     "'-1' is not a whole number of 0 or more"),
])
def test_a_launchers_own_flag_error_is_one_line(argv, message, capsys):
  base = ["--config", "configs/llama_600m.py", "--platform", "tpu", "--tpu_type", "v5p-128",
          "--workdir", "gs://tst-runs/x", "--image", "img:1"]
  with pytest.raises(SystemExit) as stop:
    render.parse_args(base + argv)
  err = capsys.readouterr().err
  assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith(message), err


def test_xm_launch_without_xmanager_is_one_line_naming_the_extra(monkeypatch, capsys):
  monkeypatch.setattr(xm_launch.importlib.util, "find_spec",
                      lambda name, *a: None if name == "xmanager" else FIND_SPEC(name, *a))
  code = xm_launch.main(["--config", "configs/llama_600m.py", "--platform", "tpu",
                         "--tpu_type", "v5p-128", "--workdir", "gs://tst-runs/x"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1 and "pip install -e '.[xm]'" in err, err


def test_an_override_of_a_field_the_config_file_sets_for_its_arm_is_refused():
  """configs/qwen3_moe_10b_a1b.py's baseline is the paper's 125,000 steps, set in its own
  get_config, not by the arm registry: --config.train.steps beside it is refused as beside a
  '<N>k' arm; a field the arm leaves alone is not."""
  path_arg = os.path.join(ROOT, "configs", "qwen3_moe_10b_a1b.py") + ":baseline"
  with pytest.raises(ConfigError, match="train.steps=30 and the arm 'baseline'"):
    configlib.refuse_arm_overrides(path_arg, ["train.steps=30"], "--config.")
  configlib.refuse_arm_overrides(path_arg, ["optimizer.lr=1e-4"], "--config.")
  # configs/demo.py sets what its final block prints per arm: not a field the arm trains with
  configlib.refuse_arm_overrides(os.path.join(ROOT, "configs", "demo.py") + ":s8",
                                 ["reference.name=mine"], "--config.")


def test_no_validate_skips_the_config_and_nothing_else():
  """--no_validate renders a field the config does not have (the config is not loaded), and
  still refuses a bucket name GCS would refuse and a target that is no slice."""
  base = ["--config", "configs/llama_600m.py", "--platform", "tpu", "--image", "img:1",
          "--no_validate"]
  [spec] = render.specs(render.parse_args(base + ["--tpu_type", "v5p-128", "--workdir",
                                                  "gs://tst-runs/x", "--config.model.bogus=1"]))
  assert "--config.model.bogus=1" in spec["command"]
  with pytest.raises(UserError, match="'UPPER' is not a GCS bucket name"):
    render.specs(render.parse_args(base + ["--tpu_type", "v5p-128", "--workdir",
                                           "gs://UPPER/x"]))
  with pytest.raises(ValueError, match="--tpu_type 'v5p-7'"):
    render.specs(render.parse_args(base + ["--tpu_type", "v5p-7", "--workdir",
                                           "gs://tst-runs/x"]))
