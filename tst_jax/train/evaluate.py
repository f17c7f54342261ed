"""Held-out evaluation: the next-token loss on the same validation windows every time, and on
each named set of data.eval_sets, each with its bits per byte where the store records the
bytes of its text; in phase 1 also the phase's own loss on held-out bags."""

from __future__ import annotations

import math

import jax
import numpy as np

from tst_jax.parallel.logical import axis_rules
from tst_jax.train import step as step_lib
from tst_jax.config.plan import Phase


class Evaluator:
  """Returns the held-out next-token loss of a run's parameters, in nats per token, its bits
  per byte, and the held-out loss of a tst phase's task."""

  def __init__(self, trainer: step_lib.Trainer, windows: list[np.ndarray], process_count: int,
               sets: dict[str, list[np.ndarray]] | None = None, eos_id: int | None = None, *,
               bags: dict[Phase, list[np.ndarray]] | None = None,
               token_bytes: list[np.ndarray] | None = None,
               set_bytes: dict[str, list[np.ndarray] | None] | None = None):
    """`bags` holds each tst phase's held-out windows of its S·L + 1 tokens, its rows of its
    batches of phase.batch_size. `token_bytes` holds the UTF-8 bytes of text under each token
    of `windows`, and `set_bytes` of each set's, None where the store does not record them."""
    self.trainer, self.windows, self.process_count = trainer, windows, process_count
    self.sets, self.bags = sets or {}, bags or {}
    self.documents = step_lib.Documents.of(trainer.spec.data, eos_id)
    self.eval_step = self._jit(step_lib.make_eval_step(trainer.graphdef, self.documents))
    self.bag_steps = {}   # phase -> its jitted bag_eval_step, made at its first eval
    set_bytes = set_bytes or {}
    # Nats of a token to bits of a byte, per set ("": the run's own), None where unknown.
    self.per_byte = {name: self._per_byte(w, b) for name, w, b in
                     [("", windows, token_bytes)]
                     + [(n, w, set_bytes.get(n)) for n, w in self.sets.items()]}

  def __call__(self, params) -> float:
    return self.loss_of(params, self.windows)

  def of_sets(self, params) -> dict[str, float]:
    """Returns the held-out loss of each set of data.eval_sets, by name."""
    return {name: self.loss_of(params, windows) for name, windows in self.sets.items()}

  def bits_per_byte(self, loss: float, name: str = "") -> float | None:
    """Returns the bits per byte of text of a held-out `loss` of the run's own windows, or of
    set `name`'s: the loss summed over the scored tokens, in bits, over the bytes of text
    under those tokens. None where the store does not record its bytes."""
    factor = self.per_byte[name]
    return None if factor is None else loss * factor

  def record(self, params, phase: Phase) -> dict:
    """Returns every held-out loss of `params` after a step of `phase`, as metrics.jsonl
    names them: eval_loss and eval_bpb, eval_loss/<set> and eval_bpb/<set>, and in a tst
    phase eval_bag_loss. A bits per byte whose bytes are unknown is left out."""
    losses = {"": self(params)} | self.of_sets(params)
    record = {}
    for name, loss in losses.items():
      bpb = self.bits_per_byte(loss, name)
      suffix = f"/{name}" if name else ""
      record |= {f"eval_loss{suffix}": loss} | ({} if bpb is None else
                                                 {f"eval_bpb{suffix}": bpb})
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

  def _per_byte(self, windows: list[np.ndarray], token_bytes: list[np.ndarray] | None
                ) -> float | None:
    """Returns tokens / (bytes x ln 2) of the targets `loss_of` scores in `windows`, the factor
    from a loss in nats per token to bits per byte, None without the bytes (or with none)."""
    if token_bytes is None:
      return None
    scored = jax.jit(step_lib.make_scored_step(self.documents),
                     in_shardings=(self.trainer.batch_sharding,) * 2)
    tokens, nbytes = 0, 0
    for window, under in zip(windows, token_bytes, strict=True):
      n, b = self._run(scored, self._batch(window), under)
      tokens, nbytes = tokens + int(n), nbytes + int(b)
    return tokens / (nbytes * math.log(2)) if nbytes else None

  def _jit(self, fn):
    return jax.jit(fn, in_shardings=(self.trainer.shardings.params, self.trainer.batch_sharding))

  def _batch(self, window: np.ndarray) -> jax.Array:
    """Returns the global batch of which `window` holds this process's rows."""
    return jax.make_array_from_process_local_data(
        self.trainer.batch_sharding, window,
        (len(window) * self.process_count, window.shape[1]))

  def _run(self, step, first, window: np.ndarray):
    """Runs `step` on `first` (the parameters, or a global batch) and the global batch of
    which `window` holds this process's rows."""
    with axis_rules(self.trainer.mesh, self.trainer.spec.run.logical_axis_rules):
      return jax.device_get(step(first, self._batch(window)))
