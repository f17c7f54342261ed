"""The object stores behind URLs: a URL's scheme, its fsspec filesystem with the options and
the package its store needs, the bucket names GCS takes, and which errors are a store's and
why it refused a path."""

from __future__ import annotations

import errno
import functools
import logging
import re

import fsspec

from tst_jax.errors import UserError, in_chain

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# Listings are not cached: another process or host writes the same bucket, a lock above all.
_OPTIONS = {"gs": dict(use_listings_cache=False), "gcs": dict(use_listings_cache=False),
            "s3": dict(use_listings_cache=False)}
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_BUCKET_CHARS = _ALNUM | {"-", "_"}   # of each dot-separated part of a GCS bucket's name
# What each store needs, as the error line names it.
_PACKAGES = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs", "hf": "huggingface_hub"}
_EXTRAS = {"gcsfs": "tst-jax[gcs]", "s3fs": "tst-jax[s3]", "huggingface_hub": "huggingface_hub"}
_LOGINS = {"gs": "run gcloud auth application-default login or set "
                 "GOOGLE_APPLICATION_CREDENTIALS",
           "s3": "set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
           "hf": "run hf auth login or set HF_TOKEN"}


class PathError(UserError):
  """A path that cannot be read or written: missing, no credentials, no such bucket, not
  permitted or without the package its store needs. The message names the path and why."""


def is_url(path: str) -> bool:
  """Returns whether `path` is a URL such as gs://bucket/x, read through fsspec."""
  return bool(_URL.match(str(path)))


def protocol(path: str) -> str:
  """Returns the scheme of a URL, 'gs' for gs://bucket/x, or '' for a local path."""
  return str(path).split("://", 1)[0] if is_url(path) else ""


def filesystem(url: str):
  """Returns the fsspec filesystem of `url` and the path within it, 'bucket/x' for gs://bucket/x."""
  check_bucket_name(url)
  scheme = protocol(url)
  if scheme in ("gs", "gcs"):
    _gcsfs_to_the_log()
  try:
    return fsspec.core.url_to_fs(url, **_OPTIONS.get(scheme, {}))
  except ImportError as e:
    package = _PACKAGES.get(scheme, scheme)
    raise PathError(f"{url}: {scheme}:// paths need {package}: pip install "
                    f"'{_EXTRAS.get(package, package)}'") from e


class _ClientLinesToTheLog(logging.Filter):
  """Shows a store client's log records as info lines, with --verbosity=0 only. gcsfs logs each
  request it gives up on with its traceback, and the error that follows says it in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno > logging.INFO:
      record.levelno, record.levelname = logging.INFO, "INFO"
    return logging.getLogger(record.name).isEnabledFor(record.levelno)


@functools.cache
def _gcsfs_to_the_log():
  logging.getLogger("gcsfs").addFilter(_ClientLinesToTheLog())


# A store that stopped answering, as the OSError of its connection says it.
_UNREACHABLE = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
                          errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE})
# The packages whose errors are a store's: its client, HTTP and credentials.
_CLIENTS = ("aiohttp", "gcsfs", "google", "s3fs", "botocore", "aiobotocore", "huggingface_hub",
            "requests", "urllib3")


def store_error(e: BaseException) -> BaseException | None:
  """Returns the failure of a store behind `e`, itself or what it was raised from: a PathError,
  a connection refused, lost or timed out, or an error of a store's client. None for an error
  of the code."""
  return in_chain(e, _a_store_failure)


def _a_store_failure(e: BaseException) -> bool:
  return (isinstance(e, PathError) or type(e).__module__.split(".")[0] in _CLIENTS
          or (isinstance(e, OSError) and e.errno in _UNREACHABLE))


def check_bucket_name(path: str, what: str = ""):
  """Raises one PathError where `path` is in a GCS bucket whose name GCS refuses. TensorStore,
  which writes a run's checkpoints, refuses it before any request, after the run has begun."""
  if protocol(path) not in ("gs", "gcs"):
    return
  name = path.split("://", 1)[1].split("/", 1)[0]
  parts = name.split(".")
  if not (3 <= len(name) <= 222 and all(
      part and len(part) <= 63 and part[0] in _ALNUM and part[-1] in _ALNUM
      and set(part) <= _BUCKET_CHARS for part in parts)):
    raise PathError(f"{what + ' ' if what else ''}{path}: {name!r} is not a GCS bucket name: "
                    "3 to 63 lowercase letters, digits, '-' and '_' (or such parts joined by "
                    "dots), starting and ending with a letter or digit")


def url_of(fs, url: str, path: str) -> str:
  """Returns the URL of `path` in `fs`, written with the scheme `url` was."""
  path = fs._strip_protocol(path)   # pylint: disable=protected-access
  # A file:// URL's path is absolute; a bucket's starts at the bucket's name.
  return protocol(url) + "://" + (path if protocol(url) == "file" else path.lstrip("/"))


def reason(e: BaseException, path: str) -> str:
  """Says in a few words why a store refused `path`: credentials, permission, a missing bucket,
  or that it cannot be reached."""
  name = type(e).__name__
  login = _LOGINS.get("gs" if protocol(path) == "gcs" else protocol(path), "")
  if "Credentials" in name or "RefreshError" in name or "auth" in type(e).__module__:
    return f"no credentials ({name}): {login}" if login else f"no credentials ({name})"
  if isinstance(e, PermissionError) or "Forbidden" in str(e) or "AccessDenied" in str(e):
    return "permission denied" + (f" to these credentials: {login}" if login else "")
  if isinstance(e, FileNotFoundError):
    return "no such bucket or folder"
  if isinstance(e, NotADirectoryError):
    return f"{e.filename} is a file, not a folder"
  said = f"{name}: {str(e).splitlines()[0] if str(e) else ''}"
  if (isinstance(e, OSError) and e.errno in _UNREACHABLE) or "Connect" in name:
    return f"the store cannot be reached ({said})"
  return said
