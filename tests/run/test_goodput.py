"""The goodput ledger against the wall clock, and the account of a run's sessions against one
worked out by hand: steps trained again after a restart, and the time between sessions."""

import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tst_jax.errors import DataError, WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.run import goodput, workdir as workdir_lib


def test_the_categories_add_up_to_the_wall_time_and_a_compile_is_compile():
  ledger = goodput.Ledger(start=time.time() - 2.0)   # a process that started 2 s ago
  try:
    t0 = time.time()
    with ledger.timed("data"):
      time.sleep(0.05)
    in_data = time.time() - t0
    t0 = time.time()
    with ledger.timed("eval"):
      inner = jax.jit(lambda x: jnp.sin(x) * 3)
      outer = jax.jit(lambda x: inner(x) + jnp.cos(inner(x)))   # nested: traced inside
      outer(np.ones(41, np.float32)).block_until_ready()
      time.sleep(0.05)
    in_eval = time.time() - t0
    now, seconds = ledger.totals()
  finally:
    ledger.close()
  assert sum(seconds.values()) == pytest.approx(now - ledger.start, abs=1e-6)
  assert seconds["startup"] >= 2.0
  assert 0.05 <= seconds["data"] <= in_data
  assert seconds["compile"] > 0
  # Each second once: nested traces are not counted twice, and the eval keeps the rest.
  assert seconds["compile"] + seconds["eval"] == pytest.approx(in_eval, abs=0.01)
  assert seconds["eval"] >= 0.05


def test_a_closed_ledger_hears_no_compile():
  ledger = goodput.Ledger()
  ledger.close()
  jax.jit(lambda x: x * 7 + 2)(np.ones(43, np.float32)).block_until_ready()
  assert ledger.totals()[1]["compile"] == 0.0


def test_iterate_spends_each_wait_on_its_category_and_the_rest_where_it_was():
  waits, got = [], []

  def slow():
    for i in range(3):
      t0 = time.time()
      time.sleep(0.03)
      waits.append(time.time() - t0)
      yield i

  ledger = goodput.Ledger()
  ledger.switch("step")
  try:
    for item in ledger.iterate("data", slow()):
      got.append(item)
      time.sleep(0.02)
    now, seconds = ledger.totals()
  finally:
    ledger.close()
  assert got == [0, 1, 2]
  assert sum(waits) <= seconds["data"] and seconds["step"] >= 0.06
  assert seconds["data"] + seconds["step"] + seconds["startup"] == pytest.approx(
      now - ledger.start, abs=1e-6) and seconds["startup"] < sum(waits)


def _session(start: float, steps: list[tuple[int, float, float]], ended=None) -> list[dict]:
  """goodput.jsonl's lines of a session that started at `start`: (step, time, its step
  seconds) each, the rest of its time in startup; the last line ends it `ended`."""
  lines = []
  for step, now, step_s in steps:
    seconds = dict.fromkeys(goodput.CATEGORIES, 0.0)
    seconds.update(step=step_s, startup=now - start - step_s)
    lines.append(dict(session=start, kind="step", time=now, step=step, seconds=seconds))
  lines[0].update(kind="start", total_steps=12)
  if ended:
    lines[-1].update(kind="end", ended=ended)
  return lines


# Killed after step 9 with checkpoint 8, resumed at 8 and killed after 11 with checkpoint 10,
# resumed at 10 to the end.
SESSIONS = (_session(0.0, [(0, 5, 0), (4, 10, 4), (8, 20, 12), (9, 22, 13.5)])
            + _session(30.0, [(8, 35, 0), (10, 45, 6), (11, 48, 8)])
            + _session(50.0, [(10, 55, 0), (12, 70, 10)], ended="finished"))


def test_steps_past_the_checkpoint_a_later_session_resumed_from_are_lost():
  run = goodput.account(SESSIONS)
  assert [(s.first_step, s.last_step, s.ended) for s in run.sessions] == [
      (0, 9, None), (8, 11, None), (10, 12, "finished")]
  assert [s.seconds["lost"] for s in run.sessions] == [1.5, 2.0, 0.0]
  assert [s.seconds["step"] for s in run.sessions] == [12.0, 6.0, 10.0]
  assert run.seconds["lost"] == 3.5 and run.seconds["step"] == 28.0
  assert run.seconds["down"] == (30 - 22) + (50 - 48)
  assert run.retrained == 2          # steps 9 and 11
  assert run.wall == 70 and sum(run.seconds.values()) == pytest.approx(70)
  assert run.goodput == pytest.approx(28 / 70) and run.total_steps == 12


def test_a_session_resumed_before_an_earlier_ones_start_loses_all_its_steps():
  # The second session's checkpoint did not restore: the third resumed from step 2.
  lines = (_session(0.0, [(0, 1, 0), (2, 5, 3), (4, 10, 6)])
           + _session(20.0, [(4, 21, 0), (6, 30, 5)])
           + _session(40.0, [(2, 41, 0), (12, 60, 15)], ended="finished"))
  run = goodput.account(lines)
  assert [s.seconds["lost"] for s in run.sessions] == [3.0, 5.0, 0.0]
  assert sum(run.seconds.values()) == pytest.approx(run.wall)


def test_the_report_lists_every_part_and_each_session():
  text = goodput.report(goodput.account(SESSIONS), "/runs/a")
  assert text.splitlines()[0] == ("goodput of /runs/a: 40.0% of its 70.0 s of wall time was "
                                  "training steps, over 3 sessions")
  for label in goodput.LABELS.values():
    assert f"  {label} " in text
  assert re.search(r"\n  lost to restarts +3\.5 s +5\.0%  \(2 steps trained again\)\n", text)
  assert "no end record: killed, or still running" in text and text.endswith("12 of 12")


def test_a_session_log_reads_back_and_a_line_a_kill_cut_short_is_left_out(tmp_path):
  rundir = RunDir(str(tmp_path))
  for back, step in ((5.0, 0), (0.0, 2)):       # the first process started 5 s before
    ledger = goodput.Ledger(time.time() - back)
    session = goodput.SessionLog(ledger, rundir, step, 12)
    fields = session.interval(step + 1)
    session.sync(step + 2)
    session.close()
    ledger.close()
    assert set(fields) == {"goodput"} | {f"goodput/{k}_s" for k in goodput.CATEGORIES}
    with open(rundir.goodput, "a") as f:
      f.write('{"session": 1, "ki')                # killed in the middle of a line
  run = goodput.read_account(rundir)
  assert [(s.first_step, s.last_step) for s in run.sessions] == [(0, 2), (2, 4)]
  assert sum(run.seconds.values()) == pytest.approx(run.wall)
  assert run.seconds["lost"] == 0 and run.sessions[0].seconds["startup"] >= 5
  with open(rundir.goodput, "a") as f:
    f.write("\n" + json.dumps(SESSIONS[1]) + "\n")    # the cut line is now mid-session
  with pytest.raises(DataError, match=r"goodput.jsonl:\d+: cannot be read as JSON"):
    workdir_lib.read_goodput(rundir)


def test_a_folder_without_goodput_jsonl_is_one_error_naming_it(tmp_path):
  with pytest.raises(WorkdirError, match="goodput.jsonl: no such file"):
    workdir_lib.read_goodput(RunDir(str(tmp_path)))
  (tmp_path / "goodput.jsonl").write_text('{"step": 3}\n')
  with pytest.raises(DataError, match="not a record of goodput"):
    workdir_lib.read_goodput(RunDir(str(tmp_path)))
