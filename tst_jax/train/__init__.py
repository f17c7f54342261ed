"""The step: optimizer, pure train step, setup, the two-phase loop, checkpoints, evaluation and
the phase handoff."""
