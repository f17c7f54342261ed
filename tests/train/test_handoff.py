"""The phase handoff (tst_jax/train/handoff.py): the randomisation ablation's fresh embedding
and head; the handoff through a checkpoint runs in tests/train/test_loop.py."""

import jax
import numpy as np

from tests.fixtures.tiny import tiny_config
from tst_jax.config import spec as spec_lib
from tst_jax.train import step as step_lib
from tst_jax.train.handoff import reinit_embedding_and_head


def test_reinit_takes_embedding_and_head_from_a_fresh_init_and_keeps_the_rest():
  spec = spec_lib.build(tiny_config())
  trainer = step_lib.Trainer.of(spec, jax.devices()[:1])
  state = trainer.init_state(spec.run.seed)
  fresh = trainer.init_state(spec.run.seed + 1)
  out = reinit_embedding_and_head(state, trainer)
  swapped = 0
  for (path, got), old, new in zip(jax.tree_util.tree_leaves_with_path(out.params),
                                   jax.tree.leaves(state.params), jax.tree.leaves(fresh.params)):
    io = jax.tree_util.keystr(path).startswith(("['embed']", "['lm_head']"))
    np.testing.assert_array_equal(got, new if io else old)
    swapped += io
  assert swapped == 2 and int(out.step) == int(state.step)
