"""Model families in one registry: each family's config and model classes, imported plainly.

A family's config owns what it knows: `build(rngs)`, `param_counts()` and
`flops_per_token(seq_len)`.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from tst_jax import schema
from tst_jax.errors import ConfigError
from tst_jax.models import llama, moe


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: its config dataclass, its model class and its named sizes."""
  config: type
  model: type
  presets: dict


ModelConfig = llama.LlamaConfig | moe.MoEConfig

# config.model.family, which is also the family's Hugging Face model_type.
FAMILIES = {"llama": Family(llama.LlamaConfig, llama.Llama, llama.PRESETS),
            "qwen3_moe": Family(moe.MoEConfig, moe.Qwen3MoE, moe.PRESETS)}


FAMILY = schema.one_of(FAMILIES)   # config.model.family's rule


def family(name: str) -> Family:
  """Returns the family called `name`, config.model.family."""
  if not FAMILY.ok(name):
    raise ConfigError("model.family", f"must be {FAMILY.must}, got {name!r}")
  return FAMILIES[name]


def preset_config(name: str, preset: str, **overrides) -> ml_collections.ConfigDict:
  """Returns a ConfigDict of every field of family `name`'s config, from a preset."""
  presets = family(name).presets
  if preset not in presets:
    raise ValueError(f"unknown {name} preset {preset!r}: choose from {tuple(presets)}")
  config = schema.defaults(family(name).config, **{**presets[preset], **overrides})
  config.family = name
  return config


def model_config(model_cfg):
  """Returns the model section of a run config as its family's frozen config dataclass: every
  field checked by its rule, then the combinations by the dataclass."""
  fields = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
  return schema.parse(family(fields.pop("family", None)).config, fields, "model")


def family_of(cfg) -> str:
  """Returns the family name of a model config dataclass."""
  for name, f in FAMILIES.items():
    if type(cfg) is f.config:
      return name
  raise TypeError(f"not a model config: {type(cfg).__name__}")
