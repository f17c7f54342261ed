"""The paper's 10B-total / 1B-active Qwen3-style MoE (Table 1): S=16, TST 12,483 of 49,983 steps.

Shape: Qwen3-30B-A3B halved in width (D 1024, 32 layers, 128 experts top-8, expert width 768,
QK-norm GQA 16/4 heads of 128), Llama-3 vocabulary, untied: 10.10B total, 1.04B active.
8M-token batches (4096 x 2048), AdamW lr 3e-4, WSD (2000 warmup, last 10% decay), bf16, FSDP.
Hardware in the paper: 64 B200 GPUs (TorchTitan, FSDP); here FSDP over all devices.
Fit check on that hardware (tests/train/test_fit.py runs it):
  python main.py --config configs/qwen3_moe_10b_a1b.py --mode plan \\
      --accelerator=b200 --config.mesh.fsdp=64
says yes: 49.3 GB per B200 of the 135 GB JAX takes, at 64 rows of 2048 per device in one
micro-batch with remat=save_dots. remat=save_experts would skip rerunning the experts' sort and
grouped GEMMs in the backward, but keeps [N·P, 2F + D] per sparse layer: 221.3 GB in one
micro-batch, 112.1 GB in two, and each micro-batch gathers FSDP's weights again.

  python main.py --config configs/qwen3_moe_10b_a1b.py --mode plan
  python -m tst_jax.data.prepare --source='jsonl:/data/fineweb_edu/**/*.jsonl.zst' \\
      --tokenizer=/models/llama3/tokenizer.json --out=/data/tok/fineweb_edu-llama3
  python -m tst_jax.data.prepare --source='jsonl:/data/dclm/**/*.jsonl.zst' \\
      --tokenizer=/models/llama3/tokenizer.json --out=/data/tok/dclm-llama3
  python main.py --config configs/qwen3_moe_10b_a1b.py --workdir /gcs/bucket/moe_tst \\
      --config.data.mixture='tokens:/data/tok/fineweb_edu-llama3=0.5,tokens:/data/tok/dclm-llama3=0.5'
  baseline arm (125,000 plain steps, same FLOPs per step): configs/qwen3_moe_10b_a1b.py:baseline
On 8 B200 hosts of a GKE cluster (docs/launch.md), the stores in a bucket:
  python -m launch.gke.render --config configs/qwen3_moe_10b_a1b.py --platform gpu \\
      --gpu_type b200 --num_hosts 8 --workdir gs://my-tst-runs/moe_tst \\
      --image us-docker.pkg.dev/my-project/tst/tst-jax-gpu:v1 --service_account tst-ksa \\
      --config.data.mixture='tokens:gs://my-tst-data/tok/fineweb_edu-llama3=0.5,tokens:gs://my-tst-data/tok/dclm-llama3=0.5' \\
    | kubectl apply -f -

Expected (paper): final loss TST 2.236 vs baseline 2.252, at 4768 vs 12311 B200-hours;
data tokens TST 1.68T (phase 1) of 2T total, baseline 1.05T.
"""

from tst_jax.config import defaults


def get_config(arg: str = ""):
  c = defaults.paper_base_config("qwen3_moe", "10b_a1b")  # bf16, remat, fused loss, FSDP
  # model.remat stays save_dots, in one micro-batch: save_experts fits only in two (the fit
  # check above), full recomputes every layer's forward
  # data: the paper's 50/50 FineWeb-Edu/DCLM mixture, each corpus its own store; set
  # data.mixture to the two stores (the commands above; docs/data.md, 'Mixtures')
  c.data.seq_len = 2048             # L
  c.data.batch_size = 4096          # B: 8M tokens per step
  # tst
  c.tst.bag_size = 16               # S
  c.tst.ratio = 12_483 / 49_983     # r: 12,483 TST steps of 49,983 (the same fraction at <N>k)
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay)
  c.optimizer.lr = 3e-4
  c.optimizer.warmup_steps = 2000
  c.optimizer.decay_fraction = 0.1  # the last 10% of the steps
  c.optimizer.grad_accum = 1        # the 64 rows per B200 in one micro-batch: the fit check above
  # train
  c.train.steps = 49_983            # T: both phases ('<N>k': N x 1000)
  if "baseline" in defaults.arms(arg):
    c.train.steps = 125_000         # the paper's baseline: 125,000 next-token steps
  return defaults.apply_arms(c, arg, "configs/qwen3_moe_10b_a1b.py")
