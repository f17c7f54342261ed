"""The compare-and-swap writes of a workdir's lock (tst_jax/fileio/swap.py): create-if-absent,
write-if-unchanged and remove-if-unchanged hold on the local disk, in the GCS emulator's bucket
and in fsspec's memory store, against racers and on a disk without hard links."""

import os
import shutil
import time
import types

from tst_jax import fileio
from tst_jax.fileio import swap


def test_create_new_is_a_lock_and_remove_if_unchanged_takes_over_only_a_stale_one(root):
  fileio.makedirs(root)
  lock = fileio.join(root, "lock.json")
  assert swap.version(lock) is None
  assert swap.create_new(lock, '{"pid": 1}')
  assert not swap.create_new(lock, '{"pid": 2}')          # the holder's file is kept
  assert fileio.read_json(lock) == {"pid": 1}
  seen = swap.version(lock)
  assert seen is not None and swap.version(lock) == seen
  fileio.write_text(lock, '{"pid": 1, "renewed": true}')   # the holder renews: a new version
  assert swap.version(lock) != seen
  assert not swap.remove_if_unchanged(lock, seen)          # a live lock stays
  assert fileio.read_json(lock) == {"pid": 1, "renewed": True}
  assert swap.remove_if_unchanged(lock, swap.version(lock))   # a stale one goes
  assert not fileio.exists(lock) and not swap.remove_if_unchanged(lock, seen)
  assert swap.create_new(lock, b'{"pid": 3}') and fileio.read_json(lock) == {"pid": 3}
  assert fileio.listdir(root) == ["lock.json"]


def test_write_if_unchanged_never_overwrites_a_file_written_since_its_version(root):
  """A lock's holder renews it on the version it last wrote. Another run that removed and
  re-created the lock meanwhile keeps its own, and the holder learns it."""
  fileio.makedirs(root)
  lock = fileio.join(root, "lock.json")
  assert swap.create_new(lock, '{"pid": 1}')
  mine = swap.version(lock)
  renewed = swap.write_if_unchanged(lock, '{"pid": 1, "beat": 2}', mine)
  assert renewed is not None and renewed == swap.version(lock) != mine
  assert fileio.read_json(lock) == {"pid": 1, "beat": 2}
  assert swap.write_if_unchanged(lock, b'{"pid": 1, "beat": 3}', mine) is None   # stale
  assert swap.remove_if_unchanged(lock, renewed)             # another run takes over
  assert swap.write_if_unchanged(lock, '{"pid": 1, "beat": 3}', renewed) is None  # gone
  assert not fileio.exists(lock)
  assert swap.create_new(lock, '{"pid": 2}')
  assert swap.write_if_unchanged(lock, '{"pid": 1, "beat": 3}', renewed) is None
  assert fileio.read_json(lock) == {"pid": 2} and fileio.listdir(root) == ["lock.json"]


def test_a_rename_that_copies_the_file_keeps_its_version(tmp_path, monkeypatch):
  """gcsfuse renames a file by copying it, which gives it a new inode and time: a lock set
  aside to be compared is still the one that was read."""
  def copy_then_remove(src, dst):
    shutil.copyfile(src, dst)
    os.remove(src)

  monkeypatch.setattr(os, "rename", copy_then_remove)
  lock = str(tmp_path / "lock")
  assert swap.create_new(lock, "a")
  renewed = swap.write_if_unchanged(lock, "b", swap.version(lock))
  assert renewed is not None and fileio.read_text(lock) == "b"
  assert swap.remove_if_unchanged(lock, renewed) and os.listdir(tmp_path) == []


def test_a_local_lock_is_never_missing_while_its_holder_renews_it(tmp_path):
  """A run that starts while the holder renews the lock finds it there every time: it never
  creates one of its own, nor reads that there is none."""
  from concurrent.futures import ThreadPoolExecutor   # pylint: disable=import-outside-toplevel
  lock = str(tmp_path / "lock")
  assert swap.create_new(lock, "0")
  renewing = [True]

  def renew() -> int:
    beats, seen = 0, swap.version(lock)
    while renewing[0]:
      beats += 1
      seen = swap.write_if_unchanged(lock, str(beats), seen)
      assert seen is not None
    return beats

  with ThreadPoolExecutor(1) as pool:
    beats = pool.submit(renew)
    for _ in range(1000):
      assert not swap.create_new(lock, "another run") and swap.version(lock) is not None
    renewing[0] = False
    assert beats.result() > 10
  assert os.listdir(tmp_path) == ["lock"]


def test_a_local_lock_pinned_by_a_write_is_left_unless_its_writer_died(tmp_path, monkeypatch):
  """A holder's write pins the lock with a second hard link while it compares it: a run that
  would remove the lock leaves it. A pin that a killed process left stops nobody for long."""
  lock = str(tmp_path / "lock")
  assert swap.create_new(lock, "a")
  seen = swap.version(lock)
  os.link(lock, lock + ".0.pin")
  assert not swap.remove_if_unchanged(lock, seen) and fileio.read_text(lock) == "a"
  later = time.time() + 60
  monkeypatch.setattr(swap, "time", types.SimpleNamespace(time=lambda: later))
  assert swap.remove_if_unchanged(lock, seen) and os.listdir(tmp_path) == ["lock.0.pin"]


def test_create_new_lets_exactly_one_of_many_racers_win(tmp_path):
  from concurrent.futures import ThreadPoolExecutor   # pylint: disable=import-outside-toplevel
  lock = str(tmp_path / "lock")
  with ThreadPoolExecutor(8) as pool:
    won = list(pool.map(lambda i: swap.create_new(lock, str(i)), range(32)))
  assert sum(won) == 1 and fileio.read_text(lock) == str(won.index(True))


def test_create_new_without_hard_links_still_creates_only_once(tmp_path, monkeypatch):
  """A file system without hard links, as a gcsfuse mount: an exclusive create instead."""
  def no_links(src, dst):
    raise PermissionError(1, "Operation not permitted")
  monkeypatch.setattr(os, "link", no_links)
  lock = str(tmp_path / "lock")
  assert swap.create_new(lock, "a") and not swap.create_new(lock, "b")
  assert fileio.read_text(lock) == "a" and os.listdir(tmp_path) == ["lock"]
  seen = swap.version(lock)
  fileio.write_text(lock, "renewed")
  assert not swap.remove_if_unchanged(lock, seen) and fileio.read_text(lock) == "renewed"
  assert swap.write_if_unchanged(lock, "mine", seen) is None
  assert swap.write_if_unchanged(lock, "mine", swap.version(lock)) is not None
  assert fileio.read_text(lock) == "mine" and sorted(os.listdir(tmp_path)) == ["lock"]
