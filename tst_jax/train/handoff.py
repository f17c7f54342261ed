"""The phase handoff: a run continues into its next phase through a checkpoint."""

from __future__ import annotations

import jax

from tst_jax import optim, superposition as sp
from tst_jax.train import checkpoint as ckpt_lib, step as step_lib
from tst_jax.run.console import Console
from tst_jax.config.plan import Phase


def handoff(state: step_lib.TrainState, phase: Phase, checkpoints: ckpt_lib.RunCheckpoints,
            trainer: step_lib.Trainer, console: Console) -> step_lib.TrainState:
  """Returns the state `phase` starts from: `state` saved, then restored with its optimizer
  state, step and data position. At the switch to ntp, tst.reinit_at_switch asks for a fresh
  embedding and head, tst.switch_adam = reset for fresh Adam moments."""
  checkpoints.save_step(state, phase.first_step, force=True)
  checkpoints.wait()
  state, meta = checkpoints.restore(phase.first_step, checkpoints.abstract_state)
  tst = trainer.spec.tst
  switch = phase.first_step == trainer.spec.plan.switch_step
  reinit, reset = switch and tst.reinit_at_switch, switch and tst.switch_adam == "reset"
  console.print(f"phase switch at step {phase.first_step}: restored the {meta['phase']} "
                f"checkpoint, now {phase.name}"
                + (f" S={phase.bag_size}" if phase.is_tst else "")
                + (" with a fresh embedding and LM head (reinit_at_switch)" if reinit else "")
                + (" with fresh Adam moments (switch_adam=reset)" if reset else "")
                + (f", the lr warmed up again over {tst.switch_warmup} steps (switch_warmup)"
                   if switch and tst.switch_warmup else ""))
  if reinit:
    state = reinit_embedding_and_head(state, trainer)
  if reset:
    fresh = jax.jit(trainer.tx.init, out_shardings=trainer.shardings.opt_state)(state.params)
    state = state.replace(opt_state=optim.fresh_moments(state.opt_state, fresh))
  return state


def reinit_embedding_and_head(state: step_lib.TrainState,
                              trainer: step_lib.Trainer) -> step_lib.TrainState:
  """Returns `state` with a fresh embedding and LM head and their Adam moments: the paper's
  randomisation ablation at the start of phase 2."""
  fresh = trainer.init_state(trainer.spec.run.seed + 1)
  return state.replace(params=sp.switch_to_next_token(state.params, fresh.params),
                       opt_state=sp.switch_to_next_token(state.opt_state, fresh.opt_state))
