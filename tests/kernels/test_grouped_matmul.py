"""The grouped matmul of `expert_impl=gmm` (tst_jax/kernels/grouped_matmul.py) against a slow
per-group loop: forward, dX and dW, for uneven, empty and all-rows groups, rows past the last
group (other shards' experts), float32 and bfloat16; its backward is grouped GEMMs only."""

import importlib
import json
import os
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures import tokamax
from tests.fixtures.paths import ROOT
from tests.fixtures.tokamax import FakeMosaicConfig, FakeTritonConfig
from tst_jax import platform
from tst_jax.errors import ConfigError
from tst_jax.kernels import gemm_measured, grouped_matmul as gm, tokamax_tuning


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


@pytest.fixture
def fake_tokamax(monkeypatch, tmp_path):
  return tokamax.install(monkeypatch, tmp_path)


H100 = "NVIDIA H100 80GB HBM3"


def test_tokamax_pads_rows_and_runs_the_measured_kernel_of_each_product(fake_tokamax, capsys):
  """131009 rows (benchmarks/grouped_matmul.py's: tokamax refused them on the H100 and, padded
  to 131016, on the H200): padded to whole tiles of 64 inside grouped_matmul, values and both
  gradients as XLA's; the forward and dX on Mosaic, dW on Triton (platform's H100 entry),
  each with its fallback and each kernel with the config pinned from tokamax's H100 tables, so
  nothing is autotuned."""
  with pytest.raises(ValueError, match="multiple of its tiling 8, but got 131009"):
    fake_tokamax.ragged_dot_general(jnp.ones((131009, 2)), jnp.ones((1, 2, 2)),
                                    jnp.asarray([1]), gm._DIMS["forward"])
  backend, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert backend == "tokamax" and "Triton" in why and "dw triton [pinned] then mosaic" in why
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
  # tokamax's H100 tables at F 768, 128 experts (pallas_mosaic_gpu_ragged_dot.json,
  # triton_ragged_dot.json of its 0.0.17 wheel), the fastest entry of each
  forward_mosaic, _ = by_product["forward"]["configs"]
  assert forward_mosaic == FakeMosaicConfig(block_m=128, block_n=64, block_k=128, num_stages=4,
                                            split_k=1, grid_minor_dim=1, grid_tile_width=8)
  assert by_product["dw"]["configs"][0] == FakeTritonConfig(
      block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=5)
  dx_mosaic, dx_triton = by_product["dx"]["configs"]
  assert (dx_mosaic.persistent, dx_mosaic.num_stages, dx_triton.block_n) == (False, 2, 128)
  assert fake_tokamax.tuned == [] and fake_tokamax.entered == []
  said = capsys.readouterr().err
  assert "tokamax: dw float32[131072,8] x float32[131072,4]: triton, config pinned" in said


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
  _, kernels, why = platform.grouped_matmul_backend("gpu", "NVIDIA A40")
  assert kernels == gm.Kernels() and "no kernel table for NVIDIA A40" in why
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


@pytest.fixture
def fake_packages():
  """Forgets, after the test and after monkeypatch has put back what it took out, the tokamax,
  triton and jax_triton it imported from a folder of its own: a later import (torch's, of
  triton) must find the installed ones. Ask for it before monkeypatch."""
  before = set(sys.modules)
  yield
  for name in set(sys.modules) - before:
    if name.split(".")[0] in ("tokamax", "triton", "jax_triton"):
      del sys.modules[name]


def _install_tokamax(monkeypatch, tmp_path, names, modules=()):
  """A tokamax laid out as 0.0.17 (its registry in tokamax._src.ops.ragged_dot.api) that
  registers the kernels `names`, on sys.path, with each of `modules` (name -> __init__ source)
  beside it."""
  root = tmp_path / "_".join(names)
  api = root / "tokamax" / "_src" / "ops" / "ragged_dot"
  api.mkdir(parents=True)
  for folder in (api, api.parent, api.parent.parent, api.parent.parent.parent):
    (folder / "__init__.py").touch()
  (api / "api.py").write_text(f"IMPLEMENTATIONS = {dict.fromkeys(names)!r}\n")
  for module, source in dict(modules).items():
    (root / module).mkdir()
    (root / module / "__init__.py").write_text(source)
  for name in [m for m in sys.modules if m.split(".")[0] in ("tokamax", "triton", "jax_triton")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.syspath_prepend(str(root))


def test_kernels_tokamax_cannot_run_are_left_out_and_said_in_one_line(fake_packages,
                                                                     monkeypatch, tmp_path):
  """tokamax 0.0.17 registers its Triton kernels only where jax-triton and triton import, and
  refuses an unknown name ("Unknown implementation: triton" on an H200 without them, 2026-11-27):
  the H100's Triton-first choice keeps Mosaic alone there, and the reason says in one line
  which of the two does not import and why."""
  monkeypatch.setattr(gm, "tokamax_version", lambda: "0.0.17")
  monkeypatch.setattr(gemm_measured, "FILE", str(tmp_path / "none.json"))
  monkeypatch.setenv(tokamax_tuning.ENV, "off")
  _install_tokamax(monkeypatch, tmp_path / "a", ["xla", "mosaic_gpu"])
  monkeypatch.setitem(sys.modules, "triton", None)   # absent, also where torch brought it
  assert "triton not used: triton does not import (ModuleNotFoundError" in \
      platform.grouped_matmul_backend("gpu", H100)[2]
  broken = "raise ImportError(\"cannot import name 'triton_call' from 'jaxlib'\")\n"
  _install_tokamax(monkeypatch, tmp_path / "b", ["xla", "mosaic_gpu"],
                   {"triton": "", "jax_triton": broken})
  assert gm.tokamax_kernels() == {"xla", "mosaic_gpu", "mosaic"}
  _, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert kernels[:3] == (("mosaic",), ("mosaic",), ("mosaic",))
  assert {p[1] for p in kernels.pinned} == {"mosaic"}
  assert ("triton not used: jax_triton does not import (ImportError: cannot import name "
          "'triton_call' from 'jaxlib')") in why and "\n" not in why
  assert "dw mosaic [pinned]" in why
  _install_tokamax(monkeypatch, tmp_path / "c", ["xla", "triton", "mosaic_gpu"])
  _, kernels, why = platform.grouped_matmul_backend("gpu", H100)
  assert kernels.dw == ("triton", "mosaic") and "not used" not in why
  # a product left with none, or naming none, runs what tokamax's own order keeps
  assert gm.Kernels(dw=("triton",)).within({"mosaic"}) == gm.Kernels(*[("mosaic",)] * 3)


# jax_triton's triton_call as each release's wheel declares it (jax_triton/triton_lib.py), its
# body left out: 0.3.1 asks for out_shape, 0.4.x takes out_type; 0.4.1 also takes None arguments.
_TRITON_CALL = {
    (0, 3, 1): "def triton_call(*args, kernel, out_shape, grid, name='', "
               "custom_call_target_name='triton_kernel_call', num_warps=None, num_stages=None, "
               "num_ctas=1, compute_capability=None, enable_fp_fusion=True, "
               "input_output_aliases=None, zeroed_outputs=(), debug=False, "
               "serialized_metadata=b'', **metaparams): ...\n",
    (0, 4, 0): "def triton_call(*args, kernel, out_type=None, grid, name='', num_warps=None, "
               "num_stages=None, num_ctas=None, compute_capability=None, backend_options=None, "
               "input_output_aliases=None, zeroed_outputs=(), debug=False, "
               "serialized_metadata=b'', cost_estimate=None, has_side_effect=False, "
               "**kwargs): ...\n",
}
_TRITON_CALL[(0, 4, 1)] = _TRITON_CALL[(0, 4, 0)]


@pytest.mark.parametrize("version,why", [
    ((0, 3, 1), "jax_triton 0.3.1's triton_call takes no out_type, which tokamax's Triton "
                "kernels pass: they need jax-triton >= 0.4.1 (with triton >= 3.7)"),
    ((0, 4, 0), "jax_triton 0.4.0 is older than the 0.4.1 tokamax's Triton kernels need (with "
                "triton >= 3.7)"),
    ((0, 4, 1), None)], ids=["0.3.1", "0.4.0", "0.4.1"])
def test_triton_runs_only_where_jax_triton_traces_it(fake_packages, monkeypatch, tmp_path,
                                                     version, why):
  """tokamax 0.0.17 registers its Triton kernels wherever jax_triton imports, and they pass
  triton_call an out_type, which jax-triton 0.3.1's triton_call answers with a TypeError in the
  trace, past which tokamax does not fall back; 0.4.0 is below the floor of tokamax's own
  Triton test. With either the H100's Triton-first dW runs Mosaic, a GPU with no kernel table
  runs tokamax's own order less Triton, and the plan says why in one line; with 0.4.1 Triton
  stays."""
  monkeypatch.setattr(gm, "tokamax_version", lambda: "0.0.17")
  monkeypatch.setattr(gemm_measured, "FILE", str(tmp_path / "none.json"))
  monkeypatch.setenv(tokamax_tuning.ENV, "off")
  jax_triton = (f"__version_info__ = {version!r}\n__version__ = {'.'.join(map(str, version))!r}\n"
                + _TRITON_CALL[version])
  _install_tokamax(monkeypatch, tmp_path, ["xla", "triton", "mosaic_gpu"],
                   {"triton": "", "jax_triton": jax_triton})
  assert gm.triton_unavailable() == gm.triton_call_refused() == why
  _, kernels, line = platform.grouped_matmul_backend("gpu", H100)
  _, own, own_line = platform.grouped_matmul_backend("gpu", "NVIDIA A40")
  if why is None:
    assert gm.tokamax_kernels() == {"xla", "triton", "mosaic_gpu", "mosaic"}
    assert kernels.dw == ("triton", "mosaic") and "not used" not in line
    assert own == gm.Kernels() and "not used" not in own_line
    return
  assert gm.tokamax_kernels() == {"xla", "mosaic_gpu", "mosaic"}
  assert kernels[:3] == (("mosaic",),) * 3 and {p[1] for p in kernels.pinned} == {"mosaic"}
  assert f"triton not used: {why}" in line and "\n" not in line
  assert own[:3] == (("mosaic", "xla"),) * 3 and f"triton not used: {why}" in own_line


@pytest.mark.parametrize("kind,lines,why", [
    (H100, ["forward mosaic [pinned] then triton [pinned]", "dx mosaic [pinned] then triton "
            "[pinned]", "dw triton [pinned] then mosaic [pinned]"], "tokamax's H100 tables"),
    ("NVIDIA H200", ["forward mosaic [pinned] then triton [pinned]",
                     "dw triton [pinned] then mosaic [pinned]"],
     "the H100's entry: tokamax ships no H200 table, and the H200 is sm_90 as the H100"),
    ("NVIDIA B200", ["forward mosaic [fallback: tokamax's heuristic tile] then triton "
                     "[fallback: tokamax's heuristic tile]",
                     "dw triton [pinned] then mosaic [fallback"], "tokamax's B200 tables"),
    ("NVIDIA A40", ["forward tokamax's own kernel and config", "dx tokamax's own kernel and "
                    "config", "dw tokamax's own kernel and config"],
     "no kernel table for NVIDIA A40: tokamax's own kernels and configs"),
])
def test_the_plan_says_each_products_kernels_and_where_their_configs_come_from(
    fake_tokamax, monkeypatch, kind, lines, why):
  """The run's plan line, per GPU: each product's kernels in order, each with its config's
  source (pinned; tokamax's heuristic tile where tokamax ships no table and tuning is off; a
  GPU with no entry in one line), and where the table came from; what the MoE lab measured
  on that GPU, here nothing."""
  monkeypatch.setenv(tokamax_tuning.ENV, "off")
  monkeypatch.setattr(gm, "tokamax_table", lambda kernel, device_kind: False)
  impl, reason = platform.expert_impl("gmm", "gpu", kind)
  assert impl == "gmm" and "\n" not in reason
  for line in lines:
    assert line in reason, (line, reason)
  assert why in reason
  assert f"the MoE lab measured nothing on {kind} (no_measurements.json has no entry)" in reason
  monkeypatch.setenv(tokamax_tuning.ENV, "/tmp/kept")
  if kind == "NVIDIA B200":
    assert "forward mosaic [autotuned by tokamax once per shape]" in platform.expert_impl(
        "gmm", "gpu", kind)[1]


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
  from tst_jax.models import experts as moe_experts   # pylint: disable=import-outside-toplevel
  n, d, f, e, p = 10, 6, 5, 4, 3                                       # A = 30 -> R = 64
  k = jax.random.split(jax.random.key(1), 6)
  x = jax.random.normal(k[0], (n, d))
  ids = jnp.argsort(jax.random.uniform(k[1], (n, e)), axis=1)[:, :p].astype(jnp.int32)
  weights = jax.nn.softmax(jax.random.normal(k[2], (n, p)))
  gate, up = jax.random.normal(k[3], (e, d, f)), jax.random.normal(k[4], (e, d, f))
  down = jax.random.normal(k[5], (e, f, d))
  _, kernels, _ = platform.grouped_matmul_backend("gpu", H100)
  gmm = lambda *a: moe_experts.experts_gmm(*a, backend="tokamax", kernels=kernels)

  def loss(impl):
    return lambda x, w, g, u, dn: jnp.sum(jnp.sin(impl(x, ids, w, g, u, dn)))
  args = (x, weights, gate, up, down)
  grad = lambda impl: jax.grad(loss(impl), argnums=(0, 1, 2, 3, 4))
  assert _row_pads(jax.make_jaxpr(grad(gmm))(*args).jaxpr) == []
  for got, want in zip(grad(gmm)(*args), grad(moe_experts.experts_dense)(*args)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gmm(x, ids, *args[1:]), moe_experts.experts_dense(x, ids, *args[1:]),
                             rtol=1e-5, atol=1e-5)
  assert {c["rows"] for c in fake_tokamax.calls} == {64}


def _measure(path, device_kind, passes=None, tuned=()):
  """A gemm_measured.json at `path` holding one device's measurements."""
  gemm_measured.write(gemm_measured.record({}, device_kind, "a test's numbers",
                                           passes or {}, list(tuned)), str(path))


def test_tuned_and_pinned_configs_run_as_is_and_tokamax_tunes_the_rest(fake_tokamax, capsys):
  """Each call's config: the MoE lab's tuned one for its exact shapes on this device (the
  forward here), else the pinned one (dW), else tokamax's, autotuned once per shape (dX, the
  one product tuned); the fallback kernels keep their pins; each call says its choice once."""
  x, w = jnp.ones((64, 3), jnp.bfloat16), jnp.ones((2, 3, 5), jnp.bfloat16)
  sizes = jnp.asarray([30, 34], jnp.int32)
  tuned = dict(block_m=64, block_n=32, block_k=128, num_stages=2, split_k=1)
  _measure(gemm_measured.FILE, jax.devices()[0].device_kind, tuned=[dict(
      product="forward", kernel="mosaic", lhs="bfloat16[64,3]", rhs="bfloat16[2,3,5]",
      out="None", config=tuned, ms=0.1, start_ms=0.2, candidates=30, search_s=40.0)])
  pinned = dict(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=5)
  kernels = gm.Kernels(forward=("mosaic", "triton"), dx=("mosaic",), dw=("triton", "mosaic"),
                       pinned=(("dw", "triton", json.dumps(pinned)),
                               ("forward", "triton", json.dumps(pinned))))
  grad = jax.grad(lambda x, w: gm.grouped_matmul(x, w, sizes, "tokamax", kernels).astype(
      jnp.float32).sum(), argnums=(0, 1))
  got = jax.jit(grad)(x, w)
  want = jax.grad(lambda x, w: gm.grouped_matmul(x, w, sizes).astype(jnp.float32).sum(),
                  argnums=(0, 1))(x, w)
  for g, r in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32))
  by_product = {next(p for p, d in gm._DIMS.items() if d == c["dims"]): c
                for c in fake_tokamax.calls}
  assert by_product["forward"]["configs"] == (FakeMosaicConfig(**tuned),
                                              FakeTritonConfig(**pinned))
  assert by_product["dw"]["configs"] == (FakeTritonConfig(**pinned), None)
  assert by_product["dx"]["configs"] == (None,)
  assert fake_tokamax.tuned == [[(64, 5), (2, 3, 5), (2,)]]           # dX's shapes alone
  assert [c["entered"] for c in fake_tokamax.calls] == [0, 1, 1]     # forward, dX, dW
  said = capsys.readouterr().err.splitlines()
  assert [line.split(": ", 2)[-1].split(",")[0] for line in said if ", config" in line] == [
      "mosaic", "mosaic", "triton"]
  assert any("forward bfloat16[64,3] x bfloat16[2,3,5]: mosaic, config tuned" in l for l in said)
  assert any("dx bfloat16[64,5] x bfloat16[2,3,5]: mosaic, config by tokamax" in l for l in said)
  jax.block_until_ready(jax.jit(grad)(x * 2, w))                      # said once per call
  assert not [l for l in capsys.readouterr().err.splitlines() if ", config" in l]


def test_a_config_the_installed_tokamax_refuses_runs_tokamaxs_own(fake_tokamax, capsys):
  """A pinned config with a field the installed tokamax's Config lacks (another version's):
  that kernel runs tokamax's own config, which is autotuned, and the line says why."""
  kernels = gm.Kernels(forward=("mosaic",), pinned=(
      ("forward", "mosaic", json.dumps(dict(block_m=128, block_n=64, block_k=128, num_stages=4,
                                            split_k=1, swizzle=128))),))
  x, w, sizes = jnp.ones((64, 3)), jnp.ones((2, 3, 5)), jnp.asarray([30, 34], jnp.int32)
  np.testing.assert_allclose(gm.grouped_matmul(x, w, sizes, "tokamax", kernels),
                             gm.grouped_matmul(x, w, sizes))
  assert fake_tokamax.calls[0]["configs"] == (None,) and len(fake_tokamax.tuned) == 1
  said = capsys.readouterr().err
  assert "mosaic, config by tokamax" in said and "mosaic's config refused by tokamax " \
      "(TypeError" in said and "swizzle" in said


def test_the_kernel_of_each_product_is_what_the_lab_measured_fastest(fake_tokamax):
  """Where the MoE lab timed a product's kernels on this GPU (gemm_measured.json), the fastest
  of them, summed over the shapes that timed both, runs first, and the plan says the times;
  products it did not time keep the table's order."""
  kind = "NVIDIA H200"
  _measure(gemm_measured.FILE, kind, passes={
      "recipe": {"forward": {"mosaic": 2.0, "triton": 1.5}, "dw": {"mosaic": 4.1, "triton": 1.2}},
      "b10": {"forward": {"mosaic": 1.0, "triton": 1.8}, "dw": {"triton": 0.9}}})
  assert gemm_measured.pass_times(kind) == {"forward": {"mosaic": 3.0, "triton": 3.3},
                                            "dw": {"triton": 2.1}}
  _, kernels, why = platform.grouped_matmul_backend("gpu", kind)
  assert (kernels.forward, kernels.dx, kernels.dw) == (("mosaic", "triton"),
                                                       ("mosaic", "triton"),
                                                       ("triton", "mosaic"))
  assert ("measured fastest by the MoE lab: forward mosaic: mosaic 3 ms vs triton 3.3 ms, "
          "dw triton: triton 2.1 ms") in why
  assert "the MoE lab measured 2 shapes' kernels and tuned 0 calls on NVIDIA H200" in why
  _measure(gemm_measured.FILE, kind, passes={"recipe": {"dx": {"mosaic": 2.0, "triton": 1.0}}})
  assert platform.grouped_matmul_backend("gpu", kind)[1].dx == ("triton", "mosaic")
