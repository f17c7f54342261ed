"""The Llama model: float32 parameters named by their logical sharding axes, and bags of tokens
that change only the embedding (Hugging Face's LlamaForCausalLM fed the bag means agrees)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures import hf_llama
from tests.fixtures.hf_llama import B, L, S, hf_logits, tokens, tst_logits


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  return hf_llama.untied(tmp_path_factory)


def test_params_are_float32_and_named(untied):
  _, _, tst = untied
  state = nnx.state(tst, nnx.Param)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state))
  assert state["blocks"]["attn"]["q_proj"].get_metadata()["out_sharding"] == (
      "layers", "embed", "heads", "head_dim")


def test_bags_only_change_the_embedding(untied):
  """Bags [B, l, S] == tokens whose embedding is the mean of the bag's S embeddings."""
  model, _, tst = untied
  bags_BxlxS = tokens((B, L // S, S), seed=9)
  table_VxD = np.asarray(tst.embed.table[...])
  mean_BxlxD = table_VxD[bags_BxlxS].astype(np.float64).mean(axis=2).astype(np.float32)
  # The same model, its first B*l rows replaced by the bag means, read by plain tokens
  # (padded to length L to reuse the compiled [B, L] forward; causal, so the first l agree).
  replaced = nnx.clone(tst)
  n = B * (L // S)
  replaced.embed.table[...] = jnp.asarray(table_VxD).at[:n].set(mean_BxlxD.reshape(n, -1))
  ids_BxL = np.zeros((B, L), np.int32)
  ids_BxL[:, :L // S] = np.arange(n).reshape(B, L // S)
  bag_logits = tst_logits(tst, bags_BxlxS)
  np.testing.assert_allclose(bag_logits, tst_logits(replaced, ids_BxL)[:, :L // S],
                             atol=1e-5, rtol=0)
  np.testing.assert_allclose(bag_logits, hf_logits(model, embeds_BxLxD=mean_BxlxD),
                             atol=1e-4, rtol=0)
