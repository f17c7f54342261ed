"""FP8 matmuls for the decoder's linear layers under `model.matmul_precision=fp8`, through qwix.

`einsum(subscripts, x, w)` is `jnp.einsum(subscripts, x, w)` with its dot_general replaced by
qwix's quantized-training dot_general from the `fp8` extra. It is configured as the usual FP8
training recipe with per-tensor current scaling:
  forward   x and w are each scaled by absmax / 448, one scale per tensor computed every step,
            cast to float8_e4m3fn, multiplied in one f8 x f8 dot and rescaled. On Hopper GPUs
            that dot is XLA's FP8 GEMM.
  backward  the incoming gradient is quantized the same way to float8_e5m2, with more range and
            less precision, and multiplied with the forward's f8 operands, so dx and dw are fp8
            dots too.
The output has x's dtype. qwix owns the scaling code, and nothing here computes a scale.

This does not use `qwix.quantize_model`, qwix's public entry, because that intercepts every
dot_general and einsum called inside the matched modules. In our Attention those include the
q·kᵀ and p·v einsums of XLA's `jax.nn.dot_product_attention`, and in the MoE layer the float32
router. Calling qwix's QT dot_general at the linear layers themselves quantizes exactly those,
as MaxText's qwix integration does. It lives in `qwix._src`, so the extra pins qwix below 0.2.
"""

from __future__ import annotations

import jax.numpy as jnp

from tst_jax.errors import ConfigError

FIELD = "model.matmul_precision"
FORWARD_QTYPE = jnp.float8_e4m3fn    # activations and weights: 3 mantissa bits, |x| <= 448
BACKWARD_QTYPE = jnp.float8_e5m2     # incoming gradients: 2 mantissa bits, |x| <= 57344
NEEDS_QWIX = ("'fp8' needs qwix (0.1.8 or a later 0.1.x), which is not installed here: "
              "pip install 'tst-jax[fp8]' (or pip install 'qwix>=0.1.8,<0.2'), or use 'default'")


def _qwix_qt():
  """Imports qwix's quantized-training dot_general module on first use, since qwix is optional."""
  try:
    from qwix._src.core import dot_general_qt  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(FIELD, NEEDS_QWIX) from None
  return dot_general_qt


def unavailable() -> str | None:
  """Says why fp8 cannot run here, or returns None when it can."""
  try:
    _qwix_qt()
  except ConfigError as e:
    return e.message
  return None


def qt_config(qt):
  """Builds the recipe above as qwix's DotGeneralQtConfig.

  That is absmax calibration, qwix's default, one scale per tensor with no per-channel axes,
  e4m3 forward and e5m2 gradients. The backward reuses the forward's quantized operands, as
  qwix does by default when the backward is quantized.
  """
  return qt.DotGeneralQtConfig(
      lhs_qtype=FORWARD_QTYPE, rhs_qtype=FORWARD_QTYPE,
      lhs_disable_channelwise_axes=True, rhs_disable_channelwise_axes=True,
      dlhs_grad_qtype=BACKWARD_QTYPE, drhs_grad_qtype=BACKWARD_QTYPE,
      dlhs_grad_disable_channelwise_axes=True, drhs_grad_disable_channelwise_axes=True)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                **kwargs):
  """Computes `jax.lax.dot_general` in FP8, with the signature jnp.einsum calls it with.

  The recipe is the same for both operands, so einsum may pass them in either order.
  """
  del precision, kwargs            # fp8 has one precision, and XLA propagates the sharding
  qt = _qwix_qt()
  out = qt.dot_general_qt(lhs, rhs, dimension_numbers, qt_config(qt))
  return out if preferred_element_type is None else out.astype(preferred_element_type)


def einsum(subscripts: str, x, w):
  """Computes `jnp.einsum(subscripts, x, w)` of two operands, both quantized to FP8 as above."""
  return jnp.einsum(subscripts, x, w, _dot_general=dot_general)
