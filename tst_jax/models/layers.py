"""Blocks shared by every model family: embedding, RMSNorm, RoPE, GQA attention, SwiGLU, decoder.

Letters follow the package docstring: B batch, L positions, S bag size, D model dim, H heads,
K kv heads, G head dim, F ffw dim, V vocab, M cached positions. Parameters are float32 and
matmuls run in `dtype`. The linear layers' matmuls, attention q/k/v/o and the SwiGLU MLP, can
run in FP8 instead through `matmul_precision`. Every parameter carries logical axis names for
the mesh rules.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tst_jax.kernels import fp8, splash_attention
from tst_jax.parallel.logical import constrain
from tst_jax.superposition import superpose

REMAT_POLICIES = ("none", "full", "save_dots", "save_experts")
# What remat=save_experts keeps beyond save_dots: each MoE layer's int32 routing and its grouped
# GEMMs' outputs, so that the backward reruns neither the sort nor the GEMMs. save_dots keeps
# none of them, since ragged_dot is no dot_general and blocked's einsum has a batch dimension.
# The dispatched rows are gathered again instead, as much memory traffic as keeping them and no
# memory.
EXPERT_SAVES = ("moe_routing", "moe_gate", "moe_up", "moe_out")
MATMUL_PRECISIONS = ("default", "fp8")   # linear layers: `dtype` or FP8 via qwix


def param(rngs: nnx.Rngs, shape, names, *, std=None, init=None, dtype=jnp.float32):
  """Creates a parameter with logical axis names, truncated-normal(std) or constant."""
  if init is not None:
    value = jnp.full(shape, init, dtype)
  else:
    value = std * jax.random.truncated_normal(rngs.params(), -3.0, 3.0, shape, dtype)
  return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  rope_theta: float = 500_000.0
  rope_scaling: tuple | None = None  # Llama-3.1: factor, low_freq, high_freq, original_len
  qk_norm: bool = False              # Qwen3: RMSNorm on every head's q and k
  norm_eps: float = 1e-5
  attention_impl: str = "xla"        # xla | cudnn | splash: the model config's, resolved
  matmul_precision: str = "default"  # q/k/v/o projections: default in dtype, or fp8


def linear(subscripts: str, x, w, precision: str = "default"):
  """Runs a linear layer's `jnp.einsum(subscripts, x, w)` as is, or through `kernels.fp8`."""
  if precision == "fp8":
    return fp8.einsum(subscripts, x, w)
  return jnp.einsum(subscripts, x, w)


class KVCache(NamedTuple):
  """Keys and values of the positions seen so far, [B, M, K, G] per layer.

  A model's cache stacks them over layers, [n_layers, B, M, K, G], and is scanned with them.
  """
  k: jax.Array
  v: jax.Array


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, rngs: nnx.Rngs, names=("norm",)):
    self.eps = eps
    self.scale = param(rngs, (dim,), names, init=1.0)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = self.scale[...].reshape((1,) * (x.ndim - 1) + (-1,))
    return (y * scale).astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling=None) -> np.ndarray:
  """Returns inverse frequencies [G/2], with Llama-3.1 frequency scaling if given."""
  inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if scaling is None:
    return inv.astype(np.float32)
  factor, low_freq_factor, high_freq_factor, original_len = scaling
  wavelen = 2 * math.pi / inv
  low_wavelen, high_wavelen = original_len / low_freq_factor, original_len / high_freq_factor
  smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
  mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
  scaled = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
  return scaled.astype(np.float32)


def apply_rope(x_BxLxHxG, positions_BxL, inv_freq):
  """Applies the rotary embedding in Hugging Face's rotate-half layout."""
  angles = positions_BxL[..., None].astype(jnp.float32) * inv_freq[None, None, :]  # [B, L, G/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x_BxLxHxG.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxG.dtype)


class Attention(nnx.Module):
  """Grouped-query causal self-attention through jax.nn.dot_product_attention."""

  def __init__(self, cfg: AttentionConfig, *, dtype, rngs: nnx.Rngs, std: float = 0.02):
    d, h, k, g = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    if h % k:
      raise ValueError(f"n_heads {h} must be a multiple of n_kv_heads {k}")
    self.cfg, self.dtype = cfg, dtype
    self.q_proj = param(rngs, (d, h, g), ("embed", "heads", "head_dim"), std=std)
    self.k_proj = param(rngs, (d, k, g), ("embed", "kv_heads", "head_dim"), std=std)
    self.v_proj = param(rngs, (d, k, g), ("embed", "kv_heads", "head_dim"), std=std)
    self.o_proj = param(rngs, (h, g, d), ("heads", "head_dim", "embed"), std=std)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(g, cfg.norm_eps, rngs, names=("head_dim",))
      self.k_norm = RMSNorm(g, cfg.norm_eps, rngs, names=("head_dim",))

  def __call__(self, x_BxLxD, positions_BxL, cache: KVCache | None = None, documents_BxL=None):
    """Attends causally over x and returns the output and the updated cache.

    With `documents` [B, L], a position attends only to the positions of its own document.
    With a `cache`, x's keys and values are written into it at `positions`, consecutive per
    row, and x attends to every cached position up to its own. Without one the cache is None.
    """
    dt, mp = self.dtype, self.cfg.matmul_precision
    q, k, v = self.project(x_BxLxD, positions_BxL)
    q = constrain(q, ("batch", "length", "heads", "head_dim"))
    if cache is None:
      impl = self.cfg.attention_impl      # resolved with the model's config, never `auto`
      with jax.named_scope("attention"):   # the step profile's category
        if impl == "splash":               # Pallas TPU kernels keep no [L, L] scores
          out_BxLxHxG = splash_attention.causal_attention(q, k, v, documents_BxL=documents_BxL)
        else:
          mask = None if documents_BxL is None else (
              documents_BxL[:, None, :, None] == documents_BxL[:, None, None, :])  # [B,1,L,L]
          out_BxLxHxG = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                                     implementation=impl)
      return linear("blhg,hgd->bld", out_BxLxHxG, self.o_proj[...].astype(dt), mp), None
    write = jax.vmap(lambda c, new, start: jax.lax.dynamic_update_slice(c, new, (start, 0, 0)))
    start_B = positions_BxL[:, 0]
    cache = KVCache(write(cache.k, k.astype(cache.k.dtype), start_B),
                    write(cache.v, v.astype(cache.v.dtype), start_B))
    cached_M = jnp.arange(cache.k.shape[1], dtype=positions_BxL.dtype)
    mask_BxLxM = cached_M[None, None, :] <= positions_BxL[:, :, None]
    out_BxLxHxG = jax.nn.dot_product_attention(
        q, cache.k.astype(dt), cache.v.astype(dt), mask=mask_BxLxM[:, None])
    return linear("blhg,hgd->bld", out_BxLxHxG, self.o_proj[...].astype(dt), mp), cache


  def project(self, x_BxLxD, positions_BxL):
    """Returns the queries [B, L, H, G], keys and values [B, L, K, G] of x, the queries and
    keys normalised (qk_norm) and rotated to their positions."""
    dt, mp = self.dtype, self.cfg.matmul_precision
    q = linear("bld,dhg->blhg", x_BxLxD, self.q_proj[...].astype(dt), mp)
    k = linear("bld,dkg->blkg", x_BxLxD, self.k_proj[...].astype(dt), mp)
    v = linear("bld,dkg->blkg", x_BxLxD, self.v_proj[...].astype(dt), mp)
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    inv_freq = rope_inv_freq(self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling)
    return apply_rope(q, positions_BxL, inv_freq), apply_rope(k, positions_BxL, inv_freq), v


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

  def __init__(self, dim: int, ffw_dim: int, *, dtype, rngs: nnx.Rngs, std: float = 0.02,
               matmul_precision: str = "default"):
    self.dtype, self.matmul_precision = dtype, matmul_precision
    self.gate_proj = param(rngs, (dim, ffw_dim), ("embed", "mlp"), std=std)
    self.up_proj = param(rngs, (dim, ffw_dim), ("embed", "mlp"), std=std)
    self.down_proj = param(rngs, (ffw_dim, dim), ("mlp", "embed"), std=std)

  def __call__(self, x_BxLxD):
    dt, mp = self.dtype, self.matmul_precision
    gate = linear("bld,df->blf", x_BxLxD, self.gate_proj[...].astype(dt), mp)
    up = linear("bld,df->blf", x_BxLxD, self.up_proj[...].astype(dt), mp)
    h_BxLxF = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
    return linear("blf,fd->bld", h_BxLxF, self.down_proj[...].astype(dt), mp)


class Block(nnx.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then x + ffw(norm(x))."""

  def __init__(self, attn_cfg: AttentionConfig, make_ffw: Callable[[nnx.Rngs], nnx.Module],
               *, dtype, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(attn_cfg.dim, attn_cfg.norm_eps, rngs)
    self.attn = Attention(attn_cfg, dtype=dtype, rngs=rngs)
    self.post_attn_norm = RMSNorm(attn_cfg.dim, attn_cfg.norm_eps, rngs)
    self.ffw = make_ffw(rngs)

  def __call__(self, x_BxLxD, positions_BxL, cache: KVCache | None = None, documents_BxL=None):
    """Returns the output, aux and the updated KV cache, None when none is given."""
    attn, cache = self.attn(self.input_norm(x_BxLxD), positions_BxL, cache, documents_BxL)
    x_BxLxD = x_BxLxD + attn
    out = self.ffw(self.post_attn_norm(x_BxLxD))
    aux = {}
    if isinstance(out, tuple):   # MoE layers also return auxiliary losses and statistics
      out, aux = out
    out = constrain(x_BxLxD + out, ("batch", "length", "embed"))
    return out, aux, cache


def stacked(n: int, make_block: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs):
  """Builds `n` blocks with parameters stacked on a leading 'layers' axis for `run_stack`."""
  @nnx.split_rngs(splits=n)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(r):
    return make_block(r)
  return make(rngs)


def rematted(fn, policy: str):
  """Returns `fn` under the model.remat `policy`: what the backward pass recomputes."""
  if policy == "none":
    return fn
  if policy == "full":
    return jax.checkpoint(fn)
  dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  if policy == "save_dots":
    return jax.checkpoint(fn, policy=dots)
  if policy == "save_experts":
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.save_from_both_policies(
        dots, jax.checkpoint_policies.save_only_these_names(*EXPERT_SAVES)))
  raise ValueError(f"model.remat must be one of {REMAT_POLICIES}, got {policy!r}")


def run_stack(blocks, x_BxLxD, positions_BxL, remat: str = "none",
              cache: KVCache | None = None, documents_BxL=None):
  """Applies stacked blocks with lax.scan, so compile time stays flat in depth.

  `documents` [B, L], where given, keeps each position's attention to its own document.
  Returns the output, the per-layer auxiliary outputs stacked on axis 0, and the updated stacked
  KV cache, scanned with the layers' parameters and None when none is given.
  """
  graphdef, state = nnx.split(blocks)

  if cache is None:
    def body(h, layer_state):
      h, aux, _ = nnx.merge(graphdef, layer_state)(h, positions_BxL,
                                                   documents_BxL=documents_BxL)
      return h, aux
    h, aux = jax.lax.scan(rematted(body, remat), x_BxLxD, state)
    return h, aux, None

  def cached_body(h, layer):
    layer_state, layer_cache = layer
    h, aux, layer_cache = nnx.merge(graphdef, layer_state)(h, positions_BxL, layer_cache)
    return h, (aux, layer_cache)
  h, (aux, cache) = jax.lax.scan(cached_body, x_BxLxD, (state, cache))
  return h, aux, cache


def run_stack_to_last(blocks, x_BxLxD, positions_BxL, remat: str = "none", documents_BxL=None):
  """Applies stacked blocks as `run_stack` does, without a cache, and also returns the last
  block's input: (output, the input of the last block, the per-layer aux). The scan carries
  each block's input beside its output, so no block's parameters are sliced or copied."""
  graphdef, state = nnx.split(blocks)

  def body(carry, layer_state):
    h, _ = carry
    out, aux, _ = nnx.merge(graphdef, layer_state)(h, positions_BxL, documents_BxL=documents_BxL)
    return (out, h), aux
  (h, last_input), aux = jax.lax.scan(rematted(body, remat), (x_BxLxD, x_BxLxD), state)
  return h, last_input, aux


class Embedding(nnx.Module):
  """Token embedding table [V, D]. Bags [B, L, S] are superposed as a mean summed in float32."""

  def __init__(self, vocab_size: int, dim: int, rngs: nnx.Rngs, std: float = 0.02):
    self.table = param(rngs, (vocab_size, dim), ("vocab", "embed"), std=std)

  @jax.named_scope("embed")   # the step profile's category
  def __call__(self, tokens):
    table = self.table[...]
    if tokens.ndim == 3:
      return superpose(table, tokens)
    return jnp.take(table, tokens, axis=0)
