"""The phase handoff (tst_jax/train/handoff.py): the randomisation ablation's fresh embedding
and head, and the switch options (tst.switch_adam, tst.switch_warmup) in a two-phase run; the
handoff through a checkpoint runs in tests/train/test_loop.py."""

import json
import math

import jax
import numpy as np
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import cli
from tst_jax.config import defaults, spec as spec_lib
from tst_jax.errors import ConfigError
from tst_jax.train import step as step_lib
from tst_jax.train.handoff import reinit_embedding_and_head


def test_reinit_takes_embedding_and_head_from_a_fresh_init_and_keeps_the_rest():
  spec = spec_lib.build(tiny_config())
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  state = trainer.init_state(spec.run.seed)
  fresh = trainer.init_state(spec.run.seed + 1)
  out = reinit_embedding_and_head(state, trainer)
  swapped = 0
  for (path, got), old, new in zip(jax.tree_util.tree_leaves_with_path(out.params),
                                   jax.tree.leaves(state.params), jax.tree.leaves(fresh.params)):
    io = jax.tree_util.keystr(path).startswith(("['embed']", "['lm_head']"))
    np.testing.assert_array_equal(got, new if io else old)
    swapped += io
  assert swapped == 2 and int(out.step) == int(state.step)


@pytest.mark.parametrize("arg, field, value", [("adam_reset", "switch_adam", "reset"),
                                               ("rewarm50", "switch_warmup", 50)])
def test_the_switch_arms_set_their_fields(arg, field, value):
  c = defaults.apply_arms(tiny_config(), arg, "tiny")
  assert c.tst[field] == value


def test_a_rewarm_of_no_steps_is_refused_as_an_arm():
  with pytest.raises(ConfigError, match="rewarm0"):
    defaults.apply_arms(tiny_config(), "rewarm0", "tiny")


def test_switch_step_is_where_the_last_tst_phase_hands_over_to_ntp():
  assert spec_lib.build(tiny_config(steps=12, ratio=0.5)).plan.switch_step == 6
  assert spec_lib.build(tiny_config(steps=12, ratio=0.0)).plan.switch_step is None
  smooth = tiny_config(steps=12, ratio=0.5, bag_size=4, tst=dict(schedule="halve"))
  assert spec_lib.build(smooth).plan.switch_step == 6


def _rows(workdir):
  with open(f"{workdir}/metrics.jsonl") as f:
    return {r["step"]: r for r in map(json.loads, f) if "grad_norm" in r}


def test_a_run_with_both_switch_options_restarts_adam_and_rewarms_at_the_switch(tmp_path):
  """The run's logged lr follows the rewarm from the switch (step 6 of 12; a row's lr is the
  schedule's at the step before it). Its first next-token step's Adam first moment is
  (1 - b1) x that step's clipped gradient, whose RMS over the P parameters is
  0.1 x min(grad_norm, 1) / sqrt(P); the run that keeps its moments has more in it."""
  config = tiny_config(steps=12, ratio=0.5, tst=dict(switch_adam="reset", switch_warmup=4))
  cli.run(config, str(tmp_path / "both"))
  cli.run(tiny_config(steps=12, ratio=0.5), str(tmp_path / "keep"))
  both, keep = _rows(tmp_path / "both"), _rows(tmp_path / "keep")
  for step in range(1, 13):
    factor = min((step - 1 - 6 + 1) / 4, 1.0) if step > 6 else 1.0
    assert both[step]["lr"] == pytest.approx(keep[step]["lr"] * factor, rel=1e-6), step
  _, params = step_lib.abstract_model(spec_lib.build(config).model)
  n = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  first = both[7]
  want = 0.1 * min(first["grad_norm"], 1.0) / math.sqrt(n)
  assert first["adam_mu_rms"] == pytest.approx(want, rel=1e-4)
  assert keep[7]["adam_mu_rms"] > 1.5 * want
  for step in range(1, 7):      # phase 1 is the same run, to the last bits of another program
    assert both[step]["loss"] == pytest.approx(keep[step]["loss"], rel=1e-5)   # float bits
