"""Model families in one registry: each family's config and model classes, imported plainly.

What a family provides is `FamilyConfig` and `FamilyModel` below; `register` adds one. A
family's config owns what it knows: `build(rngs)`, its parameter counts and its FLOPs. Its
Hugging Face converter, where it has one, registers in tst_jax/convert/hf.py.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import ml_collections

from tst_jax import schema
from tst_jax.errors import ConfigError
from tst_jax.models import llama, moe


@runtime_checkable
class FamilyConfig(Protocol):
  """What the run asks of a family's frozen config dataclass (config.model).

  The fields are read by the plan, the fit check and the platform's `auto` choices; a field
  of these names with another meaning would mislead them.
  """
  vocab_size: int
  dim: int
  n_layers: int
  head_dim: int
  dtype: str
  remat: str
  attention_impl: str
  tie_embeddings: bool

  def build(self, rngs):
    """Returns the model of this config (a FamilyModel), its parameters drawn from `rngs`."""

  def param_counts(self) -> tuple[int, int]:
    """Returns (total, active) parameters from shapes alone: active counts what a token uses."""

  def matmul_params(self) -> int:
    """Returns the matmul parameters a token goes through: the N of the 6N FLOPs rule."""

  def flops_per_token(self, seq_len: int) -> float:
    """Returns training FLOPs per position at `seq_len` positions, attention included."""


@runtime_checkable
class FamilyModel(Protocol):
  """What the train step, the evals and the sampler ask of a family's model."""

  def forward(self, tokens, documents_BxL=None, positions_BxL=None):
    """Maps tokens [B, L] or bags [B, L, S] to final hidden states [B, L, D] and its aux."""

  def aux_loss(self, aux):
    """Returns the auxiliary training loss and its metrics from `forward`'s aux."""

  def head_kernel(self):
    """Returns the LM head as a [D, V] kernel."""

  def logits(self, h_BxLxD):
    """Returns float32 logits [B, L, V] of hidden states."""

  def init_cache(self, batch: int, max_len: int):
    """Returns an empty KV cache for `decode`."""

  def decode(self, tokens_BxL, positions_BxL, cache):
    """Returns the logits of tokens at `positions` against the cache, and the updated cache."""


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: its config dataclass, its model class and its named sizes."""
  config: type
  model: type
  presets: dict


# A model section, typed: the config of any family of FAMILIES, one registered later too, so
# what every family's config meets rather than a union of the families there are at import.
ModelConfig = FamilyConfig

# config.model.family, which is also the family's Hugging Face model_type.
FAMILIES = {"llama": Family(llama.LlamaConfig, llama.Llama, llama.PRESETS),
            "qwen3_moe": Family(moe.MoEConfig, moe.Qwen3MoE, moe.PRESETS)}


FAMILY = schema.registered(FAMILIES)   # config.model.family's rule


def register(name: str, family_: Family, *, replace: bool = False) -> None:
  """Adds model family `name`: from then on config.model.family may name it (schema.register's
  rule). Its config class must be a frozen dataclass of schema fields that meets FamilyConfig."""
  missing = [m for m in ("build", "param_counts", "matmul_params", "flops_per_token")
             if not callable(getattr(family_.config, m, None))]
  if missing:
    raise TypeError(f"family {name!r}: its config lacks {', '.join(missing)} (FamilyConfig)")
  schema.register(FAMILIES, "model family", name, family_, replace=replace)


def unregister(name: str) -> None:
  """Removes model family `name`, as a test that registered one does after it."""
  del FAMILIES[name]


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
