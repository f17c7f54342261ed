"""main.py with data in a bucket (the GCS emulator): a store, a glob or a bucket that does not
exist is one `error:` line naming it, exit 2, before anything compiles."""

import os
import subprocess
import sys

import pytest

from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax.data import run_data
from tst_jax.errors import ConfigError
from tst_jax.train import spec as spec_lib


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
    run_data.check_paths(spec_lib.check(config).data)
  assert caught.value.field == "data.source" and caught.value.message == line.format(bucket=bucket)
