"""What `auto` resolves to on each platform (tst_jax.platform), with the fallback reasons."""

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import models, platform
from tst_jax.errors import ConfigError
from tst_jax.kernels import grouped_matmul
from tst_jax.config import spec as spec_lib
from tst_jax.config.outlook import format_plan


@pytest.mark.parametrize("dtype,head_dim,where,expected,reason", [
    ("bfloat16", 64, "gpu", "cudnn", "cuDNN flash attention"),
    ("float16", 128, "gpu", "cudnn", "cuDNN flash attention"),
    ("float32", 64, "gpu", "xla", "needs bfloat16/float16, model.dtype is float32"),
    ("bfloat16", 256, "gpu", "xla", "head_dim <= 128 and % 8 == 0, got 256"),
    ("bfloat16", 36, "gpu", "xla", "got 36"),
    ("bfloat16", 64, "cpu", "xla", "XLA attention on cpu"),
    ("bfloat16", 64, "tpu", "xla", "XLA attention on tpu"),
])
def test_attention_auto(dtype, head_dim, where, expected, reason):
  impl, why = platform.attention_impl("auto", dtype, head_dim, where)
  assert impl == expected and reason in why
  assert platform.attention_impl(None, dtype, head_dim, where)[0] == expected  # None = auto
  assert platform.attention_impl("xla", dtype, head_dim, "gpu") == ("xla", "set in the config")


@pytest.mark.parametrize("where,loss,experts", [
    ("gpu", "pallas", "blocked"), ("cpu", "xla", "blocked"), ("tpu", "xla", "ragged")])
def test_loss_and_experts_auto(where, loss, experts, monkeypatch):
  # A GPU without tokamax: blocked (with tokamax, gmm: tests/kernels/test_grouped_matmul.py).
  monkeypatch.setattr(grouped_matmul, "tokamax_version", lambda: None)
  assert platform.loss_impl("auto", where)[0] == loss
  assert platform.expert_impl("auto", where)[0] == experts
  assert platform.loss_impl("naive", where) == ("naive", "set in the config")
  assert platform.expert_impl("dense", where) == ("dense", "set in the config")


def test_a_plan_for_a_named_gpu_resolves_what_the_gpu_extra_runs(monkeypatch):
  """Planned from this CPU for a GPU, expert_impl=auto is gmm, as a GPU install with the gpu
  extra (launch/Dockerfile.gpu's) runs it, whatever is installed here, and the reason says so;
  a GPU this process runs on without tokamax gets blocked; the other choices are unchanged."""
  monkeypatch.setattr(grouped_matmul, "tokamax_version", lambda: None)   # as on this machine
  config = tiny_config()
  config.model = models.preset_config("qwen3_moe", "tiny_moe")
  model_cfg = spec_lib.check(config).model
  planned = platform.resolve(model_cfg, "auto", "gpu").choices
  impl, why = planned["model.expert_impl"]
  assert impl == "gmm" and "planned for a GPU with the gpu extra" in why
  assert platform.GPU_EXTRA in why and "launch/Dockerfile.gpu" in why
  assert platform.expert_impl("auto", "gpu") == platform._NO_TOKAMAX   # a GPU run without it
  assert platform.expert_impl("capacity", "gpu", planned=True)[1].startswith(
      "set in the config; planned for a GPU with the gpu extra")
  assert platform.expert_impl("auto", "tpu", planned=True)[0] == "ragged"
  assert platform.resolve(model_cfg, "auto").choices["model.expert_impl"][0] == "blocked"
  assert planned["model.dispatch_impl"][0] == "pallas"


def test_resolve_applies_to_a_copy_and_prints_in_the_plan():
  config = tiny_config()
  config.loss.impl = "auto"
  checked = spec_lib.check(config)
  spec = checked.on_platform()                   # the test machine is a CPU
  resolved = spec.resolved
  assert resolved.platform == "cpu"
  assert resolved.choices["loss.impl"][0] == "xla"
  assert resolved.choices["model.attention_impl"][0] == "xla"
  recorded = spec.to_json()                      # config.json: what the run ran with
  assert (recorded["loss"]["impl"], recorded["model"]["attention_impl"]) == ("xla", "xla")
  assert spec.loss.impl == "xla"
  assert spec.model.attention_impl == "xla"
  assert (config.loss.impl, config.model.attention_impl) == ("auto", "auto")  # untouched
  assert (checked.loss.impl, checked.model.attention_impl) == ("auto", "auto")
  text = format_plan(spec.plan, resolved)
  line = next(l for l in text.splitlines() if l.startswith("platform "))
  assert line.startswith("platform cpu") and "loss.impl=xla" in line
  assert resolved.to_json()["loss.impl"]["reason"].startswith("fastest on CPU")
  on_gpu = platform.resolve(checked.model, "auto", "gpu")
  assert on_gpu.choices["loss.impl"][0] == "pallas"


def test_unknown_impls_are_refused():
  config = tiny_config()
  config.model.attention_impl = "flash"
  with pytest.raises(ConfigError, match="config.model.attention_impl: must be one of") as e:
    spec_lib.check(config)
  assert e.value.field == "model.attention_impl"
  assert platform.LOSS_IMPLS == ("auto", "naive", "xla", "pallas")


def test_peak_flops_reads_the_datasheet_table_by_device_kind():
  assert platform.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert platform.peak_flops("TPU v5 lite") == 197e12    # not the shorter "TPU v5" entry
  assert platform.peak_flops("TPU v5p") == 459e12
  assert platform.peak_flops("cpu") is None


def test_mfu_is_model_flops_per_second_over_the_devices_peak():
  # 3e12 FLOPs per step, 10 steps in 2 s, over 4 devices of 1e12 FLOP/s: 15e12 / 4e12.
  assert platform.mfu(3e12, 2 / 10, 4, 1e12) == pytest.approx(3e12 * 10 / 2 / (1e12 * 4))
  assert platform.mfu(3e12, 0.2, 4, None) is None


def test_memory_in_use_is_null_where_the_backend_reports_none():
  class Device:
    def __init__(self, stats):
      self.stats = stats

    def memory_stats(self):
      return self.stats

  got = platform.memory_in_use([Device({"bytes_in_use": 5, "peak_bytes_in_use": 9}),
                                Device({"bytes_in_use": 7, "peak_bytes_in_use": 8})])
  assert got == dict(memory_bytes_in_use=7, memory_peak_bytes=9)
  assert platform.memory_in_use([Device(None)]) == dict(memory_bytes_in_use=None,
                                                        memory_peak_bytes=None)


@pytest.mark.parametrize("where,dispatch", [("gpu", "pallas"), ("cpu", "gather"),
                                            ("tpu", "gather")])
def test_dispatch_auto_is_the_measured_fastest_and_pallas_is_refused_on_tpu(where, dispatch):
  impl, why = platform.dispatch_impl("auto", where)
  assert impl == dispatch and why and "\n" not in why
  assert platform.dispatch_impl("unrolled", where) == ("unrolled", "set in the config")
  if where == "tpu":
    with pytest.raises(ConfigError) as e:
      platform.dispatch_impl("pallas", where)
    assert e.value.field == "model.dispatch_impl"
  else:
    assert platform.dispatch_impl("pallas", where)[0] == "pallas"
