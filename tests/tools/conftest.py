"""The tools' tests run with every warning an error: a library's warning printed beside a tool's
table fails its test. DeprecationWarning stays a warning, since Python shows it to no user."""

import pathlib

import pytest

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
  for item in items:
    if HERE in item.path.parents:
      item.add_marker(pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"))
      item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning"))
      item.add_marker(pytest.mark.filterwarnings("error"))
