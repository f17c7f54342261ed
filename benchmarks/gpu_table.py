"""The short table `bash benchmarks/gpu.sh OUT quick` prints last, from OUT/gpu.jsonl.

  python benchmarks/gpu_table.py OUT/gpu.jsonl        # markdown on stdout

One row per timed train step (step time, MFU, peak memory, compile time) and per grouped-GEMM
backend (forward+backward, share of the bf16 peak); the profile's row adds the dispatch+combine
and matmul shares of the step. Each row's target (issue 39) is printed beside it. A run that
timed out, failed or was skipped gets a line under the table, with its bound.
"""

from __future__ import annotations

import json
import sys

LABELS = {"recipe": "MoE recipe (qwen3_moe_gpu_small)", "b10": "10B-A1B shapes, 4 layers",
          "profile": "MoE recipe, profiled", "d270": "llama_270m",
          "d270_docs": "llama_270m, data.document_mask", "d600": "llama_600m",
          "gemm": "grouped GEMM alone", "gemm_tuned": "grouped GEMM, tokamax tuned"}
# (row, phase or backend) -> (what is compared, at least / at most, value)
TARGETS = {("recipe", "tst"): ("mfu", ">=", 0.25), ("recipe", "ntp"): ("mfu", ">=", 0.25),
           ("b10", "ntp"): ("mfu", ">=", 0.30), ("d270", "ntp"): ("mfu", ">=", 0.38),
           ("profile", "ntp"): ("dispatch_share", "<=", 0.10),
           ("gemm", "tokamax"): ("fwd_bwd_of_peak", ">=", 0.50),
           ("gemm_tuned", "tokamax"): ("fwd_bwd_of_peak", ">=", 0.50)}
HEADER = ("| row | phase / backend | step s | MFU | peak GB | compile s | note | target |\n"
          "|---|---|---:|---:|---:|---:|---|---|")


def _pct(x):
  return "--" if x is None else f"{100 * x:.1f}%"


def _num(x, digits=3):
  return "--" if x is None else f"{x:.{digits}f}"


def _target(row: str, key: str, values: dict) -> str:
  if (row, key) not in TARGETS:
    return ""
  name, way, want = TARGETS[(row, key)]
  got = values.get(name)
  if got is None:
    return f"{way} {want:.0%}: not measured"
  met = got >= want if way == ">=" else got <= want
  return f"{way} {want:.0%}: {'met' if met else 'missed'}"


def step_row(r: dict) -> str:
  """A train step's row: step time, MFU, peak memory, compile time, profile shares."""
  note, values = "", dict(mfu=r.get("mfu"))
  profile = r.get("profile")
  if profile:
    ms, step_ms = profile["ms_per_step"], profile["step_ms"]
    values["dispatch_share"] = ms.get("dispatch+combine", 0) / step_ms
    matmul = ms.get("matmul forward", 0) + ms.get("matmul backward", 0)
    note = (f"dispatch+combine {_pct(values['dispatch_share'])}, matmuls "
            f"{_pct(matmul / step_ms)}, other ops {_pct(ms.get('other ops', 0) / step_ms)} "
            f"of {step_ms:.1f} ms")
  else:
    note = f"expert_impl {r['expert_impl']}, remat {r['remat']}" if r.get("expert_impl") \
        else f"remat {r.get('remat')}, loss {r.get('loss_impl')}"
  peak = r.get("peak_bytes_in_use")
  return (f"| {LABELS.get(r['row'], r['row'])} | {r['phase']} | {_num(r['step_s'])} | "
          f"{_pct(r.get('mfu'))} | {_num(peak and peak / 1e9, 1)} | {_num(r['compile_s'], 1)} | "
          f"{note} | {_target(r['row'], r['phase'], values)} |")


def gemm_row(r: dict) -> str:
  """A grouped-GEMM backend's row: forward+backward time and share of the bf16 peak."""
  if "skipped" in r:
    return f"| {LABELS.get(r['row'], r['row'])} | {r['backend']} | | | | | {r['skipped']} | |"
  note = (f"fwd+bwd {r['fwd_bwd_ms']:.2f} ms, {r['fwd_bwd_tflops']:.0f} TFLOP/s, "
          f"{_pct(r.get('fwd_bwd_of_peak'))} of peak; {r['rows']} rows")
  note += f"; {r['kernels']}" if r.get("kernels") else ""
  return (f"| {LABELS.get(r['row'], r['row'])} | {r['backend']} | {_num(r['fwd_bwd_ms'] / 1e3)} "
          f"| | | {_num(r['compile_s'], 1)} | {note} | "
          f"{_target(r['row'], r['backend'], r)} |")


def table(lines: list[dict]) -> str:
  """The markdown table of gpu.jsonl's tagged lines, then what did not finish."""
  rows, problems = [HEADER], []
  for r in lines:
    if "row" not in r or r.get("lab"):   # the MoE lab's own rows: its table is lab.md
      continue
    if "step_s" in r:
      rows.append(step_row(r))
    elif "fwd_bwd_ms" in r or ("backend" in r and "skipped" in r):
      rows.append(gemm_row(r))
    elif "skipped" in r:
      problems.append(f"- {r['row']}: skipped, {r['skipped']}")
    elif r.get("rc", 0) != 0:
      why = "timed out" if r["rc"] in (124, 137) else f"failed (exit status {r['rc']})"
      problems.append(f"- {r['row']}: {why} after {r['wall_s']} s of its {r['bound_s']} s "
                      "(quick_log.txt has its output)")
  walls = [r for r in lines if "wall_s" in r and not r.get("lab")]
  total = sum(r["wall_s"] for r in walls)
  return "\n".join(rows + problems + [f"{len(walls)} runs, {total} s in all"])


def main(argv):
  with open(argv[1]) as f:
    lines = [json.loads(line) for line in f if line.startswith("{")]
  print(table(lines))


if __name__ == "__main__":
  main(sys.argv)
