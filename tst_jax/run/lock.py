"""The lock of a workdir: which live run holds it, on a local disk or in a bucket.

A file created only if absent is the whole protocol, so a bucket's create-if-absent write holds
a workdir there the same way as a hard link does on a disk, and a dead run's lock is removed
only if unchanged since it was read: by its generation or ETag in a bucket. The holder rewrites
its heartbeat from a thread: steps, checkpoints and logs can be hours apart while a store is
prepared or a step compiles, and one small write every LOCK_BEAT_S costs nothing. Each rewrite
is conditional on the holder's own last one, so it never overwrites a lock that another run
took. A holder that lost its lock, or wrote no heartbeat for LOCK_GIVE_UP_S, stops at its next
step, where the loop calls `Lock.check`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

from tst_jax import fileio
from tst_jax.fileio import swap
from tst_jax.errors import WorkdirError
from tst_jax.rundir import RunDir

log = logging.getLogger("tst_jax")

LOCK_BEAT_S = 30.0
LOCK_STALE_S = 300.0   # a heartbeat this old is a dead run's, whatever its host
LOCK_GIVE_UP_S = 200.0   # the holder's own limit: it stops well before others may take over
_ABANDONED = set()       # the tokens of this process's locks left behind by `Lock.abandon`


class Lock:
  """The workdir's lock while this process holds it: `Lock.take`, then `release`."""

  def __init__(self, rundir: RunDir, record: dict, made_workdir: bool = False):
    self.rundir, self.file, self.record = rundir, rundir.lock, record
    self.made_workdir = made_workdir
    self.version = swap.version(self.file)   # of this process's last write: the next is on it
    self.lost, self.failure = "", ""      # why this run no longer holds it; the last beat's error
    self._stop = threading.Event()
    self._beat = threading.Thread(target=self._renew, name="tst_jax-lock", daemon=True)
    self._beat.start()

  @classmethod
  def take(cls, rundir: RunDir, say=print) -> Lock:
    """Takes the lock of `rundir`, over a dead run's with a line that says so. A live run's
    lock raises WorkdirError naming its holder."""
    made_workdir = not fileio.exists(rundir.root)
    fileio.makedirs(rundir.root)
    file = rundir.lock
    record = dict(host=socket.gethostname(), pid=os.getpid(), token=uuid.uuid4().hex,
                  started=_utc_now(), heartbeat=time.time())
    for _ in range(3):   # another process may take or free it between two looks
      if swap.create_new(file, json.dumps(record)):
        return cls(rundir, record, made_workdir)
      seen, held = _look(file)
      if held is None or seen is None:
        continue
      if held.get("token") == record["token"]:   # a retried create whose first try went through
        return cls(rundir, record, made_workdir)
      dead = _dead(held)
      if not dead:
        raise WorkdirError(f"--workdir {rundir}: a live run holds it: {_holder(held)} "
                           f"({file}); wait for it to end, stop it, or use another --workdir")
      if swap.remove_if_unchanged(file, seen):
        say(f"taking over {file} from a dead run: {_holder(held)}, {dead}")
    raise WorkdirError(f"--workdir {rundir}: {file} keeps changing: another run is starting "
                       "in this workdir; use another --workdir")

  def check(self):
    """Raises WorkdirError where this run may no longer hold its workdir: its lock was taken
    over or removed, or no heartbeat was written for LOCK_GIVE_UP_S."""
    age = time.time() - self.record["heartbeat"]
    lost = self.lost or (age > LOCK_GIVE_UP_S and f"no heartbeat could be written to it for "
                         f"{age:.0f} s ({self.failure or 'the write has not returned'})")
    if lost:
      raise WorkdirError(f"--workdir {self.rundir}: this run no longer holds "
                         f"{self.file}: {lost}. It stops at this step; run the same command "
                         "again to resume from its last checkpoint once no other run holds it")

  def release(self):
    """Stops the heartbeat and removes the lock, where it is still this process's."""
    self._stop.set()
    self._beat.join()
    seen, held = _look(self.file)
    if held is not None and held.get("token") == self.record["token"]:
      swap.remove_if_unchanged(self.file, seen)
    if self.made_workdir:   # a run refused before it wrote leaves nothing
      fileio.remove_empty_folder(self.rundir.root)

  def abandon(self):
    """Stops the heartbeat without a word to the store, which failed: the lock stays, and a
    restart on this host takes it over from the run it names, whose process has ended or, in
    this process, is this one."""
    self._stop.set()
    _ABANDONED.add(self.record["token"])

  def _renew(self):
    while not self._stop.wait(LOCK_BEAT_S) and not self.lost:
      try:
        self._write_beat()
      except Exception as e:   # pylint: disable=broad-except
        # gcsfs's HttpError and google-auth's errors are no OSErrors. Any error waits for the
        # next beat, and `check` stops the run if none gets through for LOCK_GIVE_UP_S.
        self.failure = fileio.reason(e, self.file)
        log.warning("could not renew %s, trying again in %.0f s: %s", self.file, LOCK_BEAT_S,
                    self.failure)

  def _write_beat(self):
    """Writes a new heartbeat on this process's last version of the lock, or records why this
    run lost the lock: another run took it over or removed it."""
    record = dict(self.record, heartbeat=time.time())
    version = swap.write_if_unchanged(self.file, json.dumps(record), self.version)
    if version is None:   # changed by another run, or still this run's own: see which
      version, held = _look(self.file)
      # A retried write whose first try went through leaves the new record, a run that looked
      # at the lock and put it back leaves the old one.
      if held not in (record, self.record):
        self.lost = f"another run took it over: {_holder(held)}" if held else "it was removed"
        return
      record = held
    self.record, self.version, self.failure = record, version, ""


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _look(file: str) -> tuple[str | None, dict | None]:
  """Returns the lock's version and record. The version is read first, so a write between the
  two makes a removal or heartbeat conditional on that version fail, never pass on a record
  it did not see."""
  return swap.version(file), _read_lock(file)


def _read_lock(file: str) -> dict | None:
  """Returns the lock's record, None where there is none. An unreadable one is a holder we
  know nothing of, its heartbeat the file's time."""
  try:
    text = fileio.read_text(file)
  except FileNotFoundError:
    return None
  try:
    held = dict(json.loads(text))
    if isinstance(held.get("heartbeat"), (int, float)):
      return held
  except (ValueError, TypeError):
    pass
  return dict(host="?", pid=-1, started="?", heartbeat=_mtime(file), token=None)


def _mtime(file: str) -> float:
  """Returns the time `file` was last written, 0 where it is gone."""
  try:
    return fileio.mtime(file)
  except FileNotFoundError:
    return 0.0


def _dead(held: dict) -> str:
  """Says why the holder is dead, '' where it may be alive."""
  if held.get("token") in _ABANDONED:
    return "it stopped in this process after its store failed"
  if held.get("host") == socket.gethostname() and not _pid_alive(held.get("pid", -1)):
    return "its process has ended"
  age = time.time() - held.get("heartbeat", 0)
  if age > LOCK_STALE_S:
    return f"its heartbeat is {age:.0f} s old, over {LOCK_STALE_S:.0f} s"
  if held.get("host") == socket.gethostname() and _started_after(held.get("pid"),
                                                                 held.get("heartbeat", 0)):
    # A restarted container's command has the pid and host name of the one that died.
    return f"pid {held.get('pid')} is a process started since that heartbeat"
  return ""


def process_start(pid: int | str = "self") -> float | None:
  """Returns when process `pid` of this host started, in seconds since the epoch, from its
  start since boot in Linux's /proc and the time since boot now; None where it cannot say."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      ticks = int(f.read().rpartition(")")[2].split()[19])   # field 22, starttime
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError, AttributeError):   # not Linux, or no such process
    return None
  return time.time() - age


def _started_after(pid, when: float) -> bool:
  """Whether process `pid` of this host started after `when` (seconds since the epoch), by
  /proc; False where /proc does not say."""
  try:
    start = process_start(int(pid))
  except (TypeError, ValueError):
    return False
  return start is not None and start > when + 1.0   # a second's margin for the clocks


def _pid_alive(pid) -> bool:
  if not isinstance(pid, int) or pid <= 0:   # 0 and -1 would name groups of processes
    return False
  try:
    os.kill(pid, 0)
  except (ProcessLookupError, OverflowError):
    return False
  except PermissionError:   # another user's process
    return True
  return True


def _holder(held: dict) -> str:
  age = time.time() - held.get("heartbeat", 0)
  return (f"pid {held.get('pid')} on host {held.get('host')}, started {held.get('started')}, "
          f"heartbeat {age:.0f} s ago")
