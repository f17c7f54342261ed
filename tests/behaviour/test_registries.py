"""The four registries, model families, loss variants, source formats and trackers, keep one
rule for a name registered twice (schema.register): the same entry again is a no-op, another
is one ValueError naming the registry and the name, unless `replace=True` says to replace it."""

import pytest

from tst_jax import losses, models
from tst_jax.data import formats
from tst_jax.run import sinks

# kind: (register, unregister, the registry, two of its built-in names)
REGISTRIES = {
    "model family": (models.register, models.unregister, models.FAMILIES, "llama", "qwen3_moe"),
    "loss variant": (losses.register, losses.unregister, losses.VARIANTS, "mce", "alt"),
    "source format": (formats.register, formats.unregister, formats.FORMATS, "jsonl",
                      "parquet"),
    "tracker": (sinks.register, sinks.unregister, sinks.TRACKERS, "wandb", "trackio"),
}


@pytest.mark.parametrize("kind", REGISTRIES)
def test_a_name_registered_again_is_a_no_op_with_its_entry_and_an_error_with_another(kind):
  register, unregister, registry, first, second = REGISTRIES[kind]
  entry, other = registry[first], registry[second]
  names = tuple(registry)
  twice = rf"^{kind} '{{}}' is registered already: pass replace=True to replace it$"
  register("copy", entry)
  try:
    register("copy", entry)
    assert registry["copy"] is entry and tuple(registry) == names + ("copy",)
    with pytest.raises(ValueError, match=twice.format("copy")):
      register("copy", other)
    with pytest.raises(ValueError, match=twice.format(first)):
      register(first, other)                     # a built-in name too
    assert registry["copy"] is entry and registry[first] is entry
    register("copy", other, replace=True)
    assert registry["copy"] is other
  finally:
    unregister("copy")
  assert tuple(registry) == names


def test_tokens_names_no_source_format():
  with pytest.raises(ValueError, match="^'tokens' names a prepared store, not a source format$"):
    formats.register("tokens", formats.FORMATS["jsonl"])
