"""Paths on the local disk and in object stores (tst_jax/fileio/): each function gives the same
contents on the local disk, in the GCS emulator's bucket and in fsspec's memory store; writes
are whole or not at all; a path that cannot be read or written is one error naming it and why."""

import json
import os
import re
import time
import uuid

import pytest

from tst_jax import fileio


def test_a_staged_file_arrives_whole_or_not_at_all(root):
  """A writer that needs a local file name, as safetensors' does, writes `path` through it."""
  fileio.makedirs(root)
  path = fileio.join(root, "model.safetensors")
  with fileio.staged(path) as local:
    assert not fileio.is_url(local) and not fileio.exists(path)
    with open(local, "wb") as f:
      f.write(b"weights")
  assert fileio.read_bytes(path) == b"weights" and not os.path.exists(local)
  with pytest.raises(KeyError):
    with fileio.staged(fileio.join(root, "half")) as local:
      with open(local, "wb") as f:
        f.write(b"half")
      raise KeyError("the writer failed")
  assert not fileio.exists(fileio.join(root, "half")) and not os.path.exists(local)
  assert fileio.listdir(root) == ["model.safetensors"]


def test_files_and_folders_read_back_what_was_written(root):
  fileio.makedirs(fileio.join(root, "a", "b"))
  fileio.write_text(fileio.join(root, "a", "b", "x.txt"), "héllo\n")
  fileio.write_json(fileio.join(root, "a", "plan.json"), {"b": 1, "a": [1, 2]}, sort_keys=True)
  fileio.write_bytes(fileio.join(root, "top.bin"), bytes(range(256)) * 4)
  with fileio.open(fileio.join(root, "a", "w.jsonl"), "w") as f:
    f.write('{"k": 1}\n')
  assert fileio.read_text(fileio.join(root, "a", "b", "x.txt")) == "héllo\n"
  text = fileio.read_text(fileio.join(root, "a", "plan.json"))
  assert json.loads(text) == {"a": [1, 2], "b": 1} and text.index('"a"') < text.index('"b"')
  assert fileio.read_json(fileio.join(root, "a", "w.jsonl")) == {"k": 1}
  assert fileio.getsize(fileio.join(root, "top.bin")) == 1024
  with fileio.open(fileio.join(root, "top.bin"), "rb") as f:     # a range read
    f.seek(300)
    assert f.read(3) == bytes([44, 45, 46])
  assert fileio.listdir(root) == ["a", "top.bin"]
  assert fileio.listdir(fileio.join(root, "a")) == ["b", "plan.json", "w.jsonl"]
  assert fileio.isdir(fileio.join(root, "a")) and not fileio.isfile(fileio.join(root, "a"))
  assert fileio.isfile(fileio.join(root, "top.bin")) and not fileio.isdir(fileio.join(root, "top.bin"))
  assert not fileio.exists(fileio.join(root, "nope")) and not fileio.isfile(fileio.join(root, "nope"))
  assert not [n for n in fileio.listdir(root) if n.endswith(".tmp")]      # nothing left aside


def test_glob_is_sorted_recursive_and_gives_sizes(root):
  for name, size in (("b/2.jsonl", 3), ("a.jsonl", 1), ("b/c/1.jsonl", 2), ("b/x.txt", 5)):
    fileio.makedirs(fileio.dirname(fileio.join(root, name)))
    fileio.write_bytes(fileio.join(root, name), b"z" * size)
  found = fileio.glob_files(fileio.join(root, "**", "*.jsonl"))
  assert found == {fileio.join(root, "a.jsonl"): 1, fileio.join(root, "b", "2.jsonl"): 3,
                   fileio.join(root, "b", "c", "1.jsonl"): 2}
  assert list(found) == sorted(found)
  assert fileio.glob(fileio.join(root, "b", "*")) == [
      fileio.join(root, "b", n) for n in ("2.jsonl", "c", "x.txt")]
  assert fileio.glob(fileio.join(root, "*.parquet")) == []

  assert fileio.any_file(fileio.join(root, "**", "*.txt"))
  assert not fileio.any_file(fileio.join(root, "*.parquet"))
  named = [fileio.join(root, n) for n in ("a.jsonl", "b/2.jsonl", "b/x.txt", "b/gone.txt")]
  assert fileio.sizes(named) == {named[0]: 1, named[1]: 3, named[2]: 5}   # one listing a folder


def test_a_folder_is_uploaded_and_an_empty_local_one_removed(root, tmp_path):
  """A local folder goes into a store whole (a profile's trace), and a folder left empty
  goes with its last file: on the disk it is removed, in a store it has no other being."""
  (tmp_path / "trace" / "x").mkdir(parents=True)
  (tmp_path / "trace" / "x" / "a.pb").write_bytes(b"abc")
  if fileio.local_path(root) is None:
    fileio.upload_folder(str(tmp_path / "trace"), fileio.join(root, "profile"))
    assert fileio.read_bytes(fileio.join(root, "profile", "x", "a.pb")) == b"abc"
    assert not (tmp_path / "trace").exists()
  fileio.makedirs(root)
  fileio.write_text(fileio.join(root, "f"), "x")
  before = time.time()
  assert abs(fileio.mtime(fileio.join(root, "f")) - before) < 60
  fileio.remove_empty_folder(root)
  assert fileio.exists(fileio.join(root, "f"))             # not empty: kept
  fileio.remove(fileio.join(root, "f"))
  fileio.remove_empty_folder(root)
  assert not fileio.exists(fileio.join(root, "f"))
  assert fileio.local_path(root) is None or not os.path.exists(root)


def test_remove_and_rmtree_and_no_append_in_a_store(root):
  path = fileio.join(root, "metrics.jsonl")
  fileio.makedirs(root)
  fileio.write_text(path, "1\n2\n")
  if fileio.is_url(root):
    with pytest.raises(ValueError, match="cannot append"):
      fileio.open(path, "a")
  fileio.remove(path)
  assert not fileio.exists(path)
  with pytest.raises(FileNotFoundError):
    fileio.remove(path)
  fileio.makedirs(fileio.join(root, "d", "e"))
  fileio.write_text(fileio.join(root, "d", "e", "f"), "x")
  fileio.write_text(fileio.join(root, "keep"), "y")
  fileio.rmtree(fileio.join(root, "d"))
  fileio.rmtree(fileio.join(root, "never"))
  assert fileio.listdir(root) == ["keep"]


def test_write_json_replaces_whole_or_leaves_the_old_file(root):
  fileio.makedirs(root)
  path = fileio.join(root, "plan.json")
  fileio.write_json(path, {"a": 1})
  text = fileio.read_text(path)

  class Unwritable:
    pass
  with pytest.raises(TypeError):
    fileio.write_json(path, {"z": 1, "obj": Unwritable()})
  assert fileio.read_text(path) == text     # the reader still sees the old file, whole
  fileio.write_json(path, {"obj": Unwritable()}, default=lambda o: "unwritable")
  assert fileio.read_json(path) == {"obj": "unwritable"}
  assert fileio.listdir(root) == ["plan.json"]


def test_local_write_that_fails_half_way_leaves_the_old_file(tmp_path, monkeypatch):
  path = str(tmp_path / "plan.json")
  fileio.write_json(path, {"a": 1})
  real_replace = os.replace
  monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "full")))
  with pytest.raises(OSError):
    fileio.write_json(path, {"a": 2})
  monkeypatch.setattr(os, "replace", real_replace)
  assert fileio.read_json(path) == {"a": 1}


def test_check_readable_and_writable_name_the_path_and_the_reason(root, tmp_path):
  fileio.makedirs(root)
  fileio.write_text(fileio.join(root, "there"), "x")
  fileio.check_readable(fileio.join(root, "there"), "data.source")
  fileio.check_writable(fileio.join(root, "run"), "--workdir")
  assert fileio.listdir(root) == ["there"]                 # the probe is gone
  missing = fileio.join(root, "nope")
  with pytest.raises(fileio.PathError, match=f"^data.source {missing} does not exist$"):
    fileio.check_readable(missing, "data.source")
  if not fileio.is_url(root):
    with pytest.raises(fileio.PathError, match="is a file, not a folder"):
      fileio.check_writable(fileio.join(root, "there", "run"), "--workdir")


def test_a_missing_bucket_is_named(bucket):
  missing = "gs://no-such-bucket-" + uuid.uuid4().hex[:8]
  with pytest.raises(fileio.PathError, match=f"does not exist \\(there is no bucket {missing}\\)"):
    fileio.check_readable(missing + "/store", "data.source")
  with pytest.raises(fileio.PathError, match=f"--workdir {missing}/run cannot be written: no such"):
    fileio.check_writable(missing + "/run", "--workdir")


def test_local_paths_stay_plain_and_urls_are_recognised():
  assert fileio.is_url("gs://b/x") and fileio.is_url("hf://datasets/a/b") and fileio.is_url(
      "memory://x") and not fileio.is_url("/tmp/x") and not fileio.is_url("rel/gs:/x")
  assert fileio.join("gs://b", "run", "x.json") == "gs://b/run/x.json"
  assert fileio.join("/a", "b") == os.path.join("/a", "b")
  assert fileio.absolute("gs://b/x") == "gs://b/x" and fileio.absolute("~/x") == os.path.expanduser("~/x")
  assert fileio.basename("gs://b/run/") == "run" and fileio.dirname("gs://b/run/x") == "gs://b/run"
  assert fileio.expanduser("~/x") == os.path.expanduser("~/x") and fileio.expanduser("x") == "x"
  assert fileio.expanduser("gs://b/~x") == "gs://b/~x"
  assert fileio.local_path("~/x") == os.path.expanduser("~/x")
  assert fileio.local_path("x") == os.path.abspath("x") and fileio.local_path("gs://b/x") is None


def test_a_glob_is_checked_up_to_its_first_wildcard(root):
  fileio.makedirs(fileio.join(root, "data"))
  fileio.write_text(fileio.join(root, "data", "a.jsonl"), "{}")
  fileio.check_readable(fileio.join(root, "data", "**", "*.jsonl"), "data.source")
  pattern = fileio.join(root, "nope", "*.jsonl")
  line = f"data.source {pattern}: {fileio.join(root, 'nope')} does not exist"
  with pytest.raises(fileio.PathError, match=f"^{re.escape(line)}$"):
    fileio.check_readable(pattern, "data.source")
  if fileio.local_path(root) is None:       # a store says why it hides a file
    with pytest.raises(fileio.PathError, match=f"^{re.escape(line)}$"):
      fileio.check_reachable(pattern, "data.source")
  else:                                     # the disk hides nothing: the caller says it
    fileio.check_reachable(pattern, "data.source")


@pytest.mark.slow
def test_the_emulator_serves_thousands_of_requests(bucket):
  """The server's request log goes to a file: a pipe nobody reads would stop it after ~64 KiB."""
  path = fileio.join(bucket, "x")
  for i in range(1500):         # about 15 s on the 2-core machine
    fileio.write_text(path, str(i))
  assert fileio.read_text(path) == "1499"


def test_a_whole_file_read_is_one_version_of_an_object_rewritten_meanwhile(bucket, monkeypatch):
  """A lock's heartbeat rewrites it while another run reads it: a read that looked up the size
  before the rewrite and fetched the bytes after would give the new text cut to the old
  length. Here the rewrite lands right after every size lookup."""
  path = bucket + "/lock.json"
  fileio.write_json(path, {"heartbeat": 1.5})
  fs, _ = fileio.filesystem(path)
  info = fs.info

  def info_then_rewrite(*args, **kwargs):
    seen = info(*args, **kwargs)
    fileio.write_json(path, {"heartbeat": 1795654055.3048418})
    return seen

  monkeypatch.setattr(fs, "info", info_then_rewrite)
  assert fileio.read_json(path)["heartbeat"] in (1.5, 1795654055.3048418)
  with pytest.raises(ValueError):     # what a ranged read after a size lookup gives
    with fileio.open(path, "r") as f:
      json.loads(f.read())


def test_a_file_url_globs_to_the_names_that_join_gives(tmp_path):
  """A store at tokens:file:///... finds its shards by these names."""
  root = "file://" + str(tmp_path)
  fileio.write_bytes(fileio.join(root, "a.bin"), b"xy")
  assert fileio.glob_files(fileio.join(root, "*.bin")) == {fileio.join(root, "a.bin"): 2}
