"""Weighted mixtures of token stores: which entry each training window comes from, and where
in that entry's own store it starts.

A phase draws its B rows per step from the entries of its mixture. Slot g of the phase (row
g % B of batch g // B) goes to the entry that Grain's `MapDataset.mix` gives element g, and
to that entry's next window: the i-th slot of an entry reads window i of the entry's own
seeded shuffled order (`pipeline.WindowSource`), from where the entry stopped in the earlier
phases. So each entry reads its store as a single-source run reads its one store, and batch
k is a pure function of (stores, weights, seed, k): a resumed run draws the same batches.

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
                   f"> 0, the largest at most {_MAX_RATIO} times the smallest")


class Interleave:
  """Which entry each slot of a phase reads, and which of that entry's windows: Grain's
  `MapDataset.mix` of the weights, one period of it read and repeated."""

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
class RunMixture:
  """A run's mixtures: the entries of its tst phases and of the others, and the training
  split of each source's store. Phases are read by `steps`, `batch_size`, `window` and
  `is_tst`, as train.plan.Phase has them."""
  tst: tuple[Entry, ...]
  main: tuple[Entry, ...]
  splits: dict               # source -> its store's training StoreSplit

  @classmethod
  def of(cls, d, splits: dict | None = None) -> RunMixture:
    """Builds the mixtures of config.data `d`: data.tst_mixture for tst phases when set, else
    data.mixture, else data.source alone."""
    main = parse(d.mixture, "data.mixture") if d.mixture else (Entry(d.source, 1.0),)
    tst = parse(d.tst_mixture, "data.tst_mixture") if d.tst_mixture else main
    return cls(tst, main, splits or {})

  @property
  def sources(self) -> list[str]:
    """Every entry's source, once each, tst phases' first."""
    return list(dict.fromkeys(e.source for e in self.tst + self.main))

  def entries(self, phase) -> tuple[Entry, ...]:
    return self.tst if phase.is_tst else self.main

  def windows(self, phases) -> list[dict[str, int]]:
    """Counts the windows each phase reads of each source, phase by phase."""
    out = []
    for p in phases:
      entries = self.entries(p)
      counts = interleave(tuple(e.weight for e in entries)).counts(p.steps * p.batch_size)
      out.append({e.source: int(n) for e, n in zip(entries, counts)})
    return out

  def tokens_read(self, phases) -> list[dict[str, int]]:
    """Data tokens each phase reads of each source: W - 1 per window, as a phase's
    data_tokens count them."""
    return [{s: n * (p.window - 1) for s, n in w.items()}
            for w, p in zip(self.windows(phases), phases)]

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

  def batches(self, phases, index: int, *, seed: int, process_index: int = 0,
              process_count: int = 1) -> grain.DatasetIterator:
    """Iterator of this process's batches of phase `index` (`pipeline.make_batches` for a
    mixture: resumable by `set_state`)."""
    phase = phases[index]
    return pipeline.batches_of(MixtureSource(
        self.splits, self.entries(phase), self.windows(phases)[index],
        self.starts(phases, index), phase.batch_size, phase.window, seed=seed,
        num_batches=phase.steps, process_index=process_index, process_count=process_count))

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
  [B_local, W] batch k. Slot g = k*B + r goes to entry `select(g)` and to that entry's window
  of the same index in its own `WindowSource` (seeded order over its region of the phase)."""

  def __init__(self, splits: dict, entries: tuple[Entry, ...], windows: dict[str, int],
               starts: dict[str, int], batch_size: int, window: int, *, seed: int,
               num_batches: int, process_index: int = 0, process_count: int = 1):
    if batch_size % process_count:
      raise ValueError(
          f"batch_size {batch_size} is not divisible by the number of processes {process_count}")
    self.order = interleave(tuple(e.weight for e in entries))
    self.sources = [pipeline.WindowSource(splits[e.source], 1, window, starts[e.source],
                                          seed=seed, num_batches=windows[e.source])
                    for e in entries]
    self.batch_size, self.window, self.num_batches = batch_size, window, num_batches
    rows = batch_size // process_count
    self.rows = np.arange(process_index * rows, (process_index + 1) * rows)   # global rows

  def __len__(self) -> int:
    return self.num_batches

  def __getitem__(self, k: int) -> np.ndarray:
    entry_b, index_b = self.order.select(int(k) * self.batch_size + self.rows)
    out = np.empty((len(self.rows), self.window), np.int32)
    for i, source in enumerate(self.sources):
      mine = entry_b == i
      if mine.any():
        out[mine] = source.windows(index_b[mine])
    return out
