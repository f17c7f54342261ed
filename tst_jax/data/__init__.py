"""Data: corpora, tokenizers, the prepared token store, and its shuffled windows through Grain."""

from tst_jax.errors import DataError
from tst_jax.data.pipeline import (
    WindowSource,
    eval_windows,
    make_batches,
    unigram_entropy,
)
from tst_jax.data.sources import load_documents, split_documents
from tst_jax.data.store import StoreSplit, TokenStore
from tst_jax.data.tokenizer import Tokenizer, get_tokenizer, train_bpe

__all__ = [
    "WindowSource", "eval_windows", "make_batches", "unigram_entropy", "load_documents", "split_documents", "Tokenizer", "get_tokenizer",
    "train_bpe", "DataError", "StoreSplit", "TokenStore",
]
