"""Qwen3-MoE: ragged vs dense experts, FLOPs, causality, sizes (HF parity and conversion:
tests/convert/test_qwen3_moe_hf.py)."""

import collections
import dataclasses
import functools
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src import ad_checkpoint   # saved_residuals: public only as a printer

from tests.fixtures import subprocess_env
from tests.fixtures.grouped import nan_past_the_groups
from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import configlib, models, platform
from tst_jax.errors import ConfigError
from tst_jax.kernels import grouped_matmul, moe_dispatch
from tst_jax.models import experts as moe_experts, llama, moe
from tst_jax.config import spec as spec_lib
from tst_jax.rundir import RunDir
from tst_jax.train import step as step_lib
from tst_jax.train.setup import Setup


# Shapes: B batch, L length, l bags, S bag size, D 32, E experts, K top-k, F expert width.
SMALL = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffw_dim=48,
             n_experts=8, n_experts_per_token=2, moe_ffw_dim=16, rope_theta=10_000.0)


def _close(a, b, tol=1e-5):
  """|a - b| <= tol * (|b| + max|b|, at least 1): float32 agreement relative to the scale."""
  scale = max(1.0, float(np.max(np.abs(b)))) if np.size(b) else 1.0
  np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


def _random(make, seed=0, std=0.3):
  """`make()`'s module with numpy-random parameters (norm scales near 1): no jitted init."""
  graphdef, state = nnx.split(nnx.eval_shape(make))
  rng = np.random.default_rng(seed)
  def fill(path, leaf):
    is_norm = any("norm" in str(k) for k in path)
    value = 1.0 + rng.uniform(-0.5, 0.5, leaf.shape) if is_norm else rng.normal(0, std, leaf.shape)
    return jnp.asarray(value, leaf.dtype)
  return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


def _split_call(layer):
  """A pure f(state, x) -> (out, aux) for an nnx layer."""
  graphdef, state = nnx.split(layer)
  return (lambda st, x: nnx.merge(graphdef, st)(x)), state


def _twin_layers(starve: bool, norm_topk_prob: bool, impl: str = "ragged",
                 dispatch: str = "gather"):
  """The same SparseMoE parameters behind the `impl` and the dense expert paths."""
  cfg = moe.MoEConfig(**SMALL, norm_topk_prob=norm_topk_prob, expert_impl=impl,
                      dispatch_impl=dispatch)
  ragged = _random(lambda: moe.SparseMoE(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0)))
  x_BxLxD = jax.random.normal(jax.random.key(1), (2, 12, cfg.dim))
  if starve:   # feature 0 is a constant 3 and experts 4..7 score -150 on it: never picked
    x_BxLxD = x_BxLxD.at[..., 0].set(3.0)
    ragged.router[...] = ragged.router[...].at[0, 4:].set(-50.0)
  dense_cfg = dataclasses.replace(cfg, expert_impl="dense")
  dense = nnx.merge(nnx.graphdef(nnx.eval_shape(
      lambda: moe.SparseMoE(dense_cfg, dtype=jnp.float32, rngs=nnx.Rngs(0)))), nnx.state(ragged))
  return cfg, ragged, dense, x_BxLxD


@pytest.mark.parametrize("impl", ["ragged", "gmm", "blocked"])
@pytest.mark.parametrize("starve,norm_topk_prob", [(False, True), (True, True), (False, False)])
def test_grouped_matches_dense_values_and_grads(starve, norm_topk_prob, impl, dispatch="gather"):
  cfg, ragged, dense, x_BxLxD = _twin_layers(starve, norm_topk_prob, impl, dispatch)
  f_ragged, state = _split_call(ragged)
  f_dense, _ = _split_call(dense)
  cotangent = jax.random.normal(jax.random.key(2), x_BxLxD.shape)

  def value_and_grads(f):   # output, aux, and grads of <out, ct> + lb wrt params and input
    def loss(st, x):
      out, aux = f(st, x)
      return jnp.sum(out * cotangent) + aux["lb_loss"], (out, aux)
    (_, (out, aux)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        state, x_BxLxD)
    return out, aux, grads

  out_r, aux_r, g_r = jax.jit(value_and_grads, static_argnums=0)(f_ragged)
  out_d, aux_d, g_d = jax.jit(value_and_grads, static_argnums=0)(f_dense)
  _close(out_r, out_d)
  assert float(jnp.max(jnp.abs(out_r))) > 0.1             # not trivially small
  jax.tree.map(_close, aux_r, aux_d)
  jax.tree.map(_close, g_r, g_d)
  assert float(jnp.max(jnp.abs(g_r[0]["router"][...]))) > 0
  if starve:   # experts 4..7 get no rows and no gradient; and eager (no jit) agrees
    _close(f_ragged(state, x_BxLxD)[0], out_r)
    np.testing.assert_array_equal(aux_r["expert_frac"][4:], 0.0)
    assert float(jnp.min(aux_r["expert_frac"][:4])) > 0
    np.testing.assert_array_equal(g_r[0]["gate_proj"][...][4:], 0.0)

  # z-loss and load balancing from their definitions
  logits_NxE = x_BxLxD.reshape(-1, cfg.dim) @ ragged.router[...]
  np.testing.assert_allclose(
      aux_r["z_loss"], jnp.mean(jax.nn.logsumexp(logits_NxE, axis=-1) ** 2), rtol=1e-5)
  np.testing.assert_allclose(jnp.sum(aux_r["expert_frac"]), cfg.n_experts_per_token, rtol=1e-6)


# ------------------------------------------------------------------ FLOPs, causality, sizes

@pytest.mark.parametrize("dispatch", moe_dispatch.IMPLS)
@pytest.mark.parametrize("impl", ["gmm", "blocked"])
def test_dispatch_impls_match_dense_values_and_grads(impl, dispatch):
  """Each way of moving rows (moe_dispatch.IMPLS) gives the per-token dense reference's output,
  statistics and gradients, starved experts included."""
  test_grouped_matches_dense_values_and_grads(True, True, impl, dispatch)


def _row_selects(jaxpr, rows: int) -> int:
  """Counts the selects over [rows, ...] matrices in `jaxpr` and the jaxprs inside it."""
  found = 0
  for eqn in jaxpr.eqns:
    shape = eqn.outvars[0].aval.shape if eqn.outvars else ()
    found += eqn.primitive.name == "select_n" and len(shape) == 2 and shape[0] == rows
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _row_selects(sub, rows)
  return found


@pytest.mark.parametrize("fuse_gate_up", [False, True])
@pytest.mark.parametrize("tile,rows", [(7, 49), (8, 48)])
def test_rows_past_the_groups_never_reach_a_gradient(fuse_gate_up, tile, rows, monkeypatch):
  """Grouped GEMMs leave the rows past their groups undefined, here NaN. In tiles of 7 rows,
  as tokamax's of 64, the 48 assignments take 49 rows: the one past them is zeroed in every
  product, and the layer's output, statistics and gradients are the dense per-token
  reference's, gate and up fused or not. In tiles of 8 they take exactly 48 rows: no row lies
  past the groups, which the layout knows before tracing, so no product selects rows at all.
  (Under expert parallelism: tests/parallel/test_mesh.py.)"""
  monkeypatch.setattr(grouped_matmul, "row_tile", lambda backend: tile)
  cfg, layer, dense, x_BxLxD = _twin_layers(True, True, "gmm", "pallas")
  f_dense, state = _split_call(dense)
  variant = functools.partial(moe_experts.experts_gmm, dispatch="pallas", fuse_gate_up=fuse_gate_up)
  cotangent = jax.random.normal(jax.random.key(4), x_BxLxD.shape)

  def value_and_grads(experts):
    def loss(st, x):
      weights, ids, aux = moe.route(x.reshape(-1, cfg.dim), st["router"][...], cfg)
      out = experts(x.reshape(-1, cfg.dim), ids, weights, st["gate_proj"][...],
                    st["up_proj"][...], st["down_proj"][...])
      return jnp.sum(out.reshape(x.shape) * cotangent) + aux["lb_loss"]
    return jax.value_and_grad(loss, argnums=(0, 1))

  jaxpr = jax.make_jaxpr(value_and_grads(variant))(state, x_BxLxD).jaxpr
  matmuls = 2 if fuse_gate_up else 3   # forward and dX of each, and dY before each dW
  assert _row_selects(jaxpr, rows) == (3 * matmuls if rows > 48 else 0)
  written = nan_past_the_groups(monkeypatch)
  (value, got), (want_value, want) = (jax.jit(value_and_grads(e))(state, x_BxLxD)
                                      for e in (variant, moe_experts.experts_dense))
  assert written and set(written) == {rows}
  _close(value, want_value)
  jax.tree.map(_close, got, want)
  assert float(jnp.abs(got[0]["up_proj"][...]).max()) > 0


@pytest.mark.parametrize("routing", ["balanced", "skewed"])
def test_capacity_matches_dense_values_and_grads_and_logs_its_overflow(routing, monkeypatch):
  """expert_impl=capacity with C rounded to tiles of 8 rather than 128 (C = 8 for these 48
  assignments over 8 experts): the rows past C run as grouped GEMMs, whose rows past their
  groups are NaN here, and the output, statistics and gradients are the dense per-token
  reference's, with balanced routing (4 of the 48 past C) and skewed (experts 4..7 get none:
  17 past C on the others); `moe/overflow` is the share past C."""
  monkeypatch.setattr(moe_dispatch, "CAPACITY_TILE", 8)
  written = nan_past_the_groups(monkeypatch)
  cfg, layer, dense, x_BxLxD = _twin_layers(routing == "skewed", True, "capacity")
  cfg = dataclasses.replace(cfg, expert_capacity_factor=1.0)
  layer.cfg = cfg
  f_layer, state = _split_call(layer)
  f_dense, _ = _split_call(dense)
  cotangent = jax.random.normal(jax.random.key(2), x_BxLxD.shape)

  def value_and_grads(f):
    def loss(st, x):
      out, aux = f(st, x)
      return jnp.sum(out * cotangent) + aux["lb_loss"], aux
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(state, x_BxLxD)

  ((value, aux), grads), ((want_value, want_aux), want) = (value_and_grads(f_layer),
                                                           value_and_grads(f_dense))
  _close(value, want_value)
  jax.tree.map(_close, grads, want)
  _close(aux["lb_loss"], want_aux["lb_loss"])
  counts = np.asarray(aux["expert_frac"]) * x_BxLxD.shape[0] * x_BxLxD.shape[1]
  share = np.sum(np.maximum(counts - 8, 0)) / 48
  np.testing.assert_allclose(aux["overflow"], share, rtol=1e-6)
  assert share > 0 and written and set(written) == {40}     # 8 x 8 slots, then 48 - 8 rows
  assert round(share * 48) == {"balanced": 4, "skewed": 17}[routing], share * 48
  abstract = nnx.eval_shape(lambda: moe.Qwen3MoE(cfg, rngs=nnx.Rngs(0)))
  _, metrics = abstract.aux_loss(jax.tree.map(lambda a: jnp.stack([a, a]), aux))
  np.testing.assert_allclose(metrics["moe/overflow"], share, rtol=1e-6)


@pytest.mark.parametrize("dispatch", moe_dispatch.IMPLS)
def test_dispatch_impls_in_bfloat16_stay_near_float32(dispatch):
  """In bf16 compute, each way of moving rows stays within bf16's tolerance of the float32
  dense reference, output and input gradient: a relative error near 2^-8, far from 1."""
  cfg, layer, dense, x_BxLxD = _twin_layers(False, True, "gmm", dispatch)
  bf16 = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: moe.SparseMoE(
      cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))), nnx.state(layer))
  f_bf16, state = _split_call(bf16)
  f_dense, _ = _split_call(dense)
  cotangent = jax.random.normal(jax.random.key(3), x_BxLxD.shape)

  def out_and_dx(f):
    out, vjp = jax.vjp(lambda x: f(state, x)[0].astype(jnp.float32), x_BxLxD)
    return out, vjp(cotangent)[0]

  for got, want in zip(jax.jit(out_and_dx, static_argnums=0)(f_bf16),
                       jax.jit(out_and_dx, static_argnums=0)(f_dense)):
    error = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert error < 2e-2, (dispatch, error)


def _matmul_flops(jaxpr) -> float:
  """Multiply-add FLOPs of dot_general and ragged_dot_general (each row through one group).
  A ragged contraction (the grouped weight gradient, out [E, I, O] from rows split into E
  groups) does each row once: its out·rows product is divided by the E groups."""
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "ragged_dot_general"):
      lhs = eqn.invars[0].aval
      ragged = eqn.params.get("ragged_dot_dimension_numbers")
      dims = eqn.params.get("dimension_numbers") or ragged.dot_dimension_numbers
      contract = math.prod(lhs.shape[i] for i in dims[0][0])
      groups = 1
      if ragged is not None and set(ragged.lhs_ragged_dimensions) & set(dims[0][0]):
        groups = eqn.invars[2].aval.shape[0]     # group sizes [E]
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * contract / groups
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      total += _matmul_flops(sub)
  return total


def test_compiled_flops_scale_with_active_not_total_params():
  """XLA's cost analysis of the compiled MoE layer, forward and forward+backward, as E grows
  16x at fixed top-k: the blocked experts stay within a constant factor of the active
  matmul FLOPs (2·N·(D·E router + K·3·D·F experts)); the dense reference grows with E."""
  x_BxLxD = jnp.ones((8, 64, SMALL["dim"]))
  n, d, f, k = 8 * 64, SMALL["dim"], SMALL["moe_ffw_dim"], SMALL["n_experts_per_token"]
  ratios = {}
  for impl, experts in [("blocked", (8, 32, 128)), ("dense", (8, 32))]:
    for e in experts:
      cfg = moe.MoEConfig(**{**SMALL, "n_experts": e}, expert_impl=impl)
      layer, state = _split_call(_random(lambda: moe.SparseMoE(cfg, dtype=jnp.float32,
                                                               rngs=nnx.Rngs(0))))
      forward = lambda st, x: layer(st, x)[0]
      train = jax.grad(lambda st, x: jnp.sum(forward(st, x) ** 2))
      active = 2 * n * (d * e + k * 3 * d * f)
      fns = (forward, train) if impl == "blocked" else (forward,)
      ratios[impl, e] = [jax.jit(fn).lower(state, x_BxLxD).compile().cost_analysis()["flops"]
                         / active for fn in fns]
  # Blocked: the K·N rows plus at most 25% padding (E blocks) plus elementwise work;
  # training (forward + two backward matmuls per matmul) is ~3x the forward.
  for e in (8, 32, 128):
    fwd, fwd_bwd = ratios["blocked", e]
    assert 1.0 <= fwd <= 1.5 and 2.5 <= fwd_bwd <= 3.5, (e, fwd, fwd_bwd)
  # Dense: every expert on every token, so per active FLOP the cost grows with E/K.
  assert ratios["dense", 32][0] / ratios["dense", 8][0] > 3


def test_ragged_program_does_active_matmul_work():
  """The ragged program's matmuls (what a grouped-GEMM backend, TPU or GPU, executes) see
  the N·K sorted rows whatever E is; only the router grows. XLA:CPU itself expands
  ragged_dot to a zero-masked matmul over every group (see docs/performance.md)."""
  x_BxLxD = jnp.ones((4, 32, SMALL["dim"]))
  counted = {}
  for e in (8, 32):
    cfg = moe.MoEConfig(**{**SMALL, "n_experts": e}, expert_impl="ragged")
    layer, state = _split_call(_random(lambda: moe.SparseMoE(cfg, dtype=jnp.float32,
                                                             rngs=nnx.Rngs(0))))
    counted[e] = _matmul_flops(jax.make_jaxpr(lambda st, x: layer(st, x)[0])(state,
                                                                            x_BxLxD).jaxpr)
  n_tokens = x_BxLxD.shape[0] * x_BxLxD.shape[1]
  assert counted[32] - counted[8] == 2 * n_tokens * SMALL["dim"] * (32 - 8)
  k = SMALL["n_experts_per_token"]    # router, K·(gate, up, down); the top-k weighted sum
  assert counted[8] == 2 * n_tokens * SMALL["dim"] * (8 + k * 3 * SMALL["moe_ffw_dim"])  # is
                                      # element-wise (kernels/moe_dispatch), not a matmul


def test_gmm_program_does_active_matmul_work_forward_and_backward():
  """expert_impl=gmm, differentiated: the grouped GEMMs of the forward (3), dX (3) and dW (3,
  each a ragged contraction over the rows) all see the N·K sorted rows whatever E is; as E
  grows 4x only the router's three matmuls (forward, dX, dW) grow. XLA:CPU compiles ragged_dot
  to a masked dense matmul, so this counts the program a grouped-GEMM backend runs."""
  x_BxLxD = jnp.ones((4, 32, SMALL["dim"]))
  n, d, f = 4 * 32, SMALL["dim"], SMALL["moe_ffw_dim"]
  k = SMALL["n_experts_per_token"]
  counted = {}
  for e in (8, 32):
    cfg = moe.MoEConfig(**{**SMALL, "n_experts": e}, expert_impl="gmm")
    layer, state = _split_call(_random(lambda: moe.SparseMoE(cfg, dtype=jnp.float32,
                                                             rngs=nnx.Rngs(0))))
    train = jax.grad(lambda st, x: jnp.sum(layer(st, x)[0] ** 2), argnums=(0, 1))
    counted[e] = _matmul_flops(jax.make_jaxpr(train)(state, x_BxLxD).jaxpr)
  assert counted[32] - counted[8] == 3 * 2 * n * d * (32 - 8)
  experts = 3 * 2 * (n * k) * 3 * d * f           # 3 GEMMs, each forward + dX + dW
  router = 3 * 2 * n * d * 8
  assert counted[8] == experts + router   # combine and dispatch: gathers and sums, no dot


def test_bags_run_and_are_causal_by_gradients():
  cfg = moe.MoEConfig(**{**SMALL, "n_layers": 3}, mlp_only_layers=(0,))
  model = _random(lambda: moe.Qwen3MoE(cfg, rngs=nnx.Rngs(0)), std=0.1)
  n_bags, bag = 5, 3
  bags_BxlxS = jnp.arange(n_bags * bag, dtype=jnp.int32).reshape(1, n_bags, bag) * 4 + 1
  graphdef, params = nnx.split(model)

  def hidden_per_bag(p):   # [l]: each bag's summed final hidden state; and the logits
    m = nnx.merge(graphdef, p)
    h_BxlxD, _ = m.forward(bags_BxlxS)
    return h_BxlxD[0].sum(-1), m.logits(h_BxlxD)

  @jax.jit
  def jacobian(p):   # [l, V, D]; lax.map, not vmap: ragged_dot has no batching rule off axis 0
    _, vjp, logits = jax.vjp(hidden_per_bag, p, has_aux=True)
    return jax.lax.map(lambda ct: vjp(ct)[0]["embed"]["table"][...], jnp.eye(n_bags)), logits
  jac, logits = jacobian(params)
  assert logits.shape == (1, n_bags, cfg.vocab_size)
  touched_jxV = jnp.any(jac != 0, axis=-1)
  for j in range(n_bags):
    for i in range(n_bags):
      assert bool(jnp.all(touched_jxV[j, bags_BxlxS[0, i]])) == (i <= j), (j, i)


def test_stage_units_keep_the_stack_scanned():
  dense, sparse = False, True
  assert moe.stage_units((dense, sparse, sparse, sparse)) == (((dense,), 1), ((sparse,), 3))
  assert moe.stage_units((dense, sparse) * 3) == (((dense, sparse), 3),)
  assert moe.stage_units((sparse,) * 48) == (((sparse,), 48),)
  cfg = moe.MoEConfig(**{**SMALL, "n_layers": 6}, decoder_sparse_step=3)
  assert cfg.sparse_layers() == (dense, dense, sparse) * 2
  assert moe.stage_units(cfg.sparse_layers()) == (((dense, dense, sparse), 2),)


def test_param_counts_10b_a1b():
  cfg = moe.MoEConfig(**moe.PRESETS["10b_a1b"])
  total, active = cfg.param_counts()
  assert abs(total / 10e9 - 1) < 0.1 and abs(active / 1e9 - 1) < 0.1, (total, active)
  # Active = matmul params of the 6N rule + the embedding lookup + norms.
  norms = (2 * cfg.n_layers + 1) * cfg.dim + 2 * cfg.n_layers * cfg.head_dim
  assert active == cfg.matmul_params() + cfg.vocab_size * cfg.dim + norms
  attention = 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 4096   # llama's formula
  assert cfg.flops_per_token(4096) == 6.0 * cfg.matmul_params() + attention
  tiny = moe.MoEConfig(**moe.PRESETS["tiny_moe"])
  assert tiny.param_counts() == (2_823_552, 1_643_904)


def _float_row_scatters(hlo_text: str, dim: int) -> list[str]:
  """The floating-point scatters over [.., D] rows in an optimized HLO module, the embedding's
  [V, D] gradient (under the `embed` name scope) aside: one line each."""
  found = []
  for line in hlo_text.splitlines():
    m = re.search(r"=\s*(bf16|f16|f32|f64|f8\w*)\[([\d,]+)\]\S*\s+scatter\(", line)
    op_name = re.search(r'op_name="([^"]*)"', line)
    if m and int(m.group(2).split(",")[-1]) == dim and not (op_name and re.search(
        r"[(/]embed\)", op_name.group(1))):
      found.append(line.strip()[:160])
  return found


def test_gmm_train_step_has_no_float_row_scatters():
  """Dispatch and combine are permutations, so their transposes are gathers too: the compiled
  NTP train step of configs/tiny_moe.py with expert_impl=gmm holds no floating-point scatter
  over [rows, D] (before: two, the autodiff transposes of the dispatch and combine gathers);
  the embedding's [V, D] gradient is the one left, and is found (the check can fail)."""
  config = configlib.load_config(os.path.join(ROOT, "configs", "tiny_moe.py"))
  config.model.expert_impl = "gmm"
  spec = spec_lib.build(config)
  phase = next(p for p in spec.plan.phases if p.name == "ntp")
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       trainer.abstract, trainer.shardings)
  window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32,
                                sharding=trainer.batch_sharding)
  hlo = (trainer.train_step(phase).lower(state, window)
         .compile(subprocess_env.users_emitters()).as_text())
  assert _float_row_scatters(hlo, spec.model.dim) == []
  embedding = [line for line in hlo.splitlines() if re.search(r"\sscatter\(", line)
               and "(embed)" in line and f"[{spec.model.vocab_size},{spec.model.dim}]" in line]
  assert len(embedding) == 1, embedding


def _primitive_counts(jaxpr, counts=None):
  counts = collections.Counter() if counts is None else counts
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] += 1
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _primitive_counts(sub, counts)
  return counts


@pytest.mark.parametrize("impl", ["gmm", "blocked"])
def test_save_experts_keeps_the_grouped_gemm_outputs(impl):
  """remat=save_experts: the backward reruns neither the sort nor the expert matmuls (their
  outputs and the routing are saved by name), save_dots reruns both; same loss and gradients."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, SMALL["vocab_size"], (2, 8)))
  grads, counts, saved = {}, {}, {}
  for remat in ("save_dots", "save_experts"):
    cfg = moe.MoEConfig(**SMALL, expert_impl=impl, remat=remat)
    graphdef, params = nnx.split(_random(lambda: moe.Qwen3MoE(cfg, rngs=nnx.Rngs(0))))
    loss = lambda p: jnp.sum(jnp.sin(nnx.merge(graphdef, p).forward(tokens)[0]))
    grads[remat] = jax.jit(jax.grad(loss))(params)
    counts[remat] = _primitive_counts(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    saved[remat] = [tuple(aval.shape) for aval, _ in ad_checkpoint.saved_residuals(loss, params)]
  a, f, d = 2 * 8 * SMALL["n_experts_per_token"], SMALL["moe_ffw_dim"], SMALL["dim"]
  matmul = "ragged_dot_general" if impl == "gmm" else "dot_general"
  assert counts["save_dots"]["sort"] == 2 * counts["save_experts"]["sort"] == 4
  assert counts["save_dots"][matmul] - counts["save_experts"][matmul] == 3   # the forward's 3
  if impl == "gmm":   # [layers, A, F] twice and [layers, A, D] kept, only with save_experts
    layers = SMALL["n_layers"]
    assert saved["save_experts"].count((layers, a, f)) == 2
    assert (layers, a, d) in saved["save_experts"]
    assert (layers, a, f) not in saved["save_dots"]
  # The same sums in another order: XLA:CPU's loop emitters (the tests' fast_compile_flags)
  # fuse the two programs differently, a few ulps of float32 apart.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
               grads["save_dots"], grads["save_experts"])


@pytest.mark.parametrize("impl", ["gmm", "ragged", "capacity"])
def test_the_config_fuses_gate_and_up_to_the_same_loss_and_grads(impl):
  """model.expert_fuse_gate_up=on runs gate and up as one grouped GEMM in the whole model
  (one forward product fewer in the layers' jaxpr), with the loss and gradients of the
  unfused model, save_experts' saved outputs included; with an expert_impl that has no grouped
  GEMM it is one ConfigError naming the field; a bool, as config.json of earlier runs holds
  it, reads as on or off."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, SMALL["vocab_size"], (2, 8)))
  results, counts = {}, {}
  for fuse in ("off", "on"):
    cfg = moe.MoEConfig(**SMALL, expert_impl=impl, remat="save_experts",
                        expert_fuse_gate_up=fuse)
    graphdef, params = nnx.split(_random(lambda: moe.Qwen3MoE(cfg, rngs=nnx.Rngs(0))))
    loss = lambda p: jnp.sum(jnp.sin(nnx.merge(graphdef, p).forward(tokens)[0]))
    results[fuse] = jax.jit(jax.value_and_grad(loss))(params)
    counts[fuse] = _primitive_counts(jax.make_jaxpr(loss)(params).jaxpr)
  matmul = "dot_general" if impl == "capacity" else "ragged_dot_general"   # C >= A here
  assert counts["off"][matmul] - counts["on"][matmul] == 1   # in the scanned layers' body
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
               results["off"], results["on"])
  blocked = moe.MoEConfig(**SMALL, expert_impl="blocked", expert_fuse_gate_up="on")
  with pytest.raises(ConfigError, match="fuses the grouped GEMMs of expert_impl gmm, ragged, "
                                        "capacity; this run's is blocked") as e:
    platform.resolve(blocked, "naive", "cpu")
  assert e.value.field == "model.expert_fuse_gate_up"
  assert [moe.MoEConfig(**SMALL, expert_fuse_gate_up=b).expert_fuse_gate_up
          for b in (True, False)] == ["on", "off"]
  with pytest.raises(ConfigError, match=r"model.expert_fuse_gate_up: must be one of \('auto', "
                                        r"'on', 'off'\), got 'True'"):
    moe.MoEConfig(**SMALL, expert_fuse_gate_up="True")


def test_fused_gate_up_is_auto_only_where_a_train_step_measured_it_faster(monkeypatch):
  """expert_fuse_gate_up=auto: off where no train step measured fused against split (a layer
  alone does not decide it), on where one measured fused faster on this GPU, off where slower
  or where the expert_impl has nothing to fuse; a run's record of it goes back to auto."""
  kind = "NVIDIA H200"
  assert platform.fuse_gate_up("auto", "gmm", "gpu", kind) == (
      "off", f"no train step measured gate and up fused against split on {kind}: gpu.sh "
             "moe_lab steps both (docs/performance.md)")
  monkeypatch.setitem(platform._FUSED_STEP, "H200", (0.170, 0.180, "a test's step"))
  value, why = platform.fuse_gate_up("auto", "gmm", "gpu", kind)
  assert value == "on" and why == "a train step took 0.170 s fused, 0.180 s split (a test's step)"
  assert platform.fuse_gate_up("auto", "gmm", "gpu", "NVIDIA H100 80GB HBM3")[0] == "off"
  assert platform.fuse_gate_up("auto", "blocked", "gpu", kind) == (
      "off", "expert_impl blocked has no grouped GEMM to fuse")
  assert platform.fuse_gate_up("auto", "gmm", "cpu")[0] == "off"
  monkeypatch.setitem(platform._FUSED_STEP, "H200", (0.190, 0.180, "a test's step"))
  assert platform.fuse_gate_up("auto", "capacity", "gpu", kind)[0] == "off"
  cfg = moe.MoEConfig(**SMALL, expert_impl="gmm")
  resolved = platform.resolved_model(cfg, platform.resolve(cfg, "naive", "cpu"))
  assert resolved.expert_fuse_gate_up == "off"
  assert platform.unresolved(resolved, "model").expert_fuse_gate_up == "auto"


@pytest.mark.slow
def test_a_runs_loss_with_gate_and_up_fused_and_no_tail_selects_is_the_old_paths(tmp_path,
                                                                               monkeypatch):
  """Four bf16 train steps of a small MoE on the same batches from the same state: gmm with gate
  and up fused and no tail selects (its buffer is exactly the N·P rows: what `auto` picks on a
  GPU once a step measures fusion faster), against gmm unfused with every select (the path
  before): the same losses and gradient norms within bf16's noise."""
  config = tiny_config(steps=4, ratio=0.0, bag_size=1, data=dict(batch_size=4))
  config.model = models.preset_config("qwen3_moe", "tiny_moe", vocab_size=512, dim=32,
                                      n_layers=2, n_heads=2, n_kv_heads=2, ffw_dim=64,
                                      n_experts=4, n_experts_per_token=2, moe_ffw_dim=32,
                                      dtype="bfloat16", expert_impl="gmm", init_std=0.2)
  always_selects = grouped_matmul.grouped_matmul
  losses, init = {}, None
  for path in ("before", "fused"):
    config.model.expert_fuse_gate_up = "on" if path == "fused" else "off"
    with monkeypatch.context() as patch:
      if path == "before":
        patch.setattr(grouped_matmul, "grouped_matmul",
                      lambda x, w, sizes, backend, kernels, tail: always_selects(
                          x, w, sizes, backend, kernels, tail=True))
      run = Setup.create(spec_lib.build(config), RunDir(str(tmp_path)))   # one corpus
      (phase,) = run.spec.plan.phases
      state = (run.trainer.init_state(config.seed) if init is None
               else jax.device_put(init, run.trainer.shardings))
      init = init or jax.device_get(state)
      step, batches = jax.jit(run.trainer.train_step(phase)), run.batches(phase, 0)
      losses[path] = []
      for _ in range(4):
        state, metrics = step(state, next(batches))
        losses[path].append((float(metrics["loss"]), float(metrics["grad_norm"])))
  assert losses["before"][0][0] > 5 and losses["before"][-1][0] < losses["before"][0][0]
  # bf16's precision, 2^-8: the paths round differently (6e-4 of the loss and 3e-3 of the
  # gradient's norm apart by the fourth step here); gate and up swapped in the fused path
  # would be 3% apart from the first.
  np.testing.assert_allclose(losses["fused"], losses["before"], rtol=2 ** -8)
