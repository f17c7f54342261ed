"""The peers in the kit: benchmarks/peer_torch.py (HF Llama) and benchmarks/peer_grug.py
(Levanter's Grug MoE), run as a GPU call runs them, at their tiny shapes on CPU."""

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.subprocess_env import one_cpu_device
from tst_jax.models import llama

WHEELS_PEER = os.environ.get("WHEELS_PEER", os.path.join(ROOT, ".whl_peer"))


def _run(script: str, args: list[str], timeout: int = 300, **env) -> list[dict]:
  """Runs benchmarks/<script> with `args` and returns its JSON lines."""
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                        env={**one_cpu_device(), **env})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _torch_peer(compile_flag: str):
  row, = _run("peer_torch.py", ["--tiny", "--steps", "2", "--warmup", "1", compile_flag])
  for key in ("step_s", "first_step_s", "tokens_per_s", "model_flops_per_step",
              "peak_memory_bytes", "device", "torch", "transformers"):
    assert row[key] is not None, key
  assert row["device"] == "cpu" and row["mfu"] is None and row["autocast"] is None
  assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(2 * 64 / row["step_s"])

  # FLOPs by hand from the tiny preset: 6 N per token, N every weight matmul with the head,
  # and 12 x layers x heads x head_dim x L for the attention scores.
  shape = llama.PRESETS["tiny"]
  v, d, layers, h, k, f = (shape[n] for n in ("vocab_size", "dim", "n_layers", "n_heads",
                                              "n_kv_heads", "ffw_dim"))
  g, batch, seq = d // h, 2, 64
  n = layers * (d * g * (2 * h + 2 * k) + 3 * d * f) + d * v
  # The same N from the peer's own model: its parameters less the embedding and the norms.
  assert row["params"] - v * d - (2 * layers + 1) * d == n
  by_hand = (6 * n + 12 * layers * h * g * seq) * batch * seq
  ours = llama.LlamaConfig(**shape).flops_per_token(seq) * seq * batch
  assert row["model_flops_per_step"] == by_hand == ours
  return row


@pytest.mark.slow
def test_torch_peer_reports_its_step_and_our_flops():
  # --no-compile: torch.compile takes 85 s on 2 CPU cores for this tiny model, cache cold.
  row = _torch_peer("--no-compile")
  assert row["compile"] is False


@pytest.mark.slow
def test_torch_peer_compiled():
  assert _torch_peer("--compile")["compile"] is True


def test_grug_peer_not_installed_is_a_skipped_line():
  rows = _run("peer_grug.py", ["--tiny"], PYTHONPATH=ROOT)
  assert len(rows) == 1 and "marin-levanter is not on the path" in rows[0]["skipped"]


def test_grug_peer_that_fails_to_import_says_why_and_its_pin(tmp_path):
  # A stand-in marin-levanter whose grug module fails as a jax it was not built for would.
  (tmp_path / "levanter" / "grug").mkdir(parents=True)
  (tmp_path / "levanter" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
  (tmp_path / "levanter" / "grug" / "__init__.py").write_text("")
  (tmp_path / "levanter" / "grug" / "grug_moe.py").write_text(
      "from jax import a_name_this_jax_lacks\n")
  meta = tmp_path / "marin_levanter-0.0.1.dist-info"
  meta.mkdir()
  (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: marin-levanter\nVersion: 0.0.1\n"
                                 "Requires-Dist: jax<0.5\n"
                                 "Requires-Dist: jax[cuda13]==0.4.0 ; extra == 'gpu'\n")
  rows = _run("peer_grug.py", ["--tiny"], PYTHONPATH=f"{tmp_path}:{ROOT}")
  assert len(rows) == 1
  assert rows[0]["skipped"].startswith("ImportError: cannot import name 'a_name_this_jax_lacks'")
  assert rows[0]["jax_pin"] == "<0.5" and rows[0]["pin_met"] is False


@pytest.fixture(scope="module")
def peer_site(tmp_path_factory):
  """Installs the peer's wheels from ./.whl_peer, offline, into a folder for PYTHONPATH."""
  if not os.path.isdir(WHEELS_PEER) or not any(n.endswith(".whl")
                                               for n in os.listdir(WHEELS_PEER)):
    pytest.skip(f"no peer wheels in {WHEELS_PEER}: bash benchmarks/peer_wheels.sh downloads "
                "them (the tests download nothing)")
  site = tmp_path_factory.mktemp("peer_site")
  subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "peer_wheels.sh"), "--install",
                  str(site)], check=True, capture_output=True, timeout=120,
                 env=dict(os.environ, WHEELS_PEER=WHEELS_PEER))
  return site


def test_grug_peer_matches_the_dense_experts_and_times_its_layer(peer_site):
  rows = _run("peer_grug.py", ["--tiny", "--repeats", "2"], PYTHONPATH=f"{peer_site}:{ROOT}")
  check, timed = rows
  assert check["check"] == "experts_dense" and check["impl"] == "grug:scatter"
  assert check["out_shape"] == [64, 32] and check["finite"]
  assert check["rel_err"] < 1e-5 and check["grad_rel_err"] < 1e-5
  assert check["jax_pin"] and check["levanter"]
  n, d, e, p, f = 64, 32, 4, 2, 16      # moe_lab's tiny shape
  assert timed["lab"] and timed["shape"] == "tiny" and timed["piece"] == "layer"
  assert timed["mode"] == "fwd_bwd" and timed["fwd_bwd_ms"] > 0
  # moe_lab's layer count: the three expert matmuls and the router, forward, x3 with backward.
  assert timed["flops"] == 3 * (3 * 2 * n * p * d * f + 2 * n * d * e)
