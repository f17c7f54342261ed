"""Tiny Llama trained with TST on the embedded corpus (the Python standard library), on CPU.

Command (2 CPU cores: 2 min 44 s measured on a quiet machine, 7 min on a loaded one):
  python main.py --config configs/demo.py --workdir /tmp/tst_demo
Expected: phase 1 (S=4, 90 steps) then phase 2 (210 steps); final held-out next-token loss
3.66 nats/token, below the phase-1 end eval (5.69) and the unigram entropy (6.43); see
docs/demo.md. Baseline arm (r = 0, same FLOPs per step):
  python main.py --config configs/demo.py:baseline --workdir /tmp/tst_demo_baseline
"""

from tst_jax.train.defaults import base_config


def get_config(arg: str = ""):
  c = base_config("llama", "tiny")
  c.data.max_bytes = 6_000_000      # a 6 MB slice of the stdlib keeps tokenizing fast
  c.model.vocab_size = 4096         # BPE trained to this size on the training documents
  if arg == "baseline":
    c.tst.ratio = 0.0               # r = 0: plain next-token training throughout
  elif arg:
    raise ValueError(f"configs/demo.py takes '' or 'baseline', got {arg!r}")
  return c
