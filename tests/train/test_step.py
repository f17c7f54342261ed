"""The train step (tst_jax/train/step.py): both phases cost the same FLOPs in XLA's compiled
cost analysis; the fused loss in the trainer follows the naive one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax import superposition as sp
from tst_jax.errors import ConfigError
from tst_jax.models import llama, moe
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import plan as plan_lib, spec as spec_lib
from tst_jax.config.sections import Loss
from tst_jax import optim
from tst_jax.train import step as step_lib
from tst_jax.run import workdir as workdir_lib


def test_phase_flops_equal_in_compiled_cost_analysis():
  config = tiny_config()
  plan = spec_lib.check(config).plan
  tst_phase, ntp_phase = plan.phases
  assert tst_phase.flops_per_step == ntp_phase.flops_per_step
  model_cfg = spec_lib.check(config).model
  tx, schedule = optim.make_optimizer(config.optimizer, plan.total_steps)
  graphdef, _ = step_lib.abstract_model(model_cfg)
  state = jax.eval_shape(step_lib.init_fn(model_cfg, tx), jax.random.key(0))

  def flops(phase):
    step = step_lib.make_train_step(graphdef, phase, config.loss, tx, schedule)
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), np.int32)
    return jax.jit(step).lower(state, window).compile().cost_analysis()["flops"]

  tst, ntp = flops(tst_phase), flops(ntp_phase)
  assert abs(tst - ntp) / ntp < 0.02, (tst, ntp)


# The default suite runs the fused trainer in parallel/test_mesh (fsdp4 x tensor2).
@pytest.mark.slow
def test_fused_loss_in_the_trainer_matches_naive(tmp_path):
  """loss.impl=xla (chunked, no [N, V] logits) gives the naive loss trajectory, both phases."""
  losses = {}
  for impl in ("naive", "xla"):
    workdir = tmp_path / impl
    cli.run(tiny_config(steps=6, loss=dict(impl=impl)), str(workdir))
    losses[impl] = [r["loss"] for r in workdir_lib.read_metrics(RunDir(workdir))
                    if "loss" in r]
  np.testing.assert_allclose(losses["xla"], losses["naive"], rtol=2e-5)


EOS = 63
SMALL = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffw_dim=48,
             rope_theta=10_000.0, attention_impl="xla", init_std=0.3)


def _model(family: str):
  if family == "llama":
    cfg = llama.LlamaConfig(**SMALL)
  else:
    cfg = moe.MoEConfig(**SMALL, n_experts=4, n_experts_per_token=2, moe_ffw_dim=16,
                        expert_impl="blocked", dispatch_impl="gather")
  return cfg.build(nnx.Rngs(0))


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("bag_size", [1, 2])
@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_packed_documents_get_the_hidden_states_and_targets_they_get_alone(family, bag_size,
                                                                          restart):
  """Three EOS-ended documents packed in one window, under data.document_mask: each document's
  positions get the final hidden states and targets it gets in a window of its own, in the
  next-token phase and in phase 1's bags (documents in whole bags). Positions restarted or not
  agree alike (RoPE sees only offsets); without the mask the second and third differ."""
  rng = np.random.default_rng(0)
  lengths = (6, 4, 8)
  docs = [np.append(rng.integers(0, EOS, n - 1), EOS).astype(np.int32) for n in lengths]
  extra = np.array([5], np.int32)               # the token past the window's last input
  model = _model(family)
  view_fn = (sp.ntp_view if bag_size == 1 else
             functools.partial(sp.tst_view, bag_size=bag_size, mode="full"))
  documents = step_lib.Documents(EOS, restart)

  def hidden_and_targets(window, masked=True):
    inputs, targets, docs_BxL, positions = step_lib.view(
        jnp.asarray(window)[None], view_fn, documents if masked else None)
    hidden, _ = model.forward(inputs, docs_BxL, positions)
    return np.asarray(hidden[0]), np.asarray(targets[0])

  packed = np.concatenate(docs + [extra])
  hidden, targets = hidden_and_targets(packed)
  unmasked, _ = hidden_and_targets(packed, masked=False)
  start = 0
  for d, doc in enumerate(docs):
    alone_hidden, alone_targets = hidden_and_targets(np.concatenate([doc, extra]))
    span = slice(start // bag_size, (start + len(doc)) // bag_size)
    np.testing.assert_allclose(hidden[span], alone_hidden, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(targets[span], alone_targets)
    if d:
      assert np.abs(unmasked[span] - alone_hidden).max() > 1e-3
    start += len(doc)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_a_straddling_bags_tokens_of_the_next_document_do_not_move_the_loss(family):
  """Under data.document_mask a bag that straddles a boundary is its first document's: the next
  document's tokens in it are no input of that document's positions and no position's
  target, so phase 1's loss does not change when they do. The next document's first whole
  bag does move it, and without the mask the straddling tokens do too."""
  bag_size, latent = 4, 4
  phase = plan_lib.Phase("tst", 0, 1, bag_size, "full", latent, 1, 1.0)
  rng = np.random.default_rng(1)
  window = rng.integers(0, EOS, (1, phase.window)).astype(np.int32)
  window[0, 5] = EOS                  # document A is tokens 0-5, B starts inside bag 1 (4-7)
  model = _model(family)
  documents = step_lib.Documents(EOS)

  def loss(tokens, masked=True):
    return float(step_lib.loss(model, jnp.asarray(tokens), phase, Loss(),
                               documents if masked else None)[0])

  straddling = window.copy()
  straddling[0, 6:8] = (window[0, 6:8] + 1) % EOS          # B's two tokens in bag 1
  assert loss(straddling) == loss(window)
  assert abs(loss(straddling, masked=False) - loss(window, masked=False)) > 1e-4
  first_whole = window.copy()
  first_whole[0, 8] = (window[0, 8] + 1) % EOS              # B's first whole bag, 8-11
  assert abs(loss(first_whole) - loss(window)) > 1e-4


def test_a_document_mask_needs_the_stores_eos_and_refuses_positions_alone():
  config = tiny_config()
  config.data.document_mask = True
  spec = spec_lib.build(config)
  trainer = step_lib.Trainer.of(spec)
  with pytest.raises(ValueError, match="EOS id"):
    trainer.train_step(spec.plan.phases[0])
  config.data.document_mask, config.data.document_positions = False, True
  with pytest.raises(ConfigError) as e:
    spec_lib.check(config)
  assert e.value.field == "data.document_positions"


def test_io_norms_are_the_frobenius_norms_of_the_embedding_and_the_head():
  spec = spec_lib.build(tiny_config())
  state = step_lib.Trainer.of(spec, jax.devices()[:1]).init_state(0)
  norms = step_lib.io_norms(state.params)
  embed = np.asarray(state.params["embed"]["table"][...])
  head = np.concatenate([np.ravel(x) for x in jax.tree.leaves(state.params["lm_head"])])
  assert set(norms) == {"embed_norm", "head_norm"}
  assert float(norms["embed_norm"]) == pytest.approx(np.linalg.norm(embed), rel=1e-5)
  assert float(norms["head_norm"]) == pytest.approx(np.linalg.norm(head), rel=1e-5)
