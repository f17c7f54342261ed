"""FP8 linear layers (`model.matmul_precision=fp8`, tst_jax/kernels/fp8.py through qwix): one
einsum against a numpy quantize-dequantize reference, forward and both gradients; the model
near the default but not equal to it; f8 in the decoder's linear matmuls only (not the
superposed embedding, the attention scores, the LM head or the MCE loss); both phases train;
a bad value or a missing qwix is a ConfigError."""

import collections
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.fp8 import E4M3, E5M2, LINEARS, needs_qwix, qdq, x_for
from tests.fixtures.tiny import tiny_config
from tst_jax import models
from tst_jax.errors import ConfigError
from tst_jax.kernels import fp8
from tst_jax.models import layers
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import sections, spec as spec_lib
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import step as step_lib



def _grads(spec):
  """(dx(g, w), dw(x, g)) of `spec` for a cotangent g: the einsums of the transposed products."""
  x_subs, w_subs = spec.split("->")[0].split(",")
  out_subs = spec.split("->")[1]
  return (lambda a, b: np.einsum(f"{out_subs},{w_subs}->{x_subs}", a, b),
          lambda a, b: np.einsum(f"{x_subs},{out_subs}->{w_subs}", a, b))


@needs_qwix
@pytest.mark.parametrize("spec,w_shape", LINEARS)
def test_one_linear_layer_matches_a_numpy_fp8_reference(spec, w_shape):
  """Forward: x and w each to e4m3 with one absmax scale, the product in float64. Backward:
  the cotangent to e5m2 the same way, times the forward's e4m3 operands. Agreement to float32
  rounding (the reference rounds the same numbers); jit and no-jit alike."""
  rng = np.random.default_rng(0)
  x = x_for(spec, w_shape, rng)
  w = (0.1 * rng.normal(size=w_shape)).astype(np.float32)
  mag = np.einsum(spec, np.abs(x).astype(np.float64), np.abs(w))     # the product's scale
  for fn in (fp8.einsum, jax.jit(fp8.einsum, static_argnums=0)):
    out, vjp = jax.vjp(lambda a, b: fn(spec, a, b), jnp.asarray(x), jnp.asarray(w))
    assert out.dtype == jnp.float32
    np.testing.assert_array_less(np.abs(out - np.einsum(spec, qdq(x, E4M3), qdq(w, E4M3))),
                                 1e-6 * mag + 1e-30)
    g = rng.normal(size=out.shape).astype(np.float32)
    dx, dw = vjp(jnp.asarray(g))
    dx_of, dw_of = _grads(spec)
    np.testing.assert_array_less(np.abs(dx - dx_of(qdq(g, E5M2), qdq(w, E4M3))),
                                 1e-6 * dx_of(np.abs(g), np.abs(w)) + 1e-30)
    np.testing.assert_array_less(np.abs(dw - dw_of(qdq(x, E4M3), qdq(g, E5M2))),
                                 1e-6 * dw_of(np.abs(x), np.abs(g)) + 1e-30)


def _models():
  """The tiny Llama in bfloat16 with default and with fp8 matmuls, the same parameters."""
  base, quant = (spec_lib.check(tiny_config(model=dict(
      dtype="bfloat16", matmul_precision=p))).model.build(nnx.Rngs(0)) for p in ("default", "fp8"))
  nnx.update(quant, nnx.state(base, nnx.Param))
  return base, quant


@needs_qwix
@pytest.mark.slow
def test_model_forward_and_loss_are_near_the_default_but_not_equal():
  """Logits and the loss of tokens and of bags: within 2^-3 (e4m3's relative step) of the
  default's, and not equal (fp8 runs)."""
  base, quant = _models()
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 512, (4, 16)), jnp.int32)
  bags = jnp.asarray(rng.integers(0, 512, (4, 16, 2)), jnp.int32)
  targets = jnp.asarray(rng.integers(0, 512, (4, 16, 2)), jnp.int32)
  loss_cfg = sections.Loss("naive")
  for inputs in (tokens, bags):
    logits_b, logits_q = (np.asarray(m(inputs), np.float32) for m in (base, quant))
    scale = np.abs(logits_b).max()
    assert 0 < np.abs(logits_q - logits_b).max() < 2**-3 * scale
    loss_b, loss_q = (float(step_lib.lm_loss(m, m(inputs, return_hidden=True), targets,
                                             loss_cfg)) for m in (base, quant))
    assert loss_b != loss_q and abs(loss_q - loss_b) < 2**-3 * loss_b


@needs_qwix
def test_superposed_embedding_and_loss_are_untouched():
  """The superposed embedding of bags and the LM head + MCE loss of a given hidden state are
  bit-identical with and without fp8: only the decoder blocks change."""
  base, quant = _models()
  rng = np.random.default_rng(0)
  bags = jnp.asarray(rng.integers(0, 512, (4, 16, 2)), jnp.int32)
  targets = jnp.asarray(rng.integers(0, 512, (4, 16, 2)), jnp.int32)
  np.testing.assert_array_equal(base.embed(bags), quant.embed(bags))
  hidden = jnp.asarray(rng.normal(size=(4, 16, 32)), jnp.bfloat16)
  for impl in ("naive", "xla"):
    loss_cfg = sections.Loss(impl)
    assert float(step_lib.lm_loss(base, hidden, targets, loss_cfg)) == float(
        step_lib.lm_loss(quant, hidden, targets, loss_cfg))


def _dots(closed_jaxpr) -> collections.Counter:
  """(lhs dtype, rhs dtype) of every dot_general in a jaxpr, nested jaxprs included."""
  found = collections.Counter()

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found[tuple(str(v.aval.dtype) for v in eqn.invars)] += 1
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            walk(sub)
  walk(closed_jaxpr.jaxpr)
  return found


@needs_qwix
def test_f8_only_in_the_decoder_linear_matmuls():
  """The differentiated loss of each phase: the 7 linear matmuls of the (scanned) block run
  as e4m3 x e4m3 forward and as e5m2 x e4m3 in the 14 of their backward; every other matmul
  (attention scores, the LM head and the loss, forward and backward) is the default's."""
  c = tiny_config(model=dict(dtype="bfloat16"))
  base, quant = _models()
  for phase in spec_lib.check(c).plan.phases:
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32)
    found = {}
    for name, model in (("default", base), ("fp8", quant)):
      graphdef, params = nnx.split(model, nnx.Param)
      loss = lambda p, w, g=graphdef, ph=phase: step_lib.loss(nnx.merge(g, p), w, ph,
                                                              sections.Loss("naive"))[0]
      found[name] = _dots(jax.make_jaxpr(jax.grad(loss))(params, window))
    f8 = {k: v for k, v in found["fp8"].items() if "float8" in k[0] + k[1]}
    assert f8 == {("float8_e4m3fn", "float8_e4m3fn"): 7, ("float8_e5m2", "float8_e4m3fn"): 14}
    rest = found["fp8"] - collections.Counter(f8)
    assert rest + collections.Counter({("bfloat16", "bfloat16"): 21}) == found["default"]


@needs_qwix
@pytest.mark.slow
def test_gradients_reach_every_decoder_weight():
  """fp8 gradients of the tst loss: finite and nonzero for every parameter, and pointing as
  the default's do (cosine > 0.99 per tensor)."""
  c = tiny_config(model=dict(dtype="bfloat16"))
  tst = spec_lib.check(c).plan.phases[0]
  window = jnp.asarray(np.random.default_rng(0).integers(0, 512, (4, tst.window)), jnp.int32)
  grads = {}
  for name, model in zip(("default", "fp8"), _models()):
    graphdef, params = nnx.split(model, nnx.Param)
    grads[name] = jax.grad(lambda p, g=graphdef: step_lib.loss(
        nnx.merge(g, p), window, tst, sections.Loss("naive"))[0])(params)
  flat_b = dict(jax.tree_util.tree_leaves_with_path(grads["default"]))
  flat_q = jax.tree_util.tree_leaves_with_path(grads["fp8"])
  assert any("blocks" in jax.tree_util.keystr(path) for path, _ in flat_q)
  for path, gq in flat_q:
    gq, gb = np.asarray(gq, np.float64).ravel(), np.asarray(flat_b[path], np.float64).ravel()
    name = jax.tree_util.keystr(path)
    assert np.isfinite(gq).all() and np.abs(gq).max() > 0, name
    assert gq @ gb / np.linalg.norm(gq) / np.linalg.norm(gb) > 0.99, name


@pytest.mark.slow   # test_gradients_reach_every_decoder_weight keeps fp8 training in the default run
@needs_qwix
def test_both_phases_train_with_fp8_as_the_default_does(tmp_path):
  """A tiny two-phase run with fp8: tst then ntp steps, the train loss falls in each phase,
  and the held-out losses at the switch and at the end are within 0.02 of the default's."""
  summaries, records = {}, {}
  for precision in ("default", "fp8"):
    workdir = tmp_path / precision
    summaries[precision] = cli.run(tiny_config(model=dict(matmul_precision=precision)),
                                    str(workdir))
    records[precision] = [r for r in workdir_lib.read_metrics(RunDir(workdir))
                          if "loss" in r]
  assert [r["phase"] for r in records["fp8"]] == ["tst"] * 6 + ["ntp"] * 6
  for phase in ("tst", "ntp"):
    losses = [r["loss"] for r in records["fp8"] if r["phase"] == phase]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], (phase, losses)
  for key in ("phase1_end_eval_loss", "final_eval_loss"):
    assert abs(summaries["fp8"][key] - summaries["default"][key]) < 0.02, key


@pytest.mark.parametrize("value", ["fp16", "FP8", "", None])
def test_a_bad_value_is_a_config_error_naming_the_field(value):
  c = tiny_config()
  with c.unlocked():
    c.model.matmul_precision = value
  with pytest.raises(ConfigError, match=r"^config\.model\.matmul_precision: must be one of") as e:
    spec_lib.check(c)
  assert e.value.field == "model.matmul_precision"


def test_without_qwix_fp8_is_a_config_error_with_the_pip_command(monkeypatch):
  """Checked before anything is built (check_devices), and again where fp8 is first used."""
  for name in [m for m in sys.modules if m.split(".")[0] == "qwix"] + ["qwix"]:
    monkeypatch.setitem(sys.modules, name, None)      # importing qwix now fails
  spec = spec_lib.check(tiny_config(model=dict(matmul_precision="fp8"))).on_platform()
  for fails in (lambda: spec.check_devices(8),
                lambda: fp8.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4)))):
    with pytest.raises(ConfigError, match=r"pip install 'tst-jax\[fp8\]'") as e:
      fails()
    assert e.value.field == "model.matmul_precision"
  spec_lib.check(tiny_config()).on_platform().check_devices(8)   # the default needs no qwix
