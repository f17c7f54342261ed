"""Train, plan or evaluate a tst-jax run: python main.py --config configs/demo.py --workdir W."""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tst_jax import cli, configlib, errors
from tst_jax.run import lock
from tst_jax.config import spec as spec_lib
from tst_jax.train import fit

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (resumed if it exists).")
_MODE = flags.DEFINE_enum("mode", "train", list(cli.MODES), "What to do.")
_ACCELERATOR = flags.DEFINE_enum(
    "accelerator", None, list(fit.HBM_GB), "With --mode plan: compile both phases' steps on "
    "the mesh's devices (emulated on CPU) and say whether they fit this accelerator's memory.")
flags.mark_flags_as_required(["config"])


def parse_flags(argv):
  """A bad flag, config file or config override is one `error:` line and exit status 2;
  --help-config lists every config field (its default, doc and rule) and exits."""
  if "--help-config" in argv:
    print(spec_lib.help_text())
    sys.exit(0)
  try:
    argv = flags.FLAGS(argv)
    path_arg = flags.FLAGS["config"].config_filename
    if not os.path.isfile(configlib.config_arg(path_arg)[0]):
      raise errors.ConfigError("--config", f"no such file: {configlib.config_arg(path_arg)[0]}")
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    configlib.refuse_arm_overrides(path_arg, [f"{k}={v}" for k, v in overrides.items()],
                                   "--config.")
    return argv
  except flags.Error as e:   # a config file that raised: its traceback is in the message
    user_error = errors.user_error_in(e)
    if user_error is not None:   # config_flags re-raises it as a TypeError: say it as it is
      sys.stderr.write(errors.one_line(user_error) + "\n")
      sys.exit(errors.EXIT_STATUS)
    head, _, trace = str(e).partition("Traceback")
    last = trace.strip().splitlines()[-1] if trace.strip() else ""
    line = f"error: {' '.join((head + last).split())}"
  except (AttributeError, KeyError) as e:   # ml_collections: an unknown --config.<field>
    name = str(e).strip("'\"")
    flag = next((a for a in argv if a.startswith("--config.") and f".{name}" in a), name)
    line = (f"error: {flag.partition('=')[0]}: the config has no field {name!r} "
            "(every field: python main.py --help-config)")
  except errors.UserError as e:
    line = errors.one_line(e)
  sys.stderr.write(line + "\n")
  sys.exit(errors.EXIT_STATUS)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Library logs (orbax, jax) are warnings only, unless asked for: --verbosity=0 shows INFO,
  # --verbosity=1 also DEBUG and the traceback of a user error.
  verbosity = flags.FLAGS.verbosity if flags.FLAGS["verbosity"].present else logging.WARNING
  debug = verbosity >= 1
  logging.set_verbosity(verbosity)
  errors.plain_warnings()
  errors.main(cli.run, _CONFIG.value, _WORKDIR.value, _MODE.value, debug=debug,
              accelerator=_ACCELERATOR.value or "", started=lock.process_start())


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
