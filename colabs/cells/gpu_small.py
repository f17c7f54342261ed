"""The cells of gpu_small.ipynb: configs/gpu_small.py's TST against its baseline on one GPU."""

from cells import INSTALL, SMALL_FLAG

CELLS = [
    ("md", '''
# TST beats its equal-FLOPs baseline on one GPU: configs/gpu_small.py

A 33.6M-parameter Llama (d 512, 8 layers, an 8,192-token BPE) trained 2000 steps of 64 x 512
positions twice, at the same FLOPs per step (6.60 TFLOPs):

* **TST**: 600 steps (r = 0.3) reading bags of S = 2 tokens, then 1400 next-token steps;
* **baseline**: 2000 next-token steps (`configs/gpu_small.py:baseline`).

**Expected** (docs/results.md, measured on one **H100 80GB**, 2026-11-25, jax 0.11.2, commit
c5be70f, seeds 0 and 1, on 200 MB of Python source: the `*.py` of a torch install's
site-packages): held-out next-token loss **TST 1.836 ± 0.004, baseline 1.917 ± 0.005** (TST
ahead by 0.081 ± 0.001). Against finished baselines of 3k and 4k steps as well, the same
loss costs the baseline 1.28x TST's compute (seed 0): less than the paper's 1.8x at 3B and
> 2.5x at 10B-A1B. S = 2 was the best bag size at this scale (S = 4: 1.13x; the paper's S: 4-8).
Time on the H100: about 80 s of GPU per arm, plus 33 s to tokenize the corpus once. Colab
runtimes (T4, L4, A100) have not been measured: expect several times the H100's time; this
notebook prints each run's wall time.

The corpus here is this runtime's own site-packages (Colab ships torch, so it is Python
source of the same kind, but not the same files): compare the **gap** between the two runs
with 0.08 nats, not the absolute losses. `TST_SMALL=1` shrinks everything to seconds on CPU
(that is what CI runs).
'''),
    ("code", INSTALL),
    ("code", f'''
import os, sysconfig, tempfile, time

import jax
import matplotlib.pyplot as plt

from tst_jax import configlib
from tst_jax.rundir import RunDir
from tst_jax import cli
from tst_jax.run import workdir as workdir_lib
from tst_jax.config import spec as spec_lib
from tst_jax.config.outlook import format_plan

{SMALL_FLAG}
print("JAX", jax.__version__, jax.devices())
'''),
    ("md", '''
## The configs

`configs/gpu_small.py` as `main.py --config` reads it; the corpus is the `*.py` files of this
Python's site-packages, at most 200 MB (the config's `data.max_bytes`). The baseline reads
the TST run's token store (`tokens:`), so both train on the same tokens and are judged on the
same held-out windows.
'''),
    ("code", '''
GPU_SMALL = os.path.join(REPO, "configs", "gpu_small.py")
SOURCE = os.environ.get("TST_SOURCE", f"text:{sysconfig.get_paths()['purelib']}/**/*.py")
SMALL = [  # TST_SMALL: a 2-layer float32 model, 12 steps on 200 kB of the stdlib, on CPU
    "data.source=builtin:pystdlib", "data.max_bytes=200000", "data.seq_len=16",
    "data.batch_size=4", "data.eval_batches=2", "model.vocab_size=512", "model.dim=32",
    "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.ffw_dim=64",
    "model.dtype=float32", "loss.impl=xla", "optimizer.warmup_steps=2", "train.steps=12",
    "train.eval_every=4", "train.log_every=4", "train.checkpoint_every=1000"]


def gpu_small_config(arg=""):
  config = configlib.load_config(GPU_SMALL + (f":{arg}" if arg else ""))
  return configlib.apply_overrides(config, SMALL if TST_SMALL else [f"data.source={SOURCE}"])


ROOT = os.environ.get("TST_WORKDIR") or tempfile.mkdtemp(prefix="tst_gpu_small_")
runs = {"TST": os.path.join(ROOT, "tst"), "baseline": os.path.join(ROOT, "baseline")}
tst_config, base_config = gpu_small_config(), gpu_small_config("baseline")
plan = spec_lib.check(tst_config).plan
print(format_plan(plan, with_json=False))
'''),
    ("md", '''
## Train both arms

Each cell resumes from its workdir's latest checkpoint if it is run again (e.g. after the
runtime was interrupted; `ROOT` must then be set to the same folder).
'''),
    ("code", '''
summary, seconds = {}, {}
start = time.time()
summary["TST"] = cli.run(tst_config, runs["TST"])
seconds["TST"] = time.time() - start
'''),
    ("code", '''
base_config.data.source = "tokens:" + os.path.join(runs["TST"], "data")
base_config.data.tokenizer = ""     # the store's own
start = time.time()
summary["baseline"] = cli.run(base_config, runs["baseline"])
seconds["baseline"] = time.time() - start
'''),
    ("md", '''
## Held-out next-token loss of both arms

At equal FLOPs per step, the step axis is the compute axis. The dashed line is TST's switch.
'''),
    ("code", '''
%matplotlib inline
# (inline again: cli.run switched matplotlib to Agg to write each run's loss.png)
fig, ax = plt.subplots(figsize=(8, 4.5))
for (label, workdir), color in zip(runs.items(), ("tab:orange", "tab:blue")):
  evals = [r for r in workdir_lib.read_metrics(RunDir(workdir)) if "eval_loss" in r]
  ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", color=color,
          label=f"{label}: held-out next-token loss")
switch = plan.phases[0].last_step
ax.axvline(switch, color="gray", ls="--", label=f"TST phase switch (step {switch})")
ax.set_xlabel("step (equal FLOPs per step)")
ax.set_ylabel("loss (nats/token)")
ax.set_ylim(top=min(ax.get_ylim()[1], 6.0))
ax.grid(alpha=0.3)
ax.legend()
plt.show()
EXPECTED = {"TST": 1.836, "baseline": 1.917}     # H100, torch site-packages, docs/results.md
for label, s in summary.items():
  print(f"{label:9s} final held-out loss {s['final_eval_loss']:.3f} (H100 reference "
        f"{EXPECTED[label]:.3f}), {seconds[label]:.0f} s")
gap = summary["TST"]["final_eval_loss"] - summary["baseline"]["final_eval_loss"]
print(f"TST - baseline: {gap:+.3f} nats (H100 reference: -0.081 ± 0.001)")
'''),
]
