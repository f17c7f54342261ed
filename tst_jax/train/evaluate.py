"""Held-out evaluation: the next-token loss on the same validation windows every time."""

from __future__ import annotations

import jax
import numpy as np

from tst_jax.parallel.logical import axis_rules
from tst_jax.train import step as step_lib


class Evaluator:
  """Returns the held-out next-token loss of a run's parameters, in nats per token."""

  def __init__(self, trainer: step_lib.Trainer, windows: list[np.ndarray], process_count: int):
    self.trainer, self.windows, self.process_count = trainer, windows, process_count
    self.eval_step = jax.jit(step_lib.make_eval_step(trainer.graphdef),
                             in_shardings=(trainer.shardings.params, trainer.batch_sharding))

  def __call__(self, params) -> float:
    trainer = self.trainer
    total, count = 0.0, 0.0
    for window in self.windows:
      batch = jax.make_array_from_process_local_data(
          trainer.batch_sharding, window, (len(window) * self.process_count, window.shape[1]))
      with axis_rules(trainer.mesh, trainer.spec.run.logical_axis_rules):
        s, n = self.eval_step(params, batch)
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)
