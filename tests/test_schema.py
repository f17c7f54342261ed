"""A config section declared once (tst_jax/schema.py), on a section made up here: its defaults
as a ConfigDict, the parse that checks every field against its rule, a field added after runs
were written, the record of a section and the help lines. The run's own sections against the
schema: tests/config/test_spec.py::test_every_run_field_has_its_check."""

import dataclasses
import math

import ml_collections
import pytest

from tst_jax import schema
from tst_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Section:
  width: int = schema.field(8, schema.integer(1, 64), "how wide")
  rate: float = schema.field(0.5, schema.number(0.0, 1.0, open_lo=True), "a rate in (0, 1]")
  mode: str = schema.field("fast", schema.one_of(("fast", "slow")), "which way")
  limit: int | None = schema.field(None, schema.Rule(lambda v: v is None or v > 0,
                                                     "None or > 0", int), "an optional limit")
  late: bool = schema.field(True, schema.BOOL, "a field added later", added=False)
  derived: int = 0          # not a config field: given to parse


def test_defaults_are_a_config_dict_with_typed_placeholders():
  node = schema.defaults(Section, width=16)
  assert isinstance(node, ml_collections.ConfigDict)
  assert node.to_dict() == dict(width=16, rate=0.5, mode="fast", limit=None, late=True)
  assert node.get_type("limit") is int        # a None default can be set from the command line
  node.limit = 3
  with pytest.raises(ValueError, match="Section has no fields \\['bogus'\\]"):
    schema.defaults(Section, bogus=1)

  @dataclasses.dataclass(frozen=True)
  class Required:
    size: int = schema.field(schema.MISSING, schema.integer(1), "given by a preset")
  with pytest.raises(ValueError, match="Required.size has no default"):
    schema.defaults(Required)
  assert schema.defaults(Required, size=2).size == 2


def test_parse_checks_each_field_and_names_it():
  node = schema.defaults(Section).to_dict()
  section = schema.parse(Section, node, "demo", derived=7)
  assert section == Section(derived=7)
  assert schema.values(section) == node                      # the record: config fields only
  for field, bad, must in [("width", 0, "an integer >= 1 and <= 64"),
                           ("width", True, "an integer >= 1 and <= 64"),   # a bool is no int
                           ("rate", 0.0, "a number in (0, 1]"),
                           ("rate", math.nan, "a number in (0, 1]"),
                           ("mode", "medium", "one of ('fast', 'slow')"),
                           ("limit", -1, "None or > 0")]:
    with pytest.raises(ConfigError) as e:
      schema.parse(Section, {**node, field: bad}, "demo")
    assert f"demo.{field}: must be {must}, got {bad!r}" in str(e.value)
  with pytest.raises(ConfigError, match=r"config.demo.wdth: is not a field of config.demo "
                                        r"\(nor are \['zz'\]\): .*--help-config"):
    schema.parse(Section, {**node, "wdth": 9, "zz": 1}, "demo")       # a typo is refused
  with pytest.raises(ConfigError, match="config.inner: is not a field of the config"):
    schema.parse(Section, {**node, "inner": {}}, "")
  assert schema.parse(Section, {**node, "inner": {}}, "", sections=("inner",)) == Section()
  del node["width"]
  with pytest.raises(ConfigError, match="demo.width: is missing .*--help-config"):
    schema.parse(Section, node, "demo")


def test_a_field_added_later_reads_an_old_record_with_the_value_it_ran_with():
  old = schema.defaults(Section).to_dict()
  del old["late"]                 # a config.json written before `late` existed
  assert schema.parse(Section, old, "demo").late is False     # its `added`, not the default
  assert schema.parse(Section, {**old, "late": True}, "demo").late is True


def test_check_a_section_built_directly():
  schema.check(Section(), "demo")
  with pytest.raises(ConfigError, match="demo.mode: must be one of"):
    schema.check(Section(mode="warp"), "demo")


def test_help_lines_name_default_doc_and_rule():
  lines = schema.help_lines(Section, "demo")
  assert len(lines) == 5                      # `derived` is not a config field
  assert lines[0].split()[:3] == ["demo.width", "8", "how"]
  assert lines[0].endswith("how wide (an integer >= 1 and <= 64)")
  assert "demo.rate" in lines[1] and "(a number in (0, 1])" in lines[1]
  assert schema.help_lines(Section, "")[2].startswith("mode ")
  assert [f.name for f in schema.config_fields(Section)] == [
      "width", "rate", "mode", "limit", "late"]


def test_number_rule_words():
  assert schema.number(0.0).must == "a number >= 0"
  assert schema.number(0.0, open_lo=True).must == "a number > 0"
  assert schema.number(0.0, 1.0, open_hi=True).must == "a number in [0, 1)"
  assert schema.number(0.0).ok(1e9) and not schema.number(0.0).ok(math.inf)
  assert not schema.number(0.0, 1.0, open_hi=True).ok(1.0)


def test_a_registered_field_takes_a_name_registered_after_it_was_declared():
  registry = {"jsonl": None}

  @dataclasses.dataclass(frozen=True)
  class Sinks:
    sink: str = schema.field("jsonl", schema.registered(registry),
                             lambda: "where records go: " + " | ".join(registry))

  with pytest.raises(ConfigError, match=r"^config.s.sink: must be one of \('jsonl',\), got "
                                        r"'mlflow'$"):
    schema.parse(Sinks, dict(sink="mlflow"), "s")
  registry["mlflow"] = None
  assert schema.parse(Sinks, dict(sink="mlflow"), "s").sink == "mlflow"
  rule = schema.config_fields(Sinks)[0].metadata["rule"]
  assert rule.options == ("jsonl", "mlflow") and rule.kind is str and not rule.ok(3)
  assert schema.help_lines(Sinks, "s")[0].endswith(
      "where records go: jsonl | mlflow (one of ('jsonl', 'mlflow'))")   # the doc read now too


def test_a_name_registered_again_is_a_no_op_with_an_equal_entry_else_replace_says_so():
  """Every registry's rule (tests/behaviour/test_registries.py runs it on the four)."""
  registry = {}
  schema.register(registry, "widget", "a", 1)
  schema.register(registry, "widget", "a", 1.0)   # equal: the same entry
  with pytest.raises(ValueError, match=r"^widget 'a' is registered already: pass replace=True "
                                       r"to replace it$"):
    schema.register(registry, "widget", "a", 2)
  assert registry == {"a": 1}
  schema.register(registry, "widget", "a", 2, replace=True)
  assert registry == {"a": 2}


def test_dotted_names_every_leaf_of_a_nested_record():
  assert schema.dotted({"tst": {"ratio": 0.3, "mode": "full"}, "seed": 1, "a": {"b": {"c": []}}}) \
      == {"tst.ratio": 0.3, "tst.mode": "full", "seed": 1, "a.b.c": []}
