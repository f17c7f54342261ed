"""The grouped matmul of `expert_impl=gmm` (tst_jax/kernels/grouped_matmul.py) against a slow
per-group loop: forward, dX and dW, for uneven, empty and all-rows groups, rows past the last
group (other shards' experts), float32 and bfloat16; its backward is grouped GEMMs only."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tst_jax import platform
from tst_jax.kernels import grouped_matmul as gm


def per_group(x_AxI, w_ExIxO, sizes_E):
  """The obvious loop: rows [s_e, s_e + size_e) times w[e]; rows past the groups are 0."""
  x, w = np.asarray(x_AxI, np.float64), np.asarray(w_ExIxO, np.float64)
  y, start = np.zeros((x.shape[0], w.shape[2])), 0
  for e, size in enumerate(np.asarray(sizes_E)):
    y[start:start + size] = x[start:start + size] @ w[e]
    start += size
  return y


SIZES = {"uneven": [3, 0, 7, 2, 4], "one_expert_takes_all": [0, 0, 16, 0, 0],
         "empty_experts_and_rows_past": [5, 0, 0, 6, 0]}   # 11 of 16 rows grouped


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("case", list(SIZES))
def test_forward_and_both_gradients_match_the_per_group_loop(case, dtype, tol):
  a, i, o = 16, 6, 5
  sizes_E = jnp.asarray(SIZES[case], jnp.int32)
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x_AxI = jax.random.normal(k1, (a, i)).astype(dtype)
  w_ExIxO = jax.random.normal(k2, (len(SIZES[case]), i, o)).astype(dtype)
  dy_AxO = jax.random.normal(k3, (a, o))

  def loss(x, w):
    return jnp.sum(gm.grouped_matmul(x, w, sizes_E).astype(jnp.float32) * dy_AxO)

  y = jax.jit(gm.grouped_matmul)(x_AxI, w_ExIxO, sizes_E)
  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x_AxI, w_ExIxO)
  assert y.dtype == dx.dtype == dw.dtype == jnp.dtype(dtype)
  # The slow version of each: y = per_group(x, w); dx = per_group(dy, wᵀ); dw[e] = x_eᵀ dy_e.
  want_dx = per_group(dy_AxO, np.swapaxes(np.asarray(w_ExIxO, np.float32), 1, 2), sizes_E)
  want_dw = np.zeros(w_ExIxO.shape)
  start = 0
  for e, size in enumerate(SIZES[case]):
    rows = slice(start, start + size)
    want_dw[e] = np.asarray(x_AxI, np.float64)[rows].T @ np.asarray(dy_AxO, np.float64)[rows]
    start += size
  scale = lambda ref: tol * max(1.0, float(np.abs(ref).max()))
  for got, want in ((y, per_group(x_AxI, w_ExIxO, sizes_E)), (dx, want_dx), (dw, want_dw)):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=scale(want), rtol=tol)
  past = int(np.sum(SIZES[case]))
  assert not np.any(np.asarray(y[past:])) and not np.any(np.asarray(dx[past:]))


def test_the_backward_is_grouped_gemms_with_no_rows_by_experts_array():
  """Differentiated, the program holds ragged_dot (forward, dX) and one ragged-contraction
  ragged_dot_general (dW), and no [A, E] intermediate (one-hot masks, a dense expansion)."""
  a, e = 24, 5
  x, w = jnp.ones((a, 8)), jnp.ones((e, 8, 4))
  sizes = jnp.asarray([4, 0, 12, 3, 5], jnp.int32)
  jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: gm.grouped_matmul(x, w, sizes).sum(),
                                  argnums=(0, 1)))(x, w)
  names = [str(eqn.primitive) for eqn in jaxpr.jaxpr.eqns] + [
      str(inner.primitive) for eqn in jaxpr.jaxpr.eqns for sub in eqn.params.values()
      if hasattr(sub, "jaxpr") for inner in getattr(sub, "jaxpr", sub).eqns]
  assert "ragged_dot_general" in " ".join(names)
  shapes = {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}
  shapes |= {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for sub in eqn.params.values()
             if hasattr(sub, "jaxpr") for inner in getattr(sub, "jaxpr", sub).eqns
             for v in inner.outvars}
  assert (a, e) not in shapes and (e, a) not in shapes, shapes


def test_backend_choice_and_a_bad_backend():
  assert platform.grouped_matmul_backend("cpu")[0] == "xla"
  assert platform.grouped_matmul_backend("tpu")[0] == "xla"
  want = "tokamax" if gm.tokamax_available() else "xla"
  assert platform.grouped_matmul_backend("gpu")[0] == want
  assert platform.expert_impl("gmm", "cpu")[1].startswith("set in the config; grouped GEMM")
  with pytest.raises(ValueError, match="backend must be one of"):
    gm.grouped_matmul(jnp.ones((2, 3)), jnp.ones((1, 3, 4)), jnp.asarray([2]), "cutlass")


def test_the_benchmark_runs_at_tiny_shapes():
  """benchmarks/grouped_matmul.py (its GPU rows: benchmarks/gpu.sh) runs on CPU with --smoke."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "grouped_matmul.py"),
                        "--smoke", "--backends", "xla"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             PYTHONPATH=root))
  assert out.returncode == 0, out.stderr
  row = json.loads(out.stdout.splitlines()[-1])
  assert row["backend"] == "xla" and row["rows"] > 0 and row["fwd_bwd_tflops"] > 0
