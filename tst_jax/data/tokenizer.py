"""Tokenizers: a byte-level BPE trained on the corpus, or a tokenizer.json or SentencePiece file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from tst_jax import fileio
from tst_jax.errors import ConfigError, DataError

EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
BPE_EOS = "<|endoftext|>"
_MIN_BPE_VOCAB = 257  # 256 byte tokens + EOS.
# The file names of the tokenizer a token store keeps beside its shards.
TOKENIZER_JSON, SENTENCEPIECE_MODEL = "tokenizer.json", "tokenizer.model"


class Tokenizer:
  """A HF `tokenizers.Tokenizer` or a SentencePiece model, with its EOS id and file.

  Text is encoded literally. A special-token string inside a document, such as
  "<|endoftext|>", is tokenized as ordinary text, so EOS appears in the token stream only where
  the pipeline puts it. `decode` keeps special tokens, so EOS shows up in decoded text.
  """

  def __init__(self, hf: tokenizers.Tokenizer | None = None, *, sp=None, eos_id: int,
               path: str | None = None):
    assert (hf is None) != (sp is None), "exactly one of hf / sp"
    self._hf, self._sp = hf, sp
    if hf is not None:
      hf.encode_special_tokens = True
      self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
    else:
      self.vocab_size = sp.get_piece_size()
    self.eos_id = int(eos_id)
    self.path = path

  @property
  def is_sentencepiece(self) -> bool:
    return self._sp is not None

  def encode(self, text: str) -> list[int]:
    if self._hf is not None:
      return self._hf.encode(text, add_special_tokens=False).ids
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Encodes many texts at once, in parallel threads for HF tokenizers."""
    if self._hf is not None:
      encs = self._hf.encode_batch_fast(list(texts), add_special_tokens=False)
      return [e.ids for e in encs]
    return self._sp.encode(list(texts))

  def encode_with_bytes(self, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]]:
    """Encodes each text as `encode` does, with the UTF-8 bytes of the text under each token
    [n] (`token_bytes`), which sum to the text's bytes."""
    if self._hf is not None:
      encs = self._hf.encode_batch(list(texts), add_special_tokens=False)
      return [(e.ids, token_bytes(_char_to_byte(text)[[a for a, _ in e.offsets]],
                                  len(text.encode("utf-8", errors="surrogatepass"))))
              for text, e in zip(texts, encs)]
    protos = self._sp.encode(list(texts), out_type="immutable_proto")
    return [([p.id for p in proto.pieces],   # SentencePiece's offsets are in bytes already
             token_bytes(np.array([p.begin for p in proto.pieces], np.int64),
                         len(text.encode("utf-8", errors="surrogatepass"))))
            for text, proto in zip(texts, protos)]

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self._hf is not None:
      return self._hf.decode(ids, skip_special_tokens=False)
    return self._sp.decode(ids)

  def save(self, path: str) -> None:
    """Writes the tokenizer file to `path`, local or in a bucket: tokenizer.json, or the .model
    for SentencePiece."""
    fileio.makedirs(fileio.dirname(fileio.absolute(path)))
    if self._hf is not None:
      fileio.write_text(path, self._hf.to_str(pretty=True))
    else:
      fileio.write_bytes(path, self._sp.serialized_model_proto())

  def fingerprint(self) -> str:
    """Returns a string for caches that changes whenever the id mapping could change."""
    blob = self._hf.to_str().encode() if self._hf is not None else self._sp.serialized_model_proto()
    return hashlib.sha256(blob).hexdigest()

  def __repr__(self):
    return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, path={self.path!r})"


def token_bytes(starts: np.ndarray, total: int) -> np.ndarray:
  """Returns the bytes of text under each token [n] (uint32) from the byte offset where each
  starts in a text of `total` bytes: from its start to the next token's, the first from 0,
  the last to the end.

  The counts sum to `total` whatever the offsets, so the bytes of any run of a store's tokens
  are those of its text. Offsets that go back (a character cut into several byte-level
  tokens shares one offset) are taken at their running maximum: such a character counts
  under the last of its tokens.
  """
  if not len(starts):
    return np.zeros(0, np.uint32)
  at = np.maximum.accumulate(np.clip(np.asarray(starts, np.int64), 0, total))
  at[0] = 0
  return np.diff(np.append(at, total)).astype(np.uint32)


def _char_to_byte(text: str) -> np.ndarray:
  """Returns the byte offset of each character of `text` in its UTF-8 form, and its length
  last [len(text) + 1]: HF tokenizers give offsets in characters."""
  points = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), np.uint32)
  width = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
  return np.concatenate([[0], np.cumsum(width, dtype=np.int64)])


def get_tokenizer(name: str, *, folder: str | None, vocab_size: int,
                  train_docs: list[str] | None = None) -> Tokenizer:
  """Returns the tokenizer named by `name`, kept in `folder`, a token store's, when given.

  name:
    "bpe"          a byte-level BPE with exactly `vocab_size` ids and EOS "<|endoftext|>",
                   trained on `train_docs` only, never on validation text, and saved to
                   <folder>/tokenizer.json. Later calls load that file instead of retraining.
    "*.json"       a HF tokenizer.json such as Llama-3's. `vocab_size` is not used.
    "*.model"      a SentencePiece model from the `sentencepiece` extra. `vocab_size` is not used.
  """
  if name == "bpe":
    return _get_bpe(folder, vocab_size, train_docs)
  if not (name.endswith(".json") or name.endswith(".model")):
    raise ValueError(
        f"unknown tokenizer {name!r}: expected 'bpe', a tokenizer.json or a .model file")
  if not fileio.isfile(name):
    raise ConfigError("data.tokenizer", f"file {name!r} does not exist")
  if name.endswith(".json"):
    hf = _load_tokenizer_json(name, "config.data.tokenizer: give a valid tokenizer.json")
    path = copy_file(name, fileio.join(folder, TOKENIZER_JSON)) if folder else name
    return Tokenizer(hf, eos_id=_find_eos(hf, name), path=path)
  return _load_sentencepiece(name, folder)


def _get_bpe(folder: str | None, vocab_size: int, train_docs: list[str] | None) -> Tokenizer:
  cached = fileio.join(folder, TOKENIZER_JSON) if folder else None
  if cached and fileio.isfile(cached):
    hf = _load_tokenizer_json(
        cached, "it is the BPE this workdir's data and checkpoints were made with: restore it "
        "from a copy; only in a workdir without checkpoints, delete it and data/ to train them "
        "again; else use a fresh --workdir")
    tok = Tokenizer(hf, eos_id=_find_eos(hf, cached), path=cached)
    if tok.vocab_size != vocab_size:
      raise DataError(
          f"{cached}: has vocab size {tok.vocab_size} but model.vocab_size={vocab_size}: this "
          "workdir belongs to another config; use a fresh workdir or the matching vocab size")
    return tok
  if not train_docs:
    raise ValueError("tokenizer 'bpe' needs train_docs to train on")
  hf = train_bpe(train_docs, vocab_size)
  if cached:
    fileio.makedirs(folder)
    fileio.write_text(cached, hf.to_str(pretty=True))     # as hf.save writes it, whole
  return Tokenizer(hf, eos_id=hf.token_to_id(BPE_EOS), path=cached)


def _load_tokenizer_json(path: str, recovery: str) -> tokenizers.Tokenizer:
  try:
    return tokenizers.Tokenizer.from_str(fileio.read_text(path))
  except Exception as e:  # tokenizers raises a bare Exception for unreadable files
    raise DataError(f"{path}: cannot be read as a tokenizer.json ({e}); {recovery}") from e


def train_bpe(docs: list[str], vocab_size: int) -> tokenizers.Tokenizer:
  """Trains a GPT-2 style byte-level BPE with exactly `vocab_size` ids, where id 0 is EOS.

  Every byte is in the initial alphabet, so any text encodes and decodes back exactly. If the
  corpus is too small to learn enough merges, the vocab is padded with never-produced
  "<|reserved_i|>" special tokens, so the vocab size always equals the requested one.
  """
  if vocab_size < _MIN_BPE_VOCAB:
    raise ValueError(f"vocab_size must be >= {_MIN_BPE_VOCAB} for byte-level BPE, got {vocab_size}")
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[BPE_EOS], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(docs, trainer, length=len(docs))
  missing = vocab_size - hf.get_vocab_size(with_added_tokens=True)
  if missing > 0:
    hf.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
  assert hf.get_vocab_size(with_added_tokens=True) == vocab_size
  return hf


def _find_eos(hf: tokenizers.Tokenizer, path: str) -> int:
  for t in EOS_CANDIDATES:
    i = hf.token_to_id(t)
    if i is not None:
      return i
  raise DataError(f"{path}: the tokenizer has no EOS token (looked for "
                  f"{', '.join(EOS_CANDIDATES)}); use a tokenizer with one")


def _load_sentencepiece(spec: str, folder: str | None) -> Tokenizer:
  try:
    import sentencepiece  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(
        f"tokenizer {spec!r} needs sentencepiece: pip install 'tst-jax[sentencepiece]'") from e
  sp = sentencepiece.SentencePieceProcessor(model_proto=fileio.read_bytes(spec))
  if sp.eos_id() < 0:
    raise ValueError(f"tokenizer {spec!r} has no EOS token")
  path = copy_file(spec, fileio.join(folder, SENTENCEPIECE_MODEL)) if folder else spec
  return Tokenizer(sp=sp, eos_id=sp.eos_id(), path=path)


def copy_file(src: str, dst: str) -> str:
  """Copies the tokenizer file `src`, a tokenizer.json or a SentencePiece .model, to `dst`
  and returns `dst`. A different tokenizer there is refused."""
  if fileio.isfile(dst):
    if not (_same_json if src.endswith(".json") else _same_bytes)(src, dst):
      raise DataError(
          f"{dst}: exists and differs from tokenizer {src!r}: this workdir belongs to another "
          "config; use a fresh workdir or the tokenizer it was made with")
    return dst
  fileio.makedirs(fileio.dirname(dst))
  fileio.write_bytes(dst, fileio.read_bytes(src))
  return dst


def _same_bytes(a: str, b: str) -> bool:
  return fileio.read_bytes(a) == fileio.read_bytes(b)


def _same_json(a: str, b: str) -> bool:
  """Says whether tokenizer.json `b`, a workdir's copy, holds what `a` holds."""
  if _same_bytes(a, b):
    return True
  want = json.loads(fileio.read_text(a))
  try:
    return json.loads(fileio.read_text(b)) == want
  except (ValueError, UnicodeDecodeError) as e:
    raise DataError(f"{b}: cannot be read as a tokenizer.json ({e}); it is this workdir's copy "
                    f"of {a}: restore it from a copy or delete it (it is copied again), or use "
                    "another --workdir") from None
