"""python -m tst_jax.tools.goodput: the split of a run's wall time over its sessions, printed as
a table or as JSON; a run killed twice and resumed, end to end through main.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures import sigkill, subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tst_jax import errors
from tst_jax.rundir import RunDir
from tst_jax.run import goodput
from tst_jax.tools import goodput as goodput_tool

CMD = [sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG]
# main.py with a SIGKILL where the loop would save step $KILL_AT: the steps after the last
# checkpoint are trained again by the next session.
KILLED = sigkill.script("int(os.environ['KILL_AT'])")


def _two_sessions(rundir: RunDir):
  """Writes goodput.jsonl of a session killed after step 3 with checkpoint 2, and of the
  session that resumed at 2 and finished at step 4."""
  for back, first, last, ended in ((3.0, 0, 3, None), (0.0, 2, 4, "finished")):
    ledger = goodput.Ledger(time.time() - back)
    session = goodput.SessionLog(ledger, rundir, first, 4)
    for step in range(first + 1, last + 1):
      with ledger.timed("step"):
        time.sleep(0.01)
      session.interval(step)
    if ended:
      session.end(last, ended)
    session.close()
    ledger.close()


def _table(text: str) -> dict[str, float]:
  """Returns the seconds of each row of the tool's table, the wall time's included."""
  return {k: float(v) for k, v in re.findall(r"^ *([a-z][a-z ]+?) +([\d.]+) s +[\d.]+%",
                                            text, re.M)}


def test_the_tool_prints_the_split_and_each_session(tmp_path, capsys):
  rundir = RunDir(str(tmp_path))
  _two_sessions(rundir)
  goodput_tool.main([str(tmp_path)])
  text = capsys.readouterr().out
  run = goodput.read_account(rundir)
  assert text.startswith(f"goodput of {tmp_path}: {run.goodput:.1%} of its ")
  rows = _table(text)
  assert rows == pytest.approx(dict(**{"wall time": run.wall}, **{
      goodput.LABELS[k]: v for k, v in run.seconds.items()}), abs=0.05)   # to 0.1 s
  assert sum(run.seconds.values()) == pytest.approx(run.wall, rel=1e-9)
  assert run.seconds["lost"] > 0 and run.seconds["down"] > 0
  assert "(1 steps trained again)" in text and "steps done: 4 of 4" in text
  assert "no end record: killed, or still running" in text and "finished" in text
  goodput_tool.main([str(tmp_path), "--json"])
  got = json.loads(capsys.readouterr().out)
  assert got["seconds"] == run.seconds and got["retrained"] == 1
  assert [(s["first_step"], s["last_step"]) for s in got["sessions"]] == [(0, 3), (2, 4)]


def test_a_folder_that_holds_no_run_is_one_line(tmp_path, capsys):
  for workdir in (tmp_path / "missing", tmp_path):
    with pytest.raises(SystemExit) as stop:
      errors.main(goodput_tool.main, [str(workdir)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert str(workdir) in err


@pytest.mark.slow
def test_a_run_killed_twice_and_resumed_adds_up_to_its_wall_time(tmp_path):
  """The tiny run, SIGKILLed where it would save step 4 (checkpoint 2 complete, step 4 logged
  by its eval) and then step 10 (checkpoint 8), resumed each time: the tool's parts add up
  to its wall time within 2%, which is the time the three processes took within a few
  seconds; steps 3, 4 and 9 were trained twice, their time lost to restarts."""
  workdir, env = str(tmp_path / "run"), subprocess_env.one_cpu_device()
  t0 = time.time()
  for kill_at in (4, 10):
    killed = subprocess.run([sys.executable, "-c", KILLED, *CMD[1:], "--workdir", workdir],
                            env=dict(env, KILL_AT=str(kill_at)), cwd=ROOT,
                            capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  resumed = subprocess.run(CMD + ["--workdir", workdir], env=env, capture_output=True,
                           text=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  elapsed = time.time() - t0
  assert re.search(r"^goodput: [\d.]+% of this session's", resumed.stdout, re.M), resumed.stdout
  shown = subprocess.run([sys.executable, "-m", "tst_jax.tools.goodput", workdir], env=env,
                         capture_output=True, text=True)
  assert shown.returncode == 0, shown.stderr
  print(f"{shown.stdout}\nthe three processes took {elapsed:.1f} s")
  rows = _table(shown.stdout)
  wall = rows.pop("wall time")
  assert sum(rows.values()) == pytest.approx(wall, rel=0.02)
  assert elapsed - 10 <= wall <= elapsed      # the processes' last teardown is not recorded
  run = goodput.read_account(RunDir(workdir))
  assert [(s.first_step, s.last_step, s.ended) for s in run.sessions] == [
      (0, 4, None), (2, 9, None), (8, 12, "finished")]
  assert run.retrained == 3 and run.seconds["lost"] > 0 and run.seconds["down"] > 0
  assert [s.seconds["lost"] > 0 for s in run.sessions] == [True, True, False]
  for s in run.sessions:
    assert s.seconds["compile"] > 0 and s.seconds["step"] > 0 and s.seconds["startup"] > 0
  assert [s.seconds["checkpoint_restore"] > 0 for s in run.sessions] == [False, True, True]
