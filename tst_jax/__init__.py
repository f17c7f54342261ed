"""tst-jax: Token-Superposition Training for JAX/Flax language models.

Shape letters, as in `hidden_BxLxD`, `targets_NxS` or `# [B, L, S]`, mean one thing in every file:

  B  batch rows                          N  tokens of a flattened batch, B·L
  L  positions the model sees            D  model dim
  S  bag size, 1 in the ntp phase        F  ffw dim, an expert's in MoE
  T  data tokens per row, S·L            V  vocab
  W  window: a batch row, T + 1          H  query heads
  E  experts                             K  kv heads
  P  experts per token, the top-k        G  head dim
  A  expert assignments, N·P             M  cached positions when decoding
  R  assignments padded to whole blocks  C  rows of one tile or block in kernels and MoE

Counts that are not array dimensions get words: `total_steps`, `top_k`, `stream_len`.

The names below are the public API for a training loop of your own, as docs/api.md shows: the
superposed embedding, the phase views and bag targets, the MCE loss family and the switch. They
load on first use, so `import tst_jax` itself, which every `tst_jax.<module>` import runs first,
imports no JAX: a module that needs none pays for none.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# One storage client per workdir: with TensorFlow installed, etils.epath, under Orbax, would
# send gs:// through tf.io.gfile while every other file of the run goes through fsspec's
# gcsfs. This module runs before any tst_jax module imports Orbax, and etils reads the
# variable at its first gs:// path. A user's own setting stands.
os.environ.setdefault("EPATH_USE_TF", "false")

_EXPORTS = {
    "tst_jax.superposition": ("IGNORE_INDEX", "bag_targets", "data_length", "fold", "ntp_view",
                              "superpose", "switch_to_next_token", "tst_view",
                              "window_targets"),
    "tst_jax.losses": ("bag_weights", "cross_entropy", "linear_mce_loss", "mce_loss",
                       "mce_loss_per_position"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)

if TYPE_CHECKING:
  from tst_jax.losses import (bag_weights, cross_entropy, linear_mce_loss, mce_loss,
                              mce_loss_per_position)
  from tst_jax.superposition import (IGNORE_INDEX, bag_targets, data_length, fold, ntp_view,
                                     superpose, switch_to_next_token, tst_view, window_targets)


def __getattr__(name):
  if name not in _HOME:   # `from tst_jax import losses` then imports the submodule
    raise AttributeError(f"module 'tst_jax' has no attribute {name!r}")
  value = getattr(importlib.import_module(_HOME[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(list(globals()) + __all__)
