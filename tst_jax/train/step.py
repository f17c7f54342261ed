"""Train state, sharded init, and the pure jitted train/eval steps of each phase.

A batch is a packed window of tokens [B, W], W = S·L + 1 (letters: the package docstring).
The phase decides the view: the tst step folds it into bags (`superposition.tst_view`) and
uses the MCE loss. The ntp step is the ordinary language-model step: shift by one,
cross-entropy, and with multi-token prediction the CE of the k - 1 further tokens beside it
(models/mtp.py).
"""

from __future__ import annotations

import contextlib
import functools
import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tst_jax import losses, models
from tst_jax import superposition as sp
from tst_jax.models import mtp as mtp_lib
from tst_jax.parallel import mesh as mesh_lib
from tst_jax.parallel.logical import axis_rules, constrain
from tst_jax import optim
from tst_jax.config.plan import Phase
from tst_jax.config.sections import Loss
from tst_jax.config.spec import RunSpec


@flax.struct.dataclass
class TrainState:
  step: jax.Array            # optimizer steps done (global across phases)
  params: nnx.State
  opt_state: optax.OptState


def abstract_model(model_cfg: models.ModelConfig, mtp: mtp_lib.Mtp | None = None
                   ) -> tuple[nnx.GraphDef, nnx.State]:
  """Returns the model's graph and parameter shapes, with the heads of `mtp` where it has
  some, without allocating anything."""
  abstract = nnx.eval_shape(lambda: mtp_lib.build(model_cfg, mtp, nnx.Rngs(0)))
  return nnx.split(abstract, nnx.Param)


def fresh_state(params, tx) -> TrainState:
  """Step 0: `params` and a fresh optimizer state."""
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def init_fn(model_cfg: models.ModelConfig, tx, mtp: mtp_lib.Mtp | None = None
            ) -> Callable[[jax.Array], TrainState]:
  def init(key):
    model = mtp_lib.build(model_cfg, mtp, nnx.Rngs(params=key))
    return fresh_state(nnx.split(model, nnx.Param)[1], tx)
  return init


def abstract_state(model_cfg: models.ModelConfig, tx, mtp: mtp_lib.Mtp | None = None
                   ) -> tuple[nnx.GraphDef, TrainState]:
  """(the model's graph, the abstract TrainState) from one abstract build of the model and
  the heads of `mtp`: nothing allocated, nothing compiled."""
  graphdef, params = abstract_model(model_cfg, mtp)
  return graphdef, jax.eval_shape(lambda p: fresh_state(p, tx), params)


def shardings_of(abstract: TrainState, mesh, rules) -> TrainState:
  """Returns the NamedShardings of an abstract TrainState from its parameters' logical axes."""
  # Muon's state holds parameters that one of its branches masks out: no array, no sharding.
  masked = lambda v: isinstance(v, nnx.Variable) and isinstance(v.get_value(), optax.MaskedNode)
  specs = jax.tree.map(lambda v, spec: v if masked(v) else spec, abstract,
                       nnx.get_partition_spec(abstract), is_leaf=masked)
  return mesh_lib.tree_shardings(specs, mesh, rules)


@jax.named_scope("loss")   # the step profile's category (train/step_profile)
def lm_loss(model, hidden_BxLxD, targets_BxLxS, loss_cfg, *, weighting="uniform",
            variant="mce"):
  """Applies the LM head and the multi-hot cross-entropy, plain next-token CE at S = 1.

  `losses.linear_mce_loss` computes it with loss.impl, resolved once per run, and the z-loss of
  loss.z_loss."""
  d, s = hidden_BxLxD.shape[-1], targets_BxLxS.shape[-1]
  head_DxV = model.head_kernel().astype(hidden_BxLxD.dtype)   # the compute dtype, as logits()
  return losses.linear_mce_loss(hidden_BxLxD.reshape(-1, d), head_DxV,
                                targets_BxLxS.reshape(-1, s), weighting=weighting,
                                variant=variant, impl=loss_cfg.impl, z_loss=loss_cfg.z_loss)


@dataclasses.dataclass(frozen=True)
class Documents:
  """data.document_mask of a run: its store's EOS id, and whether positions restart at each
  document (data.document_positions)."""
  eos_id: int
  restart_positions: bool = False

  @classmethod
  def of(cls, data, eos_id: int | None) -> Documents | None:
    """Returns the Documents of config.data, None without data.document_mask."""
    if not data.document_mask:
      return None
    if eos_id is None:
      raise ValueError("data.document_mask needs the token store's EOS id")
    return cls(int(eos_id), data.document_positions)


def view(window_BxW, view_fn, documents: Documents | None):
  """Returns a window's inputs, targets, and the documents and positions of the model's
  positions ([B, L] each, None without document masks) under a phase's `view_fn`."""
  if documents is None:
    return (*view_fn(window_BxW), None, None)
  inputs, targets, docs_BxL = sp.document_view(window_BxW, documents.eos_id, view_fn)
  positions_BxL = sp.document_positions(docs_BxL) if documents.restart_positions else None
  return inputs, targets, docs_BxL, positions_BxL


def loss(model: nnx.Module, window_BxW: jax.Array, phase: Phase, loss_cfg: Loss,
         documents: Documents | None = None) -> tuple[jax.Array, Any]:
  """Returns (loss, aux) of a window in `phase`: superposed inputs and the MCE in tst, the
  ordinary next-token loss in ntp, where no superposition code runs. With `documents`, no
  position sees or predicts another document's tokens (superposition.document_view).

  With multi-token prediction the loss is the next-token head's, and aux holds under
  mtp_lib.ATTR the CE of each further token t+2..t+k, [k - 1], each over the positions whose
  target the window holds, without the z-loss."""
  if phase.mtp_k > 1:
    inputs, targets_BxLxK, docs_BxL, positions_BxL = view(
        window_BxW, functools.partial(sp.tst_view, bag_size=phase.mtp_k, mode="output_only"),
        documents)
    h_KxBxLxD, aux = mtp_lib.hidden_states(model, inputs, targets_BxLxK, docs_BxL,
                                           positions_BxL)
    plain = dataclasses.replace(loss_cfg, z_loss=0.0)
    further = [lm_loss(model, h_KxBxLxD[j], targets_BxLxK[..., j:j + 1], plain)
               for j in range(1, phase.mtp_k)]
    return (lm_loss(model, h_KxBxLxD[0], targets_BxLxK[..., :1], loss_cfg),
            dict(aux, **{mtp_lib.ATTR: jnp.stack(further)}))
  if not phase.is_tst:
    inputs, targets_BxLxS, docs_BxL, positions_BxL = view(window_BxW, sp.ntp_view, documents)
    targets_BxLxS, weighting = targets_BxLxS[..., None], {}
  else:
    if window_BxW.shape[1] != phase.window:
      raise ValueError(f"phase {phase.name}: windows of {window_BxW.shape[1]} tokens, the plan "
                       f"says {phase.window} (T + 1 = {phase.data_seq_len} + 1)")
    inputs, targets_BxLxS, docs_BxL, positions_BxL = view(
        window_BxW, functools.partial(sp.tst_view, bag_size=phase.bag_size, mode=phase.mode),
        documents)
    weighting = dict(weighting=phase.weighting, variant=phase.variant)
  hidden_BxLxD, aux = model.forward(inputs, docs_BxL, positions_BxL)
  return lm_loss(model, hidden_BxLxD, targets_BxLxS, loss_cfg, **weighting), aux


def objective(model: nnx.Module, window_BxW: jax.Array, phase: Phase, loss_cfg: Loss,
              documents: Documents | None = None) -> tuple[jax.Array, tuple[jax.Array, dict]]:
  """Returns what a train step minimises on a window, and (`loss`'s value, metrics): the loss,
  the model's auxiliary losses (MoE's) and, with multi-token prediction, λ x the further
  tokens' mean CE."""
  value, aux = loss(model, window_BxW, phase, loss_cfg, documents)
  further_J = aux.pop(mtp_lib.ATTR, None) if isinstance(aux, dict) else None
  aux_loss, metrics = model.aux_loss(aux)
  if further_J is not None:
    mtp_loss, mtp_metrics = mtp_lib.objective(further_J, phase.mtp_weight)
    aux_loss, metrics = aux_loss + mtp_loss, dict(metrics, **mtp_metrics)
  return value + aux_loss, (value, metrics)


def make_train_step(graphdef: nnx.GraphDef, phase: Phase, loss_cfg: Loss,
                    tx: optax.GradientTransformation, schedule: Callable, grad_accum: int = 1,
                    mesh_rules: tuple | None = None,
                    documents: Documents | None = None) -> Callable:
  """Returns train_step(state, window) -> (state, metrics) of `phase`, with grads accumulated over
  micro-batches, traced under `mesh_rules`, a (mesh, logical axis rules) pair, where given."""

  def loss_and_aux(params, window):
    return objective(nnx.merge(graphdef, params), window, phase, loss_cfg, documents)

  grad_fn = jax.value_and_grad(loss_and_aux, has_aux=True)
  scope = (lambda: axis_rules(*mesh_rules)) if mesh_rules else contextlib.nullcontext

  def train_step(state: TrainState, window_BxW):
    with scope():
      if grad_accum == 1:
        (_, (value, aux_metrics)), grads = grad_fn(state.params, window_BxW)
      else:
        # Row r goes to micro-batch r % grad_accum, so each keeps the batch sharding.
        micro = window_BxW.reshape(-1, grad_accum, window_BxW.shape[-1]).swapaxes(0, 1)
        micro = constrain(micro, (None, "batch", None))
        zeros = jax.tree.map(jnp.zeros_like, state.params)

        def accumulate(carry, window):
          (_, (value, aux_metrics)), grads = grad_fn(state.params, window)
          return jax.tree.map(jnp.add, carry, grads), (value, aux_metrics)

        grads, (value, aux_metrics) = jax.lax.scan(accumulate, zeros, micro)
        grads = jax.tree.map(lambda g: g / grad_accum, grads)
        value, aux_metrics = jnp.mean(value), jax.tree.map(lambda x: jnp.mean(x, 0),
                                                           aux_metrics)
      with jax.named_scope("optimizer"):   # the step profile's category (train/step_profile)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        if phase.mtp_k == 1 and mtp_lib.ATTR in state.params:
          # Heads that this phase does not train keep their init and their optimizer state,
          # weight decay and step count included, for the MTP phase that follows.
          updates, opt_state = optim.hold(mtp_lib.ATTR, updates, opt_state, state.opt_state)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        # NaN/Inf guard: a non-finite loss or gradient leaves params and optimizer untouched,
        # so no bad state can reach a checkpoint. The loop stops or skips by train.nan_policy.
        finite = jnp.isfinite(value) & jnp.isfinite(grad_norm)
        params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                         (params, opt_state), (state.params, state.opt_state))
    metrics = dict(loss=value, lr=schedule(state.step), grad_norm=grad_norm,
                   param_norm=optax.tree.norm(params), update_norm=optax.tree.norm(updates),
                   finite=finite, **io_norms(params), **optim.moment_stats(opt_state),
                   **aux_metrics)
    return TrainState(state.step + 1, params, opt_state), metrics

  return train_step


def io_norms(params) -> dict:
  """Returns the norms of the embedding and the LM head (embed_norm, head_norm; a tied head is
  the embedding): the layers TST trains differently, whose scale the switch carries over."""
  return {f"{'head' if key == 'lm_head' else key}_norm": optax.tree.norm(params[key])
          for key in sp.IO_PARAMS if key in params}


def make_eval_step(graphdef, documents: Documents | None = None):
  """eval_step(params, window) -> (sum of next-token NLL, number of tokens), in nats; with
  `documents`, each document alone, its first token not counted."""
  def eval_step(params, window_BxW):
    model = nnx.merge(graphdef, params)
    inputs_BxL, labels_BxL, docs_BxL, positions_BxL = view(window_BxW, sp.ntp_view, documents)
    logits = model(inputs_BxL, documents_BxL=docs_BxL, positions_BxL=positions_BxL)
    per_token, mask = losses.mce_loss_per_position(logits, labels_BxL[..., None])
    return jnp.sum(per_token * mask), jnp.sum(mask)
  return eval_step


def make_scored_step(documents: Documents | None = None):
  """scored_step(window, bytes) -> (the targets eval_step scores, the UTF-8 bytes of text
  under them), `bytes` [B, W] holding the bytes under each token of `window`: with
  `documents`, no document's first token, as eval_step."""
  def scored_step(window_BxW, bytes_BxW):
    _, labels_BxL, _, _ = view(window_BxW, sp.ntp_view, documents)
    mask_BxL = labels_BxL != sp.IGNORE_INDEX
    return jnp.sum(mask_BxL), jnp.sum(jnp.where(mask_BxL, bytes_BxW[:, 1:], 0))
  return scored_step


def make_bag_eval_step(graphdef, phase: Phase, loss_cfg: Loss,
                       documents: Documents | None = None):
  """bag_eval_step(params, window) -> the loss of tst `phase` on a window of its S·L + 1
  tokens, as its train step computes it (`loss`), without the z-loss and MoE's auxiliary
  losses, which regularise training and are no part of the task."""
  loss_cfg = dataclasses.replace(loss_cfg, z_loss=0.0)

  def bag_eval_step(params, window_BxW):
    return loss(nnx.merge(graphdef, params), window_BxW, phase, loss_cfg, documents)[0]
  return bag_eval_step


@dataclasses.dataclass(frozen=True)
class Trainer:
  """Builds each phase's jitted train step of a run from what they all share, made from its
  checked spec with nothing allocated: the mesh, the optimizer and its schedule, the model
  graph, the abstract TrainState and its shardings, the batch sharding. The run's Setup,
  the fit check and the step benchmark all build their steps with one."""
  spec: RunSpec
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: Callable
  graphdef: nnx.GraphDef
  abstract: TrainState          # shapes only
  shardings: TrainState         # NamedShardings of each leaf
  batch_sharding: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]   # key -> a fresh TrainState (init_fn), made in
                                            # `of` with the rest (benchmarks/config_path.py)

  @classmethod
  def of(cls, spec, devices=None) -> Trainer:
    mesh = mesh_lib.make_mesh(spec.mesh, devices)
    mtp_from = [p.first_step for p in spec.plan.phases if p.mtp_k > 1]
    switch, warmup = spec.plan.switch_step, spec.tst.switch_warmup
    tx, schedule = optim.make_optimizer(spec.optimizer, spec.plan.total_steps,
                                        (mtp_lib.ATTR, mtp_from[0]) if mtp_from else None,
                                        (switch, warmup) if switch and warmup else None)
    graphdef, abstract = abstract_state(spec.model, tx, spec.mtp)
    rules = spec.run.logical_axis_rules
    return cls(spec, mesh, tx, schedule, graphdef, abstract, shardings_of(abstract, mesh, rules),
               mesh_lib.batch_sharding(mesh, rules, 2), init_fn(spec.model, tx, spec.mtp))

  def init_state(self, seed: int) -> TrainState:
    """Returns a fresh TrainState, initialised by one jitted init directly into its shardings."""
    with axis_rules(self.mesh, self.spec.run.logical_axis_rules):
      return jax.jit(self.init, out_shardings=self.shardings)(jax.random.key(seed))

  def init_params(self, seed: int, which) -> nnx.State:
    """Returns the parameters that the nnx filter `which` selects of `init_state(seed)`, in
    their shardings. The jitted init computes those alone: XLA drops the rest, unused."""
    part = lambda params: nnx.split_state(params, which, ...)[0]
    with axis_rules(self.mesh, self.spec.run.logical_axis_rules):
      return jax.jit(lambda key: part(self.init(key).params),
                     out_shardings=part(self.shardings.params))(jax.random.key(seed))

  def check(self) -> None:
    """Before compiling: every parameter, and every phase's (micro-)batch and the eval batch,
    divides over the mesh axes that shard it."""
    accum = self.spec.optimizer.grad_accum
    for p in self.spec.plan.phases:
      mesh_lib.check_batch(p.batch_size // accum, self.batch_sharding,
                           f"phase {p.name}'s {p.batch_size // accum} rows"
                           + (f" per micro-batch (grad_accum={accum})" if accum > 1 else ""))
    mesh_lib.check_batch(self.spec.data.batch_size, self.batch_sharding,
                         f"the eval batch's {self.spec.data.batch_size} rows")
    mesh_lib.check_divisible(self.abstract.params, self.shardings.params)

  def train_step(self, phase: Phase, eos_id: int | None = None) -> Callable:
    """Returns the jitted train step of `phase`, with explicit shardings and the state donated.
    `eos_id`, the token store's, splits documents under data.document_mask."""
    step = make_train_step(self.graphdef, phase, self.spec.loss, self.tx, self.schedule,
                           self.spec.optimizer.grad_accum,
                           (self.mesh, self.spec.run.logical_axis_rules),
                           Documents.of(self.spec.data, eos_id))
    return jax.jit(step,
                   in_shardings=(self.shardings, self.batch_sharding),
                   out_shardings=(self.shardings, mesh_lib.replicated(self.mesh)),
                   donate_argnums=(0,))
