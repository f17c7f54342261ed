"""The notebooks in colabs/: generated from colabs/build.py, and each runs top to bottom on CPU
with TST_SMALL=1 (nbclient, a fresh kernel, one CPU device)."""

import os
import resource
import subprocess
import sys
import time

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

COLABS = os.path.join(ROOT, "colabs")
NOTEBOOKS = ["quickstart.ipynb", "fused_loss.ipynb",
             # Slow: their cells' sweep and losses have tests of their own in tests/tools and
             # tests/test_superposition.py; test_notebooks_match_build_script checks them here.
             pytest.param("inside_tst.ipynb", marks=pytest.mark.slow),
             pytest.param("gpu_small.ipynb", marks=pytest.mark.slow)]
BUDGET_S = 90          # per notebook: CPU seconds of its kernel (about wall time on 2 idle cores)


def test_notebooks_match_build_script():
  out = subprocess.run([sys.executable, os.path.join(COLABS, "build.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
  nb = nbformat.read(os.path.join(COLABS, name), as_version=4)
  assert nb.cells[1].source.lstrip().startswith("# Install tst-jax")
  assert any('TST_SMALL = os.environ.get("TST_SMALL", "0") == "1"' in c.source
             for c in nb.cells if c.cell_type == "code")
  # conftest.py asks for 8 host devices; a notebook gets the one a laptop or Colab CPU has.
  env = dict(subprocess_env.one_cpu_device(), TST_SMALL="1",
             TST_WORKDIR=str(tmp_path / "runs"))
  client = nbclient.NotebookClient(nb, timeout=3 * BUDGET_S, kernel_name="python3",
                                   resources={"metadata": {"path": COLABS}})
  start, cpu_start = time.time(), _children_cpu_s()
  client.execute(env=env)           # raises CellExecutionError on the first failing cell
  elapsed, cpu = time.time() - start, _children_cpu_s() - cpu_start   # the kernel is reaped
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "error"]
  assert not errors
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
  assert images, "every notebook draws at least one figure"
  # CPU time, not wall time: on a CPU shared with other jobs the wall clock says little.
  assert cpu < BUDGET_S, f"{name}: kernel used {cpu:.0f} CPU s ({elapsed:.0f} s wall)"


def _children_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime
