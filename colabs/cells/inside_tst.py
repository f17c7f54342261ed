"""The cells of inside_tst.ipynb: bags, next-bag targets, superposed embeddings and the MCE loss, by hand."""

from cells import INSTALL, SMALL_FLAG

CELLS = [
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
