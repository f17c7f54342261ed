"""Config files and overrides: `--set k=v` reads values as main.py's `--config.k=v` does;
every config file takes the same `:arg` arms; model presets keep typed None placeholders."""

import glob
import os
import typing

import pytest
from absl import flags
from ml_collections import config_flags

from tests.fixtures.paths import ROOT
from tst_jax import configlib, models, schema
from tst_jax.errors import ConfigError

TINY_MOE = os.path.join(ROOT, "configs", "tiny_moe.py")
REFUSED = "refused"

# (field, raw string) across the field types of configs/tiny_moe.py, bad values included.
CASES = [
    *(("tst.bag_size", raw) for raw in ["6", "-3", "0x10", "1_000", "1e3", "2.5", "6.0",
                                          "true", "abc", ""]),
    *(("tst.ratio", raw) for raw in ["1", "0.5", "1e-1", ".5", "nan", "-inf", "abc", "0.5x",
                                       ""]),
    *(("train.progress_bar", raw) for raw in ["false", "False", "TRUE", "0", "1", "t", "f",
                                                "yes", "on", "no", "x", ""]),
    *(("data.source", raw) for raw in ["text:/a/**/*.py", "'quoted'", "1", "None", "a b", ""]),
    *(("model.mlp_only_layers", raw) for raw in ["()", "(0, 2)", "[1]", "3", "1,2", "(1, 2",
                                                   "1 2", "abc"]),
    *(("logical_axis_rules", raw) for raw in ['(("batch", "data"),)', "()", "((1, 2)"]),
    # None-valued: a typed placeholder (tuple | None), as every None model default is.
    *(("model.rope_scaling", raw) for raw in ["(8.0, 1.0, 4.0, 8192)", "None", "8", "[1, 2]",
                                                "(8.0,", "a b"]),
]


def _get(config, field):
  for name in field.split("."):
    config = config[name]
  return config


def _main_py(config_file, field, raw):
  """What main.py's flag makes of `--config.<field>=<raw>` (the value), or REFUSED."""
  argv = ["main.py", "--config", config_file, f"--config.{field}={raw}"]
  flag_values = flags.FlagValues()
  try:
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values, lock_config=True,
                                    sys_argv=argv)
    flag_values(argv)
  except flags.Error:
    return REFUSED
  return _get(flag_values.config, field)


def _configlib(config_file, field, raw):
  """What `python -m tst_jax.tools.sweep --set <field>=<raw>` makes of it, or REFUSED."""
  config = configlib.load_config(config_file)
  try:
    configlib.apply_overrides(config, [f"{field}={raw}"])
  except ConfigError as e:
    assert str(e).startswith(f"config.{field}: cannot read {raw!r} as "), str(e)
    return REFUSED
  return _get(config, field)


def _typed(value):
  return type(value).__name__, repr(value)      # repr: nan == nan, 1 != 1.0 != True


@pytest.mark.parametrize("field,raw", CASES)
def test_overrides_read_as_main_py_reads_them(field, raw):
  assert _typed(_configlib(TINY_MOE, field, raw)) == _typed(_main_py(TINY_MOE, field, raw))


def test_both_refuse_a_field_set_to_none(tmp_path):
  config_file = tmp_path / "none_field.py"
  config_file.write_text("import ml_collections\n\n\ndef get_config():\n"
                         "  return ml_collections.ConfigDict(dict(a=None, b=1))\n")
  assert _main_py(str(config_file), "a", "1") == REFUSED
  with pytest.raises(ConfigError, match="config.a: cannot read '1' as NoneType"):
    configlib.apply_overrides(configlib.load_config(str(config_file)), ["a=1"])


def test_every_config_file_takes_the_arms():
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
    name = os.path.relpath(path, ROOT)
    tst = configlib.load_config(path)
    assert tst.tst.ratio > 0 and tst.tst.bag_size > 1, name
    baseline = configlib.load_config(path + ":baseline")
    assert baseline.tst.ratio == 0.0, name
    arms = configlib.load_config(path + ":s8, r0.5,4k,reinit")
    assert (arms.tst.bag_size, arms.tst.ratio, arms.train.steps) == (8, 0.5, 4000), name
    assert arms.tst.reinit_at_switch, name
    assert configlib.load_config(path + ":4k,600mb").data.max_bytes == 600_000_000, name
    with pytest.raises(ValueError, match=f"{name}: unknown arm 'bogus'"):
      configlib.load_config(path + ":bogus")
  moe = os.path.join(ROOT, "configs", "qwen3_moe_10b_a1b.py")
  assert configlib.load_config(moe).train.steps == 49_983
  assert configlib.load_config(moe + ":baseline").train.steps == 125_000  # the paper's


def test_none_model_defaults_are_typed_placeholders():
  for family, preset in [("llama", "tiny"), ("qwen3_moe", "tiny_moe")]:
    c = models.preset_config(family, preset)
    assert c.rope_scaling is None and c.get_type("rope_scaling") is tuple
  optional = schema._optional_type  # pylint: disable=protected-access
  assert optional(int | None, "x") is int
  assert optional(typing.Optional[str], "x") is str
  assert optional(tuple[int, ...] | None, "x") is tuple
  with pytest.raises(TypeError, match="x: a None default"):
    optional(int | str | None, "x")
  with pytest.raises(TypeError, match="x: a None default"):
    optional(int, "x")


