"""A run's data: its token store (`tokens:DIR` read in place, any other source prepared once
into <workdir>/data), the tokenizer, and the held-out eval windows of this process."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np

from tst_jax import fileio
from tst_jax.data import pipeline, prepare as prepare_lib, tokenizer as tokenizer_lib
from tst_jax.data.store import MANIFEST, TokenStore
from tst_jax.errors import ConfigError
from tst_jax.parallel import distributed
from tst_jax.train import plan as plan_lib

STORE_FILE = "store.json"   # the fingerprint of the token store a workdir trains on


@dataclasses.dataclass(frozen=True)
class RunData:
  tokenizer: tokenizer_lib.Tokenizer
  train: object                      # StoreSplit: the training stream, memory-mapped
  val: object                        # StoreSplit: the held-out stream
  eval_windows: list[np.ndarray]     # this process's rows of each eval batch, [B_local, W]
  unigram_entropy: float
  fingerprint: str                   # of the token store: a workdir resumes on the same one


def prepare_data(config, workdir: str, model_vocab: int, block=None, say=None) -> RunData:
  """The run's token store (`tokens:DIR` read in place, any other source prepared once into
  <workdir>/data), its tokenizer (copied to the workdir for export), and the eval windows.
  Nothing here reads more of the store than the eval windows.

  `block` (index, count): this process's rows of the eval batches (default: by process);
  `say`: prints what is done (reading, tokenizing: minutes to hours at scale).
  """
  d = config.data
  plan_lib.check_paths(config)
  store = _open_store(config, workdir, model_vocab, say or (lambda text: None))
  _check_store_of_workdir(workdir, store, config.train.force_resume)
  tokenizer = store.tokenizer(workdir)
  _check_vocab(tokenizer.vocab_size, model_vocab, f"the store {store.directory}")
  index, count = block or (jax.process_index(), jax.process_count())
  windows = []
  if len(store.val) >= d.batch_size * (d.seq_len + 1):
    windows = pipeline.eval_windows(store.val, batch_size=d.batch_size, window=d.seq_len + 1,
                                    num_batches=d.eval_batches,
                                    process_index=index, process_count=count)
  if not windows:
    raise ConfigError(f"config.data.val_fraction: the held-out split of {store.directory} has "
                      f"{len(store.val)} tokens, too few for one {d.batch_size} x "
                      f"{d.seq_len + 1} eval batch")
  if distributed.is_primary():    # the store this workdir trains on, from now on
    fileio.write_json(os.path.join(workdir, STORE_FILE),
                      dict(fingerprint=store.fingerprint, directory=store.directory),
                      sort_keys=True)
  return RunData(tokenizer, store.train, store.val, windows, store.unigram_entropy,
                 store.fingerprint)


def _open_store(config, workdir: str, model_vocab: int, say) -> TokenStore:
  """`tokens:DIR` as it is (its tokenizer must be the config's, if one is named), or the
  store of data.source prepared into <workdir>/data (reused when already there)."""
  d = config.data
  named = None
  if d.tokenizer not in ("", "bpe"):    # a file: checked before anything is tokenized
    named = tokenizer_lib.get_tokenizer(d.tokenizer, workdir=None, vocab_size=0)
    _check_vocab(named.vocab_size, model_vocab, repr(d.tokenizer))
  t0 = time.time()
  if d.source.startswith("tokens:"):
    store = TokenStore(d.source[len("tokens:"):])
    if named is not None and named.fingerprint() != store.manifest["tokenizer"]["fingerprint"]:
      raise ConfigError(f"config.data.tokenizer {d.tokenizer!r} is not the tokenizer of the "
                        f"store {store.directory} (its manifest names another); leave "
                        "data.tokenizer empty to use the store's own")
  else:
    out = os.path.join(workdir, "data")
    if not os.path.exists(os.path.join(out, MANIFEST)):
      say(f"data: tokenizing {d.source} into {out} (tokenizer {d.tokenizer}"
          + (f", trained first on up to {prepare_lib.BPE_SAMPLE_BYTES / 1e6:.0f} MB of it"
             if d.tokenizer == "bpe" else "") + ")")
    prepare_lib.prepare(out=out, **store_request(config, model_vocab), workers=1,
                        progress=False)
    store = TokenStore(out)
  seconds = time.time() - t0
  say(f"data: {len(store.train):,} training and {len(store.val):,} held-out tokens in "
      f"{store.directory}" + (f" (prepared in {seconds:.0f} s)" if seconds >= 1 else ""))
  return store


def _check_vocab(vocab_size: int, model_vocab: int, what: str):
  if vocab_size > model_vocab:
    raise ConfigError(f"config.model.vocab_size: the tokenizer of {what} has {vocab_size} "
                      f"tokens, more than the model's {model_vocab}")


def _check_store_of_workdir(workdir: str, store, force: bool):
  """Refuse to resume a workdir on another store than the one it was trained on."""
  path = os.path.join(workdir, STORE_FILE)
  if not os.path.exists(path) or force:
    return
  with open(path) as f:
    saved = json.load(f)
  if saved["fingerprint"] != store.fingerprint:
    raise ConfigError(
        f"workdir {workdir} was trained on the token store {saved['directory']} (fingerprint "
        f"{saved['fingerprint'][:12]}), not on {store.directory} ({store.fingerprint[:12]}); "
        "use another --workdir, or --config.train.force_resume=True to resume anyway")


def store_request(config, model_vocab: int) -> dict:
  """What a run's prepared store depends on: the arguments of `prepare.prepare` (all but the
  folder). Runs with equal requests can share one store (the sweep does)."""
  d = config.data
  return dict(source=d.source, tokenizer=d.tokenizer, vocab_size=model_vocab,
              seed=data_seed(config), val_fraction=d.val_fraction,
              val_piece_bytes=d.val_piece_bytes, max_bytes=d.max_bytes or None, text_field=d.text_field)


def data_seed(config) -> int:
  """The seed of the held-out split and the token streams: data.seed, else the run's seed.
  Runs of several seeds with one data.seed share one tokenized corpus and held-out set."""
  return config.data.seed if config.data.seed >= 0 else config.seed
