"""Grouped matmul, the MoE experts' GEMM: rows sorted by group, each group times its own weights.

Letters: A rows (expert assignments, sorted by expert), E groups (experts), I inputs, O outputs.
x [A, I] @ w [E, I, O] with group sizes [E] -> [A, O]: rows [s_e, s_e + sizes[e]) times w[e],
where s_e is the sum of the earlier sizes. Rows past the last group (assignments another
expert-parallel shard computes) come out 0 and get no gradient.

`grouped_matmul` has a custom VJP whose backward is grouped too: dx = grouped(dy, wᵀ) per
group, and dw[e] = x_eᵀ · dy_e as one ragged-contraction GEMM (`ragged_dot_general` with the
rows as the ragged contracting dimension). Neither builds an [A, E] array or pads a group to
the largest one. Backends:
  xla      jax.lax.ragged_dot / ragged_dot_general: native on TPU; XLA:CPU and released
           jaxlib GPU builds expand it to a masked dense matmul over every group (E x the work)
  tokamax  tokamax.ragged_dot (the OpenXLA kernel library: Mosaic GPU kernels for sm90/sm100,
           a Triton fallback) for the three products, its own grouped VJP (the `gpu` extra)
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp

from tst_jax.parallel import varying

BACKENDS = ("xla", "tokamax")
# dw[e] = x[rows of e]ᵀ @ dy[rows of e]: contract the rows (ragged over the groups), no batch.
_WEIGHT_GRAD_DIMS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[])


def tokamax_available() -> bool:
  return importlib.util.find_spec("tokamax") is not None


def grouped_matmul(x_AxI, w_ExIxO, sizes_E, backend: str = "xla"):
  """x [A, I] rows in group order, w [E, I, O], sizes [E] (int32) -> [A, O] in x's dtype."""
  if backend == "tokamax":
    import tokamax   # pylint: disable=g-import-not-at-top  (optional: the gpu extra)
    return _rows_in_groups(tokamax.ragged_dot(x_AxI, w_ExIxO, sizes_E), sizes_E)
  if backend != "xla":
    raise ValueError(f"grouped matmul backend must be one of {BACKENDS}, got {backend!r}")
  return _xla(*varying.alike(x_AxI, w_ExIxO), sizes_E)


def _rows_in_groups(y_AxO, sizes_E):
  """Rows past the last group set to 0 (grouped GEMMs leave them undefined)."""
  valid_A = jnp.arange(y_AxO.shape[0]) < jnp.sum(sizes_E)
  return jnp.where(valid_A[:, None], y_AxO, jnp.zeros((), y_AxO.dtype))


@jax.custom_vjp
def _xla(x_AxI, w_ExIxO, sizes_E):
  return _rows_in_groups(jax.lax.ragged_dot(x_AxI, w_ExIxO, sizes_E), sizes_E)


def _xla_fwd(x_AxI, w_ExIxO, sizes_E):
  return _xla(x_AxI, w_ExIxO, sizes_E), (x_AxI, w_ExIxO, sizes_E)


def _xla_bwd(residuals, dy_AxO):
  x_AxI, w_ExIxO, sizes_E = residuals
  dy_AxO = _rows_in_groups(dy_AxO, sizes_E)
  dx_AxI = _rows_in_groups(
      jax.lax.ragged_dot(dy_AxO, jnp.swapaxes(w_ExIxO, 1, 2), sizes_E), sizes_E)
  dw_ExIxO = jax.lax.ragged_dot_general(x_AxI, dy_AxO, sizes_E, _WEIGHT_GRAD_DIMS,
                                        preferred_element_type=jnp.float32)
  return dx_AxI.astype(x_AxI.dtype), dw_ExIxO.astype(w_ExIxO.dtype), None


_xla.defvjp(_xla_fwd, _xla_bwd)

