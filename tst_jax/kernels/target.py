"""The platform the kernels are built for: the backend's, or, while a step is lowered ahead of
time for another (`lowering_for("tpu")` on a CPU host), that one.

A Pallas kernel picks its backend (Mosaic TPU or Triton) and whether it is interpreted when it
is traced, so a lowering for a TPU from a CPU host must say so before tracing: otherwise the
kernels trace as CPU's, interpreted, and the lowered program holds none of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("tst_jax_kernel_target",
                                                                     default=None)


def platform() -> str:
  """Returns the platform kernels trace for: 'tpu', 'gpu' or 'cpu'."""
  return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def lowering_for(name: str):
  """Traces the kernels inside for platform `name` ('tpu' or 'gpu'), not interpreted, for a
  `.lower(lowering_platforms=...)` of the same platform; nothing compiled here can run."""
  if name not in ("tpu", "gpu", "cpu"):
    raise ValueError(f"lowering_for: a platform is tpu, gpu or cpu, got {name!r}")
  token = _TARGET.set(name)
  try:
    yield
  finally:
    _TARGET.reset(token)


def jit(fn=None, *, static_argnames=()):
  """jax.jit of a kernel `fn(..., platform)` that reads the platform it traces for: each call
  passes `platform()` as a static argument, so the jit cache keys on it (a lowering for TPU
  never reuses a trace made for this CPU host). The wrapper takes `fn`'s arguments less
  `platform`."""
  if fn is None:
    return functools.partial(jit, static_argnames=static_argnames)
  names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
  jitted = jax.jit(fn, static_argnames=(*names, "platform"))

  @functools.wraps(fn)
  def call(*args, **kwargs):
    return jitted(*args, platform=platform(), **kwargs)
  return call
