"""A fused-loss kernel under shard_map: rows split like 'batch', the head's V like 'vocab'.

XLA's SPMD partitioner cannot split a Pallas kernel, a custom call, so under a mesh it would
all-gather the batch-sharded hidden and the vocab-sharded head onto every device. The XLA
kernel's loop over vocab tiles of a vocab-sharded head partitions badly too. Here each device
runs the kernel on its rows against its V/tp columns, shard_map's entry all-gathers the head's
D as FSDP does, and the shards combine exactly. lse is the logsumexp of the local lse over vocab
shards, and z the psum of the local target logits. A valid target lies in one shard, and the
others see it as ignored and give 0.

check_vma=False, since Pallas outputs and the XLA kernel's loop carries have no varying-axes
type. Gradients stay exact by shard_map's transpose in that mode. A replicated output's
cotangent is split over its replicas, psum transposes to psum, and an input's cotangent is
summed over the axes its PartitionSpec omits: d_hidden over the vocab shards, d_head over the
row shards. tests/kernels/test_linear_mce.py checks both against the naive loss.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tst_jax.parallel import logical


def lse_and_target_logits(kernel, hidden_NxD, head_DxV, targets_NxS, *, ignore_index,
                          **kernel_kwargs):
  """Runs `kernel(hidden, head, targets, ...)` -> lse [N], z [N, S] split over the mesh.

  The mesh is the enclosing `axis_rules`'. Without one, or when no axis used is larger than 1,
  this is the plain call.
  """
  context = logical.current()
  call = lambda h, w, t, ignore: kernel(h, w, t, ignore_index=ignore, **kernel_kwargs)  # noqa: E731
  if context is None:
    return call(hidden_NxD, head_DxV, targets_NxS, ignore_index)
  mesh, rules = context
  row_entry, vocab_entry = logical.logical_to_pspec(("batch", "vocab"), rules)  # axes used once
  row_axes, vocab_axes = logical.mesh_axes(row_entry), logical.mesh_axes(vocab_entry)
  rows, shards = (math.prod(mesh.shape[a] for a in axes) for axes in (row_axes, vocab_axes))
  if rows * shards == 1:
    return call(hidden_NxD, head_DxV, targets_NxS, ignore_index)
  (n, _), v = hidden_NxD.shape, head_DxV.shape[1]
  if v % shards or n % rows:
    raise ValueError(f"fused loss under a mesh: the vocabulary ({v}) must divide over the "
                     f"'vocab' mesh axes {vocab_axes} ({shards} shards) and the B·L rows "
                     f"({n}) over the 'batch' mesh axes {row_axes} ({rows} shards)")

  def local(hidden_NxD, head_DxV, targets_NxS):
    v_local = head_DxV.shape[1]
    offset = jax.lax.axis_index(vocab_axes) * v_local if vocab_axes else 0
    mine_NxS = (targets_NxS != ignore_index) & (targets_NxS >= offset) & (
        targets_NxS < offset + v_local)
    # -1 marks the others, never a local column, so a shard's column can't equal ignore_index.
    lse_N, z_NxS = call(hidden_NxD, head_DxV, jnp.where(mine_NxS, targets_NxS - offset, -1), -1)
    if not vocab_axes:
      return lse_N, z_NxS
    m_N = jax.lax.pmax(jax.lax.stop_gradient(lse_N), vocab_axes)
    lse_N = m_N + jnp.log(jax.lax.psum(jnp.exp(lse_N - m_N), vocab_axes))
    return lse_N, jax.lax.psum(z_NxS, vocab_axes)

  sharded = jax.shard_map(
      local, mesh=mesh, check_vma=False,
      in_specs=(jax.P(row_entry, None), jax.P(None, vocab_entry), jax.P(row_entry, None)),
      out_specs=(jax.P(row_entry), jax.P(row_entry, None)))
  return sharded(hidden_NxD, head_DxV, targets_NxS)
