"""tst-jax: Token-Superposition Training for JAX/Flax language models."""

__version__ = "0.1.0"
