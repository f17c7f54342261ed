"""The phase handoff: a run continues into its next phase through a checkpoint."""

from __future__ import annotations

from tst_jax import superposition as sp
from tst_jax.train import checkpoint as ckpt_lib, step as step_lib
from tst_jax.run.console import Console
from tst_jax.config.plan import Phase


def handoff(state: step_lib.TrainState, phase: Phase, checkpoints: ckpt_lib.RunCheckpoints,
            trainer: step_lib.Trainer, console: Console) -> step_lib.TrainState:
  """Returns the state `phase` starts from: `state` saved, then restored with its optimizer
  state, step and data position, with a fresh embedding and head where tst.reinit_at_switch
  asks for them at the switch to ntp."""
  checkpoints.save_step(state, phase.first_step, force=True)
  checkpoints.wait()
  state, meta = checkpoints.restore(phase.first_step, checkpoints.abstract_state)
  reinit = trainer.spec.tst.reinit_at_switch and not phase.is_tst
  console.print(f"phase switch at step {phase.first_step}: restored the {meta['phase']} "
                f"checkpoint, now {phase.name}"
                + (f" S={phase.bag_size}" if phase.is_tst else "")
                + (" with a fresh embedding and LM head (reinit_at_switch)" if reinit else ""))
  return reinit_embedding_and_head(state, trainer) if reinit else state


def reinit_embedding_and_head(state: step_lib.TrainState,
                              trainer: step_lib.Trainer) -> step_lib.TrainState:
  """Returns `state` with a fresh embedding and LM head and their Adam moments: the paper's
  randomisation ablation at the start of phase 2."""
  fresh = trainer.init_state(trainer.spec.run.seed + 1)
  return state.replace(params=sp.switch_to_next_token(state.params, fresh.params),
                       opt_state=sp.switch_to_next_token(state.opt_state, fresh.opt_state))
