"""train.eval_tasks (tst_jax/train/downstream.py): lm-eval's tasks scored on the live
parameters inside a tiny two-phase run, offline on the local task; the scores are those of
tools.eval on the run's final checkpoint; a phase-1 model is not scored; a task lm-eval cannot
load is one error line."""

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")   # the task's data is local; never download
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from tests.fixtures.paths import TESTDATA  # noqa: E402
from tests.fixtures.tiny import tiny_config  # noqa: E402
from tst_jax import errors  # noqa: E402
from tst_jax.errors import ConfigError  # noqa: E402
from tst_jax.rundir import RunDir
from tst_jax import cli  # noqa: E402
from tst_jax.config import spec as spec_lib
from tst_jax.train import trained_run
from tst_jax.train import downstream
from tst_jax.run import workdir as workdir_lib  # noqa: E402

TASK_DIR = os.path.join(TESTDATA, "mc_task")


def tasks_config(**train):
  """The tiny run (12 steps, the switch after 6) scoring the local task every 4 steps, at
  data.seq_len 32: its longest answer is 17 tokens."""
  return tiny_config(data=dict(seq_len=32),
                     train=dict(eval_tasks="tst_mc", eval_tasks_include=TASK_DIR,
                                eval_tasks_every=4) | train)


@pytest.mark.slow
def test_tasks_are_scored_in_the_run_as_tools_eval_scores_its_checkpoint(tmp_path, capsys,
                                                                         monkeypatch):
  """Scored every 2 steps of the next-token phase, 8 to 12, never in phase 1; each score in
  metrics.jsonl (and so TensorBoard and the tracker), on the console and in
  lm_eval/step_<N>.json; at the last step, with no checkpoint read, the accuracies tools.eval
  gives the final checkpoint. A scoring that fails, here at step 8, is one line, and the run
  goes on."""
  score = downstream.InRun.__call__

  def fail_at_step_8(self, params, step, phase):
    if step == 8:
      raise ValueError("bad request: 8 context and 40 continuation tokens (max_length 32)")
    return score(self, params, step, phase)
  monkeypatch.setattr(downstream.InRun, "__call__", fail_at_step_8)
  cli.run(tasks_config(eval_tasks_every=2), str(tmp_path))
  scored = [r for r in workdir_lib.read_metrics(RunDir(tmp_path)) if "tasks_s" in r]
  assert [(r["step"], r["phase"]) for r in scored] == [(10, "ntp"), (12, "ntp")]
  for r in scored:
    assert 0 <= r["tasks/tst_mc/acc"] <= 1 and 0 <= r["tasks/tst_mc/acc_norm"] <= 1
    assert "tasks/tst_mc/acc_stderr" in r and r["data_tokens"] > 0
  assert sorted(os.listdir(RunDir(tmp_path).lm_eval)) == ["step_10.json", "step_12.json"]
  with open(RunDir(tmp_path).lm_eval_step(12)) as f:
    assert json.load(f)["results"]["tst_mc"]["sample_len"] == 10
  out = capsys.readouterr().out
  assert ("tasks step 8: not scored: ValueError: bad request: 8 context and 40 continuation "
          "tokens (max_length 32)\n") in out
  last = scored[-1]
  assert ("tasks step 12 (") in out and (f"tst_mc acc {last['tasks/tst_mc/acc']:.4f}, "
                                          f"acc_norm {last['tasks/tst_mc/acc_norm']:.4f}") in out
  lm = downstream.TstJaxLM(trained=trained_run.load(RunDir(tmp_path), 12), batch_size=4)
  tool = downstream.evaluate(lm, ["tst_mc"], include_path=TASK_DIR)["results"]["tst_mc"]
  assert last["tasks/tst_mc/acc"] == tool["acc,none"]
  assert last["tasks/tst_mc/acc_norm"] == tool["acc_norm,none"]


def test_a_task_lm_eval_cannot_load_is_one_config_error(tmp_path):
  """The tasks load as the run's loop starts (Setup.load_tasks), before its first step: a
  task whose data cannot be read, as a dataset that cannot be downloaded offline, is one line
  naming train.eval_tasks and why."""
  with open(os.path.join(TASK_DIR, "tst_mc.yaml")) as f:
    yaml = f.read().replace("task: tst_mc", "task: tst_gone").replace("mc_data.load",
                                                                      "gone.load")
  (tmp_path / "tst_gone.yaml").write_text(yaml)
  (tmp_path / "gone.py").write_text("def load(**kwargs):\n  raise FileNotFoundError("
                                    "'no such dataset: gone.jsonl')\n")
  spec = spec_lib.check(tasks_config(eval_tasks="tst_gone", eval_tasks_include=str(tmp_path)))
  with pytest.raises(ConfigError) as caught:
    downstream.InRun(spec, None, None, RunDir(tmp_path))
  assert caught.value.field == "train.eval_tasks"
  assert "FileNotFoundError: no such dataset: gone.jsonl" in str(caught.value)
  assert errors.one_line(caught.value).count("\n") == 0


def test_the_include_folder_must_be_a_local_folder(tmp_path):
  spec = spec_lib.check(tasks_config(eval_tasks_include=str(tmp_path / "none")))
  with pytest.raises(ConfigError, match="is not a local folder") as caught:
    spec.check_paths()
  assert caught.value.field == "train.eval_tasks_include"


def test_task_metrics_name_each_task_metric_and_filter_and_the_paper_average():
  results = {"results": {
      "tst_mc": {"alias": "tst_mc", "acc,none": 0.5, "acc_stderr,none": 0.1, "sample_len": 10},
      "gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": "N/A"},
      **{t: {f"{m},none": 0.5} for t, m in downstream.PAPER_TASKS.items()}}}
  got = downstream.task_metrics(results, ["tst_mc", "gsm8k", "boolq"])
  assert got == {"tasks/tst_mc/acc": 0.5, "tasks/tst_mc/acc_stderr": 0.1,
                 "tasks/gsm8k/exact_match/strict-match": 0.25, "tasks/boolq/acc": 0.5,
                 "tasks/paper_average": 0.5}
  assert downstream.fewshot("paper,tst_mc") == 0 and downstream.fewshot("tst_mc") is None
  assert downstream.fewshot("paper", 5) == 5
