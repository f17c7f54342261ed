"""Logical axis names on arrays, resolved against the active mesh and rules.

Kept over Flax's logical_to_mesh_axes: Flax assigns rules in priority order over the whole
array and skips a rule whose axes are partly taken, where this fills dimensions left to right.
"""

from __future__ import annotations

import contextlib
import threading

import jax
from jax.sharding import NamedSharding, PartitionSpec

_CONTEXT = threading.local()

# The default config.logical_axis_rules. The first rule for a name wins, and a mesh axis is used
# once per array.
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp", "expert")),  # [B, ...] batches and activations: data parallel
    ("layers", None),                       # stacked-layer axis of scanned blocks: never split
    ("vocab", "tensor"),                    # V of the [V, D] embedding and [D, V] head
    ("embed", "fsdp"),                      # D of every weight: FSDP shards it
    ("mtp_in", "fsdp"),                     # 2D, the input of DeepSeek's MTP projection [2D, D]
    ("heads", "tensor"),                    # H of q/o projections: tensor parallel
    ("kv_heads", "tensor"),                 # K of k/v projections
    ("mlp", "tensor"),                      # F of the SwiGLU weights
    ("expert", "expert"),                   # E of the MoE expert weights: expert parallel
    ("length", None),                       # sequence positions: not split
    ("head_dim", None),                     # G: not split
    ("norm", None),                         # norm scales: replicated
)


@contextlib.contextmanager
def axis_rules(mesh, rules):
  """Makes `constrain` map logical names to `mesh` axes through `rules` within the block."""
  previous = getattr(_CONTEXT, "value", None)
  _CONTEXT.value = (mesh, tuple((k, v) for k, v in rules))
  try:
    yield
  finally:
    _CONTEXT.value = previous


def current():
  """Returns the mesh and rules of the enclosing `axis_rules` block, or None outside one."""
  return getattr(_CONTEXT, "value", None)


def mesh_axes(entry) -> tuple[str, ...]:
  """Returns one PartitionSpec entry as a tuple of mesh axis names."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def logical_to_pspec(names, rules) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec, taking each dimension's free mesh axes in order.

  The first rule for a name wins and None means replicated. A mesh axis is used at most once
  per array, so a later name whose axes are all taken stays replicated.
  """
  table = {}
  for name, axes in rules:
    table.setdefault(name, axes)
  used, entries = set(), []
  for name in names:
    axes = tuple(a for a in mesh_axes(table.get(name)) if a not in used)
    used.update(axes)
    entries.append(axes[0] if len(axes) == 1 else (axes or None))
  return PartitionSpec(*entries)


def constrain(x, names):
  """Constrains an activation's sharding by logical names, a no-op outside `axis_rules`."""
  context = getattr(_CONTEXT, "value", None)
  if context is None:
    return x
  mesh, rules = context
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_pspec(names, rules)))
