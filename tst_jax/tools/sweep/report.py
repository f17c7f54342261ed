"""A sweep's reports: the grid's tables and heatmap (W/sweep.{csv,md}, W/sweep_heatmap.png) and
the arms' results over seeds (W/results.{json,md} and the figure-2 curves, tools.arms)."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np

from tst_jax import fileio
from tst_jax.tools import arms as arms_lib, compare
from tst_jax.tools.eval_curve import load_run
from tst_jax.tools.sweep.points import BAG, RATIO, point_dir
from tst_jax.run.console import human
from tst_jax.config.plan import Plan
from tst_jax.config.record import plan_and_tokens
from tst_jax.run.workdir import final_eval, read_summary


def points_under(workdir: str):
  """(name, sweep_point.json, its plan typed, its store's training tokens or None) of every
  point directory under `workdir`, by name: the plan the run recorded (plan.json), else the
  one the sweep wrote as it started it. A workdir not made yet has none."""
  for name in fileio.listdir(workdir) if fileio.isdir(workdir) else []:
    rundir = point_dir(workdir, name)
    if fileio.isfile(rundir.sweep_point):
      meta = fileio.read_json(rundir.sweep_point)
      yield (name, meta, *plan_and_tokens(rundir, started=Plan.from_json(meta["plan"])))


def finished_arm_runs(workdir: str) -> tuple[list, list[dict]]:
  """((arm, seed, its EvalCurve) of every finished arm point under `workdir`, the failed
  ones with their error)."""
  runs, failed = [], []
  for name, meta, plan, _ in points_under(workdir):
    if not meta.get("arm"):
      continue
    if meta.get("status") == "failed":
      failed.append(dict(name=name, arm=meta["arm"], seed=meta["seed"], error=meta["error"]))
    elif final_eval(point_dir(workdir, name), plan.total_steps) is not None:
      runs.append((meta["arm"], meta["seed"], load_run(fileio.join(workdir, name))))
  return runs, failed


def collect(workdir: str) -> list[dict]:
  """Collects one record per finished point under `workdir`, with the difference to the
  baseline of the same seed, negative where TST reached a lower loss."""
  records = []
  for name, meta, plan, train_tokens in points_under(workdir):
    loss = final_eval(point_dir(workdir, name), plan.total_steps)
    summary = read_summary(point_dir(workdir, name))
    if loss is None or summary is None:
      continue
    extra = {k: v for k, v in meta["grid"].items() if k not in (RATIO, BAG)}
    records.append(dict(
        name=name, r=meta["r"], S=meta["S"], seed=meta["seed"], **extra,   # its grid cell
        final_eval_loss=loss, data_tokens=summary["data_tokens"],
        passes=sum(plan.passes(train_tokens)) if train_tokens else None,
        equivalent_tokens=summary["equivalent_tokens"], flops=plan.flops_total,
        wall_s=meta.get("wall_s", summary.get("seconds_this_session")),
        train_s=summary.get("seconds_this_session"), steps=plan.total_steps))
  baselines = {r["seed"]: r["final_eval_loss"] for r in records if r["r"] == 0.0}
  for r in records:
    base = baselines.get(r["seed"])
    r["delta_vs_baseline"] = None if base is None else r["final_eval_loss"] - base
  return sorted(records, key=lambda r: (r["r"] > 0, r["r"], r["S"], str(_extras(r)), r["seed"]))


def _extras(record: dict) -> dict:
  fixed = ("name", "r", "S", "seed", "final_eval_loss", "data_tokens", "passes",
           "equivalent_tokens", "flops", "wall_s", "train_s", "steps", "delta_vs_baseline")
  return {k: v for k, v in record.items() if k not in fixed}


def rxs_tables(records: list[dict]) -> list[tuple[dict, dict]]:
  """[(extra grid values, {(r, S): [losses over seeds]})], the baseline (r = 0, S = 1) in
  every group."""
  groups: dict[str, tuple[dict, dict]] = {}
  for r in records:
    if r["r"] > 0:
      key = json.dumps(_extras(r), sort_keys=True)
      groups.setdefault(key, (_extras(r), {}))[1].setdefault((r["r"], r["S"]), []).append(r)
  base = [r for r in records if r["r"] == 0.0]
  if not groups and base:
    groups["{}"] = ({}, {})
  for _, cells in groups.values():
    if base:
      cells[(0.0, 1)] = base
  return list(groups.values())


def cell_mean(runs: list[dict]) -> tuple[float, float | None]:
  """(mean loss, mean difference to the same seed's baseline or None) over a cell's seeds.
  Cells are ranked by the paired difference: seeds differ in held-out split and data order."""
  deltas = [x["delta_vs_baseline"] for x in runs]
  return (float(np.mean([x["final_eval_loss"] for x in runs])),
          None if None in deltas else float(np.mean(deltas)))


def _fmt(x, digits=4):
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "--"
  if isinstance(x, float):
    return f"{x:.{digits}f}"
  return str(x)


def write_reports(workdir: str, records: list[dict], command: str = "") -> dict:
  """Writes sweep.csv, sweep.md and sweep_heatmap.png, returning their paths."""
  paths = {k: fileio.join(workdir, name) for k, name in (
      ("csv", "sweep.csv"), ("md", "sweep.md"), ("png", "sweep_heatmap.png"))}
  extra_keys = sorted({k for r in records for k in _extras(r)})
  columns = ["name", "r", "S", "seed", *extra_keys, "final_eval_loss", "delta_vs_baseline",
             "data_tokens", "passes", "equivalent_tokens", "flops", "steps", "wall_s",
             "train_s"]
  table = io.StringIO(newline="")
  writer = csv.DictWriter(table, columns)
  writer.writeheader()
  for r in records:
    writer.writerow({k: r.get(k, "") for k in columns})
  fileio.write_text(paths["csv"], table.getvalue())

  lines = compare.report_head("Sweep results", command)
  lines += ["Final held-out next-token loss (nats/token) of every finished run; Δ = loss minus "
            "the baseline (r = 0) of the same seed, negative is better. FLOPs are the plan's "
            "training FLOPs (6·N per position plus attention, both phases); wall time "
            "includes data preparation and compilation.",
            "",
            "| run | r | S | seed | " + "".join(f"{k} | " for k in extra_keys) +
            "final eval loss | Δ vs baseline | data tokens | passes | equiv. tokens | FLOPs | "
            "wall s |", "|---" * (11 + len(extra_keys)) + "|"]
  for r in records:
    lines.append(f"| {r['name']} | {r['r']:g} | {r['S']} | {r['seed']} | "
                 + "".join(f"{r.get(k, '')} | " for k in extra_keys)
                 + f"{_fmt(r['final_eval_loss'])} | {_fmt(r['delta_vs_baseline'], 4)} | "
                 f"{human(r['data_tokens'])} | {_fmt(r['passes'], 2)} | "
                 f"{human(r['equivalent_tokens'])} | "
                 f"{human(r['flops'])} | {_fmt(r['wall_s'], 0)} |")
  for extras, cells in rxs_tables(records):
    label = f"; {', '.join(f'{k}={v}' for k, v in extras.items())}" if extras else ""
    rows, cols = sorted({r for r, _ in cells}), sorted({s for _, s in cells})
    for title, key in (("Final loss", "final_eval_loss"),
                       ("Δ vs the baseline of the same seed", "delta_vs_baseline")):
      lines += ["", f"## {title}, rows r, columns S (mean over seeds{label})", "",
                "| r \\ S | " + " | ".join(map(str, cols)) + " |",
                "|---" * (len(cols) + 1) + "|"]
      for row in rows:
        texts = []
        for col in cols:
          values = [x[key] for x in cells.get((row, col), []) if x[key] is not None]
          text = f"{np.mean(values):.4f}" if values else "--"
          if len(values) > 1:
            text += f" ± {np.std(values, ddof=1):.4f} (n={len(values)})"
          texts.append(text)
        lines.append(f"| {row:g} | " + " | ".join(texts) + " |")
    tst = {k: cell_mean(v) for k, v in cells.items() if k[0] > 0}
    if tst:
      (br, bs), (loss, delta) = min(tst.items(), key=lambda kv: kv[1][::-1])
      lines += ["", f"Best TST point: r = {br:g}, S = {bs} (mean loss {loss:.4f}" +
                (f", mean Δ {delta:+.4f}" if delta is not None else "") + ")."]
  lines += ["", f"![heatmap]({fileio.basename(paths['png'])})", ""]
  fileio.write_text(paths["md"], "\n".join(lines))
  plot_heatmap(records, paths["png"])
  return paths


def plot_heatmap(records: list[dict], out_path: str):
  """Rows r, columns S, the mean loss written in each cell, coloured by the mean difference to
  the same seed's baseline (green: lower loss than the baseline) when there is one."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.colors import TwoSlopeNorm

  tables = rxs_tables(records)
  if not tables:
    return
  fig, axes = plt.subplots(1, len(tables), figsize=(1.2 + 1.1 * max(
      len({s for _, s in cells}) for _, cells in tables) * len(tables), 0.6 + 0.5 * max(
          len({r for r, _ in cells}) for _, cells in tables) + 1.2), squeeze=False)
  deltas = [d for _, cells in tables for runs in cells.values()
            if (d := cell_mean(runs)[1]) is not None]
  span = max([abs(d) for d in deltas] + [1e-6])      # one colour scale for all panels
  for ax, (extras, cells) in zip(axes[0], tables):
    rows, cols = sorted({r for r, _ in cells}), sorted({s for _, s in cells})
    mean, shade = np.full((len(rows), len(cols)), np.nan), np.full((len(rows), len(cols)), np.nan)
    count = np.zeros_like(mean, dtype=int)
    for (r, s), runs in cells.items():
      loss, delta = cell_mean(runs)
      mean[rows.index(r), cols.index(s)] = loss
      shade[rows.index(r), cols.index(s)] = np.nan if delta is None else delta
      count[rows.index(r), cols.index(s)] = len(runs)
    if not np.all(np.isnan(shade)):
      image = ax.imshow(shade, cmap="RdYlGn_r", norm=TwoSlopeNorm(0.0, -span, span))
      fig.colorbar(image, ax=ax, label="loss − same-seed baseline (nats)", shrink=0.8)
      dark = np.abs(shade) > 0.6 * span
    else:
      image = ax.imshow(mean, cmap="viridis_r")
      fig.colorbar(image, ax=ax, label="final eval loss (nats)", shrink=0.8)
      dark = mean > np.nanmin(mean) + 0.6 * (np.nanmax(mean) - np.nanmin(mean))
    for i in range(len(rows)):
      for j in range(len(cols)):
        if count[i, j]:
          ax.text(j, i, f"{mean[i, j]:.3f}" + (f"\nn={count[i, j]}" if count[i, j] > 1 else ""),
                  ha="center", va="center", fontsize=8, color="white" if dark[i, j] else "black")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [f"{r:g}" for r in rows])
    ax.set_xlabel("bag size S")
    ax.set_ylabel("TST step ratio r")
    ax.set_title("final eval loss" + (f" ({', '.join(f'{k}={v}' for k, v in extras.items())})"
                                      if extras else ""), fontsize=10)
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
  plt.close(fig)


def write_arm_reports(workdir: str, command: str = "", order=()) -> dict:
  """Writes results.json, results.md and the figure-2 curves of every finished arm point under
  `workdir`, listing failed ones with their error. Returns the paths."""
  runs, failed = finished_arm_runs(workdir)
  return arms_lib.write_arms(workdir, runs, failed, command, order)


