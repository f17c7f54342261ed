"""Dependencies: the tested versions satisfy the declared ranges; the tfds reader needs no
TensorFlow."""

import os
import sys
import types

import pytest
from packaging.requirements import Requirement

from tests.fixtures.paths import ROOT
from tst_jax.data import sources


def _pins(name: str = "constraints.txt") -> dict[str, str]:
  pins = {}
  with open(os.path.join(ROOT, name)) as f:
    for line in f:
      line = line.split("#")[0].strip()
      if line:
        name, version = line.split("==")
        pins[name.lower().replace("_", "-")] = version
  return pins


def test_tested_versions_satisfy_pyproject():
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  pins = _pins()
  for line in project["dependencies"] + project["optional-dependencies"]["test"]:
    req = Requirement(line)
    name = req.name.lower().replace("_", "-")
    assert name in pins, f"{name} is declared but its tested version is not in constraints.txt"
    assert req.specifier.contains(pins[name], prereleases=True), (line, pins[name])


def test_tfds_reads_through_data_source_without_tensorflow(monkeypatch):
  """`tfds:` reads the ArrayRecord data source (random access, no TensorFlow), not
  tfds.load's tf.data pipeline."""
  calls = []
  docs = [{"text": b"first document"}, {"text": b"second"}]

  def data_source(name, split):
    calls.append((name, split))
    return docs

  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = data_source
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  monkeypatch.setitem(sys.modules, "tensorflow", None)     # importing it would fail
  assert list(sources._tfds_texts("lm1b", "test")) == [b"first document", b"second"]
  assert calls == [("lm1b", "test")]


def test_gpu_extra_and_its_constraints_name_the_tokamax_that_ran():
  """The [gpu] extra asks for what ran on the H100 (jax >= 0.11.2, tokamax >= 0.0.17 on
  Python >= 3.12), constraints-gpu.txt pins versions inside those ranges, and the floor the
  run enforces (platform.GMM_MIN_TOKAMAX) is the extra's."""
  tomllib = pytest.importorskip("tomllib")
  from tst_jax import platform   # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    gpu = {Requirement(r).name: Requirement(r)
           for r in tomllib.load(f)["project"]["optional-dependencies"]["gpu"]}
  assert str(gpu["tokamax"].specifier) == ">=0.0.17"
  assert str(gpu["tokamax"].marker) == 'python_version >= "3.12"'
  assert not gpu["tokamax"].marker.evaluate({"python_version": "3.11"})
  assert str(gpu["jax"].specifier) == ">=0.11.2"
  assert ".".join(map(str, platform.GMM_MIN_TOKAMAX)) == "0.0.17"
  pins = _pins("constraints-gpu.txt")
  assert pins["tokamax"] == "0.0.17" and pins["jax"] == pins["jaxlib"] == "0.11.2"
  for name, req in gpu.items():
    assert req.specifier.contains(pins[name]), (name, pins[name])
