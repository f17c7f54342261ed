r"""The plan of benchmarks/gpu_budget.sh: what one budget of GPU seconds runs, from what docs/gpu,
the ladder and the last run's folder already hold.

  python benchmarks/gpu_budget.py --out OUT --workdir W --budget_s 540 start
  python benchmarks/gpu_budget.py ... ladder --left_s 350     # the ladder's points that fit
  python benchmarks/gpu_budget.py ... report                  # budget.md and the next command

`start` decides, before anything runs: the MoE lab runs unless rows of a lab at today's MoE
path are found (a fingerprint of the lab's source and of what it imports of the kernels, the
MoE layer, the platform's choices and their data files, recorded in the `budget` row that opens
the lab's rows in gpu.jsonl); quick's rows that finished at today's code are not run again. It
reads every gpu.jsonl under docs/gpu and the last run's folder (--last), and brings that
folder's finished ladder points to the ladder. `ladder` names the ladder's next call that fits
the seconds left, as `tools.ladder --plan_only` packs it. `report` writes budget.md and
prints the command that goes on with what is still missing.

A fingerprint hashes Python files as their syntax trees without docstrings and shell scripts
without their comment lines, so that a comment or a docstring changes nothing.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import glob
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

from tst_jax import errors, fileio
from tst_jax.config.record import read_plan
from tst_jax.run.workdir import final_eval
from tst_jax.tools import ladder as ladder_tool, ladder_tables
from tst_jax.tools.ladder_plan import LADDERS, Call, Ladder
from tst_jax.tools.sweep.brought_back import point_dirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The lab's stage at most, its gpu.sh call's environment row and table included.
LAB_STAGE_S = 180
# Before the first stage on a bare H200: the wheels' install (1-2 s) and the environment row
# (3-4 s) in the install and env rows of docs/gpu/*/gpu.jsonl, this planner, and margin.
START_S = 40
PLAN_S = 15             # the `ladder` step's own seconds, before the ladder trains
# The lab's source, and the floor of what it imports that makes the MoE path.
MOE_ROOTS = ("benchmarks/moe_lab.py",)
MOE_FLOOR = ("benchmarks/", "tst_jax/kernels/", "tst_jax/models/moe.py",
             "tst_jax/models/experts.py", "tst_jax/parallel/",
             "tst_jax/platform.py")
CODE_GLOBS = ("tst_jax/**/*.py", "configs/*.py", "benchmarks/*.py", "benchmarks/*.sh")
# The CPU dry run's ladder (TINY=1): one rung of the tiny test config. Its rate is no
# measurement: any that packs the tiny runs into one call serves.
TINY_CONFIG = "tests/fixtures/tiny_config.py"
TINY = Ladder("", TINY_CONFIG, ("0.004k",), factors=(1.0, 2.0), rate=1e9, parallel=2,
              sized=False)
TINY_SETS = ("data.seed=0", "train.checkpoint_every=100")


def normalized(path: str, text: str) -> str:
  """Returns what a fingerprint hashes of a file: a Python file's syntax tree without its
  docstrings, a shell script without its comment lines, any other file as it is."""
  if path.endswith(".py"):
    tree = ast.parse(text)
    for node in ast.walk(tree):
      body = getattr(node, "body", None)
      if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
          and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)
  if path.endswith(".sh"):
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
  return text


def fingerprint(root: str, paths: list[str]) -> str:
  """Hashes the normalized files `paths` under `root`, with their names."""
  digest = hashlib.sha256()
  for path in sorted(paths):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
      digest.update(f"{path}\0{normalized(path, f.read())}\0".encode())
  return digest.hexdigest()[:16]


def _imports(text: str) -> list[str]:
  """Lists the modules a Python file imports, and `module.name` for each `from module import
  name`, which may be a module too."""
  names = []
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
  return names


def _module_files(module: str, importer: str) -> list[str]:
  """Lists the files `module` may be, relative to the root: a package's module, or a script
  beside `importer` outside the package (a benchmark's folder is on its sys.path)."""
  path = module.replace(".", "/")
  out = [f"{path}.py", f"{path}/__init__.py"]
  if not importer.startswith("tst_jax/"):
    out.append(f"{os.path.dirname(importer)}/{path}.py")
  return out


def moe_path_files(root: str = ROOT) -> list[str]:
  """Lists the files of the MoE path: the lab, what it imports within MOE_FLOOR, and every
  data file in the package folders of those modules (a kernel's tables)."""
  todo, seen = list(MOE_ROOTS), set()
  while todo:
    path = todo.pop()
    if path in seen or not os.path.isfile(os.path.join(root, path)):
      continue
    seen.add(path)
    with open(os.path.join(root, path), encoding="utf-8") as f:
      for module in _imports(f.read()):
        todo += [p for p in _module_files(module, path) if p.startswith(MOE_FLOOR)]
  data = set()
  for folder in {os.path.dirname(p) for p in seen if p.count("/") > 1 and p.startswith("tst_jax/")}:
    for path in glob.glob(os.path.join(root, folder, "**", "*"), recursive=True):
      rel = os.path.relpath(path, root)
      if os.path.isfile(path) and not rel.endswith((".py", ".pyc")) and "__pycache__" not in rel:
        data.add(rel)
  return sorted(seen | data)


def code_files(root: str = ROOT) -> list[str]:
  """Lists the files quick's rows run: the package, the configs and the benchmarks."""
  found = {os.path.relpath(p, root) for g in CODE_GLOBS
           for p in glob.glob(os.path.join(root, g), recursive=True)}
  return sorted(p for p in found if "__pycache__" not in p)


def fingerprints(root: str = ROOT) -> dict:
  """Returns today's fingerprints of the MoE path and of the code."""
  return dict(moe_path=fingerprint(root, moe_path_files(root)),
              code=fingerprint(root, code_files(root)))


def segments(path: str) -> list[dict]:
  """Splits a gpu.jsonl into the runs it holds: each `budget` row opens one with its
  fingerprints and what it carried over; rows before any have none."""
  out = [dict(source=path, budget={}, rows=[])]
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      if not isinstance(row, dict):
        continue
      if row.get("row") == "budget":
        out.append(dict(source=path, budget=row, rows=[]))
      else:
        out[-1]["rows"].append(row)
  return out


def history(folders: list[str]) -> list[dict]:
  """Returns the runs of every gpu.jsonl under `folders`, recursively."""
  segs = []
  for folder in folders:
    if folder and os.path.isdir(folder):
      for path in sorted(glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True)):
        segs += segments(path)
  return segs


def lab_found(segs: list[dict], moe_path: str) -> str | None:
  """Names the file whose lab measured the MoE path `moe_path` to its winners, or None."""
  for seg in segs:
    if seg["budget"].get("moe_path") != moe_path:
      continue
    if seg["budget"].get("lab_found") or any(r.get("piece") == "winners" for r in seg["rows"]):
      return seg["budget"].get("lab_found") or seg["source"]
  return None


def quick_rows(root: str = ROOT) -> list[str]:
  """Names quick's rows a budget runs, in benchmarks/gpu.sh's order: those of a fixed bound,
  not the autotuning row, whose bound QUICK_TUNE_S the budget sets to 0."""
  text = open(os.path.join(root, "benchmarks", "gpu.sh"), encoding="utf-8").read()
  quick = text.split("if want quick; then", 1)[1].split("\nfi\n", 1)[0]
  return re.findall(r"^\s*bounded (\w+) \d+ ", quick, re.M)


def rows_done(segs: list[dict], code: str) -> list[str]:
  """Lists quick's rows that finished (exit status 0) in runs at the code `code`, with those
  their runs carried over."""
  done = []
  for seg in segs:
    if seg["budget"].get("code") == code:
      done += seg["budget"].get("rows_done", [])
      done += [r["row"] for r in seg["rows"] if r.get("rc") == 0 and "row" in r]
  return [r for r in quick_rows() if r in done]


def last_points(last: str, into: str) -> str | None:
  """Copies the finished ladder points of the last run's folder (its points.tar.gz, or runs/
  unpacked) into `into`/runs. Returns `into`, or None without any; unfinished points, which
  a call packs as well, stay behind."""
  shutil.rmtree(into, ignore_errors=True)
  if not last or not os.path.isdir(last):
    return None
  source = last
  packed = os.path.join(last, "points.tar.gz")
  if os.path.isfile(packed):
    source = into + ".unpacked"
    shutil.rmtree(source, ignore_errors=True)
    with tarfile.open(packed) as tar:
      tar.extractall(source, filter="data")
  kept = 0
  for rundir in point_dirs(source):
    steps = read_plan(rundir).plan.total_steps
    if final_eval(rundir, steps) is not None:
      shutil.copytree(rundir.root, os.path.join(into, "runs", rundir.name))
      kept += 1
  shutil.rmtree(into + ".unpacked", ignore_errors=True)
  return into if kept else None


def the_ladder(args) -> tuple[Ladder, list[str], str]:
  """Returns the budget's ladder, the arguments that name it to tools.ladder, and its
  workdir."""
  if args.tiny:
    sets = [x for s in TINY_SETS for x in ("--set", s)]
    return (TINY, ["--config", TINY.config, "--lengths", ",".join(TINY.lengths),
                  "--baseline_factors", ",".join(f"{f:g}" for f in TINY.factors),
                  "--rate", f"{TINY.rate:g}", "--parallel", str(TINY.parallel), *sets],
            args.ladder_dir)
  lad = LADDERS[args.ladder]
  return lad, ["--ladder", lad.name], os.path.join(args.ladder_dir, lad.name)


def last_dir(args) -> str:
  """Names the folder where `start` keeps the last run's finished points for the ladder."""
  return os.path.join(args.workdir, "last_points")


def finished_args(args) -> list[str]:
  """Returns --finished for every folder of finished points: FINISHED's and the last run's."""
  folders = list(args.finished) + ([last_dir(args)] if os.path.isdir(last_dir(args)) else [])
  return [x for f in folders for x in ("--finished", f)]


def ladder_plan(args, budget_s: float) -> tuple[Call | None, str]:
  """Plans the ladder from its finished points: (its next call within `budget_s` seconds of
  training, its report)."""
  lad, named, workdir = the_ladder(args)
  argv = [*named, "--workdir", args.ladder_dir, "--plan_only", "--budget_s", f"{budget_s:.0f}",
          *finished_args(args), *(x for s in args.set for x in ("--set", s))]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    _, call, _ = ladder_tool.run_ladder(ladder_tool.parse_args(argv), lad, workdir,
                                        "python -m tst_jax.tools.ladder " + shlex.join(argv))
  return call, out.getvalue()


def ladder_window(budget_s: float, lab: bool, keep_s: float) -> float:
  """Returns the seconds a budget's ladder trains for, planned before the budget starts:
  what the start, the lab and the ladder's deadline keep (`keep_s`) leave."""
  return budget_s - START_S - keep_s - (LAB_STAGE_S if lab else 0)


def write_row(out: str, row: dict):
  """Appends `row` to OUT/gpu.jsonl."""
  with open(os.path.join(out, "gpu.jsonl"), "a", encoding="utf-8") as f:
    f.write(json.dumps(row) + "\n")


def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _commit() -> str | None:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False).stdout.strip() or None
  except OSError:
    return None


def past_runs(args, *more: str) -> list[dict]:
  """Returns the runs that docs/gpu, the last run's folder and `more` hold."""
  return history([os.path.join(ROOT, "docs", "gpu"), args.last, *more])


def start(args) -> int:
  """Decides the lab and quick's rows, brings the last run's points, writes the `budget` row,
  W/budget.sh for the script and budget.md's plan."""
  prints, segs, files = fingerprints(), past_runs(args), moe_path_files()
  lab_at = lab_found(segs, prints["moe_path"])
  run_lab = {"1": True, "0": False}.get(args.lab, lab_at is None)
  done = rows_done(segs, prints["code"])
  why = (f"measured at this MoE path in {lab_at}" if lab_at else
         "no lab rows at this MoE path in docs/gpu or the last run's folder")
  lab_line = (f"the MoE lab: {'runs' if run_lab else 'skipped'} ({why}"
              f"{', LAB=' + args.lab if args.lab else ''})")
  quick_line = "quick: its rows" + (f" but {', '.join(done)}, done at this code" if done else "")
  lines = [f"Fingerprints: MoE path {prints['moe_path']} ({len(files)} files), code "
           f"{prints['code']}.", f"1. {lab_line}."]
  if args.plan_only:
    last_points(args.last, last_dir(args))
    full = ladder_window(args.budget_s, False, args.keep_s)
    call, report = ladder_plan(args, full)
    print(report)
    window = ladder_window(args.budget_s, run_lab, args.keep_s)
    call = ladder_plan(args, window)[0] if run_lab else call
    lines.append(f"2. the ladder {args.ladder_name}, about {window:.0f} s of training: " + (
        f"POINTS={','.join(call.points)} (about {call.seconds:.0f} s)" if call else
        "nothing that fits") + f". Its calls above are budgets without the lab, about "
        f"{full:.0f} s of training each.")
    lines.append(f"3. {quick_line}, in the time left.")
    print("\n".join(lines))
    return 0
  brought = last_points(args.last, last_dir(args))
  write_row(args.out, dict(
      row="budget", **prints, budget_s=args.budget_s, lab_runs=run_lab, lab_found=lab_at,
      rows_done=done, last=args.last, last_points=brought,
      date=str(datetime.date.today()), commit=_commit(), jax=_version("jax"),
      tokamax=_version("tokamax")))
  lines += [f"2. the ladder {args.ladder_name}: its next points that fit the time left.",
            f"3. {quick_line}, in the time left."]
  with open(os.path.join(args.workdir, "budget.sh"), "w", encoding="utf-8") as f:
    f.write(f"LAB_RUN={int(run_lab)}\nLAB_S={LAB_STAGE_S - 15}\n"
            f"DONE_ROWS={shlex.quote(','.join(done))}\n")
  fileio.write_text(os.path.join(args.out, "budget.md"), head(args) + "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


def head(args) -> str:
  """Returns budget.md's title, command and the heading of its plan."""
  return (f"# GPU budget of {args.budget_s:.0f} s, {datetime.date.today()}\n\n"
          f"`{shlex.join(['bash', 'benchmarks/gpu_budget.sh', args.out])}`"
          f"{', LAST=' + args.last if args.last else ''}\n\n## Plan at the start\n\n")


def ladder(args) -> int:
  """Writes W/ladder_call.sh: the tools.ladder arguments of the next call within --left_s
  (POINTS as given, else the plan's), or none."""
  window = args.left_s - PLAN_S
  call, report = ladder_plan(args, window)
  points = args.points.split(",") if args.points else list(call.points) if call else []
  lad, named, workdir = the_ladder(args)
  with open(os.path.join(args.workdir, "ladder_call.sh"), "w", encoding="utf-8") as f:
    argv = [*named, "--workdir", args.ladder_dir, "--points", ",".join(points), "--budget_s",
            f"{window:.0f}", *finished_args(args)] if points else []
    f.write(f"LADDER_ARGS=({shlex.join(argv)})\nLADDER_WORKDIR={shlex.quote(workdir)}\n")
  write_row(args.out, dict(row="budget_ladder_plan", ladder=lad.name or lad.config,
                           window_s=round(window), points=points,
                           seconds=round(call.seconds) if call and not args.points else None,
                           completes=list(call.completes) if call and not args.points else []))
  if not points:
    print(report.split("Missing:")[-1].strip() if "Missing:" in report else
          "the ladder: every point finished")
  return 0


def report(args) -> int:
  """Writes budget.md and prints the command that goes on with what is still missing."""
  segs = past_runs(args, args.out)
  mine = segments(os.path.join(args.out, "gpu.jsonl"))[-1]     # this run's, as `start` opened it
  prints, rows = mine["budget"], mine["rows"]
  lab_at = lab_found(segs, prints["moe_path"])
  done = rows_done(segs, prints["code"])
  stages = [r for r in rows if r.get("row", "").startswith("budget_") and "rc" in r]
  _, _, workdir = the_ladder(args)
  window = ladder_window(args.budget_s, lab_at is None, args.keep_s)
  call, _ = ladder_plan(args, window)
  result = os.path.join(workdir, "ladder.json")
  points = fileio.read_json(result)["points"] if os.path.isfile(result) else []
  tiny = "TINY=1 " if args.tiny else ""
  next_cmd = f'{tiny}LAST={args.out} bash benchmarks/gpu_budget.sh "$OUT"'
  would = [f"the MoE lab: {'skipped, measured at this MoE path' if lab_at else 'runs'}",
           f"the ladder {args.ladder_name}: " + (f"POINTS={','.join(call.points)} (about "
                                            f"{call.seconds:.0f} s of {window:.0f})" if call
                                            else "no call planned"),
           "quick: " + (", ".join(r for r in quick_rows() if r not in done) or
                        "nothing, every row done at this code")]
  write_row(args.out, dict(row="budget_next", command=next_cmd, lab_runs=lab_at is None,
                           ladder_points=list(call.points) if call else [],
                           rows_done=done))
  lines = [fileio.read_text(os.path.join(args.out, "budget.md")).split("## Stages")[0].rstrip(),
           "", "## Stages", "", "| stage | exit status | seconds | bound |", "|---|---:|---:|---:|"]
  lines += [f"| {r['row'][len('budget_'):]} | {r['rc']} | {r['wall_s']} | {r['bound_s']} |"
            for r in stages]
  if points:
    lines += ["", f"## The ladder {args.ladder_name} after this budget", "",
              ladder_tables.format_points(points), "", ladder_tables.format_rungs(points)]
  lines += ["", "## Next", "", f"`{next_cmd}`", "", "It would run: " + "; ".join(would) + "."]
  fileio.write_text(os.path.join(args.out, "budget.md"), "\n".join(lines) + "\n")
  print("\n".join(lines[lines.index("## Stages"):lines.index("## Stages") + 4 + len(stages)]))
  print(f"\nIt would run next: {'; '.join(would)}.\nKeep {args.out} (docs/gpu/<date>-<device>/ "
        "for a lent GPU's) and give that folder as LAST:")
  print(f"Next: {next_cmd}")
  return 0


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="the budget's output folder")
  p.add_argument("--workdir", required=True, help="the budget's own files and the ladder's")
  p.add_argument("--budget_s", type=float, required=True)
  p.add_argument("--keep_s", type=float, required=True,
                 help="seconds the ladder's deadline keeps (sweep_common.sh's KEEP_S)")
  p.add_argument("--ladder", default="moe", choices=list(LADDERS), help="a named ladder")
  p.add_argument("--last", default="", help="the last run's folder: gpu.jsonl, points.tar.gz")
  p.add_argument("--finished", action="append", default=[], help="more finished points")
  p.add_argument("--set", action="append", default=[], help="override of every ladder run")
  p.add_argument("--tiny", action="store_true", help="the CPU dry run's tiny ladder")
  sub = p.add_subparsers(dest="step", required=True)
  s = sub.add_parser("start")
  s.add_argument("--plan_only", action="store_true")
  s.add_argument("--lab", default="", choices=["", "0", "1"], help="1 runs it, 0 skips it")
  s = sub.add_parser("ladder")
  s.add_argument("--left_s", type=float, required=True)
  s.add_argument("--points", default="", help="the points to train instead of the plan's")
  sub.add_parser("report")
  args = p.parse_args(argv)
  args.ladder_dir = os.path.join(args.workdir, "ladder")
  args.ladder_name = f"tiny ({TINY.config})" if args.tiny else args.ladder
  return args


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.last and not os.path.isfile(os.path.join(args.last, "gpu.jsonl")):
    raise errors.ConfigError("LAST", f"{args.last}: holds no gpu.jsonl: give the folder of "
                             "the last budget's files")
  return dict(start=start, ladder=ladder, report=report)[args.step](args)


if __name__ == "__main__":
  sys.exit(errors.main(main))
