"""The data tests' shared tokenizer: a byte-level BPE of 300 tokens trained on CORPUS, once for
tests/data/ (the tokenizer and pipeline tests both read it)."""

import pytest

from tests.fixtures.corpus import CORPUS
from tst_jax.data import get_tokenizer


@pytest.fixture(scope="package")
def bpe_dir(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("bpe"))
  get_tokenizer("bpe", folder=folder, vocab_size=300, train_docs=CORPUS)
  return folder


@pytest.fixture(scope="package")
def tok(bpe_dir):
  return get_tokenizer("bpe", folder=bpe_dir, vocab_size=300, train_docs=None)
