"""Paths: the ways to realize a set of tensors, enumerated lazily, run, and measured for time and error.

A path fixes, for the tensors being realized, the lowering of every composite region in their graph (see
tgrad/tensor_ops/composite.py), the opts of every kernel ("heuristic", or "beam2": BEAM=2's searched winners) and the
device. `PathSpace(outs)` finds the regions (at their default lowerings) and how they nest: a region inside another
one's default body only exists while that one keeps its default, so a path gives an inner region a lowering only
then; this makes paths distinct graphs and lets `count` be exact before iterating (a product over top-level regions
of a sum over their lowerings). `iterate` yields, in a deterministic order, first the *uniform* paths (each composite
name lowered one way everywhere: the few paths a profiler should measure first), then every other path.

`measure(space, path)` runs a path without committing anything (the graph stays unrealized, so every path runs on the
same inputs; buffers that an ASSIGN writes are restored after each run), timing each launch (device events on CUDA),
and compares its outputs with the float64 reference of the same graph (tgrad/paths/graph.py) with the most exact
lowerings: max absolute error, and max relative error — each element's error over the larger of its reference
magnitude and a floor: √ε of the output's dtype times the output's largest reference magnitude. Below that floor an
element's error is set by the rounding of the large values it was computed from (in float16 a logit near 0 carries
the error of the products of size ~max that made it), not by its own magnitude; √ε is 3.5e-4 of the largest value
in float32, 3.1e-2 in float16, 8.8e-2 in bfloat16.
"""
from __future__ import annotations
import contextlib, hashlib, itertools, json, math
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional, Sequence
import numpy as np
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.dtype import DType, dtypes
from tgrad.device import Buffer
from tgrad.helpers import Context
from tgrad.custom import host_values
from tgrad.shape.sint import evaluate
from tgrad.schedule import create_schedule
from tgrad.realize import lower_schedule, realize
from tgrad.tensor_ops.composite import Region, apply_lowering, lowering_part, reference_lowering, \
  regions_above
from tgrad.paths.graph import graph_key, graph_description, reference_graph
from tgrad.paths.user_kernels import USER_KERNELS, USER_PREFIX, user_regions, verified_lowerings

OPTS_CHOICES = ("heuristic", "beam2")   # what a path may say about kernel opts (beam2: searched with BEAM=2)
DEFAULT_REPEATS = 5
DEFAULT = "default"

@dataclass(frozen=True)
class Path:
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
      seen, stack = set(), list(region.root.srcs)
      while stack:
        lb = stack.pop()
        if id(lb) in seen or id(lb) in inputs: continue
        seen.add(id(lb))
        for j in index.get(id(lb), ()):
          if j != i and (parent[j] is None or depth[i] >= depth[parent[j]]): parent[j], depth[j] = i, depth[i] + 1
        base = lb.base
        if base is not lb: stack.append(base)
        elif base.buffer is None: stack.extend(base.srcs)
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

  def _path(self, assignment: dict[int, str], opts: str) -> Path:
    choices = tuple(assignment.get(i, DEFAULT) for i in range(len(self.regions)))
    return self._make(self._canonical(choices), opts)

  def _make(self, choices: tuple[str, ...], opts: str) -> Path:
    return Path(choices, self.names, opts, self.device, self.parts_of(choices))

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

  def uniform_paths(self, opts: str) -> Iterator[Path]:
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

  def __iter__(self) -> Iterator[Path]:
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
  order: dict[int, int] = {}
  stack = list(outs[::-1])
  while stack:
    lb = stack.pop()
    if id(lb) in order: continue
    order[id(lb)] = len(order)
    if not lb.is_base: stack.append(lb.base)
    elif lb.buffer is None: stack.extend(lb.srcs[::-1])
  return sorted(regions, key=lambda r: (order[id(r.root)], not r.name.startswith(USER_PREFIX)))

def iterate(*tensors, opts: Sequence[str] = ("heuristic",)) -> PathSpace:
  """The paths of realizing these Tensors: a PathSpace (iterate it; `len()`-like `.count`)."""
  return PathSpace([t.lazydata for t in tensors], opts)

def _beam(opts: str) -> int: return 2 if opts == "beam2" else 0

def realize_path(path: Path, space: Optional[PathSpace] = None) -> None:
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
  path: Path
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
  found, seen, stack = [], set(), list(outs)
  while stack:
    lb = stack.pop()
    if id(lb) in seen: continue
    seen.add(id(lb))
    if lb.base is not lb: stack.append(lb.base)
    elif lb.buffer is not None: found.append(lb.buffer)
    else: stack.extend(lb.srcs)
  return found

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

def relative_floor(dtype: DType) -> float:
  """√ε of a float dtype (see the module doc); exact dtypes (ints, bools, float64) get float64's."""
  return math.sqrt(float(np.finfo(dtype.np if dtype.is_float and dtype.itemsize < 8 else np.float64).eps)) \
    if dtype != dtypes.bfloat16 else math.sqrt(2.0 ** -7)

def errors(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray],
           floors: Optional[Sequence[float]] = None) -> tuple[float, float]:
  """(max relative, max absolute) error over all outputs; see the module doc for the relative floor. Equal values
  (the same infinity, NaN against NaN) are exact; NaN against a number, or a number against an infinity, is an
  infinite error."""
  max_rel = max_abs = 0.0
  floors = floors or [relative_floor(dtypes.float32)] * len(outputs)
  for out, ref, relative_to in zip(outputs, reference, floors):
    if out.size == 0: continue
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
      equal = (out == ref) | (np.isnan(out) & np.isnan(ref))
      diff = np.where(equal, 0.0, np.abs(out - ref))
      diff = np.where(np.isnan(diff), np.inf, diff)
      finite = np.abs(ref[np.isfinite(ref)])
      floor = max(relative_to * (float(finite.max()) if finite.size else 1.0), np.finfo(np.float64).tiny)
      scale = np.maximum(np.where(np.isfinite(ref), np.abs(ref), 1.0), floor)
      relative = np.where(np.isinf(diff), np.inf, diff / scale)
    max_abs = max(max_abs, float(diff.max()))
    max_rel = max(max_rel, float(relative.max()))
  return max_rel, max_abs

def measure(space: PathSpace, path: Path, reference: Optional[list[np.ndarray]] = None,
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

