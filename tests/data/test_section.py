"""config.data (tst_jax/data/section.py): its fields' rules, and the paths it names checked
before a run, each error naming its field."""

import pytest

from tests.fixtures.tiny import tiny_config
from tst_jax.config import spec as spec_lib
from tst_jax.data import section
from tst_jax.data.store import MANIFEST
from tst_jax.errors import ConfigError


def _data(config):
  """A tiny config's data settings as the trainer's spec makes them."""
  return spec_lib.check(config).data


def test_eval_sets_are_named_sources_and_a_missing_one_names_its_field(tmp_path):
  store = tmp_path / "store"            # check_paths asks only that a manifest is there
  store.mkdir()
  (store / MANIFEST).write_text("{}")
  config = tiny_config(data=dict(eval_sets=f"a=tokens:{store}, b.v-2=text:/x/*"))
  assert section.eval_sets(_data(config)) == (("a", f"tokens:{store}"),
                                              ("b.v-2", "text:/x/*"))
  for bad in ("a=tokens:/x,a=tokens:/y", "a b=tokens:/x", "tokens:/x", "a="):
    config.data.eval_sets = bad
    with pytest.raises(ConfigError) as caught:
      _data(config)
    assert caught.value.field == "data.eval_sets"
  config.data.eval_sets = f"a=tokens:{store},b=tokens:{tmp_path}/none"
  with pytest.raises(ConfigError, match="/none' is not a token store") as caught:
    section.check_paths(_data(config))
  assert caught.value.field == "data.eval_sets"
