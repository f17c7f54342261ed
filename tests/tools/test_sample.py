"""Sampling with the KV cache: greedy tokens equal repeated full forward passes; seeded
nucleus sampling; the CLI streams text and refuses phase-1 checkpoints."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures import trained
from tst_jax import errors
from tst_jax.models import sampling
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.tools import sample


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained.workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def final(workdir):
  return trained_run.load(RunDir(workdir))


def _greedy_by_full_forward(model, prompt, n):
  """Reference: the whole sequence through the model each step (right-padded to one shape,
  so one compilation; causal, so the padding changes nothing before it)."""
  forward = nnx.jit(lambda m, tokens: m(tokens))
  ids = list(prompt)
  for _ in range(n):
    padded = np.zeros((1, len(prompt) + n), np.int32)
    padded[0, :len(ids)] = ids
    ids.append(int(jnp.argmax(forward(model, padded)[0, len(ids) - 1])))
  return ids[len(prompt):]


def test_greedy_sampling_equals_repeated_full_forward(final):
  tok = final.tokenizer
  prompts = [[tok.eos_id] + tok.encode(text)
             for text in ("def main(", "import os\nimport sys\n\nclass Foo(object):\n    def")]
  got = sampling.Sampler(final.model).generate(prompts, 12, temperature=0.0)
  for prompt, new in zip(prompts, got):
    assert new == _greedy_by_full_forward(final.model, prompt, 12)


def test_sampling_is_seeded_and_top_p_narrows_to_greedy(final):
  sampler = sampling.Sampler(final.model)
  prompt = [[final.tokenizer.eos_id] + final.tokenizer.encode("for i in")]
  a = sampler.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=3)
  assert a == sampler.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=3)
  assert a != sampler.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=4)
  assert (sampler.generate(prompt, 10, temperature=1.0, top_p=1e-6, seed=3)
          == sampler.generate(prompt, 10, temperature=0.0))
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  kept = np.isfinite(sampling.filter_top_p(logits, jnp.float32(0.75)))
  assert kept.tolist() == [[True, True, False, False]]


def test_cli_streams_text_and_refuses_phase1_checkpoints(workdir, capsys):
  sample.main(["--workdir", workdir, "--prompt", "def f(", "--max_new_tokens", "8",
               "--temperature", "0"])
  out = capsys.readouterr().out
  assert out.startswith("def f(") and len(out) > len("def f(\n")
  with pytest.raises(SystemExit) as stop:
    errors.main(sample.main, ["--workdir", workdir, "--step", str(trained.PHASE1_STEP),
                              "--prompt", "x"])
  err = capsys.readouterr().err
  assert stop.value.code == 2 and err.startswith("error: --step: step 4 of ") and err.count(
      "\n") == 1 and "predicts bags, not next tokens" in err
  sample.main(["--workdir", workdir, "--step", str(trained.PHASE1_STEP), "--prompt", "x",
               "--max_new_tokens", "2", "--force"])
  assert capsys.readouterr().out.startswith("x")


def test_a_run_in_a_bucket_samples_the_text_of_the_run_on_the_disk(workdir, bucket, capsys):
  args = ["--prompt", "def f(", "--max_new_tokens", "8", "--temperature", "0"]
  sample.main(["--workdir", workdir, *args])
  here = capsys.readouterr().out
  sample.main(["--workdir", trained.in_bucket(workdir, bucket), *args])
  assert capsys.readouterr().out == here
