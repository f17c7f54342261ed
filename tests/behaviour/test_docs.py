"""The README reads in two minutes: a quickstart of at most 40 lines with the two commands, and
no paragraph over 6 lines; the rest lives in docs/, and every docs/*.md it names exists."""

import ast
import os
import re

from tests.fixtures.paths import ROOT
from tst_jax.config import plan as plan_lib
from tst_jax.run import console as console_lib


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def paragraphs(text: str) -> list[list[str]]:
  """Returns the prose paragraphs of markdown `text`, each a list of lines: code blocks,
  tables and headings are not prose, and each item of a list is a paragraph of its own."""
  out, current, fenced = [], [], False
  for line in text.splitlines() + [""]:
    if line.startswith("```"):
      fenced = not fenced
      line = ""
    if fenced or line.startswith(("|", "#")) or not line.strip() or line.startswith("- "):
      if current:
        out.append(current)
      current = [line] if line.startswith("- ") and not fenced else []
      continue
    current.append(line)
  return out


def test_the_quickstart_fits_a_screen_and_holds_the_two_commands():
  text = _readme()
  quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  assert len(quickstart.strip("\n").splitlines()) <= 40
  assert [b.splitlines()[0] for b in re.findall(r"```bash\n(.*?)```", quickstart, re.S)] == [
      "# 1. Install, then train the demo: a two-phase TST run on the embedded corpus, on CPU.",
      "# 2. Install the test dependencies, then run the tests."]


def test_no_paragraph_of_the_readme_is_over_six_lines():
  long = [p[0][:60] for p in paragraphs(_readme()) if len(p) > 6]
  assert not long, long


def test_the_docs_the_readme_names_exist():
  named = set(re.findall(r"docs/[\w/.-]+\.md", _readme()))
  assert named and all(os.path.exists(os.path.join(ROOT, d)) for d in named), named


def test_paragraphs_counts_prose_only():
  text = "# t\n\none\ntwo\n\n```\na\nb\n```\n| x |\n- item\n  more\n\nlast\n"
  assert paragraphs(text) == [["one", "two"], ["- item", "  more"], ["last"]]


def _defines_something(path: str) -> bool:
  """Says whether a package's __init__.py defines a function or a class, rather than only
  naming its package or gathering its modules' names."""
  with open(path) as f:
    body = ast.parse(f.read()).body
  return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in body)


def test_the_architecture_names_every_module():
  """docs/architecture.md's module table has a row for each module of tst_jax/, by its path
  under the package, a package's __init__.py where it holds code, and no row for a module
  that is gone."""
  with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
    named = set(re.findall(r"^\| `([\w/]+\.py)` \|", f.read(), re.M))
  package = os.path.join(ROOT, "tst_jax")
  modules = set()
  for folder, dirs, files in os.walk(package):
    dirs[:] = [d for d in dirs if not d.startswith("__")]
    rel = os.path.relpath(folder, package)
    modules |= {os.path.normpath(os.path.join(rel, f)) for f in files if f.endswith(".py")
                and (f != "__init__.py" or rel == "."
                     or _defines_something(os.path.join(folder, f)))}
  assert modules - named == set(), "add them to docs/architecture.md's module table"
  assert named - modules == set(), "gone from tst_jax/: remove their rows"


# How this project measures on the GPUs it is lent: its own machinery, which docs/gpu/README.md
# holds. A user's docs say how to run a GPU, not how this project's sessions are budgeted.
LEASE_WORDS = re.compile(r"\$OUT\b|\bTOTAL_S\b|\blent\b|\bleases?\b|device time|"
                         r"device budget|budget_left|\bborrowed\b|GPU windows?\b|gpu_wheels|"
                         r"no GPU in (this|that) session", re.I)


def test_the_projects_gpu_lease_wording_stays_in_docs_gpu():
  pages = [os.path.join(ROOT, "README.md")] + [
      os.path.join(folder, f) for folder, _, files in os.walk(os.path.join(ROOT, "docs"))
      for f in files if f.endswith(".md")
      and not os.path.relpath(folder, ROOT).startswith(os.path.join("docs", "gpu"))]
  found = []
  for page in pages:
    with open(page) as f:
      for number, line in enumerate(f, 1):
        found += [f"{os.path.relpath(page, ROOT)}:{number}: {m.group(0)}"
                  for m in LEASE_WORDS.finditer(line)]
  assert not found, "\n".join(found)
  with open(os.path.join(ROOT, "docs", "gpu", "README.md")) as f:
    assert LEASE_WORDS.search(f.read())      # the words exist, and live there


def test_the_console_excerpts_print_what_a_run_prints_now():
  """The eval lines of the README's and docs/demo.md's excerpts as the console writes them
  today: the console's own eval line from each excerpt's numbers, bits per byte and, in phase
  1, the held-out bag loss included."""
  pattern = re.compile(r"^eval  step (\d+): held-out next-token loss ([\d.]+), ([\d.]+) "
                       r"bits/byte(?:; held-out bag loss ([\d.]+) \(the tst S=(\d+) task.*\))?$")
  for page in ("README.md", os.path.join("docs", "demo.md")):
    with open(os.path.join(ROOT, page)) as f:
      lines = [line for line in f.read().splitlines() if line.startswith("eval  step")]
    assert lines, page
    for line in lines:
      found = pattern.match(line)
      assert found, f"{page}: {line}"
      step, loss, bpb, bag, bag_size = found.groups()
      record = dict(eval_loss=float(loss), eval_bpb=float(bpb))
      phase = None
      if bag is not None:
        record["eval_bag_loss"] = float(bag)
        phase = plan_lib.Phase("tst", 0, int(step), int(bag_size), "full", 128, 16, 1.0)
      printed = []
      console = console_lib.Console(int(step), 0, bar=False)
      console.print = printed.append
      console.eval(int(step), record, phase)
      assert printed == [line], page


def _architecture() -> str:
  with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
    return f.read()


def test_the_layer_table_is_the_import_tests():
  """docs/architecture.md's table of layers is the one the import test enforces: the same
  modules on the same layers, no more and no fewer."""
  from tests.behaviour.test_import_layers import LAYERS   # pylint: disable=import-outside-toplevel
  table = _architecture().split("| layer | modules | what |", 1)[1].split("\n\n", 1)[0]
  documented = set()
  for row in table.strip().splitlines()[1:]:
    layer, modules = row.split("|")[1:3]
    documented |= {("tst_jax." + name.rstrip("/").replace("/", "."), float(layer))
                   for name in re.findall(r"`([\w/]+)`", modules)}
  assert documented == {(prefix, float(layer)) for prefix, layer in LAYERS}


# A path of the project: tst_jax/x.py, tests/y/, or in backticks a module's path under tst_jax/.
_PATH = re.compile(r"\b((?:tst_jax|tests|benchmarks|configs|launch|colabs)/[\w/.-]*\w/?)"
                   r"|`(\w+/(?:[\w/]*\.py)?)`")


def test_every_path_the_architecture_names_exists():
  named = {a or b for a, b in _PATH.findall(_architecture())}
  assert len(named) > 30, named
  missing = [p for p in sorted(named) if not os.path.exists(os.path.join(ROOT, p))
             and not os.path.exists(os.path.join(ROOT, "tst_jax", p))]
  assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


_DATE = re.compile(r"(?<![/\w-])(?:19|20)\d\d-[01]\d(?:-[0-3]\d)?(?![\w-])")   # not a path's part
_HASH = re.compile(r"\b(?!\d+e\d+\b)(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def test_no_history_in_the_architecture_or_dates_in_the_code():
  """docs/architecture.md says what is: no dates or commit hashes, which belong to the dated
  pages of docs/ and to commit messages. No tst_jax module holds a date but in a path."""
  text = _architecture()
  assert not _DATE.findall(text) and not _HASH.findall(text), (
      _DATE.findall(text), _HASH.findall(text))
  dated = []
  for folder, _, files in os.walk(os.path.join(ROOT, "tst_jax")):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(folder, name)) as f:
          dated += [f"{name}:{n}" for n, line in enumerate(f, 1) if _DATE.search(line)]
  assert not dated, dated
  assert _DATE.findall("on 2026-11-25 and 2026-11")
  assert not _DATE.findall("docs/gpu/2026-11-26-h200")
  assert _HASH.findall("commit 5ea38ad") and not _HASH.findall("2250e12 decade abcdefa")
