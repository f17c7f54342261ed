"""Token superposition: fold tokens into bags, shift targets causally, average embeddings.

Shapes (letters as in the package docstring): B batch, T = S·L data tokens per row, L positions
the model sees, S bag size, W = T + 1 window, D model dim, V vocab.
Everything here is a pure array transformation, and the trainer picks one by `tst.mode`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE_INDEX = -100
IO_PARAMS = ("embed", "lm_head")   # the input and output layers: what TST trains differently
MODES = ("full", "input_only", "output_only")   # tst.mode: the phase-1 views
PHASE_MODES = ("ntp",) + MODES                  # a phase's mode: ntp reads plain tokens


def _check_bag_size(bag_size: int) -> None:
  if not isinstance(bag_size, int) or bag_size < 1:
    raise ValueError(f"bag_size must be an integer >= 1, got {bag_size!r}")


def fold(tokens_BxT, bag_size: int):
  """[B, T] tokens -> [B, T // S, S] non-overlapping bags (the paper's input folding)."""
  _check_bag_size(bag_size)
  *lead, length = tokens_BxT.shape
  if length % bag_size:
    raise ValueError(
        f"sequence length {length} is not a multiple of bag_size {bag_size}")
  return tokens_BxT.reshape(*lead, length // bag_size, bag_size)


def bag_targets(labels_BxT, bag_size: int, ignore_index: int = IGNORE_INDEX):
  """Next-token labels [B, T] -> next-bag targets [B, T // S, S].

  Labels are shifted left by S - 1 (padding the end with `ignore_index`) before
  folding, so the bag of inputs at [t, t+S-1] predicts the tokens at [t+S, t+2S-1].
  """
  _check_bag_size(bag_size)
  pad = [(0, 0)] * (labels_BxT.ndim - 1) + [(0, bag_size - 1)]
  shifted = jnp.pad(labels_BxT, pad, constant_values=ignore_index)[..., bag_size - 1:]
  return fold(shifted, bag_size)


def window_targets(labels_BxT, bag_size: int, ignore_index: int = IGNORE_INDEX):
  """Next-token labels [B, T] -> the next S tokens of every position [B, T, S].

  The output-only ablation: position t (a single token) predicts [t+1, t+S].
  """
  _check_bag_size(bag_size)
  length = labels_BxT.shape[-1]
  pad = [(0, 0)] * (labels_BxT.ndim - 1) + [(0, bag_size - 1)]
  padded = jnp.pad(labels_BxT, pad, constant_values=ignore_index)
  return jnp.stack([padded[..., i:i + length] for i in range(bag_size)], axis=-1)


def superpose(table_VxD, bags_BxLxS):
  """Mean of the S embeddings of every bag, summed in float32: [B, L, S] -> [B, L, D].

  Cast back to the table's dtype, as in the paper's listing. S = 1 is the plain lookup.
  """
  bag_size = bags_BxLxS.shape[-1]
  if bag_size == 1:
    return jnp.take(table_VxD, bags_BxLxS[..., 0], axis=0)
  # A running float32 sum keeps only one [B, L, D] float32 buffer alive.
  h_BxLxD = jnp.take(table_VxD, bags_BxLxS[..., 0], axis=0).astype(jnp.float32)
  for i in range(1, bag_size):
    h_BxLxD = h_BxLxD + jnp.take(table_VxD, bags_BxLxS[..., i], axis=0).astype(jnp.float32)
  return (h_BxLxD / bag_size).astype(table_VxD.dtype)


def data_length(latent_len: int, bag_size: int, mode: str) -> int:
  """T, the data tokens per row that a phase's view turns into L model positions:
  S·L for full and input_only (L bags of S tokens), L for output_only (single tokens in) and
  for the ntp phase."""
  _check_mode(mode)
  return latent_len if mode in ("ntp", "output_only") else bag_size * latent_len


def _check_mode(mode: str) -> None:
  if mode not in PHASE_MODES:
    raise ValueError(f"a phase's mode must be one of {PHASE_MODES}, got {mode!r}")


def ntp_view(window_BxW):
  """Splits a packed window of data_len + 1 tokens into next-token inputs and targets."""
  return window_BxW[:, :-1], window_BxW[:, 1:]


def tst_view(window_BxW, bag_size: int, mode: str = "full",
             ignore_index: int = IGNORE_INDEX):
  """Splits a packed window of data_len + 1 tokens into phase-1 inputs and targets.

  full:        inputs bags [B, L, S],  targets next bag [B, L, S]
  input_only:  inputs bags [B, L, S],  targets the single next token [B, L, 1]
  output_only: inputs tokens [B, T],   targets the next S tokens [B, T, S]
  """
  inputs_BxT, labels_BxT = ntp_view(window_BxW)
  if mode == "full":
    return fold(inputs_BxT, bag_size), bag_targets(labels_BxT, bag_size, ignore_index)
  if mode == "input_only":
    return (fold(inputs_BxT, bag_size),
            bag_targets(labels_BxT, bag_size, ignore_index)[..., :1])
  if mode == "output_only":
    return inputs_BxT, window_targets(labels_BxT, bag_size, ignore_index)
  raise ValueError(f"tst.mode must be one of {MODES}, got {mode!r}")


def document_ids(tokens_BxW, eos_id: int):
  """Numbers the documents of packed rows [B, W]: the count of EOS tokens before each token, so
  an EOS belongs to the document it ends and a row's first document is 0."""
  is_eos = (tokens_BxW == eos_id).astype(jnp.int32)
  return jnp.cumsum(is_eos, axis=-1) - is_eos


def document_view(window_BxW, eos_id: int, view, ignore_index: int = IGNORE_INDEX):
  """Applies a phase's `view` (ntp_view, or tst_view with its S and mode bound) to a packed
  window whose documents must not see each other: returns its inputs, its targets with every
  token of another document ignored, and the document of each model position [B, L].

  A position belongs to the document of its first token, so a bag that straddles a boundary
  is its first document's, and its tokens of the next document are no one's input. A
  document's last position predicts nothing past the document's end, as the stream's last
  does past the window, and a document's first token is never a target.
  """
  inputs, targets = view(window_BxW)
  docs_in, docs_target = view(document_ids(window_BxW, eos_id))
  docs_BxL = docs_in[..., 0] if docs_in.ndim == 3 else docs_in
  mine = docs_BxL[..., None] if docs_target.ndim == 3 else docs_BxL
  return inputs, jnp.where(docs_target == mine, targets, ignore_index), docs_BxL


def document_positions(docs_BxL):
  """Returns each position's offset from the first position of its document, [B, L]."""
  length = docs_BxL.shape[-1]
  index_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), docs_BxL.shape)
  starts = jnp.concatenate([jnp.ones_like(docs_BxL[..., :1], bool),
                            docs_BxL[..., 1:] != docs_BxL[..., :-1]], axis=-1)
  return index_BxL - jax.lax.cummax(jnp.where(starts, index_BxL, 0), axis=docs_BxL.ndim - 1)


def switch_to_next_token(tree, fresh=None, io_params=IO_PARAMS):
  """Applies the phase switch to a parameter or optimizer-state pytree.

  The paper keeps everything: the embedding and LM head trained on bags carry TST's gain into
  next-token training, so this returns `tree` itself. Phase 2 only changes the batches, with
  `ntp_view`, and the loss, to `cross_entropy`. With `fresh`, a newly initialised tree of the
  same structure, it is the paper's randomisation ablation: the leaves under a key named in
  `io_params` come from `fresh`, every other leaf from `tree`.
  """
  if fresh is None:
    return tree
  def take(path, old, new):
    return new if any(str(getattr(k, "key", "")) in io_params for k in path) else old
  return jax.tree_util.tree_map_with_path(take, tree, fresh)
