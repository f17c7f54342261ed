"""tst_jax.data.mixture: the interleave against Grain's own MapDataset.mix, each entry's share
of the windows, each entry's stream continued across phases, exact resume, the weights of each
stage of data.mixture_stages and its bad values, and mixture runs, one of them in stages,
killed and resumed against the same run in one go."""

import json
import os
import re
import types

import grain
import numpy as np
import pytest

from tests.fixtures import trained
from tests.fixtures.tiny import tiny_config
from tst_jax.data import mixture, pipeline, prepare as prepare_lib, run_data, section
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import spec as spec_lib
from tst_jax.run import workdir as workdir_lib

WEIGHTS = [(0.7, 0.3), (0.5, 0.5), (0.2, 0.3, 0.5), (1 / 3, 2 / 3), (0.9, 0.05, 0.05)]


def phase(steps, batch_size, window, is_tst=False):
  """A phase as the mixture reads one (train.plan.Phase has these fields)."""
  return types.SimpleNamespace(steps=steps, batch_size=batch_size, window=window, is_tst=is_tst)


def data(mix, **fields):
  """config.data of the mixture `mix`, e.g. 's0=0.7,s1=0.3' of the sources of `streams`."""
  return section.Data(mixture=mix, **fields)


def streams(sizes):
  """In-memory streams whose tokens name their entry and position: entry i, position p is
  i * 10**9 + p."""
  return {f"s{i}": i * 10**9 + np.arange(n, dtype=np.int64) for i, n in enumerate(sizes)}


@pytest.mark.parametrize("weights", WEIGHTS)
def test_interleave_is_grains_mix_over_several_periods(weights):
  order = mixture.interleave(weights)
  n = len(weights)
  mixed = grain.MapDataset.mix([grain.MapDataset.range(i * 10**9, (i + 1) * 10**9)
                                for i in range(n)], order.per_period.tolist())
  slots = np.arange(3 * order.period + 17)
  entry, index = np.divmod(np.array([mixed[int(g)] for g in slots]), 10**9)
  got = order.select(slots)
  np.testing.assert_array_equal(got[0], entry)
  np.testing.assert_array_equal(got[1], index)
  np.testing.assert_array_equal(order.counts(len(slots)), np.bincount(entry, minlength=n))


def test_each_entry_gets_its_weight_of_a_million_training_tokens():
  """0.7/0.3 over 1M training tokens (B=16, W=65: 977 steps): each share within 1% of its
  weight, counted from the tokens themselves; batches equal a slow version that asks
  Grain's mix and the entry's WindowSource row by row."""
  splits = streams([300_000, 200_000])
  mix = mixture.RunMixture.of(data("s0=0.7,s1=0.3"), splits)
  phases = [phase(-(-1_000_000 // (16 * 64)), 16, 65)]
  batches = mix.batches(phases, 0, seed=3)
  entry_of_row = np.concatenate([next(batches)[:, 0] // 10**9 for _ in range(phases[0].steps)])
  share = np.bincount(entry_of_row) / len(entry_of_row)
  assert len(entry_of_row) * 64 >= 1_000_000
  np.testing.assert_allclose(share, [0.7, 0.3], rtol=0.01)
  order = mixture.interleave((0.7, 0.3))
  mixed = grain.MapDataset.mix([grain.MapDataset.range(0, 10**9),
                                grain.MapDataset.range(10**9, 2 * 10**9)],
                               order.per_period.tolist())
  windows = mix.windows(phases)[0]
  one_by_one = {s: pipeline.WindowSource(splits[s], 1, 65, 0, seed=3, num_batches=windows[s])
                for s in splits}
  again = mix.batches(phases, 0, seed=3)
  for k in range(40):
    slow = [one_by_one[f"s{e}"][i][0] for e, i in
            (divmod(mixed[k * 16 + r], 10**9) for r in range(16))]
    np.testing.assert_array_equal(next(again), np.stack(slow))


def test_resume_draws_the_same_batches_and_processes_split_the_rows():
  splits = streams([50_000, 40_000, 30_000])
  mix = mixture.RunMixture.of(data("s0=0.5,s1=0.25,s2=0.25"), splits)
  phases = [phase(30, 8, 17)]
  full = list(mix.batches(phases, 0, seed=1))
  assert len(full) == 30
  resumed = mix.batches(phases, 0, seed=1)
  resumed.set_state({**resumed.get_state(), "next_index": 11})
  np.testing.assert_array_equal(np.stack(list(resumed)), np.stack(full[11:]))
  halves = [list(mix.batches(phases, 0, seed=1, process_index=p, process_count=2))
            for p in range(2)]
  np.testing.assert_array_equal(np.concatenate([np.stack(h) for h in halves], axis=1),
                                np.stack(full))
  other = np.stack(list(mix.batches(phases, 0, seed=2)))
  assert not np.array_equal(other, np.stack(full))


def test_a_source_continues_where_the_earlier_phase_left_it():
  """Phase 1 reads s0 alone (data.tst_mixture), phase 2 mixes s0 and s1: s0's windows of both
  phases cover one region of its stream from 0, every token a target once, and s1's from 0."""
  splits = streams([100_000, 100_000])
  mix = mixture.RunMixture.of(data("s0=0.5,s1=0.5", tst_mixture="s0=1"), splits)
  phases = [phase(10, 4, 33, is_tst=True), phase(20, 4, 17)]
  assert mix.starts(phases, 1) == {"s0": 10 * 4 * 32, "s1": 0}
  targets = {"s0": [], "s1": []}
  for index, p in enumerate(phases):
    for batch in mix.batches(phases, index, seed=0):
      for row in batch:
        targets[f"s{row[0] // 10**9}"].append(row[1:] % 10**9)
  for source, read in mix.tokens_read(phases)[0].items():
    assert read == 10 * 4 * 32 and source == "s0"
  assert sum(map(len, targets["s0"])) == 10 * 4 * 32 + 40 * 16
  for source, got in targets.items():
    got = np.sort(np.concatenate(got))
    np.testing.assert_array_equal(got, np.arange(1, len(got) + 1))


STAGES = "0:s0=0.7,s1=0.3;60:s0=0.2,s1=0.3,s2=0.5;150:s2=1"


def staged_run(stages=STAGES):
  """Three streams mixed 0.5/0.3/0.2 in data.mixture, the training weights by `stages`; a tst
  phase of 100 steps (W = 33), then ntp (W = 17), rows of 16: the second stage spans the
  switch."""
  splits = streams([200_000, 200_000, 200_000])
  mix = mixture.RunMixture.of(data("s0=0.5,s1=0.3,s2=0.2", mixture_stages=stages), splits)
  return mix, [phase(100, 16, 33, is_tst=True), phase(100, 16, 17)]


def test_each_stage_gets_its_weights_and_each_source_reads_on_across_stages():
  """The entry of each window drawn, read from its tokens, counted per stage: each share
  within 1% of its stage's weight, a source a stage leaves out never drawn in it, the tokens
  per stage what the plan counts; each source's windows of both phases and all stages cover
  its stream from 0, every token a target once."""
  mix, phases = staged_run()
  stage_of_step = np.searchsorted([0, 60, 150], np.arange(200), side="right") - 1
  drawn = np.zeros((3, 3), np.int64)              # [stage, source] windows
  tokens = np.zeros((3, 3), np.int64)
  targets = {i: [] for i in range(3)}
  for index, p in enumerate(phases):
    for k, batch in enumerate(mix.batches(phases, index, seed=5)):
      entry = batch[:, 0] // 10**9
      stage = stage_of_step[index * 100 + k]
      np.add.at(drawn[stage], entry, 1)
      np.add.at(tokens[stage], entry, p.window - 1)
      for e, row in zip(entry, batch):
        targets[e].append(row[1:] % 10**9)
  weights = [[0.7, 0.3, 0], [0.2, 0.3, 0.5], [0, 0, 1]]
  np.testing.assert_allclose(drawn / drawn.sum(1, keepdims=True), weights, atol=0.01)
  assert drawn[0, 2] == 0 and drawn[2, :2].sum() == 0
  reads = mix.stage_reads(phases)
  assert [(r.stage.first_step, r.steps, r.phases) for r in reads] == [
      (0, 60, (0,)), (60, 90, (0, 1)), (150, 50, (1,))]
  np.testing.assert_array_equal([list(r.tokens.values()) for r in reads], tokens)
  for got in targets.values():
    got = np.sort(np.concatenate(got))
    np.testing.assert_array_equal(got, np.arange(1, len(got) + 1))


def test_stages_resume_exactly_and_one_stage_is_the_mixture_without_stages():
  """A phase resumed inside a stage, after a stage started within it, draws the batches of
  the phase in one go; one stage of data.mixture's own weights draws its batches."""
  mix, phases = staged_run()
  full = list(mix.batches(phases, 1, seed=2))
  resumed = mix.batches(phases, 1, seed=2)
  resumed.set_state({**resumed.get_state(), "next_index": 57})   # step 157: the third stage
  np.testing.assert_array_equal(np.stack(list(resumed)), np.stack(full[57:]))
  plain, _ = staged_run(stages="")
  same, _ = staged_run(stages="0:s0=5,s1=3,s2=2")
  for index in range(2):
    np.testing.assert_array_equal(np.stack(list(same.batches(phases, index, seed=2))),
                                  np.stack(list(plain.batches(phases, index, seed=2))))


def test_a_stage_names_a_source_by_its_short_name_or_in_full():
  main = mixture.parse("tokens:/data/tok/dclm=0.5,jsonl:/data/c4/*.jsonl.gz=0.3,"
                       "tokens:gs://b/fineweb/=0.2", "data.mixture")
  stages = mixture.stages("0:c4=1,dclm=3 ; 10:fineweb=1,tokens:/data/tok/dclm=1", main, "f")
  assert stages == (
      mixture.Stage(0, (mixture.Entry("tokens:/data/tok/dclm", 0.75),
                        mixture.Entry("jsonl:/data/c4/*.jsonl.gz", 0.25))),
      mixture.Stage(10, (mixture.Entry("tokens:/data/tok/dclm", 0.5),
                         mixture.Entry("tokens:gs://b/fineweb/", 0.5))))
  same = mixture.parse("tokens:/x/a=1,tokens:/y/a=1", "data.mixture")
  assert mixture.name_of("tokens:/x/a", [e.source for e in same]) == "tokens:/x/a"
  with pytest.raises(ConfigError, match="'a' names 2 sources of data.mixture: give one in full"):
    mixture.stages("0:a=1", same, "data.mixture_stages")


@pytest.mark.parametrize("stages,data_fields,message", [
    ("0:a=0.7,c=0.3", {}, "'c' is not a source of data.mixture: name one of 'a', 'b'"),
    ("0:a=0,b=1", {}, "must be '' or '<step>:name=weight"),
    ("0:a=-1,b=1", {}, "must be '' or '<step>:name=weight"),
    ("5:a=1", {}, "must be '' or '<step>:name=weight"),
    ("0:a=1;4:b=1;2:a=1", {}, "must be '' or '<step>:name=weight"),
    ("0:a=1;0:b=1", {}, "must be '' or '<step>:name=weight"),
    ("a=1", {}, "must be '' or '<step>:name=weight"),
    ("0:a=1,tokens:/d/a=1", {}, "the stage at step 0 names 'tokens:/d/a' twice"),
    ("0:a=1;8:b=1", {}, "the stage at step 8 starts after the run's last step"),
    ("0:a=1", dict(mixture=""), "needs data.mixture"),
    ("0:a=1", dict(tst_mixture="tokens:/d/a=1"), "data.tst_mixture would be ignored")])
def test_a_bad_stage_is_one_error_naming_its_field(stages, data_fields, message):
  config = tiny_config(steps=8, data={"mixture": "tokens:/d/a=0.5,tokens:/d/b=0.5",
                                      "mixture_stages": stages, **data_fields})
  with pytest.raises(ConfigError, match=re.escape(message)) as caught:
    spec_lib.check(config)
  assert caught.value.field == "data.mixture_stages"


def test_eval_rows_come_from_each_held_out_split_in_proportion():
  vals = streams([20_000, 20_000])
  mix = mixture.RunMixture.of(data("s0=0.75,s1=0.25"))
  windows = mix.eval_windows(vals, batch_size=8, window=33, num_batches=4)
  rows = np.concatenate(windows)
  assert rows.shape == (32, 33) and (np.bincount(rows[:, 0] // 10**9) == [24, 8]).all()
  for i in range(2):   # each entry's rows spread over its whole held-out split, in order
    starts = rows[rows[:, 0] // 10**9 == i, 0] % 10**9
    assert (np.diff(starts) > 0).all() and starts[-1] > 20_000 // 2


@pytest.mark.parametrize("text,message", [
    ("tokens:/a", "is not source=weight"), ("tokens:/a=0", "weight > 0"),
    ("tokens:/a=x", "weight > 0"), ("tokens:/a=1,tokens:/a=2", "each source once"),
    ("tokens:/a=1,tokens:/b=2000", "over 1000 times")])
def test_a_bad_mixture_names_its_field(text, message):
  with pytest.raises(ConfigError, match=message) as caught:
    mixture.parse(text, "data.mixture")
  assert caught.value.field == "data.mixture"


def test_weights_are_normalised():
  entries = mixture.parse("tokens:/d/a=7, tokens:/d/b=3", "data.mixture")
  assert [(e.source, e.weight) for e in entries] == [("tokens:/d/a", 0.7), ("tokens:/d/b", 0.3)]


# --- a run on a mixture ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
  """Two token stores of one tokenizer: stdlib modules, and prose."""
  root = tmp_path_factory.mktemp("mix")
  code = prepare_lib.prepare("builtin:pystdlib", str(root / "code"), vocab_size=300,
                             max_bytes=120_000, val_fraction=0.1, val_piece_bytes=2048,
                             workers=1, progress=False)
  os.makedirs(root / "prose")
  rng = np.random.default_rng(0)
  words = "the a of to and in is it that for on with as was at by an be this from".split()
  for i in range(60):
    (root / "prose" / f"{i}.txt").write_text(" ".join(rng.choice(words, 300)) + "\n")
  prose = prepare_lib.prepare(f"text:{root}/prose/*.txt", str(root / "prose_store"),
                              tokenizer=os.path.join(code, "tokenizer.json"), val_fraction=0.1,
                              val_piece_bytes=2048, workers=1, progress=False)
  return code, prose


def mixture_config(two_stores, **train):
  code, prose = two_stores
  return tiny_config(steps=8, data=dict(mixture=f"tokens:{code}=0.6,tokens:{prose}=0.4",
                                        tst_mixture=f"tokens:{prose}=1"),
                     train=dict(checkpoint_every=1, keep_checkpoints=20, eval_every=2, **train))


def _losses(workdir):
  return {r["step"]: r["loss"] for r in workdir_lib.read_metrics(RunDir(workdir))
          if "loss" in r}


@pytest.mark.slow
def test_a_mixture_run_resumed_logs_the_losses_of_one_in_one_go(two_stores, tmp_path, capsys):
  config = mixture_config(two_stores)
  cli.run(config, str(tmp_path))
  out = capsys.readouterr().out
  code, prose = two_stores
  assert f"data: tokens:{code} (weight tst S=2 0, ntp 0.6)" in out
  assert f"data: tokens:{prose} (weight tst S=2 1, ntp 0.4)" in out
  assert ("data: eval_bag_loss reads the held-out split of data.mixture, as eval_loss does, not "
          "data.tst_mixture's") in out
  record = json.loads((tmp_path / "plan.json").read_text())["data"]
  assert [s["source"] for s in record["sources"]] == [f"tokens:{prose}", f"tokens:{code}"]
  logged = _losses(tmp_path)
  assert sorted(logged) == list(range(1, 9))
  _check_the_bytes_under_the_held_out_rows(config, str(tmp_path))
  trained.kill_after(tmp_path, 3)
  cli.run(config, str(tmp_path))
  again = _losses(tmp_path)
  np.testing.assert_array_equal([again[k] for k in range(1, 9)],
                                [logged[k] for k in range(1, 9)])


def test_a_staged_run_resumed_inside_a_stage_logs_the_losses_of_one_in_one_go(
    two_stores, tmp_path, capsys):
  """Stages at steps 0, 2 and 6 of an 8-step run whose tst phase ends at step 4: the plan
  prints each stage's weight, tokens and passes per source and plan.json records them, and
  the run killed after step 5, inside the second stage and after the switch, logs the
  losses of the run in one go."""
  code, prose = two_stores
  config = mixture_config(two_stores)
  config.data.update(tst_mixture="", mixture_stages="0:prose_store=1;2:code=1,prose_store=1;"
                     "6:code=0.8,prose_store=0.2")
  cli.run(config, str(tmp_path))
  out = capsys.readouterr().out
  assert f"data: tokens:{code} (weight by stage 0, 0.5, 0.8): " in out
  stages = json.loads((tmp_path / "plan.json").read_text())["data"]["stages"]
  assert [(s["first_step"], s["steps"], s["phases"]) for s in stages] == [
      (0, 2, ["tst"]), (2, 4, ["tst", "ntp"]), (6, 2, ["ntp"])]
  code_rows, prose_rows = mixture.interleave((0.8, 0.2)).counts(2 * 4)
  assert [s["tokens"] for s in stages] == [   # tst windows of 32 tokens, ntp's of 16
      {f"tokens:{code}": 0, f"tokens:{prose}": 2 * 4 * 32},
      {f"tokens:{code}": 4 * 32 + 4 * 16, f"tokens:{prose}": 4 * 32 + 4 * 16},
      {f"tokens:{code}": code_rows * 16, f"tokens:{prose}": prose_rows * 16}]
  train = {s: len(TokenStore(s[len("tokens:"):]).train) for s in stages[0]["tokens"]}
  assert stages[1]["passes"] == {s: n / train[s] for s, n in stages[1]["tokens"].items()}
  assert (f"data: stage 2 from step 2 (4 steps of tst S=2 and ntp): code 0.5: 192 tokens, "
          f"{192 / train[f'tokens:{code}']:.3g} passes; prose_store 0.5: 192 tokens") in out
  logged = _losses(tmp_path)
  assert sorted(logged) == list(range(1, 9))
  trained.kill_after(tmp_path, 5)
  cli.run(config, str(tmp_path))
  again = _losses(tmp_path)
  np.testing.assert_array_equal([again[k] for k in range(1, 9)],
                                [logged[k] for k in range(1, 9)])


def _check_the_bytes_under_the_held_out_rows(config, workdir):
  """A mixture's held-out rows come with the bytes under each of their tokens, read from the
  store of the row's own source (a token of whole characters: the bytes of its text), and
  every eval logs eval_bpb."""
  data = run_data.prepare_data(spec_lib.check(config).data, RunDir(workdir), 512, (0, 1))
  rows = np.concatenate(data.eval_windows)
  under = np.concatenate(data.held_out.token_bytes(4, 17))
  pieces = [data.tokenizer.decode([t]) for t in rows.ravel().tolist()]
  want = [0 if t == data.tokenizer.eos_id else len(p.encode()) for t, p in
          zip(rows.ravel().tolist(), pieces)]
  whole = np.array(["\ufffd" not in p for p in pieces])
  assert (under.ravel()[whole] == np.array(want)[whole]).all() and whole.mean() > 0.9
  assert all(r["eval_bpb"] > 0 for r in workdir_lib.read_metrics(RunDir(workdir))
             if "eval_loss" in r)


def test_the_plan_warns_per_source_that_repeats(two_stores, capsys):
  code, prose = two_stores
  config = mixture_config(two_stores)
  config.train.steps = 2000
  cli.run(config, "", mode="plan")
  out = capsys.readouterr().out
  assert f"the run reads the training tokens of tokens:{prose}" in out
  assert f"the run reads the training tokens of tokens:{code}" not in out
  spec = spec_lib.check(config)
  tokens = run_data.training_tokens(spec.data)
  (_, n_prose, each_prose), (_, n_code, each_code) = tokens.passes(spec.plan)
  code_rows, prose_rows = mixture.interleave((0.6, 0.4)).counts(1000 * 4)   # ntp's rows
  assert sum(each_prose) * n_prose == pytest.approx(1000 * 4 * 32 + prose_rows * 16)  # + tst's
  assert sum(each_code) * n_code == pytest.approx(code_rows * 16)


def test_a_mixture_of_other_tokenizers_or_missing_stores_is_refused(two_stores, tmp_path):
  code, prose = two_stores
  config = mixture_config(two_stores)
  config.data.mixture = f"tokens:{code}=0.5,tokens:{tmp_path}/none=0.5"
  with pytest.raises(ConfigError, match="is not a token store") as caught:
    spec_lib.check(config).check_paths()
  assert caught.value.field == "data.mixture"
  config.data.mixture = f"tokens:{code}=0.5,text:{tmp_path}/*.txt=0.5"
  (tmp_path / "a.txt").write_text("some text to tokenize\n")
  with pytest.raises(ConfigError, match="each source would get its own bpe") as caught:
    spec_lib.check(config).check_paths()
  assert caught.value.field == "data.tokenizer"
  other = prepare_lib.prepare(f"text:{os.path.dirname(prose)}/prose/*.txt",
                              str(tmp_path / "other"), vocab_size=280, val_fraction=0.1,
                              val_piece_bytes=2048, workers=1, progress=False)
  config.data.mixture, config.data.tst_mixture = f"tokens:{code}=0.5,tokens:{other}=0.5", ""
  with pytest.raises(ConfigError, match="were made with different tokenizers"):
    run_data.prepare_data(spec_lib.check(config).data, RunDir(tmp_path / "w"), 512, (0, 1))


@pytest.fixture(scope="module")
def small_stores(two_stores, tmp_path_factory):
  """Two stores of the same 80 words of prose, of the tokenizer of `two_stores`: one whose
  held-out split holds one window of the tiny run's eval rows but not the three a 0.4 share
  reads, one whose training split is shorter than a window of 8-token bags."""
  code, _ = two_stores
  root = tmp_path_factory.mktemp("small")
  os.makedirs(root / "text")
  rng = np.random.default_rng(0)
  words = "the a of to and in is it that for on with as was at by an be this from".split()
  for i in range(8):
    (root / "text" / f"{i}.txt").write_text(" ".join(rng.choice(words, 10)) + "\n")
  return [prepare_lib.prepare(f"text:{root}/text/*.txt", str(root / name),
                              tokenizer=os.path.join(code, "tokenizer.json"),
                              val_fraction=fraction, val_piece_bytes=2048, workers=1,
                              progress=False) for name, fraction in (("val", 0.3), ("train", 0.5))]


def test_a_split_too_small_for_its_batches_is_one_error_naming_its_source(
    two_stores, small_stores, tmp_path):
  """A mixture's held-out split too small for its rows of the eval batches, a mixture's
  training split shorter than a window, and the same store read alone: one ConfigError each,
  from one guard, naming the source, its tokens and what would fit, before any checkpoint."""
  code, _ = two_stores
  small_val, small_train = small_stores
  val, train = len(TokenStore(small_val).val), len(TokenStore(small_train).train)
  assert 17 <= val < 3 * 17 and train < 8 * 16 + 1 <= len(TokenStore(small_train).val)
  cases = [
      (dict(mixture=f"tokens:{code}=0.6,tokens:{small_val}=0.4"), 2,
       f"config.data.mixture: tokens:{small_val}: its held-out split has {val} tokens, too few "
       "for its rows of 2 eval batches, 3 windows of 17 tokens (51): give "
       "data.eval_batches=1, data.batch_size=2 or more data"),
      (dict(mixture=f"tokens:{code}=0.6,tokens:{small_train}=0.4"), 8,
       f"config.data.mixture: tokens:{small_train}: its training split has {train} tokens, "
       "too few for the tst phase, 1 window of 129 tokens (129): give a shorter window "
       "(data.seq_len, tst.bag_size) or more data"),
      (dict(source=f"tokens:{small_train}", eval_batches=1, batch_size=2), 8,
       f"config.data.source: tokens:{small_train}: its training split has {train} tokens, "
       "too few for a tst batch, 2 windows of 129 tokens (258): give a shorter window "
       "(data.seq_len, tst.bag_size) or more data")]
  for k, (data, bag_size, message) in enumerate(cases):
    workdir = tmp_path / str(k)
    with pytest.raises(ConfigError) as caught:
      cli.run(tiny_config(steps=4, bag_size=bag_size, data=data), str(workdir))
    assert str(caught.value) == message
    assert not (workdir / "checkpoints").exists() and not (workdir / "config.json").exists()
