"""A run's record: one reader and one writer for each of its files, and the one check that a
workdir holds this run. config.json and plan.json, which hold the typed spec and the plan, are
config/record.py's.

Where each file lives is RunDir's (tst_jax/rundir.py). A workdir is a local folder or a
bucket's URL such as gs://bucket/run: every file goes through fileio, metrics.jsonl through
appending.Appender, the checkpoints through Orbax's own URL support. Readers of files written
by older versions of tst-jax sit at the end of this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from tst_jax import fileio
from tst_jax.data import tokenizer as tokenizer_lib
from tst_jax.data.run_data import Stores
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.run import appending

ORBAX_COMMIT = "commit_success.txt"   # in a bucket, what Orbax writes last in a step's folder


def read_json(rundir: RunDir, file: str) -> dict | None:
  """Returns the record `file` of the run in `rundir`, None where there is none. One that is
  not a JSON object is a DataError naming it."""
  if not fileio.isfile(file):
    return None
  try:
    record = json.loads(fileio.read_text(file))
  except (ValueError, UnicodeDecodeError) as e:
    raise DataError(f"{file}: cannot be read as JSON ({e}); it is a record of the run in "
                    f"{rundir}: restore it from a copy") from None
  if not isinstance(record, dict):
    raise DataError(f"{file}: holds a {type(record).__name__}, not a JSON object; it is a "
                    f"record of the run in {rundir}: restore it from a copy")
  return record


def open_metrics(rundir: RunDir, start: int) -> appending.Appender:
  """Opens metrics.jsonl to append from step `start` on, first dropping the lines after it:
  an earlier attempt logged them after its last checkpoint, or before its first."""
  if fileio.exists(rundir.metrics):
    kept = [r for r in read_metrics(rundir) if r.get("step", 0) <= start] if start else []
    fileio.write_text(rundir.metrics, "".join(json.dumps(r) + "\n" for r in kept))
  return appending.Appender(rundir.metrics, parts=rundir.parts)


def _json_lines(file: str) -> Iterator[tuple[int, object]]:
  """Yields the number of each non-blank line of JSON-lines `file` and its value, or the
  ValueError reading it raised."""
  for number, line in enumerate(fileio.read_text(file).split("\n"), 1):
    if line.strip():
      try:
        yield number, json.loads(line)
      except ValueError as e:
        yield number, e


def read_metrics(rundir: RunDir) -> list[dict]:
  """Returns every line of metrics.jsonl, empty where the run has written none."""
  if not fileio.exists(rundir.metrics):
    return []
  records = []
  for number, record in _json_lines(rundir.metrics):
    if isinstance(record, ValueError):
      raise DataError(f"{rundir.metrics}:{number}: cannot be read as JSON ({record}); it is "
                      "the run's log of losses: restore it from a copy")
    records.append(record)
  return records


def open_goodput(rundir: RunDir) -> appending.Appender:
  """Opens goodput.jsonl to append a session's lines after every earlier session's."""
  return appending.Appender(rundir.goodput, parts=rundir.parts)


def read_goodput(rundir: RunDir) -> list[dict]:
  """Returns every line of goodput.jsonl. A line that cannot be read is left out where it
  ends a session's lines, as a killed session's last write can; anywhere else it is a
  DataError. A workdir without the file is a WorkdirError."""
  fileio.check_readable(rundir.root, "the run")
  if not fileio.exists(rundir.goodput):
    raise WorkdirError(f"{rundir.goodput}: no such file: {rundir} holds no run, or one that "
                       "has not reached its first step")
  records, cut = [], []     # cut: (the index of the record after it, line number, error)
  for number, record in _json_lines(rundir.goodput):
    if isinstance(record, ValueError):
      cut.append((len(records), number, record))
    else:
      records.append(record)
  for after, number, e in cut:    # a kill cuts a line short: a session's start comes next
    follows = records[after] if after < len(records) else {"kind": "start"}
    if not records or not isinstance(follows, dict) or follows.get("kind") != "start":
      raise DataError(f"{rundir.goodput}:{number}: cannot be read as JSON ({e}); it is the "
                      "run's record of its wall time: restore it from a copy")
  bad = next((r for r in records if not isinstance(r, dict)
              or not {"session", "time", "step", "seconds"} <= r.keys()), None)
  if bad is not None or not records:
    raise DataError(f"{rundir.goodput}: " + (f"a line is not a record of goodput: {bad}"
                    if records else "holds no record") + "; it is written from a run's start")
  return records


def final_eval(rundir: RunDir, steps: int) -> float | None:
  """Returns the held-out loss logged at step `steps`, None where there is none."""
  last = [r["eval_loss"] for r in read_metrics(rundir)
          if "eval_loss" in r and r["step"] == steps]
  return last[-1] if last else None


def write_profile(rundir: RunDir, table: str, record: dict, traced: str):
  """Writes the step-profile table of train.profile_steps and its JSON record beside the
  trace, uploading the trace from `traced` (`RunDir.trace_dir`) where the run is a bucket's."""
  fileio.makedirs(rundir.profile)
  if traced != rundir.profile:
    fileio.upload_folder(traced, rundir.profile)
  fileio.write_text(rundir.profile_table, table + "\n")
  fileio.write_json(rundir.profile_json, record)


def write_tracker(rundir: RunDir, record: dict):
  """Writes tracker.json: the tracker and its run id, which a resumed run continues."""
  fileio.write_json(rundir.tracker, record)


def read_tracker(rundir: RunDir) -> dict | None:
  """Returns tracker.json, None where the run has no tracker."""
  return read_json(rundir, rundir.tracker)


def write_store(rundir: RunDir, fingerprint: str, directory: str, train_tokens: int):
  """Writes store.json: the token store the run trains on from now on."""
  fileio.write_json(rundir.store, dict(fingerprint=fingerprint, directory=directory,
                                       train_tokens=train_tokens), sort_keys=True)


def read_store(rundir: RunDir) -> dict | None:
  """Returns store.json, or None where the run has not recorded its store."""
  return read_json(rundir, rundir.store)


def write_summary(rundir: RunDir, summary: dict):
  """Writes summary.json as the run finishes."""
  fileio.write_json(rundir.summary, summary)


def read_summary(rundir: RunDir) -> dict | None:
  """Returns summary.json, or None for a run that has not finished."""
  return read_json(rundir, rundir.summary)


def write_tokenizer(rundir: RunDir, tokenizer: tokenizer_lib.Tokenizer):
  """Copies the run's tokenizer beside its records, where export and the tools read it:
  tokenizer.json, or a SentencePiece run's tokenizer.model. Another tokenizer there is
  refused."""
  tokenizer_lib.copy_file(tokenizer.path, rundir.tokenizer_model if tokenizer.is_sentencepiece
                          else rundir.tokenizer_json)


def read_tokenizer(rundir: RunDir, vocab_size: int) -> tokenizer_lib.Tokenizer:
  """Returns the run's tokenizer from the copy the trainer made, a tokenizer.json or a
  SentencePiece run's tokenizer.model."""
  for path in (rundir.tokenizer_json, rundir.tokenizer_model):
    if fileio.isfile(path):
      return tokenizer_lib.get_tokenizer(path, folder=None, vocab_size=vocab_size)
  raise WorkdirError(f"{rundir} has no tokenizer.json (or tokenizer.model): the run's "
                     "tokenizer is missing")


def checkpoint_steps(rundir: RunDir) -> list[int]:
  """Returns the steps with a complete checkpoint, in order."""
  return complete_steps(rundir.checkpoints, rundir.remote)


def complete_steps(folder: str, remote: bool) -> list[int]:
  """Returns the steps of the checkpoint folder `folder` that are complete, in order. In a
  bucket (`remote`), where a folder cannot be renamed into place, a complete one holds the
  commit file that Orbax, or for s3:// train/checkpoint_mirror.py, writes last."""
  if not fileio.isdir(folder):
    return []
  done = ORBAX_COMMIT if remote else "state"
  return sorted(int(d) for d in fileio.listdir(folder)
                if d.isdigit() and fileio.exists(fileio.join(folder, d, done)))


def check_same_run(where: str, what: str, differs: str | None, force: bool):
  """Refuses to resume a run of another `what` unless `force`: `differs` says how they differ."""
  if differs and not force:
    raise ConfigError("--workdir", f"{where} holds a run of another {what}: {differs}; use "
                      "another --workdir, or --config.train.force_resume=True to resume anyway")


def check_store(rundir: RunDir, stores: Stores, force: bool):
  """Refuses to resume a run on other token stores than the ones its store.json names."""
  saved = read_store(rundir)
  differs = saved and saved["fingerprint"] != stores.fingerprint and (
      f"{saved['directory']} (fingerprint {saved['fingerprint'][:12]}) there, "
      f"{stores.directory} ({stores.fingerprint[:12]}) here")
  check_same_run(rundir.root, "token store", differs, force)


def train_tokens(rundir: RunDir) -> int | None:
  """Returns the training tokens of the store the run trained on, None where unknown."""
  saved = read_store(rundir)
  if saved is None:
    return None
  if "train_tokens" in saved:
    return saved["train_tokens"]
  return _older_store_tokens(saved)


# Readers for runs without store.json's token count, so that they still compare and evaluate.

def _older_store_tokens(saved: dict) -> int | None:
  """Counts the tokens of a store.json that does not record them, in the store itself."""
  try:
    return len(TokenStore(saved["directory"]).train)
  except DataError:
    return None
