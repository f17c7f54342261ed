"""The MoE lab's grouped GEMM measurements shipped as package data
(tst_jax/kernels/gemm_measured.py): absent, malformed, merged and read back; what a run does with
them is tests/kernels/test_grouped_matmul.py's."""

import importlib
import json
import os
import sys

import pytest

from tests.fixtures.paths import ROOT
from tst_jax import platform
from tst_jax.kernels import gemm_measured, grouped_matmul

H200 = "NVIDIA H200"


def _tuned(product="dw", kernel="triton", rows=262144, ms=0.4, block_m=128):
  return dict(product=product, kernel=kernel, lhs=f"bfloat16[{rows},768]",
              rhs=f"bfloat16[{rows},384]", out="bfloat16",
              config=dict(block_m=block_m, block_n=256, block_k=32, num_warps=8, num_stages=5),
              ms=ms, start_ms=0.6, candidates=30, search_s=41.0)


def test_an_absent_table_measured_nothing_and_says_so(tmp_path):
  path = str(tmp_path / "gemm_measured.json")
  assert gemm_measured.load(path) == {} and gemm_measured.entry(H200, path) is None
  assert gemm_measured.pass_times(H200, path) == {}
  assert gemm_measured.tuned_config(H200, "dw", "triton", "a", "b", "c", path) is None
  assert gemm_measured.tuned_count(H200, "dw", "triton", path) == 0
  assert gemm_measured.describe(H200, path) == (
      "the MoE lab measured nothing on NVIDIA H200 (gemm_measured.json has no entry)")


@pytest.mark.parametrize("text", ["{", "[]", '{"devices": {"NVIDIA H200": {"tuned": []}}}',
                                  '{"devices": {"NVIDIA H200": {"source": "s", "tuned": 3}}}'])
def test_a_malformed_table_is_one_error_naming_the_file(tmp_path, text):
  path = tmp_path / f"bad{len(text)}.json"
  path.write_text(text)
  with pytest.raises(ValueError, match=rf"{path}: not a table of grouped GEMM measurements"):
    gemm_measured.load(str(path))


def test_a_calls_measurements_merge_into_the_table_and_read_back(tmp_path):
  """record() keeps what another call measured, replaces what this one measured again (a
  shape's kernel times, a call's tuned config) and the source; write() and load() round-trip;
  device kinds match whatever their case."""
  path = str(tmp_path / "gemm_measured.json")
  first = gemm_measured.record({}, H200, "call 1", {"recipe": {"dw": {"mosaic": 4.0}}},
                               [_tuned(), _tuned(product="forward", kernel="mosaic")])
  gemm_measured.write(first, path)
  second = gemm_measured.record(gemm_measured.load(path), "nvidia h200", "call 2",
                                {"b10": {"dw": {"mosaic": 2.0, "triton": 0.5}}},
                                [_tuned(ms=0.3, block_m=64)])
  gemm_measured.write(second, path)
  (kind,) = gemm_measured.load(path)
  table = gemm_measured.entry(H200, path)
  assert kind == "nvidia h200" and table["source"] == "call 2"
  assert set(table["passes"]) == {"recipe", "b10"} and len(table["tuned"]) == 2
  assert gemm_measured.tuned_config(H200, "dw", "triton", "bfloat16[262144,768]",
                                    "bfloat16[262144,384]", "bfloat16", path)["block_m"] == 64
  assert gemm_measured.tuned_count(H200, "forward", "mosaic", path) == 1
  assert gemm_measured.pass_times(H200, path) == {"dw": {"mosaic": 6.0}}   # triton: b10 alone
  assert gemm_measured.describe(H200, path) == (
      "the MoE lab measured 2 shapes' kernels and tuned 2 calls on NVIDIA H200 "
      "(gemm_measured.json: call 2)")
  assert json.loads(open(path).read())["devices"]["nvidia h200"]["source"] == "call 2"


def test_the_shipped_table_when_there_is_one_loads_with_its_sources():
  """The package's own file (absent until a GPU measured something) reads as a table whose
  every entry names the call that measured it."""
  devices = gemm_measured.load()
  assert all(entry["source"] for entry in devices.values())
  assert os.path.isfile(gemm_measured.FILE) == bool(devices)


def _benchmark(name):
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)


@pytest.mark.parametrize("kernel", ["mosaic", "triton"])
def test_the_search_steps_around_the_pinned_config(kernel):
  """benchmarks/gemm_search.py's candidates: the pinned config first, then at most 35 others,
  none twice, each one or two fields from it along the values tokamax autotunes over."""
  search = _benchmark("gemm_search")
  start = platform._SM90_KERNELS.config("dw", kernel)   # pylint: disable=protected-access
  found = search.candidates(kernel, start)
  assert found[0] == start and 20 <= len(found) <= search.MAX_CANDIDATES
  assert len({json.dumps(c, sort_keys=True) for c in found}) == len(found)
  for config in found[1:]:
    changed = {k for k in config if config[k] != start.get(k)}
    assert 1 <= len(changed) <= 2, changed
    assert all(config[k] in search.GRID[kernel][k] for k in changed)


def test_a_gpu_calls_lab_rows_record_into_the_table_a_run_reads(tmp_path, monkeypatch):
  """`moe_lab.py --record`: a GPU call's pass rows (each product's ms per kernel) and search
  rows (a call's fastest config) go into the table under the call's device with its source;
  a run there then orders that product's kernels by them and runs the tuned config; a CPU
  call's rows record nothing."""
  search = _benchmark("gemm_search")
  path = str(tmp_path / "gemm_measured.json")
  rows = [dict(row="env", env=True, commit="abc123", jax="0.11.2", tokamax="0.0.17",
               date="2026-12-01"),
          dict(lab=True, shape="-", piece="copy", device_kind=H200),
          dict(lab=True, shape="recipe", piece="pass", impl="dx/mosaic", mode="fwd", ms=2.0),
          dict(lab=True, shape="recipe", piece="pass", impl="dx/triton", mode="fwd", ms=1.5),
          dict(lab=True, shape="recipe", piece="pass", impl="dw/triton", skipped="no time"),
          dict(lab=True, shape="recipe", piece="search", impl="dw/triton", call="down",
               **{k: v for k, v in _tuned().items()})]
  assert search.record(rows, path) == (f"recorded 1 products' kernel times and 1 tuned "
                                       f"configs of {H200} in {path}")
  table = gemm_measured.entry(H200, path)
  assert table["source"] == ("benchmarks/gpu.sh moe_lab,search at commit abc123; NVIDIA H200; "
                             "jax 0.11.2, tokamax 0.0.17; 2026-12-01")
  monkeypatch.setattr(gemm_measured, "FILE", path)
  monkeypatch.setattr(grouped_matmul, "tokamax_version", lambda: "0.0.17")
  monkeypatch.setattr(grouped_matmul, "tokamax_kernels", lambda: None)
  _, kernels, why = platform.grouped_matmul_backend("gpu", H200)
  assert kernels.dx == ("triton", "mosaic") and "dx triton: triton 1.5 ms vs mosaic 2 ms" in why
  assert "dw triton [tuned at 1 shapes, else pinned]" in why
  chosen, source = grouped_matmul.choose(kernels, "dw", H200, "bfloat16[262144,768]",
                                         "bfloat16[262144,384]", "bfloat16")
  assert source == grouped_matmul.TUNED and chosen[0] == ("triton", _tuned()["config"])
  cpu = [dict(lab=True, shape="-", piece="copy", device_kind="cpu")] + rows[2:]
  assert search.record(cpu, str(tmp_path / "cpu.json")).startswith("nothing to record")
  assert not os.path.exists(tmp_path / "cpu.json")
