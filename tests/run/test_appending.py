"""Appending to a run's files (tst_jax/run/appending.py): written through locally; in a
bucket uploaded when due and at `flush`, by compose in GCS and by a rewrite elsewhere."""

import json

import pytest

from tst_jax import fileio
from tst_jax.run import appending


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


def test_a_compose_sent_again_after_its_answer_was_lost_joins_the_bytes_once(bucket,
                                                                             monkeypatch):
  """gcsfs sends a compose again when its answer is lost. GCS refuses the second one with
  HTTP 412 since the object's generation has moved past the one the compose names. The
  emulator ignores that precondition, so here the test plays GCS's part."""
  path = bucket + "/events"
  fileio.write_bytes(path, b"x")
  fs, name = fileio.filesystem(path)
  request = fs._request   # pylint: disable=protected-access

  async def answer_lost(method, url, *args, **kwargs):
    if not url.endswith("/compose"):
      return await request(method, url, *args, **kwargs)
    await request(method, url, *args, **kwargs)        # goes through, its answer never comes
    now = json.loads((await request("GET", "b/{}/o/{}", *args))[3])["generation"]
    if str(kwargs.get("ifGenerationMatch", now)) != now:
      raise FileExistsError(url)                       # gcsfs's error for HTTP 412
    return await request(method, url, *args, **kwargs)

  monkeypatch.setattr(fs, "_request", answer_lost)
  size = appending.append_object(fs, name, b"y")
  monkeypatch.undo()
  assert fileio.read_bytes(path) == b"xy" and size == 2


@pytest.mark.parametrize("step", ["create", "compose"])
def test_an_upload_that_raised_yet_went_through_is_not_sent_again(step, bucket, monkeypatch):
  """gcsfs gives up with an error though its last try went through: `flush` reports it as
  one PathError, and the next `flush` finds those bytes in the file and does not send them."""
  path = bucket + "/metrics.jsonl"
  if step == "compose":
    fileio.write_bytes(path, b"a\n")
  out = appending.Appender(path)
  out.write("b\n")
  fs, name = fileio.filesystem(path)
  real = {"create": fs.pipe_file, "compose": appending._compose}[step]   # pylint: disable=protected-access

  def through_then_raise(*args, **kwargs):
    real(*args, **kwargs)
    if name in args:       # the upload into the file itself, not a part's
      raise ConnectionError("no answer")

  monkeypatch.setattr(*((fs, "pipe_file") if step == "create" else (appending, "_compose")),
                      through_then_raise)
  with pytest.raises(fileio.PathError, match=r"/metrics.jsonl cannot be appended to: the store "
                     r"cannot be reached \(ConnectionError: no answer\)$"):
    out.flush()
  monkeypatch.undo()
  out.write("c\n")
  out.close()
  assert fileio.read_text(path) == ("a\n" if step == "compose" else "") + "b\nc\n"


def test_another_writer_is_one_error_and_its_bytes_stay(bucket):
  """Bytes this run did not write are found in the file: the upload stops with one line."""
  path = bucket + "/metrics.jsonl"
  out = appending.Appender(path)
  out.write("a\n")
  out.flush()
  fileio.write_text(path, "someone else\n")
  out.write("b\n")
  with pytest.raises(fileio.PathError, match="metrics.jsonl holds 13 bytes, not the 2 this run's "
                                             "uploads left: another writer changed it$"):
    out.flush()
  assert fileio.read_text(path) == "someone else\n"
