"""Dependencies: the tested versions satisfy the declared ranges; the tfds reader needs no
TensorFlow; CI runs the README's test command at both ends of what an install resolves, and
once more with every extra installed and the slow tests too."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.fixtures.paths import ROOT
from tst_jax.data import formats
from tst_jax.kernels import grouped_matmul


def _pins(name: str = "constraints.txt") -> dict[str, str]:
  pins = {}
  with open(os.path.join(ROOT, name)) as f:
    for line in f:
      line = line.split("#")[0].strip()
      if line:
        name, version = line.split("==")
        pins[name.lower().replace("_", "-")] = version
  return pins


@pytest.mark.parametrize("constraints", ["constraints.txt", "constraints-py313.txt"])
def test_tested_versions_satisfy_pyproject(constraints):
  """Each end's constraints pin every direct and [test] dependency inside its declared range,
  and the README names the file."""
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  pins = _pins(constraints)
  declared = project["dependencies"] + project["optional-dependencies"]["test"]
  for line in declared:
    req = Requirement(line)
    name = req.name.lower().replace("_", "-")
    assert name in pins, f"{name} is declared but its tested version is not in {constraints}"
    assert req.specifier.contains(pins[name], prereleases=True), (line, pins[name])
  assert len(pins) == len(declared) + 1          # jaxlib: jax's, pinned to jax's version
  assert pins["jaxlib"] == pins["jax"]
  with open(os.path.join(ROOT, "README.md")) as f:
    assert f"-c {constraints}" in " ".join(f.read().split())


def test_the_python_floor_is_the_oldest_tested_end_and_the_readme_says_it():
  """pyproject's requires-python is the Python that constraints.txt, the oldest end, was
  tested on, and the quickstart names it: on an older one pip names tst-jax, not flax."""
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    floor = tomllib.load(f)["project"]["requires-python"]
  with open(os.path.join(ROOT, "constraints.txt")) as f:
    tested = re.search(r"\(Python (\d+\.\d+),", f.read()).group(1)
  assert floor == f">={tested}"
  with open(os.path.join(ROOT, "README.md")) as f:
    assert f"Python >= {tested}" in f.read()


def test_tfds_reads_through_data_source_without_tensorflow(monkeypatch):
  """`tfds:` reads the ArrayRecord data source (random access, no TensorFlow), not
  tfds.load's tf.data pipeline."""
  calls = []
  docs = [{"text": b"first document"}, {"text": b"second"}]

  def data_source(name, split, data_dir, download):
    calls.append((name, split, data_dir, download))
    return docs

  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = data_source
  fake.builder = lambda name, data_dir: types.SimpleNamespace(
      is_prepared=lambda: True, info=types.SimpleNamespace(splits={"test": 2}))
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  monkeypatch.setitem(sys.modules, "tensorflow", None)     # importing it would fail
  shard = formats.InputShard("tfds", ("lm1b", "test"), 0)
  monkeypatch.setenv("TFDS_DATA_DIR", "/data/tfds")   # read when the source is, as TFDS's own
  assert list(formats._tfds_texts(shard)) == [b"first document", b"second"]
  assert calls == [("lm1b", "test", "/data/tfds", False)]


def test_gpu_extra_and_its_constraints_name_the_tokamax_that_ran():
  """The [gpu] extra asks for what ran on the H100 (jax >= 0.11.2, tokamax >= 0.0.17 on
  Python >= 3.12) and the oldest jax-triton that traces tokamax's Triton kernels,
  constraints-gpu.txt pins versions inside those ranges, and the floor the run enforces
  (platform.GMM_MIN_TOKAMAX) is the extra's."""
  tomllib = pytest.importorskip("tomllib")
  from tst_jax import platform   # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  # [gpu] is CUDA 12's JAX and [gpu-kernels], the one list, which launch/Dockerfile.gpu
  # installs with the JAX of its CUDA.
  cuda = {Requirement(r).name: Requirement(r) for r in extras["gpu"]}
  assert set(cuda) == {"jax", "tst-jax"} and cuda["tst-jax"].extras == {"gpu-kernels"}
  assert cuda["jax"].extras == {"cuda12"} and str(cuda["jax"].specifier) == ">=0.11.2"
  gpu = {Requirement(r).name: Requirement(r) for r in extras["gpu-kernels"]}
  assert str(gpu["tokamax"].specifier) == ">=0.0.17"
  assert str(gpu["tokamax"].marker) == 'python_version >= "3.12"'
  assert not gpu["tokamax"].marker.evaluate({"python_version": "3.11"})
  assert str(gpu["jax"].specifier) == ">=0.11.2"
  floor = ".".join(map(str, grouped_matmul.JAX_TRITON_MIN))
  assert gpu["jax-triton"].specifier.contains(floor)
  assert not gpu["jax-triton"].specifier.contains("0.4.0")   # triton_call takes no None
  assert not gpu["jax-triton"].specifier.contains("0.3.1")   # nor out_type
  assert ".".join(map(str, platform.GMM_MIN_TOKAMAX)) == "0.0.17"
  pins = _pins("constraints-gpu.txt")
  assert pins["tokamax"] == "0.0.17" and pins["jax"] == pins["jaxlib"] == "0.11.2"
  for name, req in gpu.items():
    assert req.specifier.contains(pins[name]), (name, pins[name])


def test_the_gpu_pins_trace_tokamaxs_triton_kernels():
  """constraints-gpu.txt pins the tokamax whose Triton calls grouped_matmul.JAX_TRITON_MIN is
  read from (0.0.17's pass out_type and None arguments; its own Triton test skips below
  jax_triton 0.4.1), a jax-triton at or past that floor, and a triton that jax-triton 0.4.x
  takes (>= 3.7): pins that would register a Triton path that fails to trace fail here."""
  pins = _pins("constraints-gpu.txt")
  assert pins["tokamax"] == "0.0.17", "read the new tokamax's triton_call and its test's floor"
  assert Version(pins["jax-triton"]).release >= grouped_matmul.JAX_TRITON_MIN, pins
  assert Version(pins["triton"]) >= Version("3.7"), pins


def test_every_extra_but_the_gpus_is_in_every():
  """[every], what CI's third run installs, names each extra but [gpu], [gpu-kernels] and [test]."""
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  every, *pins = map(Requirement, extras["every"])
  assert every.name == "tst-jax" and not every.specifier
  assert every.extras == set(extras) - {"every", "gpu", "gpu-kernels", "test"}
  nested = {str(r) for name in every.extras for r in map(Requirement, extras[name])}
  assert pins and {str(p) for p in pins} <= nested, "a pin of [every] is a nested extra's own"


# The modules each extra of [every] is for: what a user of it imports.
EXTRA_MODULES = {
    "gcs": ["gcsfs"], "s3": ["s3fs"], "s3-test": ["moto", "kubernetes"], "parquet": ["pyarrow"],
    "tfds": ["tensorflow_datasets", "array_record"], "seqio": ["seqio", "tensorflow"],
    "ray": ["ray"], "wandb": ["wandb"], "trackio": ["trackio"], "eval": ["lm_eval"],
    "sentencepiece": ["sentencepiece"], "xm": ["xmanager"], "fp8": ["qwix"]}


def test_every_extras_modules_import_together():
  """Where every extra is installed (.ci/run's third run), the modules of each import in one
  process: an extra whose pins let pip install what cannot import (seqio's sentencepiece
  beside xmanager's protobuf < 7) fails here. Skipped where one is not installed."""
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    every = Requirement(tomllib.load(f)["project"]["optional-dependencies"]["every"][0])
  assert set(EXTRA_MODULES) == every.extras
  modules = [m for names in EXTRA_MODULES.values() for m in names]
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    pytest.skip(f"not every extra is installed here: no {', '.join(missing)}")
  result = subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)],
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]


def _readme_command(number: int) -> str:
  """The command of the README's quickstart block `number`."""
  with open(os.path.join(ROOT, "README.md")) as f:
    blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
  [command] = [b.splitlines()[1] for b in blocks if b.startswith(f"# {number}. ")]
  return command


def _ci(tmp_path, pyenv_versions: dict[str, str], command: str, every: str):
  """Sources .ci/run and runs its three runs in tmp_path, with the test's Python as the default
  python3 and fake pyenv Pythons ({version: exit code of anything but the version probe}),
  `command` for the README's and `every` for the every-extras run's."""
  tools = tmp_path / "tools"
  tools.mkdir(parents=True)
  for tool in ("bash", "sort", "tail", "cut", "mktemp", "ln", "rm", "touch", "dirname"):
    (tools / tool).symlink_to(shutil.which(tool))
  (tmp_path / "default").mkdir()
  (tmp_path / "default" / "python3").symlink_to(sys.executable)
  for version, rc in pyenv_versions.items():
    fake = tmp_path / "pyenv" / "versions" / version / "bin" / "python3"
    fake.parent.mkdir(parents=True)
    fake.write_text(f'#!/bin/sh\ncase "$2" in *releaselevel*) echo "{version} $0"; exit 0;; '
                    f'esac\nexit {rc}\n')
    fake.chmod(0o755)
  (tmp_path / "pyenv").mkdir(exist_ok=True)
  work = tmp_path / "work"
  work.mkdir()
  env = dict(PATH=f"{tmp_path / 'default'}:{tools}", PYENV_ROOT=str(tmp_path / "pyenv"),
             HOME=str(tmp_path), FAKE=command, FAKE_EVERY=every)
  script = (f'source {os.path.join(ROOT, ".ci", "run")}; README_COMMAND="$FAKE"; '
            'EVERY_COMMAND="$FAKE_EVERY"; all_runs')
  result = subprocess.run([shutil.which("bash"), "-c", script], cwd=work, env=env,
                          capture_output=True, text=True)
  return result.returncode, result.stdout, sorted(os.listdir(work))


def test_ci_runs_the_readme_test_command_at_both_ends_and_fails_if_either_fails(tmp_path):
  """.ci/run's command is the README's command 2, run on the default python3 in .venv and on
  the newest Python in .venv-newest, then once more in .venv-every with [every] and the slow
  tests; a failure of any fails CI, and with no newer Python it says so and runs the one it
  has. The venvs are ignored by git."""
  source = (f'source {os.path.join(ROOT, ".ci", "run")}; '
            'printf "%s\\n%s" "$README_COMMAND" "$EVERY_COMMAND"')
  ci_command, every_command = subprocess.run(
      [shutil.which("bash"), "-c", source], capture_output=True, text=True,
      check=True).stdout.split("\n")
  assert ci_command == _readme_command(2)
  assert every_command == ci_command.replace(".venv", ".venv-every").replace(
      "'.[test]'", "'.[test,every]'") + " -m 'slow or not slow'"
  with open(os.path.join(ROOT, ".gitignore")) as f:
    assert {"/.venv/", "/.venv-newest/", "/.venv-every/"} <= set(f.read().split())
  fake = "touch .venv.ran && python3 -c pass"
  every = "touch .venv-every.ran && python3 -c pass"
  rc, out, ran = _ci(tmp_path / "a", {"3.99.0": 3, "3.10.0": 0}, fake, every)
  assert rc == 1 and ran == [".venv-every.ran", ".venv-newest.ran", ".venv.ran"], out
  assert "=== newest Python: python3 is 3.99.0 " in out
  assert re.search(r"^=== default python3: no jax in \.venv: passed in \d+ s$", out, re.M)
  assert re.search(r"^=== newest Python: no jax in \.venv-newest: FAILED \(exit 3\)", out, re.M)
  assert re.search(r"^=== every extra, slow tests too: no jax in \.venv-every: passed in \d+ s$",
                   out, re.M)
  rc, out, ran = _ci(tmp_path / "b", {"3.99.0": 0}, fake, every)
  assert rc == 0 and ran == [".venv-every.ran", ".venv-newest.ran", ".venv.ran"], out
  rc, out, ran = _ci(tmp_path / "c", {"3.9.0": 0}, fake, every)
  assert rc == 0 and ran == [".venv-every.ran", ".venv.ran"], out
  assert "no Python newer than the default python3 on this machine: it ran on that one" in out
  rc, out, ran = _ci(tmp_path / "d", {"3.9.0": 0}, fake, every + " && exit 4")
  assert rc == 1 and re.search(r"^=== every extra, slow tests too: no jax in \.venv-every: "
                               r"FAILED \(exit 4\)", out, re.M), out
