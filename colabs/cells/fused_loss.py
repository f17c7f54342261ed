"""The cells of fused_loss.ipynb: the fused linear + MCE loss's memory and time against the vocabulary."""

from cells import INSTALL, SMALL_FLAG

CELLS = [
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
