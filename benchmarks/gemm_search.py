r"""The MoE lab's bounded tuning search of the grouped GEMM, and the record of a GPU call's
measurements into the package's table (tst_jax/kernels/gemm_measured.py).

  python benchmarks/moe_lab.py --search --shapes recipe     # GPU: one row per call searched
  python benchmarks/moe_lab.py --record gpu.jsonl --into tst_jax/kernels/gemm_measured.json

The search takes each grouped GEMM call of one MoE layer (forward, dX and dW of the gate/up and
down projections, and of gate and up fused), on the kernel a run gives that product
(`platform.grouped_matmul_backend`), and times at most MAX_CANDIDATES tile configs around the
one a run starts from: its pinned config, else tokamax's heuristic tile. Each field steps one
place either way along the values tokamax's own autotuning tries, then the block sizes two at
a time. tokamax compiles and times them (`BoundArguments.autotune`), stopped at --search_s
seconds per call; the fastest is the row's config, beside the time of the one it started from.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time

import jax
import jax.numpy as jnp

from tst_jax import platform
from tst_jax.kernels import gemm_measured, grouped_matmul as gm

# The values tokamax 0.0.17 autotunes each field over, for bf16 operands on sm_90: Mosaic's
# block_n is its output's swizzle width there, so it stays as the start has it. Mosaic's
# num_stages adds 3 to tokamax's 2 and 4.
GRID = {
    "mosaic": dict(block_m=(16, 32, 64, 128), block_k=(128, 256, 512), num_stages=(2, 3, 4),
                   persistent=(False, True), grid_minor_dim=(0, 1),
                   grid_tile_width=(1, 2, 4, 8)),
    "triton": dict(block_m=(32, 64, 128, 256), block_n=(32, 64, 128, 256),
                   block_k=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4, 5, 6)),
}
MAX_CANDIDATES = 36
BLOCKS = ("block_m", "block_n", "block_k")


def _steps(grid: tuple, value) -> list:
  """The values one place either way of `value` along `grid`, the nearest where it is off it."""
  at = min(range(len(grid)), key=lambda i: abs(grid[i] - value))
  return [grid[i] for i in (at - 1, at + 1) if 0 <= i < len(grid) and grid[i] != value] + (
      [grid[at]] if grid[at] != value else [])


def candidates(kernel: str, start: dict) -> list[dict]:
  """Returns `start` and the configs around it, start first, at most MAX_CANDIDATES: each
  field of GRID[kernel] that `start` sets one step either way, then two fields one step each,
  block sizes first."""
  grid = {name: values for name, values in GRID[kernel].items() if name in start}
  found = [dict(start)]
  def add(config):
    if config not in found and len(found) < MAX_CANDIDATES:
      found.append(config)
  for name, values in grid.items():
    for value in _steps(values, start[name]):
      add({**start, name: value})
  names = sorted(grid, key=lambda n: n not in BLOCKS)
  for a, b in itertools.combinations(names, 2):
    for va, vb in itertools.product(_steps(grid[a], start[a]), _steps(grid[b], start[b])):
      add({**start, a: va, b: vb})
  return found


def calls(n: int, d: int, e: int, k: int, f: int):
  """Yields (name, product, lhs shape, rhs shape, out dtype) for each grouped GEMM call of one
  layer with N·P assignments in whole tiles of the tokamax kernels' rows."""
  rows = -(-n * k // gm.ROW_TILE) * gm.ROW_TILE
  for name, i, o in (("gate_up", d, f), ("down", f, d), ("gate_up_fused", d, 2 * f)):
    yield name, "forward", (rows, i), (e, i, o), None
    yield name, "dx", (rows, o), (e, i, o), jnp.bfloat16
    yield name, "dw", (rows, i), (rows, o), jnp.bfloat16


def search_rows(shape: str, dims: tuple, budget_s: float, deadline: float):
  """Yields one lab row per call of the layer at `dims` (N, D, E, P, F): the fastest config
  found on the kernel a run gives its product, or why it was not searched."""
  n, d, e, k, f = dims
  base = dict(lab=True, shape=shape, piece="search")
  if jax.default_backend() != "gpu" or not gm.tokamax_version():
    yield dict(base, impl="-", skipped="the search needs tokamax on a GPU "
                                       "(pip install 'tst-jax[gpu]')")
    return
  _, kernels, _ = platform.grouped_matmul_backend("gpu")
  sizes = jax.ShapeDtypeStruct((e,), jnp.int32)
  for name, product, lhs, rhs, out in calls(n, d, e, k, f):
    kernel = (kernels.order(product) or ("mosaic",))[0]
    specs = [jax.ShapeDtypeStruct(lhs, jnp.bfloat16), jax.ShapeDtypeStruct(rhs, jnp.bfloat16),
             sizes]
    row = dict(base, impl=f"{product}/{kernel}", call=name, product=product, kernel=kernel,
               lhs=gemm_measured.signature(lhs, "bfloat16"),
               rhs=gemm_measured.signature(rhs, "bfloat16"), out=str(out and jnp.dtype(out)))
    left = deadline - time.perf_counter()
    if left < 10:
      yield dict(row, skipped="past the search's seconds")
      continue
    try:
      yield dict(row, **_search(product, kernel, kernels.config(product, kernel), specs, out,
                                min(budget_s, left)))
    except Exception as e:   # pylint: disable=broad-except  (a call that fails is a finding)
      yield dict(row, failed=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")


def _search(product: str, kernel: str, start: dict | None, specs, out, budget_s: float) -> dict:
  """Times the candidates around `start` with tokamax's autotuner: the fastest config, its ms,
  the start's ms, how many ran and failed, and the seconds it took."""
  import tokamax   # pylint: disable=g-import-not-at-top  (the gpu extra)
  from tokamax import autotuning   # pylint: disable=g-import-not-at-top
  call = lambda lhs, rhs, sizes: tokamax.ragged_dot_general(
      lhs, rhs, sizes, ragged_dot_dimension_numbers=gm._DIMS[product],   # pylint: disable=protected-access
      preferred_element_type=out, implementation=(kernel,))
  (bound,) = autotuning.get_bound_args(call, *specs)
  bound = dataclasses.replace(bound, op=bound.op.replace(config=None))
  if start is None:
    start = _as_dict(bound.heuristics_config)
  config_cls = type(bound.op).config_cls
  built = []
  for candidate in candidates(kernel, start):
    try:
      built.append(config_cls(**candidate))
    except (TypeError, ValueError):   # a value this kernel's Config refuses
      built.append(None)
  configs = {c for c in built if c is not None}
  t0 = time.perf_counter()
  data = bound.autotune(configs, timeout=budget_s, cache_results=False)
  times = {c: r.median_evaluation_time_ms for c, r in data.items()
           if hasattr(r, "median_evaluation_time_ms")}
  if not times:
    raise RuntimeError(f"none of the {len(configs)} configs ran")
  best = min(times, key=times.get)
  return dict(config=_as_dict(best), ms=times[best], start_ms=times.get(built[0]),
              candidates=len(configs), failed=len(data) - len(times),
              search_s=round(time.perf_counter() - t0, 1))


def _as_dict(config) -> dict:
  """tokamax's config as the plain JSON its Config class takes back."""
  return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def measured(rows: list[dict]) -> tuple[str | None, dict, list]:
  """Returns the device kind of a GPU call's lab rows, the ms of each product per kernel per
  shape (its `pass` rows) and the configs its search found (its `search` rows)."""
  kind = next((r.get("device_kind") for r in rows if r.get("piece") == "copy"), None)
  passes, tuned = {}, []
  for r in rows:
    if r.get("piece") == "pass" and "ms" in r:
      product, kernel = r["impl"].split("/")
      passes.setdefault(r["shape"], {}).setdefault(product, {})[kernel] = r["ms"]
    if r.get("piece") == "search" and "config" in r:
      tuned.append({key: r[key] for key in ("product", "kernel", "lhs", "rhs", "out", "config",
                                            "ms", "start_ms", "candidates", "search_s")})
  return kind, passes, tuned


def record(rows: list[dict], path: str | None = None) -> str:
  """Folds a GPU call's lab rows into the table at `path` (the package's by default) and
  returns a line saying what it recorded; a call without a device or measurements records
  nothing."""
  kind, passes, tuned = measured(rows)
  if not kind or kind == "cpu" or not (passes or tuned):
    return f"nothing to record: no GPU measurements in these rows (device {kind})"
  env = next((r for r in rows if r.get("env")), {})
  source = (f"benchmarks/gpu.sh moe_lab,search at commit {env.get('commit')}; {kind}; "
            f"jax {env.get('jax')}, tokamax {env.get('tokamax')}; {env.get('date')}")
  table = gemm_measured.record(gemm_measured.load(path), kind, source, passes, tuned)
  gemm_measured.write(table, path)
  return (f"recorded {sum(len(p) for p in passes.values())} products' kernel times and "
          f"{len(tuned)} tuned configs of {kind} in {path or gemm_measured.FILE}")
