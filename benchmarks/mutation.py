"""Scores tests by the mutants of a module they kill: python benchmarks/mutation.py MODULE=TESTS ...

Each argument names a module's file and the test files that check it, comma-separated, e.g.
`tst_jax/losses.py=tests/test_losses.py,tests/test_z_loss.py`. A mutant is the module with one
small change to its syntax tree: an arithmetic operator swapped (+ -, * /, // *, % //, ** *), a
comparison turned (< <=, == !=, is, in), `and` for `or`, a `not` or the minus of an expression
dropped, True for False, a number n made n + 1. Docstrings, other strings, annotations and
lines marked `# pragma: no mutate` are left alone. A mutant is killed when its module's tests
fail or run past --timeout; it survives when they pass. The tests that killed earlier mutants
run first, and the first failure ends the run (`-x`).

Each mutant runs in a child forked from one process that has already imported jax, torch and
pytest, and is given to pytest in memory by an import hook: the file on disk is never changed,
so the work tree stays as it is, whatever stops the run. A test that starts a new Python
process runs the module as it is on disk; give only tests that check the module in-process.
The mutants run one at a time. The first line of each module is its tests' run unmutated,
which must pass. --list prints the mutants without running them; --only runs some by number.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
           ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
           ast.In: ast.NotIn, ast.NotIn: ast.In}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}
# Imported once, before the first fork, so that no mutant pays for them; none imports tst_jax.
PRELOAD = ("numpy", "jax", "jax.numpy", "flax.nnx", "optax", "torch", "hypothesis", "pytest",
           "ml_collections")
KILLERS_FIRST = 8    # how many of the tests that killed earlier mutants run first
PYTEST_ARGS = ["-x", "-q", "--no-header", "-p", "no:cacheprovider", "-o", "addopts=",
               "-m", "not slow", "--hypothesis-seed=0"]


@dataclasses.dataclass(frozen=True)
class Mutant:
  """One change, number `index` of its module's (what --only takes), shown as `before` ->
  `after` at `line`."""
  path: str
  index: int
  line: int
  before: str
  after: str


def _skipped(tree: ast.Module, source: str) -> set[int]:
  """Returns the ids of the nodes never mutated: docstrings, annotations and what lies under
  them, and the nodes of lines marked `# pragma: no mutate`."""
  skip = set()
  marked = {n for n, text in enumerate(source.splitlines(), 1) if "pragma: no mutate" in text}

  def under(node):
    if node is not None:
      skip.update(id(n) for n in ast.walk(node))

  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        under(body[0])
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      under(node.returns)
    elif isinstance(node, ast.arg):
      under(node.annotation)
    elif isinstance(node, ast.AnnAssign):
      under(node.annotation)
    elif isinstance(node, ast.ImportFrom):
      under(node)
    if getattr(node, "lineno", None) in marked:
      skip.add(id(node))
  return skip


def _changes(node: ast.AST):
  """Yields, for each mutation of `node` itself (its children untouched), a function that
  makes it in place."""
  def set_op(new):
    return lambda n: setattr(n, "op", new())

  if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINARY:
    yield set_op(BINARY[type(node.op)])
  elif isinstance(node, ast.BoolOp):
    yield set_op(BOOLEAN[type(node.op)])
  elif isinstance(node, ast.Compare):
    for k, op in enumerate(node.ops):
      if type(op) in COMPARE:
        yield lambda n, k=k: n.ops.__setitem__(k, COMPARE[type(n.ops[k])]())
  elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
    yield lambda n: setattr(n, "value", not n.value)
  elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
    yield lambda n: setattr(n, "value", n.value + 1)


def _unary_drops(tree: ast.AST, skip: set[int]):
  """Yields (parent, field, position) of each `not x` or `-x` that dropping its operator
  mutates: the parent's `field` (at `position` in a list) holds the UnaryOp. A negative number
  is left to the number's mutation (-1 becomes -2): `axis=1` for `axis=-1` on the 2-D arrays
  these modules handle is the same program."""
  for parent in ast.walk(tree):
    for field, value in ast.iter_fields(parent):
      for position, child in (enumerate(value) if isinstance(value, list) else [(None, value)]):
        if (isinstance(child, ast.UnaryOp) and isinstance(child.op, (ast.Not, ast.USub))
            and not isinstance(child.operand, ast.Constant) and id(child) not in skip):
          yield parent, field, position


def _replace_child(parent, field, position, new):
  if position is None:
    setattr(parent, field, new)
  else:
    getattr(parent, field)[position] = new


def mutants(path: str) -> list[tuple[Mutant, ast.Module]]:
  """Returns every mutant of the module at `path` with its changed syntax tree."""
  source = open(os.path.join(ROOT, path), encoding="utf-8").read()
  tree = ast.parse(source, path)
  skip = _skipped(tree, source)
  nodes = list(ast.walk(tree))
  found = []

  def make(index, change):
    """Adds the mutant that `change(node)` makes of the `index`-th node of a copy of the tree;
    `change` returns the changed node's source before and after, and its line."""
    copied = copy.deepcopy(tree)
    line, before, after = change(list(ast.walk(copied))[index])
    ast.fix_missing_locations(copied)
    found.append((Mutant(path, len(found), line, before, after), copied))

  for index, node in enumerate(nodes):
    if id(node) in skip or not hasattr(node, "lineno"):
      continue
    for change in _changes(node):
      def in_place(n, change=change):
        before = ast.unparse(n)
        change(n)
        return n.lineno, before, ast.unparse(n)
      make(index, in_place)
  for parent, field, position in list(_unary_drops(tree, skip)):
    def drop(n, field=field, position=position):
      child = getattr(n, field)[position] if position is not None else getattr(n, field)
      _replace_child(n, field, position, child.operand)
      return child.lineno, ast.unparse(child), ast.unparse(child.operand)
    make(next(i for i, n in enumerate(nodes) if n is parent), drop)
  return found


class _Loader(importlib.abc.Loader):
  """Loads one module from a syntax tree instead of its file."""

  def __init__(self, tree: ast.Module, path: str):
    self.tree, self.path = tree, path

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    exec(compile(self.tree, self.path, "exec"), module.__dict__)   # pylint: disable=exec-used


class _Finder(importlib.abc.MetaPathFinder):
  """Finds module `name` as the mutant's tree, every other module as usual."""

  def __init__(self, name: str, tree: ast.Module, path: str):
    self.name, self.tree, self.path = name, tree, path

  def find_spec(self, fullname, target=None, path=None):
    del target, path
    if fullname != self.name:
      return None
    spec = importlib.util.spec_from_file_location(
        fullname, self.path, loader=_Loader(self.tree, self.path),
        submodule_search_locations=None)
    return spec


def _module_name(path: str) -> str:
  return os.path.splitext(path)[0].replace(os.sep, ".").replace("/", ".")


def _run_tests(path: str, tree: ast.Module | None, tests: list[str], timeout: float,
               log: str) -> tuple[str, float]:
  """Runs `tests` in a forked child with the module at `path` loaded from `tree` (None: as it
  is on disk); returns 'passed', 'failed' or 'timeout', and the seconds it took."""
  start = time.monotonic()
  pid = os.fork()
  if pid == 0:    # the child: never returns
    code = 3
    try:
      os.setpgid(0, 0)
      fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
      os.dup2(fd, 1)
      os.dup2(fd, 2)
      if tree is not None:
        sys.meta_path.insert(0, _Finder(_module_name(path), tree, os.path.join(ROOT, path)))
      import pytest   # pylint: disable=import-outside-toplevel
      code = pytest.main([*PYTEST_ARGS, *tests])
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(int(code))   # pylint: disable=protected-access
  try:
    os.setpgid(pid, pid)   # as the child does: whichever runs first, killpg finds the group
  except OSError:
    pass
  try:
    while time.monotonic() - start < timeout:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        pid = None
        return ("passed" if os.waitstatus_to_exitcode(status) == 0 else "failed",
                time.monotonic() - start)
      time.sleep(0.05)
    return "timeout", time.monotonic() - start
  finally:     # past the timeout, or this process stopped: the child's tests stop too
    if pid is not None:
      os.killpg(pid, signal.SIGKILL)
      os.waitpid(pid, 0)


def _failed_test(log: str) -> str | None:
  """Returns the id of the test that failed first in a pytest log of `-x -q`, if a test did
  (not the import of a test file)."""
  with open(log, encoding="utf-8", errors="replace") as f:
    for line in f:
      if line.startswith(("FAILED ", "ERROR ")) and "::" in line:   # a test, not a file
        return line.split()[1]
  return None


def _verdict(path, tree, tests, killers, timeout, log) -> tuple[str, float]:
  """Runs the tests that killed earlier mutants first, most kills first (a mutant is most often
  killed by the test that killed its neighbours), then, where they pass, every test of the
  module; returns 'survived', 'killed' or 'killed (timeout)', and the seconds it took."""
  seconds = 0.0
  first = sorted(killers, key=killers.get, reverse=True)[:KILLERS_FIRST]
  for selection in ([first] if first else []) + [tests]:
    status, took = _run_tests(path, tree, selection, timeout - seconds, log)
    seconds += took
    if status != "passed":
      killer = _failed_test(log)
      if killer is not None:
        killers[killer] = killers.get(killer, 0) + 1
      return "killed" + (" (timeout)" if status == "timeout" else ""), seconds
  return "survived", seconds


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("targets", nargs="+", metavar="MODULE=TESTS",
                      help="a module's file and its test files, comma-separated")
  parser.add_argument("--timeout", type=float, default=300.0,
                      help="seconds one mutant's tests may run; past it the mutant is killed")
  parser.add_argument("--only", default="", help="run only these mutants: MODULE:N,N,...")
  parser.add_argument("--list", action="store_true", help="print the mutants and stop")
  parser.add_argument("--json", default="", help="also write every mutant's result here")
  args = parser.parse_args(argv)
  os.chdir(ROOT)
  sys.path.insert(0, ROOT)
  only_path, _, only = args.only.partition(":")
  chosen = {int(n) for n in only.split(",") if n}
  targets = []
  for target in args.targets:
    path, _, tests = target.partition("=")
    if not tests:
      parser.error(f"{target}: expected MODULE=TEST[,TEST...]")
    targets.append((path, tests.split(",")))
  if args.list:
    for path, _ in targets:
      for m, _ in mutants(path):
        print(f"{path}:{m.index} line {m.line}: {m.before}  ->  {m.after}")
    return 0
  import tests.conftest   # pylint: disable=import-outside-toplevel,unused-import
  for name in PRELOAD:     # the tests' environment first (XLA_FLAGS, JAX_PLATFORMS), then these
    __import__(name)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stops the child's tests too
  results, logs = [], tempfile.mkdtemp(prefix="tst_jax_mutation_")
  for path, tests in targets:
    if only_path and path != only_path:
      continue
    killers = {}
    status, seconds = _run_tests(path, None, tests, args.timeout, os.path.join(logs, "base"))
    print(f"{path}: its tests unmutated {status} in {seconds:.0f} s", flush=True)
    if status != "passed":
      print(open(os.path.join(logs, "base"), encoding="utf-8").read()[-3000:])
      return 1
    for m, tree in mutants(path):
      if chosen and m.index not in chosen:
        continue
      log = os.path.join(logs, f"{_module_name(path)}.{m.index}")
      verdict, seconds = _verdict(path, tree, tests, killers, args.timeout, log)
      results.append(dict(dataclasses.asdict(m), verdict=verdict, seconds=round(seconds, 1)))
      print(f"{verdict:17s} {path}:{m.index} line {m.line}: {m.before}  ->  {m.after}  "
            f"({seconds:.0f} s)", flush=True)
  killed = sum(r["verdict"] != "survived" for r in results)
  share = 100 * killed / max(len(results), 1)
  print(f"{killed} of {len(results)} mutants killed ({share:.1f}%); test logs in {logs}")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(dict(killed=killed, mutants=len(results), results=results), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
