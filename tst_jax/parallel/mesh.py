"""The device mesh from config, shardings of logically-named pytrees, and pre-compile checks."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from tst_jax import schema
from tst_jax.errors import ConfigError
from tst_jax.parallel.logical import logical_to_pspec, mesh_axes

MESH_AXES = ("data", "fsdp", "tensor", "expert")
_AXIS = schema.Rule(
    lambda v: isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1),
    "an integer >= 1, or -1 (all remaining devices)", int, lo=-1)


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """config.mesh: the device mesh's axis sizes. One may be -1 for the remaining devices."""
  data: int = schema.field(-1, _AXIS, "data parallel (-1: all remaining devices)")
  fsdp: int = schema.field(1, _AXIS, "FSDP: parameters sharded over it")
  tensor: int = schema.field(1, _AXIS, "tensor parallel: heads, FFW and vocab split")
  expert: int = schema.field(1, _AXIS, "expert parallel: the MoE experts split")
  dcn_data: int = schema.field(1, schema.integer(1), "multi-slice: slices (or processes) the "
                               "data axis spans over DCN")


def mesh_shape(mesh_cfg, num_devices: int) -> dict[str, int]:
  """Returns axis sizes from config, filling an axis of -1 with the remaining devices.

  A mesh without -1 may use fewer devices than there are, if its size divides their number.
  """
  sizes = {axis: int(getattr(mesh_cfg, axis)) for axis in MESH_AXES}
  fill = [a for a, n in sizes.items() if n == -1]
  if len(fill) > 1:
    raise ConfigError("mesh", f"at most one axis may be -1, got {fill}")
  if any(n == 0 or n < -1 for n in sizes.values()):
    raise ConfigError("mesh", f"axis sizes must be >= 1 or -1, got {sizes}")
  known = math.prod(n for n in sizes.values() if n != -1)
  if num_devices % known:
    raise ConfigError("mesh", f"{sizes}: {known} devices do not divide the {num_devices} "
                      "available devices")
  if fill:
    sizes[fill[0]] = num_devices // known
  return sizes


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  """Builds the data, fsdp, tensor, expert mesh over `devices`, by default all of them."""
  devices = jax.devices() if devices is None else list(devices)
  sizes = mesh_shape(mesh_cfg, len(devices))
  shape = tuple(sizes[a] for a in MESH_AXES)
  if math.prod(shape) < len(devices):
    if jax.process_count() > 1:
      raise ConfigError("mesh", f"{sizes} uses {math.prod(shape)} of the {len(devices)} "
                       "devices; a multi-process mesh must use them all (set an axis to -1)")
    devices = devices[:math.prod(shape)]   # e.g. a one-device run on a host of 8
  grid = device_grid(shape, int(mesh_cfg.dcn_data), devices)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def device_grid(shape, dcn_data: int, devices) -> np.ndarray:
  """Lays out devices as `shape`, with fast links on the inner axes.

  With dcn_data > 1 the data axis is split over that many TPU slices, or GPU and CPU host
  processes, joined by the slower data-centre network. Every other axis stays inside one slice.
  """
  if dcn_data <= 1:
    try:
      return mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError, AssertionError):  # unusual topologies
      return np.asarray(devices).reshape(shape)
  if shape[0] % dcn_data:
    raise ConfigError("mesh.dcn_data", f"{dcn_data} must divide the data axis ({shape[0]})")
  ici = (shape[0] // dcn_data,) + tuple(shape[1:])
  return mesh_utils.create_hybrid_device_mesh(
      ici, (dcn_data, 1, 1, 1), devices,
      process_is_granule=not hasattr(devices[0], "slice_index"))


def tree_shardings(logical_specs, mesh: Mesh, rules):
  """Maps a pytree of logical PartitionSpecs from nnx.get_partition_spec to NamedShardings."""
  def to_sharding(pspec):
    names = tuple(pspec) if isinstance(pspec, PartitionSpec) else ()
    return NamedSharding(mesh, logical_to_pspec(names, rules))
  return jax.tree.map(to_sharding, logical_specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


def batch_sharding(mesh: Mesh, rules, ndim: int) -> NamedSharding:
  """Shards a batch's first axis like the 'batch' logical axis and replicates the rest."""
  return NamedSharding(mesh, logical_to_pspec(("batch",) + (None,) * (ndim - 1), rules))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def _axes(sharding: NamedSharding, dim: int) -> tuple[str, ...]:
  pspec = tuple(sharding.spec) + (None,) * (dim + 1 - len(sharding.spec))
  return mesh_axes(pspec[dim])


def shards(sharding: NamedSharding, dim: int) -> int:
  """Counts how many ways dimension `dim` is split by `sharding`."""
  return math.prod(sharding.mesh.shape[a] for a in _axes(sharding, dim))


def process_batch_block(sharding: NamedSharding) -> tuple[int, int]:
  """Returns index and count: this process loads block `index` of `count` equal row blocks.

  The blocks split every global batch. Replicas, processes holding the same rows, get the same
  block.
  """
  n = shards(sharding, 0)
  rows = {index[0].start or 0
          for index in sharding.addressable_devices_indices_map((n, 1)).values()}
  first, count = min(rows), n // len(rows)
  if rows != set(range(first, first + len(rows))) or first % len(rows):
    raise ValueError(f"process {jax.process_index()} holds batch shards {sorted(rows)} of {n}: "
                     "not one contiguous block; order the mesh devices by process")
  return first // len(rows), count


def check_batch(batch_size: int, sharding: NamedSharding, what: str,
                field: str = "data.batch_size"):
  """Checks that a global batch splits evenly over the mesh axes that shard the batch."""
  n = shards(sharding, 0)
  if batch_size % n:
    axes = {a: sharding.mesh.shape[a] for a in _axes(sharding, 0) if sharding.mesh.shape[a] > 1}
    raise ConfigError(field, f"{what} do not divide over the {n} batch shards of mesh axes "
                      f"{axes}; use a multiple of {n}")


def check_divisible(abstract_tree, shardings, what: str = "parameter"):
  """Checks that every sharded array dimension is a multiple of its mesh axes' size."""
  problems = []

  def check(path, leaf, sharding):
    for dim, size in enumerate(leaf.shape):
      if size % shards(sharding, dim):
        problems.append(f"{jax.tree_util.keystr(path)} {tuple(leaf.shape)}: dim {dim} "
                        f"({size}) over mesh axes {_axes(sharding, dim)} "
                        f"({shards(sharding, dim)} devices)")

  jax.tree_util.tree_map_with_path(check, abstract_tree, shardings)
  if problems:
    raise ConfigError("mesh", f"{len(problems)} {what} dimensions do "
                     "not divide over their mesh axes: " + "; ".join(problems[:3]) +
                     (" ..." if len(problems) > 3 else "") + " (change the mesh or the model "
                     "shape, or map that logical axis to None)")


def per_device_bytes(tree, device=None) -> int:
  """Counts the bytes of `tree`'s shards on `device`, by default the first local device."""
  device = jax.local_devices()[0] if device is None else device
  return sum(shard.data.nbytes for leaf in jax.tree.leaves(tree)
             for shard in leaf.addressable_shards if shard.device == device)
