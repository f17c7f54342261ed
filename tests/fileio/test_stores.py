"""The object stores behind URLs (tst_jax/fileio/stores.py): the bucket names GCS takes, and a
store that refuses a path, or whose package is missing, said in one line with the reason."""

import errno
import re

import fsspec
import pytest

from tst_jax import fileio
from tst_jax.fileio import stores


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
  stores.check_bucket_name(f"gs://{name}/run", "--workdir")
  stores.check_bucket_name(f"s3://{name.upper()}/run", "--out")   # S3 has its own rule


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
    (DefaultCredentialsError, r"no credentials \(DefaultCredentialsError\)$"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
     r"the store cannot be reached \(ConnectionRefusedError: \[Errno \d+\] Connection refused\)$")])
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
  assert "gcloud auth application-default login" in stores.reason(
      DefaultCredentialsError(), "gs://b/x")


def test_a_store_without_its_package_names_the_package(monkeypatch):
  def url_to_fs(url, **kwargs):
    raise ImportError("Install s3fs to access S3")
  monkeypatch.setattr(fsspec.core, "url_to_fs", url_to_fs)
  with pytest.raises(fileio.PathError, match=r"s3://b/x: s3:// paths need s3fs: pip install "
                     r"'tst-jax\[s3\]'"):
    fileio.check_readable("s3://b/x", "data.source")
