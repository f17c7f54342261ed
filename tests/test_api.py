"""The public API (tst_jax.__all__, docs/api.md): the example that puts TST into a plain Flax
NNX + optax loop runs, and its losses equal the trainer's own step on the same batches."""

import importlib.util
import os
import re

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import tst_jax
from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import models, superposition as sp
from tst_jax.config import spec as spec_lib
from tst_jax.train import step as step_lib

spec = importlib.util.spec_from_file_location(
    "tst_in_your_loop", os.path.join(ROOT, "examples", "tst_in_your_loop.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def stream(n=40_000, vocab=512, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def test_the_example_trains_its_own_model():
  periodic = (np.arange(40_000) % 61).astype(np.int32)     # a stream with something to learn
  losses, windows = example.train(example.TinyLM(512, 32, nnx.Rngs(0)), periodic, steps=8)
  assert [w.shape for w in windows] == [(8, 4 * 32 + 1)] * 4 + [(8, 32 + 1)] * 4
  assert all(np.isfinite(losses)) and losses[3] < losses[0] and losses[7] < losses[4]


@pytest.mark.slow
def test_the_example_loop_matches_the_trainer_step_for_step():
  """Our Llama in the example's loop, and the trainer's jitted step (its loss built from a
  plan's phases) from the same parameters and optimizer on the example's windows."""
  run = spec_lib.check(tiny_config(steps=6, ratio=0.5, bag_size=example.S,
                                   data=dict(seq_len=example.L, batch_size=example.B)))
  assert [(p.bag_size, p.steps) for p in run.plan.phases] == [(example.S, 3), (1, 3)]
  tx = optax.adamw(3e-3)
  model = run.model.build(nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  state = step_lib.TrainState(jax.numpy.zeros((), "int32"), params, tx.init(params))
  theirs, windows = example.train(run.model.build(nnx.Rngs(0)), stream(), steps=6,
                                  tx=tx)
  ours = []
  for phase in run.plan.phases:
    train_step = jax.jit(step_lib.make_train_step(
        graphdef, phase, run.loss, tx, optax.constant_schedule(3e-3)))
    for k in range(phase.first_step, phase.last_step):
      state, metrics = train_step(state, windows[k])
      ours.append(float(metrics["loss"]))
  np.testing.assert_allclose(theirs, ours, rtol=2e-5)


def test_switch_keeps_everything_or_swaps_only_the_embedding_and_head():
  model = spec_lib.check(tiny_config()).model.build(nnx.Rngs(0))
  _, params = nnx.split(model, nnx.Param)
  _, fresh = nnx.split(spec_lib.check(tiny_config()).model.build(nnx.Rngs(1)), nnx.Param)
  assert tst_jax.switch_to_next_token(params) is params
  swapped = tst_jax.switch_to_next_token(params, fresh)
  flat = [jax.tree_util.tree_leaves_with_path(t) for t in (swapped, params, fresh)]
  io = [bool({str(getattr(k, "key", "")) for k in path} & set(sp.IO_PARAMS))
        for path, _ in flat[0]]
  assert any(io) and not all(io)
  for is_io, (_, got), (_, old), (_, new) in zip(io, *flat):
    np.testing.assert_array_equal(got, new if is_io else old)


def test_every_public_name_is_documented():
  with open(os.path.join(ROOT, "docs", "api.md")) as f:
    documented = set(re.findall(r"`tst_jax\.(\w+)", f.read()))
  assert set(tst_jax.__all__) <= documented, set(tst_jax.__all__) - documented
