"""Finished points brought back from another machine: their records without checkpoints.

A run's checkpoints are too large to copy between machines, but a finished point's records are
small: its config, plan, metrics, summary and the sweep's own record
(`benchmarks/sweep_common.sh` packs them). Copied into a sweep's workdir they are finished
points like any other: the sweep skips them and its tables, frontier and trend count them, so
a ladder grows over runs made on several machines that keep nothing between them.
"""

from __future__ import annotations

import os
import re

from tst_jax import errors, fileio
from tst_jax.rundir import RunDir
from tst_jax.tools.sweep.points import point_dir
from tst_jax.config import record as record_lib
from tst_jax.run.workdir import final_eval

RECORDS = ("config", "plan", "metrics", "summary")   # the RunDir members a point brings back


def point_dirs(folder: str) -> list[RunDir]:
  """Lists the directories under `folder`, or its runs/ as points.tar.gz unpacks, that hold a
  point's records, by name. `folder` may be a bucket's: the records are copied out of it."""
  found = []
  for top in (folder, fileio.join(folder, "runs")):
    if fileio.isdir(top):
      found += [point_dir(top, n) for n in fileio.listdir(top)
                if all(fileio.isfile(getattr(point_dir(top, n), m)) for m in RECORDS)]
  return found


def point_record(rundir: RunDir) -> dict:
  """Reads a point's sweep_point.json, else makes one from the records: an arm point named
  <arm>_seed<N> as `points.make_arm_points` names them, with '+' written '-', and the '-ds' of
  an mtp<k>-ds part its own."""
  if fileio.isfile(rundir.sweep_point):
    return fileio.read_json(rundir.sweep_point)
  m = re.fullmatch(r"(.+)_seed(\d+)", rundir.name)
  if not m:
    raise errors.DataError(f"{rundir}: has no {fileio.basename(rundir.sweep_point)} and its "
                           "name is not <arm>_seed<N>: bring back the sweep's record too")
  plan = record_lib.read_plan(rundir).plan
  config = record_lib.read_config_json(rundir)
  return dict(name=rundir.name, config=None, overrides=[], grid={},
              arm=re.sub(r"-(?!ds(?:-|$))", "+", m.group(1)), seed=int(m.group(2)),
              baseline=False,
              r=plan.ratio, S=plan.phases[0].bag_size, steps=plan.total_steps,
              plan=plan.to_json(), status="done",
              data_source=config.get("data", {}).get("source"))


def bring_back(folder: str, workdir: str) -> list[str]:
  """Copies the records of every finished point under `folder` into `workdir` and returns their
  names. One that `workdir` already holds finished is left as it is. An unfinished run of the
  same name there is an error, since its checkpoints would not match the copied records."""
  brought = []
  for src in point_dirs(folder):
    record = point_record(src)
    steps = record_lib.read_plan(src).plan.total_steps
    if final_eval(src, steps) is None:
      raise errors.DataError(f"{src}: unfinished (no eval at its last step {steps}): bring "
                             "back finished points only")
    dst = point_dir(workdir, src.name)
    if final_eval(dst, steps) is not None:
      continue
    if fileio.exists(dst.root):
      raise errors.DataError(f"{dst}: holds an unfinished run of the point brought back from "
                             f"{src}: move it away first")
    _copy_records(src, dst, dict(record, brought_from=src.root))
    brought.append(src.name)
  return brought


def _copy_records(src: RunDir, dst: RunDir, record: dict):
  """Copies a point's records from `src` to `dst` with `record` as its sweep_point.json. On a
  disk they go to a folder beside `dst`, renamed into place at the end. A bucket cannot
  rename, so there metrics.jsonl goes last: the point counts as finished once its final eval
  is there."""
  into = dst if dst.remote else RunDir(dst.root + ".tmp")
  fileio.makedirs(into.root)
  fileio.write_json(into.sweep_point, record)
  for member in sorted(RECORDS, key=lambda m: m == "metrics"):
    fileio.write_bytes(getattr(into, member), fileio.read_bytes(getattr(src, member)))
  if into != dst:
    os.replace(into.root, dst.root)
