"""Export a trained run as a Hugging Face model folder that transformers loads on its own.

  python -m tst_jax.tools.export --workdir W --out D [--step N] [--dtype float32|bf16]
      [--max-shard-size 5GB] [--overwrite] [--push_to_hub ORG/NAME [--private] [--revision B]]

D gets config.json and the weights from `tst_jax.convert.hf.to_hf`, of the next-token model
alone (a run's multi-token prediction heads stay behind): one model.safetensors, or
shards of at most --max-shard-size with model.safetensors.index.json, as huggingface_hub
splits them and `huggingface-cli upload` takes them. It also gets the run's tokenizer as
tokenizer.json and tokenizer_config.json, so that
`AutoModelForCausalLM.from_pretrained(D)` and `AutoTokenizer.from_pretrained(D)` work without
tst_jax. `max_position_embeddings` is the run's data.seq_len, the length it was trained at.
lm-eval's `--model hf` truncates contexts to it, as `python -m tst_jax.tools.eval` does. The
reverse, `--config.init_from_hf=D`, starts a run from such a folder.

--push_to_hub ORG/NAME then uploads the local D to that model repository of the Hugging Face
Hub (tst_jax/tools/hub.py), creating it where missing: private with --private, and on branch
--revision, created too, instead of main.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import tokenizers

from tst_jax import errors, fileio
from tst_jax.errors import WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.config import record
from tst_jax.train import trained_run
from tst_jax.convert import hf as convert_hf
from tst_jax.tools import hub

log = logging.getLogger("tst_jax")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def export(workdir: str, out: str, step: int | None = None, *, overwrite: bool = False,
           dtype: str = "float32", max_shard_size: int | str = "5GB") -> str:
  """Writes checkpoint `step`, by default the latest, of the run in `workdir` to folder `out`,
  local or in a bucket, and returns `out` made absolute.

  The weights are in `dtype`, float32 or bf16, in shards of at most `max_shard_size`.

  Refuses an `out` that holds files unless `overwrite`, which replaces only the files this
  writes. Everything is read and checked before anything is written.
  """
  out = fileio.absolute(str(out))
  fileio.check_output(out, "--out", "an export")
  if fileio.exists(out) and not fileio.isdir(out):
    raise fileio.PathError(f"--out {out} exists and is not a folder")
  if fileio.isdir(out) and fileio.listdir(out) and not overwrite:
    raise fileio.PathError(f"--out {out} is not empty; pass --overwrite to write into it")
  trained = trained_run.load(RunDir(workdir), step, dtype="float32")
  tokenizer_file = trained.rundir.tokenizer_json
  if not fileio.isfile(tokenizer_file):
    raise WorkdirError(f"{tokenizer_file} does not exist: only a run with a HF "
                       "tokenizer.json can be exported")
  tokenizer_json = fileio.read_bytes(tokenizer_file)   # the run's copy, maybe in a bucket
  eos = tokenizers.Tokenizer.from_str(tokenizer_json.decode()).id_to_token(
      trained.tokenizer.eos_id)
  if trained.phase1_only:
    log.warning("step %d is a phase-1 (TST) checkpoint: it predicts bags, not next tokens",
                trained.step)
  mtp = record.read_config(trained.rundir)["mtp"]
  if mtp.on:
    log.info("the run's %d multi-token prediction heads (mtp.kind=%s) stay behind: the export "
             "is the next-token model, as in their papers", mtp.k - 1, mtp.kind)

  convert_hf.to_hf(trained.model, out, overwrite=overwrite, dtype=dtype,
                   max_shard_size=max_shard_size)
  config_file = fileio.join(out, convert_hf.CONFIG_FILE)
  hf = fileio.read_json(config_file)
  hf.update(max_position_embeddings=trained.max_length, eos_token_id=trained.tokenizer.eos_id,
            bos_token_id=None, pad_token_id=None)
  fileio.write_text(config_file, json.dumps(hf, indent=2, sort_keys=True) + "\n")
  fileio.write_bytes(fileio.join(out, "tokenizer.json"), tokenizer_json)
  tokenizer_config = dict(
      tokenizer_class="PreTrainedTokenizerFast", eos_token=eos,
      model_max_length=trained.max_length, clean_up_tokenization_spaces=False)
  fileio.write_text(fileio.join(out, "tokenizer_config.json"),
                    json.dumps(tokenizer_config, indent=2) + "\n")
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tst_jax.tools.export", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the run's directory")
  parser.add_argument("--out", required=True, help="the Hugging Face folder to write")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--dtype", choices=sorted(convert_hf.EXPORT_DTYPES), default="float32",
                      help="the weights' dtype (default: float32)")
  parser.add_argument("--max-shard-size", default="5GB",
                      help="the largest safetensors file, e.g. 5GB or 500MB (default: 5GB)")
  parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
  parser.add_argument("--push_to_hub", metavar="ORG/NAME", default=None,
                      help="then upload --out, a local folder, to this model repository of "
                           "the Hugging Face Hub, created where missing")
  parser.add_argument("--private", action="store_true",
                      help="with --push_to_hub: a private repository (a public one is refused)")
  parser.add_argument("--revision", default=None,
                      help="with --push_to_hub: the branch to upload to, created where missing "
                           "(default: main)")
  args = parser.parse_args(argv)
  hub.check(args.push_to_hub, args.out, private=args.private, revision=args.revision)
  out = export(args.workdir, args.out, args.step, overwrite=args.overwrite, dtype=args.dtype,
               max_shard_size=args.max_shard_size)
  print(f"exported {args.workdir} to {out}", flush=True)   # before the upload, which may fail
  if args.push_to_hub:
    url = hub.push(out, args.push_to_hub, private=args.private, revision=args.revision)
    print(f"pushed {out} to {url}")


if __name__ == "__main__":
  sys.exit(errors.main(main))
