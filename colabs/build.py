"""Writes the four notebooks of colabs/ from their cells (colabs/cells/), so they stay in sync.

  python colabs/build.py            # rewrite quickstart/inside_tst/fused_loss/gpu_small.ipynb
  python colabs/build.py --check    # exit 1 if a committed notebook differs from its cells

Notebooks are stored without outputs. Every one opens with the same install cell and reads
TST_SMALL=1 (CI) to shrink its steps and sizes; tests/behaviour/test_colabs.py runs them.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import nbformat

from cells import fused_loss, gpu_small, inside_tst, quickstart

HERE = os.path.dirname(os.path.abspath(__file__))

NOTEBOOKS = {"quickstart.ipynb": quickstart.CELLS, "inside_tst.ipynb": inside_tst.CELLS,
             "fused_loss.ipynb": fused_loss.CELLS, "gpu_small.ipynb": gpu_small.CELLS}


def notebook(name: str, cells) -> nbformat.NotebookNode:
  stem = name.split(".")[0]
  nb = nbformat.v4.new_notebook()
  nb.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": [], "name": name},
      "accelerator": "GPU" if stem != "inside_tst" else "None"}
  for i, (kind, source) in enumerate(cells):
    make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
    nb.cells.append(make(textwrap.dedent(source).strip("\n"), id=f"{stem}-{i}"))
  nbformat.validate(nb)
  return nb


def render(name: str) -> str:
  return nbformat.writes(notebook(name, NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="compare, do not write")
  args = parser.parse_args(argv)
  stale = []
  for name in NOTEBOOKS:
    path, text = os.path.join(HERE, name), render(name)
    if args.check:
      if not os.path.exists(path) or open(path).read() != text:
        stale.append(name)
    else:
      with open(path, "w") as f:
        f.write(text)
      print("wrote", path)
  if stale:
    print(f"out of date (run python colabs/build.py): {stale}", file=sys.stderr)
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main())
