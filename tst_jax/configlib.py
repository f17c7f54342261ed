"""Config files by name, `key=value` overrides read as `--config.key=value`, and grids."""

from __future__ import annotations

import difflib
import importlib.util
import itertools
import os

import ml_collections
from absl import flags
from ml_collections import config_flags

from tst_jax import schema
from tst_jax.config import defaults
from tst_jax.errors import ConfigError, UserError


def load_config(path_arg: str) -> ml_collections.ConfigDict:
  """Loads 'path/to/config.py[:arg]' as config_flags does: get_config(arg), or get_config()."""
  path, arg = config_arg(path_arg)
  if not os.path.isfile(path):
    raise ConfigError("--config", f"{path_arg}: file {path!r} does not exist")
  name = "_tst_config_" + os.path.splitext(os.path.basename(path))[0]
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      raise ConfigError("--config", f"{path_arg}: {path!r} defines no get_config()")
    return module.get_config(arg) if arg else module.get_config()
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  the file's own error, as main.py says it
    raise ConfigError("--config", f"{path_arg}: {path!r} raised {type(e).__name__}: "
                      f"{' '.join(str(e).split())}") from e


def parse_override(text: str, flag: str = "--set") -> tuple[str, str]:
  """Splits 'a.b=value' into ('a.b', 'value'); `flag` is where the text came from."""
  key, sep, value = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(flag, f"{text!r}: expected 'dotted.key=value'")
  return key.strip(), value.strip()


def config_arg(path_arg: str) -> tuple[str, str]:
  """Splits 'path/to/config.py[:arg]' into the file and its arg, as `load_config` reads it."""
  path, _, arg = (path_arg.partition(":") if not os.path.isfile(path_arg)
                  else (path_arg, "", ""))
  return path, arg


def refuse_arm_overrides(path_arg: str, overrides, flag: str = "--set"):
  """Refuses an override of a field that an arm of `path_arg`'s arg sets, in one line naming
  both: `--set train.steps=30` with a '2k' arm would make the arm's length a name only.
  `flag` is where the overrides came from; '--config.' prints each as main.py's flag."""
  path, arg = config_arg(path_arg)
  sets = defaults.arm_fields(arg, path)
  parsed = [parse_override(text, flag) for text in overrides]
  if arg and any(key not in sets for key, _ in parsed):
    # A config file may set more for its arg than the registry's arms do (the paper's 10B-A1B
    # baseline is 125,000 steps): every field the arg changes in the file is the arm's.
    sets = {**{key: arg for key in _changed_by(path, arg)}, **sets}
  for key, value in parsed:
    if key in sets:
      given = f"--config.{key}" if flag == "--config." else flag
      raise ConfigError(given, f"{key}={value} and the arm {sets[key]!r} of {path_arg} both set "
                        f"{key}: keep one of them")


def _changed_by(path: str, arg: str) -> set[str]:
  """Returns the dotted fields whose value `path`'s get_config(arg) changes from get_config()."""
  plain, armed = (schema.dotted(load_config(p).to_dict()) for p in (path, f"{path}:{arg}"))
  return {key for key in armed if armed[key] != plain.get(key)
          and not key.startswith("reference.")}   # what a run prints beside it, per arm


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> ml_collections.ConfigDict:
  """Sets each 'a.b.c=value' on `config` in place, one after the other, and returns it.

  Each is read as main.py reads `--config.a.b.c=value`: by ml_collections.config_flags, with
  the field's absl parser. An unknown field or an unreadable value is a ConfigError.
  """
  for text in overrides:
    key, raw = parse_override(text)
    parent, leaf = _parent(config, key)
    argv = ["configlib", f"--config.{key}={raw}"]
    flag_values = flags.FlagValues()
    try:
      config_flags.DEFINE_config_dict("config", config, flag_values=flag_values,
                                      lock_config=False, sys_argv=argv)
      flag_values(argv)
    except flags.Error as e:
      kind = parent.get_type(leaf)
      reason = ("a field set to None has no type to read a value as" if kind is type(None)
                else str(e).removeprefix(f"flag {argv[1]}: "))
      raise ConfigError(key, f"cannot read {raw!r} as {kind.__name__}: {reason}") from None
  return config


def parse_grid(text: str) -> list[list[str]]:
  """Expands a grid into the cartesian product of its points, the first key varying slowest.

  'a=1,2' and 'b=x,y', joined by a semicolon, give a=1 b=x, a=1 b=y, a=2 b=x, a=2 b=y.
  An empty grid is one empty point.
  """
  axes = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    key, raw = parse_override(part, "--grid")
    values = [v.strip() for v in raw.split(",")]
    if not all(values):
      raise ConfigError("--grid", f"axis {part!r} has an empty value")
    axes.append([f"{key}={v}" for v in values])
  keys = [a[0].partition("=")[0] for a in axes]
  if len(set(keys)) != len(keys):
    raise ConfigError("--grid", f"{text!r} names a key twice")
  return [list(point) for point in itertools.product(*axes)]


def _parent(config, key: str):
  """Splits a dotted key into section and leaf name, with a did-you-mean error for unknown names."""
  *path, leaf = key.split(".")
  node = config
  for depth, name in enumerate(path + [leaf]):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      where = ".".join(path[:depth]) or "the config"
      options = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(name, options, n=3)
      hint = f"; did you mean {', '.join(close)}?" if close else f"; fields: {options}"
      raise ConfigError(key, f"unknown field: {where} has no {name!r}{hint}")
    if depth < len(path):
      node = node[name]
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise ConfigError(key, f"is a section, not a field: set one of its fields "
                     f"{sorted(node[leaf].keys())}")
  return node, leaf
