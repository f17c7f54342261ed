"""Prints the table of benchmarks/cpu_factors.sh's finished points, from the records it copies
to docs/cpu_factors/<point>/: per point the parameters (active ones where fewer), positions per step, vocabulary, steps,
tokens per parameter, both arms' final held-out loss over seeds (mean ± sd), and TST's Δ at
equal FLOPs paired by seed, with its standard error and Δ / se; and draws each point's Δ with
two standard errors either side into <folder>/delta.png.

  python benchmarks/cpu_factors_table.py [docs/cpu_factors] > docs/cpu_factors/table.md
"""

import json
import math
import os
import sys

ORDER = ["base", "pos2k", "pos8k", "len256", "len512", "vocab4k", "vocab8k", "d96", "d128",
         "t12k", "t12k_seeds345", "t20k", "t20k_seeds345", "moe",
         "moe_pos512"]   # t12k and t20k again, on new seeds


def _delta(folder: str, point: str) -> tuple[dict, dict] | None:
  """Returns the arms of `point` by name and TST's paired Δ, None while it has no Δ."""
  with open(os.path.join(folder, point, "results.json")) as f:
    arms = {a["arm"]: a for a in json.load(f)["arms"]}
  delta = arms.get("tst", {}).get("delta_equal_flops")
  return (arms, delta) if delta and delta["n"] >= 2 else None


def row(folder: str, point: str) -> str | None:
  """The table's row of `point`, or None while its TST arm has no Δ."""
  found = _delta(folder, point)
  if found is None:
    return None
  arms, delta = found
  runs = os.path.join(folder, point, "runs")
  run = os.path.join(runs, min(r for r in os.listdir(runs) if r.startswith("tst_seed")))
  with open(os.path.join(run, "plan.json")) as f:
    plan = json.load(f)
  with open(os.path.join(run, "config.json")) as f:
    vocab = json.load(f)["model"]["vocab_size"]
  ntp = plan["phases"][-1]
  params = f"{plan['params_total'] / 1e6:.2f}M"
  if plan["params_active"] != plan["params_total"]:
    params += f" ({plan['params_active'] / 1e6:.2f}M active)"
  se = delta["sd"] / math.sqrt(delta["n"])
  ratio = f"{delta['mean'] / se:+.1f}" if se else "--"
  loss = lambda s: f"{s['mean']:.4f} ± {s['sd']:.4f}"   # noqa: E731
  return (f"| {point} | {params} | "
          f"{ntp['batch_size'] * ntp['latent_seq_len']:,} ({ntp['batch_size']} x "
          f"{ntp['latent_seq_len']}) | {vocab:,} | {plan['total_steps']:,} | "
          f"{plan['tokens_per_param']:.1f} | {delta['n']} | {loss(arms['baseline']['final_loss'])} | "
          f"{loss(arms['tst']['final_loss'])} | {delta['mean']:+.4f} ± {delta['sd']:.4f} | "
          f"{se:.4f} | {ratio} |")


def figure(folder: str, points: list[str]) -> None:
  """Draws each point's Δ at equal FLOPs with two standard errors either side, below zero
  where TST is ahead, into <folder>/delta.png."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  deltas = [_delta(folder, p)[1] for p in points]
  means = [d["mean"] for d in deltas]
  errors = [2 * d["sd"] / math.sqrt(d["n"]) for d in deltas]
  fig, ax = plt.subplots(figsize=(7, 0.45 * len(points) + 1.2))
  y = range(len(points))[::-1]
  ax.errorbar(means, y, xerr=errors, fmt="o", capsize=3, color="tab:blue")
  ax.axvline(0, color="black", linewidth=0.8)
  ax.set_yticks(list(y), points)
  ax.set_xlabel("TST minus its equal-FLOPs baseline, final held-out loss (nats; ± 2 se)")
  ax.set_title("Where TST pays on 2 CPU cores: below 0 it is ahead")
  fig.tight_layout()
  fig.savefig(os.path.join(folder, "delta.png"), dpi=120)


def main(folder: str = "docs/cpu_factors") -> None:
  print("| point | parameters | positions per step (B x L) | V | steps | tokens per parameter | "
        "seeds | baseline final | TST final | Δ at equal FLOPs ± sd | se | Δ / se |")
  print("|---" * 12 + "|")
  done = [p for p in ORDER if os.path.exists(os.path.join(folder, p, "results.json"))
          and _delta(folder, p)]
  for point in done:
    print(row(folder, point))
  if done:
    figure(folder, done)


if __name__ == "__main__":
  main(*sys.argv[1:])
