"""Bad input as a user meets it: every config override either plans (and its train steps
trace) or is a ConfigError naming a field; main.py turns user errors into one line, exit 2."""

import ast
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.fixtures.corpus import bad_files
from tests.fixtures.fields import BASES, FIELDS
from tests.fixtures import subprocess_env
from tests.fixtures.paths import ROOT, TINY_CONFIG
from tests.fixtures.tiny import tiny_config
from tst_jax import configlib
from tst_jax.errors import ConfigError, UserError, config_name
from tst_jax.config import spec as spec_lib
from tst_jax.train import step as step_lib

DEFAULTS = {family: make() for family, make in BASES.items()}
# Raw override strings: boundaries, wrong types, every option name of the surface, paths.
OPTIONS = ["auto", "naive", "xla", "pallas", "cudnn", "ragged", "blocked", "dense", "full",
           "input_only", "output_only", "seq", "batch", "mce", "alt", "uniform", "power",
           "exponential", "first", "fitted:/nonexistent.json", "stop", "skip", "on", "off",
           "none", "save_dots", "save_experts", "bfloat16", "float16", "float32", "default",
           "fp8", "llama", "qwen3_moe", "bpe", "/nonexistent/tokenizer.json", "x.model",
           "text:/nonexistent/*.txt", "builtin:pystdlib", "bogus", ""]
NUMBERS = ["-5", "-1", "0", "1", "2", "3", "4", "6", "8", "12", "16", "64", "100", "4096",
           "0.0", "0.5", "0.999", "1.0", "1.5", "-0.5", "1e-9", "nan", "inf", "-inf"]
ODD = ["True", "False", "None", "abc", "(1, 2)", "()", "((\"batch\", \"bogus\"),)", "[1]",
       "0,1", "1,x"]
# Python values a notebook could assign (ConfigDict accepts None and bools in any field).
PYTHON = [None, True, False, float("nan"), float("inf")]
NAMES_A_FIELD = re.compile(r"^(config\.[\w.]+|--\w+)[ :]")
OUTCOMES = collections.Counter()


def _of_its_type(family, field):
  """Raw values of the field's own type (often valid): its default, then candidates."""
  section, _, name = field.rpartition(".")
  value = (DEFAULTS[family][section] if section else DEFAULTS[family])[name]
  if isinstance(value, bool):
    return ["True", "False"]
  if isinstance(value, int):
    return [str(value), "0", "1", "2", "3", "4", "8", "16", "-1"]
  if isinstance(value, float):
    return [str(value), "0.0", "1e-3", "0.1", "0.5", "1.0", "2.0"]
  if isinstance(value, str):
    return [value] + OPTIONS
  return [str(value)] + ODD


@st.composite
def overrides(draw):
  """1-3 (field, value) pairs: a raw string through configlib (the --set / --config.x path),
  mostly of the field's type, sometimes of any; or a Python value assigned directly."""
  family = draw(st.sampled_from(sorted(BASES)))
  picks = []
  for _ in range(draw(st.integers(1, 3))):
    field = draw(st.sampled_from(FIELDS[family]))
    kind = draw(st.integers(0, 9))
    if kind == 0:
      picks.append((field, draw(st.sampled_from(PYTHON))))
    elif kind <= 2:
      picks.append((field, draw(st.sampled_from(OPTIONS + NUMBERS + ODD))))
    else:
      picks.append((field, draw(st.sampled_from(_of_its_type(family, field)))))
  return family, picks


def _apply(config, picks) -> bool:
  """False when ConfigDict's own type check refuses a Python value at assignment."""
  for field, value in picks:
    if isinstance(value, str):
      configlib.apply_overrides(config, [f"{field}={value}"])
      continue
    section, _, name = field.rpartition(".")
    try:
      (config[section] if section else config)[name] = value
    except TypeError:
      return False
  return True


def _build_and_trace(spec):
  """What Setup builds before compiling: mesh, shardings, parallel checks, then each phase's
  train step traced abstractly (no compile, no data)."""
  trainer = step_lib.Trainer.of(spec)
  trainer.check()
  for phase in spec.plan.phases:
    train_step = step_lib.make_train_step(
        trainer.graphdef, phase, spec.loss, trainer.tx, trainer.schedule,
        spec.optimizer.grad_accum)
    jax.eval_shape(train_step, trainer.abstract,
                   jax.ShapeDtypeStruct((phase.batch_size, phase.window), "int32"))


def _check(family, picks):
  config = BASES[family]()
  try:
    if not _apply(config, picks):
      OUTCOMES["refused by ConfigDict's type check"] += 1
      return
    spec = spec_lib.build(config, num_devices=jax.device_count())
    spec.check_paths()
    _build_and_trace(spec)
  except ConfigError as e:
    assert NAMES_A_FIELD.match(str(e)), (picks, str(e))
    assert str(e).startswith(f"{config_name(e.field)}: "), (picks, str(e))
    named = NAMES_A_FIELD.match(str(e)).group(1).removeprefix("config.")
    assert named.startswith("-") or named.split(".")[0] in config, (picks, str(e))
    OUTCOMES["config error naming a field"] += 1
    return
  OUTCOMES["plans, lays out and traces"] += 1


def _run_property(max_examples):
  OUTCOMES.clear()

  @settings(max_examples=max_examples, deadline=None, derandomize=True,
            suppress_health_check=list(HealthCheck))
  @given(overrides())
  def property_holds(case):
    _check(*case)

  property_holds()
  print(f"\n{sum(OUTCOMES.values())} override sets: {dict(OUTCOMES)}")
  assert OUTCOMES["config error naming a field"] and OUTCOMES["plans, lays out and traces"]


def test_config_overrides_plan_or_name_a_field():
  _run_property(25)


@pytest.mark.slow
def test_config_overrides_plan_or_name_a_field_many():
  _run_property(1000)


@pytest.mark.parametrize("picks,message", [
    ([("loss.impl", "foo")], "config.loss.impl: must be one of"),
    ([("mesh.data", "3")], r"config.mesh: .*3 devices do not divide the 8"),
    ([("optimizer.lr", "nan")], "config.optimizer.lr: must be a number > 0"),
    ([("model.n_heads", "3")], "config.model.dim: 32 is not divisible by n_heads 3"),
    ([("model.vocab_size", "100")], "config.model.vocab_size: 100 is too small"),
    ([("distributed.heartbeat_timeout_s", "0")], "config.distributed.heartbeat_timeout_s"),
    ([("logical_axis_rules", "((\"batch\", \"bogus\"),)")], "config.logical_axis_rules"),
    ([("data.seed", None)], "config.data.seed: must be an integer >= -1, got None"),
    ([("data.text_field", None)], "config.data.text_field: must be a string"),
    ([("data.mixture", "bogus")], "config.data.mixture: must be '' or source=weight"),
    ([("data.tst_mixture", "a=0")], "config.data.tst_mixture: must be '' or source=weight"),
    ([("train.eval_tasks", "arc_easy,a b")], "config.train.eval_tasks: must be '' or a comma"),
    ([("train.eval_tasks", "arc_easy,,boolq")], "config.train.eval_tasks: must be '' or a"),
    ([("train.eval_tasks_every", "-1")], "config.train.eval_tasks_every: must be an integer"),
    ([("train.eval_tasks_every", "100")], "config.train.eval_tasks_every: needs train.eval_tas"),
    ([("train.eval_tasks_include", None)], "config.train.eval_tasks_include: must be a string"),
    ([("train.eval_tasks_include", "/x")], "config.train.eval_tasks_include: needs train.eval"),
    ([("train.eval_tasks_limit", "-3")], "config.train.eval_tasks_limit: must be an integer"),
    ([("train.eval_tasks", "paper"), ("tst.ratio", "1.0")],
     "config.train.eval_tasks: the run has no next-token phase"),
])
def test_examples_name_their_field(picks, message):
  config = tiny_config()
  with pytest.raises(ConfigError, match=message):
    _apply(config, picks)
    spec_lib.check(config).on_platform().check_devices(8)


ENV = subprocess_env.one_cpu_device()


def _main(*args, config=TINY_CONFIG):
  return subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--config", config,
                         *args], env=ENV, capture_output=True, text=True, timeout=300)


def _start_main(*args, config=TINY_CONFIG):
  return subprocess.Popen([sys.executable, os.path.join(ROOT, "main.py"), "--config", config,
                           *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


ONE_LINE_ERRORS = [
    ("--config.model.n_heads=3", "error: config.model.dim: 32 is not divisible by n_heads 3"),
    ("--config.tst.mode=bogus", "error: config.tst.mode: must be one of"),
    ("--config.loss.impl=foo", "error: config.loss.impl: must be one of"),
    ("--config.data.tokenizer=/nonexistent.json",
     "error: config.data.tokenizer: file '/nonexistent.json' does not exist"),
    ("--config.data.source=text:/nonexistent/**/*.txt",
     "error: config.data.source: '/nonexistent/**/*.txt' matches no files"),
    ("--config.model.n_heads=abc", "error: flag --config.model.n_heads=abc"),
    ("--config.tst.nope=1", "error: --config.tst.nope: the config has no field 'nope'"),
    ("--config.data.mixture_stages=0:a=1",
     "error: config.data.mixture_stages: needs data.mixture"),
    ("--config.train.eval_tasks_every=4",
     "error: config.train.eval_tasks_every: needs train.eval_tasks"),
]


@pytest.fixture(scope="module")
def one_line_runs(tmp_path_factory):
  """Runs main.py with each flag of ONE_LINE_ERRORS, all at once: each run is mostly Python
  start-up, which the processes share out over the cores. Returns {flag: (workdir, result)}."""
  started = {}
  for flag, _ in ONE_LINE_ERRORS:
    workdir = tmp_path_factory.mktemp("one_line") / "run"
    started[flag] = workdir, _start_main("--workdir", str(workdir), flag)
  runs = {}
  for flag, (workdir, proc) in started.items():
    out, err = proc.communicate(timeout=300)
    runs[flag] = workdir, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
  return runs


@pytest.mark.slow
@pytest.mark.parametrize("flag,message", ONE_LINE_ERRORS)
def test_main_reports_one_line_and_exit_2(one_line_runs, flag, message):
  workdir, result = one_line_runs[flag]
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(message), result.stderr
  assert not workdir.exists()


@pytest.mark.parametrize("name", ["truncated.jsonl.gz", "garbage.jsonl.zst", "text.parquet"])
def test_a_corrupt_input_file_is_one_line_naming_it(tmp_path, name):
  path = bad_files(tmp_path / "bad")[name]
  kind = "parquet" if name.endswith(".parquet") else "jsonl"
  result = _main("--workdir", str(tmp_path / "run"), f"--config.data.source={kind}:{path}")
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(f"error: {path}: cannot be read to its end"), result.stderr


@pytest.mark.slow
def test_workdir_faults_are_one_line(tmp_path):
  """A workdir that is a file; a workdir's copy of the tokenizer that is corrupt, or the
  store's tokenizer changed (each named, with the way out, and left as it was);
  --verbosity=1 adds the traceback."""
  afile = tmp_path / "afile"
  afile.write_text("x")
  result = _main("--workdir", str(afile))
  assert result.returncode == 2
  assert result.stderr.strip() == (f"error: --workdir {afile}: is a file, not a directory: "
                                   "give a new directory, or a run's directory to resume it")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tokenizer.json").write_text("{not json")
  result = _main("--workdir", str(workdir), "--config.train.steps=1")
  assert result.returncode == 2
  assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
  assert result.stderr.startswith(f"error: {workdir / 'tokenizer.json'}: cannot be read as a "
                                  "tokenizer.json"), result.stderr
  assert "restore it from a copy or delete it" in result.stderr
  assert (workdir / "tokenizer.json").read_text() == "{not json"
  # The token store's own tokenizer, changed after the store was made: named, left as it is.
  (workdir / "tokenizer.json").unlink()
  store_tokenizer = workdir / "data" / "tokenizer.json"
  text = store_tokenizer.read_text()
  store_tokenizer.write_text(text.replace('"<|endoftext|>"', '"<|eot|>"', 1) + " ")
  result = _main("--workdir", str(workdir), "--config.train.steps=1")
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"error: {store_tokenizer}"), result.stderr
  assert not (workdir / "checkpoints").exists()
  assert not (workdir / "checkpoints").exists()
  debug = _main("--workdir", str(workdir), "--verbosity=1")
  assert debug.returncode == 2 and "Traceback" in debug.stderr
  assert any(line.startswith("error: ") for line in debug.stderr.splitlines())


def test_environment_os_errors_are_one_line(capsys):
  import errno

  def full():
    raise OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl")

  def bug():
    raise KeyError("a bug keeps its traceback")

  from tst_jax import errors
  with pytest.raises(SystemExit) as stop:
    errors.main(full)
  assert stop.value.code == 2
  assert capsys.readouterr().err == ("error: /run/metrics.jsonl: the disk is full: free space, "
                                     "then run the same command again\n")
  with pytest.raises(KeyError):
    errors.main(bug)
  assert issubclass(ConfigError, UserError)


@pytest.mark.slow
def test_data_store_faults_are_one_line_and_nothing_is_overwritten(tmp_path):
  """A truncated or missing shard of the run's store, and another store copied over it: one
  line naming the shard or the store, exit 2, no file of the store rewritten and no
  checkpoint added (a tokens: store changed under a workdir: data/test_store.py)."""
  workdir = tmp_path / "run"
  args = ("--workdir", str(workdir), "--config.train.steps=2")
  # Another store (prepared with another data.seed), its run beside the first on another core.
  other = tmp_path / "other"
  other_run = _start_main("--workdir", str(other), "--config.train.steps=2",
                          "--config.data.seed=7")
  assert _main(*args).returncode == 0
  store = workdir / "data"
  shard = store / "train-00000.bin"
  checkpoints = sorted(os.listdir(workdir / "checkpoints"))
  data = shard.read_bytes()
  shard.write_bytes(data[:-6])
  result = _main(*args)
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"error: shard {shard} has {len(data) - 6} bytes, its "
                                  "manifest says"), result.stderr
  assert shard.read_bytes() == data[:-6]
  shard.unlink()
  result = _main(*args)
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"error: shard {shard} of the store {store} is missing")
  assert not shard.exists()
  shard.write_bytes(data)
  # Another store in the workdir's place.
  other_run.communicate(timeout=300)
  assert other_run.returncode == 0
  shutil.rmtree(store)
  shutil.copytree(other / "data", store)
  result = _main(*args)
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith(f"error: {store} holds another store (seed: 7 there, 0 "
                                  "asked): nothing was changed"), result.stderr
  assert sorted(os.listdir(workdir / "checkpoints")) == checkpoints


def _config_error_calls():
  """Yields (file:line, call) for each ConfigError(...) in the package, main.py and benchmarks."""
  files = [*pathlib.Path(ROOT, "tst_jax").rglob("*.py"), pathlib.Path(ROOT, "main.py"),
           *pathlib.Path(ROOT, "benchmarks").rglob("*.py")]
  for path in files:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                getattr(node.func, "id", None)) == "ConfigError":
        yield f"{os.path.relpath(path, ROOT)}:{node.lineno}", node


def test_every_config_error_names_its_field_as_data():
  calls = list(_config_error_calls())
  assert len(calls) > 40
  for where, call in calls:
    assert len(call.args) == 2 and not call.keywords, f"{where}: ConfigError(field, message)"
    field = call.args[0]
    if isinstance(field, ast.Constant):
      assert isinstance(field.value, str) and re.fullmatch(r"--[\w-]+|[A-Z_]+|[a-z_][\w.]*",
                                                           field.value), where
    elif isinstance(field, ast.JoinedStr):   # a dotted name built from parts, f"data.{name}"
      literal = "".join(v.value for v in field.values if isinstance(v, ast.Constant))
      assert re.fullmatch(r"[\w.]*", literal), f"{where}: the field is text, not data"


def test_config_error_prints_its_field():
  assert str(ConfigError("tst.bag_size", "must be >= 1")) == "config.tst.bag_size: must be >= 1"
  assert str(ConfigError("--mode", "must be train")) == "--mode: must be train"
  assert str(ConfigError("XLA_PYTHON_CLIENT_MEM_FRACTION", "'x' is not a number")).startswith(
      "XLA_PYTHON_CLIENT_MEM_FRACTION: ")
  with pytest.raises(TypeError):
    ConfigError("the field inside the text")   # pylint: disable=no-value-for-parameter
