"""A run's directory: its root, fixed once as an absolute path or a URL, and the path of every
file and folder a run writes there, each a named member.

The root is a local folder or a bucket's URL such as gs://bucket/run, and whether it is remote
is asked once, here. Every other module takes a RunDir and asks it for a path by name; none
joins a file's name onto the root itself. The readers and writers of the records are in
run/workdir.py.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from tst_jax import fileio


def _path(*parts_and_doc: str) -> property:
  """Returns the member of a RunDir that is the path of `parts` under its root, documented by
  the last argument."""
  *parts, doc = parts_and_doc
  return property(lambda rundir: rundir._at(*parts),   # pylint: disable=protected-access
                  doc=f"{'/'.join(parts)}: {doc}.")


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The directory of one run: `RunDir("~/runs/a")` or `RunDir("gs://bucket/run")`. A local
  root is made absolute with ~ expanded, a URL is kept as it is. Prints as its root."""
  root: str
  remote: bool = dataclasses.field(init=False)   # a bucket's, read and written through fsspec

  def __post_init__(self):
    root = fileio.absolute(os.fspath(self.root))
    object.__setattr__(self, "root", root)
    object.__setattr__(self, "remote", fileio.is_url(root))

  def __str__(self) -> str:
    return self.root

  def _at(self, *names: str) -> str:
    return fileio.join(self.root, *names)

  @property
  def name(self) -> str:
    """Names the run by its folder's last part, as trackers and reports do."""
    return fileio.basename(self.root)

  # The run's records: one reader and one writer each, in run/workdir.py.
  config = _path("config.json", "the config the run trains with, `auto` fields resolved")
  plan = _path("plan.json", "the PlanRecord: phases, training tokens, resolved `auto` choices")
  metrics = _path("metrics.jsonl", "one JSON object per train or eval line")
  store = _path("store.json", "the token store the run trains on: fingerprint, folder, tokens")
  summary = _path("summary.json", "the finished run's final losses and token counts")
  lock = _path("lock.json", "the live run that holds the directory: host, pid, start, heartbeat")
  tracker = _path("tracker.json", "which run of train.tracker this run logs to")
  goodput = _path("goodput.jsonl", "each session's wall time by category, kept across restarts")

  # What the run writes beside its records.
  checkpoints = _path("checkpoints", "Orbax's steps")
  tensorboard = _path("tensorboard", "the TensorBoard event files")
  # Outside tensorboard/, so that TensorBoard never reads a part that a killed run left behind.
  parts = _path(".parts", "in a bucket, the new bytes of an appended file on their way onto "
                "it (run/appending.py)")
  loss_plot = _path("loss.png", "the finished run's losses")
  profile = _path("profile", "the jax.profiler trace of train.profile_steps and its tables")
  profile_table = _path("profile", "step_profile.txt", "milliseconds per step by category")
  profile_json = _path("profile", "step_profile.json", "the same, with the top ops")
  tokenizer_json = _path("tokenizer.json", "the copy of the run's tokenizer that the tools read")
  tokenizer_model = _path("tokenizer.model", "the copy of a SentencePiece run's tokenizer")
  lm_eval = _path("lm_eval", "lm-eval's results, of tools.eval and of train.eval_tasks")
  data = _path("data", "the token store prepared from data.source")

  # What tools.sweep writes into each point's run.
  sweep_point = _path("sweep_point.json", "the sweep's record of the point: status, arm, seed")
  sweep_log = _path("sweep_log.txt", "the output of the point's trainer")

  def checkpoint(self, step: int) -> str:
    """Returns the folder of the checkpoint of `step`, checkpoints/<step>."""
    return self._at("checkpoints", str(step))

  def lm_eval_step(self, step: int) -> str:
    """Returns the file of lm-eval's results of checkpoint or step `step`."""
    return self._at("lm_eval", f"step_{step}.json")

  def mixture_data(self, k: int) -> str:
    """Returns the token store prepared from source `k` of data.mixture, mixture/<k>/data."""
    return self._at("mixture", str(k), "data")

  def eval_set_data(self, name: str) -> str:
    """Returns the token store prepared from the set `name` of data.eval_sets,
    eval_sets/<name>/data."""
    return self._at("eval_sets", name, "data")

  def trace_dir(self) -> str:
    """Returns the folder jax.profiler traces into: `profile`, or a new local folder for a
    run in a bucket, since the profiler writes local files only."""
    return tempfile.mkdtemp(prefix="tst_jax_profile_") if self.remote else self.profile

  def check_writable(self):
    """Raises one PathError where no run can be written here: a store other than gs://, a
    bucket name GCS refuses, a file in the way, no permission or no bucket. The folder is
    made later, once the config has passed every check. In a bucket a probe object is written
    and removed: no other test shows that these credentials may write there."""
    fileio.check_output(self.root, "--workdir", "a run's workdir", fileio.RUN_STORES,
                        remedy="give a new directory, or a run's directory to resume it")
