"""Accelerator targets, the platform-neutral job spec of a run (hosts, chips, env, command),
and the checks a unit passes before it launches.

Shared by `launch/xm_launch.py` (which prints these specs with --dry_run) and
`launch/gke/render.py` (which turns one into a JobSet manifest). A unit is checked by the
trainer's own checks (`check_unit`), the fit check included. Nothing here contacts a service.

TPU slice sizes (https://cloud.google.com/tpu/docs/v5p, "Configurations"): v4 and v5p names
count TensorCores, 2 per chip, 4 chips per VM host, so v5p-128 = 64 chips = 16 hosts,
topology 4x4x4 (the table: 4x4x4 | 128 cores | 64 chips | 16 hosts). v5e (v5litepod-N) and
v6e names count chips, 4 per host in multi-host slices, 2D topologies. JAX sees one device
per chip (megacore), so a v5p-128 run has 64 devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import sys

from tst_jax import configlib, errors, fileio
from tst_jax.config import spec as spec_lib
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.train import fit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTAINER_REPO = "/app"          # where the Dockerfiles put the checkout (WORKDIR)
GCS_MOUNT_ROOT = "/gcs"          # gs://BUCKET/path is mounted at /gcs/BUCKET/path (gcsfuse)
# Emergency checkpoints (train.local_checkpoint_every) go to a folder of the node, which
# outlives the pods that JobSet deletes and recreates on a restart.
LOCAL_CHECKPOINTS = "/tst-jax-local"                             # in the container
LOCAL_CHECKPOINTS_ON_NODE = "/mnt/stateful_partition/tst-jax-local"   # a GKE node's disk
COORDINATOR_PORT = 1234          # jax.distributed coordinator on process 0
REPLICATED_JOB = "workers"       # the JobSet's one replicated job: one pod per host
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclasses.dataclass(frozen=True)
class _TpuFamily:
  gke_accelerator: str           # node label cloud.google.com/gke-tpu-accelerator
  cores_per_chip: int            # what the number in the type name counts, per chip
  dims: int                      # 3D torus (v4, v5p) or 2D (v5e, v6e)
  single_host_chips: int         # slices up to this many chips are one host
  chip: str                      # the chip's name in the fit check (train/fit.py's HBM_GB)


# type prefix -> family. The number after the dash is TensorCores for v4/v5p, chips otherwise.
TPU_FAMILIES = {
    "v4": _TpuFamily("tpu-v4-podslice", 2, 3, 4, "v4"),
    "v5p": _TpuFamily("tpu-v5p-slice", 2, 3, 4, "v5p"),
    "v5litepod": _TpuFamily("tpu-v5-lite-podslice", 1, 2, 8, "v5e"),
    "v6e": _TpuFamily("tpu-v6e-slice", 1, 2, 8, "v6e"),
}
TPU_CHIPS_PER_HOST = 4           # multi-host slices: 4 chips per VM

# --gpu_type -> (GKE node label cloud.google.com/gke-accelerator, GCE machine type, the GPU's
# name in the fit check), 8 GPUs each.
GPU_TYPES = {
    "h100": ("nvidia-h100-80gb", "a3-highgpu-8g", "h100"),
    "h100-mega": ("nvidia-h100-mega-80gb", "a3-megagpu-8g", "h100"),
    "h200": ("nvidia-h200-141gb", "a3-ultragpu-8g", "h200"),
    "b200": ("nvidia-b200", "a4-highgpu-8g", "b200"),
}
GPUS_PER_HOST = 8


@dataclasses.dataclass(frozen=True)
class Target:
  """Where a run goes: `hosts` pods, each with `per_host` accelerators of one kind."""
  platform: str                  # tpu | gpu
  accelerator: str               # v5p-128 | b200 | ...
  hosts: int
  per_host: int                  # chips (TPU) or GPUs per host
  gke_accelerator: str           # node-selector value
  chip: str                      # the accelerator's name in the fit check: h100, v5e, ...
  topology: str = ""             # TPU slice topology, e.g. 4x4x4
  machine_type: str = ""         # GPU VM type, e.g. a4-highgpu-8g

  @property
  def devices(self) -> int:
    """JAX devices of the whole run (one per chip or GPU)."""
    return self.hosts * self.per_host

  def to_json(self) -> dict:
    out = dict(type=self.accelerator, gke_accelerator=self.gke_accelerator,
               count_per_host=self.per_host, devices=self.devices)
    if self.topology:
      out["topology"] = self.topology
    if self.machine_type:
      out["machine_type"] = self.machine_type
    return out


def tpu_target(tpu_type: str, topology: str = "") -> Target:
  """'v5p-128' -> 16 hosts x 4 chips, topology 4x4x4 (see the module docstring)."""
  prefix, _, count = tpu_type.partition("-")
  if prefix not in TPU_FAMILIES or not count.isdigit() or int(count) < 1:
    raise ValueError(f"--tpu_type {tpu_type!r}: expected <family>-<N> with family one of "
                     f"{sorted(TPU_FAMILIES)}, e.g. v5p-128")
  family = TPU_FAMILIES[prefix]
  if int(count) % family.cores_per_chip:
    raise ValueError(f"--tpu_type {tpu_type!r}: {prefix} counts TensorCores, "
                     f"{family.cores_per_chip} per chip; N must be a multiple of that")
  chips = int(count) // family.cores_per_chip
  if chips <= family.single_host_chips:
    hosts, per_host = 1, chips
  elif chips % TPU_CHIPS_PER_HOST:
    raise ValueError(f"--tpu_type {tpu_type!r}: {chips} chips do not fill "
                     f"{TPU_CHIPS_PER_HOST}-chip hosts")
  else:
    hosts, per_host = chips // TPU_CHIPS_PER_HOST, TPU_CHIPS_PER_HOST
  topology = topology or _topology(chips, family.dims)
  shape = [int(d) for d in topology.split("x")]
  if len(shape) != family.dims or _product(shape) != chips:
    raise ValueError(f"topology {topology!r} is not a {family.dims}D shape of {chips} chips")
  return Target("tpu", tpu_type, hosts, per_host, family.gke_accelerator, family.chip,
                topology=topology)


def _topology(chips: int, dims: int) -> str:
  """The most cubic shape of a power-of-two chip count, written as Google does (ascending,
  1s last): 4 -> 2x2x1, 32 -> 2x4x4, 64 -> 4x4x4 (3D); 8 -> 2x4 (2D). Other counts need
  --tpu_topology."""
  if chips & (chips - 1):
    raise ValueError(f"{chips} chips is not a power of two: pass --tpu_topology, your slice's "
                     f"shape of {chips} chips (e.g. {_shape_of(chips, dims)})")
  shape = [1] * dims
  while _product(shape) < chips:
    shape[shape.index(min(shape))] *= 2
  return "x".join(map(str, sorted(shape, key=lambda d: (d == 1, d))))


def _shape_of(chips: int, dims: int) -> str:
  """The most cubic `dims`-dimensional shape of `chips` chips, ascending, 1s last:
  48, 3 -> 3x4x4; 6, 3 -> 2x3x1."""
  def shapes(n, k):
    if k == 1:
      yield (n,)
      return
    for d in range(1, n + 1):
      if n % d == 0:
        yield from ((d, *rest) for rest in shapes(n // d, k - 1) if rest[0] >= d)
  best = min(shapes(chips, dims), key=lambda shape: shape[-1] - shape[0])
  return "x".join(map(str, sorted(best, key=lambda d: (d == 1, d))))   # as _topology writes it


def _product(xs) -> int:
  out = 1
  for x in xs:
    out *= x
  return out


def gpu_target(gpu_type: str, num_hosts: int) -> Target:
  if gpu_type not in GPU_TYPES:
    raise ValueError(f"--gpu_type {gpu_type!r}: expected one of {sorted(GPU_TYPES)}")
  if num_hosts < 1:
    raise ValueError(f"--num_hosts must be >= 1, got {num_hosts}")
  label, machine, chip = GPU_TYPES[gpu_type]
  return Target("gpu", gpu_type, num_hosts, GPUS_PER_HOST, label, chip, machine_type=machine)


def make_target(platform: str, *, tpu_type: str = "", tpu_topology: str = "",
                gpu_type: str = "", num_hosts: int = 1) -> Target:
  if platform == "tpu":
    if not tpu_type:
      raise ValueError("--platform=tpu needs --tpu_type (e.g. v5p-128)")
    return tpu_target(tpu_type, tpu_topology)
  if platform == "gpu":
    if not gpu_type:
      raise ValueError("--platform=gpu needs --gpu_type (e.g. b200)")
    return gpu_target(gpu_type, num_hosts)
  raise ValueError(f"--platform must be tpu or gpu, got {platform!r}")


# -- runs ------------------------------------------------------------------------------------
def container_config(spec: str) -> str:
  """'configs/x.py[:arg]' (relative to the repo or the cwd, or absolute) -> the same file
  relative to the repo root, which the image holds at CONTAINER_REPO."""
  path, sep, arg = spec.partition(":")
  candidates = [path] if os.path.isabs(path) else [os.path.join(os.getcwd(), path),
                                                    os.path.join(REPO, path)]
  found = next((os.path.abspath(p) for p in candidates if os.path.isfile(p)), None)
  if found is None:
    raise FileNotFoundError(f"config file {path!r} does not exist")
  rel = os.path.relpath(found, REPO)
  if rel.startswith(".."):
    raise ValueError(f"config {found} is outside the repository {REPO}: the image only "
                     "holds the checkout, so put the config under configs/")
  return rel + sep + arg


_GS_URL = re.compile(r"gs://([^/\s'\",;=]+)")   # a bucket of a gs:// URL in a value


def to_mounted(value: str) -> tuple[str, list[str]]:
  """Every gs://BUCKET in `value` -> /gcs/BUCKET, and the buckets to mount: the trainer reads
  and writes with plain file I/O, so buckets are mounted with the GKE gcsfuse driver. A bucket
  GCS would refuse the name of is an error here, by the rule the trainer checks it with."""
  buckets = _GS_URL.findall(value)
  for bucket in buckets:
    fileio.check_bucket_name(f"gs://{bucket}", value)
  return _GS_URL.sub(lambda m: f"{GCS_MOUNT_ROOT}/{m.group(1)}", value), buckets


def container_workdir(workdir: str) -> tuple[str, list[str]]:
  """(the workdir the trainer sees, the buckets to mount): gs://B/run -> /gcs/B/run."""
  fileio.check_store(workdir, "--workdir", "a run's workdir", fileio.RUN_STORES)
  path, buckets = to_mounted(workdir.rstrip("/"))
  if not buckets:         # nothing else is mounted: each pod would write into its container
    raise ValueError(f"--workdir {workdir!r}: not a gs:// bucket, and the launchers mount "
                     "Cloud Storage buckets only, so every pod would write into its own "
                     "container: use gs://BUCKET/path")
  return path, buckets


def main_command(config: str, workdir: str, overrides) -> list[str]:
  """The container's command: main.py with the config and the '--config.a.b=v' overrides."""
  return ["python", "main.py", "--config", config, "--workdir", workdir,
          *(f"--config.{o}" for o in overrides)]


def config_name(config: str) -> str:
  """'configs/llama_600m.py' -> 'llama_600m'; with arms, they follow:
  'configs/llama_3b.py:20k,baseline' -> 'llama_3b-20k-baseline', so a run and its baseline
  get JobSets of their own."""
  path, _, arg = config.partition(":")
  arms = [part.strip() for part in arg.split(",") if part.strip()]
  return "-".join([os.path.splitext(os.path.basename(path))[0], *arms])


def run_name(base: str, suffix: str = "", max_len: int = 40) -> str:
  """A DNS-1035 label for the JobSet (and its pods and headless service): pod hostnames
  '<name>-workers-<i>-<j>' must stay within 63 characters."""
  name = re.sub(r"[^a-z0-9]+", "-", f"{base}-{suffix}".lower()).strip("-")
  if len(name) > max_len:
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    name = name[:max_len - 7].rstrip("-") + "-" + digest
  if not name or not name[0].isalpha():
    name = "tst-" + name
  return name[:max_len].rstrip("-")


def unit_suffix(overrides) -> str:
  """'tst.ratio=0.1', 'tst.bag_size=4' -> 'ratio0.1_bag_size4' (as tst_jax.tools.sweep names points)."""
  return "_".join(f"{k.split('.')[-1]}{v}" for k, _, v in (o.partition("=") for o in overrides))


def env_for(target: Target, name: str, extra: dict | None = None) -> list[dict]:
  """Kubernetes-style env: the platform, and on multi-host GPU what jax.distributed needs
  (TPU slices are auto-detected from the variables GKE injects)."""
  env = [dict(name="JAX_PLATFORMS", value="tpu" if target.platform == "tpu" else "cuda")]
  if target.platform == "gpu" and target.hosts > 1:
    # Process 0 is pod 0 of job 0; JobSet names it <name>-<job>-0-0 in the subdomain <name>.
    env += [dict(name="JAX_COORDINATOR_ADDRESS",
                 value=f"{name}-{REPLICATED_JOB}-0-0.{name}:{COORDINATOR_PORT}"),
            dict(name="JAX_NUM_PROCESSES", value=str(target.hosts)),
            dict(name="JAX_PROCESS_ID",
                 valueFrom=dict(fieldRef=dict(fieldPath=COMPLETION_INDEX)))]
  env += [dict(name=k, value=str(v)) for k, v in (extra or {}).items()]
  return env


def job_spec(target: Target, *, config: str, workdir: str, image: str, overrides=(),
             name: str | None = None, env: dict | None = None, work_unit: int = 1) -> dict:
  """One work unit as JSON: hosts, accelerator, image, env, and the command on every host."""
  config = container_config(config)
  name = run_name(name or config_name(config))
  path, buckets = container_workdir(workdir)
  mounted = []
  for override in overrides:          # data paths on gs:// are read through the mount too
    value, more = to_mounted(override)
    mounted.append(value)
    buckets += more
  if not any(o.startswith("train.local_checkpoint_dir=") for o in mounted):
    mounted.append(f"train.local_checkpoint_dir={LOCAL_CHECKPOINTS}")
  return dict(
      name=name, work_unit=work_unit, platform=target.platform, hosts=target.hosts,
      accelerator=target.to_json(), image=image, workdir=workdir,
      gcs_buckets=list(dict.fromkeys(buckets)), container_workdir=path, overrides=mounted,
      env=env_for(target, name, env), working_dir=CONTAINER_REPO,
      command=main_command(config, path, mounted))


def job_specs(target: Target, *, config: str, workdir: str, image: str, overrides=(),
              grid: str = "", name: str | None = None, env: dict | None = None,
              validate: bool = True) -> list[dict]:
  """One spec per point of `grid` ('a=1,2;b=x,y', the sweep's syntax), each in its own
  subdirectory of `workdir`; without a grid, one spec in `workdir` itself. `overrides` are
  'a.b=v' strings applied to every unit. With `validate` each unit is checked as its run will
  be (`check_unit`) and its spec holds the fit check's record under "fit"."""
  points = configlib.parse_grid(grid)
  base = name or config_name(config)
  if validate:
    fit.emulate_devices(target.devices)   # before JAX starts: the fit check's devices
  specs = []
  for index, point in enumerate(points, start=1):
    suffix = unit_suffix(point)
    fitted = check_unit(config, overrides, point, target, env or {}) if validate else None
    spec = job_spec(
        target, config=config, image=image, overrides=[*overrides, *point], env=env,
        workdir=workdir.rstrip("/") + (f"/{suffix}" if grid.strip() else ""),
        name=run_name(base, suffix if grid.strip() else ""), work_unit=index)
    specs.append(spec | ({} if fitted is None else dict(fit=fitted.to_json())))
  return specs


def check_unit(config: str, overrides, point, target: Target, env: dict) -> fit.Fit:
  """Checks a unit before it launches, as its run checks itself on start: the config loaded as
  main.py loads it, no override of a field an arm sets, every field, the data the run will
  read (its fields, forms and buckets), the batches over the target's mesh, and whether both
  phases fit the accelerator's memory (the fit check, its steps lowered on emulated devices).
  Returns the fit check; a unit that does not fit is a ValueError with the check's advice."""
  path, sep, arg = container_config(config).partition(":")
  path_arg = os.path.join(REPO, path) + sep + arg
  configlib.refuse_arm_overrides(path_arg, overrides, "--config.")
  configlib.refuse_arm_overrides(path_arg, point, "--grid")
  loaded = configlib.apply_overrides(configlib.load_config(path_arg), [*overrides, *point])
  spec = spec_lib.check(loaded)
  spec.check_fields()
  sizes = mesh_lib.mesh_shape(spec.mesh, target.devices)
  checked = spec_lib.check(configlib.apply_overrides(
      loaded, [f"mesh.{axis}={size}" for axis, size in sizes.items()]))
  fitted = fit.check(checked.on_platform(), target.chip,
                     checked.on_platform(fit.target_platform(target.chip)),
                     compile_steps=False, environ=env)
  if not fitted.fits:
    raise ValueError(f"{config} {' '.join(f'--config.{o}' for o in [*overrides, *point])}"
                     f": {fit_summary(fitted.to_json())}; the fit check advises: "
                     f"{'; '.join(fitted.advice)}")
  return fitted


def fit_summary(record: dict) -> str:
  """One line of a fit check's record: 'fit on 64 x b200, 135.0 GB per device: tst 49.3,
  ntp 49.2 GB (fits, mesh {...}, model.remat=save_dots)'."""
  phases = ", ".join(f"{p['phase']} {p['estimate'] / fit.GB:.1f}" for p in record["phases"])
  return (f"fit on {record['devices']} x {record['accelerator']}, "
          f"{record['budget_bytes'] / fit.GB:.1f} GB per device: {phases} GB "
          f"({'fits' if record['fits'] else 'does NOT fit'}, mesh {record['mesh']}, "
          f"model.remat={record['remat']})")


# -- command line ----------------------------------------------------------------------------
def run_main(prog: str, build, show) -> int:
  """Runs a launcher: `build()` makes the specs, each unit's fit check goes to stderr, then
  `show(specs)`. A bad target, config, override or a unit that does not fit is one
  'error: ...' line and exit status 2, before anything is printed or launched."""
  try:
    specs = build()
  except (errors.UserError, ValueError, FileNotFoundError) as e:
    print(errors.one_line(e) or f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return errors.EXIT_STATUS
  for spec in specs:
    if "fit" in spec:
      print(f"{prog}: {spec['name']}: {fit_summary(spec['fit'])}", file=sys.stderr)
  show(specs)
  return 0


class Parser(argparse.ArgumentParser):
  """argparse whose errors are one line, 'error: <prog>: <message>', and exit status 2, as
  every error of the launchers is: not the usage text first."""

  def error(self, message):
    print(f"error: {self.prog}: {message}", file=sys.stderr)
    sys.exit(errors.EXIT_STATUS)


def add_arguments(parser: argparse.ArgumentParser):
  """The flags both launchers share."""
  parser.add_argument("--config", required=True, help="config file[:arg], e.g. configs/demo.py")
  parser.add_argument("--platform", required=True, choices=["tpu", "gpu"])
  parser.add_argument("--tpu_type", default="", help="e.g. v5p-128 (TensorCores), v6e-64")
  parser.add_argument("--tpu_topology", default="", help="override the derived topology")
  parser.add_argument("--gpu_type", default="", help=f"one of {sorted(GPU_TYPES)}")
  parser.add_argument("--num_hosts", type=int, default=1, help="GPU hosts (8 GPUs each)")
  parser.add_argument("--workdir", default="", help="gs://BUCKET/path (mounted with gcsfuse)")
  parser.add_argument("--name", default="",
                      help="JobSet name (default: the config's and its arms', llama-3b-20k)")
  parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                      help="extra environment variable on every host (repeatable)")
  parser.add_argument("--grid", default="",
                      help="'key=v1,v2;key2=w1,w2': one work unit per point of the product")
  parser.add_argument("--no_validate", action="store_true",
                      help="skip loading the config: its fields, the overrides, the grid, the "
                           "data and the fit check go unchecked (the target, the workdir and "
                           "bucket names are still checked)")


def parse_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
  """argparse, with every '--config.a.b=v' collected into args.overrides as 'a.b=v'."""
  overrides, rest = [], []
  argv = list(argv)
  while argv:
    arg = argv.pop(0)
    if arg.startswith("--config."):
      key, sep, value = arg[len("--config."):].partition("=")
      if not sep:
        if not argv:
          parser.error(f"{arg} needs a value")
        value = argv.pop(0)
      overrides.append(f"{key}={value}")
    else:
      rest.append(arg)
  args = parser.parse_args(rest)
  args.overrides = overrides
  try:
    args.env = dict(kv.split("=", 1) for kv in args.env)
  except ValueError:
    parser.error("--env takes KEY=VALUE")
  return args


def target_from_args(args) -> Target:
  return make_target(args.platform, tpu_type=args.tpu_type, tpu_topology=args.tpu_topology,
                     gpu_type=args.gpu_type, num_hosts=args.num_hosts)
