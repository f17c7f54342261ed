r"""Tokenize a corpus once into a sharded token store that every run reads in place.

  python -m tst_jax.data.prepare --source='jsonl:/data/dclm/**/*.jsonl.zst' \
      --tokenizer=/models/llama3/tokenizer.json --out=/data/tok/dclm-llama3 [--workers=16]
      [--runner=ray]      # the tasks below on a Ray cluster (runners.py, docs/data.md)

A tokenizer comes first: a file copied in, or `bpe` trained on the first 64 MB of training
text. Then two passes whose memory does not grow with the corpus:
  1. One worker per input shard, a JSONL or Parquet file or about 64 MB of text files, cuts
     each document into pieces of at most val_piece_bytes, or keeps it whole with 0. It holds
     out a piece when its hash of seed, document digest and k is below val_fraction, where a
     one-piece document hashes seed and text. It tokenizes the held-out pieces and the runs of
     training pieces between them, as `sources.segments` does, into work/in-NNNNN.bin with an
     index of offset, length and split hash. Of each held-out document, and of each one that
     `output_shards.plan` may move to the held-out split, it also writes the UTF-8 bytes of
     text under each token (`Tokenizer.encode_with_bytes`) to work/in-NNNNN.bytes.bin.
  2. One worker per output shard gathers the documents of its split, as `split_documents`
     assigns them, whose seeded bucket hash falls in its range. It shuffles them by seed and
     writes each followed by EOS; a held-out shard writes its tokens' bytes beside it, 0 for
     EOS.
A split of one shard is exactly the documents of `split_documents(...)` tokenized in memory,
the tests' reference: the documents in corpus order permuted by np.random.default_rng(seed).
Every file is written under a .tmp name and renamed when complete, with a done marker. A rerun
skips what is done, and manifest.json, written last, makes the store readable.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time

import numpy as np
import tqdm

from tst_jax import errors, fileio
from tst_jax.data import formats, output_shards, runners, sources as sources_lib
from tst_jax.data import store as store_lib
from tst_jax.errors import ConfigError, DataError
from tst_jax.data.tokenizer import Tokenizer, get_tokenizer

log = logging.getLogger("tst_jax")
SHARD_TOKENS = 2**28              # tokens per output shard, 0.5 GB as uint16
BPE_SAMPLE_BYTES = 64_000_000     # text a `bpe` tokenizer is trained on: the first train docs
_ENCODE_CHARS = 1_000_000         # text per encode_batch call: bounds its results' memory
# A document of pass 1: its tokens' offset and count in in-NNNNN.bin, its split hash, and the
# offset of its tokens' bytes in in-NNNNN.bytes.bin (-1: none written).
_INDEX = np.dtype([("offset", "<i8"), ("length", "<i8"), ("u", "<f8"), ("bytes_at", "<i8")])
PENDING = "prepare.json"          # the request of a prepare under way in its --out


def _check_arguments(val_fraction, max_bytes, val_piece_bytes, tokenizer, vocab_size, runner):
  """Refuses an argument out of its range, naming its flag, before anything is read."""
  runners.check(runner)
  for flag, check, value in (("--val_fraction", sources_lib.check_val_fraction, val_fraction),
                             ("--max_bytes", sources_lib.check_max_bytes, max_bytes)):
    try:
      check(value)
    except ValueError as e:
      raise ConfigError(flag, str(e)) from None
  if val_piece_bytes < 0:
    raise ConfigError("--val_piece_bytes", f"must be >= 0, got {val_piece_bytes}")
  if tokenizer == "bpe" and not vocab_size:
    raise ConfigError("--vocab_size", "tokenizer 'bpe' needs it")


def _tokenize_inputs(pool, jobs, tasks, work, bad: list[dict], progress: bool
                     ) -> tuple[list[dict], list[dict]]:
  """Tokenizes the input shards of `jobs`, the others of `tasks` being done, with a bar.

  Returns the done marker of each input shard read, and `bad` with the files left out.
  """
  t0 = time.time()
  # closed by `with` on an error too, so the error's line starts a line of its own
  with tqdm.tqdm(total=sum(_size(t) for t in tasks), unit="B", unit_scale=True,
                 desc="tokenize", disable=not progress) as bar:
    bar.update(sum(_size(t) for t in tasks) - sum(_size(j[0]) for j in jobs))
    tokens_so_far = 0
    for done in pool.imap_unordered(_tokenize_shard, jobs):
      tokens_so_far += done["tokens"]
      bar.update(done["num_bytes"])
      bar.set_postfix(tokens_per_s=f"{tokens_so_far / max(time.time() - t0, 1e-9):.3g}")
  inputs = [dict(index=i, **_input_done(work, i)) for i, _, _ in tasks]
  bad = bad + [d["skipped"] for d in inputs if "skipped" in d]
  for record in bad:
    log.warning("left out %s: %s", record["file"], record["reason"])
  return [d for d in inputs if "skipped" not in d], bad


def prepare(source: str, out: str, *, tokenizer: str = "bpe", vocab_size: int | None = None,
            seed: int = 0, val_fraction: float = 0.02, val_piece_bytes: int = 0,
            max_bytes: int | None = None,
            text_field: str = "text", imports: str = "", workers: int | None = None,
            shard_tokens: int = SHARD_TOKENS, bpe_sample_bytes: int = BPE_SAMPLE_BYTES,
            progress: bool = True, skip_bad_files: bool = False, runner: str = "local") -> str:
  """Writes, finishes or finds already written the store of `source` in `out`, its tasks run
  by `runner` of runners.RUNNERS.

  An input file that cannot be read to its end stops it with a BadFile naming the file. The
  finished input shards are kept for the rerun. `skip_bad_files` leaves such files out
  instead, each named in the log and the manifest. Every rerun tries a left-out file again.
  """
  _check_arguments(val_fraction, max_bytes, val_piece_bytes, tokenizer, vocab_size, runner)
  out = fileio.absolute(str(out))
  fileio.check_store(out, "--out", "a token store")
  request = dict(source=source, text_field=text_field, seed=seed, val_fraction=val_fraction,
                 val_piece_bytes=val_piece_bytes, max_bytes=max_bytes, shard_tokens=shard_tokens,
                 tokenizer=_tokenizer_request(tokenizer, vocab_size, bpe_sample_bytes))
  if _finished(out, request):
    return out
  shards = sources_lib.input_shards(source, text_field, imports)   # no files: writes nothing
  with _claimed(out, request):
    bad = [] if skip_bad_files else None      # records of the files left out
    budgets = sources_lib.byte_budgets(shards, max_bytes, bad)
    tasks = [(i, s, b) for i, (s, b) in enumerate(zip(shards, budgets)) if b != 0]
    split = (seed, val_fraction, val_piece_bytes)
    tok = _get_tokenizer(out, tokenizer, vocab_size, tasks, split, bpe_sample_bytes,
                         skip_bad_files)
    dtype = store_lib.token_dtype(tok.vocab_size)
    work = _fresh_work_folder(out, request)
    jobs = [(t, tok.path, dtype, split, work, skip_bad_files) for t in tasks
            if _to_read(work, t[0])]
    t0 = time.time()
    with runners.start(runner, workers) as pool:
      pool.check_shared(work)
      inputs, bad = _tokenize_inputs(pool, jobs, tasks, work, bad or [], progress)
      if not any(d["docs"] for d in inputs):
        raise DataError(f"source {source!r} gave an empty corpus (no non-whitespace documents"
                        + (f"; {len(bad)} bad files left out)" if bad else ")"))
      plan = output_shards.plan(inputs, val_fraction, shard_tokens)
      output_shards.forget_another_plan(out, work, plan, inputs)
      outputs = [(split, k, count, inputs, plan["moved"], seed, val_fraction, out, work,
                  tok.eos_id, dtype, tok.vocab_size) for split, count in plan["shards"].items()
                 for k in range(count)]
      written = list(pool.imap(output_shards.write, outputs))
    text_bytes = sum(d["text_bytes"] for d in inputs)
    _log_prepared(out, inputs, text_bytes, bad, time.time() - t0)
    output_shards.write_manifest(out, work, request, tok, dtype, shards, written,
                                 text_bytes, bad)
    shutil.rmtree(work)
    fileio.remove(fileio.join(out, PENDING))
  return out


def _fresh_work_folder(out: str, request: dict) -> str:
  """Returns prepare's work folder, made, without the half-written files of an interrupted
  run."""
  work = work_folder(out, request)
  os.makedirs(work, exist_ok=True)
  for name in os.listdir(work):
    if ".tmp" in name:
      os.remove(os.path.join(work, name))
  return work


def _log_prepared(out: str, inputs: list[dict], text_bytes: int, bad: list[dict],
                  seconds: float) -> None:
  """Logs what the store of `inputs` holds, how fast this session wrote it and how many files
  it left out."""
  docs, tokens = sum(d["docs"] for d in inputs), sum(d["tokens"] for d in inputs)
  log.info("prepared %s: %d documents, %.1f MB of text, %d tokens in %.1f s (%.3g tokens/s, "
           "%.3g MB/s; this session)", out, docs, text_bytes / 1e6, tokens, seconds,
           tokens / max(seconds, 1e-9), text_bytes / 1e6 / max(seconds, 1e-9))
  if bad:
    log.warning("left out %d bad files, listed in %s", len(bad),
                fileio.join(out, store_lib.MANIFEST))


def work_folder(out: str, request: dict) -> str:
  """Returns the local folder of prepare's work files: out/work, or for a store in a bucket a
  folder of the local cache named for the store and its request, which a resumed prepare on
  this machine finds again."""
  local = fileio.local_path(out)
  if local is not None:
    return os.path.join(local, "work")
  key = hashlib.sha256(json.dumps([out, request], sort_keys=True).encode()).hexdigest()[:16]
  work = fileio.user_cache("prepare", key)
  log.info("prepare: work files of %s in %s, deleted once the store is written", out, work)
  return work


def _size(task) -> int:
  """Returns the bytes of an input shard to read: on disk, or its share of max_bytes."""
  _, shard, budget = task
  return shard.num_bytes if budget is None else budget


def _tokenizer_request(name: str, vocab_size: int | None, sample_bytes: int) -> dict:
  # "spec" is the store format's key for the tokenizer's name in manifests on disk
  if name == "bpe":
    return dict(spec="bpe", vocab_size=vocab_size, sample_bytes=sample_bytes)
  fileio.check_readable(name, "--tokenizer")
  if not fileio.isfile(name):
    raise fileio.PathError(f"--tokenizer {name} is a folder: give a tokenizer.json or .model")
  return dict(spec=fileio.basename(name),
              fingerprint=get_tokenizer(name, folder=None, vocab_size=0).fingerprint())


def _finished(out: str, request: dict) -> bool:
  """Returns whether `out` holds the store of `request`. Another store there is refused, with
  nothing touched."""
  if not fileio.exists(fileio.join(out, store_lib.MANIFEST)):
    return False
  manifest = store_lib.read_manifest(out)
  if manifest["request"] == request:
    return True
  raise DataError(f"{out} holds another store ({_differs(manifest['request'], request)}): "
                  "nothing was changed; write this one elsewhere (another --out, or another "
                  "--workdir for a run), or delete that store to prepare it again")


@contextlib.contextmanager
def _claimed(out: str, request: dict):
  """Records the request in `out`, new or empty, for the block that writes the store there,
  or resumes an unfinished prepare of it. A folder that is making another store, or holds
  other files, is refused with nothing touched. A block that raises before an input shard is
  done leaves a new `out` as it found it: such a start has kept nothing a rerun would not redo
  at once, and the finished input shards of a later stop are kept for the rerun."""
  pending = fileio.join(out, PENDING)
  if fileio.exists(pending):
    saved = fileio.read_json(pending)
    if saved != request:
      raise DataError(f"{out} holds an unfinished prepare of another store "
                      f"({_differs(saved, request)}); choose another --out or delete it")
    yield
    return
  if fileio.isdir(out) and fileio.listdir(out):
    raise DataError(f"{out} is not empty and holds no store: choose a new or empty --out "
                    "(prepare writes and deletes files there)")
  fileio.check_writable(out, "--out")
  existed = fileio.exists(out)
  fileio.makedirs(out)
  fileio.write_json(pending, request)
  try:
    yield
  except Exception:
    work = work_folder(out, request)
    if not (os.path.isdir(work) and any(n.endswith(".done.json") for n in os.listdir(work))):
      fileio.rmtree(work)
      for name in fileio.listdir(out):      # each written by this prepare: `out` was empty
        path = fileio.join(out, name)
        if fileio.isdir(path):
          fileio.rmtree(path)
        else:
          fileio.remove(path)
      if not existed:
        fileio.remove_empty_folder(out)
    raise


def _differs(saved: dict, request: dict) -> str:
  keys = sorted(k for k in set(saved) | set(request) if saved.get(k) != request.get(k))
  return ", ".join(f"{k}: {saved.get(k)!r} there, {request.get(k)!r} asked" for k in keys)


def _get_tokenizer(out, name, vocab_size, tasks, split, sample_bytes, skip_bad_files
                   ) -> Tokenizer:
  """Returns the store's tokenizer in `out`, copied from a file or trained as BPE.

  A BPE is trained on the first `sample_bytes` of training documents in corpus order, never on
  held-out pieces, of the files that read to their end. `split` holds seed, val_fraction and
  val_piece_bytes.
  """
  if name != "bpe" or fileio.isfile(fileio.join(out, "tokenizer.json")):
    return get_tokenizer(name, folder=out, vocab_size=vocab_size or 0)
  sample, size = [], 0
  for _, shard, budget in tasks:
    try:
      texts, size = _training_texts(shard, budget, split, size, sample_bytes)
    except sources_lib.BadFile:
      if not skip_bad_files:
        raise
      continue                   # named by the worker that tokenizes it
    sample += texts
    if size >= sample_bytes:
      break
  if not sample:
    raise DataError(f"{tasks[0][1].name if tasks else 'the source'}: no training documents to "
                    "train the BPE tokenizer on (an empty corpus, every document held out"
                    + (", or every file left out as bad)" if skip_bad_files else ")"))
  return get_tokenizer("bpe", folder=out, vocab_size=vocab_size, train_docs=sample)


def _training_texts(shard, budget, split, size: int, sample_bytes: int
                    ) -> tuple[list[str], int]:
  """The training pieces of `shard` read until `size` reaches `sample_bytes` at the end of a
  document, and the size then."""
  texts = []
  for doc in sources_lib.shard_documents(shard, budget):
    for text, u in sources_lib.segments(doc, *split):
      if u >= split[1]:
        texts.append(text)
        size += len(text.encode("utf-8", errors="surrogatepass"))
    if size >= sample_bytes:
      break
  return texts, size


def _input_done(work: str, index: int) -> dict | None:
  """The done marker of input shard `index`, None before it is done."""
  path = output_shards.done_path(work, f"in-{index:05d}")
  return fileio.read_json(path) if os.path.exists(path) else None


def _to_read(work: str, index: int) -> bool:
  """Whether input shard `index` is to tokenize: not done, a bad file left out by an earlier
  run, which every rerun reads again, or done without its held-out tokens' bytes."""
  done = _input_done(work, index)
  return done is None or "skipped" in done or "token_bytes" not in done


def _tokenize_shard(job) -> dict:
  """Pass 1 for one input shard: its tokens, a per-document index, then a done marker. With
  skip_bad_files, a BadFile gives a marker that records it instead."""
  (index, shard, budget), tok_path, dtype, split, work, skip_bad_files = job
  try:
    return _tokenize_documents(index, shard, budget, tok_path, dtype, split, work)
  except sources_lib.BadFile as e:
    if not skip_bad_files:
      raise
    done = dict(docs=0, tokens=0, num_bytes=_size(job[0]), text_bytes=0, skipped=e.record())
    fileio.write_json(output_shards.done_path(work, f"in-{index:05d}"), done)
    return done


def _tokenize_documents(index, shard, budget, tok_path, dtype, split, work) -> dict:
  val_fraction = split[1]
  tok = get_tokenizer(tok_path, folder=None, vocab_size=0)
  name = os.path.join(work, f"in-{index:05d}")
  rows, offset, batch, hashes, chars, text_bytes = [], 0, [], [], 0, 0
  least, at = 1.0, 0          # the least hash so far; bytes written to in-NNNNN.bytes.bin
  with open(name + ".bin.tmp", "wb") as f, open(name + ".bytes.tmp", "wb") as f_bytes:
    def flush():
      nonlocal offset, least, at
      # Bytes of the held-out documents, and of each that holds the least hash so far: the
      # plan may move this shard's least one into a held-out split that has none.
      want = []
      for u in hashes:
        want.append(u < val_fraction or u < least)
        least = min(least, u)
      plain = iter(tok.encode_batch([t for t, w in zip(batch, want) if not w]))
      counted = iter(tok.encode_with_bytes([t for t, w in zip(batch, want) if w]))
      for u, w in zip(hashes, want):
        ids, nbytes = next(counted) if w else (next(plain), None)
        rows.append((offset, len(ids), u, at if w else -1))
        np.asarray(ids, dtype=dtype).tofile(f)
        offset += len(ids)
        if w:
          nbytes.astype(store_lib.BYTES_DTYPE).tofile(f_bytes)
          at += len(nbytes)
    for doc, num_bytes in sources_lib.take(sources_lib.raw_documents(shard), budget):
      for text, u in sources_lib.segments(doc, *split):
        batch.append(text)
        hashes.append(u)
      chars += len(doc)
      text_bytes += num_bytes
      if chars >= _ENCODE_CHARS:
        flush()
        batch, hashes, chars = [], [], 0
    flush()
  table = np.array(rows, dtype=_INDEX)
  with open(name + ".idx.tmp", "wb") as f:
    np.save(f, table)
  os.replace(name + ".bin.tmp", name + ".bin")
  os.replace(name + ".bytes.tmp", name + ".bytes.bin")
  os.replace(name + ".idx.tmp", name + ".idx.npy")
  u = table["u"]
  done = dict(docs=len(table), tokens=offset, num_bytes=_size((index, shard, budget)),
              text_bytes=text_bytes, token_bytes=at,
              shard=shard.name,
              val_docs=int((u < val_fraction).sum()),
              val_tokens=int(table["length"][u < val_fraction].sum()),
              min_u=float(u.min()) if len(u) else 1.0, min_doc=int(u.argmin()) if len(u) else -1,
              max_u=float(u.max()) if len(u) else -1.0, max_doc=int(u.argmax()) if len(u) else -1)
  fileio.write_json(output_shards.done_path(work, f"in-{index:05d}"), done)
  return done


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tst_jax.data.prepare", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--source", required=True, help=f"one of {formats.forms()}")
  p.add_argument("--out", required=True, help="the store folder (created; resumed if unfinished)")
  p.add_argument("--tokenizer", default="bpe", help="bpe | tokenizer.json | .model")
  p.add_argument("--vocab_size", type=int, default=None, help="ids of a bpe tokenizer")
  p.add_argument("--seed", type=int, default=0, help="held-out split and document order")
  p.add_argument("--val_fraction", type=float, default=0.02, help="pieces held out")
  p.add_argument("--val_piece_bytes", type=int, default=0,
                 help="held-out split: documents cut into pieces of at most this many bytes "
                      "(0: whole documents; small corpora: e.g. 2048, docs/data.md)")
  p.add_argument("--max_bytes", type=int, default=None, help="read at most this much text")
  p.add_argument("--text_field", default="text",
                 help="JSONL field / Parquet column / tfds or seqio feature")
  p.add_argument("--imports", default="",
                 help="modules to import first, comma-separated: those that register the "
                      "seqio Tasks and Mixtures (or a source format) --source names")
  p.add_argument("--workers", type=int, default=None,
                 help="processes at once (default: all cores, or the Ray cluster's)")
  p.add_argument("--runner", default="local", choices=sorted(runners.RUNNERS),
                 help="local: a process pool on this machine; ray: tasks on a Ray cluster "
                      "(RAY_ADDRESS, else one on this machine; docs/data.md)")
  p.add_argument("--shard_tokens", type=int, default=SHARD_TOKENS, help="tokens per shard")
  p.add_argument("--bpe_sample_bytes", type=int, default=BPE_SAMPLE_BYTES,
                 help="text a bpe tokenizer is trained on")
  p.add_argument("--skip_bad_files", action="store_true",
                 help="leave out input files that cannot be read to their end (truncated, "
                      "corrupt): each is named, and listed in the manifest")
  args = p.parse_args(argv)
  t0 = time.time()
  out = prepare(args.source, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                seed=args.seed, val_fraction=args.val_fraction,
                val_piece_bytes=args.val_piece_bytes, max_bytes=args.max_bytes,
                text_field=args.text_field, imports=args.imports, workers=args.workers,
                shard_tokens=args.shard_tokens, bpe_sample_bytes=args.bpe_sample_bytes,
                skip_bad_files=args.skip_bad_files, runner=args.runner)
  for line in store_lib.prepared_lines(out, time.time() - t0, args.val_fraction):
    print(line, file=sys.stderr if line.startswith("warning: ") else sys.stdout)
  return 0


if __name__ == "__main__":
  errors.plain_warnings()
  sys.exit(errors.main(main))
