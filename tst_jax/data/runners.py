"""Engines that run prepare's tasks: a process pool on this machine, or a Ray cluster.

`prepare` hands a runner two lists of tasks, one per input shard and then one per output shard,
through the two methods of multiprocessing.Pool it uses: `imap_unordered` and `imap`. Each
task writes its files under a .tmp name and a done marker last, so an engine may run it again
after its worker died, and a rerun of prepare skips what is done. The driver alone writes
the tokenizer before the tasks and the manifest after them.
"""

from __future__ import annotations

import collections
import importlib.util
import multiprocessing
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator

from tst_jax.errors import ConfigError

_RAY_RETRIES = 3     # runs of a task after its worker died (killed, out of memory, node lost)


def _one_thread_per_worker():
  os.environ["RAYON_NUM_THREADS"] = "1"   # the workers are parallel already


class _Inline:
  """Runs a pool's work in this process: one worker, no process start, all tokenizer threads."""
  imap = imap_unordered = staticmethod(map)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def check_shared(self, folder: str):
    del folder   # one process sees its own disk


class _Pool:
  """A pool of `workers` processes on this machine, spawned: no fork of a process that may
  hold JAX's threads."""

  def __init__(self, workers: int):
    self.pool = multiprocessing.get_context("spawn").Pool(workers,
                                                          initializer=_one_thread_per_worker)

  def imap(self, fn, jobs):
    return self.pool.imap(fn, jobs)

  def imap_unordered(self, fn, jobs):
    return self.pool.imap_unordered(fn, jobs)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.pool.terminate()
    return False

  def check_shared(self, folder: str):
    del folder   # every worker runs on this machine


def _local(workers: int | None):
  workers = workers or os.cpu_count() or 1
  return _Inline() if workers == 1 else _Pool(workers)


def _run_one_thread(fn: Callable, job):
  """Runs fn(job) in a Ray worker, its tokenizer on one thread: the workers are parallel."""
  _one_thread_per_worker()
  return fn(job)


def _sees(path: str, node: str) -> tuple[str, bool]:
  return node, os.path.exists(path)


class _Ray:
  """Tasks on a Ray cluster: the one RAY_ADDRESS names or `ray start` left on this machine,
  else a local one started for this prepare and stopped after it. A task whose worker dies is
  run again by Ray, up to _RAY_RETRIES times. `workers` caps the tasks in flight."""

  def __init__(self, workers: int | None):
    import ray   # pylint: disable=import-outside-toplevel  (an optional, costly engine)
    self.ray, self.workers, self.started, self.pending = ray, workers, False, []

  def __enter__(self):
    if not self.ray.is_initialized():
      self.ray.init(log_to_driver=False, include_dashboard=False)
      self.started = True
    self.task = self.ray.remote(max_retries=_RAY_RETRIES)(_run_one_thread)
    return self

  def __exit__(self, *exc):
    for ref in self.pending:          # an interrupted prepare leaves no task running
      self.ray.cancel(ref, force=True)
    if self.started:
      self.ray.shutdown()
    return False

  def _results(self, fn, jobs: Iterable, ordered: bool) -> Iterator:
    """Yields fn(job) for each job, in order or as they finish, at most `workers` in flight."""
    todo, flight = iter(jobs), collections.OrderedDict()
    cap = self.workers or float("inf")
    while True:
      for job in todo:
        ref = self.task.remote(fn, job)
        flight[ref] = None
        if len(flight) >= cap:
          break
      if not flight:
        self.pending = []
        return
      self.pending = list(flight)
      if ordered:
        ref = next(iter(flight))
      else:
        (ref,), _ = self.ray.wait(list(flight), num_returns=1)
      del flight[ref]
      yield self._get(ref)

  def _get(self, ref):
    try:
      return self.ray.get(ref)
    except self.ray.exceptions.RayTaskError as e:   # the task's own error, as raised there
      raise e.cause from None

  def imap(self, fn, jobs):
    return self._results(fn, jobs, ordered=True)

  def imap_unordered(self, fn, jobs):
    return self._results(fn, jobs, ordered=False)

  def check_shared(self, folder: str):
    """Raises a ConfigError where a node of the cluster does not see `folder` of this
    machine at the same path: prepare's tasks exchange their files there."""
    probe = os.path.join(folder, f".runner-probe-{uuid.uuid4().hex}")
    with open(probe, "wb"):
      pass
    try:
      strategy = self.ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
      nodes = [n["NodeID"] for n in self.ray.nodes() if n["Alive"]]
      seen = self.ray.get([self.ray.remote(_sees).options(
          scheduling_strategy=strategy(node, soft=False)).remote(probe, node) for node in nodes])
    finally:
      os.remove(probe)
    blind = [node for node, ok in seen if not ok]
    if blind:
      raise ConfigError("--out", f"{len(blind)} of the Ray cluster's {len(nodes)} nodes do not "
                        f"see {folder}, where prepare's tasks exchange their files (on "
                        f"{socket.gethostname()}): give --out on a filesystem every node mounts "
                        "at one path (NFS, Filestore, EFS); a store in a bucket is written "
                        "from one machine's Ray (docs/data.md)")


# The engines of --runner by name: each opens with the number of workers (None: all cores).
RUNNERS = {"local": _local, "ray": _Ray}
_PACKAGES = {"ray": "ray"}


def check(name: str):
  """Raises a ConfigError naming --runner where `name` is no runner or its engine is not
  installed, before prepare reads anything."""
  if name not in RUNNERS:
    raise ConfigError("--runner", f"{name!r} is not one of {sorted(RUNNERS)}")
  package = _PACKAGES.get(name)
  if package and importlib.util.find_spec(package) is None:
    raise ConfigError("--runner", f"{name} needs {package}: pip install 'tst-jax[{name}]'")


def start(name: str, workers: int | None):
  """Returns runner `name` for `workers` processes (None: all cores), to enter with `with`."""
  check(name)
  return RUNNERS[name](workers)
