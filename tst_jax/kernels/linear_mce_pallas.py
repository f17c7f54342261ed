"""Fused linear + multi-hot CE as Pallas kernels: the entry point, its custom VJP, Triton kernels.

The Triton kernels run on GPU. The TPU's Mosaic kernels are in linear_mce_tpu.py and the tile
math both share in linear_mce_tiles.py. On CPU the kernels are interpreted.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from tst_jax.kernels import linear_mce_tpu, target
from tst_jax.kernels.linear_mce_tiles import (TileConfig, column_ids, d_logits, dot, dot_nt,
                                              dot_tn, gather, mask_padded, online_lse)
from tst_jax.superposition import IGNORE_INDEX

# Letters: N tokens, D model dim, V vocabulary, S bag size, C rows of one tile or chunk, and
# bn, bd, bv the tile sizes.
BACKENDS = ("auto", "triton", "mosaic_tpu")
# Per-backend block_n, block_v, block_d. Triton needs powers of two >= 16, and its tiles are
# the fastest of benchmarks/loss_tiles.py's sweep on an H100. Mosaic wants multiples of 8 x 128
# and MXU-sized tiles.
DEFAULT_BLOCKS = {"triton": (128, 256, 64), "mosaic_tpu": (256, 512, 512)}


@target.jit(static_argnames=(
    "ignore_index", "backend", "interpret", "block_n", "block_v", "block_d", "v_splits",
    "num_warps", "num_stages", "vmem_limit_bytes", "bwd_rows"))
def lse_and_target_logits(hidden_NxD, head_DxV, targets_NxS, *, ignore_index=IGNORE_INDEX,
                          backend: str = "auto", interpret: bool | None = None,
                          block_n: int | None = None, block_v: int | None = None,
                          block_d: int | None = None, v_splits: int | None = None,
                          num_warps: int | None = None, num_stages: int | None = None,
                          vmem_limit_bytes: int | None = None, bwd_rows: int = 1024,
                          platform: str):
  """Returns the per-row logsumexp [N] and target logits [N, S] of `hidden @ head` in float32.

  Matmuls take the input dtype, bf16 on accelerators, and accumulate in float32. No pass writes
  [N, V] logits. The Triton backward writes d logits one chunk of `bwd_rows` rows at a time,
  [bwd_rows, V] in the input dtype, and gets d_hidden and d_head from two XLA matmuls per
  chunk. `backend` is "triton" on GPU, "mosaic_tpu" on TPU, or "auto" to pick by platform,
  with Triton-style kernels interpreted on CPU. interpret defaults to True on CPU. Ignored
  targets get logit 0 and no gradient. Triton's v_splits splits the vocabulary of each row
  block over programs, for occupancy when N / block_n is small.
  """
  n, d = hidden_NxD.shape
  v = head_DxV.shape[1]
  if targets_NxS.ndim != 2 or targets_NxS.shape[0] != n or head_DxV.shape[0] != d:
    raise ValueError(f"shapes disagree: hidden {hidden_NxD.shape}, head {head_DxV.shape}, "
                     f"targets {targets_NxS.shape}")
  if backend == "auto":
    backend = "mosaic_tpu" if platform == "tpu" else "triton"
  if backend not in BACKENDS:
    raise ValueError(f"unknown backend {backend!r}: expected one of {BACKENDS}")
  if interpret is None:
    interpret = platform == "cpu"
  sublanes = 8 * 4 // jnp.dtype(hidden_NxD.dtype).itemsize  # TPU rows: 8 of f32, 16 of bf16
  bn, bv, bd = (
      b if b is not None else _fit(default, size, backend, align)
      for b, default, size, align in zip((block_n, block_v, block_d), DEFAULT_BLOCKS[backend],
                                         (n, v, d), (sublanes, 128, 128)))
  if not interpret:
    _check_blocks(backend, bn, bv, bd, sublanes)
  n_pad, v_pad, d_pad = -n % bn, -v % bv, -d % bd
  num_v = (v + v_pad) // bv
  if v_splits is None:  # aim for >= 256 programs in the Triton forward
    v_splits = max(1, min(num_v, 256 // ((n + n_pad) // bn))) if backend == "triton" else 1
  if v_splits < 1 or min(bn, bv, bd) < 1:
    raise ValueError(f"v_splits and block sizes must be positive, got {v_splits=}, "
                     f"{bn=}, {bv=}, {bd=}")
  rows = n + n_pad   # the d-logits chunk: a multiple of bn that divides the padded rows
  chunk = max(bn, min(rows, bwd_rows) // bn * bn)
  while rows % chunk:
    chunk -= bn
  cfg = TileConfig(backend, bool(interpret), bn, bv, bd, v, v + v_pad, -(-num_v // v_splits),
                num_warps, num_stages, vmem_limit_bytes, chunk)

  dtype = jnp.promote_types(hidden_NxD.dtype, head_DxV.dtype)  # kernels take one input dtype
  targets_NxS = jnp.where(targets_NxS == ignore_index, -1, targets_NxS).astype(jnp.int32)
  hidden_NxD = jnp.pad(hidden_NxD.astype(dtype), ((0, n_pad), (0, d_pad)))
  head_DxV = jnp.pad(head_DxV.astype(dtype), ((0, d_pad), (0, v_pad)))
  targets_NxS = jnp.pad(targets_NxS, ((0, n_pad), (0, 0)), constant_values=-1)
  lse_N, z_NxS = _fused(hidden_NxD, head_DxV, targets_NxS, cfg)
  return lse_N[:n], z_NxS[:n]


def _fit(block, size, backend, align):
  """Shrinks the default block to the smallest legal tile covering a smaller dimension."""
  if size >= block:
    return block
  if backend == "triton":
    return max(16, 1 << (size - 1).bit_length())
  return -(-size // align) * align


def _check_blocks(backend, bn, bv, bd, sublanes):
  if backend == "triton":
    for name, b in (("block_n", bn), ("block_v", bv), ("block_d", bd)):
      if b < 16 or b & (b - 1):
        raise ValueError(f"Triton tiles must be powers of two >= 16, got {name}={b}")
    return
  if bn % sublanes or bv % 128 or bd % 128:
    raise ValueError(f"Mosaic TPU tiles need block_n % {sublanes} == 0 and block_v, block_d "
                     f"% 128 == 0, got {bn=}, {bv=}, {bd=}")


# --- custom_vjp: hidden, head, targets -> lse [N], target logits [N, S]. ---

@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(hidden_NxD, head_DxV, targets_NxS, cfg):
  return _forward(hidden_NxD, head_DxV, targets_NxS, cfg)


def _fused_fwd(hidden_NxD, head_DxV, targets_NxS, cfg):
  lse_N, z_NxS = _forward(hidden_NxD, head_DxV, targets_NxS, cfg)
  return (lse_N, z_NxS), (hidden_NxD, head_DxV, targets_NxS, lse_N)


def _fused_bwd(cfg, res, cts):
  hidden_NxD, head_DxV, targets_NxS, lse_N = res
  d_lse_N, d_z_NxS = cts
  args = (hidden_NxD, head_DxV, targets_NxS, lse_N[:, None], d_lse_N[:, None],
          d_z_NxS.astype(jnp.float32))
  if cfg.backend == "triton":
    d_hidden, d_head = _backward_triton(*args, cfg)
  else:
    d_hidden, d_head = linear_mce_tpu.backward(*args, cfg)
  return d_hidden.astype(hidden_NxD.dtype), d_head.astype(head_DxV.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _forward(hidden_NxD, head_DxV, targets_NxS, cfg):
  if cfg.backend == "triton":
    return _forward_triton(hidden_NxD, head_DxV, targets_NxS, cfg)
  return linear_mce_tpu.forward(hidden_NxD, head_DxV, targets_NxS, cfg)


# --- Triton on GPU: a grid over row blocks and vocabulary splits, loops in the kernel. ---

def _triton_params(cfg, num_warps, num_stages):
  return pltriton.CompilerParams(num_warps=cfg.num_warps or num_warps,
                                 num_stages=cfg.num_stages or num_stages)


def _logits_triton(h_ref, w_ref, col0, cfg, num_d):
  """Computes the [bn, bv] float32 logits of the row block against columns col0 : col0 + bv."""
  bn, bv, bd = cfg.block_n, cfg.block_v, cfg.block_d

  def d_step(k, acc):
    k0 = pl.multiple_of(k * bd, bd)
    return acc + dot(h_ref[:, pl.ds(k0, bd)], w_ref[pl.ds(k0, bd), pl.ds(col0, bv)])

  return lax.fori_loop(0, num_d, d_step, jnp.zeros((bn, bv), jnp.float32))


def _fwd_kernel_triton(h_ref, w_ref, t_ref, lse_ref, z_ref, *, cfg, num_v, num_d, per_split):
  # h_ref [bn, D], w_ref [D, V], t_ref [bn, S], and this split's lse_ref [bn, 1], z_ref [bn, S]
  bn, bv = cfg.block_n, cfg.block_v
  first = pl.program_id(1) * per_split
  targets = [t_ref[:, s:s + 1] for s in range(t_ref.shape[1])]

  def v_step(j, carry):
    m, l, zs = carry
    col0 = pl.multiple_of(j * bv, bv)
    logits = _logits_triton(h_ref, w_ref, col0, cfg, num_d)
    cols = column_ids(col0, (bn, bv))
    logits = mask_padded(logits, cols, cfg)
    m, l = online_lse(m, l, logits)
    return m, l, tuple(z + gather(logits, cols, t) for z, t in zip(zs, targets))

  init = (jnp.full((bn, 1), -jnp.inf, jnp.float32), jnp.zeros((bn, 1), jnp.float32),
          tuple(jnp.zeros((bn, 1), jnp.float32) for _ in targets))
  m, l, zs = lax.fori_loop(first, jnp.minimum(first + per_split, num_v), v_step, init)
  lse_ref[...] = m + jnp.log(l)
  for s, z in enumerate(zs):
    z_ref[:, s:s + 1] = z


def _forward_triton(hidden_NxD, head_DxV, targets_NxS, cfg):
  (n, d), v, s = hidden_NxD.shape, head_DxV.shape[1], targets_NxS.shape[1]
  bn, num_v, per_split = cfg.block_n, v // cfg.block_v, cfg.split_tiles
  splits = -(-num_v // per_split)
  kernel = functools.partial(_fwd_kernel_triton, cfg=cfg, num_v=num_v,
                             num_d=d // cfg.block_d, per_split=per_split)
  lse_splitsxNx1, z_splitsxNxS = pl.pallas_call(
      kernel,
      grid=(n // bn, splits),
      in_specs=[pl.BlockSpec((bn, d), lambda i, p: (i, 0)),
                pl.BlockSpec((d, v), lambda i, p: (0, 0)),
                pl.BlockSpec((bn, s), lambda i, p: (i, 0))],
      out_specs=[pl.BlockSpec((None, bn, 1), lambda i, p: (p, i, 0)),
                 pl.BlockSpec((None, bn, s), lambda i, p: (p, i, 0))],
      out_shape=[jax.ShapeDtypeStruct((splits, n, 1), jnp.float32),
                 jax.ShapeDtypeStruct((splits, n, s), jnp.float32)],
      compiler_params=_triton_params(cfg, num_warps=8, num_stages=3),
      interpret=cfg.interpret,
      name="linear_mce_fwd",
  )(hidden_NxD, head_DxV, targets_NxS)
  # Each split holds a partial logsumexp, and a target lies in exactly one split.
  return jax.nn.logsumexp(lse_splitsxNx1[..., 0], axis=0), z_splitsxNxS.sum(axis=0)


def _dlogits_kernel_triton(h_ref, w_ref, t_ref, lse_ref, d_lse_ref, d_z_ref, out_ref, *, cfg,
                           num_n, num_d):
  # Program p owns logit tile i, j of the chunk: a GEMM tile over D with the softmax gradient
  # as its epilogue, written in the input dtype. Consecutive programs share head tile j, read
  # once from HBM per chunk, while the chunk's hidden rows stay in L2.
  col0 = (pl.program_id(0) // num_n) * cfg.block_v
  logits = _logits_triton(h_ref, w_ref, 0, cfg, num_d)
  cols = column_ids(col0, logits.shape)
  logits = mask_padded(logits, cols, cfg)
  out_ref[...] = d_logits(logits, cols, lse_ref[...], d_lse_ref[...], t_ref,
                           d_z_ref).astype(out_ref.dtype)


def _backward_triton(hidden_NxD, head_DxV, targets_NxS, lse_Nx1, d_lse_Nx1, d_z_NxS,
                             cfg):
  """Runs the backward without atomics, one chunk of C rows at a time.

  A Pallas kernel writes d logits [C, V], recomputed tile by tile and never stored for all N.
  Two cuBLAS matmuls then give d_hidden[chunk] = d_logits @ head.T and add
  hidden[chunk].T @ d_logits into d_head.
  """
  (n, d), v, s = hidden_NxD.shape, head_DxV.shape[1], targets_NxS.shape[1]
  bn, bv, c = cfg.block_n, cfg.block_v, cfg.bwd_rows
  num_n, num_v = c // bn, v // bv
  row = lambda p: (p % num_n, 0)  # noqa: E731
  dlogits = pl.pallas_call(
      functools.partial(_dlogits_kernel_triton, cfg=cfg, num_n=num_n, num_d=d // cfg.block_d),
      grid=(num_n * num_v,),
      in_specs=[pl.BlockSpec((bn, d), row), pl.BlockSpec((d, bv), lambda p: (0, p // num_n)),
                pl.BlockSpec((bn, s), row), pl.BlockSpec((bn, 1), row),
                pl.BlockSpec((bn, 1), row), pl.BlockSpec((bn, s), row)],
      out_specs=pl.BlockSpec((bn, bv), lambda p: (p % num_n, p // num_n)),
      out_shape=jax.ShapeDtypeStruct((c, v), head_DxV.dtype),
      compiler_params=_triton_params(cfg, num_warps=8, num_stages=3),
      interpret=cfg.interpret,
      name="linear_mce_dlogits",
  )

  def chunk(d_head_DxV, xs):
    h_CxD, *rest = xs
    d_logits_CxV = dlogits(h_CxD, head_DxV, *rest)
    d_h_CxD = dot_nt(d_logits_CxV, head_DxV)
    return d_head_DxV + dot_tn(h_CxD, d_logits_CxV), d_h_CxD

  xs = tuple(x.reshape(n // c, c, x.shape[1])
             for x in (hidden_NxD, targets_NxS, lse_Nx1, d_lse_Nx1, d_z_NxS))
  d_head, d_hidden = lax.scan(chunk, jnp.zeros((d, v), jnp.float32), xs)
  return d_hidden.reshape(n, d), d_head


