"""A run's workdir: the name of every file a run writes, one reader and one writer for each
record, and the one check that a workdir holds this run.

Paths are strings joined here, so that one module decides where a run's files live. A workdir
is a local folder or a bucket's URL such as gs://bucket/run: every file goes through fileio,
metrics.jsonl through appending.Appender, the checkpoints through Orbax's own URL support.
Readers of files written by older versions of tst-jax sit at the end of this module.
"""

from __future__ import annotations

import json
import tempfile

import ml_collections

from tst_jax import fileio
from tst_jax.data import run_data, tokenizer as tokenizer_lib
from tst_jax.data.store import TokenStore
from tst_jax.errors import ConfigError, DataError, WorkdirError
from tst_jax.train import appending, spec as spec_lib
from tst_jax.train.plan import Plan, PlanRecord

CONFIG = "config.json"        # the config the run trains with, `auto` fields resolved
PLAN = "plan.json"            # PlanRecord: phases, training tokens, resolved `auto` choices
METRICS = "metrics.jsonl"     # one JSON object per train or eval line
STORE = "store.json"          # the token store the run trains on: fingerprint, folder, tokens
SUMMARY = "summary.json"      # the finished run's final losses and token counts
CHECKPOINTS = "checkpoints"   # Orbax steps
ORBAX_COMMIT = "commit_success.txt"   # in a bucket, what Orbax writes last in a step's folder
TENSORBOARD = "tensorboard"
LOSS_PLOT = "loss.png"
LOCK = "lock.json"            # the live run that holds the workdir: host, pid, start, heartbeat
TRACKER = "tracker.json"      # train.tracker: which tracker run this workdir logs to
PROFILE = "profile"           # train.profile_steps: the jax.profiler trace and its table
PROFILE_TABLE = PROFILE + "/step_profile.txt"   # milliseconds per step by category
PROFILE_JSON = PROFILE + "/step_profile.json"    # the same, with the top ops
LM_EVAL = "lm_eval"           # lm-eval's results, step_<N>.json: tools.eval's and train.eval_tasks'
# Written by the data layer, which names them: the token store prepared from data.source and
# the copy of the run's tokenizer that export reads.
DATA = run_data.PREPARED_DIR
TOKENIZER_JSON, TOKENIZER_MODEL = tokenizer_lib.TOKENIZER_JSON, tokenizer_lib.SENTENCEPIECE_MODEL


def path(workdir: str, name: str) -> str:
  """Returns the path of file `name` of the run in `workdir`."""
  return fileio.join(workdir, name)


def _read_json(workdir: str, name: str) -> dict | None:
  """Returns the record `name` of the run in `workdir`, None where there is none. One that is
  not a JSON object is a DataError naming it."""
  file = path(workdir, name)
  if not fileio.isfile(file):
    return None
  try:
    record = json.loads(fileio.read_text(file))
  except (ValueError, UnicodeDecodeError) as e:
    raise DataError(f"{file}: cannot be read as JSON ({e}); it is a record of the run in "
                    f"{workdir}: restore it from a copy") from None
  if not isinstance(record, dict):
    raise DataError(f"{file}: holds a {type(record).__name__}, not a JSON object; it is a "
                    f"record of the run in {workdir}: restore it from a copy")
  return record


def write_config(workdir: str, config: dict):
  """Writes config.json: the run's config as `RunSpec.to_json` gives it."""
  fileio.write_json(path(workdir, CONFIG), config, sort_keys=True)


def read_config_json(workdir: str) -> dict | None:
  """Returns config.json as written, None where the run has not written one."""
  return _read_json(workdir, CONFIG)


def read_config(workdir: str) -> dict:
  """Returns the typed sections of the run in `workdir`, read from its config.json. A workdir
  without one is a WorkdirError, a config.json that does not check a DataError naming it."""
  config = _read_json(workdir, CONFIG)
  if config is None:
    raise WorkdirError(f"{path(workdir, CONFIG)} does not exist: {workdir} is not a "
                       "tst_jax run directory")
  try:
    return spec_lib.sections_of(config)
  except (ValueError, KeyError, TypeError) as e:   # a field that does not check, a section lost
    raise DataError(f"{path(workdir, CONFIG)}: cannot be read ({e}); it records the config "
                    f"of the run in {workdir}: restore it from a copy, or use another "
                    "--workdir") from None


def write_plan(workdir: str, record: PlanRecord):
  """Writes plan.json, as the run starts and again on each resume."""
  fileio.write_json(path(workdir, PLAN), record.to_json())


def read_plan(workdir: str) -> PlanRecord | None:
  """Returns the run's plan.json, or None where the run has not written one."""
  record = _read_json(workdir, PLAN)
  return None if record is None else PlanRecord.from_json(record)


def open_metrics(workdir: str, start: int) -> appending.Appender:
  """Opens metrics.jsonl to append from step `start` on, first dropping the lines after it:
  an earlier attempt logged them after its last checkpoint, or before its first."""
  file = path(workdir, METRICS)
  if fileio.exists(file):
    kept = [r for r in read_metrics(workdir) if r.get("step", 0) <= start] if start else []
    fileio.write_text(file, "".join(json.dumps(r) + "\n" for r in kept))
  return appending.Appender(file)


def read_metrics(workdir: str) -> list[dict]:
  """Returns every line of metrics.jsonl, empty where the run has written none."""
  file = path(workdir, METRICS)
  if not fileio.exists(file):
    return []
  records = []
  for number, line in enumerate(fileio.read_text(file).split("\n"), 1):
    try:
      records += [json.loads(line)] if line.strip() else []
    except ValueError as e:
      raise DataError(f"{file}:{number}: cannot be read as JSON ({e}); it is the run's log of "
                      "losses: restore it from a copy") from None
  return records


def final_eval(workdir: str, steps: int) -> float | None:
  """Returns the held-out loss logged at step `steps`, None where there is none."""
  last = [r["eval_loss"] for r in read_metrics(workdir)
          if "eval_loss" in r and r["step"] == steps]
  return last[-1] if last else None


def trace_dir(workdir: str) -> str:
  """Returns the folder jax.profiler traces train.profile_steps into: <workdir>/profile, or a
  local one for a bucket's workdir, since the profiler writes local files only."""
  if fileio.is_url(workdir):
    return tempfile.mkdtemp(prefix="tst_jax_profile_")
  return path(workdir, PROFILE)


def write_profile(workdir: str, table: str, record: dict, traced: str):
  """Writes the step-profile table of train.profile_steps and its JSON record beside the
  trace, uploading the trace from `traced` where the workdir is a bucket's."""
  fileio.makedirs(path(workdir, PROFILE))
  if traced != path(workdir, PROFILE):
    fs, remote = fileio.filesystem(path(workdir, PROFILE))
    fs.put(traced.rstrip("/") + "/", remote, recursive=True)
    fileio.rmtree(traced)
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


def lm_eval_path(workdir: str, step: int) -> str:
  """Returns the path of the lm-eval results of checkpoint or step `step`."""
  return fileio.join(path(workdir, LM_EVAL), f"step_{step}.json")


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
    if fileio.isfile(path(workdir, name)):
      return tokenizer_lib.get_tokenizer(path(workdir, name), workdir=None, vocab_size=vocab_size)
  raise WorkdirError(f"{workdir} has no tokenizer.json (or tokenizer.model): the run's "
                     "tokenizer is missing")


def checkpoint_steps(workdir: str) -> list[int]:
  """Returns the steps with a complete checkpoint, in order. In a bucket, where a folder
  cannot be renamed into place, Orbax marks a complete one with its commit file."""
  directory = path(workdir, CHECKPOINTS)
  if not fileio.isdir(directory):
    return []
  done = ORBAX_COMMIT if fileio.is_url(directory) else "state"
  return sorted(int(d) for d in fileio.listdir(directory)
                if d.isdigit() and fileio.exists(fileio.join(directory, d, done)))


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
