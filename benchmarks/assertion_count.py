"""Counts the assertions of each test file, as JSON: python benchmarks/assertion_count.py [REV].

An assertion is an `assert` statement or a call of pytest.raises/warns/fail/approx, of numpy's
assert_* (assert_allclose, assert_array_equal, ...) or of any other callable whose name starts
with `assert` (mock's assert_called_once, a test's own _assert helper is counted where called).
With REV, the files are read from that git revision instead of the work tree."""

import ast
import json
import subprocess
import sys
from pathlib import Path

CALLS = {"raises", "warns", "fail", "approx", "deprecated_call"}


def _name(func: ast.AST) -> str:
  if isinstance(func, ast.Attribute):
    return func.attr
  return func.id if isinstance(func, ast.Name) else ""


def count(source: str) -> int:
  """Returns the number of assert statements and assertion calls in one file's source."""
  n = 0
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Assert):
      n += 1
    elif isinstance(node, ast.Call):
      name = _name(node.func).lstrip("_")
      n += name in CALLS or name.startswith("assert")
  return n


def _files(rev: str | None) -> dict[str, str]:
  if rev is None:
    return {str(p): p.read_text() for p in sorted(Path("tests").rglob("test_*.py"))}
  names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "tests"], check=True,
                         capture_output=True, text=True).stdout.split()
  return {p: subprocess.run(["git", "show", f"{rev}:{p}"], check=True, capture_output=True,
                            text=True).stdout
          for p in names if Path(p).name.startswith("test_") and p.endswith(".py")}


def main() -> None:
  rev = sys.argv[1] if len(sys.argv) > 1 else None
  per_file = {path: count(text) for path, text in _files(rev).items()}
  print(json.dumps({"rev": rev or "worktree", "total": sum(per_file.values()),
                    "files": per_file}, indent=1))


if __name__ == "__main__":
  main()
