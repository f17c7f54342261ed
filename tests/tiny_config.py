"""The tiny test run as a config file, for subprocess tests: python main.py --config THIS."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.tiny import tiny_config  # noqa: E402


def get_config(arg=""):
  del arg
  return tiny_config()
