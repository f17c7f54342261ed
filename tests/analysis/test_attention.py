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


def test_the_entropy_of_each_layer_is_that_of_hfs_attention_weights(untied):
  model, _, tst = untied
  x = tokens((B, L), seed=5)
  with torch.no_grad():
    weights = model(torch.from_numpy(x).long(), output_attentions=True).attentions
  want = np.stack([_entropy_of(w.numpy()) for w in weights])           # [layers, H]
  got = attention.attention_entropy(tst, x)
  assert got.shape == (2, 4)
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert 0.05 < got.min() and got.max() < 0.999       # neither one-hot nor uniform


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
