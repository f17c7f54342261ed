"""Train-step benchmark: step time, tokens/s, FLOPs, MFU and memory, as JSON lines.

  python benchmarks/step.py --config configs/demo.py --phase both     # TST vs NTP side by side
  python benchmarks/step.py --config configs/llama_600m.py --phase both --config.data.batch_size=8
  python benchmarks/step.py --config configs/demo.py --depths 2,4,8,16,32 --phase ntp
  python benchmarks/step.py --config configs/llama_270m.py --phase both --profile 5  # ms by kind
  python benchmarks/step.py --config configs/qwen3_moe_gpu_small.py --phase ntp --profile 3 \
      --hlo_dir /tmp/hlo     # and the slowest ops' optimized HLO, to read which jnp op each is
  python benchmarks/step.py --config configs/llama_600m.py --phase ntp --devices 1,2,4,8 \
      --config.data.batch_size=128          # 1 -> 8 GPUs at 16 rows per device: scaling

Model FLOPs per step are analytic: 6 * N_matmul + 12 * layers * heads * head_dim * L per
position (forward + backward, attention scores counted in full), times batch * L positions;
N_matmul counts every weight matmul including the LM head (active experts only for MoE).
MFU = model FLOPs / step time / (devices * peak). The compiled cost analysis is printed too.
"""

import gzip
import json
import os
import statistics
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from tst_jax import platform
from tst_jax.parallel import xla_flags
from tst_jax.run import step_profile
from tst_jax.config import spec as spec_lib
from tst_jax.train import fit, step as step_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.", lock_config=True)
_PHASE = flags.DEFINE_enum("phase", "both", ["tst", "ntp", "both"], "Which phase's step.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_DEPTHS = flags.DEFINE_list("depths", [], "Also report compile time at these n_layers.")
_PROFILE = flags.DEFINE_integer("profile", 0, "Also trace this many steps and print where "
                                "their milliseconds go, by category (tst_jax.run.step_profile). "
                                "Turns XLA's GPU command buffers off for the whole process.")
_HLO_DIR = flags.DEFINE_string("hlo_dir", None, "With --profile: write the optimized HLO of "
                                "the step's five slowest ops (<phase>_top_ops.hlo.txt) and of "
                                "the whole step (<phase>_step.hlo.txt.gz) into this folder.")
_DEVICES = flags.DEFINE_list("devices", [], "Scaling: run on the first N local devices for each "
                             "N (e.g. 1,2,4,8) at the same rows per device (data.batch_size is "
                             "the global batch at the largest N); prints per-device MFU and "
                             "the scaling efficiency against the smallest N.")

def build(config, phase_name, devices=None):
  """The jitted step of phase `phase_name` of a run config on `devices` (default: all), with
  the defaults a run gets on this platform (`auto` resolved)."""
  spec = spec_lib.build(config)
  plan = spec.plan
  phase = next((p for p in plan.phases if p.name == phase_name), None)
  if phase is None:
    raise ValueError(f"the config has no {phase_name!r} phase (r = {spec.tst.ratio})")
  trainer = step_lib.Trainer.of(spec, devices)
  # Random tokens: EOS 0 splits them into documents (data.document_mask) as often as any id.
  return spec, phase, trainer, trainer.train_step(phase, eos_id=0)


def write_hlo(folder: str, phase: str, hlo_text: str, profile) -> None:
  """Writes the five slowest ops' optimized HLO, each op's milliseconds and jnp source first,
  and the whole step's HLO gzipped, into `folder`."""
  os.makedirs(folder, exist_ok=True)
  top = profile.top_ops[:5]
  with open(os.path.join(folder, f"{phase}_top_ops.hlo.txt"), "w") as f:
    for name, category, ms in top:
      f.write(f"// {name}: {ms:.3f} ms per step, {category}, from "
              f"{profile.sources.get(name) or 'no op_name'}\n")
    f.write(step_profile.fusion_text(hlo_text, [name for name, _, _ in top]))
  with gzip.open(os.path.join(folder, f"{phase}_step.hlo.txt.gz"), "wt") as f:
    f.write(hlo_text)


def bench_phase(config, phase_name, devices=None) -> dict:
  spec, phase, trainer, train_step = build(config, phase_name, devices)
  model_cfg = spec.model
  rng = np.random.default_rng(0)
  windows = [jax.device_put(rng.integers(0, model_cfg.vocab_size,
                                         (phase.batch_size, phase.window), dtype=np.int32),
                            trainer.batch_sharding) for _ in range(2)]
  state = trainer.init_state(0)
  t0 = time.perf_counter()
  compiled = train_step.lower(state, windows[0]).compile()
  compile_s = time.perf_counter() - t0
  for i in range(_WARMUP.value):
    state, metrics = train_step(state, windows[i % 2])
  jax.block_until_ready(state)
  times = []
  for i in range(_STEPS.value):
    t = time.perf_counter()
    state, metrics = train_step(state, windows[i % 2])
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  profile = None
  if _PROFILE.value:
    hlo_text = compiled.as_text()
    state, profile, _ = step_profile.profile_steps(
        train_step, state, windows[0], steps=_PROFILE.value, hlo_text=hlo_text)
    if _HLO_DIR.value:
      write_hlo(_HLO_DIR.value, phase.name, hlo_text, profile)
  devices = trainer.mesh.devices.size
  peak = platform.peak_flops(jax.devices()[0].device_kind)
  cost = compiled.cost_analysis() or {}
  memory = compiled.memory_analysis()
  stats = jax.devices()[0].memory_stats() or {}
  return dict(
      phase=phase.name, bag_size=phase.bag_size, batch_size=phase.batch_size,
      latent_seq_len=phase.latent_seq_len, data_seq_len=phase.data_seq_len,
      n_layers=model_cfg.n_layers, params=spec.plan.params_total, dtype=model_cfg.dtype,
      loss_impl=spec.loss.impl, remat=model_cfg.remat,
      expert_impl=getattr(model_cfg, "expert_impl", None),
      dispatch_impl=getattr(model_cfg, "dispatch_impl", None),
      expert_fuse_gate_up=getattr(model_cfg, "expert_fuse_gate_up", None),
      attention_impl=model_cfg.attention_impl, compile_s=compile_s, step_s=step_s,
      step_s_min=min(times), data_tokens_per_s=phase.data_tokens_per_step / step_s,
      equivalent_tokens_per_s=phase.equivalent_tokens_per_step / step_s,
      model_flops_per_step=phase.flops_per_step,
      compiled_flops_per_step=cost.get("flops"),
      mfu=platform.mfu(phase.flops_per_step, step_s, devices, peak),
      temp_bytes=getattr(memory, "temp_size_in_bytes", None),
      argument_bytes=getattr(memory, "argument_size_in_bytes", None),
      peak_bytes_in_use=stats.get("peak_bytes_in_use"),
      loss=float(metrics["loss"]), devices=devices, device_kind=jax.devices()[0].device_kind,
      backend=jax.default_backend(), jax_version=jax.__version__,
      # --profile turns XLA's GPU command buffers off for the whole process (it has to be
      # set before the backend starts; a user's own flag is kept): what XLA_FLAGS holds is
      # what the timings above were taken with.
      command_buffers="off" if xla_flags.command_buffers_off() else "default",
      **(dict(profile=profile.to_json(), profile_table=profile.table()) if profile else {}))


def scaling(config, phase_name, counts) -> list[dict]:
  """The step on the first n local devices for each n, rows per device held fixed: per-device
  MFU and weak-scaling efficiency (data tokens/s per device against the smallest n)."""
  rows = config.data.batch_size // max(counts)
  results = []
  for n in counts:
    with config.unlocked():
      config.data.batch_size = rows * n
    r = bench_phase(config, phase_name, jax.local_devices()[:n])
    base = results[0] if results else r
    r.update(scaling_devices=n, per_device_data_tokens_per_s=r["data_tokens_per_s"] / n,
             scaling_efficiency=(r["data_tokens_per_s"] / n)
             / (base["data_tokens_per_s"] / base["devices"]))
    results.append(r)
    print(json.dumps(dict({k: r[k] for k in ("scaling_devices", "batch_size", "step_s",
                                             "per_device_data_tokens_per_s",
                                             "scaling_efficiency", "device_kind")},
                          per_device_mfu=r["mfu"])), flush=True)
  return results


def main(argv):
  del argv
  checked = spec_lib.check(_CONFIG.value)
  flags_set = xla_flags.apply(   # as a run does: before the backend starts
      checked.mesh, checked.distributed, fit.layer_param_bytes(checked.model))
  profile_flags = xla_flags.for_profile() if _PROFILE.value else None   # also before it
  spec = checked.on_platform()   # the defaults a run gets on this platform
  print(json.dumps(dict(resolved=spec.resolved.to_json(), xla_flags=flags_set.line(),
                        profile_flags=profile_flags)), flush=True)
  config = _CONFIG.value
  phases = ["tst", "ntp"] if _PHASE.value == "both" else [_PHASE.value]
  if _DEVICES.value:
    for name in phases:
      scaling(config, name, [int(n) for n in _DEVICES.value])
    return
  results = {}
  for name in phases:
    results[name] = bench_phase(config, name)
    table = results[name].pop("profile_table", None)
    print(json.dumps(results[name]), flush=True)
    if table:
      print(f"step profile, phase {name}:\n{table}", flush=True)
  if len(results) == 2:
    tst, ntp = results["tst"], results["ntp"]
    print(json.dumps(dict(
        side_by_side=True, bag_size=tst["bag_size"],
        data_tokens_per_s_ratio=tst["data_tokens_per_s"] / ntp["data_tokens_per_s"],
        target_ratio=0.9 * tst["bag_size"], step_time_ratio=tst["step_s"] / ntp["step_s"])),
        flush=True)
  for depth in _DEPTHS.value:   # compile time vs depth: flat with the scanned layer stack
    with config.unlocked():
      config.model.n_layers = int(depth)
    _, phase, trainer, train_step = build(config, phases[-1])
    state = trainer.abstract
    window = jax.ShapeDtypeStruct((phase.batch_size, phase.window), np.int32)
    t0 = time.perf_counter()
    train_step.lower(state, window).compile()
    print(json.dumps(dict(compile_depth=int(depth), phase=phases[-1],
                          compile_s=time.perf_counter() - t0)), flush=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
