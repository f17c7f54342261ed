"""The speed-up ladder's tables: every TST run against its baselines, and per rung over its seeds,
the rows docs/results.md's MoE table holds."""

from __future__ import annotations

from tst_jax.analysis.frontier import spread
from tst_jax.tools import compare


def format_points(points: list[dict]) -> str:
  """Formats a row per TST run of `tools.ladder.ladder_points`."""
  lines = ["| run | S | seed | steps | tokens per parameter | passes | final eval loss | Δ at "
           "equal FLOPs | slope s per e-fold | predicted exp(Δ/s) | measured speed-up | seed "
           "noise | baselines |", "|---" * 13 + "|"]
  for p in points:
    lines.append(f"| {p['run']} | {p['S']} | {p['seed']} | {p['steps']} | "
                 f"{p['tokens_per_param']:.3g} | {compare.fmt(p['passes'], '.2f')} | "
                 f"{p['final_loss']:.4f} | {p['delta_text']} | "
                 f"{compare.fmt(p['slope'], '+.4f')} | {p['speedup_predicted_text']} | "
                 f"{p['speedup_text']} | {p['noise']} | {', '.join(p['baselines'])} |")
  return "\n".join(lines)


def rung_rows(points: list[dict]) -> list[dict]:
  """Groups the TST runs of `points` by rung and arm: Δ at equal FLOPs as mean ± sd where two
  seeds or more measured it, the measured and predicted speed-ups seed by seed, and whether
  every run of the rung has finished."""
  groups: dict[tuple, list[dict]] = {}
  for p in points:
    groups.setdefault((p["tokens_per_param"], p["S"], p["length"], p["arm"]), []).append(p)
  rows = []
  for (tokens, S, length, arm), group in sorted(groups.items()):
    group.sort(key=lambda p: p["seed"])
    deltas = spread(p["delta_equal_flops"] for p in group if p["delta_equal_flops"] is not None)
    delta = (group[0]["delta_text"] if deltas is None or deltas["n"] < 2 else
             f"{deltas['mean']:+.4f} ± {deltas['sd']:.4f}")
    rows.append(dict(
        length=length, arm=arm, S=S, tokens_per_param=tokens, seeds=[p["seed"] for p in group],
        final_loss=" / ".join(f"{p['final_loss']:.4f}" for p in group), delta_text=delta,
        speedup_text=" / ".join(p["speedup_text"] for p in group),
        predicted_text=" / ".join(p["speedup_predicted_text"] for p in group),
        finished=all(p["rung_done"] for p in group)))
  return rows


def format_rungs(points: list[dict]) -> str:
  """Formats `rung_rows(points)`: per seed values separated by ' / ', in seed order."""
  lines = ["| rung | arm | S | tokens per active parameter | seeds | final eval loss | Δ at "
           "equal FLOPs | measured equal-loss speed-up | predicted exp(Δ/s) | rung |",
           "|---" * 10 + "|"]
  for r in rung_rows(points):
    lines.append(f"| {r['length']} | {r['arm']} | {r['S']} | {r['tokens_per_param']:.3g} | "
                 f"{', '.join(map(str, r['seeds']))} | {r['final_loss']} | {r['delta_text']} | "
                 f"{r['speedup_text']} | {r['predicted_text']} | "
                 f"{'finished' if r['finished'] else 'baselines missing'} |")
  return "\n".join(lines)
