"""Builds the optimizer: AdamW, or Muon for the blocks' matrices with AdamW for the rest.

Both get a norm-excluding decay mask, global-norm clipping and one learning-rate schedule over
both phases. The train step drops non-finite updates itself rather than through
optax.apply_if_finite, which applies a bad update after max_consecutive_errors and keeps its
counters in the optimizer state.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from optax import contrib

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("wsd", "cosine")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
MU_DTYPES = ("float32", "bfloat16")
SWITCH_ADAM = ("keep", "reset")   # tst.switch_adam: what Adam's moments do at the switch
# Axes Muon orthogonalises each slice of separately: a scanned block's layer, an MoE expert.
STACKED_AXES = ("layers", "expert")
# Muon's update RMS scaled to AdamW's, so that both share the lr and the weight decay
# ("Muon is Scalable for LLM Training", Liu et al.).
MUON_RMS = 0.2


def decay_curve(shape: str, x):
  """Returns the lr's share of its way from peak to end at a fraction x of the decay.

  It is 1 at x = 0 and 0 at x = 1.
  """
  curves = {"linear": lambda x: 1.0 - x,
            "cosine": lambda x: 0.5 * (1.0 + jnp.cos(jnp.pi * x)),
            "1-sqrt": lambda x: 1.0 - jnp.sqrt(x)}   # optax has no such piece (test_optim)
  return curves[shape](x)


def lr_schedule(opt_cfg, total_steps: int, rewarm: tuple[int, int] | None = None):
  """Returns the learning rate at each global step, over both phases.

  A linear warmup comes first. WSD then holds the peak and decays in `decay_shape` over the
  last `decay_fraction` of the steps. Cosine decays over all the steps after warmup. Both end
  at `final_lr_fraction` of the peak. `rewarm` = (first, steps) scales the steps from global
  step `first` on by (n + 1) / steps, the n-th of them, up to 1: a second linear warmup, at
  the switch to next-token training for tst.switch_warmup.
  """
  peak, final = opt_cfg.lr, opt_cfg.lr * opt_cfg.final_lr_fraction
  if opt_cfg.schedule == "cosine":
    warmup = min(opt_cfg.warmup_steps, total_steps)
    decay, shape = total_steps - warmup, "cosine"
  else:
    decay, shape = round(opt_cfg.decay_fraction * total_steps), opt_cfg.decay_shape
    warmup = min(opt_cfg.warmup_steps, total_steps - decay)

  # Not optax.join_schedules of its pieces: other float32 last bits move the losses (test_optim).
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    x = jnp.clip((step - (total_steps - decay)) / max(decay, 1), 0.0, 1.0)
    after = final + (peak - final) * decay_curve(shape, x)
    lr = jnp.where(step < warmup, peak * step / max(warmup, 1), after)
    if rewarm is None:
      return lr
    first, steps = rewarm
    return jnp.where(step >= first, lr * jnp.minimum((step - first + 1) / max(steps, 1), 1.0),
                     lr)
  return schedule


def decay_mask(params):
  """Marks the parameters that get weight decay: everything but norm scales."""
  def keep(path, _):
    return not any("norm" in str(getattr(k, "key", getattr(k, "name", k))) for k in path)
  return jax.tree_util.tree_map_with_path(keep, params)


def muon_dims(variable):
  """Returns how Muon reads a parameter as matrices, or None for AdamW's parameters.

  From its logical axis names: a hidden weight has an 'embed' axis and no 'vocab' or 'norm'
  one. Its stacked axes are batch axes, 'embed' is the input axis when it comes first and
  the output axis otherwise, and the other axes are the other side of the matrix.
  """
  names = (variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable)
           else None)
  if not names or "embed" not in names or {"vocab", "norm"} & set(names):
    return None
  matrix = [i for i, n in enumerate(names) if n not in STACKED_AXES]
  embed, rest = names.index("embed"), tuple(i for i in matrix if names[i] != "embed")
  if len(matrix) < 2:
    return None
  if embed == matrix[0]:
    return contrib.MuonDimensionNumbers(reduction_axis=embed, output_axis=rest)
  return contrib.MuonDimensionNumbers(reduction_axis=rest, output_axis=embed)


def _dims_tree(params):
  """`muon_dims` of every parameter, None for a leaf another transform owns."""
  def dims(v):
    live = isinstance(v, nnx.Variable) and not isinstance(v.get_value(), optax.MaskedNode)
    return muon_dims(v) if live else None
  return jax.tree.map(dims, params, is_leaf=lambda v: isinstance(v, (nnx.Variable,
                                                                     optax.MaskedNode)))


def _labels(params):
  return jax.tree.map(lambda v: "adamw" if muon_dims(v) is None else "muon", params,
                      is_leaf=lambda v: isinstance(v, nnx.Variable))


def make_optimizer(opt_cfg, total_steps: int, late: tuple[str, int] | None = None,
                   rewarm: tuple[int, int] | None = None):
  """Builds the optax transformation and its schedule from the optimizer section.

  `late` = (key, step): the parameters under `key` first train at global step `step`, as the
  heads of multi-token prediction after TST's phase 1. They get an optimizer state of their own,
  whose step count starts at 0 there, for Adam's bias correction, and whose schedule reads
  the global step. The steps before hold them and that state as they are (`hold`).
  `rewarm` is lr_schedule's.
  """
  schedule = lr_schedule(opt_cfg, total_steps, rewarm)
  tx = _transform(opt_cfg, schedule)
  if late is not None:
    key, first = late
    tx = optax.partition({"model": tx, key: _transform(opt_cfg, lambda n: schedule(n + first))},
                         functools.partial(_late_labels, key))
  return optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip), tx), schedule


def _transform(opt_cfg, schedule):
  """Returns AdamW, or Muon with AdamW beside it, on `schedule`, without the clipping."""
  mu_dtype = jnp.dtype(opt_cfg.mu_dtype)
  adamw = optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                      weight_decay=opt_cfg.weight_decay, mask=decay_mask, mu_dtype=mu_dtype)
  if opt_cfg.name == "muon":
    muon = contrib.muon(schedule, weight_decay=opt_cfg.weight_decay, mu_dtype=mu_dtype,
                        muon_weight_dimension_numbers=_dims_tree, consistent_rms=MUON_RMS)
    adamw = optax.partition({"muon": muon, "adamw": adamw}, _labels)
  return adamw


def _under(path, key: str) -> bool:
  return any(str(getattr(k, "key", "")) == key for k in path)


def _late_labels(key: str, params):
  return jax.tree_util.tree_map_with_path(lambda path, _: key if _under(path, key) else "model",
                                          params, is_leaf=lambda v: isinstance(v, nnx.Variable))


def hold(key: str, updates, opt_state, old_opt_state):
  """Returns (`updates`, `opt_state`) of a step before make_optimizer's `late` parameters under
  `key` train: their updates zero and their optimizer state `old_opt_state`'s, so that the step
  leaves them, their moments and their step count as they are."""
  return (_from(key, updates, jax.tree.map(jnp.zeros_like, updates)),
          _from(key, opt_state, old_opt_state))


def _from(key: str, new, old):
  """Returns the pytree `new` with every leaf under `key` taken from `old`."""
  return jax.tree_util.tree_map_with_path(lambda path, n, o: o if _under(path, key) else n,
                                          new, old)


def fresh_moments(opt_state, fresh):
  """Returns `opt_state` with the moments and step counts of `fresh`, a newly initialised
  state of the same optimizer, but its own schedule counts (optax's ScaleByScheduleState), so
  that the learning rate goes on at the global step: Adam restarts, bias correction included,
  as at step 0, and so does Muon's momentum where optimizer.name is muon
  (tst.switch_adam = reset)."""
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  return jax.tree.map(lambda old, new: old if is_schedule(old) else new, opt_state, fresh,
                      is_leaf=is_schedule)


def moment_stats(opt_state) -> dict:
  """Returns the root mean square of Adam's first and second moments over every parameter
  AdamW holds (adam_mu_rms, adam_nu_rms): what the update m / sqrt(v) divides is what changes
  when the loss does, as at the switch to next-token training. Parameters not yet training
  (MTP heads waiting through TST's phase 1) count with their zero moments."""
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  states = [x for x in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(x)]
  def rms(trees):
    leaves = [x for t in trees for x in jax.tree.leaves(t)]
    if not leaves:
      return jnp.zeros((), jnp.float32)
    total = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)
    return jnp.sqrt(total / float(sum(x.size for x in leaves)))   # a count past int32 too
  return dict(adam_mu_rms=rms([st.mu for st in states]), adam_nu_rms=rms([st.nu for st in states]))
