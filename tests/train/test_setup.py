"""Setting a run up in its workdir (tst_jax/train/setup.py): a workdir of another config refuses
to resume; one written before the typed run spec still resumes with the same settings."""

import dataclasses
import json
import os

import pytest

from tests.fixtures.paths import TESTDATA
from tests.fixtures.tiny import tiny_config
from tst_jax.errors import ConfigError
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import record as record_lib, spec as spec_lib
from tst_jax.train import setup as setup_lib


def test_workdir_of_another_config_refuses_to_resume(tmp_path):
  """Another section, or another train.steps (the finished run's phases and learning-rate
  schedule), is refused with one line and every record left as it was; the lock of each
  run is gone once it ends, refused or not."""
  cli.run(tiny_config(steps=4), str(tmp_path))
  records = ("metrics.jsonl", "config.json", "plan.json", "summary.json")
  before = {name: (tmp_path / name).read_bytes() for name in records}
  assert not os.path.exists(RunDir(tmp_path).lock)
  with pytest.raises(ValueError, match="holds a run of another config: sections"):
    cli.run(tiny_config(steps=4, bag_size=4), str(tmp_path))
  with pytest.raises(ConfigError) as e:
    cli.run(tiny_config(steps=6, train=dict(eval_every=2, log_every=3)), str(tmp_path))
  assert e.value.field == "--workdir" and "\n" not in str(e.value)
  assert ("holds a run of another config: train.steps 4 there, 6 here (a run cannot be "
          "extended or shortened") in str(e.value)
  assert {name: (tmp_path / name).read_bytes() for name in records} == before
  assert not os.path.exists(RunDir(tmp_path).lock)


def test_a_workdir_written_before_the_run_spec_still_resumes(tmp_path):
  """tests/testdata/config_683731c.json is the config.json the trainer wrote for tiny_config()
  at 683731c, before the typed run spec: resuming such a workdir with the same settings (and
  the fields added since at the values that run had: each field's `added=` in its
  declaration) finds its config equal and records it with those fields; another config is
  still refused."""
  old = os.path.join(TESTDATA, "config_683731c.json")
  with open(old) as f:
    written_then = json.load(f)
  path = tmp_path / "config.json"
  path.write_text(open(old).read())
  same = tiny_config(data=dict(val_piece_bytes=0))   # fields added since: their old values
  setup_lib._check_workdir_config(spec_lib.build(same), RunDir(tmp_path))  # pylint: disable=protected-access
  record_lib.write_config(RunDir(tmp_path), spec_lib.build(same).to_json())
  rewritten = json.loads(path.read_text())
  then = spec_lib.sections_of(written_then)
  # The default rules table grows a rule with each new logical axis name. A run's rules are no
  # field of sections.SAME_RUN: the resume records the table it runs with.
  then["run"] = dataclasses.replace(then["run"], logical_axis_rules=LOGICAL_AXIS_RULES)
  assert spec_lib.sections_of(rewritten) == then                                 # the same run
  added = {"tst": ["schedule", "switch_adam", "switch_warmup"], "data": ["val_piece_bytes"],
           "model": ["matmul_precision"]}
  for section, names in added.items():                   # now recorded, at their old values
    assert all(n not in written_then[section] for n in names)
    assert {n: rewritten[section][n] for n in names} == {
        n: getattr(spec_lib.sections_of(written_then)[section], n) for n in names}
  assert rewritten["tst"]["schedule"] == "" and rewritten["data"]["val_piece_bytes"] == 0
  assert rewritten["tst"]["switch_adam"] == "keep" and rewritten["tst"]["switch_warmup"] == 0
  assert rewritten["reference"] == {"name": "", "loss": 0.0, "measured": "", "command": "",
                                    "data": "", "run": "", "loss_sd": 0.0, "seeds": 1}
  for other, section in ((tiny_config(bag_size=4, data=dict(val_piece_bytes=0)), "tst"),
                         (tiny_config(), "data")):          # held out by pieces: another split
    with pytest.raises(ConfigError, match=rf"another config: sections \['{section}'\]"):
      setup_lib._check_workdir_config(spec_lib.build(other), RunDir(tmp_path))  # pylint: disable=protected-access


@pytest.mark.slow
def test_a_workdir_from_another_platform_resumes_evaluates_and_loads_here(tmp_path):
  """config.json records each `auto` as the platform that trained chose it (a GPU: cudnn
  attention, the Pallas loss). Here those fields (platform.PLATFORM_FIELDS) are this
  platform's own: the run resumes, evaluates and loads; an eval leaves config.json as the
  training platform wrote it; any other difference still refuses."""
  from tst_jax import platform
  from tst_jax.train import trained_run
  cli.run(tiny_config(steps=4), str(tmp_path))
  path = tmp_path / "config.json"
  record = json.loads(path.read_text())
  assert record["model"]["attention_impl"] == "xla" and record["loss"]["impl"] == "naive"  # CPU
  record["model"]["attention_impl"], record["loss"]["impl"] = "cudnn", "pallas"
  path.write_text(json.dumps(record))
  assert set(platform.PLATFORM_FIELDS) >= {"model.attention_impl", "loss.impl"}

  setup_lib._check_workdir_config(spec_lib.build(tiny_config(steps=4)), RunDir(tmp_path))  # pylint: disable=protected-access
  evaluated = cli.run(tiny_config(steps=4), str(tmp_path), mode="eval")
  assert evaluated["step"] == 4 and evaluated["eval_loss"] > 0 and evaluated["eval_bpb"] > 0
  assert json.loads(path.read_text())["model"]["attention_impl"] == "cudnn"   # not rewritten
  loaded = trained_run.load(RunDir(tmp_path))
  assert loaded.model.cfg.attention_impl == "xla"               # this platform's kernel
  assert cli.run(tiny_config(steps=4), str(tmp_path))["steps"] == 4      # resumed: finished
  assert json.loads(path.read_text())["model"]["attention_impl"] == "xla"  # trained here now
  with pytest.raises(ValueError, match=r"sections \['tst'\] differ"):
    setup_lib._check_workdir_config(  # pylint: disable=protected-access
        spec_lib.build(tiny_config(steps=4, bag_size=4)), RunDir(tmp_path))
