"""Config overrides and grids; the sweep command end to end on tiny runs (tables, resume)."""

import csv
import inspect
import io
import json
import os
import subprocess
import statistics

import pytest

from tests.fixtures.brought_back import write_point
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import configlib, errors, fileio
from tst_jax.data import prepare as prepare_lib, run_data
from tst_jax.rundir import RunDir
from tst_jax.tools import ladder, sweep
from tst_jax.tools.sweep.brought_back import RECORDS, bring_back
from tst_jax.tools.sweep.points import point_dir
from tst_jax.run import workdir as workdir_lib
from tst_jax.config import spec as spec_lib

STEPS = 8
FAST = ["--set", f"train.steps={STEPS}", "--set", "train.checkpoint_every=100"]


def test_points_share_a_store_exactly_when_its_prepare_arguments_agree():
  """The sweep's store key is the trainer's own prepare request: seq_len, batch size and the
  TST fields do not change the store; the held-out fraction, data seed, tokenizer and
  vocabulary do."""
  base = tiny_config()
  key = sweep.data_key(spec_lib.check(base))
  same = [dict(data=dict(seq_len=64, batch_size=8, eval_batches=3)),
          dict(bag_size=8, ratio=0.25, tst=dict(mode="input_only"))]
  other = [dict(data=dict(val_fraction=0.2)), dict(data=dict(seed=7)),
           dict(data=dict(max_bytes=1000)), dict(data=dict(tokenizer="/t/tokenizer.json")),
           dict(model=dict(vocab_size=1024))]
  assert all(sweep.data_key(spec_lib.check(tiny_config(**f))) == key for f in same)
  assert all(sweep.data_key(spec_lib.check(tiny_config(**f))) != key for f in other)
  pinned = tiny_config(data=dict(seed=0))     # data.seed set: the run's seed no longer counts
  reseeded = tiny_config(data=dict(seed=0))
  reseeded.seed = 1
  assert (sweep.data_key(spec_lib.check(pinned)) == sweep.data_key(spec_lib.check(reseeded))
          == key)
  arguments = set(inspect.signature(prepare_lib.prepare).parameters)
  assert set(run_data.store_request(spec_lib.check(base).data, 512)) <= arguments


def test_overrides_coerce_to_the_field_type_and_reject_unknown_fields():
  c = configlib.load_config(os.path.join(ROOT, "configs", "demo.py") + ":baseline")
  assert c.tst.ratio == 0.0
  configlib.apply_overrides(c, ["tst.ratio=1", "tst.bag_size=6", "train.progress_bar=false",
                                "data.max_bytes=1000000", "model.attention_impl=cudnn"])
  assert (c.tst.ratio, c.tst.bag_size, c.train.progress_bar) == (1.0, 6, False)
  assert isinstance(c.tst.ratio, float) and c.data.max_bytes == 1_000_000
  assert c.model.attention_impl == "cudnn"            # a typed None placeholder
  with pytest.raises(ValueError, match="did you mean ratio"):
    configlib.apply_overrides(c, ["tst.ratoi=0.1"])
  with pytest.raises(ValueError, match="as int"):
    configlib.apply_overrides(c, ["tst.bag_size=2.5"])
  with pytest.raises(ValueError, match="as int"):      # as --config.data.max_bytes=1e6 is
    configlib.apply_overrides(c, ["data.max_bytes=1e6"])
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
  """Every number of sweep.csv against the run's own metrics.jsonl, plan and store, in a
  folder or a bucket."""
  workdir = str(workdir)
  rows = {r["name"]: r for r in csv.DictReader(io.StringIO(
      fileio.read_text(fileio.join(workdir, "sweep.csv"))))}
  assert set(rows) == set(expected)
  base = {r["seed"]: float(r["final_eval_loss"]) for r in rows.values() if r["r"] == "0.0"}
  md = fileio.read_text(fileio.join(workdir, "sweep.md"))
  for name, (ratio, bag) in expected.items():
    row = rows[name]
    records = workdir_lib.read_metrics(RunDir(fileio.join(workdir, name)))
    final = [r["eval_loss"] for r in records if "eval_loss" in r and r["step"] == STEPS]
    last = [r for r in records if "loss" in r][-1]
    assert float(row["final_eval_loss"]) == final[-1]
    assert f"{final[-1]:.4f}" in md
    assert (int(row["data_tokens"]), int(row["equivalent_tokens"])) == (
        last["data_tokens"], last["equivalent_tokens"])
    store = run_data.TokenStore(workdir_lib.read_store(point_dir(workdir, name))["directory"])
    assert float(row["passes"]) == pytest.approx(last["data_tokens"] / len(store.train))
    plan = spec_lib.check(tiny_config(steps=STEPS, ratio=ratio, bag_size=bag)).plan.to_json()
    assert float(row["flops"]) == plan["flops_total"]
    assert (float(row["r"]), int(row["S"])) == ((ratio, bag) if ratio else (0.0, 1))
    if base:
      assert float(row["delta_vs_baseline"]) == pytest.approx(final[-1] - base[row["seed"]])
    else:
      assert row["delta_vs_baseline"] == ""
  assert fileio.getsize(fileio.join(workdir, "sweep_heatmap.png")) > 0


def _run_and_resume(workdir, grid, expected, monkeypatch, capsys, baseline=("--include_baseline",)):
  args = ["--config", TINY_CONFIG, "--grid", grid, "--workdir", str(workdir), *baseline, *FAST]
  assert sweep.main(args) == 0
  _check_tables(workdir, expected)
  table = fileio.read_text(fileio.join(str(workdir), "sweep.csv"))
  capsys.readouterr()

  def no_training(*a, **k):
    raise AssertionError("a finished point was trained again")
  monkeypatch.setattr("tst_jax.cli.run", no_training)
  assert sweep.main(args) == 0
  out = capsys.readouterr().out
  assert out.count("finished, skipped") == len(expected)
  assert fileio.read_text(fileio.join(str(workdir), "sweep.csv")) == table
  tables = ", ".join(fileio.join(str(workdir), f) for f in ("sweep.csv", "sweep.md",
                                                             "sweep_heatmap.png"))
  assert out.endswith(f"\nwrote {tables}; the points' runs in {workdir}\n"), out[-400:]


@pytest.mark.slow
def test_sweep_1x2_tables_match_metrics_and_rerun_skips(tmp_path, monkeypatch, capsys):
  expected = {"baseline_seed0": (0.0, 2), "ratio0.5_bag_size2_seed0": (0.5, 2),
              "ratio0.5_bag_size4_seed0": (0.5, 4)}
  _run_and_resume(tmp_path, "tst.ratio=0.5;tst.bag_size=2,4", expected, monkeypatch, capsys)


@pytest.mark.slow
def test_sweep_1x2_in_a_bucket_reads_one_store_in_place_and_rerun_skips(bucket, monkeypatch,
                                                                         capsys):
  """--workdir gs://...: the store is prepared once into the bucket and each point trains on it
  in place, its store.json naming that store at its fingerprint; the tables in the bucket
  match each point's metrics, and a rerun skips both points."""
  workdir = fileio.join(bucket, "sweep")
  expected = {"ratio0.5_bag_size2_seed0": (0.5, 2), "ratio0.5_bag_size4_seed0": (0.5, 4)}
  _run_and_resume(workdir, "tst.ratio=0.5;tst.bag_size=2,4", expected, monkeypatch, capsys,
                  baseline=())
  shared = [n for n in fileio.listdir(workdir) if n.startswith("data_")]
  assert len(shared) == 1
  store = run_data.TokenStore(fileio.join(workdir, shared[0], "data"))
  for name in expected:
    point = fileio.join(workdir, name)
    assert workdir_lib.read_store(RunDir(point))["fingerprint"] == store.fingerprint
    assert workdir_lib.read_store(RunDir(point))["directory"] == store.directory
    assert not fileio.exists(fileio.join(point, "data"))           # no copy of its own
    assert fileio.read_json(RunDir(point).sweep_point)["status"] == "done"
  # A point without its summary is unfinished: the same command resumes it from its last
  # checkpoint, which passes the checks that the run and its token store are the same.
  point = fileio.join(workdir, "ratio0.5_bag_size4_seed0")
  loss = workdir_lib.final_eval(RunDir(point), STEPS)
  fileio.remove(RunDir(point).summary)
  monkeypatch.undo()
  capsys.readouterr()
  assert sweep.main(["--config", TINY_CONFIG, "--grid", "tst.ratio=0.5;tst.bag_size=2,4",
                     "--workdir", workdir, *FAST]) == 0
  out = capsys.readouterr().out
  assert out.count("finished, skipped") == 1 and "ratio0.5_bag_size4_seed0: training" in out
  assert workdir_lib.read_summary(RunDir(point))["final_eval_loss"] == loss


def test_a_point_log_in_a_bucket_is_appended_after_each_trainer(bucket):
  """In a bucket each trainer's output goes to a local file, appended to sweep_log.txt once
  it ends, after what earlier trainers of the point left there."""
  for text in (b"first run\n", b"resumed\n"):
    with sweep.run._log_file(RunDir(bucket)) as log:     # pylint: disable=protected-access
      log.write(text)
  assert fileio.read_bytes(RunDir(bucket).sweep_log) == b"first run\nresumed\n"


@pytest.mark.parametrize("tool", ["sweep", "ladder"])
def test_a_workdir_that_cannot_be_written_is_one_line_before_any_point(gcs_emulator, tool,
                                                                       capsys):
  missing = "gs://tst-no-such-bucket-here/sweep"
  main = sweep.main if tool == "sweep" else ladder.main
  args = ["--config", TINY_CONFIG, "--workdir", missing,
          *(["--grid", "tst.ratio=0.5;tst.bag_size=2"] if tool == "sweep" else [])]
  with pytest.raises(SystemExit) as e:
    errors.main(main, args)
  err = capsys.readouterr()
  assert e.value.code == 2 and "training" not in err.out
  assert err.err == (f"error: --workdir {missing} cannot be written: no such bucket or "
                     "folder\n")


@pytest.mark.slow
def test_sweep_2x2_tables_match_metrics_and_rerun_skips(tmp_path, monkeypatch, capsys):
  expected = {"baseline_seed0": (0.0, 2)}
  expected.update({f"ratio{r}_bag_size{s}_seed0": (r, s) for r in (0.25, 0.5) for s in (2, 4)})
  _run_and_resume(tmp_path, "tst.ratio=0.25,0.5;tst.bag_size=2,4", expected, monkeypatch,
                  capsys)


def test_gpu_small_arms_set_the_tst_fields_at_equal_flops_per_step():
  gpu_small = os.path.join(ROOT, "configs", "gpu_small.py")
  expected = {  # arm -> (S, r, mode, reinit); S = 2 is the best measured at this scale
      "": (2, 0.3, "full", False), "tst": (2, 0.3, "full", False),
      "baseline": (2, 0.0, "full", False), "reinit": (2, 0.3, "full", True),
      "input_only": (2, 0.3, "input_only", False), "output_only": (2, 0.3, "output_only", False),
      "r1.0": (2, 1.0, "full", False), "s4": (4, 0.3, "full", False),
      "s8": (8, 0.3, "full", False), "r0.2": (2, 0.2, "full", False),
      "s4+r0.5": (4, 0.5, "full", False), "s8+r0.5": (8, 0.5, "full", False),
      "s4+reinit": (4, 0.3, "full", True)}
  base_plan = spec_lib.check(configlib.load_config(gpu_small + ":baseline")).plan
  assert [p.name for p in base_plan.phases] == ["ntp"] and base_plan.total_steps == 2000
  assert 33_000_000 < base_plan.params_total < 34_000_000
  per_step = base_plan.phases[0].flops_per_step
  for arm, (bag, ratio, mode, reinit) in expected.items():
    c = configlib.load_config(sweep.Point("p", {}, 0, False, arm).config_arg(gpu_small))
    assert (c.tst.bag_size, c.tst.ratio, c.tst.mode, c.tst.reinit_at_switch) == (
        bag, ratio, mode, reinit), arm
    assert (c.model.dim, c.model.n_layers, c.model.vocab_size, c.data.batch_size,
            c.data.seq_len, c.data.seed) == (512, 8, 8192, 64, 512, 0)
    plan = spec_lib.check(c).plan
    assert all(p.flops_per_step == per_step for p in plan.phases), arm     # equal FLOPs
    assert plan.phases[0].steps == (round(ratio * 2000) if ratio else 2000)
  assert configlib.load_config(gpu_small + ":baseline,4k").train.steps == 4000
  assert configlib.load_config(gpu_small + ":baseline,1.5k").train.steps == 1500
  with pytest.raises(ValueError, match="unknown arm 'r'"):
    configlib.load_config(gpu_small + ":r")


def test_set_of_a_field_an_arm_sets_is_one_line_before_anything(tmp_path, capsys):
  """`--set train.steps=30` with '<N>k' arms would give every arm 30 steps: refused, naming
  the override and the arm, before a point or the workdir is made."""
  workdir = tmp_path / "sweep"
  with pytest.raises(errors.ConfigError, match=r"^--set: train.steps=30 and the arm '0.045k' "
                     r"of .*gpu_small.py:baseline,0.045k both set train.steps: keep one"):
    sweep.main(["--config", os.path.join(ROOT, "configs", "gpu_small.py"), "--workdir",
                str(workdir), "--arms", "tst,baseline,baseline+0.045k", "--set",
                "train.steps=30", "--dry_run"])
  assert not workdir.exists() and not capsys.readouterr().out
  sweep.main(["--config", os.path.join(ROOT, "configs", "gpu_small.py"), "--workdir",
              str(workdir), "--arms", "tst,baseline", "--set", "train.steps=30", "--dry_run"])
  assert "tst_seed0" in capsys.readouterr().out      # no arm sets the steps: --set does


@pytest.mark.slow
def test_arms_in_parallel_share_one_tokenized_corpus_resume_and_record_failures(
    tmp_path, monkeypatch, capsys):
  args = ["--config", TINY_CONFIG, "--arms", "baseline,tst", "--seeds", "0,1", "--parallel", "2",
          "--workdir", str(tmp_path), "--set", "data.seed=0", *FAST]
  envs, real_popen = [], subprocess.Popen

  def popen(cmd, **kwargs):
    envs.append(kwargs["env"])
    return real_popen(cmd, **kwargs)
  monkeypatch.setattr(subprocess, "Popen", popen)
  assert sweep.main(args) == 0
  out = capsys.readouterr().out
  names = ["baseline_seed0", "baseline_seed1", "tst_seed0", "tst_seed1"]
  assert all(f"{n}: final eval loss" in out for n in names)
  assert len(envs) == 4 and all(e["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.450" and
                                e["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" for e in envs)
  # One token store (with its tokenizer), built once by the sweep: every point holds hard
  # links to its files, which the trainer found valid (a rebuilt store would be new files).
  shared = [p for p in os.listdir(tmp_path) if p.startswith("data_")]
  assert len(shared) == 1 and out.count("data prepared once") == 1
  store = tmp_path / shared[0] / "data"
  files = sorted(f for f in os.listdir(store) if (store / f).is_file())
  assert "manifest.json" in files and any(f.endswith(".bin") for f in files), files
  for name in files:
    inode = os.stat(store / name).st_ino
    assert all(os.stat(tmp_path / n / "data" / name).st_ino == inode for n in names)
  # The table: per arm, the mean and sd over seeds of each run's own final eval loss.
  result = json.loads((tmp_path / "results.json").read_text())
  finals = {n: json.loads((tmp_path / n / "summary.json").read_text())["final_eval_loss"]
            for n in names}
  for arm in result["arms"]:
    losses = [finals[f"{arm['arm']}_seed{s}"] for s in (0, 1)]
    assert arm["seeds"] == [0, 1]
    assert arm["final_loss"]["mean"] == pytest.approx(statistics.mean(losses))
    assert arm["final_loss"]["sd"] == pytest.approx(statistics.stdev(losses))
  assert [a["arm"] for a in result["arms"]] == ["baseline", "tst"]
  # Passes over the data: the data tokens each arm read over the store's training tokens.
  prepared = json.loads((tmp_path / shared[0] / "prepared.json").read_text())
  for arm in result["arms"]:
    assert arm["passes"] == pytest.approx(arm["data_tokens"] / prepared["train_tokens"])
  assert (tmp_path / "loss_vs_flops.png").stat().st_size > 0
  assert "| tst | 0.5 | 2 | 8 |" in (tmp_path / "results.md").read_text()
  # Rerun with one more arm whose trainer fails: finished points are skipped, the failure is
  # recorded, the table keeps the finished arms.
  failing = tmp_path / "fail.py"
  failing.write_text("import sys; sys.exit('boom')\n")
  monkeypatch.setattr(sweep.run, "_MAIN", str(failing))
  args[args.index("baseline,tst")] = "baseline,tst,r0.25"
  assert sweep.main(args) == 1
  out = capsys.readouterr().out
  assert out.count("finished, skipped") == 4 and out.count("FAILED") == 2
  result = json.loads((tmp_path / "results.json").read_text())
  assert [f["name"] for f in result["failed"]] == ["r0.25_seed0", "r0.25_seed1"]
  assert [a["arm"] for a in result["arms"]] == ["baseline", "tst"]


def test_the_table_counts_finished_points_brought_back_without_checkpoints(tmp_path, capsys):
  """Points finished on another machine (records only: no checkpoints, no token store, no
  sweep_point.json) are brought into W: nothing trains or tokenizes, the table holds their
  losses, and tst's Δ at equal FLOPs is its loss minus the same-length baseline's (2.0, not
  the longer baseline's 1.8 at its end). Bringing them again changes nothing."""
  back, work = tmp_path / "back", tmp_path / "w"
  losses = {"baseline": 2.0, "tst": 1.9, "baseline+0.024k": 1.8}
  for point in sweep.make_arm_points(list(losses), [0]):
    steps = 24 if "0.024k" in point.arm else 12
    write_point(str(back), TINY_CONFIG, point, [],
                {steps // 2: 3.0, steps: losses[point.arm]})
  args = ["--config", TINY_CONFIG, "--arms", ",".join(losses), "--seeds", "0",
          "--workdir", str(work), "--finished", str(back)]
  assert sweep.main(args) == 0
  out = capsys.readouterr().out
  assert "brought back from" in out and out.count("finished, skipped") == 3
  assert ": training (" not in out and "data prepared" not in out
  assert not any(n.startswith("data_") for n in os.listdir(work))
  result = json.loads((work / "results.json").read_text())
  arms = {a["arm"]: a for a in result["arms"]}
  assert {a: arms[a]["final_loss"]["mean"] for a in losses} == pytest.approx(losses)
  assert arms["tst"]["delta_equal_flops"]["mean"] == pytest.approx(1.9 - 2.0)
  assert "| tst |" in (work / "results.md").read_text()
  for name in os.listdir(work):
    if os.path.isdir(work / name) and not name.startswith("."):
      assert not any("checkpoint" in f for f in os.listdir(work / name)), name
  assert sweep.main(args) == 0
  assert "nothing new" in capsys.readouterr().out


def test_finished_points_are_brought_back_from_a_bucket(tmp_path, bucket):
  """--finished gs://...: the records of each finished point are copied out of the bucket."""
  back = fileio.join(bucket, "points")
  for point in sweep.make_arm_points(["baseline", "tst"], [0]):
    write_point(back, TINY_CONFIG, point, [], {6: 3.0, 12: 2.0})
  assert bring_back(back, str(tmp_path)) == ["baseline_seed0", "tst_seed0"]
  for name in ("baseline_seed0", "tst_seed0"):
    for member in RECORDS:
      assert fileio.read_bytes(getattr(RunDir(tmp_path / name), member)) == fileio.read_bytes(
          getattr(RunDir(fileio.join(back, name)), member))
    record = json.loads((tmp_path / name / "sweep_point.json").read_text())
    assert record["brought_from"] == fileio.join(back, name) and record["status"] == "done"
    assert workdir_lib.final_eval(RunDir(tmp_path / name), 12) == 2.0
  assert bring_back(back, str(tmp_path)) == []


def test_a_budget_the_points_cannot_meet_is_refused_in_one_line(tmp_path, capsys):
  """--budget_s: the unfinished points' plan FLOPs at --rate, plus the overheads, against the
  budget; over it, one line naming the rate, before anything runs."""
  plan = spec_lib.check(tiny_config()).plan
  args = ["--config", TINY_CONFIG, "--arms", "baseline,tst", "--seeds", "0,1", "--parallel",
          "2", "--workdir", str(tmp_path), "--dry_run", "--rate", str(plan.flops_total / 10)]
  need = 4 * 10 + 2 * sweep.OVERHEAD_S + 40.0    # 4 runs of 10 s, 2 waves, the corpus
  assert sweep.estimate_s([plan] * 4, 2, plan.flops_total / 10, sweep.OVERHEAD_S, 40.0) == \
      pytest.approx(need)
  with pytest.raises(SystemExit) as e:
    sweep.main(args + ["--budget_s", str(need - 1)])
  line = str(e.value)
  assert "\n" not in line and line.startswith("budget: 4 of 4 points to train")
  assert f"about {need:.0f} s of the {need - 1:.0f} s budget" in line and "FLOP/s" in line
  assert not os.listdir(tmp_path)
  assert sweep.main(args + ["--budget_s", str(need + 1)]) == 0
  assert f"about {need:.0f} s of the {need + 1:.0f} s budget" in capsys.readouterr().out
