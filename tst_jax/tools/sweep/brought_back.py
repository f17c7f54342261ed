"""Finished points brought back from another machine: their records without checkpoints.

A lent device keeps nothing, and a run's checkpoints are too large to bring back, but a finished
point's records are small: its config, plan, metrics, summary and the sweep's own record
(`benchmarks/sweep_common.sh` packs them). Copied into a sweep's workdir they are finished
points like any other: the sweep skips them and its tables, frontier and trend count them, so
a ladder grows over several lent sessions.
"""

from __future__ import annotations

import os
import re

from tst_jax import errors, fileio
from tst_jax.tools.sweep.points import POINT_FILE
from tst_jax.train import workdir as workdir_lib
from tst_jax.train.workdir import final_eval

RECORDS = (workdir_lib.CONFIG, workdir_lib.PLAN, workdir_lib.METRICS, workdir_lib.SUMMARY)


def point_dirs(folder: str) -> list[str]:
  """Lists the directories under `folder`, or its runs/ as points.tar.gz unpacks, that hold a
  point's records, by name. `folder` may be a bucket's: the records are copied out of it."""
  found = []
  for top in (folder, fileio.join(folder, "runs")):
    if fileio.isdir(top):
      found += [fileio.join(top, n) for n in fileio.listdir(top)
                if all(fileio.isfile(fileio.join(top, n, f)) for f in RECORDS)]
  return found


def point_record(point_dir: str) -> dict:
  """Reads a point's sweep_point.json, else makes one from the records: an arm point named
  <arm>_seed<N> as `points.make_arm_points` names them, with '+' written '-'."""
  path = fileio.join(point_dir, POINT_FILE)
  if fileio.isfile(path):
    return fileio.read_json(path)
  name = fileio.basename(fileio.absolute(point_dir))
  m = re.fullmatch(r"(.+)_seed(\d+)", name)
  if not m:
    raise errors.DataError(f"{point_dir}: has no {POINT_FILE} and its name is not "
                           "<arm>_seed<N>: bring back the sweep's record too")
  plan = workdir_lib.read_plan(point_dir).plan
  config = workdir_lib.read_config_json(point_dir)
  return dict(name=name, config=None, overrides=[], grid={}, arm=m.group(1).replace("-", "+"),
              seed=int(m.group(2)), baseline=False, r=plan.ratio,
              S=plan.phases[0].bag_size, steps=plan.total_steps, plan=plan.to_json(),
              status="done", data_source=config.get("data", {}).get("source"))


def bring_back(folder: str, workdir: str) -> list[str]:
  """Copies the records of every finished point under `folder` into `workdir` and returns their
  names. One that `workdir` already holds finished is left as it is. An unfinished run of the
  same name there is an error, since its checkpoints would not match the copied records."""
  brought = []
  for src in point_dirs(folder):
    name = fileio.basename(src)
    record = point_record(src)
    steps = workdir_lib.read_plan(src).plan.total_steps
    if final_eval(src, steps) is None:
      raise errors.DataError(f"{src}: unfinished (no eval at its last step {steps}): bring "
                             "back finished points only")
    dst = fileio.join(workdir, name)
    if final_eval(dst, steps) is not None:
      continue
    if fileio.exists(dst):
      raise errors.DataError(f"{dst}: holds an unfinished run of the point brought back from "
                             f"{src}: move it away first")
    _copy_records(src, dst, dict(record, brought_from=fileio.absolute(src)))
    brought.append(name)
  return brought


def _copy_records(src: str, dst: str, record: dict):
  """Copies a point's records from `src` to `dst` with `record` as its sweep_point.json. On a
  disk they go to dst.tmp, renamed into place at the end. A bucket cannot rename, so there
  metrics.jsonl goes last: the point counts as finished once its final eval is there."""
  into = dst if fileio.is_url(dst) else dst + ".tmp"
  fileio.makedirs(into)
  fileio.write_json(fileio.join(into, POINT_FILE), record)
  for f in sorted(RECORDS, key=lambda f: f == workdir_lib.METRICS):
    fileio.write_bytes(fileio.join(into, f), fileio.read_bytes(fileio.join(src, f)))
  if into != dst:
    os.replace(into, dst)
