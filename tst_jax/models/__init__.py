"""Model families behind one small registry: config dataclass, module class, counts, FLOPs."""

from __future__ import annotations

import dataclasses
import importlib

import ml_collections

from tst_jax import schema
from tst_jax.errors import ConfigError

@dataclasses.dataclass(frozen=True)
class Family:
  """A model family's modules, by import path: `model` defines CONFIG_CLS, MODEL_CLS,
  PRESETS, param_counts(cfg) (total, active) and flops_per_token(cfg, seq_len); `hf`, the
  Hugging Face converter of the same architecture (tst_jax.convert.hf: the family's name is
  its HF model_type)."""
  model: str
  hf: str


# The one registry of model families: config.model.family, and the HF model_type.
FAMILIES = {"llama": Family("tst_jax.models.llama", "tst_jax.convert.llama_hf"),
            "qwen3_moe": Family("tst_jax.models.moe", "tst_jax.convert.qwen3_moe_hf")}


def family_module(family: str):
  if family not in FAMILIES:
    raise ConfigError("model.family", f"must be one of {tuple(FAMILIES)}, got {family!r}")
  return importlib.import_module(FAMILIES[family].model)


def preset_config(family: str, preset: str, **overrides) -> ml_collections.ConfigDict:
  """A ConfigDict holding every field of the family's config dataclass, from a preset."""
  module = family_module(family)
  if preset not in module.PRESETS:
    raise ValueError(f"unknown {family} preset {preset!r}: choose from {tuple(module.PRESETS)}")
  config = schema.defaults(module.CONFIG_CLS, **{**module.PRESETS[preset], **overrides})
  config.family = family
  return config


def model_config(model_cfg):
  """The model section of a run config -> the family's frozen config dataclass (once): every
  field checked by its rule (schema), then the combinations by the dataclass."""
  fields = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
  module = family_module(fields.pop("family", None))
  return schema.parse(module.CONFIG_CLS, fields, "model")


def family_of(cfg) -> str:
  """The family name of a model config dataclass."""
  for family in FAMILIES:
    if type(cfg) is family_module(family).CONFIG_CLS:
      return family
  raise TypeError(f"not a model config: {type(cfg).__name__}")


def module_for(cfg):
  return family_module(family_of(cfg))


def build(cfg, rngs):
  return module_for(cfg).MODEL_CLS(cfg, rngs=rngs)
