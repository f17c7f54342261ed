"""Preemption: SIGTERM/SIGINT finish the step, checkpoint, and exit 0; a second signal exits."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import jax
import numpy as np

log = logging.getLogger("tst_jax")


class Preempted(Exception):
  """Raised inside the loop once the checkpoint of `step` is written."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}")
    self.step = step


class PreemptionGuard:
  """Turns SIGTERM/SIGINT into a request the loop honours after the current step.

  On several processes the request is agreed with an all-gather every step, so every
  process stops (and checkpoints) at the same step, whichever of them got the signal.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      sys.stderr.write(f"second {signal.Signals(signum).name}: exiting now, without a "
                       "checkpoint\n")
      os._exit(128 + signum)
    self.requested = True
    log.warning("%s received: finishing this step, then checkpointing and exiting (send it "
                "again to exit at once)", signal.Signals(signum).name)

  def should_stop(self) -> bool:
    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils
    return bool(np.max(multihost_utils.process_allgather(np.int32(self.requested))))

  def close(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
