"""fold, bag_targets, superpose, the phase views and the switch: against the paper's appendix A
PyTorch listings run in torch, written-out cases, and hypothesis properties, each with a `slow`
twin of many examples."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tst_jax import superposition as sp

SETTINGS = settings(max_examples=6, deadline=None)
MANY = settings(max_examples=300, deadline=None)    # each property's `slow` twin (end of file)


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
  """Two rows, the second the first + 20: every row gets its own inputs and targets."""
  s, length = 2, 6
  window = jnp.arange(length + 1)[None] + jnp.array([[10], [30]])
  inp, tgt = sp.tst_view(window, s, "input_only")
  np.testing.assert_array_equal(inp, [[[10, 11], [12, 13], [14, 15]],
                                      [[30, 31], [32, 33], [34, 35]]])
  np.testing.assert_array_equal(tgt, [[[12], [14], [16]], [[32], [34], [36]]])
  inp, tgt = sp.tst_view(window, s, "output_only")
  np.testing.assert_array_equal(inp, [[10, 11, 12, 13, 14, 15], [30, 31, 32, 33, 34, 35]])
  expect = np.array([[11, 12], [12, 13], [13, 14], [14, 15], [15, 16], [16, -100]])
  np.testing.assert_array_equal(tgt, [expect, np.where(expect < 0, -100, expect + 20)])
  with pytest.raises(ValueError, match="tst.mode"):
    sp.tst_view(window, s, "both")


@pytest.mark.parametrize("mode", sp.PHASE_MODES)
def test_a_window_of_data_length_plus_one_gives_the_phase_its_l_positions(mode):
  """data_length is T = S·L for full and input_only (L bags of S tokens) and L for
  output_only and ntp (single tokens in); the phase's view of a window of T + 1 tokens has
  those L positions, with a loss target per position."""
  s, latent = 3, 4
  expect = {"full": s * latent, "input_only": s * latent}.get(mode, latent)
  assert sp.data_length(latent, s if mode != "ntp" else 1, mode) == expect
  window = jnp.arange(expect + 1)[None]
  inputs, targets = (sp.ntp_view(window) if mode == "ntp" else sp.tst_view(window, s, mode))
  assert inputs.shape[1] == targets.shape[1] == latent
  with pytest.raises(ValueError, match="a phase's mode must be one of"):
    sp.data_length(latent, s, "bags")


def test_the_switch_keeps_everything_or_takes_the_io_layers_from_fresh():
  """Without `fresh` the tree itself (the paper); with it, the leaves under embed and
  lm_head come from fresh and every other leaf from the tree (the ablation)."""
  tree = {"embed": {"table": 1}, "layers": {"w": 2, "lm_head_like": 3}, "lm_head": {"w": 4}}
  fresh = {"embed": {"table": 10}, "layers": {"w": 20, "lm_head_like": 30},
           "lm_head": {"w": 40}}
  assert sp.switch_to_next_token(tree) is tree
  assert sp.switch_to_next_token(tree, fresh) == {
      "embed": {"table": 10}, "layers": {"w": 2, "lm_head_like": 3}, "lm_head": {"w": 40}}
  assert sp.switch_to_next_token(tree, fresh, io_params=("layers",)) == {
      "embed": {"table": 1}, "layers": {"w": 20, "lm_head_like": 30}, "lm_head": {"w": 4}}


def test_fold_errors():
  with pytest.raises(ValueError, match="not a multiple of bag_size 4"):
    sp.fold(jnp.zeros((2, 10), jnp.int32), 4)
  with pytest.raises(ValueError, match="bag_size must be an integer >= 1"):
    sp.fold(jnp.zeros((2, 10), jnp.int32), 0)


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 3))
def test_fold_then_flatten_is_identity_and_targets_shift(s, bags, batch):
  fold_then_flatten_is_identity_and_targets_shift(s, bags, batch)


def fold_then_flatten_is_identity_and_targets_shift(s, bags, batch):
  tokens = np.arange(batch * bags * s).reshape(batch, bags * s)
  folded = sp.fold(tokens, s)
  np.testing.assert_array_equal(folded.reshape(batch, -1), tokens)
  targets = sp.bag_targets(tokens, s)
  flat = np.asarray(targets).reshape(batch, -1)
  # Target position p holds label p + S - 1 (or ignore past the end).
  expect = np.where(np.arange(bags * s) + s - 1 < bags * s,
                    np.pad(tokens, ((0, 0), (0, s - 1)), constant_values=-100)[:, s - 1:], -100)
  np.testing.assert_array_equal(flat, expect)


@SETTINGS
@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_superpose_is_order_free_mean_and_s1_lookup(s, seed):
  superpose_is_order_free_mean_and_s1_lookup(s, seed)


def superpose_is_order_free_mean_and_s1_lookup(s, seed):
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(11, 5)).astype(np.float32)
  bags = rng.integers(0, 11, size=(2, 3, s))
  got = sp.superpose(jnp.asarray(table), jnp.asarray(bags))
  np.testing.assert_allclose(got, table[bags].mean(axis=-2), rtol=1e-5, atol=1e-6)
  reversed_bags = bags[..., ::-1]
  np.testing.assert_allclose(sp.superpose(jnp.asarray(table), jnp.asarray(reversed_bags)), got,
                             rtol=1e-5, atol=1e-6)


# The slow twins: every property above with MANY examples (python -m pytest -m slow).
@pytest.mark.slow
@MANY
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 3))
def test_fold_then_flatten_is_identity_and_targets_shift_many(s, bags, batch):
  fold_then_flatten_is_identity_and_targets_shift(s, bags, batch)


@pytest.mark.slow
@MANY
@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_superpose_is_order_free_mean_and_s1_lookup_many(s, seed):
  superpose_is_order_free_mean_and_s1_lookup(s, seed)


EOS = 9


def test_document_ids_count_the_eos_before_each_token():
  window = jnp.array([[1, 2, EOS, 3, EOS, 4, 5]])
  np.testing.assert_array_equal(sp.document_ids(window, EOS), [[0, 0, 0, 1, 1, 2, 2]])


def test_document_view_keeps_each_position_to_its_own_documents_targets():
  """ntp: an EOS predicts nothing (the next document's first token is no one's target);
  tst full, S = 2: a bag is its first token's document, and of its next bag only that
  document's tokens are targets; output_only likewise per token."""
  window = jnp.array([[1, 2, EOS, 3, 4, 5, EOS, 6, 7]])           # W = 9: T = 8, L = 4 at S 2
  ig = sp.IGNORE_INDEX
  inputs, targets, docs = sp.document_view(window, EOS, sp.ntp_view)
  np.testing.assert_array_equal(inputs, window[:, :-1])
  np.testing.assert_array_equal(targets, [[2, EOS, ig, 4, 5, EOS, ig, 7]])
  np.testing.assert_array_equal(docs, [[0, 0, 0, 1, 1, 1, 1, 2]])
  view = lambda w: sp.tst_view(w, 2, "full")
  inputs, targets, docs = sp.document_view(window, EOS, view)
  # bags [1 2] [EOS 3] [4 5] [EOS 6]; their next bags [EOS 3] [4 5] [EOS 6] [7 -]
  np.testing.assert_array_equal(inputs, [[[1, 2], [EOS, 3], [4, 5], [EOS, 6]]])
  np.testing.assert_array_equal(docs, [[0, 0, 1, 1]])
  np.testing.assert_array_equal(targets, [[[EOS, ig], [ig, ig], [EOS, ig], [ig, ig]]])
  unmasked = sp.tst_view(window, 2, "full")[1]
  assert not np.array_equal(unmasked, targets)                   # masks changed the targets
  _, targets, docs = sp.document_view(window, EOS, lambda w: sp.tst_view(w, 2, "output_only"))
  np.testing.assert_array_equal(docs, [[0, 0, 0, 1, 1, 1, 1, 2]])
  np.testing.assert_array_equal(targets[0, 1], [EOS, ig])        # token 2: EOS, then doc 1's 3
  np.testing.assert_array_equal(targets[0, 3], [4, 5])


@pytest.mark.parametrize("bag_size", [2, 4])
def test_a_document_loses_s_targets_at_a_bag_boundary_and_more_inside_a_bag(bag_size):
  """Of the tst targets, a document that starts on a bag boundary loses its first bag, S, as
  it does in a window of its own; one that starts j tokens into a bag also loses its S - j
  tokens there: 2S - j (docs/data.md, "Document masks")."""
  s, latent = bag_size, 6
  for j in range(s):
    window = np.full((1, s * latent + 1), 1, np.int32)
    window[0, 2 * s + j - 1] = EOS                  # the second document starts at 2S + j
    _, plain = sp.tst_view(jnp.asarray(window), s, "full")
    _, masked, _ = sp.document_view(jnp.asarray(window), EOS,
                                    lambda w: sp.tst_view(w, s, "full"))
    counted = np.asarray(plain) != sp.IGNORE_INDEX
    lost = int((counted & (np.asarray(masked) == sp.IGNORE_INDEX)).sum())
    assert lost == (s if j == 0 else 2 * s - j), (s, j, lost)


def test_document_positions_restart_at_each_document():
  docs = jnp.array([[0, 0, 0, 1, 1, 2], [3, 3, 3, 3, 4, 4]])
  np.testing.assert_array_equal(sp.document_positions(docs),
                                [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
