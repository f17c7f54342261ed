"""Qwen3-style Mixture-of-Experts decoder, the paper's 10B-A1B, on the shared Llama blocks.

Letters follow the package docstring: N tokens with B·L flattened, E experts, P experts per
token, A = N·P assignments, R assignment rows padded to whole blocks of C, D model dim, F expert
ffw dim, I and O a matmul's input and output dims. Attention, norms, RoPE and the decoder block
come from `layers`. Only the feed-forward differs: a float32 softmax router picks P of E SwiGLU
experts per token, and the experts run dropless as one grouped matmul over the assignments
sorted by expert, or with a capacity: each expert's first C as a batched matmul, the rest
grouped. As in Qwen3-30B-A3B there is no shared expert, attention has QK-norm and the
head is untied.

Dense and sparse layers follow Hugging Face's `mlp_only_layers` and `decoder_sparse_step`.
The stack stays scanned whatever the pattern. `stage_units` splits it into a few stages, each a
unit of consecutive layers such as [dense], [sparse] or [dense, sparse], repeated `r` times and
scanned over `r`. First-k-dense gives 2 stages, every-n-th-sparse gives 1.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tst_jax import platform, schema
from tst_jax.kernels import moe_dispatch
from tst_jax.errors import ConfigError
from tst_jax.models import experts, layers, llama

_LAYERS = schema.Rule(lambda v: isinstance(v, (tuple, list)) and all(
    isinstance(i, int) and not isinstance(i, bool) for i in v), "a tuple of layer indices", tuple)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig(llama.LlamaConfig):
  """config.model of the qwen3_moe family: LlamaConfig plus experts, `ffw_dim` for dense layers."""
  n_experts: int = schema.field(llama.MISSING, schema.integer(1), "E: experts per MoE layer")
  n_experts_per_token: int = schema.field(llama.MISSING, schema.integer(1), "P: the top-k "
                                          "(<= n_experts)")
  moe_ffw_dim: int = schema.field(llama.MISSING, schema.integer(1), "F of every expert")
  norm_topk_prob: bool = schema.field(True, schema.BOOL, "renormalise the P router weights to "
                                      "sum to 1")
  aux_loss_coef: float = schema.field(0.001, schema.number(0), "load-balancing loss weight "
                                      "(HF router_aux_loss_coef)")
  router_z_loss_coef: float = schema.field(0.0, schema.number(0), "weight of "
                                           "mean(logsumexp(router logits)^2)")
  mlp_only_layers: tuple = schema.field((), _LAYERS, "layer indices with a dense MLP (HF "
                                        "semantics)")
  decoder_sparse_step: int = schema.field(1, schema.integer(1), "layer i is sparse iff "
                                          "(i + 1) % step == 0 (and not mlp_only)")
  expert_impl: str = schema.field("auto", schema.one_of(platform.EXPERT_IMPLS), "ragged | gmm "
                                  "(grouped GEMMs both ways, tokamax on GPU) | capacity (each "
                                  "expert's first C rows as batched matmuls, the rest as gmm) | "
                                  "blocked | dense (reference) | auto (the platform's measured "
                                  "fastest)")
  dispatch_impl: str = schema.field("auto", schema.one_of(platform.DISPATCH_IMPLS), "how "
                                    "dispatch and combine move rows: " + " | ".join(
                                        moe_dispatch.IMPLS) + " (kernels/moe_dispatch.py) | "
                                    "auto (the platform's measured fastest)")
  expert_fuse_gate_up: str = schema.field("auto", schema.one_of(platform.FUSE_GATE_UP), "on: "
                                          "the experts' gate and up as one grouped GEMM "
                                          "against their weights side by side (expert_impl "
                                          "gmm, ragged or capacity), the rows read once | off "
                                          "| auto (on where a train step measured it faster)")
  expert_capacity_factor: float = schema.field(1.25, schema.number(0, open_lo=True), "cf of "
                                               "expert_impl=capacity: C = roundup(cf·N·P/E, "
                                               "128) rows per expert run as batched matmuls, "
                                               "the rows past C as grouped GEMMs")

  def __post_init__(self):
    if isinstance(self.expert_fuse_gate_up, bool):   # the field's spelling in the config.json
      object.__setattr__(self, "expert_fuse_gate_up",  # of runs from before it took auto
                         "on" if self.expert_fuse_gate_up else "off")
    super().__post_init__()
    object.__setattr__(self, "mlp_only_layers", tuple(sorted(set(self.mlp_only_layers))))
    if self.n_experts_per_token > self.n_experts:
      raise ConfigError("model.n_experts_per_token", f"must be in [1, {self.n_experts}], "
                        f"got {self.n_experts_per_token}")
    if any(not 0 <= i < self.n_layers for i in self.mlp_only_layers):
      raise ConfigError("model.mlp_only_layers", f"{self.mlp_only_layers} out of range "
                        f"[0, {self.n_layers})")

  def sparse_layers(self) -> tuple[bool, ...]:
    """Returns which layers are MoE, by Hugging Face Qwen3-MoE's rule."""
    return tuple(i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
                 for i in range(self.n_layers))

  def build(self, rngs: nnx.Rngs) -> Qwen3MoE:
    """Returns the model of this config, its parameters drawn from `rngs`."""
    return Qwen3MoE(self, rngs=rngs)

  def param_counts(self) -> tuple[int, int]:
    """Returns (total, active) parameters from shapes only. Active leaves out the E - P unused
    experts of each sparse layer and counts everything else in full."""
    total = llama.param_count(self)
    unused = sum(self.sparse_layers()) * (self.n_experts - self.n_experts_per_token)
    return total, total - unused * 3 * self.dim * self.moe_ffw_dim

  def matmul_params(self) -> int:
    """Returns the matmul parameters a token goes through, the 'N' of the 6N rule for MoE:
    attention, dense MLPs, routers, P experts per sparse layer and the head."""
    d, g = self.dim, self.head_dim
    n_sparse = sum(self.sparse_layers())
    attn = d * g * (2 * self.n_heads + 2 * self.n_kv_heads)
    dense_mlp = 3 * d * self.ffw_dim
    sparse_mlp = d * self.n_experts + self.n_experts_per_token * 3 * d * self.moe_ffw_dim
    return (self.n_layers * attn + (self.n_layers - n_sparse) * dense_mlp
            + n_sparse * sparse_mlp + d * self.vocab_size)


# Qwen3 conventions: rope_theta 1e6, RMSNorm eps 1e-6, head_dim 128 at scale, QK-norm.
PRESETS = {
    "tiny_moe": dict(vocab_size=4096, dim=128, n_layers=4, n_heads=4, n_kv_heads=2,
                     ffw_dim=384, n_experts=8, n_experts_per_token=2, moe_ffw_dim=128,
                     rope_theta=10_000.0, norm_eps=1e-6),
    # 10B total and 1B active: Qwen3-30B-A3B at half width, D 1024 with 16 heads of 128 and 4 KV
    # heads, keeping its 128 experts, top-8 and expert width 768 in all 32 layers.
    "10b_a1b": dict(vocab_size=llama.LLAMA3_VOCAB, dim=1024, n_layers=32, n_heads=16,
                    n_kv_heads=4, head_dim=128, ffw_dim=6144, n_experts=128,
                    n_experts_per_token=8, moe_ffw_dim=768, rope_theta=1_000_000.0,
                    norm_eps=1e-6),
}


def stage_units(sparse: tuple[bool, ...]) -> tuple[tuple[tuple[bool, ...], int], ...]:
  """Splits a layer pattern into (unit, repeats) pairs, greedily the unit covering most layers.

  With d dense and s sparse, [d, s, s, s] gives ((d,), 1), ((s,), 3), and [d, s, d, s] gives
  ((d, s), 2).
  """
  units, i, n = [], 0, len(sparse)
  while i < n:
    best = (1, 1)                                    # unit length, repeats
    for u in range(1, (n - i) // 2 + 1):
      r = 1
      while sparse[i + r * u: i + (r + 1) * u] == sparse[i: i + u]:
        r += 1
      if r >= 2 and r * u > best[0] * best[1]:
        best = (u, r)
    u, r = best
    units.append((tuple(sparse[i: i + u]), r))
    i += u * r
  return tuple(units)


def _route(x_NxD, router_DxE, k: int, norm_topk_prob: bool):
  """Routes in float32: returns logits and probs [N, E], top-k weights and ids [N, P]."""
  logits_NxE = jnp.dot(x_NxD.astype(jnp.float32), router_DxE)
  probs_NxE = jax.nn.softmax(logits_NxE, axis=-1)
  weights_NxP, ids_NxP = jax.lax.top_k(probs_NxE, k)
  if norm_topk_prob:
    weights_NxP = weights_NxP / jnp.sum(weights_NxP, axis=-1, keepdims=True)
  return logits_NxE, probs_NxE, weights_NxP, ids_NxP


def route(x_NxD, router_DxE, cfg: MoEConfig):
  """Routes tokens: returns the top-k weights and ids [N, P] and the layer's statistics.

  Switch and HF Qwen3-MoE load balancing: frac_E counts top-k assignments per token and sums
  to P, prob_E is the mean router probability, and balanced routing gives lb_loss = P.
  """
  logits_NxE, probs_NxE, weights_NxP, ids_NxP = _route(
      x_NxD, router_DxE, cfg.n_experts_per_token, cfg.norm_topk_prob)
  n = x_NxD.shape[0]
  frac_E = jnp.bincount(ids_NxP.reshape(-1), length=cfg.n_experts).astype(jnp.float32) / n
  prob_E = jnp.mean(probs_NxE, axis=0)
  aux = {
      "lb_loss": cfg.n_experts * jnp.sum(frac_E * prob_E),
      "z_loss": jnp.mean(jnp.square(jax.nn.logsumexp(logits_NxE, axis=-1))),
      "expert_frac": frac_E,
      "router_prob": prob_E,
  }
  return weights_NxP, ids_NxP, aux


class SparseMoE(nnx.Module):
  """Routes each token to P of E SwiGLU experts, returning the output and per-layer statistics."""

  def __init__(self, cfg: MoEConfig, *, dtype, rngs: nnx.Rngs):
    d, e, f, std = cfg.dim, cfg.n_experts, cfg.moe_ffw_dim, cfg.init_std
    if cfg.dispatch_impl == "auto":   # a layer built alone; a model resolves its config first
      cfg = dataclasses.replace(cfg, dispatch_impl=platform.dispatch_impl("auto")[0])
    if cfg.expert_fuse_gate_up == "auto":
      cfg = dataclasses.replace(cfg, expert_fuse_gate_up=platform.fuse_gate_up(
          "auto", cfg.expert_impl)[0])
    self.cfg, self.dtype = cfg, dtype
    # The router stays replicated over experts: it is tiny and top-k needs every logit.
    self.router = layers.param(rngs, (d, e), ("embed", None), std=std)
    self.gate_proj = layers.param(rngs, (e, d, f), ("expert", "embed", "mlp"), std=std)
    self.up_proj = layers.param(rngs, (e, d, f), ("expert", "embed", "mlp"), std=std)
    self.down_proj = layers.param(rngs, (e, f, d), ("expert", "mlp", "embed"), std=std)

  def __call__(self, x_BxLxD):
    cfg, dt = self.cfg, self.dtype
    b, length, d = x_BxLxD.shape
    x_NxD = x_BxLxD.reshape(b * length, d)
    weights_NxP, ids_NxP, aux = route(x_NxD, self.router[...], cfg)
    if cfg.expert_impl == "capacity":
      aux["overflow"] = experts.capacity_overflow(ids_NxP, cfg.n_experts,
                                                  cfg.expert_capacity_factor)
    run_experts = experts.expert_fn(cfg.expert_impl, cfg.dispatch_impl, cfg.expert_fuse_gate_up,
                        cfg.expert_capacity_factor)
    out_NxD = experts.experts_sharded(run_experts, x_NxD, ids_NxP,
                              weights_NxP, self.gate_proj[...].astype(dt),
                              self.up_proj[...].astype(dt), self.down_proj[...].astype(dt))
    return out_NxD.astype(x_BxLxD.dtype).reshape(b, length, d), aux


class Period(nnx.Module):
  """One repeat of a stage's unit: its decoder blocks in order, dense or sparse each."""

  def __init__(self, cfg: MoEConfig, unit: tuple[bool, ...], *, dtype, rngs: nnx.Rngs):
    def make_ffw(sparse):
      if sparse:
        return lambda r: SparseMoE(cfg, dtype=dtype, rngs=r)
      return lambda r: layers.MLP(cfg.dim, cfg.ffw_dim, dtype=dtype, rngs=r, std=cfg.init_std,
                                  matmul_precision=cfg.matmul_precision)
    self.blocks = nnx.List([
        layers.Block(cfg.attention(qk_norm=True), make_ffw(sparse), dtype=dtype, rngs=rngs)
        for sparse in unit])

  def __call__(self, x_BxLxD, positions_BxL, cache: layers.KVCache | None = None,
               documents_BxL=None):
    """Returns the output, the aux of the unit's sparse blocks and the updated caches or None."""
    auxes, caches = [], []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else layers.KVCache(cache.k[i], cache.v[i])
      x_BxLxD, aux, layer_cache = block(x_BxLxD, positions_BxL, layer_cache, documents_BxL)
      caches.append(layer_cache)
      if aux:
        auxes.append(aux)
    aux = jax.tree.map(lambda *a: jnp.stack(a), *auxes) if auxes else {}  # over sparse blocks
    if cache is None:
      return x_BxLxD, aux, None
    return x_BxLxD, aux, jax.tree.map(lambda *a: jnp.stack(a), *caches)


class Qwen3MoE(llama.Llama):
  """Qwen3-MoE: the embedding, scanned stages of blocks, a norm and the head.

  Shares Llama's embedding, head, `logits` and `__call__`. `forward` returns the MoE statistics
  of every sparse layer, in layer order, stacked on axis 0.
  """

  def make_layers(self, rngs: nnx.Rngs):
    cfg = self.cfg
    self.units = stage_units(cfg.sparse_layers())
    self.stages = nnx.List([
        layers.stacked(repeats, lambda r, u=unit: Period(cfg, u, dtype=self.dtype, rngs=r), rngs)
        for unit, repeats in self.units])

  def make_block(self, rngs: nnx.Rngs) -> layers.Block:
    """Returns a dense Qwen3 block, QK-norm and the dense MLP: what an MTP module runs."""
    return Period(self.cfg, (False,), dtype=self.dtype, rngs=rngs).blocks[0]

  def run_layers(self, h_BxLxD, positions_BxL, cache=None, documents_BxL=None):
    """Returns h, the aux of every sparse layer in layer order, and the updated caches.

    There is one cache per stage, [repeats, unit, B, M, K, G], or None without a cache.
    """
    auxes, caches = [], []
    for i, stage in enumerate(self.stages):
      h_BxLxD, aux, stage_cache = layers.run_stack(
          stage, h_BxLxD, positions_BxL, self.cfg.remat, cache=None if cache is None else cache[i],
          documents_BxL=documents_BxL)
      caches.append(stage_cache)
      if aux:   # repeats x sparse blocks -> layers
        auxes.append(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), aux))
    aux = jax.tree.map(lambda *a: jnp.concatenate(a), *auxes) if auxes else {}
    return h_BxLxD, aux, None if cache is None else caches

  def init_cache(self, batch: int, max_len: int):
    return [self.empty_cache((repeats, len(unit)), batch, max_len)
            for unit, repeats in self.units]

  def aux_loss(self, aux):
    """Returns the weighted load-balancing and z-losses, averaged over layers, and metrics.

    `moe/expert_load` [E] is each expert's share of the top-k assignments averaged over layers.
    `moe/max_load` is E times its maximum, 1 when balanced. Under expert_impl=capacity,
    `moe/overflow` is the share of the assignments past their expert's C rows, which run as
    grouped GEMMs, over the step's whole batch, where each device lays out its own tokens
    (`experts.capacity_overflow`).
    """
    if not aux:
      return jnp.zeros((), jnp.float32), {}
    cfg = self.cfg
    lb, z = jnp.mean(aux["lb_loss"]), jnp.mean(aux["z_loss"])
    load_E = jnp.mean(aux["expert_frac"], axis=0) / cfg.n_experts_per_token
    metrics = {"moe/lb_loss": lb, "moe/z_loss": z, "moe/expert_load": load_E,
               "moe/max_load": cfg.n_experts * jnp.max(load_E)}
    if "overflow" in aux:
      metrics["moe/overflow"] = jnp.mean(aux["overflow"])
    return cfg.aux_loss_coef * lb + cfg.router_z_loss_coef * z, metrics
