"""Fused linear + multi-hot CE: per-row logsumexp and target logits without [N, V] logits."""
