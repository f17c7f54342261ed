"""Plain next-token CE of a trained run on random windows of its training and held-out splits.

  python benchmarks/split_loss.py --workdir /tmp/tst_demo [--windows 512] [--step N]

Draws `--windows` windows of data.seq_len + 1 tokens at seeded random positions of each split
of the run's token store (<workdir>/data, or its `tokens:` store) and prints one JSON line:
the mean CE per predicted token (nats) on each, and their difference. A held-out split that
represents its corpus scores about what the training split does on a small model that saw
each training token about once (docs/demo.md).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.data.store import TokenStore


@jax.jit
def _ce_sum(graphdef_state, inputs_BxL, targets_BxL):
  graphdef, state = graphdef_state
  logits_BxLxV = nnx.merge(graphdef, state)(inputs_BxL).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL).sum()


def split_ce(trained, split, windows: int, seed: int, batch: int = 32) -> float:
  """Mean next-token CE (nats/token) of `trained` on `windows` seeded random windows."""
  window = trained.max_length + 1
  starts = np.random.default_rng(seed).integers(0, len(split) - window, size=windows)
  model = nnx.split(trained.model)
  total = 0.0
  for i in range(0, windows, batch):
    tokens_BxW = split.gather(starts[i:i + batch], window)
    total += float(_ce_sum(model, tokens_BxW[:, :-1], tokens_BxW[:, 1:]))
  return total / (windows * (window - 1))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--step", type=int, default=None, help="checkpoint (default: the latest)")
  p.add_argument("--windows", type=int, default=512, help="windows per split")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  trained = trained_run.load(RunDir(args.workdir), args.step, dtype="float32")
  source = trained.data.source
  store = TokenStore(source[len("tokens:"):] if source.startswith("tokens:")
                     else os.path.join(args.workdir, "data"))
  train = split_ce(trained, store.train, args.windows, args.seed)
  val = split_ce(trained, store.val, args.windows, args.seed)
  print(json.dumps(dict(workdir=args.workdir, step=trained.step, windows=args.windows,
                        window=trained.max_length + 1, train_ce=round(train, 4),
                        val_ce=round(val, 4), val_minus_train=round(val - train, 4),
                        train_tokens=len(store.train), val_tokens=len(store.val),
                        val_docs=store.manifest["splits"]["val"]["docs"])))


if __name__ == "__main__":
  main()
