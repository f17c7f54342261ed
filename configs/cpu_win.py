"""Where TST beats its equal-FLOPs baseline on 2 CPU cores: the CPU ladder's recipe trained five
times longer, 20,000 steps on 40 MB of the standard library (31 tokens per parameter).

Shape: `configs/cpu_ladder.py`'s 328K-parameter Llama (d 64, 4 layers, a 1,024-token BPE; 64
positions x 8 rows per step; S = 2, r = 0.3, lr 1e-3). Its TST arm reads its 11.9M training
tokens 1.1 times, its baseline 0.86 times. One arm takes 13 to 21 minutes on one of 2 cores;
three seeds of both arms, two at a time, take about an hour:

  python -m tst_jax.tools.sweep --config configs/cpu_win.py --workdir runs/cpu_win \\
      --arms baseline,tst --seeds 0,1,2 --parallel 2

Expected (2-core CPU, Python 3.11.7, jax 0.10.2, 2026-12-08; docs/results.md "The factor
sweep", records in docs/cpu_factors/t20k*/): TST ends below its baseline on every seed run,
by 0.035, 0.033, 0.044 on seeds 0-2 and 0.027, 0.042, 0.005 on seeds 3-5, which were run after
this length was chosen: Δ -0.031 ± 0.014 nats over the six (se 0.006); the baseline ends at
2.74 ± 0.04 (seeds 0-2), TST at 2.70 ± 0.04.
"""

import os

from tst_jax import configlib
from tst_jax.config import defaults

LADDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_ladder.py")


def get_config(arg: str = ""):
  c = configlib.load_config(LADDER)       # the recipe, as the ladder's config file writes it
  # data: 40 MB of the embedded standard library
  c.data.max_bytes = 40_000_000     # 11.9M training tokens: TST at 20,000 steps reads 13.3M
  # train
  c.train.steps = 20_000            # T: 31 tokens per parameter
  c.train.eval_every = 5000
  return defaults.apply_arms(c, arg, "configs/cpu_win.py")
