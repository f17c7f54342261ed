"""Every user-given path goes through tst_jax/fileio/: no module outside it calls `open`,
`Path`, `os.makedirs`, `shutil` or a figure's `savefig` on one. Parsed from the source.

A user-given path is, as far as a syntax tree can tell, any parameter of a function (a tool's
argparse namespace too, since it comes from `argv`) and any name assigned from one in that
function, loops and `with` targets included. Such a call is allowed where the function has
just found the path local: in the body of `if not fileio.is_url(...)` or of
`if fileio.local_path(...) is not None`, or in the `else` of their opposites. LOCAL lists the
functions whose paths are local by construction."""

import ast
import pathlib

import pytest

from tests.fixtures import paths

ROOT = pathlib.Path(paths.ROOT)
BANNED = {("open",), ("Path",), ("pathlib", "Path"), ("os", "makedirs"), ("os", "mkdir")}
# (module, function): why its path is local, whatever the user gave.
LOCAL = {
    ("tst_jax/data/prepare.py", "prepare"): "the work folder: prepare.work_folder is local",
    ("tst_jax/data/prepare.py", "_fresh_work_folder"): "prepare.work_folder, local",
    ("tst_jax/run/lock.py", "process_start"): "Linux's /proc of this host",
    ("tst_jax/data/prepare.py", "_tokenize_documents"): "files in prepare's local work folder",
    ("tst_jax/data/output_shards.py", "write"): "a shard staged in the local work folder",
    ("tst_jax/kernels/tokamax_tuning.py", "_load"): "the autotuning cache, a local folder",
    ("tst_jax/kernels/gemm_measured.py", "_load"): "the package's table, or the lab's local copy",
    ("tst_jax/data/runners.py", "check_shared"): "a probe in prepare's local work folder",
    ("tst_jax/kernels/tokamax_tuning.py", "_tune"): "the autotuning cache, a local folder",
    ("tst_jax/tools/sweep/run.py", "link_prepared_data"):
        "hard links, made only in a local sweep folder (shared_store)",
    ("tst_jax/tools/sweep/run.py", "_link_or_copy"): "link_prepared_data's, local",
    ("tst_jax/train/local_checkpoint.py", "__init__"): "train.local_checkpoint_dir: a host's disk",
    ("tst_jax/train/local_checkpoint.py", "_write"): "train.local_checkpoint_dir: a host's disk",
    ("tst_jax/train/local_checkpoint.py", "_write_folder"): "train.local_checkpoint_dir, local",
    ("tst_jax/train/local_checkpoint.py", "_read_index"): "train.local_checkpoint_dir, local",
    ("tst_jax/train/local_checkpoint.py", "_remove"): "train.local_checkpoint_dir, local",
}


def _dotted(func) -> tuple:
  parts = []
  while isinstance(func, ast.Attribute):
    parts.append(func.attr)
    func = func.value
  return tuple(reversed(parts + [func.id])) if isinstance(func, ast.Name) else ()


def _names(node) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_url_test(test) -> bool | None:
  """True for `fileio.is_url(...)` or `fileio.local_path(...) is None`, False for their
  opposites, else None."""
  if (isinstance(test, ast.Compare) and len(test.ops) == 1
      and isinstance(test.ops[0], (ast.Is, ast.IsNot)) and isinstance(test.left, ast.Call)
      and _dotted(test.left.func)[-1:] == ("local_path",)
      and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
    return isinstance(test.ops[0], ast.Is)
  negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
  call = test.operand if negated else test
  if isinstance(call, ast.Call) and _dotted(call.func)[-1:] == ("is_url",):
    return not negated
  return None


def _tainted(fn) -> set[str]:
  """The function's parameters and every name assigned from one, to a fixed point."""
  args = fn.args
  tainted = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
             if a.arg not in ("self", "cls")}
  tainted |= {a.arg for a in (args.vararg, args.kwarg) if a}
  while True:
    before = len(tainted)
    for node in ast.walk(fn):
      if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        value = node.value
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      elif isinstance(node, (ast.For, ast.comprehension)):
        value, targets = node.iter, [node.target]
      elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        value, targets = node.context_expr, [node.optional_vars]
      else:
        continue
      if value is not None and _names(value) & tainted:
        for target in targets:
          tainted |= _names(target)
    if len(tainted) == before:
      return tainted


def _local_branch(call, parents) -> bool:
  """Whether `call` runs only where an enclosing `if` found the path local."""
  node = call
  while node in parents:
    parent = parents[node]
    if isinstance(parent, ast.If):
      url = _is_url_test(parent.test)
      if (url is False and node in parent.body) or (url is True and node in parent.orelse):
        return True
    node = parent
  return False


def user_path_calls(source: str) -> list[tuple[int, str, str]]:
  """(line, function, call) of each banned call on a user-given path in a module's source."""
  tree = ast.parse(source)
  parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
  found = set()
  for fn in ast.walk(tree):
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    tainted = _tainted(fn)
    for call in ast.walk(fn):
      if not isinstance(call, ast.Call):
        continue
      name = _dotted(call.func)
      banned = (name in BANNED or name[:1] == ("shutil",)
                or (isinstance(call.func, ast.Attribute) and call.func.attr == "savefig"))
      if (banned and any(_names(a) & tainted for a in call.args + [k.value for k in call.keywords])
          and not _local_branch(call, parents)):
        found.add((call.lineno, fn.name, ".".join(name) or call.func.attr))
  return sorted(found)


MODULES = sorted(p for p in (ROOT / "tst_jax").rglob("*.py") if p.parent.name != "fileio")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_paths_go_through_fileio(path):
  where = str(path.relative_to(ROOT))
  calls = [(line, fn, call) for line, fn, call in user_path_calls(path.read_text())
           if (where, fn) not in LOCAL]
  assert not calls, "\n".join(f"{where}:{line} {fn}: {call}(...) on a user-given path: use "
                              "tst_jax.fileio" for line, fn, call in calls)


def test_every_local_exception_still_applies():
  """A LOCAL entry whose function no longer makes such a call is stale."""
  for where, fn in LOCAL:
    assert any(f == fn for _, f, _ in user_path_calls((ROOT / where).read_text())), (where, fn)


def test_the_rule_finds_a_user_path_and_spares_a_local_one():
  flagged = user_path_calls(
      "def export(workdir, out):\n"
      "  out = Path(out)\n"                             # a path handed in: flagged
      "  folder = os.path.join(out, 'x')\n"
      "  os.makedirs(folder, exist_ok=True)\n"          # derived from it: flagged
      "  for f in files_of(out):\n"
      "    shutil.copy(f, '/tmp')\n"                    # a loop over it: flagged
      "  if not fileio.is_url(out):\n"
      "    open(out + '/log', 'a')\n"                   # found local first: spared
      "  if fileio.is_url(out):\n"
      "    pass\n"
      "  else:\n"
      "    fig.savefig(out)\n"                          # found local first: spared
      "  if fileio.local_path(out) is not None:\n"
      "    open(out)\n"                                 # found local first: spared
      "  if fileio.local_path(out) is None:\n"
      "    open(out)\n"                                 # found a URL: flagged
      "  open(__file__)\n"                              # not the user's: spared
      "\n"
      "def plot(fig, out_path):\n"
      "  fig.savefig(out_path)\n")                      # flagged
  assert flagged == [(2, "export", "Path"), (4, "export", "os.makedirs"),
                     (6, "export", "shutil.copy"), (16, "export", "open"),
                     (20, "plot", "fig.savefig")]
