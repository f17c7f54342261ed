"""Test setup: CPU, float32 matmuls, strict rank promotion, 8 virtual devices for mesh tests."""

import os
import tempfile

from tests.fixtures.subprocess_env import fast_compile_flags   # imports no jax

# Must happen before jax is imported anywhere: mesh tests need several host devices, and
# the tests' tiny programs compile several times faster under fast_compile_flags.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      + fast_compile_flags())
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most test time is XLA compiling the same tiny shapes: a persistent compilation cache
# (inherited by the subprocess tests through the environment) makes repeats nearly free.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "tst_jax_test_compilation_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# trackio keeps its local runs here, not in the user's cache; it reads this on import.
os.environ.setdefault("TRACKIO_DIR", os.path.join(tempfile.gettempdir(), "tst_jax_test_trackio"))
# gcsfs reads this on import: tests/fixtures/buckets.py says why the emulator needs it off.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import jax  # noqa: E402

pytest_plugins = ["tests.fixtures.buckets"]   # gcs_emulator, bucket and root, for any test

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")
