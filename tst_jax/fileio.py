"""Files written whole or not at all, so a reader such as a resumed run never sees half of one."""

from __future__ import annotations

import json
import os


def write_text(path: str, text: str):
  """Writes `text` to `path` through `path`.tmp and a rename."""
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def write_json(path: str, obj, *, sort_keys: bool = False, default=None):
  """Writes `obj` as indented JSON to `path` through `path`.tmp and a rename."""
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1, sort_keys=sort_keys, default=default)
  os.replace(path + ".tmp", path)
