"""lm-eval harness tasks on a trained run, natively in JAX: lm-eval's model `tst_jax`
(tst_jax/train/downstream.py), on one checkpoint.

  python -m tst_jax.tools.eval --workdir W --tasks arc_easy,hellaswag [--num_fewshot 0] [--limit N]
      [--include_path DIR] [--step N] [--batch_size 16]

prints lm-eval's table and merges the results into <W>/lm_eval/step_<N>.json. `--tasks paper`
is the paper's protocol: ARC-e, ARC-c, BoolQ, HellaSwag, MMLU, OpenBookQA, PIQA and
Winogrande, 0-shot, and the average of the seven without MMLU, which its figures call
"average". Contexts are truncated from the left to data.seq_len, the length the run was
trained at, or to --max_length. Requests are right-padded into fixed-shape batches with
lengths rounded up to powers of two, and only continuation tokens are scored.

The alternative, with no tst_jax at evaluation time, is to export and run lm-eval's `hf`
model. Both give the same scores, as tests/tools/test_eval.py checks:

  python -m tst_jax.tools.export --workdir W --out D
  lm_eval --model hf --model_args pretrained=D,dtype=float32 --tasks arc_easy
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys

try:
  from lm_eval import utils as lm_utils   # an optional dependency, as train/downstream.py says
except ImportError as e:
  raise ImportError("tst_jax.tools.eval needs lm-eval: pip install -e '.[eval]' (or pip "
                    "install lm-eval)") from e

from tst_jax import errors, fileio
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.train.downstream import (PAPER_AVERAGE, TstJaxLM, evaluate, fewshot,
                                      paper_average, task_list, write_results)
from tst_jax.tools import sample


def results_table(results: dict) -> str:
  """Returns lm-eval's table of `results`, made in this process. Its table writer
  (dataproperty) would fork a worker per CPU to format the cells, and a fork of a process
  running JAX can deadlock, as JAX warns; one CPU counted is no worker."""
  cpu_count = multiprocessing.cpu_count
  multiprocessing.cpu_count = lambda: 1
  try:
    return lm_utils.make_table(results)
  finally:
    multiprocessing.cpu_count = cpu_count


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tst_jax.tools.eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the run's directory")
  parser.add_argument("--tasks", required=True,
                      help="comma list of lm-eval task names; 'paper': the paper's eight")
  parser.add_argument("--num_fewshot", type=int, default=None,
                      help="default: the task's own; 0 with --tasks paper")
  parser.add_argument("--limit", type=float, default=None, help="documents per task")
  parser.add_argument("--include_path", default=None, help="folder of extra task YAMLs")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--max_length", type=int, default=None,
                      help="context length (default: the run's data.seq_len)")
  args = parser.parse_args(argv)
  fileio.check_readable(args.workdir, "--workdir")
  rundir = RunDir(args.workdir)
  fileio.check_writable(rundir.lm_eval, "--workdir")
  trained = trained_run.load(rundir, args.step)
  if trained.phase1_only:
    print(f"eval: warning: {sample.phase1_message(trained)}", file=sys.stderr)
  lm = TstJaxLM(trained=trained, batch_size=args.batch_size, max_length=args.max_length)
  limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
  shots = fewshot(args.tasks, args.num_fewshot)
  try:
    results = evaluate(lm, task_list(args.tasks), num_fewshot=shots, limit=limit,
                       include_path=args.include_path)
  except ConnectionError as e:   # datasets' for a Hub it cannot reach, after its retries
    raise errors.DataError(
        f"--tasks {args.tasks}: {' '.join(str(e).split())}: lm-eval downloads a task's dataset "
        "from the Hugging Face Hub on first use and reads its cache after (HF_HOME): run where "
        "the Hub is reachable once, or give local tasks with --include_path") from None
  print(results_table(results))
  average = paper_average(results)
  if average is not None:
    print(f"the paper's average of {len(PAPER_AVERAGE)} tasks ({', '.join(PAPER_AVERAGE)}; "
          f"{shots}-shot): {average:.4f}")
  print(f"results: {write_results(results, rundir, trained.step)}")


if __name__ == "__main__":
  sys.exit(errors.main(main))
