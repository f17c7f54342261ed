"""The tile math of the fused linear + multi-hot CE kernels, and the kernels' settings.

Triton on GPU and Mosaic on TPU share these pure functions of [bn, bv] float32 tiles.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax


# Letters: N tokens, D model dim, V vocabulary, S bag size, C rows of one tile or chunk, and
# bn, bd, bv the tile sizes. Kernels see row-vectors as [bn, 1] so the same tile math serves
# both backends.


@dataclasses.dataclass(frozen=True)
class TileConfig:
  backend: str
  interpret: bool
  block_n: int
  block_v: int
  block_d: int
  v_true: int          # unpadded vocabulary size: columns >= v_true are masked to -inf
  v_padded: int        # vocabulary size after padding to a multiple of block_v
  split_tiles: int     # Triton forward: vocabulary tiles per program, as v_splits ranges
  num_warps: int | None
  num_stages: int | None
  vmem_limit_bytes: int | None
  bwd_rows: int        # Triton backward: rows per chunk of the [bwd_rows, V] d-logits buffer


def column_ids(col0, shape):
  return col0 + lax.broadcasted_iota(jnp.int32, shape, 1)


def mask_padded(logits, cols, cfg):
  if cfg.v_true == cfg.v_padded:
    return logits
  return jnp.where(cols < cfg.v_true, logits, -jnp.inf)


def online_lse(m_Cx1, l_Cx1, logits):
  m_new = jnp.maximum(m_Cx1, logits.max(axis=1, keepdims=True))
  l_new = l_Cx1 * jnp.exp(m_Cx1 - m_new) + jnp.exp(logits - m_new).sum(axis=1, keepdims=True)
  return m_new, l_new


def gather(logits, cols, target_Cx1):
  """Returns the logit at each row's target column if it lies in this tile, else 0: [bn, 1]."""
  return jnp.where(cols == target_Cx1, logits, 0.0).sum(axis=1, keepdims=True)


def d_logits(logits, cols, lse_Cx1, d_lse_Cx1, t_ref, d_z_ref):
  """Computes d loss / d logits = d_lse * softmax + d_z scattered onto the target columns."""
  d = jnp.exp(logits - lse_Cx1) * d_lse_Cx1
  for s in range(t_ref.shape[1]):  # S is small and static: one compare per bag slot
    d = d + jnp.where(cols == t_ref[:, s:s + 1], d_z_ref[:, s:s + 1], 0.0)
  return d


def dot(a, b):
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def dot_nt(a, b):
  """Computes a @ b.T with the transpose folded into the matmul."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_tn(a, b):
  """Computes a.T @ b with the transpose folded into the matmul."""
  return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
