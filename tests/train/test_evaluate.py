"""Held-out evaluation (tst_jax/train/evaluate.py) against a slow obvious mean next-token NLL,
and phase 1's held-out bag loss against its train step's loss."""

import jax
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax.config import spec as spec_lib
from tst_jax.train import step as step_lib
from tst_jax.train.evaluate import Evaluator


def test_the_evaluator_is_the_mean_next_token_nll_over_every_window():
  spec = spec_lib.build(tiny_config())
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  params = trainer.init_state(0).params
  rng = np.random.default_rng(0)
  windows = [rng.integers(0, 512, (4, 17), dtype=np.int32) for _ in range(2)]
  model = nnx.merge(trainer.graphdef, params)
  nll = []
  for window in windows:
    logits = np.asarray(model(window[:, :-1]), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll.append(-np.take_along_axis(logp, window[:, 1:, None], -1))
  np.testing.assert_allclose(Evaluator(trainer, windows, 1)(params), np.mean(nll), rtol=1e-5)


def _log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def test_with_document_masks_each_document_is_scored_alone():
  """data.document_mask: the held-out loss is the mean NLL of every target inside its own
  document, each document's logits those it gets alone, so no first token of a document and no
  token past an EOS counts; it differs from the loss of the same windows unmasked."""
  config = tiny_config()
  config.data.document_mask = True
  spec = spec_lib.build(config)
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  params = trainer.init_state(0).params
  eos = 7
  rng = np.random.default_rng(1)
  windows = [rng.integers(8, 512, (4, 17), dtype=np.int32) for _ in range(2)]
  for w in windows:
    w[:, [3, 9]] = eos
  model = nnx.merge(trainer.graphdef, params)
  nll = []
  for window in windows:
    for row in window:
      for a, end in ((0, 4), (4, 10), (10, 17)):   # each document: through its EOS
        doc = row[a:end]
        logp = _log_softmax(model(doc[None, :-1]))[0]
        nll += list(-logp[np.arange(len(doc) - 1), doc[1:]])
  got = Evaluator(trainer, windows, 1, eos_id=eos)(params)
  np.testing.assert_allclose(got, np.mean(nll), rtol=1e-5)
  plain = step_lib.Trainer.of(spec_lib.build(tiny_config()), jax.devices()[:1])
  assert abs(got - Evaluator(plain, windows, 1)(params)) > 1e-3


def test_the_bag_loss_is_the_phase_training_loss_on_held_out_windows():
  """eval_bag_loss of a tst phase is the loss its train step reports on each held-out window of
  S·L + 1 tokens (S = 2, the 'power' weighting), averaged over the batches; the z-loss, a
  regulariser, stays out of it; an ntp phase has none."""
  spec = spec_lib.build(tiny_config(tst=dict(weighting="power")))
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  phase = spec.plan.phases[0]
  rng = np.random.default_rng(2)
  windows = [rng.integers(0, 512, (4, phase.window), dtype=np.int32) for _ in range(2)]
  assert phase.window == 2 * 16 + 1
  params = trainer.init_state(0).params
  got = Evaluator(trainer, [], 1, bags={phase: windows}).bag_loss(params, phase)
  train_step = trainer.train_step(phase)
  trained = [float(train_step(trainer.init_state(0), w)[1]["loss"]) for w in windows]
  np.testing.assert_allclose(got, np.mean(trained), rtol=1e-5)
  uniform = spec_lib.build(tiny_config()).plan.phases[0]
  assert abs(Evaluator(trainer, [], 1, bags={uniform: windows}).bag_loss(params, uniform)
             - got) > 1e-3     # the weighting is the phase's
  z_spec = spec_lib.build(tiny_config(tst=dict(weighting="power"), loss=dict(z_loss=0.1)))
  z_trainer = step_lib.Trainer.of(z_spec, jax.devices()[:1])
  z_phase = z_spec.plan.phases[0]
  assert Evaluator(z_trainer, [], 1, bags={z_phase: windows}).bag_loss(
      params, z_phase) == pytest.approx(got, rel=1e-6)
  assert Evaluator(trainer, [], 1, bags={phase: windows}).bag_loss(
      params, spec.plan.phases[1]) is None


def test_bits_per_byte_count_the_bytes_under_the_scored_targets_only():
  """eval_bpb is the NLL summed over the scored targets, in bits, over the UTF-8 bytes of text
  under those targets. With document masks a document's first token is no target, so its
  bytes do not count, nor do those under each window's first token, an input only. Here
  those tokens carry 40 bytes each: the naive number, the loss over the bytes per token of
  all the windows' tokens, is far off."""
  config = tiny_config(data=dict(document_mask=True))
  trainer = step_lib.Trainer.of(spec_lib.build(config), jax.devices()[:1])
  params = trainer.init_state(0).params
  eos, starts = 7, (0, 4, 10)
  rng = np.random.default_rng(3)
  windows = [rng.integers(8, 512, (4, 17), dtype=np.int32) for _ in range(2)]
  under = [rng.integers(1, 5, (4, 17)).astype(np.int32) for _ in range(2)]
  for w, b in zip(windows, under):
    w[:, [3, 9]], b[:, [3, 9]] = eos, 0        # EOS: no text
    b[:, list(starts)] = 40                    # a window's and each document's first token
  model = nnx.merge(trainer.graphdef, params)
  nll, nbytes = [], 0
  for window, b in zip(windows, under):
    for row, row_bytes in zip(window, b):
      for a, end in zip(starts, (4, 10, 17)):
        logp = _log_softmax(model(row[a:end][None, :-1]))[0]
        nll += list(-logp[np.arange(end - a - 1), row[a + 1:end]])
        nbytes += int(row_bytes[a + 1:end].sum())
  evaluator = Evaluator(trainer, windows, 1, eos_id=eos, token_bytes=under)
  loss = evaluator(params)
  got = evaluator.bits_per_byte(loss)
  np.testing.assert_allclose(got, np.sum(nll) / (nbytes * np.log(2)), rtol=1e-5)
  naive = loss / np.log(2) / (sum(b.sum() for b in under) / sum(w.size for w in windows))
  assert abs(naive - got) > 0.5 * got
  assert Evaluator(trainer, windows, 1, eos_id=eos).bits_per_byte(loss) is None
