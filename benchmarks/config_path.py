"""Follow a run's config from the entry point: the modules it is handed to, in order.

  python benchmarks/config_path.py [--config tests/fixtures/tiny_config.py] [--steps 2]

Runs `main.py`'s entry (`tst_jax.cli.run`, or `loop.run` at commits before it) on a tiny
two-phase run under `sys.setprofile`, following every call of a tst_jax function that is handed
the config as an argument: the ConfigDict itself, a RunSpec checked from it, or one of that
spec's parts (its sections, model config, plan, data settings); the methods and properties of
those objects themselves aside. Consecutive calls within one module are one visit. Prints
JSON:
  visits     the modules the config is handed to, in the order it happens;
  returns    per module, how many times the path comes back to it after leaving it, and the
             largest (at c5be70f: 6, tst_jax.train.step);
  climbs     how many visits climb back up a layer from the one before (the table of
             tests/behaviour/test_import_layers.py; at c5be70f: 9).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default=os.path.join(ROOT, "tests", "fixtures", "tiny_config.py"))
  p.add_argument("--steps", type=int, default=2)
  args = p.parse_args()
  from tests.behaviour.test_import_layers import layer   # the project's layer table, one home
  from tst_jax import configlib
  config = configlib.load_config(args.config)
  config.train.steps = args.steps
  try:
    from tst_jax import cli
    entry = cli.run
  except ImportError:              # before the cli module existed
    from tst_jax.train import loop
    entry = loop.run
  followed = {id(config)}      # the ConfigDict, then what is checked from it (see above)
  visits = []

  def follow(spec):
    followed.add(id(spec))
    for name in getattr(spec, "__dataclass_fields__", ()):
      part = getattr(spec, name, None)
      if part is not None and not isinstance(part, (int, float, str, tuple)):
        followed.add(id(part))        # its sections, model config, plan, data settings

  def profile(frame, event, arg):
    del arg
    if event != "call":
      return
    module = frame.f_globals.get("__name__", "")
    if not module.startswith("tst_jax"):
      return
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    given = [frame.f_locals.get(n) for n in names if n not in ("self", "cls")]
    for value in frame.f_locals.values():     # a spec checked from the config: follow it
      if type(value).__name__ == "RunSpec" and code.co_name != "__init__":
        follow(value)
    if any(id(v) in followed for v in given) and (not visits or visits[-1] != module):
      visits.append(module)

  with tempfile.TemporaryDirectory() as workdir:
    sys.setprofile(profile)
    try:
      entry(config, workdir)
    finally:
      sys.setprofile(None)
  returns, left = {}, set()
  for before, module in zip([None] + visits, visits):
    if module in left:
      returns[module] = returns.get(module, 0) + 1
    left.add(before)
    left.discard(module)
  layers = [layer(m) for m in visits]
  climbs = sum(1 for a, b in zip(layers, layers[1:]) if None not in (a, b) and b > a)
  print(json.dumps(dict(entry=f"{entry.__module__}.{entry.__name__}", visits=visits,
                        returns=returns, max_returns=max(returns.values(), default=0),
                        climbs=climbs), indent=1))

if __name__ == "__main__":
  main()
