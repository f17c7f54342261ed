"""The run's own config sections, each field declared once: the top level `Run`, tst, loss,
optimizer, train and reference.

The other sections live with what they configure: data in data/section.py, model in the
family's config dataclass, mesh in parallel/mesh.py and distributed in parallel/distributed.py.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

from tst_jax import fileio, losses, models, platform, schema
from tst_jax.parallel.logical import LOGICAL_AXIS_RULES
from tst_jax.parallel.mesh import MESH_AXES
from tst_jax.superposition import MODES
from tst_jax.optim import DECAY_SHAPES, MU_DTYPES, OPTIMIZERS, SCHEDULES, SWITCH_ADAM
from tst_jax.run import sinks, step_profile
from tst_jax.config.plan import EQUAL_FLOPS


def _axes_ok(target) -> bool:
  names = (target,) if isinstance(target, str) else target
  return target is None or (isinstance(names, (tuple, list)) and all(n in MESH_AXES
                                                                     for n in names))


_RULES = schema.Rule(
    lambda rules: isinstance(rules, (tuple, list)) and all(
        isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], str)
        and _axes_ok(r[1]) for r in rules),
    f"(logical name, None | a mesh axis of {MESH_AXES} | a tuple of them) pairs", tuple)


def _window_ok(text) -> bool:
  if not isinstance(text, str):
    return False
  try:
    step_profile.profile_window(text)
  except ValueError:
    return False
  return True


def _task_names_ok(text) -> bool:
  names = text.split(",") if isinstance(text, str) and text else []
  return isinstance(text, str) and all(
      n and n.replace("_", "a").replace(".", "a").replace("-", "a").isalnum() for n in names)


# A folder of the host each process runs on; an object store is the workdir's place.
_HOST_FOLDER = schema.Rule(lambda v: isinstance(v, str) and fileio.local_path(v) is not None,
                           "a folder on each host's own disk, not a URL", str)
_WINDOW = schema.Rule(_window_ok, "'' or '<first>,<count>', both >= 1", str)
_TASKS = schema.Rule(_task_names_ok, "'' or a comma list of lm-eval task names or 'paper' "
                     "(letters, digits, _ . -)", str)


@dataclasses.dataclass(frozen=True)
class Run:
  """The top level of a run config."""
  seed: int = schema.field(0, schema.integer(0), "model init, batch order (and the data "
                           "unless data.seed)")
  init_from_hf: str = schema.field("", schema.STRING, "a Hugging Face folder (e.g. from "
                                   "tst_jax.tools.export) to start from")
  logical_axis_rules: tuple = schema.field(LOGICAL_AXIS_RULES, _RULES, "logical axis -> mesh "
                                           "axes, the first match wins (parallel/logical.py)")

  def __post_init__(self):   # config.json's lists read back as the tuples they were
    as_tuple = lambda axes: tuple(axes) if isinstance(axes, list) else axes
    object.__setattr__(self, "logical_axis_rules", tuple(
        (name, as_tuple(axes)) for name, axes in self.logical_axis_rules))


@dataclasses.dataclass(frozen=True)
class Tst:
  """config.tst: phase 1's settings, from which the plan makes each phase's own."""
  bag_size: int = schema.field(4, schema.integer(1), "S: tokens superposed per bag (1: the "
                               "baseline)")
  ratio: float = schema.field(0.3, schema.number(0, 1), "r: share of the steps in phase 1 "
                              "(0: the baseline)")
  mode: str = schema.field("full", schema.one_of(MODES), "full | input_only | output_only "
                           "(the paper's section 5.2 ablation)")
  weighting: str = schema.field("uniform", schema.STRING, "the MCE's bag weights: uniform | "
                                "power | exponential | first | fitted:<F.json> | fitted:paper "
                                "(appendix D's C0 + a·d^k)")
  variant: str = schema.field("mce", losses.VARIANT, lambda: "the bag's loss, a variant of "
                              "losses.py: " + losses.variants_doc())
  equal_flops: str = schema.field("seq", schema.one_of(EQUAL_FLOPS), "seq: data length S x L "
                                  "(the paper's) | batch: S x the rows of L/S bags")
  reinit_at_switch: bool = schema.field(False, schema.BOOL, "re-initialise embedding and head "
                                        "at the switch (the randomisation ablation)")
  schedule: str = schema.field("", schema.STRING, "phase 1's tst phases: '' one (the hard switch) "
                               "| halve (S, S/2, ... 2) | 'S1,S2,...'", added="")
  switch_adam: str = schema.field("keep", schema.one_of(SWITCH_ADAM), "keep: Adam's moments "
                                  "go on into next-token training, restored with the checkpoint "
                                  "(the paper says nothing else) | reset: zero moments and "
                                  "bias correction from the switch (Muon's momentum too), the "
                                  "schedule unchanged",
                                  added="keep")
  switch_warmup: int = schema.field(0, schema.integer(0), "steps of a linear lr warmup from "
                                    "the switch to next-token training (0: the one schedule "
                                    "goes on, the paper's)", added=0)


@dataclasses.dataclass(frozen=True)
class Loss:
  """config.loss."""
  impl: str = schema.field("naive", schema.one_of(platform.LOSS_IMPLS), "naive (logits) | xla "
                           "(chunked) | pallas | auto (the platform's measured fastest)")
  z_loss: float = schema.field(0.0, schema.number(0), "adds z_loss x the mean over positions "
                               "of logsumexp(logits)^2 (PaLM's 1e-4; 0: off)", added=0.0)


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """config.optimizer: AdamW (the paper's) or Muon, and one schedule over both phases."""
  name: str = schema.field("adamw", schema.one_of(OPTIMIZERS), "adamw (the paper's) | muon: "
                           "Muon for the blocks' matrices, AdamW for embedding, head, norms",
                           added="adamw")
  lr: float = schema.field(3e-3, schema.number(0, open_lo=True), "peak learning rate")
  b1: float = schema.field(0.9, schema.number(0, 1, open_hi=True), "AdamW beta 1 (the paper's)")
  b2: float = schema.field(0.95, schema.number(0, 1, open_hi=True), "AdamW beta 2 (the paper's)")
  eps: float = schema.field(1e-8, schema.number(0, open_lo=True), "AdamW epsilon")
  weight_decay: float = schema.field(0.1, schema.number(0), "decoupled, not on norm scales")
  grad_clip: float = schema.field(1.0, schema.number(0, open_lo=True), "global-norm clipping")
  mu_dtype: str = schema.field("float32", schema.one_of(MU_DTYPES), "dtype of the first "
                               "moment (AdamW's and Muon's momentum)", added="float32")
  schedule: str = schema.field("wsd", schema.one_of(SCHEDULES), "wsd: warmup, constant, decay "
                               "| cosine: warmup, then a cosine decay to the end", added="wsd")
  warmup_steps: int = schema.field(20, schema.integer(0), "linear warmup steps")
  decay_fraction: float = schema.field(0.1, schema.number(0, 1), "WSD: the decay's share of "
                                       "all steps, at the end")
  decay_shape: str = schema.field("linear", schema.one_of(DECAY_SHAPES), "WSD: the decay's "
                                  "shape, linear | cosine | 1-sqrt", added="linear")
  final_lr_fraction: float = schema.field(0.0, schema.number(0, 1), "the lr at the end, as a "
                                          "fraction of the peak")
  grad_accum: int = schema.field(1, schema.integer(1), "micro-batches per optimizer step")


@dataclasses.dataclass(frozen=True)
class Train:
  """config.train: the run's length, and the loop's cadences and policies."""
  steps: int = schema.field(300, schema.integer(1), "T: total optimizer steps, both phases")
  log_every: int = schema.field(10, schema.integer(1), "metrics.jsonl cadence (steps)")
  eval_every: int = schema.field(50, schema.integer(1), "held-out eval cadence (and at each "
                                 "phase end)")
  checkpoint_every: int = schema.field(100, schema.integer(0), "periodic checkpoints (plus "
                                       "each phase end)")
  checkpoint_minutes: float = schema.field(0.0, schema.number(0), "also save when this many "
                                          "minutes have passed since the last save, for "
                                          "preemptible machines (0: off)", added=0.0)
  keep_checkpoints: int = schema.field(2, schema.integer(1), "the latest N kept, plus the "
                                       "phase-switch checkpoints")
  local_checkpoint_every: int = schema.field(0, schema.integer(0), "emergency checkpoints: "
                                             "each process's shards to a disk of its host "
                                             "every this many steps, resumed from when newer "
                                             "than the workdir's (0: off; "
                                             "docs/reliability.md)", added=0)
  local_checkpoint_dir: str = schema.field("", _HOST_FOLDER, "the emergency checkpoints' "
                                           "folder on each host, on a disk that outlives the "
                                           "process ('': ~/.cache/tst_jax/local_checkpoints)",
                                           added="")
  progress_bar: bool = schema.field(True, schema.BOOL, "a tqdm bar with the phase and ETA (on "
                                    "a terminal)")
  force_resume: bool = schema.field(False, schema.BOOL, "resume a workdir whose config or "
                                    "store differs")
  nan_policy: str = schema.field("stop", schema.one_of(("stop", "skip")), "a non-finite loss "
                                 "or gradient: stop | skip (the batch, no update)")
  max_nan_skips: int = schema.field(3, schema.integer(0), "with skip: stop after this many "
                                    "skipped batches")
  max_passes: float = schema.field(0.0, schema.number(0), "refuse to train a run that would "
                                   "read its training tokens more times (0: no limit)",
                                   added=0.0)
  tracker: str = schema.field("none", schema.registered(sinks.TRACKERS), "also send "
                              "metrics.jsonl's records to this tracker of run/sinks.py "
                              "(WANDB_MODE=offline works without a login)", added="none")
  profile_steps: str = schema.field("", _WINDOW, "'<first>,<count>': a jax.profiler trace of "
                                    "these steps and their milliseconds by category, in "
                                    "<workdir>/profile ('': none)", added="")
  eval_tasks: str = schema.field("", _TASKS, "lm-eval tasks scored on the live parameters in "
                                 "the next-token phase, never a phase-1 model, which predicts "
                                 "bags: comma list, 'paper' the paper's eight 0-shot ('': "
                                 "none; needs lm-eval; docs/evaluation.md)", added="")
  eval_tasks_every: int = schema.field(0, schema.integer(0), "steps between eval_tasks' "
                                       "scorings, in the next-token phase; always after the "
                                       "last step (0: then only)", added=0)
  eval_tasks_include: str = schema.field("", schema.STRING, "a folder of task YAMLs lm-eval "
                                         "does not ship, as tools.eval's --include_path ('': "
                                         "none)", added="")
  eval_tasks_limit: int = schema.field(0, schema.integer(0), "documents per eval_tasks task, "
                                       "lm-eval's --limit, for a quick look; its scores are "
                                       "not the task's (0: all)", added=0)


# What makes two runs one run: a workdir resumes only a run equal in these, and a run prints
# its difference from config.reference only where it equals the run the reference was measured
# for. A section stands for all its fields.
SAME_RUN = ("seed", "model", "tst", "data", "optimizer", "loss", "mtp", "train.steps")


def same_run_fields(sections) -> dict:
  """Returns the fields of SAME_RUN of a run's typed sections, a mapping with the keys of
  spec.sections_of, as dotted name -> value as config.json writes it. The platform's own
  choices (platform.PLATFORM_FIELDS) are back at `auto`: a run does not change with them."""
  fields = {}
  for name in SAME_RUN:
    section, _, field = name.partition(".")
    if section == "seed":
      fields["seed"] = sections["run"].seed
      continue
    typed = sections[section]
    values = schema.values(platform.unresolved(typed, section)
                           if section in ("model", "loss") else typed)
    if section == "model":
      values = dict(family=models.family_of(typed), **values)
    fields.update({f"{section}.{k}": v for k, v in values.items() if k == field or not field})
  return json.loads(json.dumps(fields))   # tuples as lists, as config.json and a record hold them


def _run_record_ok(text) -> bool:
  try:
    return isinstance(text, str) and (not text or isinstance(json.loads(text), dict))
  except ValueError:
    return False


@dataclasses.dataclass(frozen=True)
class Reference:
  """config.reference: a measured result the run's final block prints beside its own."""
  name: str = schema.field("", schema.STRING, "what it is, e.g. 'the equal-FLOPs baseline' "
                           "('': none)", added="")
  loss: float = schema.field(0.0, schema.number(0), "its final held-out loss (nats/token)",
                             added=0.0)
  measured: str = schema.field("", schema.STRING, "where and when: the docs page that records "
                               "its device and date, e.g. 'docs/demo.md: 2-core CPU'",
                               added="")
  command: str = schema.field("", schema.STRING, "the command that measures it again",
                              added="")
  data: str = schema.field("", schema.STRING, "the data it was measured on: the token store's "
                           "fingerprint, or builtin:pystdlib@<major.minor> for that Python's "
                           "standard library. The run prints its difference from it only on "
                           "the same data", added="")
  run: str = schema.field("", schema.Rule(_run_record_ok, "'' or a JSON object", str),
                          "the run it was measured for: its fields of sections.SAME_RUN as "
                          "JSON, as defaults.as_written(config) gives them. The run prints its "
                          "difference from it only where it equals them all", added="")
  loss_sd: float = schema.field(0.0, schema.number(0), "the sample sd of its final loss over "
                                "`seeds` seeds of its command (0 with one seed)", added=0.0)
  seeds: int = schema.field(1, schema.integer(1), "how many seeds `loss` is the mean of",
                            added=1)

  def differences(self, fields: dict) -> list[str]:
    """Names each field in which a run's `fields` (same_run_fields) differ from the run this
    was measured for, as 'train.steps 20, not 300'."""
    recorded = json.loads(self.run) if self.run else {}
    return [f"{k} {_shown(fields.get(k))}, not {_shown(recorded.get(k))}"
            for k in sorted(set(recorded) | set(fields)) if fields.get(k) != recorded.get(k)]

  def command_for(self, fields: dict) -> str:
    """Returns `command` with the run's own overrides of the fields of the run this was
    measured for, so that it measures the reference on the run's data and settings. The tst
    section stays the reference's own: its arm differs from the run in that."""
    recorded = json.loads(self.run) if self.run else {}
    overrides = [shlex.quote(f"--config.{k}={_flag_value(v)}") for k, v in fields.items()
                 if k in recorded and recorded[k] != v and not k.startswith("tst.")]
    return " ".join([self.command, *overrides])


def _shown(value) -> str:
  return repr(value) if isinstance(value, str) else str(value)


def _flag_value(value) -> str:
  """Writes a field's value as a --config.<field>= flag takes it."""
  return str(tuple(value) if isinstance(value, list) else value)
