"""A tiny two-phase run config for trainer tests: seconds per phase on CPU."""

from tst_jax.train.defaults import base_config


def tiny_config(steps=12, ratio=0.5, bag_size=2, **sections):
  """Small Llama on a 300 kB slice of the stdlib; `sections` override fields, e.g.
  tiny_config(train=dict(eval_every=4))."""
  c = base_config("llama", "tiny")
  c.data.max_bytes = 300_000
  c.data.seq_len = 16
  c.data.batch_size = 4
  c.data.eval_batches = 2
  c.data.val_fraction = 0.1
  c.model.update(vocab_size=512, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffw_dim=64)
  c.tst.update(bag_size=bag_size, ratio=ratio)
  c.optimizer.warmup_steps = 2
  c.mesh.data = 1                   # one device (tests/conftest.py forces 8 host devices)
  c.train.update(steps=steps, log_every=1, eval_every=4, checkpoint_every=2,
                 keep_checkpoints=3, progress_bar=False)
  for name, fields in sections.items():
    c[name].update(fields)
  return c
