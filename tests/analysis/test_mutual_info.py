"""Token mutual information vs a slow direct computation; the power-law fit; the weights file."""

import collections
import json
import math

import numpy as np
import pytest

from tst_jax import losses
from tst_jax.analysis import mutual_info as mi


def _slow_mi(docs, d):
  """I(X_t; X_{t+d}) by the definition, pairs within each document, plus Miller-Madow."""
  pairs = [(int(doc[t]), int(doc[t + d])) for doc in docs for t in range(len(doc) - d)]
  n = len(pairs)
  joint = collections.Counter(pairs)
  left = collections.Counter(a for a, _ in pairs)
  right = collections.Counter(b for _, b in pairs)
  plugin = sum(c / n * math.log((c / n) / ((left[a] / n) * (right[b] / n)))
               for (a, b), c in joint.items())
  # Miller-Madow: each entropy + (occupied cells - 1) / 2N; I = H(A) + H(B) - H(A, B).
  mm = plugin + ((len(left) - 1) + (len(right) - 1) - (len(joint) - 1)) / (2 * n)
  return plugin, mm, n


def test_mi_equals_the_direct_computation_and_skips_document_boundaries():
  rng = np.random.default_rng(0)
  docs = []
  for length in (300, 17, 1, 120, 5, 250):    # a Markov chain over 12 tokens, short docs too
    doc = [int(rng.integers(12))]
    for _ in range(length - 1):
      doc.append(int((doc[-1] * 5 + rng.integers(3)) % 12))
    docs.append(np.array(doc))
  result = mi.mutual_information(docs, max_distance=8)
  for i, d in enumerate(result["distances"]):
    plugin, mm, n = _slow_mi(docs, d)
    assert result["pairs"][i] == n
    assert result["plugin"][i] == pytest.approx(plugin, rel=1e-10, abs=1e-12)
    assert result["miller_madow"][i] == pytest.approx(mm, rel=1e-10, abs=1e-12)
  assert result["plugin"][0] > 1.0 > result["plugin"][-1]   # the chain forgets with distance
  # Independent pairs: the plug-in estimate sits above 0 (its bias), Miller-Madow nearer 0.
  floor = result["shuffled"]
  assert floor["plugin"] > abs(floor["miller_madow"])


def test_fit_recovers_known_power_law():
  d = np.arange(1, 65)
  fit = mi.fit_power_law(d, 3.63 + 1.35 * d ** -1.25)
  assert (fit["C0"], fit["a"], fit["k"]) == pytest.approx((3.63, 1.35, -1.25), rel=1e-6)
  noisy = 0.2 + 0.9 * d ** -0.7 + np.random.default_rng(1).normal(0, 1e-4, d.shape)
  fit = mi.fit_power_law(d, noisy)
  assert (fit["C0"], fit["a"], fit["k"]) == pytest.approx((0.2, 0.9, -0.7), rel=2e-2)


def test_weights_file_loads_as_a_fitted_weighting(tmp_path):
  fit = dict(C0=0.05, a=1.2, k=-1.1)
  path = tmp_path / "mi.json"
  path.write_text(json.dumps(dict(fit=fit, weights=mi.weights_from_fit(fit, 16))))
  expected = 0.05 + 1.2 * np.arange(1, 17.0) ** -1.1
  for s in (1, 4, 16):
    np.testing.assert_allclose(losses.bag_weights(f"fitted:{path}", s), expected[:s], rtol=1e-6)
  # Beyond the stored list the fit itself is evaluated.
  np.testing.assert_allclose(losses.bag_weights(f"fitted:{path}", 20),
                             0.05 + 1.2 * np.arange(1, 21.0) ** -1.1, rtol=1e-6)
  # A fit that dips below zero is clipped in the weights list (weights must be >= 0).
  assert min(mi.weights_from_fit(dict(C0=-0.1, a=1.0, k=-1.0), 64)) == 0.0


def test_command_line_writes_a_loadable_file(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
  for i in range(6):
    (corpus / f"{i}.txt").write_text(" ".join(rng.choice(words, 400)))
  out = tmp_path / "mi.json"
  assert mi.main(["--data", f"text:{corpus}/*.txt", "--tokenizer", "bpe", "--vocab_size", "300",
                  "--max_distance", "6", "--out", str(out)]) == 0
  saved = json.loads(out.read_text())
  assert len(saved["weights"]) == 6 and saved["fit"]["estimator"] == "miller_madow"
  np.testing.assert_allclose(losses.bag_weights(f"fitted:{out}", 4), saved["weights"][:4],
                             rtol=1e-6)
  assert (tmp_path / "mi.png").stat().st_size > 0
