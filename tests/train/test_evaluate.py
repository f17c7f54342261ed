"""Held-out evaluation (tst_jax/train/evaluate.py) against a slow obvious mean next-token NLL."""

import jax
import numpy as np
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax.train import spec as spec_lib, step as step_lib
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
