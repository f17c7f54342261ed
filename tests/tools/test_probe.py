"""python -m tst_jax.tools.probe on a tiny two-phase run: the entropies it prints are the
analysis' on the held-out windows read from the store, bags of the run's S included, and bad
input is one line."""

import json

import numpy as np
import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax import cli, errors
from tst_jax import superposition as sp
from tst_jax.analysis import attention
from tst_jax.data.store import TokenStore
from tst_jax.rundir import RunDir
from tst_jax.tools import probe
from tst_jax.train import trained_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("probe") / "run"
  cli.run(tiny_config(steps=12, ratio=0.5, bag_size=2), str(workdir))   # switch at step 6
  return workdir


def test_the_probe_of_the_switch_is_the_analysis_on_held_out_windows(run, tmp_path, capsys):
  out = tmp_path / "probe.json"
  probe.main(["--workdir", str(run), "--steps", "6,12", "--batches", "2", "--json", str(out)])
  text = capsys.readouterr().out
  rows = json.loads(out.read_text())
  assert [(r["step"], r["phase"], r["bag_size"]) for r in rows] == [(6, "tst", 2), (12, "ntp", 2)]
  store = TokenStore(str(RunDir(str(run)).data))
  starts = np.linspace(0, len(store.val) - 32, 8).astype(np.int64)      # 2 x B 4, S·L = 32
  windows = np.stack([store.val.read(int(s), 32) for s in starts]).astype(np.int32)
  model = trained_run.load(RunDir(str(run)), 6, dtype="float32").model
  stats = attention.attention_stats(model, windows[:, :16])
  for key, name in (("tokens", "entropy"), ("on_self", "self"), ("on_first", "first")):
    np.testing.assert_allclose(rows[0][key], stats[name].mean(-1), rtol=1e-5)
  bags = sp.fold(windows, 2)
  np.testing.assert_allclose(rows[0]["bags"], attention.attention_entropy(model, bags).mean(-1),
                             rtol=1e-5)
  assert rows[0]["input_scale"] == pytest.approx(attention.input_scale(model, bags), rel=1e-5)
  assert (f"| 6 | tst | 0 | {rows[0]['tokens'][0]:.3f} | {rows[0]['on_self'][0]:.3f} | "
          f"{rows[0]['on_first'][0]:.3f} | {rows[0]['bags'][0]:.3f} | ") in text
  assert rows[0]["tokens"] != rows[1]["tokens"]


def test_windows_in_slices_give_the_probe_of_all_at_once(run, monkeypatch):
  """Scores bounded to a slice of rows a call: the rows' weighted means, the same numbers."""
  trained = trained_run.load(RunDir(str(run)), 6, dtype="float32")
  whole = probe.probe(trained, 2)
  monkeypatch.setattr(probe, "SCORES_PER_CALL", 3 * 2 * 16 * 16)   # 3 rows of H 2, L 16
  sliced = probe.probe(trained, 2)
  for key in ("tokens", "on_self", "on_first", "bags", "input_scale"):
    np.testing.assert_allclose(sliced[key], whole[key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "six"], "--steps 'six': a comma list of checkpoint steps"),
    (["--steps", "7"], "has no checkpoint of step 7"),
    (["--batches", "0"], "--batches 0: at least 1"),
])
def test_bad_input_is_one_line(run, argv, message):
  with pytest.raises(errors.UserError, match=message):
    probe.main(["--workdir", str(run), *argv])
