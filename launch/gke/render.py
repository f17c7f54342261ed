"""Render a tst-jax run as a GKE JobSet manifest (multi-host TPU slice or GPU nodes).

  python -m launch.gke.render --config configs/llama_600m.py --platform tpu --tpu_type v5p-128 \\
      --workdir gs://my-tst-runs/llama_600m --image us-docker.pkg.dev/my-project/tst/tst-jax-tpu:v1 \\
      --service_account tst-ksa --config.data.source=tokens:gs://my-tst-data/tok/dclm-llama3 \\
    | kubectl apply -f -
  python -m launch.gke.render --config configs/qwen3_moe_10b_a1b.py --platform gpu \\
      --gpu_type b200 --num_hosts 8 --workdir gs://my-tst-runs/moe_tst \\
      --image us-docker.pkg.dev/my-project/tst/tst-jax-gpu:v1 --service_account tst-ksa \\
      --config.data.mixture='tokens:gs://my-tst-data/tok/fineweb_edu-llama3=0.5,tokens:gs://my-tst-data/tok/dclm-llama3=0.5'

One replicated job of `hosts` pods (an Indexed Job: parallelism = completions = hosts), one
process per host. TPU: the slice's node selectors and google.com/tpu chips per host;
jax.distributed finds the slice from the variables GKE injects. GPU: nvidia.com/gpu = 8 and
the coordinator = pod 0 through the JobSet's headless service, process id = the pod's job
completion index. Preemption: SIGTERM makes the trainer finish its step and checkpoint within
the grace period; any failed pod fails the job (backoffLimit 0) and JobSet restarts the whole
set (failurePolicy.maxRestarts), which resumes from the workdir. Each unit is checked first as
its run will check itself, fit check included, which goes to stderr. See docs/launch.md.
"""

from __future__ import annotations

import argparse
import sys

if __package__ in (None, ""):   # run as a file: make `launch` importable
  import os
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch import jobspec  # noqa: E402

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The JobSet controller release these manifests are written and tested for (its CRD's schema:
# tests/testdata/jobset/), installed as docs/launch.md shows.
JOBSET_VERSION = "v0.12.0"
JOBSET_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
                  f"releases/download/{JOBSET_VERSION}/manifests.yaml")
CONTAINER = "tst"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The driver's volume attribute for pods on the host network (TPU slices here): Workload
# Identity gives such a pod no token unless the volume asks for its Kubernetes service
# account's (driver 1.17.2 and later, GKE 1.29 and later; docs/launch.md).
HOST_NETWORK_KSA = "hostNetworkPodKSA"
# The driver's sidecar in each pod, with no CPU, memory or disk limit ("0"), as xpk sets it:
# its defaults throttle a host that reads its training data through the mount.
GCSFUSE_ANNOTATIONS = {"gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0",
                       "gke-gcsfuse/memory-limit": "0",
                       "gke-gcsfuse/ephemeral-storage-limit": "0"}


# Times JobSet recreates every pod of a run after one fails or is preempted, unless
# --max_restarts says otherwise: each restart resumes from the workdir's last checkpoint.
MAX_RESTARTS = 10


def jobset(spec: dict, *, service_account: str = "", max_restarts: int = MAX_RESTARTS,
           grace_period_s: int = 600, spot: bool = False, namespace: str = "") -> dict:
  """The JobSet (a plain dict, ready for yaml/json) of one job spec from `jobspec.job_spec`."""
  accel, hosts, tpu = spec["accelerator"], spec["hosts"], spec["platform"] == "tpu"
  resource = "google.com/tpu" if tpu else "nvidia.com/gpu"
  count = str(accel["count_per_host"])
  if tpu:
    node_selector = {"cloud.google.com/gke-tpu-accelerator": accel["gke_accelerator"],
                     "cloud.google.com/gke-tpu-topology": accel["topology"]}
  else:
    node_selector = {"cloud.google.com/gke-accelerator": accel["gke_accelerator"]}
  tolerations = [dict(key=resource, operator="Exists", effect="NoSchedule")]
  if spot:
    node_selector["cloud.google.com/gke-spot"] = "true"
    tolerations.append(dict(key="cloud.google.com/gke-spot", operator="Equal", value="true",
                            effect="NoSchedule"))

  mounts, volumes, annotations = [], [], {}
  for i, bucket in enumerate(spec["gcs_buckets"]):   # the GKE Cloud Storage FUSE CSI driver
    annotations.update(GCSFUSE_ANNOTATIONS)
    mounts.append(dict(name=f"gcs-{i}", mountPath=f"{jobspec.GCS_MOUNT_ROOT}/{bucket}"))
    attributes = dict(bucketName=bucket, mountOptions="implicit-dirs")
    if tpu:   # host-network pods get the pod's KSA token only when the volume opts in
      attributes[HOST_NETWORK_KSA] = "true"
    volumes.append(dict(name=f"gcs-{i}", csi=dict(driver=GCSFUSE_DRIVER,
                                                  volumeAttributes=attributes)))
  mounts.append(dict(name="local-checkpoints", mountPath=jobspec.LOCAL_CHECKPOINTS))
  volumes.append(dict(name="local-checkpoints", hostPath=dict(
      path=jobspec.LOCAL_CHECKPOINTS_ON_NODE, type="DirectoryOrCreate")))
  if not tpu:              # NCCL needs more shared memory than the container default
    mounts.append(dict(name="dshm", mountPath="/dev/shm"))
    volumes.append(dict(name="dshm", emptyDir=dict(medium="Memory")))

  container = dict(
      name=CONTAINER, image=spec["image"], imagePullPolicy="Always",
      workingDir=spec["working_dir"], command=spec["command"], env=spec["env"],
      resources=dict(requests={resource: count}, limits={resource: count}),
      volumeMounts=mounts)
  if not tpu and hosts > 1:
    container["ports"] = [dict(name="coordinator", containerPort=jobspec.COORDINATOR_PORT)]
  pod_spec = dict(
      restartPolicy="Never",
      # SIGTERM -> the trainer finishes the step and writes a checkpoint before the SIGKILL.
      terminationGracePeriodSeconds=grace_period_s,
      nodeSelector=node_selector, tolerations=tolerations,
      containers=[container], volumes=volumes)
  if service_account:      # a KSA with access to the bucket (Workload Identity)
    pod_spec["serviceAccountName"] = service_account
  if tpu:                  # as in Google's multi-host TPU JobSets: host networking for DCN
    pod_spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")

  labels = {"app.kubernetes.io/name": "tst-jax", "tst-jax/run": spec["name"],
            "tst-jax/work-unit": str(spec["work_unit"])}
  metadata = dict(name=spec["name"], labels=labels)
  if namespace:
    metadata["namespace"] = namespace
  if tpu:                  # one slice = one node pool, not shared with another job
    metadata["annotations"] = {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
  return dict(
      apiVersion=JOBSET_API, kind="JobSet", metadata=metadata,
      spec=dict(
          failurePolicy=dict(maxRestarts=max_restarts),
          network=dict(enableDNSHostnames=True, publishNotReadyAddresses=True),
          replicatedJobs=[dict(
              name=jobspec.REPLICATED_JOB, replicas=1,
              template=dict(spec=dict(
                  parallelism=hosts, completions=hosts, completionMode="Indexed",
                  backoffLimit=0,
                  template=dict(metadata=dict(labels=dict(labels), annotations=annotations),
                                spec=pod_spec))))]))


def pod_template(manifest: dict) -> dict:
  """The pod template of a rendered JobSet."""
  return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def _count(text: str) -> int:
  """A whole number of 0 or more, for argparse."""
  if not text.isdigit():
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
  return int(text)


def add_jobset_arguments(parser: argparse.ArgumentParser):
  """The flags of the JobSet both launchers write: its service account, restart policy,
  grace period and nodes."""
  parser.add_argument("--service_account", default="",
                      help="Kubernetes service account with access to the bucket")
  parser.add_argument("--max_restarts", type=_count, default=MAX_RESTARTS,
                      help="times JobSet recreates every pod after one fails or is preempted, "
                           "each time resuming from the workdir (0: the first failure ends "
                           "the run)")
  parser.add_argument("--grace_period_s", type=int, default=600,
                      help="seconds between SIGTERM and SIGKILL (the final checkpoint)")
  parser.add_argument("--spot", action="store_true", help="schedule on Spot VMs")


def jobset_options(args) -> dict:
  """The keyword arguments of `jobset` that `add_jobset_arguments`' flags set."""
  return dict(service_account=args.service_account, max_restarts=args.max_restarts,
              grace_period_s=args.grace_period_s, spot=args.spot, namespace=args.namespace)


def parse_args(argv):
  parser = jobspec.Parser(prog="python -m launch.gke.render", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
  jobspec.add_arguments(parser)
  parser.add_argument("--image", required=True, help="container image (launch/Dockerfile.*)")
  add_jobset_arguments(parser)
  parser.add_argument("--namespace", default="")
  parser.add_argument("--format", default="yaml", choices=["yaml", "json"])
  args = jobspec.parse_args(parser, argv)
  if not args.workdir:
    parser.error("--workdir is required (gs://BUCKET/path)")
  return args


def specs(args) -> list[dict]:
  """The job spec of each unit, checked as its run will be (jobspec.check_unit)."""
  return jobspec.job_specs(
      jobspec.target_from_args(args), config=args.config, workdir=args.workdir,
      image=args.image, overrides=args.overrides, grid=args.grid, name=args.name or None,
      env=args.env, validate=not args.no_validate)


def manifests(args, job_specs: list[dict]) -> list[dict]:
  """The JobSet of each job spec, with the flags of `args`."""
  return [jobset(s, **jobset_options(args)) for s in job_specs]


def render(args) -> list[dict]:
  """The JobSet of each unit of `args`."""
  return manifests(args, specs(args))


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)

  def show(job_specs: list[dict]):
    docs = manifests(args, job_specs)
    if args.format == "json":
      import json
      print(json.dumps(docs if len(docs) > 1 else docs[0], indent=1))
    else:
      import yaml
      print(yaml.safe_dump_all(docs, sort_keys=False), end="")
  return jobspec.run_main("render", lambda: specs(args), show)


if __name__ == "__main__":
  sys.exit(main())
