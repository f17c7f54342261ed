"""The step: pure train step, setup, the two-phase loop, checkpoints, evaluation, the phase
handoff, the fit check that compiles the steps, and a trained run read back."""
