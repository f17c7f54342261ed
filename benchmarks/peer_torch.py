"""The dense peer: Hugging Face transformers' Llama trained with torch.compile at a config's
shape, timed like benchmarks/step.py and scored with our FLOPs formula. One JSON line.

  python benchmarks/peer_torch.py                                   # llama_270m, 16 x 2048
  python benchmarks/peer_torch.py --config configs/llama_600m.py --batch 8
  python benchmarks/peer_torch.py --tiny --steps 2 --warmup 1       # the tiny shape, on CPU

The model is `transformers.LlamaForCausalLM` at the config's model section, mapped by
tst_jax.convert.llama_hf.config_to_hf, with parameters in float32, bf16 autocast and fused
AdamW on CUDA, float32 and PyTorch's default AdamW elsewhere. A step is forward, the HF
loss, backward and the optimizer step on random tokens. Model FLOPs per step are the
tst_jax plan's NTP phase at --batch x --seq, the number benchmarks/step.py reports for our
own step, so `mfu` here and there compare. The first step's seconds include compilation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

# Our FLOPs come from tst_jax, which imports jax: keep JAX off the GPU that torch times.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import transformers  # noqa: E402

from tst_jax import configlib, models, platform  # noqa: E402
from tst_jax.convert import llama_hf  # noqa: E402
from tst_jax.config import spec as spec_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def our_shape(config_path: str, batch: int, seq: int, tiny: bool):
  """Returns the config's model dataclass and our model FLOPs of one NTP step of batch x seq."""
  config = configlib.load_config(config_path)
  if config.model.family != "llama":
    raise SystemExit(f"{config_path}: the dense peer is a Llama; model.family is "
                     f"{config.model.family!r}")
  if tiny:
    config.model = models.preset_config("llama", "tiny")
  config.data.batch_size, config.data.seq_len = batch, seq
  config.tst.ratio = 0.0      # the baseline: its one phase is the NTP step step.py times
  spec = spec_lib.check(config)
  phase, = spec.plan.phases
  return spec.model, phase.flops_per_step


def peak_memory(device: torch.device) -> int:
  """Returns the peak bytes allocated on a CUDA device, or the process's peak RSS elsewhere."""
  if device.type == "cuda":
    return torch.cuda.max_memory_allocated(device)
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default=os.path.join(ROOT, "configs", "llama_270m.py"))
  p.add_argument("--batch", type=int, default=None, help="rows per step (16; --tiny: 2)")
  p.add_argument("--seq", type=int, default=None, help="tokens per row (2048; --tiny: 64)")
  p.add_argument("--steps", type=int, default=10, help="timed steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
  p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                 help="torch.compile the model")
  p.add_argument("--tiny", action="store_true", help="the llama tiny preset at 2 x 64 "
                 "unless --batch or --seq: runs on CPU in seconds")
  args = p.parse_args(argv)
  args.batch = args.batch or (2 if args.tiny else 16)
  args.seq = args.seq or (64 if args.tiny else 2048)
  cfg, flops = our_shape(args.config, args.batch, args.seq, args.tiny)

  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  torch.manual_seed(0)
  torch.set_float32_matmul_precision("high")
  hf_config = transformers.LlamaConfig(**llama_hf.config_to_hf(cfg))
  model = transformers.LlamaForCausalLM(hf_config).to(device)
  model.train()
  # bf16 autocast and fused AdamW are the GPU recipe; on CPU the run only shows the script works.
  autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
  forward = torch.compile(model) if args.compile else model
  batches = [torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
             for _ in range(2)]

  def step(tokens):
    with autocast:
      loss = forward(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()

  def timed(i):
    t = time.perf_counter()
    loss = step(batches[i % 2])
    if cuda:
      torch.cuda.synchronize()
    return time.perf_counter() - t, loss

  first_s, _ = timed(0)
  for i in range(args.warmup):
    timed(i + 1)
  times, loss = [], None
  for i in range(args.steps):
    seconds, loss = timed(i)
    times.append(seconds)
  step_s = statistics.median(times)
  name = torch.cuda.get_device_name(device) if cuda else "cpu"
  peak = platform.peak_flops(name) if cuda else None
  print(json.dumps(dict(
      peer="torch", model="transformers.LlamaForCausalLM", config=args.config,
      batch=args.batch, seq=args.seq, params=sum(t.numel() for t in model.parameters()),
      compile=args.compile, autocast="bfloat16" if cuda else None, fused_adamw=cuda,
      steps=args.steps, warmup=args.warmup, first_step_s=first_s, step_s=step_s,
      step_s_min=min(times), tokens_per_s=args.batch * args.seq / step_s,
      model_flops_per_step=flops, mfu=platform.mfu(flops, step_s, 1, peak),
      peak_memory_bytes=peak_memory(device), loss=loss.item(), device=name,
      torch=torch.__version__, transformers=transformers.__version__)))


if __name__ == "__main__":
  main()
