"""Converts between Hugging Face's `Qwen3MoeForCausalLM` and tst_jax's `Qwen3MoE`.

A family module for `tst_jax.convert.hf` under key "qwen3_moe". HF stores Linear weights as
[out, in], and ours are [in, out] with heads split as [D, H, G]. Experts are read in both HF
layouts and written per expert. `save_pretrained` writes them per expert, as
`mlp.experts.{e}.gate_proj.weight` [F, D]. transformers 5 holds them fused in memory, as
`mlp.experts.gate_up_proj` [E, 2F, D] and `mlp.experts.down_proj` [E, D, F].
"""

from __future__ import annotations

import numpy as np

from tst_jax.convert.reading import make_config, read
from tst_jax.models import moe

# A tied checkpoint may still carry lm_head.weight, and an untied config always reads it.
IGNORED = (r"^lm_head\.weight$", r"rotary_emb\.inv_freq$")


def config_from_hf(hf: dict, **overrides) -> moe.MoEConfig:
  """Builds a MoEConfig from an HF config.json dict. `overrides` replace any field."""
  if hf.get("attention_bias") or hf.get("use_sliding_window"):
    raise ValueError("Qwen3-MoE with attention_bias or sliding windows is not supported")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}")
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "llama3":
    rope_scaling = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                    rope["original_max_position_embeddings"])
  elif rope_type == "default":
    rope_scaling = None
  else:
    raise ValueError(f"unsupported rope_type {rope_type!r}")
  kwargs = dict(
      vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
      n_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"],
      ffw_dim=hf["intermediate_size"],
      head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
      rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
      rope_scaling=rope_scaling, norm_eps=hf["rms_norm_eps"],
      tie_embeddings=hf.get("tie_word_embeddings", False),
      init_std=hf.get("initializer_range", 0.02),
      n_experts=hf.get("num_experts", hf.get("num_local_experts")),
      n_experts_per_token=hf["num_experts_per_tok"], moe_ffw_dim=hf["moe_intermediate_size"],
      norm_topk_prob=hf.get("norm_topk_prob", False),
      aux_loss_coef=hf.get("router_aux_loss_coef", 0.001),
      mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
      decoder_sparse_step=hf.get("decoder_sparse_step", 1))
  return make_config(moe.MoEConfig, kwargs, overrides)


def config_to_hf(cfg: moe.MoEConfig) -> dict:
  """Writes a complete HF config dict for Qwen3MoeForCausalLM from a MoEConfig."""
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    factor, low, high, original = cfg.rope_scaling
    rope.update(rope_type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                original_max_position_embeddings=original)
  return {
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim,
      "intermediate_size": cfg.ffw_dim, "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": 32768,
      "initializer_range": cfg.init_std, "rms_norm_eps": cfg.norm_eps, "use_cache": True,
      "tie_word_embeddings": cfg.tie_embeddings,
      "rope_parameters": rope, "rope_theta": cfg.rope_theta,    # rope_theta: transformers 4
      "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
      "attention_dropout": 0.0, "decoder_sparse_step": cfg.decoder_sparse_step,
      "moe_intermediate_size": cfg.moe_ffw_dim, "num_experts_per_tok": cfg.n_experts_per_token,
      "num_experts": cfg.n_experts, "norm_topk_prob": cfg.norm_topk_prob,
      "output_router_logits": False, "router_aux_loss_coef": cfg.aux_loss_coef,
      "mlp_only_layers": list(cfg.mlp_only_layers), "dtype": "float32",
      "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
  }


def _layer_slots(cfg: moe.MoEConfig):
  """Lists HF layer index, stage, position in unit, repeat and sparse for every layer, in order."""
  i = 0
  for stage, (unit, repeats) in enumerate(moe.stage_units(cfg.sparse_layers())):
    for r in range(repeats):
      for j, sparse in enumerate(unit):
        yield i, stage, j, r, sparse
        i += 1


def _layer_from_hf(tensors, p: str, cfg: moe.MoEConfig, sparse: bool) -> dict:
  """Maps one HF decoder layer under prefix `p` to our Block's pure dict, without a layer axis."""
  d, h, k, g = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  get = lambda name, *shape: read(tensors, p + name, shape)
  block = {
      "input_norm": {"scale": get("input_layernorm.weight", d)},
      "post_attn_norm": {"scale": get("post_attention_layernorm.weight", d)},
      "attn": {
          "q_proj": get("self_attn.q_proj.weight", h * g, d).T.reshape(d, h, g),
          "k_proj": get("self_attn.k_proj.weight", k * g, d).T.reshape(d, k, g),
          "v_proj": get("self_attn.v_proj.weight", k * g, d).T.reshape(d, k, g),
          "o_proj": get("self_attn.o_proj.weight", d, h * g).T.reshape(h, g, d),
          "q_norm": {"scale": get("self_attn.q_norm.weight", g)},
          "k_norm": {"scale": get("self_attn.k_norm.weight", g)},
      },
  }
  if not sparse:
    f = cfg.ffw_dim
    block["ffw"] = {"gate_proj": get("mlp.gate_proj.weight", f, d).T,
                    "up_proj": get("mlp.up_proj.weight", f, d).T,
                    "down_proj": get("mlp.down_proj.weight", d, f).T}
    return block
  e, f = cfg.n_experts, cfg.moe_ffw_dim
  if p + "mlp.experts.gate_up_proj" in tensors:   # fused: [E, 2F, D] with gate first, [E, D, F]
    gate_up = get("mlp.experts.gate_up_proj", e, 2 * f, d)
    gate, up = gate_up[:, :f].transpose(0, 2, 1), gate_up[:, f:].transpose(0, 2, 1)
    down = get("mlp.experts.down_proj", e, d, f).transpose(0, 2, 1)
  else:                                           # per expert: [F, D], [F, D], [D, F]
    gate = np.stack([get(f"mlp.experts.{i}.gate_proj.weight", f, d).T for i in range(e)])
    up = np.stack([get(f"mlp.experts.{i}.up_proj.weight", f, d).T for i in range(e)])
    down = np.stack([get(f"mlp.experts.{i}.down_proj.weight", d, f).T for i in range(e)])
  block["ffw"] = {"router": get("mlp.gate.weight", e, d).T, "gate_proj": gate, "up_proj": up,
                  "down_proj": down}
  return block


def params_from_hf(tensors: dict, cfg: moe.MoEConfig) -> dict:
  """Maps HF tensors {name: array} to the pure dict of `nnx.state(Qwen3MoE(cfg), nnx.Param)`."""
  v, d = cfg.vocab_size, cfg.dim
  units = moe.stage_units(cfg.sparse_layers())
  per_slot = {}   # stage, j -> list over repeats of that block's pure dict
  for i, stage, j, _, sparse in _layer_slots(cfg):
    per_slot.setdefault((stage, j), []).append(
        _layer_from_hf(tensors, f"model.layers.{i}.", cfg, sparse))
  stages = {
      k: {"blocks": {j: _stack(per_slot[(k, j)]) for j in range(len(unit))}}
      for k, (unit, _) in enumerate(units)}
  pure = {"embed": {"table": read(tensors, "model.embed_tokens.weight", (v, d))},
          "final_norm": {"scale": read(tensors, "model.norm.weight", (d,))}, "stages": stages}
  if not cfg.tie_embeddings:
    pure["lm_head"] = read(tensors, "lm_head.weight", (v, d)).T
  return pure


def params_to_hf(pure: dict, cfg: moe.MoEConfig) -> dict:
  """Maps the pure param dict of a Qwen3MoE to HF tensors per expert, as float32 numpy."""
  d = cfg.dim
  np32 = lambda x: np.ascontiguousarray(np.asarray(x, dtype=np.float32))
  out = {"model.embed_tokens.weight": np32(pure["embed"]["table"]),
         "model.norm.weight": np32(pure["final_norm"]["scale"])}
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = np32(np.asarray(pure["lm_head"]).T)
  for i, stage, j, r, sparse in _layer_slots(cfg):
    blk = _index(pure["stages"][stage]["blocks"][j], r)
    p, attn = f"model.layers.{i}.", blk["attn"]
    out[f"{p}input_layernorm.weight"] = np32(blk["input_norm"]["scale"])
    out[f"{p}post_attention_layernorm.weight"] = np32(blk["post_attn_norm"]["scale"])
    for name in ("q_proj", "k_proj", "v_proj"):
      out[f"{p}self_attn.{name}.weight"] = np32(attn[name].reshape(d, -1).T)
    out[f"{p}self_attn.o_proj.weight"] = np32(attn["o_proj"].reshape(-1, d).T)
    out[f"{p}self_attn.q_norm.weight"] = np32(attn["q_norm"]["scale"])
    out[f"{p}self_attn.k_norm.weight"] = np32(attn["k_norm"]["scale"])
    ffw = blk["ffw"]
    if not sparse:
      for name in ("gate_proj", "up_proj", "down_proj"):
        out[f"{p}mlp.{name}.weight"] = np32(ffw[name].T)
      continue
    out[f"{p}mlp.gate.weight"] = np32(ffw["router"].T)
    for e in range(cfg.n_experts):
      for name in ("gate_proj", "up_proj", "down_proj"):
        out[f"{p}mlp.experts.{e}.{name}.weight"] = np32(ffw[name][e].T)
  return out


def _stack(trees: list) -> dict:
  """Stacks blocks' pure dicts into one pure dict with a leading layer axis."""
  if isinstance(trees[0], dict):
    return {key: _stack([t[key] for t in trees]) for key in trees[0]}
  return np.stack(trees)


def _index(tree, r: int):
  """Slices repeat `r` off the leading layer axis of every array in a pure dict."""
  if isinstance(tree, dict):
    return {key: _index(v, r) for key, v in tree.items()}
  return np.asarray(tree)[r]
