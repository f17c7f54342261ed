"""Emergency checkpoint cost: the seconds the loop waits for one copy, the write behind it, a
restore, and an Orbax checkpoint of the same state beside them; JSON.

  python benchmarks/emergency_checkpoint.py --mb 256,1024 --folder /tmp/tst_emergency_bench

A state of `mb` megabytes of random float32 leaves (64 MB each), sharded over every device
of this process (--devices CPU devices here), is saved by tst_jax.train.local_checkpoint as a
run saves it: `save` copies the shards to host memory, the time the loop stands still, and a
thread writes and fsyncs them (`wait`). Then its restore, every byte read once (from the page
cache, just written), and the persistent checkpoint of the same state through the run's Orbax
Checkpoints to the same disk (save, then its asynchronous write). Each is the median of
--repeats. The folder is deleted at the end. On CPU a device's buffer is host memory, so the
copy costs almost nothing; on a GPU it is the device-to-host transfer.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEAF_MB = 64


def _state(mb: int):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  mesh = jax.make_mesh((jax.device_count(),), ("fsdp",))
  rows = LEAF_MB * (1 << 20) // 4 // 1024
  leaves = max(mb // LEAF_MB, 1)
  sharding = NamedSharding(mesh, P("fsdp"))
  rng = np.random.default_rng(0)        # random bytes: no store compresses them away
  return {f"w{i}": jax.device_put(rng.standard_normal((rows, 1024), np.float32), sharding)
          for i in range(leaves)}


def _abstract(state):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def measure(mb: int, folder: str, repeats: int) -> dict:
  """Returns the median seconds of each part for a state of `mb` megabytes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tst_jax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from tst_jax.train import local_checkpoint  # pylint: disable=g-import-not-at-top
  state = _state(mb)
  jax.block_until_ready(state)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  local = local_checkpoint.LocalCheckpoints(os.path.join(folder, "local"),
                                            os.path.join(folder, "workdir"), "bench", 1)
  persistent = ckpt_lib.Checkpoints(os.path.join(folder, "persistent"), keep=1)
  times = {k: [] for k in ("copy_s", "write_s", "restore_s", "orbax_save_s", "orbax_write_s")}
  for step in range(1, repeats + 1):
    t0 = time.perf_counter()
    local.save(step, state)
    t1 = time.perf_counter()
    local.wait()
    t2 = time.perf_counter()
    restored, _ = local.restore_newest(step - 1, step, _abstract(state))
    jax.block_until_ready(jax.tree.map(jnp.sum, restored))   # every byte read
    t3 = time.perf_counter()
    persistent.save(step, state, dict(step=step), force=True)
    t4 = time.perf_counter()
    persistent.wait()
    t5 = time.perf_counter()
    for key, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
      times[key].append(seconds)
  persistent.close()
  out = dict(mb=nbytes / 1e6, **{k: statistics.median(v) for k, v in times.items()})
  out["copy_gb_per_s"] = nbytes / 1e9 / out["copy_s"]
  out["write_gb_per_s"] = nbytes / 1e9 / out["write_s"]
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mb", default="256,1024", help="comma list of state sizes, MB")
  parser.add_argument("--folder", default="/tmp/tst_emergency_bench",
                      help="a new folder on the disk to measure; deleted at the end")
  parser.add_argument("--devices", type=int, default=8, help="CPU devices, where the state "
                      "is on the CPU")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  if os.path.exists(args.folder):
    parser.error(f"--folder {args.folder} exists: give a new one, which is deleted at the end")
  sizes = [int(s) for s in args.mb.split(",")]
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_num_cpu_devices", args.devices)   # the CPU backend's alone
  try:
    rows = [measure(mb, os.path.join(args.folder, str(mb)), args.repeats) for mb in sizes]
  finally:
    shutil.rmtree(args.folder, ignore_errors=True)
  print(json.dumps(dict(
      command=" ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])]),
      device=f"{jax.device_count()} x {jax.devices()[0].device_kind}", host=platform.node(),
      cpus=os.cpu_count(), python=platform.python_version(), jax=jax.__version__,
      date=datetime.date.today().isoformat(), repeats=args.repeats, rows=rows), indent=1))


if __name__ == "__main__":
  main()
