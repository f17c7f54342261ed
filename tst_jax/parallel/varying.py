"""Under shard_map: operands made to vary over the same mesh axes before a custom VJP.

A custom VJP must return cotangents of its inputs' types, and a cotangent computed from several
operands varies over all their axes. dW of a grouped matmul varies over the token rows' axes,
and the gradient of a gathered row over the routing's. Broadcasting every operand to the union
of their axes with `jax.lax.pcast` outside the VJP makes the types agree. JAX's AD then sums
each cotangent over the axes its operand did not vary over, as for any replicated value used by
a varying computation. Outside a shard_map nothing varies and the operands come back as they
are.
"""

from __future__ import annotations

import jax


def varying_axes(a) -> frozenset:
  """Returns the manual mesh axes `a` varies over inside a shard_map, none outside one."""
  aval = jax.typeof(a)
  mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10, where older jax has aval.vma
  return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def alike(*arrays):
  """Makes each of `arrays` vary over the union of the mesh axes any of them varies over."""
  vma = [varying_axes(a) for a in arrays]
  axes = frozenset().union(*vma)
  return tuple(jax.lax.pcast(a, tuple(sorted(axes - v)), to="varying") if axes - v else a
               for a, v in zip(arrays, vma))


def shape_like(a, shape, dtype) -> jax.ShapeDtypeStruct:
  """Returns the type of an array of `shape` and `dtype` that varies as `a` does, for a Pallas
  call's output under a shard_map that checks varying axes."""
  aval = jax.typeof(a)
  if hasattr(aval, "manual_axis_type"):
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=aval.manual_axis_type)
  return jax.ShapeDtypeStruct(shape, dtype, vma=getattr(aval, "vma", frozenset()))
