"""The native lm-eval adapter against lm-eval's own `hf` model on the exported folder: the same
loglikelihoods, rolling loglikelihoods, greedy generations and task accuracy (local task)."""

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")   # the task's data is local; never download
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from tests.fixtures import trained  # noqa: E402
from tests.fixtures import subprocess_env  # noqa: E402
from tests.fixtures.paths import ROOT, TESTDATA  # noqa: E402
from tst_jax import fileio  # noqa: E402
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run  # noqa: E402
from tst_jax.train import downstream
from tst_jax.tools import eval as tst_eval, export  # noqa: E402

TASK_DIR = os.path.join(TESTDATA, "mc_task")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained.workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def models(workdir, tmp_path_factory):
  """(native, hf): the final checkpoint in JAX, and its export through transformers."""
  hf_dir = export.export(workdir, tmp_path_factory.mktemp("lm_eval") / "hf")
  native = tst_eval.TstJaxLM(trained=trained_run.load(RunDir(workdir)), batch_size=4)
  hf = HFLM(pretrained=str(hf_dir), dtype="float32", batch_size=4, device="cpu")
  assert hf.max_length == native.max_length == trained.config().data.seq_len
  return native, hf


def _requests(kind, args):
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def _task_pairs():
  with open(os.path.join(TASK_DIR, "mc.jsonl")) as f:
    docs = [json.loads(line) for line in f]
  return [(d["context"], choice) for d in docs for choice in d["choices"]]


def test_loglikelihoods_match_hf(models):
  native, hf = models
  pairs = _task_pairs() + [
      ("", "def f(x):"),                               # empty context: conditioned on EOS
      ("x = [" + "1, " * 40, "2]"),                    # longer than max_length: left-truncated
      ("import os\n", "import sys\nimport json\n"),
  ]
  ours = native.loglikelihood(_requests("loglikelihood", pairs))
  theirs = hf.loglikelihood(_requests("loglikelihood", pairs))
  for (a, greedy_a), (b, greedy_b) in zip(ours, theirs, strict=True):
    assert a == pytest.approx(b, abs=1e-3) and greedy_a == greedy_b
  # Batching and padding do not change a score.
  one_by_one = tst_eval.TstJaxLM(trained=native.trained, batch_size=1)
  alone = one_by_one.loglikelihood(_requests("loglikelihood", pairs[-3:]))
  assert [x for x, _ in alone] == pytest.approx([x for x, _ in ours[-3:]], abs=1e-5)


def test_rolling_loglikelihood_and_greedy_generation_match_hf(models):
  native, hf = models
  texts = [("import os\nimport sys\n" * 8,), ("hi",), ("def main():\n    return 0\n",)]
  ours = native.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
  theirs = hf.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
  assert ours == pytest.approx(theirs, abs=1e-3)

  gen = dict(until=["\n\n"], max_gen_toks=8, do_sample=False)
  prompts = [("def main(", gen), ("import os\nclass Foo:\n    def", gen), ("for i in", gen)]
  ours = native.generate_until(_requests("generate_until", prompts))
  assert ours == hf.generate_until(_requests("generate_until", prompts))
  assert all(isinstance(text, str) for text in ours)


def test_same_accuracy_on_the_local_task(models):
  native, hf = models
  results = [tst_eval.evaluate(lm, ["tst_mc"], include_path=TASK_DIR, bootstrap_iters=0)
             ["results"]["tst_mc"] for lm in (native, hf)]
  assert results[0]["acc,none"] == results[1]["acc,none"]
  assert results[0]["acc_norm,none"] == results[1]["acc_norm,none"]
  assert results[0]["sample_len"] == 10


def test_cli_prints_the_table_and_writes_results(workdir, capsys):
  tst_eval.main(["--workdir", workdir, "--tasks", "tst_mc", "--include_path", TASK_DIR,
                 "--limit", "4", "--batch_size", "4"])
  out = capsys.readouterr().out
  assert "tst_mc" in out and "acc" in out
  path = os.path.join(workdir, "lm_eval", f"step_{trained.FINAL_STEP}.json")
  with open(path) as f:
    record = json.load(f)
  assert record["step"] == trained.FINAL_STEP and "acc,none" in record["results"]["tst_mc"]


def test_a_run_in_a_bucket_gets_its_results_in_the_bucket(workdir, bucket, capsys):
  """The results of a run in a bucket go into its lm_eval folder there, as on the disk."""
  remote = trained.in_bucket(workdir, bucket)
  tst_eval.main(["--workdir", remote, "--tasks", "tst_mc", "--include_path", TASK_DIR,
                 "--limit", "4", "--batch_size", "4"])
  path = fileio.join(remote, "lm_eval", f"step_{trained.FINAL_STEP}.json")
  assert f"results: {path}" in capsys.readouterr().out
  record = fileio.read_json(path)
  assert record["step"] == trained.FINAL_STEP and record["workdir"] == remote
  assert "acc,none" in record["results"]["tst_mc"]


@pytest.mark.slow
def test_a_task_whose_dataset_is_unreachable_is_one_line(workdir):
  """lm-eval's own download of arc_easy, with the Hub unreachable (offline mode, which fails at
  once where a missing network retries for half a minute): one error line, exit 2."""
  env = dict(subprocess_env.one_cpu_device(), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
  out = subprocess.run([sys.executable, "-m", "tst_jax.tools.eval", "--workdir", workdir,
                        "--tasks", "arc_easy", "--limit", "2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 2 and out.stderr.splitlines()[-1] == out.stderr.strip(), out.stderr
  assert out.stderr.startswith("error: --tasks arc_easy: Couldn't reach 'allenai/ai2_arc' on "
                               "the Hub") and "--include_path" in out.stderr, out.stderr


def test_paper_tasks_run_0_shot_and_print_the_7_task_average(workdir, capsys, monkeypatch):
  """--tasks paper asks lm-eval for the paper's eight tasks 0-shot and prints the mean of the
  seven without MMLU; lm-eval's answer is stood in for (its datasets are downloads)."""
  asked = {}
  scores = {"arc_easy": 0.50, "arc_challenge": 0.25, "boolq": 0.60, "hellaswag": 0.30,
            "mmlu": 0.99, "openbookqa": 0.20, "piqa": 0.65, "winogrande": 0.52}

  def fake_evaluate(lm, tasks, **kwargs):
    asked.update(tasks=tasks, **kwargs)
    return {"results": {t: {f"{downstream.PAPER_TASKS[t]},none": v, "alias": t}
                        for t, v in scores.items()}}

  monkeypatch.setattr(tst_eval, "evaluate", fake_evaluate)
  monkeypatch.setattr(tst_eval.lm_utils, "make_table", lambda results: "table")
  tst_eval.main(["--workdir", workdir, "--tasks", "paper", "--limit", "4"])
  assert asked["tasks"] == ["arc_easy", "arc_challenge", "boolq", "hellaswag", "mmlu",
                            "openbookqa", "piqa", "winogrande"]
  assert asked["num_fewshot"] == 0
  mean = (0.50 + 0.25 + 0.60 + 0.30 + 0.20 + 0.65 + 0.52) / 7     # MMLU's 0.99 left out
  assert (f"the paper's average of 7 tasks (arc_easy, arc_challenge, boolq, hellaswag, "
          f"openbookqa, piqa, winogrande; 0-shot): {mean:.4f}") in capsys.readouterr().out
  assert tst_eval.task_list("paper,tst_mc,boolq")[-1] == "tst_mc"
  assert tst_eval.paper_average({"results": {"boolq": {"acc,none": 1.0}}}) is None

