"""Config files by name, `key=value` overrides with type coercion, and cartesian grids."""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import itertools
import os

import ml_collections

from tst_jax.errors import ConfigError

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def load_config(spec: str) -> ml_collections.ConfigDict:
  """'path/to/config.py[:arg]' -> the file's get_config(arg) (get_config() without an arg),
  as `config_flags.DEFINE_config_file` does."""
  path, _, arg = spec.partition(":") if not os.path.isfile(spec) else (spec, "", "")
  if not os.path.isfile(path):
    raise ConfigError(f"--config {spec}: file {path!r} does not exist")
  name = "_tst_config_" + os.path.splitext(os.path.basename(path))[0]
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"--config {spec}: {path!r} defines no get_config()")
  return module.get_config(arg) if arg else module.get_config()


def parse_override(text: str) -> tuple[str, str]:
  key, sep, value = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"override {text!r}: expected 'dotted.key=value'")
  return key.strip(), value.strip()


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> ml_collections.ConfigDict:
  """Sets each 'a.b.c=value' on `config` (in place, also returned). The value is coerced to
  the existing field's type; an unknown field or an impossible value is a ConfigError."""
  for text in overrides:
    key, raw = parse_override(text)
    parent, leaf = _parent(config, key)
    with config.unlocked() if config.is_locked else contextlib.nullcontext():
      parent[leaf] = coerce(raw, _field_type(parent, leaf), key)
  return config


def coerce(raw: str, kind: type | None, key: str = "value"):
  """The string `raw` as type `kind` (None: a Python literal if it parses, else the string)."""
  try:
    if kind is bool:
      if raw.lower() in _TRUE:
        return True
      if raw.lower() in _FALSE:
        return False
      raise ValueError("expected true/false")
    if kind is int:
      value = ast.literal_eval(raw)
      if isinstance(value, float) and value.is_integer():
        value = int(value)                       # 1e3 -> 1000
      if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("expected an integer")
      return value
    if kind is float:
      return float(raw)
    if kind is str:
      return raw
    if kind in (tuple, list):
      value = ast.literal_eval(raw)
      if value is None:
        return None
      return kind(value if isinstance(value, (tuple, list)) else (value,))
    if kind is None:
      try:
        return ast.literal_eval(raw)
      except (ValueError, SyntaxError):
        return raw
  except (ValueError, SyntaxError) as e:
    raise ConfigError(f"config.{key}: cannot read {raw!r} as {kind.__name__}: {e}") from None
  raise ConfigError(f"config.{key}: fields of type {kind.__name__} cannot be overridden")


def parse_grid(text: str) -> list[list[str]]:
  """'a=1,2;b=x,y' -> [['a=1', 'b=x'], ['a=1', 'b=y'], ['a=2', 'b=x'], ['a=2', 'b=y']]: the
  cartesian product, the first key varying slowest. An empty grid is one empty point."""
  axes = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    key, raw = parse_override(part)
    values = [v.strip() for v in raw.split(",")]
    if not all(values):
      raise ConfigError(f"--grid: axis {part!r} has an empty value")
    axes.append([f"{key}={v}" for v in values])
  keys = [a[0].partition("=")[0] for a in axes]
  if len(set(keys)) != len(keys):
    raise ConfigError(f"--grid {text!r}: names a key twice")
  return [list(point) for point in itertools.product(*axes)]


def _parent(config, key: str):
  """(section, leaf name) of a dotted key, with a did-you-mean error for unknown names."""
  *path, leaf = key.split(".")
  node = config
  for depth, name in enumerate(path + [leaf]):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      where = ".".join(path[:depth]) or "the config"
      options = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(name, options, n=3)
      hint = f"; did you mean {', '.join(close)}?" if close else f"; fields: {options}"
      raise ConfigError(f"config.{key}: unknown field: {where} has no {name!r}{hint}")
    if depth < len(path):
      node = node[name]
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise ConfigError(f"config.{key}: is a section, not a field: set one of its fields "
                     f"{sorted(node[leaf].keys())}")
  return node, leaf


def _field_type(parent, leaf: str) -> type | None:
  value = parent[leaf]
  if value is not None:
    return type(value)
  try:
    kind = parent.get_ref(leaf).get_type()   # placeholders (None defaults) keep their type
  except ValueError:                         # a field set to None: no type to keep
    return None
  return None if kind is type(None) else kind
