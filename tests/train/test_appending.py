"""Appending to a run's files (tst_jax/train/appending.py): written through locally; in a
bucket uploaded when due and at `flush`, by compose in GCS and by a rewrite elsewhere."""

import pytest

from tst_jax import fileio
from tst_jax.train import appending


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


@pytest.mark.parametrize("where", ["local", "gs", "memory"])
def test_lines_are_in_the_file_once_due_or_flushed(where, tmp_path, request):
  root = {"local": lambda: str(tmp_path),
          "gs": lambda: request.getfixturevalue("bucket"),
          "memory": lambda: f"memory://{tmp_path.name}"}[where]()
  path, clock = fileio.join(root, "metrics.jsonl"), _Clock()
  out = appending.Appender(path, every_s=10, clock=clock)
  out.write("a\n")
  assert fileio.read_text(path) == "a\n" if where == "local" else not fileio.exists(path)
  clock.now = 10
  out.write("b\n")                    # due: uploaded with the line before it
  assert fileio.read_text(path) == "a\nb\n"
  out.write("c\n")
  out.write(b"d\n")
  assert fileio.read_text(path) == ("a\nb\nc\nd\n" if where == "local" else "a\nb\n")
  out.flush()
  assert fileio.read_text(path) == "a\nb\nc\nd\n"
  with appending.Appender(path, clock=clock) as again:   # a resumed run appends to it
    again.write("e\n")
  assert fileio.read_text(path) == "a\nb\nc\nd\ne\n"
  out.close()
  assert fileio.listdir(root) == ["metrics.jsonl"]   # no part object left behind


def test_a_bucket_file_grows_by_compose_not_by_a_rewrite(bucket, monkeypatch):
  """GCS joins the new bytes to the object: the old bytes are never read or sent again."""
  path = bucket + "/events"
  appending.append_object(*fileio.filesystem(path), b"x" * 1000)
  fs, name = fileio.filesystem(path)
  sent, pipe = [], fs.pipe_file
  monkeypatch.setattr(fs, "cat_file", lambda *a, **k: pytest.fail("read the object back"))
  monkeypatch.setattr(fs, "pipe_file", lambda p, data, **k: sent.append(len(data)) or pipe(
      p, data, **k))
  appending.append_object(fs, name, b"y" * 10)
  monkeypatch.undo()
  assert sent == [10] and fileio.read_bytes(path) == b"x" * 1000 + b"y" * 10
