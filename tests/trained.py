"""One small trained two-phase run, shared by the export, sample and lm-eval tests."""

import json
import os

from tests.tiny import tiny_config
from tst_jax.train import cli

PHASE1_STEP = 4   # the handoff checkpoint: phase 1 (TST) ends here
FINAL_STEP = 8


def config():
  """8 steps (4 TST with bags of 2, then 4 next-token), L = 32, checkpoints at 4, 6, 8."""
  return tiny_config(steps=FINAL_STEP, ratio=0.5, data=dict(seq_len=32, max_bytes=150_000),
                     train=dict(eval_every=100, checkpoint_every=2, keep_checkpoints=2))


def workdir(tmp_path_factory) -> str:
  """Trains the run once per pytest session (the first module fixture to ask trains it)."""
  path = tmp_path_factory.getbasetemp() / "trained_run"
  if not (path / "summary.json").exists():
    cli.run(config(), str(path))
  return str(path)


def summary(path) -> dict:
  with open(os.path.join(path, "summary.json")) as f:
    return json.load(f)
