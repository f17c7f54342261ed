"""Tile sweep of the fused linear + MCE loss: forward and forward+backward time per config.

  python benchmarks/loss_tiles.py --n 16384 --d 2048 --v 128256 --dtype bfloat16 \
      --configs 'naive;xla;pallas:128,128,64,8,3;pallas:128,256,64,8,3,bwd=atomic'

Each config is `impl[:block_n,block_v,block_d,num_warps,num_stages[,key=value...]]` (pallas)
or `xla[:block_n,block_v]`; all run in this process (fresh random inputs per config, median
of --repeats timed calls after a warm-up). Memory is XLA's compiled temp + argument + output
bytes of the forward+backward program, not the device's cumulative peak counter. One JSON
line per config; docs/kernels.md holds the measured tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from tst_jax import losses


def parse_config(text: str) -> tuple[str, dict]:
  impl, _, rest = text.partition(":")
  if not rest:
    return impl, {}
  names = (("block_n", "block_v", "block_d", "num_warps", "num_stages") if impl == "pallas"
           else ("block_n", "block_v"))
  kwargs, positional = {}, [p for p in rest.split(",") if "=" not in p]
  for name, value in zip(names, positional):
    kwargs[name] = int(value)
  for part in (p for p in rest.split(",") if "=" in p):
    key, value = part.split("=")
    kwargs[key] = int(value) if value.isdigit() else value
  return impl, kwargs


def _time(fn, args, repeats):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def run(args, impl: str, kwargs: dict, seed: int) -> dict:
  dtype = jnp.dtype(args.dtype)
  k_h, k_w, k_t = jax.random.split(jax.random.PRNGKey(seed), 3)
  hidden_NxD = jax.random.normal(k_h, (args.n, args.d), jnp.float32).astype(dtype)
  head_DxV = (jax.random.normal(k_w, (args.d, args.v), jnp.float32) / args.d ** 0.5).astype(dtype)
  targets_NxS = jax.random.randint(k_t, (args.n, args.s), 0, args.v)

  def loss_fn(h, w, t):
    return losses.linear_mce_loss(h, w, t, impl=impl, **kwargs)

  fwd = jax.jit(loss_fn)
  both = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
  inputs = (hidden_NxD, head_DxV, targets_NxS)
  t0 = time.perf_counter()
  compiled = both.lower(*inputs).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  record = dict(impl=impl, kwargs=kwargs, n=args.n, d=args.d, v=args.v, s=args.s,
                dtype=args.dtype, compile_s=round(compile_s, 2),
                fwd_ms=1e3 * _time(fwd, inputs, args.repeats),
                fwd_bwd_ms=1e3 * _time(compiled, inputs, args.repeats),
                loss=float(fwd(*inputs)),
                bytes=sum(getattr(mem, f, 0) or 0 for f in (
                    "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")),
                device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__)
  return record


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=16384)
  p.add_argument("--d", type=int, default=2048)
  p.add_argument("--v", type=int, default=128256)
  p.add_argument("--s", type=int, default=1, help="bag size S (targets per row)")
  p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--configs", default="naive;xla;pallas")
  args = p.parse_args()
  for i, text in enumerate(args.configs.split(";")):
    impl, kwargs = parse_config(text)
    try:
      print(json.dumps(run(args, impl, kwargs, seed=i)), flush=True)
    except Exception as e:  # a tile that does not compile is a result too
      print(json.dumps(dict(impl=impl, kwargs=kwargs, error=f"{type(e).__name__}: {e}"[:500])),
            flush=True)


if __name__ == "__main__":
  main()
