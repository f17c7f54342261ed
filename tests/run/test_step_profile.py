"""The step profile: a traced step's milliseconds by category, summing to its wall time."""

import json
import os
import re
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import models
from tst_jax.parallel import xla_flags
from tst_jax.run import step_profile
from tst_jax.config import spec as spec_lib
from tst_jax.train import step as step_lib


def traced_step(phase_name, moe=False, **mesh):
  """The loop's jitted train step of the tiny config (fused XLA loss, XLA attention); `moe`:
  a tiny Qwen3-MoE with grouped GEMMs in place of its Llama."""
  config = tiny_config(loss=dict(impl="xla"), mesh=mesh)
  if moe:
    config.model = models.preset_config("qwen3_moe", "tiny_moe", vocab_size=512, dim=32,
                                        n_layers=2, n_heads=2, n_kv_heads=1, ffw_dim=64,
                                        moe_ffw_dim=32, expert_impl="gmm")
  spec = spec_lib.check(config)
  plan = spec.plan
  phase = next(p for p in plan.phases if p.name == phase_name)
  trainer = step_lib.Trainer.of(spec)
  step = trainer.train_step(phase)
  state = trainer.init_state(0)
  window = jax.device_put(np.random.default_rng(0).integers(
      0, spec.model.vocab_size, (phase.batch_size, phase.window), dtype=np.int32),
      trainer.batch_sharding)
  for _ in range(2):   # compiled and warm
    state, _ = step(state, window)
  return step, jax.block_until_ready(state), window


@pytest.mark.parametrize("phase_name", ["tst", pytest.param("ntp", marks=pytest.mark.slow)])
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


@pytest.mark.slow
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
  %mpmd_map.27 = bf16[16,2]{1,0} custom-call(%a, %b), custom_call_target="mosaic_gpu_v2", metadata={op_name="jit(train_step)/jvp()/while/body/closed_call/ragged_dot_general"}
  %mpmd_map.28 = bf16[16,8]{1,0} custom-call(%a, %b), custom_call_target="mosaic_gpu_v2", metadata={op_name="jit(train_step)/transpose(jvp())/while/body/closed_call/ragged_dot_general"}
  %triton_dw = bf16[2,8,2]{2,1,0} custom-call(%a, %b), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(train_step)/transpose(jvp())/while/body/closed_call/ragged_dot_general"}
  %gather.3 = f32[16,8]{1,0} gather(%a, %i), metadata={op_name="jit(train_step)/jvp()/while/body/closed_call/moe_dispatch/jit(_take)/gather"}
  %sort.1 = (s32[16]{0}, s32[16]{0}) sort(%i, %j), metadata={op_name="jit(train_step)/jvp()/while/body/closed_call/moe_dispatch/sort"}
  %input_fusion.9 = f32[4,8]{1,0} fusion(%g), kind=kInput, calls=%fused_dot, metadata={op_name="jit(train_step)/transpose(jvp(moe_combine))/moe_combine/reduce_sum"}
  ROOT %t = (f32[4,2], f32[8]) tuple(%x, %y)
}
"""


def test_categories_from_the_hlo():
  """Opcodes, fused ops, name scopes and custom-call targets decide an op's category."""
  module, ops = step_profile.parse_hlo(HLO)
  assert module == "jit_train_step"
  got = {name: step_profile.category(ops[name]) for name in
         ("gemm_fusion", "all-gather-start", "fmha", "x", "y", "z", "w", "mpmd_map.27",
          "mpmd_map.28", "triton_dw", "gather.3", "sort.1", "input_fusion.9")}
  assert got == {"gemm_fusion": "matmul backward", "all-gather-start": "collectives",
                 "fmha": "attention", "x": "loss", "y": "optimizer", "z": "embedding",
                 "w": "other ops",
                 # tokamax's grouped GEMMs (Mosaic GPU, Triton) are matmuls; the MoE's routing,
                 # dispatch and combine have their own category, whatever their opcodes
                 "mpmd_map.27": "matmul forward", "mpmd_map.28": "matmul backward",
                 "triton_dw": "matmul backward", "gather.3": "dispatch+combine",
                 "sort.1": "dispatch+combine", "input_fusion.9": "dispatch+combine"}
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


def test_profile_turns_gpu_command_buffers_off_before_the_backend_starts(monkeypatch):
  """`for_profile` adds the flag to XLA_FLAGS (after the user's), keeps a command-buffer flag
  the user set, and in a fresh process the flag reaches XLA: set after `import jax`, before
  any device use, it is read with the others (the CPU device count it holds takes effect;
  an unknown flag would abort the backend's start)."""
  monkeypatch.setattr(xla_flags, "xla_bridge", types.SimpleNamespace(
      backends_are_initialized=lambda: False))   # as before JAX starts
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert not xla_flags.command_buffers_off(env)
  assert xla_flags.for_profile(env).startswith("XLA_FLAGS += --xla_gpu_enable_command_buffer=")
  assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_enable_command_buffer="
  assert xla_flags.command_buffers_off(env)
  user = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}
  assert "as the user set them" in xla_flags.for_profile(user) and not (
      xla_flags.command_buffers_off(user))
  monkeypatch.undo()
  jax.devices()   # this process's backend has started: too late, and the line says so
  assert "left on" in xla_flags.for_profile({})
  code = ("import os, jax\n"
          "from tst_jax.parallel import xla_flags\n"
          "env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=3'}\n"
          "print(xla_flags.for_profile(env))\n"
          "os.environ['XLA_FLAGS'] = env['XLA_FLAGS']\n"
          "print(jax.device_count(), xla_flags.command_buffers_off())\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
                       | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  added, started = out.stdout.strip().splitlines()
  assert added.startswith("XLA_FLAGS += --xla_gpu_enable_command_buffer=")
  assert started == "3 True", out.stderr[-2000:]


@pytest.mark.slow
def test_moe_dispatch_and_combine_have_their_own_row(tmp_path):
  """A gmm MoE step: the experts' routing, dispatch and combine (gathers, sorts, sums) fill
  their own row, the grouped matmuls the matmul rows; the rows still sum to the step."""
  step, state, window = traced_step("ntp", moe=True, data=1)
  _, prof, _ = step_profile.profile_steps(step, state, window, steps=2, trace_dir=str(tmp_path))
  assert sum(prof.ms.values()) == pytest.approx(prof.step_ms, rel=1e-6)
  for cat in ("dispatch+combine", "matmul forward", "matmul backward"):
    assert prof.ms[cat] > 0, (cat, prof.table())
  assert prof.note == ""   # CPU: no command buffers to blur it
  # Each category's largest ops, within its time; the slowest ops name their jnp operations.
  for cat, ops in prof.top_by_category.items():
    assert ops == sorted(ops, key=lambda o: -o[1]) and sum(ms for _, ms in ops) <= (
        prof.ms[cat] * (1 + 1e-6))
  assert "in matmul backward:" in prof.table()
  named = [prof.sources[op] for op, _, _ in prof.top_ops if prof.sources.get(op)]
  assert named and not any(n.startswith("jit(") for n in named)


def test_fusion_text_is_the_slowest_fusions_hlo_alone():
  """The HLO of a fusion of a compiled MoE step, read alone: its line, then the body it calls
  with every instruction fused into it; a name not in the module says so."""
  step, state, window = traced_step("ntp", moe=True, data=1)
  hlo = step.lower(state, window).compile().as_text()
  _, ops = step_profile.parse_hlo(hlo)
  fusion = next(name for name, op in ops.items() if op.opcode == "fusion"
                and "reduce" in op.opcodes)
  text = step_profile.fusion_text(hlo, [fusion, "no_such_op"])
  assert text.startswith(f"// ---- {fusion}\n") and "// no_such_op: not in this module" in text
  (called,) = re.findall(r"calls=%?([\w.\-]+)", text.splitlines()[1])[:1]
  assert f"{called} " in text and " reduce(" in text
  assert step_profile.source(ops[fusion]) and len(text) < len(hlo) / 4


@pytest.mark.slow
def test_benchmark_profile_of_a_moe_step(tmp_path):
  """benchmarks/step.py --profile on a small gmm MoE, end to end (12 s): the command-buffer
  flag is set before the backend starts, the categories sum to the traced step, and the
  experts' dispatch and combine have their own row beside the grouped matmuls."""
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "step.py"), "--config",
       os.path.join(ROOT, "configs", "tiny_moe.py"), "--phase", "ntp", "--steps", "1",
       "--warmup", "1", "--profile", "2", "--config.model.expert_impl=gmm",
       "--config.data.batch_size=4", "--config.data.seq_len=32", "--config.model.n_layers=2",
       "--config.mesh.data=1", "--config.mesh.fsdp=1"],
      capture_output=True, text=True, timeout=600, cwd=tmp_path,
      env=os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
  assert lines[0]["profile_flags"].startswith("XLA_FLAGS += --xla_gpu_enable_command_buffer=")
  prof = lines[1]["profile"]
  assert lines[1]["expert_impl"] == "gmm" and prof["note"] == ""   # CPU: no command buffers
  assert lines[1]["command_buffers"] == "off"       # read from XLA_FLAGS, as the step ran
  assert sum(prof["ms_per_step"].values()) == pytest.approx(prof["step_ms"], rel=1e-6)
  for cat in ("dispatch+combine", "matmul forward", "matmul backward"):
    assert prof["ms_per_step"][cat] > 0, (cat, prof)


def test_profile_window_reads_first_and_count():
  assert step_profile.profile_window("") is None
  assert step_profile.profile_window("3,2") == (3, 2)
  for bad in ("3", "3,2,1", "0,2", "3,0", "a,b", "-1,2"):
    with pytest.raises(ValueError):
      step_profile.profile_window(bad)


def test_command_buffers_note_says_how_to_turn_them_off_on_a_gpu(monkeypatch):
  """XLA reads its flags once, as the backend starts: a run cannot turn command buffers off
  for its profile window alone, so it says so, with the flag, unless XLA_FLAGS has it."""
  assert step_profile.command_buffers_note() == ""            # CPU
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setenv("XLA_FLAGS", "")
  note = step_profile.command_buffers_note()
  assert "cannot be off for a few steps only" in note
  assert f"XLA_FLAGS={xla_flags.COMMAND_BUFFERS_OFF}" in note
  monkeypatch.setenv("XLA_FLAGS", xla_flags.COMMAND_BUFFERS_OFF)
  assert step_profile.command_buffers_note() == ""
