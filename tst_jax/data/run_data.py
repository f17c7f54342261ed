"""A run's data: its token store (`tokens:DIR` read in place, any other source prepared once
into the run's data/), the tokenizer, and the held-out eval windows of this process."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Callable

import jax
import numpy as np

from tst_jax import fileio
from tst_jax.data import mixture as mixture_lib, pipeline, prepare as prepare_lib
from tst_jax.data import sources
from tst_jax.data import tokenizer as tokenizer_lib
from tst_jax.data.section import Data, eval_sets, store_dir
from tst_jax.data.store import MANIFEST, TokenStore
from tst_jax.errors import ConfigError
from tst_jax.rundir import RunDir

log = logging.getLogger("tst_jax")


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """A held-out split, or one per store of a mixture, read as `num_batches` batches of
  windows spread evenly over it (`pipeline.eval_windows`), the same at every eval."""
  splits: dict                       # source -> its store's held-out StoreSplit
  num_batches: int                   # data.eval_batches
  block: tuple[int, int]             # (index, count): this process's rows of each batch
  mixture: mixture_lib.RunMixture | None = None   # rows drawn from its main entries
  byte_splits: dict | None = None    # source -> the bytes under each token of its split; None
                                     # where a store does not record them

  @classmethod
  def of(cls, stores: dict, num_batches: int, block: tuple[int, int],
         mixture: mixture_lib.RunMixture | None = None) -> HeldOut:
    """Returns the HeldOut of `stores`, source -> TokenStore, with their tokens' bytes where
    every one of them records them."""
    known = all(st.val_bytes is not None for st in stores.values())
    return cls({s: st.val for s, st in stores.items()}, num_batches, block, mixture,
               {s: st.val_bytes for s, st in stores.items()} if known else None)

  def token_bytes(self, batch_size: int, window: int) -> list[np.ndarray] | None:
    """Returns the UTF-8 bytes of text under each token of `windows(batch_size, window)`,
    [B_local, W] each, or None where a store does not record them."""
    if self.byte_splits is None:
      return None
    return dataclasses.replace(self, splits=self.byte_splits, byte_splits=None).windows(
        batch_size, window)

  def windows(self, batch_size: int, window: int) -> list[np.ndarray]:
    """Returns this process's rows [B_local, W] of each batch of `batch_size` windows of
    `window` tokens: fewer batches, or none, where the split is short."""
    if not self.fits(batch_size, window):
      return []
    index, count = self.block
    draw = dict(batch_size=batch_size, window=window, num_batches=self.num_batches,
                process_index=index, process_count=count)
    if self.mixture is None:
      (split,) = self.splits.values()
      return pipeline.eval_windows(split, **draw)
    return self.mixture.eval_windows(self.splits, **draw)

  def fits(self, batch_size: int, window: int) -> bool:
    """Says whether each split holds its rows of one batch, the least `windows` draws: a
    store read alone gives a batch's rows, each source of a mixture all its rows at once."""
    if self.mixture is None:
      return all(len(split) >= batch_size * window for split in self.splits.values())
    rows = self.mixture.eval_rows(batch_size, self.num_batches)
    return all(len(self.splits[source]) >= n * window for source, n in rows.items())


@dataclasses.dataclass(frozen=True)
class RunData:
  tokenizer: tokenizer_lib.Tokenizer
  train: object                      # StoreSplit: the training stream, memory-mapped
  val: object                        # StoreSplit: the held-out stream
  eval_windows: list[np.ndarray]     # this process's rows of each eval batch, [B_local, W]
  held_out: HeldOut                  # where eval_windows come from, for windows of other widths
  unigram_entropy: float
  fingerprint: str                   # of the token store: a workdir resumes on the same one
  data_name: str                     # what config.reference.data names: store.data_name
  mixture: mixture_lib.RunMixture | None = None    # data.mixture's stores, the first as `train`
  eval_sets: dict = dataclasses.field(default_factory=dict)   # name -> its HeldOut

  @property
  def directory(self) -> str:
    """Names the folder of the run's store, or of each store of its mixture."""
    if self.mixture is None:
      return self.train.directory
    return ", ".join(split.directory for split in self.mixture.splits.values())

  def check_batches(self, d: Data, phases) -> None:
    """Refuses a training split too small for a phase's batches (`check_fits`): a store read
    alone draws a batch's B windows at once, each source of a mixture one window at a time.
    Phases are read by `batch_size`, `window`, `name` and `is_tst`, as train.plan.Phase has
    them."""
    if self.mixture is None:
      for p in phases:
        check_fits(d, "data.source", d.source, self.train, p.window,
                   lambda b, k, p=p: p.batch_size * b // d.batch_size, f"a {p.name} batch")
      return
    for part in self.mixture.parts(phases):
      p = phases[part.phase]
      for e in part.entries:
        field = ("data.tst_mixture" if p.is_tst and d.tst_mixture else
                 "data.mixture" if d.mixture else "data.source")
        check_fits(d, field, e.source, self.mixture.splits[e.source], p.window,
                   lambda b, k: 1, f"the {p.name} phase")

  @property
  def train_tokens(self) -> TrainTokens:
    """Training tokens of the run's store, or of each store of its mixture."""
    if self.mixture is None:
      return TrainTokens.of(self.train)
    return TrainTokens.of_mixture(self.mixture, {s: TrainTokens.of(split)
                                                 for s, split in self.mixture.splits.items()})


@dataclasses.dataclass(frozen=True)
class Stores:
  """The token stores a run trains on, opened: data.source's, or one per source of its
  mixture."""
  stores: tuple[TokenStore, ...]
  mixture: mixture_lib.RunMixture | None
  fingerprint: str      # the one store's, or of the mixture's sources and their stores
  directory: str        # the folder of each store, joined by ", "


def open_stores(d: Data, rundir: RunDir, model_vocab: int, say=None) -> Stores:
  """Opens the token stores the run trains on, reading their manifests only: `tokens:DIR` in
  place, any other source prepared once into the run's data/, a mixture's k-th source into
  its mixture/<k>/data. The caller has checked the paths with `check_paths`."""
  say = say or (lambda text: None)
  if not (d.mixture or d.tst_mixture):
    store = _open_store(d, rundir.data, model_vocab, say)
    return Stores((store,), None, store.fingerprint, store.directory)
  mix = mixture_lib.RunMixture.of(d)
  stores = tuple(_open_store(dataclasses.replace(d, source=s), rundir.mixture_data(k),
                             model_vocab, say) for k, s in enumerate(mix.sources))
  if len({st.manifest["tokenizer"]["fingerprint"] for st in stores}) > 1:
    raise ConfigError("data.mixture", "the stores " + ", ".join(st.directory for st in stores)
                      + " were made with different tokenizers: prepare them with one")
  body = json.dumps([[s, st.fingerprint] for s, st in zip(mix.sources, stores)])
  return Stores(stores, mix, hashlib.sha256(body.encode()).hexdigest(),
                ", ".join(st.directory for st in stores))


def load_data(d: Data, stores: Stores, rundir: RunDir, model_vocab: int, block=None,
              say=None) -> RunData:
  """Returns the run's data from its opened `stores`: their tokenizer, checked against the
  model's vocab, and the eval windows, reading no more of the stores than those windows.
  A source of data.eval_sets is prepared into the run's eval_sets/<name>/data.
    block  (index, count): this process's rows of the eval batches, by default by process
    say    prints what is done, since reading and tokenizing take hours at scale
  """
  block = block or (jax.process_index(), jax.process_count())
  run = (_mixture_data(d, stores, model_vocab, block) if stores.mixture is not None
         else _store_data(d, stores.stores[0], model_vocab, block))
  if not d.eval_sets:
    return run
  return dataclasses.replace(run, eval_sets=_eval_set_windows(d, rundir, run, block, say))


def prepare_data(d: Data, rundir: RunDir, model_vocab: int, block=None, say=None) -> RunData:
  """Opens the run's token stores and loads its data from them, `open_stores` then
  `load_data`, with none of the checks against the run's record that Setup makes between
  the two."""
  return load_data(d, open_stores(d, rundir, model_vocab, say), rundir, model_vocab, block, say)


def _store_data(d: Data, store: TokenStore, model_vocab: int, block) -> RunData:
  """`load_data` of one store."""
  tokenizer = store.tokenizer()
  _check_vocab(tokenizer.vocab_size, model_vocab, f"the store {store.directory}")
  check_fits(d, "data.source", d.source, store.val, d.seq_len + 1, lambda b, k: b * k,
             f"{d.eval_batches} eval batches")
  held_out = HeldOut.of({d.source: store}, d.eval_batches, block)
  return RunData(tokenizer, store.train, store.val, held_out.windows(d.batch_size, d.seq_len + 1),
                 held_out, store.unigram_entropy, store.fingerprint, store.data_name)


def _mixture_data(d: Data, opened: Stores, model_vocab: int, block) -> RunData:
  """`load_data` of a mixture: one tokenizer for all its stores, and held-out windows drawn
  from the entries as training rows are."""
  stores = opened.stores
  tokenizer = stores[0].tokenizer()
  _check_vocab(tokenizer.vocab_size, model_vocab, f"the store {stores[0].directory}")
  mix = dataclasses.replace(opened.mixture,
                            splits={s: st.train for s, st in zip(opened.mixture.sources, stores)})
  for e in mix.main:
    check_fits(d, "data.mixture" if d.mixture else "data.source", e.source,
               stores[mix.sources.index(e.source)].val, d.seq_len + 1,
               lambda b, k, e=e: mix.eval_rows(b, k)[e.source],
               f"its rows of {d.eval_batches} eval batches")
  held_out = HeldOut.of(dict(zip(mix.sources, stores)), d.eval_batches, block, mix)
  entropy = sum(e.weight * stores[mix.sources.index(e.source)].unigram_entropy
                for e in mix.main)   # a lower bound of the mixture's: docs/data.md
  return RunData(tokenizer, stores[0].train, stores[0].val,
                 held_out.windows(d.batch_size, d.seq_len + 1), held_out, entropy,
                 opened.fingerprint, opened.fingerprint, mix)


def _eval_set_windows(d: Data, rundir: RunDir, run: RunData, block, say) -> dict:
  """name -> the HeldOut of each set of data.eval_sets: the held-out split of its store, a
  `tokens:` one of the run's tokenizer or one prepared with it."""
  out = {}
  for name, source in eval_sets(d):
    plain = d.alone(source, tokenizer="" if source.startswith("tokens:")
                    else run.tokenizer.path)
    store = _open_store(plain, rundir.eval_set_data(name), run.tokenizer.vocab_size,
                        say or (lambda text: None))
    if store.manifest["tokenizer"]["fingerprint"] != run.tokenizer.fingerprint():
      raise ConfigError("data.eval_sets", f"{name}: the store {store.directory} was made with "
                        "another tokenizer than the run's: prepare it with the run's")
    check_fits(d, "data.eval_sets", source, store.val, d.seq_len + 1, lambda b, k: b * k,
               f"{d.eval_batches} eval batches of the set {name}")
    out[name] = HeldOut.of({source: store}, d.eval_batches, block)
  return out


def check_fits(d: Data, field: str, source: str, split, window: int,
               rows_of: Callable[[int, int], int], need: str) -> None:
  """Refuses a split of `source`'s store too small for its batches, held-out or training,
  with one error naming the source, the split's tokens and what would fit.

  Its reader draws `rows_of(batch_size, eval_batches)` windows of `window` tokens at once,
  which need that many times `window` tokens (pipeline.WindowSource): `need` says which rows.
  `field` is the config field that names the source."""
  held_out = split.split == "val"
  where = source if source.startswith("tokens:") else f"{source} (the store {split.directory})"
  tokens, rows = len(split), rows_of(d.batch_size, d.eval_batches)
  if tokens >= rows * window:
    return
  holds = tokens // window
  fits = lambda b, k: 1 <= rows_of(b, k) <= holds   # a fix that reads none of it is no fix
  fixes = [f"data.eval_batches={k}" for k in range(d.eval_batches - 1, 0, -1)
           if held_out and fits(d.batch_size, k)][:1]
  fixes += [f"data.batch_size={b}" for b in range(d.batch_size - 1, 0, -1)
            if fits(b, d.eval_batches)][:1]
  if not held_out:
    fixes.append("a shorter window (data.seq_len, tst.bag_size)")
  fixes.append("more data" + (f" (data.val_fraction, {d.val_fraction:g} now)"
                              if held_out and not source.startswith("tokens:") else ""))
  raise ConfigError(field, f"{where}: its {'held-out' if held_out else 'training'} split has "
                    f"{tokens:,} tokens, too few for {need}, {rows:,} window"
                    f"{'s' * (rows != 1)} of {window} tokens ({rows * window:,}): give "
                    + (", ".join(fixes[:-1]) + " or " if len(fixes) > 1 else "") + fixes[-1])


@dataclasses.dataclass(frozen=True)
class TrainTokens:
  """How many training tokens a run's store holds, as far as is known before it trains."""
  count: int
  exact: bool          # counted in a store, else an upper bound from the size of the text
  where: str           # the store, or how the bound was made
  mixture: mixture_lib.RunMixture | None = None   # a mixture's, with each source's count:
  entries: tuple = ()                             # ((source, TrainTokens), ...)

  @classmethod
  def of(cls, split) -> TrainTokens:
    """Counts the training tokens of a StoreSplit."""
    return cls(len(split), True, f"the store {split.directory}")

  @classmethod
  def of_mixture(cls, mix, counts: dict) -> TrainTokens:
    """Sums a mixture's counts, given as source -> TrainTokens, and keeps each source's."""
    return cls(sum(t.count for t in counts.values()), all(t.exact for t in counts.values()),
               f"{len(counts)} stores of data.mixture", mix, tuple(counts.items()))

  def passes(self, plan) -> list[tuple[str, int, list[float]]]:
    """(where, training tokens, passes of each phase) of each store the run of `plan`
    reads: its one store, or each source of its mixture."""
    if self.mixture is None:
      return [(self.where, self.count, plan.passes(self.count))]
    counts = {s: t.count for s, t in self.entries}
    return [(s, counts[s], x) for s, x in self.mixture.passes(plan.phases, counts).items()]

  def stage_passes(self, plan) -> list[tuple[mixture_lib.StageRead, dict[str, float]]]:
    """Each stage of data.mixture_stages with the passes it makes over each source's
    training tokens; none without stages."""
    if self.mixture is None:
      return []
    counts = {s: t.count for s, t in self.entries}
    return [(read, {s: n / counts[s] for s, n in read.tokens.items()})
            for read in self.mixture.stage_reads(plan.phases)]


def training_tokens(d: Data, rundir: RunDir | None = None) -> TrainTokens | None:
  """Counts the training tokens of the run's store where it exists, else bounds them by the
  source's size with `sources.token_bound`, else None. Reads manifests and file sizes only.

  The store exists for a `tokens:` source or once prepared into the run's data/, or a
  mixture's k-th source into its mixture/<k>/data."""
  if d.mixture or d.tst_mixture:
    mix = mixture_lib.RunMixture.of(d)
    counts = {s: _training_tokens(d.alone(s), rundir and rundir.mixture_data(k))
              for k, s in enumerate(mix.sources)}
    return None if None in counts.values() else TrainTokens.of_mixture(mix, counts)
  return _training_tokens(d, rundir and rundir.data)


def _training_tokens(d: Data, prepared: str | None) -> TrainTokens | None:
  """`training_tokens` of data.source alone, prepared into the folder `prepared`."""
  folder = store_dir(d, prepared)
  if folder and fileio.isfile(fileio.join(folder, MANIFEST)):
    return TrainTokens.of(TokenStore(folder).train)
  bound = sources.token_bound(d.source, d.max_bytes or None)
  if bound is None:
    return None
  return TrainTokens(bound, False, f"not tokenized yet: the bytes of {d.source}, a bound for "
                                   "UTF-8 text")


def _open_store(d: Data, prepared: str, model_vocab: int, say) -> TokenStore:
  """`tokens:DIR` as it is (its tokenizer must be the config's, if one is named), or the
  store of data.source prepared into the folder `prepared` (reused when already there)."""
  named = None
  if d.tokenizer not in ("", "bpe"):    # a file: checked before anything is tokenized
    named = tokenizer_lib.get_tokenizer(d.tokenizer, folder=None, vocab_size=0)
    _check_vocab(named.vocab_size, model_vocab, repr(d.tokenizer))
  t0 = time.time()
  if d.source.startswith("tokens:"):
    store = TokenStore(store_dir(d, prepared))
    if named is not None and named.fingerprint() != store.manifest["tokenizer"]["fingerprint"]:
      raise ConfigError("data.tokenizer", f"{d.tokenizer!r} is not the tokenizer of the "
                        f"store {store.directory} (its manifest names another); leave "
                        "data.tokenizer empty to use the store's own")
  else:
    out = prepared
    if not fileio.exists(fileio.join(out, MANIFEST)):
      say(f"data: tokenizing {d.source} into {out} (tokenizer {d.tokenizer}"
          + (f", trained first on up to {prepare_lib.BPE_SAMPLE_BYTES / 1e6:.0f} MB of it"
             if d.tokenizer == "bpe" else "") + ")")
    prepare_lib.prepare(out=out, **store_request(d, model_vocab), workers=1,
                        progress=False)
    store = TokenStore(out)
  seconds = time.time() - t0
  text = store.val_text_bytes
  say(f"data: {len(store.train):,} training and {len(store.val):,} held-out tokens in "
      f"{store.directory}" + (f" (prepared in {seconds:.0f} s)" if seconds >= 1 else "")
      + ("; held-out bytes unknown: the store was prepared before stores recorded them, so "
         "no bits per byte (prepare it again for them)" if text is None else
         f"; {text / max(len(store.val), 1):.3g} bytes of text per held-out token"))
  return store


def _check_vocab(vocab_size: int, model_vocab: int, what: str):
  """Refuses a tokenizer of more tokens than the model's vocabulary, and warns of one of
  fewer: the rows past its last id are never trained, which padding may mean, a typo not."""
  if vocab_size > model_vocab:
    raise ConfigError("model.vocab_size", f"the tokenizer of {what} has {vocab_size} "
                      f"tokens, more than the model's {model_vocab}")
  if vocab_size < model_vocab and jax.process_index() == 0:
    log.warning("model.vocab_size %d is larger than the %d tokens of the tokenizer of %s: "
                "%d rows of the embedding and the head are never trained; set "
                "--config.model.vocab_size=%d unless the padding is meant", model_vocab,
                vocab_size, what, model_vocab - vocab_size, vocab_size)


def store_request(d: Data, model_vocab: int) -> dict:
  """Returns what a run's prepared store depends on: the arguments of `prepare.prepare` but
  the folder. Runs with equal requests can share one store, as a sweep's do."""
  return dict(source=d.source, tokenizer=d.tokenizer, vocab_size=model_vocab, seed=d.split_seed,
              val_fraction=d.val_fraction, val_piece_bytes=d.val_piece_bytes,
              max_bytes=d.max_bytes or None, text_field=d.text_field) | (
                  dict(imports=d.imports) if d.imports else {})   # older requests: unchanged
