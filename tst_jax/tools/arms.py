"""TST arms over seeds (python -m tst_jax.tools.sweep --arms): each run against the frontier
of its seed's finished baselines (tools.compare), summarised per arm as mean ± sd over the
seeds, in W/results.{json,md} with the figure-2 curves of every run."""

from __future__ import annotations

import math

from tst_jax import fileio
from tst_jax.analysis.frontier import spread
from tst_jax.tools.compare import (METHOD, fit_text, fmt, frontier_for, frontier_notes,
                                   report_head, run_row)
from tst_jax.tools.eval_curve import EvalCurve
from tst_jax.run.console import human


def summarize_arms(runs: list[tuple[str, int, EvalCurve]], order=()
                   ) -> tuple[list[dict], list[dict], list[str]]:
  """Returns per-arm rows, per-run rows and notes of (arm, seed, run) triples.

  `frontier_for` and `run_row` compare each run with the frontier of its seed's finished
  baselines that match it. Each arm gets its final loss, Δ at equal FLOPs and equal-loss
  speed-up over the seeds where they are measured."""
  per_run, notes = [], []
  for seed in sorted({seed for _, seed, _ in runs}):
    items = [(arm, run) for arm, s, run in runs if s == seed]
    seed_runs = [run for _, run in items]
    for arm, run in items:
      frontier, left_out = frontier_for(run, seed_runs)
      row = run_row(run, frontier, len(left_out))
      notes += [f"seed {seed}: {n}" for n in left_out + frontier_notes(frontier, seed_runs)]
      notes += [f"seed {seed}: {run.name}: {w}" for w in row["warnings"]]
      per_run.append(dict(row, arm=arm, seed=seed))
  notes = list(dict.fromkeys(notes))
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
        delta_bounds=[r["delta_text"] for r in group
                      if r["delta_equal_flops"] is None and r["delta_text"] != "--"],
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


def delta_text(arm: dict) -> str:
  """Δ over the seeds where it is measured, with the standard error of its mean over two or
  more, each seed's Δ paired with its own baselines; else its bound (a run below the shortest
  baseline's FLOPs, or past the longest)."""
  delta = arm["delta_equal_flops"]
  if delta or not arm["delta_bounds"]:
    se = f" (se {delta['sd'] / math.sqrt(delta['n']):.4f})" if delta and delta["n"] > 1 else ""
    return _spread_text(delta, sign="+") + se
  return ", ".join(dict.fromkeys(arm["delta_bounds"]))


def speedup_text(arm: dict) -> str:
  """'1.13x (1 seed)', '1.28 ± 0.01x [1.27, 1.29] (2 seeds)', '> 1.33x (1 seed)', both for
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
                 f"{delta_text(a)} | {speedup_text(a)} |")
  lines += ["", "| run | arm | seed | final eval loss | passes | baselines' loss at equal "
            "FLOPs | Δ | baselines' FLOPs to equal loss | speed-up | power-law fit | slope s "
            "| predicted exp(Δ/s) |", "|---" * 12 + "|"]
  for r in per_run:
    lines.append(f"| {r['run']} | {r['arm']} | {r['seed']} | {r['final_loss']:.4f} | "
                 f"{fmt(r['passes'], '.2f')} | {fmt(r['frontier_loss_at_equal_flops'])} | "
                 f"{r['delta_text']} | "
                 f"{'' if r['speedup_bound'] == '=' else r['speedup_bound'] + ' '}"
                 f"{human(r['equal_loss_flops'])} | {r['speedup_text']} | "
                 f"{fit_text(r)} | {fmt(r['slope'], '+.4f')} | "
                 f"{r['speedup_predicted_text']} |")
  return "\n".join(lines)


def plot_arms(runs: list[tuple[str, int, EvalCurve]], out_dir: str) -> list[str]:
  """Plots the figure-2 curves of every run, one colour per arm: held-out loss against training
  FLOPs in loss_vs_flops.png and against data tokens in loss_vs_data.png. Returns the paths."""
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
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    paths.append(fileio.join(out_dir, name + ".png"))
    fileio.write_figure(paths[-1], fig)
    plt.close(fig)
  return paths


def write_arms(out: str, runs: list[tuple[str, int, EvalCurve]], failed=(), command: str = "",
               order=()) -> dict:
  """Writes out/results.json, out/results.md and the curves of `plot_arms`, returning the paths."""
  paths = dict(json=fileio.join(out, "results.json"), md=fileio.join(out, "results.md"))
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
    lines += [f"![{fileio.basename(p)}]({fileio.basename(p)})" for p in paths["png"]] + [""]
  if failed:
    lines += ["Failed:", ""] + [f"- {f['name']}: {f['error']}" for f in failed] + [""]
  fileio.write_text(paths["md"], "\n".join(lines))
  return paths
