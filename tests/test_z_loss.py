"""The z-loss (loss.z_loss): z_loss * the mean over rows with a valid target of
logsumexp(logits)^2, written out in numpy; every implementation (naive, xla, the Pallas kernels
interpreted, and sharded) against the naive one, values and gradients."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tst_jax import losses
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES, axis_rules
from tst_jax.superposition import IGNORE_INDEX

N, D, V, S = 24, 16, 200, 3
Z = 0.05    # large, so that the z term is a visible share of the loss and its gradient
BLOCKS = {"xla": dict(block_n=8, block_v=64),
          "pallas": dict(block_n=16, block_v=64, block_d=16, backend="triton", interpret=True),
          "mosaic": dict(block_n=8, block_v=128, block_d=128, backend="mosaic_tpu",
                         interpret=True)}


def _problem():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(N, D)).astype(np.float32)
  head = (rng.normal(size=(D, V)) * 3 / np.sqrt(D)).astype(np.float32)
  targets = rng.integers(0, V, size=(N, S))
  targets[rng.random((N, S)) < 0.2] = IGNORE_INDEX
  targets[[3, 9]] = IGNORE_INDEX                       # rows the z-loss leaves out
  return jnp.asarray(hidden), jnp.asarray(head), jnp.asarray(targets, jnp.int32)


def _z_numpy(hidden, head, targets):
  """z-loss term and its gradient in hidden, from the logits in float64."""
  logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64)
  top = logits.max(-1, keepdims=True)
  lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
  rows = np.asarray(targets != IGNORE_INDEX).any(-1)
  term = Z * np.mean(lse[rows] ** 2)
  softmax = np.exp(logits - lse[:, None])
  d_logits = Z * 2 * (lse * rows)[:, None] * softmax / rows.sum()
  return term, d_logits @ np.asarray(head, np.float64).T


def _loss_and_grads(impl, hidden, head, targets, z_loss, **kw):
  fn = lambda h, w: losses.linear_mce_loss(h, w, targets, impl=impl, weighting="power",  # noqa: E731
                                           z_loss=z_loss, **kw)
  return jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))(hidden, head)


def _close(got, want, what, tol=1e-5):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)
  assert err <= tol, f"{what}: max error {err:.2e} of max |ref|"


def test_naive_z_loss_is_the_written_out_term_and_its_gradient():
  hidden, head, targets = _problem()
  plain, (plain_dh, _) = _loss_and_grads("naive", hidden, head, targets, 0.0)
  with_z, (z_dh, _) = _loss_and_grads("naive", hidden, head, targets, Z)
  term, term_dh = _z_numpy(hidden, head, targets)
  assert term > 0.1 * float(plain)
  _close(float(with_z) - float(plain), term, "z term")
  _close(np.asarray(z_dh) - np.asarray(plain_dh), term_dh, "d_hidden of the z term", 1e-4)
  logits = hidden @ head
  _close(losses.mce_loss(logits, targets, weighting="power", z_loss=Z), with_z, "mce_loss")
  alt = losses.mce_loss(logits, targets, variant="alt", z_loss=Z)
  _close(alt - losses.mce_loss(logits, targets, variant="alt"), term, "alt's z term")


@pytest.mark.parametrize("impl", ["xla", "pallas", "mosaic"])
def test_fused_z_loss_matches_naive(impl):
  hidden, head, targets = _problem()
  want = _loss_and_grads("naive", hidden, head, targets, Z)
  got = _loss_and_grads("xla" if impl == "xla" else "pallas", hidden, head, targets, Z,
                        **BLOCKS[impl])
  for what, g, w in zip(("loss", "d_hidden", "d_head"), jax.tree.leaves(got),
                        jax.tree.leaves(want)):
    _close(g, w, f"{impl} {what}")


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_sharded_z_loss_matches_naive(impl):
  """Rows over data (2), the vocabulary over tensor (4): the z term squares the logsumexp
  combined over the vocabulary shards."""
  hidden, head, targets = _problem()
  want = _loss_and_grads("naive", hidden, head, targets, Z)
  sizes = dict(data=2, fsdp=1, tensor=4, expert=1, dcn_data=1)
  with axis_rules(mesh_lib.make_mesh(ml_collections.ConfigDict(sizes)), LOGICAL_AXIS_RULES):
    got = _loss_and_grads(impl, hidden, head, targets, Z,
                          **{k: v for k, v in BLOCKS[impl].items() if k != "block_v"},
                          block_v=16 if impl == "xla" else 32)
  for what, g, w in zip(("loss", "d_hidden", "d_head"), jax.tree.leaves(got),
                        jax.tree.leaves(want)):
    _close(g, w, f"sharded {impl} {what}")
