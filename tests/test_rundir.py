"""A run's directory (tst_jax/rundir.py): its root fixed once, local or in the GCS emulator's
bucket, every path a named member under it, and the one check that a run can be written there,
with one set of messages."""

import ast
import os
import pathlib
import re
import uuid

import pytest

from tests.fixtures.paths import ROOT
from tst_jax import fileio
from tst_jax.rundir import RunDir

# Every member and the path under the root it names.
MEMBERS = {
    "config": "config.json", "plan": "plan.json", "metrics": "metrics.jsonl",
    "store": "store.json", "summary": "summary.json", "lock": "lock.json",
    "tracker": "tracker.json", "checkpoints": "checkpoints", "tensorboard": "tensorboard",
    "parts": ".parts", "loss_plot": "loss.png", "profile": "profile",
    "profile_table": "profile/step_profile.txt", "profile_json": "profile/step_profile.json",
    "tokenizer_json": "tokenizer.json", "tokenizer_model": "tokenizer.model",
    "lm_eval": "lm_eval", "data": "data", "sweep_point": "sweep_point.json",
    "sweep_log": "sweep_log.txt"}
METHODS = {("checkpoint", 12): "checkpoints/12", ("lm_eval_step", 8): "lm_eval/step_8.json",
           ("mixture_data", 1): "mixture/1/data", ("eval_set_data", "code"): "eval_sets/code/data"}


def _under(rundir: RunDir) -> dict:
  """Returns each member's path relative to the root, with '/' between its parts."""
  cut = len(rundir.root) + 1
  found = {name: getattr(rundir, name)[cut:] for name in MEMBERS}
  found.update({(name, arg): getattr(rundir, name)(arg)[cut:] for name, arg in METHODS})
  return {k: v.replace(os.sep, "/") for k, v in found.items()}


def test_a_local_root_is_made_absolute_once_with_home_expanded(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  for given, root in (("runs/a", tmp_path / "runs" / "a"), ("~/a", tmp_path / "home" / "a"),
                      (tmp_path / "b", tmp_path / "b"), (str(tmp_path / "c") + "/", tmp_path / "c")):
    rundir = RunDir(given)
    assert rundir.root == str(root) and not rundir.remote and str(rundir) == str(root)
    assert rundir.name == root.name
    assert _under(rundir) == {**MEMBERS, **METHODS}
    assert all(getattr(rundir, m).startswith(str(root) + os.sep) for m in MEMBERS)
  assert RunDir("runs/a") == RunDir(str(tmp_path / "runs" / "a"))   # one root, one RunDir
  with pytest.raises(AttributeError):
    RunDir("x").root = "y"       # frozen
  assert RunDir(tmp_path).trace_dir() == RunDir(tmp_path).profile


def test_a_bucket_root_is_kept_as_its_url(bucket):
  rundir = RunDir(f"{bucket}/run")
  assert rundir.root == f"{bucket}/run" and rundir.remote and rundir.name == "run"
  assert _under(rundir) == {**MEMBERS, **METHODS}
  assert rundir.metrics == f"{bucket}/run/metrics.jsonl"
  assert rundir.mixture_data(0) == f"{bucket}/run/mixture/0/data"
  traced = rundir.trace_dir()          # the profiler writes local files only
  assert not fileio.is_url(traced) and os.path.isdir(traced)
  os.rmdir(traced)
  fileio.write_json(rundir.config, dict(a=1))   # every member is a path fileio writes
  assert fileio.read_json(f"{bucket}/run/config.json") == dict(a=1)
  rundir.check_writable()
  assert fileio.listdir(rundir.root) == ["config.json"]   # the probe is gone


def test_check_writable_passes_a_new_folder_and_a_runs_own(tmp_path):
  RunDir(tmp_path / "new" / "deeper").check_writable()
  assert not (tmp_path / "new").exists()       # made later, once the config has passed
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.json").write_text("{}")
  RunDir(tmp_path / "run").check_writable()


def test_check_writable_says_each_fault_in_one_line(tmp_path):
  """A file in the workdir's place, a file above it, a store other than gs://, a bucket name
  GCS refuses: each one line naming --workdir, the path and what to do."""
  afile = tmp_path / "afile"
  afile.write_text("x")
  cases = {
      str(afile): f"--workdir {afile}: is a file, not a directory: give a new directory, or a "
                  "run's directory to resume it",
      str(afile / "run"): f"--workdir {afile / 'run'} cannot be written: {afile} is a file, "
                          "not a folder",
      "memory://run": "--workdir memory://run: a run's workdir is a local folder, gs:// or "
                      "s3://; memory:// is not supported there",
      "gs://b1/run": "--workdir gs://b1/run: 'b1' is not a GCS bucket name: 3 to 63 lowercase "
                     "letters, digits, '-' and '_' (or such parts joined by dots), starting and "
                     "ending with a letter or digit"}
  for root, line in cases.items():
    with pytest.raises(fileio.PathError, match=f"^{re.escape(line)}$"):
      RunDir(root).check_writable()
  assert afile.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_check_writable_refuses_a_folder_without_permission(tmp_path):
  (tmp_path / "closed").mkdir(mode=0o500)
  with pytest.raises(fileio.PathError, match=re.escape(
      f"--workdir {tmp_path / 'closed' / 'run'} cannot be written: permission denied")):
    RunDir(tmp_path / "closed" / "run").check_writable()


def test_check_writable_names_a_missing_bucket(gcs_emulator):
  missing = f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/run"
  with pytest.raises(fileio.PathError, match=f"^--workdir {missing} cannot be written: no such "
                     "bucket or folder$"):
    RunDir(missing).check_writable()


def test_the_tools_outputs_share_the_rule_and_its_messages(tmp_path):
  """fileio.check_output, the tools' check of an output folder, says the same of a file in
  its place, with the tool's own flag and what to do."""
  afile = tmp_path / "afile"
  afile.write_text("x")
  with pytest.raises(fileio.PathError, match=f"^--out {afile}: is a file, not a directory: "
                     "give a new directory$"):
    fileio.check_output(str(afile), "--out", "an export")


def test_the_data_layer_takes_a_store_folder_or_a_rundir_never_a_workdir_string():
  """No function of tst_jax/data/ has a parameter named `workdir`: below the run's record,
  code takes the folder it needs or a RunDir."""
  found = []
  for path in sorted(pathlib.Path(ROOT, "tst_jax", "data").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        if "workdir" in names:
          found.append(f"{path.name}:{node.lineno}")
  assert not found


def test_only_fileio_and_rundir_tell_a_local_path_from_a_url():
  """Every other module asks fileio for the operation, or a RunDir whether it is remote."""
  found = [f"{path.relative_to(ROOT)}:{number}"
           for path in sorted(pathlib.Path(ROOT, "tst_jax").rglob("*.py"))
           if path.parent.name != "fileio" and path.relative_to(ROOT).as_posix() != "tst_jax/rundir.py"
           for number, line in enumerate(path.read_text().splitlines(), 1) if "is_url(" in line]
  assert not found
