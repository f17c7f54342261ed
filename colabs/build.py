"""Writes the four notebooks of colabs/ from the cells below, so they stay in sync.

  python colabs/build.py            # rewrite quickstart/inside_tst/fused_loss/gpu_small.ipynb
  python colabs/build.py --check    # exit 1 if a committed notebook differs from this file

Notebooks are stored without outputs. Every one opens with the same install cell and reads
TST_SMALL=1 (CI) to shrink its steps and sizes; tests/test_colabs.py runs them.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))

INSTALL = '''
# Install tst-jax unless it is importable: from this checkout when the notebook runs inside
# one, else (e.g. on Colab) from a clone of TST_JAX_GIT, which you set to the repository URL.
import importlib.util, os, subprocess, sys

TST_JAX_GIT = os.environ.get("TST_JAX_GIT", "https://github.com/<org>/tst-jax")  # <- set me


def find_checkout(path=os.getcwd()):
  while not os.path.isfile(os.path.join(path, "pyproject.toml")) or \\
      not os.path.isdir(os.path.join(path, "tst_jax")):
    if os.path.dirname(path) == path:
      return None
    path = os.path.dirname(path)
  return path


REPO = find_checkout()
if REPO is None:
  if "<org>" in TST_JAX_GIT:
    raise RuntimeError("Not inside a tst-jax checkout: set TST_JAX_GIT to the repository URL")
  REPO = os.path.abspath("tst-jax")
  if not os.path.isdir(REPO):
    subprocess.check_call(["git", "clone", "--quiet", "--depth", "1", TST_JAX_GIT, REPO])
if importlib.util.find_spec("tst_jax") is None:
  subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "-e", REPO])
  sys.path.insert(0, REPO)   # this kernel started before the editable install existed
print("tst-jax checkout:", REPO)
'''

SMALL_FLAG = 'TST_SMALL = os.environ.get("TST_SMALL", "0") == "1"   # CI: tiny sizes, seconds'


# -- quickstart ------------------------------------------------------------------------------
QUICKSTART = [
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

from tst_jax import trained_run, configlib
from tst_jax.tools.sample import Sampler
from tst_jax.train import loop, metrics
from tst_jax.train import spec as spec_lib
from tst_jax.train.plan import format_plan

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

`loop.run(config, workdir)` is what `python main.py --config ... --workdir ...` calls. A
workdir that already holds a checkpoint resumes from it (run the cell again after an
interruption). The baseline reuses the TST run's tokenizer, so both are evaluated on the same
held-out tokens.
'''),
    ("code", '''
summary = {"TST": loop.run(tst_config, runs["TST"])}
'''),
    ("code", '''
base_config.data.tokenizer = os.path.join(runs["TST"], "tokenizer.json")
summary["baseline"] = loop.run(base_config, runs["baseline"])
'''),
    ("md", '''
## Loss curves

Phase 1's training loss is the MCE over bags (a different quantity, higher); the black
markers are what both runs are judged on: the held-out **next-token** loss. Against data
tokens (right), TST's phase 1 reads S times more text per step.
'''),
    ("code", '''
%matplotlib inline
# (inline again: loop.run switched matplotlib to Agg to write each run's loss.png)
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
for (label, workdir), color in zip(runs.items(), ("tab:orange", "tab:blue")):
  records = metrics.read(os.path.join(workdir, "metrics.jsonl"))
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
  trained = trained_run.load(workdir)
  tok = trained.tokenizer
  [new] = Sampler(trained.model).generate(
      [[tok.eos_id] + tok.encode(prompt)], 24 if TST_SMALL else 150, temperature=0.7,
      top_p=0.95, seed=0, eos_id=tok.eos_id)
  print(f"----- {label} (step {trained.step}) -----")
  print(prompt + tok.decode(new))
'''),
]


# -- inside TST ------------------------------------------------------------------------------
INSIDE = [
    ("md", '''
# Inside TST: bags, next-bag targets, superposed embeddings, the MCE loss

The four pure functions phase 1 adds to ordinary training, on a toy batch of words.
Shapes: B batch, L data length, S bag size, l = L / S positions the model sees, D model
width, V vocabulary.
'''),
    ("code", INSTALL),
    ("code", f'''
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from tst_jax import losses, superposition

{SMALL_FLAG}
'''),
    ("md", '''
## A toy batch

The data loader hands phase 1 windows of S·l + 1 tokens (one extra for the last target).
Here two rows of words, S = 4, l = 4: 17 tokens per row.
'''),
    ("code", '''
S, l = 4, 4
text = ("the cat sat on the mat and then the dog sat on the log because it was warm "
        "a bird sang in the old tree while the sun set over the quiet hill far away").split()
vocab = sorted(set(text))
V = len(vocab)
ids = np.array([vocab.index(w) for w in text])
window_BxT = jnp.asarray(np.stack([ids[:S * l + 1], ids[S * l + 1:2 * (S * l + 1)]]))
word = lambda i: vocab[i] if i >= 0 else "·"
print("V =", V, "| window shape", window_BxT.shape)
print(" ".join(word(int(i)) for i in window_BxT[0]))
'''),
    ("md", '''
## `fold` and `bag_targets`

`tst_view` splits a window into inputs (all but the last token) folded into bags
`[B, l, S]`, and next-token labels turned into **next-bag** targets `[B, l, S]`: the labels
shifted by S − 1 and folded, so bag j's targets are the tokens of bag j + 1. The last bag
has one real target (the window's extra token) and S − 1 ignored ones (`-100`, shown as ·).
'''),
    ("code", '''
bags_BxlxS, targets_BxlxS = superposition.tst_view(window_BxT, S)
inputs_BxL, labels_BxL = superposition.ntp_view(window_BxT)
assert (bags_BxlxS == superposition.fold(inputs_BxL, S)).all()
assert (targets_BxlxS == superposition.bag_targets(labels_BxL, S)).all()
assert (targets_BxlxS[:, :-1] == bags_BxlxS[:, 1:]).all()   # next bag = the following bag
print("bags", bags_BxlxS.shape, "targets", targets_BxlxS.shape)

fig, axes = plt.subplots(1, 2, figsize=(12, 3.2))
for ax, grid, title in ((axes[0], bags_BxlxS[0], "input bags (row 0)"),
                        (axes[1], targets_BxlxS[0], "next-bag targets (row 0)")):
  grid = np.asarray(grid)
  ax.imshow(np.where(grid >= 0, np.arange(l)[:, None] + (ax is axes[1]), -1), cmap="Pastel1",
            vmin=-1, vmax=8, aspect="auto")
  for j in range(l):
    for i in range(S):
      ax.text(i, j, word(int(grid[j, i])), ha="center", va="center", fontsize=10)
  ax.set_xticks(range(S), [f"slot {i}" for i in range(S)])
  ax.set_yticks(range(l), [f"position {j}" for j in range(l)])
  ax.set_title(title)
fig.suptitle("position j reads bag j and predicts bag j + 1 (same colour = same tokens)")
plt.tight_layout()
plt.show()
'''),
    ("md", '''
## `superpose`: one position per bag

The model's input at position j is the mean of the S embeddings of bag j, summed in float32
and cast back to the table's dtype. Everything after the embedding is the ordinary model on
l positions, so a phase-1 step costs what a next-token step on l tokens costs, while reading
S·l tokens of data.
'''),
    ("code", '''
D = 8
table_VxD = jax.random.normal(jax.random.key(0), (V, D))
h_BxlxD = superposition.superpose(table_VxD, bags_BxlxS)
np.testing.assert_allclose(h_BxlxD[0, 0], table_VxD[bags_BxlxS[0, 0]].mean(0), rtol=1e-6)

rows = np.concatenate([np.asarray(table_VxD[bags_BxlxS[0, 0]]), np.asarray(h_BxlxD[0, :1])])
plt.figure(figsize=(7, 2.6))
plt.imshow(rows, cmap="RdBu_r", aspect="auto")
plt.yticks(range(S + 1), [word(int(t)) for t in bags_BxlxS[0, 0]] + ["mean = input 0"])
plt.xlabel("embedding dimension")
plt.colorbar()
plt.title("bag 0: its S token embeddings and the superposed input")
plt.show()
'''),
    ("md", '''
## `mce_loss`: the multi-hot cross-entropy

For every position, the targets are S tokens; each bag column i contributes the ordinary
cross-entropy `logsumexp(z) − z[y_i]`, averaged over the column's valid entries, and the
columns are combined with weights w_i (uniform by default). The target distribution puts
w_i / Σw on each token of the bag, so for distinct tokens the lowest possible loss is its
entropy, log S; `kl=True` subtracts it (0 at the optimum).
'''),
    ("code", '''
logits_BxlxV = jax.random.normal(jax.random.key(1), (2, l, V))
loss = losses.mce_loss(logits_BxlxV, targets_BxlxS)

# By hand: per-column mean CE over valid targets, averaged over the columns.
logp = np.asarray(jax.nn.log_softmax(logits_BxlxV, axis=-1)).reshape(-1, V)
t = np.asarray(targets_BxlxS).reshape(-1, S)
columns = [-logp[t[:, i] >= 0, t[t[:, i] >= 0, i]].mean() for i in range(S)]
np.testing.assert_allclose(loss, np.mean(columns), rtol=1e-5)
print(f"random logits: MCE = {float(loss):.3f} nats (log V = {np.log(V):.3f})")

# The best a model can do is predict the target distribution itself (count / S for each
# token of the bag); its loss is that distribution's entropy: log S for S distinct tokens,
# less when a word repeats inside a bag ("the ... the").
onehot_BxlxV = jax.nn.one_hot(targets_BxlxS, V).sum(-2)      # ignored (-100) targets add 0
full_BxlxS = targets_BxlxS[:, :-1]                             # positions with S real targets
p_target = onehot_BxlxV[:, :-1] / S
best_logits = jnp.log(jnp.maximum(p_target, 1e-30))
entropy = float(-(p_target * jnp.log(jnp.where(p_target > 0, p_target, 1.0))).sum(-1).mean())
print(f"best logits:   MCE = {float(losses.mce_loss(best_logits, full_BxlxS)):.3f} = mean "
      f"target entropy {entropy:.3f} (log S = {np.log(S):.3f}; kl=True subtracts log S)")

# S = 1 is the ordinary next-token cross-entropy of phase 2.
next_logits = jax.random.normal(jax.random.key(2), (2, S * l, V))
np.testing.assert_allclose(losses.mce_loss(next_logits, labels_BxL[..., None]),
                           losses.cross_entropy(next_logits, labels_BxL), rtol=1e-6)
'''),
    ("md", '''
## What the loss asks for

Left: the target distribution of each position of row 0 (multi-hot, 1/S per token; the
last position only knows its first target). Right: weightings of the bag slots
(`tst.weighting`): `uniform` (the paper's), `power` 1/i, `exponential` e^(−i), `first`
(only the next token: the input-only ablation).
'''),
    ("code", '''
per_pos, valid = losses.mce_loss_per_position(logits_BxlxV, targets_BxlxS)
print("per-position loss (row 0):", np.round(np.asarray(per_pos[0]), 3), "valid:",
      np.asarray(valid[0]))

fig, axes = plt.subplots(1, 2, figsize=(13, 3.4), gridspec_kw=dict(width_ratios=[2.2, 1]))
target_dist = np.asarray(onehot_BxlxV[0] / onehot_BxlxV[0].sum(-1, keepdims=True))
axes[0].imshow(target_dist, cmap="Greens", aspect="auto", vmin=0, vmax=1)
axes[0].set_xticks(range(V), vocab, rotation=90, fontsize=7)
axes[0].set_yticks(range(l), [f"position {j}" for j in range(l)])
axes[0].set_title("MCE target distribution, row 0")
SS = 8 if not TST_SMALL else 6
for k, name in enumerate(losses.WEIGHTINGS):
  w = losses.bag_weights(name, SS)
  axes[1].bar(np.arange(SS) + 0.2 * k, w / w.sum(), width=0.2, label=name)
axes[1].set_xlabel("bag slot i")
axes[1].set_ylabel("w_i / Σw")
axes[1].set_title(f"weightings, S = {SS}")
axes[1].legend()
plt.tight_layout()
plt.show()
'''),
]


# -- fused loss ------------------------------------------------------------------------------
FUSED = [
    ("md", '''
# The fused linear + MCE loss: memory and time against the vocabulary

`linear_mce_loss(hidden_NxD, head_DxV, targets_NxS)` is `mce_loss(hidden @ head, targets)`.
`impl="naive"` materialises the `[N, V]` float32 logits (and their gradient); `impl="xla"`
walks the vocabulary in chunks (logsumexp and target logits with a custom VJP), so no
`[N, V]` array exists. With the paper's 128k vocabulary and 2M-token batches that is the
difference between fitting and not. Below: XLA's compiled temporary memory
(`memory_analysis().temp_size_in_bytes`) and wall time of loss + gradients at growing V.
'''),
    ("code", INSTALL),
    ("code", f'''
import os, time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from tst_jax.losses import linear_mce_loss

{SMALL_FLAG}
S = 4                                               # bag size: targets per position
if TST_SMALL:
  N, D, VOCABS = 512, 64, [512, 2048, 8192]         # positions, model width, vocabularies
elif jax.default_backend() == "cpu":
  N, D, VOCABS = 2048, 256, [4096, 16384, 65536]
else:                                               # 131072: about the Llama-3 vocabulary
  N, D, VOCABS = 4096, 1024, [4096, 16384, 65536, 131072]
REPEATS = 2 if TST_SMALL else 5
print(jax.devices(), dict(N=N, D=D, S=S))
'''),
    ("code", '''
def inputs(V, seed=0):
  kh, kw, kt = jax.random.split(jax.random.key(seed), 3)
  hidden = jax.random.normal(kh, (N, D), jnp.float32)
  head = jax.random.normal(kw, (D, V), jnp.float32) / np.sqrt(D)
  targets = jax.random.randint(kt, (N, S), 0, V)
  return hidden, head, targets


def loss_and_grads(impl):
  loss = lambda h, w, t: linear_mce_loss(h, w, t, impl=impl)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


# Same loss and gradients, to float32 rounding.
args = inputs(VOCABS[0])
(l_naive, g_naive), (l_xla, g_xla) = (loss_and_grads(i)(*args) for i in ("naive", "xla"))
np.testing.assert_allclose(l_naive, l_xla, rtol=1e-5)
for a, b in zip(g_naive, g_xla):
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
print(f"loss {float(l_naive):.5f} (naive) vs {float(l_xla):.5f} (xla)")
'''),
    ("code", '''
rows = []
for V in VOCABS:
  args = inputs(V)
  for impl in ("naive", "xla"):
    compiled = loss_and_grads(impl).lower(*args).compile()
    memory = compiled.memory_analysis()
    temp = memory.temp_size_in_bytes if memory is not None else float("nan")
    jax.block_until_ready(compiled(*args))                      # warm up
    times = []
    for _ in range(REPEATS):
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      times.append(time.perf_counter() - t0)
    rows.append(dict(V=V, impl=impl, temp_mib=temp / 2**20, ms=1e3 * float(np.median(times))))
    print(f"V={V:>7,} {impl:5s}  temp {rows[-1]['temp_mib']:9.1f} MiB   "
          f"{rows[-1]['ms']:8.1f} ms   (logits alone: {N * V * 4 / 2**20:8.1f} MiB)")
'''),
    ("code", '''
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for impl, style in (("naive", "o-"), ("xla", "s-")):
  sel = [r for r in rows if r["impl"] == impl]
  axes[0].plot([r["V"] for r in sel], [r["temp_mib"] for r in sel], style, label=impl)
  axes[1].plot([r["V"] for r in sel], [r["ms"] for r in sel], style, label=impl)
axes[0].plot(VOCABS, [N * V * 4 / 2**20 for V in VOCABS], "k:", label="[N, V] float32 logits")
axes[0].set_ylabel("compiled temp memory (MiB)")
axes[1].set_ylabel("loss + grads (ms)")
for ax in axes:
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("vocabulary V")
  ax.grid(alpha=0.3)
  ax.legend()
fig.suptitle(f"linear_mce_loss, N={N}, D={D}, S={S}, {jax.default_backend()}")
plt.tight_layout()
plt.show()
'''),
    ("md", '''
The naive path's temporary memory grows with N·V (the logits and their gradient); the
chunked path's stays at a few chunks. On GPU and TPU, `impl="pallas"` (a fused kernel) and
`impl="auto"` (the trainer's default for the paper configs: `loss.impl`) go further; see
`benchmarks/mce_loss.py` for the full sweep.
'''),
]

# -- gpu_small: TST vs its baseline on one GPU -----------------------------------------------
GPU_SMALL = [
    ("md", '''
# TST beats its equal-FLOPs baseline on one GPU: configs/gpu_small.py

A 33.6M-parameter Llama (d 512, 8 layers, an 8,192-token BPE) trained 2000 steps of 64 x 512
positions twice, at the same FLOPs per step (6.60 TFLOPs):

* **TST**: 600 steps (r = 0.3) reading bags of S = 4 tokens, then 1400 next-token steps;
* **baseline**: 2000 next-token steps (`configs/gpu_small.py:baseline`).

**Expected** (docs/results.md, measured on one **H100 80GB**, 2026-11-23, jax 0.11.2, seeds 0
and 1, on 200 MB of Python source: the `*.py` of a torch install's site-packages): held-out
next-token loss **TST 1.894 ± 0.002, baseline 1.945 ± 0.006** (TST ahead by 0.051); TST's
curve is far above at the switch (4.75-4.80 vs 2.60 at step 600) and crosses the baseline
between steps 1200 and 1300. Time on the H100: about 80 s of GPU per arm, plus 33 s to
tokenize the corpus once. Colab runtimes (T4, L4, A100) have not been measured: expect
several times the H100's time; this notebook prints each run's wall time.

The corpus here is this runtime's own site-packages (Colab ships torch, so it is Python
source of the same kind, but not the same files): compare the **gap** between the two runs
with 0.05 nats, not the absolute losses. `TST_SMALL=1` shrinks everything to seconds on CPU
(that is what CI runs).
'''),
    ("code", INSTALL),
    ("code", f'''
import os, sysconfig, tempfile, time

import jax
import matplotlib.pyplot as plt

from tst_jax import configlib
from tst_jax.train import loop, metrics
from tst_jax.train import spec as spec_lib
from tst_jax.train.plan import format_plan

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
summary["TST"] = loop.run(tst_config, runs["TST"])
seconds["TST"] = time.time() - start
'''),
    ("code", '''
base_config.data.source = "tokens:" + os.path.join(runs["TST"], "data")
base_config.data.tokenizer = ""     # the store's own
start = time.time()
summary["baseline"] = loop.run(base_config, runs["baseline"])
seconds["baseline"] = time.time() - start
'''),
    ("md", '''
## Held-out next-token loss of both arms

At equal FLOPs per step, the step axis is the compute axis. The dashed line is TST's switch.
'''),
    ("code", '''
%matplotlib inline
# (inline again: loop.run switched matplotlib to Agg to write each run's loss.png)
fig, ax = plt.subplots(figsize=(8, 4.5))
for (label, workdir), color in zip(runs.items(), ("tab:orange", "tab:blue")):
  evals = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "eval_loss" in r]
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
EXPECTED = {"TST": 1.894, "baseline": 1.945}     # H100, torch site-packages, docs/results.md
for label, s in summary.items():
  print(f"{label:9s} final held-out loss {s['final_eval_loss']:.3f} (H100 reference "
        f"{EXPECTED[label]:.3f}), {seconds[label]:.0f} s")
gap = summary["TST"]["final_eval_loss"] - summary["baseline"]["final_eval_loss"]
print(f"TST - baseline: {gap:+.3f} nats (H100 reference: -0.051 ± 0.008)")
'''),
]

NOTEBOOKS = {"quickstart.ipynb": QUICKSTART, "inside_tst.ipynb": INSIDE,
             "fused_loss.ipynb": FUSED, "gpu_small.ipynb": GPU_SMALL}


def notebook(name: str, cells) -> nbformat.NotebookNode:
  stem = name.split(".")[0]
  nb = nbformat.v4.new_notebook()
  nb.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": [], "name": name},
      "accelerator": "GPU" if stem != "inside_tst" else "None"}
  for i, (kind, source) in enumerate(cells):
    make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
    nb.cells.append(make(textwrap.dedent(source).strip("\n"), id=f"{stem}-{i}"))
  nbformat.validate(nb)
  return nb


def render(name: str) -> str:
  return nbformat.writes(notebook(name, NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="compare, do not write")
  args = parser.parse_args(argv)
  stale = []
  for name in NOTEBOOKS:
    path, text = os.path.join(HERE, name), render(name)
    if args.check:
      if not os.path.exists(path) or open(path).read() != text:
        stale.append(name)
    else:
      with open(path, "w") as f:
        f.write(text)
      print("wrote", path)
  if stale:
    print(f"out of date (run python colabs/build.py): {stale}", file=sys.stderr)
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main())
