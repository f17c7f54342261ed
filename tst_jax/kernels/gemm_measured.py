"""What the MoE lab measured of the grouped GEMM's kernels on each GPU, shipped as package data.

`gemm_measured.json`, beside this module, holds per device kind (jax's `device_kind`, such as
"NVIDIA H200") what `benchmarks/moe_lab.py --record` folds into it from a GPU call's rows:

  {"devices": {"NVIDIA H200": {
     "source": "the command, device, versions and date of the call",
     "passes": {"recipe": {"forward": {"mosaic": 1.21, "triton": 1.48}, "dx": {...},
                           "dw": {...}}},          # ms of each product of one layer, per kernel
     "tuned": [{"product": "dw", "kernel": "triton", "lhs": "bfloat16[262144,768]",
                "rhs": "bfloat16[262144,384]", "out": "bfloat16", "config": {...},
                "ms": 0.41, "start_ms": 0.62, "candidates": 30, "search_s": 41.0}]}}}

`passes` decides each product's kernel (`platform.grouped_matmul_backend`), `tuned` the tile
configuration of one call's exact shapes (`grouped_matmul`). The file is absent until a GPU
measured something: every reader then answers that nothing was measured.
"""

from __future__ import annotations

import functools
import json
import os

from tst_jax import fileio

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_measured.json")
PRODUCTS = ("forward", "dx", "dw")


def signature(shape, dtype) -> str:
  """Returns an operand's shape as the table writes it, e.g. 'bfloat16[262144,768]'."""
  return f"{dtype}[{','.join(str(int(n)) for n in shape)}]"


def load(path: str | None = None) -> dict:
  """Returns the devices of the table at `path`, by default FILE; {} where it is absent.

  A file that is not such a table is a ValueError naming it.
  """
  return _load(path or FILE)


@functools.cache
def _load(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  try:
    with open(path) as f:
      devices = json.load(f)["devices"]
    for entry in devices.values():
      if not isinstance(entry.get("source"), str) or not isinstance(entry.get("tuned", []), list):
        raise ValueError("an entry without its source, or tuned not a list")
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{path}: not a table of grouped GEMM measurements ({e})") from None
  return devices


def entry(device_kind: str, path: str | None = None) -> dict | None:
  """Returns what was measured on `device_kind`, None where nothing was."""
  return next((v for k, v in load(path).items() if k.lower() == device_kind.lower()), None)


def pass_times(device_kind: str, path: str | None = None) -> dict[str, dict[str, float]]:
  """Returns each product's ms per kernel on `device_kind`, summed over the shapes that timed
  every kernel the product was timed with; {} where nothing was measured."""
  found = entry(device_kind, path) or {}
  times = {}
  for product in PRODUCTS:
    per_shape = [s[product] for s in found.get("passes", {}).values() if s.get(product)]
    kernels = set.intersection(*(set(s) for s in per_shape)) if per_shape else set()
    if kernels:
      times[product] = {k: sum(s[k] for s in per_shape) for k in sorted(kernels)}
  return times


def tuned_config(device_kind: str, product: str, kernel: str, lhs: str, rhs: str, out: str,
                 path: str | None = None) -> dict | None:
  """Returns the config the lab's search found fastest for this exact call, None where it
  searched none."""
  for row in (entry(device_kind, path) or {}).get("tuned", []):
    if (row["product"], row["kernel"], row["lhs"], row["rhs"], row["out"]) == (
        product, kernel, lhs, rhs, out):
      return row["config"]
  return None


def tuned_count(device_kind: str, product: str, kernel: str, path: str | None = None) -> int:
  """Returns how many shapes of `product` on `kernel` the lab tuned on `device_kind`."""
  return sum(row["product"] == product and row["kernel"] == kernel
             for row in (entry(device_kind, path) or {}).get("tuned", []))


def describe(device_kind: str, path: str | None = None) -> str:
  """Says what the table holds for `device_kind`, for the plan."""
  found = entry(device_kind, path)
  name = os.path.basename(path or FILE)
  if found is None:
    return f"the MoE lab measured nothing on {device_kind} ({name} has no entry)"
  return (f"the MoE lab measured {len(found.get('passes', {}))} shapes' kernels and tuned "
          f"{len(found.get('tuned', []))} calls on {device_kind} ({name}: {found['source']})")


def record(table: dict, device_kind: str, source: str, passes: dict, tuned: list) -> dict:
  """Returns `table` with one GPU call's measurements of `device_kind` in it.

  `passes` ({shape: {product: {kernel: ms}}}) replaces the shapes it names; each of `tuned`
  replaces the row of the same call and kernel, if any. `source` replaces the entry's.
  """
  devices = dict(table)
  old = next((devices.pop(k) for k in list(devices) if k.lower() == device_kind.lower()), {})
  key = lambda row: (row["product"], row["kernel"], row["lhs"], row["rhs"], row["out"])
  new_keys = {key(row) for row in tuned}
  devices[device_kind] = dict(
      source=source, passes={**old.get("passes", {}), **passes},
      tuned=[r for r in old.get("tuned", []) if key(r) not in new_keys] + list(tuned))
  return devices


def write(devices: dict, path: str | None = None) -> None:
  """Writes the table of `devices` to `path`, the package's file by default."""
  fileio.write_json(path or FILE, {"devices": devices}, sort_keys=True)
  _load.cache_clear()
