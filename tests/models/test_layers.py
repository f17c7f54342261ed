"""Layers: `linear` is the float32 einsum bit for bit by default and the exact product up to
float8 rounding with fp8; the KV cache decodes as the full forward pass does, for a Llama and
for a Qwen3-MoE with two scanned stages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.fp8 import E4M3, LINEARS, needs_qwix, rounding, x_for
from tst_jax.models import layers
from tst_jax.models.llama import Llama, LlamaConfig


@needs_qwix
@pytest.mark.parametrize("spec,w_shape", LINEARS)
def test_fp8_is_the_exact_product_up_to_float8_rounding_and_not_equal_to_it(spec, w_shape):
  """|fp8 - exact| <= (|x| + ex) @ (|w| + ew) - |x| @ |w| with ex, ew the e4m3 rounding
  bounds (~2^-4 relative): e4m3 precision propagated through the sum. And fp8 is applied:
  the result is not the float32 einsum, which `linear(..., "default")` is bit for bit."""
  rng = np.random.default_rng(1)
  x = x_for(spec, w_shape, rng)
  w = (0.1 * rng.normal(size=w_shape)).astype(np.float32)
  exact = np.einsum(spec, x.astype(np.float64), w)
  ax, aw = np.abs(x).astype(np.float64), np.abs(w).astype(np.float64)
  bound = np.einsum(spec, ax + rounding(x, E4M3), aw + rounding(w, E4M3)) - np.einsum(
      spec, ax, aw)
  out = np.asarray(layers.linear(spec, jnp.asarray(x), jnp.asarray(w), "fp8"))
  np.testing.assert_array_less(np.abs(out - exact), bound * (1 + 1e-5))
  default = layers.linear(spec, jnp.asarray(x), jnp.asarray(w), "default")
  np.testing.assert_array_equal(default, jnp.einsum(spec, jnp.asarray(x), jnp.asarray(w)))
  assert np.abs(out - default).max() > 1e-3 * np.abs(default).max()


def _moe():
  from tst_jax.models.moe import MoEConfig, Qwen3MoE
  cfg = MoEConfig(vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffw_dim=48,
                  n_experts=4, n_experts_per_token=2, moe_ffw_dim=16, mlp_only_layers=(0,))
  return Qwen3MoE(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_cached_decode_logits_equal_the_full_forward(family):
  """A prompt pass, then one token a step; GQA (4 heads sharing 2 KV heads). The MoE has a
  dense first layer then sparse ones (two scanned stages, one cache each)."""
  if family == "llama":
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffw_dim=48)
    model = Llama(cfg, rngs=nnx.Rngs(0))
  else:
    model = _moe()
  tokens_BxL = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
  full_BxLxV = nnx.jit(lambda m, t: m(t))(model, tokens_BxL)
  decode = nnx.jit(lambda m, t, p, c: m.decode(t, p, c))
  cache = model.init_cache(2, 16)
  logits, cache = decode(model, tokens_BxL[:, :5], jnp.broadcast_to(jnp.arange(5), (2, 5)), cache)
  np.testing.assert_allclose(logits, full_BxLxV[:, :5], atol=1e-5)
  for t in range(5, 9):
    logits, cache = decode(model, tokens_BxL[:, t:t + 1], jnp.full((2, 1), t), cache)
    np.testing.assert_allclose(logits[:, 0], full_BxLxV[:, t], atol=1e-5)
