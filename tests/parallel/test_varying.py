"""Operands made to vary alike under shard_map (tst_jax/parallel/varying.py): outside a
shard_map nothing varies; inside, `alike` broadcasts each operand to the union of their mesh
axes, so a custom VJP's cotangents type-check, and the replicated operand's gradient is the
sum over the shards, as the unsharded program's is."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from tst_jax.parallel import varying


def test_outside_a_shard_map_nothing_varies():
  a, b = jnp.ones(3), jnp.zeros(2)
  assert varying.varying_axes(a) == frozenset()
  assert varying.alike(a, b) == (a, b)


def _scaled_sum(x, w):
  """sum(x * w) with a custom VJP whose cotangents need x and w to vary alike."""
  @jax.custom_vjp
  def f(x, w):
    return jnp.sum(x * w)

  def fwd(x, w):
    return f(x, w), (x, w)

  def bwd(res, g):
    x, w = res
    return g * w * jnp.ones_like(x), g * x     # dw from x: varies over x's axes
  f.defvjp(fwd, bwd)
  return f(*varying.alike(x, w))


def test_alike_inside_a_shard_map_and_the_gradient_of_the_replicated_operand():
  mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,))
  x = jnp.arange(8.0)
  w = jnp.full((2,), 0.5)
  seen = {}

  def local(x_shard, w_rep):
    seen["before"] = (varying.varying_axes(x_shard), varying.varying_axes(w_rep))
    seen["after"] = tuple(varying.varying_axes(a) for a in varying.alike(x_shard, w_rep))
    return jax.lax.psum(_scaled_sum(x_shard, w_rep), "x")

  loss = jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P()), out_specs=P())
  value, (dx, dw) = jax.value_and_grad(loss, argnums=(0, 1))(x, w)
  assert seen["before"] == (frozenset({"x"}), frozenset())
  assert seen["after"] == (frozenset({"x"}), frozenset({"x"}))
  # The unsharded program: sum over shards of sum(x_shard * w).
  want = lambda x, w: jnp.sum(x.reshape(4, 2) * w[None, :])
  want_dx, want_dw = jax.grad(want, argnums=(0, 1))(x, w)
  np.testing.assert_allclose(value, want(x, w))
  np.testing.assert_allclose(dx, want_dx)
  np.testing.assert_allclose(dw, want_dw)       # summed over the 4 shards: [12, 16] * 1
