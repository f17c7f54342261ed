"""Compare runs as the paper's figure 2: loss vs FLOPs, loss vs data tokens, equal-loss speedup.

  python -m tst_jax.tools.compare --runs W_base,W_tst [--baseline W_base] [--out DIR]

Reads each run's metrics.jsonl (held-out eval lines) and config.json (for the plan's FLOPs per
step of each phase). For every non-baseline run it reports
  equal-FLOPs: the baseline's eval loss at the run's total FLOPs (interpolated on its curve);
  equal-data:  the baseline's eval loss at the run's total data tokens (if it read that many);
  equal-loss:  the steps and FLOPs the baseline needs to reach the run's final eval loss,
               linearly interpolated between its eval points (or "not reached").
Several baselines (r = 0) in --runs also give the paper's own equal-loss view: the final losses
of those runs against their FLOPs. Writes DIR/compare.{md,json,png}. `write_arms` is the
same comparison per seed, summarised per arm over seeds (`python -m tst_jax.tools.sweep --arms`).
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
from tst_jax.train import spec as spec_lib
from tst_jax.train.console import human


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
  phases = plan["phases"]
  tst = phases[0] if phases[0]["name"] == "tst" else None
  return EvalCurve(name or os.path.basename(os.path.normpath(workdir)), workdir,
             np.array([r["step"] for r in rows], float), np.array([r["eval_loss"] for r in rows]),
             np.array([r["data_tokens"] for r in rows], float), phases,
             r=float(config.tst.ratio) if tst else 0.0,
             S=tst["bag_size"] if tst else 1)


def crossing(x: np.ndarray, y: np.ndarray, target: float) -> tuple[float | None, str]:
  """The first x where the curve y(x) reaches `target` (y <= target), linearly interpolated
  between the eval points around it: (x, note). note is '' for an interpolated crossing,
  'at or before the first eval' when the first point is already below, and
  'not reached' (x None) when no point is."""
  below = np.nonzero(y <= target)[0]
  if below.size == 0:
    return None, "not reached"
  i = int(below[0])
  if i == 0:
    return float(x[0]), "at or before the first eval"
  x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
  return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y1)), ""


def value_at(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
  """y interpolated at `at`, None outside [x0, x_last]."""
  if at < x[0] or at > x[-1]:
    return None
  return float(np.interp(at, x, y))


def compare(runs: list[EvalCurve], baseline: EvalCurve) -> list[dict]:
  """One row per run other than the baseline: the three views."""
  rows = []
  base_flops = baseline.flops
  frontier = sorted((r.total_flops, r.final_loss, r.total_steps) for r in runs if r.is_baseline)
  for run in runs:
    if run is baseline:
      continue
    steps, note = crossing(baseline.steps, baseline.loss, run.final_loss)
    flops = None if steps is None else float(baseline.flops_at(steps))
    row = dict(
        run=run.name, r=run.r, S=run.S, steps=run.total_steps, flops=run.total_flops,
        data_tokens=run.total_data_tokens, final_loss=run.final_loss,
        baseline=baseline.name, baseline_final_loss=baseline.final_loss,
        baseline_loss_at_equal_flops=value_at(base_flops, baseline.loss, run.total_flops),
        baseline_loss_at_equal_data=value_at(baseline.data_tokens, baseline.loss,
                                              run.total_data_tokens),
        baseline_steps_to_equal_loss=steps, baseline_flops_to_equal_loss=flops,
        equal_loss_note=note,
        speedup_steps=None if steps is None else steps / run.total_steps,
        speedup_flops=None if flops is None else flops / run.total_flops,
        speedup_lower_bound=(baseline.total_steps / run.total_steps if steps is None else None))
    if len(frontier) >= 2:    # the paper's view: final losses of several baseline runs
      fx, note = crossing(np.array([f[0] for f in frontier]), np.array([f[1] for f in frontier]),
                          run.final_loss)
      row["frontier_flops_to_equal_loss"] = fx
      row["frontier_speedup_flops"] = None if fx is None else fx / run.total_flops
      row["frontier_note"] = note.replace("at or before the first eval",
                                          "at or below the smallest baseline")
    rows.append(row)
  return rows


def _f(x, fmt=".4f"):
  return "--" if x is None else format(x, fmt)


def report_head(title: str, command: str = "") -> list[str]:
  """A markdown report's first lines: its title, then the command that made it."""
  return [f"# {title}", ""] + (["```", command, "```", ""] if command else [])


def format_table(rows: list[dict], runs: list[EvalCurve]) -> str:
  lines = ["| run | r | S | steps | FLOPs | data tokens | final eval loss |",
           "|---|---|---|---|---|---|---|"]
  for run in runs:
    lines.append(f"| {run.name} | {run.r:g} | {run.S} | {run.total_steps} | "
                 f"{human(run.total_flops)} | {human(run.total_data_tokens)} | "
                 f"{run.final_loss:.4f} |")
  lines += ["", "| run | vs baseline | equal-FLOPs: baseline loss (Δ) | "
            "equal-data: baseline loss (Δ) | equal-loss: baseline steps (FLOPs) | speedup |",
            "|---|---|---|---|---|---|"]
  for row in rows:
    def delta(base):
      return "not covered" if base is None else f"{base:.4f} ({row['final_loss'] - base:+.4f})"
    if row["baseline_steps_to_equal_loss"] is None:
      equal = f"not reached in {row['speedup_lower_bound'] * row['steps']:.0f} steps"
      speed = f"> {row['speedup_lower_bound']:.2f}x"
    else:
      equal = (f"{row['baseline_steps_to_equal_loss']:.1f} "
               f"({human(row['baseline_flops_to_equal_loss'])})")
      bound = ""
      if row["equal_loss_note"]:       # reached by the first eval: an upper bound
        equal += f", {row['equal_loss_note']}"
        bound = "≤ "
      speed = f"{bound}{row['speedup_steps']:.2f}x steps, {bound}{row['speedup_flops']:.2f}x FLOPs"
    lines.append(f"| {row['run']} | {row['baseline']} | "
                 f"{delta(row['baseline_loss_at_equal_flops'])} | "
                 f"{delta(row['baseline_loss_at_equal_data'])} | {equal} | {speed} |")
  if any("frontier_flops_to_equal_loss" in r for r in rows):
    lines += ["", "Equal loss against the final losses of the baseline runs (the paper's view):",
              "", "| run | baseline FLOPs to equal loss | speedup (FLOPs) |", "|---|---|---|"]
    for row in rows:
      fx = row.get("frontier_flops_to_equal_loss")
      note = row.get("frontier_note", "")
      bound = "≤ " if note and fx is not None else ""
      lines.append(f"| {row['run']} | {human(fx)}{', ' + note if note else ''} | "
                   f"{bound}{_f(row.get('frontier_speedup_flops'), '.2f')}x |")
  return "\n".join(lines)


def plot(runs: list[EvalCurve], baseline: EvalCurve, rows: list[dict], out_path: str):
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
  names = [r["run"] for r in rows]
  x = np.arange(len(rows))
  ax.bar(x - 0.2, [r["flops"] for r in rows], 0.4, label="the run (its total)")
  needed = [r["baseline_flops_to_equal_loss"] for r in rows]
  ax.bar(x + 0.2, [n if n is not None else baseline.total_flops for n in needed], 0.4,
         label=f"{baseline.name} to reach the same loss", color="tab:gray")
  for i, (n, r) in enumerate(zip(needed, rows)):
    if n is None:
      text = f"not reached\n(> {baseline.total_flops / r['flops']:.2f}x)"
    else:
      text = ("≤ " if r["equal_loss_note"] else "") + f"{r['speedup_flops']:.2f}x"
    ax.text(i + 0.2, n if n is not None else baseline.total_flops, text, ha="center",
            va="bottom", fontsize=8)
  ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
  ax.set_ylabel("training FLOPs")
  ax.set_title("Equal-loss: FLOPs to the run's final loss")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out_path, dpi=100)
  plt.close(fig)


# -- arms over seeds (python -m tst_jax.tools.sweep --arms) -----------------------------------------
def spread(values) -> dict | None:
  """mean, sd (n - 1; None for one value), min, max and n of `values`; None if empty."""
  v = np.asarray(list(values), dtype=np.float64)
  if not v.size:
    return None
  return dict(mean=float(v.mean()), sd=float(v.std(ddof=1)) if v.size > 1 else None,
              min=float(v.min()), max=float(v.max()), n=int(v.size))


def summarize_arms(runs: list[tuple[str, int, EvalCurve]], order=()) -> tuple[list[dict], list[dict]]:
  """(per-arm rows, per-run rows) of (arm, seed, run) triples. Each run is compared with the
  reference of its seed (the r = 0 run with the most FLOPs, whose curve covers the others);
  each arm's final loss, loss minus the reference's at equal FLOPs, and equal-loss speed-up
  (the reference's FLOPs to reach the run's final loss / the run's FLOPs) over its seeds."""
  per_run = []
  for seed in sorted({seed for _, seed, _ in runs}):
    items = [(arm, run) for arm, s, run in runs if s == seed]
    baselines = [run for _, run in items if run.is_baseline]
    ref = max(baselines, key=lambda r: r.total_flops) if baselines else None
    rows = {row["run"]: row for row in compare([run for _, run in items], ref)} if ref else {}
    for arm, run in items:
      row = rows.get(run.name) or dict(
          run=run.name, r=run.r, S=run.S, steps=run.total_steps, flops=run.total_flops,
          data_tokens=run.total_data_tokens, final_loss=run.final_loss,
          baseline=ref.name if ref else None)
      per_run.append(dict(row, arm=arm, seed=seed, reference=run is ref))
  names = list(dict.fromkeys([a for a in order if any(r["arm"] == a for r in per_run)] +
                             sorted({r["arm"] for r in per_run})))
  arms = []
  for name in names:
    group = [r for r in per_run if r["arm"] == name]
    compared = [r for r in group if not r["reference"] and r.get("baseline")]
    speed = [r["speedup_flops"] for r in compared]
    arms.append(dict(
        arm=name, r=group[0]["r"], S=group[0]["S"], steps=group[0]["steps"],
        flops=group[0]["flops"], data_tokens=group[0]["data_tokens"],
        seeds=[r["seed"] for r in group], reference=all(r["reference"] for r in group),
        final_loss=spread(r["final_loss"] for r in group),
        delta_equal_flops=spread(r["final_loss"] - r["baseline_loss_at_equal_flops"]
                                 for r in compared
                                 if r["baseline_loss_at_equal_flops"] is not None),
        speedup_flops=spread(x for x in speed if x is not None),
        not_reached=sum(x is None for x in speed),
        speedup_lower_bound=spread(r["speedup_lower_bound"] for r in compared
                                   if r["speedup_lower_bound"] is not None)))
  return arms, per_run


def _spread_text(s: dict | None, fmt: str = ".4f", sign: str = "") -> str:
  if s is None:
    return "--"
  text = format(s["mean"], sign + fmt)
  if s["n"] > 1:
    text += (f" ± {s['sd']:{fmt}} [{s['min']:{sign + fmt}}, {s['max']:{sign + fmt}}]")
  return text


def speedup_text(arm: dict) -> str:
  """'0.75 ± 0.18 [0.62, 0.88]', 'not reached (> 1.00x)' or both for mixed seeds."""
  if arm["reference"]:
    return "reference"
  parts = []
  if arm["speedup_flops"]:
    parts.append(_spread_text(arm["speedup_flops"], ".2f") + "x")
  if arm["not_reached"]:
    bound = arm["speedup_lower_bound"]
    seeds = "" if not arm["speedup_flops"] else f" in {arm['not_reached']} seed(s)"
    parts.append(f"not reached{seeds}" + (f" (> {bound['min']:.2f}x)" if bound else ""))
  return ", ".join(parts) or "--"


def format_arms(arms: list[dict], per_run: list[dict]) -> str:
  lines = ["| arm | r | S | steps | FLOPs | data tokens | seeds | final eval loss "
           "(mean ± sd [min, max]) | Δ vs baseline at equal FLOPs | equal-loss speed-up (FLOPs) |",
           "|---" * 10 + "|"]
  for a in arms:
    lines.append(f"| {a['arm']} | {a['r']:g} | {a['S']} | {a['steps']} | {human(a['flops'])} | "
                 f"{human(a['data_tokens'])} | {','.join(map(str, a['seeds']))} | "
                 f"{_spread_text(a['final_loss'])} | "
                 f"{_spread_text(a['delta_equal_flops'], sign='+')} | {speedup_text(a)} |")
  lines += ["", "| run | arm | seed | final eval loss | reference | reference loss at equal FLOPs "
            "| reference FLOPs to equal loss | speed-up |", "|---" * 8 + "|"]
  for r in per_run:
    if r["reference"] or not r.get("baseline"):
      speed = "reference" if r["reference"] else "--"
      lines.append(f"| {r['run']} | {r['arm']} | {r['seed']} | {r['final_loss']:.4f} | "
                   f"{r.get('baseline') or '--'} | -- | -- | {speed} |")
      continue
    needed = r["baseline_flops_to_equal_loss"]
    speed = (f"not reached (> {r['speedup_lower_bound']:.2f}x)" if needed is None else
             ("≤ " if r["equal_loss_note"] else "") + f"{r['speedup_flops']:.2f}x")
    lines.append(f"| {r['run']} | {r['arm']} | {r['seed']} | {r['final_loss']:.4f} | "
                 f"{r['baseline']} | {_f(r['baseline_loss_at_equal_flops'])} | "
                 f"{human(needed)} | {speed} |")
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
  arms, per_run = summarize_arms(runs, order) if runs else ([], [])
  fileio.write_json(paths["json"],
                    dict(command=command, arms=arms, runs=per_run, failed=list(failed)))
  lines = report_head("TST arms against the equal-FLOPs baseline", command)
  lines += ["Held-out next-token loss (nats/token) at the last step, over seeds (sd with n - 1). "
            "Each run is compared with the baseline (r = 0) of its seed with the most FLOPs: "
            "Δ is the run's loss minus that baseline's at the same FLOPs (negative: TST is "
            "better); the equal-loss speed-up is the baseline's FLOPs to first reach the run's "
            "final loss (interpolated between its evals) over the run's FLOPs. Against a "
            "baseline of the same length a better run is 'not reached' (> 1x); a longer "
            "baseline arm (e.g. baseline+4k) measures the speed-up itself, though at equal "
            "steps its curve has not decayed its learning rate yet (it overstates the steps "
            "the baseline needs).", ""]
  if arms:
    lines += [format_arms(arms, per_run), ""]
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
  p.add_argument("--runs", required=True, help="comma list of run workdirs")
  p.add_argument("--baseline", default="",
                 help="the reference run (default: the first run with r = 0, else the first)")
  p.add_argument("--out", default="", help="output directory (default: the current one)")
  p.add_argument("--verbosity", type=int, default=0,
                 help="1: tracebacks of user errors too (else one 'error:' line)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  dirs = [d for d in args.runs.split(",") if d]
  if args.baseline and args.baseline not in dirs:
    dirs.insert(0, args.baseline)
  names = [os.path.basename(os.path.normpath(d)) for d in dirs]
  if len(set(names)) < len(names):      # same basenames: name them parent/basename
    names = [os.path.join(*os.path.normpath(os.path.abspath(d)).split(os.sep)[-2:])
             for d in dirs]
  runs = [load_run(d, name) for d, name in zip(dirs, names)]
  if args.baseline:
    baseline = runs[dirs.index(args.baseline)]
  else:
    baseline = next((r for r in runs if r.is_baseline), runs[0])
  rows = compare(runs, baseline)
  table = format_table(rows, runs)
  print(table)
  out = args.out or "."
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "compare.md"), "w") as f:
    f.write(f"# Comparison against {baseline.name}\n\n```\npython -m tst_jax.tools.compare "
            f"{' '.join(sys.argv[1:] if argv is None else argv)}\n```\n\n{table}\n\n"
            "![comparison](compare.png)\n")
  with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump(dict(baseline=baseline.name, rows=rows), f, indent=1)
  plot(runs, baseline, rows, os.path.join(out, "compare.png"))
  return 0


if __name__ == "__main__":
  sys.exit(errors.main(main, debug="--verbosity=1" in sys.argv))
