"""Compare-and-swap writes, the primitives of a workdir's lock (run/lock.py): a file created
only where none is, and a write or a delete only where the file is as it was read. On a disk
they are hard links and renames, in a bucket its preconditions."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import time
import uuid

from tst_jax.fileio import filesystem, is_url, protocol, read_bytes, write_bytes


def create_new(path: str, data: bytes | str) -> bool:
  """Writes `data` to `path` only if nothing is there, as one atomic step, and returns whether
  it did: of racers for one path, exactly one gets True. A local file is hard-linked into place,
  a store's write is create-only: ifGenerationMatch=0 in GCS, If-None-Match in S3."""
  data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
  if is_url(path):
    fs, p = filesystem(path)
    try:
      fs.pipe_file(p, data, mode="create")
    except FileExistsError:
      return False
    return True
  aside = f"{path}.{uuid.uuid4().hex}.tmp"
  with builtins.open(aside, "wb") as f:
    f.write(data)
  try:
    return _link(aside, path, data)
  finally:
    os.remove(aside)


def _link(aside: str, path: str, data: bytes) -> bool:
  """Hard-links `aside` to `path` if nothing is there: without hard links, it creates `path`."""
  try:
    os.link(aside, path)
  except FileExistsError:
    return False
  except OSError:
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
  return True


def version(path: str) -> str | None:
  """Returns a token that changes whenever `path` is written with other contents, None where
  there is no file: a GCS generation, an S3 ETag, else the contents' sha256, which renames keep."""
  try:
    if not is_url(path):
      return hashlib.sha256(read_bytes(path)).hexdigest()
    fs, p = filesystem(path)
    fs.invalidate_cache(p)
    info = fs.info(p)
  except FileNotFoundError:
    return None
  found = info.get("generation") or info.get("ETag") or info.get("etag")
  return str(found) if found else hashlib.sha256(fs.cat_file(p)).hexdigest()


def remove_if_unchanged(path: str, seen: str) -> bool:
  """Removes the file at `path` if its `version` is still `seen`, and returns whether it did: a
  dead run's lock. GCS's delete carries ifGenerationMatch, S3's If-Match, and a local file is
  renamed aside first."""
  if not is_url(path):
    aside = f"{path}.{uuid.uuid4().hex}.stale"
    try:
      st = os.stat(path)   # before the rename, which sets its ctime
      os.rename(path, aside)
    except FileNotFoundError:
      return False
    # A second link pins a file while a write compares it, unless that write's process died.
    pinned = os.stat(aside).st_nlink > 1 and time.time() - st.st_ctime < 10
    unchanged = version(aside) == seen and not pinned
    if not unchanged:              # a newer holder's file goes back, unless yet another is there
      _link(aside, path, read_bytes(aside))
    os.remove(aside)
    return unchanged
  if version(path) != seen:
    return False
  fs, p = filesystem(path)
  try:
    if protocol(path) in ("gs", "gcs"):
      fs.call("DELETE", "b/{}/o/{}", *fs.split_path(p)[:2], ifGenerationMatch=seen)
      fs.invalidate_cache(p)
    elif protocol(path) == "s3":
      fs.call_s3("delete_object", Bucket=fs.split_path(p)[0], Key=fs.split_path(p)[1],
                 IfMatch=seen)
      fs.invalidate_cache(p)
    else:
      fs.rm_file(p)
  except (FileNotFoundError, FileExistsError):    # gone, or a precondition that failed
    return False
  except OSError as e:
    if _s3_condition_failed(e):
      return False
    raise
  return True


# S3's answers to a write or delete whose If-Match or If-None-Match did not hold: 412, or 409
# while another conditional write of the same key is under way. s3fs raises them as OSError.
_S3_CONDITION_FAILED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})


def _s3_condition_failed(e: OSError) -> bool:
  response = getattr(e.__cause__, "response", None) or {}
  return response.get("Error", {}).get("Code") in _S3_CONDITION_FAILED


def write_if_unchanged(path: str, data: bytes | str, seen: str) -> str | None:
  """Writes `data` to `path` whole if its `version` is still `seen`, and returns the new version,
  None where it changed or is gone: a lock's heartbeat. GCS's write carries ifGenerationMatch,
  S3's If-Match on the ETag."""
  data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
  if not is_url(path):
    return _replace_if_unchanged(path, data, seen)
  fs, p = filesystem(path)
  if protocol(path) == "s3":
    bucket, key, _ = fs.split_path(p)
    try:
      written = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=seen)
    except FileNotFoundError:
      return None
    except OSError as e:
      if _s3_condition_failed(e):
        return None
      raise
    finally:
      fs.invalidate_cache(p)
    return str(written["ETag"])
  if protocol(path) not in ("gs", "gcs"):
    if version(path) != seen:
      return None
    write_bytes(path, data)
    return version(path)
  bucket, key, _ = fs.split_path(p)
  cut = uuid.uuid4().hex     # gcsfs's own upload sends no precondition but create-only
  body = (f"--{cut}\nContent-Type: application/json\n\n{json.dumps(dict(name=key))}\n--{cut}"
          "\nContent-Type: application/octet-stream\n\n").encode() + data + f"\n--{cut}--".encode()
  try:
    return str(fs.call("POST", fs._location + "/upload/storage/v1/b/{}/o", bucket,   # pylint: disable=protected-access
                       uploadType="multipart", ifGenerationMatch=seen, data=body, json_out=True,
                       headers={"Content-Type": f'multipart/related; boundary="{cut}"'}
                       )["generation"])
  except (FileNotFoundError, FileExistsError):    # gone, or a precondition that failed
    return None


def _replace_if_unchanged(path: str, data: bytes, seen: str) -> str | None:
  """Replaces the local file `path` by `data` if its `version` is `seen`: a hard link pins it
  while it is compared, so a reader never finds it missing. Without hard links it checks first."""
  pin = f"{path}.{uuid.uuid4().hex}.pin"
  try:
    os.link(path, pin)
  except FileNotFoundError:
    return None
  except OSError:   # no hard links
    pin = path
  try:
    if version(pin) != seen:
      return None
    write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()
  finally:
    if pin != path:
      os.remove(pin)
