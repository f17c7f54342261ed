"""Logical axis names on activations, resolved against the active mesh and rules."""

from __future__ import annotations

import contextlib
import threading

import jax
from jax.sharding import NamedSharding, PartitionSpec

_CONTEXT = threading.local()

# Logical axis -> mesh axes (config.logical_axis_rules). The first matching rule wins; a mesh
# axis is used once per array.
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp", "expert")),  # [B, ...] batches and activations: data parallel
    ("layers", None),                       # stacked-layer axis of scanned blocks: never split
    ("vocab", "tensor"),                    # V of the [V, D] embedding and [D, V] head
    ("embed", "fsdp"),                      # D of every weight: FSDP shards it
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
  """Within this block, `constrain` maps logical names to `mesh` axes through `rules`."""
  previous = getattr(_CONTEXT, "value", None)
  _CONTEXT.value = (mesh, tuple((k, v) for k, v in rules))
  try:
    yield
  finally:
    _CONTEXT.value = previous


def current():
  """The (mesh, rules) of the enclosing `axis_rules` block, or None outside one."""
  return getattr(_CONTEXT, "value", None)


def mesh_axes(entry) -> tuple[str, ...]:
  """One PartitionSpec entry (None, an axis name or a tuple of them) as a tuple of names."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def logical_to_pspec(names, rules) -> PartitionSpec:
  """Logical axis names -> PartitionSpec: the first rule for a name wins, None = replicated.

  A mesh axis is used at most once per array; a later name that maps to a used axis
  is left replicated.
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
  """Sharding constraint on an activation by logical names; a no-op without a mesh."""
  context = getattr(_CONTEXT, "value", None)
  if context is None:
    return x
  mesh, rules = context
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_pspec(names, rules)))
