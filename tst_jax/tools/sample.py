"""Sample text from a trained run with a KV cache and a jitted decode step, streaming it out.

  python -m tst_jax.tools.sample --workdir W --prompt "def main(" [--max_new_tokens 100]
      [--temperature 0.8] [--top_p 0.95] [--seed 0] [--step N] [--force]

`--temperature 0` decodes greedily. The prompt follows an end-of-text token, as a document
start does in training. A checkpoint of TST's phase 1 is refused unless `--force`: it has only
seen bags and predicts the next bag, not the next token, as the paper's section 3 says.
"""

from __future__ import annotations

import argparse
import sys

from tst_jax import errors
from tst_jax.errors import ConfigError
from tst_jax.models.sampling import Sampler
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run


class _Stream:
  """Prints decoded text as tokens arrive, holding back an incomplete UTF-8 character."""

  def __init__(self, tokenizer, out=None):
    self.tokenizer, self.out, self.ids, self.printed = tokenizer, out or sys.stdout, [], 0

  def __call__(self, row: int, token: int):
    del row
    self.ids.append(token)
    text = self.tokenizer.decode(self.ids)
    if not text.endswith("\ufffd"):
      self.out.write(text[self.printed:])
      self.out.flush()
      self.printed = len(text)


def phase1_message(trained) -> str:
  return (f"step {trained.step} of {trained.rundir} is a phase-1 (token-superposition) "
          f"checkpoint: it has only seen bags of {trained.tst.bag_size} tokens, so it "
          "predicts bags, not next tokens (paper section 3).")


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tst_jax.tools.sample", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the run's directory")
  parser.add_argument("--prompt", default="", help="text to continue")
  parser.add_argument("--max_new_tokens", type=int, default=100)
  parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
  parser.add_argument("--top_p", type=float, default=0.95, help="nucleus sampling mass")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--force", action="store_true", help="sample a phase-1 checkpoint")
  args = parser.parse_args(argv)
  trained = trained_run.load(RunDir(args.workdir), args.step)
  if trained.phase1_only and not args.force:
    raise ConfigError("--step", f"{phase1_message(trained)} Its samples are not text: choose "
                      "a later --step, or pass --force to sample anyway.")
  tok = trained.tokenizer
  prompt = [tok.eos_id] + tok.encode(args.prompt)
  sys.stdout.write(args.prompt)
  Sampler(trained.model).generate(
      [prompt], args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
      seed=args.seed, eos_id=tok.eos_id, on_token=_Stream(tok))
  sys.stdout.write("\n")


if __name__ == "__main__":
  sys.exit(errors.main(main))
