"""The fused linear + multi-hot CE on TPU as Mosaic kernels, interpreted on CPU for the tests.

Their reductions are sequential "arbitrary" grid axes with VMEM scratch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tst_jax.kernels.linear_mce_tiles import (column_ids, d_logits, dot, dot_nt, dot_tn, gather,
                                              mask_padded, online_lse)


def _tpu_params(cfg, semantics):
  return pltpu.CompilerParams(dimension_semantics=semantics,
                              vmem_limit_bytes=cfg.vmem_limit_bytes)


def _tpu_interpret(cfg):
  return pltpu.InterpretParams() if cfg.interpret else False


def _fwd_kernel_tpu(h_ref, w_ref, t_ref, lse_ref, z_ref, acc_ref, m_ref, l_ref, zacc_ref, *,
                    cfg, num_v, num_d):
  # grid: row block i, vocab block j, model-dim block k. Blocks are h [bn, bd] and w [bd, bv].
  j, k = pl.program_id(1), pl.program_id(2)

  @pl.when((j == 0) & (k == 0))
  def _():
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    zacc_ref[...] = jnp.zeros(zacc_ref.shape, jnp.float32)

  @pl.when(k == 0)
  def _():
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  acc_ref[...] += dot(h_ref[...], w_ref[...])

  @pl.when(k == num_d - 1)
  def _():
    cols = column_ids(j * cfg.block_v, acc_ref.shape)
    logits = mask_padded(acc_ref[...], cols, cfg)
    m_ref[...], l_ref[...] = online_lse(m_ref[...], l_ref[...], logits)
    for s in range(t_ref.shape[1]):
      zacc_ref[:, s:s + 1] += gather(logits, cols, t_ref[:, s:s + 1])

  @pl.when((j == num_v - 1) & (k == num_d - 1))
  def _():
    lse_ref[...] = m_ref[...] + jnp.log(l_ref[...])
    z_ref[...] = zacc_ref[...]


def forward(hidden_NxD, head_DxV, targets_NxS, cfg):
  (n, d), v, s = hidden_NxD.shape, head_DxV.shape[1], targets_NxS.shape[1]
  bn, bv, bd = cfg.block_n, cfg.block_v, cfg.block_d
  num_v, num_d = v // bv, d // bd
  kernel = functools.partial(_fwd_kernel_tpu, cfg=cfg, num_v=num_v, num_d=num_d)
  lse_Nx1, z_NxS = pl.pallas_call(
      kernel,
      grid=(n // bn, num_v, num_d),
      in_specs=[pl.BlockSpec((bn, bd), lambda i, j, k: (i, k)),
                pl.BlockSpec((bd, bv), lambda i, j, k: (k, j)),
                pl.BlockSpec((bn, s), lambda i, j, k: (i, 0))],
      out_specs=[pl.BlockSpec((bn, 1), lambda i, j, k: (i, 0)),
                 pl.BlockSpec((bn, s), lambda i, j, k: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((n, 1), jnp.float32),
                 jax.ShapeDtypeStruct((n, s), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((bn, bv), jnp.float32), pltpu.VMEM((bn, 1), jnp.float32),
                      pltpu.VMEM((bn, 1), jnp.float32), pltpu.VMEM((bn, s), jnp.float32)],
      compiler_params=_tpu_params(cfg, (pltpu.PARALLEL, pltpu.ARBITRARY, pltpu.ARBITRARY)),
      interpret=_tpu_interpret(cfg),
      name="linear_mce_fwd",
  )(hidden_NxD, head_DxV, targets_NxS)
  return lse_Nx1[:, 0], z_NxS


def _bwd_kernel_tpu(h_ref, w_ref, t_ref, lse_ref, d_lse_ref, d_z_ref, out_ref, acc_ref, p_ref,
                    grad_ref, *, cfg, wrt, num_inner, num_d):
  """Builds one of the two backward kernels, selected by `wrt`, since TPU has no atomics.

  The grid is outer block, inner block and phase k in [0, 2 num_d). With wrt="hidden" the
  outer block is row block i and the inner one vocab block j, and wrt="head" swaps them.
  Phase k < num_d accumulates the logit tile over model-dim blocks, and at k = num_d - 1 it
  becomes d logits, kept in p_ref. Phase k >= num_d adds d-block k - num_d of the gradient
  into the float32 grad_ref [num_d, ...], written out after the last inner block.
  """
  outer, inner, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  j = outer if wrt == "head" else inner

  @pl.when((inner == 0) & (k == 0))
  def _():
    grad_ref[...] = jnp.zeros(grad_ref.shape, jnp.float32)

  @pl.when(k == 0)
  def _():
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(k < num_d)
  def _():
    acc_ref[...] += dot(h_ref[...], w_ref[...])

  @pl.when(k == num_d - 1)
  def _():
    cols = column_ids(j * cfg.block_v, acc_ref.shape)
    logits = mask_padded(acc_ref[...], cols, cfg)
    p_ref[...] = d_logits(logits, cols, lse_ref[...], d_lse_ref[...], t_ref,
                           d_z_ref).astype(p_ref.dtype)

  @pl.when(k >= num_d)
  def _():
    if wrt == "hidden":
      grad_ref[k - num_d] += dot_nt(p_ref[...], w_ref[...])       # [bn, bd]
    else:
      grad_ref[k - num_d] += dot_tn(h_ref[...], p_ref[...])       # [bd, bv]

  @pl.when((inner == num_inner - 1) & (k == 2 * num_d - 1))
  def _():
    bd = cfg.block_d
    for kk in range(num_d):  # static lane and sublane slices of the output block
      if wrt == "hidden":
        out_ref[:, kk * bd:(kk + 1) * bd] = grad_ref[kk].astype(out_ref.dtype)
      else:
        out_ref[kk * bd:(kk + 1) * bd, :] = grad_ref[kk].astype(out_ref.dtype)


def backward(hidden_NxD, head_DxV, targets_NxS, lse_Nx1, d_lse_Nx1, d_z_NxS, cfg):
  (n, d), v, s = hidden_NxD.shape, head_DxV.shape[1], targets_NxS.shape[1]
  bn, bv, bd = cfg.block_n, cfg.block_v, cfg.block_d
  num_n, num_v, num_d = n // bn, v // bv, d // bd
  semantics = (pltpu.PARALLEL, pltpu.ARBITRARY, pltpu.ARBITRARY)
  args = (hidden_NxD, head_DxV, targets_NxS, lse_Nx1, d_lse_Nx1, d_z_NxS)
  compute_dtype = head_DxV.dtype

  # d_hidden: grid i, j, k. Phase 2 needs only w, so h keeps its last block and no DMA runs.
  row = lambda i, j, k: (i, 0)  # noqa: E731
  d_hidden = pl.pallas_call(
      functools.partial(_bwd_kernel_tpu, cfg=cfg, wrt="hidden", num_inner=num_v, num_d=num_d),
      grid=(num_n, num_v, 2 * num_d),
      in_specs=[pl.BlockSpec((bn, bd), lambda i, j, k: (i, jnp.minimum(k, num_d - 1))),
                pl.BlockSpec((bd, bv), lambda i, j, k: (k % num_d, j)),
                pl.BlockSpec((bn, s), row), pl.BlockSpec((bn, 1), row),
                pl.BlockSpec((bn, 1), row), pl.BlockSpec((bn, s), row)],
      out_specs=pl.BlockSpec((bn, d), row),
      out_shape=jax.ShapeDtypeStruct((n, d), hidden_NxD.dtype),
      scratch_shapes=[pltpu.VMEM((bn, bv), jnp.float32), pltpu.VMEM((bn, bv), compute_dtype),
                      pltpu.VMEM((num_d, bn, bd), jnp.float32)],
      compiler_params=_tpu_params(cfg, semantics),
      interpret=_tpu_interpret(cfg),
      name="linear_mce_bwd_hidden",
  )(*args)

  # d_head: grid j, i, k. Phase 2 needs only h, so w keeps its last block.
  row = lambda j, i, k: (i, 0)  # noqa: E731
  d_head = pl.pallas_call(
      functools.partial(_bwd_kernel_tpu, cfg=cfg, wrt="head", num_inner=num_n, num_d=num_d),
      grid=(num_v, num_n, 2 * num_d),
      in_specs=[pl.BlockSpec((bn, bd), lambda j, i, k: (i, k % num_d)),
                pl.BlockSpec((bd, bv), lambda j, i, k: (jnp.minimum(k, num_d - 1), j)),
                pl.BlockSpec((bn, s), row), pl.BlockSpec((bn, 1), row),
                pl.BlockSpec((bn, 1), row), pl.BlockSpec((bn, s), row)],
      out_specs=pl.BlockSpec((d, bv), lambda j, i, k: (0, j)),
      out_shape=jax.ShapeDtypeStruct((d, v), head_DxV.dtype),
      scratch_shapes=[pltpu.VMEM((bn, bv), jnp.float32), pltpu.VMEM((bn, bv), compute_dtype),
                      pltpu.VMEM((num_d, bd, bv), jnp.float32)],
      compiler_params=_tpu_params(cfg, semantics),
      interpret=_tpu_interpret(cfg),
      name="linear_mce_bwd_head",
  )(*args)
  return d_hidden, d_head
