r"""Run a grid of TST configs, or named arms, point by point (resumable) and tabulate them.

  python -m tst_jax.tools.sweep --config configs/demo.py --workdir W \
      --grid "tst.ratio=0.1,0.3,0.5;tst.bag_size=2,4,6,8" --include_baseline --seeds 0,1
  python -m tst_jax.tools.sweep --config configs/gpu_small.py --workdir W \
      --arms baseline,tst,reinit,s8+r0.5 --seeds 0,1 --parallel 4

Each point trains in W/<name> (in this process, or `python main.py` with --subprocess or
--parallel N, N at a time); a point whose summary.json holds the requested steps is skipped,
an interrupted one resumes from its checkpoint, a failed one is recorded and the others go on.
The tables cover every finished point under W (so later, smaller sweeps into the same W add
rows), rewritten after each point. A grid gives W/sweep.csv, W/sweep.md and
W/sweep_heatmap.png (rows r, columns S, the mean over seeds; colour: the mean difference to
the baseline of the same seed). Arms (config args, parts joined by '+': `s8+r0.5` is
config.py:s8,r0.5) give W/results.{json,md}: per arm over seeds the final loss, its difference
to the seed's baseline at equal FLOPs and the equal-loss speed-up (tst_jax.tools.compare), and the
figure-2 curves W/loss_vs_{flops,data}.png. A corpus is tokenized once per prepare request (a store
in W/data_<key>/data, hard-linked into each point; a `tokens:` store is read where it is), and
all points share a persistent XLA cache.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

from tst_jax import configlib, errors, fileio
from tst_jax.data import run_data
from tst_jax.tools import compare
from tst_jax.train import loop, spec as spec_lib

POINT_FILE = "sweep_point.json"
RATIO, BAG = "tst.ratio", "tst.bag_size"
_MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "main.py")


@dataclasses.dataclass(frozen=True)
class Point:
  name: str
  grid: dict            # this point's grid values, key -> string
  seed: int
  baseline: bool
  arm: str = ""         # a config arg ('+' for ','), for --arms

  def config_spec(self, config: str) -> str:
    """'path[:arg]' plus this point's arm: configs/x.py:s8,r0.5."""
    if not self.arm:
      return config
    path, _, arg = config.partition(":")
    return f"{path}:{','.join(filter(None, [arg, self.arm.replace('+', ',')]))}"

  def overrides(self, base: list[str]) -> list[str]:
    """--set overrides, then the grid's, then the seed (and r = 0 for the baseline)."""
    extra = [f"{RATIO}=0.0"] if self.baseline else []
    return [*base, *(f"{k}={v}" for k, v in self.grid.items()), *extra, f"seed={self.seed}"]


def make_points(grid: str, seeds: list[int], include_baseline: bool) -> list[Point]:
  points = []
  for seed in seeds:
    if include_baseline:
      points.append(Point(f"baseline_seed{seed}", {}, seed, True))
    for overrides in configlib.parse_grid(grid) if grid.strip() else []:
      values = dict(configlib.parse_override(o) for o in overrides)
      parts = [f"{k.split('.')[-1]}{v}" for k, v in values.items()] + [f"seed{seed}"]
      points.append(Point(re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)), values, seed,
                          False))
  return points


def make_arm_points(arms: list[str], seeds: list[int]) -> list[Point]:
  """Arm-major: every seed of the first arm, then the next arm (so with --parallel the first
  arms, e.g. baseline and tst, finish first)."""
  return [Point(re.sub(r"[^A-Za-z0-9._-]+", "-", f"{arm}_seed{seed}"), {}, seed, False, arm)
          for arm in arms for seed in seeds]


# -- running ---------------------------------------------------------------------------------
def resolve(config_spec: str, overrides: list[str]):
  config = configlib.apply_overrides(configlib.load_config(config_spec), overrides)
  return config, spec_lib.check(config).plan


def finished(point_dir: str, steps: int) -> bool:
  """True when the run in `point_dir` completed `steps` steps; a run that completed another
  number of steps is an error (its checkpoints belong to another plan)."""
  path = os.path.join(point_dir, "summary.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    done = json.load(f)["steps"]
  if done != steps:
    raise RuntimeError(f"{point_dir} finished {done} steps but this sweep asks for {steps}: "
                       "use another --workdir")
  return final_eval(point_dir, steps) is not None


def final_eval(point_dir: str, steps: int) -> float | None:
  """The held-out loss of the eval line written at the last step (metrics.jsonl)."""
  path = os.path.join(point_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    evals = [r for r in map(json.loads, filter(str.strip, f)) if "eval_loss" in r]
  last = [r["eval_loss"] for r in evals if r["step"] == steps]
  return last[-1] if last else None


def run_point(args, point: Point, index: int, total: int, env=None) -> str:
  """Trains one point unless it is finished; returns 'done', 'skipped' or 'failed'."""
  point_dir = os.path.join(args.workdir, point.name)
  overrides = point.overrides(args.set)
  spec = point.config_spec(args.config)
  config, plan = resolve(spec, overrides)
  if finished(point_dir, config.train.steps):
    print(f"[{index}/{total}] {point.name}: finished, skipped", flush=True)
    return "skipped"
  os.makedirs(point_dir, exist_ok=True)
  phases = plan.phases
  if not config.data.source.startswith("tokens:"):   # a tokens: store is read where it is
    link_prepared_data(shared_data_dir(args.workdir, config), point_dir)
  meta = dict(name=point.name, config=spec, overrides=overrides, grid=point.grid, arm=point.arm,
              seed=point.seed, baseline=point.baseline, data_key=_data_key(config),
              r=float(config.tst.ratio) if phases[0].name == "tst" else 0.0,
              S=phases[0].bag_size, steps=plan.total_steps, plan=plan.to_json(), status="running")
  fileio.write_json(os.path.join(point_dir, POINT_FILE), meta)
  print(f"[{index}/{total}] {point.name}: training ({' '.join(overrides)})", flush=True)
  t0 = time.time()
  try:
    if args.subprocess or args.parallel > 1:
      cmd = [sys.executable, _MAIN, "--config", spec, "--workdir", point_dir,
             *(f"--config.{k}={_cli_value(config, k)}" for k, _ in
               map(configlib.parse_override, overrides))]
      with open(os.path.join(point_dir, "sweep_log.txt"), "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    else:
      loop.run(config, point_dir)
  except Exception as e:   # noqa: BLE001 - one failed point does not stop the sweep
    meta.update(status="failed", error=f"{type(e).__name__}: {e}", wall_s=time.time() - t0)
    fileio.write_json(os.path.join(point_dir, POINT_FILE), meta)
    line = errors.one_line(e)        # a user error: its one line, else the traceback
    print(line, file=sys.stderr) if line and not args.verbosity else traceback.print_exc()
    print(f"[{index}/{total}] {point.name}: FAILED ({meta['error']})", flush=True)
    return "failed"
  meta.update(status="done", wall_s=time.time() - t0)
  fileio.write_json(os.path.join(point_dir, POINT_FILE), meta)
  print(f"[{index}/{total}] {point.name}: final eval loss "
        f"{final_eval(point_dir, plan.total_steps):.4f} ({meta['wall_s']:.0f} s)", flush=True)
  return "done"


@contextlib.contextmanager
def compilation_cache(path: str | None):
  """A persistent XLA cache at `path` for the points of this sweep (and their subprocesses):
  points that compile the same step (same S, same shapes) load it instead of compiling."""
  if path is None:
    yield
    return
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc
  before = (jax.config.jax_compilation_cache_dir, os.environ.get("JAX_COMPILATION_CACHE_DIR"))
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  cc.set_cache_dir(path)
  cc.reset_cache()          # an earlier compile in this process may have decided "no cache"
  try:
    yield
  finally:
    cc.set_cache_dir(before[0])
    cc.reset_cache()
    if before[1] is None:
      os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
      os.environ["JAX_COMPILATION_CACHE_DIR"] = before[1]


def shared_data_dir(workdir: str, config) -> str:
  return os.path.join(workdir, "data_" + hashlib.sha256(_data_key(config).encode()).hexdigest()[:12])


def prepare_shared_data(workdir: str, config):
  """Prepares the token store of `config`'s data (with its BPE tokenizer) once, in
  W/data_<key>/data (the trainer's own prepare_data), for every point with the same data to
  link; a `tokens:` store needs nothing."""
  if config.data.source.startswith("tokens:"):
    return
  path = shared_data_dir(workdir, config)
  done = os.path.join(path, "prepared.json")
  if not os.path.exists(done):
    t0 = time.time()
    spec = spec_lib.check(config)
    spec.check_paths()
    data = run_data.prepare_data(spec.data, path, config.model.vocab_size, block=(0, 1))
    fileio.write_json(done, dict(data_key=_data_key(config), train_tokens=len(data.train),
                           val_tokens=len(data.val), seconds=time.time() - t0))
    print(f"data prepared once in {path}: {len(data.train):,} training tokens "
          f"({time.time() - t0:.0f} s)", flush=True)


def link_prepared_data(source: str, point_dir: str):
  """Hard-links the prepared token store (shards, manifest, tokenizer) into a fresh point's
  <point>/data, where the trainer finds it as its own (the files are never written again;
  copies only across filesystems). The trainer checks the manifest."""
  store, target = os.path.join(source, "data"), os.path.join(point_dir, "data")
  if os.path.exists(target) or not os.path.exists(os.path.join(store, "manifest.json")):
    return
  os.makedirs(target + ".tmp", exist_ok=True)
  for name in os.listdir(store):
    dst = os.path.join(target + ".tmp", name)
    if not os.path.exists(dst):
      _link_or_copy(os.path.join(store, name), dst)
  os.replace(target + ".tmp", target)


def _link_or_copy(src: str, dst: str):
  try:
    os.link(src, dst)
  except OSError:
    shutil.copyfile(src, dst)


def _data_key(config) -> str:
  """What the prepared store of a run depends on (not seq_len or batch_size: points that
  differ only in those share one store)."""
  return json.dumps(run_data.store_request(spec_lib.check(config).data,
                                           config.model.vocab_size), sort_keys=True)


def _cli_value(config, dotted: str) -> str:
  value = config
  for name in dotted.split("."):
    value = value[name]
  return str(value)


# -- tables ----------------------------------------------------------------------------------
def points_under(workdir: str):
  """(name, sweep_point.json) of every point directory under `workdir`, by name."""
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name, POINT_FILE)
    if os.path.isfile(path):
      with open(path) as f:
        yield name, json.load(f)


def collect(workdir: str) -> list[dict]:
  """One record per finished point under `workdir`, with the difference to the baseline of
  the same seed (negative: TST reached a lower loss)."""
  records = []
  for name, meta in points_under(workdir):
    loss = final_eval(os.path.join(workdir, name), meta["steps"])
    summary_path = os.path.join(workdir, name, "summary.json")
    if loss is None or not os.path.exists(summary_path):
      continue
    with open(summary_path) as f:
      summary = json.load(f)
    extra = {k: v for k, v in meta["grid"].items() if k not in (RATIO, BAG)}
    records.append(dict(
        name=name, r=meta["r"], S=meta["S"], seed=meta["seed"], **extra,
        final_eval_loss=loss, data_tokens=summary["data_tokens"],
        equivalent_tokens=summary["equivalent_tokens"], flops=meta["plan"]["flops_total"],
        wall_s=meta.get("wall_s", summary.get("seconds_this_session")),
        train_s=summary.get("seconds_this_session"), steps=meta["steps"]))
  baselines = {r["seed"]: r["final_eval_loss"] for r in records if r["r"] == 0.0}
  for r in records:
    base = baselines.get(r["seed"])
    r["delta_vs_baseline"] = None if base is None else r["final_eval_loss"] - base
  return sorted(records, key=lambda r: (r["r"] > 0, r["r"], r["S"], str(_extras(r)), r["seed"]))


def _extras(record: dict) -> dict:
  fixed = ("name", "r", "S", "seed", "final_eval_loss", "data_tokens", "equivalent_tokens",
           "flops", "wall_s", "train_s", "steps", "delta_vs_baseline")
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


def _human(x: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3g}{unit}"
  return f"{x:g}"


def write_reports(workdir: str, records: list[dict], command: str = "") -> dict:
  """sweep.csv, sweep.md and sweep_heatmap.png; returns their paths."""
  paths = dict(csv=os.path.join(workdir, "sweep.csv"), md=os.path.join(workdir, "sweep.md"),
               png=os.path.join(workdir, "sweep_heatmap.png"))
  extra_keys = sorted({k for r in records for k in _extras(r)})
  columns = ["name", "r", "S", "seed", *extra_keys, "final_eval_loss", "delta_vs_baseline",
             "data_tokens", "equivalent_tokens", "flops", "steps", "wall_s", "train_s"]
  with open(paths["csv"], "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    for r in records:
      writer.writerow({k: r.get(k, "") for k in columns})

  lines = ["# Sweep results", ""]
  if command:
    lines += ["```", command, "```", ""]
  lines += ["Final held-out next-token loss (nats/token) of every finished run; Δ = loss minus "
            "the baseline (r = 0) of the same seed, negative is better. FLOPs are the plan's "
            "training FLOPs (6·N per position plus attention, both phases); wall time "
            "includes data preparation and compilation.",
            "",
            "| run | r | S | seed | " + "".join(f"{k} | " for k in extra_keys) +
            "final eval loss | Δ vs baseline | data tokens | equiv. tokens | FLOPs | wall s |",
            "|---" * (10 + len(extra_keys)) + "|"]
  for r in records:
    lines.append(f"| {r['name']} | {r['r']:g} | {r['S']} | {r['seed']} | "
                 + "".join(f"{r.get(k, '')} | " for k in extra_keys)
                 + f"{_fmt(r['final_eval_loss'])} | {_fmt(r['delta_vs_baseline'], 4)} | "
                 f"{_human(r['data_tokens'])} | {_human(r['equivalent_tokens'])} | "
                 f"{_human(r['flops'])} | {_fmt(r['wall_s'], 0)} |")
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
  lines += ["", f"![heatmap]({os.path.basename(paths['png'])})", ""]
  with open(paths["md"], "w") as f:
    f.write("\n".join(lines))
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
  fig.savefig(out_path, dpi=100)
  plt.close(fig)


def write_arm_reports(workdir: str, command: str = "", order=()) -> dict:
  """results.json, results.md and the figure-2 curves of every arm point under `workdir`
  (the finished ones; failed ones are listed with their error); returns the paths."""
  runs, failed = [], []
  for name, meta in points_under(workdir):
    if not meta.get("arm"):
      continue
    if meta.get("status") == "failed":
      failed.append(dict(name=name, arm=meta["arm"], seed=meta["seed"], error=meta["error"]))
    elif final_eval(os.path.join(workdir, name), meta["steps"]) is not None:
      runs.append((meta["arm"], meta["seed"], compare.load_run(os.path.join(workdir, name))))
  return compare.write_arms(workdir, runs, failed, command, order)


# -- command line ----------------------------------------------------------------------------
def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m tst_jax.tools.sweep", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="config file[:arg], e.g. configs/demo.py")
  p.add_argument("--grid", default="", help="'key=v1,v2;key2=w1,w2': the cartesian product")
  p.add_argument("--arms", default="",
                 help="comma list of config args, one point per arm and seed, parts joined by "
                      "'+' (baseline,tst,s8+r0.5): results.{json,md} and figure-2 curves")
  p.add_argument("--workdir", required=True, help="one subdirectory per point, tables here")
  p.add_argument("--include_baseline", action="store_true",
                 help="also run r = 0 (plain next-token training, same FLOPs) per seed")
  p.add_argument("--seeds", default=None, help="comma list, e.g. 0,1,2 (default: the config's)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override applied to every point (repeatable), read as main.py reads "
                      "--config.KEY=VALUE")
  p.add_argument("--subprocess", action="store_true",
                 help="train each point with `python main.py` instead of in this process")
  p.add_argument("--parallel", type=int, default=1, metavar="N",
                 help="train N points at once as subprocesses (sharing one accelerator: each "
                      "may use 0.9/N of its memory)")
  p.add_argument("--compilation_cache", default="",
                 help="persistent XLA cache shared by the points (default: JAX's configured "
                      "one, else W/.jax_cache; 'none': off): points with the same shapes reuse "
                      "each other's compiled steps")
  p.add_argument("--dry_run", action="store_true", help="list the points and exit")
  p.add_argument("--verbosity", type=int, default=0,
                 help="1: tracebacks of user errors too (else one 'error:' line)")
  return p.parse_args(argv)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  os.makedirs(args.workdir, exist_ok=True)
  if args.seeds:
    seeds = [int(s) for s in args.seeds.split(",")]
  else:
    seeds = [int(resolve(args.config, args.set)[0].seed)]
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  if arms and (args.grid or args.include_baseline):
    raise SystemExit("--arms replaces --grid and --include_baseline (use a 'baseline' arm)")
  points = make_arm_points(arms, seeds) if arms else make_points(args.grid, seeds,
                                                                 args.include_baseline)
  if not points:
    raise SystemExit("no points: give --arms, or --grid and/or --include_baseline")
  # Every point's config, before anything runs: a misspelt arm or override fails here.
  configs = [resolve(p.config_spec(args.config), p.overrides(args.set))[0] for p in points]
  if args.dry_run:
    for point in points:
      print(point.name, point.config_spec(args.config), " ".join(point.overrides(args.set)))
    return 0
  cache = args.compilation_cache
  import jax
  if not cache:
    cache = jax.config.jax_compilation_cache_dir or os.path.join(args.workdir, ".jax_cache")
  if (cache != "none" and any(c.mesh.expert not in (0, 1) for c in configs)
      and jax.default_backend() == "cpu"):
    # jaxlib 0.10.2's XLA:CPU deadlocks running the expert-parallel step loaded from the
    # persistent cache (docs/distributed.md); compiling it afresh is correct.
    print("compilation cache off: expert-parallel steps on CPU (see docs/distributed.md)")
    cache = "none"
  command = "python -m tst_jax.tools.sweep " + " ".join(
      f"'{a}'" if any(c in a for c in " ;*") else a for a in argv)

  def report() -> dict:
    if arms:
      return write_arm_reports(args.workdir, command, arms)
    return write_reports(args.workdir, collect(args.workdir), command)

  status = {}
  with compilation_cache(None if cache == "none" else os.path.abspath(cache)):
    for config in {_data_key(c): c for c in configs}.values():
      prepare_shared_data(args.workdir, config)      # tokenize once, before any point runs
    if args.parallel > 1:
      # Subprocesses on one accelerator: each may grow to its share of the memory.
      env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                 XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / args.parallel:.3f}")
      with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {pool.submit(run_point, args, p, i + 1, len(points), env): p
                   for i, p in enumerate(points)}
        for future in concurrent.futures.as_completed(futures):
          status[futures[future].name] = future.result()
          if status[futures[future].name] == "done":
            report()                                   # partial results after each point
    else:
      for i, point in enumerate(points):
        status[point.name] = run_point(args, point, i + 1, len(points))
        if status[point.name] == "done":
          report()
  paths = report()
  print(open(paths["md"]).read())
  failed = [p.name for p in points if status[p.name] == "failed"]
  if failed:
    print(f"failed points: {failed}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(errors.main(main, debug="--verbosity=1" in sys.argv))
