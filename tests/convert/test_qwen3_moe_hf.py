"""Qwen3-MoE <-> Hugging Face (tst_jax/convert/qwen3_moe_hf.py): logits and load balancing
against transformers' Qwen3MoeForCausalLM, the round trip, the fused expert layout, and the
tst_jax.convert.hf dispatcher."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tst_jax import platform
from tst_jax.convert import qwen3_moe_hf
from tst_jax.models import moe


HF_CASES = {   # first layer dense, then sparse; and every second layer sparse
    "mlp_only_layers": dict(num_hidden_layers=3, mlp_only_layers=[0]),
    "sparse_step": dict(num_hidden_layers=4, decoder_sparse_step=2),
}


@pytest.fixture(scope="module", params=sorted(HF_CASES))
def hf_checkpoint(request, tmp_path_factory):
  """A random float32 Qwen3MoeForCausalLM saved with save_pretrained, and its logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  config = transformers.Qwen3MoeConfig(
      vocab_size=96, hidden_size=32, intermediate_size=40, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2,
      moe_intermediate_size=24, norm_topk_prob=True, rms_norm_eps=1e-6,
      initializer_range=0.1, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
      attn_implementation="eager", **HF_CASES[request.param])
  model = transformers.Qwen3MoeForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.uniform_(0.5, 1.5)
  path = tmp_path_factory.mktemp("qwen3_moe") / request.param
  model.save_pretrained(path)
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 10))
  with torch.no_grad():
    out = model(torch.tensor(tokens), output_router_logits=True)
  return dict(path=path, tokens=tokens, logits=out.logits.numpy(), aux_loss=float(out.aux_loss),
              router_logits=[r.numpy() for r in out.router_logits], model=model)


def _load_ours(path, **overrides):
  from safetensors.numpy import load_file   # pylint: disable=import-outside-toplevel
  hf_cfg = json.loads((path / "config.json").read_text())
  cfg = qwen3_moe_hf.config_from_hf(hf_cfg, **overrides)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: moe.Qwen3MoE(cfg, rngs=nnx.Rngs(0))))
  pure = qwen3_moe_hf.params_from_hf(load_file(path / "model.safetensors"), cfg)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, pure))
  return nnx.merge(graphdef, state)


def test_hf_logits_and_load_balancing(hf_checkpoint):
  from transformers.models.qwen3_moe import modeling_qwen3_moe as hf_moe  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  model = _load_ours(hf_checkpoint["path"])
  cfg = model.cfg
  assert cfg.sparse_layers() == tuple(
      type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"
      for layer in hf_checkpoint["model"].model.layers)

  @nnx.jit
  def run(m, tokens):
    h, aux = m.forward(tokens)
    return m.logits(h), aux, m.aux_loss(aux)
  logits, aux, (loss, metrics) = run(model, jnp.asarray(hf_checkpoint["tokens"]))
  np.testing.assert_allclose(logits, hf_checkpoint["logits"], atol=1e-4, rtol=1e-4)

  # Per layer, our lb_loss is HF's load_balancing_loss_func on that layer's router logits.
  hf_per_layer = [float(hf_moe.load_balancing_loss_func((torch.tensor(r),), cfg.n_experts,
                                                        cfg.n_experts_per_token))
                  for r in hf_checkpoint["router_logits"]]
  np.testing.assert_allclose(aux["lb_loss"], hf_per_layer, rtol=1e-5)
  # HF's model-level aux_loss pools counts and probabilities over layers before the product;
  # ours averages the per-layer losses (each layer balanced on its own). Both from our aux:
  pooled = cfg.n_experts * jnp.sum(jnp.mean(aux["expert_frac"], 0) * jnp.mean(aux["router_prob"], 0))
  np.testing.assert_allclose(pooled, hf_checkpoint["aux_loss"], rtol=1e-5)
  # Coefficient convention as HF: loss += router_aux_loss_coef * lb (balanced lb = K).
  np.testing.assert_allclose(loss, cfg.aux_loss_coef * jnp.mean(aux["lb_loss"]), rtol=1e-6)
  np.testing.assert_allclose(metrics["moe/expert_load"].sum(), 1.0, rtol=1e-6)


def test_hf_round_trip(hf_checkpoint, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  model = _load_ours(hf_checkpoint["path"])
  pure = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  tensors = qwen3_moe_hf.params_to_hf(pure, model.cfg)
  original = load_file(hf_checkpoint["path"] / "model.safetensors")
  assert sorted(tensors) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)

  save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  (tmp_path / "config.json").write_text(json.dumps(qwen3_moe_hf.config_to_hf(model.cfg)))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, attn_implementation="eager", dtype=torch.float32).eval()
  assert type(reloaded).__name__ == "Qwen3MoeForCausalLM"
  with torch.no_grad():
    logits = reloaded(torch.tensor(hf_checkpoint["tokens"])).logits.numpy()
  np.testing.assert_allclose(logits, hf_checkpoint["logits"], atol=1e-5, rtol=1e-5)
  # HF configs hold no implementation choice: read back, `auto` resolves as the model's did.
  assert platform.resolved_model(
      qwen3_moe_hf.config_from_hf(qwen3_moe_hf.config_to_hf(model.cfg))) == model.cfg


def test_fused_expert_layout_reads_the_same(hf_checkpoint):
  """transformers 5 keeps experts fused in memory (gate_up_proj [E, 2F, D]); read that too."""
  model = hf_checkpoint["model"]
  fused = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  assert any(k.endswith("mlp.experts.gate_up_proj") for k in fused)
  cfg = _load_ours(hf_checkpoint["path"]).cfg
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  a = qwen3_moe_hf.params_from_hf(fused, cfg)
  b = qwen3_moe_hf.params_from_hf(load_file(hf_checkpoint["path"] / "model.safetensors"), cfg)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_through_the_hf_dispatcher(hf_checkpoint, tmp_path, monkeypatch):
  """tst_jax.convert.hf.from_hf / to_hf with this family (every tensor read, same params)."""
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  from tst_jax.convert import hf  # pylint: disable=import-outside-toplevel
  model = hf.from_hf(hf_checkpoint["path"])
  expected = nnx.to_pure_dict(nnx.state(_load_ours(hf_checkpoint["path"]), nnx.Param))
  jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(model, nnx.Param)),
               expected)
  hf.to_hf(model, tmp_path / "out")
  written = load_file(tmp_path / "out" / "model.safetensors")
  original = load_file(hf_checkpoint["path"] / "model.safetensors")
  assert sorted(written) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
