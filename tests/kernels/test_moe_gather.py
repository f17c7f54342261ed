"""The Pallas kernels of MoE dispatch and combine (tst_jax/kernels/moe_gather.py), interpreted on
CPU, against slow loops over rows: weighted P-way sums and scaled gathers, indices past the
table, row counts that are not whole blocks, widths of several column blocks, bf16 tables
summed in float32; and both kernels lowered for a GPU at the recipe's shapes."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures import gpu_target
from tst_jax.kernels import moe_gather, target


def _table(rows, d, dtype, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(rows, d)), dtype)


@pytest.mark.parametrize("n,top_k,r,d,dtype", [
    (20, 3, 40, 64, jnp.float32),      # N not a whole block of 32
    (64, 8, 100, 768, jnp.bfloat16),   # three column blocks of 256, bf16 summed in float32
    (33, 2, 7, 12, jnp.float32),       # D of no power-of-two block above 4
])
def test_gather_sum_is_the_weighted_sum_of_rows(n, top_k, r, d, dtype):
  rng = np.random.default_rng(1)
  table = _table(r, d, dtype)
  rows = rng.integers(0, r + 3, (n, top_k)).astype(np.int32)   # some past the table: 0
  weights = rng.uniform(size=(n, top_k)).astype(np.float32)
  got = moe_gather.gather_sum(table, jnp.asarray(rows), jnp.asarray(weights))
  t64, want = np.asarray(table, np.float64), np.zeros((n, d))
  for i in range(n):
    for p in range(top_k):
      if rows[i, p] < r:
        want[i] += weights[i, p] * t64[rows[i, p]]
  assert got.dtype == jnp.float32 and got.shape == (n, d)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert np.any(rows >= r) and float(jnp.abs(got).max()) > 0


@pytest.mark.parametrize("r,t,d,dtype", [(50, 9, 64, jnp.float32), (70, 30, 512, jnp.bfloat16)])
def test_gather_is_the_scaled_rows_in_the_asked_dtype(r, t, d, dtype):
  rng = np.random.default_rng(2)
  table = _table(t, d, dtype)
  index = rng.integers(0, t + 2, r).astype(np.int32)
  scale = rng.uniform(size=r).astype(np.float32)
  t64 = np.asarray(table, np.float64)
  want = np.stack([scale[i] * t64[index[i]] if index[i] < t else np.zeros(d) for i in range(r)])
  for out_dtype in (None, jnp.float32):
    got = moe_gather.gather(table, jnp.asarray(index), jnp.asarray(scale), dtype=out_dtype)
    assert got.dtype == (out_dtype or dtype)
    tol = 2 ** -8 if got.dtype == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=1e-6)


def test_block_d_is_the_largest_power_of_two_dividing_d_up_to_256():
  assert [moe_gather.block_d(d) for d in (768, 1024, 384, 96, 12, 7)] == [256, 256, 128, 32, 4, 1]


def test_both_kernels_lower_for_a_gpu_as_triton_calls_at_the_recipes_shapes(monkeypatch):
  """At qwen3_moe_gpu_small's shapes (R 262144 rows of D 768, N 32768 tokens, P 8): the Pallas
  kernels lower to Triton custom calls, so no GPU call is spent on a kernel that cannot lower.
  The grid is the rows in blocks of 32 by the columns in blocks of 256."""
  table = jax.ShapeDtypeStruct((262144, 768), jnp.bfloat16)
  rows = jax.ShapeDtypeStruct((32768, 8), jnp.int32)
  weights = jax.ShapeDtypeStruct((32768, 8), jnp.float32)
  index = jax.ShapeDtypeStruct((262144,), jnp.int32)
  scale = jax.ShapeDtypeStruct((262144,), jnp.float32)
  with target.lowering_for("gpu"), gpu_target.h100(monkeypatch):
    for fn, args, grid in ((moe_gather.gather_sum, (table, rows, weights), (1024, 3)),
                           (moe_gather.gather, (table, index, scale), (8192, 3))):
      text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
      assert "__gpu$xla.gpu.triton" in text
      assert f"grid_x = {grid[0]} : i32, grid_y = {grid[1]} : i32" in text
