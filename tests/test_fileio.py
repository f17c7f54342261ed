"""Paths on the local disk and in object stores (tst_jax/fileio/): each function gives the same
contents on the local disk, in the GCS emulator's bucket and in fsspec's memory store; writes
are whole or not at all; the lock's create-if-absent, write-if-unchanged and
remove-if-unchanged hold; a path that cannot be read or written is one error naming it and why."""

import json
import os
import re
import shutil
import time
import types
import uuid

import fsspec
import pytest

from tst_jax import fileio


@pytest.fixture(params=["local", "gcs", "memory"])
def root(request, tmp_path):
  """A fresh empty folder: local, in a new emulator bucket, or in fsspec's memory store."""
  if request.param == "local":
    return str(tmp_path / "root")
  if request.param == "gcs":
    return request.getfixturevalue("bucket") + "/root"
  return f"memory://tst-{uuid.uuid4().hex[:8]}/root"


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


def test_create_new_is_a_lock_and_remove_if_unchanged_takes_over_only_a_stale_one(root):
  fileio.makedirs(root)
  lock = fileio.join(root, "lock.json")
  assert fileio.version(lock) is None
  assert fileio.create_new(lock, '{"pid": 1}')
  assert not fileio.create_new(lock, '{"pid": 2}')          # the holder's file is kept
  assert fileio.read_json(lock) == {"pid": 1}
  seen = fileio.version(lock)
  assert seen is not None and fileio.version(lock) == seen
  fileio.write_text(lock, '{"pid": 1, "renewed": true}')   # the holder renews: a new version
  assert fileio.version(lock) != seen
  assert not fileio.remove_if_unchanged(lock, seen)          # a live lock stays
  assert fileio.read_json(lock) == {"pid": 1, "renewed": True}
  assert fileio.remove_if_unchanged(lock, fileio.version(lock))   # a stale one goes
  assert not fileio.exists(lock) and not fileio.remove_if_unchanged(lock, seen)
  assert fileio.create_new(lock, b'{"pid": 3}') and fileio.read_json(lock) == {"pid": 3}
  assert fileio.listdir(root) == ["lock.json"]


def test_write_if_unchanged_never_overwrites_a_file_written_since_its_version(root):
  """A lock's holder renews it on the version it last wrote. Another run that removed and
  re-created the lock meanwhile keeps its own, and the holder learns it."""
  fileio.makedirs(root)
  lock = fileio.join(root, "lock.json")
  assert fileio.create_new(lock, '{"pid": 1}')
  mine = fileio.version(lock)
  renewed = fileio.write_if_unchanged(lock, '{"pid": 1, "beat": 2}', mine)
  assert renewed is not None and renewed == fileio.version(lock) != mine
  assert fileio.read_json(lock) == {"pid": 1, "beat": 2}
  assert fileio.write_if_unchanged(lock, b'{"pid": 1, "beat": 3}', mine) is None   # stale
  assert fileio.remove_if_unchanged(lock, renewed)             # another run takes over
  assert fileio.write_if_unchanged(lock, '{"pid": 1, "beat": 3}', renewed) is None  # gone
  assert not fileio.exists(lock)
  assert fileio.create_new(lock, '{"pid": 2}')
  assert fileio.write_if_unchanged(lock, '{"pid": 1, "beat": 3}', renewed) is None
  assert fileio.read_json(lock) == {"pid": 2} and fileio.listdir(root) == ["lock.json"]


def test_a_rename_that_copies_the_file_keeps_its_version(tmp_path, monkeypatch):
  """gcsfuse renames a file by copying it, which gives it a new inode and time: a lock set
  aside to be compared is still the one that was read."""
  def copy_then_remove(src, dst):
    shutil.copyfile(src, dst)
    os.remove(src)

  monkeypatch.setattr(os, "rename", copy_then_remove)
  lock = str(tmp_path / "lock")
  assert fileio.create_new(lock, "a")
  renewed = fileio.write_if_unchanged(lock, "b", fileio.version(lock))
  assert renewed is not None and fileio.read_text(lock) == "b"
  assert fileio.remove_if_unchanged(lock, renewed) and os.listdir(tmp_path) == []


def test_a_local_lock_is_never_missing_while_its_holder_renews_it(tmp_path):
  """A run that starts while the holder renews the lock finds it there every time: it never
  creates one of its own, nor reads that there is none."""
  from concurrent.futures import ThreadPoolExecutor   # pylint: disable=import-outside-toplevel
  lock = str(tmp_path / "lock")
  assert fileio.create_new(lock, "0")
  renewing = [True]

  def renew() -> int:
    beats, seen = 0, fileio.version(lock)
    while renewing[0]:
      beats += 1
      seen = fileio.write_if_unchanged(lock, str(beats), seen)
      assert seen is not None
    return beats

  with ThreadPoolExecutor(1) as pool:
    beats = pool.submit(renew)
    for _ in range(1000):
      assert not fileio.create_new(lock, "another run") and fileio.version(lock) is not None
    renewing[0] = False
    assert beats.result() > 10
  assert os.listdir(tmp_path) == ["lock"]


def test_a_local_lock_pinned_by_a_write_is_left_unless_its_writer_died(tmp_path, monkeypatch):
  """A holder's write pins the lock with a second hard link while it compares it: a run that
  would remove the lock leaves it. A pin that a killed process left stops nobody for long."""
  lock = str(tmp_path / "lock")
  assert fileio.create_new(lock, "a")
  seen = fileio.version(lock)
  os.link(lock, lock + ".0.pin")
  assert not fileio.remove_if_unchanged(lock, seen) and fileio.read_text(lock) == "a"
  later = time.time() + 60
  monkeypatch.setattr(fileio, "time", types.SimpleNamespace(time=lambda: later))
  assert fileio.remove_if_unchanged(lock, seen) and os.listdir(tmp_path) == ["lock.0.pin"]


def test_create_new_lets_exactly_one_of_many_racers_win(tmp_path):
  from concurrent.futures import ThreadPoolExecutor   # pylint: disable=import-outside-toplevel
  lock = str(tmp_path / "lock")
  with ThreadPoolExecutor(8) as pool:
    won = list(pool.map(lambda i: fileio.create_new(lock, str(i)), range(32)))
  assert sum(won) == 1 and fileio.read_text(lock) == str(won.index(True))


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


@pytest.mark.parametrize("name", ["b1", "Bucket", "-abc", "abc-", "a..b", "ab.-c", "a" * 64,
                                  "x" * 63 + "." + "y" * 63 + "." + "z" * 95, "a b", ""])
def test_a_bucket_name_gcs_refuses_is_one_line_naming_the_rule(name):
  """TensorStore refuses such a name only once a checkpoint is written."""
  with pytest.raises(fileio.PathError, match=f"^--workdir gs://{re.escape(name)}/run: "
                     f"'{re.escape(name)}' is not a GCS bucket name: 3 to 63 lowercase"):
    fileio.check_output(f"gs://{name}/run", "--workdir", "a run's workdir", fileio.RUN_STORES)
  with pytest.raises(fileio.PathError, match=f"^gs://{re.escape(name)}/x: '"):
    fileio.exists(f"gs://{name}/x")


@pytest.mark.parametrize("name", ["abc", "my-bucket_1", "a.b.c", "0" * 63, "a" * 63 + ".b"])
def test_a_bucket_name_gcs_takes_passes(name):
  fileio.check_bucket_name(f"gs://{name}/run", "--workdir")
  fileio.check_bucket_name(f"s3://{name.upper()}/run", "--out")   # S3 has its own rule


class _Refusing(fsspec.AbstractFileSystem):
  """A store whose every call fails as a real one does without credentials or permission."""
  protocol = "refusing"
  error = PermissionError

  def info(self, path, **kwargs):
    raise self.error("no")

  def pipe_file(self, path, value, mode="overwrite", **kwargs):
    raise self.error("no")


class DefaultCredentialsError(Exception):
  """Named as google.auth's is."""


@pytest.mark.parametrize("error,reason", [
    (PermissionError, "permission denied$"),
    (OSError("Forbidden: b/x"), "permission denied$"),
    (DefaultCredentialsError, r"no credentials \(DefaultCredentialsError\)$")])
def test_refusals_are_one_line_with_the_reason(monkeypatch, error, reason):
  monkeypatch.setattr(_Refusing, "error", error if isinstance(error, type) else
                      lambda *_: error)
  fsspec.register_implementation("refusing", _Refusing, clobber=True)
  with pytest.raises(fileio.PathError, match="^data.source refusing://b/x cannot be read: "
                     + reason):
    fileio.check_readable("refusing://b/x", "data.source")
  with pytest.raises(fileio.PathError, match="^--workdir refusing://b/run cannot be written: "
                     + reason):
    fileio.check_writable("refusing://b/run", "--workdir")


def test_gs_credentials_reason_says_how_to_log_in():
  assert "gcloud auth application-default login" in fileio.reason(   # pylint: disable=protected-access
      DefaultCredentialsError(), "gs://b/x")


def test_a_store_without_its_package_names_the_package(monkeypatch):
  def url_to_fs(url, **kwargs):
    raise ImportError("Install s3fs to access S3")
  monkeypatch.setattr(fsspec.core, "url_to_fs", url_to_fs)
  with pytest.raises(fileio.PathError, match=r"s3://b/x: s3:// paths need s3fs: pip install "
                     r"'tst-jax\[s3\]'"):
    fileio.check_readable("s3://b/x", "data.source")


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


def test_create_new_without_hard_links_still_creates_only_once(tmp_path, monkeypatch):
  """A file system without hard links, as a gcsfuse mount: an exclusive create instead."""
  def no_links(src, dst):
    raise PermissionError(1, "Operation not permitted")
  monkeypatch.setattr(os, "link", no_links)
  lock = str(tmp_path / "lock")
  assert fileio.create_new(lock, "a") and not fileio.create_new(lock, "b")
  assert fileio.read_text(lock) == "a" and os.listdir(tmp_path) == ["lock"]
  seen = fileio.version(lock)
  fileio.write_text(lock, "renewed")
  assert not fileio.remove_if_unchanged(lock, seen) and fileio.read_text(lock) == "renewed"
  assert fileio.write_if_unchanged(lock, "mine", seen) is None
  assert fileio.write_if_unchanged(lock, "mine", fileio.version(lock)) is not None
  assert fileio.read_text(lock) == "mine" and sorted(os.listdir(tmp_path)) == ["lock"]


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
