"""Pallas (Triton) kernels for MoE dispatch and combine: row gathers that reduce in one pass.

Letters follow the package docstring: N tokens, P experts per token, R rows of the
expert-ordered buffer, D model dim, and C rows of one block. Two kernels, each one coalesced
pass over the rows it reads:

  gather_sum  out[n] = sum_p w[n, p] · table[rows[n, p]] in float32: combine's forward and
              dispatch's backward. Each program loads the P row indices of C tokens and adds
              their P rows, one block of D columns at a time, so the [N, P, D] gather is never
              written out.
  gather      out[r] = s[r] · table[index[r]]: dispatch's forward and combine's backward.

An index past the table's last row reads as a zero row: the empty rows of the buffer and the
assignments of experts another shard holds. GPUs compile the kernels with Triton; CPU
interprets them, which is how the tests run them on one device. JAX's interpreter cannot run a
kernel inside a shard_map that checks varying axes (each ref index is a literal of another
type there), so under expert parallelism the tests lower the program for a GPU instead.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from tst_jax.kernels import target
from tst_jax.parallel import varying

BLOCK_ROWS = 32     # C: rows (tokens or buffer rows) of one program


def block_d(d: int) -> int:
  """Returns the columns of one program: the largest power of two <= 256 that divides D, since
  Triton's blocks are powers of two."""
  return next(b for b in (256, 128, 64, 32, 16, 8, 4, 2, 1) if d % b == 0)


def _params():
  return pltriton.CompilerParams(num_warps=4, num_stages=1)


def _pad_rows(a, multiple: int, value):
  pad = -a.shape[0] % multiple
  return a if not pad else jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1),
                                    constant_values=value)


def _read_rows(table_ref, index_C):
  """Loads rows `index_C` of the table's column block in float32; 0 past the table's end."""
  last = table_ref.shape[0] - 1
  rows_CxBD = table_ref[jnp.minimum(index_C, last), :].astype(jnp.float32)
  return jnp.where((index_C <= last)[:, None], rows_CxBD, 0.0)


def _gather_sum_kernel(rows_ref, weights_ref, table_ref, out_ref, *, top_k):
  acc_CxBD = jnp.zeros(out_ref.shape, jnp.float32)
  for p in range(top_k):   # P is small and static: one load and one add per expert
    acc_CxBD += weights_ref[:, p][:, None] * _read_rows(table_ref, rows_ref[:, p])
  out_ref[...] = acc_CxBD


@target.jit
def gather_sum(table_RxD, rows_NxP, weights_NxP, *, platform: str):
  """Returns sum_p weights[n, p] · table[rows[n, p]] as [N, D] float32; a row >= R adds 0.
  On CPU the kernel is interpreted."""
  (n, top_k), (r, d) = rows_NxP.shape, table_RxD.shape
  bd, c = block_d(d), BLOCK_ROWS
  rows_NxP, weights_NxP, table_RxD = varying.alike(
      _pad_rows(rows_NxP.astype(jnp.int32), c, r),
      _pad_rows(weights_NxP.astype(jnp.float32), c, 0), table_RxD)
  out = pl.pallas_call(
      functools.partial(_gather_sum_kernel, top_k=top_k),
      grid=(rows_NxP.shape[0] // c, d // bd),
      in_specs=[pl.BlockSpec((c, top_k), lambda i, j: (i, 0)),
                pl.BlockSpec((c, top_k), lambda i, j: (i, 0)),
                pl.BlockSpec((r, bd), lambda i, j: (0, j))],   # every row, one column block
      out_specs=pl.BlockSpec((c, bd), lambda i, j: (i, j)),
      out_shape=varying.shape_like(table_RxD, (rows_NxP.shape[0], d), jnp.float32),
      compiler_params=_params(), interpret=platform == "cpu", name="moe_gather_sum",
  )(rows_NxP, weights_NxP, table_RxD)
  return out[:n]


def _gather_kernel(index_ref, scale_ref, table_ref, out_ref):
  rows_CxBD = _read_rows(table_ref, index_ref[...])
  out_ref[...] = (rows_CxBD * scale_ref[...][:, None]).astype(out_ref.dtype)


@target.jit(static_argnames="dtype")
def gather(table_TxD, index_R, scale_R, dtype=None, *, platform: str):
  """Returns scale[r] · table[index[r]] as [R, D] in `dtype` (table's by default); an index
  past the table's last row gives a zero row. On CPU the kernel is interpreted."""
  (r,), (t, d) = index_R.shape, table_TxD.shape
  bd, c = block_d(d), BLOCK_ROWS
  index_R, scale_R, table_TxD = varying.alike(
      _pad_rows(index_R.astype(jnp.int32), c, t), _pad_rows(scale_R.astype(jnp.float32), c, 0),
      table_TxD)
  out = pl.pallas_call(
      _gather_kernel,
      grid=(index_R.shape[0] // c, d // bd),
      in_specs=[pl.BlockSpec((c,), lambda i, j: (i,)),
                pl.BlockSpec((c,), lambda i, j: (i,)),
                pl.BlockSpec((t, bd), lambda i, j: (0, j))],   # every row, one column block
      out_specs=pl.BlockSpec((c, bd), lambda i, j: (i, j)),
      out_shape=varying.shape_like(table_TxD, (index_R.shape[0], d), dtype or table_TxD.dtype),
      compiler_params=_params(), interpret=platform == "cpu", name="moe_gather",
  )(index_R, scale_R, table_TxD)
  return out[:r]
