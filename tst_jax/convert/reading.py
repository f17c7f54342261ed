"""Reading a Hugging Face checkpoint for a converter: the family's config and each tensor,
checked against what the family expects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


def make_config(cls, fields: dict, overrides: dict):
  """Returns `cls(**fields, **overrides)`, naming any override that is not a field of `cls`."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(f"unknown {cls.__name__} overrides {unknown}; fields are {sorted(names)}")
  return cls(**{**fields, **overrides})


def read(tensors: Mapping, name: str, shape) -> np.ndarray:
  """Checkpoint tensor `name` as float32, checked against the expected `shape`."""
  shape = tuple(int(s) for s in shape)
  if name not in tensors:
    raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {shape})")
  x = tensors[name]
  if tuple(x.shape) != shape:
    raise ValueError(f"tensor {name!r} has shape {tuple(x.shape)}, expected {shape}")
  return np.asarray(x, np.float32)
