"""Tiny Qwen3-style MoE (8 experts, top-2) trained with TST on the embedded corpus, on CPU.

Command (2 CPU cores, a few minutes):
  python main.py --config configs/tiny_moe.py --workdir /tmp/tst_moe
Expected: phase 1 (S=4) then phase 2, held-out next-token loss falling below the phase-1 end
and the corpus unigram entropy; metrics.jsonl carries moe/lb_loss, moe/max_load and the
per-expert load moe/expert_load/<e>. Baseline arm: configs/tiny_moe.py:baseline.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("qwen3_moe", "tiny_moe")  # D 128, 4 layers, 8 experts of F 128, top-2
  # data: the embedded Python standard library, BPE-tokenized
  c.data.max_bytes = 6_000_000      # a 6 MB slice of the stdlib, as the dense demo
  c.data.seq_len = 128              # L
  c.data.batch_size = 16            # B
  c.model.vocab_size = 4096         # BPE trained to this size
  # tst
  c.tst.bag_size = 4                # S
  c.tst.ratio = 0.3                 # r: 60 of 200 steps in phase 1
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay)
  c.optimizer.lr = 3e-3
  c.optimizer.warmup_steps = 20
  c.optimizer.decay_fraction = 0.1  # the last 10% of the steps
  # train
  c.train.steps = 200               # T: both phases
  return defaults.apply_arms(c, arg, "configs/tiny_moe.py")
