"""Source formats in one registry: what data.source's `<format>:<argument>` means.

Each format is one `Format` of FORMATS, which says how a source of it is checked before a
run, cut into input shards, read, bounded in tokens and recorded in its store's manifest:
builtin, text, jsonl, parquet, tfds and seqio. `glob_format` makes the format of the files
that a glob matches from the reader of one file. `register` adds a format, so a new one is
one file and a line here (docs/architecture.md). A `tokens:` source is a store already
prepared, which data/run_data.py reads in place.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator

from tst_jax import fileio, schema
from tst_jax.data import file_readers
from tst_jax.errors import ConfigError, DataError

_SKIP_DIRS = ("site-packages", "dist-packages")
_GROUP_BYTES = 64 << 20  # text:/builtin: files are grouped into input shards of about this size


@dataclasses.dataclass(frozen=True)
class InputShard:
  """One unit of work of `prepare`: a group of text files, one JSONL or Parquet file, or a
  whole tfds or seqio split. `num_bytes` on disk drives the progress bar."""
  kind: str                 # the format that reads it, a name of FORMATS
  paths: tuple[str, ...]    # files, one document each for text:, or tfds's name and split
  num_bytes: int
  text_field: str = "text"
  imports: str = ""         # data.imports: what a worker process imports before reading it

  @property
  def name(self) -> str:
    return self.paths[0] if len(self.paths) == 1 else f"{self.paths[0]} (+{len(self.paths) - 1})"


def _no_check(name: str, argument: str) -> None:
  del name, argument


def _unknown_size(argument: str) -> None:
  del argument


def _nothing_more(argument: str) -> dict:
  del argument
  return {}


@dataclasses.dataclass(frozen=True)
class Format:
  """A source format. Each function takes the source's argument, what follows `<format>:`,
  and `shards` and `check` take the format's name before it.
    argument     how a source writes its argument, for the words of an unknown source
    shards       (name, argument, text_field) -> the input shards, in corpus order
    documents    one shard's documents as read, bytes or str, blank ones included
    check        refuses, before a run, a source whose files are missing: one ConfigError
                 naming data.source
    sizes        {path: bytes} of the text a source reads, which bound its tokens, or None
    fingerprint  what the corpus depends on that the source does not name, recorded in its
                 store's manifest and so in the store's fingerprint
  A store's fingerprint also holds each shard's sha256, so it changes with a file's text.
  """
  argument: str
  shards: Callable[[str, str, str], list[InputShard]]
  documents: Callable[[InputShard], Iterator[bytes | str]]
  check: Callable[[str, str], None] = _no_check
  sizes: Callable[[str], dict[str, int] | None] = _unknown_size
  fingerprint: Callable[[str], dict] = _nothing_more


def matching_files(source: str, pattern: str) -> dict[str, int]:
  """Returns {path: bytes} of the files `pattern` matches, local or in a bucket or the Hub, in
  sorted order. None matching, or a store that refuses, is one DataError naming the source."""
  fileio.check_bucket_name(pattern, "data.source")
  try:
    files = fileio.glob_files(pattern)
  except fileio.PathError:
    raise
  except Exception as e:   # pylint: disable=broad-except
    if fileio.local_path(pattern) is not None:
      raise
    if isinstance(e, FileNotFoundError):    # no bucket: check_readable below says so
      fileio.check_readable(pattern, "data.source")
    raise fileio.PathError(f"data.source {source!r} cannot be listed: "
                           f"{fileio.reason(e, pattern)}") from None
  if not files:
    fileio.check_reachable(pattern, "data.source")
    raise DataError(f"data.source {source!r} matched no files")
  return files


def check_glob(suffix: str, name: str, pattern: str) -> None:
  """Refuses a glob of format `name` that matches no file, its error's example ending in
  `suffix`. A bucket or the Hub that refuses, or a missing bucket, is one ConfigError naming
  it and why."""
  try:
    fileio.check_reachable(pattern, "the glob")
  except fileio.PathError as e:
    raise ConfigError("data.source", str(e)) from None
  if not fileio.any_file(pattern):
    raise ConfigError("data.source", f"{pattern!r} matches no files: give a glob of {name} "
                      f"files, e.g. '{name}:/data/corpus/**/*.{suffix}'")


def _one_shard_a_file(name: str, pattern: str, text_field: str) -> list[InputShard]:
  files = matching_files(f"{name}:{pattern}", pattern)
  return [InputShard(name, (p,), size, text_field) for p, size in files.items()]


def _whole_file(read, shard: InputShard) -> Iterator[str]:
  return file_readers.whole_file(shard.paths[0], read(shard.paths[0], shard.text_field))


def glob_format(read: Callable[[str, str], Iterator[str]], suffix: str, **fields) -> Format:
  """Returns the format of the files a glob matches, each file one input shard whose
  documents are `read(path, text_field)`: a file that cannot be read to its end is one
  BadFile naming it, and a glob that matches nothing is refused before a run, its example
  ending in `suffix`. `fields` sets the rest of the Format."""
  return Format("<glob>", _one_shard_a_file, functools.partial(_whole_file, read),
                check=functools.partial(check_glob, suffix), **fields)


def _grouped(files: dict[str, int]) -> list[InputShard]:
  """Groups consecutive files of {path: bytes}, one document each, into shards of about
  _GROUP_BYTES."""
  shards, group, size = [], [], 0
  for p, nbytes in files.items():
    group.append(p)
    size += nbytes
    if size >= _GROUP_BYTES:
      shards.append(InputShard("text", tuple(group), size))
      group, size = [], 0
  if group:
    shards.append(InputShard("text", tuple(group), size))
  return shards


def _text_shards(name: str, pattern: str, text_field: str) -> list[InputShard]:
  del text_field
  return _grouped(matching_files(f"{name}:{pattern}", pattern))


def _text_files(shard: InputShard) -> Iterator[bytes]:
  return (file_readers.read_file(p) for p in shard.paths)


def _stdlib_files() -> list[str]:
  root = sysconfig.get_paths()["stdlib"]
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
    paths.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(".py"))
  return sorted(paths)


def pystdlib_version() -> str:
  """Returns this Python's major.minor: builtin:pystdlib reads its standard library, which
  differs from one version to the next."""
  return "%d.%d" % sys.version_info[:2]


def _builtin_shards(name: str, argument: str, text_field: str) -> list[InputShard]:
  del text_field
  if argument != "pystdlib":
    raise DataError(f"unknown data.source {name + ':' + argument!r}: expected {forms()}")
  return _grouped({p: os.path.getsize(p) for p in _stdlib_files()})


def _builtin_sizes(argument: str) -> dict[str, int] | None:
  return {p: os.path.getsize(p) for p in _stdlib_files()} if argument == "pystdlib" else None


def modules(text: str) -> tuple[str, ...]:
  """Returns the module names of data.imports, comma-separated in `text`."""
  return tuple(filter(None, (name.strip() for name in text.split(","))))


def import_modules(text: str) -> None:
  """Imports the modules of data.imports (`text`), which register what a source names: seqio
  Tasks and Mixtures, as t5x's mixture_or_task_module, or a format of `register`. A module
  that does not import is one ConfigError naming it and why."""
  for name in modules(text):
    try:
      importlib.import_module(name)
    except Exception as e:   # pylint: disable=broad-except  # the user's module: any error
      raise ConfigError("data.imports", f"module {name!r} does not import: "
                        f"{type(e).__name__}: {e}") from None


def _split_shard(name: str, argument: str, text_field: str) -> list[InputShard]:
  """Returns the one shard of a tfds or seqio source, `<dataset or task>[:<split>]`."""
  dataset, _, split = argument.partition(":")
  return [InputShard(name, (dataset, split or "train"), 0, text_field)]


def _tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError("data.source", "a tfds: source needs tensorflow-datasets: pip install "
                      "'tst-jax[tfds]'") from None
  return tfds


def _tfds_source(name: str, split: str):
  """Returns split `split` of TFDS dataset `name` as its ArrayRecord data source (random
  access, no TensorFlow), prepared in the data_dir TFDS_DATA_DIR names when this is called,
  else TFDS's default: a run reads a prepared dataset and never downloads one. A dataset,
  preparation or split that is not there is one ConfigError naming what is."""
  tfds = _tfds()
  data_dir = os.environ.get("TFDS_DATA_DIR") or None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ConfigError("data.source", f"'tfds:{name}' is not a TFDS dataset here: "
                      f"{str(e).splitlines()[0]}") from None
  if not builder.is_prepared():
    raise ConfigError("data.source", f"TFDS dataset {name!r} is not prepared in "
                      f"{builder.data_dir}: prepare it with `tfds build {name}` (its data_dir "
                      "as TFDS_DATA_DIR)")
  splits = builder.info.splits
  if split.partition("[")[0] not in splits:   # train[:10%] is a slice of train
    raise ConfigError("data.source", f"TFDS dataset {name!r} has no split {split!r}: its "
                      f"splits are {', '.join(sorted(splits))}")
  return tfds.data_source(name, split=split, data_dir=data_dir, download=False)


def _tfds_check(name: str, argument: str) -> None:
  _tfds_source(*_split_shard(name, argument, "")[0].paths)


def _tfds_texts(shard: InputShard) -> Iterator[bytes]:
  source = _tfds_source(*shard.paths)
  for i in range(len(source)):
    yield _feature(source[i], shard)


def _feature(example: dict, shard: InputShard, decode: Callable | None = None) -> bytes | str:
  """Returns feature `shard.text_field` of `example` as text: bytes or str as they are, token
  ids decoded by `decode`, the feature's vocabulary where it names one. A missing feature, or
  ids with no vocabulary, is one DataError."""
  if shard.text_field not in example:
    raise DataError(f"data.source '{shard.kind}:{shard.paths[0]}': its examples have no feature "
                    f"{shard.text_field!r} (data.text_field); they have "
                    f"{', '.join(sorted(example))}")
  value = example[shard.text_field]
  if isinstance(value, (bytes, str)):
    return value
  if decode is None:
    raise DataError(f"data.source '{shard.kind}:{shard.paths[0]}': feature "
                    f"{shard.text_field!r} is not text ({type(value).__name__}) and names no "
                    "vocabulary that decodes it")
  return decode(value)


def _seqio_provider(name: str):
  """Returns the seqio Task or Mixture `name`, registered by data.imports' modules. seqio
  missing, or a name it does not know, is one ConfigError naming the close names."""
  try:
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError("data.source", "a seqio: source needs seqio: pip install "
                      "'tst-jax[seqio]'") from None
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError:
    known = list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names())
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    raise ConfigError("data.source", f"no seqio Task or Mixture {name!r} is registered"
                      + (f" (close: {', '.join(close)})" if close else "") + ": name the "
                      "module that registers it in data.imports") from None


def _seqio_split(task: str, split: str):
  """Returns the seqio Task or Mixture `task`, refusing a split it does not have."""
  provider = _seqio_provider(task)
  if split not in provider.splits:
    raise ConfigError("data.source", f"seqio {type(provider).__name__} {task!r} has no split "
                      f"{split!r}: its splits are {', '.join(sorted(provider.splits))}")
  return provider


def _seqio_check(name: str, argument: str) -> None:
  _seqio_split(*_split_shard(name, argument, "")[0].paths)


def _seqio_texts(shard: InputShard) -> Iterator[bytes | str]:
  """Yields feature data.text_field of each example of the Task's preprocessed dataset, its
  preprocessors applied, in order; of a Mixture, seqio's own draw from its Tasks by their
  rates (seqio's sampling, seeded as seqio seeds an unshuffled Mixture, ending when its first
  Task ends, as seqio's default sample_fn does). Token ids are decoded with the feature's
  vocabulary, so that data.tokenizer tokenizes text; the Task's own SentencePiece .model as
  data.tokenizer keeps its tokens."""
  provider = _seqio_split(*shard.paths)
  feature = provider.output_features.get(shard.text_field)
  decode = (lambda ids: feature.vocabulary.decode([int(i) for i in ids])) if feature else None
  ds = provider.get_dataset(sequence_length=None, split=shard.paths[1], shuffle=False,
                            num_epochs=1)
  for example in ds.as_numpy_iterator():
    yield _feature(example, shard, decode)


def _jsonl_sizes(pattern: str) -> dict[str, int] | None:
  """Returns the sizes of the files, which bound their text since JSON escapes only make it
  longer, or None where one is compressed."""
  files = fileio.glob_files(pattern)
  return None if any(p.endswith((".gz", ".zst")) for p in files) else files


FORMATS: dict[str, Format] = {
    # every *.py file of this Python's stdlib, the offline default
    "builtin": Format("pystdlib", _builtin_shards, _text_files, sizes=_builtin_sizes,
                      fingerprint=lambda argument: dict(python=pystdlib_version())),
    # text files matched by the glob, one document per file; `**` recurses
    "text": Format("<glob>", _text_shards, _text_files, check=functools.partial(check_glob, "txt"),
                   sizes=fileio.glob_files),
    # JSON lines, .jsonl, .jsonl.gz or .jsonl.zst: each line's text_field
    "jsonl": glob_format(file_readers.jsonl_texts, "jsonl", sizes=_jsonl_sizes),
    # Parquet files, the text_field column
    "parquet": glob_format(file_readers.parquet_texts, "parquet"),
    # the text_field feature of a TFDS dataset's ArrayRecord split, or of a seqio Task's or
    # Mixture's preprocessed examples; split train by default
    "tfds": Format("<name>[:<split>]", _split_shard, _tfds_texts, check=_tfds_check),
    "seqio": Format("<task or mixture>[:<split>]", _split_shard, _seqio_texts,
                    check=_seqio_check),
}


def register(name: str, format_: Format, *, replace: bool = False) -> None:
  """Adds format `name`: data.source and prepare's --source may name it from then on, in this
  process (schema.register's rule). prepare's worker processes, with --workers above 1, know
  the formats of FORMATS."""
  if name == "tokens":
    raise ValueError("'tokens' names a prepared store, not a source format")
  schema.register(FORMATS, "source format", name, format_, replace=replace)


def unregister(name: str) -> None:
  """Removes format `name`, as a test that registered one does after it."""
  del FORMATS[name]


def forms() -> str:
  """Lists how a source of each format is written, for the words of an unknown one."""
  names = [f"'{name}:{f.argument}'" for name, f in FORMATS.items()]
  return ", ".join(names[:-1]) + " or " + names[-1]


def parse(source: str) -> tuple[str, Format, str]:
  """Returns the format's name, the Format and the argument of `source`; an unknown format
  or a source without an argument is one DataError listing the forms."""
  name, _, argument = source.partition(":")
  if name not in FORMATS or not argument:
    raise DataError(f"unknown data.source {source!r}: expected {forms()}")
  return name, FORMATS[name], argument
