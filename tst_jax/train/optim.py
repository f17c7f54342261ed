"""AdamW with a norm-excluding decay mask, global-norm clipping and one WSD schedule.

The train step drops non-finite updates itself rather than through optax.apply_if_finite, which
applies a bad update after max_consecutive_errors and keeps its counters in the optimizer state.
"""

from __future__ import annotations

import jax
import optax


def wsd_schedule(lr: float, total_steps: int, warmup_steps: int, decay_fraction: float,
                 final_lr_fraction: float = 0.0):
  """Returns the Warmup-Stable-Decay schedule over both phases, indexed by the global step.

  Linear warmup, then constant, then linear decay over the last `decay_fraction` of the steps,
  one schedule for both phases as in the paper.
  """
  decay_steps = round(decay_fraction * total_steps)
  warmup_steps = min(warmup_steps, total_steps - decay_steps)
  stable_steps = total_steps - decay_steps - warmup_steps
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)),
       optax.constant_schedule(lr),
       optax.linear_schedule(lr, lr * final_lr_fraction, max(decay_steps, 1))],
      boundaries=[warmup_steps, warmup_steps + stable_steps])


def decay_mask(params):
  """Marks the parameters that get weight decay: everything but norm scales."""
  def keep(path, _):
    return not any("norm" in str(getattr(k, "key", getattr(k, "name", k))) for k in path)
  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(opt_cfg, total_steps: int):
  """Builds the optax transformation and its schedule from the optimizer section."""
  schedule = wsd_schedule(opt_cfg.lr, total_steps, opt_cfg.warmup_steps,
                          opt_cfg.decay_fraction, opt_cfg.final_lr_fraction)
  tx = optax.chain(
      optax.clip_by_global_norm(opt_cfg.grad_clip),
      optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps,
                  weight_decay=opt_cfg.weight_decay, mask=decay_mask))
  return tx, schedule
