"""The grouped matmul of `expert_impl=gmm` (tst_jax/kernels/grouped_matmul.py) against a slow
per-group loop: forward, dX and dW, for uneven, empty and all-rows groups, rows past the last
group (other shards' experts), float32 and bfloat16; its backward is grouped GEMMs only."""

import functools
import importlib
import json
import os
import subprocess
import sys
import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures.paths import ROOT
from tst_jax import platform
from tst_jax.errors import ConfigError
from tst_jax.kernels import grouped_matmul as gm, tokamax_tuning


def per_group(x_AxI, w_ExIxO, sizes_E):
  """The obvious loop: rows [s_e, s_e + size_e) times w[e]; rows past the groups are 0."""
  x, w = np.asarray(x_AxI, np.float64), np.asarray(w_ExIxO, np.float64)
  y, start = np.zeros((x.shape[0], w.shape[2])), 0
  for e, size in enumerate(np.asarray(sizes_E)):
    y[start:start + size] = x[start:start + size] @ w[e]
    start += size
  return y


SIZES = {"uneven": [3, 0, 7, 2, 4], "one_expert_takes_all": [0, 0, 16, 0, 0],
         "empty_experts_and_rows_past": [5, 0, 0, 6, 0]}   # 11 of 16 rows grouped


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("case", list(SIZES))
def test_forward_and_both_gradients_match_the_per_group_loop(case, dtype, tol):
  a, i, o = 16, 6, 5
  sizes_E = jnp.asarray(SIZES[case], jnp.int32)
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x_AxI = jax.random.normal(k1, (a, i)).astype(dtype)
  w_ExIxO = jax.random.normal(k2, (len(SIZES[case]), i, o)).astype(dtype)
  dy_AxO = jax.random.normal(k3, (a, o))

  def loss(x, w):
    return jnp.sum(gm.grouped_matmul(x, w, sizes_E).astype(jnp.float32) * dy_AxO)

  y = jax.jit(gm.grouped_matmul)(x_AxI, w_ExIxO, sizes_E)
  dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x_AxI, w_ExIxO)
  assert y.dtype == dx.dtype == dw.dtype == jnp.dtype(dtype)
  # The slow version of each: y = per_group(x, w); dx = per_group(dy, wᵀ); dw[e] = x_eᵀ dy_e.
  want_dx = per_group(dy_AxO, np.swapaxes(np.asarray(w_ExIxO, np.float32), 1, 2), sizes_E)
  want_dw = np.zeros(w_ExIxO.shape)
  start = 0
  for e, size in enumerate(SIZES[case]):
    rows = slice(start, start + size)
    want_dw[e] = np.asarray(x_AxI, np.float64)[rows].T @ np.asarray(dy_AxO, np.float64)[rows]
    start += size
  scale = lambda ref: tol * max(1.0, float(np.abs(ref).max()))
  for got, want in ((y, per_group(x_AxI, w_ExIxO, sizes_E)), (dx, want_dx), (dw, want_dw)):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=scale(want), rtol=tol)
  past = int(np.sum(SIZES[case]))
  assert not np.any(np.asarray(y[past:])) and not np.any(np.asarray(dx[past:]))


def test_the_backward_is_grouped_gemms_with_no_rows_by_experts_array():
  """Differentiated, the program holds ragged_dot (forward, dX) and one ragged-contraction
  ragged_dot_general (dW), and no [A, E] intermediate (one-hot masks, a dense expansion)."""
  a, e = 24, 5
  x, w = jnp.ones((a, 8)), jnp.ones((e, 8, 4))
  sizes = jnp.asarray([4, 0, 12, 3, 5], jnp.int32)
  jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: gm.grouped_matmul(x, w, sizes).sum(),
                                  argnums=(0, 1)))(x, w)
  names = [str(eqn.primitive) for eqn in jaxpr.jaxpr.eqns] + [
      str(inner.primitive) for eqn in jaxpr.jaxpr.eqns for sub in eqn.params.values()
      if hasattr(sub, "jaxpr") for inner in getattr(sub, "jaxpr", sub).eqns]
  assert "ragged_dot_general" in " ".join(names)
  shapes = {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}
  shapes |= {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for sub in eqn.params.values()
             if hasattr(sub, "jaxpr") for inner in getattr(sub, "jaxpr", sub).eqns
             for v in inner.outvars}
  assert (a, e) not in shapes and (e, a) not in shapes, shapes


def test_backend_choice_and_a_bad_backend():
  assert platform.grouped_matmul_backend("cpu")[0] == "xla"
  assert platform.grouped_matmul_backend("tpu")[0] == "xla"
  want = "tokamax" if gm.tokamax_version() else "xla"
  assert platform.grouped_matmul_backend("gpu")[0] == want
  assert platform.expert_impl("gmm", "cpu")[1].startswith("set in the config; grouped GEMM")
  with pytest.raises(ValueError, match="backend must be one of"):
    gm.grouped_matmul(jnp.ones((2, 3)), jnp.ones((1, 3, 4)), jnp.asarray([2]), "cutlass")


def test_the_benchmark_runs_at_tiny_shapes():
  """benchmarks/grouped_matmul.py (its GPU rows: benchmarks/gpu.sh) runs on CPU with --smoke."""
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "grouped_matmul.py"),
                        "--smoke", "--backends", "xla"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr
  row = json.loads(out.stdout.splitlines()[-1])
  assert row["backend"] == "xla" and row["rows"] > 0 and row["fwd_bwd_tflops"] > 0


# ------------------------------------------------------------------ tokamax, faked on CPU

class FakeTokamax(types.ModuleType):
  """tokamax's API as the code calls it (openxla/tokamax: ragged_dot_general's
  `implementation=`, autotune, AutotuningResult), computed by jax.lax.ragged_dot_general; like
  its Mosaic GPU kernels it refuses a row count that is not a multiple of 8. Records calls."""

  def __init__(self, version="0.0.17"):
    super().__init__("tokamax")
    self.__version__, self.calls, self.tuned, self.entered = version, [], [], []
    self.exact = True
    fake = self

    class AutotuningResult:
      def __init__(self, text):
        self.text = text

      def dumps(self):
        return self.text

      @classmethod
      def loads(cls, text):
        return cls(text)

      def __enter__(self):
        fake.entered.append(self.text)

      def __exit__(self, *exc):
        return False
    self.AutotuningResult = AutotuningResult

  def ragged_dot_general(self, lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                         precision=None, preferred_element_type=None, *, implementation=None):
    if lhs.shape[0] % 8:
      raise ValueError("When no rounding mode is specified, dimension 0 must have size smaller "
                       f"or a multiple of its tiling 8, but got {lhs.shape[0]}")
    if ragged_dot_dimension_numbers == gm._DIMS["dw"] and lhs.shape[0] % 64:   # on an H200
      raise ValueError("When no rounding mode is specified, dimension 1 must have size smaller "
                       f"or a multiple of its tiling 64, but got {lhs.shape[0]}")
    self.calls.append(dict(dims=ragged_dot_dimension_numbers, rows=lhs.shape[0],
                           implementation=implementation, out=preferred_element_type,
                           entered=len(self.entered)))
    product = functools.partial(jax.lax.ragged_dot_general, group_sizes=group_sizes,
                                ragged_dot_dimension_numbers=ragged_dot_dimension_numbers,
                                precision=precision, preferred_element_type=jnp.float32)
    out_type = preferred_element_type or jnp.result_type(lhs, rhs)
    if not self.exact:   # the shape only (timing tests: CPU's ragged_dot is E x the work)
      return jnp.zeros(jax.eval_shape(product, lhs, rhs).shape, out_type)
    return product(lhs, rhs).astype(out_type)

  def autotune(self, f, *args, timeout=None, progress_bar=True):
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in args)
    self.tuned.append([tuple(a.shape) for a in args])
    return self.AutotuningResult(json.dumps({"tuned": len(self.tuned)}))


@pytest.fixture
def fake_tokamax(monkeypatch, tmp_path):
  fake = FakeTokamax()
  monkeypatch.setitem(sys.modules, "tokamax", fake)
  monkeypatch.setattr(gm, "tokamax_version", lambda: fake.__version__)
  monkeypatch.setenv(tokamax_tuning.ENV, str(tmp_path / "tuning"))
  monkeypatch.setattr(tokamax_tuning, "_RESULTS", {})
  return fake


H100 = "NVIDIA H100 80GB HBM3"


def test_tokamax_pads_rows_and_runs_the_measured_kernel_of_each_product(fake_tokamax):
  """131009 rows (benchmarks/grouped_matmul.py's: tokamax refused them on the H100 and, padded
  to 131016, on the H200): padded to whole tiles of 64 inside grouped_matmul, values and both
  gradients as XLA's; the forward and dX on Mosaic, dW on Triton (platform's H100 entry),
  each with its fallback."""
  with pytest.raises(ValueError, match="multiple of its tiling 8, but got 131009"):
    fake_tokamax.ragged_dot_general(jnp.ones((131009, 2)), jnp.ones((1, 2, 2)),
                                    jnp.asarray([1]), gm._DIMS["forward"])
  backend, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert backend == "tokamax" and "Triton" in why and "autotuned once" in why
  a, i, o = 131009, 8, 4
  sizes_E = jnp.asarray([40000, 0, 51000, 39000], jnp.int32)          # 130000 of 131009 rows
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (a, i))
  w = jax.random.normal(k2, (4, i, o))
  dy = jax.random.normal(k3, (a, o))

  def run(backend):
    y, vjp = jax.vjp(lambda x, w: gm.grouped_matmul(x, w, sizes_E, backend, kernels), x, w)
    return (y,) + vjp(dy)
  got, want = run("tokamax"), run("xla")
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-4)
  assert got[0].shape == (a, o) and not np.any(np.asarray(got[0][130000:]))
  by_product = {next(p for p, d in gm._DIMS.items() if d == c["dims"]): c
                for c in fake_tokamax.calls}
  assert set(by_product) == {"forward", "dx", "dw"} and len(fake_tokamax.calls) == 3
  assert all(c["rows"] == 131072 for c in fake_tokamax.calls)        # 131009 -> 64 x 2048
  assert by_product["forward"]["implementation"] == ("mosaic", "triton")
  assert by_product["dx"]["implementation"] == ("mosaic", "triton")
  assert by_product["dw"]["implementation"] == ("triton", "mosaic")


def test_tokamax_autotunes_each_shape_once_and_keeps_it(fake_tokamax, monkeypatch):
  """The first trace autotunes the three products' shapes (abstract operands) and keeps each
  result on disk; every kernel call runs inside its result; a new process reads them back
  without tuning; TST_JAX_TOKAMAX_TUNING=off tunes nothing. bf16 operands: the output dtypes
  asked for are tokamax's own VJP's (so its shipped tables' keys match): the forward's
  default, dX in x's dtype, dW in w's (the kernels accumulate in float32 inside)."""
  x, w = jnp.ones((20, 3), jnp.bfloat16), jnp.ones((2, 3, 5), jnp.bfloat16)
  sizes = jnp.asarray([7, 9], jnp.int32)
  grad = jax.jit(jax.grad(lambda x, w: gm.grouped_matmul(x, w, sizes, "tokamax").sum(),
                          argnums=(0, 1)))
  jax.block_until_ready(grad(x, w))
  assert sorted(fake_tokamax.tuned) == sorted([[(64, 3), (2, 3, 5), (2,)],     # forward
                                               [(64, 5), (2, 3, 5), (2,)],     # dX
                                               [(64, 3), (64, 5), (2,)]])      # dW
  assert [c["entered"] for c in fake_tokamax.calls] == [1, 2, 3]
  assert [c["out"] for c in fake_tokamax.calls] == [None, jnp.bfloat16, jnp.bfloat16]
  kept = os.listdir(os.environ[tokamax_tuning.ENV])
  assert len(kept) == 3
  monkeypatch.setattr(tokamax_tuning, "_RESULTS", {})                  # a new process
  fake_tokamax.tuned.clear()
  jax.block_until_ready(jax.jit(jax.grad(lambda x, w: gm.grouped_matmul(
      x, w, sizes, "tokamax").sum(), argnums=(0, 1)))(x, w))
  assert fake_tokamax.tuned == [] and len(fake_tokamax.entered) == 6
  assert {json.loads(t)["tuned"] for t in fake_tokamax.entered[3:]} == {1, 2, 3}
  monkeypatch.setenv(tokamax_tuning.ENV, "off")
  monkeypatch.setattr(tokamax_tuning, "_RESULTS", {})
  jax.block_until_ready(grad(x * 2, w))
  assert fake_tokamax.tuned == [] and "autotuning off" in tokamax_tuning.describe()


def test_a_tuning_result_tokamax_cannot_serialize_is_used_and_not_kept(fake_tokamax, capsys):
  """On an H200 a configuration that timed out left a TimeoutError in tokamax's result, whose
  dumps() raised pydantic's serialization error (a ValueError) and stopped the run."""
  def unserializable(self):
    raise ValueError("Unable to serialize unknown type: <class 'TimeoutError'>")
  fake_tokamax.AutotuningResult.dumps = unserializable
  x, w, sizes = jnp.ones((16, 3)), jnp.ones((2, 3, 5)), jnp.asarray([7, 9], jnp.int32)
  np.testing.assert_allclose(gm.grouped_matmul(x, w, sizes, "tokamax"),
                             gm.grouped_matmul(x, w, sizes, "xla"))
  assert len(fake_tokamax.tuned) == 1 and len(fake_tokamax.entered) == 1
  assert not os.path.exists(os.environ[tokamax_tuning.ENV])
  assert "is used but not kept: Unable to serialize" in capsys.readouterr().err


def test_tokamax_versions_and_auto_on_gpu(monkeypatch):
  """auto on a GPU: gmm where tokamax is installed (the 2026-11-25 measurement as the reason),
  blocked with the pip line where not; a tokamax older than 0.0.17 is one ConfigError line
  naming its version and the fix."""
  monkeypatch.setattr(gm, "tokamax_version", lambda: "0.0.17")
  impl, why = platform.expert_impl("auto", "gpu", H100)
  assert impl == "gmm" and "1.42x" in why and "0.161 vs 0.228 s" in why and "tokamax 0.0.17" in why
  assert "Triton" in why and "Mosaic" in why
  _, kernels, why = platform.grouped_matmul_backend("gpu", "NVIDIA B200")
  assert kernels == gm.Kernels() and "none measured on NVIDIA B200" in why
  monkeypatch.setattr(gm, "tokamax_version", lambda: "0.0.12")
  for requested in ("auto", "gmm"):
    with pytest.raises(ConfigError, match=r"needs tokamax >= 0\.0\.17 .*tokamax 0\.0\.12 is "
                                          r"installed: pip install -U 'tst-jax\[gpu\]'") as e:
      platform.expert_impl(requested, "gpu", H100)
    assert e.value.field == "model.expert_impl" and "\n" not in str(e.value)
  assert platform.expert_impl("blocked", "gpu", H100) == ("blocked", "set in the config")
  monkeypatch.setattr(gm, "tokamax_version", lambda: None)
  impl, why = platform.expert_impl("auto", "gpu", H100)
  assert impl == "blocked" and "pip install 'tst-jax[gpu]'" in why
  assert platform.expert_impl("auto", "cpu")[0] == "blocked"


def test_kernels_tokamax_cannot_run_are_left_out_and_said(monkeypatch, tmp_path):
  """tokamax 0.0.17 registers its Triton kernels only where jax-triton and triton import, and
  refuses an unknown name ("Unknown implementation: triton" on an H200 without them, 2026-11-27):
  the H100's Triton-first choice keeps Mosaic alone there, and the reason says why. A tokamax
  laid out as 0.0.17 (its registry in tokamax._src.ops.ragged_dot.api) stands in for it."""
  def install(names):
    api = tmp_path / "_".join(names) / "tokamax" / "_src" / "ops" / "ragged_dot"
    api.mkdir(parents=True)
    for folder in (api, api.parent, api.parent.parent, api.parent.parent.parent):
      (folder / "__init__.py").touch()
    (api / "api.py").write_text(f"IMPLEMENTATIONS = {dict.fromkeys(names)!r}\n")
    for name in [m for m in sys.modules if m == "tokamax" or m.startswith("tokamax.")]:
      monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(api.parents[3]))
  monkeypatch.setattr(gm, "tokamax_version", lambda: "0.0.17")
  install(["xla", "mosaic_gpu"])
  assert gm.tokamax_kernels() == {"xla", "mosaic_gpu", "mosaic"}
  _, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert kernels == gm.Kernels(forward=("mosaic",), dx=("mosaic",), dw=("mosaic",))
  assert "triton not used: not installed" in why and "jax-triton" in why
  install(["xla", "triton", "mosaic_gpu"])
  _, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert kernels.dw == ("triton", "mosaic") and "not used" not in why
  assert gm.Kernels(dw=("triton",)).within({"mosaic"}) == gm.Kernels()


def test_the_benchmark_runs_131009_rows_on_tokamax(fake_tokamax, capsys, monkeypatch):
  """benchmarks/grouped_matmul.py at its GPU row count (128 experts, ~1k rows each: 131009,
  which tokamax refused on the H100) runs through the (fake) tokamax kernels, narrow D and F
  so that CPU can; both kernel choices, the platform's and one named per product. Values are
  the previous test's: here the fake returns zeros of the product's shape."""
  fake_tokamax.exact = False
  monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
  bench = importlib.import_module("grouped_matmul")
  bench.main(["--dim", "8", "--ffw", "4", "--repeats", "1",
              "--backends", "tokamax,tokamax:mosaic/mosaic/mosaic"])
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["backend"] for r in rows] == ["tokamax", "tokamax:mosaic/mosaic/mosaic"]
  assert {r["rows"] for r in rows} == {131009} and all(r["fwd_bwd_tflops"] > 0 for r in rows)
  assert rows[1]["kernels"] == "forward mosaic, dx mosaic, dw mosaic"
  assert {c["rows"] for c in fake_tokamax.calls} == {131072}
  assert {c["implementation"] for c in fake_tokamax.calls} == {None, ("mosaic",)}


def _row_pads(jaxpr):
  """The pads that grow a floating-point matrix, in `jaxpr` and every jaxpr inside it (a
  pad's transpose is a pad that shrinks: a slice)."""
  found = []
  for eqn in jaxpr.eqns:
    aval = eqn.outvars[0].aval
    if (eqn.primitive.name == "pad" and aval.ndim == 2 and aval.size > eqn.invars[0].aval.size
        and jnp.issubdtype(aval.dtype, jnp.floating)):
      found.append(tuple(aval.shape))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _row_pads(sub)
  return found


@pytest.mark.parametrize("rows,backend,want", [(21, "tokamax", [(64, 6), (64, 5)]),
                                               (64, "tokamax", []), (21, "xla", [])])
def test_rows_are_padded_once_per_call(fake_tokamax, rows, backend, want):
  """Rows that are not whole tiles of tokamax's 64: x is padded once in the forward and dy once
  in the backward (the transpose of the output's slice), not once per product (four: x for the
  forward and dW, dy for dX and dW). Whole tiles and XLA pad nothing; values as the loop's."""
  sizes_E = jnp.asarray([5, 0, 9, 3], jnp.int32)                       # 17 of the rows
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x, w, dy = (jax.random.normal(k1, (rows, 6)), jax.random.normal(k2, (4, 6, 5)),
              jax.random.normal(k3, (rows, 5)))
  loss = lambda x, w: jnp.sum(gm.grouped_matmul(x, w, sizes_E, backend) * dy)
  assert sorted(_row_pads(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w).jaxpr)) == \
      sorted(want)
  y = gm.grouped_matmul(x, w, sizes_E, backend)
  dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
  np.testing.assert_allclose(y, per_group(x, w, sizes_E), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, per_group(dy, np.swapaxes(np.asarray(w), 1, 2), sizes_E),
                             rtol=1e-5, atol=1e-5)
  assert y.shape == (rows, 5) and dx.shape == (rows, 6) and dw.shape == w.shape
  if backend == "tokamax":
    assert {c["rows"] for c in fake_tokamax.calls} == {64}


def test_the_moe_step_pads_no_rows_and_matches_the_dense_experts(fake_tokamax):
  """experts_gmm on (fake) tokamax: the dispatch lays the 30 assignments out as 64 rows, whole
  tiles, so neither the forward nor the backward pads a matrix; values
  and gradients as the dense reference (every expert on every token), which pads nothing."""
  from tst_jax.models import moe   # pylint: disable=import-outside-toplevel
  n, d, f, e, p = 10, 6, 5, 4, 3                                       # A = 30 -> R = 64
  k = jax.random.split(jax.random.key(1), 6)
  x = jax.random.normal(k[0], (n, d))
  ids = jnp.argsort(jax.random.uniform(k[1], (n, e)), axis=1)[:, :p].astype(jnp.int32)
  weights = jax.nn.softmax(jax.random.normal(k[2], (n, p)))
  gate, up = jax.random.normal(k[3], (e, d, f)), jax.random.normal(k[4], (e, d, f))
  down = jax.random.normal(k[5], (e, f, d))
  _, kernels, _ = platform.grouped_matmul_backend("gpu", H100)
  gmm = lambda *a: moe.experts_gmm(*a, backend="tokamax", kernels=kernels)

  def loss(impl):
    return lambda x, w, g, u, dn: jnp.sum(jnp.sin(impl(x, ids, w, g, u, dn)))
  args = (x, weights, gate, up, down)
  grad = lambda impl: jax.grad(loss(impl), argnums=(0, 1, 2, 3, 4))
  assert _row_pads(jax.make_jaxpr(grad(gmm))(*args).jaxpr) == []
  for got, want in zip(grad(gmm)(*args), grad(moe.experts_dense)(*args)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gmm(x, ids, *args[1:]), moe.experts_dense(x, ids, *args[1:]),
                             rtol=1e-5, atol=1e-5)
  assert {c["rows"] for c in fake_tokamax.calls} == {64}
