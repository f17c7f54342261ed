"""The multi-hot cross-entropy (MCE) loss family, optax-style functions of (logits, targets).

Semantics follow the paper's appendix A listing: with bag targets [..., S], each bag
column i contributes the ordinary mean CE over its valid (non-ignored) entries, and the
columns are combined with weights w_i normalised over the columns that have any valid
entry. Written per target, that is one coefficient per (row, column):

    c[r, i] = w_i * valid[r, i] / (n_i * W),   n_i = sum_r valid[r, i],  W = sum_{i: n_i > 0} w_i
    loss    = sum_{r, i} c[r, i] * (logsumexp(z_r) - z_r[y_ri])

which is what the fused kernels compute too (`mce_coefficients`). S = 1 is plain CE.
MCE-alt is -log of the total probability on the distinct tokens of the bag.

A variant (tst.variant) is one entry of VARIANTS: a function of the per-row logsumexp and
target logits that every implementation gives, and of how much each target counts, to each
row's weighted loss and its weight. The batch's loss is the sum of the one over the sum of the
other, a position's loss their ratio. In the batch's loss each target counts by its
coefficient c above, so MCE's is the paper's reduction.

The z-loss, as in PaLM and MaxText, adds z_loss * mean_r logsumexp(z_r)^2 over the rows r with
a valid target: it keeps the softmax normaliser near 1. Every implementation adds it to the
same per-row logsumexp, so the fused kernels need nothing of their own for it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tst_jax import fileio, platform, schema
from tst_jax.kernels import linear_mce_pallas, linear_mce_xla, sharded
from tst_jax.superposition import IGNORE_INDEX

WEIGHTINGS = ("uniform", "power", "exponential", "first")
# Appendix D's power law of the mutual information between DCLM tokens d apart, C0 + a·d^k.
# 'fitted:paper' weighs position d by its value, C0 included, as the paper weighs "by the
# values of the fitted power law", which makes the weights nearly uniform.
PAPER_FIT = dict(C0=3.63, a=1.35, k=-1.25)


def bag_weights(weighting, bag_size: int) -> np.ndarray:
  """Per-position weights [S] (float32) for a bag of `bag_size` targets.

  weighting: "uniform" (1), "power" (1/i), "exponential" (exp(-i)), "first" (delta_1),
  a length-S sequence of non-negative weights, "fitted:F.json" (the output of
  `tst_jax.analysis.mutual_info`, holding either "weights" or a fit {"C0", "a", "k"},
  evaluated as C0 + a * d^k at distances d = 1..S), or "fitted:paper" (PAPER_FIT).
  """
  positions = np.arange(1, bag_size + 1, dtype=np.float64)
  if isinstance(weighting, str) and weighting.startswith("fitted:"):
    weighting = _fitted_weights(weighting[len("fitted:"):], positions)
  if isinstance(weighting, str):
    table = {
        "uniform": np.ones_like(positions),
        "power": 1.0 / positions,
        "exponential": np.exp(-positions),
        "first": (positions == 1).astype(np.float64),
    }
    if weighting not in table:
      raise ValueError(f"unknown weighting {weighting!r}: expected one of {WEIGHTINGS}, "
                       "a list of S weights, 'fitted:<file.json>' or 'fitted:paper'")
    return table[weighting].astype(np.float32)
  weights = np.asarray(weighting, dtype=np.float64).reshape(-1)
  if weights.shape != (bag_size,):
    raise ValueError(f"weighting has {weights.size} weights but the bag size is {bag_size}")
  if not np.all(np.isfinite(weights)) or np.any(weights < 0) or not np.any(weights > 0):
    raise ValueError(f"weights must be finite, >= 0 and not all zero, got {weights.tolist()}")
  return weights.astype(np.float32)


def _fitted_weights(path: str, positions: np.ndarray) -> np.ndarray:
  try:
    if path == "paper":
      fit = PAPER_FIT
    else:
      fit = fileio.read_json(path)
  except (OSError, ValueError, fileio.PathError) as e:
    raise ValueError(f"cannot read fitted weighting file {path!r}: {e}") from e
  if "weights" in fit and len(fit["weights"]) >= len(positions):
    return np.asarray(fit["weights"][:len(positions)], dtype=np.float64)
  params = fit.get("fit", fit)
  try:
    return params["C0"] + params["a"] * positions ** params["k"]
  except KeyError as e:
    raise ValueError(f"{path!r} has neither 'weights' for {len(positions)} positions "
                     "nor a fit with keys C0, a, k") from e


def mce_coefficients(targets_NxS, weights_S, ignore_index: int = IGNORE_INDEX):
  """Per-target coefficients c [N, S] (float32) of the MCE reduction (module docstring)."""
  valid = (targets_NxS != ignore_index).astype(jnp.float32)
  count_S = valid.sum(axis=0)
  present_S = (count_S > 0).astype(jnp.float32)
  w_S = jnp.asarray(weights_S, jnp.float32) * present_S
  total = w_S.sum()
  col_S = jnp.where(count_S > 0, w_S / jnp.maximum(count_S, 1.0), 0.0)
  col_S = jnp.where(total > 0, col_S / jnp.where(total > 0, total, 1.0), 0.0)
  return valid * col_S[None, :]


def alt_mask(targets_NxS, counts_NxS):
  """[N, S] mask of the targets MCE-alt sums over: those that count, each token once.

  A token repeated inside a bag is counted once, so the total probability is <= 1.
  """
  s = targets_NxS.shape[-1]
  same = targets_NxS[:, :, None] == targets_NxS[:, None, :]        # [N, S, S]
  earlier = jnp.tril(jnp.ones((s, s), bool), k=-1)                 # j < i
  repeated = jnp.any(same & earlier[None] & counts_NxS[:, None, :], axis=-1)
  return counts_NxS & ~repeated


def mce_rows(lse_N, target_logits_NxS, targets_NxS, coef_NxS):
  """MCE per row: the CE of each target times how much it counts, summed, and that sum of
  coefficients as the row's weight."""
  del targets_NxS   # each target counts by its coefficient alone
  return (coef_NxS * (lse_N[:, None] - target_logits_NxS)).sum(-1), coef_NxS.sum(-1)


def alt_rows(lse_N, target_logits_NxS, targets_NxS, coef_NxS):
  """MCE-alt per row, -log P(bag) = lse - logsumexp over the bag's distinct targets that count,
  with weight 1 where any target counts (0 and 0 elsewhere)."""
  mask_NxS = alt_mask(targets_NxS, coef_NxS > 0)
  has_N = mask_NxS.any(axis=-1)
  bag_lse_N = jax.nn.logsumexp(jnp.where(mask_NxS, target_logits_NxS, -jnp.inf), axis=-1)
  return (jnp.where(has_N, lse_N - jnp.where(has_N, bag_lse_N, 0.0), 0.0),
          has_N.astype(jnp.float32))


def _entropy(weights_S) -> float:
  """Entropy of the distribution of targets that `weights_S` weigh, over distinct tokens."""
  p = np.asarray(weights_S, np.float64)
  p = p[p > 0] / p.sum()
  return float(-(p * np.log(p)).sum())


@dataclasses.dataclass(frozen=True)
class Variant:
  """A TST loss variant: `rows(lse_N, target_logits_NxS, targets_NxS, coef_NxS)` gives each
  row's weighted loss and its weight [N], where coef_NxS says how much each target counts
  (0: an ignored target, or one of weight 0)."""
  rows: Callable
  doc: str                # what it is, in tst.variant's line of --help-config
  weighted: bool = True   # False: it reads only which targets count, not how much
  floor: Callable | None = None   # weights [S] -> its least loss on S distinct tokens; None: 0


# tst.variant: register adds one, which the field then accepts.
VARIANTS = {"mce": Variant(mce_rows, "the paper's", floor=_entropy),
            "alt": Variant(alt_rows, "-log of the bag's probability: no per-position weights",
                           weighted=False)}
VARIANT = schema.registered(VARIANTS)   # tst.variant's rule


def register(name: str, variant: Variant, *, replace: bool = False) -> None:
  """Adds loss variant `name`: from then on tst.variant may name it (schema.register's rule)."""
  schema.register(VARIANTS, "loss variant", name, variant, replace=replace)


def unregister(name: str) -> None:
  """Removes loss variant `name`, as a test that registered one does after it."""
  del VARIANTS[name]


def variants_doc() -> str:
  """Says each variant of VARIANTS with its doc, as tst.variant's line of --help-config."""
  return " | ".join(f"{name} ({v.doc})" for name, v in VARIANTS.items())


def _variant(name: str) -> Variant:
  if name not in VARIANTS:
    raise ValueError(f"unknown loss variant {name!r}: expected one of {tuple(VARIANTS)}")
  return VARIANTS[name]


def _ratio(total, weight):
  """total / weight, 0 where the weight is 0 (nothing counts)."""
  return jnp.where(weight > 0, total / jnp.where(weight > 0, weight, 1.0), 0.0)


def _flatten(logits, targets):
  if logits.shape[:-1] != targets.shape[:-1]:
    raise ValueError(f"logits {logits.shape} and targets {targets.shape} disagree on the "
                     "leading (position) dimensions")
  return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, targets.shape[-1])


def mce_from_parts(lse_N, target_logits_NxS, targets_NxS, *, weighting="uniform",
                   variant="mce", ignore_index=IGNORE_INDEX, z_loss: float = 0.0):
  """Computes the loss from per-row logsumexp [N] and the gathered target logits [N, S], plus
  the z-loss of the module docstring when `z_loss` > 0.

  Shared by the naive loss and the chunked/fused implementations, which produce these
  two pieces without materialising [N, V] logits.
  """
  rows = _variant(variant).rows
  c_NxS = mce_coefficients(targets_NxS, bag_weights(weighting, targets_NxS.shape[-1]),
                           ignore_index)
  total_N, weight_N = rows(lse_N, target_logits_NxS, targets_NxS, c_NxS)
  loss = _ratio(total_N.sum(), weight_N.sum())
  if not z_loss:
    return loss
  has_N = (targets_NxS != ignore_index).any(axis=-1)
  return loss + z_loss * jnp.sum(jnp.where(has_N, lse_N ** 2, 0.0)) / jnp.maximum(has_N.sum(), 1)


def _lse_and_target_logits(logits_NxV, targets_NxS, ignore_index):
  logits_NxV = logits_NxV.astype(jnp.float32)
  safe_NxS = jnp.where(targets_NxS == ignore_index, 0, targets_NxS)
  return (jax.nn.logsumexp(logits_NxV, axis=-1),
          jnp.take_along_axis(logits_NxV, safe_NxS, axis=-1))


def mce_loss(logits, targets, *, weighting="uniform", variant="mce",
             ignore_index: int = IGNORE_INDEX, kl: bool = False, z_loss: float = 0.0):
  """Multi-hot cross-entropy: logits [..., V], bag targets [..., S] -> scalar (float32).

  kl=True subtracts the variant's floor (`bag_floor`: MCE's is its targets' entropy, log S for
  uniform weights), the paper's KL-normalised L_MCE that is 0 at the optimum. It is off by
  default, as in the paper.
  z_loss > 0 adds the z-loss (module docstring).
  """
  logits_NxV, targets_NxS = _flatten(logits, targets)
  lse_N, z_NxS = _lse_and_target_logits(logits_NxV, targets_NxS, ignore_index)
  loss = mce_from_parts(lse_N, z_NxS, targets_NxS, weighting=weighting, variant=variant,
                        ignore_index=ignore_index, z_loss=z_loss)
  if kl:
    loss = loss - bag_floor(weighting, variant, targets_NxS.shape[-1])
  return loss


def bag_floor(weighting, variant: str, bag_size: int) -> float:
  """Returns the least loss `variant` reaches on a bag of `bag_size` distinct tokens, where a
  next-token loss reaches 0: MCE's is its targets' entropy (log S for uniform weights), lower
  on a bag that repeats a token or has ignored targets. 0 for a variant without one."""
  floor = _variant(variant).floor
  return floor(bag_weights(weighting, bag_size)) if floor and bag_size > 1 else 0.0


def mce_loss_per_position(logits, targets, *, weighting="uniform", variant="mce",
                          ignore_index: int = IGNORE_INDEX):
  """Per-position losses [...] and a validity mask [...] for masking and reporting.

  mce is the weighted mean CE over the position's valid targets, alt is -log P(bag).
  A position with no valid target has loss 0 and mask False. Note that the mean of these
  over valid positions equals `mce_loss` only when no target is ignored (the paper's
  reduction averages each bag column over its own valid entries).
  """
  rows = _variant(variant).rows
  lead = logits.shape[:-1]
  logits_NxV, targets_NxS = _flatten(logits, targets)
  lse_N, z_NxS = _lse_and_target_logits(logits_NxV, targets_NxS, ignore_index)
  weights_S = jnp.asarray(bag_weights(weighting, targets_NxS.shape[-1]))
  w_NxS = (targets_NxS != ignore_index) * weights_S[None, :]   # each row's own weights
  total_N, weight_N = rows(lse_N, z_NxS, targets_NxS, w_NxS)
  return _ratio(total_N, weight_N).reshape(lead), (weight_N > 0).reshape(lead)


def cross_entropy(logits, labels, *, ignore_index: int = IGNORE_INDEX):
  """Standard next-token CE: logits [..., V], labels [...] -> mean over valid labels."""
  return mce_loss(logits, labels[..., None], ignore_index=ignore_index)


def linear_mce_loss(hidden_NxD, head_DxV, targets_NxS, *, weighting="uniform", variant="mce",
                    ignore_index: int = IGNORE_INDEX, impl: str = "auto", z_loss: float = 0.0,
                    **chunk_kwargs):
  """`mce_loss(hidden @ head, targets, z_loss=...)` without materialising the [N, V] logits.

  hidden [..., D], head [D, V], targets [..., S] -> scalar (float32), differentiable in
  hidden and head. impl: "naive" (float32 logits, the reference), "xla" (chunked, pure
  XLA), "pallas" (fused kernel), "auto" (measured fastest per platform: `tst_jax.platform`).
  chunk_kwargs such as block sizes go to the implementation in `tst_jax.kernels`. Under
  `axis_rules` with a mesh, xla/pallas run per shard (`tst_jax.kernels.sharded`).
  """
  if impl not in platform.LOSS_IMPLS:
    raise ValueError(f"unknown impl {impl!r}: expected one of {platform.LOSS_IMPLS}")
  _variant(variant)
  if hidden_NxD.shape[:-1] != targets_NxS.shape[:-1]:
    raise ValueError(f"hidden {hidden_NxD.shape} and targets {targets_NxS.shape} disagree on "
                     "the leading (position) dimensions")
  hidden_NxD = hidden_NxD.reshape(-1, hidden_NxD.shape[-1])
  targets_NxS = targets_NxS.reshape(-1, targets_NxS.shape[-1])
  if impl == "auto":                       # a loop of your own: a run passes its resolved impl
    impl, _ = platform.loss_impl(impl)
  if impl == "naive":
    if chunk_kwargs:
      raise TypeError(f"impl='naive' takes no chunk arguments, got {sorted(chunk_kwargs)}")
    logits_NxV = jnp.dot(hidden_NxD, head_DxV, preferred_element_type=jnp.float32)
    return mce_loss(logits_NxV, targets_NxS, weighting=weighting, variant=variant,
                    ignore_index=ignore_index, z_loss=z_loss)
  kernel = linear_mce_xla if impl == "xla" else linear_mce_pallas
  lse_N, z_NxS = sharded.lse_and_target_logits(kernel.lse_and_target_logits, hidden_NxD,
                                               head_DxV, targets_NxS, ignore_index=ignore_index,
                                               **chunk_kwargs)
  return mce_from_parts(lse_N, z_NxS, targets_NxS, weighting=weighting, variant=variant,
                        ignore_index=ignore_index, z_loss=z_loss)
