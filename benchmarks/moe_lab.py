r"""The MoE lab: every piece of one MoE layer timed alone, each alternative side by side, so one
GPU call decides what `auto` should be. JSON lines, then a table last.

  python benchmarks/moe_lab.py                       # GPU: the recipe's and 10B-A1B's shapes
  python benchmarks/moe_lab.py --tiny                # tiny shapes, any platform (CPU dry run)
  python benchmarks/moe_lab.py --winner gpu.jsonl    # the config of the layer it measured fastest

Shapes (one MoE layer, N = B·L tokens): `recipe` is configs/qwen3_moe_gpu_small.py (N 32768,
D 768, E 64, P 8, F 384); `b10` is the 10B-A1B (N 16384, D 1024, E 128, P 8, F 768). Pieces,
each forward and forward+backward, timed by the median of `--repeats` calls after a warm-up:
  router    the float32 router matmul, softmax, top-k and the aux statistics (moe.route)
  sort      the sort by expert into whole tiles of 64 rows (moe_dispatch.sort_by_expert)
  dispatch  token rows into expert order, each of moe_dispatch.IMPLS
  combine   each token's P rows back, weighted, each of moe_dispatch.IMPLS
  experts   the SwiGLU's three grouped GEMMs on rows sorted by expert: tokamax as a run gets it
            (shipped tables) and with Triton's kernel for dW or for all three products, XLA's
            ragged_dot_general and jax.lax.ragged_dot (not on a GPU: E times the work there),
            JAX's Pallas-Triton lowering of ragged_dot, the blocked batched matmul, and a
            batched matmul over equal groups (not dropless: the ceiling a grouped GEMM can
            reach)
  layer     route, sort, dispatch, experts, combine: the whole layer as a run gets it
            (`auto` expert_impl and dispatch_impl), then gmm with gate and up fused into one
            grouped GEMM, with the rows past the groups left undefined, and with both
A piece alone misses what XLA does around it in a step: the fusions it joins and the layouts
its neighbours ask for. `gpu.sh moe_lab` therefore also runs the recipe's train step with the
fastest dispatch, beside quick's step at `auto`.
Dispatch, combine, router and sort run both ways, the heavy experts and layer forward+backward
only. Each shape gets its share of --budget_s; a row past it is skipped, said so. Each row
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

import grouped_matmul as gemm_bench   # benchmarks/grouped_matmul.py: tokamax's kernels by name
from tst_jax import platform
from tst_jax.kernels import grouped_matmul as gm, moe_dispatch
from tst_jax.models import moe

SHAPES = {   # tokens N, D, E, P, F
    "recipe": (64 * 512, 768, 64, 8, 384),
    "b10": (8 * 2048, 1024, 128, 8, 768),
    "cpu": (4 * 512, 256, 16, 4, 128),     # configs/demo.py's batch, a CPU's MoE
    "tiny": (64, 32, 4, 2, 16),
}
EXPERT_IMPLS = ("tokamax", "tokamax:mosaic/mosaic/triton", "tokamax:triton/triton/triton",
                "xla", "ragged_dot", "ragged_dot_triton", "blocked", "bmm_equal")
# What the GPU call times. XLA's ragged_dot_general and jax.lax.ragged_dot do E times the work
# there (0.5-0.7% of peak) and cost a GPU call 20 s each, blocked measured slower than tokamax
# and jax 0.11.2 has no Pallas-Triton ragged_dot (docs/performance.md): left out.
GPU_EXPERT_IMPLS = ("tokamax", "tokamax:mosaic/mosaic/triton", "tokamax:triton/triton/triton",
                    "bmm_equal")
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


def with_grad(fn, argnums):
  """Returns fn's forward and backward: the gradient of <fn(...), a fixed random cotangent>."""
  def both(*args):
    out, vjp = jax.vjp(lambda *a: fn(*a), *args)
    ct = jax.tree.map(lambda o: (jax.random.normal(jax.random.key(1), o.shape, jnp.float32)
                                 / 64).astype(o.dtype), out)
    grads = vjp(ct)
    return tuple(grads[i] for i in argnums)
  return both


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
    return (lambda x, *w: moe._swiglu(moe.blocked_matmul(block_expert, block), x, *w)), x_RxD, None
  if impl == "bmm_equal":   # A / E rows per expert: the grouped GEMM's balanced ceiling
    per = case.a // case.e
    x_RxD = case.x_NxD[jnp.arange(per * case.e) % case.n]
    matmul = lambda a, w: jnp.einsum("egi,eio->ego", a.reshape(case.e, per, -1), w).reshape(
        a.shape[0], -1)
    return (lambda x, *w: moe._swiglu(matmul, x, *w)), x_RxD, None
  backend, kernels = gemm_bench.backend_of("xla" if impl.startswith("ragged") else impl)
  routing, x_RxD = sorted_rows(case, gm.row_tile(backend))
  sizes = routing.sizes_E
  if impl.startswith("ragged_dot"):
    matmul = lambda a, w: jax.lax.ragged_dot(a, w, sizes)
  else:
    matmul = lambda a, w: gm.grouped_matmul(a, w, sizes, backend, kernels)
  return (lambda x, *w: moe._swiglu(matmul, x, *w)), x_RxD, None


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
  for impl in expert_impls:
    ffn, x_RxD, why = expert_ffn(case, impl)
    rows = a if x_RxD is None else x_RxD.shape[0]
    weights_bytes = 3 * e * d * f * b16
    yield ("experts", impl, ffn, None if x_RxD is None else (x_RxD,) + case.experts,
           (0, 1, 2, 3), 6 * a * d * f, rows * d * b16 * 2 + weights_bytes,
           rows * d * b16 * 2 + weights_bytes * 2, why)


def layer_flops(case: Case) -> int:
  """Returns one MoE layer's forward FLOPs: the three expert matmuls of each assignment and the
  router's matmul."""
  return 6 * case.a * case.d * case.f + 2 * case.n * case.d * case.e


# The layer's candidates beside the run's: gmm with gate and up as one grouped GEMM, with the
# rows past the groups left undefined, and with both (moe.experts_gmm's arguments).
LAYER_VARIANTS = {"fuse_gate_up": dict(fuse_gate_up=True), "no_zero_tail": dict(zero_tail=False),
                  "fuse_gate_up+no_zero_tail": dict(fuse_gate_up=True, zero_tail=False)}


def layer(case: Case, dispatch: str, variant: str | None = None):
  """The whole MoE layer as a run gets it here: route, then the platform's expert_impl=auto
  with `dispatch`; or gmm with one of LAYER_VARIANTS."""
  experts = (moe.expert_fn(platform.expert_impl("auto")[0], dispatch) if variant is None else
             functools.partial(moe.experts_gmm, dispatch=dispatch, **LAYER_VARIANTS[variant]))
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
  modes = [] if piece in BOTH_WAYS_ONLY else [("fwd", fn, flops, bytes_fwd)]
  if argnums is not None:
    modes.append(("fwd_bwd", with_grad(fn, argnums), 3 * flops, bytes_fwd + bytes_bwd))
  for mode, f, fl, by in modes:
    if impl == "ragged_dot_triton":
      jax.config.update("jax_ragged_dot_use_gpu_pallas_triton_lowering", True)
    try:
      compile_s, seconds = timed(f, args, repeats)
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
  """Returns, per shape, the dispatch whose dispatch+combine forward+backward is fastest and
  the expert implementation whose forward+backward is fastest, from lab rows."""
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
    out[shape] = dict(dispatch=min(move, key=move.get) if move else None,
                      dispatch_ms=move, experts=min(gemm, key=gemm.get) if gemm else None,
                      layer=min(layers, key=layers.get) if layers else None)
  return out


def step_args(found: dict) -> str:
  """Returns the config overrides of the first shape's fastest whole layer, for a train step:
  its expert_impl, dispatch and fused gate and up. zero_tail has no config field: a layer
  that left it off is stepped with it on. Without layer rows, the fastest dispatch alone."""
  w = next((w for w in found.values() if w["layer"] or w["dispatch"]), None)
  if w is None:
    return "--config.model.dispatch_impl=gather"
  if not w["layer"]:
    return f"--config.model.dispatch_impl={w['dispatch']}"
  experts, rest = w["layer"].split("/", 1)
  dispatch, *variant = rest.split("+")
  return (f"--config.model.expert_impl={experts} --config.model.dispatch_impl={dispatch} "
          f"--config.model.expert_fuse_gate_up={'fuse_gate_up' in variant}")


def table(rows: list[dict]) -> str:
  lines = ["| shape | piece | impl | fwd ms | fwd+bwd ms | of floor (fwd+bwd) | bound | "
           "compile s |", "|---|---|---|---:|---:|---:|---|---:|"]
  keyed, copy = {}, next((r for r in rows if r.get("piece") == "copy"), None)
  if copy:
    lines.append(f"| - | copy | device-to-device | {copy['copy_gbytes_per_s']:.0f} GB/s read + "
                 f"written, of {copy['datasheet_gbytes_per_s'] or '?'} on the datasheet | | | | |")
  for r in rows:
    if r.get("lab") and r["shape"] != "-":
      keyed.setdefault((r["shape"], r["piece"], r["impl"]), {})[r.get("mode", "-")] = r
  for (shape, piece, impl), modes in keyed.items():
    fwd, both = modes.get("fwd", {}), modes.get("fwd_bwd", {})
    note = next((m.get("skipped") or m.get("failed") for m in modes.values()
                 if m.get("skipped") or m.get("failed")), "")
    ms = lambda m: f"{m['ms']:.3f}" if "ms" in m else ""
    share = both.get("of_floor", fwd.get("of_floor"))
    lines.append(f"| {shape} | {piece} | {impl} | {ms(fwd)} | {ms(both)} | "
                 f"{'' if share is None else f'{share:.1%}'} | "
                 f"{both.get('bound') or fwd.get('bound') or ''} | "
                 f"{both.get('compile_s', fwd.get('compile_s', ''))} |"
                 + (f" {note}" if note else ""))
  for shape, w in winners(rows).items():
    lines.append(f"- {shape}: fastest whole layer {w['layer']}, dispatch+combine (fwd+bwd) "
                 f"{w['dispatch']}, fastest "
                 f"experts {w['experts']}")
  return "\n".join(lines)


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
  p.add_argument("--table", metavar="JSONL", help="print the table of a lab's JSON lines and "
                 "exit")
  args = p.parse_args(argv)
  if args.winner or args.table:
    rows = [json.loads(line) for line in open(args.winner or args.table)
            if line.startswith("{")]
    if args.table:
      print(table(rows))
    else:
      print(step_args(winners(rows)))
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
        rows.append(row)
        print(json.dumps(row), flush=True)
    dispatch = platform.dispatch_impl("auto")[0]   # the layer as a run gets it, then the lab's
    for variant in [None] + list(LAYER_VARIANTS):  # candidates
      why = None if time.perf_counter() - start <= deadline else past
      name = (f"gmm/{dispatch}+{variant}" if variant else
              f"{platform.expert_impl('auto')[0]}/{dispatch}")
      for row in measure(case, "layer", name,
                         layer(case, dispatch, variant),
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
