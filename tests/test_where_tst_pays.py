"""The plan's warning for runs where TST is expected to end behind its baseline: too short a
next-token phase, or a model as small as every one where TST ended behind."""

import os

import pytest

from tests.fixtures.paths import ROOT
from tst_jax.configlib import load_config
from tst_jax.train import cli, outlook, spec as spec_lib


def config(name, arg=""):
  return load_config(os.path.join(ROOT, "configs", f"{name}.py") + (f":{arg}" if arg else ""))


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
  plan = spec_lib.check(config(name, arg)).plan
  got = plan.ntp_tokens_per_param
  assert got == pytest.approx(tokens_per_param, rel=0.01) if tokens_per_param else got is None
  assert (outlook.BEHIND_WARNING in outlook.format_plan(plan)) == warned
  cli.run(config(name, arg), "", mode="plan")
  assert (outlook.BEHIND_WARNING in capsys.readouterr().out) == warned
