r"""The MoE lab: every piece of one MoE layer timed alone, each alternative side by side, so one
GPU call decides what `auto` should be. JSON lines, then a table last.

  python benchmarks/moe_lab.py                       # GPU: the recipe's and 10B-A1B's shapes
  python benchmarks/moe_lab.py --tiny                # tiny shapes, any platform (CPU dry run)
  python benchmarks/moe_lab.py --winner gpu.jsonl    # the config of the layer it measured fastest
  python benchmarks/moe_lab.py --search              # GPU: the bounded tuning search of the
                                                     # grouped GEMM (benchmarks/gemm_search.py)
  python benchmarks/moe_lab.py --record gpu.jsonl --into tst_jax/kernels/gemm_measured.json

Shapes (one MoE layer, N = B·L tokens): `recipe` is configs/qwen3_moe_gpu_small.py (N 32768,
D 768, E 64, P 8, F 384); `b10` is the 10B-A1B (N 16384, D 1024, E 128, P 8, F 768). Pieces,
each forward and forward+backward, timed by the median of `--repeats` calls after a warm-up:
  router    the float32 router matmul, softmax, top-k and the aux statistics (moe.route)
  sort      the sort by expert into whole tiles of 64 rows (moe_dispatch.sort_by_expert)
  dispatch  token rows into expert order, each of moe_dispatch.IMPLS
  combine   each token's P rows back, weighted, each of moe_dispatch.IMPLS
  experts   the SwiGLU's three grouped GEMMs on rows sorted by expert: tokamax as a run gets it
            (platform.py's kernels and configs) and with Triton's kernel for dW or for all three
            products, XLA's ragged_dot_general and jax.lax.ragged_dot (not on a GPU: E times
            the work there), JAX's Pallas-Triton lowering of ragged_dot, the blocked batched
            matmul, capacity (each expert's first C rows as batched matmuls, the rest grouped;
            its row says the share past C), and a batched matmul over equal groups (not
            dropless: the ceiling a grouped GEMM can reach)
  pass      each product alone (forward, dX, dW of the three GEMMs) on each tokamax kernel,
            Mosaic and Triton, with the config a run gives it: what platform.py picks each
            product's kernel from, once `--record` writes it into the package
  layer     route, sort, dispatch, experts, combine: the whole layer as a run gets it
            (`auto` expert_impl and dispatch_impl), then gmm with gate and up fused into one
            grouped GEMM, and capacity
A piece alone misses what XLA does around it in a step: the fusions it joins and the layouts
its neighbours ask for. `gpu.sh moe_lab` therefore also runs the recipe's train step with the
fastest dispatch, beside quick's step at `auto`.
Dispatch, combine, router and sort run both ways, the heavy experts and layer forward+backward
only, a product forward only. The cotangents of forward+backward are drawn once, outside the
timed function. Each shape gets its share of --budget_s; a row past it is skipped, said so. Each row
carries its FLOPs, the fewest bytes it must move (each input read once, each output
written once), the time those take at the device's bf16 peak and datasheet bandwidth
(platform.py), the share of that floor the measured time reaches, and its compile time. A
device-to-device copy measured first gives the bandwidth actually reachable.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp

import gemm_search                    # benchmarks/gemm_search.py: the bounded tuning search
import grouped_matmul as gemm_bench   # benchmarks/grouped_matmul.py: tokamax's kernels by name
from tst_jax import platform
from tst_jax.kernels import grouped_matmul as gm, moe_dispatch
from tst_jax.models import experts as moe_experts, moe

SHAPES = {   # tokens N, D, E, P, F
    "recipe": (64 * 512, 768, 64, 8, 384),
    "b10": (8 * 2048, 1024, 128, 8, 768),
    "cpu": (4 * 512, 256, 16, 4, 128),     # configs/demo.py's batch, a CPU's MoE
    "tiny": (64, 32, 4, 2, 16),
}
EXPERT_IMPLS = ("tokamax", "tokamax:mosaic/mosaic/triton", "tokamax:triton/triton/triton",
                "xla", "ragged_dot", "ragged_dot_triton", "blocked", "capacity", "bmm_equal")
# What the GPU call times. XLA's ragged_dot_general and jax.lax.ragged_dot do E times the work
# there (0.5-0.7% of peak) and cost a GPU call 20 s each, blocked measured slower than tokamax
# and jax 0.11.2 has no Pallas-Triton ragged_dot (docs/performance.md): left out.
GPU_EXPERT_IMPLS = ("tokamax", "tokamax:mosaic/mosaic/triton", "tokamax:triton/triton/triton",
                    "capacity", "bmm_equal")
PASS_KERNELS = ("mosaic", "triton")   # each product timed on each
# Pieces timed forward+backward only: their compiles are long and a step runs them both ways.
BOTH_WAYS_ONLY = ("experts", "layer")


@dataclasses.dataclass
class Case:
  """One shape's inputs: tokens, routing and expert weights, drawn once."""
  name: str
  n: int
  d: int
  e: int
  k: int
  f: int
  x_NxD: jax.Array
  router_DxE: jax.Array
  weights_NxP: jax.Array
  ids_NxP: jax.Array
  experts: tuple          # gate [E, D, F], up [E, D, F], down [E, F, D], bf16
  cfg: moe.MoEConfig

  @property
  def a(self) -> int:
    return self.n * self.k


def make_case(name: str, seed: int = 0) -> Case:
  n, d, e, k, f = SHAPES[name]
  keys = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(keys[0], (n, d), jnp.bfloat16)
  router = jax.random.normal(keys[1], (d, e), jnp.float32) * d ** -0.5
  experts = tuple((jax.random.normal(kk, shape, jnp.float32) * shape[1] ** -0.5).astype(
      jnp.bfloat16) for kk, shape in zip(keys[2:], [(e, d, f), (e, d, f), (e, f, d)]))
  cfg = moe.MoEConfig(vocab_size=8, dim=d, n_layers=1, n_heads=1, n_kv_heads=1, ffw_dim=8,
                      n_experts=e, n_experts_per_token=k, moe_ffw_dim=f,
                      expert_impl="gmm", dispatch_impl="gather")
  weights, ids, _ = jax.jit(lambda x, r: moe.route(x, r, cfg))(x, router)
  return Case(name, n, d, e, k, f, x, router, weights, ids, experts, cfg)


def timed(fn, args, repeats: int) -> tuple[float, float]:
  """Returns the compile seconds and the median seconds of `repeats` calls of jitted `fn`."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  for _ in range(2):
    jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t)
  return compile_s, statistics.median(times)


def with_grad(fn, argnums, args):
  """Returns fn's forward and backward, the gradient of <fn(...), a random cotangent>, and its
  arguments: `args` and the cotangent, drawn here once so that no timed call draws it."""
  out = jax.eval_shape(fn, *args)
  leaves, tree = jax.tree.flatten(out)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  ct = tree.unflatten([(jax.random.normal(key, o.shape, jnp.float32) / 64).astype(o.dtype)
                       for key, o in zip(keys, leaves)])
  def both(*args_and_ct):
    *args, ct = args_and_ct
    grads = jax.vjp(fn, *args)[1](ct)
    return tuple(grads[i] for i in argnums)
  return both, tuple(args) + (ct,)


def sorted_rows(case: Case, row_tile: int):
  routing = moe_dispatch.sort_by_expert(case.ids_NxP, case.e, row_tile)
  return routing, moe_dispatch.dispatch(case.x_NxD, routing, case.k)


def expert_ffn(case: Case, impl: str):
  """Returns (f(x_RxD, gate, up, down), x_RxD, reason it cannot run or None) for `impl`."""
  if impl.startswith("tokamax") and (jax.default_backend() != "gpu"
                                     or not gm.tokamax_version()):
    return None, None, "tokamax needs a GPU and pip install 'tst-jax[gpu]'"
  if impl == "ragged_dot_triton" and jax.default_backend() != "gpu":
    return None, None, "JAX's Pallas-Triton ragged_dot lowering is for GPUs"
  if impl == "blocked":
    block = moe_dispatch.block_rows(case.a, case.e)
    routing, block_expert = moe_dispatch.blocked(case.ids_NxP, case.e, block)
    x_RxD = moe_dispatch.dispatch(case.x_NxD, routing, case.k)
    return (lambda x, *w: moe_experts.swiglu(moe_experts.blocked_matmul(block_expert, block), x, *w)), x_RxD, None
  if impl == "capacity":
    backend, kernels = gemm_bench.backend_of("tokamax" if gm.tokamax_version() and
                                             jax.default_backend() == "gpu" else "xla")
    c = moe_dispatch.capacity_rows(case.a, case.e, case.cfg.expert_capacity_factor)
    routing = moe_dispatch.capacity(case.ids_NxP, case.e, c, gm.row_tile(backend))
    x_RxD = moe_dispatch.dispatch(case.x_NxD, routing, case.k)
    matmul = moe_experts.capacity_matmul(case.e, c, lambda a, w, sizes: gm.grouped_matmul(
        a, w, sizes, backend, kernels))
    return (lambda x, *w: moe_experts.swiglu(lambda a, ww: matmul(a, ww, routing.sizes_E), x, *w)), \
        x_RxD, None
  if impl == "bmm_equal":   # A / E rows per expert: the grouped GEMM's balanced ceiling
    per = case.a // case.e
    x_RxD = case.x_NxD[jnp.arange(per * case.e) % case.n]
    matmul = lambda a, w: jnp.einsum("egi,eio->ego", a.reshape(case.e, per, -1), w).reshape(
        a.shape[0], -1)
    return (lambda x, *w: moe_experts.swiglu(matmul, x, *w)), x_RxD, None
  backend, kernels = gemm_bench.backend_of("xla" if impl.startswith("ragged") else impl)
  routing, x_RxD = sorted_rows(case, gm.row_tile(backend))
  sizes = routing.sizes_E
  if impl.startswith("ragged_dot"):
    matmul = lambda a, w: jax.lax.ragged_dot(a, w, sizes)
  else:   # the run's layout: rows past the groups only where A is not whole tiles
    matmul = lambda a, w: gm.grouped_matmul(a, w, sizes, backend, kernels,
                                            tail=x_RxD.shape[0] != case.a)
  return (lambda x, *w: moe_experts.swiglu(matmul, x, *w)), x_RxD, None


def pass_fn(case: Case, product: str, kernel: str):
  """Returns (f(x, dy_f, dy_d, gate, up, down), reason it cannot run or None): `product` of
  the layer's three grouped GEMMs on tokamax's `kernel` alone, with the config a run gives it;
  x [R, D], dy_f [R, F] and dy_d [R, D] stand in for the rows and cotangents."""
  if jax.default_backend() != "gpu" or not gm.tokamax_version():
    return None, "tokamax needs a GPU and pip install 'tst-jax[gpu]'"
  backend, kernels = gemm_bench.backend_of("tokamax")
  kernels = kernels._replace(**{product: (kernel,)})
  routing, _ = sorted_rows(case, gm.ROW_TILE)
  sizes = routing.sizes_E
  run = lambda lhs, rhs, out: gm.product(product, lhs, rhs, sizes, backend, kernels, out)
  def f(x, dy_f, dy_d, gate, up, down):
    if product == "forward":   # x·gate, x·up, h·down (dy_f stands in for h)
      return run(x, gate, None), run(x, up, None), run(dy_f, down, None)
    if product == "dx":
      return run(dy_f, gate, x.dtype), run(dy_f, up, x.dtype), run(dy_d, down, x.dtype)
    return run(x, dy_f, gate.dtype), run(x, dy_f, up.dtype), run(dy_f, dy_d, down.dtype)
  return f, None


def pieces(case: Case, impls: list[str], expert_impls: list[str]):
  """Yields (piece, impl, fn, args, grad argnums, flops fwd, bytes fwd, bytes bwd, why-not)."""
  n, d, e, k, f, a = case.n, case.d, case.e, case.k, case.f, case.a
  b16 = 2
  def router(x, r):
    weights, _, aux = moe.route(x, r, case.cfg)
    return weights, aux["lb_loss"], aux["z_loss"]
  yield ("router", "route", router, (case.x_NxD, case.router_DxE), (0, 1),
         2 * n * d * e, n * d * b16 + d * e * 4 + n * k * 8, n * d * b16 + d * e * 4, None)
  yield ("sort", "sort_by_expert", lambda ids: moe_dispatch.sort_by_expert(ids, e, gm.ROW_TILE),
         (case.ids_NxP,), None, 0, a * 4 * 3, 0, None)
  routing, y_RxD = sorted_rows(case, gm.ROW_TILE)
  r = y_RxD.shape[0]
  for impl in impls:
    yield ("dispatch", impl, lambda x, i=impl: moe_dispatch.dispatch(x, routing, k, i),
           (case.x_NxD,), (0,), 0, n * d * b16 + r * d * b16 + r * 4,
           r * d * b16 + n * d * b16 + a * 4, None)
    yield ("combine", impl, lambda y, w, i=impl: moe_dispatch.combine(y, w, routing, i),
           (y_RxD, case.weights_NxP), (0, 1), 0, r * d * b16 + n * k * 8 + n * d * b16,
           n * d * b16 + r * d * b16 * 2 + n * k * 8, None)
  weights_bytes = 3 * e * d * f * b16
  for impl in expert_impls:
    ffn, x_RxD, why = expert_ffn(case, impl)
    rows = a if x_RxD is None else x_RxD.shape[0]
    yield ("experts", impl, ffn, None if x_RxD is None else (x_RxD,) + case.experts,
           (0, 1, 2, 3), 6 * a * d * f, rows * d * b16 * 2 + weights_bytes,
           rows * d * b16 * 2 + weights_bytes * 2, why)
  keys = jax.random.split(jax.random.key(2), 2)
  stand_ins = (y_RxD, jax.random.normal(keys[0], (r, f), jnp.bfloat16),
               jax.random.normal(keys[1], (r, d), jnp.bfloat16))
  for product in gm.PRODUCTS:
    for kernel in PASS_KERNELS:
      fn, why = pass_fn(case, product, kernel)
      yield ("pass", f"{product}/{kernel}", fn, stand_ins + case.experts, None, 6 * a * d * f,
             r * (d + f) * b16 + weights_bytes, 0, why)


def layer_flops(case: Case) -> int:
  """Returns one MoE layer's forward FLOPs: the three expert matmuls of each assignment and the
  router's matmul."""
  return 6 * case.a * case.d * case.f + 2 * case.n * case.d * case.e


# The layer's candidates beside the run's: (expert_impl, gate and up fused).
LAYER_VARIANTS = (("gmm", "on"), ("capacity", "off"))


def layer_name(impl: str, dispatch: str, fuse: str) -> str:
  """A layer row's impl, e.g. gmm/pallas+fuse_gate_up: what --winner turns into a config."""
  return f"{impl}/{dispatch}" + ("+fuse_gate_up" if fuse == "on" else "")


def layer(case: Case, dispatch: str, impl: str, fuse: str):
  """The whole MoE layer: route, then experts `impl` with `dispatch`, gate and up fused or
  not, as the config would run it."""
  experts = moe_experts.expert_fn(impl, dispatch, fuse, case.cfg.expert_capacity_factor)
  def fn(x, router, gate, up, down):
    weights, ids, aux = moe.route(x, router, case.cfg)
    return experts(x, ids, weights, gate, up, down), aux["lb_loss"]
  return fn


def measure(case, piece, impl, fn, args, argnums, flops, bytes_fwd, bytes_bwd, why, *, repeats,
            peak, bandwidth, copy_bandwidth):
  """Times `fn` forward and, with argnums, forward+backward: one JSON row each."""
  base = dict(lab=True, shape=case.name, piece=piece, impl=impl)
  if why:
    yield dict(base, skipped=why)
    return
  modes = [] if piece in BOTH_WAYS_ONLY else [("fwd", fn, args, flops, bytes_fwd)]
  if argnums is not None:
    modes.append(("fwd_bwd", *with_grad(fn, argnums, args), 3 * flops, bytes_fwd + bytes_bwd))
  for mode, f, f_args, fl, by in modes:
    if impl == "ragged_dot_triton":
      jax.config.update("jax_ragged_dot_use_gpu_pallas_triton_lowering", True)
    try:
      compile_s, seconds = timed(f, f_args, repeats)
    except Exception as e:   # pylint: disable=broad-except  (a row that fails is a finding)
      yield dict(base, mode=mode, failed=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
      continue
    finally:
      if impl == "ragged_dot_triton":
        jax.config.update("jax_ragged_dot_use_gpu_pallas_triton_lowering", False)
    floor_flops = fl / peak if peak else 0.0
    floor_bytes = by / bandwidth if bandwidth else 0.0
    floor = max(floor_flops, floor_bytes)
    bound = None if not floor else "compute" if floor_flops >= floor_bytes else "memory"
    yield dict(base, mode=mode, ms=1e3 * seconds, compile_s=round(compile_s, 3), flops=fl,
               bytes=by, bound=bound,
               floor_ms=1e3 * floor, of_floor=floor / seconds if floor else None,
               tflops=fl / seconds / 1e12, gbytes_per_s=by / seconds / 1e9,
               of_copy_bandwidth=by / seconds / copy_bandwidth if copy_bandwidth else None)


def copy_bandwidth(repeats: int) -> float:
  """Measures a device-to-device copy of 2 GiB (256 MiB on CPU): bytes read plus written per s."""
  size = (1 << 30 if jax.default_backend() == "gpu" else 1 << 27) // 4
  src = jnp.arange(size, dtype=jnp.float32)
  _, seconds = timed(lambda a: a * 1.0 + 1.0, (src,), repeats)
  return 2 * 4 * size / seconds


def winners(rows: list[dict]) -> dict:
  """Returns, per shape, the dispatch whose dispatch+combine forward+backward is fastest, the
  expert implementation and the whole layer whose forward+backward is fastest, and each
  product's ms per tokamax kernel, from lab rows."""
  out = {}
  for shape in sorted({r["shape"] for r in rows if r.get("lab") and r["shape"] != "-"}):
    timed_rows = [r for r in rows if r.get("shape") == shape and r.get("mode") == "fwd_bwd"
                  and "ms" in r]
    move = {}
    for r in timed_rows:
      if r["piece"] in ("dispatch", "combine"):
        move.setdefault(r["impl"], {})[r["piece"]] = r["ms"]
    move = {i: v["dispatch"] + v["combine"] for i, v in move.items() if len(v) == 2}
    gemm = {r["impl"]: r["ms"] for r in timed_rows if r["piece"] == "experts"
            and r["impl"] != "bmm_equal"}
    layers = {r["impl"]: r["ms"] for r in timed_rows if r["piece"] == "layer"}
    _, passes, _ = gemm_search.measured([r for r in rows if r.get("shape") == shape])
    out[shape] = dict(dispatch=min(move, key=move.get) if move else None,
                      dispatch_ms=move, experts=min(gemm, key=gemm.get) if gemm else None,
                      layer=min(layers, key=layers.get) if layers else None,
                      passes=passes.get(shape, {}))
  return out


def step_args(found: dict, fuse: str | None = None) -> str:
  """Returns the config overrides of the first shape's fastest whole layer, for a train step:
  its expert_impl, dispatch and gate and up fused or not, or as `fuse` says where its
  expert_impl fuses them. Without layer rows, the fastest dispatch alone."""
  w = next((w for w in found.values() if w["layer"] or w["dispatch"]), None)
  if w is None:
    return "--config.model.dispatch_impl=gather"
  if not w["layer"]:
    return f"--config.model.dispatch_impl={w['dispatch']}"
  experts, rest = w["layer"].split("/", 1)
  dispatch, *variant = rest.split("+")
  fused = "on" if "fuse_gate_up" in variant else "off"
  if fuse and experts in platform.FUSES_GATE_UP:
    fused = fuse
  return (f"--config.model.expert_impl={experts} --config.model.dispatch_impl={dispatch} "
          f"--config.model.expert_fuse_gate_up={fused}")


def table(rows: list[dict]) -> str:
  lines = ["| shape | piece | impl | fwd ms | fwd+bwd ms | of floor (fwd+bwd) | bound | "
           "compile s |", "|---|---|---|---:|---:|---:|---|---:|"]
  keyed, copy = {}, next((r for r in rows if r.get("piece") == "copy"), None)
  if copy:
    lines.append(f"| - | copy | device-to-device | {copy['copy_gbytes_per_s']:.0f} GB/s read + "
                 f"written, of {copy['datasheet_gbytes_per_s'] or '?'} on the datasheet | | | | |")
  for r in rows:
    if r.get("lab") and r["shape"] != "-" and r["piece"] != "search":
      keyed.setdefault((r["shape"], r["piece"], r["impl"]), {})[r.get("mode", "-")] = r
  for (shape, piece, impl), modes in keyed.items():
    fwd, both = modes.get("fwd", {}), modes.get("fwd_bwd", {})
    note = next((m.get("skipped") or m.get("failed") for m in modes.values()
                 if m.get("skipped") or m.get("failed")), "")
    if "overflow" in both:
      note = f"{both['overflow']:.1%} of the assignments past C"
    ms = lambda m: f"{m['ms']:.3f}" if "ms" in m else ""
    share = both.get("of_floor", fwd.get("of_floor"))
    lines.append(f"| {shape} | {piece} | {impl} | {ms(fwd)} | {ms(both)} | "
                 f"{'' if share is None else f'{share:.1%}'} | "
                 f"{both.get('bound') or fwd.get('bound') or ''} | "
                 f"{both.get('compile_s', fwd.get('compile_s', ''))} |"
                 + (f" {note}" if note else ""))
  for r in rows:
    if r.get("piece") == "search":
      found = (f"{r['ms']:.3f} ms (from {r['start_ms'] or 0:.3f}), {r['candidates']} configs in "
               f"{r['search_s']} s: {json.dumps(r['config'])}" if "config" in r
               else r.get("skipped") or r.get("failed"))
      lines.append(f"- search {r['shape']} {r.get('call', '')} {r['impl']}: {found}")
  for shape, w in winners(rows).items():
    if not any((w["layer"], w["dispatch"], w["experts"], w["passes"])):
      continue
    passes = ", ".join(f"{p} {min(k, key=k.get)}" for p, k in w["passes"].items())
    lines.append(f"- {shape}: fastest whole layer {w['layer']}, dispatch+combine (fwd+bwd) "
                 f"{w['dispatch']}, fastest experts {w['experts']}"
                 + (f", fastest kernel per product: {passes}" if passes else ""))
  return "\n".join(lines)


def capacity_overflow(case: Case) -> float:
  """The share of the case's assignments past their expert's C slots under capacity."""
  counts = jnp.bincount(case.ids_NxP.reshape(-1), length=case.e)
  c = moe_dispatch.capacity_rows(case.a, case.e, case.cfg.expert_capacity_factor)
  return float(moe_dispatch.overflow_share(counts, c))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", default="recipe,b10")
  p.add_argument("--tiny", action="store_true", help="the tiny shape only: a check that it runs")
  p.add_argument("--impls", default=",".join(moe_dispatch.IMPLS))
  p.add_argument("--expert_impls", default=None, help=f"of {EXPERT_IMPLS}; default "
                 f"{GPU_EXPERT_IMPLS} on a GPU, all elsewhere")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--budget_s", type=float, default=150.0,
                 help="each shape's rows that would start past its share of this many seconds "
                 "are skipped, said so")
  p.add_argument("--winner", metavar="JSONL", help="print the config overrides of the fastest "
                 "whole layer in a lab's JSON lines (of the first shape) and exit")
  p.add_argument("--fuse", choices=("on", "off"), help="with --winner: gate and up fused or "
                 "not, whatever the winner did (where its expert_impl fuses them)")
  p.add_argument("--table", metavar="JSONL", help="print the table of a lab's JSON lines and "
                 "exit")
  p.add_argument("--search", action="store_true", help="run the bounded tuning search of the "
                 "grouped GEMM's calls at --shapes instead of the lab's pieces")
  p.add_argument("--search_s", type=float, default=60.0, help="the search's seconds per call")
  p.add_argument("--record", metavar="JSONL", help="fold a GPU call's pass and search rows "
                 "into the table --into and exit")
  p.add_argument("--into", metavar="JSON", help="with --record: the table to write (default: "
                 "the package's tst_jax/kernels/gemm_measured.json)")
  args = p.parse_args(argv)
  if args.winner or args.table or args.record:
    rows = [json.loads(line) for line in open(args.winner or args.table or args.record)
            if line.startswith("{")]
    if args.table:
      print(table(rows))
    elif args.record:
      print(gemm_search.record(rows, args.into))
    else:
      print(step_args(winners(rows), args.fuse))
    return
  start = time.perf_counter()
  kind = jax.devices()[0].device_kind
  peak, bandwidth = platform.peak_flops(kind), platform.peak_bandwidth(kind)
  copy = copy_bandwidth(args.repeats)
  print(json.dumps(dict(lab=True, shape="-", piece="copy", impl="device-to-device",
                        copy_gbytes_per_s=copy / 1e9, datasheet_gbytes_per_s=(
                            bandwidth / 1e9 if bandwidth else None), device_kind=kind,
                        jax_version=jax.__version__, tokamax=gm.tokamax_version())), flush=True)
  rows = []
  shapes = ["tiny"] if args.tiny else args.shapes.split(",")
  if args.search:
    deadline = start + args.search_s * sum(len(list(gemm_search.calls(*SHAPES[name])))
                                           for name in shapes)
    for name in shapes:
      for row in gemm_search.search_rows(name, SHAPES[name], args.search_s, deadline):
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows), flush=True)
    return
  impls = args.impls.split(",")
  expert_impls = ([i for i in args.expert_impls.split(",") if i]
                  if args.expert_impls is not None else
                  GPU_EXPERT_IMPLS if jax.default_backend() == "gpu" else EXPERT_IMPLS)
  for index, name in enumerate(shapes):
    case = make_case(name)
    todo = list(pieces(case, impls, expert_impls))
    deadline = args.budget_s * (index + 1) / len(shapes)   # each shape its share
    past = f"past this shape's share of the lab's {args.budget_s:.0f} s"
    for piece, impl, fn, fargs, argnums, flops, bf, bb, why in todo:
      if time.perf_counter() - start > deadline:
        why = why or past
      for row in measure(case, piece, impl, fn, fargs, argnums, flops, bf, bb, why,
                         repeats=args.repeats, peak=peak, bandwidth=bandwidth,
                         copy_bandwidth=copy):
        if (piece, impl, row.get("mode")) == ("experts", "capacity", "fwd_bwd"):
          row["overflow"] = capacity_overflow(case)
        rows.append(row)
        print(json.dumps(row), flush=True)
    dispatch = platform.dispatch_impl("auto")[0]   # the layer as a run gets it, then the lab's
    experts = platform.expert_impl("auto")[0]      # candidates
    run_fuse = platform.fuse_gate_up("auto", experts)[0]
    for impl, fuse in [(experts, run_fuse)] + list(LAYER_VARIANTS):
      why = None if time.perf_counter() - start <= deadline else past
      for row in measure(case, "layer", layer_name(impl, dispatch, fuse),
                         layer(case, dispatch, impl, fuse),
                         (case.x_NxD, case.router_DxE) + case.experts, (0, 1, 2, 3, 4),
                         layer_flops(case), 0, 0, why, repeats=args.repeats, peak=peak,
                         bandwidth=None, copy_bandwidth=None):
        rows.append(row)
        print(json.dumps(row), flush=True)
  print(json.dumps(dict(lab=True, shape="-", piece="winners", impl="-", winners=winners(rows),
                        wall_s=time.perf_counter() - start)), flush=True)
  print(table(rows), flush=True)


if __name__ == "__main__":
  main()
