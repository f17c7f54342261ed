"""Training: run plan, optimizer, pure train step, checkpoints, metrics and the two-phase loop."""
