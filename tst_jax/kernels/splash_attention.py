"""Causal grouped-query attention through JAX's Pallas splash-attention kernels on TPU.

Letters: B rows, L positions, H query heads, K kv heads, G head dim. The kernels of
`make_splash_mqa` take one example and one kv head at a time: queries [H/K, L, G] against keys
and values [L, G], with a causal mask processed once into block tables. `causal_attention` maps
them over B and K. They skip the fully masked blocks and never hold [L, L] scores, as MaxText's
TPU default does. `interpret=True` runs the same kernels on CPU through Pallas' TPU
interpreter, which is what the tests check against XLA attention.
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

from tst_jax.parallel import logical

BLOCKS = (512, 256, 128)   # rows of a q or kv tile: the largest that divides L is used


def block_for(length: int) -> int | None:
  """Returns the splash tile for L positions, or None when L is no multiple of 128."""
  return next((b for b in BLOCKS if length % b == 0), None)


@functools.lru_cache(maxsize=16)
def _kernel(length: int, group: int, interpret: bool):
  """Builds the causal MQA kernel for L positions and H/K query heads, mask tables in numpy."""
  b = block_for(length)
  if b is None:
    raise ValueError(f"splash attention needs L a multiple of {BLOCKS[-1]}, got {length}")
  sizes = kernel.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                            block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b,
                            block_kv_dq=b)
  mask = masks.MultiHeadMask([masks.CausalMask((length, length))] * group)
  with jax.ensure_compile_time_eval():   # concrete tables, though first built inside a trace
    return kernel.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def causal_attention(q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, *, interpret: bool = False,
                     documents_BxL=None):
  """Computes causal softmax(q kᵀ / sqrt(G)) v as [B, L, H, G].

  Query head h reads kv head h // (H/K), as jax.nn.dot_product_attention does. With
  `documents` [B, L], the kernels' segment ids keep each position to its own document. Under
  `axis_rules` with a mesh the kernels run per shard (`_per_shard`): XLA cannot partition a
  Mosaic kernel.
  """
  attend = functools.partial(_attention, interpret=interpret)
  context = logical.current()
  if context is not None:
    return _per_shard(attend, *context, q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, documents_BxL)
  return attend(q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, documents_BxL)


def _per_shard(attend, mesh, rules, q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, documents_BxL):
  """Runs `attend` under shard_map: the rows split as 'batch', the query and kv heads as
  'heads' and 'kv_heads' where both split alike (each device keeps whole groups of H/K query
  heads with their kv head), else whole. A sequence split over devices is refused: each query
  would see only its shard's keys."""
  q_spec = logical.logical_to_pspec(("batch", "length", "heads", "head_dim"), rules)
  k_spec = logical.logical_to_pspec(("batch", "length", "kv_heads", "head_dim"), rules)
  if q_spec[1] is not None or q_spec[3] is not None:
    raise ValueError(f"splash attention under a mesh that splits the sequence or the head dim "
                     f"({q_spec}): use model.attention_impl=xla")
  heads = q_spec[2] if q_spec[2] == k_spec[2] else None
  batch = q_spec[0]
  used = logical.mesh_axes(batch) + logical.mesh_axes(heads)
  if math.prod(mesh.shape[a] for a in used) == 1:
    return attend(q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, documents_BxL)
  qkv = jax.P(batch, None, heads, None)
  args, specs = (q_BxLxHxG, k_BxLxKxG, v_BxLxKxG), (qkv,) * 3
  if documents_BxL is not None:
    args, specs = args + (documents_BxL,), specs + (jax.P(batch, None),)
  local = lambda q, k, v, docs=None: attend(q, k, v, docs)   # noqa: E731
  # check_vma=False: Pallas outputs carry no varying-axes type (kernels/sharded.py).
  return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=qkv,
                       check_vma=False)(*args)


def _attention(q_BxLxHxG, k_BxLxKxG, v_BxLxKxG, documents_BxL=None, *, interpret: bool):
  """`causal_attention` on one device."""
  b, length, h, g = q_BxLxHxG.shape
  k = k_BxLxKxG.shape[2]
  attend = _kernel(length, h // k, interpret)
  q_BxKxQxLxG = (q_BxLxHxG * g ** -0.5).reshape(b, length, k, h // k, g).transpose(0, 2, 3, 1, 4)
  k_BxKxLxG, v_BxKxLxG = k_BxLxKxG.transpose(0, 2, 1, 3), v_BxLxKxG.transpose(0, 2, 1, 3)
  if documents_BxL is None:
    out = jax.vmap(jax.vmap(attend))(q_BxKxQxLxG, k_BxKxLxG, v_BxKxLxG)   # [B, K, H/K, L, G]
  else:
    segments = lambda docs: kernel.SegmentIds(q=docs, kv=docs)
    per_head = lambda q, k, v, docs: attend(q, k, v, segment_ids=segments(docs))
    out = jax.vmap(jax.vmap(per_head, in_axes=(0, 0, 0, None)))(
        q_BxKxQxLxG, k_BxKxLxG, v_BxKxLxG, documents_BxL.astype(jax.numpy.int32))
  return out.transpose(0, 3, 1, 2, 4).reshape(b, length, h, g)
