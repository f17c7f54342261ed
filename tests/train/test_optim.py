"""The optimizer, and the non-finite guard compared with optax.apply_if_finite, which it keeps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tst_jax.train import optim
from tst_jax.train.sections import Optimizer


def _setup(max_errors: int):
  params = {"w": jnp.arange(4.0), "norm": jnp.ones(2)}
  tx, _ = optim.make_optimizer(Optimizer(warmup_steps=0), total_steps=100)
  return params, tx, optax.apply_if_finite(tx, max_consecutive_errors=max_errors)


def test_apply_if_finite_matches_on_finite_gradients():
  params, tx, guarded = _setup(2)
  grads = {"w": jnp.array([0.1, -0.2, 0.3, 0.0]), "norm": jnp.array([0.5, 0.5])}
  want, _ = tx.update(grads, tx.init(params), params)
  got, _ = guarded.update(grads, guarded.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


def test_apply_if_finite_is_not_the_nan_policy_guard():
  """Three differences: it applies a bad update after max_consecutive_errors where the loop
  stops at train.max_nan_skips, it counts consecutive steps where max_nan_skips counts all,
  and its counters change the optimizer state that checkpoints hold."""
  params, tx, guarded = _setup(2)
  nan = {"w": jnp.full(4, jnp.nan), "norm": jnp.zeros(2)}
  state = guarded.init(params)
  for _ in range(2):
    updates, state = guarded.update(nan, state, params)
    assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(updates))
  updates, state = guarded.update(nan, state, params)
  assert not np.isfinite(np.asarray(optax.apply_updates(params, updates)["w"])).any()
  # A finite step in between resets its count: 2 + 2 non-finite steps are all skipped.
  state = guarded.init(params)
  finite = jax.tree.map(jnp.ones_like, params)
  for grads in [nan, nan, finite, nan, nan]:
    updates, state = guarded.update(grads, state, params)
    assert np.isfinite(np.asarray(updates["w"])).all()
  assert int(state.total_notfinite) == 4
  assert jax.tree.structure(guarded.init(params)) != jax.tree.structure(tx.init(params))
