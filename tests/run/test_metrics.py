"""The metrics sinks (tst_jax/run/metrics.py): metrics.jsonl and TensorBoard's event file,
written on the main thread on a disk and in the GCS emulator's bucket, whole at each `sync`
and after a failed upload."""

import logging
import threading

import pytest

from tests.fixtures import events
from tst_jax import fileio
from tst_jax.rundir import RunDir
from tst_jax.run import appending, metrics, workdir as workdir_lib

pytest.importorskip("tensorboardX")


def _workdir(where, tmp_path, request) -> str:
  """Returns a new workdir on the disk or in the bucket, as setup leaves it."""
  return {"local": lambda: str(tmp_path),
          "gs": lambda: fileio.join(request.getfixturevalue("bucket"), "run")}[where]()


def _record(step: int) -> dict:
  return dict(step=step, phase="tst", loss=10.0 - step, lr=1e-3)


def _steps_in(workdir: str) -> tuple[list[int], list[int]]:
  """Returns the steps of metrics.jsonl's lines and of the `loss` events TensorBoard shows."""
  return ([r["step"] for r in workdir_lib.read_metrics(RunDir(workdir))],
          events.steps(RunDir(workdir).tensorboard, "loss"))


@pytest.mark.parametrize("where", ["local", "gs"])
def test_sync_puts_every_line_and_event_written_so_far_in_the_files(where, tmp_path, request):
  """tensorboardX's own flush leaves events in its queue: `sync` must not, since a checkpoint
  follows it and a kill after the checkpoint would lose them."""
  workdir = _workdir(where, tmp_path, request)
  writer = metrics.MetricsWriter(RunDir(workdir), resume_step=0)
  for step in range(1, 9):
    writer.write(_record(step))
  writer.sync()
  assert _steps_in(workdir) == (list(range(1, 9)), list(range(1, 9)))
  lr = [e for e in events.events(RunDir(workdir).tensorboard)
        if e.summary.value and e.summary.value[0].tag == "lr"]
  assert [(e.step, e.summary.value[0].simple_value) for e in lr] == [
      (s, pytest.approx(1e-3)) for s in range(1, 9)]
  writer.close()


def test_a_failed_upload_is_kept_retried_and_reported_once_on_the_main_thread(
    bucket, monkeypatch, caplog):
  """Every write is due to upload and the store refuses them all: writes go on, each failure
  a warning, `sync` is one PathError naming the file, and once the store is back every line
  and event is in its file once. All uploads run on the thread that writes."""
  monkeypatch.setattr(appending, "APPEND_EVERY_S", 0.0)
  workdir, threads, real = fileio.join(bucket, "run"), set(), appending.append_object

  def refused(*args, **kwargs):
    threads.add(threading.current_thread())
    raise ConnectionError("the store is away")

  writer = metrics.MetricsWriter(RunDir(workdir), resume_step=0)
  monkeypatch.setattr(appending, "append_object", refused)
  with caplog.at_level(logging.WARNING, logger="tst_jax"):
    for step in range(1, 31):    # more events than tensorboardX's queue holds
      writer.write(_record(step))
  assert "an upload failed, tried again in 0 s and at the next flush" in caplog.text
  with pytest.raises(fileio.PathError, match=r"/run/metrics.jsonl cannot be appended to: the "
                     r"store cannot be reached \(ConnectionError: the store is away\)$"):
    writer.sync()
  monkeypatch.setattr(appending, "append_object", lambda *a, **k: threads.add(
      threading.current_thread()) or real(*a, **k))
  writer.write(_record(31))
  writer.sync()
  assert _steps_in(workdir) == (list(range(1, 32)), list(range(1, 32)))
  assert threads == {threading.main_thread()}
  writer.close()


@pytest.mark.parametrize("where", ["local", "gs"])
@pytest.mark.parametrize("checkpoint", [3, 0])
def test_a_resumed_run_hides_the_events_a_killed_one_logged_past_its_checkpoint(
    where, checkpoint, tmp_path, request):
  """The killed run synced steps 1-5 and its last checkpoint is `checkpoint`, 0 for none:
  the run started again logs the steps after it to 6. metrics.jsonl drops the killed run's
  lines past the checkpoint, and TensorBoard hides its events past it."""
  workdir = _workdir(where, tmp_path, request)
  killed = metrics.MetricsWriter(RunDir(workdir), resume_step=0)
  for step in range(1, 6):
    killed.write(_record(step))
  killed.sync()                    # then SIGKILL: never closed
  again = metrics.MetricsWriter(RunDir(workdir), resume_step=checkpoint)
  for step in range(checkpoint + 1, 7):
    again.write(_record(step))
  again.close()
  folder = RunDir(workdir).tensorboard
  assert events.steps(folder, "loss", shown=False) == [1, 2, 3, 4, 5,
                                                       *range(checkpoint + 1, 7)]
  assert _steps_in(workdir) == ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])


def test_parts_left_by_a_killed_run_are_in_a_folder_tensorboard_never_reads(bucket,
                                                                            monkeypatch):
  """A kill between a part's compose and its removal leaves the part: in <workdir>/.parts,
  named without "tfevents", so TensorBoard finds the run's one event file and no other."""
  workdir = fileio.join(bucket, "run")
  writer = metrics.MetricsWriter(RunDir(workdir), resume_step=0)
  writer.write(_record(1))
  writer.sync()                    # creates both objects: no part yet
  fs, root = fileio.filesystem(workdir)
  monkeypatch.setattr(fs, "rm_file", lambda path: None)
  writer.write(_record(2))
  writer.sync()                    # composes a part onto each
  monkeypatch.undo()
  (event_file,) = events.event_files(workdir)
  assert event_file.startswith(f"{root}/tensorboard/events.out.tfevents.")
  parts = [f for f in fs.find(root) if f not in (event_file, f"{root}/metrics.jsonl")]
  assert len(parts) == 2 and all(p.startswith(f"{root}/.parts/") for p in parts), parts
  assert _steps_in(workdir) == ([1, 2], [1, 2])
