"""Pass 2 of `prepare`: each output shard's documents gathered from the pass-1 token files of
every input shard, in a seeded order, each followed by EOS; then the manifest that lists them."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from tst_jax import fileio
from tst_jax.data import sources as sources_lib, store as store_lib

_WRITE_TOKENS = 2**22             # tokens buffered per write of an output shard
_OPEN_FILES = 256                 # pass-1 token files a pass-2 worker keeps open


def done_path(work: str, name: str) -> str:
  """Returns the path of the done marker of work file `name`, written once the file is complete."""
  return os.path.join(work, name + ".done.json")


def plan(inputs: list[dict], val_fraction: float, shard_tokens: int) -> dict:
  """Output shards per split, and the documents `split_documents` moves across: with
  val_fraction > 0 and >= 2 documents each split gets one (the first extreme hash)."""
  docs = sum(d["docs"] for d in inputs)
  val_docs = sum(d["val_docs"] for d in inputs)
  moved = {}
  if val_fraction > 0 and docs >= 2:
    live = [d for d in inputs if d["docs"]]
    if val_docs == 0:     # the document of the smallest hash goes to val
      first = min(live, key=lambda d: d["min_u"])
      moved[f"{first['index']}:{first['min_doc']}"] = "val"
    if val_docs == docs:  # the document of the largest hash goes to train
      first = max(live, key=lambda d: d["max_u"])
      moved[f"{first['index']}:{first['max_doc']}"] = "train"
  val_docs += sum(1 if to == "val" else -1 for to in moved.values())
  val_tokens = sum(d["val_tokens"] for d in inputs)
  sizes = dict(train=(docs - val_docs, sum(d["tokens"] for d in inputs) - val_tokens + docs),
               val=(val_docs, val_tokens + val_docs))     # (documents, tokens with EOS)
  shards = {s: max(1, -(-tokens // shard_tokens)) if n else 0 for s, (n, tokens) in sizes.items()}
  return dict(shards=shards, moved=moved)


def write(job) -> dict:
  """Pass 2 for output shard k of a split: its documents from every input shard, in a
  seeded order, each followed by EOS, then a done marker. A held-out shard also writes the
  UTF-8 bytes under each of its tokens, 0 under EOS. A shard already done is skipped."""
  split, k, count, inputs, moved, seed, val_fraction, out, work, eos, dtype, vocab = job
  name = f"{split}-{k:05d}"
  path, marker = fileio.join(out, name + ".bin"), done_path(work, name)
  staged = os.path.join(work, name + ".bin.tmp")    # local: a store takes the file in one put
  held_out = split == "val"
  if os.path.exists(marker) and fileio.exists(path):
    done = fileio.read_json(marker)
    if not held_out or "bytes_file" in done:
      return dict(split=split, **done)
  picked = []                    # (input shard, offsets, lengths, bytes_at) in corpus order
  for d in inputs:
    table = np.load(os.path.join(work, f"in-{d['index']:05d}.idx.npy"))
    is_val = table["u"] < val_fraction
    for key, to in moved.items():
      i, doc = map(int, key.split(":"))
      if i == d["index"]:
        is_val[doc] = to == "val"
    bucket = np.floor(_bucket_hash(seed, d["index"], len(table)) * count).astype(np.int64)
    mine = (is_val == held_out) & (bucket == k)
    picked.append((d["index"], table["offset"][mine], table["length"][mine],
                   table["bytes_at"][mine]))
  source = np.concatenate([np.full(len(o), i) for i, o, _, _ in picked]).astype(np.int64)
  offsets, lengths, bytes_at = (np.concatenate([p[c] for p in picked]) for c in (1, 2, 3))
  if held_out and (bytes_at < 0).any():
    raise RuntimeError(f"{name}: pass 1 wrote no bytes of held-out documents it was to count")
  order = np.random.default_rng(seed if count == 1 else [seed, k]).permutation(len(offsets))
  sha, counts, tokens = hashlib.sha256(), np.zeros(vocab, np.int64), 0
  eos_1 = np.array([eos], dtype=dtype)
  with _InputReader(work, dtype) as inputs_bin, open(staged, "wb") as f, \
       _TokenBytes(work, name, out, held_out) as under:
    pieces, buffered = [], 0
    for j in order.tolist() + [None]:
      if j is not None:
        pieces += [inputs_bin.read(int(source[j]), int(offsets[j]), int(lengths[j])), eos_1]
        buffered += int(lengths[j]) + 1
        under.add(int(source[j]), int(bytes_at[j]), int(lengths[j]))
      if pieces and (buffered >= _WRITE_TOKENS or j is None):
        chunk = np.concatenate(pieces)
        f.write(chunk.tobytes())
        sha.update(chunk.tobytes())
        counts += np.bincount(chunk, minlength=vocab)[:vocab]
        tokens += len(chunk)
        pieces, buffered = [], 0
        under.flush()
  fileio.move_in(staged, path)
  np.save(os.path.join(work, name + ".counts.npy"), counts)
  done = dict(file=fileio.basename(path), tokens=tokens, docs=len(order),
              sha256=sha.hexdigest(), **under.done())
  fileio.write_json(marker, done)
  return dict(split=split, **done)


class _TokenBytes:
  """Writes the bytes under each token of a held-out output shard, beside its tokens, from
  pass 1's in-NNNNN.bytes.bin, and a 0 under each document's EOS. Does nothing for a
  training shard."""

  def __init__(self, work: str, name: str, out: str, on: bool):
    self.on, self.work = on, work
    self.path = fileio.join(out, name + store_lib.BYTES_SUFFIX)
    self.staged = os.path.join(work, name + store_lib.BYTES_SUFFIX + ".tmp")
    self.pieces, self.total, self.sha = [], 0, hashlib.sha256()
    self.reader = _InputReader(work, store_lib.BYTES_DTYPE, store_lib.BYTES_SUFFIX)

  def __enter__(self):
    self.file = open(self.staged, "wb") if self.on else None
    return self

  def add(self, index: int, at: int, length: int):
    """Adds the bytes of a document of `length` tokens at `at` of input shard `index`'s file."""
    if self.on:
      self.pieces += [self.reader.read(index, at, length), np.zeros(1, store_lib.BYTES_DTYPE)]

  def flush(self):
    if self.pieces:
      chunk = np.concatenate(self.pieces)
      self.file.write(chunk.tobytes())
      self.sha.update(chunk.tobytes())
      self.total += int(chunk.sum(dtype=np.int64))
      self.pieces = []

  def done(self) -> dict:
    """Moves the file into the store; returns what the manifest records of it."""
    if not self.on:
      return {}
    self.file.close()
    fileio.move_in(self.staged, self.path)
    return dict(bytes_file=fileio.basename(self.path), bytes=self.total,
                bytes_sha256=self.sha.hexdigest())

  def __exit__(self, *exc):
    self.reader.close()
    if self.file is not None:
      self.file.close()
    return False


class _InputReader:
  """Reads documents of the pass-1 token files, or of their bytes files with `suffix`, with
  pread: their pages are not kept mapped (a memory map would count every page touched in
  this process's RSS), and at most _OPEN_FILES files are open at once."""

  def __init__(self, work: str, dtype: str, suffix: str = ".bin"):
    self.work, self.dtype, self.suffix, self.fds = work, np.dtype(dtype), suffix, {}

  def read(self, index: int, offset: int, length: int) -> np.ndarray:
    if index not in self.fds:
      if len(self.fds) >= _OPEN_FILES:
        self.close()
      self.fds[index] = os.open(os.path.join(self.work, f"in-{index:05d}{self.suffix}"),
                                os.O_RDONLY)
    size = self.dtype.itemsize
    return np.frombuffer(os.pread(self.fds[index], length * size, offset * size), self.dtype)

  def close(self):
    for fd in self.fds.values():
      os.close(fd)
    self.fds = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False


def _bucket_hash(seed: int, index: int, num_docs: int) -> np.ndarray:
  """A number in [0, 1) per document of input shard `index`, fixed by (seed, index, doc)."""
  return np.random.default_rng([seed, 1 << 32, index]).random(num_docs)


def forget_another_plan(out: str, work: str, plan: dict, inputs: list[dict]):
  """Deletes the output shards an interrupted run planned from other input shards, as when a
  bad file it left out reads to its end now. Then records this plan in `work`."""
  path = os.path.join(work, "outputs.json")
  planned = dict(plan, inputs=[[d["index"], d["tokens"]] for d in inputs])
  if os.path.exists(path) and fileio.read_json(path) != planned:
    for folder in (work, out):
      for name in fileio.listdir(folder):
        if name.startswith(store_lib.SPLITS) and name.endswith((".done.json", ".bin")):
          fileio.remove(fileio.join(folder, name))
  fileio.write_json(path, planned)


def write_manifest(out, work, request, tok, dtype, shards, written, text_bytes, bad):
  """Writes the store's manifest.json, last: the request, the tokenizer, the sources read and
  the output shards `written` of each split, then the fingerprint of all of it."""
  splits = {}
  for split in store_lib.SPLITS:
    mine = [w for w in written if w["split"] == split]
    offsets = np.cumsum([0] + [w["tokens"] for w in mine]).tolist()
    bytes_of = ("bytes_file", "bytes", "bytes_sha256") if split == "val" else ()
    entry = dict(docs=sum(w["docs"] for w in mine), tokens=offsets[-1],
                 shards=[dict(file=w["file"], tokens=w["tokens"], offset=o, docs=w["docs"],
                              sha256=w["sha256"], **{k: w[k] for k in bytes_of})
                         for w, o in zip(mine, offsets)])
    if bytes_of:   # the UTF-8 bytes of the split's text, each token's in its bytes_file
      entry["bytes"] = sum(w["bytes"] for w in mine)
    if split == "train":
      counts = sum(np.load(os.path.join(work, w["file"][:-4] + ".counts.npy"))
                   for w in mine)
      p = counts[counts > 0] / max(counts.sum(), 1)
      entry["unigram_entropy"] = float(-(p * np.log(p)).sum())
    splits[split] = entry
  manifest = dict(
      format=store_lib.FORMAT, version=store_lib.VERSION, request=request, dtype=dtype,
      tokenizer=dict(file=fileio.basename(tok.path), fingerprint=tok.fingerprint(),
                     vocab_size=tok.vocab_size, eos_id=tok.eos_id),
      seed=request["seed"], sources=dict(source=request["source"], input_shards=len(shards),
                                         input_bytes=sum(s.num_bytes for s in shards),
                                         text_bytes=text_bytes, **_read_from(request),
                                         **(dict(skipped=bad) if bad else {})),
      splits=splits, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
  manifest["fingerprint"] = store_lib.fingerprint(manifest)
  fileio.write_json(fileio.join(out, store_lib.MANIFEST), manifest)


def _read_from(request: dict) -> dict:
  """Returns what the source read that its name does not say: the Python of builtin:pystdlib."""
  return sources_lib.fingerprint(request["source"])
