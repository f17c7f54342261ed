"""train.tracker: the tracker gets metrics.jsonl's records of both phases, the plan as config
and the phase switch; a resumed run continues its tracker run; a missing package is one line."""

import glob
import json
import struct
import sys
import types

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import tracker as tracker_lib, workdir as workdir_lib


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)   # import wandb raises ImportError
  with pytest.raises(ConfigError, match=r"^config.train.tracker: wandb is not installed: pip "
                                        r"install wandb, or train.tracker=none$"):
    tracker_lib.wandb(RunDir(tmp_path), None, {})


def _fake_trackio(calls):
  module = types.ModuleType("trackio")
  module.init = lambda **kw: calls.append(("init", kw))
  module.log = lambda values, step: calls.append(("log", dict(values, step=step)))
  module.finish = lambda: calls.append(("finish", None))
  return module


def test_trackio_gets_both_phases_the_plan_and_the_switch_and_resumes(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setitem(sys.modules, "trackio", _fake_trackio(calls))
  config = tiny_config(steps=8, train=dict(tracker="trackio", checkpoint_every=0))
  cli.run(config, str(tmp_path))
  (_, init), *logs, (last, _) = calls
  assert last == "finish" and init["resume"] == "allow"
  assert [p["name"] for p in init["config"]["plan"]["phases"]] == ["tst", "ntp"]
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  train = [(r["step"], r["loss"]) for r in records if "loss" in r]
  assert [(v["step"], v["loss"]) for _, v in logs if "loss" in v] == train   # both phases
  assert [v["step"] for _, v in logs if "eval_loss" in v] == [r["step"] for r in records
                                                               if "eval_loss" in r]
  assert [v["step"] for _, v in logs if "phase_switch" in v] == [5]   # the first ntp step
  # Run again, longer: the same tracker run continues.
  calls.clear()
  with config.unlocked():
    config.train.steps = 10
  config.train.force_resume = True
  cli.run(config, str(tmp_path))
  assert calls[0][1]["name"] == init["name"] == workdir_lib.read_tracker(RunDir(tmp_path))["id"]


def _wandb_records(run_dir: str):
  """Yields the protobuf Records of an offline run's .wandb file (LevelDB's log format)."""
  from wandb.proto import wandb_internal_pb2   # pylint: disable=g-import-not-at-top
  (path,) = glob.glob(f"{run_dir}/wandb/offline-run-*/run-*.wandb")
  data, pos, pending = open(path, "rb").read(), 7, b""   # 7: the file's own header
  while pos + 7 <= len(data):
    if 32768 - pos % 32768 < 7:                           # a block's padding
      pos += 32768 - pos % 32768
      continue
    _, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:
      break
    pending += data[pos + 7:pos + 7 + size]
    pos += 7 + size
    if kind in (1, 4):                                    # a full record, or its last piece
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      pending = b""
      yield record


def test_wandb_offline_run_holds_both_phases_and_the_config(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  cli.run(tiny_config(steps=8, train=dict(tracker="wandb", checkpoint_every=0)), str(tmp_path))
  history, config = [], {}
  for record in _wandb_records(str(tmp_path)):
    kind = record.WhichOneof("record_type")
    if kind == "history":
      history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                      for i in record.history.item})
    elif kind in ("run", "config"):
      updates = record.run.config.update if kind == "run" else record.config.update
      config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                     for i in updates})
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  logged = {(h["_step"], h["loss"]) for h in history if "loss" in h}
  assert logged == {(r["step"], r["loss"]) for r in records if "loss" in r}   # both phases
  assert [p["name"] for p in config["plan"]["phases"]] == ["tst", "ntp"]
  assert config["config"]["train"]["tracker"] == "wandb"
