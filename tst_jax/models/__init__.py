"""Model families behind one small registry: config dataclass, module class, counts, FLOPs."""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing

import ml_collections

from tst_jax.errors import ConfigError

# family -> module; each module defines CONFIG_CLS, MODEL_CLS, PRESETS, param_counts(cfg)
# (total, active) and flops_per_token(cfg, seq_len).
FAMILIES = {"llama": "tst_jax.models.llama", "qwen3_moe": "tst_jax.models.moe"}


def family_module(family: str):
  if family not in FAMILIES:
    raise ConfigError("model.family", f"must be one of {tuple(FAMILIES)}, got {family!r}")
  return importlib.import_module(FAMILIES[family])


def preset_config(family: str, preset: str, **overrides) -> ml_collections.ConfigDict:
  """A ConfigDict holding every field of the family's config dataclass, from a preset."""
  module = family_module(family)
  if preset not in module.PRESETS:
    raise ValueError(f"unknown {family} preset {preset!r}: choose from {tuple(module.PRESETS)}")
  fields = {f.name: f.default for f in dataclasses.fields(module.CONFIG_CLS)
            if f.default is not dataclasses.MISSING}
  fields.update(module.PRESETS[preset], **overrides)
  # None defaults become typed placeholders so `--config.model.rope_scaling=(8, 1, 4, 8192)`
  # works: `tuple | None` -> placeholder(tuple).
  hints = typing.get_type_hints(module.CONFIG_CLS)
  for name, value in fields.items():
    if value is None:
      fields[name] = ml_collections.config_dict.placeholder(_optional_type(hints[name], name))
  return ml_collections.ConfigDict(dict(family=family, **fields))


def _optional_type(hint, name: str) -> type:
  """`T | None` (or Optional[T]) -> T: the type a None-defaulted field holds when set."""
  kinds = [k for k in typing.get_args(hint) if k is not type(None)]
  if typing.get_origin(hint) not in (typing.Union, types.UnionType) or len(kinds) != 1:
    raise TypeError(f"model.{name}: a None default needs a `T | None` annotation, got {hint}")
  return typing.get_origin(kinds[0]) or kinds[0]    # tuple[int, ...] -> tuple


def model_config(model_cfg):
  """The model section of a run config -> the family's frozen config dataclass (once)."""
  fields = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
  module = family_module(fields.pop("family"))
  known = {f.name for f in dataclasses.fields(module.CONFIG_CLS)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ConfigError("model", f"unknown model fields {unknown} for "
                      f"{module.CONFIG_CLS.__name__}")
  return module.CONFIG_CLS(**fields)


def module_for(cfg):
  for family in FAMILIES:
    module = family_module(family)
    if type(cfg) is module.CONFIG_CLS:
      return module
  raise TypeError(f"not a model config: {type(cfg).__name__}")


def build(cfg, rngs):
  return module_for(cfg).MODEL_CLS(cfg, rngs=rngs)
