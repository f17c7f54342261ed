"""Imports point down the layers (LAYERS here, docs/architecture.md's table): every tst_jax
import, at module level or inside a function, goes to its own layer or a lower one, and no
tst_jax module is imported inside a function (that hides a cycle: the code is in the wrong place). Libraries may be
imported lazily where a command does not always need them (matplotlib, jax in the sweep's
driver, optional extras). Parsed from the source, so no module has to be importable."""

import ast
import pathlib

import pytest

from tests.fixtures import paths

ROOT = pathlib.Path(paths.ROOT)
# (module prefix, layer): the longest matching prefix wins. The package's __init__ (the public
# API) may import from any layer.
LAYERS = [
    ("tst_jax.errors", 0), ("tst_jax.fileio", 0), ("tst_jax.rundir", 0), ("tst_jax.schema", 0),
    ("tst_jax.platform", 1), ("tst_jax.superposition", 1), ("tst_jax.kernels", 1),
    ("tst_jax.parallel", 1), ("tst_jax.losses", 1), ("tst_jax.optim", 1),
    ("tst_jax.models", 2),
    ("tst_jax.data", 3), ("tst_jax.convert", 3), ("tst_jax.analysis", 3),
    # layer 4 in three floors: the run's record < its config and plan < the step and the loop
    ("tst_jax.run", 4.0), ("tst_jax.config", 4.1), ("tst_jax.train", 4.2),
    ("tst_jax.tools", 5), ("tst_jax.configlib", 5), ("tst_jax.cli", 5),
]
def layer(module: str):
  best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len,
             default=None)
  return dict(LAYERS)[best] if best else None


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree):
  """(imported module, line, inside a function) of every import in a module's syntax tree."""
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      if isinstance(child, ast.Import):
        found.extend((a.name, child.lineno, in_function) for a in child.names)
      elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
        found.append((child.module, child.lineno, in_function))
        found.extend((f"{child.module}.{a.name}", child.lineno, in_function)
                     for a in child.names if child.module == "tst_jax")
      visit(child, inner)
  visit(tree, False)
  return found


MODULES = sorted((ROOT / "tst_jax").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_down_the_layers(path):
  me = module_name(path)
  if me == "tst_jax":
    return
  mine = layer(me)
  assert mine is not None, f"{me} is in no layer: add it to LAYERS and docs/architecture.md's table"
  problems = []
  for name, line, in_function in imports(ast.parse(path.read_text())):
    theirs = layer(name)
    if theirs is not None and theirs > mine:
      problems.append(f"{path.name}:{line} {me} (layer {mine}) imports {name} (layer {theirs})")
    if in_function and name.startswith("tst_jax"):
      problems.append(f"{path.name}:{line} imports {name} inside a function")
  assert not problems, "\n".join(problems)


def test_the_check_catches_an_upward_import(tmp_path):
  """The parser sees imports in functions and both import forms."""
  tree = ast.parse("from tst_jax.train import loop\ndef f():\n  import tst_jax.tools.sweep\n")
  assert imports(tree) == [("tst_jax.train", 1, False), ("tst_jax.tools.sweep", 3, True)]
  assert layer("tst_jax.train.loop") == 4.2 and layer("tst_jax.models.moe") == 2
  assert layer("tst_jax.config.record") == 4.1 and layer("tst_jax.run.workdir") == 4.0


def _imported_modules(module: str) -> set[str]:
  """Returns the tst_jax modules `module` imports at module level, `from pkg import mod` as
  the module `pkg.mod` where that is a file."""
  parts = module.split(".")
  path = ROOT.joinpath(*parts).with_suffix(".py")
  if not path.exists():
    path = ROOT.joinpath(*parts, "__init__.py")
  found = set()
  for name, _, in_function in imports(ast.parse(path.read_text())):
    if in_function or not name.startswith("tst_jax"):
      continue
    found.add(name)
  tree = ast.parse(path.read_text())
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tst_jax"):
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        if ROOT.joinpath(*sub.split(".")).with_suffix(".py").exists():
          found.add(sub)
  return {m for m in found if ROOT.joinpath(*m.split(".")).with_suffix(".py").exists()
          or ROOT.joinpath(*m.split("."), "__init__.py").exists()}


def _reachable(module: str) -> set[str]:
  seen, todo = set(), [module]
  while todo:
    name = todo.pop()
    if name not in seen:
      seen.add(name)
      todo.extend(_imported_modules(name))
  return seen


def test_the_graph_sees_every_model_family_under_the_train_step():
  """The registries import their families plainly, so the layer check sees those edges."""
  assert {"tst_jax.models", "tst_jax.models.llama", "tst_jax.models.moe",
          "tst_jax.models.layers"} <= _reachable("tst_jax.train.step")
  assert {"tst_jax.convert.llama_hf",
          "tst_jax.convert.qwen3_moe_hf"} <= _reachable("tst_jax.convert.hf")


# A module past this many lines holds more than one idea (STYLE.md: one module per idea).
MAX_MODULE_LINES = 450


def test_every_module_holds_one_idea_in_at_most_450_lines():
  long = {str(p.relative_to(ROOT)): n for p in MODULES
          if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
  assert not long, f"split by idea: {long}"
