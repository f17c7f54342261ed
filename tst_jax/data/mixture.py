"""Weighted mixtures of token stores: which entry each training window comes from, and where
in that entry's own store it starts.

A phase draws its B rows per step from the entries of its mixture. Slot g of the phase (row
g % B of batch g // B) goes to the entry that Grain's `MapDataset.mix` gives element g, and
to that entry's next window: the i-th slot of an entry reads window i of the entry's own
seeded shuffled order (`pipeline.WindowSource`), from where the entry stopped in the earlier
phases. So each entry reads its store as a single-source run reads its one store, and batch
k is a pure function of (stores, weights, seed, k): a resumed run draws the same batches.

Stages (data.mixture_stages) change the weights at given steps. A phase is then cut into
parts where a stage starts, each part interleaved by its stage's weights from its own first
slot, and an entry's windows numbered on across the parts: its i-th window of the phase is
still window i of its one `WindowSource`, so stages change which rows read which entry, never
how an entry reads its store, and batch k stays a pure function of its arguments.

`MapDataset.mix` interleaves exactly: of any P consecutive elements, P the sum of its integer
proportions, entry i gets its proportion. Calling it once per row costs a Python call per
window, so `Interleave` reads one period of it and applies it to whole batches with numpy.
"""

from __future__ import annotations

import dataclasses
import functools

import grain
import numpy as np

from tst_jax import schema
from tst_jax.data import pipeline
from tst_jax.errors import ConfigError

_MAX_RATIO = 1000     # largest weight over smallest: bounds the interleave's period (Grain
                      # scales the smallest weight to 100)


@dataclasses.dataclass(frozen=True)
class Entry:
  source: str       # tokens:<store> or a source prepared into the workdir
  weight: float     # its share of the windows, the weights summing to 1


def parse(text: str, field: str) -> tuple[Entry, ...]:
  """Parses 'source=weight,source=weight,...' into entries with weights that sum to 1."""
  entries = []
  for item in filter(None, (part.strip() for part in text.split(","))):
    source, sep, weight = item.rpartition("=")
    try:
      value = float(weight) if sep and source else float("nan")
    except ValueError:
      value = float("nan")
    if not value > 0 or value == float("inf"):
      raise ConfigError(field, f"{item!r} is not source=weight with a weight > 0, e.g. "
                        "'tokens:/data/dclm=0.5,tokens:/data/fineweb_edu=0.5'")
    entries.append((source, value))
  sources = [s for s, _ in entries]
  if not entries or len(set(sources)) < len(sources):
    raise ConfigError(field, f"{text!r}: give each source once, as source=weight,...")
  weights = np.array([w for _, w in entries])
  if weights.max() / weights.min() > _MAX_RATIO:
    raise ConfigError(field, f"the largest weight is over {_MAX_RATIO} times the smallest")
  return tuple(Entry(s, float(w / weights.sum())) for s, w in zip(sources, weights))


def _well_formed(text) -> bool:
  if not isinstance(text, str):
    return False
  try:   # ConfigError needs a field; schema names the real one where the rule fails
    return not text or bool(parse(text, "data.mixture"))
  except ConfigError:
    return False


RULE = schema.Rule(_well_formed, "'' or source=weight,... with each source once and weights "
                   f"> 0, the largest at most {_MAX_RATIO} times the smallest", str)


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of data.mixture_stages: the weights of the training rows from a step on."""
  first_step: int              # global optimizer step from which its weights apply
  entries: tuple[Entry, ...]   # in data.mixture's order; a source left out reads nothing


def _stages_parse(text: str, field: str) -> tuple[tuple[int, tuple[Entry, ...]], ...]:
  """Parses '<step>:name=weight,...;...' into (step, entries) pairs, each name as written."""
  stages = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    step, sep, weights = part.partition(":")
    if not (sep and step.strip().isdigit()):
      raise ConfigError(field, f"{part!r} is not <step>:name=weight,..., e.g. "
                        "'0:dclm=0.7,fineweb=0.3;5000:dclm=0.5,fineweb=0.5'")
    stages.append((int(step), parse(weights, field)))
  steps = [step for step, _ in stages]
  if not stages or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
    raise ConfigError(field, f"{text!r}: the first stage starts at step 0 and each later one "
                      "at a larger step")
  return tuple(stages)


def _stages_well_formed(text) -> bool:
  if not isinstance(text, str):
    return False
  try:
    return not text or bool(_stages_parse(text, "data.mixture_stages"))
  except ConfigError:
    return False


STAGES_RULE = schema.Rule(
    _stages_well_formed, "'' or '<step>:name=weight,...;...', the first stage at step 0 and "
    "the steps increasing, each stage's names once with weights > 0, the largest at most "
    f"{_MAX_RATIO} times the smallest", str)


def short_name(source: str) -> str:
  """Names a source by the last part of its path that is not a glob: `dclm` for
  tokens:/data/tok/dclm, `c4` for jsonl:/data/c4/*.jsonl.gz."""
  path = source.partition(":")[2] or source
  parts = [p for p in path.split("/") if p and not any(c in p for c in "*?[")]
  return parts[-1] if parts else source


def name_of(source: str, sources) -> str:
  """Returns the name of `source` among `sources`: its short name where no other shares it,
  else the source in full."""
  short = short_name(source)
  return short if [short_name(s) for s in sources].count(short) == 1 else source


def stages(text: str, main: tuple[Entry, ...], field: str) -> tuple[Stage, ...]:
  """Parses data.mixture_stages against data.mixture's entries `main`: each stage's sources
  resolved from their names and put in data.mixture's order, its weights summing to 1."""
  if not text:
    return ()
  sources = [e.source for e in main]
  known = {**{name_of(s, sources): s for s in sources}, **{s: s for s in sources}}
  out = []
  for step, entries in _stages_parse(text, field):
    weights = {}
    for e in entries:
      if e.source not in known:
        ambiguous = [s for s in sources if short_name(s) == e.source]
        raise ConfigError(field, f"{e.source!r} " + (
            f"names {len(ambiguous)} sources of data.mixture: give one in full" if ambiguous
            else "is not a source of data.mixture: name one of "
            + ", ".join(repr(name_of(s, sources)) for s in sources)))
      if known[e.source] in weights:
        raise ConfigError(field, f"the stage at step {step} names {known[e.source]!r} twice")
      weights[known[e.source]] = e.weight
    out.append(Stage(step, tuple(Entry(s, weights[s]) for s in sources if s in weights)))
  return tuple(out)


class Interleave:
  """Which entry each slot of a phase, or of a part of one, reads, and which of that entry's
  windows: Grain's `MapDataset.mix` of the weights, one period of it read and repeated."""

  def __init__(self, weights):
    # Grain mixes in integer proportions, the smallest scaled to 100. Given those integers its
    # pattern repeats every sum of them slots, as tests/data/test_mixture.py checks.
    self.per_period = np.round(np.asarray(weights, np.float64) / min(weights) * 100
                               ).astype(np.int64)
    self.period = int(self.per_period.sum())
    mixed = grain.MapDataset.mix([grain.MapDataset.range(i * self.period, (i + 1) * self.period)
                                  for i in range(len(weights))], self.per_period.tolist())
    self.entry_p, self.index_p = np.divmod(
        np.array([mixed[g] for g in range(self.period)], dtype=np.int64), self.period)

  def select(self, slots) -> tuple[np.ndarray, np.ndarray]:
    """(entry, index in that entry) of each slot, as int64 arrays."""
    cycle, at = np.divmod(np.asarray(slots, dtype=np.int64), self.period)
    entry = self.entry_p[at]
    return entry, cycle * self.per_period[entry] + self.index_p[at]

  def counts(self, slots: int) -> np.ndarray:
    """Counts how many of the first `slots` slots each entry reads."""
    cycles, rest = divmod(slots, self.period)
    return cycles * self.per_period + np.bincount(self.entry_p[:rest],
                                                  minlength=len(self.per_period))


@functools.lru_cache(maxsize=16)
def interleave(weights: tuple[float, ...]) -> Interleave:
  return Interleave(weights)


@dataclasses.dataclass(frozen=True)
class Part:
  """Steps of one phase that read one set of weights: a phase, or its share of a stage."""
  phase: int                   # index of the phase
  stage: int | None            # index of the stage, None without data.mixture_stages
  steps: int
  entries: tuple[Entry, ...]

  @property
  def order(self) -> Interleave:
    return interleave(tuple(e.weight for e in self.entries))

  def windows(self, batch_size: int) -> np.ndarray:
    """Counts the windows the part reads of each of its entries, rows of `batch_size`."""
    return self.order.counts(self.steps * batch_size)


class Draw:
  """Which entry each slot of a phase reads, and which of that entry's windows: its parts'
  interleaves one after the other, each entry's windows numbered on across the parts."""

  def __init__(self, parts, batch_size: int):
    self.sources = list(dict.fromkeys(e.source for part in parts for e in part.entries))
    self.first_slot = np.cumsum([0] + [part.steps * batch_size for part in parts])
    self.orders = [part.order for part in parts]
    self.entry_of = [np.array([self.sources.index(e.source) for e in part.entries])
                     for part in parts]
    read = np.zeros(len(self.sources), np.int64)   # windows of each entry in earlier parts
    self.offsets = []
    for part, entry_of in zip(parts, self.entry_of):
      self.offsets.append(read.copy())
      np.add.at(read, entry_of, part.windows(batch_size))
    self.total = read

  def select(self, slots) -> tuple[np.ndarray, np.ndarray]:
    """(entry, index in that entry) of each slot of the phase, as int64 arrays."""
    slots = np.asarray(slots, dtype=np.int64)
    entry, index = np.empty_like(slots), np.empty_like(slots)
    part = np.searchsorted(self.first_slot[:-1], slots, side="right") - 1
    for j in np.unique(part):
      mine = part == j
      e, i = self.orders[j].select(slots[mine] - self.first_slot[j])
      entry[mine] = self.entry_of[j][e]
      index[mine] = i + self.offsets[j][entry[mine]]
    return entry, index

  def counts(self) -> dict[str, int]:
    """Counts the windows the phase reads of each entry."""
    return {s: int(n) for s, n in zip(self.sources, self.total)}


@dataclasses.dataclass(frozen=True)
class StageRead:
  """What one stage of data.mixture_stages reads: its steps, its phases and its tokens."""
  stage: Stage
  steps: int
  phases: tuple[int, ...]      # indices of the phases it spans
  tokens: dict                 # source -> data tokens, W - 1 per window


@dataclasses.dataclass(frozen=True)
class RunMixture:
  """A run's mixtures: the entries of its tst phases and of the others, the stages that
  change their weights by step, and the training split of each source's store. Phases are
  read by `steps`, `batch_size`, `window` and `is_tst`, as train.plan.Phase has them, and
  follow each other from step 0."""
  tst: tuple[Entry, ...]
  main: tuple[Entry, ...]
  splits: dict               # source -> its store's training StoreSplit
  stages: tuple[Stage, ...] = ()   # data.mixture_stages: every phase's weights by step

  @classmethod
  def of(cls, d, splits: dict | None = None) -> RunMixture:
    """Builds the mixtures of config.data `d`: data.tst_mixture for tst phases when set, else
    data.mixture, else data.source alone; data.mixture_stages' weights over them."""
    main = parse(d.mixture, "data.mixture") if d.mixture else (Entry(d.source, 1.0),)
    tst = parse(d.tst_mixture, "data.tst_mixture") if d.tst_mixture else main
    return cls(tst, main, splits or {}, stages(d.mixture_stages, main, "data.mixture_stages"))

  @property
  def sources(self) -> list[str]:
    """Every entry's source, once each, tst phases' first."""
    return list(dict.fromkeys(e.source for e in self.tst + self.main))

  def entries(self, phase) -> tuple[Entry, ...]:
    return self.tst if phase.is_tst else self.main

  def parts(self, phases) -> list[Part]:
    """Cuts the phases where a stage starts, so that each part reads one set of weights."""
    out, first = [], 0
    for index, p in enumerate(phases):
      if not self.stages:
        out.append(Part(index, None, p.steps, self.entries(p)))
      for k, stage in enumerate(self.stages):
        end = self.stages[k + 1].first_step if k + 1 < len(self.stages) else first + p.steps
        lo, hi = max(stage.first_step, first), min(end, first + p.steps)
        if lo < hi:
          out.append(Part(index, k, hi - lo, stage.entries))
      first += p.steps
    return out

  def draw(self, phases, index: int) -> Draw:
    """Returns the draw of phase `index`: its parts' interleaves."""
    return Draw([part for part in self.parts(phases) if part.phase == index],
                phases[index].batch_size)

  def windows(self, phases) -> list[dict[str, int]]:
    """Counts the windows each phase reads of each source, phase by phase."""
    return [self.draw(phases, index).counts() for index in range(len(phases))]

  def tokens_read(self, phases) -> list[dict[str, int]]:
    """Data tokens each phase reads of each source: W - 1 per window, as a phase's
    data_tokens count them."""
    return [{s: n * (p.window - 1) for s, n in w.items()}
            for w, p in zip(self.windows(phases), phases)]

  def stage_reads(self, phases) -> list[StageRead]:
    """What each stage reads, across the phases it spans: none without stages."""
    if not self.stages:
      return []
    steps, spans = [0] * len(self.stages), [[] for _ in self.stages]
    tokens = [dict.fromkeys((e.source for e in self.main), 0) for _ in self.stages]
    for part in self.parts(phases):
      p = phases[part.phase]
      for e, n in zip(part.entries, part.windows(p.batch_size)):
        tokens[part.stage][e.source] += int(n) * (p.window - 1)
      steps[part.stage] += part.steps
      spans[part.stage].append(part.phase)
    return [StageRead(stage, n, tuple(dict.fromkeys(span)), read)
            for stage, n, span, read in zip(self.stages, steps, spans, tokens)]

  def starts(self, phases, index: int) -> dict[str, int]:
    """Returns where phase `index` starts in each source's stream: where earlier phases left it."""
    start = dict.fromkeys(self.sources, 0)
    for read in self.tokens_read(phases[:index]):
      for source, n in read.items():
        start[source] += n
    return start

  def passes(self, phases, train_tokens: dict[str, int]) -> dict[str, list[float]]:
    """Counts how many times each phase reads each source's training tokens."""
    reads = self.tokens_read(phases)
    return {s: [r.get(s, 0) / train_tokens[s] for r in reads] for s in self.sources}

  def source(self, phases, index: int, *, seed: int, process_index: int = 0,
             process_count: int = 1) -> MixtureSource:
    """Returns the random-access source of this process's batches of phase `index`."""
    phase = phases[index]
    return MixtureSource(self.splits, self.draw(phases, index), self.starts(phases, index),
                         phase.batch_size, phase.window, seed=seed, num_batches=phase.steps,
                         process_index=process_index, process_count=process_count)

  def batches(self, phases, index: int, *, seed: int, process_index: int = 0,
              process_count: int = 1) -> grain.DatasetIterator:
    """Iterator of this process's batches of phase `index` (`pipeline.make_batches` for a
    mixture: resumable by `set_state`)."""
    return pipeline.batches_of(self.source(phases, index, seed=seed, process_index=process_index,
                                           process_count=process_count))

  def eval_rows(self, batch_size: int, num_batches: int) -> dict[str, int]:
    """Counts the held-out rows of each main entry's source in `num_batches` eval batches:
    its own held-out split must hold that many windows."""
    counts = interleave(tuple(e.weight for e in self.main)).counts(num_batches * batch_size)
    return {e.source: int(n) for e, n in zip(self.main, counts)}

  def eval_windows(self, vals: dict, *, batch_size: int, window: int, num_batches: int,
                   process_index: int = 0, process_count: int = 1) -> list[np.ndarray]:
    """`num_batches` int32 [B_local, W] held-out batches whose rows come from the main
    mixture's entries as its training rows do, each entry's spread over its own held-out
    split (`pipeline.eval_windows`): their mean loss is the mixture-weighted held-out loss."""
    entries = self.main
    order = interleave(tuple(e.weight for e in entries))
    entry_g, index_g = order.select(np.arange(num_batches * batch_size))
    rows_g = np.empty((len(entry_g), window), np.int32)
    for i, e in enumerate(entries):
      count = self.eval_rows(batch_size, num_batches)[e.source]
      spread = pipeline.eval_windows(vals[e.source], batch_size=count, window=window,
                                     num_batches=1) if count else [np.zeros((0, window))]
      if not spread:
        return []
      rows_g[entry_g == i] = spread[0][index_g[entry_g == i]]
    local = batch_size // process_count
    return [rows_g[k * batch_size + process_index * local:][:local]
            for k in range(num_batches)]


class MixtureSource:
  """Grain random-access source of a phase's batches from a mixture: item k is the int32
  [B_local, W] batch k. Slot g = k*B + r goes to entry `draw.select(g)` and to that entry's
  window of the same index in its own `WindowSource` (seeded order over its region of the
  phase)."""

  def __init__(self, splits: dict, draw: Draw, starts: dict[str, int], batch_size: int,
               window: int, *, seed: int, num_batches: int, process_index: int = 0,
               process_count: int = 1):
    if batch_size % process_count:
      raise ValueError(
          f"batch_size {batch_size} is not divisible by the number of processes {process_count}")
    self.draw = draw
    self.sources = [pipeline.WindowSource(splits[s], 1, window, starts[s], seed=seed,
                                          num_batches=n) for s, n in draw.counts().items()]
    self.batch_size, self.window, self.num_batches = batch_size, window, num_batches
    rows = batch_size // process_count
    self.rows = np.arange(process_index * rows, (process_index + 1) * rows)   # global rows

  def __len__(self) -> int:
    return self.num_batches

  def __getitem__(self, k: int) -> np.ndarray:
    entry_b, index_b = self.draw.select(int(k) * self.batch_size + self.rows)
    out = np.empty((len(self.rows), self.window), np.int32)
    for i, source in enumerate(self.sources):
      mine = entry_b == i
      if mine.any():
        out[mine] = source.windows(index_b[mine])
    return out
