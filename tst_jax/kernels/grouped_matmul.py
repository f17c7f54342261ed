"""Grouped matmul, the MoE experts' GEMM: rows sorted by group, each group times its own weights.

Letters: A rows (expert assignments, sorted by expert), E groups (experts), I inputs, O outputs,
C rows of a kernel tile. x [A, I] @ w [E, I, O] with group sizes [E] -> [A, O]: rows
[s_e, s_e + sizes[e]) times w[e], where s_e is the sum of the earlier sizes. Rows past the last
group (assignments another expert-parallel shard computes) come out 0 and get no gradient.

`grouped_matmul` has a custom VJP whose backward is grouped too, three products in all:
  forward  y = x @ w[e] per group                     (ragged rows, w's group dimension)
  dx       dx = dy @ w[e]ᵀ per group                  (the same, contracting w's O)
  dw       dw[e] = x_eᵀ · dy_e, one GEMM whose ragged dimension is the contracted rows
Neither builds an [A, E] array or pads a group to the largest one. Backends:
  xla      jax.lax.ragged_dot_general, native on TPU. XLA:CPU and released jaxlib GPU builds
           expand it to a masked dense matmul over every group, E times the work.
  tokamax  tokamax.ragged_dot_general from the OpenXLA kernel library, the `gpu` extra. Each
           product runs on the Mosaic GPU or Triton kernel that `Kernels` names, picked by
           `platform.grouped_matmul_backend` from measurements. Rows come in whole tiles of
           C = 8, padded once at the entry, and `tokamax_tuning` autotunes each shape once.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tst_jax.kernels import tokamax_tuning
from tst_jax.parallel import varying

BACKENDS = ("xla", "tokamax")
# C: tokamax's Mosaic GPU kernels take rows in whole tiles, of 8 in the forward on an H100 and
# of 64 in dW's on an H200; 64 is both, and costs at most 63 padding rows.
ROW_TILE = 64
# The three products as ragged_dot_general dimension numbers (tokamax's names for them:
# DEFAULT, TRANS_RHS and RAGGED_CONTRACTING_DOT_DIM_NUMS), so both backends see the same calls.
_DIMS = {
    "forward": jax.lax.RaggedDotDimensionNumbers(   # x [A, I] · w [E, I, O]: contract I
        dot_dimension_numbers=(([1], [1]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[0]),
    "dx": jax.lax.RaggedDotDimensionNumbers(        # dy [A, O] · w [E, I, O]: contract O
        dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[0]),
    "dw": jax.lax.RaggedDotDimensionNumbers(        # x [A, I] · dy [A, O]: contract the rows
        dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[]),
}


class Kernels(NamedTuple):
  """tokamax's `implementation=` for each product: kernel names, of which the first that runs
  wins, as tokamax falls back past a NotImplementedError. None keeps tokamax's own order."""
  forward: tuple[str, ...] | None = None
  dx: tuple[str, ...] | None = None
  dw: tuple[str, ...] | None = None

  def line(self) -> str:
    return ", ".join(f"{p} {'/'.join(k) if k else 'default'}" for p, k in zip(self._fields, self))

  def within(self, names) -> Kernels:
    """Returns these kernels less those not in `names`; a product left with none keeps
    tokamax's own order."""
    return Kernels(*(tuple(n for n in k if n in names) or None if k else None for k in self))


def tokamax_kernels() -> frozenset[str] | None:
  """Returns the kernel names the installed tokamax can run, "mosaic" among them where it has
  a Mosaic kernel; None where it does not say. Its Triton kernels need jax-triton and triton,
  which tokamax does not install: without them it knows no "triton" and refuses the name."""
  try:   # tokamax lists them in no public name
    from tokamax._src.ops.ragged_dot import api   # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  names = set(getattr(api, "IMPLEMENTATIONS", ()))
  if any(n.startswith("mosaic") for n in names):
    names.add("mosaic")
  return frozenset(names) or None


def tokamax_version() -> str | None:
  """Returns the installed tokamax's version without importing it, None when not installed."""
  try:
    return importlib.metadata.version("tokamax")
  except importlib.metadata.PackageNotFoundError:
    return None


def row_tile(backend: str) -> int:
  """C: the row count `backend`'s kernels take in whole multiples of (1: any)."""
  return ROW_TILE if backend == "tokamax" else 1


def grouped_matmul(x_AxI, w_ExIxO, sizes_E, backend: str = "xla", kernels: Kernels = Kernels(),
                   zero_tail: bool = True):
  """x [A, I] rows in group order, w [E, I, O], sizes [E] (int32) -> [A, O] in x's dtype.

  Rows that are not whole tiles of `row_tile(backend)` are padded here, once: x in the
  forward and, as the slice's transpose, dy in the backward, for all three products. The MoE
  dispatch lays out whole tiles itself (`moe_dispatch.sort_by_expert`), so a step pads none.
  Rows past the last group come out 0, and so does their part of dx; without `zero_tail` they
  are left undefined, a select over [A, O] fewer per product, for a caller that reads none of
  them. The cotangent's rows past the groups are zeroed either way, so dW never reads them."""
  if backend not in BACKENDS:
    raise ValueError(f"grouped matmul backend must be one of {BACKENDS}, got {backend!r}")
  rows = x_AxI.shape[0]
  pad = -rows % row_tile(backend)
  if pad:   # the padding rows lie past the last group: no expert computes them
    x_AxI = jnp.pad(x_AxI, ((0, pad), (0, 0)))
  y = _grouped(backend, kernels, zero_tail, *varying.alike(x_AxI, w_ExIxO), sizes_E)
  return y[:rows] if pad else y


def _rows_in_groups(y_AxO, sizes_E, zero: bool = True):
  """Rows past the last group set to 0 (grouped GEMMs leave them undefined); `zero` False
  leaves them."""
  if not zero:
    return y_AxO
  valid_A = jnp.arange(y_AxO.shape[0]) < jnp.sum(sizes_E)
  return jnp.where(valid_A[:, None], y_AxO, jnp.zeros((), y_AxO.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _grouped(backend, kernels, zero_tail, x_AxI, w_ExIxO, sizes_E):
  return _rows_in_groups(_product(backend, kernels, "forward", x_AxI, w_ExIxO, sizes_E,
                                  None), sizes_E, zero_tail)   # None: x's dtype (w's too)


def _grouped_fwd(backend, kernels, zero_tail, x_AxI, w_ExIxO, sizes_E):
  return (_grouped(backend, kernels, zero_tail, x_AxI, w_ExIxO, sizes_E),
          (x_AxI, w_ExIxO, sizes_E))


def _grouped_bwd(backend, kernels, zero_tail, residuals, dy_AxO):
  x_AxI, w_ExIxO, sizes_E = residuals
  dy_AxO = _rows_in_groups(dy_AxO, sizes_E).astype(x_AxI.dtype)
  dx_AxI = _rows_in_groups(_product(backend, kernels, "dx", dy_AxO, w_ExIxO, sizes_E,
                                    x_AxI.dtype), sizes_E, zero_tail)
  # dW accumulates over up to A rows: float32 where XLA would otherwise add in the inputs'
  # dtype. tokamax's kernels accumulate in float32 inside and write w's dtype, as its own VJP.
  dw_ExIxO = _product(backend, kernels, "dw", x_AxI, dy_AxO, sizes_E,
                      jnp.float32 if backend == "xla" else w_ExIxO.dtype)
  return dx_AxI.astype(x_AxI.dtype), dw_ExIxO.astype(w_ExIxO.dtype), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def _product(backend, kernels, product, lhs, rhs, sizes_E, out_dtype):
  """One of the three products (`_DIMS`) on `backend`."""
  dims = _DIMS[product]
  if backend == "xla":
    return jax.lax.ragged_dot_general(lhs, rhs, sizes_E, dims, preferred_element_type=out_dtype)
  return _tokamax(getattr(kernels, product), dims, lhs, rhs, sizes_E, out_dtype)


def _tokamax(implementation, dims, lhs, rhs, sizes_E, out_dtype):
  """tokamax.ragged_dot_general on rows in whole tiles of C (`grouped_matmul` pads them)."""
  import tokamax   # pylint: disable=g-import-not-at-top  (optional: the gpu extra)
  call = functools.partial(tokamax.ragged_dot_general, ragged_dot_dimension_numbers=dims,
                           preferred_element_type=out_dtype, implementation=implementation)
  with tokamax_tuning.tuned(call, lhs, rhs, sizes_E):
    return call(lhs, rhs, sizes_E)
