"""The paper's 10B-total / 1B-active Qwen3-style MoE (Table 1): S=16, TST 12,483 of 49,983 steps.

Shape: Qwen3-30B-A3B halved in width (D 1024, 32 layers, 128 experts top-8, expert width 768,
QK-norm GQA 16/4 heads of 128), Llama-3 vocabulary, untied: 10.10B total, 1.04B active.
8M-token batches (4096 x 2048), AdamW lr 3e-4, WSD (2000 warmup, last 10% decay), bf16, FSDP.
Hardware in the paper: 64 B200 GPUs (TorchTitan, FSDP).

  python main.py --config configs/qwen3_moe_10b_a1b.py --mode plan
  python -m tst_jax.data.prepare --source='jsonl:/data/fineweb_edu_dclm/**/*.jsonl.zst' \\
      --tokenizer=/models/llama3/tokenizer.json --out=/data/tok/fineweb_edu_dclm-llama3
  python main.py --config configs/qwen3_moe_10b_a1b.py --workdir /gcs/bucket/moe_tst \\
      --config.data.source=tokens:/data/tok/fineweb_edu_dclm-llama3
  baseline arm (125,000 plain steps, same FLOPs per step): configs/qwen3_moe_10b_a1b.py:baseline

Expected (paper): final loss TST 2.236 vs baseline 2.252, at 4768 vs 12311 B200-hours;
data tokens TST 1.68T (phase 1) of 2T total, baseline 1.05T.
"""

from tst_jax.train.defaults import paper_config


def get_config(arg: str = ""):
  if arg not in ("", "baseline"):
    raise ValueError(f"configs/qwen3_moe_10b_a1b.py takes '' or 'baseline', got {arg!r}")
  if arg == "baseline":
    return paper_config("qwen3_moe", "10b_a1b", "baseline", lr=3e-4, steps=125_000,
                        seq_len=2048, batch_size=4096, bag_size=16, tst_steps=0)
  return paper_config("qwen3_moe", "10b_a1b", "", lr=3e-4, steps=49_983, seq_len=2048,
                      batch_size=4096, bag_size=16, tst_steps=12_483)
