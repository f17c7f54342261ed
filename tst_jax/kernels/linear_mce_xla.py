"""Chunked linear + multi-hot CE in pure XLA: online logsumexp over vocabulary tiles."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from tst_jax.kernels import target
from tst_jax.superposition import IGNORE_INDEX

# Letters: N tokens, D model dim, V vocabulary, S bag size, C rows of one block_n tile.

# block_n, block_v by platform. On CPU a 4 MiB float32 tile, the fastest of a sweep, keeps
# the matmuls efficient and the softmax passes in cache. GPU and TPU get large tiles so that
# each while-loop step is a big matmul: a 4096 x 16384 float32 tile is 256 MiB.
DEFAULT_BLOCKS = {"cpu": (512, 2048), "gpu": (4096, 16384), "tpu": (4096, 16384)}


@target.jit(static_argnames=("ignore_index", "block_n", "block_v"))
def lse_and_target_logits(hidden_NxD, head_DxV, targets_NxS, *, ignore_index=IGNORE_INDEX,
                          block_n: int | None = None, block_v: int | None = None,
                          platform: str):
  """Returns the per-row logsumexp [N] and target logits [N, S] of `hidden @ head` in float32.

  Never materialises [N, V]. Rows are processed block_n at a time and the vocabulary block_v
  at a time with an online logsumexp, and the backward recomputes each logit tile. Ignored
  targets get logit 0 and receive no gradient, since their loss coefficient is 0. N and V need
  not be multiples of the blocks: rows are zero-padded and columns masked. A block is first
  shrunk by up to 2x to divide its dimension, avoiding the padded copy.
  """
  n, d = hidden_NxD.shape
  v = head_DxV.shape[1]
  if targets_NxS.ndim != 2 or targets_NxS.shape[0] != n or head_DxV.shape[0] != d:
    raise ValueError(f"shapes disagree: hidden {hidden_NxD.shape}, head {head_DxV.shape}, "
                     f"targets {targets_NxS.shape}")
  default_n, default_v = DEFAULT_BLOCKS.get(platform, DEFAULT_BLOCKS["gpu"])
  block_n = default_n if block_n is None else block_n
  block_v = default_v if block_v is None else block_v
  if block_n < 1 or block_v < 1:
    raise ValueError(f"block sizes must be positive, got {block_n=}, {block_v=}")
  bn, bv = _fit(block_n, n), _fit(block_v, v)
  n_pad, v_pad = -n % bn, -v % bv
  targets_NxS = jnp.where(targets_NxS == ignore_index, -1, targets_NxS).astype(jnp.int32)
  hidden_NxD = jnp.pad(hidden_NxD, ((0, n_pad), (0, 0)))
  head_DxV = jnp.pad(head_DxV, ((0, 0), (0, v_pad)))
  targets_NxS = jnp.pad(targets_NxS, ((0, n_pad), (0, 0)), constant_values=-1)
  lse_N, z_NxS = _chunked(hidden_NxD, head_DxV, targets_NxS, v, bn, bv)
  return lse_N[:n], z_NxS[:n]


def _fit(block, size):
  """Returns `block`, or the largest block down to half of it that divides `size` unpadded."""
  if size <= block:
    return size
  count = -(-size // block)
  for c in range(count, 2 * count + 1):
    if size % c == 0:
      return size // c
  return block


def _logits_tile(h_CxD, head_DxV, j, block_v, v_true):
  """Computes float32 logits of one [block_n, block_v] tile, with padded columns at -inf."""
  w_tile = lax.dynamic_slice_in_dim(head_DxV, j * block_v, block_v, axis=1)
  logits = jnp.dot(h_CxD, w_tile, preferred_element_type=jnp.float32)
  if v_true % block_v:
    cols = j * block_v + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    logits = jnp.where(cols < v_true, logits, -jnp.inf)
  return logits, w_tile


def _in_tile(targets_CxS, j, block_v):
  """Returns the tile-local column of each target and whether it falls inside tile j."""
  local = targets_CxS - j * block_v
  inside = (local >= 0) & (local < block_v)
  return jnp.clip(local, 0, block_v - 1), inside


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunked(hidden_NxD, head_DxV, targets_NxS, v_true, block_n, block_v):
  return _forward(hidden_NxD, head_DxV, targets_NxS, v_true, block_n, block_v)


def _forward(hidden_NxD, head_DxV, targets_NxS, v_true, block_n, block_v):
  n, d = hidden_NxD.shape
  s = targets_NxS.shape[1]
  num_v = head_DxV.shape[1] // block_v

  def row_block(args):
    h_CxD, t_CxS = args

    def v_step(j, carry):
      m_C, l_C, z_CxS = carry
      logits, _ = _logits_tile(h_CxD, head_DxV, j, block_v, v_true)
      m_new = jnp.maximum(m_C, logits.max(axis=1))
      l_C = l_C * jnp.exp(m_C - m_new) + jnp.exp(logits - m_new[:, None]).sum(axis=1)
      local, inside = _in_tile(t_CxS, j, block_v)
      z_CxS = z_CxS + jnp.where(inside, jnp.take_along_axis(logits, local, axis=1), 0.0)
      return m_new, l_C, z_CxS

    init = (jnp.full((block_n,), -jnp.inf, jnp.float32), jnp.zeros((block_n,), jnp.float32),
            jnp.zeros((block_n, s), jnp.float32))
    m_C, l_C, z_CxS = lax.fori_loop(0, num_v, v_step, init)
    return m_C + jnp.log(l_C), z_CxS

  lse, z = lax.map(row_block, (hidden_NxD.reshape(-1, block_n, d),
                               targets_NxS.reshape(-1, block_n, s)))
  return lse.reshape(n), z.reshape(n, s)


def _chunked_fwd(hidden_NxD, head_DxV, targets_NxS, v_true, block_n, block_v):
  lse_N, z_NxS = _forward(hidden_NxD, head_DxV, targets_NxS, v_true, block_n, block_v)
  return (lse_N, z_NxS), (hidden_NxD, head_DxV, targets_NxS, lse_N)


def _chunked_bwd(v_true, block_n, block_v, res, cts):
  """Computes d logits = d_lse * softmax + scatter of d_z at the targets, one tile at a time."""
  hidden_NxD, head_DxV, targets_NxS, lse_N = res
  d_lse_N, d_z_NxS = cts
  n, d = hidden_NxD.shape
  s = targets_NxS.shape[1]
  num_v = head_DxV.shape[1] // block_v
  rows_CxS = lax.broadcasted_iota(jnp.int32, (block_n, s), 0)

  def row_block(d_head_DxV, args):
    h_CxD, t_CxS, lse_C, d_lse_C, d_z_CxS = args

    def v_step(j, carry):
      d_h_CxD, d_head_DxV = carry
      logits, w_tile = _logits_tile(h_CxD, head_DxV, j, block_v, v_true)
      d_logits = jnp.exp(logits - lse_C[:, None]) * d_lse_C[:, None]
      local, inside = _in_tile(t_CxS, j, block_v)
      d_logits = d_logits.at[rows_CxS, local].add(jnp.where(inside, d_z_CxS, 0.0))
      d_logits = d_logits.astype(head_DxV.dtype)
      d_h_CxD += jnp.dot(d_logits, w_tile.T, preferred_element_type=jnp.float32)
      d_w_tile = jnp.dot(h_CxD.T, d_logits, preferred_element_type=jnp.float32)
      d_head_DxV = lax.dynamic_update_slice_in_dim(
          d_head_DxV,
          lax.dynamic_slice_in_dim(d_head_DxV, j * block_v, block_v, axis=1) + d_w_tile,
          j * block_v, axis=1)
      return d_h_CxD, d_head_DxV

    d_h_CxD, d_head_DxV = lax.fori_loop(
        0, num_v, v_step, (jnp.zeros((block_n, d), jnp.float32), d_head_DxV))
    return d_head_DxV, d_h_CxD

  blocks = (hidden_NxD.reshape(-1, block_n, d), targets_NxS.reshape(-1, block_n, s),
            lse_N.reshape(-1, block_n), d_lse_N.reshape(-1, block_n),
            d_z_NxS.reshape(-1, block_n, s))
  d_head_DxV, d_hidden = lax.scan(row_block, jnp.zeros(head_DxV.shape, jnp.float32), blocks)
  return (d_hidden.reshape(n, d).astype(hidden_NxD.dtype), d_head_DxV.astype(head_DxV.dtype),
          None)


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
