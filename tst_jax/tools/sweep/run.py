"""Running a sweep's points: in this process or as `python main.py` subprocesses, resumable,
on one tokenized corpus per prepare request, with a persistent XLA cache shared by all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from tst_jax import configlib, errors, fileio
from tst_jax.data import run_data
from tst_jax.rundir import RunDir
from tst_jax.tools.sweep.points import Point, point_dir, resolve
from tst_jax import cli
from tst_jax.run import workdir as workdir_lib
from tst_jax.run.appending import Appender

_MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "main.py")


def finished(rundir: RunDir, steps: int) -> bool:
  """Says whether the run in `rundir` completed `steps` steps. A run that completed another
  number of steps is an error, since its checkpoints belong to another plan."""
  summary = workdir_lib.read_summary(rundir)
  if summary is None:
    return False
  done = summary["steps"]
  if done != steps:
    raise errors.WorkdirError(f"{rundir} finished {done} steps but this sweep asks for "
                              f"{steps}: use another --workdir")
  return workdir_lib.final_eval(rundir, steps) is not None


def run_point(args, point: Point, index: int, total: int, env=None) -> str:
  """Trains one point unless it is finished. Returns 'done', 'skipped' or 'failed', or past
  `args.deadline`, a time.time() or None, 'interrupted' or 'not started'. The same command
  resumes an interrupted point from its checkpoint."""
  rundir = point_dir(args.workdir, point.name)
  overrides = point.overrides(args.set)
  config_arg = point.config_arg(args.config)
  config, spec = resolve(config_arg, overrides)
  plan = spec.plan
  if finished(rundir, plan.total_steps):
    print(f"[{index}/{total}] {point.name}: finished, skipped", flush=True)
    return "skipped"
  if args.deadline is not None and time.time() >= args.deadline:
    print(f"[{index}/{total}] {point.name}: not started (--deadline_s)", flush=True)
    return "not started"
  fileio.makedirs(rundir.root)
  store = shared_store(args.workdir, spec, rundir)
  meta = dict(name=point.name, config=config_arg, overrides=overrides, grid=point.grid,
              arm=point.arm, seed=point.seed, baseline=point.baseline, data_key=data_key(spec),
              r=plan.ratio, S=plan.phases[0].bag_size, steps=plan.total_steps,
              plan=plan.to_json(), status="running")
  fileio.write_json(rundir.sweep_point, meta)
  print(f"[{index}/{total}] {point.name}: training ({' '.join(overrides)})", flush=True)
  if store:
    overrides = [*overrides, f"data.source=tokens:{store}"]
    config = resolve(config_arg, overrides)[0]
  t0 = time.time()
  try:
    if args.subprocess or args.parallel > 1 or args.deadline is not None:
      cmd = [sys.executable, _MAIN, "--config", config_arg, "--workdir", rundir.root,
             *(f"--config.{k}={_cli_value(config, k)}" for k, _ in
               map(configlib.parse_override, overrides))]
      with _log_file(rundir) as log:
        done = _train(cmd, log, env, args.deadline)
      if not done and not finished(rundir, plan.total_steps):
        meta.update(status="interrupted", wall_s=time.time() - t0)
        fileio.write_json(rundir.sweep_point, meta)
        print(f"[{index}/{total}] {point.name}: interrupted at the deadline (the same "
              "command resumes it from its latest checkpoint)", flush=True)
        return "interrupted"
    else:
      cli.run(config, rundir.root)
  except Exception as e:   # noqa: BLE001 - one failed point does not stop the sweep
    meta.update(status="failed", error=f"{type(e).__name__}: {e}", wall_s=time.time() - t0)
    fileio.write_json(rundir.sweep_point, meta)
    line = errors.one_line(e)        # a user error: its one line, else the traceback
    print(line, file=sys.stderr) if line and not args.verbosity else traceback.print_exc()
    print(f"[{index}/{total}] {point.name}: FAILED ({meta['error']})", flush=True)
    return "failed"
  meta.update(status="done", wall_s=time.time() - t0)
  fileio.write_json(rundir.sweep_point, meta)
  loss = workdir_lib.final_eval(rundir, plan.total_steps)
  print(f"[{index}/{total}] {point.name}: final eval loss {loss:.4f} "
        f"({meta['wall_s']:.0f} s)", flush=True)
  return "done"


@contextlib.contextmanager
def _log_file(rundir: RunDir):
  """Yields the file a point's trainer writes its output to: its sweep_log.txt on a disk,
  and for a bucket's point a local temporary file, appended to that object when the trainer
  ends, since an object cannot be written to as it grows."""
  if not rundir.remote:
    with fileio.open(rundir.sweep_log, "a") as log:
      yield log
    return
  with tempfile.TemporaryFile() as log:
    try:
      yield log
    finally:
      log.seek(0)
      with Appender(rundir.sweep_log, parts=rundir.parts) as out:
        out.write(log.read())


# After SIGTERM: time for the current step (its compilation, if it is the first) and its
# checkpoint write. Scripts that stop the sweep from outside leave it this much more.
GRACE_S = 90


def _train(cmd: list[str], log, env, deadline: float | None) -> bool:
  """Runs the trainer `cmd` and says whether it finished.

  At `deadline` it gets SIGTERM. Once its loop has started, tst_jax/train/preemption.py
  finishes the current step, compiling it first if need be, checkpoints and exits 0. Before
  that, while importing, reading data or restoring, SIGTERM ends it at once. SIGKILL follows
  after GRACE_S. Either way the result is False and the point resumes from its latest
  checkpoint, if any."""
  with subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env) as proc:
    try:
      proc.wait(timeout=None if deadline is None else max(deadline - time.time(), 0))
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=GRACE_S)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      if proc.returncode in (0, -signal.SIGTERM, -signal.SIGKILL):
        return False
    except BaseException:
      proc.kill()                  # the sweep itself stops: so does its trainer
      raise
  if proc.returncode:
    raise subprocess.CalledProcessError(proc.returncode, cmd)
  return True


@contextlib.contextmanager
def compilation_cache(path: str | None):
  """Sets a persistent XLA cache at `path` for the points of this sweep and their
  subprocesses: points that compile the same step, of equal S and shapes, load it."""
  if path is None:
    yield
    return
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc
  before = (jax.config.jax_compilation_cache_dir, os.environ.get("JAX_COMPILATION_CACHE_DIR"))
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  cc.set_cache_dir(path)
  cc.reset_cache()          # an earlier compile in this process may have decided "no cache"
  try:
    yield
  finally:
    cc.set_cache_dir(before[0])
    cc.reset_cache()
    if before[1] is None:
      os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
      os.environ["JAX_COMPILATION_CACHE_DIR"] = before[1]


def shared_data_dir(workdir: str, spec) -> str:
  return fileio.join(workdir, "data_" + hashlib.sha256(data_key(spec).encode()).hexdigest()[:12])


def prepare_shared_data(workdir: str, spec):
  """Prepares the token store and BPE tokenizer of a run spec's data once in W/data_<key>/data,
  with the trainer's own prepare_data, for every point with the same data to link. A
  `tokens:` store needs nothing."""
  if spec.data.source.startswith("tokens:"):
    return
  path = shared_data_dir(workdir, spec)
  done = fileio.join(path, "prepared.json")
  if not fileio.exists(done):
    t0 = time.time()
    spec.check_paths()
    data = run_data.prepare_data(spec.data, RunDir(path), spec.model.vocab_size, block=(0, 1))
    fileio.write_json(done, dict(data_key=data_key(spec), train_tokens=len(data.train),
                           val_tokens=len(data.val), seconds=time.time() - t0))
    print(f"data prepared once in {path}: {len(data.train):,} training tokens "
          f"({time.time() - t0:.0f} s)", flush=True)


def shared_store(workdir: str, spec, rundir: RunDir) -> str:
  """Gives a point the store the sweep prepared for its data. On a disk its files are
  hard-linked into the point's data/, where the trainer finds them as its own, and '' is
  returned. A bucket has no links, so there it returns the shared store's URL, for the point
  to read in place as `tokens:`. A `tokens:` source or a mixture needs nothing and gets ''."""
  d = spec.data
  if d.source.startswith("tokens:") or d.mixture or d.tst_mixture:
    return ""
  shared = RunDir(shared_data_dir(workdir, spec))
  if not shared.remote:
    link_prepared_data(shared, rundir)
    return ""
  return shared.data


def link_prepared_data(source: RunDir, rundir: RunDir):
  """Hard-links the prepared token store (shards, manifest, tokenizer) of the folder `source`
  into a fresh point's data/, where the trainer finds it as its own. Links are safe since the
  files are never written again, and copies are made only across filesystems. The trainer
  checks the manifest."""
  store, target = source.data, rundir.data
  if os.path.exists(target) or not os.path.exists(os.path.join(store, "manifest.json")):
    return
  os.makedirs(target + ".tmp", exist_ok=True)
  for name in os.listdir(store):
    dst = os.path.join(target + ".tmp", name)
    if not os.path.exists(dst):
      _link_or_copy(os.path.join(store, name), dst)
  os.replace(target + ".tmp", target)


def _link_or_copy(src: str, dst: str):
  try:
    os.link(src, dst)
  except OSError:
    shutil.copyfile(src, dst)


def data_key(spec) -> str:
  """Returns what the prepared store of a run spec depends on. Points that differ only in
  seq_len or batch_size share one store."""
  return json.dumps(run_data.store_request(spec.data, spec.model.vocab_size), sort_keys=True)


def _cli_value(config, dotted: str) -> str:
  value = config
  for name in dotted.split("."):
    value = value[name]
  return str(value)


