"""Composite regions of the lazy graph and their lowerings: the registry, finding regions, applying a lowering.

A composite op (exp, tanh, softmax, matmul, ...) survives in the lazy graph as a named `Region` (docs/paths.md): a
Tensor method calls `composite(name, inputs, **params)`, which builds the composite's "default" lowering (with
autograd: the graph, kernels and results are exactly those of a plain method) and marks the output's base as the
region's root (`LazyBuffer.region`): the composite's name, its input values, its params and that base. A later step
lists `regions_above(*outputs)`, asks `lowerings_for(region)` and calls `apply_lowering(region, name)`, which rewrites
the root (`LazyBuffer.rewrite`) to compute the alternative, built from the inputs without autograd;
`apply_lowering(region, "default")` puts the graph as built back. Gradients keep coming from the default's Functions:
they hold the default's intermediate values, which an alternative never changes.

The registry (`register(name, lowerings)`, `unregister(name)`, read through `LOWERINGS`) maps each composite to its
`Lowering`s. tensor_ops/composite.py registers the Tensor-level decompositions; tgrad/paths/user_kernels.py registers
user kernels. A lowering's build takes and returns the front end's values (Tensors): this module imports nothing
above the lazy graph, so the front end names its value type once (`bind_value_type`).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from tgrad.backend import device_kind
from tgrad.helpers import prod
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import Ops

DEFAULT = "default"

@dataclass(frozen=True)
class Lowering:
  """One way to compute a composite: `build(*input values, **params) -> value` from front-end ops (Tensors).
  `exactness` ranks the lowerings of one composite against a float64 reference (highest: the most exact)."""
  name: str                     # stable: it goes in the benchmark database
  description: str
  build: Callable[..., Any]
  exactness: int
  devices: Optional[frozenset[str]] = None   # None: every device
  dtypes: Optional[frozenset] = None          # of the composite's output; None: every float dtype
  part: Optional[str] = None                  # where its work runs when not on the region's device ("LLVM", NUMPY)

@dataclass(eq=False)
class Region:
  """One composite in the lazy graph: `root` is an unrealized base whose value is its output, computed now by the
  lowering `current`. The alternatives built so far are kept, so switching back and forth builds nothing twice."""
  name: str
  inputs: tuple[LazyBuffer, ...]
  params: tuple[tuple[str, Any], ...]    # sorted (name, value) pairs, JSON-able
  root: LazyBuffer
  current: str = DEFAULT
  _alternatives: dict[str, tuple] = field(default_factory=dict, repr=False)   # lowering → the root's (op, srcs, arg)

  def move_to(self, root: LazyBuffer) -> None:
    """The region's output is now computed at `root` (a base rewritten to compute it: copy coalescing); the old
    root is no region's."""
    self.root.set_region(None)
    self.root = root
    root.set_region(self)

# ---------------------------------------------------------------------------------------------------------------
# the registry

LOWERINGS: dict[str, dict[str, Lowering]] = {}   # composite → lowering name → Lowering (change it through register)
_REFERENCES: dict[str, str] = {}   # composite → its float64 reference's lowering, where that is not the most exact

def register(name: str, lowerings: dict[str, Lowering], reference: Optional[str] = None) -> None:
  """Register (or replace) composite `name` with its lowerings, "default" first. `reference`: the lowering of its
  float64 reference, when that is not the most exact one (a composite whose alternatives compute a different function
  from the one asked for, e.g. gelu's erf form and its tanh approximation, is referenced by its default)."""
  if next(iter(lowerings), None) != DEFAULT: raise ValueError(f"composite {name!r}: the default lowering comes first")
  if reference is not None and reference not in lowerings:
    raise ValueError(f"composite {name!r}: its reference lowering {reference!r} is not one of {list(lowerings)}")
  LOWERINGS[name] = dict(lowerings)
  if reference is not None: _REFERENCES[name] = reference
  else: _REFERENCES.pop(name, None)

def unregister(name: str) -> None:
  LOWERINGS.pop(name, None)
  _REFERENCES.pop(name, None)

_value_type: Optional[Callable[..., Any]] = None

def bind_value_type(value_type: Callable[..., Any]) -> None:
  """The front end's value type (tgrad.Tensor): lowerings are built on `value_type(lb, requires_grad=False)`, and
  give values whose `.lazydata` is a LazyBuffer."""
  global _value_type
  _value_type = value_type

# ---------------------------------------------------------------------------------------------------------------
# regions

def composite(name: str, inputs: tuple[Any, ...], **params) -> Any:
  """The composite `name` of `inputs` (front-end values) by its default lowering, with autograd, its output's base
  marked as the region's root when the output is that base or a contiguous reshape of it (a composite whose output is
  some other view of a value gets no region: rewriting that value would change more than the composite). A region on
  a base that already has one (a composite whose default is another composite) replaces it: the outer one names the
  whole value."""
  out = LOWERINGS[name][DEFAULT].build(*inputs, **params)
  lb = out.lazydata
  if not isinstance(lb, LazyBuffer) or any(not isinstance(t.lazydata, LazyBuffer) for t in inputs):
    return out   # over sharded values (tgrad/multi/): no region, the default lowering
  root = lb.base
  if root.buffer is None and root.srcs and (lb is root or (lb.st.contiguous and lb.size == root.size)):
    root.set_region(Region(name, tuple([t.lazydata for t in inputs]), tuple(sorted(params.items())), root))
  return out

def _valid(region: Region, lowering: Lowering) -> bool:
  device, dtype = device_kind(region.root.device), region.root.dtype
  if lowering.devices is not None and device not in lowering.devices: return False
  if lowering.name == DEFAULT: return True
  return dtype in lowering.dtypes if lowering.dtypes is not None else dtype.is_float

def lowerings_for(region: Region) -> list[str]:
  """The lowerings valid for the region's device and output dtype: "default" first, then the rest sorted."""
  valid = [name for name, lowering in LOWERINGS[region.name].items() if name != DEFAULT and _valid(region, lowering)]
  return [DEFAULT] + sorted(valid)

def lowering_part(region: Region, name: str) -> Optional[str]:
  """Where lowering `name` of the region runs when not on the region's device ("LLVM", "NUMPY"), else None."""
  return LOWERINGS[region.name][name].part

def apply_lowering(region: Region, name: str) -> None:
  """Make the region's root compute lowering `name`: it takes the op, sources and arg of the alternative's output
  (built once from the inputs, without autograd); when that output is a view (a reshape of a base of another shape),
  the root becomes a CAST to its own dtype of it, an elementwise identity that fuses. "default" restores the graph as
  built exactly. ValueError for an unknown lowering, one not valid for the device or dtype, or a realized root."""
  lowerings = LOWERINGS[region.name]
  if name not in lowerings:
    raise ValueError(f"composite {region.name!r} has no lowering {name!r}; it has {list(lowerings)}")
  if not _valid(region, lowerings[name]):
    raise ValueError(f"lowering {name!r} of composite {region.name!r} is not valid on {region.root.device} for "
                     f"{region.root.dtype}; valid: {lowerings_for(region)}")
  root = region.root
  if root.buffer is not None:
    raise ValueError(f"composite {region.name!r} is already realized: lowering {name!r} can't be applied")
  if name == DEFAULT: root.rewrite(*root.as_built)
  else:
    if name not in region._alternatives: region._alternatives[name] = _build_alternative(region, lowerings[name])
    root.rewrite(*region._alternatives[name])
  region.current = name

def _build_alternative(region: Region, lowering: Lowering) -> tuple:
  if _value_type is None: raise RuntimeError("no front end is bound (regions.bind_value_type): import tgrad first")
  root = region.root
  out = lowering.build(*[_value_type(lb, requires_grad=False) for lb in region.inputs],
                       **dict(region.params)).lazydata
  if out.dtype != root.dtype or out.size != prod(root.shape):
    raise RuntimeError(f"lowering {lowering.name!r} of {region.name!r} gives {out.shape} {out.dtype}, not "
                       f"{root.shape} {root.dtype}")
  out = out.reshape(root.shape)
  if out.is_base and out.buffer is None and out.srcs: return (out.op, out.srcs, out.arg)
  return (Ops.CAST, (out,), None)

def regions_above(*lbs: LazyBuffer) -> list[Region]:
  """The regions in the unrealized graph above `lbs` under the current lowerings: depth-first from the roots in
  order, each region at its first visit (so an enclosing region comes before the regions inside it)."""
  return [lb.region for lb in walk(lbs, realized=False) if lb.region is not None]

def exact_lowering(name: str) -> str:
  """The most exact lowering of composite `name` (the highest exactness; on a tie, the first registered)."""
  lowerings = list(LOWERINGS[name].values())
  return max(lowerings, key=lambda lowering: (lowering.exactness, -lowerings.index(lowering))).name

def reference_lowering(region: Region) -> str:
  """The lowering of the float64 reference of `region`: the most exact way to compute the function it asks for (so
  a path's error measures how far it is from *that* function; see `register`'s `reference`)."""
  return _REFERENCES.get(region.name) or exact_lowering(region.name)
