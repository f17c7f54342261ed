"""main.py with data in a bucket (the GCS emulator): a store, a glob or a bucket that does not
exist is one `error:` line naming it, exit 2, before anything compiles; a run on a store in
the bucket logs the losses of the same run on its local copy."""

import os
import socket
import subprocess
import sys

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import cli, errors
from tst_jax.data import section
from tst_jax.errors import ConfigError
from tst_jax.config import spec as spec_lib


def test_main_names_a_missing_store_in_a_bucket_in_one_line(bucket, tmp_path):
  env = subprocess_env.one_cpu_device()          # after the emulator set its variables
  run = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG,
                        f"--workdir={tmp_path / 'run'}", f"--config.data.source=tokens:{bucket}/nope"],
                       env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2, run.stderr
  assert run.stderr.strip().splitlines() == [
      f"error: config.data.source: the token store {bucket}/nope does not exist"]
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("source,line", [
    ("tokens:gs://tst-no-such-bucket/store", "the token store gs://tst-no-such-bucket/store "
     "does not exist (there is no bucket gs://tst-no-such-bucket)"),
    ("jsonl:{bucket}/nope/*.jsonl", "the glob {bucket}/nope/*.jsonl: {bucket}/nope does not exist"),
    ("parquet:{bucket}/*.parquet", "'{bucket}/*.parquet' matches no files: give a glob of parquet "
     "files, e.g. 'parquet:/data/corpus/**/*.parquet'")])
def test_the_data_paths_check_names_what_is_missing(bucket, source, line):
  config = tiny_config()
  config.data.source = source.format(bucket=bucket)
  with pytest.raises(ConfigError) as caught:
    section.check_paths(spec_lib.check(config).data)
  assert caught.value.field == "data.source" and caught.value.message == line.format(bucket=bucket)


def _no_network(monkeypatch):
  """Makes every request of gcsfs fail at once as it does, out of retries, where
  storage.googleapis.com's name does not resolve."""
  gcsfs = pytest.importorskip("gcsfs")
  aiohttp = pytest.importorskip("aiohttp")
  key = aiohttp.client_reqrep.ConnectionKey("storage.googleapis.com", 443, True, True, None,
                                            None, None)

  async def request(self, *args, **kwargs):
    raise aiohttp.ClientConnectorDNSError(
        key, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
  monkeypatch.setattr(gcsfs.GCSFileSystem, "_request", request)
  monkeypatch.setenv("NO_GCE_CHECK", "true")   # credentials without a metadata server's wait


@pytest.mark.parametrize("mode,said", [
    ("plan", "'jsonl:{glob}' cannot be listed"), ("train", "the glob {glob} cannot be read")])
def test_a_bucket_that_cannot_be_reached_is_one_line_in_each_mode(
    monkeypatch, capsys, tmp_path, mode, said):
  _no_network(monkeypatch)
  monkeypatch.setattr(cli.Setup, "create", lambda *a, **k: pytest.fail("went on"))
  glob = "gs://tst-no-such-bucket-xyz/d/*.jsonl"
  config = tiny_config(data=dict(source=f"jsonl:{glob}"))
  with pytest.raises(SystemExit) as e:
    errors.main(cli.run, config, str(tmp_path / "run") if mode == "train" else "", mode=mode)
  assert e.value.code == errors.EXIT_STATUS
  assert capsys.readouterr().err.splitlines() == [
      f"error: config.data.source: {said.format(glob=glob)}: the store cannot be reached "
      "(ClientConnectorDNSError: Cannot connect to host storage.googleapis.com:443 ssl:default "
      "[Name or service not known])"]


def test_a_plan_names_a_bucket_that_does_not_exist_in_one_line(gcs_emulator):
  config = tiny_config(data=dict(source="jsonl:gs://tst-no-such-bucket-xyz/d/*.jsonl"))
  with pytest.raises(ConfigError) as caught:
    cli.run(config, "", mode="plan")
  assert caught.value.field == "data.source" and caught.value.message == (
      "'jsonl:gs://tst-no-such-bucket-xyz/d/*.jsonl' cannot be listed: no such bucket or folder")


@pytest.mark.slow
def test_a_run_on_a_store_in_a_bucket_logs_the_losses_of_the_local_store(bucket, tmp_path):
  """prepare --out gs://... and a local prepare give one fingerprint, and main.py on
  tokens:gs://... logs every loss of the same run on the local store (about 20 s on the 2-core machine with a warm compilation cache)."""
  import json   # pylint: disable=import-outside-toplevel
  env = dict(subprocess_env.one_cpu_device(), PYTHONPATH=ROOT)
  prepared = {}
  for name, out in (("remote", f"{bucket}/store"), ("local", str(tmp_path / "store"))):
    run = subprocess.run([sys.executable, "-m", "tst_jax.data.prepare", "--source=builtin:pystdlib",
                          "--max_bytes=300000", "--vocab_size=512", "--val_fraction=0.1",
                          "--workers=1", f"--out={out}"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    prepared[name] = json.loads(run.stdout.strip().splitlines()[-1])["fingerprint"]
  assert prepared["remote"] == prepared["local"]
  logged = {}
  for name, source in (("remote", f"tokens:{bucket}/store"), ("local", f"tokens:{tmp_path}/store")):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config", TINY_CONFIG,
                          f"--workdir={tmp_path / name}", f"--config.data.source={source}"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    with open(tmp_path / name / "metrics.jsonl") as f:
      logged[name] = [(r.get("step"), r.get("loss"), r.get("val_loss")) for r in map(json.loads, f)]
  assert len(logged["remote"]) > 10 and logged["remote"] == logged["local"]
