"""The workdir's lock (tst_jax/train/lock.py): a second run stops with one line naming the
live holder, a dead run's lock is taken over with a line, on a local disk and in a bucket."""

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import errors, fileio
from tst_jax.errors import WorkdirError
from tst_jax.train import cli, lock as lock_lib, workdir as workdir_lib


@pytest.fixture(params=["local", "bucket"])
def root(request, tmp_path):
  """A folder to make workdirs in: on the local disk, or gs://<bucket> in the emulator."""
  if request.param == "local":
    return str(tmp_path)
  return request.getfixturevalue("bucket")


def _lock_of(workdir, **fields):
  """Writes the lock a run with `fields` left in `workdir`; returns its path."""
  record = dict(host=socket.gethostname(), pid=os.getpid(), started="2026-01-01T00:00:00Z",
                heartbeat=time.time(), token="theirs") | fields
  fileio.makedirs(workdir)
  file = fileio.join(workdir, workdir_lib.LOCK)
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
  assert fileio.listdir(workdir) == [workdir_lib.LOCK] and fileio.read_text(file) == held


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
      lock_lib.Lock.take(workdir, say=said.append)
    assert not said and _held(file)["token"] == "theirs"
    return
  lock = lock_lib.Lock.take(workdir, say=said.append)
  assert len(said) == 1 and said[0].startswith(f"taking over {file} from a dead run: pid ")
  assert why in said[0]
  held = _held(file)
  assert (held["pid"], held["host"], held["token"]) == (os.getpid(), socket.gethostname(),
                                                       lock.record["token"])
  lock.release()
  assert not fileio.exists(file)


def test_an_unreadable_lock_is_judged_by_its_age(tmp_path):
  """A lock that is not JSON names no holder: it counts as live until its file is stale."""
  file = _lock_of(str(tmp_path))
  with open(file, "w") as f:
    f.write('{"host": "half a')
  with pytest.raises(WorkdirError, match=r"a live run holds it: pid -1 on host \?, started \?"):
    lock_lib.Lock.take(str(tmp_path))
  old = time.time() - lock_lib.LOCK_STALE_S - 60
  os.utime(file, (old, old))
  said = []
  lock_lib.Lock.take(str(tmp_path), say=said.append).release()
  assert len(said) == 1 and "its heartbeat is" in said[0] and os.listdir(tmp_path) == []


def test_the_holder_renews_its_heartbeat_and_releases_only_its_own_lock(root, monkeypatch):
  monkeypatch.setattr(lock_lib, "LOCK_BEAT_S", 0.05)
  workdir = fileio.join(root, "run")
  lock = lock_lib.Lock.take(workdir)
  file = fileio.join(workdir, workdir_lib.LOCK)
  first = _held(file)["heartbeat"]
  deadline = time.time() + 5
  while _held(file)["heartbeat"] == first and time.time() < deadline:
    time.sleep(0.05)
  assert _held(file)["heartbeat"] > first
  with pytest.raises(WorkdirError, match=f"a live run holds it: pid {os.getpid()}"):
    lock_lib.Lock.take(workdir)                    # a second run in this very process
  lock.release()
  assert not fileio.exists(file) and not lock._beat.is_alive()  # pylint: disable=protected-access
  other = lock_lib.Lock.take(workdir)
  _lock_of(workdir, token="another run's, after a take-over")
  other.release()                                     # leaves the other run's lock alone
  assert _held(file)["token"] == "another run's, after a take-over"


def test_a_second_main_py_on_a_live_runs_workdir_exits_2_with_one_line(tmp_path):
  """Two processes: this one holds the workdir, main.py stops before it writes anything.
  tests/behaviour/test_buckets.py runs the same in a bucket."""
  workdir = str(tmp_path / "run")
  lock = lock_lib.Lock.take(workdir)
  try:
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config",
                             TINY_CONFIG, "--workdir", workdir],
                            env=subprocess_env.one_cpu_device(), capture_output=True,
                            text=True, timeout=300)
    assert os.listdir(workdir) == [workdir_lib.LOCK]    # main.py wrote nothing
  finally:
    lock.release()
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(f"error: --workdir {workdir}: a live run holds it: pid "
                                  f"{os.getpid()} on host {socket.gethostname()}, started ")
  assert not os.path.exists(workdir)   # the lock that made it leaves no empty workdir
