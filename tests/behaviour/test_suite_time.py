"""benchmarks/suite_time.py: a test's seconds are its setup, call and teardown together, the
summary's counts and seconds are pytest's, and the run starts from an empty compilation cache."""

import importlib.util
import json
import os

from tests.fixtures.paths import ROOT

_SPEC = importlib.util.spec_from_file_location("benchmarks_suite_time",
                                               os.path.join(ROOT, "benchmarks", "suite_time.py"))
suite_time = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(suite_time)

# pytest -q --durations=0 as it prints them; an id of a parametrized case may hold spaces.
OUTPUT = """\
..F.s                                                                    [100%]
============================== slowest durations ===============================
5.00s call     tests/a.py::test_one_long_call
3.00s setup    tests/b.py::test_case[--config.model.n_heads=3-error: 32 is not divisible]
3.00s call     tests/b.py::test_case[--config.model.n_heads=3-error: 32 is not divisible]
0.50s teardown tests/b.py::test_case[--config.model.n_heads=3-error: 32 is not divisible]
0.20s call     tests/c.py::test_short
=========================== short test summary info ============================
FAILED tests/a.py::test_other - AssertionError
1 failed, 1483 passed, 37 skipped, 55 warnings in 471.37s (0:07:51)
"""


def test_a_tests_seconds_are_its_setup_call_and_teardown_together():
  """The parametrized case is over 5.5 s only with its setup and teardown (6.5 s); no single
  line of it is, and the 5 s call is not."""
  assert max(float(line.split("s ")[0]) for line in OUTPUT.splitlines()[2:7]) < 5.5
  result = suite_time.report(OUTPUT, 5.5)
  assert result["over_threshold"] == [
      {"test": "tests/b.py::test_case[--config.model.n_heads=3-error: 32 is not divisible]",
       "s": 6.5}]
  assert result["counts"] == {"failed": 1, "passed": 1483, "skipped": 37}
  assert result["pytest_s"] == 471.37 and result["within_budget"] is False
  assert result["test_seconds"] == 11.7


def test_a_run_starts_from_an_empty_cache_and_lists_its_long_tests(tmp_path, capsys,
                                                                   monkeypatch):
  (tmp_path / "test_timed.py").write_text(
      "import os, time\n"
      "def test_sleeps():\n"
      "  time.sleep(0.3)\n"
      "def test_the_cache_is_new_and_empty():\n"
      "  cache = os.environ['JAX_COMPILATION_CACHE_DIR']\n"
      "  assert os.path.isdir(cache) and not os.listdir(cache)\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "warm"))
  assert suite_time.main(["--threshold", "0.25", "test_timed.py"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["counts"] == {"passed": 2} and result["within_budget"]
  assert [t["test"] for t in result["over_threshold"]] == ["test_timed.py::test_sleeps"]
  assert 0.3 <= result["over_threshold"][0]["s"] < result["wall_s"]
  assert not (tmp_path / "warm").exists()
