"""Tiny Llama trained with TST on the embedded corpus (the Python standard library), on CPU.

Command (2 CPU cores, Python 3.11: 1 min 55 s measured beside a test run, 2026-12-04):
  python main.py --config configs/demo.py --workdir /tmp/tst_demo
Expected: phase 1 (S=4, 90 steps) then phase 2 (210 steps); final held-out next-token loss
4.288 nats/token (seeds 0-2: 4.277 ± 0.061), below the phase-1 end eval (6.091) and the
unigram entropy (6.42); see docs/demo.md. At this size TST ends behind its equal-FLOPs
baseline (3.804 ± 0.092 over seeds 0-2, printed beside the run's own loss in the final block;
paired by seed, +0.473 ± 0.087), as the plan warns: on 2 CPU cores no setting was found
where TST wins (docs/demo.md, "TST on CPU: the ladder"). The corpus is the running Python's
standard library: on another Python the run reads other data, and its final block prints no
difference from these losses. Baseline arm (r = 0, same FLOPs per step):
  python main.py --config configs/demo.py:baseline --workdir /tmp/tst_demo_baseline
Multi-token prediction arm, Gloeckle et al.'s k = 2 heads at the baseline's FLOPs (197 steps;
4.588 measured, `mtp2-ds` 4.035; docs/results.md, "TST against multi-token prediction"):
  python main.py --config configs/demo.py:mtp2 --workdir /tmp/tst_demo_mtp2
"""

from tst_jax.config import defaults

MEASURED = "docs/demo.md: seeds 0-2, 2-core CPU, 2026-12-07; the host moves a run by up to 0.08"
# The final held-out losses of the two arms, measured: mean and sd over seeds 0, 1, 2.
TST_LOSS, TST_SD = 4.2772, 0.0606
BASELINE_LOSS, BASELINE_SD = 3.8043, 0.0919
DATA = "builtin:pystdlib@3.11"             # on Python 3.11's standard library


def get_config(arg: str = ""):
  c = defaults.base_config("llama", "tiny")  # D 128, 4 layers, 4 / 2 heads, F 384: 1.84M params
  # data: the embedded Python standard library, BPE-tokenized
  c.data.max_bytes = 6_000_000      # a 6 MB slice of the stdlib keeps tokenizing fast
  c.data.seq_len = 128              # L
  c.data.batch_size = 16            # B
  c.model.vocab_size = 4096         # BPE trained to this size on the training documents
  # tst
  c.tst.bag_size = 4                # S
  c.tst.ratio = 0.3                 # r: 90 of 300 steps in phase 1
  # optimizer: AdamW, WSD (linear warmup, constant, linear decay)
  c.optimizer.lr = 3e-3
  c.optimizer.warmup_steps = 20
  c.optimizer.decay_fraction = 0.1  # the last 10% of the steps
  # train
  c.train.steps = 300               # T: both phases
  c = defaults.apply_arms(c, arg, "configs/demo.py")
  # reference: the other arm's final loss, printed beside this run's in the final block
  # for this config as written (run=): with a --config override of its seed, steps, model,
  # tst, data, optimizer, loss or mtp the final block says which differs and prints no
  # difference
  if c.tst.ratio == 0.0 and arg.replace(" ", "") == "baseline":
    c.reference.update(name="TST (configs/demo.py)", loss=TST_LOSS, loss_sd=TST_SD, seeds=3,
                       measured=MEASURED, data=DATA,
                       command="python main.py --config configs/demo.py --workdir /tmp/tst_demo",
                       run=defaults.as_written(c))
  elif not arg:
    c.reference.update(name="its equal-FLOPs baseline (configs/demo.py:baseline)",
                       loss=BASELINE_LOSS, loss_sd=BASELINE_SD, seeds=3, measured=MEASURED,
                       data=DATA,
                       command="python main.py --config configs/demo.py:baseline "
                               "--workdir /tmp/tst_demo_baseline", run=defaults.as_written(c))
  return c
