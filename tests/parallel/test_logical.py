"""Logical axis names to mesh axes, compared with Flax's logical_to_mesh_axes, which it keeps."""

import json
import subprocess
import sys

from flax import linen as nn
from jax.sharding import PartitionSpec as P

from tests.fixtures.paths import ROOT
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES, logical_to_pspec

# Runs in a fresh process that emulates 64 CPU devices. For every config file and every
# device count it prints the logical names whose shardings differ between the two.
_COMPARE = """
import glob, json, jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 64)
from flax import nnx, linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P
from tst_jax import configlib, models
from tst_jax.parallel import logical, mesh as mesh_lib
from tst_jax.config import spec as spec_lib

ACTIVATIONS = [("batch", "length", "heads", "head_dim"), ("batch", "length", "mlp"),
               ("batch", "length", "embed"), ("batch", "length", "vocab"),
               (None, "batch", None), ("batch", None), ("expert", None, "mlp"),
               ("batch", "vocab")]
out = {}
for path in sorted(glob.glob("configs/*.py")):
  checked = spec_lib.check(configlib.load_config(path)).on_platform("cpu")
  rules = checked.run.logical_axis_rules
  model = nnx.eval_shape(lambda: checked.model.build(nnx.Rngs(0)))
  params = nnx.get_partition_spec(nnx.state(model, nnx.Param))
  names = {tuple(s) for s in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, P))}
  names |= set(ACTIVATIONS)
  for n in (1, 8, 64):
    mesh = mesh_lib.make_mesh(checked.mesh, jax.devices()[:n])
    differ = []
    for names_ in sorted(names, key=str):
      ours, theirs = logical.logical_to_pspec(names_, rules), nn.logical_to_mesh_axes(names_, rules)
      if ours != P(*theirs) or not NamedSharding(mesh, ours).is_equivalent_to(
          nn.logical_to_mesh_sharding(P(*names_), mesh, list(rules)), len(names_)):
        differ.append(str(names_))
    out[f"{path} x{n}"] = dict(names=len(names), differ=differ)
print(json.dumps(out))
"""


def test_same_shardings_as_flax_for_every_config_file_at_1_8_and_64_devices():
  proc = subprocess.run([sys.executable, "-c", _COMPARE], cwd=ROOT, capture_output=True,
                        text=True, check=True)
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(result) >= 3 * 9, sorted(result)
  for run, row in result.items():
    assert row["names"] >= 17 and row["differ"] == [], run


def test_flax_resolves_by_rule_priority_where_this_resolves_left_to_right():
  """What keeps logical.py: the two differ on arrays that the configs do not have."""
  # An FSDP axis ahead of the batch: here each dimension takes its free axes in order.
  names = ("embed", "batch")
  assert logical_to_pspec(names, LOGICAL_AXIS_RULES) == P("fsdp", ("data", "expert"))
  flax = P(*nn.logical_to_mesh_axes(names, LOGICAL_AXIS_RULES))
  assert flax == P(None, ("data", "fsdp", "expert"))
  # Flax skips a tuple rule when one of its axes is taken, and tries the name's next rule.
  rules = (("embed", "fsdp"), ("batch", ("data", "fsdp")), ("batch", "tensor"))
  assert logical_to_pspec(("embed", "batch"), rules) == P("fsdp", "data")
  assert P(*nn.logical_to_mesh_axes(("embed", "batch"), rules)) == P("fsdp", "tensor")
