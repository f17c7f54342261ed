"""Paths on the local disk or in an object store, and files written whole or not at all.

A local path goes through os and open, as always. A URL such as gs://bucket/run, s3://...,
hf://datasets/... or memory://... goes through fsspec, which needs the store's package: gcsfs,
s3fs or huggingface_hub. One write of an object is atomic, so a reader such as a resumed run
never sees half of a file in either place.

An object store has no append: `open` refuses mode 'a' there, and run/appending.py joins new
bytes to an object instead. It has no directories either: `makedirs` does nothing there, and
a folder exists once an object lies under it.

Beside it: stores.py, the object stores behind URLs, and swap.py, the compare-and-swap writes
of a workdir's lock.
"""

from __future__ import annotations

import builtins
import contextlib
import glob as glob_lib
import io
import json
import os
import posixpath
import shutil
import tempfile
import uuid

# The stores' own names, which callers reach as fileio's: fileio.is_url, fileio.PathError.
from tst_jax.fileio.stores import (PathError, check_bucket_name, filesystem, is_url, protocol,
                                   reason, store_error, url_of)

# The stores an output may go to besides the local disk. A run's workdir is on a store whose
# writes can be conditional, for its lock: GCS's generations, S3's If-None-Match and If-Match.
# A file written whole (a token store, an export, a report) goes to any store fsspec writes
# objects to.
RUN_STORES = ("gs", "s3")
FILE_STORES = ("gs", "gcs", "s3")
NEW_FOLDER = "give a new directory"   # what to do about a file where an output folder goes


def join(path: str, *parts: str) -> str:
  """Joins path parts: with '/' for a URL, with os.path.join for a local path."""
  return posixpath.join(path, *parts) if is_url(path) else os.path.join(path, *parts)


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def dirname(path: str) -> str:
  return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def absolute(path: str) -> str:
  """Returns a local path made absolute with ~ expanded, and a URL as it is."""
  return path if is_url(path) else os.path.abspath(os.path.expanduser(path))


def user_cache(*parts: str, environ=os.environ) -> str:
  """Returns the folder `parts` under tst_jax's part of this user's cache directory,
  $XDG_CACHE_HOME or ~/.cache: files a later run on this machine finds again."""
  cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "tst_jax", *parts)


def expanduser(path: str) -> str:
  """Returns a local path with ~ expanded, and a URL as it is."""
  return path if is_url(path) else os.path.expanduser(path)


def local_path(path: str) -> str | None:
  """Returns `path` on this machine's disk, absolute with ~ expanded, for what only a local
  file can be (a memory map, a file that grows, a folder another program reads); None for
  a URL."""
  return None if is_url(path) else absolute(path)


def exists(path: str) -> bool:
  if not is_url(path):
    return os.path.exists(path)
  fs, p = filesystem(path)
  return fs.exists(p)


def isfile(path: str) -> bool:
  if not is_url(path):
    return os.path.isfile(path)
  fs, p = filesystem(path)
  return fs.isfile(p)


def isdir(path: str) -> bool:
  """Returns whether `path` is a directory: in a store, whether any object lies under it."""
  if not is_url(path):
    return os.path.isdir(path)
  fs, p = filesystem(path)
  return fs.isdir(p)


def listdir(path: str) -> list[str]:
  """Returns the sorted names in a directory, files and folders, without their path."""
  if not is_url(path):
    return sorted(os.listdir(path))
  fs, p = filesystem(path)
  return sorted(posixpath.basename(q.rstrip("/")) for q in fs.ls(p, detail=False)
                if q.rstrip("/") != p.rstrip("/"))


def makedirs(path: str):
  """Makes a local directory and its parents if missing. In a store, folders need no making."""
  if not is_url(path):
    os.makedirs(path, exist_ok=True)


def remove_empty_folder(path: str):
  """Removes the local folder `path` where it is empty. A store's folder goes with its last
  object."""
  if not is_url(path) and os.path.isdir(path) and not os.listdir(path):
    os.rmdir(path)


def getsize(path: str) -> int:
  if not is_url(path):
    return os.path.getsize(path)
  fs, p = filesystem(path)
  return int(fs.size(p))


def mtime(path: str) -> float:
  """Returns the time `path` was last written, in seconds since the epoch."""
  if not is_url(path):
    return os.path.getmtime(path)
  fs, p = filesystem(path)
  return fs.modified(p).timestamp()


def remove(path: str):
  """Removes one file, raising FileNotFoundError when it is missing."""
  if not is_url(path):
    os.remove(path)
    return
  fs, p = filesystem(path)
  if protocol(path) == "s3":
    fs.invalidate_cache(p)
    fs.info(p)        # S3 deletes a missing key without a word: this raises FileNotFoundError
  fs.rm_file(p)


def rmtree(path: str):
  """Removes a directory and everything under it, if it exists."""
  if not is_url(path):
    shutil.rmtree(path, ignore_errors=True)
    return
  fs, p = filesystem(path)
  if fs.exists(p):
    fs.rm(p, recursive=True)


def any_file(pattern: str) -> bool:
  """Says whether the glob `pattern` matches a file. Locally it stops at the first."""
  if is_url(pattern):
    return bool(glob_files(pattern))
  return any(os.path.isfile(p) for p in glob_lib.iglob(os.path.expanduser(pattern),
                                                         recursive=True))


def sizes(paths: list[str]) -> dict[str, int]:
  """Returns {path: bytes} of those of `paths` that exist: locally from a stat of each, in a
  store from one listing of each folder they are in."""
  found = {p: os.path.getsize(p) for p in paths if not is_url(p) and os.path.isfile(p)}
  urls = [p for p in paths if is_url(p)]
  for folder in sorted({dirname(p) for p in urls}):
    listed = glob_files(join(folder, "*"))
    found.update({p: listed[p] for p in urls if p in listed})
  return found


def glob(pattern: str) -> list[str]:
  """Returns the sorted files and folders matching `pattern`. `**` recurses, ~ expands locally."""
  return sorted(glob_files(pattern, files_only=False))


def glob_files(pattern: str, files_only: bool = True) -> dict[str, int]:
  """Returns {path: bytes} of the files matching `pattern` in sorted path order, from one
  listing in a store. `**` recurses. Folders are left out unless not `files_only`."""
  if not is_url(pattern):
    matches = sorted(glob_lib.glob(os.path.expanduser(pattern), recursive=True))
    return {p: os.path.getsize(p) if os.path.isfile(p) else 0 for p in matches
            if not files_only or os.path.isfile(p)}
  fs, p = filesystem(pattern)
  found = fs.glob(p, detail=True)
  return {url_of(fs, pattern, q): int(info.get("size") or 0) for q, info in sorted(found.items())
          if not files_only or info.get("type") == "file"}


def open(path: str, mode: str = "r", **kwargs):   # pylint: disable=redefined-builtin
  """Opens a file as builtins.open does. A URL opens through fsspec, which reads ranges of the
  object as they are asked for, and writes it once on close. Mode 'a' is refused there."""
  if not is_url(path):
    return builtins.open(path, mode, **kwargs)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{path}: an object store cannot append or update in place; "
                     "use tst_jax.run.appending.Appender")
  fs, p = filesystem(path)
  return fs.open(p, mode, **kwargs)


def read_bytes(path: str) -> bytes:
  """Returns a file's bytes. An object comes in one request, so one version of it: ranged
  reads sized by an earlier look could mix a rewritten object with its old length."""
  if not is_url(path):
    with builtins.open(path, "rb") as f:
      return f.read()
  fs, p = filesystem(path)
  return fs.cat_file(p)


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def read_json(path: str):
  return json.loads(read_text(path))


def write_bytes(path: str, data: bytes):
  """Writes `data` to `path` whole: locally through `path`.tmp and a rename, in a store as
  one object."""
  if is_url(path):
    fs, p = filesystem(path)
    fs.pipe_file(p, bytes(data))
    return
  with builtins.open(path + ".tmp", "wb") as f:
    f.write(data)
  os.replace(path + ".tmp", path)


def write_text(path: str, text: str):
  """Writes `text` to `path` whole, as `write_bytes` does."""
  write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj, *, sort_keys: bool = False, default=None):
  """Writes `obj` as indented JSON to `path` whole, as `write_bytes` does."""
  write_text(path, json.dumps(obj, indent=1, sort_keys=sort_keys, default=default))


def write_figure(path: str, fig):
  """Writes a matplotlib figure to `path` as a PNG, whole, as `write_bytes` does."""
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100)
  write_bytes(path, png.getvalue())


@contextlib.contextmanager
def staged(path: str):
  """Yields a local file name for a writer that needs one, such as safetensors', and makes
  that file `path` once the block ends: a rename beside a local `path`, one upload to a store.
  A block that raises leaves nothing at `path`."""
  if is_url(path):
    fd, local = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
  else:
    local = path + ".tmp"
  try:
    yield local
    if not is_url(path):   # a writer may make its file private, as safetensors' 0600
      os.chmod(local, _new_file_mode())
    move_in(local, path)
  finally:
    if os.path.exists(local):
      os.remove(local)


def _new_file_mode() -> int:
  """Returns the mode open() gives a new file here: 0o666 less the process's umask."""
  mask = os.umask(0o022)
  os.umask(mask)
  return 0o666 & ~mask


def upload_folder(local: str, path: str):
  """Copies the local folder `local` and everything under it to `path` in a store, then
  removes `local`."""
  fs, p = filesystem(path)
  fs.put(local.rstrip("/") + "/", p, recursive=True)
  rmtree(local)


def move_in(local: str, path: str):
  """Moves the finished local file `local` to `path`: a rename on the local disk, an upload of
  one object to a store, after which the local file is removed."""
  if not is_url(path):
    os.replace(local, path)
    return
  fs, p = filesystem(path)
  fs.put_file(local, p)
  os.remove(local)


def check_readable(path: str, what: str):
  """Raises one PathError naming `what` and `path` and why it cannot be read: missing, no
  such bucket, no credentials, not permitted, or no package for its store. A glob is checked
  up to the folder before its first wildcard."""
  check_bucket_name(path, what)
  fixed = _before_wildcard(path)
  try:
    if is_url(fixed):
      fs, p = filesystem(fixed)
      fs.info(p)                 # fs.exists would turn every refusal into False
    elif not os.path.exists(os.path.expanduser(fixed)):
      raise FileNotFoundError(2, "no such file", fixed)
    elif not os.access(os.path.expanduser(fixed), os.R_OK):
      raise PermissionError(13, "permission denied", fixed)
  except PathError:
    raise
  except FileNotFoundError:
    where = path if fixed == path else f"{path}: {fixed}"
    raise PathError(f"{what} {where} does not exist{_no_bucket(path)}") from None
  except Exception as e:   # pylint: disable=broad-except
    raise PathError(f"{what} {path} cannot be read: {reason(e, path)}") from None


def check_reachable(path: str, what: str):
  """Raises one PathError, as `check_readable` does, where the store of the URL `path`
  refuses it: no bucket, no credentials, not permitted or no package for the store. A local
  path passes: there nothing hides why a file is missing, and the caller says it."""
  if is_url(path):
    check_readable(path, what)


def _before_wildcard(path: str) -> str:
  """Returns `path` cut to the folder before its first wildcard, the whole path without one."""
  cut = min((path.index(c) for c in "*?[" if c in path), default=None)
  if cut is None:
    return path
  return path[:cut].rsplit("/", 1)[0] if "/" in path[:cut] else "."


def check_output(path: str, what: str, holds: str, stores: tuple[str, ...] = FILE_STORES, *,
                 remedy: str = NEW_FOLDER):
  """Raises one PathError where the output folder `path`, given as `what` (a flag), cannot
  be: in a store outside `stores` (`check_store`), or where nothing can be written
  (`check_writable`, whose `remedy` is said of a file in its place)."""
  check_store(path, what, holds, stores)
  check_writable(path, what, remedy=remedy)


def check_store(path: str, what: str, holds: str, stores: tuple[str, ...] = FILE_STORES):
  """Raises one PathError where the output `path` is a URL of a store outside `stores`, or in
  a bucket GCS refuses the name of, before anything asks that store. `holds` names the output
  for the error line: "a run's workdir"."""
  if is_url(path) and protocol(path) not in stores:
    where = ", ".join(["a local folder"] + [f"{s}://" for s in stores if s != "gcs"])
    raise PathError(f"{what} {path}: {holds} is {' or '.join(where.rsplit(', ', 1))}; "
                    f"{protocol(path)}:// is not supported there")
  check_bucket_name(path, what)


def check_writable(path: str, what: str, *, remedy: str = NEW_FOLDER):
  """Raises one PathError naming `what` and `path` and why no folder can be written there: a
  file in its place (the error line ends with `remedy`), a file above it, no permission, or in
  a store no bucket or no credentials. In a store it writes and removes a probe object, the one
  sure test of write permission."""
  try:
    if is_url(path):
      probe = join(path, f".tst_jax_write_probe_{uuid.uuid4().hex}")
      write_bytes(probe, b"")
      remove(probe)
      return
    if os.path.exists(absolute(path)) and not os.path.isdir(absolute(path)):
      raise PathError(f"{what} {path}: is a file, not a directory: {remedy}")
    parent = existing_parent(path)
    if not os.path.isdir(parent):
      raise NotADirectoryError(20, "a file is in the way", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
      raise PermissionError(13, "permission denied", parent)
  except PathError:
    raise
  except Exception as e:   # pylint: disable=broad-except
    raise PathError(f"{what} {path} cannot be written: {reason(e, path)}") from None


def existing_parent(path: str) -> str:
  """Returns the local `path`, absolute with ~ expanded, or its nearest folder that exists."""
  parent = absolute(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  return parent


def _no_bucket(path: str) -> str:
  """Returns ' (no bucket <name>)' when the bucket of a URL is missing, else ''."""
  if protocol(path) not in ("gs", "gcs", "s3"):
    return ""
  root = protocol(path) + "://" + path.split("://", 1)[1].split("/", 1)[0]
  try:
    return "" if exists(root) else f" (there is no bucket {root})"
  except Exception:   # pylint: disable=broad-except
    return ""
