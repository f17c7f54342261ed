"""The base run configs every configs/*.py file starts from, and the `:arg` arms they take.

Each field's default, rule and doc are declared once, in its section's dataclass.
"""

import json

import ml_collections

from tst_jax import models, schema
from tst_jax.errors import ConfigError
from tst_jax.config.sections import Run, same_run_fields
from tst_jax.config.spec import SECTIONS, sections_of


def base_config(family: str = "llama", preset: str = "tiny") -> ml_collections.ConfigDict:
  """Returns a run config with every field at its declared default, the model's from `preset`."""
  c = schema.defaults(Run)
  c.model = models.preset_config(family, preset)
  for name, cls in SECTIONS.items():
    c[name] = schema.defaults(cls)
  return c


def as_written(c: ml_collections.ConfigDict) -> str:
  """Returns config.reference.run for a reference measured with config `c` as it stands: its
  fields of sections.SAME_RUN as JSON. A config file calls it after setting its fields, so a
  --config override of any of them is a run the reference was not measured for."""
  return json.dumps(same_run_fields(sections_of(c)), sort_keys=True)


def paper_base_config(family: str, preset: str) -> ml_collections.ConfigDict:
  """Returns base_config at the paper's scale: a prepared corpus, bf16, remat, the fused loss,
  FSDP and sparse logging. Each paper config sets its recipe of shape, batch, schedule, S and r.
  """
  c = base_config(family, preset)
  c.data.source = ""                # required, e.g. tokens:/data/tok/dclm-llama3 of DCLM
  c.data.tokenizer = ""             # Llama-3 tokenizer.json, or "" with tokens:
  c.data.eval_batches = 16
  c.data.val_fraction = 0.001
  c.data.val_piece_bytes = 0        # web-scale corpora: whole documents held out
  c.model.dtype = "bfloat16"        # bf16 compute, float32 master weights
  c.model.remat = "save_dots"
  c.loss.impl = "auto"              # fused linear + MCE, with no [N, V] logits
  c.mesh.data, c.mesh.fsdp = 1, -1  # FSDP over every device, as in the paper
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.checkpoint_every = 1000
  return c


def arms(arg: str) -> list[str]:
  """Splits a config's `:arg`: 'baseline, 20k' -> ['baseline', '20k']."""
  return [part for part in (p.strip() for p in (arg or "").split(",")) if part]


def apply_arms(c: ml_collections.ConfigDict, arg: str, name: str) -> ml_collections.ConfigDict:
  """Sets the arms named by `arg`, every config file's `:arg`, in place and returns the config.

  `arg` is a comma list of:
    tst           the config as written
    baseline      r = 0: next-token steps at the same FLOPs
    reinit        a fresh embedding and head at the switch
    input_only    superposition at the input only, output_only at the output only
    smooth        phase 1 as tst phases of S, S/2, ... 2, which is tst.schedule='halve'
    s<S>          the bag size
    r<r>          the step ratio
    <N>k          total steps in thousands, e.g. 2k, 1.5k, 0.45k
    <N>mb         data.max_bytes in millions of bytes, e.g. 600mb: a corpus for a longer run
    mtp<k>        multi-token prediction of k tokens a position, Gloeckle et al.'s heads, at
                  the baseline's FLOPs (fewer steps); alone next-token training throughout
                  (r = 0), with tst or r<r> in the next-token phase after TST's phase 1
    mtp<k>-ds     the same with DeepSeek-V3's cascaded modules
  `name` is the config file, for the error message.
  """
  parts = arms(arg)
  if any(mtp_arm(p) for p in parts) and not any(
      p == "tst" or p[0] == "r" and _is_float(p[1:]) for p in parts):
    c.tst.ratio = 0.0      # an MTP arm is MTP's own unless it names TST's phase 1
  for part in parts:
    if part == "tst":
      continue
    if part == "baseline":
      c.tst.ratio = 0.0
    elif part == "reinit":
      c.tst.reinit_at_switch = True
    elif part in ("input_only", "output_only"):
      c.tst.mode = part
    elif part == "smooth":
      c.tst.schedule = "halve"
    elif part[0] == "s" and part[1:].isdigit():
      c.tst.bag_size = int(part[1:])
    elif part[0] == "r" and _is_float(part[1:]):
      c.tst.ratio = float(part[1:])
    elif arm_steps(part):
      c.train.steps = arm_steps(part)
    elif part.endswith("mb") and part[:-2].isdigit() and int(part[:-2]) > 0:
      c.data.max_bytes = int(part[:-2]) * 1_000_000
    elif mtp_arm(part):
      c.mtp.k, c.mtp.kind = mtp_arm(part)
    else:
      raise ConfigError("--config", f"{name}: unknown arg {part!r}; expected a comma list of "
                        "tst, baseline, reinit, input_only, output_only, smooth, s<S>, r<ratio>, "
                        "<N>k, <N>mb, mtp<k>, mtp<k>-ds")
  return c


def mtp_arm(part: str) -> tuple[int, str] | None:
  """Reads an 'mtp<k>' or 'mtp<k>-ds' arm: 'mtp4' -> (4, 'gloeckle'), 'mtp2-ds' -> (2,
  'deepseek'). Any other text, or k < 2, gives None."""
  text, ds = (part[:-3], True) if part.endswith("-ds") else (part, False)
  if not (text.startswith("mtp") and text[3:].isdigit() and int(text[3:]) >= 2):
    return None
  return int(text[3:]), "deepseek" if ds else "gloeckle"


def arm_steps(part: str) -> int:
  """Reads the steps of a '<N>k' arm: '2k' -> 2000, '1.5k' -> 1500, '0.45k' -> 450.

  Any other text, or one that is not a positive whole number of steps, gives 0.
  """
  if not (part.endswith("k") and _is_float(part[:-1])):
    return 0
  steps = float(part[:-1]) * 1000
  whole = 1 <= steps < 1e12 and abs(steps - round(steps)) < 1e-6    # not inf or nan
  return int(round(steps)) if whole else 0


def steps_arm(steps: int) -> str:
  """Names the '<N>k' arm of `steps` steps, the inverse of `arm_steps`: 2000 -> '2k'."""
  return f"{steps / 1000:.12g}k"


def _is_float(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True
