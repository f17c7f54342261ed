"""Conversion between tst_jax models and Hugging Face checkpoints."""
