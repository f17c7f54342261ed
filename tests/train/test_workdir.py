"""A run's workdir (tst_jax/train/workdir.py): one name, reader and writer per file, one
"same run?" check whose message is the same for a config, a store and a checkpoint, and the
lock that keeps a second run out of a live run's workdir."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import errors
from tst_jax.errors import ConfigError, WorkdirError
from tst_jax.train import cli, workdir as workdir_lib


def test_metrics_read_back_and_resume_drops_the_lines_after_the_checkpoint(tmp_path):
  workdir = str(tmp_path)
  assert workdir_lib.read_metrics(workdir) == []
  lines = [dict(step=s, loss=10.0 - s) for s in range(1, 6)] + [dict(step=5, eval_loss=3.5)]
  with workdir_lib.open_metrics(workdir, None) as f:
    f.writelines(json.dumps(r) + "\n" for r in lines)
  assert workdir_lib.read_metrics(workdir) == lines
  assert workdir_lib.final_eval(workdir, 5) == 3.5 and workdir_lib.final_eval(workdir, 4) is None
  with workdir_lib.open_metrics(workdir, 3) as f:   # resumed from the checkpoint of step 3
    f.write(json.dumps(dict(step=4, loss=1.0)) + "\n")
  assert workdir_lib.read_metrics(workdir) == lines[:3] + [dict(step=4, loss=1.0)]


def test_records_read_back_as_written(tmp_path):
  workdir = str(tmp_path)
  assert workdir_lib.read_summary(workdir) is None and workdir_lib.read_store(workdir) is None
  workdir_lib.write_summary(workdir, dict(steps=8, final_eval_loss=3.25))
  workdir_lib.write_store(workdir, "f" * 64, "/stores/a", 1234)
  assert workdir_lib.read_summary(workdir) == dict(steps=8, final_eval_loss=3.25)
  assert workdir_lib.train_tokens(workdir) == 1234
  assert (tmp_path / workdir_lib.STORE).is_file() and (tmp_path / workdir_lib.SUMMARY).is_file()


@pytest.mark.parametrize("what,differs", [("config", "sections ['tst'] differ"),
                                          ("token store", "A there, B here")])
def test_one_same_run_check_with_one_message(tmp_path, what, differs):
  with pytest.raises(ConfigError) as e:
    workdir_lib.check_same_run(str(tmp_path), what, differs, force=False)
  assert e.value.field == "--workdir"
  assert str(e.value) == (f"--workdir: {tmp_path} holds a run of another {what}: {differs}; "
                          "use another --workdir, or --config.train.force_resume=True to "
                          "resume anyway")
  workdir_lib.check_same_run(str(tmp_path), what, differs, force=True)
  workdir_lib.check_same_run(str(tmp_path), what, None, force=False)


def _lock_of(workdir, **fields):
  """Writes the lock a run with `fields` left in `workdir`; returns its path."""
  record = dict(host=socket.gethostname(), pid=os.getpid(), started="2026-01-01T00:00:00Z",
                heartbeat=time.time(), token="theirs") | fields
  os.makedirs(workdir, exist_ok=True)
  file = os.path.join(workdir, workdir_lib.LOCK)
  with open(file, "w") as f:
    json.dump(record, f)
  return file


def _dead_pid() -> int:
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def test_a_live_runs_lock_stops_a_second_run_with_one_line_before_it_writes(tmp_path):
  """The holder is this test's own process, alive: cli.run stops before it writes a file."""
  workdir = str(tmp_path / "run")
  file = _lock_of(workdir)
  held = open(file).read()
  with pytest.raises(WorkdirError) as e:
    cli.run(tiny_config(steps=2), workdir)
  line = errors.one_line(e.value)
  assert line.startswith(f"error: --workdir {workdir}: a live run holds it: pid {os.getpid()} "
                         f"on host {socket.gethostname()}, started 2026-01-01T00:00:00Z"), line
  assert os.listdir(workdir) == [workdir_lib.LOCK] and open(file).read() == held


@pytest.mark.parametrize("fields,why", [
    (dict(pid="dead"), "its process has ended"),
    (dict(host="elsewhere", heartbeat=time.time() - workdir_lib.LOCK_STALE_S - 60),
     "its heartbeat is"),
    (dict(host="elsewhere", pid=-1), None),           # alive there, for all we can tell
    (dict(pid=os.getpid(), heartbeat=time.time() - 10 * workdir_lib.LOCK_STALE_S),
     "its heartbeat is")])                            # a pid reused since by another process
def test_a_dead_runs_lock_is_taken_over_with_a_line(tmp_path, fields, why):
  workdir = str(tmp_path)
  file = _lock_of(workdir, **{k: _dead_pid() if v == "dead" else v for k, v in fields.items()})
  said = []
  if why is None:
    with pytest.raises(WorkdirError, match="a live run holds it: pid -1 on host elsewhere"):
      workdir_lib.Lock.take(workdir, say=said.append)
    assert not said and json.load(open(file))["token"] == "theirs"
    return
  lock = workdir_lib.Lock.take(workdir, say=said.append)
  assert len(said) == 1 and said[0].startswith(f"taking over {file} from a dead run: pid ")
  assert why in said[0]
  held = json.load(open(file))
  assert (held["pid"], held["host"], held["token"]) == (os.getpid(), socket.gethostname(),
                                                       lock.record["token"])
  lock.release()
  assert os.listdir(workdir) == []


def test_a_lock_retaken_in_between_is_put_back_and_an_unreadable_one_judged_by_its_age(
    tmp_path):
  """Two runs find one dead lock: the slower must not remove the faster one's new lock."""
  file = _lock_of(str(tmp_path), token="the faster run's")
  assert not workdir_lib._remove_if_same(file, dict(token="the dead run's"))  # pylint: disable=protected-access
  assert json.load(open(file))["token"] == "the faster run's" and os.listdir(tmp_path) == [
      workdir_lib.LOCK]
  with open(file, "w") as f:
    f.write('{"host": "half a')
  with pytest.raises(WorkdirError, match=r"a live run holds it: pid -1 on host \?, started \?"):
    workdir_lib.Lock.take(str(tmp_path))
  old = time.time() - workdir_lib.LOCK_STALE_S - 60
  os.utime(file, (old, old))
  said = []
  workdir_lib.Lock.take(str(tmp_path), say=said.append).release()
  assert len(said) == 1 and "its heartbeat is" in said[0] and os.listdir(tmp_path) == []


def test_the_holder_renews_its_heartbeat_and_releases_only_its_own_lock(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lib, "LOCK_BEAT_S", 0.02)
  workdir = str(tmp_path)
  lock = workdir_lib.Lock.take(workdir)
  file = os.path.join(workdir, workdir_lib.LOCK)
  first = json.load(open(file))["heartbeat"]
  deadline = time.time() + 5
  while json.load(open(file))["heartbeat"] == first and time.time() < deadline:
    time.sleep(0.02)
  assert json.load(open(file))["heartbeat"] > first
  with pytest.raises(WorkdirError, match=f"a live run holds it: pid {os.getpid()}"):
    workdir_lib.Lock.take(workdir)                    # a second run in this very process
  lock.release()
  assert not os.path.exists(file) and not lock._beat.is_alive()  # pylint: disable=protected-access
  other = workdir_lib.Lock.take(workdir)
  _lock_of(workdir, token="another run's, after a take-over")
  other.release()                                     # leaves the other run's lock alone
  assert json.load(open(file))["token"] == "another run's, after a take-over"


def test_a_second_main_py_on_a_live_runs_workdir_exits_2_with_one_line(tmp_path):
  """Two processes: this one holds the workdir, main.py stops before it writes anything."""
  workdir = str(tmp_path / "run")
  lock = workdir_lib.Lock.take(workdir)
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
