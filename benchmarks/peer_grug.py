r"""The JAX MoE peer: Levanter's Grug MoE layer timed forward+backward at the MoE lab's shapes,
as JSON lines that sit beside benchmarks/moe_lab.py's `layer` rows.

  bash benchmarks/peer_wheels.sh                     # once, on a machine with PyPI: ./.whl_peer
  bash benchmarks/peer_wheels.sh --install /tmp/peer_site && \
      PYTHONPATH=/tmp/peer_site:$PYTHONPATH python3 benchmarks/peer_grug.py
  ... python3 benchmarks/peer_grug.py --tiny         # the tiny shape: CPU, a check that it runs

The peer is `levanter.grug.grug_moe.moe_mlp` (marin-levanter, with haliax's ragged_dot from
marin-haliax), installed with --no-deps. It takes routing already made, so a row's layer is
the lab's: moe.route on the lab's inputs (moe_lab.make_case), then the peer's dispatch, three
grouped GEMMs and combine, timed by moe_lab.timed. Its backends: `sonic` combines with a Triton
gather-sum over each token's k rows and needs jax-triton and triton; `scatter` combines with a
scatter-add and runs anywhere. Their GEMMs are haliax's ragged_dot, a Pallas-Triton kernel on
GPUs and XLA's ragged_dot_general elsewhere. FLOPs are the lab's `layer` count.

Before timing, each backend is checked in float32 at the tiny shape against
tst_jax.models.moe_experts.experts_dense, on the same routing and weights: values and gradients.
marin-levanter pins jax below what the GPU image has; the rows run anyway and say so
(`jax_pin`, `pin_met`). A peer that cannot be imported is one line with `skipped` and the reason.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import types

import jax
import jax.numpy as jnp

import moe_lab   # benchmarks/moe_lab.py: the shapes, the inputs and the timing of the lab's rows
from tst_jax import platform
from tst_jax.models import experts as moe_experts, moe

DIST = "marin-levanter"


def jax_pin() -> tuple[str | None, bool | None]:
  """Returns marin-levanter's jax requirement and whether this jax meets it (None: unknown)."""
  try:
    from packaging.requirements import Requirement   # pylint: disable=import-outside-toplevel
    requires = importlib.metadata.requires(DIST) or ()
  except (ImportError, importlib.metadata.PackageNotFoundError):
    return None, None
  pins = [r.specifier for r in map(Requirement, requires) if r.name == "jax" and not r.marker]
  return (str(pins[0]), pins[0].contains(jax.__version__)) if pins else (None, None)


def triton_status() -> str:
  """Imports jax-triton for sonic's combine and returns its version, or why it cannot be used.

  jax-triton raises ImportError where jaxlib lacks GPU Triton support, which sonic.py does not
  catch: hidden after such a failure, it lets sonic.py take its own no-Triton branch and the
  scatter backend still import.
  """
  try:
    import jax_triton  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return importlib.metadata.version("jax-triton")
  except Exception as e:   # pylint: disable=broad-except  (any failure only rules out sonic)
    sys.modules["jax_triton"] = None
    return f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def load_grug():
  """Imports and returns levanter.grug.grug_moe, and the peer's versions as a dict.

  levanter/__init__.py imports the whole trainer and its many dependencies: a bare package
  module in its place lets the grug modules, which need only equinox, jaxtyping and haliax,
  import alone.
  """
  spec = importlib.util.find_spec("levanter")
  if spec is None:
    raise ImportError(f"{DIST} is not on the path: bash benchmarks/peer_wheels.sh --install DIR")
  package = types.ModuleType("levanter")
  package.__path__ = list(spec.submodule_search_locations)
  sys.modules.setdefault("levanter", package)
  jax_triton = triton_status()
  from levanter.grug import grug_moe   # pylint: disable=import-outside-toplevel
  pin, met = jax_pin()
  return grug_moe, dict(levanter=importlib.metadata.version(DIST),
                        haliax=importlib.metadata.version("marin-haliax"), jax=jax.__version__,
                        jax_pin=pin, pin_met=met, jax_triton=jax_triton)


def ragged_dot_fell_back() -> bool:
  """Returns whether haliax's ragged_dot has fallen back from its Pallas-Triton kernel to XLA's
  ragged_dot_general in this process: a GPU row then times XLA's, which does E times the work."""
  module = sys.modules.get("haliax.nn.ragged_dot")
  return bool(getattr(module, "_HAS_WARNED_AUTO_FALLBACK", False))   # it warns only once


def layer(grug_moe, case, impl: str):
  """Returns the lab's MoE layer with the peer's experts: route, then grug's moe_mlp."""
  def fn(x_NxD, router_DxE, w13_ExDx2F, down_ExFxD):
    weights_NxP, ids_NxP, aux = moe.route(x_NxD, router_DxE, case.cfg)
    out_NxD = grug_moe.moe_mlp(x_NxD, ids_NxP, weights_NxP, w13_ExDx2F, down_ExFxD,
                               implementation=impl)
    return out_NxD, aux["lb_loss"]
  return fn


def check(grug_moe, impl: str) -> dict:
  """Compares the peer's moe_mlp with experts_dense in float32 at the tiny shape: values and
  the gradients of <out, ct> for x and the three expert weights, as max |diff| / max |ref|."""
  case = moe_lab.make_case("tiny")
  f32 = lambda a: a.astype(jnp.float32)
  x, gate, up, down = f32(case.x_NxD), *map(f32, case.experts)
  weights, ids = case.weights_NxP, case.ids_NxP
  ct = jax.random.normal(jax.random.key(2), x.shape, jnp.float32)
  peer = lambda x, g, u, d: grug_moe.moe_mlp(x, ids, weights, jnp.concatenate([g, u], -1), d,
                                             implementation=impl)
  ref = lambda x, g, u, d: moe_experts.experts_dense(x, ids, weights, g, u, d)
  outs, grads = [], []
  for fn in (peer, ref):
    out, vjp = jax.vjp(jax.jit(fn), x, gate, up, down)
    outs.append(out)
    grads.append(vjp(ct))
  rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
  return dict(peer="grug", check="experts_dense", impl=f"grug:{impl}", shape="tiny",
              out_shape=list(outs[0].shape), finite=bool(jnp.isfinite(outs[0]).all()),
              rel_err=rel(*outs), grad_rel_err=max(rel(a, b) for a, b in zip(*grads)))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", default="recipe,b10", help=f"of {tuple(moe_lab.SHAPES)}")
  p.add_argument("--tiny", action="store_true", help="the tiny shape only")
  p.add_argument("--impls", default=None, help="grug backends; default sonic,scatter on a "
                 "GPU, scatter elsewhere (sonic's combine is a Triton kernel)")
  p.add_argument("--repeats", type=int, default=10)
  args = p.parse_args(argv)
  gpu = jax.default_backend() == "gpu"
  impls = (args.impls or ("sonic,scatter" if gpu else "scatter")).split(",")
  try:
    grug_moe, versions = load_grug()
  except Exception as e:   # pylint: disable=broad-except  (a peer that does not import is a row)
    pin, met = jax_pin()
    print(json.dumps(dict(peer="grug", skipped=f"{type(e).__name__}: {str(e)[:300]}",
                          jax=jax.__version__, jax_pin=pin, pin_met=met)), flush=True)
    return
  kind = jax.devices()[0].device_kind
  peak = platform.peak_flops(kind)
  for impl in impls:
    try:
      print(json.dumps(dict(check(grug_moe, impl), **versions)), flush=True)
    except Exception as e:   # pylint: disable=broad-except
      print(json.dumps(dict(peer="grug", check="experts_dense", impl=f"grug:{impl}",
                            failed=f"{type(e).__name__}: {str(e)[:300]}", **versions)),
            flush=True)
  for name in ["tiny"] if args.tiny else args.shapes.split(","):
    case = moe_lab.make_case(name)
    gate, up, down = case.experts
    inputs = (case.x_NxD, case.router_DxE, jnp.concatenate([gate, up], -1), down)
    flops = moe_lab.layer_flops(case)
    for impl in impls:
      base = dict(lab=True, peer="grug", shape=name, piece="layer", impl=f"grug:{impl}",
                  mode="fwd_bwd", device=kind,
                  ragged_dot=os.environ.get("RAGGED_DOT_IMPL", "auto"), **versions)
      fn = moe_lab.with_grad(layer(grug_moe, case, impl), (0, 1, 2, 3))
      try:
        compile_s, seconds = moe_lab.timed(fn, inputs, args.repeats)
      except Exception as e:   # pylint: disable=broad-except  (a row that fails is a finding)
        print(json.dumps(dict(base, failed=f"{type(e).__name__}: {str(e)[:300]}")), flush=True)
        continue
      print(json.dumps(dict(
          base, ragged_dot_fell_back=ragged_dot_fell_back(), ms=1e3 * seconds,
          fwd_bwd_ms=1e3 * seconds, compile_s=round(compile_s, 3), flops=3 * flops,
          tflops=3 * flops / seconds / 1e12,
          of_peak=3 * flops / seconds / peak if peak else None)), flush=True)


if __name__ == "__main__":
  main()
