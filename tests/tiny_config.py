"""The tiny test run as a config file, for subprocess tests: python main.py --config THIS[:arm]."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.tiny import tiny_config  # noqa: E402
from tst_jax.train.defaults import apply_arms  # noqa: E402


def get_config(arg=""):
  return apply_arms(tiny_config(), arg, "tests/tiny_config.py")
