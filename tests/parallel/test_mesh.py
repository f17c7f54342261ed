"""Meshes on 8 host CPU devices: the same losses as one device, FSDP memory, clear errors."""

import dataclasses
import functools
import math
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures import gpu_target
from tests.fixtures.grouped import nan_past_the_groups
from tests.fixtures.tiny import tiny_config
from tst_jax import models
from tst_jax.kernels import moe_dispatch, moe_gather, target
from tst_jax.models import experts as moe_experts
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules
from tst_jax.rundir import RunDir
from tst_jax.train import checkpoint as ckpt_lib
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax import optim
from tst_jax.train import step as step_lib
from tst_jax.train.setup import Setup
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES

AXES = ("data", "fsdp", "tensor", "expert")


def mesh_config(mesh=(1, 1, 1, 1), family="llama", grad_accum=1, loss_impl="naive"):
  """The tiny two-phase run (3 + 3 steps) on `mesh`; 16 rows so every batch axis divides."""
  c = tiny_config(steps=6, data=dict(batch_size=16), optimizer=dict(grad_accum=grad_accum),
                  loss=dict(impl=loss_impl))
  if family == "qwen3_moe":
    c.model = models.preset_config("qwen3_moe", "tiny_moe", vocab_size=512, dim=32,
                                   n_layers=2, n_heads=2, n_kv_heads=2, ffw_dim=64,
                                   n_experts=4, n_experts_per_token=2, moe_ffw_dim=32)
  else:
    c.model.n_kv_heads = 2          # K must divide over the tensor axis
  c.mesh.update(dict(zip(AXES, mesh)))
  return c


def train_losses(config, workdir, init=None):
  """Both phases step by step through the run's own mesh, shardings and sharded batches.

  Returns (per-step losses, first batch of each phase, final state). `init` (a host copy of
  a TrainState) is put on the mesh instead of a sharded init, to save its compilation.
  """
  run = Setup.create(spec_lib.build(config), RunDir(workdir))
  plan = run.spec.plan
  if init is None:
    state = run.trainer.init_state(config.seed)
  else:
    state = jax.device_put(init, run.trainer.shardings)
  losses, firsts = [], []
  for phase in plan.phases:
    step = run.trainer.train_step(phase)     # the loop's step: the run's loss and grad_accum
    batches = run.batches(phase, phase.first_step)
    batch = next(batches)
    firsts.append(batch)
    compiled = step.lower(state, batch).compile()
    for i in range(phase.steps):
      state, metrics = compiled(state, batch if i == 0 else next(batches))
      losses.append(float(metrics["loss"]))
  return np.array(losses), firsts, state


@pytest.fixture
def no_persistent_cache():
  """Compile afresh: jaxlib 0.10.2's XLA:CPU deadlocks in the collectives of the expert-
  parallel train step when it is loaded from the persistent compilation cache (a fresh
  compile of the same program runs correctly; docs/distributed.md)."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  cc.reset_cache()
  yield
  jax.config.update("jax_enable_compilation_cache", before)
  cc.reset_cache()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One device per family: (initial state on the host, per-step losses)."""
  cache = {}

  def get(family):
    if family not in cache:
      config = mesh_config(family=family)
      run = Setup.create(spec_lib.build(config), RunDir(str(tmp_path_factory.mktemp("init"))))
      init = jax.device_get(run.trainer.init_state(config.seed))
      losses, _, _ = train_losses(config, tmp_path_factory.mktemp(family), init)
      cache[family] = init, losses
    return cache[family]
  return get


@pytest.mark.parametrize("mesh,family,grad_accum,loss_impl", [
    pytest.param((8, 1, 1, 1), "llama", 1, "naive", marks=pytest.mark.slow),
    ((1, 8, 1, 1), "llama", 1, "naive"),
    # and 2 micro-batches of 8 rows, each sharded
    pytest.param((2, 4, 1, 1), "llama", 2, "naive", marks=pytest.mark.slow),
    ((1, 4, 2, 1), "llama", 1, "xla"),      # the fused loss's shard_map, vocab over tensor
    # The experts' shard_map, compiled afresh (no_persistent_cache): the longest case, so
    # slow; test_expert_parallel_shard_map_matches_one_device checks its values and gradients.
    pytest.param((4, 1, 1, 2), "qwen3_moe", 1, "naive", marks=pytest.mark.slow),
    # The experts whole, each device's own tokens in the shard_map: the load-balancing loss
    # stays the whole batch's. Slow for its two compiles of the MoE;
    # test_expert_parallel_shard_map_matches_one_device checks each expert_impl there.
    pytest.param((2, 4, 1, 1), "qwen3_moe", 1, "naive", marks=pytest.mark.slow),
], ids=["data8", "fsdp8", "data2_fsdp4_accum2", "fsdp4_tensor2_fused", "moe_data4_expert2",
        "moe_data2_fsdp4"])
def test_mesh_trains_like_one_device(mesh, family, grad_accum, loss_impl, reference, tmp_path,
                                     record_property, request):
  if mesh[3] > 1:
    request.getfixturevalue("no_persistent_cache")
  init, expected = reference(family)      # one device, naive loss
  config = mesh_config(mesh, family, grad_accum, loss_impl)
  losses, firsts, state = train_losses(config, tmp_path, init)
  # Phase 1 (bagged windows, 2L + 1 tokens) and phase 2 shard their rows the same way.
  for batch, window in zip(firsts, (33, 17)):
    assert batch.shape == (16, window)
    n = mesh[0] * mesh[1] * mesh[3]        # data x fsdp x expert shard the batch
    assert {s.data.shape for s in batch.addressable_shards} == {(16 // n, window)}
  # Parameters live on the mesh as the logical rules say: D over fsdp, H over tensor, E over
  # expert.
  if family == "llama":
    q = state.params["blocks"]["attn"]["q_proj"][...]             # [layers, D, H, G]
    assert q.addressable_shards[0].data.shape == (2, 32 // mesh[1], 2 // mesh[2], 16)
  else:
    experts = [x for x in jax.tree.leaves(state.params) if "expert" in str(x.sharding.spec)]
    assert experts and all(x.addressable_shards[0].data.shape[1] == 4 // mesh[3]
                           for x in experts)                      # [layers, E, ...]
  record_property("max_abs_loss_diff", float(np.abs(losses - expected).max()))
  np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-4)
  assert len(losses) == 6 and np.all(np.isfinite(losses))


def sort_lengths(jaxpr) -> list[int]:
  """Returns the operand length of every sort in `jaxpr` and the jaxprs inside it."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sort":
      found.append(eqn.invars[0].aval.shape[0])
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += sort_lengths(sub)
  return found


@pytest.mark.parametrize("impl,dispatch", [("ragged", "gather"), ("gmm", "gather"),
                                           ("blocked", "gather"), ("dense", "gather")])
@pytest.mark.parametrize("mesh,batch_axes", [
    ((4, 1, 1, 2), ("data", "fsdp", "expert")),   # tokens split over experts: gather, scatter
    ((1, 2, 2, 2), ("data", "fsdp", "expert")),   # and expert weights split over tensor
    ((2, 1, 1, 4), ("data", "fsdp")),             # tokens replicated over experts: psum
    ((8, 1, 1, 1), ("data", "fsdp", "expert")),   # experts whole: each device its own tokens
    ((1, 8, 1, 1), ("data", "fsdp", "expert")),
], ids=["data4_expert2", "fsdp2_tensor2_expert2", "replicated_tokens_expert4", "data8", "fsdp8"])
def test_expert_parallel_shard_map_matches_one_device(mesh, batch_axes, impl, dispatch):
  """The experts' shard_map gives the unsharded dense reference's output and gradients. Each
  device sorts the assignments of its own tokens, N·P/shards of them, or of its expert group's
  where tokens are gathered over expert shards, and runs E/ep experts (F/tp wide) with explicit
  collectives; with the experts whole there are none."""
  e, d, f, k, n = 8, 16, 24, 2, 64
  keys = jax.random.split(jax.random.key(0), 5)
  x_NxD = jax.random.normal(keys[0], (n, d))
  experts = [jax.random.normal(kk, shape) * 0.3 for kk, shape in
             zip(keys[1:4], [(e, d, f), (e, d, f), (e, f, d)])]
  router_NxE = jax.random.normal(keys[4], (n, e)).at[:, 3].add(-100.0)   # expert 3 gets none
  weights_NxK, ids_NxK = jax.lax.top_k(jax.nn.softmax(router_NxE), k)

  def loss(experts_fn, x, w, *weights):
    return jnp.sum(jnp.sin(experts_fn(x, ids_NxK, w, *weights)))

  grad = jax.grad(loss, argnums=(1, 2, 3, 4, 5))
  expected = grad(moe_experts.experts_dense, x_NxD, weights_NxK, *experts)
  run_mesh = mesh_lib.make_mesh(mesh_config(mesh).mesh)
  rules = (("batch", batch_axes),) + LOGICAL_AXIS_RULES[1:]
  sharded = functools.partial(moe_experts.experts_sharded, moe_experts.expert_fn(impl, dispatch))
  with axis_rules(run_mesh, rules):
    got = jax.jit(grad, static_argnums=0)(sharded, x_NxD, weights_NxK, *experts)
    jaxpr = jax.make_jaxpr(sharded)(x_NxD, ids_NxK, weights_NxK, *experts)
    hlo = jax.jit(sharded).lower(x_NxD, ids_NxK, weights_NxK, *experts).as_text()
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * (1 + float(jnp.abs(b).max())))
  assert float(jnp.abs(expected[2][3]).max()) == 0 and float(jnp.abs(got[2][3]).max()) == 0
  # Inside the shard_map: each device's tokens, the local expert weights, the sort of the
  # assignments it lays out, and the collectives that move tokens.
  shards = math.prod(mesh[AXES.index(a)] for a in batch_axes)
  gathered = mesh[3] if "expert" in batch_axes else 1
  assert sort_lengths(jaxpr.jaxpr) == ([] if impl == "dense" else
                                       [n * k * gathered // shards] * 2)   # order, inverse
  (inner,) = [q for q in jaxpr.jaxpr.eqns if q.primitive.name == "shard_map"]
  local_shapes = [v.aval.shape for v in inner.params["jaxpr"].invars]
  assert local_shapes[0] == (n // shards, d)
  assert local_shapes[3] == (e // mesh[3], d, f // mesh[2])
  collectives = {c for c in ("all_gather", "reduce_scatter", "all_reduce")
                 if f"stablehlo.{c}" in hlo}
  ep_collectives = {"all_gather", "reduce_scatter"} if "expert" in batch_axes else {"all_reduce"}
  assert collectives == (set() if mesh[2] == mesh[3] == 1 else
                         ep_collectives | ({"all_reduce"} if mesh[2] > 1 else set()))


@pytest.mark.parametrize("impl", ["gmm", "capacity"])
def test_expert_parallel_rows_past_the_groups_never_reach_a_gradient(impl, monkeypatch):
  """Under expert parallelism another shard's assignments leave rows past the groups, as many
  as the routing decides: their selects stay, so NaN written there by the grouped GEMMs (a
  kernel leaves them undefined) reaches no output and no gradient, weights' included; with C
  in tiles of 4 rather than 128, capacity's rows past C run as grouped GEMMs too."""
  monkeypatch.setattr(moe_dispatch, "CAPACITY_TILE", 4)
  written = nan_past_the_groups(monkeypatch)
  test_expert_parallel_shard_map_matches_one_device((4, 1, 1, 2), ("data", "fsdp", "expert"),
                                                    impl, "gather")
  assert written


@pytest.mark.parametrize("routing", ["balanced", "skewed"])
@pytest.mark.parametrize("mesh,batch_axes", [
    ((4, 1, 1, 2), ("data", "fsdp", "expert")), ((8, 1, 1, 1), ("data", "fsdp")),
    ((2, 4, 1, 1), ("data", "fsdp"))], ids=["data4_expert2", "data8", "data2_fsdp4"])
def test_capacity_on_8_devices_matches_the_per_token_reference(mesh, batch_axes, routing,
                                                               monkeypatch):
  """expert_impl=capacity on 8 devices, with expert parallelism and without, balanced and
  skewed routing: the unsharded dense reference's output and gradients. C in tiles of 4 and a
  capacity factor of 0.5 send many assignments past C; skewed routing (experts 0 and 5 favoured)
  sends most of theirs. Each device lays out its own tokens, or its expert group's, with its
  own C: the overflow share counts past each group's C."""
  monkeypatch.setattr(moe_dispatch, "CAPACITY_TILE", 4)
  e, d, f, k, n = 8, 16, 24, 2, 64
  keys = jax.random.split(jax.random.key(1), 5)
  x_NxD = jax.random.normal(keys[0], (n, d))
  experts = [jax.random.normal(kk, shape) * 0.3 for kk, shape in
             zip(keys[1:4], [(e, d, f), (e, d, f), (e, f, d)])]
  router_NxE = jax.random.normal(keys[4], (n, e))
  if routing == "skewed":
    router_NxE = router_NxE.at[:, jnp.asarray([0, 5])].add(3.0)
  weights_NxK, ids_NxK = jax.lax.top_k(jax.nn.softmax(router_NxE), k)
  counts = np.bincount(np.asarray(ids_NxK).reshape(-1), minlength=e)
  assert counts.max() > moe_dispatch.capacity_rows(n * k, e, 0.5)   # some past C

  def loss(experts_fn, x, w, *weights):
    return jnp.sum(jnp.sin(experts_fn(x, ids_NxK, w, *weights)))

  grad = jax.grad(loss, argnums=(1, 2, 3, 4, 5))
  expected = grad(moe_experts.experts_dense, x_NxD, weights_NxK, *experts)
  rules = (("batch", batch_axes),) + LOGICAL_AXIS_RULES[1:]
  sharded = functools.partial(moe_experts.experts_sharded, moe_experts.expert_fn("capacity", "gather",
                                                                 capacity_factor=0.5))
  with axis_rules(mesh_lib.make_mesh(mesh_config(mesh).mesh), rules):
    got = jax.jit(grad, static_argnums=0)(sharded, x_NxD, weights_NxK, *experts)
    overflow = moe_experts.capacity_overflow(ids_NxK, e, 0.5)
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * (1 + float(jnp.abs(b).max())))
  # The groups: 8 devices' 8 tokens each, or 4 expert groups' 16 (rows in device order).
  groups = 4 if "expert" in batch_axes else 8
  c = moe_dispatch.capacity_rows(n * k // groups, e, 0.5)
  past = sum(np.maximum(np.bincount(g.reshape(-1), minlength=e) - c, 0).sum()
             for g in np.split(np.asarray(ids_NxK), groups))
  assert past > 0
  np.testing.assert_allclose(overflow, past / (n * k), rtol=1e-6)


@pytest.mark.parametrize("batch_axes,want", [
    (("data", "fsdp", "expert"), [[0, 1], [2, 3], [4, 5], [6, 7]]),  # expert minor: neighbours
    (("expert", "data", "fsdp"), [[0, 4], [1, 5], [2, 6], [3, 7]]),  # expert major: strided
    (("data", "fsdp"), [[0, 1], [2, 3], [4, 5], [6, 7]]),             # tokens not over experts
    ((), [list(range(8))])])                                          # tokens not split
def test_token_groups_are_the_rows_each_expert_group_lays_out(batch_axes, want):
  """On data 4 x expert 2, the rows of each group that lays out its own assignments: device
  (d, x) holds row d·2 + x with expert minor in the batch rule, x·4 + d with it major, and
  rows 2d, 2d + 1 where the tokens are split over data alone."""
  rules = (("batch", batch_axes or None),) + LOGICAL_AXIS_RULES[1:]
  ids_NxP = jnp.arange(16, dtype=jnp.int32).reshape(8, 2)   # 8 rows, 1 or 2 per device
  with axis_rules(mesh_lib.make_mesh(mesh_config((4, 1, 1, 2)).mesh), rules):
    groups = moe_experts.token_groups(ids_NxP)
  np.testing.assert_array_equal(groups, np.asarray(ids_NxP)[np.asarray(want)])


@pytest.mark.parametrize("dispatch", [i for i in moe_dispatch.IMPLS
                                      if i not in ("gather", "pallas")])
def test_expert_parallel_dispatch_impls_match_one_device(dispatch):
  """Each way of moving rows, under the 8-device expert-parallel shard_map (tokens over data 4
  x expert 2): the unsharded dense reference's output and gradients. (pallas: below.)"""
  test_expert_parallel_shard_map_matches_one_device((4, 1, 1, 2), ("data", "fsdp", "expert"),
                                                    "gmm", dispatch)


def test_expert_parallel_pallas_dispatch_lowers_for_a_gpu(monkeypatch):
  """The Pallas dispatch under the 8-device expert-parallel shard_map, forward and backward,
  lowers for a GPU with its Triton kernels inside: their outputs carry the shard_map's varying
  axes. JAX's CPU interpreter cannot run a kernel there (moe_gather's docstring), so the
  values on 8 devices are the GPU's to check; on one device tests/kernels check them."""
  e, d, f, k, n = 8, 16, 24, 2, 64
  x_NxD, weights_NxK = jnp.ones((n, d)), jnp.ones((n, k))
  ids_NxK = jnp.tile(jnp.arange(k, dtype=jnp.int32), (n, 1))
  experts = [jnp.ones(shape) for shape in [(e, d, f), (e, d, f), (e, f, d)]]
  sharded = functools.partial(moe_experts.experts_sharded, moe_experts.expert_fn("blocked", "pallas"))
  loss = lambda x, w, *ws: jnp.sum(sharded(x, ids_NxK, w, *ws))
  rules = (("batch", ("data", "fsdp", "expert")),) + LOGICAL_AXIS_RULES[1:]
  mesh = gpu_target.h100_mesh(mesh_lib.make_mesh(mesh_config((4, 1, 1, 2)).mesh))
  with axis_rules(mesh, rules), gpu_target.h100(monkeypatch, mesh), target.lowering_for("gpu"):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        x_NxD, weights_NxK, *experts).lower(lowering_platforms=("cuda",)).as_text()
  assert re.search(r"sdy.manual_computation|SPMDFullToShardShape", text)
  assert set(re.findall(r'name = "(moe_gather\w*)"', text)) == {"moe_gather", "moe_gather_sum"}
  assert "xla.gpu.triton" in text


def test_fsdp_shards_params_and_optimizer_state(tmp_path, record_property):
  """Under fsdp=8 each device holds ~1/8 of the parameters and Adam moments (norm scales and
  scalars stay replicated), initialised directly into their shards."""
  def state_on(mesh):
    config = mesh_config(mesh)
    run = Setup.create(spec_lib.build(config), RunDir(str(tmp_path / str(mesh[1]))))
    return run.trainer.init_state(config.seed)

  one, fsdp = state_on((1, 1, 1, 1)), state_on((1, 8, 1, 1))
  table = fsdp.params["embed"]["table"][...]                          # [V, D]: D over fsdp
  assert {s.data.shape for s in table.addressable_shards} == {(512, 32 // 8)}
  for part in ("params", "opt_state"):
    full = mesh_lib.per_device_bytes(getattr(one, part))
    shard = mesh_lib.per_device_bytes(getattr(fsdp, part))
    record_property(f"{part}_bytes_per_device", f"{shard} of {full}")
    assert 1 / 8 <= shard / full < 1 / 8 + 0.02, (part, shard, full)
  # The sharded init is the same model as the one-device init.
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(fsdp.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_checkpoint_restores_onto_another_mesh(tmp_path):
  """A sharded Orbax checkpoint saved on (8 fsdp) restores onto (2 data x 2 fsdp x 2 tensor)."""
  def layout(mesh):
    config = mesh_config(mesh)
    tx, _ = optim.make_optimizer(config.optimizer, 10)
    spec = spec_lib.check(config)
    _, abstract = step_lib.abstract_state(spec.model, tx)
    return abstract, step_lib.shardings_of(abstract, mesh_lib.make_mesh(spec.mesh),
                                           spec.run.logical_axis_rules)

  abstract, fsdp = layout((1, 8, 1, 1))
  rng = np.random.default_rng(0)
  host = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), abstract)
  checkpoints = ckpt_lib.Checkpoints(str(tmp_path), keep=1)
  checkpoints.save(3, jax.device_put(host, fsdp), dict(step=3), force=True)
  checkpoints.wait()
  _, other = layout((2, 2, 2, 1))
  state, meta = checkpoints.restore(3, ckpt_lib.abstract_with_shardings(abstract, other))
  checkpoints.close()
  assert meta == dict(step=3)
  for got, want, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(host),
                                 jax.tree.leaves(other)):
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("mesh,batch,message", [
    ((3, 1, 1, 1), 8, r"config.mesh: .*'data': 3.*3 devices do not divide the 8 available"),
    ((2, -1, 1, 1), 4, r"phase tst's 4 rows do not divide over the 8 batch shards of mesh "
                       r"axes \{'data': 2, 'fsdp': 4\}; use a multiple of 8"),
    ((-1, 1, 1, 1), 12, r"12 rows do not divide over the 8 batch shards"),
    ((1, 1, 4, 2), 8, r"\['blocks'\]\['attn'\]\['k_proj'\].*over mesh axes \('tensor',\)"),
    ((-1, 1, 1, 1), 8, r"phase tst's 4 rows per micro-batch \(grad_accum=2\) do not divide"),
])
def test_bad_mesh_fails_before_compilation(tmp_path, mesh, batch, message):
  config = tiny_config(data=dict(batch_size=batch))     # K = 1 kv head: no tensor split
  config.mesh.update(dict(zip(AXES, mesh)))
  config.optimizer.grad_accum = 2 if "grad_accum" in message else 1
  compiles = []

  def count(event, duration, **kwargs):
    del duration, kwargs
    compiles.extend([event] if event.endswith("backend_compile_duration") else [])

  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    with pytest.raises(ValueError, match=message):
      cli.run(config, str(tmp_path / "run"))
  finally:
    jax.monitoring.unregister_event_duration_listener(count)
  assert not compiles and not (tmp_path / "run").exists()   # nothing compiled or written


def test_mesh_shape_and_process_block():
  cfg = mesh_config((2, -1, 1, 1)).mesh
  assert mesh_lib.mesh_shape(cfg, 8) == dict(data=2, fsdp=4, tensor=1, expert=1)
  assert mesh_lib.make_mesh(mesh_config((1, 2, 1, 1)).mesh).devices.size == 2  # a sub-mesh
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    mesh_lib.mesh_shape(mesh_config((-1, -1, 1, 1)).mesh, 8)
  mesh = mesh_lib.make_mesh(mesh_config((2, 4, 1, 1)).mesh)
  sharding = mesh_lib.batch_sharding(mesh, tiny_config().logical_axis_rules, 2)
  assert mesh_lib.shards(sharding, 0) == 8 and mesh_lib.shards(sharding, 1) == 1
  assert mesh_lib.process_batch_block(sharding) == (0, 1)   # one process loads every row


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  id: int
  process_index: int
  platform: str = "cpu"
  device_kind: str = "cpu"


def test_dcn_data_keeps_each_process_on_its_own_data_rows():
  """Multi-slice / multi-host: data is split over DCN first, so fsdp stays inside a process
  even when the device list interleaves the processes."""
  devices = [FakeDevice(i, i % 2) for i in range(8)]
  grid = mesh_lib.device_grid((2, 4, 1, 1), 2, devices)
  assert [{d.process_index for d in row.ravel()} for row in grid] == [{0}, {1}]
  with pytest.raises(ValueError, match="dcn_data: 3 must divide the data axis"):
    mesh_lib.device_grid((2, 4, 1, 1), 3, devices)
