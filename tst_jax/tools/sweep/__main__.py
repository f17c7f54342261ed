"""python -m tst_jax.tools.sweep: a user error is one line and exit status 2."""

import sys

from tst_jax import errors
from tst_jax.tools.sweep import main

errors.plain_warnings()
sys.exit(errors.main(main, debug="--verbosity=1" in sys.argv))
