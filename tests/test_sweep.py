"""Config overrides and grids; the sweep command end to end on tiny runs (tables, resume)."""

import csv
import os

import pytest

from tests.tiny import tiny_config
from tst_jax import configlib, sweep
from tst_jax.train import metrics as metrics_lib
from tst_jax.train.plan import make_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_config.py")
STEPS = 8
FAST = ["--set", f"train.steps={STEPS}", "--set", "train.checkpoint_every=100"]


def test_overrides_coerce_to_the_field_type_and_reject_unknown_fields():
  c = configlib.load_config(os.path.join(ROOT, "configs", "demo.py") + ":baseline")
  assert c.tst.ratio == 0.0
  configlib.apply_overrides(c, ["tst.ratio=1", "tst.bag_size=6", "train.progress_bar=false",
                                "data.max_bytes=1e6", "model.attention_impl=cudnn"])
  assert (c.tst.ratio, c.tst.bag_size, c.train.progress_bar) == (1.0, 6, False)
  assert isinstance(c.tst.ratio, float) and c.data.max_bytes == 1_000_000
  assert c.model.attention_impl == "cudnn"            # a typed None placeholder
  with pytest.raises(ValueError, match="did you mean ratio"):
    configlib.apply_overrides(c, ["tst.ratoi=0.1"])
  with pytest.raises(ValueError, match="as int"):
    configlib.apply_overrides(c, ["tst.bag_size=2.5"])
  with pytest.raises(ValueError, match="is a section"):
    configlib.apply_overrides(c, ["tst=1"])
  with pytest.raises(ValueError, match="dotted.key=value"):
    configlib.apply_overrides(c, ["tst.ratio"])


def test_grid_is_the_cartesian_product():
  assert configlib.parse_grid("a.x=1,2;b=u,v") == [
      ["a.x=1", "b=u"], ["a.x=1", "b=v"], ["a.x=2", "b=u"], ["a.x=2", "b=v"]]
  assert configlib.parse_grid("") == [[]]
  with pytest.raises(ValueError, match="twice"):
    configlib.parse_grid("a=1;a=2")
  names = [p.name for p in sweep.make_points("tst.ratio=0.1;tst.bag_size=2,4", [0, 1], True)]
  assert names == ["baseline_seed0", "ratio0.1_bag_size2_seed0", "ratio0.1_bag_size4_seed0",
                   "baseline_seed1", "ratio0.1_bag_size2_seed1", "ratio0.1_bag_size4_seed1"]


def _check_tables(workdir, expected):
  """Every number of sweep.csv against the run's own metrics.jsonl and plan."""
  with open(workdir / "sweep.csv") as f:
    rows = {r["name"]: r for r in csv.DictReader(f)}
  assert set(rows) == set(expected)
  base = {r["seed"]: float(r["final_eval_loss"]) for r in rows.values() if r["r"] == "0.0"}
  md = (workdir / "sweep.md").read_text()
  for name, (ratio, bag) in expected.items():
    row = rows[name]
    records = metrics_lib.read(str(workdir / name / "metrics.jsonl"))
    final = [r["eval_loss"] for r in records if "eval_loss" in r and r["step"] == STEPS]
    last = [r for r in records if "loss" in r][-1]
    assert float(row["final_eval_loss"]) == final[-1]
    assert f"{final[-1]:.4f}" in md
    assert (int(row["data_tokens"]), int(row["equivalent_tokens"])) == (
        last["data_tokens"], last["equivalent_tokens"])
    plan = make_plan(tiny_config(steps=STEPS, ratio=ratio, bag_size=bag)).to_json()
    assert float(row["flops"]) == plan["flops_total"]
    assert (float(row["r"]), int(row["S"])) == ((ratio, bag) if ratio else (0.0, 1))
    assert float(row["delta_vs_baseline"]) == pytest.approx(final[-1] - base[row["seed"]])
  assert (workdir / "sweep_heatmap.png").stat().st_size > 0


def _run_and_resume(tmp_path, grid, expected, monkeypatch, capsys):
  args = ["--config", CONFIG, "--grid", grid, "--workdir", str(tmp_path), "--include_baseline",
          *FAST]
  assert sweep.main(args) == 0
  _check_tables(tmp_path, expected)
  table = (tmp_path / "sweep.csv").read_text()
  capsys.readouterr()

  def no_training(*a, **k):
    raise AssertionError("a finished point was trained again")
  monkeypatch.setattr("tst_jax.train.loop.run", no_training)
  assert sweep.main(args) == 0
  assert capsys.readouterr().out.count("finished, skipped") == len(expected)
  assert (tmp_path / "sweep.csv").read_text() == table


def test_sweep_1x2_tables_match_metrics_and_rerun_skips(tmp_path, monkeypatch, capsys):
  expected = {"baseline_seed0": (0.0, 2), "ratio0.5_bag_size2_seed0": (0.5, 2),
              "ratio0.5_bag_size4_seed0": (0.5, 4)}
  _run_and_resume(tmp_path, "tst.ratio=0.5;tst.bag_size=2,4", expected, monkeypatch, capsys)


@pytest.mark.slow
def test_sweep_2x2_tables_match_metrics_and_rerun_skips(tmp_path, monkeypatch, capsys):
  expected = {"baseline_seed0": (0.0, 2)}
  expected.update({f"ratio{r}_bag_size{s}_seed0": (r, s) for r in (0.25, 0.5) for s in (2, 4)})
  _run_and_resume(tmp_path, "tst.ratio=0.25,0.5;tst.bag_size=2,4", expected, monkeypatch,
                  capsys)
