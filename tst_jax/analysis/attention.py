"""How a trained model's attention spreads, and how large the input a bag gives is against one
token's: what the switch from bags to tokens changes inside the network.

A head's normalised attention entropy at a query is the entropy of its causal attention
weights over the positions it sees, divided by the entropy of the uniform attention over them,
log(position + 1): 1 is uniform, 0 is all on one position. The first position, which sees only
itself, is left out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def attention_stats(model: nnx.Module, inputs, positions_BxL=None) -> dict[str, np.ndarray]:
  """Returns, for each layer and query head [layers, H] of the dense decoder `model` (a Llama:
  its scanned `blocks`) on tokens [B, L] or bags [B, L, S], the mean over the batch and the
  positions after the first of: the normalised attention entropy (`entropy`), the weight a
  query puts on its own position (`self`) and on the first position (`first`)."""
  if not hasattr(model, "blocks") or not hasattr(model, "embed_inputs"):
    raise ValueError(f"attention entropy is measured on the dense Llama family's scanned "
                     f"blocks, not on a {type(model).__name__}")
  h_BxLxD, positions_BxL = model.embed_inputs(inputs, positions_BxL)
  graphdef, state = nnx.split(model.blocks)

  def layer(h_BxLxD, layer_state):
    block = nnx.merge(graphdef, layer_state)
    q_BxLxHxG, k_BxLxKxG, _ = block.attn.project(block.input_norm(h_BxLxD), positions_BxL)
    stats = head_stats(q_BxLxHxG, k_BxLxKxG)
    h_BxLxD, _, _ = block(h_BxLxD, positions_BxL)
    return h_BxLxD, stats

  _, stats = jax.lax.scan(layer, h_BxLxD, state)
  return {name: np.asarray(value) for name, value in stats.items()}


def attention_entropy(model: nnx.Module, inputs, positions_BxL=None) -> np.ndarray:
  """Returns `attention_stats`' normalised entropy [layers, H]."""
  return attention_stats(model, inputs, positions_BxL)["entropy"]


def head_stats(q_BxLxHxG, k_BxLxKxG) -> dict[str, jax.Array]:
  """Returns each query head's [H] mean over the batch and the positions after the first of
  its normalised causal attention entropy, its weight on the query's own position and on the
  first position, the H query heads sharing the K key heads in groups."""
  _, length, heads, dim = q_BxLxHxG.shape
  k_BxLxHxG = jnp.repeat(k_BxLxKxG, heads // k_BxLxKxG.shape[2], axis=2)
  scores_BxHxLxL = jnp.einsum("blhg,bmhg->bhlm", q_BxLxHxG.astype(jnp.float32),
                              k_BxLxHxG.astype(jnp.float32)) / jnp.sqrt(dim)
  causal_LxL = jnp.tril(jnp.ones((length, length), bool))
  logp = jax.nn.log_softmax(jnp.where(causal_LxL, scores_BxHxLxL, -jnp.inf), axis=-1)
  p = jnp.exp(logp)
  entropy_BxHxL = -jnp.sum(jnp.where(causal_LxL, p * logp, 0.0), axis=-1)
  uniform_L = jnp.log(jnp.arange(1, length + 1, dtype=jnp.float32))
  after_first = lambda x_BxHxL: jnp.mean(x_BxHxL[..., 1:], axis=(0, 2))
  uniform_L = jnp.where(uniform_L > 0, uniform_L, 1.0)    # the first position: left out below
  return dict(entropy=after_first(entropy_BxHxL / uniform_L[None, None]),
              self=after_first(jnp.diagonal(p, axis1=-2, axis2=-1)),
              first=after_first(p[..., 0]))


def head_entropy(q_BxLxHxG, k_BxLxKxG) -> jax.Array:
  """Returns `head_stats`' normalised entropy [H]."""
  return head_stats(q_BxLxHxG, k_BxLxKxG)["entropy"]


def input_scale(model: nnx.Module, bags_BxLxS) -> float:
  """Returns the RMS of the superposed input of `bags` [B, L, S] over the RMS of the inputs of
  the same tokens one at a time: 1 / sqrt(S) where a bag's embeddings are orthogonal and of
  one norm, 1 where they are equal."""
  bag_BxLxD, _ = model.embed_inputs(bags_BxLxS)
  batch, length, size = bags_BxLxS.shape
  tokens_BxT = bags_BxLxS.reshape(batch, length * size)
  token_BxTxD, _ = model.embed_inputs(tokens_BxT)
  rms = lambda x: jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))
  return float(rms(bag_BxLxD) / rms(token_BxTxD))
