"""Tiny Llama trained with TST on the embedded corpus (the Python standard library), on CPU.

Command (2 CPU cores: 2 min 14 s measured on a quiet machine, 3 min 03 s on a shared one):
  python main.py --config configs/demo.py --workdir /tmp/tst_demo
Expected: phase 1 (S=4, 90 steps) then phase 2 (210 steps); final held-out next-token loss
4.39 nats/token (within 0.06 of the model's loss on its training split), below the phase-1
end eval (6.12) and the unigram entropy (6.42); see docs/demo.md. At this length TST is
expected to end behind its baseline (the plan says so; docs/results.md). Baseline arm (r = 0,
same FLOPs per step):
  python main.py --config configs/demo.py:baseline --workdir /tmp/tst_demo_baseline
"""

from tst_jax.train import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("llama", "tiny")  # D 128, 4 layers, 4 / 2 heads, F 384: 1.84M params
  # data: the embedded Python standard library, BPE-tokenized
  c.data.max_bytes = 6_000_000      # a 6 MB slice of the stdlib keeps tokenizing fast
  c.data.seq_len = 128              # L
  c.data.batch_size = 16            # B
  c.model.vocab_size = 4096         # BPE trained to this size on the training documents
  # tst
  c.tst.bag_size = 4                # S
  c.tst.ratio = 0.3                 # r: 90 of 300 steps in phase 1
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay)
  c.optimizer.lr = 3e-3
  c.optimizer.warmup_steps = 20
  c.optimizer.decay_fraction = 0.1  # the last 10% of the steps
  # train
  c.train.steps = 300               # T: both phases
  return defaults.apply_arms(c, arg, "configs/demo.py")
