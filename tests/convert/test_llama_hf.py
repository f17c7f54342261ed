"""Llama <-> Hugging Face conversion: logits against transformers' LlamaForCausalLM."""

import json

import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from tests.fixtures import hf_llama
from tests.fixtures.hf_llama import (B, L, LLAMA3, SHAPE, hf_logits, make_hf, tokens,
                                     tst_logits)
from tst_jax import platform
from tst_jax.convert import hf, reading
from tst_jax.models import llama


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  return hf_llama.untied(tmp_path_factory)


def test_logits_match_hf(untied):
  model, _, tst = untied
  assert tst.cfg.n_kv_heads == 2 and tst.cfg.rope_theta == 12345.0
  assert not tst.cfg.tie_embeddings and tst.cfg.rope_scaling is None
  x = tokens((B, L))
  np.testing.assert_allclose(tst_logits(tst, x), hf_logits(model, x), atol=1e-4, rtol=0)


def test_to_hf_round_trip(untied, tmp_path):
  model, _, tst = untied
  hf.to_hf(tst, tmp_path / "out")
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert written["architectures"] == ["LlamaForCausalLM"] and written["model_type"] == "llama"
  assert written["torch_dtype"] == "float32" and written["tie_word_embeddings"] is False
  back = transformers.LlamaForCausalLM.from_pretrained(
      tmp_path / "out", attn_implementation="eager").float().eval()
  x = tokens((B, L), seed=2)
  np.testing.assert_allclose(hf_logits(back, x), hf_logits(model, x), atol=1e-5, rtol=0)
  # HF configs hold no implementation choice: read back, `auto` resolves as the model's did.
  assert platform.resolved_model(hf.config_from_hf(tmp_path / "out")) == tst.cfg


def test_tied_embeddings(tmp_path):
  model = make_hf(seed=3, tie_word_embeddings=True)
  model.save_pretrained(tmp_path / "in")
  tst = hf.from_hf(tmp_path / "in")
  assert tst.cfg.tie_embeddings and "lm_head" not in nnx.to_pure_dict(nnx.state(tst))
  x = tokens((B, L), seed=4)
  np.testing.assert_allclose(tst_logits(tst, x), hf_logits(model, x), atol=1e-4, rtol=0)
  hf.to_hf(tst, tmp_path / "out")
  assert "lm_head.weight" not in load_file(tmp_path / "out" / "model.safetensors")
  back = transformers.LlamaForCausalLM.from_pretrained(
      tmp_path / "out", attn_implementation="eager").float().eval()
  assert back.config.tie_word_embeddings
  np.testing.assert_allclose(hf_logits(back, x), hf_logits(model, x), atol=1e-5, rtol=0)


def test_llama3_rope_scaling(tmp_path):
  model = make_hf(seed=5, rope_scaling=LLAMA3)
  model.save_pretrained(tmp_path / "in")
  tst = hf.from_hf(tmp_path / "in")
  assert tst.cfg.rope_scaling == (8.0, 1.0, 4.0, 64)
  x = tokens((B, L), seed=6)
  np.testing.assert_allclose(tst_logits(tst, x), hf_logits(model, x), atol=1e-4, rtol=0)
  hf.to_hf(tst, tmp_path / "out")
  assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_scaling"][
      "rope_type"] == "llama3"
  back = transformers.LlamaForCausalLM.from_pretrained(
      tmp_path / "out", attn_implementation="eager").float().eval()
  np.testing.assert_allclose(hf_logits(back, x), hf_logits(model, x), atol=1e-5, rtol=0)


def test_sharded_bfloat16_checkpoint(tmp_path):
  """Sharded index + bfloat16 tensors (numpy has no bfloat16: the reader's own path)."""
  make_hf(seed=7).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="40KB")
  assert (tmp_path / "model.safetensors.index.json").exists()
  # Reloaded in float32: `.to(bfloat16)` also rounds HF's RoPE frequencies, tst_jax's do not.
  model = transformers.LlamaForCausalLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
  tst = hf.from_hf(tmp_path)
  x = tokens((B, L), seed=8)
  np.testing.assert_allclose(tst_logits(tst, x), hf_logits(model, x), atol=1e-4, rtol=0)


def test_config_from_hf_without_weights():
  cfg = hf.config_from_hf({"model_type": "llama", **SHAPE}, dtype="bfloat16", remat="full")
  assert (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (64, 4, 2, 16)
  assert (cfg.dtype, cfg.remat, cfg.norm_eps) == ("bfloat16", "full", 1e-5)
  # transformers<5 spelling of llama3 scaling, explicit head_dim.
  old = {"model_type": "llama", **SHAPE, "head_dim": 32,
         "rope_scaling": {"type": "llama3", **{k: v for k, v in LLAMA3.items()
                                               if k != "rope_type"}}}
  cfg = hf.config_from_hf(old)
  assert cfg.head_dim == 32 and cfg.rope_scaling == (8.0, 1.0, 4.0, 64)
  with pytest.raises(ValueError, match="bogus"):
    hf.config_from_hf({"model_type": "llama", **SHAPE}, bogus=1)


@pytest.mark.parametrize("extra, message", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "yarn"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "linear"),
])
def test_unsupported_features(extra, message):
  with pytest.raises(ValueError, match=message):
    hf.config_from_hf({"model_type": "llama", **SHAPE, **extra})


def test_refuses_non_empty_dir(untied, tmp_path):
  _, _, tst = untied
  (tmp_path / "notes.txt").write_text("keep")
  with pytest.raises(ValueError, match="not empty"):
    hf.to_hf(tst, tmp_path)
  hf.to_hf(tst, tmp_path, overwrite=True)
  assert (tmp_path / "model.safetensors").exists() and (tmp_path / "notes.txt").exists()


def _copy_checkpoint(src, dst, edit):
  dst.mkdir()
  (dst / "config.json").write_text((src / "config.json").read_text())
  tensors = load_file(src / "model.safetensors")
  edit(tensors)
  save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def test_mis_shaped_and_missing_tensors(untied, tmp_path):
  _, src, _ = untied
  name = "model.layers.1.self_attn.k_proj.weight"

  def reshape(t):
    t[name] = np.zeros((24, 64), np.float32)

  _copy_checkpoint(src, tmp_path / "bad", reshape)
  with pytest.raises(ValueError, match=rf"{name}.*\(24, 64\).*\(32, 64\)"):
    hf.from_hf(tmp_path / "bad")
  _copy_checkpoint(src, tmp_path / "missing", lambda t: t.pop("model.norm.weight"))
  with pytest.raises(ValueError, match=r"missing tensor 'model.norm.weight'"):
    hf.from_hf(tmp_path / "missing")
  with pytest.raises(ValueError, match=r"unknown LlamaConfig overrides \['bogus'\]"):
    reading.make_config(llama.LlamaConfig, {}, {"bogus": 1})

  def add_bias(t):
    t["model.layers.0.self_attn.q_proj.bias"] = np.zeros((64,), np.float32)

  _copy_checkpoint(src, tmp_path / "extra", add_bias)
  with pytest.raises(ValueError, match=r"does not map.*q_proj\.bias"):
    hf.from_hf(tmp_path / "extra")


def test_unknown_model_type_and_missing_files(untied, tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(ValueError, match="'gpt2'.*llama"):
    hf.from_hf(tmp_path)
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.from_hf(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **SHAPE}))
    hf.from_hf(tmp_path)
  with pytest.raises(TypeError, match="no Hugging Face family"):
    hf.to_hf(object(), tmp_path / "x")
