"""The paper's 3B dense model: SmolLM3-3B shape in Llama-3 code, Llama-3 vocabulary, untied.

TST with S=6 for 30% of the steps (6,000 of 20,000), 2M-token batches (1024 x 2048),
AdamW lr 2e-4, WSD (2000 warmup, last 10% decay), bf16 compute, FSDP.
Hardware: 64 B200 GPUs in the paper; any GPU/TPU mesh here (FSDP over all devices).
Fit check on that hardware (tests/train/test_fit.py runs it):
  python main.py --config configs/llama_3b.py --mode plan \
      --accelerator=b200 --config.mesh.fsdp=64
says yes: 60.7 GB per B200 of the 135 GB JAX takes, at 16 rows of 2048 per device.

  python -m tst_jax.data.prepare --source='jsonl:/data/dclm/**/*.jsonl.zst' \
      --tokenizer=/models/llama3/tokenizer.json --out=/data/tok/dclm-llama3   # once, shared
  python main.py --config configs/llama_3b.py --mode plan
  python main.py --config configs/llama_3b.py:20k \
      --config.data.source=tokens:/data/tok/dclm-llama3 --workdir /gcs/bucket/llama_3b_tst
  baseline arm (same FLOPs, r = 0): --config configs/llama_3b.py:20k,baseline
One GPU (docs/performance.md, "Will a run fit?"): the fit check estimates 54.1 GB per H100 at
16 x 2048 rows per step with full remat (113 GB with the config's save_dots), so on one H100
  python main.py --config configs/llama_3b.py:20k --config.model.remat=full \
      --config.optimizer.grad_accum=64 --config.data.source=tokens:/data/tok/dclm-llama3 ...
keeps the paper's 1024-row batch as 64 micro-batches of 16 (step time and MFU to be measured:
benchmarks/gpu.sh). Its fit check, --mode plan --accelerator=h100 --config.mesh.fsdp=1, says
54.07 GB per phase (params 13.35, grads 13.35, Adam 26.70, activations 0.67).

Expected final loss (paper, DCLM): baseline 2.808 (20k), 2.677 (36k), 2.640 (50k); TST 2.676.
Table 1 data tokens at 20k steps: TST 75B (phase 1) + 30B = 105B; baseline 42B.
"""

from tst_jax.config import defaults


def get_config(arg: str = "20k"):
  c = defaults.paper_base_config("llama", "3b")  # bf16, remat, fused loss, FSDP
  # data: set data.source (and data.tokenizer unless tokens:), see the commands above
  c.data.seq_len = 2048             # L
  c.data.batch_size = 1024          # B: 2M tokens per step
  # tst
  c.tst.bag_size = 6                # S
  c.tst.ratio = 6_000 / 20_000      # r: 6,000 TST steps of 20,000 (the same fraction at <N>k)
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay)
  c.optimizer.lr = 2e-4
  c.optimizer.warmup_steps = 2000
  c.optimizer.decay_fraction = 0.1  # the last 10% of the steps
  # train
  c.train.steps = 20_000            # T: both phases ('<N>k': N x 1000)
  return defaults.apply_arms(c, arg, "configs/llama_3b.py")
