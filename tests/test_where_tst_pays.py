"""The plan's warning for runs too short for TST to end ahead of its baseline."""

import os

import pytest

from tst_jax.configlib import load_config
from tst_jax.train import cli, plan as plan_lib, spec as spec_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(name, arg=""):
  return load_config(os.path.join(ROOT, "configs", f"{name}.py") + (f":{arg}" if arg else ""))


@pytest.mark.parametrize("name, arg, warned, tokens_per_param", [
    ("demo", "", True, 210 * 16 * 128 / 1.84e6),        # 0.23: the demo ends behind
    ("demo", "smooth", True, 210 * 16 * 128 / 1.84e6),
    ("demo", "baseline", False, None),                   # nothing to compare
    ("gpu_small", "", False, 1400 * 64 * 512 / 33.6e6),  # 1.37: measured ahead by 0.05
    ("llama_270m", "", False, 14000 * 1024 * 2048 / 254e6),
])
def test_the_plan_warns_when_the_next_token_phase_is_too_short(name, arg, warned,
                                                               tokens_per_param, capsys):
  plan = spec_lib.check(config(name, arg)).plan
  got = plan.ntp_tokens_per_param
  assert got == pytest.approx(tokens_per_param, rel=0.01) if tokens_per_param else got is None
  assert (plan_lib.BEHIND_WARNING in plan_lib.format_plan(plan)) == warned
  cli.run(config(name, arg), "", mode="plan")
  assert (plan_lib.BEHIND_WARNING in capsys.readouterr().out) == warned
