"""Compare finished runs as the paper does: the equal-loss speed-up and Δ at equal FLOPs against
the frontier of finished baselines, and figure 2's loss-vs-FLOPs and loss-vs-data curves.

  python -m tst_jax.tools.compare --runs W_base2k,W_base3k,W_base4k,W_tst [--out DIR]

Reads each run's metrics.jsonl (held-out eval lines), config.json (the plan: FLOPs per step of
each phase) and store.json (its training tokens: the passes over the data). The baselines
(r = 0) among --runs make the frontier (tst_jax/analysis/frontier.py): their final losses
against their total FLOPs, interpolated between lengths. For every run:
  Δ at equal FLOPs       its final loss minus the frontier's at its FLOPs;
  equal-loss speed-up    the frontier's FLOPs to reach its final loss over its FLOPs (a baseline
                         is 1.00x by construction; '>' and '≤' are bounds past the frontier's
                         ends; one baseline length gives none);
  equal data             the longest baseline's eval curve after as many data tokens (figure 2's
                         right panel): a point in the middle of a run whose learning rate has
                         not decayed, so never a speed-up.
Writes DIR/compare.{md,json,png}. `write_arms` makes the same comparison per seed and
summarises it per arm over seeds (`python -m tst_jax.tools.sweep --arms`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import ml_collections
import numpy as np

from tst_jax import errors, fileio
from tst_jax.analysis.frontier import LENGTHS_NEEDED, EqualLoss, Frontier, spread
from tst_jax.data import run_data
from tst_jax.train import defaults, spec as spec_lib
from tst_jax.train.console import human

METHOD = ("Δ at equal FLOPs is the run's final held-out loss minus the finished baselines' "
          "(r = 0; in a sweep, of the run's seed) at its FLOPs; the equal-loss speed-up is the FLOPs at which "
          "those baselines' final losses reach the run's final loss, interpolated between "
          "baseline lengths, over the run's FLOPs (a baseline is 1.00x; '>' and '≤' are bounds "
          "past the longest and shortest baseline). Both use finished runs, whose learning "
          "rate has decayed, never the middle of a longer run's curve.")


@dataclasses.dataclass
class EvalCurve:
  """A finished run's held-out loss curve and plan, read from its workdir."""
  name: str
  workdir: str
  steps: np.ndarray         # eval steps
  loss: np.ndarray          # held-out next-token loss at those steps
  data_tokens: np.ndarray
  phases: list              # plan phases: first_step, steps, flops_per_step, bag_size, name
  r: float
  S: int
  train_tokens: int | None = None   # of the store it read (None: unknown)

  @property
  def total_steps(self) -> int:
    return sum(p["steps"] for p in self.phases)

  @property
  def final_loss(self) -> float:
    return float(self.loss[-1])

  @property
  def is_baseline(self) -> bool:
    return all(p["name"] == "ntp" for p in self.phases)

  def flops_at(self, step):
    """Training FLOPs after `step` (fractional steps allowed) optimizer steps."""
    step = np.asarray(step, dtype=np.float64)
    total = np.zeros_like(step)
    first = 0
    for p in self.phases:
      total += np.clip(step - first, 0, p["steps"]) * p["flops_per_step"]
      first += p["steps"]
    return total

  @property
  def flops(self) -> np.ndarray:
    return self.flops_at(self.steps)

  @property
  def total_flops(self) -> float:
    return float(self.flops_at(self.total_steps))

  @property
  def total_data_tokens(self) -> int:
    return int(sum(p["data_tokens"] for p in self.phases))

  @property
  def passes(self) -> float | None:
    """How many times the run read its training tokens (None: the store is unknown)."""
    return self.total_data_tokens / self.train_tokens if self.train_tokens else None


def load_run(workdir: str, name: str | None = None) -> EvalCurve:
  """A run directory of `main.py` -> its eval curve and plan."""
  for needed in ("config.json", "metrics.jsonl"):
    if not os.path.isfile(os.path.join(workdir, needed)):
      raise errors.DataError(f"{workdir}: has no {needed}: give run directories of main.py")
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.tst.weighting = "uniform"      # FLOPs do not depend on it (and a fitted file may move)
  plan = spec_lib.check(config).plan.to_json()
  evals = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in filter(str.strip, f):
      record = json.loads(line)
      if "eval_loss" in record:
        evals[record["step"]] = record      # the last line of a step wins (resumed runs)
  if not evals:
    raise errors.DataError(f"{workdir}/metrics.jsonl: has no eval lines: give runs that "
                           "reached their first eval")
  rows = [evals[s] for s in sorted(evals)]
  if rows[-1]["step"] != plan["total_steps"]:
    raise errors.DataError(
        f"{workdir}: unfinished (its last eval is at step {rows[-1]['step']} of "
        f"{plan['total_steps']}): compare finished runs, whose learning rate has decayed; "
        "the same command resumes it")
  phases = plan["phases"]
  tst = phases[0] if phases[0]["name"] == "tst" else None
  return EvalCurve(name or os.path.basename(os.path.normpath(workdir)), workdir,
                   np.array([r["step"] for r in rows], float),
                   np.array([r["eval_loss"] for r in rows]),
                   np.array([r["data_tokens"] for r in rows], float), phases,
                   r=float(config.tst.ratio) if tst else 0.0, S=tst["bag_size"] if tst else 1,
                   train_tokens=run_data.workdir_train_tokens(workdir))


def lengths_to_add(steps: int, have_one: bool = True) -> list[str]:
  """Baseline arms of 1.5x and 2x `steps` (and of `steps` itself without any baseline), as
  `--arms` spells them."""
  return ([] if have_one else ["baseline"]) + [
      f"baseline+{defaults.steps_arm(round(steps * f))}" for f in (1.5, 2)]


def frontier_of(runs: list[EvalCurve]) -> Frontier:
  """The finished baselines among `runs`: (total FLOPs, final loss, name)."""
  return Frontier.of((r.total_flops, r.final_loss, r.name) for r in runs if r.is_baseline)


def value_at(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
  """y interpolated at `at`, None outside [x0, x_last]."""
  if at < x[0] or at > x[-1]:
    return None
  return float(np.interp(at, x, y))


def run_row(run: EvalCurve, frontier: Frontier) -> dict:
  """One run against the frontier: Δ at equal FLOPs and the equal-loss speed-up."""
  at = frontier.loss_at(run.total_flops) if np.isfinite(run.final_loss) else None
  if run.is_baseline:                    # a point of the frontier itself, or left out
    equal = (EqualLoss(1.0, "=", run.total_flops) if frontier.holds(run.name) else
             EqualLoss(None, note="left out of the frontier (see the notes)"))
  else:
    equal = frontier.equal_loss(run.final_loss, run.total_flops)
    if equal.note == LENGTHS_NEEDED:
      add = lengths_to_add(run.total_steps, have_one=bool(frontier.points))
      equal = dataclasses.replace(equal, note=f"{equal.note}: add --arms {','.join(add)}")
  return dict(run=run.name, r=run.r, S=run.S, steps=run.total_steps, flops=run.total_flops,
              data_tokens=run.total_data_tokens, passes=run.passes, final_loss=run.final_loss,
              is_baseline=run.is_baseline, frontier=frontier.names,
              frontier_loss_at_equal_flops=at,
              delta_equal_flops=None if at is None else run.final_loss - at,
              equal_loss_flops=equal.flops, speedup=equal.speedup, speedup_bound=equal.bound,
              speedup_text=equal.text())


def frontier_notes(frontier: Frontier, runs: list[EvalCurve], label: str = "") -> list[str]:
  """The baselines left out of the frontier: each ends above a shorter one (data repeats?)."""
  passes = {r.name: r.passes for r in runs}
  return [f"{label}{name} " + (f"ends at {loss:.4f}, above the shorter {shorter}" if shorter
                                else "ends with a non-finite loss") + ": left out of the "
          "frontier" + (f" (it read its training tokens {passes[name]:.1f} times)"
                         if (passes.get(name) or 0) > 1 else "")
          for _, loss, name, shorter in frontier.dropped]


def compare(runs: list[EvalCurve], curve: EvalCurve | None = None) -> list[dict]:
  """One row per run against the frontier of the baselines among `runs`, plus figure 2's
  equal-data view on `curve`'s eval curve (default: the longest baseline)."""
  frontier = frontier_of(runs)
  curve = curve or max((r for r in runs if r.is_baseline), key=lambda r: r.total_flops,
                       default=None)
  rows = []
  for run in runs:
    row = run_row(run, frontier)
    if curve is not None and run is not curve:
      row.update(curve=curve.name, curve_loss_at_equal_data=value_at(
          curve.data_tokens, curve.loss, run.total_data_tokens))
    rows.append(row)
  return rows


def fmt(x, spec=".4f") -> str:
  """`x` formatted, "--" for None."""
  return "--" if x is None else format(x, spec)


def report_head(title: str, command: str = "") -> list[str]:
  """A markdown report's first lines: its title, then the command that made it."""
  return [f"# {title}", ""] + (["```", command, "```", ""] if command else [])


def format_table(rows: list[dict]) -> str:
  lines = ["| run | r | S | steps | FLOPs | data tokens | passes | final eval loss | "
           "Δ at equal FLOPs (finished baselines) | equal-loss speed-up (finished baselines) |",
           "|---" * 10 + "|"]
  for row in rows:
    lines.append(f"| {row['run']} | {row['r']:g} | {row['S']} | {row['steps']} | "
                 f"{human(row['flops'])} | {human(row['data_tokens'])} | "
                 f"{fmt(row['passes'], '.2f')} | {row['final_loss']:.4f} | "
                 f"{fmt(row['delta_equal_flops'], '+.4f')} | {row['speedup_text']} |")
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
  axes[1].set_xscale("log")
  axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[0].legend(fontsize=8)
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
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out_path, dpi=100)
  plt.close(fig)


# -- arms over seeds (python -m tst_jax.tools.sweep --arms) -----------------------------------------
def summarize_arms(runs: list[tuple[str, int, EvalCurve]], order=()
                   ) -> tuple[list[dict], list[dict], list[str]]:
  """(per-arm rows, per-run rows, notes) of (arm, seed, run) triples. Each run is compared
  with the frontier of its seed's finished baselines (`run_row`); per arm, its final loss,
  Δ at equal FLOPs and equal-loss speed-up over the seeds where they are measured."""
  per_run, notes = [], []
  for seed in sorted({seed for _, seed, _ in runs}):
    items = [(arm, run) for arm, s, run in runs if s == seed]
    frontier = frontier_of([run for _, run in items])
    notes += frontier_notes(frontier, [run for _, run in items], f"seed {seed}: ")
    per_run += [dict(run_row(run, frontier), arm=arm, seed=seed) for arm, run in items]
  names = list(dict.fromkeys([a for a in order if any(r["arm"] == a for r in per_run)] +
                             sorted({r["arm"] for r in per_run})))
  arms = []
  for name in names:
    group = [r for r in per_run if r["arm"] == name]
    exact = [r for r in group if r["speedup"] is not None and r["speedup_bound"] == "="]
    arms.append(dict(
        arm=name, r=group[0]["r"], S=group[0]["S"], steps=group[0]["steps"],
        flops=group[0]["flops"], data_tokens=group[0]["data_tokens"],
        passes=group[0]["passes"], seeds=[r["seed"] for r in group],
        is_baseline=all(r["is_baseline"] for r in group),
        final_loss=spread(r["final_loss"] for r in group),
        delta_equal_flops=spread(r["delta_equal_flops"] for r in group
                                 if r["delta_equal_flops"] is not None),
        speedup=spread(r["speedup"] for r in exact),
        speedup_bounds=[dict(seed=r["seed"], bound=r["speedup_bound"], speedup=r["speedup"])
                        for r in group if r["speedup"] is not None and r not in exact],
        speedup_note=next((r["speedup_text"] for r in group if r["speedup"] is None), "")))
  return arms, per_run, notes


def _spread_text(s: dict | None, fmt: str = ".4f", sign: str = "") -> str:
  if s is None:
    return "--"
  text = format(s["mean"], sign + fmt)
  if s["n"] > 1:
    text += (f" ± {s['sd']:{fmt}} [{s['min']:{sign + fmt}}, {s['max']:{sign + fmt}}]")
  return text


def _seeds(n: int) -> str:
  return f"{n} seed" + ("s" if n != 1 else "")


def speedup_text(arm: dict) -> str:
  """'1.15x (1 seed)', '1.30 ± 0.01x [1.29, 1.30] (2 seeds)', '> 1.33x (1 seed)', both for
  mixed seeds, or why there is none."""
  if arm["is_baseline"]:
    return arm["speedup_note"] or "1.00x (a baseline)"
  parts = []
  if arm["speedup"]:
    s = arm["speedup"]
    parts.append(f"{s['mean']:.2f}x ({_seeds(1)})" if s["n"] == 1 else
                 f"{s['mean']:.2f} ± {s['sd']:.2f}x [{s['min']:.2f}, {s['max']:.2f}] "
                 f"({_seeds(s['n'])})")
  for bound in ("≤", ">"):
    hits = [b["speedup"] for b in arm["speedup_bounds"] if b["bound"] == bound]
    if hits:
      value = min(hits) if bound == ">" else max(hits)
      parts.append(f"{bound} {value:.2f}x ({_seeds(len(hits))})")
  return ", ".join(parts) or arm["speedup_note"] or "--"


def format_arms(arms: list[dict], per_run: list[dict]) -> str:
  lines = ["| arm | r | S | steps | FLOPs | data tokens | passes | seeds | final eval loss "
           "(mean ± sd [min, max]) | Δ at equal FLOPs (finished baselines) | equal-loss "
           "speed-up (finished baselines) |", "|---" * 11 + "|"]
  for a in arms:
    lines.append(f"| {a['arm']} | {a['r']:g} | {a['S']} | {a['steps']} | {human(a['flops'])} | "
                 f"{human(a['data_tokens'])} | {fmt(a['passes'], '.2f')} | "
                 f"{','.join(map(str, a['seeds']))} | {_spread_text(a['final_loss'])} | "
                 f"{_spread_text(a['delta_equal_flops'], sign='+')} | {speedup_text(a)} |")
  lines += ["", "| run | arm | seed | final eval loss | passes | baselines' loss at equal "
            "FLOPs | Δ | baselines' FLOPs to equal loss | speed-up |", "|---" * 9 + "|"]
  for r in per_run:
    lines.append(f"| {r['run']} | {r['arm']} | {r['seed']} | {r['final_loss']:.4f} | "
                 f"{fmt(r['passes'], '.2f')} | {fmt(r['frontier_loss_at_equal_flops'])} | "
                 f"{fmt(r['delta_equal_flops'], '+.4f')} | "
                 f"{'' if r['speedup_bound'] == '=' else r['speedup_bound'] + ' '}"
                 f"{human(r['equal_loss_flops'])} | "
                 f"{r['speedup_text']} |")
  return "\n".join(lines)


def plot_arms(runs: list[tuple[str, int, EvalCurve]], out_dir: str) -> list[str]:
  """The figure-2 curves of every run, one colour per arm: held-out loss vs training FLOPs
  (loss_vs_flops.png) and vs data tokens (loss_vs_data.png). Returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = list(dict.fromkeys(arm for arm, _, _ in runs))
  colors = {arm: plt.cm.tab10(i % 10) for i, arm in enumerate(arms)}
  finals = [run.final_loss for _, _, run in runs]
  low = min(float(run.loss.min()) for _, _, run in runs)
  high = max(finals) + 0.5 * (max(finals) - low) + 0.2      # early losses are off the top
  paths = []
  for name, x_of, label in (("loss_vs_flops", lambda r: r.flops, "training FLOPs"),
                            ("loss_vs_data", lambda r: r.data_tokens, "data tokens")):
    fig, ax = plt.subplots(figsize=(7, 4.6))
    labelled = set()
    for arm, seed, run in runs:
      ax.plot(x_of(run), run.loss, color=colors[arm], marker=".", lw=1.2,
              ls="--" if run.is_baseline else "-", alpha=0.85,
              label=None if arm in labelled else arm)
      labelled.add(arm)
    ax.set_ylim(low - 0.05, high)
    ax.set_xlabel(label)
    ax.set_ylabel("held-out next-token loss (nats)")
    ax.set_title(f"Held-out loss vs {label} (every seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, name + ".png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
  return paths


def write_arms(out: str, runs: list[tuple[str, int, EvalCurve]], failed=(), command: str = "",
               order=()) -> dict:
  """out/results.json, out/results.md and the curves of `plot_arms`; returns the paths."""
  paths = dict(json=os.path.join(out, "results.json"), md=os.path.join(out, "results.md"))
  arms, per_run, notes = summarize_arms(runs, order) if runs else ([], [], [])
  fileio.write_json(paths["json"], dict(command=command, method=METHOD, arms=arms,
                                        runs=per_run, notes=notes, failed=list(failed)))
  lines = report_head("TST arms against finished equal-FLOPs baselines", command)
  lines += ["Held-out next-token loss (nats/token) at the last step, over seeds (sd with "
            "n - 1); passes: how many times the run read its training tokens. " + METHOD, ""]
  if arms:
    lines += [format_arms(arms, per_run), ""]
    lines += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    paths["png"] = plot_arms(runs, out)
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in paths["png"]] + [""]
  if failed:
    lines += ["Failed:", ""] + [f"- {f['name']}: {f['error']}" for f in failed] + [""]
  with open(paths["md"], "w") as f:
    f.write("\n".join(lines))
  return paths


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.compare", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", required=True,
                 help="comma list of run workdirs; its baselines (r = 0) make the frontier")
  p.add_argument("--curve", default="",
                 help="the run whose eval curve gives the equal-data view (default: the "
                      "longest baseline)")
  p.add_argument("--out", default="", help="output directory (default: the current one)")
  p.add_argument("--verbosity", type=int, default=0,
                 help="1: tracebacks of user errors too (else one 'error:' line)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  dirs = [d for d in args.runs.split(",") if d]
  if args.curve and args.curve not in dirs:
    dirs.insert(0, args.curve)
  names = [os.path.basename(os.path.normpath(d)) for d in dirs]
  if len(set(names)) < len(names):      # same basenames: name them parent/basename
    names = [os.path.join(*os.path.normpath(os.path.abspath(d)).split(os.sep)[-2:])
             for d in dirs]
  runs = [load_run(d, name) for d, name in zip(dirs, names)]
  curve = runs[dirs.index(args.curve)] if args.curve else None
  rows = compare(runs, curve)
  frontier = frontier_of(runs)
  notes = frontier_notes(frontier, runs)
  table = "\n".join([format_table(rows)] + [f"\nNote: {n}" for n in notes])
  print(table)
  out = args.out or "."
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "compare.md"), "w") as f:
    f.write("\n".join(report_head(
        "Runs against finished baselines", "python -m tst_jax.tools.compare " +
        " ".join(sys.argv[1:] if argv is None else argv))) +
        f"\n{METHOD}\n\n{table}\n\n![comparison](compare.png)\n")
  fileio.write_json(os.path.join(out, "compare.json"),
                    dict(method=METHOD, frontier=[dict(run=n, flops=x, final_loss=y)
                                                  for x, y, n in frontier.points],
                         rows=rows, notes=notes))
  plot(runs, rows, frontier, os.path.join(out, "compare.png"))
  return 0


if __name__ == "__main__":
  sys.exit(errors.main(main, debug="--verbosity=1" in sys.argv))
