"""config.data: the corpus, its tokenizer, held-out split and batches, each field declared
once; the paths it names checked before a run, and where its token store is."""

from __future__ import annotations

import dataclasses

from tst_jax import fileio, schema
from tst_jax.data import formats, mixture as mixture_lib
from tst_jax.data.store import MANIFEST
from tst_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Data:
  """config.data: the corpus, its tokenizer and held-out split, and each step's batch."""
  source: str = schema.field(
      "builtin:pystdlib", schema.STRING, "tokens:<store dir>, read in place, or a "
      "source prepared into <workdir>/data first: " + formats.forms() + " (data/formats.py; "
      "docs/data.md)")
  mixture: str = schema.field(
      "", mixture_lib.RULE, "source=weight,...: windows drawn from each in proportion, e.g. "
      "'tokens:/data/dclm=0.5,tokens:/data/fineweb_edu=0.5', each its own store and held-out "
      "split (empty: data.source alone; docs/data.md)", added="")
  tst_mixture: str = schema.field(
      "", mixture_lib.RULE, "the mixture the tst phase reads, as data.mixture (empty: the same "
      "as the next-token phase)", added="")
  mixture_stages: str = schema.field(
      "", mixture_lib.STAGES_RULE, "step:name=weight,...;...: the training weights of "
      "data.mixture's sources from each step on, across phases, e.g. "
      "'0:dclm=0.7,fineweb=0.3;5000:dclm=0.5,fineweb=0.5' as Levanter's train_weights stages; "
      "a name is a source's last path part or the source in full, a source left out reads "
      "nothing, and data.mixture's weights still mix the held-out loss (empty: data.mixture's "
      "weights throughout; docs/data.md)", added="")
  eval_sets: str = schema.field(
      "", schema.Rule(lambda v: isinstance(v, str) and _eval_sets_parse(v) is not None,
                      "'' or name=source,... with names of letters, digits, _ . -, each once",
                      str),
      "name=source,...: more held-out sets evaluated at every eval, logged as "
      "eval_loss/<name>: a tokens: store's held-out split, or a source prepared into "
      "<workdir>/eval_sets/<name> with the run's tokenizer (docs/data.md)", added="")
  tokenizer: str = schema.field("bpe", schema.STRING, "bpe (trained once, kept with the store) "
                                "| a tokenizer.json | a SentencePiece .model")
  max_bytes: int = schema.field(0, schema.integer(0), "read at most this many bytes of text "
                                "(0: all)")
  text_field: str = schema.field("text", schema.STRING, "the JSONL field / Parquet column / "
                                 "tfds or seqio feature holding each document")
  imports: str = schema.field(
      "", schema.Rule(lambda v: isinstance(v, str) and all(
          part.isidentifier() for name in formats.modules(v) for part in name.split(".")),
                      "'' or module names, comma-separated", str),
      "modules imported before the data is read, comma-separated: those that register the "
      "seqio Tasks and Mixtures a seqio: source names (t5x's mixture_or_task_module), or a "
      "source format (docs/data.md)", added="")
  val_fraction: float = schema.field(0.02, schema.number(0, 1, open_lo=True, open_hi=True),
                                     "fraction of the corpus held out for eval")
  val_piece_bytes: int = schema.field(
      2048, schema.integer(0), "held out by pieces of <= this many bytes cut at line ends, so "
      "a small corpus's held-out set is many pieces (0: whole documents)", added=0)
  seed: int = schema.field(-1, schema.integer(-1), "held-out split, document order and BPE "
                           "(-1: the run's seed)")
  seq_len: int = schema.field(128, schema.integer(1), "L: positions the model sees (the latent "
                              "length in phase 1)")
  batch_size: int = schema.field(16, schema.integer(1), "B: rows per step, global")
  eval_batches: int = schema.field(4, schema.integer(1), "held-out batches of B x (L + 1) "
                                   "tokens per eval")
  document_mask: bool = schema.field(
      False, schema.BOOL, "attend within each EOS-ended document only, in both phases and in "
      "evals; a position (a bag: its first token) predicts only its own document's tokens "
      "(docs/data.md)", added=False)
  document_positions: bool = schema.field(
      False, schema.BOOL, "with data.document_mask: positions restart at 0 at each document",
      added=False)
  run_seed: int = 0    # derived: the run's seed (config.seed), for seed = -1

  @property
  def split_seed(self) -> int:
    """Seed of the split, document order and BPE: data.seed, else the run's, so runs of
    several seeds with one data.seed share one tokenized corpus and held-out set."""
    return self.seed if self.seed >= 0 else self.run_seed

  def __post_init__(self):
    if self.document_positions and not self.document_mask:
      raise ConfigError("data.document_positions", "needs data.document_mask=True: positions "
                        "restart at documents only where attention keeps to them")
    if self.mixture_stages and not self.mixture:
      raise ConfigError("data.mixture_stages", "needs data.mixture, which names the sources "
                        "the stages weigh")
    if self.mixture_stages and self.tst_mixture:
      raise ConfigError("data.mixture_stages", "sets every phase's weights, so "
                        "data.tst_mixture would be ignored: leave it empty and give the tst "
                        "phase's weights as the stage at step 0")
    mixture_lib.RunMixture.of(self)   # each stage's names, sources of data.mixture

  def alone(self, source: str, **fields) -> Data:
    """Returns this section reading `source` alone: no mixture, stages or eval sets."""
    return dataclasses.replace(self, source=source, mixture="", tst_mixture="",
                               mixture_stages="", eval_sets="", **fields)

  def missing_fields(self) -> list[str]:
    """Lists the fields a run needs but leaves empty. A tokens: store brings its own tokenizer."""
    needed = ("source",) if self.source.startswith("tokens:") else ("source", "tokenizer")
    return [f for f in needed if not getattr(self, f)]


def check_fields(data: Data) -> None:
  """Checks what a run will read without reading it: the fields it needs are set, each source
  is of a known form, a mixture's raw sources share one tokenizer, and every bucket is named as
  GCS names them. A launcher checks this on a machine that cannot see the data; a run adds
  `check_paths`."""
  formats.import_modules(data.imports)   # the formats and seqio Tasks its sources name
  mixed = bool(data.mixture or data.tst_mixture)
  for field in ([] if mixed else data.missing_fields()):
    raise ConfigError(f"data.{field}", "is empty: set it (the paper configs need a token store "
                      "of your copy of the data, or the data and the Llama-3 tokenizer.json; see "
                      "the config's docstring)")
  sources = _mixture_sources(data) if mixed else [("data.source", data.source)]
  for field, source in sources + [("data.eval_sets", s) for _, s in eval_sets(data)]:
    kind, _, where = source.partition(":")
    if kind != "tokens" and (kind not in formats.FORMATS or not where):
      raise ConfigError(field, f"{source!r} is not a source: expected {formats.forms()}, or "
                        "tokens:<dir> of a store made by python -m tst_jax.data.prepare")
    _bucket_named(where, field)
  if data.tokenizer not in ("", "bpe"):
    _bucket_named(data.tokenizer, "data.tokenizer")
  raw = [s for _, s in sources if not s.startswith("tokens:")]
  if mixed and raw and len(sources) > 1 and data.tokenizer in ("", "bpe"):
    raise ConfigError("data.tokenizer", f"the mixture tokenizes {raw[0]!r} here, and each "
                      "source would get its own bpe: give a tokenizer.json, or prepare the "
                      "sources with one tokenizer and mix the tokens: stores (docs/data.md)")


def _mixture_sources(data: Data) -> list[tuple[str, str]]:
  """Returns (field, source) of each source of the run's mixtures."""
  field = "data.mixture" if data.mixture else "data.tst_mixture"
  return [(field, s) for s in mixture_lib.RunMixture.of(data).sources]


def _bucket_named(path: str, field: str):
  """`fileio.check_bucket_name` as a ConfigError of `field`."""
  try:
    fileio.check_bucket_name(path, "")
  except fileio.PathError as e:
    raise ConfigError(field, str(e)) from None


def check_paths(data: Data) -> None:
  """Checks that the files a train or eval run reads exist. Plan mode does not need them."""
  check_fields(data)
  if data.eval_sets:
    _check_sources(data, [s for _, s in eval_sets(data)], "data.eval_sets")
  if data.mixture or data.tst_mixture:
    _check_mixture_paths(data)
    return
  kind, _, pattern = data.source.partition(":")
  if kind in formats.FORMATS:
    formats.FORMATS[kind].check(kind, pattern)
  if kind == "tokens":
    _reachable(pattern, "data.source", "the token store")
  if kind == "tokens" and not fileio.isfile(fileio.join(store_dir(data, None), MANIFEST)):
    raise ConfigError("data.source", f"{pattern!r} is not a token store (no manifest.json): "
                      "make one with python -m tst_jax.data.prepare --out=DIR (docs/data.md)")
  if data.tokenizer not in ("", "bpe"):
    _reachable(data.tokenizer, "data.tokenizer", "the tokenizer")
  if data.tokenizer not in ("", "bpe") and not fileio.isfile(data.tokenizer):
    raise ConfigError("data.tokenizer", f"file {data.tokenizer!r} does not exist: give the path "
                      "of a tokenizer.json or .model, or 'bpe' to train one on the data")


def _reachable(path: str, field: str, what: str):
  """`fileio.check_reachable` as a ConfigError of `field`."""
  try:
    fileio.check_reachable(path, what)
  except fileio.PathError as e:
    raise ConfigError(field, str(e)) from None


def _check_mixture_paths(data: Data) -> None:
  """Each source of the mixtures as `check_paths` checks data.source."""
  mix = mixture_lib.RunMixture.of(data)
  _check_sources(data, mix.sources, "data.mixture" if data.mixture else "data.tst_mixture")


def _check_sources(data: Data, sources: list[str], field: str) -> None:
  """Each of `sources` as `check_paths` checks data.source, an error naming `field`."""
  for source in sources:
    try:
      check_paths(data.alone(source))
    except ConfigError as e:
      raise ConfigError(field if e.field == "data.source" else e.field, e.message) from None


def _eval_sets_parse(text: str) -> tuple[tuple[str, str], ...] | None:
  """Parses `text` into (name, source) pairs of 'name=source' items, or None when it is not one."""
  pairs = [item.strip().partition("=") for item in text.split(",") if item.strip()]
  names = [name for name, _, _ in pairs]
  if len(set(names)) < len(names) or not all(
      sep and source and name.replace("_", "a").replace(".", "a").replace("-", "a").isalnum()
      for name, sep, source in pairs):
    return None
  return tuple((name, source) for name, _, source in pairs)


def eval_sets(d: Data) -> tuple[tuple[str, str], ...]:
  """Returns the name and source of each set of data.eval_sets."""
  return _eval_sets_parse(d.eval_sets) or ()


def store_dir(d: Data, prepared: str | None) -> str | None:
  """Where the store of data.source is: `tokens:DIR` (with ~ expanded, as check_paths reads
  it), else the folder `prepared` it is prepared into, None where there is none."""
  kind, _, path = d.source.partition(":")
  if kind == "tokens":
    return fileio.expanduser(path)
  return prepared
