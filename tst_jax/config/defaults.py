"""The base run configs every configs/*.py file starts from, and the `:arg` arms they take.

Each field's default, rule and doc are declared once, in its section's dataclass. The arms are
one registry, ARMS: an arm is one entry, and its form, its field and the models it is for are
read from there by every config file, the sweep's `--arms` and the rule that an override may
not set a field an arm of the same command sets.
"""

import dataclasses
import json
from typing import Callable

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


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm of a config file's `:arg`: how it is written, the field it sets, the models it is for.

  A named arm (`baseline`) sets `field` to `value`. A numbered arm is written as its `form` with
  a number in the place of `<...>` (`s<S>`: s8), which `read` turns into the field's value, or
  into None where the number is not one `must` describes.
  """
  form: str
  doc: str
  field: str = ""                          # the config field it sets ('': none)
  value: object = None                     # a named arm's value of `field`
  read: Callable[[str], object] | None = None   # a numbered arm's text -> the field's value
  must: str = ""                           # what a numbered arm's number must be
  families: tuple[str, ...] = ()           # the model families that take it (): every one
  also: tuple[tuple[str, object], ...] = ()     # further (field, value) it sets
  alone: tuple[tuple[str, object], ...] = ()    # (field, value) it sets where the same arg
                                                # names no TST phase 1 (`names_phase_1`)

  def names_phase_1(self, value) -> bool:
    """Says whether this arm, setting `value`, asks for TST's phase 1: `tst`, and every arm
    that sets a tst field but tst.ratio = 0 (baseline, r0)."""
    return self.form == "tst" or (self.field.startswith("tst.")
                                  and not (self.field == "tst.ratio" and value == 0))

  def number_text(self, part: str) -> str | None:
    """Returns the number's text where `part` is written in this numbered arm's form: its
    prefix, a text with a digit, its suffix. None otherwise."""
    if self.read is None:
      return None
    prefix, _, rest = self.form.partition("<")
    suffix = rest.partition(">")[2]
    text = part[len(prefix):len(part) - len(suffix)]
    if not (part.startswith(prefix) and part.endswith(suffix) and
            len(part) > len(prefix) + len(suffix) and any(ch.isdigit() for ch in text)):
      return None
    return text


def _whole(text: str, rule: schema.Rule):
  """`text` read as an int that `rule` accepts, else None."""
  return int(text) if text.isdigit() and rule.ok(int(text)) else None


def _number(text: str, rule: schema.Rule):
  """`text` read as a float that `rule` accepts, else None."""
  try:
    value = float(text)
  except ValueError:
    return None
  return value if rule.ok(value) else None


def _rule(dotted: str) -> schema.Rule:
  """Returns the declared rule of the config field `dotted`, e.g. 'tst.bag_size'."""
  section, _, name = dotted.partition(".")
  cls = SECTIONS[section]
  return next(f.metadata["rule"] for f in schema.config_fields(cls) if f.name == name)


def register_arm(arm: Arm) -> None:
  """Adds `arm` to every config file's `:arg`: from then on its form is an arm."""
  ARMS[arm.form] = arm


# The arms every config file takes, in the order the error lines list them.
ARMS: dict[str, Arm] = {}
for _arm in (
    Arm("tst", "the config as written"),
    Arm("baseline", "r = 0: next-token steps at the same FLOPs", "tst.ratio", 0.0),
    Arm("reinit", "a fresh embedding and head at the switch", "tst.reinit_at_switch", True),
    Arm("input_only", "superposition at the input only", "tst.mode", "input_only"),
    Arm("output_only", "superposition at the output only", "tst.mode", "output_only"),
    Arm("smooth", "phase 1 as tst phases of S, S/2, ... 2", "tst.schedule", "halve"),
    Arm("adam_reset", "fresh Adam moments at the switch", "tst.switch_adam", "reset"),
    Arm("rewarm<N>", "the lr warmed up again over N steps from the switch",
        "tst.switch_warmup", read=lambda t: _whole(t, _rule("tst.switch_warmup")) or None,
        must="N is tst.switch_warmup, a whole number of steps >= 1: rewarm50"),
    Arm("s<S>", "the bag size", "tst.bag_size",
        read=lambda t: _whole(t, _rule("tst.bag_size")),
        must=f"S is tst.bag_size, {_rule('tst.bag_size').must}"),
    Arm("r<ratio>", "the share of the steps in phase 1", "tst.ratio",
        read=lambda t: _number(t, _rule("tst.ratio")),
        must=f"the ratio is tst.ratio, {_rule('tst.ratio').must}"),
    Arm("<N>k", "total steps in thousands, e.g. 2k, 1.5k, 0.45k", "train.steps",
        read=lambda t: arm_steps(t + "k") or None,
        must="N is thousands of steps, a whole number of steps >= 1: 2k, 1.5k, 0.045k"),
    Arm("<N>mb", "data.max_bytes in millions of bytes: a corpus for a longer run",
        "data.max_bytes", read=lambda t: int(t) * 1_000_000 if t.isdigit() and int(t) else None,
        must="N is millions of bytes, a whole number >= 1: 600mb"),
    *(Arm(f"mtp<k>{suffix}", f"multi-token prediction of k tokens a position, {who}, at the "
          "baseline's FLOPs (fewer steps); alone next-token training throughout (r = 0), with "
          "an arm of TST's phase 1 (tst, r<ratio>, s<S>, ...) in the next-token phase after "
          "it", "mtp.k",
          read=lambda t: int(t) if t.isdigit() and int(t) >= 2 else None,
          must="k is mtp.k, the tokens a position with the next one, a whole number >= 2",
          also=(("mtp.kind", kind),), alone=(("tst.ratio", 0.0),))
      for suffix, who, kind in (("", "Gloeckle et al.'s heads", "gloeckle"),
                                ("-ds", "DeepSeek-V3's cascaded modules", "deepseek"))),
):
  register_arm(_arm)


def arm_forms() -> str:
  """Lists the arms as an error line does: 'tst, baseline, ..., <N>mb'."""
  return ", ".join(ARMS)


def parse_arm(part: str, name: str, family: str = "") -> tuple[Arm, object]:
  """Returns the arm `part` names and the value it sets. An arm that is unknown, whose number
  is malformed or which `family` does not take is a ConfigError naming it and the arms;
  `name` is the config file, for the line."""
  arm, value = ARMS.get(part), None
  if arm is not None:
    value = arm.value
  else:
    shaped = [a for a in ARMS.values() if a.number_text(part) is not None]
    read = [(a, a.read(a.number_text(part))) for a in shaped]
    arm, value = next(((a, v) for a, v in read if v is not None), (None, None))
    if arm is None and shaped:
      raise ConfigError("--config", f"{name}: arm {part!r} is not {shaped[0].form}: "
                        f"{shaped[0].must}; the arms: {arm_forms()}")
    if arm is None:
      raise ConfigError("--config", f"{name}: unknown arm {part!r}; the arms, a comma list: "
                        f"{arm_forms()}")
  if arm.families and family and family not in arm.families:
    raise ConfigError("--config", f"{name}: arm {part!r} is for {' and '.join(arm.families)} "
                      f"models; this config's model is {family}")
  return arm, value


def arms(arg: str) -> list[str]:
  """Splits a config's `:arg`: 'baseline, 20k' -> ['baseline', '20k']."""
  return [part for part in (p.strip() for p in (arg or "").split(",")) if part]


def apply_arms(c: ml_collections.ConfigDict, arg: str, name: str) -> ml_collections.ConfigDict:
  """Sets the arms named by `arg`, every config file's `:arg`, in place and returns the config.

  `arg` is a comma list of the forms of ARMS. `name` is the config file, for the error line.
  """
  for field, value, _ in arm_settings(arg, name, c.model.family):
    section, _, leaf = field.partition(".")
    c[section][leaf] = value
  return c


def arm_settings(arg: str, name: str = "", family: str = "") -> list[tuple[str, object, str]]:
  """Returns the (config field, value, arm) that the arms of `arg` set, in the order they are
  set: first each arm's `alone` fields where no arm names TST's phase 1, then each arm's field
  and `also` fields as written. 'mtp2' -> tst.ratio 0.0, mtp.k 2, mtp.kind 'gloeckle';
  's8,mtp2' keeps tst.ratio. Two arms that set one field are a ConfigError naming both."""
  parsed = [(part, *parse_arm(part, name, family)) for part in arms(arg)]
  with_tst = any(arm.names_phase_1(value) for _, arm, value in parsed)
  out = [(field, value, part) for part, arm, _ in parsed if not with_tst
         for field, value in arm.alone]
  setters = {}
  for part, arm, value in parsed:
    for field, v in ((arm.field, value), *arm.also):
      if field in setters:
        raise ConfigError("--config", f"{name}: arms {setters[field]!r} and {part!r} both set "
                          f"{field}: give one")
      if field:
        setters[field] = part
        out.append((field, v, part))
  return out


def arm_fields(arg: str, name: str = "") -> dict[str, str]:
  """Returns {config field: the arm of `arg` that sets it}: '2k,s8' -> train.steps: '2k',
  tst.bag_size: 's8'."""
  return {field: part for field, _, part in arm_settings(arg, name)}


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
