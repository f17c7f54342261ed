"""Trained weights read back: a run's workdir (config, tokenizer, one checkpoint's parameters)
or a Hugging Face folder to start a run from.

Shared by `export`, `eval`, `sample` and the trainer's `init_from_hf`. From a workdir only the
model's parameters are restored, without optimizer state, onto one device: the heads of
multi-token prediction, which only training uses, stay in the checkpoint. The run's
`config.json` gives the model config and the sequence length it was trained at.
"""

from __future__ import annotations

import dataclasses

import jax
import orbax.checkpoint as ocp
from flax import nnx

from tst_jax import data as data_lib
from tst_jax import fileio, platform
from tst_jax.convert import hf as convert_hf
from tst_jax.data.section import Data
from tst_jax.errors import DataError, WorkdirError
from tst_jax.rundir import RunDir
from tst_jax.run import workdir as workdir_lib
from tst_jax.train import checkpoint as ckpt_lib, checkpoint_mirror, step as step_lib
from tst_jax.config import record as record_lib
from tst_jax.config.sections import Tst


@dataclasses.dataclass
class Trained:
  """A model with the parameters of `step`, and what it needs to read and write text."""
  rundir: RunDir
  data: Data                          # the run's data section (config.json)
  tst: Tst                            # its TST section
  model: nnx.Module
  tokenizer: data_lib.Tokenizer
  step: int
  meta: dict                          # the checkpoint's record: phase, data position, ...

  @property
  def max_length(self) -> int:
    """Positions the model was trained on (data.seq_len): the context length to use."""
    return self.data.seq_len

  @property
  def phase1_only(self) -> bool:
    """True for a checkpoint of TST's phase 1: it has only seen bags, never single tokens."""
    return self.meta.get("phase") == "tst"


def load(rundir: RunDir, step: int | None = None, *, dtype: str | None = None) -> Trained:
  """Loads the run in `rundir` at checkpoint `step`, by default the latest.

  `dtype` overrides the model's compute dtype (e.g. float32 for exact comparisons).
  A workdir that is missing or holds no run, no tokenizer or no checkpoint of `step` (the
  error names the steps there), or a checkpoint that does not restore, is a UserError.
  """
  fileio.check_readable(rundir.root, "--workdir")
  sections = record_lib.read_config(rundir)
  model_cfg = platform.unresolved(sections["model"], "model")   # this platform's kernels
  if dtype is not None:
    model_cfg = dataclasses.replace(model_cfg, dtype=dtype)
  tokenizer = workdir_lib.read_tokenizer(rundir, model_cfg.vocab_size)
  steps = workdir_lib.checkpoint_steps(rundir)
  if not steps:
    raise WorkdirError(f"{rundir.checkpoints} holds no checkpoint: train the run first")
  step = steps[-1] if step is None else int(step)
  if step not in steps:
    raise WorkdirError(f"{rundir} has no checkpoint of step {step}; available steps: {steps}")
  try:
    params, meta = restore_params(rundir.checkpoints, step, model_cfg)
  except Exception as e:  # pylint: disable=broad-except  Orbax's and TensorStore's, of any kind
    raise DataError(f"{rundir.checkpoint(step)}: the checkpoint cannot be restored "
                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    f"give another --step of {steps}") from e
  graphdef, _ = step_lib.abstract_model(model_cfg)
  return Trained(rundir, sections["data"], sections["tst"], nnx.merge(graphdef, params),
                 tokenizer, step, meta)


def restore_params(directory: str, step: int, model_cfg):
  """(params, meta) of checkpoint `step`: the TrainState's parameters only, on one device."""
  _, abstract = step_lib.abstract_model(model_cfg)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = {"params": jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)}
  ckpt_lib.quiet_storage(directory)
  manager = ocp.CheckpointManager(checkpoint_mirror.readable(directory),
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True),
        meta=ocp.args.JsonRestore()))
  finally:
    manager.close()
  return restored.state["params"], dict(restored.meta)


# Model fields a run may choose over a Hugging Face checkpoint's: how it computes and trains,
# not the function its weights compute.
HF_FREE_FIELDS = ("dtype", "attention_impl", "remat", "matmul_precision", "init_std",
                  "expert_impl", "dispatch_impl", "aux_loss_coef", "router_z_loss_coef")


def hf_params(path: str, model_cfg, family: str) -> nnx.State:
  """Reads the parameters of Hugging Face folder `path` onto the host, checked to be the model
  of `model_cfg`. A ValueError names every field in which they differ."""
  config_file = fileio.join(path, convert_hf.CONFIG_FILE)
  if not fileio.isfile(config_file):
    raise FileNotFoundError(f"{config_file} does not exist: not a Hugging Face model folder")
  hf = fileio.read_json(config_file)
  if hf.get("model_type") != family:
    raise ValueError(f"{path} holds a {hf.get('model_type')!r} model but config.model.family "
                     f"is {family!r}")
  names = [f.name for f in dataclasses.fields(model_cfg)]
  free = {n: getattr(model_cfg, n) for n in HF_FREE_FIELDS if n in names}
  hf_cfg = convert_hf.config_from_hf(hf, **free)
  diff = [f"{n} (checkpoint {getattr(hf_cfg, n)!r}, config {getattr(model_cfg, n)!r})"
          for n in names if getattr(hf_cfg, n) != getattr(model_cfg, n)]
  if diff:
    raise ValueError(f"the model in {path} differs from config.model in: {', '.join(diff)}; "
                     "set those config.model fields to the checkpoint's")
  return nnx.state(convert_hf.from_hf(path, **free), nnx.Param)
