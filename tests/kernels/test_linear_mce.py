"""linear_mce_loss: the chunked XLA and Pallas (interpreted) paths against the naive logits."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tst_jax import losses
from tst_jax.kernels import linear_mce_pallas, linear_mce_xla
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules
from tst_jax.superposition import IGNORE_INDEX
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES

N, D, V = 37, 24, 301  # none a multiple of the tiles below
XLA_BLOCKS = {"block_n": 16, "block_v": 128}
PALLAS_BLOCKS = {"block_n": 16, "block_v": 128, "block_d": 16}
WEIGHTINGS = ("uniform", "power", "exponential", "first", "explicit")
TOL = 1e-5  # float32: max |error| relative to max |reference| (loss: plain relative)
# bf16 inputs vs the float32 naive loss on the same (upcast) values: the logits are exact
# float32 sums of exact products, so the loss keeps ~1e-5; the gradients pass through
# bf16 d_logits and are returned in bf16 (2^-8 relative rounding each): 2e-2 of max |ref|.
BF16_LOSS_TOL, BF16_GRAD_TOL = 1e-4, 2e-2


def _problem(s, *, n=N, d=D, v=V, seed=0, dtype=jnp.float32):
  """Random hidden/head; bags with random ignored targets, a fully ignored row, a fully
  ignored column (S > 2) and tokens repeated inside bags (S > 1)."""
  rng = np.random.default_rng(seed)
  hidden_NxD = rng.normal(size=(n, d)).astype(np.float32)
  head_DxV = (rng.normal(size=(d, v)) / np.sqrt(d)).astype(np.float32) * 3
  targets_NxS = rng.integers(0, v, size=(n, s))
  targets_NxS[rng.random((n, s)) < 0.2] = IGNORE_INDEX
  targets_NxS[2] = IGNORE_INDEX
  targets_NxS[5, 0] = v - 1  # the last (partially padded) vocabulary tile
  if s > 1:
    targets_NxS[7:12, s - 1] = targets_NxS[7:12, 0] = 11  # a token repeated in a bag
    targets_NxS[12, :] = 13                              # a bag of one token only
  if s > 2:
    targets_NxS[:, 1] = IGNORE_INDEX
  return (jnp.asarray(hidden_NxD, dtype), jnp.asarray(head_DxV, dtype),
          jnp.asarray(targets_NxS, jnp.int32))


def _weighting(name, s):
  return np.linspace(2.0, 0.5, s) if name == "explicit" else name


def _loss_and_grads(impl, hidden, head, targets, **kwargs):
  loss_fn = lambda h, w: losses.linear_mce_loss(h, w, targets, impl=impl, **kwargs)  # noqa: E731
  return jax.value_and_grad(loss_fn, argnums=(0, 1))(hidden, head)


def _run_fast(fn, *args):
  """jit and run; tiny shapes make compiling dominate, and LLVM -O0 halves it."""
  return jax.jit(fn).lower(*args).compile({"xla_backend_optimization_level": 0})(*args)


def _assert_close(got, want, tol, what):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.all(np.isfinite(got)), f"{what}: non-finite values"
  scale = max(np.abs(want).max(), 1e-12)
  err = np.abs(got - want).max() / scale
  assert err <= tol, f"{what}: max error {err:.2e} of max |ref| {scale:.2e} > {tol:.0e}"


def _check_all(impl, s, weightings=WEIGHTINGS, variants=losses.VARIANTS, **kwargs):
  """Loss, d_hidden and d_head against naive for every weighting x variant at one S.

  One jit per call: the weightings and variants only change the cotangents (d lse,
  d target logits) that reach the kernel, so they share one kernel forward and one
  kernel VJP (lax.map over the cotangents): linear_mce_loss's own chain rule (tested
  end to end below).
  """
  hidden, head, targets = _problem(s, seed=s)
  kernel = linear_mce_xla if impl == "xla" else linear_mce_pallas
  combos = [(_weighting(name, s), variant) for name in weightings for variant in variants]

  def run(hidden, head):
    parts = lambda h, w: kernel.lse_and_target_logits(h, w, targets, **kwargs)  # noqa: E731
    (lse_N, z_NxS), vjp = jax.vjp(parts, hidden, head)
    got, cts, want = [], [], []
    for weighting, variant in combos:
      from_parts = lambda l, z: losses.mce_from_parts(  # noqa: E731
          l, z, targets, weighting=weighting, variant=variant)  # pylint: disable=cell-var-from-loop
      loss, ct = jax.value_and_grad(from_parts, argnums=(0, 1))(lse_N, z_NxS)
      got.append(loss)
      cts.append(ct)
      want.append(_loss_and_grads("naive", hidden, head, targets, weighting=weighting,
                                  variant=variant))
    grads = jax.lax.map(vjp, jax.tree.map(lambda *c: jnp.stack(c), *cts))
    return jnp.stack(got), grads, want

  got_loss, (got_dh, got_dw), want = _run_fast(run, hidden, head)
  for c, ((weighting, variant), (want_loss, (want_dh, want_dw))) in enumerate(zip(combos, want)):
    what = f"{impl} S={s} {weighting} {variant}"
    _assert_close(got_loss[c], want_loss, TOL, f"{what} loss")
    _assert_close(got_dh[c], want_dh, TOL, f"{what} d_hidden")
    _assert_close(got_dw[c], want_dw, TOL, f"{what} d_head")


@pytest.mark.parametrize("s", [1, 2, 4, 6, 16])
def test_xla_matches_naive(s):
  _check_all("xla", s, **XLA_BLOCKS)


@pytest.mark.parametrize("s,v_splits", [(1, None), (6, 2)])  # 3 vocab tiles: 3 or 2 + 1 splits
def test_pallas_triton_matches_naive(s, v_splits):
  _check_all("pallas", s, backend="triton", interpret=True, v_splits=v_splits, **PALLAS_BLOCKS)


def test_pallas_tpu_matches_naive():
  """The Mosaic TPU kernels under the TPU interpreter (2 x 2 x 2 tiles, all padded)."""
  _check_all("pallas", 4, weightings=("explicit",), backend="mosaic_tpu", interpret=True,
             block_n=32, block_v=256, block_d=16)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "mosaic_tpu"])
@pytest.mark.parametrize("s", [1, 2, 4, 6, 16])
def test_pallas_sweep(backend, s):
  _check_all("pallas", s, backend=backend, interpret=True, **PALLAS_BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("impl,blocks", [
    ("xla", {"block_n": 64, "block_v": 512}),        # a single tile
    ("xla", {"block_n": 1, "block_v": 1}),           # degenerate tiles
    ("pallas", {"block_n": 64, "block_v": 512, "block_d": 32}),
    ("pallas", {"block_n": 8, "block_v": 32, "block_d": 8}),
])
def test_tile_sizes_sweep(impl, blocks):
  _check_all(impl, 3, **blocks)


# The device each platform's kernel is lowered for. jax >= 0.12 reads the GPU's kind from an
# abstract mesh when the host has none and refuses to lower Triton without it; jax 0.10 ignores
# the mesh and lowers for its fallback compute capability 9.0, an H100's. One path for both.
ABSTRACT_DEVICES = {"cuda": ("NVIDIA H100", "gpu"), "tpu": ("TPU v5 lite", "tpu")}


@pytest.mark.parametrize("platform,backend", [("cuda", "triton"), ("tpu", "mosaic_tpu")])
def test_pallas_lowers_for_gpu_and_tpu(platform, backend):
  """The compiled (not interpreted) kernels lower to Triton / Mosaic IR from this CPU host for
  an abstract H100 / TPU v5e, with the default tiles, bf16 inputs and N, V, D off the tile
  grid. Not compiled or run."""
  n, d, v, s = 300, 384, 1000, 6
  args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16),
          jax.ShapeDtypeStruct((d, v), jnp.bfloat16), jax.ShapeDtypeStruct((n, s), jnp.int32))
  step = jax.jit(jax.value_and_grad(
      lambda h, w, t: losses.linear_mce_loss(h, w, t, impl="pallas", backend=backend,
                                             interpret=False),
      argnums=(0, 1)))
  kind, device_platform = ABSTRACT_DEVICES[platform]
  device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=1, platform=device_platform)
  with jax.sharding.use_abstract_mesh(
      jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
    text = step.trace(*args).lower(lowering_platforms=(platform,)).as_text()
  assert ("__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call") in text


@pytest.mark.parametrize("impl,kwargs", [("xla", XLA_BLOCKS),
                                         ("pallas", {**PALLAS_BLOCKS, "backend": "triton"})])
def test_bf16_inputs(impl, kwargs):
  hidden, head, targets = _problem(4, dtype=jnp.bfloat16)
  want = _run_fast(lambda h, w: _loss_and_grads("naive", h, w, targets, weighting="power"),
                   hidden.astype(jnp.float32), head.astype(jnp.float32))
  loss, (d_hidden, d_head) = _run_fast(
      lambda h, w: _loss_and_grads(impl, h, w, targets, weighting="power", **kwargs),
      hidden, head)
  assert d_hidden.dtype == d_head.dtype == jnp.bfloat16
  _assert_close(loss, want[0], BF16_LOSS_TOL, "loss")
  _assert_close(d_hidden, want[1][0], BF16_GRAD_TOL, "d_hidden")
  _assert_close(d_head, want[1][1], BF16_GRAD_TOL, "d_head")


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_jit_leading_dims_and_grad(impl):
  """[B, L, D] with [B, L, S] under jit with the default blocks, equal to naive flattened."""
  hidden, head, targets = _problem(2, n=36)
  hidden_BxLxD, targets_BxLxS = hidden.reshape(4, 9, D), targets.reshape(4, 9, 2)
  step = jax.jit(jax.value_and_grad(
      lambda h, w: losses.linear_mce_loss(h, w, targets_BxLxS, impl=impl),
      argnums=(0, 1)))
  loss, (d_hidden, d_head) = step(hidden_BxLxD, head)
  want_loss, (want_dh, want_dw) = _run_fast(
      lambda h, w: _loss_and_grads("naive", h, w, targets), hidden, head)
  assert d_hidden.shape == hidden_BxLxD.shape and d_head.shape == head.shape
  _assert_close(loss, want_loss, TOL, "loss")
  _assert_close(d_hidden.reshape(36, D), want_dh, TOL, "d_hidden")
  _assert_close(d_head, want_dw, TOL, "d_head")


def test_naive_is_mce_loss_of_the_logits_and_auto_is_xla_on_cpu():
  hidden, head, targets = _problem(3)
  targets_7 = jnp.where(targets == IGNORE_INDEX, 7, targets)  # token 7 as the ignore index

  def run(hidden, head):
    kw = {"weighting": "power", "variant": "alt"}
    want = losses.mce_loss(jnp.dot(hidden, head), targets, **kw)
    naive = losses.linear_mce_loss(hidden, head, targets, impl="naive", **kw)
    auto = losses.linear_mce_loss(hidden, head, targets, impl="auto", **kw, **XLA_BLOCKS)
    xla_7 = losses.linear_mce_loss(hidden, head, targets_7, impl="xla", ignore_index=7,
                                   **XLA_BLOCKS)
    naive_7 = losses.linear_mce_loss(hidden, head, targets_7, impl="naive", ignore_index=7)
    return want, naive, auto, xla_7, naive_7

  want, naive, auto, xla_7, naive_7 = _run_fast(run, hidden, head)
  _assert_close(naive, want, TOL, "naive")
  _assert_close(auto, want, TOL, "auto")
  _assert_close(xla_7, naive_7, TOL, "ignore_index=7")


def test_errors():
  hidden, head, targets = _problem(2)
  with pytest.raises(ValueError, match="unknown impl"):
    losses.linear_mce_loss(hidden, head, targets, impl="cuda")
  with pytest.raises(ValueError, match="unknown loss variant"):
    losses.linear_mce_loss(hidden, head, targets, variant="bce", impl="xla")
  with pytest.raises(ValueError, match="leading"):
    losses.linear_mce_loss(hidden, head, targets[1:], impl="xla")
  with pytest.raises(TypeError):
    losses.linear_mce_loss(hidden, head, targets, impl="naive", block_n=8)
  with pytest.raises(ValueError, match="powers of two"):
    losses.linear_mce_loss(hidden, head, targets, impl="pallas", backend="triton",
                           interpret=False, block_n=24)


# Sharded (tst_jax.kernels.sharded): 36 rows and V = 300 divide over every mesh below;
# V / 4 = 75 columns per shard, off the 32-column tiles.
SHARDED_N, SHARDED_V = 36, 300
SHARDED_BLOCKS = {"xla": {"block_n": 8, "block_v": 32},
                  "pallas": {"block_n": 16, "block_v": 32, "block_d": 16}}


def _mesh(data, fsdp, tensor, expert):
  """A (data, fsdp, tensor, expert) mesh over the 8 host devices of tests/conftest.py."""
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor, "expert": expert, "dcn_data": 1}
  return mesh_lib.make_mesh(ml_collections.ConfigDict(sizes))


def _check_sharded(impl, problem, mesh, rules=LOGICAL_AXIS_RULES, **kwargs):
  """Loss and both gradients under `axis_rules(mesh, rules)` against naive without a mesh."""
  hidden, head, targets = problem
  want = _run_fast(lambda h, w: _loss_and_grads("naive", h, w, targets, **kwargs), hidden, head)
  with axis_rules(mesh, rules):
    got = _run_fast(lambda h, w: _loss_and_grads(impl, h, w, targets, **SHARDED_BLOCKS[impl],
                                                 **kwargs), hidden, head)
  for what, g, w in zip(("loss", "d_hidden", "d_head"), jax.tree.leaves(got),
                        jax.tree.leaves(want)):
    _assert_close(g, w, TOL, f"sharded {impl} {what}")


@pytest.mark.parametrize("impl,s,shape,variant", [
    ("xla", 1, (2, 1, 4, 1), "mce"),      # rows over data (2), V over tensor (4)
    ("xla", 4, (1, 2, 2, 2), "alt"),      # rows over fsdp x expert (4), V over tensor (2)
    ("pallas", 1, (1, 2, 2, 2), "mce"),
    ("pallas", 4, (2, 1, 4, 1), "alt"),
])
def test_sharded_matches_naive(impl, s, shape, variant):
  """shard_map over 8 CPU devices: rows like 'batch', the head's V like 'vocab'. The
  gradients check that d_hidden is summed over vocab shards and d_head over row shards."""
  _check_sharded(impl, _problem(s, n=SHARDED_N, v=SHARDED_V, seed=s), _mesh(*shape),
                 weighting="power", variant=variant)


def test_sharded_vocab_over_two_axes_and_custom_ignore_index():
  """V split over (tensor, expert) = 4 shards (the offset is their joint index), and
  ignore_index=7, which is also a shard-local column: global 82 is column 7 of shard 1."""
  hidden, head, targets = _problem(2, n=SHARDED_N, v=SHARDED_V)
  targets = jnp.where(targets == IGNORE_INDEX, 7, targets).at[:4, 0].set(82)
  rules = (("vocab", ("tensor", "expert")),) + LOGICAL_AXIS_RULES
  _check_sharded("xla", (hidden, head, targets), _mesh(1, 2, 2, 2), rules, ignore_index=7)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_sharded_kernel_sees_its_shard(impl):
  """The jaxpr runs the kernel inside shard_map on [N/2, D] rows and [D, V/4] columns;
  a Pallas kernel appears nowhere outside it (XLA would replicate it)."""
  hidden, head, targets = _problem(4, n=SHARDED_N, v=SHARDED_V)
  loss = lambda h, w: losses.linear_mce_loss(h, w, targets, impl=impl)  # noqa: E731
  with axis_rules(_mesh(2, 1, 4, 1), LOGICAL_AXIS_RULES):
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(hidden, head).jaxpr
  shard_maps = [e for e in jaxpr.eqns if e.primitive.name == "shard_map"]
  assert len(shard_maps) == 2  # forward and its transpose
  forward = shard_maps[0].params["jaxpr"]
  kernels = [e for e in forward.eqns if e.params.get("name") == "lse_and_target_logits"]
  assert [[v.aval.shape for v in e.invars] for e in kernels] == [
      [(SHARDED_N // 2, D), (D, SHARDED_V // 4), (SHARDED_N // 2, 4)]]
  inside = sum(str(e.params["jaxpr"]).count("pallas_call") for e in shard_maps)
  assert str(jaxpr).count("pallas_call") == inside and (inside > 0) == (impl == "pallas")


def test_sharded_errors_and_fallback():
  hidden, head, targets = _problem(1)                 # N = 37, V = 301
  loss = lambda h, w: losses.linear_mce_loss(h, w, targets, impl="xla")  # noqa: E731
  with axis_rules(_mesh(1, 1, 4, 1), LOGICAL_AXIS_RULES):
    with pytest.raises(ValueError, match=r"vocabulary \(301\) must divide over the 'vocab' "
                                         r"mesh axes \('tensor',\) \(4 shards\)"):
      jax.eval_shape(loss, hidden, head)
  with axis_rules(_mesh(2, 1, 1, 1), LOGICAL_AXIS_RULES):
    with pytest.raises(ValueError, match=r"rows \(37\) over the 'batch' mesh axes"):
      jax.eval_shape(loss, hidden, head)
  with axis_rules(_mesh(1, 1, 1, 1), LOGICAL_AXIS_RULES):   # one device: the plain call
    assert "shard_map" not in str(jax.make_jaxpr(loss)(hidden, head))


ON_GPU = pytest.mark.skipif(jax.default_backend() != "gpu",
                            reason="compiled Triton kernels need a GPU (run by benchmarks/gpu.sh)")


@ON_GPU
@pytest.mark.parametrize("s", [1, 6])
def test_pallas_compiled_on_gpu_matches_naive(s):
  """The compiled Triton kernels (default tiles, off-grid N, V, D) against the naive loss."""
  _check_all("pallas", s, backend="triton", interpret=False)


@ON_GPU
def test_pallas_compiled_on_gpu_bf16_at_scale():
  """bf16 at a realistic shape (several d-logits chunks) against float32 naive."""
  k_h, k_w, k_t = jax.random.split(jax.random.PRNGKey(3), 3)
  n, d, v = 4096, 1024, 50_000
  hidden = jax.random.normal(k_h, (n, d), jnp.float32).astype(jnp.bfloat16)
  head = (jax.random.normal(k_w, (d, v), jnp.float32) / d ** 0.5).astype(jnp.bfloat16)
  targets = jax.random.randint(k_t, (n, 4), 0, v)
  want = _run_fast(lambda h, w: _loss_and_grads("naive", h, w, targets),
                   hidden.astype(jnp.float32), head.astype(jnp.float32))
  got = _run_fast(lambda h, w: _loss_and_grads("pallas", h, w, targets, bwd_rows=1024),
                  hidden, head)
  _assert_close(got[0], want[0], BF16_LOSS_TOL, "loss")
  _assert_close(got[1][0], want[1][0], BF16_GRAD_TOL, "d_hidden")
  _assert_close(got[1][1], want[1][1], BF16_GRAD_TOL, "d_head")
