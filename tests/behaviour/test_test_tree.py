"""The test tree mirrors the package: the tests of tst_jax/<package>/<module>.py are in
tests/<package>/test_<module>.py (those of a module split in parts, <module>_<part>.py, too),
helpers are in tests/fixtures/, and tests that cross modules
are here in tests/behaviour/. A module with no test file of its own name is in ELSEWHERE, with
the files whose tests exercise it."""

import os

from tests.fixtures.paths import ROOT

TESTS = os.path.join(ROOT, "tests")
PACKAGE = os.path.join(ROOT, "tst_jax")
NOT_A_PACKAGE = {"fixtures", "behaviour", "testdata", "__pycache__"}

# Test files named for what they test inside one module, not for the module itself.
NAMED_FOR_A_PART = {
    "test_api.py": "__init__.py",                       # the public API, tst_jax's own names
    "config/test_plan_schedule.py": "config/plan.py",     # the plan's learning-rate schedule
    "test_z_loss.py": "losses.py",                      # the z-loss, in every implementation
    "test_loss_variants.py": "losses.py",               # the registry of TST loss variants
    "data/test_dataset_libraries.py": "data/formats.py",  # tfds: and seqio:, the real ones
}

# Modules tested through others, and where. Each named file must import the module.
ELSEWHERE = {
    "convert/hf.py": ["convert/test_llama_hf.py", "convert/test_qwen3_moe_hf.py"],
    "data/output_shards.py": ["data/test_store.py"],
    "convert/reading.py": ["convert/test_llama_hf.py"],
    "data/run_data.py": ["config/test_plan.py", "data/test_store.py"],
    "kernels/sharded.py": ["kernels/test_linear_mce.py"],
    "models/sampling.py": ["tools/test_sample.py"],
    "models/experts.py": ["models/test_moe.py", "parallel/test_mesh.py"],
    "kernels/tokamax_tuning.py": ["kernels/test_grouped_matmul.py"],
    "tools/arms.py": ["tools/test_compare.py", "tools/test_sweep.py"],
    "tools/eval_curve.py": ["tools/test_compare.py"],
    "cli.py": ["config/test_spec.py", "train/test_loop.py", "parallel/test_xla_flags.py"],
    "config/defaults.py": ["config/test_plan_schedule.py", "train/test_loop.py"],
    "config/sections.py": ["config/test_spec.py", "run/test_console.py"],
    "train/trained_run.py": ["tools/test_eval.py", "tools/test_sample.py", "tools/test_export.py"],
}


def _files(top: str, suffix: str) -> set[str]:
  return {os.path.relpath(os.path.join(d, f), top)
          for d, _, names in os.walk(top) if "__pycache__" not in d
          for f in names if f.endswith(suffix)}


def _package_of(test: str) -> str:
  return os.path.dirname(test)


def test_each_test_folder_is_a_package_of_tst_jax():
  folders = {d for d in os.listdir(TESTS) if os.path.isdir(os.path.join(TESTS, d))}
  for folder in folders - NOT_A_PACKAGE:
    assert os.path.isfile(os.path.join(PACKAGE, folder, "__init__.py")), (
        f"tests/{folder}/ mirrors no package of tst_jax/")
    assert os.path.isfile(os.path.join(TESTS, folder, "__init__.py")), folder


def test_each_test_file_is_named_for_a_module_and_helpers_are_fixtures():
  modules = _files(PACKAGE, ".py")
  for test in sorted(_files(TESTS, ".py")):
    top = test.split(os.sep)[0]
    name = os.path.basename(test)
    if top in ("fixtures", "testdata") or name in ("__init__.py", "conftest.py"):
      continue
    assert name.startswith("test_"), f"tests/{test}: a helper belongs in tests/fixtures/"
    if top == "behaviour":
      continue
    stem = name[len("test_"):-len(".py")]
    here = os.path.join(_package_of(test), stem)
    named = {here + ".py", os.path.join(here, "__init__.py"), NAMED_FOR_A_PART.get(test)}
    parts = {m for m in modules if m.startswith(here + "_")}
    assert named & modules or parts, f"tests/{test} names no module of tst_jax/{_package_of(test)}"


def test_every_module_has_tests_by_its_name_or_in_elsewhere():
  tests = _files(TESTS, ".py")
  tested_by_name = set(NAMED_FOR_A_PART.values())
  for test in tests:
    stem = os.path.basename(test)[len("test_"):-len(".py")]
    tested_by_name |= {os.path.join(_package_of(test), stem + ".py"),
                       os.path.join(_package_of(test), stem, "__init__.py")}
  for module in sorted(_files(PACKAGE, ".py")):
    package_dir = os.path.dirname(module)
    if any(module.startswith(t[:-len(".py")] + "_") for t in tested_by_name):
      continue                              # a part of a split module: linear_mce_tpu.py
    if module in tested_by_name or (module.endswith("__init__.py") and package_dir
                                    and module not in ELSEWHERE):
      continue
    if os.path.dirname(package_dir) and os.path.join(package_dir, "__init__.py") in tested_by_name:
      continue                              # a module of a tested subpackage (tools/sweep/)
    assert module in ELSEWHERE, f"tst_jax/{module}: no tests/{package_dir or '.'}/test_" \
        f"{os.path.basename(module)} and no entry in ELSEWHERE"
    name = os.path.splitext(os.path.basename(module))[0]
    for test in ELSEWHERE[module]:
      assert test in tests, f"ELSEWHERE[{module!r}]: tests/{test} does not exist"
      with open(os.path.join(TESTS, test)) as f:
        assert name in f.read(), f"tests/{test} does not use tst_jax/{module}"
  for module in ELSEWHERE:
    assert module not in tested_by_name, f"{module} has tests of its own name now"
