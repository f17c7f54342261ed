"""benchmarks/mutation.py: the mutants it makes of a module (each operator of its list, nothing
in docstrings, strings, annotations or lines marked `# pragma: no mutate`), and the import
hook that gives a mutant to the tests in place of the module's file."""

import importlib
import importlib.util
import os
import sys

from tests.fixtures.paths import ROOT

# The script, imported as a module of its own name (its dataclass looks itself up there).
_SPEC = importlib.util.spec_from_file_location("benchmarks_mutation",
                                               os.path.join(ROOT, "benchmarks", "mutation.py"))
mutation = sys.modules.setdefault("benchmarks_mutation", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(mutation)

MODULE = '''"""A docstring with 1 + 2 in it."""


def f(x: int = 3, flag=True) -> int:
  """Returns a number."""
  if x < 2 and not flag:
    return -x
  label = "a" + "b"
  return x * 2  # pragma: no mutate
'''


def test_each_mutation_of_the_list_and_nothing_else(tmp_path, monkeypatch):
  (tmp_path / "toy.py").write_text(MODULE)
  monkeypatch.setattr(mutation, "ROOT", str(tmp_path))
  found = sorted((m.line, m.before, m.after) for m, _ in mutation.mutants("toy.py"))
  assert found == sorted([
      (4, "3", "4"), (4, "True", "False"),
      (6, "x < 2 and (not flag)", "x < 2 or not flag"), (6, "x < 2", "x <= 2"),
      (6, "2", "3"), (6, "not flag", "flag"), (7, "-x", "x"),
      (8, "'a' + 'b'", "'a' - 'b'")])
  assert [m.index for m, _ in mutation.mutants("toy.py")] == list(range(len(found)))


def test_the_import_hook_gives_the_mutant_in_place_of_the_file(tmp_path, monkeypatch):
  (tmp_path / "toy_hooked.py").write_text(MODULE)
  monkeypatch.setattr(mutation, "ROOT", str(tmp_path))
  monkeypatch.syspath_prepend(str(tmp_path))
  (negated,) = [t for m, t in mutation.mutants("toy_hooked.py") if m.before == "-x"]
  monkeypatch.setattr(sys, "meta_path", [mutation._Finder("toy_hooked", negated,
                                                          str(tmp_path / "toy_hooked.py")),
                                         *sys.meta_path])
  monkeypatch.delitem(sys.modules, "toy_hooked", raising=False)
  toy = importlib.import_module("toy_hooked")
  assert toy.f(1, flag=False) == 1 and toy.__file__ == str(tmp_path / "toy_hooked.py")
  assert (tmp_path / "toy_hooked.py").read_text() == MODULE       # the file is as it was
  sys.modules.pop("toy_hooked")
