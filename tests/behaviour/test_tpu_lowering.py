"""Every paper config's train step, both phases, lowered for TPU from this CPU host with the TPU
kernels on the path: splash attention (forward, dq, dkv), the Mosaic fused loss (forward and
both backward kernels) and, for the MoE, lax.ragged_dot's grouped matmuls. The mesh is FSDP
over the 8 host devices, as each config shards over its slice: batch rows over 'fsdp', so each
Mosaic kernel runs per shard under shard_map (XLA cannot partition a custom call) and the
grouped matmuls see the local tokens. Shapes are the config's but two layers (and 16 experts):
the kernels' tiles are those of the full model. Lowered, never compiled: a kernel that does not
lower for TPU fails here."""

import re

import jax
import jax.numpy as jnp
import pytest

from tests.fixtures.paths import ROOT
from tst_jax import configlib
from tst_jax.config import spec as spec_lib
from tst_jax.kernels import target
from tst_jax.train import step as step_lib

SPLASH = {"splash_mqa_fwd_residuals", "splash_mqa_dq_no_residuals",
          "splash_mqa_dkv_no_residuals"}
FUSED_LOSS = {"linear_mce_fwd", "linear_mce_bwd_hidden", "linear_mce_bwd_head"}
# attention_impl auto: splash at the configs' L 2048 on TPU; the fused loss is forced, since
# auto keeps XLA's loss on TPU until one is measured there.
SMALL = ["model.n_layers=2", "data.batch_size=8", "mesh.fsdp=8", "mesh.data=1",
         "loss.impl=pallas", "data.source=builtin:pystdlib"]
CONFIGS = {"llama_270m": [], "llama_600m": ["optimizer.grad_accum=1"],
           "llama_3b": [], "qwen3_moe_10b_a1b": ["model.n_experts=16"]}


def lowered_for_tpu(name: str) -> dict[str, str]:
  """Returns each phase's train step of configs/<name>.py as lowered for TPU, in text."""
  config = configlib.apply_overrides(
      configlib.load_config(f"{ROOT}/configs/{name}.py"), SMALL + CONFIGS[name])
  spec = spec_lib.check(config).on_platform("tpu")
  trainer = step_lib.Trainer.of(spec, jax.devices()[:8])
  texts = {}
  for phase in spec.plan.phases:
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), jnp.int32,
                                  sharding=trainer.batch_sharding)
    with target.lowering_for("tpu"):
      texts[phase.name] = trainer.train_step(phase).trace(trainer.abstract, window).lower(
          lowering_platforms=("tpu",)).as_text()
  return texts


def kernels_in(text: str) -> set[str]:
  return set(re.findall(r'kernel_name = "([^"]+)"', text))


@pytest.mark.parametrize("name", [
    "llama_270m",
    pytest.param("llama_600m", marks=pytest.mark.slow),
    pytest.param("llama_3b", marks=pytest.mark.slow),
    "qwen3_moe_10b_a1b"])
def test_both_phases_of_each_paper_config_lower_for_tpu_with_its_kernels(name):
  texts = lowered_for_tpu(name)
  assert set(texts) == {"tst", "ntp"}
  for phase, text in texts.items():
    assert kernels_in(text) == SPLASH | FUSED_LOSS, (name, phase)
    assert re.search(r"sdy.manual_computation|SPMDFullToShardShape", text), (name, phase)
    if name.startswith("qwen3_moe"):
      assert "ragged_dot" in text, phase        # the experts' grouped matmuls, native on TPU

