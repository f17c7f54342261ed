"""Held-out evaluation: the next-token loss on the same validation windows every time, and on
each named set of data.eval_sets."""

from __future__ import annotations

import jax
import numpy as np

from tst_jax.parallel.logical import axis_rules
from tst_jax.train import step as step_lib


class Evaluator:
  """Returns the held-out next-token loss of a run's parameters, in nats per token."""

  def __init__(self, trainer: step_lib.Trainer, windows: list[np.ndarray], process_count: int,
               sets: dict[str, list[np.ndarray]] | None = None, eos_id: int | None = None):
    self.trainer, self.windows, self.process_count = trainer, windows, process_count
    self.sets = sets or {}
    documents = step_lib.Documents.of(trainer.spec.data, eos_id)
    self.eval_step = jax.jit(step_lib.make_eval_step(trainer.graphdef, documents),
                             in_shardings=(trainer.shardings.params, trainer.batch_sharding))

  def __call__(self, params) -> float:
    return self.loss_of(params, self.windows)

  def of_sets(self, params) -> dict[str, float]:
    """Returns the held-out loss of each set of data.eval_sets, by name."""
    return {name: self.loss_of(params, windows) for name, windows in self.sets.items()}

  def loss_of(self, params, windows: list[np.ndarray]) -> float:
    """Returns the next-token loss of `params` on `windows`, this process's rows of each batch."""
    trainer = self.trainer
    total, count = 0.0, 0.0
    for window in windows:
      batch = jax.make_array_from_process_local_data(
          trainer.batch_sharding, window, (len(window) * self.process_count, window.shape[1]))
      with axis_rules(trainer.mesh, trainer.spec.run.logical_axis_rules):
        s, n = self.eval_step(params, batch)
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)
