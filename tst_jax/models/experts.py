"""Runs a MoE layer's experts on tokens already routed: dropless in expert order (ragged, gmm),
with a capacity, in fixed blocks, the dense reference, and over a mesh as a shard_map: each
device its own tokens, and expert parallelism.

Letters follow the package docstring and models/moe.py: N tokens, E experts, P experts per
token, A = N·P assignments, R assignment rows in a dispatch buffer, D model dim, F expert ffw
dim, I and O a matmul's input and output dims. Every implementation takes x [N, D], the top-k
ids and weights [N, P] and the three expert weights, and returns [N, D].
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from tst_jax import platform
from tst_jax.kernels import grouped_matmul, moe_dispatch
from tst_jax.models import layers
from tst_jax.parallel import logical


# The names that remat=save_experts saves: the routing and the grouped matmuls' outputs.
_ROUTING, _GATE, _UP, _OUT = layers.EXPERT_SAVES


def swiglu(matmul, x, gate, up, down, fuse_gate_up: bool = False):
  """Applies the experts' SwiGLU to rows in expert order, naming the matmuls' outputs.

  `fuse_gate_up` runs gate and up as one matmul against their weights side by side, [E, I,
  2F]: the rows are read once and their two cotangents come out of one dX product.
  """
  if fuse_gate_up:
    f = gate.shape[-1]
    gate_up = matmul(x, jnp.concatenate([gate, up], axis=-1))
    g, u = checkpoint_name(gate_up[:, :f], _GATE), checkpoint_name(gate_up[:, f:], _UP)
  else:
    g, u = checkpoint_name(matmul(x, gate), _GATE), checkpoint_name(matmul(x, up), _UP)
  return checkpoint_name(matmul(jax.nn.silu(g) * u, down), _OUT)


def _routed(routing: moe_dispatch.Routing) -> moe_dispatch.Routing:
  return moe_dispatch.Routing(*(checkpoint_name(a, _ROUTING) for a in routing))


def _experts_sorted(matmul, x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD,
                    row_tile: int = 1, dispatch: str = "gather", fuse_gate_up: bool = False,
                    expert_shards: int = 1):
  """Sorts the N·P assignments by expert into whole row tiles, runs three matmuls, combines.

  `matmul` takes rows [R, I], weights [E, I, O], group sizes [E] and whether rows may lie past
  the groups; `dispatch` is one of moe_dispatch.IMPLS. Without expert parallelism every
  assignment has a group here, so rows lie past them only where R rounds A up to whole tiles:
  a static fact. With it (`expert_shards` > 1) another shard's assignments leave a tail whose
  length the routing decides.
  """
  routing = _routed(moe_dispatch.sort_by_expert(ids_NxP, gate_ExDxF.shape[0], row_tile))
  tail = expert_shards > 1 or routing.assignment_R.shape[0] != ids_NxP.size
  x_RxD = moe_dispatch.dispatch(x_NxD, routing, ids_NxP.shape[1], dispatch)
  y_RxD = swiglu(lambda a, w: matmul(a, w, routing.sizes_E, tail), x_RxD, gate_ExDxF,
                  up_ExDxF, down_ExFxD, fuse_gate_up)
  # rows past the groups: unread
  return moe_dispatch.combine(y_RxD, weights_NxP, routing, dispatch)


def experts_ragged(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD, *,
                   dispatch: str = "gather", fuse_gate_up: bool = False, expert_shards: int = 1):
  """Runs dropless experts on jax.lax.ragged_dot: sort by expert, three grouped matmuls, unsort.

  Each ragged_dot multiplies row block e by expert e's weights only, so a grouped-GEMM backend
  does N·P rows of work whatever E is. TPU lowers ragged_dot natively. On GPU it needs
  `jax_ragged_dot_use_gpu_pallas_triton_lowering` or XLA's cuDNN ragged-dot fusion, otherwise
  XLA expands every group to a zero-masked dense matmul, as XLA:CPU always does. There
  `experts_blocked` is the one whose cost follows the active parameters. The gradients are
  JAX's own transposes of ragged_dot, where `experts_gmm` writes them as grouped GEMMs.
  """
  return _experts_sorted(lambda a, w, sizes, tail: jax.lax.ragged_dot(a, w, sizes), x_NxD,
                         ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD,
                         dispatch=dispatch, fuse_gate_up=fuse_gate_up,
                         expert_shards=expert_shards)


def _backend(backend, kernels):
  """The grouped GEMM's backend and kernels: `platform.grouped_matmul_backend`'s by default,
  tokamax's kernels where installed on a GPU, else XLA's ragged_dot."""
  if backend is None:
    backend, kernels, _ = platform.grouped_matmul_backend()
  return backend, kernels or grouped_matmul.Kernels()


def experts_gmm(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD, *,
                backend: str | None = None, kernels: grouped_matmul.Kernels | None = None,
                dispatch: str = "gather", fuse_gate_up: bool = False, expert_shards: int = 1):
  """Runs dropless experts on `kernels.grouped_matmul`, gradients included.

  The forward, dX per group and dW as one per-expert xᵀ·dy reduction are all grouped GEMMs,
  with no [A, E] array. The dispatch lays out whole kernel tiles of rows, so no product pads,
  and where those tiles hold exactly the A rows no product selects the rows past the groups.
  """
  backend, kernels = _backend(backend, kernels)
  return _experts_sorted(
      lambda a, w, sizes, tail: grouped_matmul.grouped_matmul(a, w, sizes, backend, kernels,
                                                              tail),
      x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD,
      grouped_matmul.row_tile(backend), dispatch, fuse_gate_up, expert_shards)


def capacity_matmul(n_experts: int, capacity: int, grouped):
  """Returns the matmul of `moe_dispatch.capacity`'s layout, rows [E·C + R_O, I] times w [E, I,
  O] with the overflow's group sizes [E]: each expert's C slots by its weights in one batched
  matmul, then the R_O rows past them through `grouped`, a grouped GEMM (rows, w, sizes)."""
  slots = n_experts * capacity
  def matmul(a, w, sizes_E):
    a_ExCxI = a[:slots].reshape(n_experts, capacity, -1)
    y = jnp.einsum("eci,eio->eco", a_ExCxI, w).reshape(slots, -1)
    if a.shape[0] == slots:   # C >= A: no assignment can pass its expert's C
      return y
    return jnp.concatenate([y, grouped(a[slots:], w, sizes_E)])
  return matmul


def experts_capacity(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD, *,
                     capacity_factor: float = 1.25, backend: str | None = None,
                     kernels: grouped_matmul.Kernels | None = None, dispatch: str = "gather",
                     fuse_gate_up: bool = False, expert_shards: int = 1):
  """Runs dropless experts with a capacity: each expert's first C assignments through batched
  matmuls, [E, C, D]·[E, D, F] (cuBLAS on a GPU), the rest through the grouped GEMM.

  C = roundup(cf·A/E, 128) with E all experts, so balanced routing fills the slots and sends
  nothing past them (`moe_dispatch.capacity`). No assignment is dropped: the overflow's buffer
  holds A - C rows, as when one expert takes them all, and its grouped GEMM computes the
  groups it holds. Empty slots are zero rows, which add nothing to a weight's gradient.
  """
  backend, kernels = _backend(backend, kernels)
  (n, k), e = ids_NxP.shape, gate_ExDxF.shape[0]
  c = moe_dispatch.capacity_rows(n * k, e * expert_shards, capacity_factor)
  routing = _routed(moe_dispatch.capacity(ids_NxP, e, c, grouped_matmul.row_tile(backend)))
  x_RxD = moe_dispatch.dispatch(x_NxD, routing, k, dispatch)
  grouped = lambda a, w, sizes: grouped_matmul.grouped_matmul(a, w, sizes, backend, kernels)
  matmul = capacity_matmul(e, c, grouped)
  y_RxD = swiglu(lambda a, w: matmul(a, w, routing.sizes_E), x_RxD, gate_ExDxF, up_ExDxF,
                  down_ExFxD, fuse_gate_up)
  return moe_dispatch.combine(y_RxD, weights_NxP, routing, dispatch)


def blocked_matmul(block_expert, block: int):
  """Returns the matmul of rows in blocks of C, a [R, I] times w [E, I, O] -> [R, O], each
  block by the weights of its expert `block_expert` [blocks]: one batched matmul."""
  def matmul(a, w):
    a_blocks = a.reshape(block_expert.shape[0], block, -1)   # [blocks, C, I]
    return jnp.einsum("bti,bio->bto", a_blocks, jnp.take(w, block_expert, axis=0)).reshape(
        a.shape[0], -1)
  return matmul


def experts_blocked(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD, *,
                    block: int | None = None, dispatch: str = "gather", expert_shards: int = 1):
  """Runs dropless experts as a batched matmul over fixed-size row blocks, one expert each.

  `moe_dispatch.blocked` gathers the assignments, sorted by expert, into a buffer where each
  expert's group is padded to whole blocks. Block b is multiplied by the weights of its expert,
  a gather of [blocks, D, F]. Work is N·P + E·block rows, so the compiled FLOPs follow the
  active parameters on every backend, XLA:CPU included. The price is the gathered weights,
  blocks x D x F per matrix, which is why TPU and GPU use grouped GEMMs. Other shards'
  assignments get no block, whatever `expert_shards`.
  """
  del expert_shards
  (n, k), e = ids_NxP.shape, gate_ExDxF.shape[0]
  block = moe_dispatch.block_rows(n * k, e) if block is None else block
  routing, block_expert = moe_dispatch.blocked(ids_NxP, e, block)
  routing, block_expert = _routed(routing), checkpoint_name(block_expert, _ROUTING)
  x_RxD = moe_dispatch.dispatch(x_NxD, routing, k, dispatch)

  y_RxD = swiglu(blocked_matmul(block_expert, block), x_RxD, gate_ExDxF, up_ExDxF, down_ExFxD)
  return moe_dispatch.combine(y_RxD, weights_NxP, routing, dispatch)


def experts_dense(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD, *,
                  expert_shards: int = 1):
  """Runs every expert on every token and combines them with the top-k weights, as a reference.
  An id of another shard's expert (>= E, whatever `expert_shards`) has no one-hot column."""
  del expert_shards
  e = gate_ExDxF.shape[0]
  gate_ExNxF = jnp.einsum("nd,edf->enf", x_NxD, gate_ExDxF)
  up_ExNxF = jnp.einsum("nd,edf->enf", x_NxD, up_ExDxF)
  y_ExNxD = jnp.einsum("enf,efd->end", jax.nn.silu(gate_ExNxF) * up_ExNxF, down_ExFxD)
  combine_NxE = jnp.einsum("nke,nk->ne", jax.nn.one_hot(ids_NxP, e, dtype=weights_NxP.dtype),
                           weights_NxP)
  return jnp.einsum("end,ne->nd", y_ExNxD, combine_NxE.astype(y_ExNxD.dtype))


EXPERTS = {"ragged": experts_ragged, "gmm": experts_gmm, "capacity": experts_capacity,
           "blocked": experts_blocked, "dense": experts_dense}


def expert_fn(impl: str, dispatch: str = "gather", fuse_gate_up: str | bool = False,
              capacity_factor: float = 1.25):
  """Returns the expert implementation `impl` with the dispatch `dispatch`, both resolved from
  auto by the model's config; the dense reference has no dispatch. `fuse_gate_up` ("on" or
  True) applies to platform.FUSES_GATE_UP alone (platform.resolve refuses it with another):
  the others compute the same function without it. `capacity_factor` is capacity's alone."""
  if impl == "dense":
    return EXPERTS[impl]
  fused = (dict(fuse_gate_up=fuse_gate_up in ("on", True)) if impl in platform.FUSES_GATE_UP
           else {})
  if impl == "capacity":
    fused["capacity_factor"] = capacity_factor
  return functools.partial(EXPERTS[impl], dispatch=dispatch, **fused)


class _Split(NamedTuple):
  """How `experts_sharded` splits the layer over the mesh: mesh axes larger than 1 only."""
  batch: P              # the tokens' PartitionSpec, the 'batch' rule's
  batch_axes: tuple     # mesh axes that split the tokens
  ep_axes: tuple        # mesh axes that split the experts, E
  tp_axes: tuple        # mesh axes that split each expert's F
  gathered: tuple       # expert axes that split the tokens too: tokens gathered over them
  replicated: tuple     # expert axes that do not: the same tokens on every expert shard


def _split(n_tokens: int, context=None) -> _Split | None:
  """Returns how `context`, a (mesh, rules) pair by default the enclosing `axis_rules`', splits
  the layer, None where nothing is split.

  Tokens that do not divide over the batch axes, a short last batch of generation say, stay
  whole where the experts do too: XLA then runs every token on every device.
  """
  context = context or logical.current()
  if context is None:
    return None
  mesh, rules = context
  batch_pspec = logical.logical_to_pspec(("batch", None), rules)
  weight_pspec = logical.logical_to_pspec(("expert", None, "mlp"), rules)
  split = lambda entry: tuple(a for a in logical.mesh_axes(entry) if mesh.shape[a] > 1)
  batch_axes, ep_axes, tp_axes = (split(e) for e in (batch_pspec[0], weight_pspec[0],
                                                     weight_pspec[2]))
  if not ep_axes and not tp_axes and n_tokens % math.prod(mesh.shape[a] for a in batch_axes):
    batch_axes = ()
  if not (batch_axes or ep_axes or tp_axes):
    return None
  gathered = tuple(a for a in ep_axes if a in batch_axes)
  return _Split(batch_pspec, batch_axes, ep_axes, tp_axes, gathered,
                tuple(a for a in ep_axes if a not in gathered))


def group_devices(mesh, rules) -> int:
  """Returns how many devices' tokens each device lays out under `mesh` and `rules`: the
  expert shards its tokens are gathered over, 1 where the experts are not split."""
  split = _split(0, (mesh, rules))
  return math.prod(mesh.shape[a] for a in split.gathered) if split else 1


def token_groups(ids_NxP):
  """Returns the top-k ids [G, N/G, P] of the G groups of tokens that `experts_sharded` lays
  out apart: each device's own tokens, those of its expert-parallel group where the tokens are
  gathered over expert axes, or all N in one group outside a mesh."""
  split = _split(ids_NxP.shape[0])
  if split is None or not split.batch_axes:
    return ids_NxP[None]
  mesh, _ = logical.current()
  axes = logical.mesh_axes(split.batch[0])   # the rows' blocks, major axis first
  own = [i for i, a in enumerate(axes) if a not in split.gathered]
  ids = ids_NxP.reshape(*(mesh.shape[a] for a in axes), -1, ids_NxP.shape[1])
  ids = ids.transpose(own + [i for i in range(len(axes)) if i not in own]
                      + [len(axes), len(axes) + 1])
  return ids.reshape(math.prod(mesh.shape[axes[i]] for i in own), -1, ids_NxP.shape[1])


def capacity_overflow(ids_NxP, n_experts: int, factor: float):
  """Returns the share of the assignments past their expert's C rows, which `experts_capacity`
  runs as grouped GEMMs, where each group of `token_groups` lays out its own C."""
  ids_GxNxP = token_groups(ids_NxP)
  g, n, k = ids_GxNxP.shape
  c = moe_dispatch.capacity_rows(n * k, n_experts, factor)
  keys = ids_GxNxP + n_experts * jnp.arange(g, dtype=ids_GxNxP.dtype)[:, None, None]
  return moe_dispatch.overflow_share(jnp.bincount(keys.reshape(-1), length=g * n_experts), c)


def experts_sharded(experts, x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD):
  """Runs `experts` on each device's own tokens, as a shard_map over the mesh.

  Under `axis_rules` that split the tokens over the 'batch' mesh axes, each device sorts,
  dispatches, multiplies and combines its own N/shards tokens. Left to XLA's SPMD partitioner,
  the sort of all N·P assignments would gather every token onto every device, which then
  computes every token's experts. The expert weights enter whole, gathered over FSDP's D as
  for any matmul. Inside, the tokens vary over the batch axes and the weights do not, so AD
  sums the weights' gradients over them.

  With expert parallelism, where the 'expert' rule splits the expert weights' E axis, each
  device holds E/ep experts and its own token rows. Inside one expert group the tokens, top-k
  ids and weights are all-gathered, every device runs only its experts on the assignments
  routed to them, and a reduce-scatter sums each token's P outputs back onto the device that
  owns the token. This is dropless and needs no capacity. Its traffic, about (ep-1)/ep of the
  group's tokens each way, is at most an all-to-all's P·(ep-1)/ep when ep <= P. Expert weights
  split over 'tensor' by the 'mlp' rule add a psum. Without a mesh, or when nothing is split,
  this is `experts` itself.
  """
  args = (x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD)
  split = _split(x_NxD.shape[0])
  if split is None:
    return experts(*args)
  mesh, _ = logical.current()
  ep_axes, tp_axes, gathered, replicated = (split.ep_axes, split.tp_axes, split.gathered,
                                            split.replicated)
  batch_pspec = split.batch
  in_pspec = P(ep_axes or None, None, tp_axes or None)          # FSDP's D gathered
  out_pspec = P(ep_axes or None, tp_axes or None, None)
  ep = math.prod(mesh.shape[a] for a in ep_axes)
  if gate_ExDxF.shape[0] % ep:
    raise ValueError(f"model.n_experts={gate_ExDxF.shape[0]} must divide over the expert "
                     f"mesh axes {ep_axes} (size {ep})")

  def local(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD):
    if gathered:
      x_NxD, ids_NxP, weights_NxP = (jax.lax.all_gather(a, gathered, axis=0, tiled=True)
                                     for a in (x_NxD, ids_NxP, weights_NxP))
    if replicated:   # same tokens on every expert shard: marking them varying makes AD sum
                     # their gradients over the shards
      x_NxD, weights_NxP = (jax.lax.pcast(a, replicated, to="varying")
                            for a in (x_NxD, weights_NxP))
    if ep_axes:      # another shard's expert becomes id e_local, which no local group holds
      e_local = gate_ExDxF.shape[0]
      ids_NxP = ids_NxP - jax.lax.axis_index(ep_axes) * e_local
      mine_NxP = (ids_NxP >= 0) & (ids_NxP < e_local)
      ids_NxP, weights_NxP = (jnp.where(mine_NxP, ids_NxP, e_local),
                              jnp.where(mine_NxP, weights_NxP, 0))
    y_NxD = experts(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD,
                    expert_shards=ep)
    if gathered:
      y_NxD = jax.lax.psum_scatter(y_NxD, gathered, scatter_dimension=0, tiled=True)
    if replicated or tp_axes:
      y_NxD = jax.lax.psum(y_NxD, replicated + tp_axes)
    return y_NxD

  return jax.shard_map(local, mesh=mesh, out_specs=batch_pspec,
                       in_specs=(batch_pspec,) * 3 + (in_pspec, in_pspec, out_pspec))(*args)
