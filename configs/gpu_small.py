"""A 33M Llama where TST beats its equal-FLOPs baseline on one GPU: 2000 steps of 64 x 512.

Hardware: one H100 (80 GB). Several arms fit on it at once (`--parallel`: a 33M model does not
fill the GPU). The default corpus is the Python standard library (no download); the expected
numbers below read up to 200 MB of Python source instead:
--config.data.source='text:/opt/torch/.venv/lib/python3.12/site-packages/**/*.py'.

  python main.py --config configs/gpu_small.py --workdir /tmp/gpu_small_tst \
      --config.data.source='text:/path/to/site-packages/**/*.py'
  python main.py --config configs/gpu_small.py:baseline --workdir /tmp/gpu_small_base ...
  # every arm and seed on one tokenized corpus, the table and figure-2 curves:
  bash benchmarks/gpu_small.sh "$OUT"     # = python -m tst_jax.tools.sweep --config configs/gpu_small.py \
      #   --arms baseline,tst,reinit,input_only,output_only,r1.0,s2,s8,r0.2,r0.5 --seeds 0,1 \
      #   --parallel 4 --workdir runs/gpu_small --set data.source='text:...'

Args (a comma list; in `--arms` join parts with '+', e.g. s8+r0.5): tst (the default, S=4,
r=0.3), baseline (r = 0, the same FLOPs per step), reinit (fresh embedding and head at the
switch), input_only, output_only, smooth (phase 1 as 300 steps at S=4 then 300 at S=2),
s<S>, r<ratio> (r1.0: never switching), <N>k (total steps).

Measured on one H100 80GB (jax 0.11.2, 2026-11-23, docs/results.md): tokenizing 200 MB once
33 s; one 2000-step arm 154 s with 2 arms sharing the GPU, 476 s with 6.
Expected held-out next-token loss (mean ± sd over seeds 0, 1): tst 1.894 ± 0.002, baseline
1.945 ± 0.006; reinit 1.989 ± 0.011; seed 0 only: input_only 1.896, output_only 1.928.
"""

from tst_jax.train import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("llama", "tiny")
  # data
  c.data.max_bytes = 200_000_000    # ~60M tokens (est.): the tst arm reads 125M data tokens (two
                                    # passes), the baseline 66M; 400 MB: one pass, 2x tokenizing
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
  c.tst.bag_size = 4                # S
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
