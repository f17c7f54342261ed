"""Slow, obvious references the tests compare the library against (test-only code)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class TokenStream:
  """All documents of a split, each followed by EOS, concatenated in a seeded order, in memory:
  what a one-shard split of a prepared store (tst_jax.data.prepare) equals token for token."""

  tokens: np.ndarray  # (N,) int32
  num_docs: int
  vocab_size: int

  def __len__(self) -> int:
    return len(self.tokens)

  def __array__(self, dtype=None, copy=None):   # the data readers take it as its tokens
    return self.tokens if dtype is None else self.tokens.astype(dtype)

  @classmethod
  def build(cls, docs: Sequence[str], tokenizer, seed: int) -> TokenStream:
    if not docs:
      raise ValueError("TokenStream.build got no documents")
    order = np.random.default_rng(seed).permutation(len(docs))
    ids = tokenizer.encode_batch([docs[i] for i in order])
    flat = itertools.chain.from_iterable(x + [tokenizer.eos_id] for x in ids)
    return cls(np.fromiter(flat, dtype=np.int32), len(docs), tokenizer.vocab_size)
