"""The sweep of bad config values, generated from the schema: every field that `python main.py
--help-config` lists gets a value of another type, a value just outside each bound of its range
and an unknown choice, each read off the field's rule (tst_jax/schema.py), never listed here.

Each bad value goes in two ways, checked in this process: as the text of `--config.<field>=`
(configlib reads it with main.py's parser) and as a config.json value. Each must be one
ConfigError naming its field, before anything is built. One goes through main.py itself, for
the `error:` line, exit status 2 and a workdir never made."""

import collections
import glob
import math
import os
import re
import subprocess
import sys

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.fields import BASES
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tst_jax import configlib, models, schema
from tst_jax.errors import ConfigError
from tst_jax.config import defaults, sections, spec as spec_lib

UNKNOWN = "bogus"   # a choice no field offers


def declared_fields() -> dict[str, tuple[schema.Rule, str]]:
  """Returns {dotted name: (rule, family)} of every field --help-config lists: the top level,
  each family's model fields (the first family that declares a name), model.family and every
  section's."""
  fields = {f.name: (f.metadata["rule"], "llama") for f in schema.config_fields(sections.Run)}
  for family, classes in models.FAMILIES.items():
    for f in schema.config_fields(classes.config):
      fields.setdefault(f"model.{f.name}", (f.metadata["rule"], family))
  fields["model.family"] = (models.FAMILY, "llama")
  for name, cls in spec_lib.SECTIONS.items():
    fields.update({f"{name}.{f.name}": (f.metadata["rule"], "llama")
                   for f in schema.config_fields(cls)})
  return fields


FIELDS = declared_fields()


def bad_values(rule: schema.Rule) -> list[tuple[str, object]]:
  """Returns (what, value) of each bad value `rule` implies: one of another type, one just
  outside each finite bound (the bound itself where it is open), infinity for a number without
  an upper bound, and a choice it does not offer."""
  bad = [("wrong type", 3 if rule.kind is str else "abc")]
  step = 1 if rule.kind is int else 0.5
  if rule.lo is not None:
    bad.append(("below its range", rule.lo if not rule.ok(rule.lo) else rule.lo - step))
  if rule.hi is not None and math.isfinite(rule.hi):
    bad.append(("above its range", rule.hi if not rule.ok(rule.hi) else rule.hi + step))
  elif rule.kind is float:
    bad.append(("above its range", math.inf))
  if rule.options:
    bad.append(("unknown choice", UNKNOWN))
  assert all(not rule.ok(value) for _, value in bad), (rule.must, bad)
  return bad


CASES = [(name, what, value) for name, (rule, _) in FIELDS.items()
         for what, value in bad_values(rule)]


def _refusal(config, name: str) -> str:
  """Runs the config check and what a train run checks next. Returns '' where a ConfigError
  names field `name`, else what happened instead."""
  try:
    spec = spec_lib.check(config)
    spec = spec.on_platform()
    spec.check_devices(8)
    spec.check_paths()
  except ConfigError as e:
    return "" if e.field == name else f"a ConfigError naming {e.field!r}: {e}"
  except Exception as e:  # pylint: disable=broad-except
    return f"a traceback: {type(e).__name__}: {e}"
  return "accepted"


def _as_flag_text(name: str, value) -> str | None:
  """Returns the text of --config.<name>= that gives `value`, None where none does: every
  text of a string field reads as a string."""
  return None if FIELDS[name][0].kind is str and not isinstance(value, str) else str(value)


def _as_flag(name: str, value, family: str) -> str | None:
  """Checks `value` as the text of --config.<name>=, None where no text gives it."""
  text = _as_flag_text(name, value)
  if text is None:
    return None
  config = BASES[family]()
  try:
    configlib.apply_overrides(config, [f"{name}={text}"])
  except ConfigError as e:
    return "" if e.field == name else f"a ConfigError naming {e.field!r}: {e}"
  return _refusal(config, name)


def _in_config_json(name: str, value, family: str) -> str:
  """Checks `value` as config.json holds it: a plain dict, whatever the type."""
  record = BASES[family]().to_dict()
  section, _, leaf = name.rpartition(".")
  (record[section] if section else record)[leaf] = value
  return _refusal(record, name)


def test_every_help_config_field_is_swept():
  listed = {m.group(1) for m in map(re.compile(r"([a-z_][\w.]*) {2,}\S").match,
                                    spec_lib.help_text().splitlines()) if m}
  assert listed == set(FIELDS)
  kinds = collections.Counter(what for _, what, _ in CASES)
  assert kinds["wrong type"] == len(FIELDS) and kinds["unknown choice"] >= 15
  assert kinds["below its range"] >= 50 and kinds["above its range"] >= 15


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_bad_value_is_one_config_error_naming_its_field(name):
  """Each bad value of the field, as a flag's text and as a config.json value."""
  rule, family = FIELDS[name]
  failures = []
  for what, value in bad_values(rule):
    for route, outcome in (("--config", _as_flag(name, value, family)),
                           ("config.json", _in_config_json(name, value, family))):
      if outcome:
        failures.append(f"{name}={value!r} ({what}, {route}): {outcome}")
  assert not failures, "\n".join(failures)


def test_main_py_says_one_line_and_exits_2(tmp_path):
  """The first value below a range, through main.py (test_user_errors.py's ONE_LINE_ERRORS
  runs a wrong type and an unknown choice there)."""
  name, _, value = next(c for c in CASES if c[1] == "below its range" and "." in c[0])
  workdir = tmp_path / "run"
  result = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config",
                           TINY_CONFIG, "--workdir", str(workdir), f"--config.{name}={value}"],
                          env=subprocess_env.one_cpu_device(), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(f"error: config.{name}: must be "), result.stderr
  assert not result.stdout and not workdir.exists()


# The config files' args: every configs/*.py with each kind of bad arm, from the arm registry.
CONFIG_FILES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs",
                                                                              "*.py")))
# A registered arm only dense models take, so the family case is swept whatever ARMS holds.
DENSE_ONLY = defaults.Arm("dense_only", "a test's arm for Llama models only", "tst.ratio", 0.5,
                          families=("llama",))


def bad_arms(family: str) -> list[tuple[str, str]]:
  """Returns (what, arm) of each bad arm of a config of `family`: an unknown one, each
  numbered arm with a malformed number and with one its field's rule refuses, and each
  registered arm `family` does not take."""
  bad = [("unknown", "bogus")]
  for arm in defaults.ARMS.values():
    if arm.read is not None:
      prefix, _, rest = arm.form.partition("<")
      suffix = rest.partition(">")[2]
      bad += [("malformed number", f"{prefix}5x{suffix}"), ("malformed number",
                                                            f"{prefix}-3{suffix}")]
    if arm.families and family not in arm.families:   # a numbered one written with 1
      bad.append(("not for its family", re.sub(r"<[^>]*>", "1", arm.form)))
  return bad


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_a_bad_arm_is_one_config_error_naming_it_and_the_arms(name, monkeypatch):
  monkeypatch.setitem(defaults.ARMS, DENSE_ONLY.form, DENSE_ONLY)
  family = configlib.load_config(os.path.join(ROOT, name)).model.family
  cases = bad_arms(family)
  kinds = collections.Counter(what for what, _ in cases)
  assert kinds["unknown"] == 1 and kinds["malformed number"] >= 8
  assert (("not for its family", "dense_only") in cases) == (family != "llama")
  failures = []
  for what, arm in cases:
    try:
      configlib.load_config(os.path.join(ROOT, name) + f":tst,{arm}")
      failures.append(f"{name}:{arm} ({what}): accepted")
    except ConfigError as e:
      line = " ".join(str(e).split())
      expected = (f"arm {arm!r} is for " if what == "not for its family"
                  else f"the arms{', a comma list' if what == 'unknown' else ''}: "
                  f"{defaults.arm_forms()}")
      if e.field != "--config" or f"{arm!r}" not in line or expected not in line:
        failures.append(f"{name}:{arm} ({what}): {line}")
  assert not failures, "\n".join(failures)


def test_main_py_says_a_bad_arm_in_one_line():
  """The issue's three arms through main.py: one line naming the arm and the arms, exit 2."""
  runs = {arm: subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "main.py"), "--config", f"configs/demo.py:{arm}",
       "--mode", "plan"], cwd=ROOT, env=subprocess_env.one_cpu_device(), text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for arm in ("bogus", "5xk", "s-3")}
  for arm, process in runs.items():
    out, err = process.communicate(timeout=300)
    assert process.returncode == 2 and not out, (arm, err)
    assert err.splitlines() == [err.strip()], err
    assert err.startswith(f"error: --config: configs/demo.py: ") and f"arm {arm!r}" in err
    assert defaults.arm_forms() in err, err


def test_an_override_of_a_field_an_arm_sets_is_refused_naming_both():
  """`--set train.steps=30` with a '<N>k' arm: one line, not a run that ignores the arm."""
  with pytest.raises(ConfigError, match=r"train.steps=30 and the arm '0.045k' of "
                     r"configs/demo.py:baseline,0.045k both set train.steps"):
    configlib.refuse_arm_overrides("configs/demo.py:baseline,0.045k", ["train.steps=30"])
  with pytest.raises(ConfigError, match="tst.bag_size=4 and the arm 's8'"):
    configlib.refuse_arm_overrides("configs/demo.py:s8", ["tst.bag_size=4"], "--config.")
  configlib.refuse_arm_overrides("configs/demo.py:s8", ["tst.ratio=0.5", "train.steps=30"])
  configlib.refuse_arm_overrides("configs/demo.py", ["train.steps=30"])   # no arm: it is yours
