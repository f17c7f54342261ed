"""A run's workdir: the name of every file a run writes, one reader and one writer for each
record, and the one check that a workdir holds this run.

Paths are strings joined here, so that one module decides where a run's files live.
Readers of files written by older versions of tst-jax sit at the end of this module.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid

import ml_collections

from tst_jax import fileio
from tst_jax.data import run_data, tokenizer as tokenizer_lib
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.train import spec as spec_lib
from tst_jax.train.plan import Plan, PlanRecord

CONFIG = "config.json"        # the config the run trains with, `auto` fields resolved
PLAN = "plan.json"            # PlanRecord: phases, training tokens, resolved `auto` choices
METRICS = "metrics.jsonl"     # one JSON object per train or eval line
STORE = "store.json"          # the token store the run trains on: fingerprint, folder, tokens
SUMMARY = "summary.json"      # the finished run's final losses and token counts
CHECKPOINTS = "checkpoints"   # Orbax steps
TENSORBOARD = "tensorboard"
LOSS_PLOT = "loss.png"
LOCK = "lock.json"            # the live run that holds the workdir: host, pid, start, heartbeat
TRACKER = "tracker.json"      # train.tracker: which tracker run this workdir logs to
PROFILE = "profile"           # train.profile_steps: the jax.profiler trace and its table
PROFILE_TABLE = os.path.join(PROFILE, "step_profile.txt")   # milliseconds per step by category
PROFILE_JSON = os.path.join(PROFILE, "step_profile.json")   # the same, with the top ops
# Written by the data layer, which names them: the token store prepared from data.source and
# the copy of the run's tokenizer that export reads.
DATA = run_data.PREPARED_DIR
TOKENIZER_JSON, TOKENIZER_MODEL = tokenizer_lib.TOKENIZER_JSON, tokenizer_lib.SENTENCEPIECE_MODEL


def path(workdir: str, name: str) -> str:
  """Returns the path of file `name` of the run in `workdir`."""
  return os.path.join(workdir, name)


def _read_json(workdir: str, name: str) -> dict | None:
  file = path(workdir, name)
  if not os.path.isfile(file):
    return None
  with open(file) as f:
    return json.load(f)


def write_config(workdir: str, config: dict):
  """Writes config.json: the run's config as `RunSpec.to_json` gives it."""
  fileio.write_json(path(workdir, CONFIG), config, sort_keys=True)


def read_config_json(workdir: str) -> dict | None:
  """Returns config.json as written, None where the run has not written one."""
  return _read_json(workdir, CONFIG)


def read_config(workdir: str) -> dict:
  """Returns the typed sections of the run in `workdir`, read from its config.json."""
  config = _read_json(workdir, CONFIG)
  if config is None:
    raise FileNotFoundError(f"{path(workdir, CONFIG)} does not exist: {workdir} is not a "
                            "tst_jax run directory")
  return spec_lib.sections_of(config)


def write_plan(workdir: str, record: PlanRecord):
  """Writes plan.json, as the run starts and again on each resume."""
  fileio.write_json(path(workdir, PLAN), record.to_json())


def read_plan(workdir: str) -> PlanRecord | None:
  """Returns the run's plan.json, or None where the run has not written one."""
  record = _read_json(workdir, PLAN)
  return None if record is None else PlanRecord.from_json(record)


def open_metrics(workdir: str, resume_step: int | None):
  """Opens metrics.jsonl to append, first dropping lines after `resume_step` on a resume."""
  file = path(workdir, METRICS)
  if resume_step is not None and os.path.exists(file):
    kept = [r for r in read_metrics(workdir) if r.get("step", 0) <= resume_step]
    fileio.write_text(file, "".join(json.dumps(r) + "\n" for r in kept))
  return open(file, "a")


def read_metrics(workdir: str) -> list[dict]:
  """Returns every line of metrics.jsonl, empty where the run has written none."""
  file = path(workdir, METRICS)
  if not os.path.exists(file):
    return []
  with open(file) as f:
    return [json.loads(line) for line in f if line.strip()]


def final_eval(workdir: str, steps: int) -> float | None:
  """Returns the held-out loss logged at step `steps`, None where there is none."""
  last = [r["eval_loss"] for r in read_metrics(workdir)
          if "eval_loss" in r and r["step"] == steps]
  return last[-1] if last else None


def write_profile(workdir: str, table: str, record: dict):
  """Writes the step-profile table of train.profile_steps and its JSON record."""
  os.makedirs(path(workdir, PROFILE), exist_ok=True)
  fileio.write_text(path(workdir, PROFILE_TABLE), table + "\n")
  fileio.write_json(path(workdir, PROFILE_JSON), record)


def write_tracker(workdir: str, record: dict):
  """Writes tracker.json: the tracker and its run id, which a resumed run continues."""
  fileio.write_json(path(workdir, TRACKER), record)


def read_tracker(workdir: str) -> dict | None:
  """Returns tracker.json, None where the run has no tracker."""
  return _read_json(workdir, TRACKER)


def write_store(workdir: str, fingerprint: str, directory: str, train_tokens: int):
  """Writes store.json: the token store the run trains on from now on."""
  fileio.write_json(path(workdir, STORE), dict(fingerprint=fingerprint, directory=directory,
                                               train_tokens=train_tokens), sort_keys=True)


def read_store(workdir: str) -> dict | None:
  """Returns store.json, or None where the run has not recorded its store."""
  return _read_json(workdir, STORE)


def write_summary(workdir: str, summary: dict):
  """Writes summary.json as the run finishes."""
  fileio.write_json(path(workdir, SUMMARY), summary)


def read_summary(workdir: str) -> dict | None:
  """Returns summary.json, or None for a run that has not finished."""
  return _read_json(workdir, SUMMARY)


def read_tokenizer(workdir: str, vocab_size: int) -> tokenizer_lib.Tokenizer:
  """Returns the run's tokenizer from the copy the trainer made, a tokenizer.json or a
  SentencePiece run's tokenizer.model."""
  for name in (TOKENIZER_JSON, TOKENIZER_MODEL):
    if os.path.isfile(path(workdir, name)):
      return tokenizer_lib.get_tokenizer(path(workdir, name), workdir=None, vocab_size=vocab_size)
  raise FileNotFoundError(f"{workdir} has no tokenizer.json (or tokenizer.model): the run's "
                          "tokenizer is missing")


def checkpoint_steps(workdir: str) -> list[int]:
  """Returns the steps with a complete checkpoint, in order."""
  directory = path(workdir, CHECKPOINTS)
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory)
                if d.isdigit() and os.path.exists(os.path.join(directory, d, "state")))


def check_same_run(where: str, what: str, differs: str | None, force: bool):
  """Refuses to resume a run of another `what` unless `force`: `differs` says how they differ."""
  if differs and not force:
    raise ConfigError("--workdir", f"{where} holds a run of another {what}: {differs}; use "
                      "another --workdir, or --config.train.force_resume=True to resume anyway")


def check_store(workdir: str, store: TokenStore, force: bool):
  """Refuses to resume a run on another token store than the one its store.json names."""
  saved = read_store(workdir)
  differs = saved and saved["fingerprint"] != store.fingerprint and (
      f"{saved['directory']} (fingerprint {saved['fingerprint'][:12]}) there, "
      f"{store.directory} ({store.fingerprint[:12]}) here")
  check_same_run(workdir, "token store", differs, force)


def train_tokens(workdir: str) -> int | None:
  """Returns the training tokens of the store the run trained on, None where unknown."""
  saved = read_store(workdir)
  if saved is None:
    return None
  if "train_tokens" in saved:
    return saved["train_tokens"]
  return _older_store_tokens(saved)


def plan_and_tokens(workdir: str, started: Plan | None = None) -> tuple[Plan, int | None]:
  """Returns the run's plan and its store's training tokens or None.

  A run that has not written plan.json yet gives the plan it was `started` with, as a sweep's
  point does. A run without plan.json gives the plan of its config.json.
  """
  record = read_plan(workdir)
  if record is not None:
    return record.plan, (record.tokens.count if record.tokens and record.tokens.exact
                         else train_tokens(workdir))
  return started or _older_plan(workdir), train_tokens(workdir)


# The lock. A file created only if absent is the whole protocol, so an object store's
# create-if-absent write can hold a bucket workdir the same way. The holder rewrites its
# heartbeat from a thread: steps, checkpoints and logs can be hours apart while a store is
# prepared or a step compiles, and one small write every LOCK_BEAT_S costs nothing.
LOCK_BEAT_S = 30.0
LOCK_STALE_S = 300.0   # a heartbeat this old is a dead run's, whatever its host


class Lock:
  """The workdir's lock while this process holds it: `Lock.take`, then `release`."""

  def __init__(self, file: str, record: dict, made_workdir: bool = False):
    self.file, self.record, self.made_workdir = file, record, made_workdir
    self._stop = threading.Event()
    self._beat = threading.Thread(target=self._renew, name="tst_jax-lock", daemon=True)
    self._beat.start()

  @classmethod
  def take(cls, workdir: str, say=print) -> Lock:
    """Takes the lock of `workdir`, over a dead run's with a line that says so. A live run's
    lock raises WorkdirError naming its holder."""
    made_workdir = not os.path.exists(workdir)
    os.makedirs(workdir, exist_ok=True)
    file = path(workdir, LOCK)
    record = dict(host=socket.gethostname(), pid=os.getpid(), token=uuid.uuid4().hex,
                  started=_utc_now(), heartbeat=time.time())
    for _ in range(3):   # another process may take or free it between two looks
      if _create_if_absent(file, record):
        return cls(file, record, made_workdir)
      held = _read_lock(file)
      if held is None:
        continue
      dead = _dead(held)
      if not dead:
        raise WorkdirError(f"--workdir {workdir}: a live run holds it: {_holder(held)} "
                           f"({file}); wait for it to end, stop it, or use another --workdir")
      if _remove_if_same(file, held):
        say(f"taking over {file} from a dead run: {_holder(held)}, {dead}")
    raise WorkdirError(f"--workdir {workdir}: {file} keeps changing: another run is starting "
                       "in this workdir; use another --workdir")

  def release(self):
    """Stops the heartbeat and removes the lock, where it is still this process's."""
    self._stop.set()
    self._beat.join()
    held = _read_lock(self.file)
    if held is not None and held.get("token") == self.record["token"]:
      os.remove(self.file)
    if self.made_workdir and not os.listdir(os.path.dirname(self.file)):
      os.rmdir(os.path.dirname(self.file))   # a run refused before it wrote leaves nothing

  def _renew(self):
    while not self._stop.wait(LOCK_BEAT_S):
      held = _read_lock(self.file)
      if held is None or held.get("token") != self.record["token"]:
        return   # taken over: this run's heartbeat had stopped for LOCK_STALE_S
      self.record["heartbeat"] = time.time()
      try:
        fileio.write_json(self.file, self.record)
      except OSError:   # a full disk: the run's own writes report it, the next beat retries
        pass


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _create_if_absent(file: str, record: dict) -> bool:
  """Writes `record` to `file` whole if no file is there, else returns False: a hard link
  of a written file is atomic, so no reader sees half a lock."""
  written = f"{file}.{record['token']}"
  fileio.write_json(written, record)
  try:
    os.link(written, file)
    return True
  except FileExistsError:
    return False
  except OSError:   # a file system without hard links, as some FUSE mounts are
    return _create_exclusive(file, record)
  finally:
    os.remove(written)


def _create_exclusive(file: str, record: dict) -> bool:
  """Creates `file` holding `record` if no file is there, else returns False."""
  try:
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w") as f:
    json.dump(record, f)
  return True


def _read_lock(file: str) -> dict | None:
  """Returns the lock's record, None where there is none. An unreadable one is a holder we
  know nothing of, its heartbeat the file's time."""
  try:
    with open(file) as f:
      text, mtime = f.read(), os.fstat(f.fileno()).st_mtime
  except FileNotFoundError:
    return None
  try:
    held = dict(json.loads(text))
    if isinstance(held.get("heartbeat"), (int, float)):
      return held
  except (ValueError, TypeError):
    pass
  return dict(host="?", pid=-1, started="?", heartbeat=mtime, token=None)


def _dead(held: dict) -> str:
  """Says why the holder is dead, '' where it may be alive."""
  if held.get("host") == socket.gethostname() and not _pid_alive(held.get("pid", -1)):
    return "its process has ended"
  age = time.time() - held.get("heartbeat", 0)
  if age > LOCK_STALE_S:
    return f"its heartbeat is {age:.0f} s old, over {LOCK_STALE_S:.0f} s"
  return ""


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


def _remove_if_same(file: str, held: dict) -> bool:
  """Removes the lock where it is still `held`, and puts back a fresh one that another
  process took in between. An object store does this in one call: a delete if the
  generation is the one read."""
  aside = f"{file}.{uuid.uuid4().hex}"
  try:
    os.rename(file, aside)
  except FileNotFoundError:
    return False
  moved = _read_lock(aside)
  if moved is None or moved.get("token") == held.get("token"):
    os.remove(aside)
    return True
  _create_exclusive(file, moved)   # unless a third run took it meanwhile: theirs stays
  os.remove(aside)
  return False


# Readers for runs without plan.json or store.json's token count, so that they still compare
# and evaluate.

def _older_store_tokens(saved: dict) -> int | None:
  """Counts the tokens of a store.json that does not record them, in the store itself."""
  try:
    return len(TokenStore(saved["directory"]).train)
  except DataError:
    return None


def _older_plan(workdir: str) -> Plan:
  """Returns the plan of a run without plan.json: its config, checked."""
  config = _read_json(workdir, CONFIG)
  if config is None:
    raise DataError(f"{workdir}: has no plan.json or config.json: give run directories "
                    "of main.py")
  config = ml_collections.ConfigDict(config)
  config.tst.weighting = "uniform"
  return spec_lib.check(config).plan
