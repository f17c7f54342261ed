"""Phase 1 in stages of decreasing S (tst.schedule): the plan, the loss at each stage
boundary against the MCE written out, and a resume across a boundary."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from tests.fixtures import trained
from tests.fixtures.tiny import tiny_config
from tst_jax import losses
from tst_jax import superposition as sp
from tst_jax.data import run_data
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import defaults, record as record_lib, spec as spec_lib
from tst_jax.train.setup import Setup
from tst_jax.run import workdir as workdir_lib
from tst_jax.errors import ConfigError


def staged(**kw):
  """12 steps: S=4 for steps 0-2, S=2 for 3-5, next-token for 6-11."""
  c = tiny_config(bag_size=4, **kw)
  c.tst.schedule = "halve"
  return c


def test_stages_are_tst_phases_of_equal_flops_reading_consecutive_regions():
  plan = spec_lib.check(staged()).plan
  got = [(p.name, p.first_step, p.steps, p.bag_size, p.window) for p in plan.phases]
  assert got == [("tst", 0, 3, 4, 65), ("tst", 3, 3, 2, 33), ("ntp", 6, 6, 1, 17)]
  assert len({p.flops_per_step for p in plan.phases}) == 1
  assert [plan.data_start(p) for p in plan.phases] == [0, 3 * 4 * 64, 3 * 4 * 64 + 3 * 4 * 32]
  explicit = tiny_config(bag_size=4)
  explicit.tst.schedule = "4,2"
  assert spec_lib.check(explicit).plan == plan
  eight = tiny_config(bag_size=8, ratio=7 / 12)     # 7 phase-1 steps over S = 8, 4, 2
  eight.tst.schedule = "halve"
  assert [(p.bag_size, p.steps) for p in spec_lib.check(eight).plan.phases] == [
      (8, 3), (4, 2), (2, 2), (1, 5)]
  hard = spec_lib.check(tiny_config(bag_size=4)).plan
  assert [p.bag_size for p in hard.phases] == [4, 1]
  arm = defaults.apply_arms(tiny_config(bag_size=4), "smooth", "tiny")
  assert arm.tst.schedule == "halve" and spec_lib.check(arm).plan == plan


@pytest.mark.parametrize("schedule", ["4,4", "2", "8,4", "4,1", "x", "4,,2"])
def test_a_bad_schedule_names_its_field(schedule):
  c = tiny_config(bag_size=4)
  c.tst.schedule = schedule
  with pytest.raises(ConfigError, match=r"config\.tst\.schedule"):
    spec_lib.check(c)


def written_out_loss(model, window_BxW, bag_size):
  """The MCE of a window with S = bag_size (S = 1: next-token CE), written out here."""
  if bag_size == 1:
    return losses.mce_loss(model(window_BxW[:, :-1]), window_BxW[:, 1:, None])
  hidden, _ = model.forward(sp.fold(window_BxW[:, :-1], bag_size))
  return losses.mce_loss(model.logits(hidden), sp.bag_targets(window_BxW[:, 1:], bag_size))


# Not slow, though over the rule: the mutation score of config/plan.py counts it (docs/testing.md).
def test_each_step_at_a_stage_boundary_uses_its_stage_and_resumes_across_it(tmp_path, capsys):
  config = staged(train=dict(checkpoint_every=1, keep_checkpoints=20))
  cli.run(config, str(tmp_path))
  logged = {r["step"]: r for r in workdir_lib.read_metrics(RunDir(tmp_path))
            if "loss" in r}
  assert [logged[k]["bag_size"] for k in range(1, 13)] == [4] * 3 + [2] * 3 + [1] * 6
  # The run wrote its plan into the workdir: each stage's region of the stream, the passes
  # over its store's training tokens, the `auto` choices; read back, the run's own plan.
  record = json.loads((tmp_path / "plan.json").read_text())
  data = [3 * 4 * 64, 3 * 4 * 32, 6 * 4 * 16]
  assert [(p["first_step"], p["bag_size"], p["data_start"], p["data_tokens"])
          for p in record["phases"]] == [(0, 4, 0, data[0]), (3, 2, data[0], data[1]),
                                         (6, 1, data[0] + data[1], data[2])]
  train_tokens = len(run_data.TokenStore(str(tmp_path / "data")).train)
  assert record["data"]["train_tokens"] == train_tokens
  assert record["data"]["passes"] == pytest.approx([d / train_tokens for d in data])
  assert record["resolved"]["model.attention_impl"]["value"] == "xla"
  assert record_lib.read_plan(RunDir(tmp_path)).plan == spec_lib.check(config).plan
  written = (tmp_path / "plan.json").read_text()
  setup = Setup.create(spec_lib.build(config), RunDir(tmp_path))
  checkpoints = setup.open_checkpoints()
  for step in (2, 3, 5, 6):       # the last step of a stage and the first of the next
    phase = setup.spec.plan.phase_at(step)
    state, _ = checkpoints.restore(step, checkpoints.abstract_state)
    model = nnx.merge(setup.trainer.graphdef, state.params)
    window = np.asarray(jax.device_get(next(setup.batches(phase, step))))
    want = written_out_loss(model, window, phase.bag_size)
    np.testing.assert_allclose(logged[step + 1]["loss"], want, rtol=2e-5, err_msg=f"{step}")
  checkpoints.close()
  # Resume at step 2 (inside stage 1) through both boundaries: the same losses.
  trained.kill_after(tmp_path, 2)
  capsys.readouterr()
  os.remove(tmp_path / "plan.json")
  cli.run(config, str(tmp_path))
  assert "at step 2 of 12" in capsys.readouterr().out
  assert (tmp_path / "plan.json").read_text() == written      # written again, the same
  again = {r["step"]: r["loss"] for r in workdir_lib.read_metrics(RunDir(tmp_path))
           if "loss" in r}
  np.testing.assert_array_equal([again[k] for k in range(1, 13)],
                                [logged[k]["loss"] for k in range(1, 13)])
