"""The run's plan (tst_jax/config/plan.py): the paper configs' sizes and data tokens, a phase as
the single source of its batches and loss, plan.json's record read back typed, and every count
of a plan against the plan written out."""

import dataclasses
import json
import os
import types

import jax
import numpy as np
import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax.data import run_data
from tst_jax.config import plan as plan_lib, spec as spec_lib
from tst_jax.train import step as step_lib


def test_plan_of_paper_configs():
  """270M/600M/3B sizes and Table 1's data tokens (20k steps, 2M-token batches)."""
  from ml_collections import config_flags  # noqa: F401  (configs are plain modules)
  import importlib.util

  def load(name, arg):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return spec_lib.check(module.get_config(arg)).plan.to_json()

  # (V, D, layers, H, K, G, F) of SmolLM2-135M / SmolLM2-360M / SmolLM3-3B with the Llama-3
  # vocabulary and untied embeddings; the paper rounds these to 270M / 600M / 3B.
  shapes = {"llama_270m": (128256, 576, 30, 9, 3, 64, 1536, 270e6),
            "llama_600m": (128256, 960, 32, 15, 5, 64, 2560, 600e6),
            "llama_3b": (128256, 2048, 36, 16, 4, 128, 11008, 3e9)}
  for name, (v, d, n, h, k, g, f, nominal) in shapes.items():
    tst = load(name, "20k")
    base = load(name, "20k,baseline")
    expected = 2 * v * d + n * (d * g * (2 * h + 2 * k) + 3 * d * f + 2 * d) + d
    assert tst["params_total"] == tst["params_active"] == expected
    assert abs(expected - nominal) / nominal < 0.12, (name, expected)
    assert [p["steps"] for p in tst["phases"]] == [6000, 14000]
    assert round(tst["phases"][0]["data_tokens"] / 1e9) == 75
    assert round(tst["data_tokens_total"] / 1e9) == 105
    assert round(base["data_tokens_total"] / 1e9) == 42
    assert tst["phases"][0]["flops_per_step"] == tst["phases"][1]["flops_per_step"]
  assert [p["steps"] for p in load("llama_270m", "100k")["phases"]] == [30000, 70000]


def test_a_phase_is_the_single_source_of_its_batches_and_loss():
  """The loss of a phase is built from its own bag size, mode, weighting and variant (the
  slow, obvious version: the MCE of superposed inputs written out here), a window of the
  wrong length is refused, and a Phase whose data length is not S x L cannot be made."""
  from flax import nnx
  from tst_jax import losses, models
  from tst_jax import superposition as sp
  config = tiny_config(bag_size=4)
  config.tst.update(weighting="first", variant="alt")
  tst = spec_lib.check(config).plan.phases[0]
  assert (tst.bag_size, tst.mode, tst.weighting, tst.variant) == (4, "full", "first", "alt")
  assert tst.window - 1 == tst.bag_size * tst.latent_seq_len
  model = spec_lib.check(config).model.build(nnx.Rngs(0))
  window = np.asarray(jax.random.randint(jax.random.key(1), (2, tst.window), 0, 512))
  loss, _ = step_lib.loss(model, window, tst, config.loss)
  inputs, targets = sp.fold(window[:, :-1], 4), sp.bag_targets(window[:, 1:], 4)
  hidden, _ = model.forward(inputs)
  want = losses.mce_loss(model.logits(hidden), targets, weighting="first", variant="alt")
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  with pytest.raises(ValueError, match="windows of 33 tokens, the plan says 65"):
    step_lib.loss(model, window[:, :33], tst, config.loss)
  assert plan_lib.Phase("tst", 0, 1, 4, "full", 16, 2, 1.0).data_seq_len == 64
  assert plan_lib.Phase("tst", 0, 1, 4, "output_only", 16, 2, 1.0).data_seq_len == 16
  with pytest.raises(ValueError, match="the ntp phase and only it has S = 1"):
    plan_lib.Phase("tst", 0, 1, 1, "full", 16, 2, 1.0)


def test_the_plan_record_reads_back_typed_and_old_sweep_records_still_read():
  """plan.json's record (plan.PlanRecord) reads back into the same plan, phases, training
  tokens and resolved `auto` choices; the numbers in it are the phases' own."""
  staged = tiny_config(bag_size=4, tst=dict(schedule="halve", weighting="power"))
  batch = tiny_config(bag_size=4, tst=dict(equal_flops="batch"))
  # data tokens of each phase: staged S = 4, 2 (3 steps each, 4 rows of S x 16), then 6 ntp
  # steps of 4 x 16; equal_flops='batch': 6 steps of 16 rows of 4 bags of 4, then 6 ntp.
  expected = {"staged": [3 * 4 * 64, 3 * 4 * 32, 6 * 4 * 16], "batch": [6 * 16 * 16, 6 * 4 * 16],
              "baseline": [12 * 4 * 16]}
  for name, config in (("staged", staged), ("batch", batch),
                       ("baseline", tiny_config(ratio=0.0))):
    spec = spec_lib.check(config).on_platform("cpu")
    tokens = run_data.TrainTokens(1000, True, "the store s")
    record = plan_lib.PlanRecord(spec.plan, tokens, spec.resolved)
    written = json.loads(json.dumps(record.to_json()))
    assert plan_lib.PlanRecord.from_json(written) == record, name
    bare = plan_lib.PlanRecord(spec.plan)
    assert plan_lib.PlanRecord.from_json(json.loads(json.dumps(bare.to_json()))) == bare
    data = expected[name]
    assert [p["data_tokens"] for p in written["phases"]] == data
    assert [p["data_start"] for p in written["phases"]] == [sum(data[:k]) for k in range(len(data))]
    assert [p["first_step"] for p in written["phases"]] == (
        [0, 6] if len(data) == 2 else [0, 3, 6] if len(data) == 3 else [0])
    assert written["data"]["passes"] == pytest.approx([d / 1000 for d in data])
    # One store: no per-source or per-stage passes, which a data.mixture's record adds.
    assert set(written["data"]) == {"train_tokens", "exact", "where", "passes", "passes_total"}
    assert written["data"]["passes_total"] == pytest.approx(sum(data) / 1000)
    assert written["flops_total"] == pytest.approx(sum(p.flops_per_step * p.steps
                                                       for p in spec.plan.phases))
    assert written["tokens_per_param"] == pytest.approx(12 * 4 * 16 / spec.plan.params_active)
    assert written["ratio"] == (0.0 if name == "baseline" else 0.5)
    assert written["resolved"]["model.attention_impl"]["value"] == "xla"
    # A sweep_point.json written before first_step and ratio were recorded.
    old = {**written, "phases": [{k: v for k, v in p.items() if k != "first_step"}
                                 for p in written["phases"]]}
    del old["ratio"]
    assert plan_lib.Plan.from_json(old) == spec.plan
  assert spec_lib.check(staged).plan.phases[0].weighting == "power"


class _Model:
  """A model config of 1000 parameters, 700 active, and 100 + L FLOPs per token at length L:
  the plan needs nothing else of a model."""

  def param_counts(self):
    return 1000, 700

  def flops_per_token(self, latent):
    return 100.0 + latent


def _tst(**kw):
  return types.SimpleNamespace(**dict(dict(bag_size=4, ratio=0.3, schedule="", mode="full",
                                           equal_flops="seq", weighting="power",
                                           variant="alt"), **kw))


def test_the_plans_counts_are_those_of_a_plan_written_out():
  """10 steps, r = 0.3, S = 4, L = 16, B = 2: tst for steps 0-2 reads 2 x 64 tokens a step,
  ntp for 3-9 reads 2 x 16; every count the plan gives, at every step, is that arithmetic."""
  plan = plan_lib.make_plan(_Model(), _tst(), 16, 2, 10)
  tst, ntp = plan.phases
  assert (tst.name, tst.first_step, tst.steps, tst.bag_size, tst.latent_seq_len,
          tst.batch_size, tst.weighting, tst.variant) == ("tst", 0, 3, 4, 16, 2, "power", "alt")
  assert (ntp.name, ntp.first_step, ntp.steps, ntp.bag_size, ntp.mode, ntp.weighting,
          ntp.variant) == ("ntp", 3, 7, 1, "ntp", "uniform", "mce")
  assert (plan.params_total, plan.params_active, plan.ratio, plan.total_steps) == (
      1000, 700, 0.3, 10)
  assert tst.window == 65 and ntp.window == 17 and tst.last_step == 3 and ntp.last_step == 10
  assert tst.flops_per_step == ntp.flops_per_step == 116.0 * 16 * 2
  assert [plan.phase_at(step).name for step in range(12)] == ["tst"] * 3 + ["ntp"] * 9
  data = [0, 128, 256, 384] + [384 + 32 * k for k in range(1, 8)] + [608]
  assert [plan.tokens_at(step) for step in range(12)] == [
      dict(data_tokens=d, equivalent_tokens=32 * min(step, 10)) for step, d in enumerate(data)]
  assert plan.flops_at(2.5) == 2.5 * 116 * 32
  np.testing.assert_array_equal(plan.flops_at(np.array([0, 4, 11])), [0, 4 * 116 * 32,
                                                                       10 * 116 * 32])
  assert plan.flops_total == 10 * 116 * 32
  assert (plan.data_tokens_total, plan.equivalent_tokens_total) == (608, 320)
  assert [plan.data_start(p) for p in plan.phases] == [0, 384]
  assert plan.passes(64) == [384 / 64, 224 / 64]
  assert plan.tokens_per_param == 320 / 700 and plan.ntp_tokens_per_param == 224 / 700
  # A plan is checked once and changed by nothing after, its record neither.
  record = plan_lib.PlanRecord(plan)
  for frozen, field in ((plan, "ratio"), (tst, "steps"), (record, "tokens")):
    with pytest.raises(dataclasses.FrozenInstanceError):
      setattr(frozen, field, 1)


def test_a_plan_of_one_phase_at_either_end_of_r():
  """r = 0 or S = 1 is the baseline, next-token only; r = 1 is tst only, with no empty ntp."""
  for tst in (_tst(ratio=0.0), _tst(bag_size=1)):
    plan = plan_lib.make_plan(_Model(), tst, 16, 2, 10)
    assert [(p.name, p.steps) for p in plan.phases] == [("ntp", 10)] and plan.ratio == 0.0
    assert plan.ntp_tokens_per_param is None       # no tst phase for it to follow
  only = plan_lib.make_plan(_Model(), _tst(ratio=1.0), 16, 2, 10)
  assert [(p.name, p.steps) for p in only.phases] == [("tst", 10)] and only.ratio == 1.0
  assert only.ntp_tokens_per_param == 0.0
  two = plan_lib.make_plan(_Model(), _tst(bag_size=2), 16, 2, 10)    # the smallest bag
  assert [(p.name, p.bag_size, p.steps) for p in two.phases] == [("tst", 2, 3), ("ntp", 1, 7)]


def test_stages_share_phase_one_and_batch_equal_flops_trades_length_for_rows():
  """'halve' at S = 8 over 7 phase-1 steps: S = 8, 4, 2 for 3, 2, 2 steps; equal_flops=batch
  gives L / S positions and S x B rows, except in output_only, which keeps L and B."""
  plan = plan_lib.make_plan(_Model(), _tst(bag_size=8, ratio=0.5, schedule="halve"), 16, 2, 14)
  assert [(p.bag_size, p.first_step, p.steps) for p in plan.phases] == [
      (8, 0, 3), (4, 3, 2), (2, 5, 2), (1, 7, 7)]
  assert plan_lib.bag_schedule(_tst(bag_size=6, schedule="halve")) == (6, 3)
  assert plan_lib.bag_schedule(_tst(bag_size=5, schedule=" 5, 3,2 ")) == (5, 3, 2)
  batch = plan_lib.make_plan(_Model(), _tst(equal_flops="batch"), 16, 2, 10).phases[0]
  assert (batch.latent_seq_len, batch.batch_size, batch.data_seq_len) == (4, 8, 16)
  kept = plan_lib.make_plan(_Model(), _tst(equal_flops="batch", mode="output_only"), 16, 2,
                            10).phases[0]
  assert (kept.latent_seq_len, kept.batch_size, kept.data_seq_len) == (16, 2, 16)


@pytest.mark.parametrize("schedule,bag_size", [("8,8", 8), ("4,2", 8), ("8,1", 8), ("8,x", 8),
                                               ("8,4,3,3", 8)])
def test_a_schedule_that_does_not_decrease_from_s_to_2_is_refused(schedule, bag_size):
  with pytest.raises(ValueError, match="must start at tst.bag_size|comma list"):
    plan_lib.bag_schedule(_tst(bag_size=bag_size, schedule=schedule))


def test_an_old_sweep_record_reads_back_with_r_as_the_tst_share():
  plan = plan_lib.make_plan(_Model(), _tst(), 16, 2, 10)
  record = plan.to_json()
  del record["ratio"]
  for p in record["phases"]:
    del p["first_step"]
  back = plan_lib.Plan.from_json(record)
  assert back.ratio == 0.3 and [p.first_step for p in back.phases] == [0, 3]
  one = plan_lib.make_plan(_Model(), _tst(ratio=1.0), 16, 2, 1).to_json()   # one tst step
  del one["ratio"]
  assert plan_lib.Plan.from_json(one).ratio == 1.0
