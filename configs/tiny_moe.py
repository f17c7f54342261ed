"""Tiny Qwen3-style MoE (8 experts, top-2) trained with TST on the embedded corpus, on CPU.

Command (2 CPU cores, a few minutes):
  python main.py --config configs/tiny_moe.py --workdir /tmp/tst_moe
Expected: phase 1 (S=4) then phase 2, held-out next-token loss falling below the phase-1 end
and the corpus unigram entropy; metrics.jsonl carries moe/lb_loss, moe/max_load and the
per-expert load moe/expert_load/<e>. Baseline arm: configs/tiny_moe.py:baseline.
"""

from tst_jax.train.defaults import base_config


def get_config(arg: str = ""):
  c = base_config("qwen3_moe", "tiny_moe")
  c.data.max_bytes = 6_000_000      # a 6 MB slice of the stdlib, as the dense demo
  c.model.vocab_size = 4096         # BPE trained to this size
  c.train.steps = 200
  if arg == "baseline":
    c.tst.ratio = 0.0
  elif arg:
    raise ValueError(f"configs/tiny_moe.py takes '' or 'baseline', got {arg!r}")
  return c
