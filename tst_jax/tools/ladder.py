r"""The speed-up ladder: TST's equal-loss speed-up against run length, runs within budgets.

  python -m tst_jax.tools.ladder --ladder moe,dense --workdir runs/ladder --plan_only \
      --budget_s 330                     # on any machine: the points, what is missing, and
                                         # the one budget that adds the most
  python -m tst_jax.tools.ladder --ladder moe --workdir runs/ladder --points <as named> \
      --deadline_s 320 --budget_s 330 --set data.source='text:...'    # that budget's runs
  python -m tst_jax.tools.ladder --config configs/cpu_ladder.py --workdir runs/cpu_ladder \
      --lengths 2k,4k --baseline_factors 0.5,1 --seeds 0          # a ladder of one's own

A ladder (tools/ladder_plan.py: the named ones, or one of --config and --lengths) trains, at
each length T, its TST arms for T steps and baselines of T times each factor, every run a point
of `tools.sweep` in the ladder's workdir (W/<name> for a named one). Finished points are
skipped, interrupted ones resume from their checkpoints, and --deadline_s stops the running
ones with a checkpoint in time. Finished points brought back from other machines (records
only) join with --finished, and runs whose records were not kept with the ladder's `results`:
their sweep's results.json, each row matched to today's config of its arm by S, r, steps and
FLOPs.

Each TST run is measured against the finished baselines of its seed that match it
(tools/compare.py): Δ at equal FLOPs, the equal-loss speed-up, and next to it the speed-up the
Δ/slope model predicts from Δ and the baselines' slope, at its tokens per parameter (B·L
positions of every step over the active parameters). A one-seed Δ inside twice gpu_small's
seed spread gets a second seed planned. Per TST bag size, the exact speed-ups of the finished
rungs give speed-up ≈ a + b·ln(tokens per parameter) over their range. Writes W/ladder.{md,
json,png} (tools/ladder_report.py) and W/speedup_trends.json: the shipped trends with these in place of their recipe's,
to copy over tst_jax/config/speedup_trends.json, which the plan's "where TST pays" line reads.
With --budget_s and the ladder's rate, the missing points are packed into calls of that many
seconds (tools/ladder_plan.py), and the next call of the ladder that adds the most is named.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time

import numpy as np

from tst_jax import errors, fileio
from tst_jax.analysis.frontier import Trend
from tst_jax.tools import arms, compare, sweep
from tst_jax.tools.eval_curve import EvalCurve, config_identity
from tst_jax.tools.ladder_report import fit_trends, merged_trends, write
from tst_jax.tools.ladder_plan import (LADDERS, Call, Ladder, Rung, best_call, call_seconds,
                                       corpus_bytes, needs_second_seed, noise_text, pack_calls,
                                       rung_arms, trend_text)
from tst_jax.tools.sweep.points import point_dir
from tst_jax.tools.sweep.report import finished_arm_runs
from tst_jax.config import defaults
from tst_jax.config.plan import Plan
from tst_jax.run.workdir import final_eval


def make_rungs(ladder: Ladder, seeds: list[int], sets: list[str]
               ) -> tuple[list[Rung], dict[str, Plan]]:
  """Returns the ladder's rungs for each seed and the plan of every point by name. A sized
  ladder gives a rung the corpus its largest run needs (ladder_plan.corpus_bytes)."""
  _, spec = sweep.resolve(ladder.config, sets)
  arm_plans: dict[str, Plan] = {}

  def plan_of(arm: str) -> Plan:
    if arm not in arm_plans:
      point = sweep.make_arm_points([arm], [0])[0]
      arm_plans[arm] = sweep.resolve(point.config_arg(ladder.config), sets)[1].plan
    return arm_plans[arm]

  rungs, own = [], spec.data.max_bytes
  for length in ladder.lengths:
    tst, base = rung_arms(length, ladder.tst_arms, ladder.factors, spec.plan.total_steps)
    size = own
    if ladder.sized and own > 0:
      most = max(plan_of(a).data_tokens_total for a in tst + base)
      size = corpus_bytes(most, own, spec.data.val_fraction)
      if size != own:
        tst, base = rung_arms(length, ladder.tst_arms, ladder.factors, spec.plan.total_steps,
                              f"{size / 1e6:.0f}mb")
    rungs += [Rung(length, seed, tuple(tst), tuple(base), size) for seed in seeds]
  plans = {p.name: plan_of(p.arm) for r in rungs for p in sweep.make_arm_points(
      list(r.arms), [r.seed])}
  return rungs, plans


def results_runs(path: str, ladder: Ladder, rungs: list[Rung]) -> list[tuple[str, int, EvalCurve]]:
  """Reads (arm, seed, run) of each row of a sweep's results.json that matches an arm of the
  ladder's config today in S, r, steps and FLOPs, named and identified as that arm: runs kept
  as their final losses only. Its baselines of every length count, the rungs' TST arms only."""
  record = fileio.read_json(path)
  words = shlex.split(record.get("command", ""))
  sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
  default = sweep.resolve(ladder.config, sets)[1].plan.total_steps
  # The baseline arm of each row's length, as a rung names it.
  candidates = {a for r in rungs for a in r.tst} | {
      rung_arms(defaults.steps_arm(row["steps"]), (), (1,), default)[1][0]
      for row in record["runs"]}
  out = []
  for arm in sorted(candidates):
    point = sweep.make_arm_points([arm], [0])[0]
    config, spec = sweep.resolve(point.config_arg(ladder.config), sets)
    plan = spec.plan
    identity = config_identity(json.loads(config.to_json_best_effort()), plan)
    for row in record["runs"]:
      if (row["r"] == plan.ratio and row["S"] == plan.phases[0].bag_size
          and row["steps"] == plan.total_steps
          and abs(row["flops"] / plan.flops_total - 1) < 1e-9):
        name = sweep.make_arm_points([arm], [row["seed"]])[0].name
        out.append((arm, row["seed"], EvalCurve(
            name, path, np.array([row["steps"]], float), np.array([row["final_loss"]]),
            np.array([row["data_tokens"]], float), plan, identity=identity)))
  return out


def finished_runs(workdir: str, ladder: Ladder, rungs: list[Rung]) -> list:
  """Lists (arm, seed, run) of every finished run of the ladder: its workdir's, then the rows
  of its results files that the workdir does not hold."""
  runs, _ = finished_arm_runs(workdir)
  have = {run.name for _, _, run in runs}
  for path in ladder.results:
    runs += [r for r in results_runs(path, ladder, rungs) if r[2].name not in have]
  return runs


def ladder_points(runs: list, rungs: list[Rung]) -> tuple[list[dict], list[str]]:
  """Returns a record per finished TST run of the rungs, and the notes: its tokens per
  parameter, final loss, Δ at equal FLOPs, measured and predicted speed-up against the
  baselines of its seed and corpus, and whether its Δ stands out of the seed noise."""
  by_name = {run.name: run for _, _, run in runs}
  rung_of = {p: r for r in rungs for p in r.points[:len(r.tst)]}
  _, per_run, notes = arms.summarize_arms(runs)
  points = []
  for row in per_run:
    if row["run"] not in rung_of:
      continue
    plan, rung = by_name[row["run"]].plan, rung_of[row["run"]]
    points.append(dict(
        arm=row["arm"], seed=row["seed"], run=row["run"], length=rung.length, S=row["S"],
        steps=row["steps"], tokens_per_param=plan.tokens_per_param,
        params=plan.params_active, params_total=plan.params_total, passes=row["passes"],
        final_loss=row["final_loss"], delta_equal_flops=row["delta_equal_flops"],
        delta_text=row["delta_text"], speedup=row["speedup"],
        speedup_bound=row["speedup_bound"], speedup_text=row["speedup_text"],
        slope=row["slope"], speedup_predicted=row["speedup_predicted"],
        speedup_predicted_text=row["speedup_predicted_text"], baselines=row["frontier"],
        rung_done=all(p in by_name for p in rung.points)))
  for p in points:
    p["noise"] = noise_text([q["delta_equal_flops"] for q in points
                             if q["arm"] == p["arm"] and q["delta_equal_flops"] is not None])
  # Baselines of another rung's corpus are no baselines of these runs, by design: counted.
  kept = [n for n in notes if "data.max_bytes differs" not in n]
  if len(kept) < len(notes):
    kept.append(f"{len(notes) - len(kept)} pairs of runs on corpora of other sizes are not "
                "compared: each rung is measured against baselines on its own corpus")
  return sorted(points, key=lambda p: (p["tokens_per_param"], p["S"], p["seed"])), kept


def second_seed_rungs(rungs: list[Rung], points: list[dict]) -> list[Rung]:
  """Lists seed-1 copies of the seed-0 rungs with a TST run whose Δ is inside the seed noise,
  where the rung has no second seed yet."""
  seeds = {(r.length, r.seed) for r in rungs}
  out = []
  for rung in rungs:
    mine = [p for p in points if p["length"] == rung.length and p["seed"] == rung.seed]
    if (rung.seed == 0 and (rung.length, 1) not in seeds and mine
        and any(needs_second_seed(p["delta_equal_flops"]) for p in mine)):
      out.append(Rung(rung.length, 1, rung.tst, rung.baselines, rung.corpus_bytes))
  return out


def unfinished_points(workdir: str, names: list[str], have: set[str]) -> list[str]:
  """Lists the points of `names` that are neither in `have` nor finished in `workdir`."""
  left = []
  for name in names:
    rundir = point_dir(workdir, name)
    if name in have:
      continue
    if not fileio.isfile(rundir.sweep_point):
      left.append(name)
    elif final_eval(rundir, Plan.from_json(fileio.read_json(rundir.sweep_point)["plan"])
                    .total_steps) is None:
      left.append(name)
  return left


def check_budget(args, ladder: Ladder, rungs: list[Rung], plans: dict, wanted: list[str]):
  """Refuses, in one line and before anything runs, points that do not fit --budget_s at the
  ladder's rate (nothing to check without both)."""
  rate = args.rate or ladder.rate
  if not (args.budget_s and rate):
    return
  rung_of = {p: r for r in rungs for p in r.points}
  names = [n for n in wanted or rung_of if n in rung_of]
  need = call_seconds(names, rung_of, plans, args.parallel or ladder.parallel, rate)
  if need > args.budget_s:
    raise SystemExit(f"budget: {len(names)} points need about {need:.0f} s at {rate:.3g} "
                     f"FLOP/s, more than the call's {args.budget_s:.0f} s: name fewer "
                     "(--points, as --plan_only advises)")


def train(args, ladder: Ladder, workdir: str, rungs: list[Rung], wanted: list[str]) -> int:
  """Trains the points `wanted` (all the rungs' when empty) with `tools.sweep`, the points of
  one seed at a time, within --deadline_s. Returns the sweep's status."""
  points = {p.name: p for r in rungs for p in sweep.make_arm_points(list(r.arms), [r.seed])}
  names = wanted or list(points)
  unknown = [n for n in names if n not in points]
  if unknown:
    raise errors.ConfigError("--points", f"{unknown}: not points of the ladder "
                             f"{ladder.name or ladder.config} (its: {', '.join(points)})")
  start, status = time.time(), 0
  for seed in sorted({points[n].seed for n in names}):
    order = [points[n].arm for n in names if points[n].seed == seed]
    left = None if args.deadline_s is None else args.deadline_s - (time.time() - start)
    if left is not None and left < 1:
      break
    status |= sweep.main(
        ["--config", ladder.config, "--workdir", workdir, "--arms", ",".join(order),
         "--seeds", str(seed), "--parallel", str(args.parallel or ladder.parallel),
         *(["--deadline_s", str(left)] if left is not None else []),
         *(x for s in args.set for x in ("--set", s))])
  return status


def plan_calls(args, ladder: Ladder, rungs: list[Rung], plans: dict, missing: list[str]
               ) -> tuple[list[Call], list[str]]:
  """Packs the missing points into calls of --budget_s at the ladder's rate (--rate)."""
  rate = args.rate or ladder.rate
  if not (missing and rate and args.budget_s):
    return [], []
  rung_of = {p: r for r in rungs for p in r.points}
  parallel = args.parallel or ladder.parallel
  seconds = lambda names: call_seconds(names, rung_of, plans, parallel, rate)
  return pack_calls(rungs, set(missing), seconds, args.budget_s)


def plan_text(ladder: Ladder, args, rungs: list[Rung], missing: list[str], calls: list[Call],
              too_long: list[tuple[str, float]], extra: list[Rung]) -> list[str]:
  """Says what is missing and which calls finish it, as the report's lines."""
  lines = [""]
  if not missing:
    return lines + ["Every point of the ladder is finished."]
  lines.append(f"Missing: {', '.join(missing)}.")
  if extra:
    lines.append("Second seeds planned (a one-seed Δ inside the noise): "
                 f"{', '.join(r.label for r in extra)}.")
  if not calls and not too_long:
    return lines + ["No calls planned: give --budget_s (and --rate for a ladder without one)."]
  rate = args.rate or ladder.rate
  lines.append(f"Calls of at most {args.budget_s:.0f} s at {rate:.3g} FLOP/s, "
               f"{args.parallel or ladder.parallel} runs at a time, each rung's corpus "
               "tokenized once per call:")
  for i, call in enumerate(calls):
    done = f"; completes {', '.join(call.completes)}" if call.completes else ""
    lines.append(f"{i + 1}. POINTS={','.join(call.points)}: about {call.seconds:.0f} s{done}")
  if too_long:
    lines.append(f"Too long for one call of {args.budget_s:.0f} s, each alone: "
                 f"{', '.join(f'{n} (about {s:.0f} s)' for n, s in too_long)}: a faster step, a "
                 "longer call, or a shorter baseline factor.")
  return lines + [trend_text(rungs, set(missing), calls, args.budget_s)]


def measure(workdir: str, ladder: Ladder, rungs: list[Rung], plans: dict, sets: list[str]):
  """Measures the ladder as its finished runs stand. Returns (its rungs with the second seeds
  they need, their plans, the finished runs, the points, the notes, the second-seed rungs)."""
  runs = finished_runs(workdir, ladder, rungs)
  points, notes = ladder_points(runs, rungs)
  extra = second_seed_rungs(rungs, points)
  if extra:
    more, more_plans = make_rungs(ladder, [1], sets)
    extra = [r for r in more if r.length in {e.length for e in extra}]
    rungs, plans = rungs + extra, plans | more_plans
    points, notes = ladder_points(runs, rungs)
  return rungs, plans, runs, points, notes, extra


def run_ladder(args, ladder: Ladder, workdir: str, command: str
               ) -> tuple[int, Call | None, list[Trend]]:
  """Trains (unless --plan_only), reports and plans one ladder. Returns (status, next call,
  trends)."""
  fileio.check_output(workdir, "--workdir", "a ladder's workdir",   # before any point
                      fileio.RUN_STORES)
  fileio.makedirs(workdir)
  seeds = [int(x) for x in args.seeds.split(",")]
  for folder in list(ladder.finished) + args.finished:
    names = sweep.bring_back(folder, workdir)
    print(f"brought back from {folder}: {', '.join(names) or 'nothing new'}", flush=True)
  rungs, plans = make_rungs(ladder, seeds, args.set)
  status = 0
  if not args.plan_only:
    more, more_plans = measure(workdir, ladder, rungs, plans, args.set)[:2]
    wanted = [n for n in args.points.split(",") if n]
    check_budget(args, ladder, more, more_plans, wanted)
    status = train(args, ladder, workdir, more, wanted)
  rungs, plans, runs, points, notes, extra = measure(workdir, ladder, rungs, plans, args.set)
  have = {run.name for _, _, run in runs}
  missing = unfinished_points(workdir, list(dict.fromkeys(
      p for r in rungs for p in r.points)), have)
  calls, too_long = plan_calls(args, ladder, rungs, plans, missing)
  trends = fit_trends(points, f"{command}; {datetime.date.today().isoformat()}")
  paths = write(workdir, ladder, points, notes, trends, command, missing,
                plan_text(ladder, args, rungs, missing, calls, too_long, extra))
  print(fileio.read_text(paths["md"]))
  return status, calls[0] if calls else None, trends


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.ladder", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ladder", default="",
                 help=f"comma list of named ladders ({', '.join(LADDERS)}), each in "
                      "W/<name>; else --config and --lengths make one in W")
  p.add_argument("--config", default="", help="config file[:arg], e.g. configs/gpu_small.py")
  p.add_argument("--workdir", required=True,
                 help="one subdirectory per run, the reports here: a folder or a bucket's URL")
  p.add_argument("--lengths", default="1k,2k,4k", help="TST run lengths, <N>k each")
  p.add_argument("--baseline_factors", default="0.5,1,1.5,2",
                 help="baselines of each length times these (the frontier around each TST run)")
  p.add_argument("--tst_arms", default="tst", help="the TST arms at every length (e.g. tst,s4)")
  p.add_argument("--seeds", default="0", help="comma list")
  p.add_argument("--parallel", type=int, default=None,
                 help="runs at once (subprocesses); default the ladder's, else 1")
  p.add_argument("--points", default="",
                 help="comma list of the points to train (as a plan names them); default all")
  p.add_argument("--deadline_s", type=float, default=None,
                 help="stop the running points with a checkpoint after this many seconds")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override of every run (repeatable), as --config.KEY=VALUE")
  p.add_argument("--finished", action="append", default=[], metavar="FOLDER",
                 help="finished points brought back from another machine (records, no "
                      "checkpoints: tools.sweep --finished), counted as W's own")
  p.add_argument("--rate", type=float, default=None, metavar="FLOP/S",
                 help="the FLOP/s the runs get together on the device (default: the named "
                      "ladder's, measured)")
  p.add_argument("--budget_s", type=float, default=None,
                 help="seconds one budget trains: pack the missing points into such budgets")
  p.add_argument("--plan_only", action="store_true",
                 help="train nothing: bring back --finished, report, plan the budgets")
  return p.parse_args(argv)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  command = compare.command_line("tst_jax.tools.ladder", argv)
  names = [n for n in args.ladder.split(",") if n]
  unknown = [n for n in names if n not in LADDERS]
  if unknown or not (names or args.config):
    raise errors.ConfigError("--ladder", f"{unknown or 'none'}: give named ladders "
                             f"({', '.join(LADDERS)}) or --config")
  if names:
    ladders = [(LADDERS[n], fileio.join(args.workdir, n)) for n in names]
  else:
    ladders = [(Ladder("", args.config, tuple(x for x in args.lengths.split(",") if x),
                       tuple(args.tst_arms.split(",")),
                       tuple(float(f) for f in args.baseline_factors.split(",")),
                       rate=args.rate, parallel=1, sized=False), args.workdir)]
  fileio.check_output(args.workdir, "--workdir", "a ladder's workdir",   # before any point
                      fileio.RUN_STORES)
  for ladder, _ in ladders:   # each config and --set, also where nothing trains
    sweep.resolve(ladder.config, args.set)
  status, next_calls, trends = 0, {}, []
  for ladder, workdir in ladders:
    code, call, fitted = run_ladder(args, ladder, workdir, command)
    status, next_calls[ladder.name], trends = status | code, call, trends + fitted
  if trends:
    fileio.write_json(fileio.join(args.workdir, "speedup_trends.json"),
                      dict(trends=[t.to_json() for t in merged_trends(trends)]))
  best = best_call(next_calls)
  if best is not None:
    call = next_calls[best]
    done = f"; completes {', '.join(call.completes)}" if call.completes else ""
    print(f"Next call: {'LADDER=' + best + ' ' if best else ''}"
          f"POINTS={','.join(call.points)} (about {call.seconds:.0f} s of "
          f"{args.budget_s:.0f}{done}).")
  return status


if __name__ == "__main__":
  sys.exit(errors.main(main))
