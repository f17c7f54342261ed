r"""Run a grid of TST configs, or named arms, point by point (resumable) and tabulate them.

  python -m tst_jax.tools.sweep --config configs/demo.py --workdir W \
      --grid "tst.ratio=0.1,0.3,0.5;tst.bag_size=2,4,6,8" --include_baseline --seeds 0,1
  python -m tst_jax.tools.sweep --config configs/gpu_small.py --workdir W \
      --arms baseline,tst,reinit,s8+r0.5 --seeds 0,1 --parallel 4

Each point trains in W/<name>, in this process or, with --subprocess or --parallel N, as
`python main.py`, N at a time. A point whose summary.json holds the requested steps is
skipped, an interrupted one resumes from its checkpoint, and a failed one is recorded while
the others go on. The tables cover every finished point under W, so later, smaller sweeps
into the same W add rows, and are rewritten after each point.

A grid gives W/sweep.csv, W/sweep.md and W/sweep_heatmap.png: rows r, columns S, each cell
coloured by the mean over seeds of the difference to the same seed's baseline. Arms are
config args with parts joined by '+', so `s8+r0.5` is config.py:s8,r0.5. They give
W/results.{json,md} from tst_jax.tools.arms: per arm over seeds the final loss, its difference
to the seed's baseline at equal FLOPs and the equal-loss speed-up, with the figure-2 curves
W/loss_vs_{flops,data}.png. Finished points brought back from another machine with
--finished, records without checkpoints, join W's own. A corpus is tokenized once per prepare
request into W/data_<key>/data and hard-linked into each point, a `tokens:` store is read
where it is, and all points share a persistent XLA cache.

W may be a bucket's URL, gs://bucket/sweep: the points, their records and the reports go there
through tst_jax/fileio/, and each point reads the shared store in place as
`data.source=tokens:W/data_<key>/data`, since a bucket has no hard links.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time

from tst_jax import fileio
from tst_jax.tools import compare
from tst_jax.tools.sweep.brought_back import bring_back
from tst_jax.tools.sweep.points import (OVERHEAD_S, PREPARE_S, Point, estimate_s,
                                        make_arm_points, make_points, point_dir, resolve)
from tst_jax.tools.sweep.report import collect, write_arm_reports, write_reports
from tst_jax.tools.sweep.run import (compilation_cache, data_key, finished,
                                     prepare_shared_data, run_point, shared_data_dir)

__all__ = ["OVERHEAD_S", "Point", "bring_back", "data_key", "estimate_s", "main",
           "make_arm_points", "make_points", "resolve"]


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.sweep", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="config file[:arg], e.g. configs/demo.py")
  p.add_argument("--grid", default="", help="'key=v1,v2;key2=w1,w2': the cartesian product")
  p.add_argument("--arms", default="",
                 help="comma list of config args, one point per arm and seed, parts joined by "
                      "'+' (baseline,tst,s8+r0.5): results.{json,md} and figure-2 curves")
  p.add_argument("--workdir", required=True,
                 help="one subdirectory per point, tables here: a folder or a bucket's URL")
  p.add_argument("--include_baseline", action="store_true",
                 help="also run r = 0 (plain next-token training, same FLOPs) per seed")
  p.add_argument("--seeds", default=None, help="comma list, e.g. 0,1,2 (default: the config's)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override applied to every point (repeatable), read as main.py reads "
                      "--config.KEY=VALUE")
  p.add_argument("--subprocess", action="store_true",
                 help="train each point with `python main.py` instead of in this process")
  p.add_argument("--parallel", type=int, default=1, metavar="N",
                 help="train N points at once as subprocesses (sharing one accelerator: each "
                      "may use 0.9/N of its memory)")
  p.add_argument("--deadline_s", type=float, default=None, metavar="SECONDS",
                 help="after this many seconds start no point and stop the running ones with "
                      "a checkpoint (SIGTERM), then write the tables: for calls of bounded "
                      "length; the same command resumes (points train as subprocesses)")
  p.add_argument("--compilation_cache", default="",
                 help="persistent XLA cache shared by the points (default: JAX's configured "
                      "one, else W/.jax_cache, or for W in a bucket a local folder kept for "
                      "this call; 'none': off): points with the same shapes reuse each "
                      "other's compiled steps")
  p.add_argument("--finished", action="append", default=[], metavar="FOLDER",
                 help="finished points brought back from another machine (FOLDER/<point>/ "
                      "or FOLDER/runs/<point>/: config.json, plan.json, metrics.jsonl, "
                      "summary.json, no checkpoints): copied into W first, also with "
                      "--dry_run, and counted as W's own (repeatable)")
  p.add_argument("--budget_s", type=float, default=None, metavar="SECONDS",
                 help="refuse, in one line and before anything runs, points that cannot "
                      "finish in this many seconds: the unfinished points' plan FLOPs at "
                      "--rate, plus --overhead_s per wave of --parallel points and --prepare_s "
                      "for a corpus not yet tokenized")
  p.add_argument("--rate", type=float, default=None, metavar="FLOP/S",
                 help="with --budget_s: the FLOP/s the points get together on the device "
                      "(benchmarks/gpu_small.sh gives a measured one)")
  p.add_argument("--overhead_s", type=float, default=OVERHEAD_S,
                 help="with --budget_s: seconds per wave of points beside their FLOPs")
  p.add_argument("--prepare_s", type=float, default=PREPARE_S,
                 help="with --budget_s: seconds to tokenize a corpus not yet prepared")
  p.add_argument("--dry_run", action="store_true", help="list the points and exit")
  p.add_argument("--verbosity", type=int, default=0,
                 help="1: tracebacks of user errors too (else one 'error:' line)")
  return p.parse_args(argv)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  args.deadline = None if args.deadline_s is None else time.time() + args.deadline_s
  fileio.check_output(args.workdir, "--workdir", "a sweep's workdir",   # before any point
                      fileio.RUN_STORES)
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  points = _points(args, arms)
  # Every point's config, before anything is written: a misspelt arm or override fails here.
  specs = [resolve(p.config_arg(args.config), p.overrides(args.set))[1] for p in points]
  fileio.makedirs(args.workdir)
  for folder in args.finished:
    names = bring_back(folder, args.workdir)
    print(f"brought back from {folder}: {', '.join(names) or 'nothing new'}", flush=True)
  if args.budget_s is not None:
    print(check_budget(args, points, specs), flush=True)
  if args.dry_run:
    for point in points:
      print(point.name, point.config_arg(args.config), " ".join(point.overrides(args.set)))
    return 0
  command = compare.command_line("tst_jax.tools.sweep", argv)

  def report() -> dict:
    if arms:
      return write_arm_reports(args.workdir, command, arms)
    return write_reports(args.workdir, collect(args.workdir), command)

  todo = [s for p, s in zip(points, specs)
          if not finished(point_dir(args.workdir, p.name), s.plan.total_steps)]
  with tempfile.TemporaryDirectory(prefix="tst_jax_sweep_xla_") as scratch, \
       compilation_cache(_cache_dir(args, specs, scratch)):
    for spec in {data_key(s): s for s in todo}.values():
      prepare_shared_data(args.workdir, spec)        # tokenize once, before any point runs
    status = _run_points(args, points, report)
  paths = report()
  print(fileio.read_text(paths["md"]))
  written = [p for value in paths.values() for p in (value if isinstance(value, list) else [value])]
  print(f"wrote {', '.join(written)}; the points' runs in {args.workdir}")
  unfinished = [p.name for p in points if status[p.name] in ("interrupted", "not started")]
  if unfinished:
    print(f"unfinished at the deadline: {', '.join(unfinished)}; the same command resumes them")
  failed = [p.name for p in points if status[p.name] == "failed"]
  if failed:
    print(f"failed points: {failed}", file=sys.stderr)
  return 1 if failed else 0


def check_budget(args, points: list[Point], specs) -> str:
  """Says what the unfinished points need against --budget_s, and raises SystemExit with that
  line when they need more."""
  if not args.rate or args.rate <= 0:
    raise SystemExit("--budget_s needs --rate: the FLOP/s the points get on the device")
  todo = [s.plan for p, s in zip(points, specs)
          if not finished(point_dir(args.workdir, p.name), s.plan.total_steps)]
  unprepared = any(not s.data.source.startswith("tokens:") and not fileio.exists(
      fileio.join(shared_data_dir(args.workdir, s), "prepared.json")) for s in specs)
  prepare = args.prepare_s if unprepared and todo else 0.0
  need = estimate_s(todo, args.parallel, args.rate, args.overhead_s, prepare)
  line = (f"{len(todo)} of {len(points)} points to train: "
          f"{sum(p.flops_total for p in todo):.3g} FLOPs at an assumed "
          f"{args.rate:.3g} FLOP/s, {args.overhead_s:.0f} s per wave of "
          f"{args.parallel}, {prepare:.0f} s to tokenize: about {need:.0f} s of the "
          f"{args.budget_s:.0f} s budget")
  if need > args.budget_s:
    raise SystemExit(f"budget: {line}; ask fewer arms or seeds, or more time")
  return f"budget: {line}"


def _points(args, arms: list[str]) -> list[Point]:
  """The points of --arms or --grid (and --include_baseline), times the seeds."""
  if arms and (args.grid or args.include_baseline):
    raise SystemExit("--arms replaces --grid and --include_baseline (use a 'baseline' arm)")
  seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds
           else [resolve(args.config, args.set)[1].run.seed])
  points = (make_arm_points(arms, seeds) if arms
            else make_points(args.grid, seeds, args.include_baseline))
  if not points:
    raise SystemExit("no points: give --arms, or --grid and/or --include_baseline")
  return points


def _cache_dir(args, specs, scratch: str) -> str | None:
  """The persistent XLA cache the points share (None: off). A bucket's W gets the local folder
  `scratch`, kept for this call, since the cache writes local files only."""
  import jax
  local = fileio.local_path(args.workdir)
  cache = (args.compilation_cache or jax.config.jax_compilation_cache_dir
           or (os.path.join(local, ".jax_cache") if local else scratch))
  if (cache != "none" and any(s.mesh.expert not in (0, 1) for s in specs)
      and jax.default_backend() == "cpu"):
    # jaxlib 0.10.2's XLA:CPU deadlocks running the expert-parallel step loaded from the
    # persistent cache. Compiling it afresh is correct.
    print("compilation cache off: expert-parallel steps on CPU (see docs/distributed.md)")
    cache = "none"
  return None if cache == "none" else os.path.abspath(cache)


def _run_points(args, points: list[Point], report) -> dict[str, str]:
  """Each point's status ('done', 'skipped', ...), the reports rewritten after each done."""
  status = {}
  if args.parallel <= 1:
    for i, point in enumerate(points):
      status[point.name] = run_point(args, point, i + 1, len(points))
      if status[point.name] == "done":
        report()
    return status
  # Subprocesses on one accelerator: each may grow to its share of the memory.
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
             XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / args.parallel:.3f}")
  with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
    futures = {pool.submit(run_point, args, p, i + 1, len(points), env): p
               for i, p in enumerate(points)}
    for future in concurrent.futures.as_completed(futures):
      status[futures[future].name] = future.result()
      if status[futures[future].name] == "done":
        report()                                       # partial results after each point
  return status
