"""tokamax's autotuning for the shapes a run's kernels see: once per shape, kept on disk.

tokamax gives each kernel call the tile configuration its autotuning cache holds for that exact
call: shapes, dtypes, dimension numbers and kernel. The cache holds the tables it ships,
measured at shapes of its own choosing, and any `tokamax.AutotuningResult` entered as a
context. A call it has no entry for runs a small default tile, and every grouped GEMM of the
MoE step missed the tables on an H100. `tuned(call, *args)` is that context for one call's
shapes: `tokamax.autotune`'s result, read from `directory()` where an earlier process kept it,
else measured now, which takes minutes once per shape and device kind, and kept there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys

import jax

from tst_jax import fileio

ENV = "TST_JAX_TOKAMAX_TUNING"   # a directory, or "off"
TIMEOUT_S = 60.0                 # tokamax's limit on compiling one candidate configuration
_RESULTS: dict = {}              # key -> tokamax.AutotuningResult, in this process


def directory(environ=os.environ) -> str | None:
  """Returns where results are kept, or None when $TST_JAX_TOKAMAX_TUNING is 'off'.

  That variable names the directory, else it is tst_jax/tokamax in the user cache directory,
  $XDG_CACHE_HOME or ~/.cache. With 'off' only tokamax's own tables and heuristics apply.
  """
  chosen = environ.get(ENV, "")
  if chosen == "off":
    return None
  if chosen:
    return chosen
  return fileio.user_cache("tokamax", environ=environ)


def describe(environ=os.environ) -> str:
  """Says what the plan prints about tuning."""
  where = directory(environ)
  if where is None:
    return f"tokamax autotuning off ({ENV}=off)"
  return f"each shape autotuned once by tokamax, results kept in {where} ({ENV} to move)"


def key(call, *args) -> str:
  """Returns what a result is valid for: device kind, tokamax's version, the call and operands.

  The call counts with its own arguments, such as dimension numbers, output dtype and kernel,
  and the operands with their shapes and dtypes.
  """
  import tokamax   # pylint: disable=g-import-not-at-top
  settings = sorted((k, repr(v)) for k, v in call.keywords.items())
  return json.dumps([jax.devices()[0].device_kind, tokamax.__version__, settings,
                     [(list(a.shape), str(a.dtype)) for a in args]])


def tuned(call, *args):
  """Returns the autotuning context for `call(*args)`, a no-op context when tuning is off.

  `call` is a functools.partial of a tokamax op. args may be tracers, since only their shapes
  count.
  """
  where = directory()
  if where is None:
    return contextlib.nullcontext()
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  k = key(call, *specs)
  if k not in _RESULTS:
    _RESULTS[k] = _load(where, k) or _tune(where, k, call, specs)
  return _RESULTS[k]


def _path(where: str, k: str) -> str:
  return os.path.join(where, hashlib.sha256(k.encode()).hexdigest()[:24] + ".json")


def _load(where: str, k: str):
  """Returns the kept result for key `k`, or None when there is none, another key or junk."""
  import tokamax   # pylint: disable=g-import-not-at-top
  try:
    with open(_path(where, k)) as f:
      kept = json.load(f)
    if kept.get("key") != k:
      return None
    return tokamax.AutotuningResult.loads(json.dumps(kept["result"]))
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _tune(where: str, k: str, call, specs):
  import tokamax   # pylint: disable=g-import-not-at-top
  shapes = " x ".join(f"{a.dtype}{list(a.shape)}" for a in specs)
  sys.stderr.write(f"tokamax: autotuning {shapes} once (kept in {where})\n")
  result = tokamax.autotune(call, *specs, timeout=TIMEOUT_S, progress_bar=False)
  try:   # a configuration that timed out leaves a TimeoutError that tokamax cannot serialize
    text = result.dumps()
  except (ValueError, TypeError) as e:
    sys.stderr.write(f"tokamax: the result for {shapes} is used but not kept: {e}\n")
    return result
  os.makedirs(where, exist_ok=True)
  fileio.write_json(_path(where, k), dict(key=k, result=json.loads(text)))
  return result
