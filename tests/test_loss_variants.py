"""TST loss variants in one registry (tst_jax/losses.py's VARIANTS). A variant registered in
this file alone, a focal MCE, is one per-row function and one entry: tst.variant accepts it and
--help-config lists it, every implementation gives the loss a slow obvious version of it gives,
and a tiny two-phase run trains with it, its held-out bag loss at the switch that version's on
the checkpoint's parameters."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax import cli, losses, schema
from tst_jax import superposition as sp
from tst_jax.config import sections, spec as spec_lib
from tst_jax.data.pipeline import eval_windows
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import step as step_lib, trained_run

GAMMA = 2.0


def focal_rows(lse_N, target_logits_NxS, targets_NxS, coef_NxS):
  """Focal MCE (Lin et al., 2017): each target's CE times (1 - p)^γ, so that the targets the
  model already predicts count less; a row's weight is MCE's."""
  del targets_NxS
  ce_NxS = lse_N[:, None] - target_logits_NxS
  focal_NxS = (1.0 - jnp.exp(-ce_NxS)) ** GAMMA * ce_NxS
  return (coef_NxS * focal_NxS).sum(-1), coef_NxS.sum(-1)


@pytest.fixture
def focal():
  losses.register("focal", losses.Variant(focal_rows, "MCE with each CE times (1 - p)^2"))
  yield "focal"
  losses.unregister("focal")


def slow_focal(logits, targets, weights, ignore=sp.IGNORE_INDEX):
  """The focal MCE written out in float64 with the paper's reduction: bag column i is the mean
  over its valid rows of (1 - p)^γ CE, and the columns are mixed by their weights over the
  columns that have any valid row."""
  logits = np.asarray(logits, np.float64).reshape(-1, np.shape(logits)[-1])
  targets = np.asarray(targets).reshape(-1, np.shape(targets)[-1])
  total, weight = 0.0, 0.0
  for i, w in enumerate(weights):
    terms = []
    for row, y in zip(logits, targets[:, i]):
      if y != ignore:
        ce = np.log(np.sum(np.exp(row - row.max()))) + row.max() - row[y]
        terms.append((1.0 - np.exp(-ce)) ** GAMMA * ce)
    if terms:
      total, weight = total + w * np.mean(terms), weight + w
  return total / weight


def test_a_registered_variant_is_a_choice_of_tst_variant(focal):
  assert spec_lib.check(tiny_config(tst=dict(variant=focal))).plan.phases[0].variant == focal
  line, = [x for x in schema.help_lines(sections.Tst, "tst") if x.startswith("tst.variant ")]
  assert "'focal'" in line and "mce (the paper's)" in line
  assert "focal (MCE with each CE times (1 - p)^2)" in line    # its doc, read as help is
  losses.unregister(focal)
  try:
    with pytest.raises(ConfigError, match=r"tst.variant: must be one of \('mce', 'alt'\)"):
      spec_lib.check(tiny_config(tst=dict(variant=focal)))
    with pytest.raises(ValueError, match="unknown loss variant 'focal'"):
      losses.mce_loss(jnp.zeros((2, 5)), jnp.zeros((2, 1), jnp.int32), variant=focal)
  finally:
    losses.register(focal, losses.Variant(focal_rows, "MCE with each CE times (1 - p)^2"))


def test_every_implementation_gives_the_slow_versions_loss(focal):
  """The naive loss, the chunked XLA one and the per-position losses of the public API all
  reduce through the one row function; ignored targets and unequal weights included."""
  rng = np.random.default_rng(0)
  n, s, d, v = 12, 4, 8, 37
  hidden = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  head = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
  targets = rng.integers(0, v, (n, s))
  targets[rng.random((n, s)) < 0.25] = sp.IGNORE_INDEX
  targets[3] = sp.IGNORE_INDEX                          # a row with nothing to predict
  targets = jnp.asarray(targets, jnp.int32)
  logits = hidden @ head
  weights = losses.bag_weights("power", s)
  want = slow_focal(logits, targets, weights)
  assert abs(want - slow_focal(logits, targets, np.ones(s))) > 1e-3   # the weights count
  got = losses.mce_loss(logits, targets, weighting="power", variant=focal)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for impl in ("naive", "xla"):
    np.testing.assert_allclose(losses.linear_mce_loss(hidden, head, targets, weighting="power",
                                                      variant=focal, impl=impl), want,
                               rtol=1e-5)
  per, mask = losses.mce_loss_per_position(logits, targets, weighting="power", variant=focal)
  for r in range(n):
    counted = np.asarray(targets[r]) != sp.IGNORE_INDEX
    assert mask[r] == counted.any()
    if counted.any():
      row = slow_focal(logits[r:r + 1], targets[r:r + 1], weights * counted)
      np.testing.assert_allclose(per[r], row, rtol=1e-5)
  assert abs(float(got) - float(losses.mce_loss(logits, targets, weighting="power"))) > 1e-3


def test_a_bag_loss_has_a_floor_where_a_next_token_loss_has_0():
  """MCE on a bag of S distinct tokens is least, its targets' entropy, where the model puts
  each target's share of the weights on it: log S for uniform weights. The console prints it
  beside the bag loss (losses.bag_floor); MCE-alt's is 0, and so is a variant's without one."""
  targets = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
  for weighting in ("uniform", "power"):
    share = losses.bag_weights(weighting, 4) / losses.bag_weights(weighting, 4).sum()
    best = jnp.full((1, 11), -1e4).at[0, 1:5].set(jnp.log(share))
    floor = losses.bag_floor(weighting, "mce", 4)
    np.testing.assert_allclose(losses.mce_loss(best, targets, weighting=weighting), floor,
                               rtol=1e-5)
    assert losses.mce_loss(best.at[0, 1].add(0.5), targets, weighting=weighting) > floor
  assert losses.bag_floor("uniform", "mce", 4) == pytest.approx(np.log(4))
  assert losses.bag_floor("uniform", "mce", 1) == 0.0 and losses.bag_floor("uniform", "alt", 4) == 0
  assert float(losses.mce_loss(jnp.full((1, 11), -1e4).at[0, 1:5].set(0.0), targets,
                               variant="alt")) == pytest.approx(0.0, abs=1e-6)


def test_kl_subtracts_the_floor_a_variant_registers():
  """kl=True subtracts the floor a variant registers, so that any variant's KL form is 0 at
  its optimum, not MCE's alone."""
  losses.register("floored", losses.Variant(losses.mce_rows, "MCE, floor 0.25",
                                            floor=lambda weights_S: 0.25))
  try:
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(6, 9)), jnp.float32)
    targets = jnp.asarray(np.random.default_rng(2).integers(0, 9, (6, 3)), jnp.int32)
    plain = losses.mce_loss(logits, targets, variant="floored")
    np.testing.assert_allclose(losses.mce_loss(logits, targets, variant="floored", kl=True),
                               plain - 0.25, rtol=1e-6)
  finally:
    losses.unregister("floored")


def test_a_short_run_trains_with_a_registered_variant(tmp_path, focal):
  """Four steps, two a phase: phase 1's bag loss is the focal MCE's, whose floor is 0 where
  MCE's is log 2."""
  summary = cli.run(tiny_config(steps=4, tst=dict(variant=focal),
                                train=dict(checkpoint_every=0, eval_every=100)), str(tmp_path))
  assert np.isfinite(summary["phase1_end_eval_bag_loss"]) and np.isfinite(
      summary["final_eval_loss"])
  assert summary["phase1_bag_floor"] == 0.0


@pytest.mark.slow
def test_a_run_trains_with_a_registered_variant(tmp_path, focal):
  """Phase 1 trains on the focal MCE: its held-out bag loss at the switch (step 6) is the slow
  version's on the checkpoint's parameters, over data.eval_batches batches of B held-out
  windows of S·L + 1 = 33 tokens."""
  config = tiny_config(tst=dict(variant=focal))
  summary = cli.run(config, str(tmp_path))
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  assert [r["phase"] for r in records if "loss" in r] == ["tst"] * 6 + ["ntp"] * 6
  assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
  bag = {r["step"]: r["eval_bag_loss"] for r in records if "eval_bag_loss" in r}
  assert summary["phase1_end_eval_bag_loss"] == bag[6]
  spec = spec_lib.build(config)
  graphdef, _ = step_lib.abstract_model(spec.model)
  params, _ = trained_run.restore_params(os.path.join(tmp_path, "checkpoints"), 6, spec.model)
  model = nnx.merge(graphdef, params)
  windows = eval_windows(TokenStore(os.path.join(tmp_path, "data")).val, batch_size=4,
                         window=33, num_batches=2)
  slow = []
  for window in windows:
    hidden, _ = model.forward(sp.fold(jnp.asarray(window[:, :-1]), 2))
    logits = jax.device_get(model.logits(hidden))
    slow.append(slow_focal(logits, sp.bag_targets(jnp.asarray(window[:, 1:]), 2), np.ones(2)))
  assert bag[6] == pytest.approx(np.mean(slow), rel=1e-5)
  mce = [float(step_lib.loss(model, jnp.asarray(w), spec_lib.build(tiny_config()).plan.phases[0],
                             spec.loss)[0]) for w in windows]
  assert abs(bag[6] - np.mean(mce)) > 1e-3              # not the plain MCE
