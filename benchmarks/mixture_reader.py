"""Mixture reader benchmark: a phase's batches from one store, from a 0.7/0.3 mixture of two
(`mixture.RunMixture.batches`), from the same mixture in two stages (0.7/0.3, then 0.3/0.7
from the middle batch on: data.mixture_stages), and from Grain's `MapDataset.mix` asked once
per row; JSON.

  python benchmarks/mixture_reader.py [--gb 0.2] [--batches 500]

Two stores of random uint16 tokens (benchmarks/data_store.py's synthetic_store), memory-mapped;
each reader makes batches of 16 rows at the demo's phase-1 and phase-2 windows, through
`WindowSource` / `MixtureSource` directly (no Grain thread): the cost of the draw itself.
"""

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import types

import grain
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.data_store import synthetic_store  # noqa: E402
from tst_jax.data import TokenStore, WindowSource, mixture, train_bpe  # noqa: E402


def per_row_mix(splits, weights, window, batch_size, batches):
  """Grain's MapDataset.mix of one-window-per-element sources, read row by row."""
  order = mixture.interleave(weights)
  rows = batches * batch_size
  counts = order.counts(rows)
  parents = [grain.MapDataset.source(WindowSource(s, 1, window, seed=0, num_batches=int(n)))
             for s, n in zip(splits, counts)]
  mixed = grain.MapDataset.mix(parents, order.per_period.tolist())
  return lambda k: np.concatenate([mixed[k * batch_size + r] for r in range(batch_size)])


def timed(get, batches) -> float:
  get(0)
  t0 = time.perf_counter()
  for k in range(1, batches + 1):
    get(k)
  return (time.perf_counter() - t0) / batches


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--gb", type=float, default=0.2, help="size of each synthetic store")
  p.add_argument("--batches", type=int, default=500)
  args = p.parse_args()
  root = tempfile.mkdtemp()
  try:
    tok = os.path.join(root, "tokenizer.json")
    train_bpe(["a small corpus for a tokenizer " * 50], 300).save(tok)
    splits = [TokenStore(synthetic_store(os.path.join(root, f"s{i}"), args.gb, tok)).train
              for i in range(2)]
    weights = (0.7, 0.3)
    mix = mixture.RunMixture(mixture.parse("a=0.7,b=0.3", "m"), mixture.parse("a=0.7,b=0.3", "m"),
                             dict(a=splits[0], b=splits[1]))
    middle = args.batches // 2
    staged = dataclasses.replace(mix, stages=mixture.stages(
        f"0:a=0.7,b=0.3;{middle}:a=0.3,b=0.7", mix.main, "m"))
    result = dict(machine=dict(cpus=os.cpu_count(), platform=platform.platform(),
                               python=platform.python_version(), numpy=np.__version__,
                               grain=getattr(grain, "__version__", "?")),
                  date=time.strftime("%Y-%m-%d"), store_gb=args.gb, batch_rows=16, readers={})
    for name, window in (("phase1_16x513", 513), ("phase2_16x129", 129)):
      phase = types.SimpleNamespace(steps=args.batches + 1, batch_size=16, window=window,
                                    is_tst=False)
      source = mix.source([phase], 0, seed=0)
      stages = staged.source([phase], 0, seed=0)
      single = WindowSource(splits[0], 16, window, seed=0)
      per_row = per_row_mix(splits, weights, window, 16, args.batches)
      result["readers"][name] = {
          reader: dict(ms_per_batch=round(1e3 * s, 3),
                       tokens_per_s=round(16 * window / s))
          for reader, s in (("one_store", timed(single.__getitem__, args.batches)),
                            ("mixture", timed(source.__getitem__, args.batches)),
                            ("mixture_stages", timed(stages.__getitem__, args.batches)),
                            ("grain_mix_per_row", timed(per_row, args.batches)))}
    print(json.dumps(result))
  finally:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()
