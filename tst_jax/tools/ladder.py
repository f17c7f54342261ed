r"""The speed-up ladder: TST's equal-loss speed-up against run length, measured on one GPU.

  python -m tst_jax.tools.ladder --config configs/gpu_small.py --workdir runs/ladder \
      --lengths 1k,2k,4k --seeds 0 --parallel 4 --deadline_s 540

For each length T it trains the config's TST arm, --tst_arm, for T steps and baselines of
T/2, T, 1.5T and 2T steps, --baseline_factors, so that the frontier covers both sides of the
TST run, whether it ends ahead or behind. Every run is a point of `tools.sweep` in W. Finished
points are skipped and interrupted ones resume from their checkpoints, so one call of at most
ten minutes is followed by the same command until every point is done. --deadline_s stops the
running points with a checkpoint in time.

Each TST run's equal-loss speed-up is measured against the finished baselines of its seed by
tst_jax/analysis/frontier.py, at its tokens per parameter: B·L positions of every step over
the active parameters. Writes W/ladder.{md,json,png} with every point, the fit and its plot,
W/results.md with the sweep's table of every arm, and W/speedup_trend.json: speed-up ≈
a + b·ln(tokens per parameter) over the measured range. The plan's "where TST pays" line reads
that file as tst_jax/train/speedup_trend.json.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import numpy as np

from tst_jax import errors, fileio
from tst_jax.analysis.frontier import Trend
from tst_jax.tools import arms, compare, sweep
from tst_jax.tools.sweep.points import POINT_FILE
from tst_jax.tools.sweep.report import finished_arm_runs
from tst_jax.train import defaults
from tst_jax.train.plan import Plan
from tst_jax.train.workdir import final_eval


def ladder_arms(lengths: list[str], factors: list[float], tst_arm: str = "tst"
                ) -> tuple[list[str], list[str]]:
  """(TST arms, baseline arms) of the ladder: the TST arm at each length ('2k' or 's2+2k'),
  and baselines of every length times every factor, without repeats, shortest first."""
  steps = [defaults.arm_steps(length) for length in lengths]
  bad = [length for length, n in zip(lengths, steps) if not n]
  if bad:
    raise errors.ConfigError("--lengths", f"{bad}: give lengths as <N>k (2k, 1.5k, 0.45k)")
  tst = [length if tst_arm == "tst" else f"{tst_arm}+{length}" for length in lengths]
  base = sorted({round(n * f) for n in steps for f in factors})
  return tst, [f"baseline+{defaults.steps_arm(n)}" for n in base]


def run_order(tst: list[str], base: list[str]) -> list[str]:
  """Rung by rung, shortest first: each TST arm, then the baselines up to twice its length
  not yet listed, so that a call cut short leaves whole rungs."""
  order = []
  for arm in sorted(tst, key=lambda a: defaults.arm_steps(a.split("+")[-1])):
    top = 2 * defaults.arm_steps(arm.split("+")[-1])
    order += [arm] + [b for b in base if b not in order
                      and defaults.arm_steps(b.split("+")[-1]) <= top]
  return order + [b for b in base if b not in order]


def ladder_points(workdir: str, tst_arms: list[str]) -> tuple[list[dict], list[str]]:
  """(one record per finished TST run of `tst_arms`, notes): its tokens per parameter, final
  loss, Δ at equal FLOPs and speed-up against the finished baselines of its seed."""
  runs, _ = finished_arm_runs(workdir)
  plans = {run.name: run.plan for _, _, run in runs}
  _, per_run, notes = arms.summarize_arms(runs)
  points = [dict(arm=r["arm"], seed=r["seed"], run=r["run"], steps=r["steps"],
                 tokens_per_param=plans[r["run"]].tokens_per_param,
                 params=plans[r["run"]].params_active, final_loss=r["final_loss"],
                 delta_equal_flops=r["delta_equal_flops"], speedup=r["speedup"],
                 speedup_bound=r["speedup_bound"], speedup_text=r["speedup_text"],
                 baselines=r["frontier"])
            for r in per_run if r["arm"] in tst_arms]
  return sorted(points, key=lambda p: (p["tokens_per_param"], p["seed"])), notes


def unfinished_points(workdir: str, arms: list[str], seeds: list[int]) -> list[str]:
  """Lists the ladder's points, of every arm and seed, that have no final eval."""
  left = []
  for point in sweep.make_arm_points(arms, seeds):
    meta = fileio.join(workdir, point.name, POINT_FILE)
    if not fileio.isfile(meta):
      left.append(point.name)
      continue
    steps = Plan.from_json(fileio.read_json(meta)["plan"]).total_steps
    if final_eval(fileio.join(workdir, point.name), steps) is None:
      left.append(point.name)
  return left


def rungs(tst: list[str], factors: list[float]) -> dict[str, list[str]]:
  """Maps each TST arm's length to the arms its speed-up needs: itself and its baselines."""
  out = {}
  for arm in tst:
    length = arm.split("+")[-1]
    steps = defaults.arm_steps(length)
    out[length] = [arm] + [f"baseline+{defaults.steps_arm(round(steps * f))}"
                           for f in factors]
  return out


def next_call(rung_arms: dict[str, list[str]], missing: set[str], seeds: list[int],
              budget_s: float, estimate) -> str:
  """Spells the one call that completes the most rungs: the shortest rungs first while the
  `estimate(names)` seconds of their `missing` points fit `budget_s`."""
  chosen, names = [], []
  for length, needed in sorted(rung_arms.items(), key=lambda kv: defaults.arm_steps(kv[0])):
    todo = [p.name for p in sweep.make_arm_points(needed, seeds)
            if p.name in missing and p.name not in names]
    if not todo and all(p.name not in missing for p in sweep.make_arm_points(needed, seeds)):
      continue                                         # finished already
    if estimate(names + todo) <= budget_s:
      chosen.append(length)
      names += todo
  if not chosen:
    return (f"No rung's missing points fit {budget_s:.0f} s: ask for more time, or a shorter "
            "--lengths.")
  return (f"Next call: LENGTHS={','.join(chosen)} (rungs at {', '.join(chosen)}: "
          f"{', '.join(names) or 'nothing to train'}; about {estimate(names):.0f} s of "
          f"{budget_s:.0f}).")


def fit(points: list[dict], source: str) -> Trend | None:
  """Fits the trend over the exact speed-ups at the recipe's model size, which every point of a
  ladder shares. Bounds are shown, not fitted."""
  exact = [(p["tokens_per_param"], p["speedup"], f"{p['arm']} seed {p['seed']}")
           for p in points if p["speedup"] is not None and p["speedup_bound"] == "="]
  return Trend.fit(exact, points[0]["params"], source) if exact else None


def write(workdir: str, points: list[dict], notes: list[str], trend: Trend | None,
          command: str, unfinished: list[str], advice: str = "") -> dict:
  """Writes W/ladder.{json,md,png} and, with a trend, W/speedup_trend.json. Returns the paths."""
  paths = {k: fileio.join(workdir, f"ladder.{k}") for k in ("json", "md", "png")}
  fileio.write_json(paths["json"], dict(command=command, method=compare.METHOD, points=points,
                                        notes=notes, unfinished=unfinished,
                                        trend=trend.to_json() if trend else None))
  if trend is not None:
    paths["trend"] = fileio.join(workdir, "speedup_trend.json")
    fileio.write_json(paths["trend"], trend.to_json())
  lines = compare.report_head("The speed-up ladder: equal-loss speed-up against run length",
                              command)
  lines += [compare.METHOD, "",
            "| run | arm | seed | steps | tokens per parameter | final eval loss | Δ at equal "
            "FLOPs | equal-loss speed-up | baselines |", "|---" * 9 + "|"]
  for p in points:
    lines.append(f"| {p['run']} | {p['arm']} | {p['seed']} | {p['steps']} | "
                 f"{p['tokens_per_param']:.3g} | {p['final_loss']:.4f} | "
                 f"{compare.fmt(p['delta_equal_flops'], '+.4f')} | {p['speedup_text']} | "
                 f"{', '.join(p['baselines'])} |")
  lines.append("")
  if unfinished:
    lines.append(f"Missing: {', '.join(unfinished)} (not run, or interrupted: the same "
                 "command on a warm machine resumes those). No trend is fitted until every "
                 "run is finished (a missing long baseline turns a speed-up into a bound).")
  elif trend is None:
    lines.append("No trend: it needs exact speed-ups at two or more tokens per parameter.")
  else:
    lines.append(f"Trend: speed-up ≈ {trend.a:.3f} {trend.b:+.3f} · ln(tokens per parameter), "
                 f"least squares over {len(trend.points)} runs from {trend.low:.3g} to "
                 f"{trend.high:.3g} tokens per parameter (W/speedup_trend.json).")
  lines += [advice] if advice else []
  lines += [f"Note: {n}" for n in notes]
  lines += ["", f"![speed-up against tokens per parameter]({fileio.basename(paths['png'])})",
            ""]
  fileio.write_text(paths["md"], "\n".join(lines))
  plot(points, trend, paths["png"])
  return paths


def plot(points: list[dict], trend: Trend | None, out_path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.6))
  ax.axhline(1.0, color="gray", lw=1, ls=":")
  marker = {"=": "o", ">": "^", "≤": "v"}
  for p in points:
    if p["speedup"] is not None:
      ax.plot(p["tokens_per_param"], p["speedup"], marker[p["speedup_bound"]], color="tab:blue")
  if trend is not None:
    x = np.geomspace(trend.low, trend.high, 50)
    ax.plot(x, trend.a + trend.b * np.log(x), "-", color="tab:orange",
            label=f"{trend.a:.2f} {trend.b:+.2f} ln(x)")
    ax.legend(fontsize=8)
  ax.set_xscale("log")
  ax.set_xlabel("tokens per parameter (the run's B·L positions / active parameters)")
  ax.set_ylabel("equal-loss speed-up vs finished baselines")
  ax.set_title("TST speed-up against run length (^ lower, v upper bounds)")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
  plt.close(fig)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.ladder", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="config file[:arg], e.g. configs/gpu_small.py")
  p.add_argument("--workdir", required=True,
                 help="one subdirectory per run, the reports here: a folder or a bucket's URL")
  p.add_argument("--lengths", default="1k,2k,4k", help="TST run lengths, <N>k each")
  p.add_argument("--baseline_factors", default="0.5,1,1.5,2",
                 help="baselines of each length times these (the frontier around each TST run)")
  p.add_argument("--tst_arm", default="tst", help="the TST arm at every length (e.g. s2)")
  p.add_argument("--seeds", default="0", help="comma list")
  p.add_argument("--parallel", type=int, default=1, help="runs at once (subprocesses)")
  p.add_argument("--deadline_s", type=float, default=None,
                 help="stop the running points with a checkpoint after this many seconds")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override of every run (repeatable), as --config.KEY=VALUE")
  p.add_argument("--finished", action="append", default=[], metavar="FOLDER",
                 help="finished points brought back from another machine (records, no "
                      "checkpoints: tools.sweep --finished), counted as W's own")
  p.add_argument("--rate", type=float, default=None, metavar="FLOP/S",
                 help="with --budget_s: the FLOP/s of the device, to say which one call "
                      "of --budget_s seconds completes the most rungs")
  p.add_argument("--budget_s", type=float, default=None, help="seconds one call trains")
  p.add_argument("--plan_only", action="store_true",
                 help="train nothing: bring back --finished, report, say what is missing")
  args = p.parse_args(argv)
  fileio.check_output(args.workdir, "--workdir", "a ladder's workdir",   # before any point
                      fileio.RUN_STORES)
  sweep.resolve(args.config, args.set)   # the config and --set, also where nothing trains
  factors = [float(f) for f in args.baseline_factors.split(",")]
  tst, base = ladder_arms([x for x in args.lengths.split(",") if x], factors, args.tst_arm)
  order = run_order(tst, base)
  for folder in args.finished:
    names = sweep.bring_back(folder, args.workdir)
    print(f"brought back from {folder}: {', '.join(names) or 'nothing new'}", flush=True)
  sweep_argv = ["--config", args.config, "--workdir", args.workdir, "--arms", ",".join(order),
                "--seeds", args.seeds, "--parallel", str(args.parallel),
                *(["--deadline_s", str(args.deadline_s)] if args.deadline_s else []),
                *(x for s in args.set for x in ("--set", s))]
  status = 0 if args.plan_only else sweep.main(sweep_argv)
  command = compare.command_line("tst_jax.tools.ladder", argv)
  points, notes = ladder_points(args.workdir, tst)
  seeds = [int(x) for x in args.seeds.split(",")]
  unfinished = unfinished_points(args.workdir, order, seeds)
  trend = None if unfinished else fit(points, _source(command))   # no half-measured fit
  paths = write(args.workdir, points, notes, trend, command, unfinished,
                _advice(args, rungs(tst, factors), unfinished, seeds))
  print(fileio.read_text(paths["md"]))
  return status


def _source(command: str) -> str:
  import jax   # pylint: disable=import-outside-toplevel  (costly: only for the trend's source)
  return f"{command}; {jax.devices()[0].device_kind}; {datetime.date.today().isoformat()}"


def _advice(args, rung_arms: dict[str, list[str]], unfinished: list[str],
            seeds: list[int]) -> str:
  """Which one call of --budget_s seconds at --rate completes the most rungs ('' without)."""
  if not unfinished or not (args.rate and args.budget_s):
    return ""
  plans = {}
  for point in sweep.make_arm_points(sorted({a for v in rung_arms.values() for a in v}), seeds):
    if point.name in unfinished:
      plans[point.name] = sweep.resolve(point.config_arg(args.config),
                                        point.overrides(args.set))[1].plan
  estimate = lambda names: sweep.estimate_s([plans[n] for n in names], args.parallel,
                                            args.rate, sweep.OVERHEAD_S)
  return (f"At {args.rate:.3g} FLOP/s and {sweep.OVERHEAD_S:.0f} s per wave of "
          f"{args.parallel}: " + next_call(rung_arms, set(plans), seeds, args.budget_s,
                                            estimate))


if __name__ == "__main__":
  sys.exit(errors.main(main))
