"""Hugging Face checkpoints (config.json + safetensors) <-> tst_jax models, per model family.

`from_hf(path)` reads `config.json`, picks the family's converter by `model_type` in
`CONVERTERS`, whose names are the model families', and loads `model.safetensors` or the
shards of `model.safetensors.index.json`. `to_hf(model, path)` writes `config.json` and the
weights in float32 or bf16, as huggingface_hub's splitter shards them: one `model.safetensors`,
or shards and their index. Parameters are always float32, and `dtype` is the compute dtype of
the tst_jax model.

A converter module, registered in `CONVERTERS`, provides the functions below. The model is
built by its config, `cfg.build(rngs)`, and keeps its config as `.cfg`.

  config_from_hf(hf: dict, **overrides) -> cfg
                                      HF config.json dict -> the family's frozen config. The
                                      overrides are config field names, which
                                      `reading.make_config` checks. Raises ValueError on
                                      features it cannot represent.
  config_to_hf(cfg) -> dict           cfg -> config.json dict, with `architectures`,
                                      `model_type` and `tie_word_embeddings`.
  params_from_hf(tensors, cfg) -> dict
                                      checkpoint tensors -> a nested dict of numpy arrays shaped
                                      like `nnx.to_pure_dict(nnx.state(model, nnx.Param))`.
                                      `tensors` is a read-only Mapping name -> np.ndarray, read
                                      on access. Fetch them with
                                      `reading.read(tensors, name, shape)`.
  params_to_hf(pure: dict, cfg) -> dict[str, np.ndarray]
                                      the inverse: float32 pure dict -> HF tensor names.
  IGNORED, optional                   regexes of checkpoint tensors that may be left unread,
                                      such as `rotary_emb.inv_freq` buffers. Any other unread
                                      tensor is an error, so no weight is dropped silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from flax import traverse_util
from huggingface_hub import split_state_dict_into_shards_factory
from safetensors.numpy import save_file

from tst_jax import fileio, models
from tst_jax.convert import llama_hf, qwen3_moe_hf
from tst_jax.models import mtp as mtp_lib

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_PATTERN = "model{suffix}.safetensors"    # huggingface_hub's: model-00001-of-00003...
EXPORT_DTYPES = {"float32": np.float32, "bf16": ml_dtypes.bfloat16}

# safetensors dtype names -> numpy. bfloat16 and float8 come from ml_dtypes, as numpy has none.
_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


# ----------------------------------------------------------------------------- families


# Each Hugging Face model_type, the name of a family of tst_jax.models.FAMILIES, and its converter.
CONVERTERS = {"llama": llama_hf, "qwen3_moe": qwen3_moe_hf}


def converter(model_type: str):
  """Returns the converter of HF `model_type`."""
  if model_type not in CONVERTERS:
    raise ValueError(f"unsupported Hugging Face model_type {model_type!r}; tst_jax converts "
                     f"{tuple(CONVERTERS)}")
  return CONVERTERS[model_type]


def _family_of(model):
  try:
    return converter(models.family_of(getattr(model, "cfg", None)))
  except TypeError:
    raise TypeError(f"no Hugging Face family converts {type(model).__name__}") from None


# ----------------------------------------------------------------------------- files


def _read_config(path) -> dict:
  path = str(path)
  file = fileio.join(path, CONFIG_FILE) if fileio.isdir(path) else path
  if not fileio.isfile(file):
    raise FileNotFoundError(f"no {CONFIG_FILE} at {path}: not a Hugging Face checkpoint")
  hf = fileio.read_json(file)
  if "model_type" not in hf:
    raise ValueError(f"{file} has no 'model_type'")
  return hf


class _Tensors(Mapping):
  """Tensors of safetensors files by name, memory-mapped and read on access.

  A small reader rather than `safetensors.safe_open(framework="numpy")`, which cannot
  return bfloat16, the usual dtype of released checkpoints. Records what was read.
  """

  def __init__(self, files):
    self._entries, self.read_names = {}, set()
    for file in files:
      with fileio.open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
      header.pop("__metadata__", None)
      data = np.memmap(file, dtype=np.uint8, mode="r")
      for name, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
          raise ValueError(f"tensor {name!r} in {file} has unsupported dtype {info['dtype']}")
        self._entries[name] = (data, 8 + n, info)

  def __getitem__(self, name):
    data, base, info = self._entries[name]
    start, end = info["data_offsets"]
    self.read_names.add(name)
    return data[base + start:base + end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])

  def __iter__(self):
    return iter(self._entries)

  def __len__(self):
    return len(self._entries)


def _open_tensors(path: str) -> _Tensors:
  if fileio.isfile(fileio.join(path, WEIGHTS_FILE)):
    return _Tensors([fileio.join(path, WEIGHTS_FILE)])
  if fileio.isfile(fileio.join(path, INDEX_FILE)):
    weight_map = fileio.read_json(fileio.join(path, INDEX_FILE))["weight_map"]
    return _Tensors([fileio.join(path, f) for f in sorted(set(weight_map.values()))])
  raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {path} (only safetensors "
                          "checkpoints are supported)")


# ----------------------------------------------------------------------------- public API


def config_from_hf(path_or_dict, **overrides):
  """Returns the tst_jax config of a Hugging Face config: a dict, config.json or its folder."""
  hf = dict(path_or_dict) if isinstance(path_or_dict, Mapping) else _read_config(path_or_dict)
  return converter(hf.get("model_type")).config_from_hf(hf, **overrides)


def from_hf(path, *, dtype: str = "float32", **overrides):
  """Builds a tst_jax model with the weights of a Hugging Face safetensors checkpoint folder
  on the local disk, where its weights are memory-mapped."""
  path = str(path)
  if fileio.local_path(path) is None:
    raise ValueError(f"{path}: a Hugging Face folder is read from the local disk, where its "
                     "weights are memory-mapped: copy it there first")
  hf = _read_config(path)
  family = converter(hf["model_type"])
  cfg = family.config_from_hf(hf, dtype=dtype, **overrides)
  tensors = _open_tensors(path)
  pure = family.params_from_hf(tensors, cfg)
  ignored = [re.compile(p) for p in getattr(family, "IGNORED", ())]
  unread = sorted(n for n in set(tensors) - tensors.read_names
                  if not any(p.search(n) for p in ignored))
  if unread:
    raise ValueError(f"{path} has tensors the {hf['model_type']} converter does not map "
                     f"(unsupported features?): {unread[:8]}{' ...' if len(unread) > 8 else ''}")
  return _build(cfg, pure)


def _build(cfg, pure: dict):
  """Returns the model of `cfg` holding the parameters `pure`, with no random init in memory."""
  make = lambda: cfg.build(nnx.Rngs(0))
  graphdef, params, rest = nnx.split(nnx.eval_shape(make), nnx.Param, ...)
  if jax.tree.leaves(rest):
    # Non-parameter arrays (e.g. constant tables): a jitted constructor computes them and
    # XLA drops the random parameters nobody returns.
    rest = jax.jit(lambda: nnx.state(make(), nnx.Not(nnx.Param)))()
  expected = traverse_util.flatten_dict(nnx.to_pure_dict(params))
  given = traverse_util.flatten_dict(pure)
  missing, extra = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
  if missing or extra:
    raise ValueError(f"converted parameters do not match {type(cfg).__name__}'s model: "
                     f"missing {missing}, unexpected {extra}")
  arrays = {}
  for key, want in expected.items():
    if tuple(given[key].shape) != tuple(want.shape):
      raise ValueError(f"converted parameter {'.'.join(map(str, key))} has shape "
                       f"{tuple(given[key].shape)}, the model expects {tuple(want.shape)}")
    arrays[key] = jnp.asarray(given[key], want.dtype)
  nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict(arrays))
  return nnx.merge(graphdef, params, rest)


def to_hf(model, path, *, overwrite: bool = False, dtype: str = "float32",
          max_shard_size: int | str = "5GB") -> str:
  """Write `model` as a Hugging Face checkpoint: config.json and its weights in `dtype`
  (float32 | bf16), in safetensors shards of at most `max_shard_size` (bytes, or "5GB").
  `path` is a local folder or a bucket's (tst_jax.fileio), and is returned as a string.

  Refuses a non-empty folder unless `overwrite`, which replaces config.json and every
  model*.safetensors* file, so no shard of an earlier export is left beside the new ones.
  A model with multi-token prediction heads (models/mtp.py) is written without them, as their
  papers keep only the next-token model.
  """
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"dtype must be one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
  path = str(path)
  if fileio.exists(path) and not fileio.isdir(path):
    raise ValueError(f"{path} exists and is not a folder")
  if fileio.isdir(path) and fileio.listdir(path) and not overwrite:
    raise ValueError(f"{path} is not empty; pass overwrite=True to write into it")
  family = _family_of(model)
  hf = family.config_to_hf(model.cfg)
  torch_dtype = "bfloat16" if dtype == "bf16" else dtype
  hf.update(torch_dtype=torch_dtype, dtype=torch_dtype)   # old and new transformers spellings
  pure = jax.tree.map(lambda x: np.asarray(x, np.float32),
                      nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  pure.pop(mtp_lib.ATTR, None)
  tensors = {k: np.ascontiguousarray(np.asarray(v, np.float32).astype(EXPORT_DTYPES[dtype]))
             for k, v in family.params_to_hf(pure, model.cfg).items()}
  split = split_state_dict_into_shards_factory(
      tensors, get_storage_size=lambda a: a.nbytes, filename_pattern=SHARD_PATTERN,
      max_shard_size=max_shard_size)
  fileio.makedirs(path)
  for stale in fileio.glob(fileio.join(path, "model*.safetensors*")):
    fileio.remove(stale)
  for filename, names in split.filename_to_tensors.items():
    with fileio.staged(fileio.join(path, filename)) as local:   # safetensors writes a file
      save_file({n: tensors[n] for n in names}, local, metadata={"format": "pt"})
  if split.is_sharded:
    index = dict(metadata=dict(split.metadata), weight_map=split.tensor_to_filename)
    fileio.write_text(fileio.join(path, INDEX_FILE),
                      json.dumps(index, indent=2, sort_keys=True) + "\n")
  fileio.write_text(fileio.join(path, CONFIG_FILE), json.dumps(hf, indent=2, sort_keys=True)
                    + "\n")
  return path
