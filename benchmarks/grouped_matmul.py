r"""The MoE experts' grouped GEMM alone (tst_jax/kernels/grouped_matmul.py): one JSON line per
backend, forward and forward+backward, TFLOP/s and the fraction of the dense bf16 peak.

  python benchmarks/grouped_matmul.py                  # GPU: D 1024, F 768, 128 experts,
                                                       # ~1k rows each (the 10B-A1B layer)
  python benchmarks/grouped_matmul.py --smoke          # tiny shapes, any platform (CPU test)
  python benchmarks/grouped_matmul.py --backends tokamax,tokamax:mosaic/mosaic/mosaic
      # what a run gets (platform.py's kernel per product) against one kernel for all three

Rows go to experts unevenly (a seeded Dirichlet over the experts, some empty), as a router
sends them: 131009 rows at the defaults, not a multiple of tokamax's tile (grouped_matmul pads).
FLOPs: 2·A·D·F forward, 3x that for forward+backward (dX and dW). With tokamax, compile_s
includes its autotuning the first time a shape is seen (then kept: kernels/tokamax_tuning.py;
`tuning` says where, or that it is off).
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tst_jax import platform
from tst_jax.kernels import grouped_matmul as gm, tokamax_tuning


def backend_of(name: str) -> tuple[str, gm.Kernels]:
  """'xla'; 'tokamax' (the kernels platform.py picks for this GPU, what a run gets); or
  'tokamax:<forward>/<dX>/<dW>', one tokamax kernel name each (e.g. mosaic/mosaic/triton),
  each with the config platform.py pins for it on this GPU, where it pins one."""
  if name == "tokamax":
    backend, kernels, _ = platform.grouped_matmul_backend("gpu")
    return backend, kernels
  if name.startswith("tokamax:"):
    names = name.split(":", 1)[1].split("/")
    if len(names) != 3:
      raise SystemExit(f"--backends: {name!r}: give tokamax:<forward>/<dX>/<dW>")
    pinned = platform.grouped_matmul_backend("gpu")[1].pinned
    return "tokamax", gm.Kernels(*((n,) for n in names), pinned=pinned)
  return name, gm.Kernels()


def timed(fn, *args, repeats: int):
  jax.block_until_ready(fn(*args))               # compile and warm
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dim", type=int, default=1024)
  p.add_argument("--ffw", type=int, default=768)
  p.add_argument("--experts", type=int, default=128)
  p.add_argument("--rows_per_expert", type=int, default=1024)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--backends", default="xla,tokamax",
                 help="xla | tokamax | tokamax:<forward>/<dX>/<dW>, comma-separated")
  p.add_argument("--smoke", action="store_true", help="tiny shapes: a check that it runs")
  args = p.parse_args(argv)
  if args.smoke:
    args.dim, args.ffw, args.experts, args.rows_per_expert, args.repeats = 32, 16, 8, 16, 2
  e, d, f = args.experts, args.dim, args.ffw
  rng = np.random.default_rng(0)
  share = rng.dirichlet(np.full(e, 0.5))                       # uneven, some near 0
  sizes = np.floor(share * e * args.rows_per_expert).astype(np.int32)
  a = int(sizes.sum())
  x = jnp.asarray(rng.normal(size=(a, d)), args.dtype)
  w = jnp.asarray(rng.normal(size=(e, d, f)) / np.sqrt(d), args.dtype)
  sizes = jnp.asarray(sizes)
  peak = platform.peak_flops(jax.devices()[0].device_kind)
  for name in args.backends.split(","):
    if name.startswith("tokamax") and not gm.tokamax_version():
      print(json.dumps(dict(backend=name, skipped="tokamax is not installed "
                            "(pip install 'tst-jax[gpu]')")), flush=True)
      continue
    backend, kernels = backend_of(name)
    forward = jax.jit(lambda x, w, b=backend, k=kernels: gm.grouped_matmul(x, w, sizes, b, k))
    both = jax.jit(jax.grad(lambda x, w, b=backend, k=kernels: gm.grouped_matmul(
        x, w, sizes, b, k).astype(jnp.float32).sum(), argnums=(0, 1)))
    t0 = time.perf_counter()
    jax.block_until_ready(both(x, w))
    compile_s = time.perf_counter() - t0
    t_fwd, t_both = timed(forward, x, w, repeats=args.repeats), timed(both, x, w,
                                                                      repeats=args.repeats)
    flops = 2 * a * d * f
    result = dict(backend=name, kernels=kernels.line() if backend == "tokamax" else None,
                  tuning=tokamax_tuning.describe() if backend == "tokamax" else None,
                  rows=a, experts=e, dim=d, ffw=f, dtype=args.dtype,
                  fwd_ms=1e3 * t_fwd, fwd_bwd_ms=1e3 * t_both, compile_s=compile_s,
                  fwd_tflops=flops / t_fwd / 1e12, fwd_bwd_tflops=3 * flops / t_both / 1e12,
                  device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__)
    if peak:
      result.update(fwd_of_peak=flops / t_fwd / peak, fwd_bwd_of_peak=3 * flops / t_both / peak)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
