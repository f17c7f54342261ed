"""A Qwen3-style MoE that trains on one GPU: 711M parameters, 117M active, gpu_small's recipe.

Shape: D 768, 12 layers, every one sparse with 64 experts of width 384, top-8 (Qwen3's small
experts and its routing), QK-norm GQA 12/4 heads of 64, untied 8192-token BPE; bf16 compute,
float32 parameters. Data, batch and schedule are configs/gpu_small.py's (2000 steps of 64 x 512,
r=0.3), so the dense and the MoE results sit side by side (docs/results.md); S=4, the paper's
range (the dense 33.6M model measured best at S=2: `:s2`; TST on this MoE is not yet measured).

  python main.py --config configs/qwen3_moe_gpu_small.py --mode plan
  python main.py --config configs/qwen3_moe_gpu_small.py --workdir /tmp/moe_small_tst \
      --config.data.source='text:/path/to/site-packages/**/*.py'
  python -m tst_jax.tools.sweep --config configs/qwen3_moe_gpu_small.py --workdir runs/moe_small \
      --arms baseline,tst,baseline+3k,baseline+4k --seeds 0,1 --parallel 2 \
      --set data.source='text:...'      # + the 3k/4k baselines: the equal-loss speed-up

Args: the arms of every config (baseline, reinit, input_only, output_only, smooth, s<S>,
r<ratio>, <N>k). At 2000 steps the plan warns that TST is expected to end behind its baseline
(0.39 next-token tokens per active parameter, against the 0.7 measured on the dense
gpu_small); `:4k` is the length that rule expects to pay. Both are to be measured.
Hardware: one H200: 0.182 s per step at the defaults (gmm, save_experts, dispatch pallas: 13.1%
MFU, 28.5 GB peak; docs/performance.md, 2026-11-27); one H100 80 GB: 0.282 s with remat=save_dots
and XLA's gathers (8.5% MFU, 19.3 GB peak; 2026-11-25). The fit check (`--mode plan --accelerator=h100
--config.mesh.data=1 --config.model.expert_impl=gmm`, CPU, 2026-11-25) estimates per phase
23.7 GB with remat=save_experts (params 2.85, grads 2.85, Adam 5.69, activations 12.27: the
experts' routing and grouped-GEMM outputs kept), 14.0 GB with save_dots (activations 2.58),
12.3 GB with full, 49.0 GB with none; the budget is 60 GB, so the experts' outputs are kept.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.base_config("qwen3_moe", "tiny_moe")
  # data: as configs/gpu_small.py (one tokenized corpus for both recipes)
  c.data.max_bytes = 200_000_000    # ~60M tokens of Python source
  c.data.val_fraction = 0.02
  c.data.val_piece_bytes = 0        # whole files, as gpu_small
  c.data.seed = 0                   # one split and token stream for every seed
  c.data.seq_len = 512              # L
  c.data.batch_size = 64            # B: 32K positions per step
  c.data.eval_batches = 8
  # model: 711M total, 117M active (64 experts x 3 x 768 x 384 per layer; 8 of them active)
  c.model.update(vocab_size=8192, dim=768, n_layers=12, n_heads=12, n_kv_heads=4,
                 head_dim=64, ffw_dim=2048,     # ffw_dim: dense layers only (none here)
                 n_experts=64, n_experts_per_token=8, moe_ffw_dim=384,
                 rope_theta=1_000_000.0, norm_eps=1e-6,
                 dtype="bfloat16",              # compute dtype; parameters stay float32
                 remat="save_experts",          # save_dots + the experts' outputs: 23.7 GB
                                                # per phase on one H100 (save_dots: 14.0 GB)
                 expert_impl="auto")            # measured fastest per platform (platform.py)
  c.loss.impl = "auto"              # the fused linear + MCE loss on GPU
  # tst
  c.tst.bag_size = 4                # S
  c.tst.ratio = 0.3                 # r: 600 of 2000 steps in phase 1
  # optimizer: AdamW, WSD
  c.optimizer.lr = 1e-3             # half gpu_small's: 3.5x its active parameters
  c.optimizer.warmup_steps = 100
  c.optimizer.decay_fraction = 0.1
  # train
  c.train.steps = 2000
  c.train.log_every = 25
  c.train.eval_every = 100
  c.train.checkpoint_every = 500
  c.train.keep_checkpoints = 1      # ~8.5 GB each (float32 params + Adam moments)
  c.train.progress_bar = False
  return defaults.apply_arms(c, arg, "configs/qwen3_moe_gpu_small.py")
