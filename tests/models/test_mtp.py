"""Multi-token prediction (tst_jax/models/mtp.py) against the papers' equations written out
layer by layer: each head's hidden states, the per-offset cross-entropies and their λ-weighted
sum, their gradients, causality, and the heads' parameter and FLOP counts."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax import superposition as sp
from tst_jax.config import spec as spec_lib
from tst_jax.errors import ConfigError
from tst_jax.models import mtp as mtp_lib
from tst_jax.train import step as step_lib

EOS = 7


def _setup(kind, k=3, impl="naive", z_loss=0.0, weight=None, documents=False):
  """(model with heads, its ntp phase, loss section, Documents or None) of the tiny config."""
  c = tiny_config(steps=12, ratio=0.0, loss=dict(impl=impl, z_loss=z_loss),
                  data=dict(document_mask=documents))
  c.mtp.update(k=k, kind=kind, weight=weight)
  spec = spec_lib.check(c)
  model = mtp_lib.build(spec.model, spec.mtp, nnx.Rngs(1))
  docs = step_lib.Documents(EOS) if documents else None
  return model, spec.plan.phases[-1], spec.loss, docs


def _window(phase, seed=0, eos=False):
  w = np.array(jax.random.randint(jax.random.key(seed), (4, phase.window), 8, 512))
  if eos:   # documents of a few tokens, so many targets t + j lie in the next one
    w[:, 5::6] = EOS
  return jnp.asarray(w)


def _rms(x, scale, eps):
  return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale[None, None, :]


def _layer(stack, i):
  """Layer i of a stacked module, as a module of its own."""
  graphdef, state = nnx.split(stack)
  return nnx.merge(graphdef, jax.tree.map(lambda x: x[i], state))


def naive_hidden(model, window, kind, k, docs=None):
  """The K heads' final hidden states [B, L, D] each, by the papers' equations: the trunk's
  blocks one at a time, then Gloeckle's k - 1 blocks on the last block's input, or DeepSeek's
  modules in a cascade on its output and the embeddings of tokens t + d."""
  cfg = model.cfg
  length = window.shape[1] - 1
  positions = jnp.broadcast_to(jnp.arange(length), (window.shape[0], length))
  h = model.embed.table[...][window[:, :length]]
  for i in range(cfg.n_layers):
    trunk = h
    h = _layer(model.blocks, i)(h, positions, documents_BxL=docs)[0]
  norm = lambda x: _rms(x, model.final_norm.scale[...], cfg.norm_eps)
  if kind == "gloeckle":
    return [norm(h)] + [norm(_layer(model.mtp.blocks, j)(trunk, positions,
                                                         documents_BxL=docs)[0])
                        for j in range(k - 1)]
  outs = [norm(h)]
  padded = jnp.pad(window, ((0, 0), (0, k)))
  for d in range(1, k):
    m = _layer(model.mtp.modules, d - 1)
    e = model.embed.table[...][padded[:, d:d + length]]          # token t + d
    x = jnp.concatenate([_rms(h, m.h_norm.scale[...], cfg.norm_eps),
                         _rms(e, m.e_norm.scale[...], cfg.norm_eps)], axis=-1) @ m.proj[...]
    h = m.block(x, positions, documents_BxL=docs)[0]
    outs.append(_rms(h, m.norm.scale[...], cfg.norm_eps))
  return outs


def naive_losses(model, window, kind, k, weight, z_loss=0.0, docs=None):
  """(objective, [CE of t + 1, ..., CE of t + k]): per offset j, the mean over the positions i
  whose target window[i + j] exists (and, with documents, shares i's document)."""
  length = window.shape[1] - 1
  doc_ids = sp.document_ids(window, EOS) if docs is not None else jnp.zeros_like(window)
  hidden = naive_hidden(model, window, kind, k, None if docs is None else doc_ids[:, :length])
  head = model.lm_head[...]
  ces = []
  for j, h in enumerate(hidden, start=1):
    logits = h @ head
    lse = jax.nn.logsumexp(logits, axis=-1)
    index = jnp.arange(length) + j                                  # the target's place
    target = jnp.take(window, jnp.minimum(index, length), axis=1)
    pick = jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
    valid = (index <= length)[None] & (doc_ids[:, :length] == jnp.take(
        doc_ids, jnp.minimum(index, length), axis=1))
    ces.append(jnp.sum(jnp.where(valid, lse - pick, 0)) / jnp.sum(valid))
    if j == 1 and z_loss:   # the next-token head's rows with a target: PaLM's z-loss
      ces[0] = ces[0] + z_loss * jnp.sum(jnp.where(valid, lse ** 2, 0)) / jnp.sum(valid)
  return ces[0] + weight / (k - 1) * sum(ces[1:]), ces


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
@pytest.mark.parametrize("impl,z_loss,documents", [("naive", 0.0, False), ("xla", 0.0, False),
                                                    ("naive", 1e-2, True)],
                         ids=["naive", "fused_xla", "z_loss_documents"])
def test_each_offsets_loss_is_the_naive_cross_entropy(kind, impl, z_loss, documents):
  model, phase, loss_cfg, docs = _setup(kind, impl=impl, z_loss=z_loss, documents=documents)
  window = _window(phase, eos=documents)
  total, (value, metrics) = step_lib.objective(model, window, phase, loss_cfg, docs)
  want_total, ces = naive_losses(model, window, kind, 3, phase.mtp_weight, z_loss,
                                 docs if documents else None)
  assert phase.mtp_weight == (2.0 if kind == "gloeckle" else 0.3)   # the kinds' own λ
  np.testing.assert_allclose(value, ces[0], rtol=1e-5)
  np.testing.assert_allclose([metrics["mtp/loss_t2"], metrics["mtp/loss_t3"]], ces[1:],
                             rtol=1e-5)
  np.testing.assert_allclose(total, want_total, rtol=1e-5)


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_lambda_is_the_kinds_own_unless_given_and_never_0(kind):
  """mtp.weight None gives the kind's λ; any λ > 0 is taken as given, and 0, which would train
  the heads on nothing, is refused."""
  assert tiny_config().mtp.weight is None
  assert _setup(kind)[1].mtp_weight == {"gloeckle": 2.0, "deepseek": 0.3}[kind]
  assert _setup(kind, weight=0.05)[1].mtp_weight == 0.05
  with pytest.raises(ConfigError, match="mtp.weight.*0 would train the heads on nothing"):
    _setup(kind, weight=0.0)


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_the_next_token_head_is_the_model_without_heads(kind):
  model, phase, loss_cfg, _ = _setup(kind)
  plain = spec_lib.check(tiny_config(steps=12, ratio=0.0)).model.build(nnx.Rngs(1))
  window = _window(phase)
  inputs, labels = sp.ntp_view(window)
  np.testing.assert_allclose(step_lib.objective(model, window, phase, loss_cfg)[1][0],
                             step_lib.lm_loss(plain, plain(inputs, return_hidden=True),
                                              labels[..., None], loss_cfg), rtol=1e-6)


@pytest.mark.parametrize("kind", [pytest.param("gloeckle", marks=pytest.mark.slow), "deepseek"])
def test_gradients_are_the_naive_objectives(kind):
  """Every parameter's gradient, the heads', the shared trunk's, embedding's and LM head's,
  is the gradient of the naive objective, and λ moves the trunk's but not the main loss's."""
  model, phase, loss_cfg, _ = _setup(kind, weight=0.7)
  window = _window(phase, seed=3)
  graphdef, params = nnx.split(model, nnx.Param)
  fast = jax.grad(lambda p: step_lib.objective(nnx.merge(graphdef, p), window, phase,
                                               loss_cfg)[0])(params)
  slow = jax.grad(lambda p: naive_losses(nnx.merge(graphdef, p), window, kind, 3, 0.7)[0])(
      params)
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(fast),
                               jax.tree.leaves(slow)):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7, err_msg=str(path))
  heads = jax.tree.leaves(fast[mtp_lib.ATTR])
  assert all(float(jnp.abs(g).max()) > 0 for g in heads)
  no_mtp = jax.grad(lambda p: step_lib.objective(nnx.merge(graphdef, p), window,
                                                 dataclasses.replace(phase, mtp_weight=0.0),
                                                 loss_cfg)[0])(params)
  assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(no_mtp[mtp_lib.ATTR]))
  assert not np.allclose(fast["blocks"]["ffw"]["up_proj"][...],
                         no_mtp["blocks"]["ffw"]["up_proj"][...])   # the trunk learns from MTP


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_a_head_sees_no_token_past_the_ones_it_is_given(kind):
  """Head j's state at position i moves with window tokens up to i (Gloeckle's heads read the
  trunk) or up to i + j - 1 (DeepSeek's depth j - 1 reads tokens t+1..t+j-1), never later."""
  model, phase, _, _ = _setup(kind, k=3)
  window = _window(phase)
  inputs, targets = sp.tst_view(window, bag_size=3, mode="output_only")
  before = mtp_lib.hidden_states(model, inputs, targets)[0]
  changed = window.at[:, 9].set(11)
  inputs, targets = sp.tst_view(changed, bag_size=3, mode="output_only")
  after = mtp_lib.hidden_states(model, inputs, targets)[0]
  moved = np.abs(np.asarray(after - before)).max(axis=(1, 3)) > 0     # [K, L]
  for j in range(3):
    sees = 9 - (j if kind == "deepseek" else 0)    # the first position token 9 reaches
    assert not moved[j, :sees].any() and moved[j, sees:].any(), (j, moved[j])


def _matmul_flops(jaxpr) -> float:
  """FLOPs of every dot_general, 2 per multiply-add, scan bodies times their length."""
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[i] for i in contract)
    repeat = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    total += repeat * sum(_matmul_flops(s) for s in jax.extend.core.jaxprs_in_params(eqn.params))
  return total


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_the_heads_flops_and_parameters_are_what_the_step_computes(kind):
  """The plan's FLOPs of the heads are the matmul FLOPs that the gradient of the MTP objective
  adds to the plain one's, and their parameters those the built heads hold."""
  model, phase, loss_cfg, _ = _setup(kind, k=3)
  graphdef, params = nnx.split(model, nnx.Param)
  window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32)

  def flops(p):
    grad = jax.grad(lambda q, w: step_lib.objective(nnx.merge(graphdef, q), w, p, loss_cfg)[0])
    return _matmul_flops(jax.make_jaxpr(grad)(params, window).jaxpr)
  added = flops(phase) - flops(dataclasses.replace(phase, mtp_k=1))
  cfg, spec_mtp = model.cfg, mtp_lib.Mtp(k=3, kind=kind)
  assert added == mtp_lib.flops_per_token(cfg, spec_mtp, phase.latent_seq_len) * (
      phase.batch_size * phase.latent_seq_len)
  assert phase.mtp_flops_per_step == added
  heads = sum(x.size for x in jax.tree.leaves(params[mtp_lib.ATTR]))
  block = sum(x.size for x in jax.tree.leaves(params["blocks"])) // cfg.n_layers
  d = cfg.dim
  assert mtp_lib.param_count(cfg, spec_mtp) == heads == 2 * (
      block + (0 if kind == "gloeckle" else 2 * d * d + 3 * d))


def test_deepseek_modules_run_on_the_moe_family_and_gloeckle_heads_are_refused():
  from tst_jax import models
  from tst_jax.errors import ConfigError
  c = tiny_config(steps=12, ratio=0.0)
  c.model = models.preset_config("qwen3_moe", "tiny_moe", vocab_size=512, dim=32, n_layers=2,
                                 n_heads=2, n_kv_heads=1, ffw_dim=64, n_experts=4,
                                 n_experts_per_token=2, moe_ffw_dim=32)
  c.mtp.update(k=2, kind="gloeckle")
  with pytest.raises(ConfigError, match="mtp.kind.*deepseek"):
    spec_lib.check(c)
  c.mtp.kind = "deepseek"
  spec = spec_lib.check(c)
  model = mtp_lib.build(spec.model, spec.mtp, nnx.Rngs(0))
  block = model.mtp.modules.block
  assert hasattr(block.attn, "q_norm")            # a Qwen3 block: QK-norm, a dense MLP
  phase = spec.plan.phases[-1]
  total, (value, metrics) = step_lib.objective(model, _window(phase), phase, spec.loss)
  moe_aux = model.aux_loss(model.forward(_window(phase)[:, :-1])[1])[0]
  np.testing.assert_allclose(total, value + moe_aux + 0.3 * metrics["mtp/loss"], rtol=1e-6)
  assert "moe/lb_loss" in metrics
