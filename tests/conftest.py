"""Test setup: CPU, float32 matmuls, strict rank promotion, 8 virtual devices for mesh tests."""

import os

# Must happen before jax is imported anywhere: mesh tests need several host devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")
