"""Files written whole or not at all (tst_jax/fileio.py): a write that fails half way leaves
the file as it was, and a reader sees either the old JSON or the new."""

import json

import pytest

from tst_jax import fileio


def test_write_json_replaces_whole_or_leaves_the_old_file(tmp_path):
  path = str(tmp_path / "plan.json")
  fileio.write_json(path, {"b": 1, "a": [1, 2]}, sort_keys=True)
  text = open(path).read()
  assert json.loads(text) == {"a": [1, 2], "b": 1} and text.index('"a"') < text.index('"b"')
  assert not (tmp_path / "plan.json.tmp").exists()

  class Unwritable:
    pass
  with pytest.raises(TypeError):            # fails after part of the JSON went to the .tmp file
    fileio.write_json(path, {"z": 1, "obj": Unwritable()})
  assert open(path).read() == text          # the reader still sees the old file, whole
  fileio.write_json(path, {"obj": Unwritable()}, default=lambda o: "unwritable")
  assert json.loads(open(path).read()) == {"obj": "unwritable"}
