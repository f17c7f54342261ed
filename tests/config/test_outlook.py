"""The plan's outlook (tst_jax/config/outlook.py). Passes over the data: how many times each phase
and the run read the training tokens, and the plan's warning when they repeat. Where TST pays:
the warning for runs where TST is expected to end behind its baseline, too short a next-token
phase or a model as small as every one where TST ended behind."""

import os

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.tiny import tiny_config
from tst_jax.configlib import load_config
from tst_jax.data import prepare as prepare_lib, run_data, sources
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.config import outlook, spec as spec_lib

REPEATS = "warning: the data repeats"


def test_plan_of_a_long_run_on_a_short_corpus_warns_with_the_passes(capsys):
  # The case: the demo on 300 kB of the stdlib for 3000 steps (before tokenizing:
  # a bound from the text's bytes, so the passes are at least the printed ones).
  raw = _demo(max_bytes=300_000, steps=3000)
  config = spec_lib.check(raw)
  cli.run(raw, "", mode="plan")
  out = capsys.readouterr().out
  tokens = run_data.training_tokens(config.data)
  assert not tokens.exact and tokens.count == sources.token_bound("builtin:pystdlib", 300_000)
  total = config.plan.tokens_at(3000)["data_tokens"] / tokens.count
  assert total > 30
  assert f"{REPEATS}: the run reads its training tokens at least {total:.3g} times" in out
  assert f"at most {outlook.human(tokens.count)} training tokens" in out
  cli.run(_demo(), "", mode="plan")                  # the demo as shipped reads 0.68 of them
  assert REPEATS not in capsys.readouterr().out


def test_passes_count_a_stores_tokens_exactly(tmp_path):
  config = tiny_config(steps=40, ratio=0.5, bag_size=2)
  spec = spec_lib.check(config)
  store = tmp_path / "data"
  prepare_lib.prepare(out=str(store), workers=1, progress=False,
                      **run_data.store_request(spec.data, config.model.vocab_size))
  tokens = run_data.training_tokens(spec.data, RunDir(tmp_path))
  assert tokens.exact and tokens.count == len(run_data.TokenStore(str(store)).train)
  # The bound made before tokenizing holds: every token of both splits is within it.
  val = len(run_data.TokenStore(str(store)).val)
  assert tokens.count + val <= sources.token_bound(spec.data.source, spec.data.max_bytes)
  # 20 steps of 4 x 32 tokens (S = 2) then 20 of 4 x 16: each phase's share, and the sum.
  each = spec.plan.passes(tokens.count)
  assert each == pytest.approx([20 * 4 * 32 / tokens.count, 20 * 4 * 16 / tokens.count])
  text = outlook.format_plan(spec.plan, tokens=tokens)
  assert f"the run {sum(each):.3g}" in text and (REPEATS in text) == (sum(each) > 1)
  long = spec_lib.check(tiny_config(steps=4000)).plan
  assert REPEATS in outlook.format_plan(long, tokens=tokens)


def test_a_source_of_unknown_size_is_counted_when_tokenized(tmp_path):
  (tmp_path / "a.jsonl.gz").write_bytes(b"")
  config = tiny_config()
  config.data.source = f"jsonl:{tmp_path}/*.jsonl.gz"
  spec = spec_lib.check(config)
  assert run_data.training_tokens(spec.data) is None
  assert "counted once data.source is tokenized" in outlook.format_plan(spec.plan)


def _config(name, arg=""):
  """configs/<name>.py, with its `:arg` arms."""
  return load_config(os.path.join(ROOT, "configs", f"{name}.py") + (f":{arg}" if arg else ""))


def _demo(**data_and_train):
  config = _config("demo")
  if "max_bytes" in data_and_train:
    config.data.max_bytes = data_and_train["max_bytes"]
  if "steps" in data_and_train:
    config.train.steps = data_and_train["steps"]
  return config


@pytest.mark.slow
def test_max_passes_refuses_a_run_that_would_repeat_its_data_more(tmp_path, capsys):
  # 40 steps of the tiny run read 20 x 4 x 32 + 20 x 4 x 16 = 3,840 tokens of the store.
  config = tiny_config(steps=40, ratio=0.5, bag_size=2, train=dict(max_passes=0.01))
  with pytest.raises(ConfigError, match=r"config.train.max_passes: the run would read the "
                                        r"[\d,]+ training tokens of .* 0.0\d+ times, more than "
                                        r"0.01"):
    cli.run(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "checkpoints").exists()        # refused before training
  assert (tmp_path / "run" / "data" / "manifest.json").exists()   # the store is kept
  assert not (tmp_path / "run" / "config.json").exists()         # and no config of a run
  capsys.readouterr()
  cli.run(config, str(tmp_path / "run"), mode="plan")      # the plan, from that store, says so
  out = capsys.readouterr().out
  assert "warning: more than train.max_passes=0.01: the run will refuse to start" in out
  config.train.max_passes = 1.0                                   # it reads < 1 pass: trains
  assert cli.run(config, str(tmp_path / "run"))["steps"] == 40
  with pytest.raises(ConfigError, match="must be a number >= 0"):
    spec_lib.check(tiny_config(train=dict(max_passes=-1.0)))


@pytest.mark.parametrize("name, arg, warned, tokens_per_param", [
    ("demo", "", True, 210 * 16 * 128 / 1.84e6),        # 0.23: the demo ends behind
    ("demo", "smooth", True, 210 * 16 * 128 / 1.84e6),
    ("demo", "baseline", False, None),                   # nothing to compare
    ("cpu_ladder", "", True, 2800 * 8 * 64 / 328_256),  # 4.4, but 0.33M params: all behind
    ("gpu_small", "", False, 1400 * 64 * 512 / 33.6e6),  # 1.37: measured ahead by 0.05
    ("llama_270m", "", False, 14000 * 1024 * 2048 / 254e6),
])
def test_the_plan_warns_when_the_next_token_phase_is_too_short(name, arg, warned,
                                                               tokens_per_param, capsys):
  plan = spec_lib.check(_config(name, arg)).plan
  got = plan.ntp_tokens_per_param
  assert got == pytest.approx(tokens_per_param, rel=0.01) if tokens_per_param else got is None
  assert (outlook.BEHIND_WARNING in outlook.format_plan(plan)) == warned
  cli.run(_config(name, arg), "", mode="plan")
  assert (outlook.BEHIND_WARNING in capsys.readouterr().out) == warned


def test_the_small_model_rule_claims_nothing_past_the_longest_run_measured():
  """At most 1.84M parameters and no trend: warned up to 9.4 tokens per parameter, the
  longest measured there, and nothing said past it, where nothing was measured."""
  def warning(steps):
    plan = spec_lib.check(tiny_config(steps=steps, ratio=0.3)).plan
    return plan.tokens_per_param, outlook.behind_baseline_warning(plan, None)
  x, short = warning(100)
  assert x < outlook.BEHIND_MEASURED_TO and "measured up to 9.4 tokens per parameter" in short
  steps = 100 * round(2 * outlook.BEHIND_MEASURED_TO / x)
  x, long = warning(steps)
  assert x > outlook.BEHIND_MEASURED_TO and long is None
  plan = spec_lib.check(tiny_config(steps=steps, ratio=0.98)).plan   # past it, but almost
  assert plan.ntp_tokens_per_param < outlook.PAYS_FROM_NTP_TOKENS_PER_PARAM   # all phase 1
  assert "its next-token phase sees" in outlook.behind_baseline_warning(plan, None)
