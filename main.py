"""Train, plan or evaluate a tst-jax run: python main.py --config configs/demo.py --workdir W."""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tst_jax import errors
from tst_jax.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (resumed if it exists).")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "plan", "eval"], "What to do.")
flags.mark_flags_as_required(["config"])


def parse_flags(argv):
  """A bad flag or config override is one `error:` line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
    sys.exit(errors.EXIT_STATUS)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  debug = flags.FLAGS.verbosity >= 1          # --verbosity=1: tracebacks of user errors too
  logging.set_verbosity(max(flags.FLAGS.verbosity, logging.INFO))
  errors.main(loop.run, _CONFIG.value, _WORKDIR.value, _MODE.value, debug=debug)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
