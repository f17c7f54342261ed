"""Export to a Hugging Face folder and back: transformers alone reproduces tst_jax's eval loss;
a run initialised from the folder starts where the exported one ended; clear errors."""

import json
import os
import shutil
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from tests.fixtures import trained
from tst_jax import errors, fileio, models
from tst_jax.errors import WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import trained_run
from tst_jax.tools import export
from tst_jax.data import run_data
from tst_jax.config import spec as spec_lib
from tst_jax.train.setup import Setup


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained.workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def hf_dir(workdir, tmp_path_factory):
  return str(export.export(workdir, tmp_path_factory.mktemp("export") / "hf"))


def _hf_eval_loss(model, windows) -> float:
  total, count = 0.0, 0
  for window in windows:
    window = torch.tensor(np.asarray(window), dtype=torch.long)
    with torch.no_grad():
      logits = model(window[:, :-1]).logits
    total += float(torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1), reduction="sum"))
    count += window[:, 1:].numel()
  return total / count


def test_transformers_alone_reproduces_the_eval_loss(workdir, hf_dir):
  assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"]
  # The weights are as readable as the files open() writes (safetensors makes its own 0600).
  modes = {f: stat.S_IMODE(os.stat(os.path.join(hf_dir, f)).st_mode) for f in os.listdir(hf_dir)}
  assert len(set(modes.values())) == 1 and modes["model.safetensors"] & 0o044 == (
      0o666 & ~_umask()) & 0o044, modes
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
  tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
  ours = workdir_lib.read_tokenizer(RunDir(workdir), model.config.vocab_size)
  assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == ours.eos_id
  assert model.config.eos_token_id == ours.eos_id
  assert model.config.max_position_embeddings == trained.config().data.seq_len
  text = "import os\n\ndef main(argv):\n    return len(argv)  # done\n"
  assert tokenizer(text).input_ids == ours.encode(text)
  assert tokenizer.decode(ours.encode(text)) == text

  data = run_data.prepare_data(spec_lib.check(trained.config()).data, RunDir(workdir),
                                model.config.vocab_size)
  expected = trained.summary(workdir)["final_eval_loss"]   # tst_jax's eval at the last step
  assert _hf_eval_loss(model, data.eval_windows) == pytest.approx(expected, abs=1e-3)


def test_export_refuses_missing_step_tokenizer_and_nonempty_out(workdir, tmp_path, capsys):
  with pytest.raises(WorkdirError, match=r"no checkpoint of step 5; available steps: \[4, 6, 8\]"):
    export.export(workdir, tmp_path / "a", step=5)
  assert not (tmp_path / "a").exists()

  no_tokenizer = tmp_path / "run_without_tokenizer"
  no_tokenizer.mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), no_tokenizer)
  shutil.copytree(os.path.join(workdir, "checkpoints"), no_tokenizer / "checkpoints")
  with pytest.raises(WorkdirError, match="no tokenizer.json"):
    export.export(str(no_tokenizer), tmp_path / "b")
  assert not (tmp_path / "b").exists()

  corrupt = tmp_path / "run_with_a_corrupt_checkpoint"
  shutil.copytree(workdir, corrupt)
  for root, _, files in os.walk(corrupt / "checkpoints" / "8" / "state"):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with pytest.raises(errors.DataError, match=f"^{corrupt}/checkpoints/8: the checkpoint cannot "
                     r"be restored \(.*\); give another --step of \[4, 6, 8\]"):
    export.export(str(corrupt), tmp_path / "d")
  assert not (tmp_path / "d").exists()

  out = tmp_path / "c"
  out.mkdir()
  (out / "config.json").write_text("mine")
  with pytest.raises(fileio.PathError, match="not empty; pass --overwrite"):
    export.main(["--workdir", workdir, "--out", str(out)])
  assert os.listdir(out) == ["config.json"] and (out / "config.json").read_text() == "mine"
  export.main(["--workdir", workdir, "--out", str(out), "--step", "6", "--overwrite"])
  assert "exported" in capsys.readouterr().out
  assert (out / "config.json").read_text() != "mine" and (out / "tokenizer.json").exists()


def test_init_from_hf_starts_where_the_export_ended(workdir, hf_dir, tmp_path):
  config = trained.config()
  config.init_from_hf = hf_dir
  config.data.tokenizer = os.path.join(hf_dir, "tokenizer.json")
  run = Setup.create(spec_lib.build(config), RunDir(tmp_path / "run"))
  state, step = run.restore_or_init()
  assert step == 0 and int(state.step) == 0
  assert run.evaluate(state.params) == pytest.approx(
      trained.summary(workdir)["final_eval_loss"], abs=1e-5)
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(state.opt_state)
             if np.ndim(x) > 0)          # fresh Adam moments

  config.model.dim, config.model.ffw_dim = 64, 96
  with pytest.raises(ValueError, match=r"differs from config.model in: dim \(checkpoint 32, "
                                       r"config 64\), ffw_dim \(checkpoint 64, config 96\)"):
    trained_run.hf_params(hf_dir, models.model_config(config.model), "llama")
  with pytest.raises(ValueError, match="holds a 'llama' model but config.model.family is"):
    trained_run.hf_params(hf_dir, models.model_config(config.model), "qwen3_moe")


@pytest.mark.parametrize("dtype,tol", [("bf16", 1e-2), ("float32", 1e-5)])
def test_sharded_export_loads_in_transformers_with_the_runs_logits(workdir, tmp_path, dtype,
                                                                   tol):
  """Shards of at most 40 kB (huggingface_hub's splitter) and their index; transformers loads
  them and gives the run's own logits, within bf16's rounding of the weights (2^-9 relative
  each) for bf16."""
  out = export.export(workdir, tmp_path / "hf", dtype=dtype, max_shard_size="40KB")
  index = json.loads(fileio.read_text(os.path.join(out, "model.safetensors.index.json")))
  shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
  assert len(shards) >= 3 and shards == sorted(set(index["weight_map"].values()))
  assert all(os.path.getsize(os.path.join(out, f)) <= 40_000 + 1_000 or _one_tensor(index, f)
             for f in shards)
  model = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert model.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)
  assert index["metadata"]["total_size"] == sum(p.numel() for p in model.parameters()) * (
      2 if dtype == "bf16" else 4)
  ours = trained_run.load(RunDir(workdir), dtype="float32").model
  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(2, 32))
  want = np.asarray(ours(jnp.asarray(tokens)), np.float64)
  with torch.no_grad():
    got = model.float()(torch.tensor(tokens)).logits.double().numpy()
  assert np.abs(got - want).max() <= tol * np.abs(want).max()


def _one_tensor(index, shard) -> bool:
  """A tensor larger than the limit gets a shard of its own."""
  return list(index["weight_map"].values()).count(shard) == 1


def test_an_export_to_a_bucket_holds_the_bytes_of_the_local_one(workdir, hf_dir, bucket,
                                                                 tmp_path, monkeypatch, capsys):
  """--out gs://... of the run copied into the bucket: its objects are the local export's
  files, byte for byte, and nothing lands on the local disk. A store it cannot write to is one
  line, before anything is read."""
  monkeypatch.chdir(tmp_path)
  remote, out = trained.in_bucket(workdir, bucket), fileio.join(bucket, "hf")
  export.main(["--workdir", remote, "--out", out])
  assert capsys.readouterr().out == f"exported {remote} to {out}\n"
  assert os.listdir(tmp_path) == []
  assert {name: fileio.read_bytes(fileio.join(out, name)) for name in fileio.listdir(out)} == {
      name: fileio.read_bytes(os.path.join(hf_dir, name)) for name in os.listdir(hf_dir)}
  with pytest.raises(SystemExit) as e:
    errors.main(export.main, ["--workdir", remote, "--out", "hf://me/model"])
  assert e.value.code == 2 and capsys.readouterr().err == (
      "error: --out hf://me/model: an export is a local folder, gs:// or s3://; hf:// is not "
      "supported there\n")


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask
