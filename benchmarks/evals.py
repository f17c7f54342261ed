"""What a run's evals cost: the held-out eval with and without phase 1's bag loss, the bytes
the bits per byte need, and train.eval_tasks on the local task and on synthetic requests; JSON.

  python benchmarks/evals.py --config configs/demo.py --workdir /tmp/tst_demo_evals

Prepares the config's data into --workdir (once), then times, on the config's model at its
initial parameters: one eval of eval_loss (an ntp phase's) and one of eval_loss with
eval_bag_loss (the first tst phase's), each after a warm-up eval, so without compiling; the
Evaluator's start with and without the bytes under its windows; one in-run scoring of the local
multiple-choice task (tests/testdata/mc_task: 10 documents, 30 requests); and the adapter's
log-likelihood requests per second at the config's data.seq_len (--requests of a context of
half and a continuation of an eighth of it), the rate a task's requests go at. Prints one
JSON object.
"""

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")   # the local task needs no download
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tst_jax import configlib  # noqa: E402
from tst_jax.rundir import RunDir  # noqa: E402
from tst_jax.config import spec as spec_lib  # noqa: E402
from tst_jax.train import setup as setup_lib
from tst_jax.train.evaluate import Evaluator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_DIR = os.path.join(ROOT, "tests", "testdata", "mc_task")


def timed(fn, repeats: int = 3) -> float:
  """Returns the median seconds of `repeats` calls of `fn`, after one untimed call."""
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/demo.py")
  p.add_argument("--workdir", required=True, help="where the data is prepared (kept)")
  p.add_argument("--requests", type=int, default=256)
  args = p.parse_args()
  config = configlib.load_config(args.config)
  config.train.update(eval_tasks="tst_mc", eval_tasks_include=TASK_DIR)
  spec = spec_lib.check(config).on_platform()
  setup = setup_lib.Setup.create(spec, RunDir(args.workdir), record=False)
  params = setup.trainer.init_state(0).params
  ev, plan = setup.evaluate, spec.plan
  tst, ntp = plan.phases[0], plan.phases[-1]
  out = dict(config=args.config, device=jax.devices()[0].device_kind,
             python=platform.python_version(), jax=jax.__version__,
             load_average=os.getloadavg()[0],
             eval_loss_s=timed(lambda: ev.record(params, ntp)),
             eval_loss_and_bag_loss_s=timed(lambda: ev.record(params, tst)))
  d, data = spec.data, setup.data
  shape = (d.batch_size, d.seq_len + 1)
  out["evaluator_start_s"] = timed(lambda: Evaluator(
      setup.trainer, data.eval_windows, 1, eos_id=data.tokenizer.eos_id), repeats=1)
  out["evaluator_start_with_bytes_s"] = timed(lambda: Evaluator(
      setup.trainer, data.eval_windows, 1, eos_id=data.tokenizer.eos_id,
      token_bytes=data.held_out.token_bytes(*shape)), repeats=1)
  tasks = setup.load_tasks()
  out["tasks_local_s"] = timed(lambda: tasks(params, plan.total_steps, ntp), repeats=1)
  from tst_jax.train import downstream   # pylint: disable=g-import-not-at-top
  from lm_eval.api.instance import Instance   # pylint: disable=g-import-not-at-top
  lm = downstream.TstJaxLM(trained=tasks.trained(params, plan.total_steps, ntp),
                           batch_size=d.batch_size)
  rng = np.random.default_rng(0)
  words = lambda n: " ".join(rng.choice(["def", "x", "return", "(", ")", ":", "self"], n))
  pairs = [(words(d.seq_len // 2), " " + words(d.seq_len // 8)) for _ in range(args.requests)]
  requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
  seconds = timed(lambda: lm.loglikelihood(requests, disable_tqdm=True), repeats=1)
  out["loglikelihood_requests_per_s"] = args.requests / seconds
  json.dump(out, sys.stdout)
  print()


if __name__ == "__main__":
  main()
