r"""Probe a run's checkpoints for what the switch from bags to tokens changes: each layer's
attention entropy on held-out tokens, and on held-out bags of the run's phase-1 size, and the
size of a bag's input against one token's.

  python -m tst_jax.tools.probe --workdir W [--steps 45,150] [--batches 4] [--json OUT]

For each checkpoint (default: every one the run keeps) prints one row per layer: the mean over
the query heads of the normalised attention entropy (tst_jax/analysis/attention.py: 1 is
uniform attention over the positions a query sees, 0 all on one) and of the weight a query
puts on itself and on the first position, on windows of data.seq_len held-out tokens, and,
for a TST run, the entropy on the same number of positions of S-token bags, with the RMS of
the bags' superposed input over that of their tokens one at a time. The windows are
spread evenly over the held-out split, the same at every step; the model computes in float32,
with causal attention over each whole window: a run with data.document_mask attended within
documents, which the probe does not. A checkpoint of the dense Llama family only.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from tst_jax import errors, fileio
from tst_jax import superposition as sp
from tst_jax.analysis import attention
from tst_jax.data.store import TokenStore
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import trained_run


def held_out_windows(rundir: RunDir, rows: int, window: int) -> np.ndarray:
  """Returns `rows` int32 windows [rows, window] spread evenly over the run's held-out split."""
  record = workdir_lib.read_store(rundir)
  if record is None:
    raise errors.WorkdirError(f"{rundir.store} does not exist: the run has no token store")
  store = TokenStore(record["directory"])
  if len(store.val) < window:
    raise errors.DataError(f"{store.directory}: the held-out split has {len(store.val)} tokens, "
                           f"fewer than one window of {window}")
  starts = np.linspace(0, len(store.val) - window, rows).astype(np.int64)
  return store.val.gather(starts, window).astype(np.int32)


# The float32 [rows, H, L, L] scores one call holds, at most: windows go through in slices.
SCORES_PER_CALL = 2**27


def probe(trained: trained_run.Trained, batches: int) -> dict:
  """Returns one checkpoint's entropies per layer on tokens (and bags) and the input scale, on
  `batches` x data.batch_size held-out windows, sent through the attention in slices of rows
  whose scores stay within SCORES_PER_CALL (each slice's means weighted by its rows); the input
  scale, a ratio of RMSs over all the windows, holds no scores."""
  rundir, rows = trained.rundir, batches * trained.data.batch_size
  length, size = trained.data.seq_len, trained.tst.bag_size if trained.tst.ratio > 0 else 1
  windows = held_out_windows(rundir, rows, size * length)
  step = max(1, SCORES_PER_CALL // (trained.model.cfg.n_heads * length * length))
  slices = [windows[i:i + step] for i in range(0, rows, step)]
  mean = lambda parts: sum(len(w) * p for w, p in zip(slices, parts)) / rows   # noqa: E731
  stats = [attention.attention_stats(trained.model, w[:, :length]) for w in slices]
  out = dict(step=trained.step, phase=trained.meta.get("phase"), bag_size=size,
             tokens=mean([s["entropy"].mean(-1) for s in stats]),
             on_self=mean([s["self"].mean(-1) for s in stats]),
             on_first=mean([s["first"].mean(-1) for s in stats]))
  if size > 1:
    bags = [sp.fold(w, size) for w in slices]
    out.update(bags=mean([attention.attention_entropy(trained.model, b).mean(-1) for b in bags]),
               input_scale=attention.input_scale(trained.model, sp.fold(windows, size)))
  return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in out.items()}


def table(rows: list[dict]) -> str:
  """Formats the probes as one markdown row per checkpoint and layer."""
  lines = ["| step | phase | layer | attention entropy, tokens | weight on itself | on the "
           "first position | entropy on S-token bags | bag input RMS / token input RMS |",
           "|---" * 8 + "|"]
  for r in rows:
    for i, tokens in enumerate(r["tokens"]):
      bags = f"{r['bags'][i]:.3f}" if "bags" in r else "--"
      scale = f"{r['input_scale']:.3f}" if "input_scale" in r and i == 0 else ""
      lines.append(f"| {r['step']} | {r['phase']} | {i} | {tokens:.3f} | {r['on_self'][i]:.3f} "
                   f"| {r['on_first'][i]:.3f} | {bags} | {scale} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tst_jax.tools.probe", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the run's directory")
  parser.add_argument("--steps", default="",
                      help="comma list of checkpoint steps (default: every one kept)")
  parser.add_argument("--batches", type=int, default=4, metavar="N",
                      help="held-out windows: N x the run's data.batch_size")
  parser.add_argument("--json", default="", help="also write the probes here as JSON")
  args = parser.parse_args(argv)
  json_path = fileio.absolute(args.json) if args.json else ""
  if json_path:                                                       # before the work
    fileio.check_output(fileio.dirname(json_path), "--json", "the folder of --json")
  fileio.check_readable(args.workdir, "--workdir")
  rundir = RunDir(args.workdir)
  try:
    steps = ([int(s) for s in args.steps.split(",")] if args.steps else
             workdir_lib.checkpoint_steps(rundir))
  except ValueError:
    raise errors.UserError(f"--steps {args.steps!r}: a comma list of checkpoint steps, e.g. "
                           "45,150") from None
  if args.batches < 1:
    raise errors.UserError(f"--batches {args.batches}: at least 1")
  rows = []
  for step in steps or [None]:     # none kept: load says so, after reading the run's config
    rows.append(probe(trained_run.load(rundir, step, dtype="float32"), args.batches))
  print(table(rows))
  if json_path:
    fileio.makedirs(fileio.dirname(json_path))
    fileio.write_json(json_path, rows)


if __name__ == "__main__":
  sys.exit(errors.main(main))
