"""The share of phase 1's held-out bag targets that data.document_mask ignores, per bag size.

  python benchmarks/masked_targets.py --config configs/demo.py --workdir /tmp/tst_demo \
      --bag_sizes 4,8,16

Opens the config's token store as a run in --workdir does (prepared there once, or read in
place), draws the held-out windows of S·L + 1 tokens that phase 1's evals draw at each S, and
counts the bag targets the document masks ignore beyond those past a window's end. A document
that starts on a bag boundary loses its first bag, S targets, as it does in a window of its
own; one that starts inside a bag also loses its tokens there, up to 2S - 1 in all. Prints one
JSON line per S: targets, those ignored, their share, and the documents that start in the
windows past their first token.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tst_jax import configlib, superposition as sp   # noqa: E402
from tst_jax.config import spec as spec_lib   # noqa: E402
from tst_jax.data import run_data   # noqa: E402
from tst_jax.rundir import RunDir   # noqa: E402


def masked_share(windows: list[np.ndarray], eos_id: int, bag_size: int) -> dict:
  """Counts the bag targets of `windows` and those the document masks ignore."""
  view = functools.partial(sp.tst_view, bag_size=bag_size, mode="full")
  targets = ignored = starts = 0
  for window in windows:
    _, plain = view(window)
    _, masked, _ = sp.document_view(window, eos_id, view)
    valid = np.asarray(plain) != sp.IGNORE_INDEX
    targets += int(valid.sum())
    ignored += int((valid & (np.asarray(masked) == sp.IGNORE_INDEX)).sum())
    starts += int((window[:, :-1] == eos_id).sum())   # a document starts after each EOS
  return dict(bag_size=bag_size, targets=targets, ignored=ignored,
              share=ignored / max(targets, 1), document_starts=starts)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default=os.path.join(ROOT, "configs", "demo.py"))
  p.add_argument("--workdir", required=True, help="where the run's store is, or is prepared")
  p.add_argument("--bag_sizes", default="4,8,16")
  args = p.parse_args(argv)
  spec = spec_lib.check(configlib.load_config(args.config))
  data = run_data.prepare_data(spec.data, RunDir(args.workdir), spec.model.vocab_size, (0, 1),
                               say=print)
  for bag_size in (int(s) for s in args.bag_sizes.split(",")):
    windows = data.held_out.windows(spec.data.batch_size, bag_size * spec.data.seq_len + 1)
    print(json.dumps(masked_share(windows, data.tokenizer.eos_id, bag_size)))


if __name__ == "__main__":
  main()
