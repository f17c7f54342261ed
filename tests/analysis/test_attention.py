"""The attention probe (tst_jax/analysis/attention.py): each layer's entropy against the
attention weights transformers' LlamaForCausalLM returns for the same weights and tokens, and
the bag input's scale against the embedding table's rows."""

import numpy as np
import pytest
import torch

from tests.fixtures import hf_llama
from tests.fixtures.hf_llama import B, L, S, tokens
from tst_jax.analysis import attention


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  return hf_llama.untied(tmp_path_factory)


def _entropy_of(weights_BxHxLxL) -> np.ndarray:
  """Each head's mean over the batch and the queries after the first of the entropy of its
  weights over the positions the query sees, over log(their number): written out."""
  batch, heads, length, _ = weights_BxHxLxL.shape
  out = np.zeros(heads)
  for h in range(heads):
    values = []
    for b in range(batch):
      for q in range(1, length):
        p = weights_BxHxLxL[b, h, q, :q + 1].astype(np.float64)
        values.append(-np.sum(p * np.log(p)) / np.log(q + 1))
    out[h] = np.mean(values)
  return out


def test_each_layers_stats_are_those_of_hfs_attention_weights(untied):
  """Entropy, the weight on the query itself and on the first position, per layer and head."""
  model, _, tst = untied
  x = tokens((B, L), seed=5)
  with torch.no_grad():
    weights = [w.numpy() for w in model(torch.from_numpy(x).long(),
                                        output_attentions=True).attentions]   # [B, H, L, L]
  got = attention.attention_stats(tst, x)
  assert got["entropy"].shape == (2, 4)
  np.testing.assert_allclose(got["entropy"], np.stack([_entropy_of(w) for w in weights]),
                             rtol=1e-4)
  on_self = [np.diagonal(w, axis1=-2, axis2=-1)[..., 1:].mean(axis=(0, 2)) for w in weights]
  np.testing.assert_allclose(got["self"], np.stack(on_self), rtol=1e-4)
  np.testing.assert_allclose(got["first"], np.stack([w[..., 1:, 0].mean(axis=(0, 2))
                                                     for w in weights]), rtol=1e-4)
  assert 0.05 < got["entropy"].min() and got["entropy"].max() < 0.999   # neither extreme
  np.testing.assert_array_equal(attention.attention_entropy(tst, x), got["entropy"])


def test_a_head_with_no_query_attends_uniformly_and_a_sharp_one_to_one_position():
  rng = np.random.default_rng(0)
  k = rng.normal(size=(2, 6, 1, 8)).astype(np.float32)
  np.testing.assert_allclose(attention.head_entropy(np.zeros((2, 6, 2, 8), np.float32), k),
                             [1.0, 1.0], rtol=1e-6)
  sharp_k = np.zeros((1, 6, 1, 8), np.float32)
  sharp_k[0, 0, 0, 0] = 1.0                           # every query sees position 0 first
  sharp_q = np.zeros((1, 6, 1, 8), np.float32)
  sharp_q[..., 0] = 1e4
  assert float(attention.head_entropy(sharp_q, sharp_k)[0]) < 1e-3


def test_the_input_scale_of_bags_is_their_mean_embeddings_rms_over_the_tokens(untied):
  _, _, tst = untied
  bags = tokens((B, L, S), seed=6)
  table = np.asarray(tst.embed.table[...])
  rms = lambda x: np.sqrt(np.mean(np.square(x)))
  want = rms(table[bags].mean(axis=2)) / rms(table[bags])
  assert attention.input_scale(tst, bags) == pytest.approx(want, rel=1e-5)
  same = np.repeat(bags[..., :1], S, axis=2)           # a bag of one token S times: its input
  assert attention.input_scale(tst, same) == pytest.approx(1.0, rel=1e-5)
  assert want < 0.8                                    # random rows: near 1 / sqrt(S)
