"""benchmarks/gpu_budget.sh: one budget of GPU seconds, the MoE lab only where no lab measured
today's MoE path, the ladder's next points, quick in the time left, and a rerun with the last
run's folder that goes on with what is missing. The fingerprints and the decisions are checked
in-process; the script itself with every GPU command faked (fast), and as the whole CPU dry run
at tiny shapes, twice (slow)."""

import importlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tarfile

import pytest

from tests.fixtures.brought_back import write_point
from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT
from tst_jax.tools import ladder, ladder_plan, sweep

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
try:
  gpu_budget = importlib.import_module("gpu_budget")
finally:
  sys.path.pop(0)

SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_budget.sh")


def _write(root, path, text):
  full = os.path.join(root, path)
  os.makedirs(os.path.dirname(full), exist_ok=True)
  with open(full, "w") as f:
    f.write(text)


def test_a_fingerprint_moves_with_code_not_with_comments_or_docstrings(tmp_path):
  _write(tmp_path, "a.py", '"""Doc."""\n\ndef f(x):\n  """Adds one."""\n  return x + 1  # why\n')
  _write(tmp_path, "run.sh", "#!/bin/bash\n# a comment\necho hi\n")
  before = gpu_budget.fingerprint(str(tmp_path), ["a.py", "run.sh"])
  _write(tmp_path, "a.py", '"""Another doc."""\n\n\ndef f(x):  # other\n  """Adds 1."""\n'
         "  return x + 1\n")
  _write(tmp_path, "run.sh", "#!/bin/bash\n  # another comment\necho hi\n")
  assert gpu_budget.fingerprint(str(tmp_path), ["a.py", "run.sh"]) == before
  _write(tmp_path, "a.py", '"""Doc."""\n\ndef f(x):\n  return x + 2\n')
  assert gpu_budget.fingerprint(str(tmp_path), ["a.py", "run.sh"]) != before
  _write(tmp_path, "a.py", '"""Doc."""\n\ndef f(x):\n  return x + 1\n')
  _write(tmp_path, "run.sh", "#!/bin/bash\necho hello\n")
  assert gpu_budget.fingerprint(str(tmp_path), ["a.py", "run.sh"]) != before


def test_the_moe_path_is_what_the_lab_imports_within_its_floor_and_the_data_beside_it(tmp_path):
  """From the lab's source, the imports within MOE_FLOOR, the scripts beside it and the data
  files in the kernels' folder; the shared layers and the loss stay out. A module the MoE layer
  starts to import joins the path."""
  root = str(tmp_path)
  _write(root, "benchmarks/moe_lab.py", "import helper\nfrom tst_jax import platform\n"
         "from tst_jax.models import moe, layers\n")
  _write(root, "benchmarks/helper.py", "import json\n")
  _write(root, "benchmarks/gpu.sh", "echo\n")
  _write(root, "tst_jax/platform.py", "from tst_jax.kernels import gemm\n")
  _write(root, "tst_jax/models/moe.py", "from tst_jax.models import llama\n")
  _write(root, "tst_jax/models/layers.py", "")
  _write(root, "tst_jax/models/llama.py", "")
  _write(root, "tst_jax/kernels/gemm.py", "from tst_jax import losses\n")
  _write(root, "tst_jax/kernels/tables/h200.json", "{}")
  _write(root, "tst_jax/losses.py", "")
  assert gpu_budget.moe_path_files(root) == [
      "benchmarks/helper.py", "benchmarks/moe_lab.py", "tst_jax/kernels/gemm.py",
      "tst_jax/kernels/tables/h200.json", "tst_jax/models/moe.py", "tst_jax/platform.py"]
  before = gpu_budget.fingerprint(root, gpu_budget.moe_path_files(root))
  _write(root, "tst_jax/models/moe.py", "from tst_jax.kernels import capacity\n")
  _write(root, "tst_jax/kernels/capacity.py", "X = 1\n")
  assert "tst_jax/kernels/capacity.py" in gpu_budget.moe_path_files(root)
  assert gpu_budget.fingerprint(root, gpu_budget.moe_path_files(root)) != before
  real = gpu_budget.moe_path_files()
  assert {"benchmarks/moe_lab.py", "tst_jax/models/moe.py", "tst_jax/kernels/moe_dispatch.py",
          "tst_jax/kernels/moe_gather.py", "tst_jax/kernels/grouped_matmul.py",
          "tst_jax/platform.py"} <= set(real)
  assert not {"tst_jax/models/llama.py", "tst_jax/losses.py",
              "tst_jax/kernels/linear_mce_pallas.py"} & set(real)


def _jsonl(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


WINNERS = dict(row="lab", lab=True, shape="-", piece="winners", impl="-", winners={})


def test_a_lab_counts_only_at_its_moe_path_and_quick_rows_only_at_their_code(tmp_path):
  """Rows after a `budget` row are measured at its fingerprints: its lab, measured to its
  winners, stands for that MoE path; its quick rows that finished, for that code, with those
  it carried over. Rows without a budget row (older sessions) say neither."""
  legacy = _jsonl(tmp_path / "old" / "gpu.jsonl",
                  [WINNERS, dict(row="recipe", rc=0, wall_s=1, bound_s=9)])
  mine = _jsonl(tmp_path / "new" / "gpu.jsonl", [
      dict(row="budget", moe_path="M1", code="C1", rows_done=["d600"]),
      dict(row="env", rc=0), WINNERS, dict(row="recipe", rc=0), dict(row="b10", rc=124),
      dict(row="profile", skipped="no time left"), dict(row="budget_quick", rc=0),
      dict(row="budget", moe_path="M2", code="C2", lab_found=None),
      dict(row="d270", rc=0)])
  segs = gpu_budget.history([str(tmp_path)])
  assert len(segs) == 2 + 2 and {s["source"] for s in segs} == {legacy, mine}
  assert gpu_budget.lab_found(segs, "M1") == mine
  assert gpu_budget.lab_found(segs, "M2") is None
  assert gpu_budget.rows_done(segs, "C1") == ["recipe", "d600"]    # in quick's order
  assert gpu_budget.rows_done(segs, "C2") == ["d270"]
  assert gpu_budget.rows_done(segs, "C3") == []
  carried = gpu_budget.segments(_jsonl(tmp_path / "next.jsonl", [
      dict(row="budget", moe_path="M1", code="C1", lab_found=mine, rows_done=["recipe"])]))
  assert gpu_budget.lab_found(carried, "M1") == mine
  assert gpu_budget.rows_done(carried, "C1") == ["recipe"]
  assert gpu_budget.quick_rows() == ["recipe", "b10", "profile", "d270", "d270_docs", "d600",
                                     "gemm"]          # not the autotuned GEMM


def test_the_last_runs_finished_points_reach_the_ladder_and_its_unfinished_stay(tmp_path):
  """A call packs every point it started into points.tar.gz, unfinished ones too; those the
  ladder could not bring back, so only the finished are kept."""
  config = os.path.join(ROOT, gpu_budget.TINY.config)
  runs = tmp_path / "stage" / "runs"
  done, cut = sweep.make_arm_points(["0.004k", "baseline+0.004k"], [0])
  write_point(str(runs), config, done, [], {2: 6.5, 4: 6.1})
  write_point(str(runs), config, cut, [], {2: 6.5, 4: 6.2})
  with open(runs / cut.name / "metrics.jsonl") as f:
    first = f.readline()
  (runs / cut.name / "metrics.jsonl").write_text(first)     # cut short after step 2
  last = tmp_path / "last"
  last.mkdir()
  with tarfile.open(last / "points.tar.gz", "w:gz") as tar:
    tar.add(runs, arcname="runs")
  into = str(tmp_path / "w" / "last_points")
  assert gpu_budget.last_points(str(last), into) == into
  assert os.listdir(os.path.join(into, "runs")) == [done.name]
  assert sweep.bring_back(into, str(tmp_path / "ladder")) == [done.name]
  assert gpu_budget.last_points("", into) is None and not os.path.exists(into)


def test_every_budget_completes_a_point_of_the_moe_ladder(monkeypatch):
  """At the ladder's measured rate, each rung's TST run with the baseline of its own length,
  and each baseline alone, fits the ladder's share of a budget without the lab; the rungs
  sit at 0.6, 1.2 and 2.4 tokens per active parameter, 1k and 2k on one corpus so that they
  share baselines."""
  monkeypatch.chdir(ROOT)
  lad = ladder_plan.LADDERS["moe"]
  rungs, plans = ladder.make_rungs(lad, [0], [])
  common = open(os.path.join(ROOT, "benchmarks", "sweep_common.sh")).read()
  keep = int(re.search(r"^KEEP_S=(\d+)$", common, re.M).group(1))
  window = gpu_budget.ladder_window(540, lab=False, keep_s=keep)
  assert window == 540 - gpu_budget.START_S - keep
  rung_of = {p: r for r in rungs for p in r.points}
  seconds = lambda names: ladder_plan.call_seconds(names, rung_of, plans, lad.parallel, lad.rate)
  for rung in rungs:
    tst, own = rung.points[0], rung.points[len(rung.tst)]
    assert plans[own].total_steps == plans[tst].total_steps and plans[own].ratio == 0
    assert seconds([tst, own]) <= window, rung
    assert all(seconds([b]) <= window for b in rung.points[len(rung.tst):]), rung
  assert [round(plans[r.points[0]].tokens_per_param, 1) for r in rungs] == [0.6, 1.2, 2.4]
  assert rungs[0].corpus_bytes == rungs[1].corpus_bytes < rungs[2].corpus_bytes
  assert set(rungs[0].points) & set(rungs[1].points) == {"baseline_seed0", "baseline-2k_seed0"}


def _fake_bin(tmp_path):
  """python3 faked but for the budget's own planner: each call recorded, each run one JSON
  line, as gpu.sh's tests fake it."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  log = tmp_path / "calls.txt"
  fake = (f'printf "%q " "$@" >> {log}; echo >> {log}; '
          f'[ "$1" = benchmarks/gpu_budget.py ] && exec {sys.executable} "$@"; '
          'cat > /dev/null; '
          'case "$*" in *--winner*) echo --config.model.dispatch_impl=gather; exit;; '
          '*--table*) exit;; *moe_lab.py*) echo \'{"lab": true, "piece": "winners"}\';; esac; '
          '[ "$1" = benchmarks/gpu_table.py ] || echo \'{"fake": 1}\'')
  path = bin_dir / "python3"
  path.write_text(f"#!/usr/bin/env bash\n{fake}\n")
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return bin_dir, log


def _budget(tmp_path, out, *args, **env):
  bin_dir, log = _fake_bin(tmp_path)
  if log.exists():
    log.unlink()
  run = subprocess.run(["bash", SCRIPT, *args, str(out)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
                                             TINY="1", WORKDIR=str(tmp_path / "w"),
                                             WHEELS=str(tmp_path / "no_wheels"), **env))
  assert run.returncode == 0, run.stderr[-3000:]
  calls = [shlex.split(line) for line in log.read_text().splitlines() if line.strip()]
  return run.stdout, [c for c in calls if c and c[0] != "-"]


def _rows(out):
  return [json.loads(line) for line in open(os.path.join(out, "gpu.jsonl"))]


@pytest.mark.slow
def test_a_budget_runs_lab_ladder_quick_in_order_then_a_rerun_goes_on(tmp_path):
  """The commands faked: the lab (no lab at this MoE path yet), the ladder's next call with
  its points, budget and deadline, quick without its autotuning, the report, every stage a
  row, at most 8 files. Again with that folder as LAST: no lab, quick's finished rows skipped
  as done."""
  out1 = tmp_path / "out1"
  out1.mkdir()
  for name in ("a.txt", "b.txt", "c.txt", "d.txt"):      # with the budget's own, 9 files
    (out1 / name).write_text(name)
  stdout, calls = _budget(tmp_path, out1)
  scripts = [c[0] if c[0] != "-m" else c[1] for c in calls]
  lab = (["benchmarks/moe_lab.py"] * 3 + ["benchmarks/step.py", "benchmarks/moe_lab.py",
                                           "benchmarks/step.py", "benchmarks/moe_lab.py"])
  assert scripts == (["benchmarks/gpu_budget.py"] + lab
                     + ["benchmarks/gpu_budget.py", "tst_jax.tools.ladder"]
                     + ["benchmarks/step.py"] * 6 + ["benchmarks/grouped_matmul.py",
                                                     "benchmarks/gpu_table.py",
                                                     "benchmarks/gpu_budget.py"])
  (lad,) = [c for c in calls if "tst_jax.tools.ladder" in c]
  rung = ladder_plan.Rung("0.004k", 0, ("0.004k",), ("baseline+0.004k", "baseline+0.008k"), 0)
  assert lad[lad.index("--points") + 1] == ",".join(rung.points)
  assert lad[lad.index("--config") + 1] == gpu_budget.TINY.config
  rows = _rows(out1)
  (plan,) = [r for r in rows if r["row"] == "budget_ladder_plan"]   # planned, then the deadline
  assert float(lad[lad.index("--budget_s") + 1]) == plan["window_s"] > 0
  assert float(lad[lad.index("--deadline_s") + 1]) > 0
  budget = rows[0]
  assert budget["row"] == "budget" and budget["lab_runs"] and budget["rows_done"] == []
  assert budget["moe_path"] == gpu_budget.fingerprints()["moe_path"]
  assert [r["row"] for r in rows if r["row"].startswith("budget_") and "rc" in r] == [
      "budget_lab", "budget_ladder", "budget_quick"]
  assert {"row": "gemm_tuned", "skipped": "no time left of the section's seconds"} in rows
  assert stdout.splitlines()[-1] == f'Next: TINY=1 LAST={out1} bash benchmarks/gpu_budget.sh "$OUT"'
  assert "## Stages" in (out1 / "budget.md").read_text()
  assert sorted(os.listdir(out1)) == ["budget.md", "gpu.jsonl", "lab.md", "more.tar.gz",
                                      "quick.md", "quick_log.txt"]
  with tarfile.open(out1 / "more.tar.gz") as tar:
    assert sorted(tar.getnames()) == ["a.txt", "b.txt", "c.txt", "d.txt"]

  out2 = tmp_path / "out2"
  _, calls = _budget(tmp_path, out2, LAST=str(out1))
  assert not any(c[0] in ("benchmarks/moe_lab.py", "benchmarks/step.py") for c in calls)
  rows = _rows(out2)
  assert rows[0]["lab_found"] == str(out1 / "gpu.jsonl") and not rows[0]["lab_runs"]
  assert rows[0]["rows_done"] == gpu_budget.quick_rows()
  skipped = [r["row"] for r in rows if r.get("skipped") == "done at this code in an earlier run"]
  assert skipped == gpu_budget.quick_rows()


@pytest.mark.slow
def test_plan_only_says_what_a_budget_would_run_and_trains_nothing(tmp_path):
  bin_dir, _ = _fake_bin(tmp_path)
  bad = subprocess.run(["bash", SCRIPT, "--plan_only", str(tmp_path / "out")], text=True,
                       capture_output=True, timeout=300,
                       env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TINY="1",
                                LAST=str(tmp_path / "nowhere"), WORKDIR=str(tmp_path / "w"),
                                WHEELS=str(tmp_path / "no_wheels")))
  assert bad.returncode == 2 and bad.stderr.strip() == (
      f"error: LAST: {tmp_path / 'nowhere'}: holds no gpu.jsonl: give the folder of the last "
      "budget's files")
  stdout, calls = _budget(tmp_path, tmp_path / "out", "--plan_only")
  assert [c[0] for c in calls] == ["benchmarks/gpu_budget.py"]
  assert "1. the MoE lab: runs (no lab rows at this MoE path" in stdout
  assert "2. the ladder tiny" in stdout and "POINTS=0.004k_seed0," in stdout
  assert "The first trend" in stdout
  assert not os.path.exists(tmp_path / "out" / "gpu.jsonl")


@pytest.mark.slow
def test_the_cpu_dry_run_twice_runs_it_all_then_goes_on(tmp_path):
  """TINY=1 for real, twice: the lab, the ladder's pair of one length (POINTS), quick in the
  time left; then with that folder as LAST: no lab, the rung's last baseline (and the second
  seed its Δ inside the noise asks for), no quick row that finished before."""
  env = dict(os.environ, TINY="1", JAX_PLATFORMS="cpu", WORKDIR=str(tmp_path / "w"),
             WHEELS=str(tmp_path / "no_wheels"), XLA_FLAGS=subprocess_env.fast_compile_flags(),
             PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
  out1, out2 = tmp_path / "out1", tmp_path / "out2"
  pair = "0.004k_seed0,baseline-0.004k_seed0"
  run = subprocess.run(["bash", SCRIPT, str(out1)], capture_output=True, text=True,
                       timeout=1500, env=dict(env, BUDGET_S="400", POINTS=pair))
  assert run.returncode == 0, run.stderr[-3000:]
  rows = _rows(out1)
  ends = {r["row"]: r["rc"] for r in rows if "rc" in r}
  assert ends["budget_lab"] == ends["lab"] == ends["budget_ladder"] == 0
  assert any(r.get("piece") == "winners" for r in rows)
  with tarfile.open(out1 / "points.tar.gz") as tar:
    packed = {n.split("/")[1] for n in tar.getnames() if n.count("/") >= 1}
  assert packed == set(pair.split(","))
  done1 = [r["row"] for r in rows if r.get("rc") == 0 and r["row"] in gpu_budget.quick_rows()]
  assert len(os.listdir(out1)) <= 8
  run = subprocess.run(["bash", SCRIPT, str(out2)], capture_output=True, text=True,
                       timeout=1500, env=dict(env, BUDGET_S="400", LAST=str(out1)))
  assert run.returncode == 0, run.stderr[-3000:]
  rows = _rows(out2)
  assert not any(r.get("lab") for r in rows) and "budget_lab" not in {r["row"] for r in rows}
  (plan,) = [r for r in rows if r["row"] == "budget_ladder_plan"]
  assert "baseline-0.008k_seed0" in plan["points"] and not set(pair.split(",")) & set(
      plan["points"])
  ran = [r["row"] for r in rows if "rc" in r and r["row"] in gpu_budget.quick_rows()]
  assert not set(ran) & set(done1)
  result = json.loads((tmp_path / "w" / "ladder" / "ladder.json").read_text())
  assert any(p["run"] == "0.004k_seed0" and p["rung_done"] for p in result["points"])
  assert run.stdout.splitlines()[-1].startswith(f"Next: TINY=1 LAST={out2} ")
