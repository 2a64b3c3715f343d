"""The vocabulary of kernel optimization: an Opt (an OptOps, an axis, an amount), the KernelOptError that an illegal
one raises, the memory ops whose ShapeTrackers every opt reshapes, how a tensor core lies over a kernel's axes
(TensorCoreUse), and how a kernel's axes fold into a target's thread ids (fold_dims).
"""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import Optional
from tgrad.ops import UOp, Ops, is_gather_load
from tgrad.codegen.renderer import TensorCore
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import vmax_of
from tgrad.helpers import prod

class KernelOptError(Exception):
  """An optimization that is not legal for this kernel (wrong axis, amount that doesn't divide, …)."""

class OptOps(Enum):
  UPCAST = auto(); UNROLL = auto(); LOCAL = auto(); GROUP = auto(); GROUPTOP = auto()  # noqa: E702
  NOLOCALS = auto(); PADTO = auto(); SWAP = auto(); TC = auto(); THREAD = auto(); SMEM = auto()  # noqa: E702
  def __repr__(self): return f"OptOps.{self.name}"
  def __lt__(self, other): return self.value < other.value

@dataclass(frozen=True, order=True)
class Opt:
  op: OptOps
  axis: Optional[int] = None
  amount: Optional[int] = None
  def to_json(self) -> list: return [self.op.name, self.axis, self.amount]
  @staticmethod
  def from_json(x: list) -> Opt: return Opt(OptOps[x[0]], x[1], x[2])

MEMORY_OPS = (Ops.LOAD, Ops.STORE, Ops.CONST, Ops.ARANGE)


@dataclass(frozen=True)
class TensorCoreUse:
  """How OptOps.TC maps a kernel's reduce onto a tensor core: `reduce` = Σ a·b where `a` (a load of dtype_in, or for
  a TF32 core a float32 load rounded to TF32) varies with the tile's rows and `b` with its columns; rows_axis and
  columns_axis are the global axes that TC split (what is left of them counts tiles). `upcasts_before` counts the
  upcast axes made before TC (they stay before its own)."""
  core: TensorCore
  reduce: UOp
  a: UOp
  b: UOp
  rows_axis: int
  columns_axis: int
  upcasts_before: int = 0


def _compositions(n: int, parts: int):
  """Ways to cut n consecutive dims into `parts` non-empty runs, larger leading runs first."""
  if parts == 1:
    yield (n,)
    return
  for first in range(n - parts + 1, 0, -1):
    for rest in _compositions(n - first, parts - 1): yield (first,) + rest

def fold_dims(dims: tuple[int, ...], limits: tuple[int, ...]) -> list[tuple[int, ...]]:
  """Group consecutive dims into thread ids: at most len(limits) groups, each group's size within its id's limit.
  Returns the groups innermost first (group i is id i; limits[0] is x, the largest). Prefers one dim per id, then
  folding the leading dims together; the linearizer recovers each dim with // and %. Raises KernelOptError if no
  grouping fits."""
  if not dims: return []
  for n_ids in range(min(len(dims), len(limits)), 0, -1):
    for lengths in _compositions(len(dims), n_ids):
      groups, start = [], 0
      for length in lengths:
        groups.append(tuple(dims[start:start + length]))
        start += length
      groups.reverse()
      if all(vmax_of(prod(g)) <= limit for g, limit in zip(groups, limits)): return groups
  raise KernelOptError(f"dims {dims} do not fit thread ids with limits {limits}")

def memory_extent(memop: UOp, st: ShapeTracker) -> int:
  """1 + the largest element index a memory op may touch (0 if none): a gather's VIEW gives its first row; the loaded
  index may pick any row up to GatherAxis.size - 1."""
  extent = st.buffer_extent()
  if is_gather_load(memop) and extent > 0: extent += max(0, (memop.arg.size - 1) * memop.arg.stride)
  return extent
