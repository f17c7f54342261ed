"""Where a run's wall time went, over every session of its workdir, finished or running.

  python -m tst_jax.tools.goodput WORKDIR [--json]

prints the split of the wall time, from the first session's start to the last record, into
productive steps, compilation, data waits, checkpoint saves and restores, evaluation, startup,
the step time lost to restarts (steps trained again after a session died past its last
checkpoint) and the time between sessions, then one line per session. It reads goodput.jsonl,
which the run appends to as it trains (tst_jax/run/goodput.py); a running run's last session
ends at its last record. docs/running.md says how to read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tst_jax import errors
from tst_jax.rundir import RunDir
from tst_jax.run import goodput


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tst_jax.tools.goodput", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("workdir", help="the run's directory, local or a bucket's URL")
  parser.add_argument("--json", action="store_true",
                      help="print the account as JSON: the wall time, its parts, each session")
  args = parser.parse_args(argv)
  rundir = RunDir(args.workdir)
  run = goodput.read_account(rundir)
  if args.json:
    print(json.dumps(dict(wall=run.wall, goodput=run.goodput, seconds=run.seconds,
                          retrained=run.retrained, total_steps=run.total_steps,
                          sessions=[dataclasses.asdict(s) for s in run.sessions]), indent=1))
  else:
    print(goodput.report(run, str(rundir)))


if __name__ == "__main__":
  sys.exit(errors.main(main))
