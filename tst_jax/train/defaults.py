"""The base run configs every configs/*.py file starts from (one comment per field) and the
`:arg` arms they all take."""

import ml_collections

from tst_jax import models
from tst_jax.errors import ConfigError

# Logical axis -> mesh axes. The first matching rule wins; a mesh axis is used once per array.
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp", "expert")),  # [B, ...] batches and activations: data parallel
    ("layers", None),                       # stacked-layer axis of scanned blocks: never split
    ("vocab", "tensor"),                    # V of the [V, D] embedding and [D, V] head
    ("embed", "fsdp"),                      # D of every weight: FSDP shards it
    ("heads", "tensor"),                    # H of q/o projections: tensor parallel
    ("kv_heads", "tensor"),                 # K of k/v projections
    ("mlp", "tensor"),                      # F of the SwiGLU weights
    ("expert", "expert"),                   # E of the MoE expert weights: expert parallel
    ("length", None),                       # sequence positions: not split
    ("head_dim", None),                     # G: not split
    ("norm", None),                         # norm scales: replicated
)


def base_config(family: str = "llama", preset: str = "tiny") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                        # model init, batch order (and the data unless data.seed)
  c.init_from_hf = ""              # a Hugging Face folder (e.g. from tst_jax.tools.export) to start from

  c.data = ml_collections.ConfigDict()
  c.data.source = "builtin:pystdlib"  # tokens:<store dir> (read in place) | builtin:pystdlib |
  #   text:<glob> | jsonl:<glob> | parquet:<glob> | tfds:<name> | seqio:<task> (prepared into
  #   <workdir>/data first; big corpora: python -m tst_jax.data.prepare, see docs/data.md)
  c.data.max_bytes = 0              # read at most this many bytes of text (0: all)
  c.data.text_field = "text"        # the JSONL field / Parquet column holding each document
  c.data.tokenizer = "bpe"          # bpe (trained once, kept with the store) | tokenizer.json | .model
  c.data.val_fraction = 0.02        # fraction of the corpus held out for eval (never trained on)
  c.data.val_piece_bytes = 2048     # held out by pieces of <= this many bytes cut at line ends, so
  #   a small corpus's held-out set is many pieces, not ~2% of its files (0: whole documents)
  c.data.seed = -1                  # held-out split, document order, BPE (-1: the run's seed)
  c.data.seq_len = 128              # L: positions the model sees (latent length in phase 1)
  c.data.batch_size = 16            # B: rows per step (global, across all devices)
  c.data.eval_batches = 4           # held-out batches of B x (L + 1) tokens per eval

  c.model = models.preset_config(family, preset)  # every field of the model dataclass

  c.tst = ml_collections.ConfigDict()
  c.tst.bag_size = 4                # S: tokens superposed per bag (1: baseline)
  c.tst.ratio = 0.3                 # r: fraction of steps in phase 1 (0: baseline)
  c.tst.mode = "full"               # full | input_only | output_only (section 5.2 ablation)
  c.tst.weighting = "uniform"       # uniform | power | exponential | first | fitted:<F.json>
  c.tst.variant = "mce"             # mce (the paper's) | alt (-log of the bag's probability)
  c.tst.equal_flops = "seq"         # seq: data length S*L (paper) | batch: S x the rows
  c.tst.reinit_at_switch = False    # re-initialise embedding and head at the switch (ablation)
  c.tst.schedule = ""               # phase 1's stages: '' one (the hard switch) | halve (S, S/2,
  #   ... 2) | 'S1,S2,...'; equal steps and FLOPs per step each, then ntp (docs/results.md)

  c.loss = ml_collections.ConfigDict()
  c.loss.impl = "naive"             # naive (logits) | xla (chunked) | pallas | auto

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.lr = 3e-3             # peak learning rate
  c.optimizer.b1 = 0.9              # AdamW betas, the paper's
  c.optimizer.b2 = 0.95
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.1    # decoupled, not applied to norm scales
  c.optimizer.grad_clip = 1.0       # global-norm clipping
  c.optimizer.warmup_steps = 20     # WSD: linear warmup steps
  c.optimizer.decay_fraction = 0.1  # WSD: linear decay over the last 10% of all steps
  c.optimizer.final_lr_fraction = 0.0  # lr at the end, as a fraction of the peak
  c.optimizer.grad_accum = 1        # micro-batches per optimizer step

  c.train = ml_collections.ConfigDict()
  c.train.steps = 300               # T: total optimizer steps, both phases
  c.train.log_every = 10            # metrics.jsonl cadence (steps)
  c.train.eval_every = 50           # held-out eval cadence (and at each phase end)
  c.train.checkpoint_every = 100    # periodic checkpoints (plus each phase end)
  c.train.keep_checkpoints = 2      # latest N kept, plus the phase-switch checkpoint
  c.train.progress_bar = True       # tqdm bar with the phase and ETA
  c.train.force_resume = False      # resume a workdir whose config differs
  c.train.nan_policy = "stop"       # non-finite loss/grad: stop | skip (the batch, no update)
  c.train.max_nan_skips = 3         # with skip: stop after this many skipped batches

  c.reference = ml_collections.ConfigDict()  # a measured result the final block sets beside
  c.reference.name = ""             # what it is, e.g. "the equal-FLOPs baseline" ("": none)
  c.reference.loss = 0.0            # its final held-out loss (nats/token)
  c.reference.measured = ""         # where and when, e.g. "docs/demo.md: 2-core CPU, 2026-11-25"
  c.reference.command = ""          # the command that measures it again

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1                  # -1: all remaining devices
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.mesh.expert = 1
  c.mesh.dcn_data = 1               # multi-slice: slices (or processes) data spans over DCN
  c.logical_axis_rules = LOGICAL_AXIS_RULES

  c.distributed = ml_collections.ConfigDict()  # multi-process runs, see docs/distributed.md
  c.distributed.mode = "auto"       # auto: on if a coordinator or cluster is found | on | off
  c.distributed.coordinator_address = ""  # host:port of process 0 ("": $JAX_COORDINATOR_ADDRESS)
  c.distributed.num_processes = 0   # 0: $JAX_NUM_PROCESSES or detected
  c.distributed.process_id = -1     # -1: $JAX_PROCESS_ID or detected
  c.distributed.local_device_ids = ""  # comma list of this process's accelerators ("": all visible)
  c.distributed.cpu_devices = 0     # >0: this many CPU devices per process (tests, CPU clusters)
  c.distributed.timeout_s = 300     # seconds to wait for every process to join
  c.distributed.heartbeat_timeout_s = 100  # a process silent this long is dead: others stop
  return c


def paper_base_config(family: str, preset: str) -> ml_collections.ConfigDict:
  """base_config at the paper's scale: a prepared corpus, bf16, remat, the fused loss, FSDP and
  sparse logging. Each paper config sets its recipe (shape, batch, schedule, S, r) on it."""
  c = base_config(family, preset)
  c.data.source = ""                # required: the paper used DCLM; e.g. tokens:/data/tok/dclm-llama3
  c.data.tokenizer = ""             # the Llama-3 tokenizer.json (128,256 tokens); "" with tokens:
  c.data.eval_batches = 16
  c.data.val_fraction = 0.001
  c.data.val_piece_bytes = 0        # web-scale corpora: whole documents held out
  c.model.dtype = "bfloat16"        # bf16 compute, float32 master weights
  c.model.remat = "save_dots"
  c.loss.impl = "auto"              # fused linear + MCE: no [N, V] logits
  c.mesh.data, c.mesh.fsdp = 1, -1  # FSDP over every device, as in the paper
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.checkpoint_every = 1000
  return c


def arms(arg: str) -> list[str]:
  """A config's `:arg`, 'baseline, 20k' -> ['baseline', '20k']."""
  return [part for part in (p.strip() for p in (arg or "").split(",")) if part]


def apply_arms(c: ml_collections.ConfigDict, arg: str, name: str) -> ml_collections.ConfigDict:
  """Sets the arm named by `arg`, every config file's `:arg` (in place, also returned): a comma
  list of 'tst' (the config as written), 'baseline' (r = 0: next-token steps, the same FLOPs),
  'reinit' (fresh embedding and head at the switch), 'input_only' / 'output_only'
  (superposition at one end only), 'smooth' (phase 1 in stages of S, S/2, ... 2:
  tst.schedule='halve'), 's<S>' (bag size), 'r<r>' (step ratio) and '<N>k' (total steps:
  N thousand, e.g. 2k, 1.5k, 0.45k).
  `name` is the config file, for the error message."""
  for part in arms(arg):
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
    else:
      raise ConfigError(f"{name}: unknown arg {part!r}; expected a comma list of tst, baseline, "
                       "reinit, input_only, output_only, smooth, s<S>, r<ratio>, <N>k")
  return c


def arm_steps(part: str) -> int:
  """The steps of a '<N>k' arm: '2k' -> 2000, '1.5k' -> 1500, '0.45k' -> 450; 0 for any other
  text (or one that is not a positive whole number of steps)."""
  if not (part.endswith("k") and _is_float(part[:-1])):
    return 0
  steps = float(part[:-1]) * 1000
  whole = 1 <= steps < 1e12 and abs(steps - round(steps)) < 1e-6    # (not inf or nan)
  return int(round(steps)) if whole else 0


def steps_arm(steps: int) -> str:
  """The '<N>k' arm of `steps` steps (`arm_steps`' inverse): 2000 -> '2k', 450 -> '0.45k'."""
  return f"{steps / 1000:.12g}k"


def _is_float(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True
