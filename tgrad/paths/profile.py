"""The profiler: measure the paths of every graph a program realizes, and record them in the benchmark database.

`Profiler` watches Tensor-level realizes (installed with `watching()`): before a graph that holds composite regions
is realized, it enumerates the graph's paths (uniform paths first, see path.py), computes the float64 reference once,
and measures each path not yet recorded for this hardware and tgrad version (so a rerun resumes where the last one
stopped), within a time budget and a per-graph path limit. Each measurement becomes a database row; a path whose
error passes the dtype's sanity bound, or that fails to compile or run, is recorded as failed and never selected.
Then the program's own realize goes on as usual. The inputs are the program's own (the record says so). A graph with
round trips to another device (coalesce.py) also gets what coalescing compares measured: each copy, and the region
alone on both devices (over random inputs).
"""
from __future__ import annotations
import contextlib, dataclasses, itertools, time
from typing import Iterator, Optional, Sequence
import numpy as np
from tqdm import tqdm
from tgrad.device import Device
from tgrad.lazy import LazyBuffer
from tgrad.regions import composite
from tgrad.tensor import Tensor
from tgrad.paths.coalesce import HOST, copy_key, find_round_trips, record_copy_times
from tgrad.paths.db import Measurement, PathsDB, sanity_bound
from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version
from tgrad.helpers import code_settings
from tgrad.paths.graph import ReferenceUnavailable
from tgrad.paths.observers import observers
from tgrad.paths.path import DEFAULT, ExecutionPath, PathSpace, measure, reference_outputs, DEFAULT_REPEATS
from tgrad.paths import select

INPUT_DISTRIBUTION = "the profiled program's own inputs"
DEFAULT_BUDGET_SECONDS = 600.0
DEFAULT_MAX_PATHS = 64

STANDALONE_SEED = 0

def standalone_region(region, device: str):
  """The region alone on `device`: its composite over random realized inputs of its input shapes and dtypes (the
  graph coalesce.region_key names)."""
  rng = np.random.default_rng(STANDALONE_SEED)
  inputs = tuple(Tensor(rng.standard_normal(x.shape).astype(np.float32), device=device).cast(x.dtype).realize()
                 for x in region.inputs)
  return composite(region.name, inputs, **dict(region.params))

class Profiler:
  def __init__(self, db: Optional[PathsDB] = None, budget: float = DEFAULT_BUDGET_SECONDS,
               max_paths: int = DEFAULT_MAX_PATHS, opts: Sequence[str] = ("heuristic",),
               repeats: int = DEFAULT_REPEATS, progress: bool = True, composites: Optional[Sequence[str]] = None):
    if not budget > 0: raise ValueError(f"Profiler: budget must be > 0 seconds, got {budget}")
    if max_paths < 1: raise ValueError(f"Profiler: max_paths must be >= 1, got {max_paths}")
    if repeats < 1: raise ValueError(f"Profiler: repeats must be >= 1, got {repeats}")
    self.db = db or select.database()
    self.budget, self.max_paths, self.opts, self.repeats = budget, max_paths, tuple(opts), repeats
    # only paths that lower these composites (the rest at their defaults), and the all-default path; None: all
    self.composites = frozenset(composites) if composites is not None else None
    self.deadline = time.monotonic() + budget
    self.graphs_seen: set[str] = set()
    self.measured = self.skipped = self.failed = 0
    self.bar = tqdm(total=round(budget), unit="s", desc="profiling paths", disable=not progress,
                    bar_format="{desc}: {n:.0f}/{total:.0f}s budget |{bar}| {postfix} [{elapsed}<{remaining}]")
    self._last = time.monotonic()

  def _candidates(self, space: PathSpace) -> Iterator[ExecutionPath]:
    """The paths to measure, in the space's order. With `composites`, the uniform paths (one lowering per composite
    name everywhere) that change only those composites: a bounded list, where filtering the whole space would walk
    its product of every region's lowerings (10^90 paths for a Gemma decode step) looking for more matches."""
    if self.composites is None:
      yield from space
      return
    seen: set[tuple] = set()
    for opts in space.opts:
      for path in space.uniform_paths(opts):
        if path.choices in seen or not all(choice == DEFAULT or name in self.composites
                                           for name, choice in zip(space.names, path.choices)): continue
        seen.add(path.choices)
        yield dataclasses.replace(path, space=space)

  def out_of_budget(self) -> bool: return time.monotonic() >= self.deadline

  def _tick(self) -> None:
    now = time.monotonic()
    self.bar.update(min(now - self._last, max(0.0, self.bar.total - self.bar.n)))
    self._last = now
    self.bar.set_postfix_str(f"{len(self.graphs_seen)} graphs, {self.measured} paths measured, "
                             f"{self.skipped} already recorded, {self.failed} failed")

  def observe(self, outs: Sequence[LazyBuffer]) -> None:
    """Measure the paths of realizing outs (not yet realized); called before the program's realize."""
    outs = [o for o in outs if o.base.buffer is None]
    if not outs or self.out_of_budget(): return
    self._round_trips(outs)
    try: space = PathSpace(outs, self.opts)
    except ValueError: return
    if not space.regions or space.key in self.graphs_seen: return
    self.graphs_seen.add(space.key)
    fingerprint, version, settings = hardware_fingerprint(space.device), tgrad_version(), code_settings()
    recorded = {r.path_id for r in self.db.runs(space.key, space.device)
                if r.fingerprint == fingerprint and r.tgrad_version == version and r.settings == settings}
    reference = None
    description = space.description()
    for path in itertools.islice(self._candidates(space), self.max_paths):
      if self.out_of_budget(): break
      if path.id in recorded:
        self.skipped += 1
        continue
      if reference is None:
        try: reference = reference_outputs(space)
        except ReferenceUnavailable: return
      run = measure(space, path, reference, self.repeats)
      bound = min(sanity_bound(o.dtype) for o in outs)
      failed = bool(run.error) or not run.max_rel_error <= bound
      error = run.error or (f"max relative error {run.max_rel_error:.3g} beyond the sanity bound {bound:g}"
                            if failed else "")
      self.db.add(Measurement(
        graph_key=space.key, graph_desc=description, path_id=path.id, path_desc=path.description,
        device=space.device, parts=path.parts, fingerprint=fingerprint, tgrad_version=version,
        settings=settings, times=run.times, max_rel_error=run.max_rel_error, max_abs_error=run.max_abs_error,
        input_distribution=INPUT_DISTRIBUTION, status="failed" if failed else "ok", error=error,
        measured_at=time.time(), choices=path.choices, opts=path.opts))
      self.measured += 1
      self.failed += failed
      self._tick()
    select.forget()   # the database changed: selections are made again from it

  def _round_trips(self, outs: Sequence[LazyBuffer]) -> None:
    """For each round trip copy coalescing would judge (coalesce.py), measure what it compares: the region alone on
    LLVM and on the other device (as graphs over random realized inputs, profiled like any graph) and each copy."""
    for trip in find_round_trips(outs):
      region, device = trip.region, trip.device
      if not Device.available(device) or self.out_of_budget(): continue
      copies = [(HOST, device, x.shape, x.dtype) for x in region.inputs] + \
               [(device, HOST, region.root.shape, region.root.dtype)]
      for source, destination, shape, dtype in copies:
        if not self.db.runs(copy_key(source, destination, shape, dtype), destination):
          record_copy_times(self.db, source, destination, shape, dtype, self.repeats)
      for where in (HOST, device): self.observe([standalone_region(region, where).lazydata])

  def close(self) -> None:
    self._tick()
    self.bar.close()

@contextlib.contextmanager
def watching(profiler: Profiler) -> Iterator[Profiler]:
  """Within the scope, every Tensor-level realize is profiled first."""
  observers.append(profiler.observe)
  try: yield profiler
  finally:
    observers.remove(profiler.observe)
    profiler.close()
