"""benchmarks/split_loss.py: a trained run's next-token CE on both splits of its store."""

import json
import os
import runpy

import numpy as np
import optax
import pytest

from tests.fixtures import trained
from tests.fixtures.paths import ROOT
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.data.store import TokenStore

SCRIPT = os.path.join(ROOT, "benchmarks", "split_loss.py")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained.workdir(tmp_path_factory)


@pytest.mark.slow
def test_split_ce_is_the_mean_next_token_ce_of_its_windows(workdir, capsys):
  split_loss = runpy.run_path(SCRIPT)
  run = trained_run.load(RunDir(workdir), dtype="float32")
  val = TokenStore(os.path.join(workdir, "data")).val
  got = split_loss["split_ce"](run, val, windows=3, seed=5, batch=2)
  starts = np.random.default_rng(5).integers(0, len(val) - 33, size=3)
  windows = val.gather(starts, 33)
  want = optax.softmax_cross_entropy_with_integer_labels(
      np.asarray(run.model(windows[:, :-1]), np.float32), windows[:, 1:]).mean()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  split_loss["main"](["--workdir", workdir, "--windows", "4"])
  line = json.loads(capsys.readouterr().out)
  assert line["step"] == trained.FINAL_STEP and line["window"] == 33
  assert np.isfinite(line["train_ce"]) and np.isfinite(line["val_ce"])
