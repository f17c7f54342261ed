"""Will a run fit (`--mode plan --accelerator=...`): state bytes per device, both phases compiled,
the knob to turn when it does not (the XLA flags it prints: tests/parallel/test_xla_flags.py)."""

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax import models
from tst_jax.errors import ConfigError
from tst_jax import cli
from tst_jax.train import fit
from tst_jax.config import spec as spec_lib


def _fit(config, accelerator):
  """The fit check as the plan makes it: the spec resolved here (CPU) and on the target."""
  checked = spec_lib.check(config)
  return fit.check(checked.on_platform(), accelerator,
                   checked.on_platform(fit.target_platform(accelerator)))


@pytest.mark.slow
def test_fit_counts_state_exactly_and_compiles_both_phases():
  """Parameters and Adam state per device are the shapes over the FSDP axis (norm scales
  replicated); both phases compile; activations shrink with remat=full."""
  config = tiny_config(mesh=dict(data=1, fsdp=4), loss=dict(impl="xla"))
  result = _fit(config, "h100")
  model_cfg = models.model_config(config.model)
  total = spec_lib.check(config).plan.params_total
  norms = model_cfg.dim * (2 * model_cfg.n_layers + 1)   # replicated
  want = 4 * ((total - norms) // 4 + norms)
  assert [p.phase for p in result.phases] == ["tst", "ntp"]
  for p in result.phases:
    assert p.params == want   # Adam: mu and nu in float32, and its int32 step counts
    assert 2 * want < p.opt_state <= 2 * want + 16
    assert p.activations > 0 and p.xla_temp > 0 and p.xla_peak >= p.xla_temp
  assert result.fits and result.devices == 4 and result.mesh["fsdp"] == 4
  ntp_only = tiny_config(ratio=0.0, mesh=dict(data=1, fsdp=4), loss=dict(impl="xla"),
                         model=dict(remat="full"))
  full = _fit(ntp_only, "h100")
  assert full.phases[0].phase == "ntp"
  assert full.phases[0].activations < result.phases[1].activations
  assert "XLA:CPU" in result.table() and "--xla_gpu_enable_latency_hiding_scheduler=true" \
      in result.table()


@pytest.mark.slow
def test_moe_activations_are_each_devices_own_rows_on_the_targets_experts():
  """FSDP over 8 devices, 16 rows: each device keeps the residuals of its own 2 rows, as each
  sorts its own tokens (tests/parallel/test_mesh.py). remat=save_experts adds, per sparse
  layer, the float32 [N·P, 2F + D] outputs of the grouped GEMMs and the int32 routing (row of
  each of the A assignments, assignment of each of the R = A rows, E group sizes) of 2 rows
  of 16 tokens, not of the batch's 16 rows. On an H100, expert_impl=auto means gmm (planned
  with the gpu extra), whose rows are unpadded where this CPU's blocked pads them."""
  config = tiny_config(data=dict(batch_size=16), mesh=dict(data=1, fsdp=8))
  config.model = models.preset_config("qwen3_moe", "tiny_moe", vocab_size=512, dim=32,
                                      n_layers=2, n_heads=2, n_kv_heads=2, ffw_dim=64,
                                      n_experts=4, n_experts_per_token=2, moe_ffw_dim=32)
  activations = {}
  for remat in ("save_dots", "save_experts"):
    config.model.remat = remat
    checked = spec_lib.check(config)
    assert checked.on_platform().model.expert_impl == "blocked"
    assert checked.on_platform("gpu").model.expert_impl == "gmm"
    result = fit.check(checked.on_platform(), "h100", checked.on_platform("gpu"),
                       compile_steps=False)
    activations[remat] = result.phases[0].activations
  cfg = checked.model
  a = 2 * checked.plan.phases[0].latent_seq_len * cfg.n_experts_per_token   # A of 2 rows
  per_layer = a * (2 * cfg.moe_ffw_dim + cfg.dim) * 4 + (2 * a + cfg.n_experts) * 4
  assert activations["save_experts"] - activations["save_dots"] == sum(
      cfg.sparse_layers()) * per_layer


def test_flash_attention_keeps_no_scores():
  """A bf16 model on a GPU gets cuDNN flash attention: its [L, L] scores are not counted as
  kept for the backward (remat=none keeps them with XLA attention, as on a TPU)."""
  config = tiny_config(ratio=0.0, mesh=dict(data=1, fsdp=2), loss=dict(impl="xla"),
                       model=dict(dtype="bfloat16", remat="none", head_dim=16))
  checked = spec_lib.check(config)           # `auto` on each target: cuDNN on a GPU only
  assert checked.on_platform(fit.target_platform("h100")).model.attention_impl == "cudnn"
  assert checked.on_platform(fit.target_platform("v5p")).model.attention_impl == "xla"
  gpu, tpu = (_fit(config, a) for a in ("h100", "v5p"))
  assert gpu.flash and gpu.phases[0].activations < tpu.phases[0].activations
  assert gpu.phases[0].xla_temp == tpu.phases[0].xla_temp   # the same CPU compile


def test_the_emergency_copy_is_each_devices_parameters_and_optimizer_state(tmp_path):
  """train.local_checkpoint_every: one copy holds a device's parameters and Adam state, the
  bytes its host keeps in memory while writing them; the plan says so, and nothing without."""
  config = tiny_config(ratio=0.0, mesh=dict(data=1, fsdp=4), loss=dict(impl="xla"),
                       train=dict(local_checkpoint_every=50))
  checked = spec_lib.check(config)
  result = fit.check(checked.on_platform(), "h100", checked.on_platform("gpu"),
                     compile_steps=False)
  [phase] = result.phases
  assert result.local_copy == phase.params + phase.opt_state > 0
  assert result.to_json()["local_checkpoint_bytes"] == result.local_copy
  assert "emergency checkpoints every 50 steps" in result.table()
  config.train.local_checkpoint_every = 0
  checked = spec_lib.check(config)
  off = fit.check(checked.on_platform(), "h100", checked.on_platform("gpu"), compile_steps=False)
  assert off.local_copy == 0 and "emergency" not in off.table()


@pytest.mark.slow
def test_fit_says_which_knob_when_it_does_not_fit(monkeypatch):
  config = tiny_config(mesh=dict(data=1, fsdp=2), loss=dict(impl="xla"),
                       data=dict(batch_size=8))
  monkeypatch.setitem(fit.HBM_GB, "h100", 1e-6)     # a 1 kB accelerator
  result = _fit(config, "h100")
  assert not result.fits and "NO" in result.table()
  advice = " ".join(result.advice)
  assert "config.mesh.fsdp >=" in advice and "model.remat=full" in advice
  assert "optimizer.grad_accum=" in advice
  with pytest.raises(ConfigError, match="mesh"):
    fit.mesh_devices(tiny_config(mesh=dict(data=-1)).mesh)   # every axis must be given
  with pytest.raises(ConfigError, match="accelerator"):
    fit.accelerator_budget("a100")
  assert fit.accelerator_budget("h200", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ""})[0] == 0.75 * 141e9
  assert fit.accelerator_budget("h200", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"})[0] == 0.9 * 141e9
  assert fit.accelerator_budget("v5p", {})[0] == 95e9
  with pytest.raises(ConfigError, match="--accelerator: only with --mode plan"):
    cli.run(config, "unused", "train", accelerator="h100")


@pytest.mark.slow
def test_a_fit_plan_says_what_auto_means_there_and_ends_with_its_json(capsys):
  """The plan's last line stays its JSON (read by scripts and the slow test below) with the
  line that says what each `auto` means on the accelerator printed above it."""
  config = tiny_config(steps=4)
  config.mesh.update(data=1, fsdp=2)
  cli.run(config, "", mode="plan", accelerator="h100")
  lines = capsys.readouterr().out.splitlines()
  assert [p["name"] for p in json.loads(lines[-1])["phases"]] == ["tst", "ntp"]
  on_h100 = [line for line in lines if line.startswith("on h100: ")]
  assert len(on_h100) == 1 and "platform gpu" in on_h100[0] and "loss.impl=" in on_h100[0]


PAPER_CONFIGS = ["llama_270m", "llama_600m", "llama_3b", "qwen3_moe_10b_a1b"]
# Checks each (config file, accelerator, overrides) in one process of 64 emulated devices, the
# steps lowered, not compiled: the estimate that decides the fit is the one main.py prints.
_FIT_SCRIPT = """
import json, sys
from tst_jax import configlib
from tst_jax.config import spec as spec_lib
from tst_jax.train import fit
cases = json.loads(sys.argv[1])
fit.emulate_devices(max(fit.mesh_devices(configlib.apply_overrides(configlib.load_config(c),
                                                                    o).mesh)
                        for c, _, o in cases))
for path, accelerator, overrides in cases:
  checked = spec_lib.check(configlib.apply_overrides(configlib.load_config(path), overrides))
  result = fit.check(checked.on_platform(), accelerator,
                     checked.on_platform(fit.target_platform(accelerator)), compile_steps=False)
  print(json.dumps(result.to_json()))
"""


def documented_fit_command(name: str) -> list[str]:
  """Returns the fit check the config's docstring gives for the hardware it names, as argv."""
  path = os.path.join(ROOT, "configs", f"{name}.py")
  with open(path) as f:
    doc = ast.get_docstring(ast.parse(f.read()))
  found = re.search(r"Fit check on that hardware[^\n]*:\n\s*(python main\.py .*?)\n\S",
                    doc.replace("\\\n", " "), re.S)
  assert found, f"{path}: its docstring gives no 'Fit check on that hardware' command"
  return found.group(1).split()


@pytest.mark.slow
def test_each_paper_config_fits_the_hardware_its_docstring_names():
  cases = []
  for name in PAPER_CONFIGS:
    argv = documented_fit_command(name)
    assert argv[:5] == ["python", "main.py", "--config", f"configs/{name}.py", "--mode"], argv
    flags = dict(a.split("=", 1) for a in argv[6:])
    assert argv[5] == "plan" and set(flags) >= {"--accelerator", "--config.mesh.fsdp"}, argv
    cases.append((argv[3], flags.pop("--accelerator"),
                  [f"{k.removeprefix('--config.')}={v}" for k, v in flags.items()]))
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  out = subprocess.run([sys.executable, "-c", _FIT_SCRIPT, json.dumps(cases)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  fits = [json.loads(line) for line in out.stdout.splitlines()]
  assert len(fits) == len(PAPER_CONFIGS)
  for name, (_, accelerator, _), result in zip(PAPER_CONFIGS, cases, fits):
    estimates = [p["estimate"] / fit.GB for p in result["phases"]]
    assert result["accelerator"] == accelerator and len(estimates) == 2, name
    assert result["fits"] and max(estimates) <= result["budget_bytes"] / fit.GB, (
        f"configs/{name}.py does not fit {result['devices']} x {accelerator}: "
        f"{estimates} GB per device; {result['advice']}")


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_fit_by_their_documented_command(name):
  """The docstring's command itself: both phases compiled on the emulated devices."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  out = subprocess.run([sys.executable, *documented_fit_command(name)[1:]], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True).stdout
  plan = json.loads(out.splitlines()[-1])
  assert out.startswith("XLA_FLAGS: none added (cpu")
  assert [p["name"] for p in plan["phases"]] == ["tst", "ntp"]
  rows = [line.split() for line in out.splitlines() if line.startswith(("tst ", "ntp "))]
  assert [row[6] for row in rows[:2]] == ["yes", "yes"], out       # the fit table's rows
  assert all(float(row[7]) > 0 for row in rows[:2]), out            # XLA:CPU's, compiled
