"""The optimizer and schedule options: each schedule against its formula written out, Muon's
split of the parameters and its orthogonalised updates, bf16 moments, tiny two-phase runs with
each option, and the non-finite guard compared with optax.apply_if_finite, which it keeps."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from tests.fixtures.tiny import tiny_config
from tst_jax import losses
from tst_jax import superposition as sp
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax import optim
from tst_jax.train import step as step_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax.config.sections import Optimizer

PEAK, FINAL = 2e-3, 0.1


def _opt(**fields):
  cfg = dict(lr=PEAK, warmup_steps=10, decay_fraction=0.2, final_lr_fraction=FINAL,
             schedule="wsd", decay_shape="linear")
  return ml_collections.ConfigDict({**cfg, **fields})


def _written_out(step, total, warmup, decay, shape, peak=PEAK, final=FINAL):
  """The lr at `step`: linear warmup from 0, the peak, then a decay of `shape` to final x the
  peak over the last `decay` steps."""
  if step < warmup:
    return peak * step / warmup
  x = min(max((step - (total - decay)) / decay, 0.0), 1.0)
  left = {"linear": 1 - x, "cosine": (1 + math.cos(math.pi * x)) / 2,
          "1-sqrt": 1 - math.sqrt(x)}[shape]
  return peak * final + (peak - peak * final) * left


@pytest.mark.parametrize("shape", optim.DECAY_SHAPES)
def test_wsd_decay_shapes_follow_their_formulas(shape):
  schedule = optim.lr_schedule(_opt(decay_shape=shape), 100)
  got = np.asarray(jax.vmap(schedule)(jnp.arange(101)))
  want = [_written_out(k, 100, 10, 20, shape) for k in range(101)]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
  assert got[50] == pytest.approx(PEAK) and got[100] == pytest.approx(PEAK * FINAL)


def test_linear_wsd_is_optax_joined_schedules_and_cosine_is_optax_warmup_cosine():
  steps = jnp.arange(101)
  linear = optax.join_schedules(
      [optax.linear_schedule(0.0, PEAK, 10), optax.constant_schedule(PEAK),
       optax.linear_schedule(PEAK, PEAK * FINAL, 20)], boundaries=[10, 80])
  np.testing.assert_allclose(jax.vmap(optim.lr_schedule(_opt(), 100))(steps),
                             jax.vmap(linear)(steps), rtol=1e-5, atol=1e-9)
  cosine = optax.warmup_cosine_decay_schedule(0.0, PEAK, 10, 100, end_value=PEAK * FINAL)
  np.testing.assert_allclose(jax.vmap(optim.lr_schedule(_opt(schedule="cosine"), 100))(steps),
                             jax.vmap(cosine)(steps), rtol=1e-5, atol=1e-9)


def test_optax_joined_schedule_rounds_the_demos_learning_rates_otherwise():
  """Why the schedule is not optax's pieces joined by optax.join_schedules: on the demo's
  schedule (configs/demo.py), jitted as in the train step, it gives the same learning rates
  within float32's rounding but other last bits at several steps, warmup steps among them.
  That is enough to move the demo's documented losses (docs/demo.md)."""
  demo = _opt(lr=3e-3, warmup_steps=20, decay_fraction=0.1, final_lr_fraction=0.0)
  joined = optax.join_schedules(
      [optax.linear_schedule(0.0, 3e-3, 20), optax.constant_schedule(3e-3),
       optax.linear_schedule(3e-3, 0.0, 30)], boundaries=[20, 270])
  steps = jnp.arange(300)
  ours = np.asarray(jax.jit(jax.vmap(optim.lr_schedule(demo, 300)))(steps))
  theirs = np.asarray(jax.jit(jax.vmap(joined))(steps))
  np.testing.assert_allclose(ours, theirs, rtol=1e-6)
  differ = set(np.flatnonzero(ours != theirs).tolist())
  assert differ & set(range(1, 20)), sorted(differ)


def test_1_sqrt_decay_has_no_optax_piece():
  """optax's nearest piece, polynomial_schedule(power=0.5), is sqrt(1 - x), not 1 - sqrt(x):
  half-way through the decay it keeps 0.71 of the way from the end where 1-sqrt keeps 0.29."""
  ours = optim.lr_schedule(_opt(decay_shape="1-sqrt"), 100)
  polynomial = optax.join_schedules(
      [optax.linear_schedule(0.0, PEAK, 10), optax.constant_schedule(PEAK),
       optax.polynomial_schedule(PEAK, PEAK * FINAL, 0.5, 20)], boundaries=[10, 80])
  left = lambda lr: (float(lr) - PEAK * FINAL) / (PEAK - PEAK * FINAL)
  assert left(ours(90)) == pytest.approx(1 - math.sqrt(0.5), rel=1e-5)
  assert left(polynomial(90)) == pytest.approx(math.sqrt(0.5), rel=1e-5)


def _tiny_params(**optimizer):
  config = tiny_config()
  config.optimizer.update(warmup_steps=0, **optimizer)
  spec = spec_lib.check(config)
  tx, _ = optim.make_optimizer(spec.optimizer, spec.plan.total_steps)
  return tx, step_lib.init_fn(spec.model, tx)(jax.random.key(0)).params


def _leaves(tree):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
  """One step from a fresh state: AdamW's first update is -lr (g / (|g| + eps) + wd p), decay
  off on norm scales; Muon's of each layer's matrix is -lr 0.2 sqrt(max(m, n)) U V^T of that
  layer's gradient U S V^T alone, up to the quintic Newton-Schulz's spread of the singular
  values around 1 (0.68 to 1.04 here: the gradient's are 1 to 3)."""
  tx, params = _tiny_params(name="muon")
  rng = np.random.default_rng(0)

  def conditioned(shape, matrix):   # each layer's [in, out] slice: U diag(1..3) V^T
    m, n = matrix
    out = []
    for _ in range(shape[0]):
      u, _ = np.linalg.qr(rng.normal(size=(m, m)))
      v, _ = np.linalg.qr(rng.normal(size=(n, n)))
      out.append(u[:, :min(m, n)] @ np.diag(np.linspace(1, 3, min(m, n))) @ v[:, :min(m, n)].T)
    return np.stack(out).reshape(shape)

  # [in, out] of each: q [D, H x G], o [H x G, D] (the layer's slice, logical names' order)
  matrices = {"['blocks']['ffw']['up_proj'].value": (32, 64),
              "['blocks']['ffw']['down_proj'].value": (64, 32),
              "['blocks']['attn']['q_proj'].value": (32, 32),
              "['blocks']['attn']['o_proj'].value": (32, 32)}
  grads = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray(conditioned(x.shape, matrices[jax.tree_util.keystr(p)])
                               if jax.tree_util.keystr(p) in matrices
                               else rng.normal(size=x.shape), jnp.float32), params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  clip = 1 / max(1.0, float(optax.tree.norm(grads)))    # optimizer.grad_clip = 1
  got, g, p = _leaves(updates), _leaves(jax.tree.map(lambda x: x * clip, grads)), _leaves(params)
  muon = {k for k in got if optim.muon_dims(_variable(params, k)) is not None}
  assert muon == {f"['blocks']['{m}'].value" for m in (
      "attn']['q_proj", "attn']['k_proj", "attn']['v_proj", "attn']['o_proj",
      "ffw']['gate_proj", "ffw']['up_proj", "ffw']['down_proj")}
  lr, wd = 3e-3, 0.1
  for k in sorted(set(got) - muon):
    decay = 0.0 if "norm" in k else wd
    adam = g[k] / (np.abs(g[k]) + 1e-8)
    np.testing.assert_allclose(got[k], -lr * (adam + decay * p[k]), rtol=1e-4, atol=1e-9,
                               err_msg=k)
  for k, (m, n) in matrices.items():
    for layer in range(2):
      grad, update = (np.asarray(x[k][layer]).reshape(m, n) for x in (
          g, jax.tree.map(lambda u, w: u + lr * wd * w, got, p)))
      u, _, vt = np.linalg.svd(grad, full_matrices=False)
      polar = -lr * 0.2 * math.sqrt(max(m, n)) * u @ vt
      cosine = np.sum(update * polar) / np.linalg.norm(update) / np.linalg.norm(polar)
      ratio = np.linalg.svd(update, compute_uv=False) / np.linalg.svd(polar, compute_uv=False)
      assert cosine > 0.97, (k, layer, cosine)
      assert np.all((ratio > 0.6) & (ratio < 1.2)), (k, layer, ratio)


def test_muon_reads_deepseeks_projection_as_a_2d_by_d_matrix():
  """M_d [2D, D] of each MTP depth reads its 2D input axis and writes D: Muon's update of each
  depth's slice is -lr 0.2 sqrt(2D) U V^T of that slice's gradient U S V^T."""
  config = tiny_config(ratio=0.0, optimizer=dict(name="muon", warmup_steps=0))
  config.mtp.update(k=3, kind="deepseek")
  spec = spec_lib.check(config)
  tx, _ = optim.make_optimizer(spec.optimizer, spec.plan.total_steps)
  params = step_lib.init_fn(spec.model, tx, spec.mtp)(jax.random.key(0)).params
  proj = params["mtp"]["modules"]["proj"]
  dims = optim.muon_dims(proj)
  assert proj.shape == (2, 64, 32)        # [depths, 2D, D]
  assert (np.atleast_1d(dims.reduction_axis).tolist(),
          np.atleast_1d(dims.output_axis).tolist()) == ([1], [2])
  rng = np.random.default_rng(1)
  slices = []
  for _ in range(2):
    u, _ = np.linalg.qr(rng.normal(size=(64, 32)))
    v, _ = np.linalg.qr(rng.normal(size=(32, 32)))
    slices.append(u @ np.diag(np.linspace(1, 3, 32)) @ v.T)
  grads = jax.tree.map(jnp.zeros_like, params)
  grads["mtp"]["modules"]["proj"].set_value(jnp.asarray(np.stack(slices), jnp.float32))
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  lr, wd = 3e-3, 0.1
  update = np.asarray(jax.tree.leaves(updates["mtp"]["modules"]["proj"])[0])
  update = update + lr * wd * np.asarray(proj[...])
  for depth, grad in enumerate(slices):
    u, _, vt = np.linalg.svd(grad, full_matrices=False)
    polar = -lr * 0.2 * math.sqrt(64) * u @ vt
    cosine = np.sum(update[depth] * polar) / np.linalg.norm(update[depth]) / np.linalg.norm(polar)
    ratio = (np.linalg.svd(update[depth], compute_uv=False)
             / np.linalg.svd(polar, compute_uv=False))
    assert cosine > 0.97, (depth, cosine)
    assert np.all((ratio > 0.6) & (ratio < 1.2)), (depth, ratio)


def test_late_parameters_start_as_with_a_fresh_adamw_on_the_global_schedule():
  """Parameters under make_optimizer's `late` key, held by `hold` until step 30, neither move
  nor decay before it. Their first update there is AdamW's first of a fresh optimizer at the
  schedule's step-30 lr, -lr(30) (g / (|g| + eps) + wd p), bias-corrected from a step count
  of their own; the others go on with their moments and count."""
  cfg = Optimizer(warmup_steps=10)
  tx, schedule = optim.make_optimizer(cfg, 100, late=("mtp", 30))
  plain, _ = optim.make_optimizer(cfg, 100)
  params = {"w": jnp.arange(1.0, 5.0), "mtp": {"v": jnp.full(4, 2.0)}}
  state, other = tx.init(params), plain.init(params)
  rng = np.random.default_rng(0)
  early = lambda: {"w": jnp.asarray(rng.normal(size=4) * 0.1, jnp.float32),
                   "mtp": {"v": jnp.zeros(4)}}
  for _ in range(30):
    grads = early()
    updates, new = tx.update(grads, state, params)
    updates, state = optim.hold("mtp", updates, new, state)
    want, other = plain.update(grads, other, params)
    np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-6)   # the rest: one AdamW
    params = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(params["mtp"]["v"], 2.0)
  g = jnp.asarray([0.1, -0.2, 0.05, 0.3], jnp.float32)
  updates, _ = tx.update({"w": jnp.zeros(4), "mtp": {"v": g}}, state, params)
  lr = float(schedule(30))
  assert lr == pytest.approx(cfg.lr)     # past warmup: the global step's, not step 0's
  np.testing.assert_allclose(updates["mtp"]["v"],
                             -lr * (g / (jnp.abs(g) + cfg.eps) + cfg.weight_decay * 2.0),
                             rtol=1e-5)


def _variable(params, key):
  found = [v for p, v in jax.tree_util.tree_leaves_with_path(
      params, is_leaf=lambda v: isinstance(v, nnx.Variable)) if jax.tree_util.keystr(p)
      + ".value" == key]
  return found[0]


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
def test_bf16_moments(name):
  tx, params = _tiny_params(name=name, mu_dtype="bfloat16")
  dtypes = {str(x.dtype) for x in jax.tree.leaves(jax.eval_shape(tx.init, params))
            if x.shape == params["embed"]["table"].shape}
  assert dtypes == {"bfloat16", "float32"}      # AdamW's mu, and its nu kept in float32
  tx, params = _tiny_params(name=name)
  assert all(x.dtype != jnp.bfloat16 for x in jax.tree.leaves(jax.eval_shape(tx.init, params)))


def test_z_loss_is_in_both_phases_losses():
  """loss.z_loss reaches the train step's loss of each phase: the MCE (tst) and the
  next-token CE (ntp), each written out from the logits, plus the z term."""
  config = tiny_config(bag_size=2, loss=dict(z_loss=0.5))
  spec = spec_lib.check(config)
  graphdef, _ = step_lib.abstract_model(spec.model)
  model = nnx.merge(graphdef, step_lib.init_fn(spec.model, optax.sgd(0.1))(
      jax.random.key(0)).params)
  for phase in spec.plan.phases:
    window = jax.random.randint(jax.random.key(1), (2, phase.window), 0, 512)
    got, _ = step_lib.loss(model, window, phase, spec.loss)
    if phase.is_tst:
      hidden, _ = model.forward(sp.fold(window[:, :-1], 2))
      logits, targets = model.logits(hidden), sp.bag_targets(window[:, 1:], 2)
    else:
      logits, targets = model(window[:, :-1]), window[:, 1:, None]
    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    want = losses.mce_loss(logits, targets) + 0.5 * jnp.mean(lse ** 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=phase.name)


# One tiny two-phase run per option set (8 steps: 4 tst with S = 2, then 4 ntp), the WSD
# decay spanning both phases; the default (AdamW, linear WSD) runs in train/test_loop.py.
RUNS = {
    "muon_1-sqrt_bf16_zloss": dict(optimizer=dict(name="muon", decay_shape="1-sqrt",
                                                  mu_dtype="bfloat16"),
                                   loss=dict(z_loss=1e-3)),
    "cosine_decay": dict(optimizer=dict(decay_shape="cosine")),
    "cosine_schedule": dict(optimizer=dict(schedule="cosine")),
}


# The two cosine runs are slow: the cosine curves are checked without a run above.
@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=pytest.mark.slow) if name in ("cosine_decay", "cosine_schedule")
    else name
    for name in sorted(RUNS)])
def run(request, tmp_path_factory):
  options = RUNS[request.param]
  config = tiny_config(steps=8, train=dict(eval_every=100, checkpoint_every=100))
  for section, fields in options.items():
    config[section].update(fields)
  config.optimizer.update(warmup_steps=1, decay_fraction=0.75)
  workdir = tmp_path_factory.mktemp(request.param)
  cli.run(config, str(workdir))
  return config, workdir_lib.read_metrics(RunDir(workdir))


def test_each_option_trains_both_phases_on_its_schedule(run):
  config, records = run
  train = [r for r in records if "loss" in r]
  assert [r["phase"] for r in train] == ["tst"] * 4 + ["ntp"] * 4
  assert all(np.isfinite(r["loss"]) for r in train)
  opt = config.optimizer
  decay = 7 if opt.schedule == "cosine" else 6
  shape = "cosine" if opt.schedule == "cosine" else opt.decay_shape
  want = [_written_out(r["step"] - 1, 8, 1, decay, shape, opt.lr, opt.final_lr_fraction)
          for r in train]
  np.testing.assert_allclose([r["lr"] for r in train], want, rtol=1e-5)
  evals = [r["eval_loss"] for r in records if "eval_loss" in r]
  assert len(evals) == 2 and evals[1] < evals[0] < math.log(512)   # both phases learn



def _setup(max_errors: int):
  params = {"w": jnp.arange(4.0), "norm": jnp.ones(2)}
  tx, _ = optim.make_optimizer(Optimizer(warmup_steps=0), total_steps=100)
  return params, tx, optax.apply_if_finite(tx, max_consecutive_errors=max_errors)


def test_apply_if_finite_matches_on_finite_gradients():
  params, tx, guarded = _setup(2)
  grads = {"w": jnp.array([0.1, -0.2, 0.3, 0.0]), "norm": jnp.array([0.5, 0.5])}
  want, _ = tx.update(grads, tx.init(params), params)
  got, _ = guarded.update(grads, guarded.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


def test_apply_if_finite_is_not_the_nan_policy_guard():
  """Three differences: it applies a bad update after max_consecutive_errors where the loop
  stops at train.max_nan_skips, it counts consecutive steps where max_nan_skips counts all,
  and its counters change the optimizer state that checkpoints hold."""
  params, tx, guarded = _setup(2)
  nan = {"w": jnp.full(4, jnp.nan), "norm": jnp.zeros(2)}
  state = guarded.init(params)
  for _ in range(2):
    updates, state = guarded.update(nan, state, params)
    assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(updates))
  updates, state = guarded.update(nan, state, params)
  assert not np.isfinite(np.asarray(optax.apply_updates(params, updates)["w"])).any()
  # A finite step in between resets its count: 2 + 2 non-finite steps are all skipped.
  state = guarded.init(params)
  finite = jax.tree.map(jnp.ones_like, params)
  for grads in [nan, nan, finite, nan, nan]:
    updates, state = guarded.update(grads, state, params)
    assert np.isfinite(np.asarray(updates["w"])).all()
  assert int(state.total_notfinite) == 4
  assert jax.tree.structure(guarded.init(params)) != jax.tree.structure(tx.init(params))


def _schedule(**fields):
  return optim.lr_schedule(Optimizer(lr=2e-3, warmup_steps=10, decay_fraction=0.2, **fields),
                           100, rewarm=(40, 8))


def test_rewarm_scales_the_steps_from_the_switch_by_n_plus_1_over_its_steps():
  """Step 40 + n of a rewarm of 8 steps at 40 has (n + 1) / 8 of the one schedule's lr, up to
  1; every step before 40 and from 47 on is the one schedule's to the last bit."""
  plain = optim.lr_schedule(Optimizer(lr=2e-3, warmup_steps=10, decay_fraction=0.2), 100)
  steps = jnp.arange(101)
  got, one = np.asarray(jax.vmap(_schedule())(steps)), np.asarray(jax.vmap(plain)(steps))
  want = [one[k] * (min((k - 40 + 1) / 8, 1.0) if k >= 40 else 1.0) for k in range(101)]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_array_equal(got[:40], one[:40])
  np.testing.assert_array_equal(got[47:], one[47:])
  assert got[40] == pytest.approx(2e-3 / 8) and got[46] == pytest.approx(2e-3 * 7 / 8)


def test_fresh_moments_restart_adam_and_keep_the_schedules_count():
  """After fresh_moments the next update is AdamW's first, -lr(t) (g / (|g| + eps) + wd p)
  at the global step t's lr (a step counter of 0 would give warmup's lr(0) = 0 instead); the
  moments and counts of the old state would give another update."""
  cfg = Optimizer(warmup_steps=10)
  tx, schedule = optim.make_optimizer(cfg, 100)
  params = {"w": jnp.arange(1.0, 5.0)}
  state = tx.init(params)
  rng = np.random.default_rng(0)
  for _ in range(30):
    _, state = tx.update({"w": jnp.asarray(rng.normal(size=4), jnp.float32)}, state, params)
  reset = optim.fresh_moments(state, tx.init(params))
  g = {"w": jnp.asarray([0.1, -0.2, 0.05, 0.3], jnp.float32)}
  got, _ = tx.update(g, reset, params)
  kept, _ = tx.update(g, state, params)
  lr = float(schedule(30))
  assert lr == pytest.approx(cfg.lr)
  want = -lr * (g["w"] / (jnp.abs(g["w"]) + cfg.eps) + cfg.weight_decay * params["w"])
  np.testing.assert_allclose(got["w"], want, rtol=1e-5)
  assert not np.allclose(kept["w"], want, rtol=1e-2)
  counts = [int(s.count) for s in jax.tree.leaves(
      reset, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
      if isinstance(s, optax.ScaleByScheduleState)]
  assert counts == [30]


def test_moment_stats_are_the_rms_of_adams_moments_over_every_parameter():
  tx, _ = optim.make_optimizer(Optimizer(), 10)
  params = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
  _, state = tx.update({"a": jnp.asarray([0.3, -0.1, 0.2]), "b": jnp.full((2, 2), 0.1)},
                       tx.init(params), params)
  g = np.array([0.3, -0.1, 0.2, 0.1, 0.1, 0.1, 0.1])      # under the clip (norm 0.42)
  stats = optim.moment_stats(state)
  assert float(stats["adam_mu_rms"]) == pytest.approx(0.1 * math.sqrt(np.mean(g ** 2)), rel=1e-5)
  assert float(stats["adam_nu_rms"]) == pytest.approx(0.05 * math.sqrt(np.mean(g ** 4)),
                                                      rel=1e-5)


def test_moment_stats_trace_for_a_model_of_more_than_2_31_parameters():
  """3B parameters, as configs/llama_3b.py has: the count divides as a float, not an int32."""
  tx, _ = optim.make_optimizer(Optimizer(), 10)
  params = {"w": jax.ShapeDtypeStruct((3, 2**30), jnp.float32)}
  state = jax.eval_shape(tx.init, params)
  stats = jax.eval_shape(optim.moment_stats, state)
  assert stats["adam_nu_rms"].shape == () and stats["adam_nu_rms"].dtype == jnp.float32
