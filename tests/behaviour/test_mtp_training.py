"""Multi-token prediction in a run, across the config, the step, the loop and the tools: the
plan's equal FLOPs, the arms, the config's rules, a tiny two-phase run (TST, then MTP), the
same run on 8 CPU devices, the export that leaves the heads behind and loads in transformers,
and the frontier, where an MTP run is no baseline."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from flax import nnx

from tests.fixtures.paths import TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tests.parallel.test_mesh import mesh_config, train_losses
from tst_jax import cli, configlib, fileio
from tst_jax.config import spec as spec_lib
from tst_jax.config.plan import Plan
from tst_jax.errors import ConfigError
from tst_jax.models import mtp as mtp_lib
from tst_jax.rundir import RunDir
from tst_jax.config import record
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import step as step_lib, trained_run
from tst_jax.tools import compare, export
from tst_jax.tools.eval_curve import EvalCurve
from tst_jax.train.setup import Setup


def _with_mtp(config, k, kind="gloeckle", **fields):
  config.mtp.update(k=k, kind=kind, **fields)
  return config


@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_the_plan_pays_for_the_heads_with_fewer_steps_at_the_baselines_flops(kind):
  base = spec_lib.check(tiny_config(steps=40, ratio=0.5)).plan
  plan = spec_lib.check(_with_mtp(tiny_config(steps=40, ratio=0.5), 3, kind)).plan
  tst, ntp = plan.phases
  assert tst == base.phases[0] and (tst.mtp_k, ntp.mtp_k) == (1, 3)
  heads = ntp.mtp_flops_per_step
  assert ntp.flops_per_step == base.phases[1].flops_per_step + heads > 0
  assert ntp.steps == round(20 * base.phases[1].flops_per_step / ntp.flops_per_step) < 20
  assert abs(plan.flops_total - base.flops_total) <= ntp.flops_per_step / 2
  assert (plan.params_total, plan.params_active) == (base.params_total, base.params_active)
  assert plan.params_mtp > 0 and plan.mtp_kind == kind and not plan.is_baseline
  assert base.is_baseline is False and spec_lib.check(tiny_config(ratio=0.0)).plan.is_baseline
  more = spec_lib.check(_with_mtp(tiny_config(steps=40, ratio=0.5), 3, kind,
                                  equal_flops=False)).plan
  assert more.phases[1].steps == 20 and more.flops_total > base.flops_total
  assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
  old = plan.to_json()          # a plan.json written before MTP: its fields take defaults
  for p in old["phases"]:
    for name in ("mtp_k", "mtp_weight", "mtp_flops_per_step"):
      del p[name]
  del old["params_mtp"], old["mtp_kind"]
  assert Plan.from_json(old).phases[1] == dataclasses.replace(
      ntp, mtp_k=1, mtp_weight=0.0, mtp_flops_per_step=0.0)


def test_the_plan_prints_the_heads_parameters_and_flops(capsys):
  cli.run(_with_mtp(tiny_config(steps=40, ratio=0.5), 2, "deepseek"), "", mode="plan")
  out = capsys.readouterr().out
  plan = spec_lib.check(_with_mtp(tiny_config(steps=40, ratio=0.5), 2, "deepseek")).plan
  ntp = plan.phases[1]
  extra = ntp.mtp_flops_per_step / (ntp.flops_per_step - ntp.mtp_flops_per_step)
  assert (f"mtp: deepseek, k=2 (tokens t+1..t+2), λ=0.3 in ntp: heads of "
          f"{plan.params_mtp / 1e3:.1f}K parameters") in out
  assert f"+{extra:.0%} FLOPs per step" in out
  # Phase 1 keeps r of train.steps, 20 of 40, and so of the FLOPs; the MTP phase pays for its
  # heads with fewer steps, so that phase 1 is more than r of the steps the run takes.
  tst = plan.phases[0]
  assert tst.steps == 20 and ntp.steps < 20
  flops = tst.steps * tst.flops_per_step / plan.flops_total
  assert abs(flops - 0.5) < 0.02
  assert (f"mtp: phase 1 is 20 of {plan.total_steps} steps ({20 / plan.total_steps:.0%}) and "
          f"{flops:.0%} of the FLOPs: r=0.5 is its share of train.steps") in out


@pytest.mark.parametrize("arg,k,kind,ratio", [
    ("mtp2", 2, "gloeckle", 0.0), ("mtp4-ds", 4, "deepseek", 0.0),
    ("tst,mtp2", 2, "gloeckle", 0.5), ("r0.25,mtp3-ds", 3, "deepseek", 0.25),
    ("baseline,mtp2", 2, "gloeckle", 0.0), ("tst", 1, "gloeckle", 0.5)])
def test_mtp_arms_set_k_and_kind_and_alone_leave_out_tst(arg, k, kind, ratio):
  config = configlib.load_config(f"{TINY_CONFIG}:{arg}")
  assert (config.mtp.k, config.mtp.kind, config.tst.ratio) == (k, kind, ratio)


@pytest.mark.parametrize("arg,field,value", [
    ("s8,mtp2", "bag_size", 8), ("smooth,mtp2", "schedule", "halve"),
    ("input_only,mtp3", "mode", "input_only"), ("mtp2-ds,output_only", "mode", "output_only"),
    ("reinit,mtp2", "reinit_at_switch", True)])
def test_an_arm_of_tsts_phase_1_keeps_it_before_the_mtp_phase(arg, field, value):
  """Every arm that sets a tst field but r = 0 asks for a TST phase 1, as `tst` does."""
  config = configlib.load_config(f"{TINY_CONFIG}:{arg}")
  assert config.tst.ratio == 0.5 and config.tst[field] == value and config.mtp.k > 1
  phases = spec_lib.check(config).plan.phases
  assert phases[0].is_tst and phases[-1].mtp_k == config.mtp.k


@pytest.mark.parametrize("arg", ["mtp2,mtp3-ds", "mtp2,mtp2", "s8,mtp2-ds,mtp4"])
def test_two_mtp_arms_in_one_arg_are_refused_naming_both(arg):
  first, second = [a for a in arg.split(",") if a.startswith("mtp")]
  with pytest.raises(ConfigError, match=f"arms {first!r} and {second!r} both set mtp.k"):
    configlib.load_config(f"{TINY_CONFIG}:{arg}")


@pytest.mark.parametrize("arg", ["mtp1", "mtp", "mtpx", "mtp2-dss"])
def test_a_malformed_mtp_arm_is_an_unknown_arg(arg):
  with pytest.raises(ConfigError, match=f"arm {arg!r}.*mtp<k>, mtp<k>-ds"):
    configlib.load_config(f"{TINY_CONFIG}:{arg}")


@pytest.mark.parametrize("fields,message", [
    (dict(tst=dict(ratio=1.0)), "mtp.k.*needs a next-token phase"),
    (dict(data=dict(seq_len=4)), "mtp.k.*more than the window's data.seq_len 4"),
    # round(0.96 x 10) = 10: phase 1 takes every step, though r < 1.
    (dict(steps=10, ratio=0.96), "mtp.k.*needs a next-token phase, and the plan has none"),
])
def test_mtp_without_room_for_it_is_refused(fields, message):
  with pytest.raises(ConfigError, match=message):
    spec_lib.check(_with_mtp(tiny_config(**fields), 5))


def _mtp_config():
  """8 steps: 4 TST with bags of 2, then Gloeckle's 3 heads in the ntp phase, at equal FLOPs."""
  return _with_mtp(tiny_config(steps=8, ratio=0.5, data=dict(seq_len=32, max_bytes=150_000),
                               train=dict(eval_every=100, checkpoint_every=2)), 3)


@pytest.fixture(scope="module")
def mtp_workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("mtp_run")
  cli.run(_mtp_config(), str(path))
  return str(path)


def _under_heads(tree):
  """The leaves of `tree` under the heads' key: their parameters, or their optimizer state."""
  return [x for path, x in jax.tree_util.tree_leaves_with_path(tree)
          if any(getattr(k, "key", None) == mtp_lib.ATTR for k in path)]


def test_a_two_phase_run_trains_the_heads_after_tst(mtp_workdir):
  rundir = RunDir(mtp_workdir)
  plan = record.read_plan(rundir).plan
  assert [(p.name, p.mtp_k) for p in plan.phases] == [("tst", 1), ("ntp", 3)]
  assert plan.total_steps == 4 + plan.phases[1].steps and plan.phases[1].steps < 4
  records = [r for r in workdir_lib.read_metrics(rundir) if "loss" in r]
  assert [r["step"] for r in records] == list(range(1, plan.total_steps + 1))
  for r in records:
    assert ("mtp/loss_t3" in r) == (r["phase"] == "ntp")
    if r["phase"] == "ntp":
      assert r["mtp/loss"] == pytest.approx((r["mtp/loss_t2"] + r["mtp/loss_t3"]) / 2)
      assert np.isfinite(r["loss"]) and r["mtp/loss_t3"] > 0
  # Phase 1 leaves the heads as drawn, undecayed, their optimizer state at step count 0 and
  # zero moments; the MTP phase trains every one of their parameters and counts its steps.
  setup = Setup.create(spec_lib.build(_mtp_config()), rundir, record=False)
  checkpoints = setup.open_checkpoints()
  try:
    switch, _ = checkpoints.restore(4, checkpoints.abstract_state)
    end, _ = checkpoints.restore(plan.total_steps, checkpoints.abstract_state)
  finally:
    checkpoints.close()
  init = setup.trainer.init_state(setup.spec.run.seed)
  heads, drawn = _under_heads(switch.params), _under_heads(init.params)
  assert len(heads) == len(drawn) > 0
  for got, want in zip(heads, drawn):
    np.testing.assert_array_equal(got, want)
  counts = [x for x in _under_heads(switch.opt_state) if x.dtype.kind in "iu"]
  assert counts and not any(np.any(x) for x in _under_heads(switch.opt_state))
  assert all(int(n) == plan.phases[1].steps for n in _under_heads(end.opt_state)
             if n.dtype.kind in "iu")
  assert all(not np.array_equal(got, was) for got, was in zip(_under_heads(end.params), heads))
  assert not np.array_equal(switch.params["blocks"]["ffw"]["up_proj"][...],
                            init.params["blocks"]["ffw"]["up_proj"][...])   # phase 1 trains
  summary = json.loads(fileio.read_text(rundir.summary))
  assert np.isfinite(summary["final_eval_loss"])
  # The checkpoint holds the heads (a resume continues them); the trained model does not.
  metadata = fileio.read_text(os.path.join(rundir.checkpoint(plan.total_steps), "state",
                                           "_METADATA"))
  assert "'mtp'" in metadata or '"mtp"' in metadata
  assert not hasattr(trained_run.load(rundir).model, mtp_lib.ATTR)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_deepseeks_modules_wait_through_phase_1_and_train_after_it(optimizer):
  """One step of each phase, from the same init, at the peak lr (no warmup): the tst step
  leaves the modules as drawn, weight decay included, and the MTP step moves every one of
  their parameters, with Muon on their matrices too."""
  config = _with_mtp(tiny_config(steps=8, ratio=0.5, optimizer=dict(name=optimizer,
                                                                    warmup_steps=0)),
                     2, "deepseek")
  spec = spec_lib.build(config)
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  state = trainer.init_state(spec.run.seed)
  drawn = [np.asarray(x) for x in _under_heads(state.params)]
  tst, ntp = spec.plan.phases
  for phase, moved in ((tst, False), (ntp, True)):
    window = jax.random.randint(jax.random.key(phase.first_step), (phase.batch_size,
                                                                    phase.window), 0, 512)
    state, metrics = trainer.train_step(phase)(state, window)
    assert bool(metrics["finite"]) and ("mtp/loss" in metrics) == moved
    heads = [np.asarray(x) for x in _under_heads(state.params)]
    assert [not np.array_equal(a, b) for a, b in zip(heads, drawn)] == [moved] * len(drawn)


def _no_state(*_):
  raise AssertionError("a whole TrainState drawn")


def test_the_export_leaves_the_heads_behind_and_loads_in_transformers(mtp_workdir, tmp_path,
                                                                       monkeypatch):
  out = export.export(mtp_workdir, tmp_path / "hf")
  names = list(safetensors.numpy.load_file(os.path.join(out, "model.safetensors")))
  assert names and not any("mtp" in n for n in names)
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  plan = record.read_plan(RunDir(mtp_workdir)).plan
  assert sum(p.numel() for p in model.parameters()) == plan.params_total
  ours = trained_run.load(RunDir(mtp_workdir), dtype="float32").model
  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(2, 32))
  want = np.asarray(ours(jnp.asarray(tokens)), np.float64)
  with torch.no_grad():
    got = model(torch.tensor(tokens)).logits.double().numpy()
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
  # And back: a run with heads starts from the export, the heads as a fresh init draws them,
  # without a whole TrainState drawn for them.
  config = _mtp_config()
  config.init_from_hf = out
  config.data.tokenizer = os.path.join(out, "tokenizer.json")
  run = Setup.create(spec_lib.build(config), RunDir(tmp_path / "again"))
  with monkeypatch.context() as patch:
    patch.setattr(step_lib.Trainer, "init_state", _no_state)
    state = run.init_from_hf()
  model_only = nnx.Not(nnx.PathContains(mtp_lib.ATTR))
  rest, heads = nnx.split_state(state.params, model_only, ...)
  fresh = nnx.split_state(run.trainer.init_state(config.seed).params, model_only, ...)[1]
  jax.tree.map(np.testing.assert_array_equal, heads, fresh)
  jax.tree.map(np.testing.assert_array_equal, rest, nnx.state(ours, nnx.Param))
  assert jax.tree.leaves(heads)


# DeepSeek's M_d [2D, D] has an input axis of its own, which the mesh shards as D; Gloeckle's
# heads are the model's own blocks, stacked. Both slow (two compiles each, on 8 devices);
# tests/models/test_mtp.py checks each kind's gradients on one.
@pytest.mark.slow
@pytest.mark.parametrize("kind", mtp_lib.KINDS)
def test_mtp_on_8_devices_trains_like_one(kind, tmp_path):
  """data 2 x fsdp 4: the same per-step losses and the same heads after the next-token phase
  (no tst phase: tests/parallel/test_mesh.py shards that one)."""
  one = _with_mtp(mesh_config(), 2, kind)
  one.tst.ratio = 0.0
  run = Setup.create(spec_lib.build(one), RunDir(tmp_path / "init"))
  init = jax.device_get(run.trainer.init_state(one.seed))
  expected, _, single = train_losses(one, tmp_path / "one", init)
  eight = _with_mtp(mesh_config((2, 4, 1, 1)), 2, kind)
  eight.tst.ratio = 0.0
  losses, _, sharded = train_losses(eight, tmp_path / "eight", init)
  heads = sharded.params[mtp_lib.ATTR]
  matrices = [x for x in jax.tree.leaves(heads) if x.ndim >= 3]   # the norms' scales are 2-D
  assert matrices and all(not x.sharding.is_fully_replicated for x in matrices)
  if kind == "deepseek":   # M_d's input axis over fsdp, its output whole
    assert heads["modules"]["proj"].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", None)
  np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-4)
  for got, want in zip(jax.tree.leaves(heads), jax.tree.leaves(single.params[mtp_lib.ATTR])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)


def _curve(name, plan, final):
  return EvalCurve(name, "", np.array([plan.total_steps], float), np.array([final]),
                   np.array([plan.data_tokens_total], float), plan)


def test_an_mtp_run_is_measured_against_the_baselines_never_one_of_them():
  """An MTP run has no tst phase, as a baseline has none: read as a baseline, its low loss
  would move the frontier and make it its own 1.00x."""
  steps = (30, 60)
  base = [spec_lib.check(tiny_config(steps=s, ratio=0.0)).plan for s in steps]
  mtp = spec_lib.check(_with_mtp(tiny_config(steps=60, ratio=0.0), 2)).plan
  runs = [_curve("b30", base[0], 5.0), _curve("b60", base[1], 4.0), _curve("mtp", mtp, 4.2)]
  frontier = compare.frontier_of(runs)
  assert frontier.names == ["b30", "b60"]
  row = compare.run_row(runs[2], frontier)
  assert not row["is_baseline"] and row["speedup_bound"] == "="
  # The frontier's log-FLOPs interpolation of 4.2 between (F30, 5.0) and (F60, 4.0).
  f30, f60 = base[0].flops_total, base[1].flops_total
  want = np.exp(np.log(f30) + 0.8 * (np.log(f60) - np.log(f30))) / mtp.flops_total
  assert row["speedup"] == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
def test_the_sweep_gives_tst_and_mtp_arms_their_equal_loss_speed_up(tmp_path, capsys):
  """The acceptance command on the tiny run of 12 steps, with a baseline of 24 for a frontier
  of two lengths."""
  from tst_jax.tools import sweep
  arms = "baseline,baseline+0.024k,tst,mtp2"
  assert sweep.main(["--config", TINY_CONFIG, "--arms", arms, "--workdir", str(tmp_path),
                     "--set", "train.checkpoint_every=100"]) == 0
  result = json.loads((tmp_path / "results.json").read_text())
  rows = {a["arm"]: a for a in result["arms"]}
  assert list(rows) == arms.split(",")
  assert [rows[a]["is_baseline"] for a in rows] == [True, True, False, False]
  for arm in ("tst", "mtp2"):
    run = next(r for r in result["runs"] if r["arm"] == arm)
    assert run["frontier"] == ["baseline_seed0", "baseline-0.024k_seed0"]
    assert run["speedup"] is not None, run["speedup_text"]
  mtp_plan = record.read_plan(RunDir(str(tmp_path / "mtp2_seed0"))).plan
  base_plan = record.read_plan(RunDir(str(tmp_path / "baseline_seed0"))).plan
  assert abs(mtp_plan.flops_total - base_plan.flops_total) <= (
      mtp_plan.phases[-1].flops_per_step / 2)
  assert "| mtp2 |" in (tmp_path / "results.md").read_text()


def test_mtp_arms_come_back_from_their_point_names_and_join_a_ladders_rungs(tmp_path):
  """A point brought back without its sweep_point.json names its arm by its folder, '+'
  written '-': the '-ds' of mtp<k>-ds stays. A ladder's rung spells an MTP arm at its length,
  and fits no TST trend to it (S = 1)."""
  from tests.fixtures.brought_back import write_point
  from tst_jax.tools import ladder
  from tst_jax.tools.sweep import make_arm_points
  from tst_jax.tools.sweep.brought_back import point_record
  for arm in ("tst+mtp2-ds", "mtp3-ds+0.016k", "baseline+0.016k"):
    point = make_arm_points([arm], [0])[0]
    steps = spec_lib.check(configlib.load_config(point.config_arg(TINY_CONFIG))).plan.total_steps
    path = write_point(str(tmp_path), TINY_CONFIG, point, [], {steps: 5.0})
    assert not fileio.exists(fileio.join(path, "sweep_point.json"))
    assert point_record(RunDir(path))["arm"] == arm
  tst, _ = ladder.rung_arms("0.024k", ("tst", "mtp2"), (1.0,), 12)
  assert tst == ["0.024k", "mtp2+0.024k"]
  config = configlib.load_config(f"{TINY_CONFIG}:{tst[1].replace('+', ',')}")
  assert (config.mtp.k, config.tst.ratio, config.train.steps) == (2, 0.0, 24)
  point = dict(S=1, rung_done=True, speedup=1.1, speedup_bound="=", tokens_per_param=1.0,
               arm="mtp2", seed=0, params=1e6, params_total=1e6)
  assert ladder.fit_trends([point, dict(point, tokens_per_param=2.0)], "test") == []
