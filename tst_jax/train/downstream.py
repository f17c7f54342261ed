"""lm-eval's tasks scored on a tst_jax model in JAX: the adapter, lm-eval's model `tst_jax`,
the paper's preset of tasks, and `InRun`, the tasks of train.eval_tasks scored on the live
parameters. `python -m tst_jax.tools.eval` scores a checkpoint with the same adapter.

lm-eval is an optional dependency (`pip install -e '.[eval]'`): import this module only where
tasks are scored.
"""

from __future__ import annotations

import collections
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

try:
  from lm_eval.api.model import TemplateLM
  from lm_eval.api.registry import register_model
  from lm_eval.models import utils as lm_models_utils
  from lm_eval import utils as lm_utils
except ImportError as e:   # an optional dependency
  raise ImportError("scoring lm-eval tasks needs lm-eval: pip install -e '.[eval]' (or pip "
                    "install lm-eval)") from e

from tst_jax import fileio
from tst_jax.errors import ConfigError
from tst_jax.models.sampling import Sampler, padded_length
from tst_jax.parallel.logical import axis_rules
from tst_jax.rundir import RunDir
from tst_jax.train import trained_run
from tst_jax.config.plan import Phase


# The paper's downstream tasks (section 4: lm-eval, 0-shot) as lm-eval names them, each with
# the metric averaged: acc_norm where lm-eval reports it, acc for BoolQ and Winogrande, which
# have no other. The paper does not say which it reports.
PAPER_TASKS = {"arc_easy": "acc_norm", "arc_challenge": "acc_norm", "boolq": "acc",
               "hellaswag": "acc_norm", "mmlu": "acc", "openbookqa": "acc_norm",
               "piqa": "acc_norm", "winogrande": "acc"}
PAPER_AVERAGE = tuple(t for t in PAPER_TASKS if t != "mmlu")   # the figures' average


def task_list(text: str) -> list[str]:
  """--tasks' comma list, with 'paper' standing for PAPER_TASKS."""
  names = [t for t in text.split(",") if t]
  return list(dict.fromkeys(n for t in names for n in (PAPER_TASKS if t == "paper" else [t])))


def fewshot(text: str, asked: int | None = None) -> int | None:
  """Returns the shots of a --tasks or train.eval_tasks list: `asked`, else 0 with 'paper'
  (the paper's protocol), else None, each task's own."""
  return 0 if asked is None and "paper" in text.split(",") else asked


def paper_average(results: dict) -> float | None:
  """Averages each task's PAPER_TASKS metric over PAPER_AVERAGE, None unless all were run."""
  scores = results.get("results", {})
  if not all(t in scores for t in PAPER_AVERAGE):
    return None
  return float(np.mean([scores[t][f"{PAPER_TASKS[t]},none"] for t in PAPER_AVERAGE]))


@functools.partial(jax.jit, static_argnums=0)
def _score(graphdef, state, inputs_BxL, targets_BxL, mask_BxL):
  """Per row: the summed log-probability of the masked targets, and whether each of them is
  the argmax (lm-eval's `is_greedy`)."""
  logits_BxLxV = nnx.merge(graphdef, state)(inputs_BxL).astype(jnp.float32)
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
  logp_BxL = jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
  greedy_BxL = jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL
  return (jnp.sum(jnp.where(mask_BxL, logp_BxL, 0.0), axis=-1),
          jnp.all(greedy_BxL | ~mask_BxL, axis=-1))


@register_model("tst_jax")
class TstJaxLM(TemplateLM):
  """lm-eval's LM on a tst_jax checkpoint: `--model tst_jax --model_args workdir=W,step=N`
  (after importing this module), or `TstJaxLM(trained=trained_run.load(W))`."""

  def __init__(self, workdir: str | None = None, step: int | None = None,
               batch_size: int | str = 16, max_length: int | None = None,
               max_gen_toks: int = 256, dtype: str | None = None,
               trained: trained_run.Trained | None = None, **harness_args):
    del harness_args   # lm-eval's device / max_batch_size: JAX places the arrays itself
    super().__init__()
    if trained is None:
      if not workdir:
        raise ValueError("TstJaxLM needs workdir= (or trained=)")
      trained = trained_run.load(RunDir(workdir), None if step is None else int(step),
                                 dtype=dtype)
    self.trained, self.tok = trained, trained.tokenizer
    self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16   # "auto": 16
    self._max_length = int(max_length or trained.max_length)
    self.max_gen_toks = int(max_gen_toks)
    self._graphdef, self._state = nnx.split(trained.model)
    self._sampler = None
    self._seed = 0

  @property
  def eot_token_id(self) -> int:
    return self.tok.eos_id

  @property
  def max_length(self) -> int:
    return self._max_length

  @property
  def tokenizer_name(self) -> str:
    return f"tst_jax:{self.trained.rundir}"

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
    del add_special_tokens, kwargs   # the run's tokenizer adds no special tokens
    return self.tok.encode(string)

  def tok_decode(self, tokens) -> str:
    return self.tok.decode(tokens)

  # -- scoring -----------------------------------------------------------------------------
  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    """requests: ((context, continuation) or None, context ids, continuation ids)."""
    del kwargs
    rows = []
    for _, context, continuation in requests:
      if not context or not continuation or len(continuation) > self.max_length:
        raise ValueError(f"bad request: {len(context)} context and {len(continuation)} "
                         f"continuation tokens (max_length {self.max_length})")
      whole = (context + continuation)[-(self.max_length + 1):]   # left-truncated
      rows.append((whole[:-1], whole[1:], len(continuation)))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    results = [None] * len(rows)
    for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm,
                      desc="loglikelihood"):
      batch = order[start:start + self.batch_size]
      width = min(padded_length(len(rows[batch[0]][0])), self.max_length)
      inputs, targets = (np.zeros((self.batch_size, width), np.int32) for _ in range(2))
      mask = np.zeros((self.batch_size, width), bool)
      for r, i in enumerate(batch):   # right-padded: the causal model ignores the padding
        inp, tgt, n_cont = rows[i]
        inputs[r, :len(inp)], targets[r, :len(tgt)] = inp, tgt
        mask[r, len(inp) - n_cont:len(inp)] = True
      logp, greedy = jax.device_get(_score(self._graphdef, self._state, inputs, targets, mask))
      for r, i in enumerate(batch):
        results[i] = (float(logp[r]), bool(greedy[r]))
        if requests[i][0] is not None:
          self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """Scores each text's total log-likelihood in disjoint max-length windows, as lm-eval does."""
    windows, owner = [], []
    for i, (text,) in enumerate(req.args for req in requests):
      for context, continuation in map(lm_utils.make_disjoint_window,
                                       lm_utils.get_rolling_token_windows(
                                           token_list=self.tok_encode(text),
                                           prefix_token=self.prefix_token_id,
                                           max_seq_len=self.max_length, context_len=1)):
        windows.append((None, context, continuation))
        owner.append(i)
    totals = [0.0] * len(requests)
    for i, (logp, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
      totals[i] += logp
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  # -- generation --------------------------------------------------------------------------
  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Generation with the KV-cache sampler, batched by identical generation arguments."""
    if self._sampler is None:
      self._sampler = Sampler(self.trained.model)
    eos = self.tok_decode([self.eot_token_id])
    groups = collections.defaultdict(list)
    for i, req in enumerate(requests):
      groups[json.dumps(req.args[1], sort_keys=True, default=str)].append(i)
    results = [None] * len(requests)
    for indices in tqdm(groups.values(), disable=disable_tqdm, desc="generate_until"):
      kwargs = lm_models_utils.normalize_gen_kwargs(requests[indices[0]].args[1],
                                                    self.max_gen_toks)
      stop = [s for s in lm_models_utils.handle_stop_sequences(kwargs.get("until"), eos=eos)
              if s]
      done = lambda row, ids, stop=stop: any(s in self.tok_decode(ids) for s in stop)
      max_new = kwargs["max_gen_toks"]
      max_context = self.max_length - max_new
      if max_context <= 0:
        raise ValueError(f"max_gen_toks {max_new} leaves no room for a context in the "
                         f"model's max_length {self.max_length}")
      prompts = {i: self.tok_encode(requests[i].args[0])[-max_context:] or
                 [self.prefix_token_id] for i in indices}
      indices = sorted(indices, key=lambda i: -len(prompts[i]))
      for start in range(0, len(indices), self.batch_size):
        batch = indices[start:start + self.batch_size]
        self._seed += 1
        outs = self._sampler.generate(
            [prompts[i] for i in batch], max_new, temperature=kwargs.get("temperature", 0.0),
            top_p=kwargs.get("top_p") or 1.0, seed=self._seed, eos_id=self.eot_token_id,
            done=done)
        for i, ids in zip(batch, outs):
          text = self.tok_decode(ids)
          for s in stop:
            text = text.split(s)[0]
          results[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return results


def task_manager(tasks, include_path=None):
  """Returns lm-eval's TaskManager, of `include_path`'s tasks only when they are all that is
  asked for, because indexing lm-eval's built-in task files is slow."""
  from lm_eval.tasks import TaskManager   # pylint: disable=g-import-not-at-top
  if include_path:
    local = TaskManager(include_path=include_path, include_defaults=False)
    if set(tasks) <= set(local.all_tasks):
      return local
  return TaskManager(include_path=include_path)


def evaluate(lm, tasks, *, num_fewshot=None, limit=None, include_path=None, manager=None,
             bootstrap_iters: int = 100_000) -> dict:
  """Runs lm-eval's `simple_evaluate` of `lm` on `tasks`, names or loaded tasks, local ones
  from `include_path`, or from `manager`, the TaskManager that loaded them."""
  from lm_eval import simple_evaluate   # pylint: disable=g-import-not-at-top
  tasks = list(tasks)
  return simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                         task_manager=manager or task_manager(tasks, include_path),
                         log_samples=False, bootstrap_iters=bootstrap_iters)


def write_results(results: dict, rundir: RunDir, step: int) -> str:
  """Merges `results` into the run's lm-eval record of `step` (one entry per task), and
  returns its path."""
  path = rundir.lm_eval_step(step)
  record = fileio.read_json(path) if fileio.exists(path) else {}
  for section in ("results", "versions", "n-shot", "higher_is_better", "n-samples", "configs"):
    record.setdefault(section, {}).update(results.get(section, {}))
  record.update(workdir=rundir.root, step=step)
  fileio.makedirs(rundir.lm_eval)
  fileio.write_json(path, record, default=lm_utils.handle_non_serializable)
  return path




def task_metrics(results: dict, names: list[str]) -> dict:
  """Returns the scores of each task or group of `names` in lm-eval's `results`, as
  metrics.jsonl names them: tasks/<task>/<metric>, with ',none' (no filter) dropped and a
  filter's name after a '/', and tasks/paper_average where all its tasks ran."""
  record = {}
  for name in names:
    scores = results.get("results", {}).get(name) or results.get("groups", {}).get(name, {})
    for key, value in scores.items():
      if "," in key and isinstance(value, (int, float)) and not isinstance(value, bool):
        metric, _, kept = key.partition(",")
        record[f"tasks/{name}/{metric}" + ("" if kept == "none" else f"/{kept}")] = value
  average = paper_average(results)
  return record | ({} if average is None else {"tasks/paper_average": average})


class InRun:
  """The tasks of train.eval_tasks, loaded once as the run starts, scored on the run's live
  parameters in its ntp phase: every train.eval_tasks_every steps and after its last step.

  A phase-1 model is not scored: it has seen only bags and predicts the next bag, where
  lm-eval's scores are next-token log-likelihoods of single tokens (docs/evaluation.md).
  """

  def __init__(self, spec, trainer, tokenizer, rundir: RunDir):
    """`spec` is the run's RunSpec and `trainer` its step.Trainer."""
    self.settings, self.trainer, self.rundir = spec.train, trainer, rundir
    self.spec, self.tokenizer = spec, tokenizer
    self.names = task_list(spec.train.eval_tasks)
    self.shots = fewshot(spec.train.eval_tasks)
    try:
      self.manager = task_manager(self.names, spec.train.eval_tasks_include or None)
      self.tasks = [t for name in self.names for t in _loaded(self.manager, name)]
    except Exception as e:  # pylint: disable=broad-except
      # lm-eval raises what its task files and datasets raise: a name it does not know, a
      # dataset it cannot download.
      raise ConfigError("train.eval_tasks", f"lm-eval cannot load its tasks: "
                        f"{type(e).__name__}: {' '.join(str(e).split())}") from None

  def due(self, step: int, phase: Phase) -> bool:
    """Says whether the tasks are scored after `step` of `phase`."""
    every, last = self.settings.eval_tasks_every, self.spec.plan.total_steps
    return not phase.is_tst and (step == last or bool(every) and step % every == 0)

  def __call__(self, params, step: int, phase: Phase) -> tuple[dict, dict]:
    """Scores the tasks on `params` after `step`. Returns (metrics.jsonl's fields,
    `task_metrics`, and lm-eval's results)."""
    lm = TstJaxLM(trained=self.trained(params, step, phase),
                  batch_size=self.spec.data.batch_size)
    with axis_rules(self.trainer.mesh, self.spec.run.logical_axis_rules):
      results = evaluate(lm, self.tasks, num_fewshot=self.shots,
                         limit=self.settings.eval_tasks_limit or None, manager=self.manager)
    return task_metrics(results, self.names), results

  def trained(self, params, step: int, phase: Phase) -> trained_run.Trained:
    """Returns the run's model with `params` after `step` of `phase`, as a checkpoint loads."""
    model = nnx.merge(self.trainer.graphdef, params)
    return trained_run.Trained(self.rundir, self.spec.data, self.spec.tst, model,
                               self.tokenizer, step, dict(phase=phase.name))

  def write(self, results: dict, step: int) -> str:
    """Writes lm-eval's `results` of `step` as tools.eval does; returns the file's path."""
    return write_results(results, self.rundir, step)


def _loaded(manager, name: str) -> list:
  """Returns the task or group that `name` names, loaded by `manager`, or a tag's tasks."""
  loaded = manager.load([name])
  if name in loaded["groups"]:
    return [loaded["groups"][name]]
  if name in loaded["tasks"]:
    return [loaded["tasks"][name]]
  return list(loaded["tasks"].values())
