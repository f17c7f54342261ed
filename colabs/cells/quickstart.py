"""The cells of quickstart.ipynb: the demo's TST run against its baseline, on CPU."""

from cells import INSTALL, SMALL_FLAG

CELLS = [
    ("md", '''
# tst-jax quickstart: Token-Superposition Training vs. the baseline

Trains the demo (`configs/demo.py`: a 1.8M-parameter Llama on the Python standard library,
byte-level BPE of 4,096 tokens) twice at the same FLOPs per step:

* **TST**: phase 1 reads the stream in bags of S = 4 tokens (the mean of their embeddings is
  one position) and predicts the next bag with the multi-hot cross-entropy, for 30% of the
  steps; phase 2 is ordinary next-token training from that checkpoint.
* **baseline**: next-token training throughout (`configs/demo.py:baseline`, r = 0).

Then it plots both held-out next-token losses from the runs' `metrics.jsonl` and samples from
both models. On a 2-core CPU each run takes about 7 minutes; a Colab GPU is faster.
`TST_SMALL=1` shrinks everything to seconds (that is what CI runs).
'''),
    ("code", INSTALL),
    ("code", f'''
import os, tempfile

import jax
import matplotlib.pyplot as plt

from tst_jax import configlib
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.tools.sample import Sampler
from tst_jax import cli
from tst_jax.run import workdir as workdir_lib
from tst_jax.config import spec as spec_lib
from tst_jax.config.outlook import format_plan

{SMALL_FLAG}
print("JAX", jax.__version__, jax.devices())
'''),
    ("md", '''
## The two configs

`configlib.load_config` reads a config file as `main.py --config` does (`path[:arg]`);
`apply_overrides` takes the same `a.b=value` strings as `--config.a.b=value`.
'''),
    ("code", '''
DEMO = os.path.join(REPO, "configs", "demo.py")
SMALL = [  # TST_SMALL: a 2-layer model, 12 steps on 200 kB of text
    "data.max_bytes=200000", "data.seq_len=16", "data.batch_size=4", "data.eval_batches=2",
    "model.vocab_size=512", "model.dim=32", "model.n_layers=2", "model.n_heads=2",
    "model.n_kv_heads=1", "model.ffw_dim=64", "optimizer.warmup_steps=2",
    "train.steps=12", "train.eval_every=4", "train.log_every=1", "train.checkpoint_every=1000",
    "train.progress_bar=false"]


def demo_config(arg=""):
  config = configlib.load_config(DEMO + (f":{arg}" if arg else ""))
  return configlib.apply_overrides(config, SMALL if TST_SMALL else [])


ROOT = os.environ.get("TST_WORKDIR") or tempfile.mkdtemp(prefix="tst_quickstart_")
runs = {"TST": os.path.join(ROOT, "tst"), "baseline": os.path.join(ROOT, "baseline")}
tst_config, base_config = demo_config(), demo_config("baseline")
plan = spec_lib.check(tst_config).plan
print(format_plan(plan))
'''),
    ("md", '''
## Train

`cli.run(config, workdir)` is what `python main.py --config ... --workdir ...` calls. A
workdir that already holds a checkpoint resumes from it (run the cell again after an
interruption). The baseline reuses the TST run's tokenizer, so both are evaluated on the same
held-out tokens.
'''),
    ("code", '''
summary = {"TST": cli.run(tst_config, runs["TST"])}
'''),
    ("code", '''
base_config.data.tokenizer = os.path.join(runs["TST"], "tokenizer.json")
summary["baseline"] = cli.run(base_config, runs["baseline"])
'''),
    ("md", '''
## Loss curves

Phase 1's training loss is the MCE over bags (a different quantity, higher); the black
markers are what both runs are judged on: the held-out **next-token** loss. Against data
tokens (right), TST's phase 1 reads S times more text per step.
'''),
    ("code", '''
%matplotlib inline
# (inline again: cli.run switched matplotlib to Agg to write each run's loss.png)
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
for (label, workdir), color in zip(runs.items(), ("tab:orange", "tab:blue")):
  records = workdir_lib.read_metrics(RunDir(workdir))
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], color=color, alpha=0.35,
               label=f"{label}: train loss")
  for ax, x in ((axes[0], "step"), (axes[1], "data_tokens")):
    ax.plot([r[x] for r in evals], [r["eval_loss"] for r in evals], "o-", color=color,
            markeredgecolor="k", label=f"{label}: held-out next-token loss")
switch = plan.phases[0].last_step
axes[0].axvline(switch, color="gray", ls="--", label=f"TST phase switch (step {switch})")
axes[0].set_xlabel("step")
axes[1].set_xlabel("data tokens read")
for ax in axes:
  ax.set_ylabel("loss (nats/token)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
plt.show()
for label, s in summary.items():
  print(f"{label:9s} final held-out loss {s['final_eval_loss']:.3f} nats/token, "
        f"{s['data_tokens']:,} data tokens")
'''),
    ("md", '''
## Sample

`trained_run.load` restores a run's latest parameters with its config and tokenizer;
`Sampler` decodes with a KV cache (the command line: `python -m tst_jax.tools.sample --workdir W`).
'''),
    ("code", '''
prompt = "def main("
for label, workdir in runs.items():
  trained = trained_run.load(RunDir(workdir))
  tok = trained.tokenizer
  [new] = Sampler(trained.model).generate(
      [[tok.eos_id] + tok.encode(prompt)], 24 if TST_SMALL else 150, temperature=0.7,
      top_p=0.95, seed=0, eos_id=tok.eos_id)
  print(f"----- {label} (step {trained.step}) -----")
  print(prompt + tok.decode(new))
'''),
]
