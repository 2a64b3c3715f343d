"""User fused kernels: a kernel with a reference in tgrad ops becomes a candidate lowering wherever the reference's
graph appears in a graph being realized.

`register_kernel(name, reference=, devices=, ...)` takes a kernel as CUDA C source or LLVM IR text (with its launch
rule, tgrad/custom.py gives the argument convention: the output buffer first, then the inputs in order, then the
launch's int64 scalars; LLVM adds the call index last) and/or a numpy callable (the NUMPY backend), and a reference:
a Python function of Tensors computing the same value. It registers a composite "user:<name>" (regions.register)
whose lowerings are "default" (the graph as written), "<name>" (the compiled source, on the device of its language)
and "<name>:numpy" (the numpy callable, on any of `devices`).

`find_sites(outs, kernel)` finds where the reference's graph appears: an exact structural match (see `_match`) of the
reference built on placeholder inputs against the unrealized graph above outs — the inputs are wildcards bound
consistently (one target value each), commutative ops' operands match in either order, views match by ShapeTracker
equality after the same movement ops, constants by value and type, reduces by op and axes. Shapes come first from a
shape-blind match (which also binds the wildcards), then the reference is built at those shapes and matched exactly,
so a site matches only where the reference at its own shapes is the very same graph. Each site is a `Region` of kind
"user:<name>" that PathSpace enumerates like a composite's. Beyond form, `equivalent_sites` matches by meaning:
a composite region (rms_norm, softmax, ...) whose function the graph-equivalence checker finds equal to the
reference (proven, or on random inputs) is a site too, however differently the reference is written. And
`subgraph_sites` matches by meaning anywhere else: for each unrealized float base (the root), from the outputs down,
the cuts below it of as many nodes as the reference has inputs (sets every path down passes through, within
MAX_FRONTIER_DEPTH ops; enumerated bottom-up over the graph, at most MAX_CUTS_PER_NODE per node), each in every
order whose shapes and dtypes give the reference the root's shape and dtype and whose body has the reference's
reduces, are compared with the reference: by canonical forms first (a few ms), then, for the few nearest in size
with inputs that are values of their own, on random inputs (budgets per graph: MAX_PROOFS_PER_GRAPH,
MAX_NUMERIC_CHECKS_PER_GRAPH). A user's own RMSNorm written as x / sqrt(Σx²/n + eps) or relu(a·b + c) written as
`(s > 0).where(s, 0)` is found so. Verdicts are remembered per body structure, sites per graph key.

Before first use, each lowering is verified at the site's shapes, dtypes and device against the reference on random
inputs (VERIFY_TOLERANCE); a lowering that fails (wrong values, or it does not compile or run) warns once
(UserKernelWarning), is recorded in `kernel.failures`, and is never offered.
"""
from __future__ import annotations
import math, warnings
from dataclasses import dataclass, field
import hashlib, inspect, itertools, json
from typing import Any, Callable, Optional, Sequence, Union
import numpy as np
from tgrad.backend import known_devices, language_devices
from tgrad.custom import NUMPY, HostFunction, SourceKernel, host_values
from tgrad.device import canonical_device
from tgrad.dtype import DType, dtypes
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import COMMUTATIVE, Ops
from tgrad.realize import realize
from tgrad.regions import DEFAULT, LOWERINGS, Lowering, Region, lowerings_for, regions_above, register, unregister
from tgrad.tensor import Tensor
from tgrad.paths.accuracy import errors
from tgrad.paths.graph import arg_text, graph_key, graph_nodes, placeholders, view_text
from tgrad.paths.observers import unobserved

USER_PREFIX = "user:"
NUMPY_SUFFIX = ":numpy"
VERIFY_SEED = 0
# max relative error (path.errors: over the larger of |reference| and 1e-3 × the largest |reference|) a kernel may
# show against the reference computed by tgrad in the same dtype: ~1000 eps of float32, a few eps of the half types
VERIFY_TOLERANCE = {dtypes.float64: 1e-10, dtypes.float32: 1e-4, dtypes.float16: 1e-2, dtypes.bfloat16: 5e-2}
USER_KERNEL_EXACTNESS = 0   # never the float64 reference: the reference graph (the default) is

class UserKernelWarning(UserWarning):
  """A registered kernel failed verification at some site: it is not used there."""

@dataclass(eq=False)
class UserKernel:
  """A registered kernel (see register_kernel). `failures`: (lowering, device, shapes, dtypes) → why it failed."""
  name: str
  reference: Callable[..., Tensor]
  devices: frozenset[str]
  sources: dict[str, str]                      # language → source
  entry: str
  launches: dict[str, Callable[..., Any]]      # language → launch rule
  numpy: Optional[Callable[..., np.ndarray]]
  verified: dict[tuple, str] = field(default_factory=dict, repr=False)   # key → "" (passed) or the failure
  patterns: dict[tuple, Any] = field(default_factory=dict, repr=False)   # (device, shapes, dtypes) → pattern
  root_op: Optional[Ops] = None                                # the reference's output op, once a pattern is built
  # (composite, params, device, input shapes, dtypes) → whether that composite computes the reference (equivalence)
  equal_composites: dict[tuple, bool] = field(default_factory=dict, repr=False)
  # a subgraph's structure (_body_key) → "proven", "numeric", "different" or "unproven"
  equal_subgraphs: dict[str, str] = field(default_factory=dict, repr=False)
  # a graph's key → its subgraph sites as (root, inputs) positions in graph.graph_nodes's order
  subgraph_sites: dict[str, list[tuple[int, tuple[int, ...]]]] = field(default_factory=dict, repr=False)
  @property
  def composite(self) -> str: return USER_PREFIX + self.name
  @property
  def failures(self) -> dict[tuple, str]: return {k: v for k, v in self.verified.items() if v}

USER_KERNELS: dict[str, UserKernel] = {}

def _per_language(value: Any, language: Optional[str], what: str) -> dict[str, Any]:
  if value is None: return {}
  languages = language_devices()
  if isinstance(value, dict):
    bad = [k for k in value if k not in languages]
    if bad: raise ValueError(f"{what}: unknown languages {bad}; use {sorted(languages)}")
    return dict(value)
  if language not in languages: raise ValueError(f"{what} needs language= one of {sorted(languages)}, got {language!r}")
  return {language: value}

def register_kernel(name: str, *, reference: Callable[..., Tensor], devices: Sequence[str],
                    source: Union[str, dict[str, str], None] = None, language: Optional[str] = None,
                    entry: Optional[str] = None, launch: Union[Callable, dict[str, Callable], None] = None,
                    numpy: Optional[Callable[..., np.ndarray]] = None) -> UserKernel:
  """Register a fused kernel (see the module doc). `source` and `launch` may be dicts by language ("cuda", "llvm") to
  give one kernel in both; `entry` is the kernel function's name (default: `name`); `launch(*input shapes)` returns a
  custom.Launch or (global_size, local_size[, scalars]); `numpy(*float64 arrays)` returns the output array. A new
  registration under a name replaces the old one."""
  if not name or ":" in name: raise ValueError(f"kernel name {name!r}: non-empty, without ':'")
  sources, launches = _per_language(source, language, f"kernel {name!r} source"), \
    _per_language(launch, language, f"kernel {name!r} launch")
  if set(sources) != set(launches):
    raise ValueError(f"kernel {name!r}: a launch rule for each source language (sources {sorted(sources)}, "
                     f"launch rules {sorted(launches)})")
  if not sources and numpy is None: raise ValueError(f"kernel {name!r}: give source= (with launch=) or numpy=")
  kernel = UserKernel(name, reference, frozenset(canonical_device(d) for d in devices), sources, entry or name,
                      launches, numpy)
  lowerings = {DEFAULT: Lowering(DEFAULT, f"the reference graph of {name} as written", reference, 1)}
  source_devices = frozenset(language_devices()[lang] for lang in sources) & kernel.devices
  if source_devices:
    lowerings[name] = Lowering(name, f"user kernel {name} ({', '.join(sorted(sources))})", _build(kernel, False),
                               USER_KERNEL_EXACTNESS, source_devices)
  if numpy is not None:
    lowerings[name + NUMPY_SUFFIX] = Lowering(name + NUMPY_SUFFIX, f"user kernel {name} in numpy on the host",
                                              _build(kernel, True), USER_KERNEL_EXACTNESS, kernel.devices, part=NUMPY)
  USER_KERNELS[name] = kernel
  register(kernel.composite, lowerings)
  return kernel

def unregister_kernel(name: str) -> None:
  if (kernel := USER_KERNELS.pop(name, None)) is not None: unregister(kernel.composite)

def _build(kernel: UserKernel, host: bool) -> Callable[..., Tensor]:
  """The lowering's build: a CUSTOM op of the kernel over the site's inputs (shape and dtype from the reference)."""
  def build(*inputs: Tensor) -> Tensor:
    shaped = kernel.reference(*inputs)   # only its shape and dtype: nothing runs
    in_shapes = tuple(tuple(x.shape) for x in inputs)
    device = inputs[0].device
    if host: custom = HostFunction(kernel.name, kernel.numpy, in_shapes, tuple(shaped.shape))
    else:
      language = next(lang for lang, dev in language_devices().items() if dev == device and lang in kernel.sources)
      custom = SourceKernel(kernel.name, language, kernel.sources[language], kernel.entry, kernel.launches[language],
                            in_shapes, tuple(shaped.shape))
    return Tensor(LazyBuffer.custom(custom, tuple(x.lazydata for x in inputs), shaped.shape, shaped.dtype),
                  requires_grad=False)
  return build

# ---- matching

def reference_pattern(kernel: UserKernel, device: str, shapes: Sequence[tuple[int, ...]], dtypes_: Sequence[DType]
                      ) -> tuple[LazyBuffer, list[LazyBuffer]]:
  """The reference's graph on placeholder inputs: (its output base, the placeholders), remembered per signature."""
  key = (device, tuple(map(tuple, shapes)), tuple(dtypes_))
  if key not in kernel.patterns:
    inputs = placeholders(device, shapes, dtypes_)
    out = kernel.reference(*[Tensor(p, requires_grad=False) for p in inputs]).lazydata
    if not (out.is_base or (out.st.contiguous and out.size == out.base.size)):
      raise ValueError(f"kernel {kernel.name!r}: the reference's result must be a computed value, not a view of one")
    kernel.patterns[key] = (out.base, inputs)
    kernel.root_op = out.base.op
  return kernel.patterns[key]

def _same_const(a: Any, b: Any) -> bool: return type(a) is type(b) and (a == b or (a != a and b != b))
def _same_arg(a: Any, b: Any) -> bool:
  return a is b or (not isinstance(a, np.ndarray) and type(a) is type(b) and a == b)

def _match(p: LazyBuffer, t: LazyBuffer, wild: dict[int, LazyBuffer], binding: dict[int, LazyBuffer],
           exact: bool) -> bool:
  """Whether target t is pattern p with the wildcards (placeholder id → placeholder) bound in `binding`
  (extended in place on success). Shape-blind when not exact: views are looked through, constants compare by op."""
  if id(p) in wild:
    bound = binding.get(id(p))
    if bound is not None: return bound is t
    if exact and (t.shape != p.shape or t.dtype != p.dtype): return False
    binding[id(p)] = t
    return True
  if not p.is_base:
    if t.is_base: return not exact and _match(p.base, t, wild, binding, exact)
    if exact and p.st != t.st: return False
    return _match(p.base, t.base, wild, binding, exact)
  if not t.is_base:
    if exact: return False
    t = t.base
  if t.buffer is not None or t.op is not p.op or t.dtype != p.dtype or len(t.srcs) != len(p.srcs): return False
  if t.device != p.device: return False
  if exact and t.shape != p.shape: return False
  if p.op is Ops.CONST: return not exact or _same_const(p.arg, t.arg)
  if p.op is Ops.REDUCE_AXIS and p.arg[:2] != t.arg[:2]: return False
  if p.op is not Ops.REDUCE_AXIS and exact and not _same_arg(p.arg, t.arg): return False
  orders = [t.srcs]
  if p.op in COMMUTATIVE and len(t.srcs) == 2: orders.append(t.srcs[::-1])
  for srcs in orders:
    trial = dict(binding)
    if all(_match(ps, ts, wild, trial, exact) for ps, ts in zip(p.srcs, srcs)):
      binding.clear()
      binding.update(trial)
      return True
  return False

@dataclass(frozen=True)
class Site:
  """Where a kernel's reference appears: the root (an unrealized base) and the target values bound to its inputs."""
  kernel: UserKernel
  root: LazyBuffer
  inputs: tuple[LazyBuffer, ...]

def find_sites(outs: Sequence[LazyBuffer], kernel: Union[UserKernel, Callable[..., Tensor]],
               example: Optional[tuple[Sequence[tuple[int, ...]], Sequence[DType]]] = None) -> list[Site]:
  """The sites of `kernel` (a registered kernel, or a bare reference function) in the unrealized graph above outs
  (see the module doc), in graph order; `example` (shapes, dtypes) only matches at those input shapes and dtypes."""
  if not isinstance(kernel, UserKernel):
    kernel = UserKernel(getattr(kernel, "__name__", "reference"), kernel, frozenset(known_devices()), {}, "", {}, None)
  sites: list[Site] = []
  for candidate in walk(outs, views=False, realized=False):   # depth-first pre-order (regions_above's order)
    if candidate.device not in kernel.devices or (kernel.root_op is not None and candidate.op is not kernel.root_op):
      continue
    if example is not None:
      shapes, dtypes_ = example
    else:   # a shape-blind match on a small pattern gives the input shapes and dtypes
      guess = _shape_guess(kernel, candidate)
      if guess is None: continue
      shapes, dtypes_ = guess
    try: root, placeholders = reference_pattern(kernel, candidate.device, shapes, dtypes_)
    except Exception: continue   # the reference does not apply at these shapes
    binding: dict[int, LazyBuffer] = {}
    wild = {id(p): p for p in placeholders}
    if _match(root, candidate, wild, binding, exact=True) and len(binding) == len(placeholders):
      sites.append(Site(kernel, candidate, tuple(binding[id(p)] for p in placeholders)))
  return sites

SHAPE_GUESS_SIZE = 4   # the shape-blind pattern is built with inputs of shape (4,) ... any shape would do

def _shape_guess(kernel: UserKernel, candidate: LazyBuffer) -> Optional[tuple[list, list]]:
  """Input shapes and dtypes for an exact match at `candidate`: bind the wildcards by a shape-blind match of the
  reference built at a probe shape (the candidate's own shape, for every input, of the candidate's dtype)."""
  arity = _arity(kernel)
  probe = tuple(candidate.shape) if candidate.shape else (SHAPE_GUESS_SIZE,)
  try: root, placeholders = reference_pattern(kernel, candidate.device, [probe] * arity, [candidate.dtype] * arity)
  except Exception: return None
  binding: dict[int, LazyBuffer] = {}
  wild = {id(p): p for p in placeholders}
  if not _match(root, candidate, wild, binding, exact=False) or len(binding) != arity: return None
  bound = [binding[id(p)] for p in placeholders]
  return [tuple(b.shape) for b in bound], [b.dtype for b in bound]

def _arity(kernel: UserKernel) -> int:
  params = inspect.signature(kernel.reference).parameters.values()
  return sum(1 for p in params if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                        p.POSITIONAL_OR_KEYWORD))

def equivalent_sites(outs: Sequence[LazyBuffer], kernel: UserKernel, taken: set[int]) -> list[Site]:
  """Sites found by meaning rather than by form: every composite region above outs (not already a site, roots in
  `taken`) whose function the graph-equivalence checker (tgrad/paths/equivalence.py) finds equal to the kernel's
  reference, proven or on random inputs, at the region's input shapes and dtypes. A reference written differently
  from the model's code (x / sqrt(...) against rsqrt, a mean as sum · 1/n) is found this way. Each (composite,
  params, signature) is checked once per kernel."""
  arity, sites = _arity(kernel), []
  for region in regions_above(*outs):
    root, inputs = region.root, region.inputs
    if region.name.startswith(USER_PREFIX) or id(root) in taken or len(inputs) != arity: continue
    if root.device not in kernel.devices or not root.dtype.is_float: continue
    if any(not isinstance(s, int) for x in inputs for s in x.shape): continue   # symbolic: no example inputs
    signature = (tuple(tuple(x.shape) for x in inputs), tuple(x.dtype for x in inputs))
    key = (region.name, region.params, root.device, signature)
    if key not in kernel.equal_composites: kernel.equal_composites[key] = _computes_reference(kernel, region)
    if kernel.equal_composites[key]: sites.append(Site(kernel, root, tuple(inputs)))
  return sites

def _computes_reference(kernel: UserKernel, region: Region) -> bool:
  from tgrad.paths.equivalence import equivalent   # sympy loads on the first check, not with tgrad
  build, params = LOWERINGS[region.name][DEFAULT].build, dict(region.params)
  examples = [Tensor(LazyBuffer.loadop(Ops.EMPTY, tuple(x.shape), x.dtype, x.device)) for x in region.inputs]
  try:
    with unobserved(), _Checking(): verdict = equivalent(lambda *xs: build(*xs, **params), kernel.reference, *examples)
  except Exception: return False   # the reference does not apply to these inputs
  return verdict.kind in ("proven", "numeric")

# ---- matching by meaning anywhere: a subgraph cut at its inputs

# Bounds of the search (subgraph_sites). The depth is counted in base ops between a root and its inputs (views add
# none): an RMSNorm written out (square, sum, scale, add eps, sqrt, reciprocal, multiply) is 7 deep, a layer norm
# ~10. The cuts kept per node bound the enumeration (linear in the graph's nodes). A candidate is first compared by
# canonical forms only (a sympy expression of each side, ~1-10 ms); the few nearest in size to the reference that
# are not proven so get a numeric check (it compiles and runs both sides, ~0.1-0.5 s on LLVM): at most
# MAX_NUMERIC_CHECKS_PER_GRAPH (root, cut) pairs per graph and kernel, each in every order of its inputs, those whose
# inputs are values of their own (leaves, or read outside the body) first, then the nearest in size.
MAX_FRONTIER_DEPTH = 12
MAX_CUTS_PER_NODE = 16
MAX_PROOFS_PER_GRAPH = 16   # (root, cut) pairs compared by canonical forms, each in every order of its inputs
MAX_NUMERIC_CHECKS_PER_GRAPH = 2
# a numeric check only for a body of at most this many times the reference's base ops (and at least 1/this): a
# function written differently is about as big (the where-form of relu(a·b + c) repeats a·b + c: 2×)
NUMERIC_SIZE_RATIO = 3
# ops a matched body may not hold: writes (a numeric check would run them), copies between devices, other kernels
NOT_IN_BODIES = frozenset({Ops.ASSIGN, Ops.COPY, Ops.CUSTOM, Ops.EMPTY})
PROVEN, NUMERIC, DIFFERENT, UNPROVEN = "proven", "numeric", "different", "unproven"   # kernel.equal_subgraphs values

def _cuts(outs: Sequence[LazyBuffer], number: dict[int, int], arity: int
          ) -> dict[int, list[tuple[tuple[int, ...], int]]]:
  """For each node above outs (by its number), its cuts of at most `arity` nodes: sets of nodes below it through
  which every path down to a leaf passes (constants are part of the body, not of a cut), as (sorted numbers, depth),
  the smallest and nearest first, at most MAX_CUTS_PER_NODE. A node is its own trivial cut; a leaf (a realized base,
  an EMPTY, host data) has no other; a view's other cuts are its base's (depth unchanged); a base op's are the unions
  of one cut per source, one deeper. This is the k-feasible cut enumeration of technology mapping, bounded by
  depth."""
  cuts: dict[int, list[tuple[tuple[int, ...], int]]] = {}
  for lb in walk(outs, "post"):
    me = number[id(lb)]
    if lb.is_unrealized_const():
      cuts[me] = [((), 0)]
      continue
    found = {(me,): 0}
    if not lb.is_base: found.update((c, d) for c, d in cuts[number[id(lb.base)]] if c not in found)
    elif lb.buffer is None and lb.srcs:
      merged: dict[tuple[int, ...], int] = {(): 0}
      for src in lb.srcs:
        step: dict[tuple[int, ...], int] = {}
        for have, have_depth in merged.items():
          for cut, depth in cuts[number[id(src)]]:
            union = tuple(sorted(set(have) | set(cut)))
            deeper = max(have_depth, depth + 1)
            if len(union) <= arity and deeper <= MAX_FRONTIER_DEPTH and deeper < step.get(union, deeper + 1):
              step[union] = deeper
        merged = step
      for cut, depth in merged.items():
        if cut and cut not in found: found[cut] = depth
    cuts[me] = sorted(found.items(), key=lambda item: (len(item[0]), item[1], item[0]))[:MAX_CUTS_PER_NODE]
  return cuts

def _body(root: LazyBuffer, frontier: Sequence[LazyBuffer]) -> list[LazyBuffer]:
  """The nodes from root down to the frontier (excluded), each after its sources."""
  stop = {id(x) for x in frontier}
  return list(walk([root], "post", stop=lambda lb: id(lb) in stop))

def _subgraph_function(root: LazyBuffer, frontier: Sequence[LazyBuffer]) -> Callable[..., Tensor]:
  """f(*inputs): root's value with each frontier node replaced by the input at its position (the body rebuilt)."""
  body = _body(root, frontier)
  def f(*inputs: Tensor) -> Tensor:
    made = {id(x): t.lazydata for x, t in zip(frontier, inputs)}
    for lb in body:
      if not lb.is_base:
        base = made.get(id(lb.base), lb.base)
        made[id(lb)] = LazyBuffer(base.device, lb.st, lb.dtype, base=base if base.is_base else base.contiguous())
      elif not lb.srcs: made[id(lb)] = lb   # a constant: shared
      else: made[id(lb)] = LazyBuffer(lb.device, lb.st, lb.dtype, lb.op, tuple(made[id(s)] for s in lb.srcs), lb.arg)
    return Tensor(made[id(root)], requires_grad=False)
  return f

def _ops(lbs: Sequence[LazyBuffer]) -> list[LazyBuffer]:
  return [lb for lb in lbs if lb.is_base and lb.buffer is None and lb.srcs]

def _reduces(lbs: Sequence[LazyBuffer]) -> list[str]:
  """The reduce ops among lbs, sorted: equal functions written differently keep their reductions (a mean is a sum
  and a scale, a norm's Σx² one sum), so a body whose reduces differ from the reference's is not checked."""
  return sorted(lb.arg[0].name for lb in lbs if lb.is_base and lb.op is Ops.REDUCE_AXIS)

@dataclass(frozen=True)
class _Candidate:
  """A root and one order of a cut below it whose shapes, dtypes and reduces fit the reference; `distance`: how far
  its body's op count is from the reference's (the numeric checks go to the nearest)."""
  root: LazyBuffer
  frontier: tuple[LazyBuffer, ...]
  key: str          # the body's structure (_body_key)
  distance: float
  outside: float    # the share of its inputs that are leaves or read outside its body (values of their own)

def _body_key(body: Sequence[LazyBuffer], frontier: Sequence[LazyBuffer]) -> str:
  """The structure of a body (from _body) over its frontier, in graph_key's terms: ops, dtypes, shapes, args, views
  and edges, with each input named by its position (the inputs' order is part of what the body computes)."""
  number = {id(x): f"in{i}" for i, x in enumerate(frontier)}
  entries: list[Any] = []
  for i, lb in enumerate(body):
    number[id(lb)] = str(i)
    if not lb.is_base: entries.append(["view", view_text(lb.st), number[id(lb.base)]])
    else: entries.append([lb.op.name, lb.device, str(lb.dtype), arg_text(lb.shape), arg_text(lb.arg),
                          [number[id(s)] for s in lb.srcs]])
  return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()

def _placeholders_like(frontier: Sequence[LazyBuffer]) -> list[Tensor]:
  return [Tensor(LazyBuffer.loadop(Ops.EMPTY, tuple(x.shape), x.dtype, x.device), requires_grad=False)
          for x in frontier]

def _candidates(kernel: UserKernel, root: LazyBuffer, frontier: list[LazyBuffer], readers: dict[int, set[int]],
                outputs: dict[tuple, Optional[tuple]]) -> list[_Candidate]:
  """The orders of frontier (permutations in walk order) that give the reference root's shape and dtype, when the
  body has the reference's reduces and none of NOT_IN_BODIES. `readers`: node id → ids of the nodes reading it;
  `outputs`: (input shapes, dtypes) → the reference's (output shape, dtype, reduces, op count), or None where it
  does not apply (filled in)."""
  body: Optional[list[LazyBuffer]] = None
  found = []
  for order in itertools.permutations(frontier):
    signature = (tuple(tuple(x.shape) for x in order), tuple(x.dtype for x in order))
    if signature not in outputs: outputs[signature] = _reference_output(kernel, root.device, *signature)
    if (output := outputs[signature]) is None: continue
    shape, dtype, reduces, op_count = output
    if shape != root.shape or dtype != root.dtype: continue
    if body is None:
      body = _body(root, frontier)
      if any(lb.is_base and lb.op in NOT_IN_BODIES for lb in body): return []
      body_reduces, body_ops = _reduces(body), len(_ops(body))
    if reduces != body_reduces: return []
    inside = {id(lb) for lb in body}
    outside = sum(1 for x in frontier if not readers.get(id(x), set()) <= inside or x.base.buffer is not None)
    found.append(_Candidate(root, tuple(order), _body_key(body, order),
                            abs(math.log(max(body_ops, 1) / max(op_count, 1))), outside / len(frontier)))
  return found

def _reference_output(kernel: UserKernel, device: str, shapes: tuple, dtypes_: tuple) -> Optional[tuple]:
  try: pattern, _ = reference_pattern(kernel, device, shapes, dtypes_)
  except Exception: return None   # the reference does not apply to these inputs
  pattern_body = _body(pattern, ())
  return pattern.shape, pattern.dtype, _reduces(pattern_body), len(_ops(pattern_body))

def _proven(kernel: UserKernel, candidate: _Candidate) -> str:
  """PROVEN when the candidate's canonical form is the reference's, else UNPROVEN (DIFFERENT when the reference
  fails on its inputs)."""
  from tgrad.paths.equivalence import prove   # sympy loads on the first check, not with tgrad
  placeholders = _placeholders_like(candidate.frontier)
  try:
    with Tensor.no_grad():
      mine = _subgraph_function(candidate.root, candidate.frontier)(*placeholders)
      theirs = kernel.reference(*placeholders)
      if theirs.shape != mine.shape or theirs.dtype != mine.dtype: return DIFFERENT
      proof = prove([mine], [theirs], [p.lazydata for p in placeholders], thorough=False)
  except Exception: return DIFFERENT
  return PROVEN if proof is not None else UNPROVEN

def _numerically_equal(kernel: UserKernel, candidate: _Candidate) -> str:
  """NUMERIC or DIFFERENT: the equivalence checker on random inputs (its canonical-form proof already failed)."""
  from tgrad.paths.equivalence import equivalent   # sympy loads on the first check, not with tgrad
  examples = [Tensor(LazyBuffer.loadop(Ops.EMPTY, tuple(x.shape), x.dtype, x.device)) for x in candidate.frontier]
  try:
    with unobserved(), _Checking():
      verdict = equivalent(_subgraph_function(candidate.root, candidate.frontier), kernel.reference, *examples,
                           thorough=False)
  except Exception: return DIFFERENT
  return NUMERIC if verdict.kind != "different" else DIFFERENT

def _covered(sites: Sequence[Site]) -> set[int]:
  """The nodes computed by sites (each root and its body down to its inputs), by id."""
  return {id(lb) for site in sites for lb in _body(site.root, site.inputs)}

def subgraph_sites(outs: Sequence[LazyBuffer], kernel: UserKernel, covered: set[int]) -> list[Site]:
  """Sites found by meaning anywhere: an unrealized float base (not in `covered`, ids of nodes already computed by a
  site) whose body down to a cut of as many nodes as the reference has inputs computes the reference. Candidates:
  for each root, from the outputs down, its cuts (see _cuts), each in every order whose shapes and dtypes give the
  reference the root's shape and dtype, with the reference's reduces. Pass 1 compares canonical forms (the first
  proven candidate of a root is a site, its body covered: an outer match wins); pass 2 runs the numeric check on
  the remaining candidates nearest in size to the reference (MAX_NUMERIC_CHECKS_PER_GRAPH (root, cut) pairs).
  Verdicts are remembered per body structure (kernel.equal_subgraphs), the sites per graph (kernel.subgraph_sites,
  by graph_key and walk positions): a graph built again (a decode step) costs one walk and one key."""
  nodes = graph_nodes(list(outs))
  number = {id(lb): i for i, lb in enumerate(nodes)}
  graph = f"{graph_key(list(outs))}:{sorted(number[i] for i in covered if i in number)}"
  if graph in kernel.subgraph_sites:
    return [Site(kernel, nodes[r], tuple(nodes[i] for i in inputs)) for r, inputs in kernel.subgraph_sites[graph]]
  readers: dict[int, set[int]] = {}
  for lb in nodes:
    for src in ((lb.base,) if not lb.is_base else lb.srcs if lb.buffer is None else ()):
      readers.setdefault(id(src), set()).add(id(lb))
  arity = _arity(kernel)
  cuts = _cuts(outs, number, arity) if arity else {}
  sites: list[Site] = []
  covered, unproven, proofs = set(covered), [], MAX_PROOFS_PER_GRAPH
  outputs: dict[tuple, Optional[tuple]] = {}
  for root in nodes:
    if not root.is_base or root.buffer is not None or not root.srcs or id(root) in covered: continue
    if root.device not in kernel.devices or not root.dtype.is_float or root.op in NOT_IN_BODIES: continue
    if any(not isinstance(s, int) for s in root.shape): continue   # symbolic: no example inputs
    candidates: list[_Candidate] = []
    for cut, _ in cuts.get(number[id(root)], []):
      if len(cut) != arity or cut == (number[id(root)],): continue
      frontier = [nodes[i] for i in cut]
      if any(not isinstance(s, int) for x in frontier for s in x.shape): continue
      candidates += _candidates(kernel, root, frontier, readers, outputs)
    proven_pairs: set[tuple[int, ...]] = set()
    # inputs that are values of their own first, then the nearest in size (a stable sort: cut order among equals)
    for candidate in sorted(candidates, key=lambda c: (-c.outside, c.distance)):
      verdict = kernel.equal_subgraphs.get(candidate.key)
      pair = tuple(sorted(number[id(x)] for x in candidate.frontier))
      if verdict is None and (pair in proven_pairs or len(proven_pairs) < proofs):
        proven_pairs.add(pair)
        verdict = kernel.equal_subgraphs[candidate.key] = _proven(kernel, candidate)
      if verdict in (PROVEN, NUMERIC):
        sites.append(Site(kernel, root, candidate.frontier))
        covered |= _covered(sites[-1:])
        break
      if verdict == UNPROVEN and candidate.distance <= math.log(NUMERIC_SIZE_RATIO): unproven.append(candidate)
    proofs -= len(proven_pairs)
  groups: dict[tuple[int, ...], list[_Candidate]] = {}   # (root, cut) → its candidate orders
  for candidate in sorted(unproven, key=lambda c: (-c.outside, c.distance)):
    pair = (number[id(candidate.root)], *sorted(number[id(x)] for x in candidate.frontier))
    groups.setdefault(pair, []).append(candidate)
  numeric_checks = MAX_NUMERIC_CHECKS_PER_GRAPH
  for group in groups.values():
    if id(group[0].root) in covered: continue
    unknown = [c for c in group if kernel.equal_subgraphs[c.key] == UNPROVEN]
    if unknown:
      if numeric_checks <= 0: continue   # later groups may still be known from an earlier graph
      numeric_checks -= 1
    for candidate in group:
      if kernel.equal_subgraphs[candidate.key] == UNPROVEN:
        kernel.equal_subgraphs[candidate.key] = _numerically_equal(kernel, candidate)
      if kernel.equal_subgraphs[candidate.key] == NUMERIC:
        sites.append(Site(kernel, candidate.root, candidate.frontier))
        covered |= _covered(sites[-1:])
        break
  kernel.subgraph_sites[graph] = [(number[id(s.root)], tuple(number[id(x)] for x in s.inputs)) for s in sites]
  return sites

class _Checking:
  """Whether an equivalence check runs its trial graphs now: their realizes look for no sites (a trial graph is a
  candidate's body, whose search would start the same check again)."""
  depth = 0
  def __enter__(self) -> None: _Checking.depth += 1
  def __exit__(self, *_) -> None: _Checking.depth -= 1

def user_regions(outs: Sequence[LazyBuffer]) -> list[Region]:
  """A Region ("user:<name>", the bound inputs, the site's root) for every site of every registered kernel: the
  structural sites (find_sites), then composite regions equivalent to the reference (equivalent_sites), then any
  other subgraph equivalent to it (subgraph_sites). None while an equivalence check runs its trials."""
  if _Checking.depth: return []
  regions: list[Region] = []
  for kernel in list(USER_KERNELS.values()):
    sites = find_sites(outs, kernel)
    sites += equivalent_sites(outs, kernel, {id(site.root) for site in sites})
    sites += subgraph_sites(outs, kernel, _covered(sites))
    for site in sites: regions.append(Region(kernel.composite, site.inputs, (), site.root))
  return regions

# ---- verification

def verified_lowerings(region: Region) -> list[str]:
  """lowerings_for(region), without the user-kernel lowerings that fail verification at this site."""
  names = lowerings_for(region)
  if not region.name.startswith(USER_PREFIX): return names
  kernel = USER_KERNELS[region.name[len(USER_PREFIX):]]
  return [n for n in names if n == DEFAULT or verify(kernel, n, region) == ""]

def verify(kernel: UserKernel, lowering: str, region: Region) -> str:
  """"" when lowering `lowering` of the kernel computes its reference at this site's signature (remembered), else
  why not (warned once)."""
  device = region.root.device
  shapes, in_dtypes = tuple(tuple(x.shape) for x in region.inputs), tuple(x.dtype for x in region.inputs)
  key = (lowering, device, shapes, in_dtypes)
  if key not in kernel.verified:
    kernel.verified[key] = reason = _check(kernel, lowering, device, shapes, in_dtypes)
    if reason:
      warnings.warn(f"user kernel {kernel.name!r} ({lowering}) failed verification on {device} for inputs {shapes} "
                    f"{[str(d) for d in in_dtypes]}: {reason}; it will not be used there", UserKernelWarning,
                    stacklevel=2)
  return kernel.verified[key]

def _random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
  if dtype.is_float: return rng.standard_normal(shape).astype(np.float32 if dtype == dtypes.bfloat16 else dtype.np)
  if dtype == dtypes.bool: return rng.random(shape) < 0.5
  return rng.integers(-8, 8, shape).astype(dtype.np)

def _check(kernel: UserKernel, lowering: str, device: str, shapes: tuple, in_dtypes: tuple) -> str:
  rng = np.random.default_rng(VERIFY_SEED)
  try:
    inputs = [Tensor(_random_input(rng, s, d), device=device).cast(d).realize() for s, d in zip(shapes, in_dtypes)]
    want = kernel.reference(*inputs).lazydata.contiguous()
    got = LOWERINGS[kernel.composite][lowering].build(*inputs).lazydata.contiguous()
    realize(want, got)
    reference, values = host_values(want.base.buffer, want.shape), host_values(got.base.buffer, got.shape)
  except Exception as failure:
    return f"{type(failure).__name__}: {failure}"
  error = errors([values], [reference])[0] if values.shape == reference.shape else float("inf")
  bound = VERIFY_TOLERANCE.get(want.dtype, 0.0)
  return "" if error <= bound else f"max relative error {error:.3g} against the reference (allowed {bound:g})"
