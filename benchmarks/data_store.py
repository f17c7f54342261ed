"""Token-store benchmark: prepare throughput and peak RSS, trainer startup, reader speed; JSON.

  python benchmarks/data_store.py --root /tmp/tst_data_bench --sizes_gb 0.5,2 \
      --runs 2:0,0.5:0,0.5:1          # (corpus GB : workers, 0 = all cores); deletes --root
A run of 1 worker is one core (RAYON_NUM_THREADS=1, as each worker of a larger pool). A run
`GB:workers:ray` runs prepare --runner=ray (a Ray cluster it starts on this machine, whose
start is in its time); `local` is the default.

Generates JSONL.zst shards (64 MB of text each) of the Python stdlib repeated with a per-copy
header (so every document differs); a smaller size is the first shards of the largest; trains one BPE (--vocab_size) on a sample, then for each
run times `python -m tst_jax.data.prepare` in a subprocess, sampling the summed RSS of it and
its workers. Then, for each prepared store and for stores of random tokens (--synthetic_gb,
written in seconds): the trainer's data startup (`run_data.prepare_data` of `tokens:DIR` in a
fresh process: time, peak RSS, and its anonymous / file-backed parts) and the reader (make_batches over the
memory-mapped store at the demo's phase-1 and phase-2 shapes). Prints one JSON object.
"""

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

import numpy as np

_SHARD_TEXT = 64 << 20      # bytes of text per generated JSONL.zst shard


def generate(folder: str, gigabytes: float) -> int:
  """JSONL.zst shards of stdlib files, copy k prefixed with '# copy k'; returns text bytes."""
  import zstandard  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  root = sysconfig.get_paths()["stdlib"]
  files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                 if f.endswith(".py") and "site-packages" not in d)
  texts = []
  for p in files:
    with open(p, "rb") as f:
      texts.append(f.read().decode("utf-8", errors="replace"))
  target, total, shard, buf, size, copy = int(gigabytes * 1e9), 0, 0, io.StringIO(), 0, 0
  cctx = zstandard.ZstdCompressor(level=3, threads=-1)

  def flush():
    nonlocal shard, buf, size
    with open(os.path.join(folder, f"shard-{shard:05d}.jsonl.zst"), "wb") as f:
      f.write(cctx.compress(buf.getvalue().encode()))
    shard, buf, size = shard + 1, io.StringIO(), 0

  while total < target:
    for i, t in enumerate(texts):
      doc = f"# copy {copy} of {files[i][len(root) + 1:]}\n{t}"
      buf.write(json.dumps({"text": doc, "id": f"{copy}/{i}"}) + "\n")
      n = len(doc.encode())
      size, total = size + n, total + n
      if size >= _SHARD_TEXT:
        flush()
      if total >= target:
        break
    copy += 1
  if size:
    flush()
  return total


class PeakRss:
  """Samples the summed RSS of a process and its descendants every 0.2 s (Linux /proc)."""

  def __init__(self, pid: int):
    self.pid, self.peak_sum, self.peak_one, self._stop = pid, 0, 0, False
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _tree(self):
    children = {}
    for p in os.listdir("/proc"):
      if p.isdigit():
        try:
          with open(f"/proc/{p}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
          children.setdefault(ppid, []).append(int(p))
        except (OSError, IndexError, ValueError):
          pass
    todo, found = [self.pid], []
    while todo:
      p = todo.pop()
      found.append(p)
      todo += children.get(p, [])
    return found

  def _run(self):
    while not self._stop:
      rss = []
      for p in self._tree():
        try:
          with open(f"/proc/{p}/status") as f:
            rss += [int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")]
        except OSError:
          pass
      self.peak_sum, self.peak_one = max(self.peak_sum, sum(rss)), max([self.peak_one] + rss)
      time.sleep(0.2)

  def stop(self):
    self._stop = True
    self._thread.join()


def run_prepare(source, tokenizer, out, workers, runner="local") -> dict:
  cmd = [sys.executable, "-m", "tst_jax.data.prepare", f"--source={source}",
         f"--tokenizer={tokenizer}", f"--out={out}", f"--workers={workers}", f"--runner={runner}"]
  t0 = time.time()
  env = dict(os.environ)
  if workers == 1:      # one core: no tokenizer threads either (prepare's workers run so)
    env["RAYON_NUM_THREADS"] = "1"
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
  rss = PeakRss(proc.pid)
  stdout, stderr = proc.communicate()
  seconds = time.time() - t0
  rss.stop()
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
  with open(os.path.join(out, "manifest.json")) as f:
    manifest = json.load(f)
  text = manifest["sources"]["text_bytes"]
  tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val"))
  return dict(runner=runner, workers=workers, seconds=round(seconds, 1), text_mb=round(text / 1e6, 1),
              tokens=tokens, mb_per_s=round(text / 1e6 / seconds, 2),
              tokens_per_s=round(tokens / seconds), peak_rss_mb=round(rss.peak_sum / 1e6),
              peak_rss_one_process_mb=round(rss.peak_one / 1e6),
              shards=len(manifest["splits"]["train"]["shards"]), dtype=manifest["dtype"],
              log_tail=stderr.strip().splitlines()[-1][:200] if stderr.strip() else "",
              printed=stdout.strip().splitlines()[-1])


_STARTUP = r"""
import json, resource, sys, time
t0 = time.time()
from tst_jax.data import run_data
from tst_jax.rundir import RunDir
from tst_jax.config import spec as spec_lib
from configs import demo
imported = time.time() - t0
c = demo.get_config()
c.data.source, c.data.tokenizer = "tokens:" + sys.argv[1], ""
t1 = time.time()
data = run_data.prepare_data(spec_lib.check(c).data, RunDir(sys.argv[2]), int(sys.argv[3]),
                             (0, 1))
seconds = time.time() - t1
status = dict(line.split(":") for line in open("/proc/self/status") if ":" in line)
mb = lambda key: round(int(status[key].split()[0]) / 1e3)
print(json.dumps(dict(import_s=round(imported, 2), prepare_data_s=round(seconds, 3),
                      peak_rss_mb=mb("VmHWM"), rss_anon_mb=mb("RssAnon"),
                      rss_file_mb=mb("RssFile"), train_tokens=len(data.train))))
"""


def startup(store: str, workdir: str, vocab: int) -> dict:
  out = subprocess.run([sys.executable, "-c", _STARTUP, store, workdir, str(vocab)], check=True,
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__))))
  return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic_store(out: str, gigabytes: float, tokenizer: str) -> str:
  """A store of random uint16 tokens (train: `gigabytes`, val: 1/50 of it) with a real
  tokenizer: what startup and the reader see, made in seconds instead of tokenizing."""
  from tst_jax.data import store as store_lib  # pylint: disable=g-import-not-at-top
  from tst_jax.data.tokenizer import get_tokenizer  # pylint: disable=g-import-not-at-top
  os.makedirs(out)
  shutil.copyfile(tokenizer, os.path.join(out, "tokenizer.json"))
  tok = get_tokenizer(tokenizer, folder=None, vocab_size=0)
  rng, splits = np.random.default_rng(0), {}
  for split, total in (("train", int(gigabytes * 1e9 / 2)), ("val", int(gigabytes * 1e9 / 100))):
    shards, offset = [], 0
    while offset < total:
      n, name = min(2**28, total - offset), f"{split}-{len(shards):05d}.bin"
      with open(os.path.join(out, name), "wb") as f:
        for lo in range(0, n, 2**24):
          rng.integers(0, tok.vocab_size, min(2**24, n - lo), dtype=np.uint16).tofile(f)
      shards.append(dict(file=name, tokens=n, offset=offset, docs=0, sha256=""))
      offset += n
    splits[split] = dict(docs=0, tokens=total, shards=shards)
  splits["train"]["unigram_entropy"] = float(np.log(tok.vocab_size))
  manifest = dict(format=store_lib.FORMAT, version=store_lib.VERSION, request={}, seed=0,
                  dtype="uint16", sources={}, splits=splits, created="",
                  tokenizer=dict(file="tokenizer.json", fingerprint=tok.fingerprint(),
                                 vocab_size=tok.vocab_size, eos_id=tok.eos_id))
  manifest["fingerprint"] = store_lib.fingerprint(manifest)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f)
  return out


def reader(store: str, batches: int) -> dict:
  from tst_jax.data import TokenStore, WindowSource, make_batches  # pylint: disable=g-import-not-at-top
  split = TokenStore(store).train
  result = {}
  for name, window in (("phase1_16x513", 513), ("phase2_16x129", 129)):
    it = make_batches(split, batch_size=16, window=window, start_pos=0, seed=0)
    next(it)
    t0 = time.time()
    for _ in range(batches):
      next(it)
    s = time.time() - t0
    source = WindowSource(split, 16, window, seed=0)     # without Grain's thread and prefetch
    t1 = time.time()
    for k in range(batches):
      source[k * 997 % 100_000]
    s_direct = time.time() - t1
    result[name] = dict(tokens_per_s=round(batches * 16 * window / s),
                        ms_per_batch=round(1e3 * s / batches, 3),
                        direct_tokens_per_s=round(batches * 16 * window / s_direct),
                        direct_ms_per_batch=round(1e3 * s_direct / batches, 3))
  return result


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--root", default="/tmp/tst_data_bench")
  p.add_argument("--sizes_gb", default="0.5,2")
  p.add_argument("--runs", default="2:0,0.5:0,0.5:1",
                 help="GB:workers[:runner] (0: all cores; runner local or ray)")
  p.add_argument("--vocab_size", type=int, default=32768)
  p.add_argument("--synthetic_gb", default="0.5,4", help="random-token stores for startup")
  p.add_argument("--reader_batches", type=int, default=2000)
  p.add_argument("--keep", action="store_true", help="do not delete --root")
  args = p.parse_args()
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tst_jax.data import load_documents, train_bpe  # pylint: disable=g-import-not-at-top
  result = dict(machine=dict(cpus=os.cpu_count(), platform=platform.platform(),
                             python=platform.python_version(), numpy=np.__version__,
                             tokenizers=tokenizers.__version__),
                date=time.strftime("%Y-%m-%d"), corpora={}, prepare=[], startup={}, reader={})
  os.makedirs(args.root, exist_ok=True)
  try:
    sizes = sorted(float(s) for s in args.sizes_gb.split(","))
    t0 = time.time()
    text = generate(os.path.join(args.root, f"corpus-{sizes[-1]}"), sizes[-1])
    result["corpora"][str(sizes[-1])] = dict(text_mb=round(text / 1e6),
                                             seconds=round(time.time() - t0))
    for gb in sizes[:-1]:        # the first shards of the largest corpus, linked
      folder = os.path.join(args.root, f"corpus-{gb}")
      os.makedirs(folder)
      names = sorted(os.listdir(os.path.join(args.root, f"corpus-{sizes[-1]}")))
      for name in names[:-(-int(gb * 1e9) // _SHARD_TEXT)]:
        os.symlink(os.path.join(args.root, f"corpus-{sizes[-1]}", name),
                   os.path.join(folder, name))
    tok_path = os.path.join(args.root, "tokenizer.json")
    t0 = time.time()
    train_bpe(load_documents("builtin:pystdlib", 8_000_000), args.vocab_size).save(tok_path)
    result["tokenizer"] = dict(vocab_size=args.vocab_size, trained_on_mb=8,
                               seconds=round(time.time() - t0, 1))
    stores = {}
    for run in args.runs.split(","):
      gb, workers, runner = (run.split(":") + ["local"])[:3]
      workers = int(workers) or os.cpu_count()
      # numbered: a run repeated for its spread writes a store of its own
      out = os.path.join(args.root, f"store-{len(result['prepare'])}-{gb}-{workers}-{runner}")
      source = f"jsonl:{args.root}/corpus-{float(gb)}/*.jsonl.zst"
      load = os.getloadavg()[0]
      r = dict(corpus_gb=float(gb), **run_prepare(source, tok_path, out, workers, runner),
               load_avg_1min_before_after=[round(load, 1), round(os.getloadavg()[0], 1)])
      result["prepare"].append(r)
      print(json.dumps(r), file=sys.stderr, flush=True)
      stores[float(gb)] = out
    stores = {f"prepared-{gb}": out for gb, out in sorted(stores.items())}
    for gb in filter(None, args.synthetic_gb.split(",")):
      stores[f"synthetic-{gb}"] = synthetic_store(os.path.join(args.root, f"synthetic-{gb}"),
                                                  float(gb), tok_path)
    for name, out in stores.items():
      result["startup"][name] = startup(out, os.path.join(args.root, f"w-{name}"),
                                        args.vocab_size)
      result["reader"][name] = reader(out, args.reader_batches)
      print(json.dumps(dict(store=name, startup=result["startup"][name],
                            reader=result["reader"][name])), file=sys.stderr, flush=True)
      if name.startswith("synthetic"):
        shutil.rmtree(out)
  finally:
    if not args.keep:
      shutil.rmtree(args.root, ignore_errors=True)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
