"""Config fields declared once: a section is a frozen dataclass whose fields carry a default, a
rule and a one-line doc, through `field`.

Everything else is read from that declaration:
- `defaults`: the ConfigDict of defaults that configs/*.py start from,
- `parse`: the check that turns a ConfigDict section into the typed section,
- `added=`: the value of a field added after runs were written, what an older config.json ran
  with,
- `values`: the config.json record of a section,
- `help_lines`: `python main.py --help-config`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable

import ml_collections

from tst_jax.errors import ConfigError

MISSING = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Rule:
  """What every value of a field must be: `ok(value)`, and the words for it.

  The rest says the same as data, for what reads a rule without calling it, as the sweep of
  bad values does (tests/behaviour/test_bad_fields.py): `kind`, the type of its values, `lo`
  and `hi`, the bounds of a range, and `options`, the choices of a field that has them.
  """
  ok: Callable[[Any], bool]
  must: str
  kind: type
  lo: float | None = None
  hi: float | None = None
  options: tuple = ()


def integer(lo: int, hi: int | None = None) -> Rule:
  return Rule(lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo
                         and (hi is None or v <= hi)),
              f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""), int, lo, hi)


def number(lo: float, hi: float = math.inf, *, open_lo: bool = False,
           open_hi: bool = False) -> Rule:
  def ok(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      return False
    return (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
  interval = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
  return Rule(ok, f"a number > {lo:g}" if hi == math.inf and open_lo
              else f"a number >= {lo:g}" if hi == math.inf else f"a number in {interval}",
              float, lo, hi)


def one_of(options) -> Rule:
  options = tuple(options)
  return Rule(lambda v: isinstance(v, str) and v in options, f"one of {options}", str,
              options=options)


def registered(registry: dict) -> Rule:
  """Returns the rule of a field that names an entry of `registry`, a dict that grows: its
  names are read when the rule is, so a name registered after the field was declared is a
  choice too, in the check, its words and `options`."""
  return _Registered(registry)


def register(registry: dict, kind: str, name: str, entry, *, replace: bool = False) -> None:
  """Adds `entry` to `registry` as `name`, every registry's one rule: registering a name again
  is a no-op with an equal entry, a ValueError with another unless `replace`."""
  if name in registry and registry[name] != entry and not replace:
    raise ValueError(f"{kind} {name!r} is registered already: pass replace=True to replace it")
  registry[name] = entry


class _Registered(Rule):
  """one_of a registry's names as they are when asked."""

  def __init__(self, registry: dict):   # pylint: disable=super-init-not-called
    for name, value in dict(registry=registry, kind=str, lo=None, hi=None).items():
      object.__setattr__(self, name, value)   # a frozen dataclass's own way to set fields

  def ok(self, value) -> bool:   # pylint: disable=method-hidden
    return isinstance(value, str) and value in self.registry

  must = property(lambda self: f"one of {self.options}")
  options = property(lambda self: tuple(self.registry))
  __eq__, __hash__ = object.__eq__, object.__hash__   # the registry changes: not its value


BOOL = Rule(lambda v: isinstance(v, bool), "True or False", bool)
STRING = Rule(lambda v: isinstance(v, str), "a string", str)


def field(default, rule: Rule, doc: str | Callable[[], str], *, added=MISSING):
  """Declares a config field: its `default`, the `rule` its value must satisfy and a `doc` line.

  A MISSING default makes it required, as a model's sizes that presets give. A `doc` that is a
  function is read when the help is, as a doc that lists a registry's entries must be. `added`
  is the value a run written before the field existed had.
  """
  return dataclasses.field(default=default, metadata=dict(rule=rule, doc=doc, added=added))


def config_fields(cls) -> list[dataclasses.Field]:
  """Returns the fields of section `cls` declared with `field`, leaving out derived values."""
  return [f for f in dataclasses.fields(cls) if "rule" in f.metadata]


def defaults(cls, **overrides) -> ml_collections.ConfigDict:
  """Returns the section's defaults and `overrides` as a ConfigDict.

  A None default becomes a typed placeholder, so `--config.<section>.<field>=...` can set it.
  """
  hints = typing.get_type_hints(cls)
  node = {}
  for f in config_fields(cls):
    value = overrides.pop(f.name, f.default)
    if value is MISSING:
      raise ValueError(f"{cls.__name__}.{f.name} has no default: give it")
    node[f.name] = (ml_collections.config_dict.placeholder(_optional_type(hints[f.name], f.name))
                    if value is None else value)
  if overrides:
    raise ValueError(f"{cls.__name__} has no fields {sorted(overrides)}")
  return ml_collections.ConfigDict(node)


def parse(cls, node, prefix: str, *, sections=(), **derived):
  """Checks section `node`, a ConfigDict or dict, and builds it as `cls`.

  Every field must be present, or take its `added` value for a field added after runs were
  written, and each value must satisfy its rule. A key the section does not declare is refused
  as a typo in a config file, except `sections`, the keys of sections nested in it. The first
  problem is a ConfigError naming `prefix.<field>`. `derived` holds the section's non-config
  fields.
  """
  names = {f.name for f in config_fields(cls)}
  unknown = sorted(set(node.keys()) - names - set(sections))
  if unknown:
    raise ConfigError(f"{prefix}.{unknown[0]}" if prefix else unknown[0],
                      "is not a field of " + (f"config.{prefix}" if prefix else "the config")
                      + (f" (nor are {unknown[1:]})" if len(unknown) > 1 else "")
                      + ": python main.py --help-config lists every field")
  values = {}
  for f in config_fields(cls):
    name = f"{prefix}.{f.name}" if prefix else f.name
    if f.name in node:
      value = node[f.name]
    elif f.metadata["added"] is not MISSING:
      value = f.metadata["added"]
    else:
      raise ConfigError(name, "is missing (a config.json of an older tst-jax?): "
                        "python main.py --help-config lists every field")
    _check_field(f, value, name)
    values[f.name] = value
  return cls(**values, **derived)


def check(section, prefix: str) -> None:
  """Checks every config field of a built `section` against its rule.

  It serves sections that are also built directly, as the model's config dataclasses are,
  which call it in __post_init__.
  """
  for f in config_fields(type(section)):
    _check_field(f, getattr(section, f.name), f"{prefix}.{f.name}")


def _check_field(f: dataclasses.Field, value, name: str) -> None:
  if not f.metadata["rule"].ok(value):
    raise ConfigError(name, f"must be {f.metadata['rule'].must}, got {value!r}")


def values(section) -> dict:
  """Returns a section's config fields and their values, config.json's record of it."""
  return {f.name: getattr(section, f.name) for f in config_fields(type(section))}


def dotted(record: dict, prefix: str = "") -> dict:
  """Returns the leaves of a nested config record (config.json's, a ConfigDict's to_dict()) by
  their dotted names: {"tst": {"ratio": 0.3}} -> {"tst.ratio": 0.3}."""
  out = {}
  for key, value in record.items():
    if isinstance(value, dict):
      out.update(dotted(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def help_lines(cls, prefix: str) -> list[str]:
  """Lists one line per field: name, default, doc, and what the rule asks."""
  def default(f):
    text = "(required)" if f.default is MISSING else repr(f.default)
    return text if len(text) <= 20 else text[:17] + "..."
  def doc(f):
    return f.metadata["doc"]() if callable(f.metadata["doc"]) else f.metadata["doc"]
  return [f"{(prefix + '.' if prefix else '') + f.name:<34} {default(f):<20} "
          f"{doc(f)} ({f.metadata['rule'].must})" for f in config_fields(cls)]


def _optional_type(hint, name: str) -> type:
  """Returns T for `T | None` or Optional[T]: the type a None-defaulted field holds when set."""
  kinds = [k for k in typing.get_args(hint) if k is not type(None)]
  if typing.get_origin(hint) not in (typing.Union, types.UnionType) or len(kinds) != 1:
    raise TypeError(f"{name}: a None default needs a `T | None` annotation, got {hint}")
  return typing.get_origin(kinds[0]) or kinds[0]    # tuple[int, ...] -> tuple
