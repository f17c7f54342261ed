"""The speed-up ladder's report: a trend of the speed-up per bag size over the finished rungs,
and W/ladder.{json,md,png}."""

from __future__ import annotations

import numpy as np

from tst_jax import fileio
from tst_jax.analysis.frontier import Trend
from tst_jax.tools import compare
from tst_jax.tools.ladder_plan import Ladder
from tst_jax.tools.ladder_tables import format_points, format_rungs
from tst_jax.config import outlook


def fit_trends(points: list[dict], source: str) -> list[Trend]:
  """Fits a trend per bag size over the exact speed-ups of the finished rungs' TST runs: an
  arm without bags (S = 1, multi-token prediction's) has a row and no trend."""
  trends = []
  for S in sorted({p["S"] for p in points if p["S"] > 1}):
    exact = [p for p in points if p["S"] == S and p["rung_done"]
             and p["speedup"] is not None and p["speedup_bound"] == "="]
    trend = exact and Trend.fit([(p["tokens_per_param"], p["speedup"],
                                  f"{p['arm']} seed {p['seed']}") for p in exact],
                                exact[0]["params"], source, S, exact[0]["params_total"])
    trends += [trend] if trend else []
  return trends


def merged_trends(trends: list[Trend]) -> list[Trend]:
  """Returns the shipped trends, each replaced by the one of `trends` of its recipe and S."""
  key = lambda t: (t.params, t.params_total, t.bag_size)
  mine = {key(t) for t in trends}
  return [t for t in outlook.measured_trends() if key(t) not in mine] + trends


def write(workdir: str, ladder: Ladder, points: list[dict], notes: list[str],
          trends: list[Trend], command: str, missing: list[str], plan_lines: list[str]) -> dict:
  """Writes W/ladder.{json,md,png}. Returns the paths."""
  paths = {k: fileio.join(workdir, f"ladder.{k}") for k in ("json", "md", "png")}
  fileio.write_json(paths["json"], dict(
      command=command, ladder=ladder.name, config=ladder.config, method=compare.METHOD,
      points=points, notes=notes, unfinished=missing,
      trends=[t.to_json() for t in trends]))
  title = f"The speed-up ladder{' ' + ladder.name if ladder.name else ''} ({ladder.config})"
  lines = compare.report_head(f"{title}: equal-loss speed-up against run length", command)
  lines += [compare.METHOD, "", format_points(points), "", "Per rung, over its seeds:", "",
            format_rungs(points), ""]
  if not trends:
    lines.append("No trend: it needs exact speed-ups of finished rungs at two or more tokens "
                 "per parameter.")
  for t in trends:
    pays = t.pays_from()
    lines.append(f"Trend, S = {t.bag_size}: speed-up ≈ {t.a:.3f} {t.b:+.3f} · ln(tokens per "
                 f"parameter), least squares over {len(t.points)} runs from {t.low:.3g} to "
                 f"{t.high:.3g} tokens per parameter; 1x at "
                 + ("no length (it does not grow)" if pays is None else
                    f"{pays:.3g} tokens per parameter") + ".")
  lines += plan_lines + [f"Note: {n}" for n in notes]
  lines += ["", f"![speed-up against tokens per parameter]({fileio.basename(paths['png'])})",
            ""]
  fileio.write_text(paths["md"], "\n".join(lines))
  plot(points, trends, paths["png"])
  return paths


def plot(points: list[dict], trends: list[Trend], out_path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.6))
  ax.axhline(1.0, color="gray", lw=1, ls=":")
  marker = {"=": "o", ">": "^", "≤": "v"}
  colors = {S: plt.cm.tab10(i) for i, S in enumerate(sorted({p["S"] for p in points}))}
  for p in points:
    if p["speedup"] is not None:
      ax.plot(p["tokens_per_param"], p["speedup"], marker[p["speedup_bound"]],
              color=colors[p["S"]])
    if p["speedup_predicted"] is not None:
      ax.plot(p["tokens_per_param"], p["speedup_predicted"], "x", color=colors[p["S"]])
  for t in trends:
    x = np.geomspace(t.low, t.high, 50)
    ax.plot(x, t.a + t.b * np.log(x), "-", color=colors.get(t.bag_size, "tab:orange"),
            label=f"S = {t.bag_size}: {t.a:.2f} {t.b:+.2f} ln(x)")
  if trends:
    ax.legend(fontsize=8)
  ax.set_xscale("log")
  ax.set_xlabel("tokens per parameter (the run's B·L positions / active parameters)")
  ax.set_ylabel("equal-loss speed-up vs finished baselines")
  ax.set_title("TST speed-up against run length (^ lower, v upper bounds, x predicted)")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
  plt.close(fig)
