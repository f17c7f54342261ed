"""Llama-3 decoder in Flax NNX, with the paper's 270M, 600M and 3B presets and tiny shapes.

Calling the model on tokens [B, L] gives logits [B, L, V]. On bags [B, L, S] it superposes them
at the embedding and runs the same network over the L positions.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from tst_jax import platform, schema
from tst_jax.errors import ConfigError
from tst_jax.models import layers
from tst_jax.parallel.logical import constrain

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MISSING = schema.MISSING


def _positive_numbers(v) -> bool:
  return isinstance(v, (tuple, list)) and len(v) == 4 and all(
      schema.number(0, open_lo=True).ok(x) for x in v)


_ROPE_SCALING = schema.Rule(lambda v: v is None or _positive_numbers(v),
                            "None or 4 numbers > 0 (factor, low_freq_factor, "
                            "high_freq_factor, original_len)", tuple)


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """config.model of the llama family. A preset in `PRESETS` gives the sizes."""
  vocab_size: int = schema.field(MISSING, schema.integer(1), "V: tokens of the vocabulary")
  dim: int = schema.field(MISSING, schema.integer(1), "D: model width")
  n_layers: int = schema.field(MISSING, schema.integer(1), "decoder blocks")
  n_heads: int = schema.field(MISSING, schema.integer(1), "H: query heads")
  n_kv_heads: int = schema.field(MISSING, schema.integer(1), "K: key/value heads (GQA)")
  ffw_dim: int = schema.field(MISSING, schema.integer(1), "F: SwiGLU width")
  head_dim: int = schema.field(0, schema.integer(0), "G: per head (0: dim // n_heads)")
  rope_theta: float = schema.field(500_000.0, schema.number(0, open_lo=True), "RoPE base")
  rope_scaling: tuple | None = schema.field(None, _ROPE_SCALING, "Llama-3.1 RoPE scaling "
                                            "(factor, low_freq_factor, high_freq_factor, "
                                            "original_len); None: none")
  norm_eps: float = schema.field(1e-5, schema.number(0, open_lo=True), "RMSNorm epsilon")
  tie_embeddings: bool = schema.field(False, schema.BOOL, "the LM head is the embedding's "
                                      "transpose")
  dtype: str = schema.field("float32", schema.one_of(DTYPES), "compute dtype; parameters stay "
                            "float32")
  attention_impl: str = schema.field("auto", schema.one_of(platform.ATTENTION_IMPLS),
                                     "auto (the platform's measured fastest) | xla | cudnn | "
                                     "splash (TPU)")
  remat: str = schema.field("none", schema.one_of(layers.REMAT_POLICIES), "none | full | "
                            "save_dots | save_experts (save_dots and the MoE experts' outputs)")
  matmul_precision: str = schema.field(
      "default", schema.one_of(layers.MATMUL_PRECISIONS), "the decoder's linear layers: "
      "default (in dtype) | fp8 (qwix; embedding, head, loss, router and experts stay in "
      "dtype)", added="default")
  init_std: float = schema.field(0.02, schema.number(0, open_lo=True), "init normal's std")

  def __post_init__(self):
    schema.check(self, "model")
    if not self.head_dim:
      if self.dim % self.n_heads:
        raise ConfigError("model.dim", f"{self.dim} is not divisible by n_heads "
                          f"{self.n_heads}; set model.head_dim")
      object.__setattr__(self, "head_dim", self.dim // self.n_heads)
    if self.head_dim % 2:
      raise ConfigError("model.head_dim", f"must be even for RoPE, got {self.head_dim}")
    if self.n_heads % self.n_kv_heads:
      raise ConfigError("model.n_heads", f"{self.n_heads} must be a multiple of n_kv_heads "
                        f"{self.n_kv_heads}")
    if self.rope_scaling is not None:
      object.__setattr__(self, "rope_scaling", tuple(self.rope_scaling))

  def attention(self, qk_norm: bool = False) -> layers.AttentionConfig:
    return layers.AttentionConfig(
        dim=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
        head_dim=self.head_dim, rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
        qk_norm=qk_norm, norm_eps=self.norm_eps, attention_impl=self.attention_impl,
        matmul_precision=self.matmul_precision)

  def build(self, rngs: nnx.Rngs) -> Llama:
    """Returns the model of this config, its parameters drawn from `rngs`."""
    return Llama(self, rngs=rngs)

  def param_counts(self) -> tuple[int, int]:
    """Returns (total, active) parameters, equal for a dense model."""
    total = param_count(self)
    return total, total

  def matmul_params(self) -> int:
    """Returns the parameters a token goes through at 2 FLOPs each in the forward pass,
    everything but the embedding lookup and the norms: the 'N' of the 6N rule."""
    d, g = self.dim, self.head_dim
    attn = d * g * (2 * self.n_heads + 2 * self.n_kv_heads)
    mlp = 3 * d * self.ffw_dim
    return self.n_layers * (attn + mlp) + d * self.vocab_size

  def flops_per_token(self, seq_len: int) -> float:
    """Returns training FLOPs per model position: 6N + 12 * layers * heads * head_dim * seq_len,
    the PaLM/Chinchilla formula with forward, backward and attention scores counted in full."""
    attention = 12.0 * self.n_layers * self.n_heads * self.head_dim * seq_len
    return 6.0 * self.matmul_params() + attention


LLAMA3_VOCAB = 128_256
# The paper's section 4: SmolLM2 and SmolLM3 shapes in the Llama-3 code, Llama-3 vocabulary,
# untied.
PRESETS = {
    "tiny": dict(vocab_size=4096, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffw_dim=384,
                 rope_theta=10_000.0),
    "270m": dict(vocab_size=LLAMA3_VOCAB, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                 ffw_dim=1536, rope_theta=100_000.0),     # SmolLM2-135M shape
    "600m": dict(vocab_size=LLAMA3_VOCAB, dim=960, n_layers=32, n_heads=15, n_kv_heads=5,
                 ffw_dim=2560, rope_theta=100_000.0),     # SmolLM2-360M shape
    "3b": dict(vocab_size=LLAMA3_VOCAB, dim=2048, n_layers=36, n_heads=16, n_kv_heads=4,
               ffw_dim=11008, rope_theta=5_000_000.0),    # SmolLM3-3B shape
}


class Llama(nnx.Module):
  """Llama-3: the embedding, superposed for bags, scanned decoder blocks, a norm and the head."""

  def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
    if platform.has_auto(cfg):
      cfg = platform.resolved_model(cfg)   # a model built outside a run is resolved here once
    self.cfg = cfg
    self.dtype = DTYPES[cfg.dtype]
    self.embed = layers.Embedding(cfg.vocab_size, cfg.dim, rngs, std=cfg.init_std)
    self.make_layers(rngs)
    self.final_norm = layers.RMSNorm(cfg.dim, cfg.norm_eps, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = layers.param(rngs, (cfg.dim, cfg.vocab_size), ("embed", "vocab"),
                                  std=cfg.init_std)

  def make_layers(self, rngs: nnx.Rngs):
    """Builds the decoder stack, a hook the MoE overrides to build dense and sparse stages."""
    self.blocks = layers.stacked(self.cfg.n_layers, self.make_block, rngs)

  def run_layers(self, h_BxLxD, positions_BxL, cache=None, documents_BxL=None):
    """Runs the scanned stack of `make_layers`: returns h, aux and the updated KV cache or None."""
    return layers.run_stack(self.blocks, h_BxLxD, positions_BxL, self.cfg.remat, cache=cache,
                            documents_BxL=documents_BxL)

  def make_block(self, rngs: nnx.Rngs) -> layers.Block:
    cfg = self.cfg
    return layers.Block(
        cfg.attention(),
        lambda r: layers.MLP(cfg.dim, cfg.ffw_dim, dtype=self.dtype, rngs=r, std=cfg.init_std,
                             matmul_precision=cfg.matmul_precision),
        dtype=self.dtype, rngs=rngs)

  def forward(self, tokens, documents_BxL=None, positions_BxL=None):
    """Maps tokens [B, L] or bags [B, L, S] to final hidden states [B, L, D] and per-layer aux.

    `documents` [B, L] keeps attention within each document; `positions` default to 0..L-1.
    """
    h_BxLxD, positions_BxL = self.embed_inputs(tokens, positions_BxL)
    h_BxLxD, aux, _ = self.run_layers(h_BxLxD, positions_BxL, documents_BxL=documents_BxL)
    return self.final_norm(h_BxLxD), aux

  def embed_inputs(self, tokens, positions_BxL=None):
    """Returns the embedded tokens [B, L] or superposed bags [B, L, S] as [B, L, D] in the
    compute dtype, and their positions, 0..L-1 unless given."""
    h_BxLxD = constrain(self.embed(tokens).astype(self.dtype), ("batch", "length", "embed"))
    batch, length = h_BxLxD.shape[:2]
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return h_BxLxD, positions_BxL

  def aux_loss(self, aux):
    """Returns the auxiliary training loss and metrics from `forward`'s aux, none for dense."""
    del aux
    return jnp.zeros((), jnp.float32), {}

  def head_kernel(self):
    """Returns the LM head as a [D, V] kernel, the embedding's transpose when tied."""
    if self.cfg.tie_embeddings:
      return self.embed.table[...].T
    return self.lm_head[...]

  def logits(self, h_BxLxD):
    head_DxV = self.head_kernel().astype(self.dtype)
    logits = jnp.einsum("bld,dv->blv", h_BxLxD, head_DxV, preferred_element_type=jnp.float32)
    return constrain(logits, ("batch", "length", "vocab"))

  def __call__(self, tokens, *, return_hidden: bool = False, documents_BxL=None,
               positions_BxL=None):
    h_BxLxD, _ = self.forward(tokens, documents_BxL, positions_BxL)
    return h_BxLxD if return_hidden else self.logits(h_BxLxD)

  def init_cache(self, batch: int, max_len: int) -> layers.KVCache:
    """Returns an empty KV cache for `decode`: keys and values [n_layers, B, max_len, K, G]."""
    return self.empty_cache((self.cfg.n_layers,), batch, max_len)

  def empty_cache(self, layer_dims: tuple, batch: int, max_len: int) -> layers.KVCache:
    shape = (*layer_dims, batch, max_len, self.cfg.n_kv_heads, self.cfg.head_dim)
    return layers.KVCache(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype))

  def decode(self, tokens_BxL, positions_BxL, cache: layers.KVCache):
    """Runs tokens at `positions_BxL` against the cache and themselves, returning logits and cache.

    Positions are consecutive per row. A prompt at positions 0.. fills the cache, then one
    token a step follows.
    """
    h_BxLxD = self.embed(tokens_BxL).astype(self.dtype)
    h_BxLxD, _, cache = self.run_layers(h_BxLxD, positions_BxL, cache)
    return self.logits(self.final_norm(h_BxLxD)), cache


def param_count(cfg: LlamaConfig) -> int:
  """Counts parameters exactly from shapes, allocating nothing and starting no backend."""
  portable = platform.portable(cfg)
  abstract = nnx.eval_shape(lambda: portable.build(nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
