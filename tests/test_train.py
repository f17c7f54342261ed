"""The two-phase trainer end to end on CPU: phases, handoff, resume, FLOPs, bad configs."""

import json
import os

import jax
import numpy as np
import pytest

from tests.tiny import tiny_config
from tst_jax.data import run_data
from tst_jax.train import cli, plan as plan_lib, setup as setup_lib, spec as spec_lib
from tst_jax.train import step as step_lib
from tst_jax.train import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_two_phase_run_writes_both_phases_and_checkpoints(tmp_path):
  summary = cli.run(tiny_config(), str(tmp_path))
  records = metrics_lib.read(str(tmp_path / "metrics.jsonl"))
  phases = [r["phase"] for r in records if "loss" in r]
  assert phases == ["tst"] * 6 + ["ntp"] * 6
  assert [r["bag_size"] for r in records if "loss" in r] == [2] * 6 + [1] * 6
  # Data tokens: phase 1 reads S*L per row, phase 2 L per row.
  last = [r for r in records if "loss" in r][-1]
  assert last["data_tokens"] == 6 * 4 * 32 + 6 * 4 * 16
  assert last["equivalent_tokens"] == 12 * 4 * 16
  assert any("eval_loss" in r and r["step"] == 6 for r in records)  # end of phase 1
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert 6 in steps and 12 in steps                    # the handoff and the final one
  assert os.path.exists(tmp_path / "loss.png")
  assert np.isfinite(summary["final_eval_loss"])
  # `auto` is resolved once for this platform and recorded in summary.json and config.json.
  assert summary["resolved"]["loss.impl"]["value"] == "naive"          # set in the config
  assert summary["resolved"]["model.attention_impl"]["value"] == "xla"  # auto on CPU
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["model"]["attention_impl"] == "xla"


def test_phase_flops_equal_in_compiled_cost_analysis():
  config = tiny_config()
  plan = spec_lib.check(config).plan
  tst_phase, ntp_phase = plan.phases
  assert tst_phase.flops_per_step == ntp_phase.flops_per_step
  model_cfg = spec_lib.check(config).model
  from tst_jax.train import optim
  tx, schedule = optim.make_optimizer(config.optimizer, plan.total_steps)
  graphdef, _ = step_lib.abstract_model(model_cfg)
  state = jax.eval_shape(step_lib.init_fn(model_cfg, tx), jax.random.key(0))

  def flops(phase, loss_fn):
    step = step_lib.make_train_step(graphdef, loss_fn, tx, schedule)
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), np.int32)
    return jax.jit(step).lower(state, window).compile().cost_analysis()["flops"]

  tst = flops(tst_phase, step_lib.loss_fn(tst_phase, config.loss))
  ntp = flops(ntp_phase, step_lib.loss_fn(ntp_phase, config.loss))
  assert abs(tst - ntp) / ntp < 0.02, (tst, ntp)


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


@pytest.mark.parametrize("field,value,message", [
    ("tst.bag_size", 0, "config.tst.bag_size: must be an integer >= 1"),
    ("tst.ratio", 1.5, r"config.tst.ratio: must be a number in \[0, 1\]"),
    ("tst.weighting", "cubic", "config.tst.weighting: unknown weighting 'cubic'"),
    ("tst.mode", "both", "config.tst.mode"),
    ("data.source", "text:/nonexistent/*.txt", "matches no files"),
    ("data.tokenizer", "/nonexistent/tokenizer.json", "does not exist"),
])
def test_bad_config_fails_before_training(tmp_path, field, value, message):
  config = tiny_config()
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
  tok = get_tokenizer("bpe", workdir=str(tmp_path / "tok"), vocab_size=600,
                      train_docs=load_documents("builtin:pystdlib", 100_000))
  small = tiny_config(data=dict(tokenizer=tok.path))
  with pytest.raises(ValueError, match="config.model.vocab_size: the tokenizer .* has 600 "
                                       "tokens, more than the model's 512"):
    cli.run(small, str(tmp_path / "c"))
  assert not (tmp_path / "c" / "checkpoints").exists()


def test_workdir_of_another_config_refuses_to_resume(tmp_path):
  cli.run(tiny_config(steps=4), str(tmp_path))
  before = (tmp_path / "metrics.jsonl").read_text()
  with pytest.raises(ValueError, match="holds a run of a different config"):
    cli.run(tiny_config(steps=4, bag_size=4), str(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("expert_impl", ["auto", "gmm"])
def test_tiny_moe_trains_two_phase_with_aux_metrics(tmp_path, expert_impl):
  from tst_jax.train.defaults import base_config
  config = tiny_config(steps=16, ratio=0.25)
  moe = base_config("qwen3_moe", "tiny_moe").model
  moe.update(vocab_size=512, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffw_dim=64,
             n_experts=4, n_experts_per_token=2, moe_ffw_dim=32, expert_impl=expert_impl)
  with config.unlocked():
    config.model = moe
  config.optimizer.lr = 1e-2
  cli.run(config, str(tmp_path))
  train = [r for r in metrics_lib.read(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["phase"] for r in train] == ["tst"] * 4 + ["ntp"] * 12
  loads = [[r[f"moe/expert_load/{e}"] for e in range(4)] for r in train]
  np.testing.assert_allclose(np.sum(loads, axis=1), 1.0, rtol=1e-5)
  assert all(r["moe/lb_loss"] > 0 for r in train)
  ntp = [r["loss"] for r in train if r["phase"] == "ntp"]
  assert np.mean(ntp[-3:]) < np.mean(ntp[:3])


@pytest.mark.slow   # the default suite runs the fused trainer in test_parallel (fsdp4 x tensor2)
def test_fused_loss_in_the_trainer_matches_naive(tmp_path):
  """loss.impl=xla (chunked, no [N, V] logits) gives the naive loss trajectory, both phases."""
  losses = {}
  for impl in ("naive", "xla"):
    workdir = tmp_path / impl
    cli.run(tiny_config(steps=6, loss=dict(impl=impl)), str(workdir))
    losses[impl] = [r["loss"] for r in metrics_lib.read(str(workdir / "metrics.jsonl"))
                    if "loss" in r]
  np.testing.assert_allclose(losses["xla"], losses["naive"], rtol=2e-5)


def test_a_phase_is_the_single_source_of_its_batches_and_loss():
  """The loss of a phase is built from its own bag size, mode, weighting and variant (the
  slow, obvious version: the MCE of superposed inputs written out here), a window of the
  wrong length is refused, and a Phase whose data length is not S x L cannot be made."""
  from flax import nnx
  from tst_jax import losses, models
  from tst_jax import superposition as sp
  config = tiny_config(bag_size=4)
  config.tst.update(weighting="exponential", variant="alt")
  tst = spec_lib.check(config).plan.phases[0]
  assert (tst.bag_size, tst.mode, tst.weighting, tst.variant) == (4, "full", "exponential",
                                                                  "alt")
  assert tst.window - 1 == tst.bag_size * tst.latent_seq_len
  model = models.build(spec_lib.check(config).model, nnx.Rngs(0))
  window = np.asarray(jax.random.randint(jax.random.key(1), (2, tst.window), 0, 512))
  loss, _ = step_lib.loss_fn(tst, config.loss)(model, window)
  inputs, targets = sp.fold(window[:, :-1], 4), sp.bag_targets(window[:, 1:], 4)
  hidden, _ = model.forward(inputs)
  want = losses.mce_loss(model.logits(hidden), targets, weighting="exponential", variant="alt")
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  with pytest.raises(ValueError, match="windows of 33 tokens, the plan says 65"):
    step_lib.loss_fn(tst, config.loss)(model, window[:, :33])
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


def test_a_workdir_written_before_the_run_spec_still_resumes(tmp_path):
  """tests/testdata/config_683731c.json is the config.json the trainer wrote for tiny_config()
  at 683731c, before the typed run spec: resuming such a workdir with the same settings (and
  the fields added since at the values that run had: each field's `added=` in its
  declaration) finds its config equal and records it with those fields; another config is
  still refused."""
  from tst_jax.errors import ConfigError
  old = os.path.join(ROOT, "tests", "testdata", "config_683731c.json")
  with open(old) as f:
    written_then = json.load(f)
  path = tmp_path / "config.json"
  path.write_text(open(old).read())
  same = tiny_config(data=dict(val_piece_bytes=0))   # fields added since: their old values
  setup_lib._check_workdir_config(spec_lib.build(same), str(tmp_path))  # pylint: disable=protected-access
  setup_lib._record_config(spec_lib.build(same), str(tmp_path))  # pylint: disable=protected-access
  rewritten = json.loads(path.read_text())
  assert spec_lib.sections_of(rewritten) == spec_lib.sections_of(written_then)  # the same run
  added = {"tst": ["schedule"], "data": ["val_piece_bytes"], "model": ["matmul_precision"]}
  for section, names in added.items():                   # now recorded, at their old values
    assert all(n not in written_then[section] for n in names)
    assert {n: rewritten[section][n] for n in names} == {
        n: getattr(spec_lib.sections_of(written_then)[section], n) for n in names}
  assert rewritten["tst"]["schedule"] == "" and rewritten["data"]["val_piece_bytes"] == 0
  assert rewritten["reference"] == {"name": "", "loss": 0.0, "measured": "", "command": ""}
  for other, section in ((tiny_config(bag_size=4, data=dict(val_piece_bytes=0)), "tst"),
                         (tiny_config(), "data")):          # held out by pieces: another split
    with pytest.raises(ConfigError, match=rf"a different config \(sections \['{section}'\]"):
      setup_lib._check_workdir_config(spec_lib.build(other), str(tmp_path))  # pylint: disable=protected-access
