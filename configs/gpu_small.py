"""A 33M Llama where TST beats its equal-FLOPs baseline on one GPU: 2000 steps of 64 x 512.

Hardware: one H100 (80 GB). Several arms fit on it at once (`--parallel`: a 33M model does not
fill the GPU). The default corpus is the Python standard library (no download); the expected
numbers below read up to 200 MB of Python source instead:
--config.data.source='text:/opt/torch/.venv/lib/python3.12/site-packages/**/*.py'.

  python main.py --config configs/gpu_small.py --workdir /tmp/gpu_small_tst \
      --config.data.source='text:/path/to/site-packages/**/*.py'
  python main.py --config configs/gpu_small.py:baseline --workdir /tmp/gpu_small_base ...
  # arms and seeds on one tokenized corpus, the table and figure-2 curves, in one call:
  bash benchmarks/gpu_small.sh "$OUT"     # = python -m tst_jax.tools.sweep --config \
      #   configs/gpu_small.py --arms baseline,tst,baseline+3k --seeds 0 --parallel 4 \
      #   --workdir runs/gpu_small --set data.source='text:...' (ARMS=..., SEEDS=...: more)

Args (a comma list; in `--arms` join parts with '+', e.g. s8+r0.5): tst (the default, S=2,
r=0.3: the best measured at this scale), baseline (r = 0, the same FLOPs per step), reinit
(fresh embedding and head at the switch), input_only, output_only, smooth (phase 1 in stages
of halving S: with s4, 300 steps at S=4 then 300 at S=2), s<S> (s4 or s6: the paper's
setting, S in 4-8), r<ratio> (r1.0: never switching), <N>k (total steps), <N>mb (data.max_bytes:
a corpus for a longer run, as the speed-up ladder sizes one).

Measured on one H100 80GB (jax 0.11.2; docs/results.md), held-out next-token loss at the
last step on 200 MB of site-packages *.py, against finished baselines of 2k, 3k and 4k steps
(the equal-loss speed-up in log FLOPs: tst_jax/analysis/frontier.py):
  2026-11-25, commit c5be70f: tst (S=2) 1.8356 ± 0.0037 (seeds 0, 1), Δ -0.081, 1.28x (seed
  0); baseline 1.9165 ± 0.0047; s4 1.8729 (1.13x), s8 1.8922 (1.07x), s16 1.9132 (≤ 1.00x),
  s4+r0.5 1.8650 (1.16x), s4+r1.0 4.0264; baseline+3k 1.7812, baseline+4k 1.7372.
  2026-11-23, commit a8eba67 (every loss about 0.03 higher than on 11-25: compare within a
  date): s4 1.894 ± 0.002, baseline 1.945 ± 0.006, s4+reinit 1.989 ± 0.011; seed 0 only:
  s4+input_only 1.896, s4+output_only 1.928. Tokenizing 200 MB once 33 s; one 2000-step arm
  154 s with 2 arms sharing the GPU, 476 s with 6.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("llama", "tiny")
  # data
  c.data.max_bytes = 200_000_000    # 58M training tokens of site-packages *.py: the tst arm
                                    # reads 85M data tokens (1.5 passes; s4: 125M), the
                                    # baseline 66M (1.1); the plan prints the passes
  c.data.val_fraction = 0.02        # held-out documents
  c.data.val_piece_bytes = 0        # whole files (thousands of them): the split docs/results.md
                                    # was measured on
  c.data.seed = 0                   # one split and token stream for every seed: arms share it
  c.data.seq_len = 512              # L: positions the model sees (phase 1: S*L data tokens)
  c.data.batch_size = 64            # B: rows per step, 32K positions
  c.data.eval_batches = 8           # 8 x 64 x 512 = 262K held-out tokens per eval
  # model: 33.6M parameters (8.4M of them the untied embedding and head)
  c.model.update(vocab_size=8192,   # BPE trained on the training documents
                 dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffw_dim=1536,
                 dtype="bfloat16")  # compute dtype; parameters stay float32
  c.loss.impl = "auto"              # the fused linear + MCE loss on GPU
  # tst
  c.tst.bag_size = 2                # S: the best of 2, 4, 8, 16 on one H100 (the docstring)
  c.tst.ratio = 0.3                 # r: 600 of 2000 steps in phase 1
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay over the last 10%)
  c.optimizer.lr = 2e-3
  c.optimizer.warmup_steps = 100
  c.optimizer.decay_fraction = 0.1
  # train
  c.train.steps = 2000
  c.train.log_every = 25
  c.train.eval_every = 100          # 20 points on each curve, plus the phase-1 end
  c.train.checkpoint_every = 500
  c.train.keep_checkpoints = 1      # ~400 MB each (params + Adam moments)
  c.train.progress_bar = False      # arms run as subprocesses with their logs in files
  return defaults.apply_arms(c, arg, "configs/gpu_small.py")
