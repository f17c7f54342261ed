"""Times a test run as CI starts it, from an empty compilation cache, and lists the tests over
docs/testing.md's `slow` rule, as JSON: python benchmarks/suite_time.py [--threshold S] [ARGS].

ARGS go to pytest after its own (`-q --durations=0`): none runs the default suite, `-m slow` the
slow tests, `-n0 tests/test_losses.py` one file in one process. A test's seconds are its setup,
call and teardown together, as pytest's --durations lines give them: a module fixture's setup
counts for the first test that asked for it, and pytest leaves out the steps under 5 ms.
The exit status is pytest's."""

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata

RULE_S = 5.5       # docs/testing.md: a test over this, on 3.13 from an empty cache, is slow
BUDGET_S = 360     # CI's six minutes for the default suite
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown) +(\S.*?)\s*$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|error)s?\b")
SECONDS = re.compile(r" in (\d+(?:\.\d+)?)s\b")


def per_test(output: str) -> dict[str, float]:
  """Returns each test's seconds, its setup, call and teardown summed, from pytest's output."""
  seconds = collections.defaultdict(float)
  for line in output.splitlines():
    match = DURATION.match(line)
    if match:
      seconds[match.group(3)] += float(match.group(1))
  return dict(seconds)


def summary(output: str) -> dict:
  """Returns the counts of pytest's last summary line and the seconds it says it took."""
  for line in reversed(output.splitlines()):
    seconds, counts = SECONDS.search(line), COUNT.findall(line)
    if seconds and counts:
      return {"counts": {kind: int(n) for n, kind in counts},
              "pytest_s": float(seconds.group(1))}
  return {"counts": {}, "pytest_s": None}


def report(output: str, threshold: float) -> dict:
  """Returns the run's summary and its tests over `threshold` seconds, the longest first."""
  tests = per_test(output)
  over = sorted(((s, name) for name, s in tests.items() if s > threshold), reverse=True)
  result = summary(output)
  result.update(
      threshold_s=threshold, budget_s=BUDGET_S,
      within_budget=result["pytest_s"] is not None and result["pytest_s"] <= BUDGET_S,
      test_seconds=round(sum(tests.values()), 2),
      over_threshold=[{"test": name, "s": round(s, 2)} for s, name in over])
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--threshold", type=float, default=RULE_S,
                      help=f"list the tests over this many seconds (default {RULE_S})")
  args, pytest_args = parser.parse_known_args(argv)
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
             *pytest_args]
  with tempfile.TemporaryDirectory() as cache:
    start = time.perf_counter()
    proc = subprocess.run(command, env=dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache),
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
  if proc.returncode not in (0, 1):   # 1: some test failed, and the times still stand
    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
  result = {"method": "one pytest run from an empty compilation cache (a new "
                      "JAX_COMPILATION_CACHE_DIR), as CI starts",
            "command": " ".join(["python", *command[1:]]),
            "python": platform.python_version(), "jax": metadata.version("jax"),
            "jaxlib": metadata.version("jaxlib"), "cpus": os.cpu_count(),
            "wall_s": round(wall, 1), **report(proc.stdout, args.threshold)}
  print(json.dumps(result, indent=1))
  return proc.returncode


if __name__ == "__main__":
  sys.exit(main())
