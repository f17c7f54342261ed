"""Multi-token prediction (MTP): in a next-token phase, every position also predicts the k - 1
tokens after the next one, through heads that only training uses, in the two designs of its
papers.

  gloeckle  Gloeckle et al. 2024, "Better & Faster LLMs via Multi-token Prediction": k heads on
            a shared trunk. The model's last decoder block is the next-token head, and k - 1
            blocks of the same shape, with parameters of their own, sit beside it on the same
            trunk, the blocks before it. Every head ends in the model's final norm and LM head,
            shared. Head j predicts token t + j.
  deepseek  DeepSeek-V3's technical report, section 2.2: k - 1 modules in a cascade. Module d
            takes the previous depth's hidden state h (for d = 1 the last block's output, before
            the final norm) and the embedding of token t + d, RMSNorm-ed each, concatenated and
            projected back to D by M_d, then one decoder block, an RMSNorm of its own and the
            shared LM head. It predicts token t + d + 1 and sees the tokens up to t + d, so the
            causal chain holds at every depth. The embedding is the model's, shared.

The loss is CE(t + 1) + λ/(k - 1) · Σ_{j=2..k} CE(t + j), each CE the mean over the positions
whose target lies in the window (and in the position's document under data.document_mask).
DeepSeek-V3 writes it so, with λ = 0.3, then 0.1. Gloeckle et al. sum the k CEs, λ = k - 1.

The heads are added beside the config's model, which training otherwise leaves as it is: the
parameters of the model kept after training are the config's, and the heads' parameters and
FLOPs count in the plan. Export drops them, as both papers keep only the next-token model.
Phase 1 of TST trains on bags without them. The heads use the parts of a model that the llama
family's classes have, and families built on them inherit: `make_block`, `embed_inputs`,
`run_layers`, `embed`, `final_norm`, and for Gloeckle's heads one scanned stack, `blocks`.
Shapes: K = k heads, the next-token one first.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from tst_jax import platform, schema
from tst_jax.errors import ConfigError
from tst_jax.models import layers
from tst_jax.superposition import IGNORE_INDEX

KINDS = ("gloeckle", "deepseek")
ATTR = "mtp"   # the model's attribute that holds the heads: the key of their parameters
# λ where mtp.weight is None: Gloeckle et al.'s sum of the k CEs, DeepSeek-V3's first weight.
KIND_WEIGHT = {"gloeckle": lambda k: float(k - 1), "deepseek": lambda k: 0.3}
_POSITIVE = schema.number(0, open_lo=True)
# λ = 0 is refused: the heads would cost their FLOPs and learn nothing.
_WEIGHT = schema.Rule(lambda v: v is None or _POSITIVE.ok(v),
                      "None (the kind's own λ) or a number > 0 (0 would train the heads on "
                      "nothing: mtp.k=1 has none)", float, 0.0)


@dataclasses.dataclass(frozen=True)
class Mtp:
  """config.mtp: multi-token prediction in the next-token phases (k = 1: none)."""
  k: int = schema.field(1, schema.integer(1), "tokens predicted at each position, the next one "
                        "included: Gloeckle et al.'s n, DeepSeek-V3's depth D + 1 (1: none)",
                        added=1)
  kind: str = schema.field("gloeckle", schema.one_of(KINDS), "gloeckle: k - 1 decoder blocks "
                           "beside the last one, on its input | deepseek: k - 1 cascaded "
                           "modules, each [RMSNorm(h); RMSNorm(Emb(t+d))] -> M_d -> a block "
                           "(models/mtp.py)", added="gloeckle")
  weight: float | None = schema.field(None, _WEIGHT, "λ: the loss is CE(t+1) + λ x the mean "
                                      "CE of tokens t+2..t+k (None: the kind's own, gloeckle "
                                      "k - 1, the sum of its paper; deepseek 0.3, V3's)",
                                      added=None)
  equal_flops: bool = schema.field(True, schema.BOOL, "fewer next-token steps, so that the run "
                                   "costs the FLOPs of train.steps without MTP (False: "
                                   "train.steps, and more FLOPs)", added=True)

  @property
  def on(self) -> bool:
    return self.k > 1

  @property
  def loss_weight(self) -> float:
    """λ as the loss uses it: mtp.weight, or the kind's own where it is None."""
    return KIND_WEIGHT[self.kind](self.k) if self.weight is None else float(self.weight)

  def check(self, model_cfg) -> None:
    """Refuses heads the model family cannot carry, as a ConfigError: Gloeckle's need the last
    decoder block apart from the others, which the llama family's one scanned stack gives."""
    try:
      _abstract_heads(model_cfg, self)
    except ValueError as e:
      raise ConfigError("mtp.kind", str(e)) from None


def attach(model, mtp: Mtp, rngs: nnx.Rngs):
  """Adds the heads of `mtp` to `model`, drawn from `rngs` after the model's own parameters, so
  that a run with MTP starts from the same model as one without. Returns the model."""
  if mtp is not None and mtp.on:
    make = GloeckleHeads if mtp.kind == "gloeckle" else DeepSeekModules
    setattr(model, ATTR, make(model, mtp.k, rngs))
  return model


def build(model_cfg, mtp: Mtp | None, rngs: nnx.Rngs):
  """Returns the model of `model_cfg` with the heads of `mtp` (None or k = 1: none)."""
  return attach(model_cfg.build(rngs), mtp, rngs)


class GloeckleHeads(nnx.Module):
  """k - 1 decoder blocks of the model's kind, stacked, beside its last block."""

  def __init__(self, model, k: int, rngs: nnx.Rngs):
    if not hasattr(model, "blocks"):
      raise ValueError(f"'gloeckle' puts its heads beside the last decoder block, which "
                       f"{type(model).__name__} does not run apart from the others (its "
                       "blocks are stages): use mtp.kind='deepseek', or the llama family")
    self.blocks = layers.stacked(k - 1, model.make_block, rngs)

  def __call__(self, model, h_BxLxD, positions_BxL, documents_BxL, tokens_BxLxK):
    """Returns the heads' outputs [K, B, L, D] before the final norm, the last block's first,
    and the trunk's per-layer aux."""
    del tokens_BxLxK   # every head reads the trunk alone
    h_BxLxD, trunk_BxLxD, aux = layers.run_stack_to_last(
        model.blocks, h_BxLxD, positions_BxL, model.cfg.remat, documents_BxL)
    graphdef, state = nnx.split(self.blocks)

    def head(_, head_state):
      out, _, _ = nnx.merge(graphdef, head_state)(trunk_BxLxD, positions_BxL,
                                                  documents_BxL=documents_BxL)
      return None, out
    _, extra_JxBxLxD = jax.lax.scan(layers.rematted(head, model.cfg.remat), None, state)
    return jnp.concatenate([h_BxLxD[None], extra_JxBxLxD]), aux


class DeepSeekModule(nnx.Module):
  """One depth of DeepSeek-V3's MTP: [RMSNorm(h); RMSNorm(e)] -> M -> a decoder block -> RMSNorm."""

  def __init__(self, model, rngs: nnx.Rngs):
    cfg = model.cfg
    self.h_norm = layers.RMSNorm(cfg.dim, cfg.norm_eps, rngs)
    self.e_norm = layers.RMSNorm(cfg.dim, cfg.norm_eps, rngs)
    # M_d [2D, D]: an input axis of its own, so that Muon reads a 2D x D matrix. The mesh
    # shards it as it shards D, and leaves the output D whole, the mesh axis taken.
    self.proj = layers.param(rngs, (2 * cfg.dim, cfg.dim), ("mtp_in", "embed"),
                             std=cfg.init_std)
    self.block = model.make_block(rngs)
    self.norm = layers.RMSNorm(cfg.dim, cfg.norm_eps, rngs)

  def __call__(self, h_BxLxD, e_BxLxD, positions_BxL, documents_BxL):
    """Returns this depth's hidden state h [B, L, D] and its normed output for the head."""
    x = jnp.concatenate([self.h_norm(h_BxLxD), self.e_norm(e_BxLxD)], axis=-1)
    x = jnp.einsum("blc,cd->bld", x, self.proj[...].astype(h_BxLxD.dtype))
    h_BxLxD, _, _ = self.block(x, positions_BxL, documents_BxL=documents_BxL)
    return h_BxLxD, self.norm(h_BxLxD)


class DeepSeekModules(nnx.Module):
  """k - 1 DeepSeek-V3 MTP modules, stacked and run as a cascade."""

  def __init__(self, model, k: int, rngs: nnx.Rngs):
    self.modules = layers.stacked(k - 1, lambda r: DeepSeekModule(model, r), rngs)

  def __call__(self, model, h_BxLxD, positions_BxL, documents_BxL, tokens_BxLxK):
    """Returns the next-token head's hidden states and each depth's [K, B, L, D], before the
    final norm for the first and after each module's own for the others, and the trunk's aux.
    `tokens_BxLxK` [..., j] is token t + j + 1 of each position, IGNORE_INDEX past the window."""
    h_BxLxD, aux, _ = model.run_layers(h_BxLxD, positions_BxL, documents_BxL=documents_BxL)
    # Depth d reads token t + d. Past the window (or its document) it is a stand-in: those
    # positions' own targets are ignored, and causal attention keeps them from earlier ones.
    future_JxBxL = jnp.moveaxis(tokens_BxLxK[..., :-1], -1, 0)
    future_JxBxL = jnp.where(future_JxBxL == IGNORE_INDEX, 0, future_JxBxL)
    graphdef, state = nnx.split(self.modules)

    def depth(h, xs):
      module_state, tokens_BxL = xs
      e_BxLxD = model.embed(tokens_BxL).astype(h.dtype)
      h, out = nnx.merge(graphdef, module_state)(h, e_BxLxD, positions_BxL, documents_BxL)
      return h, out
    _, outs_JxBxLxD = jax.lax.scan(layers.rematted(depth, model.cfg.remat), h_BxLxD,
                                   (state, future_JxBxL))
    return jnp.concatenate([h_BxLxD[None], outs_JxBxLxD]), aux


def hidden_states(model, inputs_BxL, targets_BxLxK, documents_BxL=None, positions_BxL=None):
  """Returns the final hidden states of the K heads [K, B, L, D], the next-token one first as
  `model.forward` gives it, and the model's aux. `targets_BxLxK` are the tokens t+1..t+K of
  each position (superposition.window_targets), which DeepSeek's modules read."""
  heads = getattr(model, ATTR)
  h_BxLxD, positions_BxL = model.embed_inputs(inputs_BxL, positions_BxL)
  h_KxBxLxD, aux = heads(model, h_BxLxD, positions_BxL, documents_BxL, targets_BxLxK)
  if isinstance(heads, GloeckleHeads):   # the model's final norm serves every head
    return model.final_norm(h_KxBxLxD), aux
  return jnp.concatenate([model.final_norm(h_KxBxLxD[:1]), h_KxBxLxD[1:]]), aux


def objective(further_J, weight: float):
  """Returns λ × the mean of the further tokens' CEs [K - 1], and their metrics."""
  metrics = {f"mtp/loss_t{j + 2}": further_J[j] for j in range(further_J.shape[0])}
  mean = jnp.mean(further_J)
  return weight * mean, dict(metrics, **{"mtp/loss": mean})


def param_count(model_cfg, mtp: Mtp) -> int:
  """Counts the heads' parameters from their shapes, allocating nothing."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(_abstract_heads(model_cfg, mtp)))


def flops_per_token(model_cfg, mtp: Mtp, seq_len: int) -> float:
  """Returns the heads' training FLOPs per position at `seq_len` positions, counted as the
  families count theirs: 6 per matmul parameter (their blocks', M_d and one pass through the LM
  head each) and 12 · H · G · L per block for attention."""
  if not mtp.on:
    return 0.0
  matmul = sum(math.prod(x.shape) for x in jax.tree.leaves(_abstract_heads(model_cfg, mtp))
               if x.ndim >= 3)   # stacked matrices; the stacked norm scales are [K - 1, D]
  heads = mtp.k - 1
  attention = 12.0 * model_cfg.n_heads * model_cfg.head_dim * seq_len
  return 6.0 * (matmul + heads * model_cfg.dim * model_cfg.vocab_size) + heads * attention


@functools.lru_cache(maxsize=8)   # the plan asks per phase, the spec's check once more
def _abstract_heads(model_cfg, mtp: Mtp) -> nnx.State:
  if not mtp.on:
    return nnx.State({})
  model = nnx.eval_shape(lambda: build(platform.portable(model_cfg), mtp, nnx.Rngs(0)))
  return nnx.state(getattr(model, ATTR), nnx.Param)
