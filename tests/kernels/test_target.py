"""kernels/target.py: the platform kernels trace for, the backend's unless a lowering for
another platform says otherwise; the lowerings themselves are tests/behaviour/test_tpu_lowering.py's
and tests/kernels/test_linear_mce.py's."""

import jax
import jax.numpy as jnp
import pytest

from tst_jax import losses
from tst_jax.kernels import target


def test_lowering_for_sets_the_platform_inside_only():
  assert target.platform() == jax.default_backend() == "cpu"
  with target.lowering_for("tpu"):
    assert target.platform() == "tpu"
    with target.lowering_for("gpu"):
      assert target.platform() == "gpu"
    assert target.platform() == "tpu"
  assert target.platform() == "cpu"
  with pytest.raises(ValueError, match="a platform is tpu, gpu or cpu"):
    with target.lowering_for("tpuv5"):
      pass


def test_the_fused_loss_lowers_mosaic_kernels_for_tpu_only_inside_lowering_for():
  """Outside `lowering_for` the fused loss traces as this CPU's, interpreted: a lowering for
  TPU holds no Mosaic kernel, which is why a lowering for TPU must say so first. Either order
  in one process: the kernels' jit caches key on the platform."""
  args = (jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((128, 512), jnp.bfloat16), jax.ShapeDtypeStruct((256, 2), jnp.int32))
  def text():
    loss = jax.jit(jax.value_and_grad(lambda h, w, t: losses.linear_mce_loss(h, w, t,
                                                                             impl="pallas")))
    return loss.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
  assert "tpu_custom_call" not in text()
  with target.lowering_for("tpu"):
    assert "tpu_custom_call" in text()
  assert "tpu_custom_call" not in text()   # the kernel's jit keys on the platform, not reused
