"""Preemption: SIGTERM or SIGINT finish the step, checkpoint and exit 0. A second signal exits."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import jax
from jax.experimental import multihost_utils

from tst_jax.parallel import distributed

log = logging.getLogger("tst_jax")


class Preempted(Exception):
  """Raised inside the loop once the checkpoint of `step` is written."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}")
    self.step = step


class PreemptionGuard:
  """Turns SIGTERM and SIGINT into a request the loop honours after the current step.

  With one process, a Python signal handler sets a flag that every step reads, with no
  communication.

  Several processes must stop and checkpoint at the same step, whichever of them got the
  signal, without a collective per step. JAX's preemption service, on by default with
  `jax.distributed`, owns SIGTERM. Its notice reaches every process through the coordination
  service in the background, and `reached_preemption_sync_point(step)` turns true at the same
  step everywhere, at the cost of a local call per step. Orbax's CheckpointManager asks the
  same. SIGINT is passed on to it as SIGTERM. With the service off through
  `jax_enable_preemption_service=False`, the processes all-gather their flags every
  `agree_every` steps instead.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, agree_every: int = 10):
    self.requested = False
    self.agree_every = agree_every
    self._previous = {}
    self._calls = 0
    multi = jax.process_count() > 1
    self.service = multi and bool(jax.config.jax_enable_preemption_service)
    if self.service:   # SIGTERM stays with JAX's notifier, and SIGINT is forwarded to it
      self._install((signal.SIGINT,), self._forward)
    else:
      self._install(self.SIGNALS, self._handle)

  def _install(self, signals, handler):
    if threading.current_thread() is threading.main_thread():
      for sig in signals:
        self._previous.setdefault(sig, signal.signal(sig, handler))

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      sys.stderr.write(f"second {signal.Signals(signum).name}: exiting now, without a "
                       "checkpoint\n")
      os._exit(128 + signum)
    self.requested = True
    log.warning("%s received: finishing this step, then checkpointing and exiting (send it "
                "again to exit at once)", signal.Signals(signum).name)

  def _forward(self, signum, frame):
    self._handle(signum, frame)
    os.kill(os.getpid(), signal.SIGTERM)   # JAX's notifier tells the other processes

  def should_stop(self, step: int | None = None) -> bool:
    """Says whether every process stops at this step, once `step` steps are done.

    Call it once per step with the number Orbax's CheckpointManager.save is given.
    """
    self._calls += 1
    if jax.process_count() == 1:
      return self.requested
    if self.service:
      if step is None:
        raise TypeError("should_stop(step): several processes agree on a step number")
      try:
        stop = multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError as e:   # no sync manager after all, so agree by all-gather
        log.warning("JAX preemption service unavailable (%s); processes agree on a stop "
                    "every %d steps instead", e, self.agree_every)
        self.service = False
        self._install(self.SIGNALS, self._handle)
        return False
      if stop:
        log.warning("preemption notice: every process stops after step %s", step)
      return stop
    if self._calls % self.agree_every:
      return False
    return distributed.any_process(self.requested)

  def close(self):
    for sig, handler in self._previous.items():
      if handler is not None:   # None is a handler not set from Python, JAX's, still in place
        signal.signal(sig, handler)
    self._previous = {}
