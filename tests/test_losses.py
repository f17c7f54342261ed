"""MCE and MCE-alt: against the paper's appendix A PyTorch loss listing run in torch, a direct
float64 formula, and hypothesis properties, each with a `slow` twin of many examples."""

import functools
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from tst_jax import losses, platform
from tst_jax import superposition as sp

WEIGHTINGS = ["uniform", "power", "exponential", "first", "array", "fitted:paper"]
# The losses under jit, as a train step runs them: a new shape costs one compilation, not one
# per operation as in eager mode, which keeps the many shapes of the properties below fast.
mce = jax.jit(losses.mce_loss, static_argnames=("weighting", "variant", "ignore_index", "kl"))


@functools.partial(jax.jit, static_argnames=("variant",))
def mce_value_and_grad(logits, targets, variant="mce"):
  return jax.value_and_grad(lambda z: losses.mce_loss(z, targets, variant=variant))(logits)

SETTINGS = settings(max_examples=6, deadline=None)
MANY = settings(max_examples=300, deadline=None)    # each property's `slow` twin (end of file)
# Two float32 computations of one loss that differ only in summation order agree to a few ulp
# of the terms summed (logsumexp values of at most ~20 here), not of the result: near a loss
# of 0 (MCE-alt when the bag holds almost all the probability) that is a relative error far
# above any rtol (seen: 2.4e-7 on a loss of 0.0054, i.e. 2 ulp of 1.0 after -log, 4.4e-5
# relative). So an absolute tolerance of 16 float32 ulp of 1.0 (1.9e-6) sits beside rtol.
TOLERANCE = dict(rtol=1e-5, atol=16 * float(np.finfo(np.float32).eps))
# The bag is the whole vocabulary: MCE-alt is 0.0 in this order and 4.8e-7 in [0, 2, 1], the
# order default_rng(7) permutes it to (found by search; it fails with rtol alone).
NEAR_ZERO = (np.array([[-1.5174875, 5.161801, 4.018636]], np.float32), np.array([[0, 1, 2]]),
             np.random.default_rng(7))


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
      mce(jnp.asarray(logits), jnp.asarray(labels)[..., None]), ref.item(),
      rtol=1e-6)


def test_empty_column_is_left_out_and_all_ignored_is_zero():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(6, 11)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 11, size=(6, 3)))
  only_two = mce(logits, targets[:, :2])
  with_empty = mce(logits, targets.at[:, 2].set(-100))
  np.testing.assert_allclose(with_empty, only_two, rtol=1e-6)
  ignored = jnp.full((6, 3), -100)
  for variant in ("mce", "alt"):
    value, grad = mce_value_and_grad(logits, ignored, variant)
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
  got = mce(jnp.asarray(logits), jnp.asarray(targets), variant="alt", weighting=weighting)
  np.testing.assert_allclose(got, _alt_numpy(logits, targets, weights), rtol=1e-5)
  assert got >= 0


def test_alt_equals_mce_for_s1_and_kl_form():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(9, 17)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 17, size=(9, 1)))
  np.testing.assert_allclose(mce(logits, targets, variant="alt"),
                             mce(logits, targets), rtol=1e-6)
  # KL form: the paper's eq. L_MCE = mean CE - log S, zero at the uniform-on-bag optimum.
  bag = jnp.array([[1, 4, 7, 9]])
  z_opt = jnp.full((1, 17), -1e4).at[0, bag[0]].set(0.0)
  np.testing.assert_allclose(mce(z_opt, bag, kl=True), 0.0, atol=1e-5)
  np.testing.assert_allclose(mce(z_opt, bag), np.log(4), rtol=1e-6)


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
  np.testing.assert_allclose(per.mean(), mce(jnp.asarray(logits), jnp.asarray(targets)),
                             rtol=1e-5)


def test_the_loss_from_its_parts_is_the_loss(monkeypatch):
  """mce_from_parts, which the chunked and fused losses feed with each row's logsumexp and
  target logits (here from numpy), gives mce_loss's value for each variant."""
  rng = np.random.default_rng(9)
  logits = rng.normal(size=(6, 13)).astype(np.float32)
  targets = rng.integers(0, 13, size=(6, 3))
  targets[1, 0] = targets[4] = -100
  z = logits.astype(np.float64)
  lse = np.log(np.exp(z).sum(-1))
  picked = np.take_along_axis(z, np.where(targets < 0, 0, targets), -1)
  for variant in ("mce", "alt"):
    np.testing.assert_allclose(
        losses.mce_from_parts(jnp.asarray(lse, jnp.float32), jnp.asarray(picked, jnp.float32),
                              jnp.asarray(targets), weighting="power", variant=variant),
        losses.mce_loss(logits, targets, weighting="power", variant=variant), rtol=1e-5)
  # The z-loss of one row is z * its logsumexp squared.
  one = losses.mce_from_parts(jnp.asarray(lse[:1], jnp.float32),
                              jnp.asarray(picked[:1], jnp.float32), jnp.asarray(targets[:1]),
                              z_loss=0.5)
  np.testing.assert_allclose(one, losses.mce_loss(logits[:1], targets[:1]) + 0.5 * lse[0] ** 2,
                             rtol=1e-5)
  # MCE-alt of one row is -log of its bag's probability, a mean over that row alone.
  np.testing.assert_allclose(losses.mce_loss(logits[:1], targets[:1], variant="alt"),
                             _alt_numpy(logits[:1], targets[:1], np.ones(3)), rtol=1e-5)
  # And linear_mce_loss, by default, is mce_loss of hidden @ head: no z-loss unless asked, and
  # `auto` resolved to this platform's implementation.
  hidden = rng.normal(size=(6, 4)).astype(np.float32)
  head = rng.normal(size=(4, 13)).astype(np.float32)
  for impl in ("naive", "auto"):
    np.testing.assert_allclose(losses.linear_mce_loss(hidden, head, targets, impl=impl),
                               losses.mce_loss(hidden @ head, targets), rtol=1e-5)
  asked = []     # `auto` is what tst_jax.platform picks, and only `auto` asks it
  monkeypatch.setattr(platform, "loss_impl", lambda impl: asked.append(impl) or ("naive", ""))
  for impl in ("auto", "naive"):
    losses.linear_mce_loss(hidden, head, targets, impl=impl)
  assert asked == ["auto"]


def test_bad_weighting_and_variant():
  with pytest.raises(ValueError, match="unknown weighting"):
    losses.bag_weights("cubic", 4)
  with pytest.raises(ValueError, match="bag size is 4"):
    losses.bag_weights([1.0, 2.0], 4)
  for bad in ([1.0, -0.5], [0.0, 0.0], [np.nan, 1.0], [np.inf, 1.0]):   # each fault alone
    with pytest.raises(ValueError, match=r"must be finite, >= 0 and not all zero"):
      losses.bag_weights(bad, 2)
  np.testing.assert_array_equal(losses.bag_weights([0.0, 2.0], 2), [0.0, 2.0])
  with pytest.raises(ValueError, match="variant"):
    losses.mce_loss(jnp.zeros((2, 5)), jnp.zeros((2, 1), jnp.int32), variant="hinge")


def test_fitted_weights_are_a_files_weights_or_its_fit(tmp_path):
  """'fitted:F.json', tst_jax.analysis.mutual_info's output: its first S weights where it has
  at least S, else its fit C0 + a·d^k at d = 1..S, at the top or under "fit"; 'fitted:paper'
  is appendix D's fit. A file with neither, or no file, is one ValueError naming it."""
  fit = dict(C0=0.5, a=2.0, k=-1.5)
  d = np.arange(1, 6, dtype=np.float64)
  (tmp_path / "both.json").write_text(json.dumps(dict(weights=[4, 3, 2, 1], fit=fit)))
  (tmp_path / "top.json").write_text(json.dumps(fit))
  (tmp_path / "short.json").write_text(json.dumps(dict(weights=[1.0])))
  both = f"fitted:{tmp_path}/both.json"
  np.testing.assert_allclose(losses.bag_weights(both, 4), [4, 3, 2, 1])
  np.testing.assert_allclose(losses.bag_weights(both, 3), [4, 3, 2])
  np.testing.assert_allclose(losses.bag_weights(both, 5), 0.5 + 2.0 * d ** -1.5, rtol=1e-6)
  np.testing.assert_allclose(losses.bag_weights(f"fitted:{tmp_path}/top.json", 5),
                             0.5 + 2.0 * d ** -1.5, rtol=1e-6)
  np.testing.assert_allclose(losses.bag_weights("fitted:paper", 5),
                             3.63 + 1.35 * d ** -1.25, rtol=1e-6)
  with pytest.raises(ValueError, match="has neither 'weights' for 4 positions nor a fit"):
    losses.bag_weights(f"fitted:{tmp_path}/short.json", 4)
  with pytest.raises(ValueError, match="cannot read fitted weighting file"):
    losses.bag_weights(f"fitted:{tmp_path}/missing.json", 4)


def test_per_position_losses_and_the_mask_of_positions_with_a_weighted_target():
  """Per position, in float64 here: MCE the weighted mean of -log p over the valid targets,
  MCE-alt -log of their total probability; a position with one valid target counts, one with
  none or only weight-0 targets ('first' with its first ignored) is 0 and masked out."""
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(4, 7)).astype(np.float32)
  targets = np.array([[1, 2, 2], [-100, -100, -100], [3, -100, -100], [-100, 4, 5]])
  z = logits.astype(np.float64)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  p = np.exp(logp)
  per, mask = losses.mce_loss_per_position(logits, targets, weighting="power")
  w = np.array([1, 1 / 2, 1 / 3])
  expect = [(w * -logp[0, [1, 2, 2]]).sum() / w.sum(), 0.0, -logp[2, 3],
            (w[1:] * -logp[3, [4, 5]]).sum() / w[1:].sum()]
  np.testing.assert_allclose(per, expect, **TOLERANCE)
  np.testing.assert_array_equal(mask, [True, False, True, True])
  per, mask = losses.mce_loss_per_position(logits, targets, variant="alt")
  expect = [-np.log(p[0, 1] + p[0, 2]), 0.0, -logp[2, 3], -np.log(p[3, 4] + p[3, 5])]
  np.testing.assert_allclose(per, expect, **TOLERANCE)
  np.testing.assert_array_equal(mask, [True, False, True, True])
  for variant in ("mce", "alt"):
    per, mask = losses.mce_loss_per_position(logits, targets, weighting="first",
                                             variant=variant)
    np.testing.assert_allclose(per, [-logp[0, 1], 0.0, -logp[2, 3], 0.0], **TOLERANCE)
    np.testing.assert_array_equal(mask, [True, False, True, False])


def test_no_weighted_target_is_a_loss_of_zero():
  """'first' with every first target ignored: nothing is weighted, so 0 and no gradient."""
  logits = jnp.asarray(np.random.default_rng(6).normal(size=(3, 7)).astype(np.float32))
  targets = jnp.array([[-100, 1, 2], [-100, 3, 3], [-100, -100, 4]])
  value_and_grad = jax.jit(jax.value_and_grad(losses.mce_loss),
                           static_argnames=("weighting", "variant"))
  for variant in ("mce", "alt"):
    value, grad = value_and_grad(logits, targets, weighting="first", variant=variant)
    assert value == 0.0 and not np.any(grad)


def test_kl_form_subtracts_the_targets_entropy_for_any_weighting():
  """kl=True is MCE less the entropy of the normalised weights: log S for uniform, 0 for
  'first', -sum q log q with q the normalised 1/i for 'power'."""
  rng = np.random.default_rng(8)
  logits = jnp.asarray(rng.normal(size=(5, 11)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 11, size=(5, 3)))
  q = np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3)
  for weighting, entropy in (("uniform", np.log(3)), ("first", 0.0),
                             ("power", -(q * np.log(q)).sum())):
    np.testing.assert_allclose(mce(logits, targets, weighting=weighting, kl=True),
                               mce(logits, targets, weighting=weighting) - entropy,
                               **TOLERANCE)
  # MCE-alt has no KL form: kl leaves it as it is.
  np.testing.assert_array_equal(mce(logits, targets, variant="alt", kl=True),
                                mce(logits, targets, variant="alt"))


def test_the_leading_dimensions_must_agree():
  with pytest.raises(ValueError, match=r"logits \(2, 5, 7\) and targets \(2, 4, 3\) disagree"):
    losses.mce_loss(jnp.zeros((2, 5, 7)), jnp.zeros((2, 4, 3), jnp.int32))
  hidden, head = jnp.zeros((4, 8)), jnp.zeros((8, 7))
  with pytest.raises(ValueError, match=r"hidden \(4, 8\) and targets \(5, 2\) disagree"):
    losses.linear_mce_loss(hidden, head, jnp.zeros((5, 2), jnp.int32))
  with pytest.raises(ValueError, match="unknown impl 'fast'"):
    losses.linear_mce_loss(hidden, head, jnp.zeros((4, 2), jnp.int32), impl="fast")
  with pytest.raises(ValueError, match="unknown loss variant 'hinge'"):
    losses.linear_mce_loss(hidden, head, jnp.zeros((4, 2), jnp.int32), variant="hinge")
  with pytest.raises(TypeError, match=r"impl='naive' takes no chunk arguments, got \['block_n'\]"):
    losses.linear_mce_loss(hidden, head, jnp.zeros((4, 2), jnp.int32), impl="naive", block_n=8)


@st.composite
def bags_and_logits(draw, max_s=6):
  s = draw(st.integers(1, max_s))
  n = draw(st.integers(1, 6))
  v = draw(st.integers(2, 12))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(n, v)).astype(np.float32) * 3
  targets = rng.integers(0, v, size=(n, s))
  # Half the cases ignore nothing: the properties that hold only for full bags need them.
  ignored = draw(st.one_of(st.just(0.0), st.floats(0, 1)))
  targets[rng.random((n, s)) < ignored] = -100
  return logits, targets, rng


@st.composite
def full_bags(draw):
  """Three rows of bags of 6 tokens of a vocabulary of 4, nothing ignored, so that every bag
  repeats a token, and a weighting: the cases where MCE-alt <= MCE holds row by row. One shape
  for every case, so the jitted losses compile once per weighting."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  logits = rng.normal(size=(3, 4)).astype(np.float32) * 3
  return logits, rng.integers(0, 4, size=(3, 6)), draw(st.sampled_from(WEIGHTINGS[:4]))


@SETTINGS
@given(bags_and_logits())
@example(NEAR_ZERO)
def test_uniform_loss_invariant_to_permuting_each_bag(case):
  uniform_loss_invariant_to_permuting_each_bag(case)


def uniform_loss_invariant_to_permuting_each_bag(case):
  logits, targets, rng = case
  permuted = np.stack([row[rng.permutation(len(row))] for row in targets])
  # With ignored entries a permutation moves them between columns, which changes the
  # per-column averaging; without ignored entries the uniform loss must not change.
  if (targets != -100).all():
    for variant in ("mce", "alt"):
      np.testing.assert_allclose(mce(logits, permuted, variant=variant),
                                 mce(logits, targets, variant=variant), **TOLERANCE)
  np.testing.assert_allclose(mce(logits, permuted, variant="alt"),
                             mce(logits, targets, variant="alt"), **TOLERANCE)


@SETTINGS
@given(bags_and_logits())
def test_losses_are_finite_nonnegative_and_zero_when_all_ignored(case):
  losses_are_finite_nonnegative_and_zero_when_all_ignored(case)


def losses_are_finite_nonnegative_and_zero_when_all_ignored(case):
  logits, targets, _ = case
  for variant in ("mce", "alt"):
    value, grad = mce_value_and_grad(logits, targets, variant)
    # >= 0 up to float32 rounding (TOLERANCE): a bag holding the whole vocabulary gives -2e-7
    assert np.isfinite(value) and value >= -TOLERANCE["atol"] and np.all(np.isfinite(grad))
    if (targets == -100).all():
      assert value == 0


# A row that is one token six times, where MCE-alt equals MCE, beside two of repeats.
@SETTINGS
@given(full_bags())
@example((np.array([[0.5, 2.0, -1.0, 0.0], [3.0, 0.0, 1.0, -2.0], [1.0, 1.0, 4.0, 0.0]],
                   np.float32),
          np.array([[1, 1, 1, 1, 1, 1], [2, 0, 2, 3, 3, 0], [0, 1, 2, 3, 2, 2]]), "power"))
def test_alt_is_never_above_mce_on_full_bags(case):
  alt_is_never_above_mce_on_full_bags(case)


def alt_is_never_above_mce_on_full_bags(case):
  """With nothing ignored each row's MCE is a weighted mean of -log p over its bag's tokens
  of weight > 0, and its MCE-alt is -log of their total probability, which is <= each term:
  so MCE-alt <= MCE for any rows, repeats and weighting (equal where a row has one token)."""
  logits, targets, weighting = case
  alt = float(mce(logits, targets, variant="alt", weighting=weighting))
  full = float(mce(logits, targets, weighting=weighting))
  assert alt <= full + TOLERANCE["atol"], (alt, full)
  weights = losses.bag_weights(weighting, targets.shape[1])
  np.testing.assert_allclose(alt, _alt_numpy(logits, targets, weights), **TOLERANCE)
  if all(len(set(row[weights > 0])) == 1 for row in targets):
    np.testing.assert_allclose(alt, full, **TOLERANCE)


@SETTINGS
@given(bags_and_logits(max_s=1))
def test_s1_equals_cross_entropy(case):
  s1_equals_cross_entropy(case)


def s1_equals_cross_entropy(case):
  logits, targets, _ = case
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  valid = targets[:, 0] != -100
  expect = -logp[valid, targets[valid, 0]].mean() if valid.any() else 0.0
  np.testing.assert_allclose(mce(logits, targets), expect, rtol=1e-5, atol=1e-6)


def test_a_bag_of_the_whole_vocabulary_is_zero_within_the_absolute_tolerance():
  """A bag of every token has MCE-alt exactly 0, -log of a total probability of 1: in every
  order of the bag float32 gives 0 within TOLERANCE's atol, where no rtol can accept a rounding
  error against 0, and MCE gives the float64 mean of -log p."""
  logits, targets, _ = NEAR_ZERO
  z = logits.astype(np.float64)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  for order in itertools.permutations(range(3)):
    bag = targets[:, order]
    assert abs(float(mce(logits, bag, variant="alt"))) <= TOLERANCE["atol"], order
    np.testing.assert_allclose(mce(logits, bag), -logp.mean(), **TOLERANCE)


# The slow twins: every property above with MANY examples (python -m pytest -m slow).
@pytest.mark.slow
@MANY
@given(bags_and_logits())
def test_uniform_loss_invariant_to_permuting_each_bag_many(case):
  uniform_loss_invariant_to_permuting_each_bag(case)


@pytest.mark.slow
@MANY
@given(bags_and_logits())
def test_losses_are_finite_nonnegative_and_zero_when_all_ignored_many(case):
  losses_are_finite_nonnegative_and_zero_when_all_ignored(case)


@pytest.mark.slow
@MANY
@given(full_bags())
def test_alt_is_never_above_mce_on_full_bags_many(case):
  alt_is_never_above_mce_on_full_bags(case)


@pytest.mark.slow
@MANY
@given(bags_and_logits(max_s=1))
def test_s1_equals_cross_entropy_many(case):
  s1_equals_cross_entropy(case)
