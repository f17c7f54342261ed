"""Train, plan or evaluate a tst-jax run: python main.py --config configs/demo.py --workdir W."""

from absl import app, flags, logging
from ml_collections import config_flags

from tst_jax.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (resumed if it exists).")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "plan", "eval"], "What to do.")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  loop.run(_CONFIG.value, _WORKDIR.value, _MODE.value)


if __name__ == "__main__":
  app.run(main)
