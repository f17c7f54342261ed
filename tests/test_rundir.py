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

# The methods' paths, at two arguments each: a path for each argument, as a member is one path.
CALLS = [("checkpoint", 8), ("checkpoint", 12), ("lm_eval_step", 8), ("lm_eval_step", 12),
         ("mixture_data", 0), ("mixture_data", 1), ("eval_set_data", "code"),
         ("eval_set_data", "web")]


def _members() -> list[str]:
  """Names every path member of RunDir, read from the class: its properties but `name`."""
  return [n for n, v in vars(RunDir).items() if isinstance(v, property) and n != "name"]


def _layout(rundir: RunDir) -> dict:
  """Returns {member or (method, arg): its path relative to the root, '/' between parts},
  once each path is checked to lie under the root."""
  paths = {n: getattr(rundir, n) for n in _members()}
  paths.update({(n, arg): getattr(rundir, n)(arg) for n, arg in CALLS})
  sep = "/" if rundir.remote else os.sep
  outside = [p for p in paths.values() if not p.startswith(rundir.root + sep)]
  assert not outside, outside
  return {k: p[len(rundir.root) + 1:].replace(os.sep, "/") for k, p in paths.items()}


def test_every_path_is_its_own_under_the_root_as_its_doc_says(tmp_path):
  """No two members or calls share a path; each member's doc (help(RunDir)) starts with its
  path; a method's folder is under the member of its kind, one folder per argument."""
  layout = _layout(RunDir(tmp_path))
  assert len(set(layout.values())) == len(layout) > 20
  for name in _members():
    assert getattr(RunDir, name).__doc__.startswith(f"{layout[name]}: "), name
  for method, member in (("checkpoint", "checkpoints"), ("lm_eval_step", "lm_eval")):
    assert all(layout[(method, arg)].startswith(layout[member] + "/")
               for m, arg in CALLS if m == method)
  assert layout[("checkpoint", 12)].rpartition("/")[2] == "12"   # Orbax's step folders
  assert not any(p.startswith(layout["data"] + "/") for p in layout.values())


def test_a_local_root_is_made_absolute_once_with_home_expanded(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  for given, root in (("runs/a", tmp_path / "runs" / "a"), ("~/a", tmp_path / "home" / "a"),
                      (tmp_path / "b", tmp_path / "b"), (str(tmp_path / "c") + "/", tmp_path / "c")):
    rundir = RunDir(given)
    assert rundir.root == str(root) and not rundir.remote and str(rundir) == str(root)
    assert rundir.name == root.name
    assert _layout(rundir) == _layout(RunDir(tmp_path / "b"))   # one layout, wherever
  assert RunDir("runs/a") == RunDir(str(tmp_path / "runs" / "a"))   # one root, one RunDir
  with pytest.raises(AttributeError):
    RunDir("x").root = "y"       # frozen
  assert RunDir(tmp_path).trace_dir() == RunDir(tmp_path).profile


def test_a_bucket_root_is_kept_as_its_url(bucket):
  rundir = RunDir(f"{bucket}/run")
  assert rundir.root == f"{bucket}/run" and rundir.remote and rundir.name == "run"
  local = RunDir("/tmp/run")
  assert _layout(rundir) == _layout(local)     # the local layout, under the URL
  assert rundir.metrics == f"{bucket}/run/" + local.metrics.removeprefix("/tmp/run/")
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
