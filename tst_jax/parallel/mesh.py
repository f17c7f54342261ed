"""The device mesh from config, and NamedShardings for logically-annotated pytrees."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from tst_jax.parallel.logical import logical_to_spec

MESH_AXES = ("data", "fsdp", "tensor", "expert")


def mesh_shape(mesh_cfg, num_devices: int) -> dict[str, int]:
  """Axis sizes from config; one axis may be -1 (fill with the remaining devices)."""
  sizes = {axis: int(mesh_cfg[axis]) for axis in MESH_AXES}
  fill = [a for a, n in sizes.items() if n == -1]
  if len(fill) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {fill}")
  if any(n == 0 or n < -1 for n in sizes.values()):
    raise ValueError(f"config.mesh: axis sizes must be >= 1 or -1, got {sizes}")
  known = math.prod(n for n in sizes.values() if n != -1)
  if fill:
    if num_devices % known:
      raise ValueError(f"config.mesh {sizes}: the fixed axes ({known} devices) do not divide "
                       f"the {num_devices} available devices")
    sizes[fill[0]] = num_devices // known
  if math.prod(sizes.values()) != num_devices:
    raise ValueError(f"config.mesh {sizes} needs {math.prod(sizes.values())} devices but "
                     f"{num_devices} are available")
  return sizes


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  sizes = mesh_shape(mesh_cfg, len(devices))
  shape = tuple(sizes[a] for a in MESH_AXES)
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # CPU / unusual topologies: plain row-major order
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def tree_shardings(logical_specs, mesh: Mesh, rules):
  """A pytree of logical PartitionSpecs (nnx.get_partition_spec) -> NamedShardings."""
  def to_sharding(spec):
    names = tuple(spec) if isinstance(spec, PartitionSpec) else ()
    return NamedSharding(mesh, logical_to_spec(names, rules))
  return jax.tree.map(to_sharding, logical_specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


def batch_sharding(mesh: Mesh, rules, ndim: int) -> NamedSharding:
  """Batches shard their first axis like the 'batch' logical axis; the rest is replicated."""
  return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), rules))
