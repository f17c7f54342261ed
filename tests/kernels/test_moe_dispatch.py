"""MoE dispatch and combine (tst_jax/kernels/moe_dispatch.py) against slow per-assignment loops:
the layouts (sorted, sorted into whole tiles of 8 rows, blocked, capacity), values and both
gradients for
every implementation (moe_dispatch.IMPLS, the Pallas kernels interpreted), ids of other shards'
experts, backwards made of gathers (no scatter in the differentiated program), and a routing
program whose size does not depend on the number of assignments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tst_jax.kernels import moe_dispatch

N, P, E, D = 12, 3, 5, 4


def _ids(other_shards: bool):
  """[N, P] expert ids, distinct per token, expert 1 empty; with other_shards, some >= E."""
  rng = np.random.default_rng(0)
  ids = np.stack([rng.choice([0, 2, 3, 4] + [E, E + 1] * other_shards, P, replace=False)
                  for _ in range(N)])
  return jnp.asarray(ids, jnp.int32)


def _layout(ids, kind):
  if kind == "sorted":
    return moe_dispatch.sort_by_expert(ids, E), None
  if kind == "tiled":   # 36 assignments in 40 rows: whole tiles of a grouped GEMM's 8
    return moe_dispatch.sort_by_expert(ids, E, 8), None
  if kind == "capacity":   # 2 slots per expert, the rest past them: 10 + 40 rows
    return moe_dispatch.capacity(ids, E, 2, 8), None
  return moe_dispatch.blocked(ids, E, 4)


def _slow_rows(ids, routing, block_expert):
  """The buffer the obvious way: walk the assignments in expert order (stable), each expert's
  group starting where the layout says; check every row's expert on the way."""
  ids = np.asarray(ids).reshape(-1)
  rows = np.full(routing.assignment_R.shape[0], -1)
  starts = {}
  for e in range(E):
    group = [a for a in range(ids.size) if ids[a] == e]
    start = int(np.asarray(routing.row_A)[group[0]]) if group else None
    for i, a in enumerate(group):
      rows[start + i] = a
      if block_expert is not None:
        assert int(block_expert[(start + i) // 4]) == e
    starts[e] = start
  return rows


@pytest.mark.parametrize("kind", ["sorted", "tiled", "blocked"])
@pytest.mark.parametrize("other_shards", [False, True])
def test_layout_is_a_permutation_both_ways(kind, other_shards):
  ids = _ids(other_shards)
  routing, block_expert = _layout(ids, kind)
  flat = np.asarray(ids).reshape(-1)
  a, r = flat.size, routing.assignment_R.shape[0]
  np.testing.assert_array_equal(routing.sizes_E, np.bincount(flat[flat < E], minlength=E))
  row_A, assignment_R = np.asarray(routing.row_A), np.asarray(routing.assignment_R)
  assert np.all(row_A[flat >= E] == r) and np.all(row_A[flat < E] < r)
  for i in np.flatnonzero(flat < E):             # row_A and assignment_R are inverses
    assert assignment_R[row_A[i]] == i
  assert np.sum(assignment_R < a) == np.sum(flat < E) and np.all(assignment_R <= a)
  np.testing.assert_array_equal(np.where(assignment_R < a, assignment_R, -1),
                                _slow_rows(ids, routing, block_expert))
  if kind != "blocked":   # groups back to back from row 0, in expert order
    np.testing.assert_array_equal(np.sort(row_A[flat < E]), np.arange(np.sum(flat < E)))
    assert r == {"sorted": a, "tiled": 40}[kind]


def _slow_capacity(ids, capacity: int):
  """`capacity`'s buffer the obvious way: each expert's assignments in stable order, the first
  C in its slots, the rest appended after the E·C slots; -1 marks an empty row."""
  flat = np.asarray(ids).reshape(-1)
  slots, overflow, sizes = np.full(E * capacity, -1), [], []
  for e in range(E):
    group = [a for a in range(flat.size) if flat[a] == e]
    slots[e * capacity: e * capacity + min(len(group), capacity)] = group[:capacity]
    overflow += group[capacity:]
    sizes.append(max(len(group) - capacity, 0))
  return slots, np.asarray(overflow), np.asarray(sizes)


@pytest.mark.parametrize("other_shards", [False, True])
@pytest.mark.parametrize("capacity,tile", [(2, 8), (3, 1), (9, 8), (40, 8)])
def test_capacity_layout_fills_each_experts_slots_then_the_groups_past_them(capacity, tile,
                                                                           other_shards):
  """Each expert's first C assignments in its C slots, the rest as groups after them (sizes_E
  theirs), in A - C rows rounded to whole tiles: room for any routing, none past the groups
  when C holds every expert's (C = 9, 40), other shards' assignments in no row."""
  ids = _ids(other_shards)
  routing = moe_dispatch.capacity(ids, E, capacity, tile)
  flat = np.asarray(ids).reshape(-1)
  a, slots = flat.size, E * capacity
  r = routing.assignment_R.shape[0]
  assert r == slots + -(-max(a - capacity, 0) // tile) * tile
  want_slots, want_overflow, want_sizes = _slow_capacity(ids, capacity)
  assignment_R, row_A = np.asarray(routing.assignment_R), np.asarray(routing.row_A)
  np.testing.assert_array_equal(np.where(assignment_R[:slots] < a, assignment_R[:slots], -1),
                                want_slots)
  np.testing.assert_array_equal(assignment_R[slots: slots + want_overflow.size], want_overflow)
  assert np.all(assignment_R[slots + want_overflow.size:] == a)
  np.testing.assert_array_equal(routing.sizes_E, want_sizes)
  assert np.all(row_A[flat >= E] == r)
  for i in np.flatnonzero(flat < E):             # row_A and assignment_R are inverses
    assert assignment_R[row_A[i]] == i
  counts = jnp.asarray(np.bincount(flat[flat < E], minlength=E))
  np.testing.assert_allclose(moe_dispatch.overflow_share(counts, capacity),
                             want_overflow.size / np.sum(flat < E))


def test_capacity_rows_are_whole_tiles_of_the_capacity_factors_share():
  """C = roundup(cf·A/E, 128): the recipe's 32768 x 8 assignments over 64 experts at cf 1 fill
  4096 slots each, at 1.25 5120; a share below one tile is one tile."""
  assert moe_dispatch.capacity_rows(262144, 64, 1.0) == 4096
  assert moe_dispatch.capacity_rows(262144, 64, 1.25) == 5120
  assert moe_dispatch.capacity_rows(262144, 64, 1.01) == 4224
  assert moe_dispatch.capacity_rows(48, 8, 1.25) == 128


def _slow_dispatch_combine(x, y_rows, weights, ids, routing):
  """Per assignment: x rows into the buffer; out[n] = sum_p w[n,p] y[row of (n, p)]."""
  x, y_rows, w = (np.asarray(v, np.float64) for v in (x, y_rows, weights))
  flat = np.asarray(ids).reshape(-1)
  rows = np.zeros((routing.assignment_R.shape[0], D))
  out = np.zeros((N, D))
  for a in np.flatnonzero(flat < E):
    n, row = a // P, int(routing.row_A[a])
    rows[row] = x[n]
    out[n] += w[n, a % P] * y_rows[row]
  return rows, out


@pytest.mark.parametrize("impl", moe_dispatch.IMPLS)
@pytest.mark.parametrize("kind", ["sorted", "tiled", "blocked", "capacity"])
@pytest.mark.parametrize("other_shards", [False, True])
def test_dispatch_combine_values_and_gradients(kind, other_shards, impl):
  ids = _ids(other_shards)
  routing, _ = _layout(ids, kind)
  r = routing.assignment_R.shape[0]
  k = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(k[0], (N, D))
  y_rows = jax.random.normal(k[1], (r, D))
  weights = jax.random.uniform(k[2], (N, P))
  ct_rows, ct_out = jax.random.normal(k[3], (r, D)), jax.random.normal(k[4], (N, D))
  rows, out = _slow_dispatch_combine(x, y_rows, weights, ids, routing)
  np.testing.assert_allclose(moe_dispatch.dispatch(x, routing, P, impl), rows, rtol=1e-6)
  np.testing.assert_allclose(moe_dispatch.combine(y_rows, weights, routing, impl), out,
                             rtol=1e-5, atol=1e-6)
  # Gradients: the custom VJPs (gathers) against autodiff of the slow version's formulas
  # written with scatters (jnp .at[].add), which XLA transposes the ordinary way.
  flat = np.asarray(ids).reshape(-1)
  valid = flat < E
  row_of = np.where(valid, np.asarray(routing.row_A), 0)

  def reference(x, y_rows, weights):
    token = np.arange(N * P) // P
    buffer = jnp.zeros((r, D)).at[row_of[valid]].set(x[token[valid]])
    picked = jnp.where(valid[:, None], y_rows[row_of], 0.0).reshape(N, P, D)
    return buffer, jnp.einsum("npd,np->nd", picked, weights)

  def loss(fns):
    def f(x, y_rows, weights):
      rows, out = fns(x, y_rows, weights)
      return jnp.sum(rows * ct_rows) + jnp.sum(out * ct_out)
    return f

  ours = lambda x, y, w: (moe_dispatch.dispatch(x, routing, P, impl),
                          moe_dispatch.combine(y, w, routing, impl))
  got = jax.grad(loss(ours), argnums=(0, 1, 2))(x, y_rows, weights)
  want = jax.grad(loss(reference), argnums=(0, 1, 2))(x, y_rows, weights)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(got[0]).max()) > 0 and float(jnp.abs(got[2]).max()) > 0


@pytest.mark.parametrize("impl", moe_dispatch.IMPLS)
def test_bfloat16_rows_combine_in_float32(impl):
  """bf16 expert outputs: the P-way weighted sum accumulates in float32 (one rounding at the
  end), so it matches the float64 sum to bf16's last bit; so do both gradients of dispatch
  and combine, each one float32 sum rounded once to bf16."""
  ids = _ids(True)
  routing, _ = _layout(ids, "tiled")
  r = routing.assignment_R.shape[0]
  k = jax.random.split(jax.random.key(1), 4)
  y = jax.random.normal(k[0], (r, D)).astype(jnp.bfloat16)
  w = jax.random.uniform(k[1], (N, P))
  dout = jax.random.normal(k[2], (N, D)).astype(jnp.bfloat16)
  got, vjp = jax.vjp(lambda y, w: moe_dispatch.combine(y, w, routing, impl), y, w)
  assert got.dtype == jnp.bfloat16
  _, want = _slow_dispatch_combine(jnp.zeros((N, D)), y.astype(jnp.float32), w, ids, routing)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2 ** -8, atol=1e-6)
  dy, dw = vjp(dout)
  flat = np.asarray(ids).reshape(-1)
  row_A, y64, dout64 = (np.asarray(a, np.float64) if a is not routing.row_A else np.asarray(a)
                        for a in (routing.row_A, y, dout))
  want_dy, want_dw = np.zeros((r, D)), np.zeros((N, P))
  for a in np.flatnonzero(flat < E):
    want_dy[row_A[a]] = float(w[a // P, a % P]) * dout64[a // P]
    want_dw[a // P, a % P] = y64[row_A[a]] @ dout64[a // P]
  np.testing.assert_allclose(np.asarray(dy, np.float64), want_dy, rtol=2 ** -8, atol=1e-6)
  np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)
  _, vjp = jax.vjp(lambda x: moe_dispatch.dispatch(x, routing, P, impl), dout)
  (dx,) = vjp(y)
  want_dx = np.zeros((N, D))
  for a in np.flatnonzero(flat < E):
    want_dx[a // P] += y64[row_A[a]]
  assert dx.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(dx, np.float64), want_dx, rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("impl", [i for i in moe_dispatch.IMPLS if i != "pallas"])
def test_differentiated_program_has_no_scatter(impl):
  """Forward and backward of dispatch + combine: gathers, sorts and sums only (pallas's kernels
  are custom calls on a GPU)."""
  ids = _ids(True)

  def f(x, w):
    routing = moe_dispatch.sort_by_expert(ids, E)
    return jnp.sum(moe_dispatch.combine(jnp.sin(moe_dispatch.dispatch(x, routing, P, impl)), w,
                                        routing, impl))
  hlo = jax.jit(jax.grad(f, argnums=(0, 1))).lower(jnp.ones((N, D)), jnp.ones((N, P))).as_text()
  assert "stablehlo.gather" in hlo and "stablehlo.sort" in hlo
  assert "scatter" not in hlo


@pytest.mark.parametrize("kind", ["sorted", "blocked"])
def test_routing_program_does_not_grow_with_assignments(kind):
  """Both layouts lower to the same program for 24 and 393,216 assignments: no search unrolled
  over log2 A levels, whose LLVM vectorisation on jax 0.12's XLA:CPU grows exponentially."""
  def lines(n):
    ids = jax.ShapeDtypeStruct((n, P), jnp.int32)
    layout = jax.jit(lambda i: _layout(i, kind))
    return layout.lower(ids).as_text().count("\n")
  assert lines(N) == lines(N << 15)
