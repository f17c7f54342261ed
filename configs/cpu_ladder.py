"""The CPU speed-up ladder's recipe: a 328K-parameter Llama where TST's loss gap to its
equal-FLOPs baseline is the smallest found on 2 CPU cores (issue 31; docs/demo.md).

Shape: d 64, 4 layers, 4 / 2 heads, SwiGLU 192, a 1,024-token BPE (328,256 parameters);
64 positions x 8 rows per step; S = 2, r = 0.3 (the best of S 2/3/4 and r 0.15/0.3/0.5 here);
lr 1e-3 (TST's best; the baseline's is 2e-3); 12 MB of the standard library (4.54M training
tokens: no arm repeats its data). At 4000 steps one arm takes about 2.5 minutes on 2 cores.

  python main.py --config configs/cpu_ladder.py --workdir /tmp/cpu_ladder_tst
  python main.py --config configs/cpu_ladder.py:baseline --workdir /tmp/cpu_ladder_base
  python -m tst_jax.tools.ladder --config configs/cpu_ladder.py --workdir runs/cpu_ladder \\
      --lengths 2k,4k --seeds 0 --set train.eval_every=1000

Expected (2-core CPU, 2026-11-25, seeds 0 and 1; docs/demo.md has every run): TST ends
behind its baseline at every length, +0.159 ± 0.017 nats at 1000 steps, +0.076 ± 0.007 at
2000, +0.086 ± 0.024 at 4000, +0.066 ± 0.057 at 6000; at 4000 steps (seed 0) TST 3.0369,
baseline 2.9678.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("llama", "tiny")
  # data: 12 MB of the embedded standard library
  c.data.max_bytes = 12_000_000     # 4.54M training tokens: TST at 4000 steps reads 2.66M
  c.data.seq_len = 64               # L
  c.data.batch_size = 8             # B
  c.data.eval_batches = 64          # 64 x 8 x 64 = 32,768 held-out tokens per eval
  # model: 328,256 parameters
  c.model.update(dim=64, ffw_dim=192, vocab_size=1024)
  # tst
  c.tst.bag_size = 2                # S
  c.tst.ratio = 0.3                 # r
  # optimizer: AdamW, WSD
  c.optimizer.lr = 1e-3
  c.optimizer.warmup_steps = 20
  c.optimizer.decay_fraction = 0.1
  # train
  c.train.steps = 4000              # T
  c.train.eval_every = 1000
  c.train.checkpoint_every = 100_000  # the phase-end checkpoints only
  c.train.progress_bar = False
  return defaults.apply_arms(c, arg, "configs/cpu_ladder.py")
