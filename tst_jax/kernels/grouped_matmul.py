"""Grouped matmul, the MoE experts' GEMM: rows sorted by group, each group times its own weights.

Letters: A rows (expert assignments, sorted by expert), E groups (experts), I inputs, O outputs,
C rows of a kernel tile. x [A, I] @ w [E, I, O] with group sizes [E] -> [A, O]: rows
[s_e, s_e + sizes[e]) times w[e], where s_e is the sum of the earlier sizes. Rows past the last
group (assignments another expert-parallel shard computes) come out 0 and get no gradient.

`grouped_matmul` has a custom VJP whose backward is grouped too, three products in all:
  forward  y = x @ w[e] per group                     (ragged rows, w's group dimension)
  dx       dx = dy @ w[e]ᵀ per group                  (the same, contracting w's O)
  dw       dw[e] = x_eᵀ · dy_e, one GEMM whose ragged dimension is the contracted rows
Neither builds an [A, E] array or pads a group to the largest one. Backends:
  xla      jax.lax.ragged_dot_general, native on TPU. XLA:CPU and released jaxlib GPU builds
           expand it to a masked dense matmul over every group, E times the work.
  tokamax  tokamax.ragged_dot_general from the OpenXLA kernel library, the `gpu` extra. Each
           product runs on the Mosaic GPU or Triton kernel that `Kernels` names, picked by
           `platform.grouped_matmul_backend` from measurements. Rows come in whole tiles of
           C = 64, padded once at the entry. Each call's tile configuration is, in this order,
           the one the MoE lab's search found for its exact shapes on this GPU
           (`gemm_measured`), the one `Kernels` pins for the product and kernel, or tokamax's:
           `tokamax_tuning` autotunes the shape once, or with tuning off tokamax's own table
           where it lists the shape, else its heuristic tile (`choose`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.resources
import inspect
import json
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tst_jax.kernels import gemm_measured, tokamax_tuning
from tst_jax.parallel import varying

BACKENDS = ("xla", "tokamax")
# C: tokamax's Mosaic GPU kernels take rows in whole tiles, of 8 in the forward on an H100 and
# of 64 in dW's on an H200; 64 is both, and costs at most 63 padding rows.
ROW_TILE = 64
# The three products as ragged_dot_general dimension numbers (tokamax's names for them:
# DEFAULT, TRANS_RHS and RAGGED_CONTRACTING_DOT_DIM_NUMS), so both backends see the same calls.
_DIMS = {
    "forward": jax.lax.RaggedDotDimensionNumbers(   # x [A, I] · w [E, I, O]: contract I
        dot_dimension_numbers=(([1], [1]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[0]),
    "dx": jax.lax.RaggedDotDimensionNumbers(        # dy [A, O] · w [E, I, O]: contract O
        dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[0]),
    "dw": jax.lax.RaggedDotDimensionNumbers(        # x [A, I] · dy [A, O]: contract the rows
        dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[]),
}


PRODUCTS = gemm_measured.PRODUCTS
# Where a call's tile configuration comes from (`choose`): the MoE lab's search at its exact
# shapes, the product's pinned one, or tokamax's own choice.
TUNED, PINNED, TOKAMAX = "tuned", "pinned", "tokamax"
# The autotuning table each kernel reads in tokamax 0.0.17, tokamax/data/autotuning/<device>/.
_TABLES = {"mosaic": "pallas_mosaic_gpu_ragged_dot", "triton": "triton_ragged_dot"}
# tokamax 0.0.17's own kernel order on an NVIDIA GPU, of those it registers (its api's
# _DEFAULT_IMPLEMENTATIONS): what a product that names no kernels runs.
TOKAMAX_ORDER = ("mosaic", "triton", "xla")
# The oldest jax-triton that traces tokamax 0.0.17's Triton kernels: its triton_call takes their
# out_type from 0.4.0 and their None arguments from 0.4.1, below which tokamax's own test skips.
JAX_TRITON_MIN = (0, 4, 1)
_ANNOUNCED: set = set()   # the calls whose choice this process has said


class Kernels(NamedTuple):
  """tokamax's `implementation=` for each product: kernel names, of which the first that runs
  wins, as tokamax falls back past a NotImplementedError. None keeps tokamax's own order.
  `pinned` holds (product, kernel, tokamax's tile config as JSON) for the pairs that run a
  fixed config; the others run tokamax's choice."""
  forward: tuple[str, ...] | None = None
  dx: tuple[str, ...] | None = None
  dw: tuple[str, ...] | None = None
  pinned: tuple[tuple[str, str, str], ...] = ()

  def order(self, product: str) -> tuple[str, ...] | None:
    return getattr(self, product)

  def config(self, product: str, kernel: str) -> dict | None:
    """Returns the config pinned for `kernel` in `product`, None where none is."""
    return next((json.loads(c) for p, k, c in self.pinned if (p, k) == (product, kernel)), None)

  def line(self) -> str:
    return ", ".join(f"{p} {'/'.join(k) if k else 'default'}"
                     for p, k in zip(PRODUCTS, self[:3]))

  def within(self, names) -> Kernels:
    """Returns these kernels less those not in `names`; a product left with none, or naming
    none, runs tokamax's own order less them, which tokamax would otherwise try."""
    kept = [tuple(n for n in k or () if n in names)
            or tuple(n for n in TOKAMAX_ORDER if n in names) or None for k in self[:3]]
    return Kernels(*kept, tuple(p for p in self.pinned if p[1] in names))


def choose(kernels: Kernels, product: str, device_kind: str, lhs: str, rhs: str, out: str
           ) -> tuple[list[tuple[str, dict | None]], str]:
  """Returns each kernel of `product` in tokamax's order with the tile config it runs (None:
  tokamax's choice), and where the first kernel's comes from: TUNED, PINNED or TOKAMAX.

  A kernel runs the config the MoE lab's search found for this exact call on `device_kind`
  (`lhs`, `rhs` and `out` as `gemm_measured.signature` writes them), else the one `kernels`
  pins, else tokamax's. A run's pinned or tuned config is used as is: tokamax autotunes only
  where the first kernel has neither.
  """
  chosen, sources = [], []
  for kernel in kernels.order(product) or ():
    tuned = gemm_measured.tuned_config(device_kind, product, kernel, lhs, rhs, out)
    pinned = kernels.config(product, kernel)
    chosen.append((kernel, tuned if tuned is not None else pinned))
    sources.append(TUNED if tuned is not None else PINNED if pinned is not None else TOKAMAX)
  return chosen, sources[0] if sources else TOKAMAX


def tokamax_kernels() -> frozenset[str] | None:
  """Returns the kernel names the installed tokamax can run, "mosaic" among them where it has
  a Mosaic kernel; None where it does not say. Its Triton kernels need jax-triton and triton,
  which tokamax does not install: without them it knows no "triton" and refuses the name, and
  with a jax_triton that cannot trace them (`triton_call_refused`) "triton" is left out."""
  try:   # tokamax lists them in no public name
    from tokamax._src.ops.ragged_dot import api   # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  names = set(getattr(api, "IMPLEMENTATIONS", ()))
  if "triton" in names and triton_call_refused():
    names.discard("triton")
  if any(n.startswith("mosaic") for n in names):
    names.add("mosaic")
  return frozenset(names) or None


def triton_unavailable() -> str | None:
  """Says why tokamax's Triton kernels cannot run here, None where triton and jax_triton
  import and jax_triton traces them: tokamax registers them where both import, and installs
  neither."""
  for module in ("triton", "jax_triton"):
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except  (a broken install fails otherwise)
      return f"{module} does not import ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
  return triton_call_refused()


def triton_call_refused() -> str | None:
  """Says why the installed jax_triton cannot trace tokamax's Triton kernels, None where it
  can or does not import. An older triton_call fails their trace with a TypeError, which
  tokamax does not fall back past as it does past a NotImplementedError."""
  try:
    jax_triton = importlib.import_module("jax_triton")
  except Exception:  # pylint: disable=broad-except  (triton_unavailable says why)
    return None
  version = getattr(jax_triton, "__version__", "of no version")
  need = ".".join(map(str, JAX_TRITON_MIN))
  if "out_type" not in inspect.signature(jax_triton.triton_call).parameters:
    return (f"jax_triton {version}'s triton_call takes no out_type, which tokamax's Triton "
            f"kernels pass: they need jax-triton >= {need} (with triton >= 3.7)")
  if tuple(getattr(jax_triton, "__version_info__", ())) < JAX_TRITON_MIN:
    return (f"jax_triton {version} is older than the {need} tokamax's Triton kernels need "
            "(with triton >= 3.7)")
  return None


def tokamax_table(kernel: str, device_kind: str) -> bool | None:
  """Says whether the installed tokamax ships an autotuning table of `kernel` for
  `device_kind`, which it reads itself for the shapes the table lists; None where it cannot
  tell."""
  if kernel not in _TABLES:
    return None
  try:
    root = importlib.resources.files("tokamax")
  except (ModuleNotFoundError, TypeError, ValueError):
    return None
  folder = device_kind.lower().replace(" ", "_")
  return root.joinpath("data", "autotuning", folder, _TABLES[kernel] + ".json").is_file()


def tokamax_version() -> str | None:
  """Returns the installed tokamax's version without importing it, None when not installed."""
  try:
    return importlib.metadata.version("tokamax")
  except importlib.metadata.PackageNotFoundError:
    return None


def row_tile(backend: str) -> int:
  """C: the row count `backend`'s kernels take in whole multiples of (1: any)."""
  return ROW_TILE if backend == "tokamax" else 1


def grouped_matmul(x_AxI, w_ExIxO, sizes_E, backend: str = "xla", kernels: Kernels = Kernels(),
                   tail: bool = True):
  """x [A, I] rows in group order, w [E, I, O], sizes [E] (int32) -> [A, O] in x's dtype.

  Rows that are not whole tiles of `row_tile(backend)` are padded here, once: x in the
  forward and, as the slice's transpose, dy in the backward, for all three products. The MoE
  dispatch lays out whole tiles itself (`moe_dispatch.sort_by_expert`), so a step pads none.
  Rows past the last group come out 0, and so does their part of dx, and the cotangent's are
  zeroed before dW: grouped GEMMs leave those rows undefined. `tail` False is the caller's
  word that no row lies past the groups, sum(sizes) = A: the three selects over the rows,
  one per product, are then left out."""
  if backend not in BACKENDS:
    raise ValueError(f"grouped matmul backend must be one of {BACKENDS}, got {backend!r}")
  rows = x_AxI.shape[0]
  pad = -rows % row_tile(backend)
  if pad:   # the padding rows lie past the last group: no expert computes them
    x_AxI = jnp.pad(x_AxI, ((0, pad), (0, 0)))
  y = _grouped(backend, kernels, tail, *varying.alike(x_AxI, w_ExIxO), sizes_E)
  return y[:rows] if pad else y


def _rows_in_groups(y_AxO, sizes_E, tail: bool):
  """Rows past the last group set to 0, grouped GEMMs leaving them undefined; without a
  `tail` there are none."""
  if not tail:
    return y_AxO
  valid_A = jnp.arange(y_AxO.shape[0]) < jnp.sum(sizes_E)
  return jnp.where(valid_A[:, None], y_AxO, jnp.zeros((), y_AxO.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _grouped(backend, kernels, tail, x_AxI, w_ExIxO, sizes_E):
  return _rows_in_groups(product("forward", x_AxI, w_ExIxO, sizes_E, backend, kernels,
                                 None), sizes_E, tail)   # None: x's dtype (w's too)


def _grouped_fwd(backend, kernels, tail, x_AxI, w_ExIxO, sizes_E):
  return _grouped(backend, kernels, tail, x_AxI, w_ExIxO, sizes_E), (x_AxI, w_ExIxO, sizes_E)


def _grouped_bwd(backend, kernels, tail, residuals, dy_AxO):
  x_AxI, w_ExIxO, sizes_E = residuals
  dy_AxO = _rows_in_groups(dy_AxO, sizes_E, tail).astype(x_AxI.dtype)   # dW reads none past
  dx_AxI = _rows_in_groups(product("dx", dy_AxO, w_ExIxO, sizes_E, backend, kernels,
                                   x_AxI.dtype), sizes_E, tail)
  # dW accumulates over up to A rows: float32 where XLA would otherwise add in the inputs'
  # dtype. tokamax's kernels accumulate in float32 inside and write w's dtype, as its own VJP.
  dw_ExIxO = product("dw", x_AxI, dy_AxO, sizes_E, backend, kernels,
                     jnp.float32 if backend == "xla" else w_ExIxO.dtype)
  return dx_AxI.astype(x_AxI.dtype), dw_ExIxO.astype(w_ExIxO.dtype), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


def product(name: str, lhs, rhs, sizes_E, backend: str = "xla", kernels: Kernels = Kernels(),
            out_dtype=None):
  """Runs one of the three products, forward, dx or dw (`_DIMS`), on `backend`: rows in
  whole tiles of `row_tile(backend)`, nothing past the groups zeroed."""
  dims = _DIMS[name]
  if backend == "xla":
    return jax.lax.ragged_dot_general(lhs, rhs, sizes_E, dims, preferred_element_type=out_dtype)
  return _tokamax(kernels, name, lhs, rhs, sizes_E, out_dtype)


def _tokamax(kernels, name, lhs, rhs, sizes_E, out_dtype):
  """tokamax.ragged_dot_general with each kernel's config as `choose` picks it."""
  import tokamax   # pylint: disable=g-import-not-at-top  (optional: the gpu extra)
  kind = jax.devices()[0].device_kind
  sig = (gemm_measured.signature(lhs.shape, lhs.dtype),
         gemm_measured.signature(rhs.shape, rhs.dtype), str(out_dtype and jnp.dtype(out_dtype)))
  chosen, source = choose(kernels, name, kind, *sig)
  implementation, refused = [], None
  for kernel, config in chosen:
    try:
      implementation.append(kernel if config is None else _configured(kernel, config))
    except (KeyError, TypeError, ValueError) as e:   # a tokamax whose config has other fields
      implementation.append(kernel)
      refused = refused or f"{kernel}'s config refused by tokamax ({type(e).__name__}: {e})"
  if refused and chosen and implementation[0] == chosen[0][0]:
    source = TOKAMAX
  call = functools.partial(tokamax.ragged_dot_general, ragged_dot_dimension_numbers=_DIMS[name],
                           preferred_element_type=out_dtype,
                           implementation=tuple(implementation) or None)
  _announce(name, sig, chosen, source, refused)
  context = (tokamax_tuning.tuned(call, lhs, rhs, sizes_E) if source == TOKAMAX
             else contextlib.nullcontext())
  with context:
    return call(lhs, rhs, sizes_E)


def _configured(kernel: str, config: dict):
  """Returns tokamax's `kernel` op with its tile config fixed to `config`."""
  from tokamax._src.ops.ragged_dot import api   # pylint: disable=g-import-not-at-top
  op = api.IMPLEMENTATIONS["mosaic_gpu" if kernel == "mosaic" else kernel]   # as tokamax maps
  return op.replace(config=op.config_cls(**config))                         # it on a GPU


def _announce(name, sig, chosen, source, refused):
  """Says once per process which kernel and config a call runs and where the config is from."""
  key = (name, sig, tuple((k, json.dumps(c, sort_keys=True)) for k, c in chosen))
  if key in _ANNOUNCED:
    return
  _ANNOUNCED.add(key)
  first = chosen[0] if chosen else ("tokamax's default", None)
  how = (f"config {source} {json.dumps(first[1], sort_keys=True)}" if source != TOKAMAX else
         f"config by tokamax: {tokamax_tuning.describe()}")
  sys.stderr.write(f"tokamax: {name} {sig[0]} x {sig[1]}: {first[0]}, {how}"
                   + (f"; {refused}" if refused else "") + "\n")
