"""The workdir's lock (tst_jax/run/lock.py): a second run stops with one line naming the
live holder, a dead run's lock is taken over with a line, on a local disk and in a bucket. A
holder never overwrites a lock another run took, and a run that lost its lock, or cannot
renew it, stops at its next step with one line."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import errors, fileio
from tst_jax.fileio import swap
from tst_jax.errors import WorkdirError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import lock as lock_lib, workdir as workdir_lib
from tst_jax.train import loop


@pytest.fixture(params=["local", "bucket", "s3"])
def root(request, tmp_path):
  """A folder to make workdirs in: on the local disk, gs://<bucket> in the emulator, or
  s3://<bucket> in moto's server."""
  if request.param == "local":
    return str(tmp_path)
  return request.getfixturevalue("bucket" if request.param == "bucket" else "s3_bucket")


def _lock_of(workdir, **fields):
  """Writes the lock a run with `fields` left in `workdir`; returns its path."""
  record = dict(host=socket.gethostname(), pid=os.getpid(), started="2026-01-01T00:00:00Z",
                heartbeat=time.time(), token="theirs") | fields
  fileio.makedirs(workdir)
  file = RunDir(workdir).lock
  fileio.write_json(file, record)
  return file


def _held(file) -> dict:
  return fileio.read_json(file)


def _dead_pid() -> int:
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def test_a_live_runs_lock_stops_a_second_run_with_one_line_before_it_writes(root):
  """The holder is this test's own process, alive: cli.run stops before it writes a file."""
  workdir = fileio.join(root, "run")
  file = _lock_of(workdir)
  held = fileio.read_text(file)
  with pytest.raises(WorkdirError) as e:
    cli.run(tiny_config(steps=2), workdir)
  line = errors.one_line(e.value)
  assert line.startswith(f"error: --workdir {workdir}: a live run holds it: pid {os.getpid()} "
                         f"on host {socket.gethostname()}, started 2026-01-01T00:00:00Z"), line
  assert fileio.listdir(workdir) == ["lock.json"] and fileio.read_text(file) == held


@pytest.mark.parametrize("fields,why", [
    (dict(pid="dead"), "its process has ended"),
    (dict(host="elsewhere", heartbeat=time.time() - lock_lib.LOCK_STALE_S - 60),
     "its heartbeat is"),
    (dict(host="elsewhere", pid=-1), None),           # alive there, for all we can tell
    (dict(pid=os.getpid(), heartbeat=time.time() - 10 * lock_lib.LOCK_STALE_S),
     "its heartbeat is")])                            # a pid reused since by another process
def test_a_dead_runs_lock_is_taken_over_with_a_line(root, fields, why):
  workdir = fileio.join(root, "run")
  file = _lock_of(workdir, **{k: _dead_pid() if v == "dead" else v for k, v in fields.items()})
  said = []
  if why is None:
    with pytest.raises(WorkdirError, match="a live run holds it: pid -1 on host elsewhere"):
      lock_lib.Lock.take(RunDir(workdir), say=said.append)
    assert not said and _held(file)["token"] == "theirs"
    return
  lock = lock_lib.Lock.take(RunDir(workdir), say=said.append)
  assert len(said) == 1 and said[0].startswith(f"taking over {file} from a dead run: pid ")
  assert why in said[0]
  held = _held(file)
  assert (held["pid"], held["host"], held["token"]) == (os.getpid(), socket.gethostname(),
                                                       lock.record["token"])
  lock.release()
  assert not fileio.exists(file)


def test_a_restarted_containers_lock_of_its_own_pid_and_host_is_taken_over_at_once(tmp_path):
  """A container's command has the same pid (1) and host name (the pod's) at every restart:
  the lock its previous process left names this process, with a heartbeat from before this
  process started. It is taken over at once, not after LOCK_STALE_S."""
  code = ("import os, socket, sys\n"
          "from tst_jax import fileio\n"
          "from tst_jax.rundir import RunDir\n"
          "from tst_jax.run import lock\n"
          "rundir = RunDir(sys.argv[1])\n"
          "fileio.makedirs(rundir.root)\n"
          "fileio.write_json(rundir.lock, dict(host=socket.gethostname(), pid=os.getpid(),\n"
          "                  started='?', heartbeat=float(sys.argv[2]), token='before'))\n"
          "lock.Lock.take(rundir).release()\n")
  out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run"), str(time.time() - 5)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "from a dead run: pid " in out.stdout and out.stdout.rstrip().endswith(
      "is a process started since that heartbeat"), out.stdout


def test_a_lock_abandoned_after_its_store_failed_is_taken_over_in_the_same_process(root):
  """A run whose bucket failed leaves its lock without a word to the store; another run of
  this live process takes it over, as one of another process would once that one ended."""
  workdir = fileio.join(root, "run")
  abandoned = lock_lib.Lock.take(RunDir(workdir))
  abandoned.abandon()
  said = []
  lock = lock_lib.Lock.take(RunDir(workdir), say=said.append)
  assert len(said) == 1 and said[0].endswith("it stopped in this process after its store failed")
  assert _held(RunDir(workdir).lock)["token"] == lock.record["token"]
  lock.release()


def test_an_unreadable_lock_is_judged_by_its_age(tmp_path):
  """A lock that is not JSON names no holder: it counts as live until its file is stale."""
  file = _lock_of(str(tmp_path))
  with open(file, "w") as f:
    f.write('{"host": "half a')
  with pytest.raises(WorkdirError, match=r"a live run holds it: pid -1 on host \?, started \?"):
    lock_lib.Lock.take(RunDir(tmp_path))
  old = time.time() - lock_lib.LOCK_STALE_S - 60
  os.utime(file, (old, old))
  said = []
  lock_lib.Lock.take(RunDir(tmp_path), say=said.append).release()
  assert len(said) == 1 and "its heartbeat is" in said[0] and os.listdir(tmp_path) == []


def test_the_holder_renews_its_heartbeat_and_releases_only_its_own_lock(root, monkeypatch):
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.05)
  workdir = fileio.join(root, "run")
  lock = lock_lib.Lock.take(RunDir(workdir))
  file = RunDir(workdir).lock
  first = _held(file)["heartbeat"]
  deadline = time.time() + 5
  while _held(file)["heartbeat"] == first and time.time() < deadline:
    time.sleep(0.05)
  assert _held(file)["heartbeat"] > first
  with pytest.raises(WorkdirError, match=f"a live run holds it: pid {os.getpid()}"):
    lock_lib.Lock.take(RunDir(workdir))                    # a second run in this very process
  lock.release()
  assert not fileio.exists(file) and not lock._beat.is_alive()  # pylint: disable=protected-access
  other = lock_lib.Lock.take(RunDir(workdir))
  _lock_of(workdir, token="another run's, after a take-over")
  other.release()                                     # leaves the other run's lock alone
  assert _held(file)["token"] == "another run's, after a take-over"


def test_a_second_main_py_on_a_live_runs_workdir_exits_2_with_one_line(root):
  """Two processes: this one holds the workdir, on a disk or in the bucket, and main.py stops
  before it writes anything."""
  workdir = fileio.join(root, "run")
  lock = lock_lib.Lock.take(RunDir(workdir))
  try:
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config",
                             TINY_CONFIG, "--workdir", workdir],
                            env=subprocess_env.one_cpu_device(), capture_output=True,
                            text=True, timeout=300)
    assert fileio.listdir(workdir) == ["lock.json"]    # main.py wrote nothing
  finally:
    lock.release()
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(f"error: --workdir {workdir}: a live run holds it: pid "
                                  f"{os.getpid()} on host {socket.gethostname()}, started ")
  assert not fileio.exists(workdir)   # the lock that made it leaves no empty workdir


def _wait_for(ready, what: str, timeout: float = 10.0):
  deadline = time.time() + timeout
  while not ready():
    assert time.time() < deadline, f"waited {timeout} s for {what}"
    time.sleep(0.01)


def _take_over(file: str) -> dict:
  """Does what another run does to a lock it judged dead: removes it at the version it read,
  then creates its own. Returns the new record."""
  record = dict(host="elsewhere", pid=4242, token="theirs", started="2026-01-01T00:00:00Z",
                heartbeat=time.time())
  # The holder's heartbeat may rewrite or pin the lock between the look and the removal, which
  # then refuses, as it should: a taker looks again.
  _wait_for(lambda: swap.remove_if_unchanged(file, swap.version(file)), "the removal")
  assert swap.create_new(file, json.dumps(record))
  return record


def _lost(lock) -> bool:
  try:
    lock.check()
  except WorkdirError:
    return True
  return False


def _lost_line(lock) -> str:
  with pytest.raises(WorkdirError) as e:
    lock.check()
  return errors.one_line(e.value)


def test_a_beat_in_flight_never_overwrites_a_lock_another_run_took(root, monkeypatch):
  """The holder's heartbeat write is under way when another run removes and re-creates the
  lock: the write is refused, the other run's lock stays, and the holder learns it lost."""
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.02)
  holder = lock_lib.Lock.take(RunDir(fileio.join(root, "run")))
  gate, waiting = threading.Event(), threading.Event()
  write = swap.write_if_unchanged

  def held_back(path, data, seen):
    if seen == holder.version:    # the holder's beat, not the taker's
      waiting.set()
      gate.wait(10)
    return write(path, data, seen)

  monkeypatch.setattr(swap, "write_if_unchanged", held_back)
  _wait_for(waiting.is_set, "the holder's beat")
  theirs = _take_over(holder.file)
  gate.set()
  _wait_for(lambda: holder.lost, "the holder to learn it lost the lock")
  assert _held(holder.file) == theirs
  line = _lost_line(holder)
  assert line.startswith(f"error: --workdir {fileio.join(root, 'run')}: this run no longer "
                         f"holds {holder.file}: another run took it over: pid 4242 on host "
                         "elsewhere, started 2026-01-01T00:00:00Z"), line
  holder.release()
  assert _held(holder.file) == theirs


def test_a_heartbeat_that_fails_is_retried_and_stops_the_run_before_others_may_take_over(
    root, monkeypatch):
  """gcsfs raises HttpError, which is no OSError, once its own retries are spent. The beat
  tries again at the next one, and the run stops once none got through for LOCK_GIVE_UP_S,
  well before another run may take its workdir at LOCK_STALE_S."""
  assert lock_lib.LOCK_GIVE_UP_S <= lock_lib.LOCK_STALE_S - 3 * lock_lib.LOCK_BEAT_S
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.02)
  write, failures, failing = swap.write_if_unchanged, [], threading.Event()
  failing.set()

  class HttpError(Exception):
    pass

  def flaky(path, data, seen):
    if failing.is_set():
      failures.append(path)
      raise HttpError("Service Unavailable")
    return write(path, data, seen)

  monkeypatch.setattr(swap, "write_if_unchanged", flaky)
  lock = lock_lib.Lock.take(RunDir(fileio.join(root, "run")))
  first = _held(lock.file)["heartbeat"]
  _wait_for(lambda: len(failures) >= 3, "three failed beats")
  assert lock._beat.is_alive() and not lock.lost   # pylint: disable=protected-access
  lock.check()                                     # the run goes on for now
  monkeypatch.setattr(lock_lib, "LOCK_GIVE_UP_S", 0.0)
  line = _lost_line(lock)
  assert "no heartbeat could be written to it for " in line, line
  assert "(HttpError: Service Unavailable). It stops at this step; run the same" in line, line
  monkeypatch.setattr(lock_lib, "LOCK_GIVE_UP_S", 200.0)
  failing.clear()                                  # the store answers again
  _wait_for(lambda: _held(lock.file)["heartbeat"] > first, "a beat to get through")
  lock.check()
  lock.release()
  assert not fileio.exists(lock.file)


def test_a_retried_write_whose_first_try_went_through_is_the_runs_own(root, monkeypatch):
  """A store that retries a conditional write after its first try went through answers the
  retry with a failed precondition: the lock is then the run's own, not a live stranger's."""
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.02)
  create, write, said, created, retried = swap.create_new, swap.write_if_unchanged, [], [], []

  def create_then_refuse_the_retry(path, data):   # the lock's create, once
    created.append(create(path, data))
    return created[-1] and len(created) > 1

  monkeypatch.setattr(swap, "create_new", create_then_refuse_the_retry)

  def write_then_refuse_the_retry(path, data, seen):
    retried.append(write(path, data, seen))
    return None

  monkeypatch.setattr(swap, "write_if_unchanged", write_then_refuse_the_retry)
  lock = lock_lib.Lock.take(RunDir(fileio.join(root, "run")), say=said.append)
  assert not said and _held(lock.file)["token"] == lock.record["token"]
  first = _held(lock.file)["heartbeat"]
  _wait_for(lambda: len(retried) >= 2, "two beats")
  assert not lock.lost and _held(lock.file)["heartbeat"] > first and None not in retried
  lock.check()
  lock.release()
  assert not fileio.exists(lock.file)


def test_a_dead_runs_lock_is_taken_over_where_a_rename_copies_the_file(tmp_path, monkeypatch):
  """gcsfuse renames a file by copying it: a new inode and time, the same contents."""
  rename = os.rename

  def copy_then_remove(src, dst):
    shutil.copyfile(src, dst)
    os.remove(src)

  _lock_of(str(tmp_path), pid=_dead_pid())
  monkeypatch.setattr(os, "rename", copy_then_remove)
  said = []
  lock = lock_lib.Lock.take(RunDir(tmp_path), say=said.append)
  assert len(said) == 1 and "its process has ended" in said[0]
  monkeypatch.setattr(os, "rename", rename)
  lock.release()
  assert os.listdir(tmp_path) == []


def test_a_run_whose_lock_is_taken_over_stops_at_its_next_step_before_writing(tmp_path,
                                                                            monkeypatch):
  """Another run takes the lock over after step 5: the run stops with one line at step 6,
  before step 5's metrics line or any later checkpoint is written."""
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.02)
  workdir = str(tmp_path / "run")
  file = RunDir(workdir).lock
  step, take = loop.StepLog.step, lock_lib.Lock.take.__func__
  theirs, held = [], []

  def step_then_taken_over(self, done, phase, metrics):
    step(self, done, phase, metrics)
    if done == 5:
      theirs.append(_take_over(file))
      _wait_for(lambda: _lost(held[0]), "the run to learn it lost its lock")

  monkeypatch.setattr(lock_lib.Lock, "take", classmethod(
      lambda cls, *a, **k: held.append(take(cls, *a, **k)) or held[-1]))
  monkeypatch.setattr(loop.StepLog, "step", step_then_taken_over)
  with pytest.raises(WorkdirError) as e:
    cli.run(tiny_config(steps=8), workdir)
  line = errors.one_line(e.value)
  assert line.startswith(f"error: --workdir {workdir}: this run no longer holds {file}: "), line
  assert ("another run took it over: pid 4242 on host elsewhere" in line   # a beat between
          or "it was removed" in line), line                             # removal and create
  assert _held(file) == theirs[0]
  assert [r["step"] for r in workdir_lib.read_metrics(RunDir(workdir))
          if "loss" in r] == [1, 2, 3, 4]
  assert workdir_lib.checkpoint_steps(RunDir(workdir)) == [2, 4]


def test_a_process_start_is_when_it_was_launched():
  """A child's own start, read before it imports anything of its own, lies between its launch
  and its first line, to /proc's 10 ms ticks."""
  launched = time.time()
  child = subprocess.run(
      [sys.executable, "-c", "import time; now = time.time(); from tst_jax.run import lock; "
       "print(now, lock.process_start())"], capture_output=True, text=True, check=True,
      cwd=ROOT)
  first_line, started = map(float, child.stdout.split())
  assert launched - 0.02 <= started <= first_line
