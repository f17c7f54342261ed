"""prepare's runners: on a Ray cluster of this machine the store is the local runner's byte for
byte, a task whose worker is killed mid-shard is run again to the same store, a task's error
is the local runner's one line and its rerun redoes only the shards not done, and a bad source
or a missing engine is one line before any task."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from tst_jax import errors
from tst_jax.data import TokenStore, output_shards, prepare as prepare_lib, runners
from tst_jax.errors import ConfigError

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi".split()
NO_RAY = "--runner=ray needs the [ray] extra: pip install 'tst-jax[ray]'"


def _corpus(folder, files: int, docs: int, seed: int = 0) -> str:
  """Writes `files` JSONL files of `docs` documents of random words each; returns the source."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  for k in range(files):
    with open(os.path.join(folder, f"part{k}.jsonl"), "w") as f:
      for i in range(docs):
        text = f"doc {k}/{i}: " + " ".join(rng.choice(WORDS, rng.integers(5, 400)))
        f.write(json.dumps({"text": text}) + "\n")
  return f"jsonl:{folder}/*.jsonl"


def _prepare(source, out, tok, **kw) -> TokenStore:
  kw = dict(seed=1, val_fraction=0.05, progress=False, shard_tokens=40_000) | kw
  return TokenStore(prepare_lib.prepare(source, str(out), tokenizer=tok, **kw))


def _files(store: TokenStore) -> dict[str, bytes]:
  """Every file of `store` by name, the manifest without the time it was written."""
  found = {}
  for name in sorted(os.listdir(store.directory)):
    with open(os.path.join(store.directory, name), "rb") as f:
      found[name] = f.read()
  manifest = json.loads(found.pop("manifest.json"))
  del manifest["created"]
  return found | {"manifest.json": json.dumps(manifest, sort_keys=True).encode()}


@pytest.fixture(scope="module")
def ray_cluster():
  """A Ray cluster of two CPUs on this machine, which prepare's ray runner joins."""
  ray = pytest.importorskip("ray", reason=NO_RAY)
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  yield ray
  ray.shutdown()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  """A BPE tokenizer of 300 tokens trained by a local prepare of a small corpus."""
  root = tmp_path_factory.mktemp("tok")
  source = _corpus(root / "src", files=1, docs=200)
  return _prepare(source, root / "bpe", "bpe", vocab_size=300, workers=1).tokenizer_path


def test_ray_writes_the_local_runners_store(ray_cluster, tok, tmp_path):
  source = _corpus(tmp_path / "src", files=4, docs=300)
  local = _prepare(source, tmp_path / "local", tok, workers=1)
  on_ray = _prepare(source, tmp_path / "ray", tok, runner="ray", workers=2)
  assert len(local.train.files) >= 3 and len(local.manifest["sources"]) and _files(on_ray)
  assert _files(on_ray) == _files(local)


def _pids_writing(folder: str, suffix: str) -> list[tuple[int, str]]:
  """Returns (pid, file) of each process holding open a file of `folder` ending in `suffix`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith(folder) and target.endswith(suffix):
          found.append((int(pid), target))
    except OSError:
      continue
  return found


def test_a_task_killed_mid_shard_is_run_again_to_the_same_store(ray_cluster, tok, tmp_path):
  """The worker tokenizing an input shard is killed once it has written part of the shard's
  tokens: Ray runs the task again, and the store is the local runner's."""
  source = _corpus(tmp_path / "src", files=2, docs=6000)     # ~7 MB of text per file
  out, killed, stop = tmp_path / "ray", [], threading.Event()
  work = str(out / "work")

  def kill_the_first_writer():
    while not stop.is_set() and not killed:
      for pid, path in _pids_writing(work, ".bin.tmp"):
        name = os.path.basename(path)[:-len(".bin.tmp")]
        if (os.path.getsize(path) > 0 and pid != os.getpid()
            and not os.path.exists(output_shards.done_path(work, name))):
          with open(f"/proc/{pid}/cmdline", "rb") as f:
            killed.append((name, f.read().split(b"\0")[0].decode()))
          os.kill(pid, signal.SIGKILL)
          break
      time.sleep(0.005)

  watcher = threading.Thread(target=kill_the_first_writer, daemon=True)
  watcher.start()
  try:
    on_ray = _prepare(source, out, tok, runner="ray", workers=2)
  finally:
    stop.set()
    watcher.join()
  assert killed and killed[0][0].startswith("in-") and "ray" in killed[0][1].lower(), killed
  assert _files(on_ray) == _files(_prepare(source, tmp_path / "local", tok, workers=1))


def test_a_tasks_error_is_one_line_and_the_rerun_redoes_only_that_shard(ray_cluster, tok,
                                                                         tmp_path, capsys,
                                                                         monkeypatch):
  source = _corpus(tmp_path / "src", files=3, docs=200)
  good = (tmp_path / "src" / "part2.jsonl").read_bytes()
  (tmp_path / "src" / "part2.jsonl").write_bytes(good[:len(good) // 2] + b"{not json\n")
  argv = [f"--source={source}", f"--tokenizer={tok}", "--seed=1",
          "--val_fraction=0.05", "--shard_tokens=40000"]
  lines = {}
  for runner in ("local", "ray"):
    with pytest.raises(SystemExit) as stop:
      errors.main(prepare_lib.main, [*argv, f"--runner={runner}", f"--out={tmp_path}/{runner}"])
    lines[runner] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert stop.value.code == 2
  assert len(lines["ray"]) == 1 and lines["ray"] == lines["local"], lines
  assert lines["ray"][0].startswith(f"error: {tmp_path}/src/part2.jsonl:")
  work = tmp_path / "ray" / "work"
  done = {n: os.stat(work / n).st_mtime_ns for n in os.listdir(work) if n.endswith(".done.json")}
  assert done and "in-00002.done.json" not in done     # part2 starts once another is done
  (tmp_path / "src" / "part2.jsonl").write_bytes(good)
  after_pass_1 = {}
  real_plan = output_shards.forget_another_plan
  monkeypatch.setattr(output_shards, "forget_another_plan", lambda *a: after_pass_1.update(
      {n: os.stat(work / n).st_mtime_ns for n in os.listdir(work) if n.endswith(".done.json")})
                      or real_plan(*a))
  on_ray = _prepare(source, tmp_path / "ray", tok, runner="ray", workers=2)
  monkeypatch.undo()
  assert len(after_pass_1) == 3 and {n: after_pass_1[n] for n in done} == done
  assert _files(on_ray) == _files(_prepare(source, tmp_path / "local2", tok, workers=1))


@pytest.mark.parametrize("source, says", [
    ("jsonl:{tmp}/none/*.jsonl", "matched no files"),
    ("nosuchformat:{tmp}", "nosuchformat"),
])
def test_a_bad_source_is_one_line_before_the_engine_starts(tmp_path, capsys, monkeypatch,
                                                           source, says):
  ray = pytest.importorskip("ray", reason=NO_RAY)
  monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("the engine was started"))
  monkeypatch.setattr(ray, "is_initialized", lambda: False)
  argv = [f"--source={source.format(tmp=tmp_path)}", f"--out={tmp_path}/out",
          "--vocab_size=300", "--runner=ray"]
  with pytest.raises(SystemExit) as stop:
    errors.main(prepare_lib.main, argv)
  err = capsys.readouterr().err
  assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
  assert says in err and not os.path.exists(tmp_path / "out")


def test_a_runner_not_installed_or_unknown_is_refused_before_anything(tmp_path, monkeypatch):
  monkeypatch.setattr(runners.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ConfigError, match=r"^--runner: ray needs ray: pip install 'tst-jax\[ray\]'$"):
    prepare_lib.prepare(f"jsonl:{tmp_path}/x.jsonl", tmp_path / "out", vocab_size=300,
                        runner="ray")
  with pytest.raises(ConfigError, match=r"^--runner: 'spark' is not one of \['local', 'ray'\]$"):
    runners.start("spark", None)
  assert not os.path.exists(tmp_path / "out")
