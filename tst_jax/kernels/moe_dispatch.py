"""MoE dispatch and combine as permutations: token rows gathered into expert order and back.

Letters follow the package docstring: N tokens, P experts per token, A = N·P assignments with
assignment a = n·P + p, E experts, D model dim, and R rows of the expert-ordered buffer. R = A
for grouped GEMMs, rounded up to whole kernel tiles where the kernel asks, and more when each
expert's group is padded to whole blocks of C rows (`blocked`) or has C slots (`capacity`).

One sort of the A expert ids lays the buffer out both ways in `Routing`: the row of every
assignment and the assignment in every row. `dispatch` gathers the token rows into the buffer.
`combine` gathers each token's P expert outputs back and sums them, weighted, in float32.
Autodiff would transpose each gather into a scatter-add over [rows, D], which is slow on GPU.
These gathers are permutations, though, and a permutation's transpose is its inverse, so
custom VJPs make each backward the other gather. Dispatch's backward gathers every token's P
rows and sums them. Combine's gathers the token rows back into the buffer and dots them for the
weights. The inverse permutation is a second sort, of the first one's order, and the group
sizes a search of the sorted ids: no scatter anywhere, no float atomics.

An expert id >= E belongs to no row. It marks an expert that another shard holds in
`experts.experts_sharded`, sorts after every group, is dispatched nowhere and combines as 0.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tst_jax.kernels import moe_gather
from tst_jax.parallel import varying

# Searches compare every query with every sorted entry and sum, one fused pass. A binary search
# unrolled over log2 A levels is as fast on a GPU, but jax 0.12's XLA:CPU vectorises that chain
# in time exponential in its depth, and the fit check compiles the train step there
# (docs/performance.md). A loop of log2 A steps instead is slower on a GPU.
_SEARCH = "compare_all"


class Routing(NamedTuple):
  """Where each assignment sits in the expert-ordered buffer of R rows, int32 without gradient."""
  row_A: jax.Array          # [A] the buffer row of assignment a, R for none when the id is >= E
  assignment_R: jax.Array   # [R] the assignment held in row r, A for none in an empty row
  sizes_E: jax.Array        # [E] rows of each expert's group, padding excluded


def _sort(ids_NxP, n_experts: int):
  """Sorts assignments by expert: returns the order [A], its inverse [A] and group bounds [E + 1].

  The inverse gives each assignment's position in the order. The bounds say where each expert's
  group starts, and the last one where the groups end.
  """
  ids_A = ids_NxP.reshape(-1).astype(jnp.int32)
  iota_A = jax.lax.iota(jnp.int32, ids_A.shape[0])
  sorted_A, order_A = jax.lax.sort((ids_A, iota_A), num_keys=1, is_stable=True)
  _, inverse_A = jax.lax.sort((order_A, iota_A), num_keys=1)
  bounds = jnp.searchsorted(sorted_A, jnp.arange(n_experts + 1, dtype=jnp.int32),
                            method=_SEARCH).astype(jnp.int32)
  return order_A, inverse_A, bounds


@jax.named_scope("moe_dispatch")   # the step profile's category
def sort_by_expert(ids_NxP, n_experts: int, row_tile: int = 1) -> Routing:
  """Lays out the buffer of grouped GEMMs: the assignments by expert, groups unpadded.

  R is A rounded up to whole tiles of `row_tile` rows. The rows past A hold no assignment, so
  the kernels' tile is met once, at the dispatch, and no product pads its operands.
  """
  order_A, inverse_A, bounds = _sort(ids_NxP, n_experts)
  a = order_A.shape[0]
  rows = -(-a // row_tile) * row_tile
  mine_A = ids_NxP.reshape(-1) < n_experts
  order_R = jnp.pad(order_A, (0, rows - a), constant_values=a)
  filled_R = jnp.arange(rows) < bounds[-1]
  return Routing(jnp.where(mine_A, inverse_A, rows), jnp.where(filled_R, order_R, a),
                 jnp.diff(bounds))


def block_rows(assignments: int, n_experts: int) -> int:
  """Returns rows per block of `blocked`: the largest power of two <= A / 4E, at most 512.

  Padding every expert's group to whole blocks then adds at most about 25% to the A rows.
  """
  return 1 << min(9, max(0, (assignments // (4 * n_experts)).bit_length() - 1))


@jax.named_scope("moe_dispatch")
def blocked(ids_NxP, n_experts: int, block: int) -> tuple[Routing, jax.Array]:
  """Lays out the buffer with each expert's group padded to whole blocks, and each block's expert.

  There are sum_e ceil(size_e / C) <= (A + min(E, A)(C - 1)) / C blocks in all. Blocks past the
  last group hold no row: their expert is E - 1 and their rows zeros.
  """
  e, (n, k) = n_experts, ids_NxP.shape
  a = n * k
  order_A, inverse_A, bounds = _sort(ids_NxP, e)
  starts_E, sizes_E = bounds[:-1], jnp.diff(bounds)
  padded_E = -(-sizes_E // block) * block
  padded_ends_E = jnp.cumsum(padded_E)
  padded_starts_E = padded_ends_E - padded_E
  n_blocks = (a + min(e, a) * (block - 1)) // block
  rows = n_blocks * block
  ids_A = ids_NxP.reshape(-1)
  expert_A = jnp.minimum(ids_A, e - 1)
  row_A = jnp.where(ids_A < e, padded_starts_E[expert_A] + inverse_A - starts_E[expert_A], rows)
  block_expert = jnp.minimum(jnp.searchsorted(padded_ends_E, jnp.arange(n_blocks) * block,
                                              side="right", method=_SEARCH), e - 1)
  expert_R = block_expert[jnp.arange(rows) // block]
  offset_R = jnp.arange(rows) - padded_starts_E[expert_R]   # within the expert's group
  filled_R = offset_R < sizes_E[expert_R]
  assignment_R = jnp.where(filled_R, jnp.take(order_A, starts_E[expert_R] + offset_R,
                                              mode="clip"), a)
  return Routing(row_A, assignment_R, sizes_E), block_expert


# C of `capacity` is a whole multiple of this many rows: the batched matmul's tiles.
CAPACITY_TILE = 128


def capacity_rows(assignments: int, n_experts: int, factor: float) -> int:
  """Returns C, each expert's slots in `capacity`: cf·A/E rounded up to whole CAPACITY_TILEs."""
  return -(-math.ceil(factor * assignments / n_experts) // CAPACITY_TILE) * CAPACITY_TILE


def overflow_share(counts_E, capacity: int):
  """Returns the share of the assignments past their expert's first `capacity`, which
  `capacity`'s layout sends to the grouped GEMM; counts_E [E] is each expert's assignments."""
  counts_E = counts_E.astype(jnp.float32)
  return jnp.sum(jnp.maximum(counts_E - capacity, 0)) / jnp.maximum(jnp.sum(counts_E), 1)


@jax.named_scope("moe_dispatch")
def capacity(ids_NxP, n_experts: int, capacity: int, row_tile: int = 1) -> Routing:
  """Lays out the buffer of `experts.experts_capacity`: each expert's first C assignments in its C
  slots, then every assignment past them, by expert, as groups of a grouped GEMM.

  Rows [e·C, e·C + C) hold expert e's first min(size_e, C) assignments in sorted order and
  empty rows after them. The R_O rows past E·C hold the rest, expert e's size_e - C of them
  where that is positive, and `sizes_E` are those groups' sizes. R_O is A - C rounded up to
  whole tiles of `row_tile`: every assignment past C, as when one expert has all of them, so
  none is dropped.
  """
  e, (n, k) = n_experts, ids_NxP.shape
  a, slots = n * k, n_experts * capacity
  order_A, inverse_A, bounds = _sort(ids_NxP, e)
  starts_E, sizes_E = bounds[:-1], jnp.diff(bounds)
  over_E = jnp.maximum(sizes_E - capacity, 0)
  over_ends_E = jnp.cumsum(over_E)
  over_starts_E = over_ends_E - over_E
  rows_over = -(-max(a - capacity, 0) // row_tile) * row_tile
  ids_A = ids_NxP.reshape(-1)
  expert_A = jnp.minimum(ids_A, e - 1)
  rank_A = inverse_A - starts_E[expert_A]                       # within its expert's group
  row_A = jnp.where(ids_A >= e, slots + rows_over,
                    jnp.where(rank_A < capacity, expert_A * capacity + rank_A,
                              slots + over_starts_E[expert_A] + rank_A - capacity))
  slot_S = jnp.arange(slots)
  slot_expert, slot_rank = slot_S // capacity, slot_S % capacity
  assignment_S = jnp.where(slot_rank < sizes_E[slot_expert], jnp.take(
      order_A, starts_E[slot_expert] + slot_rank, mode="clip"), a)
  over_O = jnp.arange(rows_over)
  over_expert = jnp.minimum(jnp.searchsorted(over_ends_E, over_O, side="right",
                                             method=_SEARCH), e - 1)
  assignment_O = jnp.where(over_O < over_ends_E[-1], jnp.take(
      order_A, starts_E[over_expert] + capacity + over_O - over_starts_E[over_expert],
      mode="clip"), a)
  return Routing(row_A.astype(jnp.int32), jnp.concatenate([assignment_S, assignment_O]),
                 over_E)


def _rows(table, index):
  """Gathers table[index] along axis 0, with 0 where the index marks none by being out of range."""
  return jnp.take(table, index, axis=0, mode="fill", fill_value=0)


# How dispatch and combine move rows, each a full set of the four passes (dispatch and combine,
# forward and backward). The MoE lab (benchmarks/moe_lab.py) times them side by side; it also
# timed writing the gather out before the sum, P outermost, a segment_sum and weights applied
# to the buffer rows, none faster (docs/performance.md, the MoE lab's first H200 section).
#   gather    the P-way sums gather [N, P, D], then reduce over P; combine's backward gathers
#             y again for the weights' gradient
#   unrolled  the P-way sums add P gathers of [N, D] in one elementwise pass, no reduce
#   pallas    the Pallas kernels of moe_gather: one coalesced pass gathers and reduces
# Every set but `gather` takes the weights' gradient in buffer order: the dot of each row with
# the token row its backward gathers anyway, then a gather of R scalars back to [N, P].
IMPLS = ("gather", "unrolled", "pallas")


def _check(impl: str):
  if impl not in IMPLS:
    raise ValueError(f"dispatch impl must be one of {IMPLS}, got {impl!r}")


def _sum_rows(table_RxD, row_NxP, weights_NxP, impl: str):
  """Returns sum_p weights[n, p] · table[row[n, p]], [N, D] float32; weights None means 1."""
  n, k = row_NxP.shape
  if impl == "pallas":
    ones = jnp.ones((n, k), jnp.float32)
    return moe_gather.gather_sum(table_RxD, row_NxP, ones if weights_NxP is None else weights_NxP)
  w_NxP = None if weights_NxP is None else weights_NxP.astype(jnp.float32)
  if impl == "unrolled":
    total = None
    for p in range(k):
      term = _rows(table_RxD, row_NxP[:, p]).astype(jnp.float32)
      term = term if w_NxP is None else term * w_NxP[:, p, None]
      total = term if total is None else total + term
    return total
  rows_NxPxD = _rows(table_RxD, row_NxP.reshape(-1)).reshape(n, k, -1).astype(jnp.float32)
  if w_NxP is not None:
    rows_NxPxD = rows_NxPxD * w_NxP[..., None]
  return jnp.sum(rows_NxPxD, axis=1)


def _gather_rows(table_TxD, index_R, scale_R, impl: str, dtype):
  """Returns scale[r] · table[index[r]] as [R, D] in `dtype`, 0 for an index past the table;
  scale None means 1."""
  if impl == "pallas":
    scale_R = jnp.ones(index_R.shape, jnp.float32) if scale_R is None else scale_R
    return moe_gather.gather(table_TxD, index_R, scale_R, dtype=dtype)
  rows_RxD = _rows(table_TxD, index_R)
  if scale_R is not None:
    rows_RxD = rows_RxD.astype(jnp.float32) * scale_R[:, None]
  return rows_RxD.astype(dtype)


def dispatch(x_NxD, routing: Routing, top_k: int, impl: str = "gather"):
  """Gathers token rows in expert order into [R, D]: row r is its assignment's token, 0 if none."""
  _check(impl)
  with jax.named_scope("moe_dispatch"):
    x_NxD, row_A, assignment_R = varying.alike(x_NxD, routing.row_A, routing.assignment_R)
    return _dispatch(x_NxD, row_A, assignment_R, top_k, impl)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _dispatch(x_NxD, row_A, assignment_R, top_k, impl):
  del row_A
  # A // P = N: out of range, a zero row
  return _gather_rows(x_NxD, assignment_R // top_k, None, impl, x_NxD.dtype)


def _dispatch_fwd(x_NxD, row_A, assignment_R, top_k, impl):
  return _dispatch(x_NxD, row_A, assignment_R, top_k, impl), (row_A, assignment_R)


def _dispatch_bwd(top_k, impl, residuals, dy_RxD):
  """Returns dx[n], the sum of its P rows' cotangents, added in float32."""
  row_A, _ = residuals
  with jax.named_scope("moe_dispatch"):
    dx_NxD = _sum_rows(dy_RxD, row_A.reshape(-1, top_k), None, impl).astype(dy_RxD.dtype)
  return dx_NxD, None, None


_dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


def combine(y_RxD, weights_NxP, routing: Routing, impl: str = "gather"):
  """Sums each token's P expert outputs with its top-k weights in float32: [N, D] in y's dtype."""
  _check(impl)
  with jax.named_scope("moe_combine"):
    return _combine(*varying.alike(y_RxD, weights_NxP, routing.row_A, routing.assignment_R),
                    impl)


def _weight_rows(weights_NxP, assignment_R):
  """Returns each buffer row's top-k weight [R] in float32, 0 in an empty row."""
  return _rows(weights_NxP.reshape(-1), assignment_R).astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _combine(y_RxD, weights_NxP, row_A, assignment_R, impl):
  n, k = weights_NxP.shape
  return _sum_rows(y_RxD, row_A.reshape(n, k), weights_NxP, impl).astype(y_RxD.dtype)


def _combine_fwd(y_RxD, weights_NxP, row_A, assignment_R, impl):
  return _combine(y_RxD, weights_NxP, row_A, assignment_R, impl), (y_RxD, weights_NxP, row_A,
                                                                   assignment_R)


def _combine_bwd(impl, residuals, dout_NxD):
  """Returns dy and dweight, each by gathers.

  dy[r] is the weight times dout of its assignment's token, which gathers the token rows back
  into the buffer. dweight[n, p] = <dout[n], y[row of n·P + p]>: under `gather` a second
  gather of y and a dot over D, under the others the dot of each buffer row with its gathered
  token row, then a gather of the R dots.
  """
  y_RxD, weights_NxP, row_A, assignment_R = residuals
  n, k = weights_NxP.shape
  with jax.named_scope("moe_combine"):
    weight_R = _weight_rows(weights_NxP, assignment_R)
    token_R = assignment_R // k
    if impl == "gather":
      dout_NxD = dout_NxD.astype(jnp.float32)
      dy_RxD = (_rows(dout_NxD, token_R) * weight_R[:, None]).astype(y_RxD.dtype)
      y_NxPxD = _rows(y_RxD, row_A).reshape(n, k, -1).astype(jnp.float32)
      dweights_NxP = jnp.sum(y_NxPxD * dout_NxD[:, None, :], axis=-1)
    else:
      dout_RxD = _gather_rows(dout_NxD, token_R, None, impl, dout_NxD.dtype).astype(jnp.float32)
      dy_RxD = (dout_RxD * weight_R[:, None]).astype(y_RxD.dtype)
      dweight_R = jnp.sum(dout_RxD * y_RxD.astype(jnp.float32), axis=-1)
      dweights_NxP = _rows(dweight_R, row_A).reshape(n, k)
  return dy_RxD, dweights_NxP.astype(weights_NxP.dtype), None, None


_combine.defvjp(_combine_fwd, _combine_bwd)
