"""The run spec (tst_jax/config/spec.py): a bad config fails before anything trains, naming its
field; indivisible lengths and a vocabulary the tokenizer outgrows are refused; every field of
the run config is declared with its rule and doc, and `--help-config` lists them all."""

import os
import subprocess
import sys

import pytest

from tests.fixtures.fields import BASES, FIELDS
from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import models, schema
from tst_jax import cli
from tst_jax.config import sections as sections_lib, spec as spec_lib


@pytest.mark.parametrize("field,value,message", [
    ("tst.bag_size", 0, "config.tst.bag_size: must be an integer >= 1"),
    ("tst.ratio", 1.5, r"config.tst.ratio: must be a number in \[0, 1\]"),
    ("tst.weighting", "cubic", "config.tst.weighting: unknown weighting 'cubic'"),
    ("tst.variant", "alt", "^config.tst.variant: 'alt' reads only which weights are zero: "
                           "tst.weighting='power' would be ignored; use 'uniform' or 'first' "
                           "with it, or tst.variant='mce'$"),
    ("tst.mode", "both", "config.tst.mode"),
    ("data.source", "text:/nonexistent/*.txt", "matches no files"),
    ("data.tokenizer", "/nonexistent/tokenizer.json", "does not exist"),
    ("train.stepz", 5, "config.train.stepz: is not a field of config.train: python main.py "
                       "--help-config lists every field"),       # a typo in a config file
    ("model.dimz", 5, "config.model.dimz: is not a field of config.model"),
    ("train.profile_steps", "3", r"config.train.profile_steps: must be '' or '<first>,<count>'"),
    ("train.profile_steps", "11,3", "config.train.profile_steps: steps 11 to 13 go past the "
                                    "run's 12 steps"),
    ("train.profile_steps", "5,3", "config.train.profile_steps: steps 5 to 7 cross the switch "
                                   "from tst after step 6"),
])
def test_bad_config_fails_before_training(tmp_path, field, value, message):
  config = tiny_config(tst=dict(weighting="power"))    # the 'alt' row's weighting
  section, name = field.split(".")
  config[section][name] = value
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    cli.run(config, str(workdir))
  assert not (workdir / "checkpoints").exists() and not (workdir / "metrics.jsonl").exists()


def test_indivisible_length_and_vocab_too_small(tmp_path):
  config = tiny_config(tst=dict(equal_flops="batch", bag_size=3))
  with pytest.raises(ValueError, match="config.data.seq_len: 16 must be divisible by "
                                       "tst.bag_size 3"):
    cli.run(config, str(tmp_path / "a"))
  # A tokenizer file with more tokens than the model's vocabulary.
  big = tiny_config(data=dict(tokenizer="bpe"))
  cli.run(big, str(tmp_path / "b"), mode="plan")
  from tst_jax.data import get_tokenizer, load_documents
  tok = get_tokenizer("bpe", folder=str(tmp_path / "tok"), vocab_size=600,
                      train_docs=load_documents("builtin:pystdlib", 100_000))
  small = tiny_config(data=dict(tokenizer=tok.path))
  with pytest.raises(ValueError, match="config.model.vocab_size: the tokenizer .* has 600 "
                                       "tokens, more than the model's 512"):
    cli.run(small, str(tmp_path / "c"))
  assert not (tmp_path / "c" / "checkpoints").exists()


def test_every_run_field_has_its_check():
  """Each leaf of the run config is a field declared with its rule and doc (tst_jax/schema.py)
  in the section that holds it, the model's in the family's dataclass: none reaches the code
  unchecked, none is declared twice, and the ConfigDict has no leaf the schema lacks."""
  for family, make in BASES.items():
    config = make()
    declared = [name for name, _ in _declared(config)]
    assert len(declared) == len(set(declared))
    unchecked = [f for f in FIELDS[family] if f not in declared and f != "model.family"]
    assert not unchecked, (family, unchecked)
    for name, f in _declared(config):
      assert isinstance(f.metadata["rule"], schema.Rule) and f.metadata["doc"], name


def _declared(config):
  """(dotted name, dataclass field) of every field the run config's sections declare."""
  model_cls = type(models.model_config(config.model))
  sections = [("", sections_lib.Run), ("model", model_cls), *spec_lib.SECTIONS.items()]
  return [(f"{name}.{f.name}" if name else f.name, f) for name, cls in sections
          for f in schema.config_fields(cls)]


def test_help_config_lists_every_field_with_default_doc_and_rule():
  out = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--help-config"],
                       capture_output=True, text=True, check=True).stdout
  lines = {line.split()[0]: line for line in out.splitlines() if line[:1].isalpha() and
           "  " in line}
  assert lines["tst.bag_size"].split()[1] == "4" and "S: tokens superposed" in lines[
      "tst.bag_size"] and lines["tst.bag_size"].endswith("(an integer >= 1)")
  for name, cls in [("", sections_lib.Run), *spec_lib.SECTIONS.items()]:
    for f in schema.config_fields(cls):
      assert (f"{name}.{f.name}" if name else f.name) in lines
  assert "model.expert_impl" in lines and "model.n_experts_per_token" in lines


@pytest.mark.parametrize("name", sorted(os.path.basename(p)[:-3] for p in
                                        os.listdir(os.path.join(ROOT, "configs"))
                                        if p.endswith(".py")))
def test_every_config_file_round_trips_through_config_json(name):
  """Each configs/*.py (and its baseline arm), checked and resolved here, written as
  config.json and read back through the schema, gives the same typed sections: a resumed,
  evaluated or compared run reads the run that was trained."""
  import json   # pylint: disable=import-outside-toplevel
  from tst_jax import configlib   # pylint: disable=import-outside-toplevel
  for arm in ("", ":baseline"):
    spec = spec_lib.build(configlib.load_config(os.path.join(ROOT, "configs", name + ".py") + arm))
    typed = spec_lib.sections_of(json.loads(json.dumps(spec.to_json())))
    assert typed["run"] == spec.run and typed["model"] == spec.model, name + arm
    for section in spec_lib.SECTIONS:
      assert typed[section] == getattr(spec, section), (name + arm, section)


def test_checking_a_config_does_not_start_jax():
  """spec.check (with the plan's parameter counts) and the layer bytes the XLA flags need run
  before the XLA flags, a fit check's emulated devices and jax.distributed, which must all come
  before JAX's backend starts: checking any config file leaves it unstarted. (Building the
  model to count its parameters once resolved `auto` there and started it: two processes
  could not start, --profile could not turn command buffers off.)"""
  code = ("import glob, sys\n"
          "from jax._src import xla_bridge\n"
          "from tst_jax import configlib\n"
          "from tst_jax.config import spec\n"
          "from tst_jax.train import fit\n"
          "for path in sorted(glob.glob('configs/*.py')) + ['tests/fixtures/tiny_config.py']:\n"
          "  checked = spec.check(configlib.load_config(path))\n"
          "  fit.layer_param_bytes(checked.model)\n"
          "  assert not xla_bridge.backends_are_initialized(), path\n"
          "print('unstarted')\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=os.environ | {"PYTHONPATH": ROOT})
  assert out.returncode == 0 and out.stdout.strip() == "unstarted", out.stderr[-2000:]


def test_a_workdir_with_a_tilde_is_one_path_for_the_check_the_lock_and_the_run(tmp_path,
                                                                              monkeypatch):
  """bash leaves `--workdir=~/runs/a` as typed: the lock and the run's files both go under
  the home folder, not one of them under a folder named '~'."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  seen = {}

  class Stop(Exception):
    pass

  def setup_create(spec, rundir, **kwargs):
    seen["run"] = rundir.root
    raise Stop

  monkeypatch.setattr(cli.lock_lib.Lock, "take",
                      classmethod(lambda cls, rundir, say=print:
                                  seen.setdefault("lock", rundir.root) and None))
  monkeypatch.setattr(cli.Setup, "create", setup_create)
  with pytest.raises(Stop):
    cli.run(tiny_config(), workdir="~/runs/a")
  assert seen == dict(lock=str(tmp_path / "home" / "runs" / "a"),
                      run=str(tmp_path / "home" / "runs" / "a"))
  assert not os.path.exists(tmp_path / "~")
