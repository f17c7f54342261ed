"""Compare finished runs as the paper does: the equal-loss speed-up and Δ at equal FLOPs against
the frontier of finished baselines, and figure 2's loss-vs-FLOPs and loss-vs-data curves.

  python -m tst_jax.tools.compare --runs W_base2k,W_base3k,W_base4k,W_tst [--out DIR]

Reads each run's held-out eval lines in metrics.jsonl, its phases and FLOPs in plan.json, or
config.json for a run without one, and its training tokens in store.json, as
tools/eval_curve.py does. The baselines, with r = 0 and no multi-token prediction, among
--runs make the frontier of tst_jax/analysis/frontier.py: their final losses against their
total FLOPs, interpolated between lengths in log FLOPs. A baseline counts for a run only if it
equals the run in all but the TST and MTP settings, the step count and the seed: the same
model, data shapes, optimizer, schedule and token store. One left out gets a note naming the field, and a TST run with none
left is an error. For every run:
  Δ at equal FLOPs       its final loss minus the frontier's at its FLOPs
  equal-loss speed-up    the frontier's FLOPs to reach its final loss over its FLOPs. A baseline
                         is 1.00x by construction. '>' and '≤' are bounds past the frontier's
                         ends or from one baseline. With three or more lengths a power law's
                         speed-up shows too, in its own column.
  equal data             the longest baseline's eval curve after as many data tokens, as in
                         figure 2's right panel: a point in the middle of a run whose learning
                         rate has not decayed, so never a speed-up.
  bits per byte          its final held-out loss per byte of text, which runs of other
                         tokenizers share ('bytes unknown': a store prepared before stores
                         recorded them); `--rank bpb` orders the table by it, and keeps
                         a run no baseline matches, such as one of another tokenizer.
  phase-1 bag loss       its held-out MCE on phase 1's bags at the switch (eval_bag_loss).
Prints the table; with --out DIR also writes DIR/compare.{md,json,png} and says so. A row that
needs more baselines says how to train them: the sweep command of a sweep's point, else the
arms to add to the command that trained the run. tools/arms.py makes the same comparison per
seed and summarises it per arm over seeds (`python -m tst_jax.tools.sweep --arms`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys

import numpy as np

from tst_jax import errors, fileio
from tst_jax.rundir import RunDir
from tst_jax.analysis.frontier import (FIT_DISAGREES, LENGTHS_NEEDED, WIDE_BRACKET, EqualLoss,
                                       Frontier)
from tst_jax.tools.eval_curve import EvalCurve, differs, load_run
from tst_jax.config import defaults
from tst_jax.run.console import human

METHOD = ("Δ at equal FLOPs is the run's final held-out loss minus the finished baselines' "
          "(r = 0 without MTP, equal to the run in all but the TST and MTP settings, steps and "
          "seed; in a sweep, "
          "of the run's seed) at its FLOPs; the equal-loss speed-up is the FLOPs at which "
          "those baselines' final losses reach the run's final loss, interpolated between "
          "baseline lengths in log FLOPs, over the run's FLOPs (a baseline is 1.00x; '>' and "
          "'≤' are bounds past the longest and shortest baseline, or from one baseline). With "
          "three or more lengths a power law E + A·F^-α fitted to them gives a second "
          "speed-up. Both use finished runs, whose learning rate has decayed, never the "
          "middle of a longer run's curve. The predicted speed-up is exp(Δ / s), s the "
          "slope of those final losses per e-fold of FLOPs between the two lengths next to "
          "the run toward its equal loss ('~': past the frontier's end, the end segment's).")


def lengths_to_add(steps: int, have_one: bool = True) -> list[str]:
  """Names the baseline arms of 1.5x and 2x `steps`, and of `steps` itself without any
  baseline, as `--arms` spells them."""
  return ([] if have_one else ["baseline"]) + [
      f"baseline+{defaults.steps_arm(round(steps * f))}" for f in (1.5, 2)]


def between_arm(frontier: Frontier, bracket: tuple[float, float]) -> str:
  """Names the `baseline+<N>k` arm halfway between two baselines in log FLOPs, N to two digits."""
  steps = math.sqrt(bracket[0] * bracket[1]) / frontier.flops_per_step
  digits = 10 ** max(int(math.log10(steps)) - 1, 0)
  return f"baseline+{defaults.steps_arm(round(steps / digits) * digits)}"


def frontier_of(runs: list[EvalCurve]) -> Frontier:
  """Returns the frontier of the finished baselines among `runs`."""
  baselines = [r for r in runs if r.is_baseline]
  return Frontier.of(((r.total_flops, r.final_loss, r.name) for r in baselines),
                     baselines[0].plan.phases[-1].flops_per_step if baselines else None)


def frontier_for(run: EvalCurve, runs: list[EvalCurve]) -> tuple[Frontier, list[str]]:
  """Returns the frontier of the baselines among `runs` that equal `run` in all but the TST
  settings, the step count and the seed, and for a TST run one line per baseline left out."""
  kept, notes = [], []
  for other in runs:
    why = differs(other, run) if other.is_baseline else ""
    if why and not run.is_baseline:
      notes.append(f"{other.name} is not a baseline of {run.name}: {why}")
    elif other.is_baseline and not why:
      kept.append(other)
  return frontier_of(kept), notes


def value_at(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
  """y interpolated at `at`, None outside [x0, x_last]."""
  if at < x[0] or at > x[-1]:
    return None
  return float(np.interp(at, x, y))


def sweep_hint(run: EvalCurve, arms: list[str]) -> str:
  """Says to add baseline `arms` to the sweep that made `run`: its tables come from one."""
  del run
  return f"add --arms {','.join(arms)}"


def runs_hint(run: EvalCurve, arms: list[str]) -> str:
  """Says how to train the baseline `arms` of `run` for compare's --runs: the sweep command of
  its point where a sweep made it, else the arms to add to the command that trained it."""
  record = (fileio.read_json(RunDir(run.workdir).sweep_point)
            if fileio.isfile(RunDir(run.workdir).sweep_point) else {})
  if record.get("arm") and record.get("config"):
    path, _, arg = record["config"].partition(":")
    own = defaults.arms(record["arm"].replace("+", ","))
    rest = defaults.arms(arg)[:-len(own)] if own else defaults.arms(arg)
    config = path + (":" + ",".join(rest) if rest else "")
    taken = {f for a in arms for f in defaults.arm_fields(a.replace("+", ","))}   # by the arms
    sets = [o for o in record.get("overrides", []) if o.partition("=")[0] not in
            ("seed", *taken)]
    command = shlex.join(["python", "-m", "tst_jax.tools.sweep", "--config", config,
                          "--workdir", fileio.dirname(run.workdir), "--arms", ",".join(arms),
                          "--seeds", str(record.get("seed", 0)),
                          *(x for o in sets for x in ("--set", o))])
    return f"train them with {command}, then add their folders to --runs"
  each = ", ".join(f"'{a.replace('+', ',')}'" for a in arms)
  first = arms[0].replace("+", ",")
  return (f"train them: the command that trained {run.name} once per arm, {each}, added to "
          f"its --config's arms (c.py:2k becomes c.py:2k,{first}), each in a new --workdir, "
          "then add those folders to --runs")


def run_row(run: EvalCurve, frontier: Frontier, left_out: int = 0, hint=sweep_hint) -> dict:
  """Compares one run with the frontier: Δ at equal FLOPs, the equal-loss speed-up, the power
  law's, the one the Δ/slope model predicts, and the row's warnings. Δ is None outside the
  frontier, where `delta_text` bounds it, and then nothing is predicted. `hint(run, arms)`
  says how to add the baseline arms a row asks for, in the terms of the command that runs."""
  delta, delta_bound = frontier.delta(run.final_loss, run.total_flops)
  if run.is_baseline:                    # a point of the frontier itself, or left out
    equal = (EqualLoss(1.0, "=", run.total_flops) if frontier.holds(run.name) else
             EqualLoss(None, note="left out of the frontier (see the notes)"))
  elif not frontier.points and left_out:
    equal = EqualLoss(None, note="no baseline matches it (see the notes)")
  else:
    equal = frontier.equal_loss(run.final_loss, run.total_flops)
    if equal.note == LENGTHS_NEEDED and left_out:
      equal = dataclasses.replace(equal, note=f"one matching baseline length, {left_out} "
                                  "other baselines left out (see the notes)")
    if equal.speedup is None and equal.note != "its final loss is not finite":
      add = lengths_to_add(run.total_steps, have_one=bool(frontier.points))
      equal = dataclasses.replace(equal, note=f"{equal.note}: {hint(run, add)}")
  warnings = []
  if equal.wide:
    warnings.append(f"its baselines are {equal.bracket[1] / equal.bracket[0]:.1f}x apart in "
                    f"FLOPs, wider than {WIDE_BRACKET:g}x: "
                    f"{hint(run, [between_arm(frontier, equal.bracket)])}")
  if equal.fit_disagrees:
    warnings.append(f"the power law fitted to the baselines gives {equal.fit:.2f}x, more "
                    f"than {FIT_DISAGREES:.0%} from {equal.text()}")
  slope = (frontier.slope_at(run.total_flops, delta)
           if delta_bound == "=" and delta is not None and not run.is_baseline else None)
  return dict(run=run.name, r=run.r, S=run.S, steps=run.total_steps, flops=run.total_flops,
              data_tokens=run.total_data_tokens, passes=run.passes, final_loss=run.final_loss,
              final_bpb=run.final_bpb, phase1_bag_loss=run.phase1_bag_loss,
              is_baseline=run.is_baseline,
              frontier=frontier.names,
              frontier_loss_at_equal_flops=frontier.loss_at(run.total_flops),
              delta_equal_flops=delta if delta_bound == "=" else None, delta_bound=delta_bound,
              delta_text=bounded(delta, delta_bound, "+.4f"),
              equal_loss_flops=equal.flops, speedup=equal.speedup, speedup_bound=equal.bound,
              speedup_text=equal.text() + (" (see the warnings)" if warnings else ""),
              speedup_fit=equal.fit, slope=slope.value if slope else None,
              slope_bracket=slope.bracket if slope else None,
              speedup_predicted=slope.speedup(delta) if slope else None,
              speedup_predicted_text=slope.text(delta) if slope else "--",
              warnings=warnings)


def bounded(x, bound: str, form: str) -> str:
  """`x` formatted after its bound ('≤ -0.0500'), '--' for None."""
  return fmt(x, form) if x is None or bound == "=" else f"{bound} {x:{form}}"


def frontier_notes(frontier: Frontier, runs: list[EvalCurve], label: str = "") -> list[str]:
  """Lists the baselines left out of the frontier: each ends above a shorter one."""
  # A longer run can end higher when it repeats its data.
  passes = {r.name: r.passes for r in runs}
  return [f"{label}{name} " + (f"ends at {loss:.4f}, above the shorter {shorter}" if shorter
                                else "ends with a non-finite loss") + ": left out of the "
          "frontier" + (f" (it read its training tokens {passes[name]:.1f} times)"
                         if (passes.get(name) or 0) > 1 else "")
          for _, loss, name, shorter in frontier.dropped]


def compare(runs: list[EvalCurve], curve: EvalCurve | None = None, *,
            need_baselines: bool = True) -> tuple[list[dict], list[str]]:
  """(one row per run against the frontier of its own baselines, the notes), plus figure 2's
  equal-data view on `curve`'s eval curve (default: the longest baseline). A TST run that no
  baseline among `runs` matches is an error, unless not `need_baselines`, as when runs of
  other tokenizers are ranked by bits per byte: its row then has no Δ and no speed-up."""
  curve = curve or max((r for r in runs if r.is_baseline), key=lambda r: r.total_flops,
                       default=None)
  rows, notes = [], []
  for run in runs:
    frontier, left_out = frontier_for(run, runs)
    if left_out and not frontier.points and need_baselines:
      more = f" ({len(left_out) - 1} more left out)" if len(left_out) > 1 else ""
      raise errors.DataError(f"{run.name}: no baseline among the runs matches it: "
                             f"{left_out[0]}{more}")
    row = run_row(run, frontier, len(left_out), runs_hint)
    notes += left_out + frontier_notes(frontier, runs) + [
        f"{run.name}: {w}" for w in row["warnings"]]
    if curve is not None and run is not curve:
      row.update(curve=curve.name, curve_loss_at_equal_data=value_at(
          curve.data_tokens, curve.loss, run.total_data_tokens))
    rows.append(row)
  return rows, list(dict.fromkeys(notes))


RANKS = ("", "loss", "bpb")   # --rank: the order given, or by final loss or bits per byte


def ranked(rows: list[dict], by: str) -> list[dict]:
  """Orders `rows` by their final held-out loss or bits per byte, lowest first, rows whose
  bytes are unknown last; '' keeps their order."""
  if not by:
    return rows
  key = "final_loss" if by == "loss" else "final_bpb"
  return sorted(rows, key=lambda row: (row[key] is None, row[key] or 0.0))


def fmt(x, form: str = ".4f") -> str:
  """`x` formatted, "--" for None."""
  return "--" if x is None else format(x, form)


def fit_text(row: dict) -> str:
  """Formats the power law's speed-up of a row, '--' without one."""
  return "--" if row["speedup_fit"] is None else f"{row['speedup_fit']:.2f}x"


def command_line(module: str, argv) -> str:
  """Spells the command `python -m module` with `argv` as a report quotes it, an argument with
  a space, semicolon or '*' in single quotes."""
  return f"python -m {module} " + " ".join(
      f"'{a}'" if any(c in a for c in " ;*") else a for a in argv)


def report_head(title: str, command: str = "") -> list[str]:
  """Returns a markdown report's first lines: its title, then the command that made it."""
  return [f"# {title}", ""] + (["```", command, "```", ""] if command else [])


def format_table(rows: list[dict]) -> str:
  lines = ["| run | r | S | steps | FLOPs | data tokens | passes | final eval loss | "
           "bits per byte | phase-1 held-out bag loss | "
           "Δ at equal FLOPs (finished baselines) | equal-loss speed-up (finished baselines) | "
           "power-law fit | slope s per e-fold of FLOPs | predicted exp(Δ/s) |",
           "|---" * 15 + "|"]
  for row in rows:
    bpb = "bytes unknown" if row["final_bpb"] is None else f"{row['final_bpb']:.4f}"
    lines.append(f"| {row['run']} | {row['r']:g} | {row['S']} | {row['steps']} | "
                 f"{human(row['flops'])} | {human(row['data_tokens'])} | "
                 f"{fmt(row['passes'], '.2f')} | {row['final_loss']:.4f} | {bpb} | "
                 f"{fmt(row['phase1_bag_loss'])} | "
                 f"{row['delta_text']} | {row['speedup_text']} | "
                 f"{fit_text(row)} | {fmt(row['slope'], '+.4f')} | "
                 f"{row['speedup_predicted_text']} |")
  curve = next((r["curve"] for r in rows if r.get("curve")), None)
  if curve:
    lines += ["", f"Equal data (figure 2, right): {curve}'s eval curve after as many data "
              "tokens. A mid-run point (its learning rate has not decayed): not a speed-up.", "",
              f"| run | data tokens | {curve} at equal data | Δ |", "|---|---|---|---|"]
    for row in rows:
      if row.get("curve"):
        base = row["curve_loss_at_equal_data"]
        lines.append(f"| {row['run']} | {human(row['data_tokens'])} | "
                     f"{'not covered' if base is None else f'{base:.4f}'} | "
                     f"{fmt(None if base is None else row['final_loss'] - base, '+.4f')} |")
  return "\n".join(lines)


def plot(runs: list[EvalCurve], rows: list[dict], frontier: Frontier, out_path: str):
  """Loss vs FLOPs and vs data tokens (every run's curve), and the frontier of finished
  baselines with each run's final loss on it."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
  for run in runs:
    style = dict(ls="--" if run.is_baseline else "-", marker=".", label=run.name)
    line, = axes[0].plot(run.flops, run.loss, **style)
    axes[1].plot(run.data_tokens, run.loss, color=line.get_color(), **style)
  for ax, label, title in ((axes[0], "training FLOPs", "Equal-FLOPs"),
                           (axes[1], "data tokens", "Equal-data")):
    ax.set_xlabel(label)
    ax.set_ylabel("held-out next-token loss (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  if any((run.data_tokens > 0).any() for run in runs):   # a log axis needs a positive value
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[0].legend(fontsize=8, loc="upper right")
  ax = axes[2]
  if frontier.points:
    ax.plot(frontier.flops, frontier.losses, "k.--", label="finished baselines")
  for row in rows:
    if row["is_baseline"]:
      continue
    point, = ax.plot(row["flops"], row["final_loss"], "*", ms=10, label=row["run"])
    if row["equal_loss_flops"] is not None:
      ax.annotate(row["speedup_text"], (row["flops"], row["final_loss"]), fontsize=8,
                  xytext=(4, 4), textcoords="offset points", color=point.get_color())
  ax.set_xlabel("training FLOPs")
  ax.set_ylabel("final held-out loss (nats)")
  ax.set_title("Equal-loss: final losses against the finished baselines")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="upper right")
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
  plt.close(fig)


def run_names(dirs: list[str]) -> list[str]:
  """Names each run directory, a local one or a bucket's, by its last part, or by its last two
  where two runs' last parts agree."""
  parts = [fileio.absolute(d).rstrip("/").split("/") for d in dirs]
  names = [p[-1] for p in parts]
  return names if len(set(names)) == len(names) else ["/".join(p[-2:]) for p in parts]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.compare", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", required=True,
                 help="comma list of run workdirs; its baselines (r = 0) make the frontier")
  p.add_argument("--curve", default="",
                 help="the run whose eval curve gives the equal-data view (default: the "
                      "longest baseline)")
  p.add_argument("--out", default="",
                 help="folder for compare.{md,json,png}, local or a bucket's (default: none, "
                      "the table is printed only)")
  p.add_argument("--rank", default="", choices=RANKS,
                 help="order the table by final loss or bits per byte (default: as given)")
  p.add_argument("--verbosity", type=int, default=0,
                 help="1: tracebacks of user errors too (else one 'error:' line)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  out = args.out
  if out:
    fileio.check_output(out, "--out", "the comparison's folder")   # before the runs are read
  dirs = [d for d in args.runs.split(",") if d]
  if args.curve and args.curve not in dirs:
    dirs.insert(0, args.curve)
  runs = [load_run(d, name) for d, name in zip(dirs, run_names(dirs))]
  curve = runs[dirs.index(args.curve)] if args.curve else None
  rows, notes = compare(runs, curve, need_baselines=args.rank != "bpb")
  rows = ranked(rows, args.rank)
  tst = next((r for r in runs if not r.is_baseline), None)
  frontier = frontier_for(tst, runs)[0] if tst else frontier_of(runs)
  table = "\n".join([format_table(rows)] + [f"\nNote: {n}" for n in notes])
  print(table)
  if not out:
    print("\nnothing written: --out DIR writes compare.md, compare.json and compare.png there")
    return 0
  fileio.makedirs(out)
  fileio.write_text(fileio.join(out, "compare.md"), "\n".join(report_head(
      "Runs against finished baselines",
      command_line("tst_jax.tools.compare", sys.argv[1:] if argv is None else argv))) +
      f"\n{METHOD}\n\n{table}\n\n![comparison](compare.png)\n")
  fileio.write_json(fileio.join(out, "compare.json"),
                    dict(method=METHOD, frontier=[dict(run=n, flops=x, final_loss=y)
                                                  for x, y, n in frontier.points],
                         rows=rows, notes=notes))
  plot(runs, rows, frontier, fileio.join(out, "compare.png"))
  written = (fileio.join(out, f) for f in ("compare.md", "compare.json", "compare.png"))
  print(f"\nwrote {', '.join(written)}")
  return 0


if __name__ == "__main__":
  sys.exit(errors.main(main, debug="--verbosity=1" in sys.argv))
