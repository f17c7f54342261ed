"""Errors a user can fix, reported as one line: `error: <field or file>: <what to do>`, exit 2."""

from __future__ import annotations

import errno
import logging
import sys
import traceback
from typing import Callable

from absl import logging as absl_logging

# OSErrors that mean the machine, not the code: reported as one line like a UserError.
_ENVIRONMENT = {errno.ENOSPC: "the disk is full: free space",
                errno.EDQUOT: "the disk quota is exceeded: free space",
                errno.EACCES: "permission denied: fix the permissions",
                errno.EPERM: "operation not permitted: fix the permissions",
                errno.EROFS: "the file system is read-only: use a writable place"}
EXIT_STATUS = 2


class UserError(Exception):
  """A mistake or fault the user can fix. The message reads '<field or file>: <what is wrong
  and what to do>'. Entry points print it as one line without a traceback, as `main` does."""


class ConfigError(UserError, ValueError):
  """Reports a bad config field, flag or environment variable before anything is built.

  `ConfigError("tst.bag_size", "must be ...")` carries its field as data in `.field`, which
  tools and tests read instead of parsing the text. A config field prints as
  'config.tst.bag_size: must be ...'. A flag such as '--mode' or an environment variable such
  as 'XLA_PYTHON_CLIENT_MEM_FRACTION' prints as itself.
  """

  def __init__(self, field: str, message: str):
    if not field or not message:
      raise TypeError("ConfigError(field, message) needs both")
    self.field, self.message = field, message
    super().__init__(f"{config_name(field)}: {message}")

  def __reduce__(self):   # picklable across processes with both arguments
    return type(self), (self.field, self.message)


def config_name(field: str) -> str:
  """Returns how a field prints: 'config.<field>' for a config field, a flag or variable as is."""
  return field if field.startswith("-") or field.isupper() else f"config.{field}"


class DataError(UserError, ValueError):
  """A data file, cache or store that is missing, corrupt or of another run. The message names
  the file and says how to recover, and nothing is rebuilt over a run's own files."""


class WorkdirError(UserError):
  """A workdir that cannot be used or written, being a file, not permitted or on a full disk.
  A checkpoint write that failed is one, and leaves the last complete checkpoint as it was."""


class StoreError(WorkdirError):
  """The disk or bucket of a running run's workdir that failed under it: a write that did not
  go through, a bucket that stopped answering. The run stops at once and asks nothing more of
  it, and the message names the run's last complete checkpoint, which the same command resumes
  from."""


def one_line(e: BaseException) -> str | None:
  """Returns the `error: ...` line of a user error or an environment OSError, None for a bug."""
  if isinstance(e, UserError):
    text = str(e)
  elif isinstance(e, OSError) and e.errno in _ENVIRONMENT:
    where = e.filename or "a file"
    text = f"{where}: {_ENVIRONMENT[e.errno]}, then run the same command again"
  else:
    return None
  return "error: " + " ".join(text.split())


def in_chain(e: BaseException | None,
             match: Callable[[BaseException], bool]) -> BaseException | None:
  """Returns the first exception along `e`'s chain, `e` itself and then what each was raised
  from or during, for which `match` is true; None where none is. A chain that loops ends."""
  seen = set()
  while e is not None and id(e) not in seen:
    if match(e):
      return e
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return None


def user_error_in(e: BaseException | None) -> UserError | None:
  """Returns the UserError along `e`'s chain of causes, None where there is none: a config
  file's ConfigError, which config_flags re-raises as a TypeError and absl wraps again."""
  return in_chain(e, lambda cause: isinstance(cause, UserError))


def main(fn, *args, debug: bool = False, **kwargs):
  """Calls fn(*args, **kwargs), printing a user error as one line on stderr with exit status 2,
  after the traceback when `debug`. Any other exception propagates with its traceback."""
  try:
    return fn(*args, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    line = one_line(e)
    if line is None:
      raise
    if debug:
      traceback.print_exc()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    sys.exit(EXIT_STATUS)


class _PlainWarnings(logging.Handler):
  """Writes a warning as 'warning: <message>' to the stderr of the moment."""

  def __init__(self):
    super().__init__(logging.WARNING)

  def emit(self, record: logging.LogRecord):
    sys.stderr.write(f"{record.levelname.lower()}: {' '.join(record.getMessage().split())}\n")


def _not_plain(record: logging.LogRecord) -> bool:
  return not (record.name.startswith("tst_jax") and record.levelno >= logging.WARNING)


def plain_warnings():
  """Says the warnings of tst_jax's logger as 'warning: ...' lines on stderr, where absl's
  handler prints 'W1204 12:00:00.000000 1234 setup.py:72] ...'. A command's entry point
  calls it; other handlers, a test's included, still get every record."""
  log = logging.getLogger("tst_jax")
  if not any(isinstance(h, _PlainWarnings) for h in log.handlers):
    log.addHandler(_PlainWarnings())
    absl_logging.get_absl_handler().addFilter(_not_plain)
