"""Generation with a KV cache: a batch of prompts prefilled at once, then one jitted decode step
per new token, for any model with `init_cache` and `decode` (tst_jax's Llama and MoE)."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def filter_top_p(logits_BxV, top_p):
  """Keeps the most likely tokens whose probability mass first reaches top_p: a nucleus filter."""
  sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
  probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
  keep_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV < top_p   # the first is always kept
  cutoff_Bx1 = jnp.min(jnp.where(keep_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
  return jnp.where((logits_BxV >= cutoff_Bx1) | (top_p >= 1.0), logits_BxV, -jnp.inf)


def pick(logits_BxV, key, temperature, top_p):
  """Picks next tokens [B]: argmax if temperature is 0, else a sample of the filtered softmax."""
  logits_BxV = logits_BxV.astype(jnp.float32)
  scaled = filter_top_p(logits_BxV / jnp.maximum(temperature, 1e-6), top_p)
  sampled_B = jax.random.categorical(key, scaled, axis=-1)
  return jnp.where(temperature > 0, sampled_B, jnp.argmax(logits_BxV, axis=-1))


def padded_length(n: int) -> int:
  """Pads lengths to powers of two, at least 16, so there are few shapes and compilations."""
  return max(16, 1 << (n - 1).bit_length())


@functools.partial(jax.jit, static_argnums=0)
def _prefill(graphdef, state, tokens_BxP, lengths_B, cache, key, temperature, top_p):
  """Runs the prompts' pass: fills the cache and picks each row's first new token."""
  model = nnx.merge(graphdef, state)
  batch, length = tokens_BxP.shape
  positions_BxP = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  logits_BxPxV, cache = model.decode(tokens_BxP, positions_BxP, cache)
  last_BxV = jnp.take_along_axis(logits_BxPxV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
  return pick(last_BxV, key, temperature, top_p), cache


@functools.partial(jax.jit, static_argnums=0, donate_argnums=4)
def _step(graphdef, state, tokens_B, positions_B, cache, key, temperature, top_p):
  """Runs one decode step from every row's last token at its position to the next tokens."""
  model = nnx.merge(graphdef, state)
  logits_Bx1xV, cache = model.decode(tokens_B[:, None], positions_B[:, None], cache)
  return pick(logits_Bx1xV[:, 0], key, temperature, top_p), cache


class Sampler:
  """Generates in batches for a model with `init_cache` and `decode`, such as tst_jax's Llama.

  Prompts of different lengths are right-padded. The prompt pass fills the cache at positions
  0..P-1, and row b's new tokens go to positions len_b, len_b + 1, ... overwriting its padding
  before anything attends to it. Two jitted functions are compiled once per model and shape.
  """

  def __init__(self, model):
    self.model = model
    self.graphdef, self.state = nnx.split(model)

  def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
               temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
               eos_id: int | None = None,
               done: Callable[[int, list[int]], bool] | None = None,
               on_token: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """Returns the new tokens of every prompt, at most `max_new_tokens` each.

    A row stops at `eos_id`, not included, or when `done(row, its new tokens)` is true.
    `on_token(row, id)` streams them.
    """
    lengths = np.array([len(p) for p in prompts], np.int32)
    if lengths.min() < 1:
      raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
      return [[] for _ in prompts]
    width = padded_length(int(lengths.max()))
    tokens = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
      tokens[row, :len(prompt)] = prompt
    cache = self.model.init_cache(len(prompts), width + padded_length(max_new_tokens))
    key = jax.random.key(seed)
    sampling = (jnp.float32(temperature), jnp.float32(top_p))
    key, sub = jax.random.split(key)
    next_B, cache = _prefill(self.graphdef, self.state, tokens, lengths, cache, sub, *sampling)
    out, finished = [[] for _ in prompts], np.zeros(len(prompts), bool)
    for t in range(max_new_tokens):
      ids = np.asarray(next_B)
      for row, token in enumerate(ids):
        if finished[row]:
          continue
        if token == eos_id:
          finished[row] = True
          continue
        out[row].append(int(token))
        if on_token is not None:
          on_token(row, int(token))
        if done is not None and done(row, out[row]):
          finished[row] = True
      if finished.all() or t == max_new_tokens - 1:
        break
      key, sub = jax.random.split(key)
      next_B, cache = _step(self.graphdef, self.state, next_B, jnp.asarray(lengths + t), cache,
                            sub, *sampling)
    return out
