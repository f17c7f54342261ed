"""Llama family: converts between Hugging Face's `LlamaForCausalLM` and tst_jax's `Llama`.

HF linear weights are [out, in]. tst_jax kernels are [in, out], split per head as q [D, H, G],
k and v [D, K, G], o [H, G, D], and stacked over layers on a leading axis. q and k need no
permutation: `layers.apply_rope` uses HF's rotate-half layout, the layout HF's Llama
checkpoints are stored in, as the logits tests check.
"""

from __future__ import annotations

import numpy as np

from tst_jax.convert import reading
from tst_jax.models.llama import LlamaConfig

ARCHITECTURE = "LlamaForCausalLM"
# Rotary buffers saved by older transformers, and the head of tied models when saved anyway.
IGNORED = (r"\.rotary_emb\.inv_freq$", r"^lm_head\.weight$")
# tst_jax does not track a maximum length. It is written as metadata only, and default RoPE
# ignores it.
MAX_POSITIONS = 8192


def _require(hf: dict, key: str):
  if hf.get(key) is None:
    raise ValueError(f"Llama config.json lacks {key!r}")
  return hf[key]


def _rope(hf: dict):
  """Reads rope_theta and rope_scaling from transformers>=5 `rope_parameters` or <5 fields."""
  params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}   # transformers' priority
  theta = float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
  kind = params.get("rope_type", params.get("type", "default"))
  if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
    raise ValueError("partial_rotary_factor != 1 is not supported")
  if kind == "default":
    return theta, None
  if kind == "llama3":
    original = params.get("original_max_position_embeddings",
                          hf.get("max_position_embeddings"))
    return theta, (float(params["factor"]), float(params["low_freq_factor"]),
                   float(params["high_freq_factor"]), int(original))
  raise ValueError(f"unsupported rope type {kind!r}: tst_jax supports 'default' and 'llama3'")


def config_from_hf(hf: dict, **overrides) -> LlamaConfig:
  for flag in ("attention_bias", "mlp_bias"):
    if hf.get(flag):
      raise ValueError(f"{flag}=true is not supported (tst_jax Llama has no biases)")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (only silu)")
  heads, dim = _require(hf, "num_attention_heads"), _require(hf, "hidden_size")
  theta, scaling = _rope(hf)
  fields = dict(
      vocab_size=_require(hf, "vocab_size"),
      dim=dim,
      n_layers=_require(hf, "num_hidden_layers"),
      n_heads=heads,
      n_kv_heads=hf.get("num_key_value_heads") or heads,
      ffw_dim=_require(hf, "intermediate_size"),
      head_dim=hf.get("head_dim") or dim // heads,
      rope_theta=theta,
      rope_scaling=scaling,
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      init_std=float(hf.get("initializer_range", 0.02)),
  )
  return reading.make_config(LlamaConfig, fields, overrides)


def config_to_hf(cfg: LlamaConfig) -> dict:
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  scaling = None
  if cfg.rope_scaling is not None:
    factor, low, high, original = cfg.rope_scaling
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
               "high_freq_factor": high, "original_max_position_embeddings": int(original)}
    rope = {**scaling, "rope_theta": cfg.rope_theta}
  return {
      "architectures": [ARCHITECTURE],
      "model_type": "llama",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.dim,
      "intermediate_size": cfg.ffw_dim,
      "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.n_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.norm_eps,
      "max_position_embeddings": MAX_POSITIONS,
      # Both spellings: rope_theta and rope_scaling for transformers<5, rope_parameters for >=5.
      "rope_theta": cfg.rope_theta,
      "rope_scaling": scaling,
      "rope_parameters": rope,
      "tie_word_embeddings": cfg.tie_embeddings,
      "initializer_range": cfg.init_std,
      "attention_bias": False,
      "mlp_bias": False,
  }


def params_from_hf(tensors, cfg: LlamaConfig) -> dict:
  d, h, k, g, f, v = (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw_dim,
                      cfg.vocab_size)

  def stack(name, shape, to_tst):
    """Maps layer tensor `model.layers.{i}.{name}` of HF `shape` and stacks it on axis 0."""
    return np.stack([to_tst(reading.read(tensors, f"model.layers.{i}.{name}", shape))
                     for i in range(cfg.n_layers)])

  pure = {
      "embed": {"table": reading.read(tensors, "model.embed_tokens.weight", (v, d))},
      "final_norm": {"scale": reading.read(tensors, "model.norm.weight", (d,))},
      "blocks": {
          "input_norm": {"scale": stack("input_layernorm.weight", (d,), lambda w: w)},
          "post_attn_norm": {"scale": stack("post_attention_layernorm.weight", (d,),
                                            lambda w: w)},
          "attn": {
              "q_proj": stack("self_attn.q_proj.weight", (h * g, d),
                              lambda w: w.T.reshape(d, h, g)),
              "k_proj": stack("self_attn.k_proj.weight", (k * g, d),
                              lambda w: w.T.reshape(d, k, g)),
              "v_proj": stack("self_attn.v_proj.weight", (k * g, d),
                              lambda w: w.T.reshape(d, k, g)),
              "o_proj": stack("self_attn.o_proj.weight", (d, h * g),
                              lambda w: w.T.reshape(h, g, d)),
          },
          "ffw": {
              "gate_proj": stack("mlp.gate_proj.weight", (f, d), lambda w: w.T),
              "up_proj": stack("mlp.up_proj.weight", (f, d), lambda w: w.T),
              "down_proj": stack("mlp.down_proj.weight", (d, f), lambda w: w.T),
          },
      },
  }
  if not cfg.tie_embeddings:
    pure["lm_head"] = reading.read(tensors, "lm_head.weight", (v, d)).T
  return pure


def params_to_hf(pure: dict, cfg: LlamaConfig) -> dict[str, np.ndarray]:
  d, h, k, g = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  blocks, attn, ffw = pure["blocks"], pure["blocks"]["attn"], pure["blocks"]["ffw"]
  out = {
      "model.embed_tokens.weight": pure["embed"]["table"],
      "model.norm.weight": pure["final_norm"]["scale"],
  }
  for i in range(cfg.n_layers):
    p = f"model.layers.{i}."
    out[p + "input_layernorm.weight"] = blocks["input_norm"]["scale"][i]
    out[p + "post_attention_layernorm.weight"] = blocks["post_attn_norm"]["scale"][i]
    out[p + "self_attn.q_proj.weight"] = attn["q_proj"][i].reshape(d, h * g).T
    out[p + "self_attn.k_proj.weight"] = attn["k_proj"][i].reshape(d, k * g).T
    out[p + "self_attn.v_proj.weight"] = attn["v_proj"][i].reshape(d, k * g).T
    out[p + "self_attn.o_proj.weight"] = attn["o_proj"][i].reshape(h * g, d).T
    out[p + "mlp.gate_proj.weight"] = ffw["gate_proj"][i].T
    out[p + "mlp.up_proj.weight"] = ffw["up_proj"][i].T
    out[p + "mlp.down_proj.weight"] = ffw["down_proj"][i].T
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = pure["lm_head"].T
  return out
