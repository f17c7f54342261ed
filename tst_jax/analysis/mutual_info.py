r"""Mutual information between tokens at distance d, a power-law fit, and MCE bag weights.

The paper's appendix D. Run as

  python -m tst_jax.analysis.mutual_info --data builtin:pystdlib --tokenizer bpe \
      --vocab_size 4096 --max_bytes 6000000 --max_distance 64 --out docs/mi_fit.json

Estimator. For each distance d the sample is every pair x_t, x_{t+d} inside one document, N_d
pairs. EOS tokens and pairs that cross documents are left out. With the counts n_ab of the
pairs and their marginals n_a., n_.b, the plug-in or maximum-likelihood estimate in nats is

    I_plugin(d) = sum_ab (n_ab/N) log(N n_ab / (n_a. n_.b)) = H(A) + H(B) - H(A, B)

Each plug-in entropy is low by about (m - 1)/(2N), m the number of occupied cells, so I_plugin is
high by about (m_AB - m_A - m_B + 1)/(2N). For independent tokens over a large vocabulary that is
a positive floor that does not decay with d. The Miller-Madow correction removes the
first-order term:

    I_MM(d) = I_plugin(d) - (m_AB - m_A - m_B + 1) / (2N)

With N well below the number of possible pairs, the undersampled regime, Miller-Madow still
leaves a residual bias. The "shuffled" estimate pairs x_t with a random token of the corpus, at
the same N, and shows what each estimator reports for truly independent tokens.

Fit. I(d) ~ C0 + a d^k by least squares. For a fixed k the model is linear in C0 and a, solved
exactly. k is found by a grid search, then golden-section refinement of that 1-D profile.

Weights. w_d = max(C0 + a d^k, 0) for d = 1..max_distance. `losses.bag_weights` with
"fitted:F.json" takes the first S, which the MCE loss normalises, or evaluates the fit beyond
the list.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from tst_jax import data as data_lib, errors, fileio

ESTIMATORS = ("miller_madow", "plugin")


# -- estimate --------------------------------------------------------------------------------
def _entropy(counts: np.ndarray, n: int) -> float:
  counts = counts[counts > 0].astype(np.float64)
  return math.log(n) - float(np.sum(counts * np.log(counts))) / n


def pair_mi(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
  """Returns the plug-in and Miller-Madow mutual information in nats of pairs a[i], b[i]."""
  n = len(a)
  if n == 0:
    return float("nan"), float("nan")
  a, b = a.astype(np.int64), b.astype(np.int64)
  _, count_a = np.unique(a, return_counts=True)
  _, count_b = np.unique(b, return_counts=True)
  _, count_ab = np.unique(a * (int(max(a.max(), b.max())) + 1) + b, return_counts=True)
  plugin = _entropy(count_a, n) + _entropy(count_b, n) - _entropy(count_ab, n)
  correction = (len(count_ab) - len(count_a) - len(count_b) + 1) / (2 * n)
  return plugin, plugin - correction


def mutual_information(docs: list[np.ndarray], max_distance: int, seed: int = 0) -> dict:
  """Estimates I(X_t; X_{t+d}) for d = 1..max_distance over documents of tokens without EOS."""
  docs = [np.asarray(d, np.int64) for d in docs if len(d)]
  tokens = np.concatenate(docs)
  doc_id = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
  result = dict(distances=list(range(1, max_distance + 1)), plugin=[], miller_madow=[], pairs=[])
  for d in result["distances"]:
    same = doc_id[:-d] == doc_id[d:]
    plugin, mm = pair_mi(tokens[:-d][same], tokens[d:][same])
    result["plugin"].append(plugin)
    result["miller_madow"].append(mm)
    result["pairs"].append(int(same.sum()))
  # Independent pairs with the same marginal and N as d = 1: the estimators' floor.
  n = result["pairs"][0]
  rng = np.random.default_rng(seed)
  plugin, mm = pair_mi(tokens[rng.integers(0, len(tokens), n)],
                       tokens[rng.integers(0, len(tokens), n)])
  result["shuffled"] = dict(plugin=plugin, miller_madow=mm, pairs=n)
  result["tokens"], result["documents"] = int(len(tokens)), len(docs)
  return result


# -- fit -------------------------------------------------------------------------------------
def _linear_part(d: np.ndarray, y: np.ndarray, k: float) -> tuple[float, float, float]:
  """Returns C0, a and the sum of squared residuals of the best C0 + a d^k for this k."""
  design = np.stack([np.ones_like(d), d ** k], axis=1)
  (c0, a), *_ = np.linalg.lstsq(design, y, rcond=None)
  residual = y - design @ np.array([c0, a])
  return float(c0), float(a), float(residual @ residual)


def fit_power_law(distances, values, k_range=(-6.0, -0.01)) -> dict:
  """Fits C0 + a d^k with k < 0 by least squares.

  The fit is exact in C0 and a for each k. k comes from a grid search and golden-section
  refinement.
  """
  d, y = np.asarray(distances, np.float64), np.asarray(values, np.float64)
  ok = np.isfinite(y)
  d, y = d[ok], y[ok]
  if len(d) < 3:
    raise ValueError(f"need at least 3 finite points to fit C0 + a d^k, got {len(d)}")
  grid = np.linspace(*k_range, 600)
  sse = [_linear_part(d, y, k)[2] for k in grid]
  i = int(np.argmin(sse))
  lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
  ratio = (math.sqrt(5) - 1) / 2
  x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
  f1, f2 = _linear_part(d, y, x1)[2], _linear_part(d, y, x2)[2]
  for _ in range(200):
    if hi - lo < 1e-12:
      break
    if f1 < f2:
      hi, x2, f2 = x2, x1, f1
      x1 = hi - ratio * (hi - lo)
      f1 = _linear_part(d, y, x1)[2]
    else:
      lo, x1, f1 = x1, x2, f2
      x2 = lo + ratio * (hi - lo)
      f2 = _linear_part(d, y, x2)[2]
  k = (lo + hi) / 2
  c0, a, sse_k = _linear_part(d, y, k)
  return dict(C0=c0, a=a, k=float(k), rmse=math.sqrt(sse_k / len(d)))


def weights_from_fit(fit: dict, max_distance: int) -> list[float]:
  d = np.arange(1, max_distance + 1, dtype=np.float64)
  return np.maximum(fit["C0"] + fit["a"] * d ** fit["k"], 0.0).tolist()


# -- command line ----------------------------------------------------------------------------
def load_token_docs(source: str, tokenizer_spec: str, vocab_size: int, max_bytes: int | None,
                    tokenizer_dir: str | None) -> tuple[list[np.ndarray], str]:
  docs = data_lib.load_documents(source, max_bytes or None)
  tokenizer = data_lib.get_tokenizer(tokenizer_spec, folder=tokenizer_dir,
                                     vocab_size=vocab_size, train_docs=docs)
  ids = tokenizer.encode_batch(docs)
  return [np.asarray(x, np.int64) for x in ids], repr(tokenizer)


def plot(result: dict, out_path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  d = np.asarray(result["distances"], np.float64)
  dense = np.linspace(1, d[-1], 400)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, color in (("plugin", "tab:blue"), ("miller_madow", "tab:orange")):
    fit = result["fits"][name]
    ax.plot(d, result[name], ".", color=color, label=f"{name.replace('_', '-')} estimate")
    ax.plot(dense, fit["C0"] + fit["a"] * dense ** fit["k"], "-", color=color, alpha=0.8,
            label=f"fit {fit['C0']:.3f} + {fit['a']:.3f} d^{fit['k']:.3f}")
    ax.axhline(result["shuffled"][name], color=color, ls=":", lw=1,
               label=f"{name.replace('_', '-')} on shuffled pairs")
  ax.set_xscale("log")
  ax.set_xlabel("distance d (tokens)")
  ax.set_ylabel("I(X_t; X_{t+d}) (nats)")
  ax.set_title(f"Token mutual information vs distance ({result['tokens']:,} tokens)")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8, loc="upper right")
  fig.tight_layout()
  fileio.write_figure(out_path, fig)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tst_jax.analysis.mutual_info", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--data", required=True, help="a data.source, e.g. builtin:pystdlib")
  p.add_argument("--tokenizer", required=True, help="bpe | tokenizer.json | .model")
  p.add_argument("--vocab_size", type=int, default=4096, help="for --tokenizer bpe")
  p.add_argument("--max_bytes", type=int, default=0, help="read at most this much text (0: all)")
  p.add_argument("--tokenizer_dir", default=None,
                 help="cache the trained BPE here (a run's workdir reuses its tokenizer.json)")
  p.add_argument("--max_distance", type=int, default=64)
  p.add_argument("--estimator", choices=ESTIMATORS, default="miller_madow",
                 help="the estimate whose fit gives the weights")
  p.add_argument("--out", required=True, help="output JSON (the plot goes next to it, .png)")
  p.add_argument("--seed", type=int, default=0, help="for the shuffled-pairs floor")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  path = fileio.absolute(args.out)
  fileio.check_output(fileio.dirname(path), "--out", "the folder of --out")   # before the work

  docs, tokenizer = load_token_docs(args.data, args.tokenizer, args.vocab_size, args.max_bytes,
                                    args.tokenizer_dir)
  result = mutual_information(docs, args.max_distance, args.seed)
  result["fits"] = {name: fit_power_law(result["distances"], result[name])
                    for name in ESTIMATORS}
  fit = dict(result["fits"][args.estimator], estimator=args.estimator)
  out = dict(source=args.data, max_bytes=args.max_bytes, tokenizer=tokenizer,
             estimator=args.estimator, fit=fit,
             weights=weights_from_fit(fit, args.max_distance), **result)
  fileio.makedirs(fileio.dirname(path))
  fileio.write_json(path, out)
  plot(result, os.path.splitext(path)[0] + ".png")
  print(f"{result['tokens']:,} tokens in {result['documents']} documents; "
        f"shuffled-pairs floor: plug-in {result['shuffled']['plugin']:.4f}, "
        f"Miller-Madow {result['shuffled']['miller_madow']:.4f} nats")
  print(f"{'d':>4}{'plug-in':>10}{'MM':>10}")
  for i, d in enumerate(result["distances"]):
    if d <= 8 or d in (16, 32, 64) or d == args.max_distance:
      print(f"{d:>4}{result['plugin'][i]:>10.4f}{result['miller_madow'][i]:>10.4f}")
  for name, f in result["fits"].items():
    print(f"fit ({name}): C0 = {f['C0']:.4f}, a = {f['a']:.4f}, k = {f['k']:.4f} "
          f"(rmse {f['rmse']:.2g})")
  print(f"weights ({args.estimator}), d = 1..8: "
        + ", ".join(f"{w:.3f}" for w in out["weights"][:8]))
  print(f"wrote {path} and {os.path.splitext(path)[0]}.png; use the weights with "
        f"--config.tst.weighting=fitted:{args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(errors.main(main))
