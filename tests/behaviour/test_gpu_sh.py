"""benchmarks/gpu.sh, dry: with `python3` and `timeout` faked on PATH, every section runs the
commands it names, and every train-step run's config file and overrides are valid (a typo in
a field would cost a GPU session its run)."""

import os
import re
import shlex
import stat
import subprocess

import pytest

from tests.fixtures.paths import ROOT
from tst_jax import configlib


def _dry_run(tmp_path, sections):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "calls.txt"
  for name, body in (("python3", f'printf "%q " "$@" >> {log}; echo >> {log}; cat > /dev/null'),
                     ("timeout", 'shift; exec "$@"')):
    path = bin_dir / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), str(tmp_path / "out"),
                  sections], check=True, capture_output=True, text=True, timeout=60,
                 env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
  return [shlex.split(line) for line in log.read_text().splitlines() if line.strip()]


def test_every_section_runs_valid_commands(tmp_path):
  calls = _dry_run(tmp_path, "all")
  scripts = [c[0] for c in calls if c and c[0] != "-"]
  assert scripts.count("benchmarks/step.py") == 9 + 2 + 6 + 2
  assert scripts.count("benchmarks/grouped_matmul.py") == 1
  assert scripts.count("benchmarks/loss_tiles.py") == 2
  for call in calls:
    if call and call[0] == "benchmarks/step.py":
      config_file = call[call.index("--config") + 1]
      config = configlib.load_config(os.path.join(ROOT, config_file))
      overrides = [a[len("--config."):] for a in call if a.startswith("--config.")]
      configlib.apply_overrides(config, overrides)   # raises on an unknown field
  profiles = [c for c in calls if "--profile" in c]
  assert len(profiles) == 2 and all("configs/qwen3_moe" in " ".join(c) for c in profiles)
  (gemm,) = [c for c in calls if c[0] == "benchmarks/grouped_matmul.py"]
  assert "tokamax:triton/triton/triton" in gemm[gemm.index("--backends") + 1]


@pytest.mark.parametrize("sections,steps", [("moe", 6), ("moe,profile", 8), ("gemm", 0)])
def test_a_section_runs_alone(tmp_path, sections, steps):
  calls = _dry_run(tmp_path, sections)
  assert sum(c[0] == "benchmarks/step.py" for c in calls) == steps


@pytest.mark.parametrize("script", ["gpu_small.sh", "ladder.sh"])
def test_the_outer_timeout_leaves_the_sweep_its_grace(script):
  """The scripts give the sweep a deadline of LEFT seconds and kill it at LEFT + extra: at its
  deadline the sweep asks its trainers to checkpoint and waits up to GRACE_S for them, then
  writes its report, so extra must hold GRACE_S and the report; the seconds kept from the
  script's total must hold extra and the kill's own delay, then the packing. The numbers are
  benchmarks/sweep_common.sh's, which both scripts source."""
  from tst_jax.tools.sweep import run as sweep_run   # pylint: disable=import-outside-toplevel
  common = open(os.path.join(ROOT, "benchmarks", "sweep_common.sh")).read()
  kept, extra, kill = (int(re.search(rf"^{name}=(\d+)$", common, re.M).group(1))
                       for name in ("KEEP_S", "OUTER_EXTRA_S", "KILL_S"))
  assert "LEFT=$(( TOTAL_S - ($(date +%s) - START) - KEEP_S ))" in common
  text = open(os.path.join(ROOT, "benchmarks", script)).read()
  assert '. "$(dirname "$0")/sweep_common.sh"' in text and "\nsweep_left\n" in text
  assert 'timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S ))' in text
  assert "--deadline_s \"$LEFT\"" in text
  assert extra >= sweep_run.GRACE_S + 20, (extra, sweep_run.GRACE_S)
  assert kept >= extra + kill + 10, (kept, extra, kill)
