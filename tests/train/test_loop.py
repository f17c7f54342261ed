"""The two-phase trainer end to end on CPU (tst_jax/train/loop.py): both phases, the handoff
checkpoint and the final one, the resolved `auto`s recorded; a tiny MoE trains with its aux
metrics."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.corpus import prepared_before_bytes
from tests.fixtures.tiny import tiny_config
from tst_jax import fileio
from tst_jax.data import TokenStore, eval_windows
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax.train import trained_run
from tst_jax.train import loop, step as step_lib
from tst_jax.run import goodput, workdir as workdir_lib


def test_two_phase_run_writes_both_phases_and_checkpoints(tmp_path):
  summary = cli.run(tiny_config(), str(tmp_path))
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  phases = [r["phase"] for r in records if "loss" in r]
  assert phases == ["tst"] * 6 + ["ntp"] * 6
  assert [r["bag_size"] for r in records if "loss" in r] == [2] * 6 + [1] * 6
  # Data tokens: phase 1 reads S*L per row, phase 2 L per row.
  last = [r for r in records if "loss" in r][-1]
  assert last["data_tokens"] == 6 * 4 * 32 + 6 * 4 * 16
  assert last["equivalent_tokens"] == 12 * 4 * 16
  assert any("eval_loss" in r and r["step"] == 6 for r in records)  # end of phase 1
  plan = spec_lib.check(tiny_config()).plan
  for r in (r for r in records if "loss" in r):   # CPU: no bf16 peak, no memory_stats
    phase = next(p for p in plan.phases if p.name == r["phase"])
    assert r["mfu"] is None and r["step_s"] > 0
    assert r["memory_bytes_in_use"] is None and r["memory_peak_bytes"] is None
    assert r["data_tokens_per_s"] == pytest.approx(phase.batch_size * phase.data_seq_len
                                                   / r["step_s"])
    assert r["equivalent_tokens_per_s"] == pytest.approx(phase.batch_size
                                                         * phase.latent_seq_len / r["step_s"])
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert 6 in steps and 12 in steps                    # the handoff and the final one
  assert os.path.exists(tmp_path / "loss.png")
  assert np.isfinite(summary["final_eval_loss"])
  # `auto` is resolved once for this platform and recorded in summary.json and config.json.
  assert summary["resolved"]["loss.impl"]["value"] == "naive"          # set in the config
  assert summary["resolved"]["model.attention_impl"]["value"] == "xla"  # auto on CPU
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["model"]["attention_impl"] == "xla"
  _check_the_held_out_bag_loss(str(tmp_path), records, summary)
  _check_goodput(RunDir(tmp_path), records)


def _check_goodput(rundir: RunDir, records: list[dict]):
  """One session in goodput.jsonl, from step 0 to 12, its categories adding up to its wall
  time, each one the run spends time on above 0; each train line holds its interval's split,
  and the intervals add up to no more than the session."""
  run = goodput.read_account(rundir)
  (session,) = run.sessions
  assert (session.first_step, session.last_step, session.ended) == (0, 12, "finished")
  assert sum(run.seconds.values()) == pytest.approx(run.wall, rel=1e-9)
  spent = {k for k, v in session.seconds.items() if v > 0}
  assert spent == {"step", "compile", "data", "checkpoint_save", "checkpoint_restore", "eval",
                   "startup"}, session.seconds         # the handoff's restore included
  train = [r for r in records if "loss" in r]
  for k in goodput.CATEGORIES:
    assert sum(r[f"goodput/{k}_s"] for r in train) <= session.seconds[k] + 1e-6
  assert all(0 < r["goodput"] <= 1 for r in train)


def _check_the_held_out_bag_loss(workdir, records, summary):
  """Phase 1's evals log eval_bag_loss, phase 2's do not; at the switch it is the training loss
  function of the tst phase on the checkpoint's parameters, averaged over data.eval_batches
  batches of B held-out windows of S·L + 1 = 33 tokens spread over the held-out split."""
  evals = {r["step"]: r for r in records if "eval_loss" in r}
  assert [s for s, r in evals.items() if "eval_bag_loss" in r] == [4, 6]
  assert summary["phase1_end_eval_bag_loss"] == evals[6]["eval_bag_loss"]
  spec = spec_lib.build(tiny_config())
  phase = spec.plan.phases[0]
  graphdef, _ = step_lib.abstract_model(spec.model)
  params, _ = trained_run.restore_params(os.path.join(workdir, "checkpoints"), 6, spec.model)
  model = nnx.merge(graphdef, params)
  windows = eval_windows(TokenStore(os.path.join(workdir, "data")).val, batch_size=4,
                         window=33, num_batches=2)
  losses = [float(step_lib.loss(model, jnp.asarray(w), phase, spec.loss)[0]) for w in windows]
  assert evals[6]["eval_bag_loss"] == pytest.approx(np.mean(losses), rel=1e-5)


def test_step_speed_gives_mfu_from_the_plans_flops_and_a_peak():
  """MFU = FLOPs per step x steps / seconds / (peak x devices), here with a made-up peak."""
  phase = spec_lib.check(tiny_config()).plan.phases[0]
  got = loop.step_speed(phase, 2.0 / 8, peak=5e9, devices=2)   # 8 steps in 2 seconds
  assert got["mfu"] == pytest.approx(phase.flops_per_step * 8 / 2.0 / (5e9 * 2))
  assert got["step_s"] == 0.25
  assert got["data_tokens_per_s"] == pytest.approx(phase.data_tokens_per_step * 4)
  assert loop.step_speed(phase, 0.25, None, 2)["mfu"] is None


@pytest.mark.parametrize("expert_impl", [
    "auto", pytest.param("gmm", marks=pytest.mark.slow)])   # gmm: tests/models/test_moe.py
def test_tiny_moe_trains_two_phase_with_aux_metrics(tmp_path, expert_impl):
  from tst_jax.config.defaults import base_config
  config = tiny_config(steps=16, ratio=0.25)
  moe = base_config("qwen3_moe", "tiny_moe").model
  moe.update(vocab_size=512, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffw_dim=64,
             n_experts=4, n_experts_per_token=2, moe_ffw_dim=32, expert_impl=expert_impl)
  with config.unlocked():
    config.model = moe
  config.optimizer.lr = 1e-2
  cli.run(config, str(tmp_path))
  train = [r for r in workdir_lib.read_metrics(RunDir(tmp_path)) if "loss" in r]
  assert [r["phase"] for r in train] == ["tst"] * 4 + ["ntp"] * 12
  loads = [[r[f"moe/expert_load/{e}"] for e in range(4)] for r in train]
  np.testing.assert_allclose(np.sum(loads, axis=1), 1.0, rtol=1e-5)
  assert all(r["moe/lb_loss"] > 0 for r in train)
  ntp = [r["loss"] for r in train if r["phase"] == "ntp"]
  assert np.mean(ntp[-3:]) < np.mean(ntp[:3])


def test_eval_sets_are_logged_by_name_at_every_eval(tmp_path, capsys):
  """Three sets in data.eval_sets: the training store itself (its held-out split: the headline
  windows, so the same loss and bits per byte), prose tokenized with the run's tokenizer, and
  the training store as a prepare before stores recorded bytes left it (the same loss, its
  bytes unknown); each at every eval, in metrics.jsonl, TensorBoard's scalars and the console;
  the headline unchanged."""
  from tst_jax.data import prepare as prepare_lib   # pylint: disable=g-import-not-at-top
  store = prepare_lib.prepare("builtin:pystdlib", str(tmp_path / "store"), vocab_size=300,
                              max_bytes=120_000, val_fraction=0.1, val_piece_bytes=2048,
                              workers=1, progress=False)
  os.makedirs(tmp_path / "prose")
  words = "the a of to and in is it that for on with as was at by an be this from".split()
  rng = np.random.default_rng(0)
  for i in range(40):
    (tmp_path / "prose" / f"{i}.txt").write_text(" ".join(rng.choice(words, 200)) + "\n")
  old = prepared_before_bytes(store, str(tmp_path / "old"))
  config = tiny_config(steps=8, train=dict(eval_every=4),
                       data=dict(source=f"tokens:{store}",
                                 eval_sets=f"same=tokens:{store},prose=text:{tmp_path}/prose/*.txt,"
                                           f"old=tokens:{old}"))
  summary = cli.run(config, str(tmp_path / "run"))
  evals = [r for r in workdir_lib.read_metrics(RunDir(tmp_path / "run"))
           if "eval_loss" in r]
  assert [r["step"] for r in evals] == [4, 8]
  for r in evals:
    assert r["eval_loss/same"] == r["eval_loss"] and np.isfinite(r["eval_loss/prose"])
    assert r["eval_loss/prose"] != r["eval_loss"]
    assert r["eval_bpb/same"] == r["eval_bpb"] and 0 < r["eval_bpb/prose"] != r["eval_bpb"]
    assert r["eval_loss/old"] == r["eval_loss"] and "eval_bpb/old" not in r
  assert summary["final_eval_loss"] == evals[-1]["eval_loss"]
  assert summary["final_eval_bpb"] == evals[-1]["eval_bpb"]
  out = capsys.readouterr().out
  last = evals[-1]
  assert (f"eval  step 8: held-out next-token loss {last['eval_loss']:.4f}, "
          f"{last['eval_bpb']:.4f} bits/byte; same {last['eval_loss']:.4f}, "
          f"{last['eval_bpb']:.4f} bits/byte; prose ") in out
  assert f"; old {last['eval_loss']:.4f}, bytes unknown\n" in out
  assert "held-out bytes unknown: the store was prepared before stores recorded them" in out
  assert os.path.exists(tmp_path / "run" / "eval_sets" / "prose" / "data" / "manifest.json")
  pytest.importorskip("tensorboardX")
  events = b"".join(p.read_bytes() for p in (tmp_path / "run" / "tensorboard").iterdir())
  assert b"eval_loss/prose" in events and b"eval_loss/same" in events


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_profile_steps_leaves_a_trace_and_the_step_table_in_the_workdir(tmp_path, capsys,
                                                                        where, request):
  """train.profile_steps=3,2 traces steps 3 and 4 (phase 1) into <workdir>/profile; the table
  counts those two steps, and its categories sum to their wall time. A bucket's workdir gets
  the trace uploaded from a local folder."""
  workdir = (str(tmp_path) if where == "local"
             else fileio.join(request.getfixturevalue("bucket"), "run"))
  cli.run(tiny_config(steps=8, train=dict(profile_steps="3,2", eval_every=8,
                                          checkpoint_every=0)), workdir)
  assert fileio.glob(RunDir(workdir).profile + "/**/*.xplane.pb")
  table = fileio.read_text(RunDir(workdir).profile_table)
  assert table.startswith("category") and "step (wall)" in table
  record = fileio.read_json(RunDir(workdir).profile_json)
  assert record["steps"] == 2
  assert sum(record["ms_per_step"].values()) == pytest.approx(record["step_ms"], rel=1e-6)
  assert "profile of steps 3 to 4, ms per step:" in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_with_document_masks_trains_both_phases_and_evaluates_each_document_alone(
    tmp_path):
  """data.document_mask with restarted positions, end to end: both phases train and evaluate
  (each document alone: tests/train/test_evaluate.py), and config.json records both fields."""
  config = tiny_config()
  config.data.document_mask = config.data.document_positions = True
  summary = cli.run(config, str(tmp_path))
  records = workdir_lib.read_metrics(RunDir(tmp_path))
  assert [r["phase"] for r in records if "loss" in r] == ["tst"] * 6 + ["ntp"] * 6
  assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
  assert np.isfinite(summary["final_eval_loss"])
  with open(tmp_path / "config.json") as f:
    recorded = json.load(f)["data"]
  assert recorded["document_mask"] and recorded["document_positions"]
