"""A Qwen3-style MoE whose TST arm, its equal-FLOPs baseline and a baseline of twice the steps
finish in one call of at most 8 minutes on one H100: 115M parameters, 27.4M active.

Shape: D 512, 8 layers, every one sparse with 32 experts of width 256, top-4, QK-norm GQA 8/4
heads of 64, untied 8192-token BPE; bf16 compute, float32 parameters. 1000 steps of 32 x 512
(r=0.3, S=4) on the 100 MB of site-packages *.py that gpu_small reads the first half of, so
that the data and the tokenizer are prepared in seconds. configs/qwen3_moe_gpu_small.py is the
larger recipe (46 PFLOP per arm: about 9 minutes per arm at its measured 8.5% MFU).

  CONFIG=configs/qwen3_moe_one_call.py ARMS=baseline,tst,baseline+2k SEEDS=0 PARALLEL=3 \
      TOTAL_S=470 bash benchmarks/gpu_small.sh "$OUT"
  # = python -m tst_jax.tools.sweep --config configs/qwen3_moe_one_call.py --arms \
  #   baseline,tst,baseline+2k --seeds 0 --parallel 3 --budget_s ... --rate ...
  python main.py --config configs/qwen3_moe_one_call.py --mode plan   # FLOPs, memory, time

Hardware: one H100 80 GB, the three arms at once. gpu_small.sh refuses the call at its start
if the plan's FLOPs at the rate it assumes (RATE, printed) do not fit the budget.
Plan: 2.69 PFLOP per 1000-step arm, 10.8 PFLOP for the three; 3.5 GB per arm by the fit check
(`--mode plan --accelerator=h100 --config.mesh.data=1`, CPU).
Expected (one H200, 2026-11-26, seed 0, docs/results.md): baseline 2.4011, tst 2.4726, +0.0715
at equal FLOPs. The plan warns that TST ends behind its baseline here: 0.6 tokens per active
parameter, 0.42 in the next-token phase, below the ~0.7 from which TST has paid on the dense
gpu_small.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("qwen3_moe", "tiny_moe")
  # data: gpu_small's corpus, a smaller slice
  c.data.max_bytes = 100_000_000    # ~29M tokens: the 2k baseline reads 32.8M, the tst arm 31M
  c.data.val_fraction = 0.02
  c.data.val_piece_bytes = 0        # whole files, as gpu_small
  c.data.seed = 0                   # one split and token stream for every seed
  c.data.seq_len = 512              # L
  c.data.batch_size = 32            # B: 16K positions per step
  c.data.eval_batches = 8
  # model: 115M total, 27.4M active (8 layers x 32 experts x 3 x 512 x 256; 4 of them active)
  c.model.update(vocab_size=8192, dim=512, n_layers=8, n_heads=8, n_kv_heads=4,
                 head_dim=64, ffw_dim=1536,     # ffw_dim: dense layers only (none here)
                 n_experts=32, n_experts_per_token=4, moe_ffw_dim=256,
                 rope_theta=1_000_000.0, norm_eps=1e-6,
                 dtype="bfloat16",              # compute dtype; parameters stay float32
                 remat="save_experts",          # the MoE recipe's: experts' outputs kept
                 expert_impl="auto")            # measured fastest per platform (platform.py)
  c.loss.impl = "auto"              # the fused linear + MCE loss on GPU
  # tst
  c.tst.bag_size = 4                # S
  c.tst.ratio = 0.3                 # r: 300 of 1000 steps in phase 1
  # optimizer: AdamW, WSD
  c.optimizer.lr = 2e-3
  c.optimizer.warmup_steps = 50
  c.optimizer.decay_fraction = 0.1
  # train
  c.train.steps = 1000
  c.train.log_every = 25
  c.train.eval_every = 100
  c.train.checkpoint_every = 500    # the deadline's checkpoint is the one that matters
  c.train.keep_checkpoints = 1
  c.train.progress_bar = False
  return defaults.apply_arms(c, arg, "configs/qwen3_moe_one_call.py")
