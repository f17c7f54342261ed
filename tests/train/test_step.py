"""The train step (tst_jax/train/step.py): both phases cost the same FLOPs in XLA's compiled
cost analysis; the fused loss in the trainer follows the naive one."""

import jax
import numpy as np
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.train import cli, optim, spec as spec_lib, step as step_lib
from tst_jax.train import workdir as workdir_lib


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
    losses[impl] = [r["loss"] for r in workdir_lib.read_metrics(str(workdir))
                    if "loss" in r]
  np.testing.assert_allclose(losses["xla"], losses["naive"], rtol=2e-5)
