"""TST in your own Flax NNX + optax loop, with none of tst_jax's trainer: only its public API.

  python examples/tst_in_your_loop.py     # a tiny causal LM on bytes of the stdlib, CPU, seconds

Phase 1 reads windows of S·L + 1 tokens, averages each bag of S embeddings into one of L
positions and scores the next bag with the MCE; phase 2 reads L + 1 tokens and is plain
next-token training. Both phases run the same L positions, so a step costs the same FLOPs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import tst_jax

S, L, B = 4, 32, 8            # bag size, positions the model sees, rows per batch


class TinyLM(nnx.Module):
  """Any causal LM will do; this one averages the positions so far, then an MLP and a head."""

  def __init__(self, vocab: int, dim: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)
    self.mlp = nnx.Linear(dim, dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)

  def __call__(self, tokens):   # ids [B, L] or bags [B, L, S] -> logits [B, L, V]
    bags = tokens if tokens.ndim == 3 else tokens[..., None]
    h = tst_jax.superpose(self.embed.embedding[...], bags)          # TST's one input change
    h = jnp.cumsum(h, axis=1) / jnp.arange(1, h.shape[1] + 1)[None, :, None]   # causal
    return self.head(jax.nn.gelu(self.mlp(h)))


def loss_fn(model, window, tst: bool):
  """Phase 1 (tst): bags in, the next bag's MCE out. Phase 2: the ordinary LM loss."""
  if tst:
    bags, targets = tst_jax.tst_view(window, S)                       # [B, L, S] each
    return tst_jax.mce_loss(model(bags), targets)
  inputs, labels = tst_jax.ntp_view(window)                           # [B, L] each
  return tst_jax.cross_entropy(model(inputs), labels)


def train(model, tokens: np.ndarray, steps: int, ratio: float = 0.5, tx=None):
  """round(ratio·steps) TST steps, then next-token steps, each phase reading the stream on
  from where the last stopped. Returns the losses and the windows each step saw."""
  optimizer = nnx.Optimizer(model, tx or optax.adamw(3e-3), wrt=nnx.Param)
  step = nnx.jit(lambda m, o, w, tst: _update(m, o, w, tst), static_argnums=3)
  position, losses, windows = 0, [], []
  for i in range(steps):
    tst = i < round(ratio * steps)                    # the switch: nothing else to do
    width = tst_jax.data_length(L, S, "full" if tst else "ntp") + 1
    window = np.stack([tokens[position + r * (width - 1):][:width] for r in range(B)])
    position += B * (width - 1)
    losses.append(float(step(model, optimizer, window, tst)))
    windows.append(window)
  return losses, windows


def _update(model, optimizer, window, tst):
  loss, grads = nnx.value_and_grad(loss_fn)(model, window, tst)
  optimizer.update(model, grads)
  return loss


if __name__ == "__main__":
  import sysconfig
  text = open(f"{sysconfig.get_paths()['stdlib']}/typing.py", "rb").read()
  losses, _ = train(TinyLM(256, 64, nnx.Rngs(0)), np.frombuffer(text, np.uint8).astype(np.int32),
                    steps=60)
  print("phase 1 (MCE):", [round(x, 3) for x in losses[:30:5]])
  print("phase 2 (CE): ", [round(x, 3) for x in losses[30::5]])
