"""Paths: the ways to realize a set of tensors, enumerated lazily, run, and measured for time and error.

A path fixes, for the tensors being realized, the lowering of every composite region in their graph (see
tgrad/regions.py), the opts of every kernel ("heuristic", or "beam2": BEAM=2's searched winners) and the
device. `PathSpace(outs)` finds the regions (at their default lowerings) and how they nest: a region inside another
one's default body only exists while that one keeps its default, so a path gives an inner region a lowering only
then; this makes paths distinct graphs and lets `count` be exact before iterating (a product over top-level regions
of a sum over their lowerings). `iterate` yields, in a deterministic order, first the *uniform* paths (each composite
name lowered one way everywhere: the few paths a profiler should measure first), then every other path.

`measure(space, path)` runs a path without committing anything (the graph stays unrealized, so every path runs on the
same inputs; buffers that an ASSIGN writes are restored after each run), timing each launch (device events on CUDA),
and compares its outputs with the float64 reference of the same graph (tgrad/paths/graph.py) with the most exact
lowerings: max absolute and max relative error (accuracy.py).
"""
from __future__ import annotations
import contextlib, hashlib, itertools, json
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional, Sequence
import numpy as np
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import Ops
from tgrad.device import Buffer
from tgrad.helpers import Context
from tgrad.custom import host_values
from tgrad.shape.sint import evaluate
from tgrad.schedule import create_schedule
from tgrad.realize import lower_schedule, realize
from tgrad.regions import DEFAULT, Region, apply_lowering, lowering_part, reference_lowering, regions_above
from tgrad.paths.accuracy import errors, relative_floor
from tgrad.paths.graph import graph_key, graph_description, reference_graph
from tgrad.paths.user_kernels import USER_KERNELS, USER_PREFIX, user_regions, verified_lowerings

OPTS_CHOICES = ("heuristic", "beam2")   # what a path may say about kernel opts (beam2: searched with BEAM=2)
DEFAULT_REPEATS = 5

@dataclass(frozen=True)
class ExecutionPath:
  """One way to realize a PathSpace's tensors: a lowering per region (in the space's region order), opts, device."""
  choices: tuple[str, ...]
  names: tuple[str, ...]    # the composite name of each region, for the description
  opts: str
  device: str
  parts: tuple[str, ...] = ()   # the devices it uses: its own first, then others its lowerings run on ("NUMPY", ...)
  space: Optional[PathSpace] = field(default=None, compare=False, repr=False)   # the graph it is a path of
  @property
  def id(self) -> str:
    text = json.dumps([list(self.names), list(self.choices), self.opts, self.device], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
  @property
  def description(self) -> str:
    """Non-default lowerings grouped by composite ("tanh=native ×3"), then opts and device."""
    groups: dict[tuple[str, str], int] = {}
    for name, choice in zip(self.names, self.choices):
      if choice != DEFAULT: groups[(name, choice)] = groups.get((name, choice), 0) + 1
    lowered = ", ".join(f"{n}={c}" + (f" ×{k}" if k > 1 else "") for (n, c), k in sorted(groups.items()))
    where = self.device if len(self.parts) <= 1 else " + ".join(self.parts)
    return f"{lowered or 'all default'}; opts {self.opts}; {where}"

class PathSpace:
  """The paths of realizing `outs` (LazyBuffers), over the regions of their unrealized graph."""
  def __init__(self, outs: Sequence[LazyBuffer], opts: Sequence[str] = ("heuristic",)):
    bad = [o for o in opts if o not in OPTS_CHOICES]
    if bad: raise ValueError(f"unknown opts choices {bad}: use {OPTS_CHOICES}")
    self.outs = list(outs)
    if not self.outs: raise ValueError("no tensors to realize")
    if any(o.base.buffer is not None for o in self.outs): raise ValueError("a tensor to realize is already realized")
    self.opts = tuple(opts)
    self.device = self.outs[0].device
    self.regions: list[Region] = regions_above(*self.outs)
    if any(r.current != DEFAULT for r in self.regions):
      raise ValueError("a region is already lowered away from its default: paths start from the graph as built")
    if USER_KERNELS: self.regions = _in_graph_order(self.outs, self.regions + user_regions(self.outs))
    # a user kernel's lowering is offered only where it passed verification (user_kernels.verify)
    self.options: list[list[str]] = [verified_lowerings(r) for r in self.regions]
    self.names = tuple(r.name for r in self.regions)
    self.parent = self._nesting()
    self.children: dict[Optional[int], list[int]] = {}
    for i, p in enumerate(self.parent): self.children.setdefault(p, []).append(i)
    self.key = graph_key(self.outs)
    user = sorted({r.name for r in self.regions if r.name.startswith(USER_PREFIX)})
    if user:   # the user kernels that apply are part of what a record of this graph's paths means
      self.key = hashlib.sha256(json.dumps([self.key, user]).encode()).hexdigest()
    # what errors are measured on: every output but a write into part of a buffer (an ASSIGN with a region, e.g. one
    # KV cache slot), whose buffer holds values the graph doesn't compute; what it writes is checked through the
    # outputs that read it
    self.compared = [o for o in self.outs if not (o.base.op is Ops.ASSIGN and o.base.arg is not None)] or self.outs

  def _nesting(self) -> list[Optional[int]]:
    """For each region, the innermost region whose default body holds its root (None at top level)."""
    index: dict[int, list[int]] = {}   # a root → its regions (a user kernel's site may share a composite's root)
    for i, r in enumerate(self.regions): index.setdefault(id(r.root), []).append(i)
    parent: list[Optional[int]] = [None] * len(self.regions)
    depth: list[int] = [0] * len(self.regions)
    for i, region in enumerate(self.regions):   # outer regions come first (depth-first from the roots)
      inputs = {id(x) for x in region.inputs}
      for j in index[id(region.root)]:   # a later region on the same root lies inside this one
        if j > i and parent[j] is None: parent[j], depth[j] = i, depth[i] + 1
      for lb in walk(region.root.srcs, stop=lambda lb: id(lb) in inputs):
        for j in index.get(id(lb), ()):
          if j != i and (parent[j] is None or depth[i] >= depth[parent[j]]): parent[j], depth[j] = i, depth[i] + 1
    return parent

  def description(self) -> dict: return graph_description(self.outs)

  # ---- counting and enumerating
  def _count_of(self, i: int) -> int:
    inner = 1
    for c in self.children.get(i, []): inner *= self._count_of(c)
    return sum(inner if name == DEFAULT else 1 for name in self.options[i])
  @property
  def count(self) -> int:
    """The exact number of distinct paths (before iterating)."""
    total = len(self.opts)
    for top in self.children.get(None, []): total *= self._count_of(top)
    return total

  def _assignments(self, i: int) -> Iterator[dict[int, str]]:
    for name in self.options[i]:
      if name != DEFAULT:
        yield {i: name}
        continue
      kids = self.children.get(i, [])
      for parts in itertools.product(*[list(self._assignments(c)) for c in kids]):
        yield {i: DEFAULT, **{k: v for part in parts for k, v in part.items()}}

  def _path(self, assignment: dict[int, str], opts: str) -> ExecutionPath:
    choices = tuple(assignment.get(i, DEFAULT) for i in range(len(self.regions)))
    return self._make(self._canonical(choices), opts)

  def _make(self, choices: tuple[str, ...], opts: str) -> ExecutionPath:
    return ExecutionPath(choices, self.names, opts, self.device, self.parts_of(choices))

  def parts_of(self, choices: Sequence[str]) -> tuple[str, ...]:
    """The devices a path with these (canonical) lowerings uses: the space's device, then each other part in region
    order (a lowering's `part`: "LLVM" for on_LLVM, "NUMPY" for the host backend)."""
    parts = [self.device]
    for region, choice in zip(self.regions, choices):
      part = lowering_part(region, choice)
      if part is not None and part not in parts: parts.append(part)
    return tuple(parts)

  def _canonical(self, choices: tuple[str, ...]) -> tuple[str, ...]:
    """Regions inside a non-default ancestor don't exist on that path: they read as default."""
    out = list(choices)
    for i in range(len(out)):
      p = self.parent[i]
      while p is not None:
        if choices[p] != DEFAULT:
          out[i] = DEFAULT
          break
        p = self.parent[p]
    return tuple(out)

  def uniform_paths(self, opts: str) -> Iterator[ExecutionPath]:
    """One lowering per composite name everywhere it is valid (default elsewhere): first all defaults, then one name
    changed, then two, ... (the most informative measurements first), names in first-seen order."""
    names = list(dict.fromkeys(self.names))
    # each name's alternatives, those on the regions' own device first: a host path (numpy, on_LLVM) is rarely the
    # fastest of a device graph, so a profiler with a path budget measures it last
    first = {n: i for i, n in reversed(list(enumerate(self.names)))}
    alternatives = [sorted((c for c in dict.fromkeys(c for i, n in enumerate(self.names) if n == name
                                                     for c in self.options[i]) if c != DEFAULT),
                           key=lambda c, i=first[name]: (self._elsewhere(i, c), c)) for name in names]
    for changed in range(len(names) + 1):   # within a level, paths with fewer host lowerings first
      level = []
      for which in itertools.combinations(range(len(names)), changed):
        for combo in itertools.product(*[alternatives[w] for w in which]):
          elsewhere = sum(self._elsewhere(first[names[w]], c) for w, c in zip(which, combo))
          level.append((elsewhere, len(level), dict(zip((names[w] for w in which), combo))))
      for _, _, chosen in sorted(level, key=lambda entry: entry[:2]):
        choices = tuple(chosen[n] if n in chosen and chosen[n] in self.options[i] else DEFAULT
                        for i, n in enumerate(self.names))
        yield self._make(self._canonical(choices), opts)

  def _elsewhere(self, i: int, lowering: str) -> bool:
    """Whether region i's lowering runs off the region's device (copies there and back)."""
    region = self.regions[i]
    if region.name.startswith(USER_PREFIX) or lowering == DEFAULT: return False
    return lowering_part(region, lowering) is not None

  def __iter__(self) -> Iterator[ExecutionPath]:
    """Every distinct path once: uniform paths first, then the rest in lowering order, region by region."""
    seen: set[tuple] = set()
    for opts in self.opts:
      for path in self.uniform_paths(opts):
        if path.choices not in seen:
          seen.add(path.choices)
          yield replace(path, space=self)
      tops = self.children.get(None, [])
      for parts in itertools.product(*[list(self._assignments(t)) for t in tops]) if tops else [()]:
        path = self._path({k: v for part in parts for k, v in part.items()}, opts)
        if path.choices not in seen:
          seen.add(path.choices)
          yield replace(path, space=self)
      seen.clear()

  # ---- applying
  @contextlib.contextmanager
  def applied(self, choices: Sequence[str]) -> Iterator[None]:
    """The graph with these lowerings applied (outer regions first); back to the defaults afterwards."""
    try:
      for region, name in zip(self.regions, choices):
        if name != DEFAULT: apply_lowering(region, name)
      yield
    finally:
      for region in reversed(self.regions):
        if region.current != DEFAULT: apply_lowering(region, DEFAULT)

  def exact_choices(self) -> tuple[str, ...]:
    """The lowerings of the float64 reference: each region's most exact one (composite.reference_lowering)."""
    return self._canonical(tuple(reference_lowering(r) if reference_lowering(r) in opts else DEFAULT
                                 for r, opts in zip(self.regions, self.options)))

def _in_graph_order(outs: Sequence[LazyBuffer], regions: list[Region]) -> list[Region]:
  """Regions by their root's first visit depth-first from outs (regions_above's order); on one root, a user kernel's
  site (which then holds the composite) first."""
  order = {id(lb): position for position, lb in enumerate(walk(outs))}
  return sorted(regions, key=lambda r: (order[id(r.root)], not r.name.startswith(USER_PREFIX)))

def iterate(*tensors, opts: Sequence[str] = ("heuristic",)) -> PathSpace:
  """The paths of realizing these Tensors: a PathSpace (iterate it; `len()`-like `.count`)."""
  return PathSpace([t.lazydata for t in tensors], opts)

def _beam(opts: str) -> int: return 2 if opts == "beam2" else 0

def realize_path(path: ExecutionPath, space: Optional[PathSpace] = None) -> None:
  """Realize the tensors of the path's space (or of `space`) along `path`, committing, as Tensor.realize does."""
  space = space or path.space
  if space is None: raise ValueError(f"path {path.id} has no graph: pass the PathSpace it came from")
  if path.device != space.device or len(path.choices) != len(space.regions):
    raise ValueError(f"path {path.id} is not a path of this graph ({len(space.regions)} regions on {space.device})")
  for region, name in zip(space.regions, path.choices):
    if name != DEFAULT: apply_lowering(region, name)
  with Context(BEAM=_beam(path.opts)): realize(*space.outs)

# ---- measuring

@dataclass(frozen=True)
class Run:
  """One measured path: every timing (seconds per run of all its launches) and its errors against the reference."""
  path: ExecutionPath
  times: tuple[float, ...]
  max_rel_error: float
  max_abs_error: float
  kernels: int
  error: str = ""   # why the run failed ("" when it ran)

def _run_unrealized(space: PathSpace, repeats: int) -> tuple[list[float], list[np.ndarray], int]:
  """Schedule without committing, run `repeats` times (after one warm-up run that compiles), read the outputs."""
  buffers: dict[LazyBuffer, Buffer] = {}
  items = create_schedule(space.outs, commit=False, buffers=buffers)
  exec_items = lower_schedule(items)
  inputs = {id(b) for b in _realized_buffers(space.outs)}
  written = {id(b): b for item in items for b in item.outputs if id(b) in inputs}   # ASSIGN targets
  saved = {k: b.copyout() for k, b in written.items()}
  times: list[float] = []
  for repeat in range(repeats + 1):
    elapsed = sum(item.run(wait=True) or 0.0 for item in exec_items)
    if repeat: times.append(elapsed)
    if repeat == repeats: outputs = [_values(buffers[o.base], o.base) for o in space.compared]
    for k, b in written.items(): b.copyin(saved[k])
  return times, outputs, len(exec_items)

def _realized_buffers(outs: list[LazyBuffer]) -> list[Buffer]:
  """The Buffers of the realized inputs of the graph above outs."""
  return [lb.buffer for lb in walk(outs, views=False) if lb.buffer is not None]

def _values(buffer: Buffer, base: LazyBuffer) -> np.ndarray:
  """A realized base's values as float64 (bfloat16 from its raw bits; a symbolic size at its bound value). Outputs
  are compared as the bases the kernels write: a view of one only selects or repeats those values."""
  return host_values(buffer, tuple(evaluate(s) for s in base.shape)).astype(np.float64)

def reference_outputs(space: PathSpace) -> list[np.ndarray]:
  """The float64 reference of the space's outputs, computed on the LLVM device with the most exact lowerings."""
  with space.applied(space.exact_choices()):
    bases = [r.base for r in reference_graph(space.compared)]
  realize(*bases)
  return [_values(b.buffer, b) for b in bases]

def measure(space: PathSpace, path: ExecutionPath, reference: Optional[list[np.ndarray]] = None,
            repeats: int = DEFAULT_REPEATS) -> Run:
  """Run `path` on the space's graph `repeats` times (nothing committed) and measure its error."""
  if reference is None: reference = reference_outputs(space)
  try:
    with space.applied(path.choices), Context(BEAM=_beam(path.opts)):
      times, outputs, kernels = _run_unrealized(space, repeats)
  except Exception as failure:   # a path that does not compile or run is recorded as failed, never chosen
    return Run(path, (), float("inf"), float("inf"), 0, f"{type(failure).__name__}: {failure}")
  max_rel, max_abs = errors(outputs, reference, [relative_floor(o.dtype) for o in space.compared])
  return Run(path, tuple(times), max_rel, max_abs, kernels)

