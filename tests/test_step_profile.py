"""The step profile: a traced step's milliseconds by category, summing to its wall time."""

import jax
import numpy as np
import pytest

from tests.tiny import tiny_config
from tst_jax.tools import step_profile
from tst_jax.train import spec as spec_lib, step as step_lib


def traced_step(phase_name, **mesh):
  """The loop's jitted train step of the tiny config (fused XLA loss, XLA attention)."""
  config = tiny_config(loss=dict(impl="xla"), mesh=mesh)
  spec = spec_lib.check(config)
  plan = spec.plan
  phase = next(p for p in plan.phases if p.name == phase_name)
  layout = step_lib.Layout.of(spec)
  step = layout.train_step(phase)
  state = step_lib.init_state(spec.model, layout.tx, 0, layout.mesh, spec.rules)
  window = jax.device_put(np.random.default_rng(0).integers(
      0, spec.model.vocab_size, (phase.batch_size, phase.window), dtype=np.int32),
      layout.batch_sharding)
  for _ in range(2):   # compiled and warm
    state, _ = step(state, window)
  return step, jax.block_until_ready(state), window


@pytest.mark.parametrize("phase_name", ["tst", "ntp"])
def test_profile_categories_sum_to_the_measured_step(phase_name, tmp_path):
  step, state, window = traced_step(phase_name, data=1)
  _, prof, walls = step_profile.profile_steps(step, state, window, steps=4,
                                              trace_dir=str(tmp_path))
  assert set(prof.ms) == set(step_profile.CATEGORIES) and prof.steps == 4
  assert sum(prof.ms.values()) == pytest.approx(prof.step_ms, rel=1e-6)
  # The traced windows are the steps the host timed (annotation inside the timer).
  assert prof.step_ms == pytest.approx(1e3 * np.mean(walls), rel=0.25, abs=0.5)
  for cat in ("attention", "matmul forward", "matmul backward", "loss", "optimizer",
              "embedding", "other ops"):
    assert prof.ms[cat] > 0, (cat, prof.table())
  assert prof.ms["collectives"] == 0 and prof.ms["idle"] < prof.step_ms
  assert "step (wall)" in prof.table() and prof.top_ops


def test_profile_sees_the_fsdp_collectives(tmp_path):
  step, state, window = traced_step("ntp", data=1, fsdp=2)
  _, prof, _ = step_profile.profile_steps(step, state, window, steps=2, trace_dir=str(tmp_path))
  assert prof.ms["collectives"] > 0, prof.table()
  assert sum(prof.ms.values()) == pytest.approx(prof.step_ms, rel=1e-6)


HLO = """HloModule jit_train_step, entry_computation_layout={()}

%fused_dot (p0: f32[4,8], p1: f32[8,2]) -> f32[4,2] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,2]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/transpose(jvp())/while/body/closed_call/bld,df->blf/dot_general"}
}

ENTRY %main (a: f32[4,8], b: f32[8,2]) -> (f32[4,2], f32[8]) {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,2]{1,0} parameter(1)
  %gemm_fusion = f32[4,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(train_step)/transpose(jvp())/while/body/closed_call/mul"}
  %all-gather-start = (f32[4], f32[8]) all-gather-start(%c), dimensions={0}, metadata={op_name="jit(train_step)/jvp()/while/body/closed_call/dot_general"}
  %fmha = (f32[4,2], /*index=1*/u8[0]{0}) custom-call(%a, %b), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp()/while/body/closed_call/attention/dot_product_attention"}
  %x = f32[4,2]{1,0} add(%gemm_fusion, %gemm_fusion), metadata={op_name="jit(train_step)/jvp(loss)/add"}
  %y = f32[8]{0} multiply(%b, %b), metadata={op_name="jit(train_step)/optimizer/jit(clip)/mul"}
  %z = f32[8]{0} scatter(%b, %b), metadata={op_name="jit(train_step)/transpose(jvp(embed))/scatter-add"}
  %w = (f32[8]{0}, s32[]) while(%t), condition=%cond, body=%body
  ROOT %t = (f32[4,2], f32[8]) tuple(%x, %y)
}
"""


def test_categories_from_the_hlo():
  """Opcodes, fused ops, name scopes and custom-call targets decide an op's category."""
  module, ops = step_profile.parse_hlo(HLO)
  assert module == "jit_train_step"
  got = {name: step_profile.category(ops[name]) for name in
         ("gemm_fusion", "all-gather-start", "fmha", "x", "y", "z", "w")}
  assert got == {"gemm_fusion": "matmul backward", "all-gather-start": "collectives",
                 "fmha": "attention", "x": "loss", "y": "optimizer", "z": "embedding",
                 "w": "other ops"}
  assert ops["w"].opcode == "while" and ops["fmha"].opcode == "custom-call"


def test_attribution_splits_overlap_and_counts_nesting_once():
  """Two lines overlapping share the instant; a nested event wins over its parent; the rest
  of the window is idle."""
  cat = {"a": "loss", "b": "optimizer", "outer": "other ops", "inner": "attention"}.get
  events = [("l1", 0, 10, "a"), ("l2", 5, 15, "b"),
            ("l3", 20, 30, "outer"), ("l3", 22, 26, "inner")]
  by_cat, _ = step_profile.attribute([(0, 40)], events, cat)
  assert by_cat == pytest.approx({"loss": 7.5, "optimizer": 7.5, "other ops": 6,
                                  "attention": 4, "idle": 15})
