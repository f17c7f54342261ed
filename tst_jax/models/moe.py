"""Qwen3-style Mixture-of-Experts decoder, the paper's 10B-A1B, on the shared Llama blocks.

Letters follow the package docstring: N tokens with B·L flattened, E experts, P experts per
token, A = N·P assignments, R assignment rows padded to whole blocks of C, D model dim, F expert
ffw dim, I and O a matmul's input and output dims. Attention, norms, RoPE and the decoder block
come from `layers`. Only the feed-forward differs: a float32 softmax router picks P of E SwiGLU
experts per token, and the experts run dropless as one grouped matmul over the assignments
sorted by expert, or with a capacity: each expert's first C as a batched matmul, the rest
grouped. As in Qwen3-30B-A3B there is no shared expert, attention has QK-norm and the
head is untied.

Dense and sparse layers follow Hugging Face's `mlp_only_layers` and `decoder_sparse_step`.
The stack stays scanned whatever the pattern. `stage_units` splits it into a few stages, each a
unit of consecutive layers such as [dense], [sparse] or [dense, sparse], repeated `r` times and
scanned over `r`. First-k-dense gives 2 stages, every-n-th-sparse gives 1.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from tst_jax import platform, schema
from tst_jax.kernels import grouped_matmul, moe_dispatch
from tst_jax.errors import ConfigError
from tst_jax.models import layers, llama
from tst_jax.parallel import logical

_LAYERS = schema.Rule(lambda v: isinstance(v, (tuple, list)) and all(
    isinstance(i, int) and not isinstance(i, bool) for i in v), "a tuple of layer indices", tuple)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig(llama.LlamaConfig):
  """config.model of the qwen3_moe family: LlamaConfig plus experts, `ffw_dim` for dense layers."""
  n_experts: int = schema.field(llama.MISSING, schema.integer(1), "E: experts per MoE layer")
  n_experts_per_token: int = schema.field(llama.MISSING, schema.integer(1), "P: the top-k "
                                          "(<= n_experts)")
  moe_ffw_dim: int = schema.field(llama.MISSING, schema.integer(1), "F of every expert")
  norm_topk_prob: bool = schema.field(True, schema.BOOL, "renormalise the P router weights to "
                                      "sum to 1")
  aux_loss_coef: float = schema.field(0.001, schema.number(0), "load-balancing loss weight "
                                      "(HF router_aux_loss_coef)")
  router_z_loss_coef: float = schema.field(0.0, schema.number(0), "weight of "
                                           "mean(logsumexp(router logits)^2)")
  mlp_only_layers: tuple = schema.field((), _LAYERS, "layer indices with a dense MLP (HF "
                                        "semantics)")
  decoder_sparse_step: int = schema.field(1, schema.integer(1), "layer i is sparse iff "
                                          "(i + 1) % step == 0 (and not mlp_only)")
  expert_impl: str = schema.field("auto", schema.one_of(platform.EXPERT_IMPLS), "ragged | gmm "
                                  "(grouped GEMMs both ways, tokamax on GPU) | capacity (each "
                                  "expert's first C rows as batched matmuls, the rest as gmm) | "
                                  "blocked | dense (reference) | auto (the platform's measured "
                                  "fastest)")
  dispatch_impl: str = schema.field("auto", schema.one_of(platform.DISPATCH_IMPLS), "how "
                                    "dispatch and combine move rows: " + " | ".join(
                                        moe_dispatch.IMPLS) + " (kernels/moe_dispatch.py) | "
                                    "auto (the platform's measured fastest)")
  expert_fuse_gate_up: str = schema.field("auto", schema.one_of(platform.FUSE_GATE_UP), "on: "
                                          "the experts' gate and up as one grouped GEMM "
                                          "against their weights side by side (expert_impl "
                                          "gmm, ragged or capacity), the rows read once | off "
                                          "| auto (on where a train step measured it faster)")
  expert_capacity_factor: float = schema.field(1.25, schema.number(0, open_lo=True), "cf of "
                                               "expert_impl=capacity: C = roundup(cf·N·P/E, "
                                               "128) rows per expert run as batched matmuls, "
                                               "the rows past C as grouped GEMMs")

  def __post_init__(self):
    if isinstance(self.expert_fuse_gate_up, bool):   # the field's spelling in the config.json
      object.__setattr__(self, "expert_fuse_gate_up",  # of runs from before it took auto
                         "on" if self.expert_fuse_gate_up else "off")
    super().__post_init__()
    object.__setattr__(self, "mlp_only_layers", tuple(sorted(set(self.mlp_only_layers))))
    if self.n_experts_per_token > self.n_experts:
      raise ConfigError("model.n_experts_per_token", f"must be in [1, {self.n_experts}], "
                        f"got {self.n_experts_per_token}")
    if any(not 0 <= i < self.n_layers for i in self.mlp_only_layers):
      raise ConfigError("model.mlp_only_layers", f"{self.mlp_only_layers} out of range "
                        f"[0, {self.n_layers})")

  def sparse_layers(self) -> tuple[bool, ...]:
    """Returns which layers are MoE, by Hugging Face Qwen3-MoE's rule."""
    return tuple(i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
                 for i in range(self.n_layers))

  def build(self, rngs: nnx.Rngs) -> Qwen3MoE:
    """Returns the model of this config, its parameters drawn from `rngs`."""
    return Qwen3MoE(self, rngs=rngs)

  def param_counts(self) -> tuple[int, int]:
    """Returns (total, active) parameters from shapes only. Active leaves out the E - P unused
    experts of each sparse layer and counts everything else in full."""
    total = llama.param_count(self)
    unused = sum(self.sparse_layers()) * (self.n_experts - self.n_experts_per_token)
    return total, total - unused * 3 * self.dim * self.moe_ffw_dim

  def matmul_params(self) -> int:
    """Returns the matmul parameters a token goes through, the 'N' of the 6N rule for MoE:
    attention, dense MLPs, routers, P experts per sparse layer and the head."""
    d, g = self.dim, self.head_dim
    n_sparse = sum(self.sparse_layers())
    attn = d * g * (2 * self.n_heads + 2 * self.n_kv_heads)
    dense_mlp = 3 * d * self.ffw_dim
    sparse_mlp = d * self.n_experts + self.n_experts_per_token * 3 * d * self.moe_ffw_dim
    return (self.n_layers * attn + (self.n_layers - n_sparse) * dense_mlp
            + n_sparse * sparse_mlp + d * self.vocab_size)


# Qwen3 conventions: rope_theta 1e6, RMSNorm eps 1e-6, head_dim 128 at scale, QK-norm.
PRESETS = {
    "tiny_moe": dict(vocab_size=4096, dim=128, n_layers=4, n_heads=4, n_kv_heads=2,
                     ffw_dim=384, n_experts=8, n_experts_per_token=2, moe_ffw_dim=128,
                     rope_theta=10_000.0, norm_eps=1e-6),
    # 10B total and 1B active: Qwen3-30B-A3B at half width, D 1024 with 16 heads of 128 and 4 KV
    # heads, keeping its 128 experts, top-8 and expert width 768 in all 32 layers.
    "10b_a1b": dict(vocab_size=llama.LLAMA3_VOCAB, dim=1024, n_layers=32, n_heads=16,
                    n_kv_heads=4, head_dim=128, ffw_dim=6144, n_experts=128,
                    n_experts_per_token=8, moe_ffw_dim=768, rope_theta=1_000_000.0,
                    norm_eps=1e-6),
}


def stage_units(sparse: tuple[bool, ...]) -> tuple[tuple[tuple[bool, ...], int], ...]:
  """Splits a layer pattern into (unit, repeats) pairs, greedily the unit covering most layers.

  With d dense and s sparse, [d, s, s, s] gives ((d,), 1), ((s,), 3), and [d, s, d, s] gives
  ((d, s), 2).
  """
  units, i, n = [], 0, len(sparse)
  while i < n:
    best = (1, 1)                                    # unit length, repeats
    for u in range(1, (n - i) // 2 + 1):
      r = 1
      while sparse[i + r * u: i + (r + 1) * u] == sparse[i: i + u]:
        r += 1
      if r >= 2 and r * u > best[0] * best[1]:
        best = (u, r)
    u, r = best
    units.append((tuple(sparse[i: i + u]), r))
    i += u * r
  return tuple(units)


def _route(x_NxD, router_DxE, k: int, norm_topk_prob: bool):
  """Routes in float32: returns logits and probs [N, E], top-k weights and ids [N, P]."""
  logits_NxE = jnp.dot(x_NxD.astype(jnp.float32), router_DxE)
  probs_NxE = jax.nn.softmax(logits_NxE, axis=-1)
  weights_NxP, ids_NxP = jax.lax.top_k(probs_NxE, k)
  if norm_topk_prob:
    weights_NxP = weights_NxP / jnp.sum(weights_NxP, axis=-1, keepdims=True)
  return logits_NxE, probs_NxE, weights_NxP, ids_NxP


# The names that remat=save_experts saves: the routing and the grouped matmuls' outputs.
_ROUTING, _GATE, _UP, _OUT = layers.EXPERT_SAVES


def _swiglu(matmul, x, gate, up, down, fuse_gate_up: bool = False):
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
  y_RxD = _swiglu(lambda a, w: matmul(a, w, routing.sizes_E, tail), x_RxD, gate_ExDxF,
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
  y_RxD = _swiglu(lambda a, w: matmul(a, w, routing.sizes_E), x_RxD, gate_ExDxF, up_ExDxF,
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

  y_RxD = _swiglu(blocked_matmul(block_expert, block), x_RxD, gate_ExDxF, up_ExDxF, down_ExFxD)
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


def experts_sharded(experts, x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD):
  """Runs `experts` with expert parallelism written out as a shard_map over the mesh.

  Under `axis_rules` whose 'expert' rule splits the expert weights' E axis, each device holds
  E/ep experts and its own token rows. Inside one expert group the tokens, top-k ids and
  weights are all-gathered, every device runs only its experts on the assignments routed to
  them, and a reduce-scatter sums each token's P outputs back onto the device that owns the
  token. This is dropless and needs no capacity. Its traffic, about (ep-1)/ep of the group's
  tokens each way, is at most an all-to-all's P·(ep-1)/ep when ep <= P. Expert weights split
  over 'tensor' by the 'mlp' rule add a psum. Without a mesh, or when nothing is split, this is
  `experts` itself.
  """
  context = logical.current()
  args = (x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD)
  if context is None:
    return experts(*args)
  mesh, rules = context
  batch_pspec = logical.logical_to_pspec(("batch", None), rules)
  weight_pspec = logical.logical_to_pspec(("expert", None, "mlp"), rules)
  split = lambda entry: tuple(a for a in logical.mesh_axes(entry) if mesh.shape[a] > 1)
  ep_axes, tp_axes = split(weight_pspec[0]), split(weight_pspec[2])
  in_pspec = P(ep_axes or None, None, tp_axes or None)          # FSDP's D gathered
  out_pspec = P(ep_axes or None, tp_axes or None, None)
  if not ep_axes and not tp_axes:
    return experts(*args)
  ep = math.prod(mesh.shape[a] for a in ep_axes)
  if gate_ExDxF.shape[0] % ep:
    raise ValueError(f"model.n_experts={gate_ExDxF.shape[0]} must divide over the expert "
                     f"mesh axes {ep_axes} (size {ep})")
  gathered = tuple(a for a in ep_axes if a in logical.mesh_axes(batch_pspec[0]))
  replicated = tuple(a for a in ep_axes if a not in gathered)   # tokens on every shard

  def local(x_NxD, ids_NxP, weights_NxP, gate_ExDxF, up_ExDxF, down_ExFxD):
    if gathered:
      x_NxD, ids_NxP, weights_NxP = (jax.lax.all_gather(a, gathered, axis=0, tiled=True)
                                     for a in (x_NxD, ids_NxP, weights_NxP))
    if replicated:   # same tokens on every expert shard: marking them varying makes AD sum
                     # their gradients over the shards
      x_NxD, weights_NxP = (jax.lax.pcast(a, replicated, to="varying")
                            for a in (x_NxD, weights_NxP))
    e_local = gate_ExDxF.shape[0]
    ids_NxP = ids_NxP - jax.lax.axis_index(ep_axes) * e_local if ep_axes else ids_NxP
    mine_NxP = (ids_NxP >= 0) & (ids_NxP < e_local)
    y_NxD = experts(x_NxD, jnp.where(mine_NxP, ids_NxP, e_local),
                    jnp.where(mine_NxP, weights_NxP, 0), gate_ExDxF, up_ExDxF, down_ExFxD,
                    expert_shards=ep)
    if gathered:
      y_NxD = jax.lax.psum_scatter(y_NxD, gathered, scatter_dimension=0, tiled=True)
    if replicated or tp_axes:
      y_NxD = jax.lax.psum(y_NxD, replicated + tp_axes)
    return y_NxD

  return jax.shard_map(local, mesh=mesh, out_specs=batch_pspec,
                       in_specs=(batch_pspec,) * 3 + (in_pspec, in_pspec, out_pspec))(*args)


def route(x_NxD, router_DxE, cfg: MoEConfig):
  """Routes tokens: returns the top-k weights and ids [N, P] and the layer's statistics.

  Switch and HF Qwen3-MoE load balancing: frac_E counts top-k assignments per token and sums
  to P, prob_E is the mean router probability, and balanced routing gives lb_loss = P.
  """
  logits_NxE, probs_NxE, weights_NxP, ids_NxP = _route(
      x_NxD, router_DxE, cfg.n_experts_per_token, cfg.norm_topk_prob)
  n = x_NxD.shape[0]
  frac_E = jnp.bincount(ids_NxP.reshape(-1), length=cfg.n_experts).astype(jnp.float32) / n
  prob_E = jnp.mean(probs_NxE, axis=0)
  aux = {
      "lb_loss": cfg.n_experts * jnp.sum(frac_E * prob_E),
      "z_loss": jnp.mean(jnp.square(jax.nn.logsumexp(logits_NxE, axis=-1))),
      "expert_frac": frac_E,
      "router_prob": prob_E,
  }
  return weights_NxP, ids_NxP, aux


class SparseMoE(nnx.Module):
  """Routes each token to P of E SwiGLU experts, returning the output and per-layer statistics."""

  def __init__(self, cfg: MoEConfig, *, dtype, rngs: nnx.Rngs):
    d, e, f, std = cfg.dim, cfg.n_experts, cfg.moe_ffw_dim, cfg.init_std
    if cfg.dispatch_impl == "auto":   # a layer built alone; a model resolves its config first
      cfg = dataclasses.replace(cfg, dispatch_impl=platform.dispatch_impl("auto")[0])
    if cfg.expert_fuse_gate_up == "auto":
      cfg = dataclasses.replace(cfg, expert_fuse_gate_up=platform.fuse_gate_up(
          "auto", cfg.expert_impl)[0])
    self.cfg, self.dtype = cfg, dtype
    # The router stays replicated over experts: it is tiny and top-k needs every logit.
    self.router = layers.param(rngs, (d, e), ("embed", None), std=std)
    self.gate_proj = layers.param(rngs, (e, d, f), ("expert", "embed", "mlp"), std=std)
    self.up_proj = layers.param(rngs, (e, d, f), ("expert", "embed", "mlp"), std=std)
    self.down_proj = layers.param(rngs, (e, f, d), ("expert", "mlp", "embed"), std=std)

  def __call__(self, x_BxLxD):
    cfg, dt = self.cfg, self.dtype
    b, length, d = x_BxLxD.shape
    x_NxD = x_BxLxD.reshape(b * length, d)
    weights_NxP, ids_NxP, aux = route(x_NxD, self.router[...], cfg)
    if cfg.expert_impl == "capacity":   # the whole batch's counts: each expert-parallel group
      c = moe_dispatch.capacity_rows(ids_NxP.size, cfg.n_experts,   # lays out its own
                                     cfg.expert_capacity_factor)
      aux["overflow"] = moe_dispatch.overflow_share(aux["expert_frac"] * ids_NxP.shape[0], c)
    experts = expert_fn(cfg.expert_impl, cfg.dispatch_impl, cfg.expert_fuse_gate_up,
                        cfg.expert_capacity_factor)
    out_NxD = experts_sharded(experts, x_NxD, ids_NxP,
                              weights_NxP, self.gate_proj[...].astype(dt),
                              self.up_proj[...].astype(dt), self.down_proj[...].astype(dt))
    return out_NxD.astype(x_BxLxD.dtype).reshape(b, length, d), aux


class Period(nnx.Module):
  """One repeat of a stage's unit: its decoder blocks in order, dense or sparse each."""

  def __init__(self, cfg: MoEConfig, unit: tuple[bool, ...], *, dtype, rngs: nnx.Rngs):
    def make_ffw(sparse):
      if sparse:
        return lambda r: SparseMoE(cfg, dtype=dtype, rngs=r)
      return lambda r: layers.MLP(cfg.dim, cfg.ffw_dim, dtype=dtype, rngs=r, std=cfg.init_std,
                                  matmul_precision=cfg.matmul_precision)
    self.blocks = nnx.List([
        layers.Block(cfg.attention(qk_norm=True), make_ffw(sparse), dtype=dtype, rngs=rngs)
        for sparse in unit])

  def __call__(self, x_BxLxD, positions_BxL, cache: layers.KVCache | None = None,
               documents_BxL=None):
    """Returns the output, the aux of the unit's sparse blocks and the updated caches or None."""
    auxes, caches = [], []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else layers.KVCache(cache.k[i], cache.v[i])
      x_BxLxD, aux, layer_cache = block(x_BxLxD, positions_BxL, layer_cache, documents_BxL)
      caches.append(layer_cache)
      if aux:
        auxes.append(aux)
    aux = jax.tree.map(lambda *a: jnp.stack(a), *auxes) if auxes else {}  # over sparse blocks
    if cache is None:
      return x_BxLxD, aux, None
    return x_BxLxD, aux, jax.tree.map(lambda *a: jnp.stack(a), *caches)


class Qwen3MoE(llama.Llama):
  """Qwen3-MoE: the embedding, scanned stages of blocks, a norm and the head.

  Shares Llama's embedding, head, `logits` and `__call__`. `forward` returns the MoE statistics
  of every sparse layer, in layer order, stacked on axis 0.
  """

  def make_layers(self, rngs: nnx.Rngs):
    cfg = self.cfg
    self.units = stage_units(cfg.sparse_layers())
    self.stages = nnx.List([
        layers.stacked(repeats, lambda r, u=unit: Period(cfg, u, dtype=self.dtype, rngs=r), rngs)
        for unit, repeats in self.units])

  def run_layers(self, h_BxLxD, positions_BxL, cache=None, documents_BxL=None):
    """Returns h, the aux of every sparse layer in layer order, and the updated caches.

    There is one cache per stage, [repeats, unit, B, M, K, G], or None without a cache.
    """
    auxes, caches = [], []
    for i, stage in enumerate(self.stages):
      h_BxLxD, aux, stage_cache = layers.run_stack(
          stage, h_BxLxD, positions_BxL, self.cfg.remat, cache=None if cache is None else cache[i],
          documents_BxL=documents_BxL)
      caches.append(stage_cache)
      if aux:   # repeats x sparse blocks -> layers
        auxes.append(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), aux))
    aux = jax.tree.map(lambda *a: jnp.concatenate(a), *auxes) if auxes else {}
    return h_BxLxD, aux, None if cache is None else caches

  def init_cache(self, batch: int, max_len: int):
    return [self.empty_cache((repeats, len(unit)), batch, max_len)
            for unit, repeats in self.units]

  def aux_loss(self, aux):
    """Returns the weighted load-balancing and z-losses, averaged over layers, and metrics.

    `moe/expert_load` [E] is each expert's share of the top-k assignments averaged over layers.
    `moe/max_load` is E times its maximum, 1 when balanced. Under expert_impl=capacity,
    `moe/overflow` is the share of the assignments past their expert's C rows, which run as
    grouped GEMMs, over the step's whole batch: exact without expert parallelism, under which
    each group of expert shards lays out its own tokens.
    """
    if not aux:
      return jnp.zeros((), jnp.float32), {}
    cfg = self.cfg
    lb, z = jnp.mean(aux["lb_loss"]), jnp.mean(aux["z_loss"])
    load_E = jnp.mean(aux["expert_frac"], axis=0) / cfg.n_experts_per_token
    metrics = {"moe/lb_loss": lb, "moe/z_loss": z, "moe/expert_load": load_E,
               "moe/max_load": cfg.n_experts * jnp.max(load_E)}
    if "overflow" in aux:
      metrics["moe/overflow"] = jnp.mean(aux["overflow"])
    return cfg.aux_loss_coef * lb + cfg.router_z_loss_coef * z, metrics
