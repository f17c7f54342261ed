"""Where a train step's milliseconds go: a JAX profiler trace summarised by op category.

`profile_steps` traces a few calls of a jitted step with `jax.profiler.trace`. `summarize` then
reads the trace's XSpace through `jax.profiler.ProfileData`, with no TensorBoard needed, and
gives every executed HLO op of the step's module a category from the compiled HLO text. The
category comes from its opcode, such as dots and collectives, the ops fused into it, and the
name scopes the model and step put on it: `attention`, `loss`, `embed`, `optimizer`. A
backward op's name holds `transpose(`. Time is attributed on the device's timeline. Where ops
overlap, as threads on CPU or streams on GPU, each instant is split evenly between them, and
nested events count once, at the innermost. So the categories plus `idle`, when no op of the
step runs, sum to the step's wall time.

  python benchmarks/step.py --config configs/llama_270m.py --phase both --profile 5
  python main.py --config configs/demo.py --config.train.profile_steps=20,3
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import tempfile
import time

import jax
from jax.profiler import ProfileData

from tst_jax.parallel import xla_flags

CATEGORIES = ("attention", "matmul forward", "matmul backward", "loss", "optimizer",
              "embedding", "dispatch+combine", "collectives", "other ops", "idle")
SCOPES = (("optimizer", "optimizer"), ("loss", "loss"), ("embedding", "embed"),
          ("attention", "attention"), ("dispatch+combine", "moe_dispatch"),
          ("dispatch+combine", "moe_combine"))   # category, the jax.named_scope marking it
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all", "collective-broadcast")
MATMULS = ("dot", "convolution", "ragged-dot", "scaled-dot")
# cuBLAS and cuBLASLt custom calls, and Pallas kernels outside the scopes above, such as
# tokamax's grouped GEMMs: custom call `mosaic_gpu` with ops named mpmd_map.N, or `...triton`.
_MATMUL_CALLS = re.compile(r"gemm|matmul|cublas|\$dot|mosaic_gpu|triton", re.I)
_ATTENTION_CALLS = re.compile(r"fmha|flash|attention", re.I)   # cuDNN and Pallas attention calls
CONTAINERS = ("while", "conditional", "call")   # ops whose body ops have their own events
STEP_NAME = "train_step"


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of the compiled HLO: what decides its category."""
  opcode: str
  op_names: tuple[str, ...]   # its own metadata op_name first, then those of its fused ops
  opcodes: frozenset[str]     # its own opcode and those of its fused ops
  targets: tuple[str, ...]    # custom-call targets, its own or fused


def _opcode(rhs: str) -> str:
  """Returns the opcode of an HLO instruction's right-hand side, `TYPE opcode(operands), attrs`.

  That is the first `name(` outside the type's brackets, since tuple types and layouts hold
  brackets too.
  """
  depth = 0
  for m in re.finditer(r"[()\[\]{}]|(?<![\w\-.])([a-z][a-z0-9\-]*)\(", rhs):
    if m.group(1) and depth == 0:
      return m.group(1)
    token = m.group(0)[-1]
    depth += 1 if token in "([{" else -1
  return ""


def parse_hlo(hlo_text: str) -> tuple[str, dict[str, Op]]:
  """Parses `compiled.as_text()` into the module name and a map from instruction name to Op."""
  module = re.search(r"HloModule\s+([\w.\-]+)", hlo_text)
  computations: dict[str, list] = collections.defaultdict(list)
  raw, current = {}, None
  for line in hlo_text.splitlines():
    line = re.sub(r"/\*.*?\*/", "", line)
    head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if head and not line.startswith(" "):
      current = head.group(1)
      continue
    m = re.match(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$", line)
    if not m or current is None:
      continue
    name, rhs = m.groups()
    op_name = re.search(r'op_name="([^"]*)"', rhs)
    target = re.search(r'custom_call_target="([^"]*)"', rhs)
    calls = re.findall(r"calls=%?([\w.\-]+)", rhs)
    raw[name] = (_opcode(rhs), op_name.group(1) if op_name else "",
                 target.group(1) if target else "", calls)
    computations[current].append(name)

  def inner(name, seen):   # the instructions fused into `name`, recursively
    for comp in raw[name][3]:
      for child in computations.get(comp, ()):
        if child not in seen:
          seen.add(child)
          yield child
          yield from inner(child, seen)

  ops = {}
  for name, (opcode, op_name, target, _) in raw.items():
    fused = list(inner(name, set())) if opcode in ("fusion", "async-start", "call") else []
    ops[name] = Op(opcode, (op_name,) + tuple(raw[c][1] for c in fused if raw[c][1]),
                   frozenset([opcode] + [raw[c][0] for c in fused]),
                   tuple(t for t in [target] + [raw[c][2] for c in fused] if t))
  return (module.group(1) if module else ""), ops


def _has_scope(op_name: str, scope: str) -> bool:
  return re.search(rf"(^|[/(;]){re.escape(scope)}([/);]|$)", op_name) is not None


def category(op: Op) -> str:
  """Returns the category of one HLO instruction, one of CATEGORIES and never 'idle'."""
  base = {c.removesuffix("-start").removesuffix("-done") for c in op.opcodes}
  if base & set(COLLECTIVES) or any("nccl" in t.lower() for t in op.targets):
    return "collectives"
  for name in op.op_names[:1] or ("",):   # the op's own scope decides first
    for cat, scope in SCOPES:
      if _has_scope(name, scope):
        return cat
  counts = collections.Counter(cat for name in op.op_names[1:] for cat, scope in SCOPES
                               if _has_scope(name, scope))
  if counts:
    return counts.most_common(1)[0][0]
  if any(_ATTENTION_CALLS.search(t) for t in op.targets):
    return "attention"
  if base & set(MATMULS) or any(_MATMUL_CALLS.search(t) for t in op.targets):
    dots = [n for n in op.op_names if re.search(r"dot_general|einsum|ragged_dot", n)] or \
        op.op_names
    return "matmul backward" if any("transpose(" in n for n in dots) else "matmul forward"
  return "other ops"


@dataclasses.dataclass(frozen=True)
class StepProfile:
  """Milliseconds per step by category, summing to `step_ms`, from `steps` traced steps."""
  steps: int
  step_ms: float                   # mean wall time of a traced step
  ms: dict                         # category -> mean ms per step, every CATEGORIES entry
  top_ops: tuple                   # op name, category and ms per step, largest first
  trace_dir: str
  note: str = ""                   # what may have blurred the categories: GPU command buffers
  # category -> its largest ops, (name, ms per step), largest first
  top_by_category: dict = dataclasses.field(default_factory=dict)
  sources: dict = dataclasses.field(default_factory=dict)   # top op -> the jnp op it came from

  def to_json(self) -> dict:
    return dict(steps=self.steps, step_ms=self.step_ms, ms_per_step=self.ms,
                top_ops=[list(t) for t in self.top_ops], trace_dir=self.trace_dir,
                note=self.note,
                top_by_category={c: [list(t) for t in ops]
                                 for c, ops in self.top_by_category.items()},
                sources=self.sources)

  def table(self) -> str:
    lines = [f"{'category':<18}{'ms/step':>10}{'share':>8}"]
    for cat in CATEGORIES:
      lines.append(f"{cat:<18}{self.ms[cat]:>10.3f}{self.ms[cat] / self.step_ms:>8.1%}")
    lines.append(f"{'step (wall)':<18}{self.step_ms:>10.3f}{1:>8.0%}")
    lines += [f"  note: {self.note}"] if self.note else []
    lines += [f"  top op: {ms:9.3f} ms  {cat:<16} {name}  {self.sources.get(name, '')}"
              for name, cat, ms in self.top_ops[:5]]
    for cat in ("other ops", "matmul backward"):
      lines += [f"  in {cat}: {ms:9.3f} ms  {ms / self.ms[cat]:6.1%}  {name}  "
                f"{self.sources.get(name, '')}"
                for name, ms in self.top_by_category.get(cat, ())[:3] if self.ms[cat]]
    return "\n".join(lines)


def _stats(event) -> dict:
  return dict(event.stats)


def _op_events(space: ProfileData, module: str, device_ordinal: int):
  """Yields the line key, start_ns, end_ns and hlo op name of the module's ops on one device.

  A GPU or TPU device plane with an "XLA Ops" line gives one event per op there. Otherwise, on
  XLA:CPU or a GPU plane of kernels on stream lines, ops are the events carrying an `hlo_op`
  stat on the one device asked for.
  """
  planes = [p for p in space.planes if p.name.startswith("/device:")]
  device = [p for p in planes if re.search(rf":{device_ordinal}$", p.name)]
  for plane in device or [space.find_plane_with_name("/host:CPU")]:
    if plane is None:
      continue
    lines = list(plane.lines)
    ops_lines = [l for l in lines if l.name == "XLA Ops"]
    for index, line in enumerate(ops_lines or lines):
      for event in line.events:
        stats = _stats(event)
        name = stats.get("hlo_op") or (event.name.lstrip("%").split(" ")[0] if ops_lines
                                       else None)
        if not name:
          continue
        if "hlo_module" in stats and not str(stats["hlo_module"]).startswith(module):
          continue
        if not device and int(stats.get("device_ordinal", device_ordinal)) != device_ordinal:
          continue
        yield (plane.name, index), event.start_ns, event.end_ns, str(name)


def _step_windows(space: ProfileData, annotation: str) -> list[tuple[float, float]]:
  windows = []
  for plane in space.planes:
    if not plane.name.startswith("/host:"):
      continue
    for line in plane.lines:
      for event in line.events:
        if event.name == annotation and "step_num" in _stats(event):
          windows.append((event.start_ns, event.end_ns))
  return sorted(windows)


def attribute(windows, events, category_of, is_container=lambda op: False):
  """Sums nanoseconds per category and per op over `windows`.

  Inside a window, each instant goes to the innermost event of every line running then, split
  evenly between lines. A container op, such as a while loop whose body runs on other threads,
  gets time only when nothing else runs. An instant with no event running is 'idle'.
  """
  by_cat, by_op = collections.defaultdict(float), collections.defaultdict(float)
  for lo, hi in windows:
    points = []
    for line, start, end, name in events:
      start, end = max(start, lo), min(end, hi)
      if end > start:
        points.append((start, 1, end, line, name))
        points.append((end, 0, start, line, name))
    points.sort(key=lambda p: (p[0], p[1], -p[2]))   # ends first; outer starts, inner ends
    stacks: dict = collections.defaultdict(list)
    t = lo
    for when, is_start, _, line, name in points:
      active = [s[-1] for s in stacks.values() if s]
      working = [op for op in active if not is_container(op)]
      active = working or active   # a loop's own time: only while none of its ops runs
      span = when - t
      if span > 0:
        if not active:
          by_cat["idle"] += span
        for op in active:
          by_cat[category_of(op)] += span / len(active)
          by_op[op] += span / len(active)
      t = when
      if is_start:
        stacks[line].append(name)
      elif name in stacks[line]:
        stacks[line].reverse()
        stacks[line].remove(name)   # the latest opened event of that name
        stacks[line].reverse()
    by_cat["idle"] += hi - t
  return by_cat, by_op


def summarize(trace_dir: str, hlo_text: str, *, annotation: str = STEP_NAME,
              device_ordinal: int = 0, top: int = 10) -> StepProfile:
  """Returns the StepProfile of the steps annotated `annotation` in the trace under `trace_dir`."""
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
  if not paths:
    raise FileNotFoundError(f"{trace_dir}: no *.xplane.pb trace")
  space = ProfileData.from_file(paths[-1])
  module, ops = parse_hlo(hlo_text)
  windows = _step_windows(space, annotation)
  if not windows:
    raise ValueError(f"{paths[-1]}: no step annotated {annotation!r}")
  events = list(_op_events(space, module, device_ordinal))
  cache = {}

  def category_of(name):
    if name not in cache:
      cache[name] = category(ops[name]) if name in ops else "other ops"
    return cache[name]

  containers = {name for name, op in ops.items() if op.opcode in CONTAINERS}
  by_cat, by_op = attribute(windows, events, category_of, containers.__contains__)
  n = len(windows)
  step_ms = sum(hi - lo for lo, hi in windows) / n / 1e6
  ms = {cat: by_cat.get(cat, 0.0) / n / 1e6 for cat in CATEGORIES}
  ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
  by_category = collections.defaultdict(list)
  for op, ns in ranked:
    if len(by_category[category_of(op)]) < 5:
      by_category[category_of(op)].append((op, ns / n / 1e6))
  shown = {op for op, _ in ranked[:top]} | {op for ops in by_category.values() for op, _ in ops}
  return StepProfile(n, step_ms, ms,
                     tuple((op, category_of(op), ns / n / 1e6) for op, ns in ranked[:top]),
                     trace_dir, top_by_category=dict(by_category),
                     sources={op: source(ops[op]) for op in shown if op in ops})


def source(op: Op) -> str:
  """Says which jnp operations an HLO op came from: its own op_name, else its fused ops' most
  common one, without the jit(...) prefix."""
  names = [n for n in op.op_names if n]
  if not names:
    return ""
  name = names[0] if op.op_names[0] else collections.Counter(names).most_common(1)[0][0]
  return re.sub(r"^jit\([^)]*\)/", "", name)[-160:]


def fusion_text(hlo_text: str, names, max_line: int = 2000) -> str:
  """Returns the optimized HLO of instructions `names`: each one's line and, after it, every
  computation it calls, recursively (a fusion's body), so a slow fusion can be read alone.
  Lines are cut at `max_line` characters: a kernel's custom call carries its whole binary."""
  computations, current, defining = {}, None, {}
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if head and not line.startswith(" "):
      current = head.group(1)
      computations[current] = [line]
      continue
    if current is not None:
      computations[current].append(line)
      m = re.match(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=", line)
      if m:
        defining[m.group(1)] = line
  out = []
  for name in names:
    if name not in defining:
      out.append(f"// {name}: not in this module")
      continue
    out += [f"// ---- {name}", defining[name].strip()]
    todo, seen = re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", defining[name]), set()
    while todo:
      comp = todo.pop(0)
      if comp in seen or comp not in computations:
        continue
      seen.add(comp)
      out += computations[comp]
      for line in computations[comp]:
        todo += re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line)
  return "\n".join(line if len(line) <= max_line else line[:max_line] + " ..."
                   for line in out) + "\n"


def profile_window(text: str) -> tuple[int, int] | None:
  """Returns train.profile_steps' first step and count from '<first>,<count>', None for ''.

  A malformed text raises ValueError.
  """
  if not text:
    return None
  parts = text.split(",")
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"{text!r} is not '<first>,<count>'")
  first, count = (int(p) for p in parts)
  if first < 1 or count < 1:
    raise ValueError(f"{text!r}: the first step and the count must be >= 1")
  return first, count


def command_buffers_note() -> str:
  """Says how GPU command buffers blur this process's traces, or returns '' where they do not."""
  if jax.default_backend() != "gpu" or xla_flags.command_buffers_off():
    return ""
  return ("XLA's command buffers were on: their ops (command_buffer_N) are 'other ops'; XLA "
          "fixes them when JAX starts, so they cannot be off for a few steps only: turn them off "
          f"for the whole run with XLA_FLAGS={xla_flags.COMMAND_BUFFERS_OFF}, or use "
          "benchmarks/step.py --profile")


def traced_call(step, state, batch, step_num: int):
  """Calls the jitted `step` once as an annotated step of the trace, waits for it, times it."""
  t = time.perf_counter()
  with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step_num):
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
  return state, metrics, time.perf_counter() - t


def finish(trace_dir: str, hlo_text: str) -> StepProfile:
  """Returns the StepProfile of a finished trace, noting GPU command buffers where they were on."""
  return dataclasses.replace(summarize(trace_dir, hlo_text), note=command_buffers_note())


def profile_steps(step, state, batch, *, steps: int = 3, trace_dir: str | None = None,
                  hlo_text: str | None = None):
  """Traces `steps` calls of the jitted `step` and returns the state, a StepProfile and step times.

  `step` is compiled and warmed up before, and each call is waited for. `hlo_text` is the
  compiled step's text if the caller has it, else it is compiled again from `step.lower`.
  """
  trace_dir = trace_dir or tempfile.mkdtemp(prefix="tst_jax_profile_")
  hlo_text = hlo_text or step.lower(state, batch).compile().as_text()
  walls = []
  with jax.profiler.trace(trace_dir):
    for i in range(steps):
      state, _, wall = traced_call(step, state, batch, i)
      walls.append(wall)
  return state, finish(trace_dir, hlo_text), walls


class Window:
  """Traces a run's steps `first` to `first + count - 1`, numbered as the log numbers them.

  `call` stands in for the step call of the loop. The window's first call compiles the step's
  text for the table and starts the trace. Its last one stops the trace and hands the
  StepProfile to `done`, which writes it.
  """

  def __init__(self, window: tuple[int, int] | None, trace_dir: str, done, say=print):
    self.first, self.count = window or (0, 0)
    self.trace_dir, self.done, self.say = trace_dir, done, say
    self.hlo_text = None

  def call(self, step, state, batch, step_num: int):
    """Runs `step` on `state` and `batch`, traced where `step_num` lies in the window."""
    if not self.first <= step_num < self.first + self.count:
      return step(state, batch)
    if self.hlo_text is None:
      self.hlo_text = step.lower(state, batch).compile().as_text()
      if command_buffers_note():
        self.say(f"profile: {command_buffers_note()}")
      jax.profiler.start_trace(self.trace_dir)
    state, metrics, _ = traced_call(step, state, batch, step_num)
    if step_num == self.first + self.count - 1:
      self.close()
      self.done(finish(self.trace_dir, self.hlo_text))
    return state, metrics

  def close(self):
    """Stops a trace still running, as after an error or a preemption inside the window."""
    if self.hlo_text is not None and self.count:
      jax.profiler.stop_trace()
      self.count = 0
