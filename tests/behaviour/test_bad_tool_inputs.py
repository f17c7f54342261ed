"""The sweep of bad inputs, generated from the list of commands: every module of tst_jax that
runs as `python -m` (the tools, prepare, mutual_info) gets a missing input, a corrupt input, an
output that cannot be written, and a gs:// path in a bucket that does not exist and in one whose
name GCS refuses, in each role the command has: what it reads and what it writes.

Each must be one `error:` line naming the path, exit status 2, and nothing written on the disk
or in the GCS emulator (tests/fixtures/buckets.py). The commands run in this process, through
errors.main(main, argv) as their `__main__` does; three run as `python -m`, for the line and the
status a user sees."""

import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import pkgutil
import subprocess
import sys
import urllib.request
import uuid
from typing import Callable

import pytest

import tst_jax
from tests.fixtures import subprocess_env
from tests.fixtures.corpus import bad_files
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tst_jax import errors, fileio

pytestmark = [pytest.mark.filterwarnings("error"),   # a library's warning is a line too many
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]


@dataclasses.dataclass(frozen=True)
class Command:
  """How a command is called: `argv(input, output)`, the kind of its input (a run's workdir, a
  config file or a data source) and of its output (a folder or file it writes, the run's own
  workdir, or none)."""
  argv: Callable[[str, str], list[str]]
  reads: str
  writes: str


SMALL_BPE = ["--vocab_size", "300", "--max_bytes", "2000"]
COMMANDS = {
    "tst_jax.tools.export": Command(lambda i, o: ["--workdir", i, "--out", o], "run", "folder"),
    "tst_jax.tools.eval": Command(lambda i, o: ["--workdir", i, "--tasks", "arc_easy",
                                                "--limit", "1"], "run", "the run"),
    "tst_jax.tools.sample": Command(lambda i, o: ["--workdir", i, "--max_new_tokens", "1"],
                                    "run", "none"),
    "tst_jax.tools.probe": Command(lambda i, o: ["--workdir", i, "--json", o], "run", "file"),
    "tst_jax.tools.goodput": Command(lambda i, o: [i], "run", "none"),
    "tst_jax.tools.compare": Command(lambda i, o: ["--runs", i, "--out", o], "run", "folder"),
    "tst_jax.tools.sweep": Command(lambda i, o: ["--config", i, "--workdir", o, "--grid",
                                                 "tst.ratio=0.5", "--dry_run"], "config",
                                   "folder"),
    "tst_jax.tools.ladder": Command(lambda i, o: ["--config", i, "--workdir", o, "--lengths",
                                                  "1k", "--plan_only"], "config", "folder"),
    "tst_jax.data.prepare": Command(lambda i, o: ["--source", i, "--out", o, "--workers", "1",
                                                  *SMALL_BPE], "source", "folder"),
    "tst_jax.analysis.mutual_info": Command(lambda i, o: ["--data", i, "--tokenizer", "bpe",
                                                          *SMALL_BPE, "--out", o], "source",
                                            "file"),
}
KINDS = ("missing input", "corrupt input", "unwritable output", "no bucket: input",
         "no bucket: output", "a bucket name GCS refuses: input",
         "a bucket name GCS refuses: output")


def runnable_modules() -> set[str]:
  """Every module of tst_jax that runs as `python -m`: a `__main__` block or a package's
  __main__.py."""
  found = set()
  for info in pkgutil.walk_packages(tst_jax.__path__, "tst_jax."):
    if info.name.endswith(".__main__"):
      found.add(info.name.removesuffix(".__main__"))
      continue
    path = importlib.util.find_spec(info.name).origin
    if path and path.endswith(".py") and 'if __name__ == "__main__":' in pathlib.Path(
        path).read_text():
      found.add(info.name)
  return found


def test_every_command_is_swept():
  assert runnable_modules() == set(COMMANDS)
  assert {name for name, _ in CASES} == set(COMMANDS) and {k for _, k in CASES} == set(KINDS)


def _inputs(tmp: pathlib.Path) -> dict:
  """Makes the bad inputs in `tmp`: by kind of input, a missing one, a corrupt one and a good
  one; a run whose results folder is a file; a file to put an output under."""
  corrupt_run = tmp / "corrupt_run"
  corrupt_run.mkdir(parents=True)
  for name in ("config.json", "plan.json", "metrics.jsonl", "goodput.jsonl"):
    (corrupt_run / name).write_text("{not json\n")
  (tmp / "corrupt.py").write_text("def get_config(:\n")
  (tmp / "a_file").write_text("x")
  unwritable_run = tmp / "run_with_a_file_for_results"
  unwritable_run.mkdir()
  (unwritable_run / "lm_eval").write_text("x")
  truncated = bad_files(tmp / "bad")["truncated.jsonl.gz"]
  return dict(
      missing=dict(run=str(tmp / "missing"), config=str(tmp / "missing.py"),
                   source=f"text:{tmp}/missing/*.txt"),
      corrupt=dict(run=str(corrupt_run), config=str(tmp / "corrupt.py"),
                   source=f"jsonl:{truncated}"),
      good=dict(run=str(tmp / "missing"), config=TINY_CONFIG, source="builtin:pystdlib"),
      under_a_file=str(tmp / "a_file" / "out"), unwritable_run=str(unwritable_run))


def _applies(command: Command, kind: str) -> bool:
  """Whether `command` has the role that `kind` makes bad: every command reads, but sample
  writes nothing, eval writes only into the run it reads, and a config file is local."""
  if kind == "unwritable output":
    return command.writes != "none"
  if kind.endswith(": input"):
    return command.reads != "config"
  if kind.endswith(": output"):
    return command.writes not in ("none", "the run")
  return True


def _case(command: Command, kind: str, given: dict) -> tuple[list[str], str]:
  """Returns the arguments of `kind` for `command`, a case that `_applies`, and the path its
  error line must name."""
  out = dict(folder=str(given["tmp"] / "out"), file=str(given["tmp"] / "out.json"))
  out = out.get(command.writes, str(given["tmp"] / "out"))
  buckets = {"no bucket": f"gs://no-such-{uuid.uuid4().hex[:12]}", "a bucket name GCS "
             "refuses": "gs://b1"}
  if kind in ("missing input", "corrupt input"):
    bad = given[kind.split()[0]][command.reads]
    return command.argv(bad, out), bad.partition(":")[2] if command.reads == "source" else bad
  if kind == "unwritable output":
    if command.writes == "the run":
      bad = given["unwritable_run"]
      return command.argv(bad, out), fileio.join(bad, "lm_eval")
    return command.argv(given["good"][command.reads], given["under_a_file"]), \
        given["under_a_file"]
  what, _, role = kind.partition(": ")
  bucket = buckets[what]
  if role == "input":
    bad = f"{bucket}/run" if command.reads == "run" else f"text:{bucket}/*.txt"
    return command.argv(bad, out), bad.removeprefix("text:")
  bad = f"{bucket}/out" + (".json" if command.writes == "file" else "")
  return command.argv(given["good"][command.reads], bad), bad


CASES = [(name, kind) for name in COMMANDS for kind in KINDS if _applies(COMMANDS[name], kind)]


def _tree(*folders) -> dict[str, str]:
  """{path: the sha256 of a file's bytes, or 'dir'} of everything under `folders`."""
  found = {}
  for folder in folders:
    for root, dirs, files in os.walk(folder):
      found.update({os.path.join(root, d): "dir" for d in dirs})
      found.update({os.path.join(root, f): hashlib.sha256(
          pathlib.Path(root, f).read_bytes()).hexdigest() for f in files})
  return found


def _buckets(emulator: str) -> dict[str, list[str]]:
  """{bucket: its object names} of everything in the emulator."""
  def get(path):
    with urllib.request.urlopen(f"{emulator}/storage/v1/{path}") as response:
      return json.loads(response.read())
  names = [b["name"] for b in get("b").get("items", [])]
  return {name: sorted(o["name"] for o in get(f"b/{name}/o").get("items", [])) for name in names}


@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n.split('.')[-1]}-{k}" for n, k in CASES])
def test_a_bad_input_is_one_line_naming_it_and_nothing_is_written(name, kind, tmp_path,
                                                                 gcs_emulator, monkeypatch,
                                                                 capsys):
  given = dict(_inputs(tmp_path / "given"), tmp=tmp_path / "work")
  if name.endswith(".eval"):
    pytest.importorskip("lm_eval")
  argv, named = _case(COMMANDS[name], kind, given)
  (tmp_path / "work").mkdir()
  monkeypatch.chdir(tmp_path / "work")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # prepare's work files
  main = importlib.import_module(name).main
  before, in_store = _tree(tmp_path), _buckets(gcs_emulator)
  with pytest.raises(SystemExit) as stop:
    errors.main(main, argv)
  out, err = capsys.readouterr()
  assert stop.value.code == 2, (argv, out, err)
  assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), (argv, err)
  assert named in err or fileio.dirname(named) in err, (named, err)
  assert not out, out
  assert _tree(tmp_path) == before and _buckets(gcs_emulator) == in_store


# Three cases as a user runs them: (module, kind), one of each tool family.
AS_A_USER = [("tst_jax.tools.export", "corrupt input"), ("tst_jax.data.prepare", "no bucket: output"),
             ("tst_jax.tools.sweep", "corrupt input")]


def test_python_m_prints_one_line_and_exits_2(tmp_path, gcs_emulator):
  given = dict(_inputs(tmp_path / "given"), tmp=tmp_path / "work")
  (tmp_path / "work").mkdir()
  env = subprocess_env.one_cpu_device() | dict(XDG_CACHE_HOME=str(tmp_path / "cache"))
  before = _tree(tmp_path)
  runs = []
  for name, kind in AS_A_USER:
    argv, named = _case(COMMANDS[name], kind, given)
    runs.append((named, subprocess.Popen(
        [sys.executable, "-m", name, *argv], cwd=tmp_path / "work", env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
  for named, run in runs:
    out, err = run.communicate(timeout=300)
    assert run.returncode == 2, (run.args, err[-3000:])
    assert err.startswith("error: ") and err.count("\n") == 1 and named in err, err[-3000:]
    assert not out, out
  assert _tree(tmp_path) == before
