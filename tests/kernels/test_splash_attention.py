"""model.attention_impl=splash: JAX's Pallas splash-attention kernels (TPU). On CPU they run
interpreted against XLA attention (values and gradients, grouped-query heads), and the
model's train step lowers for TPU from this CPU host; elsewhere the config is refused."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import platform
from tst_jax.errors import ConfigError
from tst_jax.kernels import splash_attention
from tst_jax.config import spec as spec_lib
from tst_jax.configlib import load_config
from tst_jax.parallel.logical import axis_rules
from tst_jax.train import step as step_lib


@pytest.mark.parametrize("length,heads,kv_heads", [(128, 4, 2), (256, 2, 1)])
def test_interpreted_kernels_match_xla_attention(length, heads, kv_heads):
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (2, length, heads, 64))
  k, v = (jax.random.normal(kk, (2, length, kv_heads, 64)) for kk in keys[1:3])
  cotangent = jax.random.normal(keys[3], q.shape)

  def loss(attend, q, k, v):
    return jnp.sum(attend(q, k, v) * cotangent)

  xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)
  splash = lambda q, k, v: splash_attention.causal_attention(q, k, v, interpret=True)
  np.testing.assert_allclose(jax.jit(splash)(q, k, v), xla(q, k, v), atol=2e-5, rtol=1e-4)
  got = jax.jit(jax.grad(lambda *a: loss(splash, *a), argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(lambda *a: loss(xla, *a), argnums=(0, 1, 2))(q, k, v)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("axes", [(("batch", ("data",)), ("heads", ("tensor",)),
                                   ("kv_heads", ("tensor",))),
                                  (("batch", ("data",)), ("heads", ("tensor",)))])
def test_under_a_mesh_the_kernels_run_per_shard_as_on_one_device(axes):
  """Rows over 'data' 4, heads over 'tensor' 2: each device attends its rows' whole groups of
  query heads with their kv head, and the result, values and gradients with documents, is the
  one device's. Where kv heads are not split as query heads are, heads stay whole."""
  length, heads, kv_heads = 128, 4, 2
  keys = jax.random.split(jax.random.key(2), 4)
  q = jax.random.normal(keys[0], (4, length, heads, 64))
  k, v = (jax.random.normal(kk, (4, length, kv_heads, 64)) for kk in keys[1:3])
  docs = jnp.asarray(np.repeat(np.arange(4)[:, None] % 2, length, axis=1) *
                     (np.arange(length)[None] >= 50))
  cotangent = jax.random.normal(keys[3], q.shape)
  def both(splash):   # fresh functions each call: jit's cache does not key on axis_rules
    loss = lambda *a: jnp.sum(splash(*a) * cotangent)
    return (jax.jit(splash)(q, k, v), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v),
            jax.jit(splash).lower(q, k, v).as_text())

  attend = lambda: lambda q, k, v: splash_attention.causal_attention(
      q, k, v, interpret=True, documents_BxL=docs)
  want = both(attend())
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("data", "tensor"))
  with axis_rules(mesh, axes):
    got = both(attend())
  text = got[2]
  assert not re.search(r"sdy.manual_computation|SPMDFullToShardShape", want[2])
  assert re.search(r"sdy.manual_computation|SPMDFullToShardShape", text)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-5)
  for g, w in zip(got[1], want[1]):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_a_mesh_that_splits_the_sequence_is_refused():
  q = jnp.zeros((2, 128, 2, 64))
  k = jnp.zeros((2, 128, 1, 64))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("data",))
  with axis_rules(mesh, (("length", ("data",)),)), pytest.raises(
      ValueError, match="splits the sequence or the head dim"):
    splash_attention.causal_attention(q, k, k, interpret=True)


def test_interpreted_kernels_keep_each_document_to_itself():
  """With documents (data.document_mask), the kernels' segment ids give what XLA attention
  gives with the same-document mask, values and gradients; and not what it gives without."""
  length, heads, kv_heads = 128, 4, 2
  keys = jax.random.split(jax.random.key(1), 4)
  q = jax.random.normal(keys[0], (2, length, heads, 64))
  k, v = (jax.random.normal(kk, (2, length, kv_heads, 64)) for kk in keys[1:3])
  ends = np.zeros((2, length), np.int32)
  ends[0, [30, 31, 90]] = 1
  ends[1, [5, 100]] = 1
  docs = jnp.asarray(np.cumsum(ends, axis=1) - ends)   # an EOS ends its document
  mask = docs[:, None, :, None] == docs[:, None, None, :]
  xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)
  splash = lambda q, k, v: splash_attention.causal_attention(q, k, v, interpret=True,
                                                              documents_BxL=docs)
  cotangent = jax.random.normal(keys[3], q.shape)
  loss = lambda attend: lambda *a: jnp.sum(attend(*a) * cotangent)
  np.testing.assert_allclose(jax.jit(splash)(q, k, v), xla(q, k, v), atol=2e-5, rtol=1e-4)
  got = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)
  for g, w in zip(got, jax.grad(loss(xla), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
  plain = jax.nn.dot_product_attention(q, k, v, is_causal=True)
  assert float(jnp.abs(jax.jit(splash)(q, k, v) - plain).max()) > 1e-2


def test_the_train_step_lowers_for_tpu_from_this_host():
  """Both phases' steps of a tiny Llama with attention_impl=splash, lowered (not compiled)
  for TPU: the attention becomes Mosaic TPU custom calls."""
  config = tiny_config(data=dict(seq_len=128), model=dict(attention_impl="splash"))
  spec = spec_lib.check(config)
  graphdef, _ = step_lib.abstract_model(spec.model)
  tx = optax.adamw(1e-3)
  state = jax.eval_shape(step_lib.init_fn(spec.model, tx), jax.random.key(0))
  for phase in spec.plan.phases:
    train_step = jax.jit(step_lib.make_train_step(graphdef, phase, spec.loss, tx,
                                                  optax.constant_schedule(1e-3)))
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32)
    text = train_step.trace(state, window).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") >= 3, phase.name    # forward, dq, dkv


def test_splash_is_refused_off_tpu():
  config = tiny_config(data=dict(seq_len=128), model=dict(attention_impl="splash"))
  with pytest.raises(ConfigError, match="model.attention_impl: 'splash': splash attention runs "
                     "Pallas TPU kernels, this is cpu") as e:
    spec_lib.build(config, num_devices=1)
  assert e.value.field == "model.attention_impl"
  assert "multiple of 128, got [100]" in platform.splash_unavailable([128, 100], "tpu")
  assert platform.splash_unavailable([512, 128], "tpu") is None


@pytest.mark.parametrize("lengths, documents, impl, reason", [
    ([2048], False, "splash", "for L 2048 >= 1024"),
    ([256, 256], True, "splash", "for a document mask"),
    ([256], False, "xla", "L 256 < 1024 and no document mask"),
    ([1000], True, "xla", "splash attention needs L a multiple of 128, got [1000]"),
    ((), False, "xla", "the sequence lengths are unknown"),
])
def test_auto_on_tpu_is_splash_where_the_scores_are_the_cost(lengths, documents, impl, reason):
  """Each choice says why, and that no TPU measured it."""
  got, why = platform.attention_impl("auto", "bfloat16", 128, "tpu", lengths, documents)
  assert got == impl and reason in why and "not measured on a TPU" in why


def test_a_plan_for_a_v5p_resolves_splash_for_the_paper_configs_2048_positions():
  spec = spec_lib.check(load_config(os.path.join(ROOT, "configs", "llama_3b.py")))
  on_tpu = spec.on_platform("tpu")
  assert on_tpu.model.attention_impl == "splash"
  assert "L 2048 >= 1024" in on_tpu.resolved.choices["model.attention_impl"][1]
