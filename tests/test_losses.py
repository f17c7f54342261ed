"""superposition and MCE against the paper's appendix A PyTorch listings, run in torch."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tst_jax import losses
from tst_jax import superposition as sp

WEIGHTINGS = ["uniform", "power", "exponential", "first", "array", "fitted:paper"]


def _weights_torch(weighting, s):
  """The appendix-D weightings g(i), i = 1..S, written out independently."""
  if weighting == "array":
    return [0.5 + 0.25 * i for i in range(s)]
  return [{"uniform": 1.0, "power": 1.0 / i, "exponential": float(np.exp(-i)),
           "first": float(i == 1),
           # appendix D, figure caption: C0 + a·d^k, C0 ≈ 3.63, a ≈ 1.35, k ≈ -1.25
           "fitted:paper": 3.63 + 1.35 * i ** -1.25}[weighting] for i in range(1, s + 1)]


def paper_loss(pred, labels, weights):
  """Appendix A 'Next bag-of-words prediction loss', with the weight w per column and a
  column that has no valid entry left out (torch's mean CE would be NaN there)."""
  bs, seq, dim = pred.shape
  label_bs, label_seq = labels.shape
  superposition_bag_size = label_seq // seq
  superposition_offset = superposition_bag_size - 1
  pred = pred.flatten(0, 1).float()
  labels = torch.nn.functional.pad(labels, (0, superposition_offset), mode="constant",
                                   value=-100)[..., superposition_offset:].view(
                                       (bs, seq, superposition_bag_size))
  loss = 0.
  w_total = 0.
  for i in range(superposition_bag_size):
    w = weights[i]
    target = labels[..., i].flatten(0, 1)
    if w == 0 or not (target != -100).any():
      continue
    loss += w * torch.nn.functional.cross_entropy(pred, target)
    w_total += w
  return loss / w_total


def paper_superpose(table, tokens):
  """Appendix A 'Bag-of-Token embeddings input' listing."""
  emb = torch.nn.Embedding.from_pretrained(table)
  bs, sp_seq, superposition_bag_size = tokens.shape
  h = emb(tokens[..., 0])
  h_dtype = h.dtype
  h = h.float()
  for i in range(1, superposition_bag_size):
    h = h + emb(tokens[..., i]).float()
  return (h / superposition_bag_size).to(h_dtype)


def _weighting_arg(weighting, s):
  return np.array(_weights_torch("array", s)) if weighting == "array" else weighting


@pytest.mark.parametrize("s,weighting", list(itertools.product([1, 2, 3, 4, 6, 8], WEIGHTINGS)))
def test_mce_matches_paper_listing_loss_and_grad(s, weighting):
  rng = np.random.default_rng(s * 10 + WEIGHTINGS.index(weighting))
  bs, seq, vocab = 3, 5, 37
  logits = rng.normal(size=(bs, seq, vocab)).astype(np.float32) * 3
  labels = rng.integers(0, vocab, size=(bs, seq * s))
  labels[rng.random(labels.shape) < 0.2] = -100     # random ignore mask

  pred_t = torch.tensor(logits, requires_grad=True)
  ref = paper_loss(pred_t, torch.tensor(labels), _weights_torch(weighting, s))
  ref.backward()

  targets = sp.bag_targets(jnp.asarray(labels), s)
  fn = lambda z: losses.mce_loss(z, targets, weighting=_weighting_arg(weighting, s))
  loss, grad = jax.jit(jax.value_and_grad(fn))(jnp.asarray(logits))
  np.testing.assert_allclose(loss, ref.item(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, pred_t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_s1_is_standard_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 7, 19)).astype(np.float32)
  labels = rng.integers(0, 19, size=(4, 7))
  labels[0, :3] = -100
  ref = torch.nn.functional.cross_entropy(torch.tensor(logits).flatten(0, 1),
                                          torch.tensor(labels).flatten())
  np.testing.assert_allclose(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels)),
                             ref.item(), rtol=1e-6)
  np.testing.assert_allclose(
      losses.mce_loss(jnp.asarray(logits), jnp.asarray(labels)[..., None]), ref.item(),
      rtol=1e-6)


def test_empty_column_is_left_out_and_all_ignored_is_zero():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(6, 11)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 11, size=(6, 3)))
  only_two = losses.mce_loss(logits, targets[:, :2])
  with_empty = losses.mce_loss(logits, targets.at[:, 2].set(-100))
  np.testing.assert_allclose(with_empty, only_two, rtol=1e-6)
  ignored = jnp.full((6, 3), -100)
  for variant in ("mce", "alt"):
    value, grad = jax.value_and_grad(
        lambda z: losses.mce_loss(z, ignored, variant=variant))(logits)
    assert value == 0.0 and np.all(np.isfinite(grad)) and not np.any(grad)


def _alt_numpy(logits, targets, weights):
  """-log sum over the distinct valid (weight > 0) bag tokens of softmax(z), averaged over
  rows with any such token: a direct float64 evaluation of the MCE-alt formula."""
  z = logits.astype(np.float64)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  rows = []
  for r in range(z.shape[0]):
    bag = {int(t) for t, w in zip(targets[r], weights) if t != -100 and w > 0}
    if bag:
      rows.append(-np.log(sum(p[r, t] for t in bag)))
  return np.mean(rows) if rows else 0.0


@pytest.mark.parametrize("s,weighting", [(1, "uniform"), (4, "uniform"), (6, "first"),
                                         (8, "power")])
def test_alt_matches_direct_formula(s, weighting):
  rng = np.random.default_rng(s)
  logits = rng.normal(size=(20, 13)).astype(np.float32) * 2
  targets = rng.integers(0, 6, size=(20, s))            # small range: repeats in bags
  targets[rng.random(targets.shape) < 0.25] = -100
  targets[3] = -100                                      # a row with no target
  weights = losses.bag_weights(weighting, s)
  got = losses.mce_loss(jnp.asarray(logits), jnp.asarray(targets), variant="alt",
                        weighting=weighting)
  np.testing.assert_allclose(got, _alt_numpy(logits, targets, weights), rtol=1e-5)
  assert got >= 0


def test_alt_equals_mce_for_s1_and_kl_form():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(9, 17)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 17, size=(9, 1)))
  np.testing.assert_allclose(losses.mce_loss(logits, targets, variant="alt"),
                             losses.mce_loss(logits, targets), rtol=1e-6)
  # KL form: the paper's eq. L_MCE = mean CE - log S, zero at the uniform-on-bag optimum.
  bag = jnp.array([[1, 4, 7, 9]])
  z_opt = jnp.full((1, 17), -1e4).at[0, bag[0]].set(0.0)
  np.testing.assert_allclose(losses.mce_loss(z_opt, bag, kl=True), 0.0, atol=1e-5)
  np.testing.assert_allclose(losses.mce_loss(z_opt, bag), np.log(4), rtol=1e-6)


def test_per_position_form():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(2, 5, 13)).astype(np.float32)
  targets = rng.integers(0, 13, size=(2, 5, 3))
  per, mask = losses.mce_loss_per_position(jnp.asarray(logits), jnp.asarray(targets))
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expect = -np.take_along_axis(logp, targets, -1).mean(-1)
  np.testing.assert_allclose(per, expect, rtol=1e-5)
  assert mask.all()
  # Without ignored targets the per-position mean is the loss itself.
  np.testing.assert_allclose(per.mean(), losses.mce_loss(jnp.asarray(logits),
                                                         jnp.asarray(targets)), rtol=1e-5)


def test_bad_weighting_and_variant():
  with pytest.raises(ValueError, match="unknown weighting"):
    losses.bag_weights("cubic", 4)
  with pytest.raises(ValueError, match="bag size is 4"):
    losses.bag_weights([1.0, 2.0], 4)
  with pytest.raises(ValueError, match="variant"):
    losses.mce_loss(jnp.zeros((2, 5)), jnp.zeros((2, 1), jnp.int32), variant="hinge")


@pytest.mark.parametrize("s", [1, 2, 3, 5])
def test_fold_bag_targets_superpose_match_listings(s):
  rng = np.random.default_rng(s)
  bs, seq = 2, 4 * s
  tokens = rng.integers(0, 50, size=(bs, seq))
  # Input folding listing.
  folded_t = torch.tensor(tokens).reshape(bs, seq // s, s)
  np.testing.assert_array_equal(sp.fold(jnp.asarray(tokens), s), folded_t.numpy())
  # Embedding listing, float32 and bfloat16 tables.
  table = rng.normal(size=(50, 8)).astype(np.float32)
  ref = paper_superpose(torch.tensor(table), folded_t)
  np.testing.assert_allclose(sp.superpose(jnp.asarray(table), sp.fold(jnp.asarray(tokens), s)),
                             ref.numpy(), rtol=1e-6, atol=1e-7)
  ref16 = paper_superpose(torch.tensor(table).bfloat16(), folded_t).float().numpy()
  got16 = sp.superpose(jnp.asarray(table, jnp.bfloat16), sp.fold(jnp.asarray(tokens), s))
  assert got16.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got16, np.float32), ref16)
  if s == 1:
    np.testing.assert_array_equal(sp.superpose(jnp.asarray(table), tokens[..., None]),
                                  table[tokens])


def test_bag_targets_causal_shift():
  # Inputs at [t, t+S-1] predict the tokens at [t+S, t+2S-1]; targets past the end ignored.
  s, length = 3, 9
  window = np.arange(100, 100 + length + 1)[None]        # data_len + 1 tokens
  inputs, targets = sp.tst_view(jnp.asarray(window), s, "full")
  for j in range(length // s):
    np.testing.assert_array_equal(inputs[0, j], window[0, j * s:(j + 1) * s])
    expect = [window[0, t] if t <= length else -100 for t in range(j * s + s, j * s + 2 * s)]
    np.testing.assert_array_equal(targets[0, j], expect)


def test_ablation_modes():
  s, length = 2, 6
  window = jnp.arange(length + 1)[None] + 10
  inp, tgt = sp.tst_view(window, s, "input_only")
  np.testing.assert_array_equal(inp[0], [[10, 11], [12, 13], [14, 15]])
  np.testing.assert_array_equal(tgt[0, :, 0], [12, 14, 16])
  inp, tgt = sp.tst_view(window, s, "output_only")
  np.testing.assert_array_equal(inp[0], [10, 11, 12, 13, 14, 15])
  np.testing.assert_array_equal(tgt[0], [[11, 12], [12, 13], [13, 14], [14, 15], [15, 16],
                                         [16, -100]])
  with pytest.raises(ValueError, match="tst.mode"):
    sp.tst_view(window, s, "both")


def test_fold_errors():
  with pytest.raises(ValueError, match="not a multiple of bag_size 4"):
    sp.fold(jnp.zeros((2, 10), jnp.int32), 4)
  with pytest.raises(ValueError, match="bag_size must be an integer >= 1"):
    sp.fold(jnp.zeros((2, 10), jnp.int32), 0)
