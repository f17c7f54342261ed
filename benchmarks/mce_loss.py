"""Benchmark linear + MCE loss-and-grad: time and memory per implementation and bag size.

Prints one JSON object per (impl, S) on stdout. Each combination runs in a fresh process
so that the GPU peak-memory counter (`device.memory_stats()`, which cannot be reset)
belongs to that combination alone. Example (the GPU run of docs/kernels.md):

  python benchmarks/mce_loss.py --n 16384 --d 2048 --v 128256 --s 1,6,16 \
      --dtype bfloat16 --impl naive,xla,pallas
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=8192, help="tokens (rows of hidden)")
  p.add_argument("--d", type=int, default=512, help="model dim")
  p.add_argument("--v", type=int, default=32768, help="vocabulary size")
  p.add_argument("--s", default="1,16", help="comma list of bag sizes S")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--impl", default=None,
                 help="comma list of naive,xla,pallas (default: all three on GPU/TPU; "
                      "naive,xla on CPU, where pallas only runs interpreted)")
  p.add_argument("--repeats", type=int, default=5, help="timed runs after compile + warm-up")
  p.add_argument("--weighting", default="uniform")
  p.add_argument("--variant", default="mce", help="a loss variant of tst_jax.losses.VARIANTS")
  p.add_argument("--ignore-frac", type=float, default=0.01,
                 help="fraction of targets set to the ignore index")
  p.add_argument("--block-n", type=int, default=None, help="chunk/tile rows (xla, pallas)")
  p.add_argument("--block-v", type=int, default=None, help="chunk/tile vocab (xla, pallas)")
  p.add_argument("--block-d", type=int, default=None, help="tile model dim (pallas)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--in-process", action="store_true",
                 help="run all combinations in this process (peak memory is then cumulative)")
  p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "impl,s": child process
  return p.parse_args(argv)


def _chunk_kwargs(args, impl):
  if impl == "naive":
    return {}
  kw = {"block_n": args.block_n, "block_v": args.block_v}
  if impl == "pallas":
    kw["block_d"] = args.block_d
  return {k: v for k, v in kw.items() if v is not None}


def run_one(args, impl: str, s: int) -> dict:
  """Compile, warm up and time one (impl, S); returns the JSON record."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from tst_jax import losses  # pylint: disable=import-outside-toplevel

  dtype = jnp.dtype(args.dtype)
  k_h, k_w, k_t, k_i = jax.random.split(jax.random.PRNGKey(args.seed), 4)
  hidden_NxD = jax.random.normal(k_h, (args.n, args.d), jnp.float32).astype(dtype)
  head_DxV = (jax.random.normal(k_w, (args.d, args.v), jnp.float32)
              / args.d ** 0.5).astype(dtype)
  targets_NxS = jax.random.randint(k_t, (args.n, s), 0, args.v)
  ignored = jax.random.uniform(k_i, (args.n, s)) < args.ignore_frac
  targets_NxS = jnp.where(ignored, losses.IGNORE_INDEX, targets_NxS)
  chunk_kwargs = _chunk_kwargs(args, impl)

  def loss_fn(hidden_NxD, head_DxV, targets_NxS):
    return losses.linear_mce_loss(hidden_NxD, head_DxV, targets_NxS, weighting=args.weighting,
                                  variant=args.variant, impl=impl, **chunk_kwargs)

  step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
  t0 = time.perf_counter()
  compiled = step.lower(hidden_NxD, head_DxV, targets_NxS).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  jax.block_until_ready(compiled(hidden_NxD, head_DxV, targets_NxS))  # warm-up
  times, cpu_times = [], []
  for _ in range(args.repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    loss, _ = jax.block_until_ready(compiled(hidden_NxD, head_DxV, targets_NxS))
    times.append(time.perf_counter() - t0)
    cpu_times.append(time.process_time() - c0)
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform == "gpu" else None
  return {
      "impl": impl, "n": args.n, "d": args.d, "v": args.v, "s": s, "dtype": args.dtype,
      "weighting": args.weighting, "variant": args.variant, "ignore_frac": args.ignore_frac,
      "chunk_kwargs": chunk_kwargs, "repeats": args.repeats,
      "time_s": statistics.median(times), "time_s_min": min(times),
      # Host CPU seconds (all threads): on a shared CPU a steadier measure than wall time.
      "cpu_time_s": statistics.median(cpu_times), "loadavg_1m": round(os.getloadavg()[0], 2),
      "compile_s": round(compile_s, 3), "loss": float(loss),
      "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
      "argument_bytes": getattr(mem, "argument_size_in_bytes", None),
      "output_bytes": getattr(mem, "output_size_in_bytes", None),
      "peak_bytes": stats.get("peak_bytes_in_use") if stats else None,
      "backend": jax.default_backend(), "device_kind": device.device_kind,
      "jax_version": jax.__version__,
  }


def main(argv=None):
  args = _parse_args(argv)
  if args.one:
    impl, s = args.one.split(",")
    print(json.dumps(run_one(args, impl, int(s))), flush=True)
    return
  if args.impl is None:
    import jax  # pylint: disable=import-outside-toplevel
    args.impl = "naive,xla" if jax.default_backend() == "cpu" else "naive,xla,pallas"
  combos = [(impl, int(s)) for impl in args.impl.split(",") for s in args.s.split(",")]
  forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
  for impl, s in combos:
    if args.in_process:
      print(json.dumps(run_one(args, impl, s)), flush=True)
      continue
    child = subprocess.run([sys.executable, __file__, *forwarded, "--one", f"{impl},{s}"],
                           capture_output=True, text=True, check=False)
    if child.returncode:
      print(json.dumps({"impl": impl, "s": s, "error": child.stderr.strip()[-2000:]}),
            flush=True)
    else:
      print(child.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
  main()
