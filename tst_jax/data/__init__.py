"""Data: corpora, tokenizers, and the token stream read in shuffled windows through Grain."""

from tst_jax.data.pipeline import (
    TokenStream,
    WindowSource,
    eval_windows,
    make_batches,
    stream_position,
    unigram_entropy,
)
from tst_jax.data.sources import load_documents, split_documents
from tst_jax.data.store import StoreError, StoreSplit, TokenStore
from tst_jax.data.tokenizer import Tokenizer, get_tokenizer, train_bpe

__all__ = [
    "TokenStream", "WindowSource", "eval_windows", "make_batches", "stream_position",
    "unigram_entropy", "load_documents", "split_documents", "Tokenizer", "get_tokenizer",
    "train_bpe", "StoreError", "StoreSplit", "TokenStore",
]
