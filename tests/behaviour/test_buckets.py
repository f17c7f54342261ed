"""A run with its workdir in a bucket of the GCS emulator (tests/fixtures/buckets.py), end to
end through main.py: killed between checkpoints and resumed, it logs the losses of the same run
on the local disk; a second run on its live workdir and a bucket that does not exist each stop
with one error line."""

import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import jax
import numpy as np
import pytest
from flax import nnx

from tests.fixtures import buckets, events, sigkill, subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import errors, fileio
from tst_jax.data import prepare as prepare_lib, run_data
from tst_jax.data.store import TokenStore
from tst_jax.rundir import RunDir
from tst_jax.tools import export
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax.train import trained_run
from tst_jax.train import checkpoint
from tst_jax.run import workdir as workdir_lib

CMD = [sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG]
LIBRARY_LINE = re.compile(r"^[IWEF]\d{4} ", re.M)   # absl's and glog's, C++ or Python
KILL_AT = 9   # after checkpoint 8 is complete, before checkpoint 10: in phase 2 of 6 + 6 steps

# main.py with a SIGKILL at step KILL_AT, once the checkpoint before it is complete.
KILLED = sigkill.script(KILL_AT)


def _env() -> dict:
  """Returns main.py's environment, with the emulator's variables the fixture has set."""
  return subprocess_env.one_cpu_device()


def _store(folder: str) -> str:
  """Prepares the tiny run's token store into `folder`, on the disk or in a bucket."""
  data = spec_lib.check(tiny_config()).data
  prepare_lib.prepare(out=str(folder), workers=1, progress=False,
                      **run_data.store_request(data, 512))
  return str(folder)


def _logged(workdir) -> dict:
  """Returns {(step, kind): loss} of every train and eval line of metrics.jsonl."""
  lines = workdir_lib.read_metrics(RunDir(workdir))
  logged = {(r["step"], k): r[k] for r in lines for k in ("loss", "eval_loss") if k in r}
  assert len(logged) == len(lines), "a step logged twice"
  return logged


def _run_beside_one_killed(reference_args: list[str], killed_args: list[str], env: dict):
  """Runs main.py with `reference_args` to its end and, at once, with `killed_args` killed at
  step KILL_AT, whose workdir is the last argument. The killed run's record is whole: every
  line up to its last checkpoint, none after, and its lock is left behind."""
  remote = killed_args[-1]
  reference = subprocess.Popen(CMD + reference_args, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
  killed = subprocess.run([sys.executable, "-c", KILLED, *CMD[1:], *killed_args], env=env,
                          cwd=ROOT, capture_output=True, text=True)
  assert reference.wait() == 0, reference.stdout.read()[-3000:]
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert max(step for step, _ in _logged(remote)) == KILL_AT - 1
  assert workdir_lib.checkpoint_steps(RunDir(remote))[-1] == KILL_AT - 1
  assert fileio.exists(RunDir(remote).lock)


@pytest.mark.slow
def test_a_run_in_a_bucket_killed_and_resumed_logs_the_losses_of_the_local_run(bucket,
                                                                               tmp_path):
  """The same run, one with its store and workdir on the local disk and one with both in the
  bucket, started at once. The bucket's run is killed at step 9, between checkpoints 8 and 10,
  and run again: it takes over the dead run's lock and ends with every loss of the local run,
  bit for bit."""
  on_disk, in_bucket = _store(tmp_path / "store"), _store(fileio.join(bucket, "store"))
  assert TokenStore(in_bucket).fingerprint == TokenStore(on_disk).fingerprint
  source = [f"--config.data.source=tokens:{in_bucket}"]
  local, remote = str(tmp_path / "local"), fileio.join(bucket, "run")
  env = _env()
  _run_beside_one_killed([f"--config.data.source=tokens:{on_disk}", "--workdir", local],
                         [*source, "--workdir", remote], env)

  resumed = subprocess.run(CMD + source + ["--workdir", remote], env=env,
                           capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  # A run that is fine prints no library log line: TensorStore's credentials line and Orbax's
  # warnings go to the log (checkpoint.quiet_storage).
  assert not LIBRARY_LINE.search(resumed.stderr), resumed.stderr[-3000:]
  assert (f"taking over {RunDir(remote).lock} from a dead run: pid" in resumed.stdout
          and "its process has ended" in resumed.stdout), resumed.stdout
  assert f"resuming {remote} at step {KILL_AT - 1} of 12" in resumed.stdout
  assert _logged(remote) == _logged(local)
  assert sorted(s for s, kind in _logged(remote) if kind == "loss") == list(range(1, 13))
  run, names = RunDir(remote), fileio.listdir(remote)
  for path in (run.config, run.plan, run.store, run.summary, run.loss_plot, run.checkpoints,
               run.tensorboard, run.tokenizer_json):
    assert fileio.basename(path) in names, names
  assert fileio.basename(run.lock) not in names
  assert workdir_lib.read_summary(run) == {
      **workdir_lib.read_summary(RunDir(local)), "seconds_this_session":
      workdir_lib.read_summary(run)["seconds_this_session"]}
  # TensorBoard: the killed session's events up to its last checkpoint, then the resumed one's.
  assert events.steps(run.tensorboard, "loss", shown=False) == list(range(1, 13))
  # Read back as export, eval and sample read a run: the same weights as the local run's.
  there, here = trained_run.load(RunDir(remote)), trained_run.load(RunDir(local))
  assert there.step == here.step == 12
  assert there.tokenizer.fingerprint() == here.tokenizer.fingerprint()
  for a, b in zip(*(jax.tree.leaves(nnx.state(t.model)) for t in (there, here))):
    np.testing.assert_array_equal(a, b)
  for workdir, out in ((remote, "hf_there"), (local, "hf_here")):
    export.export(workdir, tmp_path / out)
  assert {f.name: f.read_bytes() for f in (tmp_path / "hf_there").iterdir()} == {
      f.name: f.read_bytes() for f in (tmp_path / "hf_here").iterdir()}
  # Orbax marks a checkpoint complete with its commit file on a disk too, so a run trained
  # on disk and copied into a bucket keeps its checkpoints there.
  copied = RunDir(fileio.join(bucket, "copied"))
  fs, at = fileio.filesystem(copied.checkpoints)
  fs.put(RunDir(local).checkpoints, at, recursive=True)
  assert workdir_lib.checkpoint_steps(copied) == workdir_lib.checkpoint_steps(
      RunDir(local)) == [6, 8, 10, 12]


def test_a_run_in_s3_killed_and_resumed_logs_the_losses_of_the_local_run(s3_bucket, tmp_path,
                                                                          monkeypatch):
  """The same run, on the local disk and with its workdir in moto's S3, started at once. The
  S3 run is killed at step 9, between checkpoints 8 and 10, and run again on a machine whose
  disk holds nothing of it (another cache): it downloads checkpoint 8, takes over the dead
  run's lock and ends with every loss of the local run, bit for bit. A second run on its live
  workdir stops with one line."""
  store = _store(tmp_path / "store")
  source = [f"--config.data.source=tokens:{store}"]
  local, remote = str(tmp_path / "local"), fileio.join(s3_bucket, "run")
  env = _env() | dict(XDG_CACHE_HOME=str(tmp_path / "cache-killed"))
  _run_beside_one_killed([*source, "--workdir", local], [*source, "--workdir", remote], env)

  # Resumed, it stops at step PAUSE_AT until the second run was refused.
  paused, go = tmp_path / "paused", tmp_path / "go"
  env |= dict(XDG_CACHE_HOME=str(tmp_path / "cache-resumed"), PAUSED=str(paused), GO=str(go))
  resumed = subprocess.Popen([sys.executable, "-c", PAUSED, *CMD[1:], *source, "--workdir",
                              remote], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while not paused.exists():
    assert resumed.poll() is None and time.monotonic() < deadline, resumed.communicate()
    time.sleep(0.1)
  second = subprocess.run(CMD + source + ["--workdir", remote], env=env, capture_output=True,
                          text=True)
  go.touch()
  stdout, stderr = resumed.communicate()
  assert resumed.returncode == 0, stderr[-3000:]
  assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr[-3000:]
  assert second.stderr.startswith(f"error: --workdir {remote}: a live run holds it: pid "
                                  f"{resumed.pid} on host "), second.stderr
  assert not LIBRARY_LINE.search(stderr), stderr[-3000:]
  assert (f"taking over {RunDir(remote).lock} from a dead run: pid" in stdout
          and f"resuming {remote} at step {KILL_AT - 1} of 12" in stdout), stdout
  assert _logged(remote) == _logged(local)
  assert sorted(s for s, kind in _logged(remote) if kind == "loss") == list(range(1, 13))
  assert workdir_lib.checkpoint_steps(RunDir(remote)) == workdir_lib.checkpoint_steps(
      RunDir(local)) == [6, 8, 10, 12]
  assert fileio.basename(RunDir(remote).lock) not in fileio.listdir(remote)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-read"))
  there, here = trained_run.load(RunDir(remote)), trained_run.load(RunDir(local))
  assert there.step == here.step == 12
  for a, b in zip(*(jax.tree.leaves(nnx.state(t.model)) for t in (there, here))):
    np.testing.assert_array_equal(a, b)


# The bucket stops answering before step PAUSE_AT is saved, once checkpoint PAUSE_AT - 1 is
# complete: in phase 2 of 6 + 6 steps.
PAUSE_AT = 9
# main.py that writes the file $PAUSED there and goes on once the file $GO exists.
PAUSED = (
    "import os, runpy, sys, time\n"
    "from tst_jax.train import checkpoint\n"
    "real = checkpoint.RunCheckpoints.save_step\n"
    "def save_step(self, state, step, **kw):\n"
    f"  if step == {PAUSE_AT}:\n"
    "    self.wait()\n"
    "    open(os.environ['PAUSED'], 'w').close()\n"
    "    while not os.path.exists(os.environ['GO']):\n"
    "      time.sleep(0.05)\n"
    "  return real(self, state, step, **kw)\n"
    "checkpoint.RunCheckpoints.save_step = save_step\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.slow
def test_a_run_whose_bucket_stops_answering_for_seconds_waits_and_goes_on(
    gcs_server, bucket, tmp_path, monkeypatch, caplog):
  """The bucket stops answering for 3 s: the retries of gcsfs and TensorStore wait, and the
  run goes on to log the losses of the same run on the local disk, bit for bit."""
  caplog.set_level(logging.DEBUG, logger="gcsfs")
  config = tiny_config(data=dict(source=f"tokens:{_store(tmp_path / 'store')}"))
  local, remote = str(tmp_path / "local"), fileio.join(bucket, "run")
  cli.run(config, local)
  real = checkpoint.RunCheckpoints.save_step

  def save_step(self, state, step, **kw):
    if step == PAUSE_AT:
      self.wait()
      gcs_server.stop()
      threading.Timer(3.0, gcs_server.start).start()
    return real(self, state, step, **kw)

  monkeypatch.setattr(checkpoint.RunCheckpoints, "save_step", save_step)
  cli.run(config, remote)
  assert any("retrying after exception: Cannot connect" in r.getMessage()
             for r in caplog.records), "no request met the outage"
  assert _logged(remote) == _logged(local)
  assert sorted(s for s, kind in _logged(remote) if kind == "loss") == list(range(1, 13))


@pytest.mark.slow
def test_a_run_whose_bucket_stops_answering_stops_with_one_line_and_resumes_bit_for_bit(
    gcs_emulator, tmp_path, monkeypatch):
  """The bucket of a main.py run stops answering until the run gives up, when gcsfs's retries
  end (about 35 s): it stops with one line that names checkpoint 8 and asks nothing more of
  the bucket. Once the bucket is back, the same command resumes from checkpoint 8 and ends
  with the losses of the same run on the local disk, bit for bit, started beside it."""
  store = _store(tmp_path / "store")
  emulator = buckets.Emulator(tmp_path / "gcs")    # this run's own, to stop and start again
  emulator.start()
  try:
    for name, value in emulator.env().items():   # this test's reads too
      monkeypatch.setenv(name, value)
    remote = fileio.join(buckets.make_bucket(emulator.url, "outage"), "run")
    env = _env() | dict(PAUSED=str(tmp_path / "paused"), GO=str(tmp_path / "go"))
    args = [f"--config.data.source=tokens:{store}", "--workdir"]
    local = subprocess.Popen(CMD + args + [str(tmp_path / "local")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = subprocess.Popen([sys.executable, "-c", PAUSED, *CMD[1:], *args, remote], env=env,
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (tmp_path / "paused").exists():
      assert run.poll() is None, run.communicate()
      time.sleep(0.05)
    emulator.stop()
    (tmp_path / "go").touch()
    _, err = run.communicate(timeout=300)
    emulator.start()
    assert local.wait(timeout=300) == 0, local.stdout.read()[-3000:]
    assert run.returncode == 2, err[-3000:]
    assert err.splitlines() == [err.strip()] and err.startswith("error: "), err[-3000:]
    assert (f"step {PAUSE_AT - 1} in {remote}/checkpoints is the last complete checkpoint: "
            "run the same command again to resume from it") in err, err
    assert workdir_lib.checkpoint_steps(RunDir(remote))[-1] == PAUSE_AT - 1
    resumed = subprocess.run(CMD + args + [remote], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {remote} at step {PAUSE_AT - 1} of 12" in resumed.stdout
    assert _logged(remote) == _logged(str(tmp_path / "local"))
    assert sorted(s for s, kind in _logged(remote) if kind == "loss") == list(range(1, 13))
  finally:
    emulator.stop()


def test_a_workdir_in_a_bucket_that_does_not_exist_is_one_line_before_anything_compiles(
    gcs_emulator, monkeypatch):
  monkeypatch.setattr(cli.Setup, "create", lambda *a, **k: pytest.fail("went on"))
  with pytest.raises(fileio.PathError) as e:
    cli.run(tiny_config(), "gs://no-such-bucket-here/run")
  assert errors.one_line(e.value) == (
      "error: --workdir gs://no-such-bucket-here/run cannot be written: no such bucket or "
      "folder")


def test_a_workdir_in_a_bucket_gcs_would_not_name_is_one_line_before_anything_compiles(
    gcs_emulator, monkeypatch):
  """The emulator makes a bucket of any name, GCS does not: TensorStore refused "b1" at the
  first checkpoint, after the run had written its record there."""
  buckets.make_bucket(gcs_emulator, "b1")
  monkeypatch.setattr(cli.Setup, "create", lambda *a, **k: pytest.fail("went on"))
  with pytest.raises(fileio.PathError) as e:
    cli.run(tiny_config(), "gs://b1/run")
  assert errors.one_line(e.value).startswith(
      "error: --workdir gs://b1/run: 'b1' is not a GCS bucket name: 3 to 63 lowercase letters")
  with urllib.request.urlopen(f"{gcs_emulator}/storage/v1/b/b1/o") as listing:
    assert "items" not in json.loads(listing.read())


@pytest.mark.parametrize("workdir", ["memory://run", "gcs://bucket/run", "hf://me/run"])
def test_a_workdir_in_a_store_other_than_gs_or_s3_is_one_line(workdir, monkeypatch):
  """A workdir's lock needs a store's conditional writes, which gs:// and s3:// have."""
  monkeypatch.setattr(cli.Setup, "create", lambda *a, **k: pytest.fail("went on"))
  with pytest.raises(fileio.PathError) as e:
    cli.run(tiny_config(), workdir)
  scheme = workdir.split("://")[0]
  assert errors.one_line(e.value) == (
      f"error: --workdir {workdir}: a run's workdir is a local folder, gs:// or s3://; "
      f"{scheme}:// is not supported there")


# Each tool's output in a store it cannot write: (tool, its arguments, its one error line).
# Sweeps and ladders hold runs, so their workdir is refused as --workdir is; files written
# whole go to gs:// or s3://, never hf://.
REFUSED = [
    ("sweep", ["--config", TINY_CONFIG, "--workdir", "hf://b/sweep", "--grid", "tst.ratio=0.5"],
     "--workdir hf://b/sweep: a sweep's workdir is a local folder, gs:// or s3://; hf:// is "
     "not supported there"),
    ("ladder", ["--config", TINY_CONFIG, "--workdir", "memory://ladder"],
     "--workdir memory://ladder: a ladder's workdir is a local folder, gs:// or s3://; "
     "memory:// is not supported there"),
    ("compare", ["--runs", "/nonexistent/a", "--out", "hf://me/report"],
     "--out hf://me/report: the comparison's folder is a local folder, gs:// or s3://; hf:// "
     "is not supported there"),
    ("prepare", ["--source", "builtin:pystdlib", "--vocab_size", "512", "--out",
                 "hf://datasets/me/tok"],
     "--out hf://datasets/me/tok: a token store is a local folder, gs:// or s3://; hf:// is "
     "not supported there"),
    ("mutual_info", ["--data", "builtin:pystdlib", "--tokenizer", "bpe", "--max_bytes", "1",
                     "--out", "hf://me/mi.json"],
     "--out hf://me: the folder of --out is a local folder, gs:// or s3://; hf:// is not "
     "supported there")]


@pytest.mark.parametrize("tool,args,line", REFUSED, ids=[t for t, _, _ in REFUSED])
def test_an_output_in_a_store_it_cannot_write_is_one_line(tool, args, line, tmp_path,
                                                          monkeypatch, capsys):
  """Refused as --workdir is, before anything is read or written."""
  from tst_jax.analysis import mutual_info   # pylint: disable=import-outside-toplevel
  from tst_jax.tools import compare, ladder, sweep   # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  main = dict(sweep=sweep.main, ladder=ladder.main, compare=compare.main,
              mutual_info=mutual_info.main, prepare=prepare_lib.main)[tool]
  with pytest.raises(SystemExit) as e:
    errors.main(main, args)
  assert e.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
  assert os.listdir(tmp_path) == []


# Prints what etils.epath, under Orbax, does with a gs:// path: whether it would use
# tf.io.gfile, and the backend it picks, after `import tst_jax` where argv[1] says so.
EPATH_CHOICE = (
    "import os, sys\n"
    "if sys.argv[1] == 'tst_jax':\n"
    "  import tst_jax.train.checkpoint\n"
    "from etils.epath import backend, gpath\n"
    "path = gpath.PosixGPath('gs://bucket/run/checkpoints')\n"
    "print(gpath._is_tf_installed(),\n"
    "      'fsspec' if not gpath._is_tf_installed() and path._backend is backend.fsspec_backend\n"
    "      else 'tf' if gpath._is_tf_installed() else 'other')\n")


# Whether this environment has TensorFlow: the `seqio` extra brings it, [test] does not.
TF_INSTALLED = importlib.util.find_spec("tensorflow") is not None


@pytest.mark.parametrize("stand_in", [False, True], ids=["tf_as_installed", "a_tf_stand_in"])
def test_orbax_reaches_a_bucket_through_fsspec_whatever_is_installed(stand_in, tmp_path):
  """etils.epath picks fsspec, the client of every other file of the run, for gs:// once
  tst_jax is imported, with TensorFlow installed or not: TensorFlow as this environment has it,
  or a package named tensorflow on the path that stands in for it (etils only looks it up).
  Without tst_jax, TensorFlow is seen where it is there, and an EPATH_USE_TF the user set
  stands."""
  (tmp_path / "tensorflow").mkdir()
  (tmp_path / "tensorflow" / "__init__.py").write_text("")
  env = {k: v for k, v in os.environ.items() if k != "EPATH_USE_TF"}
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] * stand_in + [ROOT])
  tf_seen = ["True", "tf"] if stand_in or TF_INSTALLED else ["False", "fsspec"]

  def choice(*args, **extra):
    result = subprocess.run([sys.executable, "-c", EPATH_CHOICE, *args], env=env | extra,
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()

  assert choice("tst_jax") == ["False", "fsspec"]
  assert choice("alone") == tf_seen
  assert choice("tst_jax", EPATH_USE_TF="1") == tf_seen
