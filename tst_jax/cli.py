"""What `python main.py` runs: one mode (train, plan or eval) of a checked config.

The order matters and is written once here: the config is checked, the XLA flags and the
distributed runtime start before anything touches a device, `auto` is resolved once for this
platform (and, for a fit check, once for the target accelerator), then the plan is printed,
or the run's data is prepared and its loop trains or evaluates.
"""

from __future__ import annotations

import json
import sys

import jax

from tst_jax.data import run_data
from tst_jax.errors import ConfigError, StoreError, WorkdirError
from tst_jax.parallel import distributed, xla_flags
from tst_jax.rundir import RunDir
from tst_jax.config import spec as spec_lib
from tst_jax.train import fit, loop
from tst_jax.run import goodput, lock as lock_lib
from tst_jax.config.outlook import format_plan
from tst_jax.train.setup import Setup

MODES = ("train", "plan", "eval")


def run(config, workdir: str = "", mode: str = "train", accelerator: str = "",
        started: float | None = None) -> dict:
  """Trains, plans or evaluates the run of `config` in `workdir`. A plan with
  an `accelerator` also compiles both phases' steps on the mesh's devices and says if they
  fit. `started`: when the session began, the process's start where main.py runs it, else
  now; goodput.jsonl counts its wall time from there. Returns the run's summary (train), the
  plan (plan) or the eval record (eval)."""
  ledger = goodput.Ledger(started) if mode == "train" else None
  try:
    return _run(config, workdir, mode, accelerator, ledger)
  finally:
    if ledger is not None:
      ledger.close()


def _run(config, workdir: str, mode: str, accelerator: str,
         ledger: goodput.Ledger | None) -> dict:
  """Runs one mode of `run`, a training run timed by `ledger`."""
  checked = spec_lib.check(config)             # every field, once, before anything starts
  if mode not in MODES:
    raise ConfigError("--mode", f"must be one of {MODES}, got {mode!r}")
  if accelerator and mode != "plan":
    raise ConfigError("--accelerator", "only with --mode plan (it checks that a run fits)")
  if accelerator:
    fit.emulate_devices(fit.mesh_devices(checked.mesh))   # CPU devices, before JAX starts
  flags = xla_flags.apply(checked.mesh, checked.distributed,   # XLA reads them as it starts
                          fit.layer_param_bytes(checked.model),
                          platform="cpu" if accelerator else None)   # the fit compiles on CPU
  distributed.initialize(checked.distributed)  # before anything touches a device
  spec = checked.on_platform()                 # `auto`, resolved once: printed and recorded
  if mode == "plan":
    return plan(spec, flags, workdir, accelerator and (
        accelerator, checked.on_platform(fit.target_platform(accelerator))))
  if flags.applied and distributed.is_primary():
    print(flags.line())
  if not workdir:
    raise ConfigError("--workdir", "required for train and eval: give a new directory, or a "
                      "run's to resume it")
  rundir = RunDir(workdir)   # once, so the check, the lock and the run see one path
  spec.check_devices(jax.device_count())
  spec.check_paths()
  rundir.check_writable()
  lock = hold_workdir(rundir) if mode == "train" else None   # an eval only reads
  try:
    setup = Setup.create(spec, rundir, record=mode == "train")
    result = evaluate_latest(setup) if mode == "eval" else loop.train(setup, lock, ledger)
  except jax.errors.JaxRuntimeError as e:
    distributed.stop_if_peer_lost(e)   # exits 2 when another process died
    raise
  finally:   # a preemption returns, so this covers a normal end, an error and a stop
    if lock is not None and isinstance(sys.exc_info()[1], StoreError) and rundir.remote:
      lock.abandon()    # a bucket that failed is asked nothing more: a restart takes it over
    elif lock is not None:
      lock.release()
  distributed.finished()          # the other processes' watchdogs stop waiting for this one
  return result


def hold_workdir(rundir: RunDir) -> lock_lib.Lock | None:
  """Takes the workdir's lock on process 0 for all the run's processes, which all stop when
  another run holds it. Returns the lock, None on the other processes."""
  lock, refused = None, None
  if distributed.is_primary():
    try:
      lock = lock_lib.Lock.take(rundir)
    except WorkdirError as e:
      refused = e
  if distributed.any_process(refused is not None):
    raise refused or WorkdirError(f"--workdir {rundir}: process 0 could not take its lock: "
                                  "its error line says why")
  return lock


def plan(spec, flags, workdir: str, target) -> dict:
  """Prints the plan (with the passes over the data, from the store in `workdir` if there is
  one) and, with `target` = (accelerator, the spec resolved for it), the fit check."""
  print(flags.line())
  fitted = fit.check(spec, *target) if target else None
  tokens = run_data.training_tokens(spec.data, RunDir(workdir) if workdir else None)
  if target:       # and the run itself on the accelerator: what `auto` means there
    print(fitted.table(), f"on {target[0]}: {target[1].resolved.line()}", sep="\n")
  print(format_plan(spec.plan, spec.resolved, tokens=tokens,   # its last line: the plan's JSON
                    max_passes=spec.train.max_passes))
  return spec.plan.to_json() | (dict(fit=fitted.to_json()) if fitted else {})


def evaluate_latest(setup: Setup) -> dict:
  """Prints and returns the held-out loss of the run's latest checkpoint in its workdir and
  its bits per byte (None where the store does not record its bytes), as a JSON line."""
  state, step = setup.restore_or_init(emergency=False)
  loss = setup.evaluate(state.params)
  result = dict(step=step, eval_loss=loss, eval_bpb=setup.evaluate.bits_per_byte(loss))
  print(json.dumps(result))
  return result
