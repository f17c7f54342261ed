"""Launch a tst-jax run (or a grid of them) on GKE with XManager: build the image, one work unit
per grid point, each a JobSet of multi-host TPU or GPU pods.

  python launch/xm_launch.py --config configs/qwen3_moe_10b_a1b.py --platform=gpu --gpu_type=b200 \\
      --num_hosts=8 --workdir gs://my-tst-runs/moe_tst --dry_run \\
      --config.data.mixture='tokens:gs://my-tst-data/tok/fineweb_edu-llama3=0.5,tokens:gs://my-tst-data/tok/dclm-llama3=0.5'
  python launch/xm_launch.py --config configs/llama_600m.py --platform=tpu --tpu_type=v5p-128 \\
      --workdir gs://my-tst-runs/sweep --image us-docker.pkg.dev/my-project/tst/tst-jax-tpu \\
      --grid "tst.ratio=0.1,0.3;tst.bag_size=4,6" --service_account tst-ksa \\
      --config.data.source=tokens:gs://my-tst-data/tok/dclm-llama3

--dry_run prints the job specs as a JSON list (hosts, accelerator per host, image, env, the
command on every host, the restart count, each unit's fit check) and contacts nothing. Either
way each unit is checked first as its run will check itself (launch/jobspec.py's check_unit).
Otherwise XManager (`pip install -e '.[xm]'`) builds launch/Dockerfile.<platform> and pushes
it to --image, records the experiment, and each work unit creates its JobSet
(launch/gke/render.py) through the Kubernetes API of the current kubectl context. The JobSet
restarts its run after a failure, --max_restarts times, each time from the workdir: XManager's
local launcher has no restart policy of its own. Why JobSets and not xm_local's executors:
its Kubernetes executor makes one single-pod Job per xm.Job with `nvidia-tesla-*` node
selectors, no TPU slice selectors and no retry (backoffLimit 0), and its Vertex executor maps
only A100/L4 machine shapes and TPU v2/v3. docs/launch.md has the whole way from zero.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import jobspec  # noqa: E402
from launch.gke import render  # noqa: E402
from tst_jax import errors  # noqa: E402


def parse_args(argv) -> argparse.Namespace:
  parser = jobspec.Parser(prog="python launch/xm_launch.py", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
  jobspec.add_arguments(parser)
  parser.add_argument("--image", default="",
                      help="registry path the built image is pushed to (default: XManager's "
                           "gcr.io/<project>/...)")
  parser.add_argument("--dry_run", action="store_true", help="print the job specs and exit")
  parser.add_argument("--namespace", default="default")
  render.add_jobset_arguments(parser)
  parser.add_argument("--title", default="", help="XManager experiment title")
  args = jobspec.parse_args(parser, argv)
  if not args.workdir:
    if not args.dry_run:
      parser.error("--workdir is required (gs://BUCKET/path)")
    args.workdir = f"gs://your-bucket/tst-jax/{jobspec.run_name(jobspec.config_name(args.config))}"
  return args


def dockerfile(platform: str) -> str:
  return f"launch/Dockerfile.{platform}"


def build_specs(args) -> list[dict]:
  """Every work unit's job spec; pure (the image is a placeholder until XManager builds it)."""
  target = jobspec.target_from_args(args)
  specs = jobspec.job_specs(
      target, config=args.config, workdir=args.workdir,
      image=args.image or f"tst-jax-{target.platform}:latest", overrides=args.overrides,
      grid=args.grid, name=args.name or None, env=args.env, validate=not args.no_validate)
  for spec in specs:
    spec["dockerfile"] = dockerfile(target.platform)
    # XManager's local launcher restarts nothing itself: the JobSet's failure policy does.
    spec["max_restarts"] = args.max_restarts
  return specs


def launch(args, specs: list[dict]):
  """Build and push the image, then one work unit per spec that creates its JobSet."""
  from absl import flags
  from xmanager import xm, xm_local

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()   # xm_local reads its own absl flags; their defaults do
  title = args.title or specs[0]["name"]
  with xm_local.create_experiment(experiment_title=title) as experiment:
    [executable] = experiment.package([xm.Packageable(
        executable_spec=xm.Dockerfile(
            path=jobspec.REPO, dockerfile=os.path.join(jobspec.REPO, specs[0]["dockerfile"])),
        executor_spec=xm_local.Kubernetes.Spec(push_image_tag=args.image or None))])
    for spec in specs:
      manifest = render.jobset(dict(spec, image=executable.image_path),
                               **render.jobset_options(args))
      manifest["metadata"]["labels"]["xmanager/experiment"] = str(experiment.experiment_id)
      experiment.add(_create_jobset, args=dict(manifest=manifest))
    print(f"experiment {experiment.experiment_id}: {len(specs)} JobSet(s) in namespace "
          f"{args.namespace}; watch with: kubectl get jobsets -l "
          f"xmanager/experiment={experiment.experiment_id}", file=sys.stderr)


async def _create_jobset(work_unit, manifest: dict):
  """A work unit's job: create the JobSet (XManager keeps the record, Kubernetes runs it)."""
  from kubernetes import client, config
  try:
    config.load_incluster_config()
  except config.ConfigException:
    config.load_kube_config()
  manifest["metadata"]["labels"]["xmanager/work-unit"] = str(work_unit.work_unit_id)
  group, version = render.JOBSET_API.split("/")
  client.CustomObjectsApi().create_namespaced_custom_object(
      group=group, version=version, namespace=manifest["metadata"]["namespace"],
      plural="jobsets", body=manifest)
  print(f"work unit {work_unit.work_unit_id}: JobSet {manifest['metadata']['name']}",
        file=sys.stderr)


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if not args.dry_run and importlib.util.find_spec("xmanager") is None:
    print("error: python launch/xm_launch.py needs XManager to launch: pip install -e '.[xm]' "
          "(--dry_run prints the job specs without it; python -m launch.gke.render writes "
          "the JobSets for kubectl)", file=sys.stderr)
    return errors.EXIT_STATUS
  show = ((lambda specs: print(json.dumps(specs, indent=1))) if args.dry_run
          else (lambda specs: launch(args, specs)))
  return jobspec.run_main("xm_launch", lambda: build_specs(args), show)


if __name__ == "__main__":
  sys.exit(main())
