"""Held-out evaluation: the next-token loss on the same validation windows every time, and on
each named set of data.eval_sets; in phase 1 also the phase's own loss on held-out bags."""

from __future__ import annotations

import jax
import numpy as np

from tst_jax.parallel.logical import axis_rules
from tst_jax.train import step as step_lib
from tst_jax.train.plan import Phase


class Evaluator:
  """Returns the held-out next-token loss of a run's parameters, in nats per token, and the
  held-out loss of a tst phase's task."""

  def __init__(self, trainer: step_lib.Trainer, windows: list[np.ndarray], process_count: int,
               sets: dict[str, list[np.ndarray]] | None = None, eos_id: int | None = None,
               bags: dict[Phase, list[np.ndarray]] | None = None):
    """`bags` holds each tst phase's held-out windows of its S·L + 1 tokens, its rows of its
    batches of phase.batch_size."""
    self.trainer, self.windows, self.process_count = trainer, windows, process_count
    self.sets, self.bags = sets or {}, bags or {}
    self.documents = step_lib.Documents.of(trainer.spec.data, eos_id)
    self.eval_step = self._jit(step_lib.make_eval_step(trainer.graphdef, self.documents))
    self.bag_steps = {}   # phase -> its jitted bag_eval_step, made at its first eval

  def __call__(self, params) -> float:
    return self.loss_of(params, self.windows)

  def of_sets(self, params) -> dict[str, float]:
    """Returns the held-out loss of each set of data.eval_sets, by name."""
    return {name: self.loss_of(params, windows) for name, windows in self.sets.items()}

  def record(self, params, phase: Phase) -> dict:
    """Returns every held-out loss of `params` after a step of `phase`, as metrics.jsonl
    names them: eval_loss, eval_loss/<set>, and in a tst phase eval_bag_loss."""
    record = dict(eval_loss=self(params),
                  **{f"eval_loss/{name}": x for name, x in self.of_sets(params).items()})
    bag = self.bag_loss(params, phase)
    return record | ({} if bag is None else dict(eval_bag_loss=bag))

  def loss_of(self, params, windows: list[np.ndarray]) -> float:
    """Returns the next-token loss of `params` on `windows`, this process's rows of each batch."""
    total, count = 0.0, 0.0
    for window in windows:
      s, n = self._run(self.eval_step, params, window)
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)

  def bag_loss(self, params, phase: Phase) -> float | None:
    """Returns the loss that tst `phase` trains on, its S, weighting and variant, as the mean
    over its held-out batches (`step.make_bag_eval_step`); None in ntp or without windows."""
    windows = self.bags.get(phase)
    if not phase.is_tst or not windows:
      return None
    if phase not in self.bag_steps:
      self.bag_steps[phase] = self._jit(step_lib.make_bag_eval_step(
          self.trainer.graphdef, phase, self.trainer.spec.loss, self.documents))
    return float(np.mean([self._run(self.bag_steps[phase], params, w) for w in windows]))

  def _jit(self, fn):
    return jax.jit(fn, in_shardings=(self.trainer.shardings.params, self.trainer.batch_sharding))

  def _run(self, step, params, window: np.ndarray):
    """Runs `step` on the global batch of which `window` holds this process's rows."""
    trainer = self.trainer
    batch = jax.make_array_from_process_local_data(
        trainer.batch_sharding, window, (len(window) * self.process_count, window.shape[1]))
    with axis_rules(trainer.mesh, trainer.spec.run.logical_axis_rules):
      return jax.device_get(step(params, batch))
