"""ShapeTracker: a stack of Views, the whole history of movement ops between a buffer and the shape a kernel reads.

`views[-1]` is what loop indices index; each earlier view is indexed by the flat (row-major) position the view after
it produces, and `views[0]` maps into memory. Movement ops apply to the last view; a reshape that it cannot express
pushes a new contiguous View. `to_indexed(idxs)` gives the simplified (memory index, valid) UOps for loop indices.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Sequence
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import Ops, UOp, simplify as simplify_uop, split_terms
from tgrad.shape.view import View, EMPTY_RANGE

def loop_index(axis: int, size: int) -> UOp:
  """The loop variable of `axis` running over [0, size): the index UOps the shape layer reasons with."""
  return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), UOp.const(dtypes.index, size)), arg=axis)

def unravel(flat: UOp, shape: tuple[int, ...]) -> list[UOp]:
  """Row-major indices of `shape` for a flat position in [0, prod(shape)). The outermost non-1 dim needs no `%`."""
  idxs: list[UOp] = []
  inner = 1
  outermost = next((d for d, s in enumerate(shape) if s != 1), len(shape))
  for d in reversed(range(len(shape))):
    if shape[d] == 1: idxs.append(UOp.const(dtypes.index, 0))
    else:
      quotient = flat if inner == 1 else flat // inner
      idxs.append(quotient if d == outermost else quotient % shape[d])
    inner *= shape[d]
  return idxs[::-1]

def _conjuncts(valid: UOp) -> list[UOp]:
  return [c for s in valid.src for c in _conjuncts(s)] if valid.op is Ops.AND else [valid]

def _bound_of(clause: UOp) -> Optional[tuple[UOp, int, int]]:
  """(x, lo, hi) when the clause says lo <= x < hi for an int x: `x < c`, `c < x` or `not (x < c)`."""
  if clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True:
    inner = clause.src[0]
    if inner.op is Ops.CMPLT and inner.src[1].op is Ops.CONST and inner.src[0].dtype.is_int:
      return inner.src[0], inner.src[1].arg, inner.src[0].vmax + 1
    return None
  if clause.op is not Ops.CMPLT or not clause.src[0].dtype.is_int: return None
  left, right = clause.src
  if right.op is Ops.CONST and left.op is not Ops.CONST: return left, left.vmin, right.arg
  if left.op is Ops.CONST and right.op is not Ops.CONST: return right, left.arg + 1, right.vmax + 1
  return None

NARROWED_NAME = "\x00valid_narrowed"   # names of the stand-in variables; no user variable is called this

def simplify_given_valid(index: UOp, valid: UOp) -> tuple[UOp, UOp]:
  """Simplify (index, valid) where the index only matters while valid holds: each bound `lo <= x < hi` in valid
  narrows x to a variable with that range while the index and the other clauses are simplified."""
  valid = simplify_uop(valid)
  bounds: dict[UOp, tuple[int, int]] = {}
  others: list[UOp] = []
  for clause in _conjuncts(valid):
    if (bound := _bound_of(clause)) is None:
      others.append(clause)
      continue
    x, lo, hi = bound
    old_lo, old_hi = bounds.get(x, (x.vmin, x.vmax + 1))
    bounds[x] = (max(old_lo, lo), min(old_hi, hi))
  if any(lo >= hi for lo, hi in bounds.values()): return simplify_uop(index), UOp.const(dtypes.bool, False)
  narrowed = {x: UOp.variable(f"{NARROWED_NAME}{k}", lo, hi - 1, x.dtype) for k, (x, (lo, hi)) in enumerate(bounds.items())}
  restore = {v: x for x, v in narrowed.items()}
  def given_bounds(u: UOp) -> UOp: return simplify_uop(simplify_uop(u).substitute(narrowed)).substitute(restore)
  clauses = [c for x, (lo, hi) in bounds.items() for c in
             ((UOp.const(x.dtype, lo - 1).lt(x),) if lo > x.vmin else ()) + ((x.lt(hi),) if hi <= x.vmax else ())]
  clauses += [given_bounds(c) for c in others]
  if any(c.op is Ops.CONST and not c.arg for c in clauses): return simplify_uop(index), UOp.const(dtypes.bool, False)
  new_valid = UOp.const(dtypes.bool, True)
  for c in clauses:
    if c.op is not Ops.CONST: new_valid = c if new_valid.op is Ops.CONST else new_valid & c
  return given_bounds(index), new_valid

def _view_from_index(shape: tuple[int, ...], idxs: list[UOp], index: UOp, valid: UOp) -> Optional[View]:
  """The View whose index math is (index, valid) over `idxs`, if index is linear in them and valid is a conjunction
  of bounds on single indices; else None."""
  terms, offset = split_terms(index)
  if any(all(t is not idx for idx in idxs) for t in terms): return None
  strides = [terms.get(idx, 0) for idx in idxs]
  mask = [(0, s) for s in shape]
  axis_of = {idx: d for d, idx in enumerate(idxs)}
  for clause in _conjuncts(valid):
    if clause.op is Ops.CONST:
      if not clause.arg: mask = [EMPTY_RANGE] * len(shape)
      continue
    if clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True:   # not (idx < c)
      negated, clause = True, clause.src[0]
    else: negated = False
    if clause.op is not Ops.CMPLT: return None
    left, right = clause.src
    if left in axis_of and right.op is Ops.CONST:
      d = axis_of[left]
      mask[d] = (max(mask[d][0], right.arg), mask[d][1]) if negated else (mask[d][0], min(mask[d][1], right.arg))
    elif right in axis_of and left.op is Ops.CONST and not negated:
      d = axis_of[right]
      mask[d] = (max(mask[d][0], left.arg + 1), mask[d][1])
    else: return None
  return View.create(shape, strides, offset, mask)

def _merge_views(first: View, second: View) -> Optional[View]:
  """One View equal to `second` indexing into `first`, or None."""
  if first.contiguous: return second
  if first.is_fully_masked() and second.ndim > 0: return View.create(second.shape, mask=(EMPTY_RANGE,) * second.ndim)
  if second.contiguous and second.size == first.size: return first.reshape(second.shape)
  idxs = [loop_index(d, s) for d, s in enumerate(second.shape)]
  index, valid = ShapeTracker((first, second)).to_indexed(idxs)
  return _view_from_index(second.shape, idxs, index, valid)

@dataclass(frozen=True)
class ShapeTracker:
  """A stack of Views: views[-1] is indexed by the loop indices, views[0] maps into memory."""
  views: tuple[View, ...]

  @staticmethod
  def from_shape(shape: Sequence[int]) -> ShapeTracker: return ShapeTracker((View.create(shape),))
  @property
  def shape(self) -> tuple[int, ...]: return self.views[-1].shape
  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous
  def __repr__(self): return f"ShapeTracker(views={self.views!r})"

  # ---- movement ops
  def _with_last(self, view: View) -> ShapeTracker: return ShapeTracker(self.views[:-1] + (view,))
  def reshape(self, new_shape: Sequence[int]) -> ShapeTracker:
    view = self.views[-1].reshape(new_shape)
    return self._with_last(view) if view is not None else ShapeTracker(self.views + (View.create(new_shape),))
  def permute(self, order: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].permute(order))
  def expand(self, new_shape: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].expand(new_shape))
  def pad(self, padding: Sequence[tuple[int, int]]) -> ShapeTracker: return self._with_last(self.views[-1].pad(padding))
  def shrink(self, bounds: Sequence[tuple[int, int]]) -> ShapeTracker:
    return self._with_last(self.views[-1].shrink(bounds))
  def flip(self, axes: Sequence[bool]) -> ShapeTracker: return self._with_last(self.views[-1].flip(axes))
  def stride(self, steps: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].stride(steps))

  # ---- composition
  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """`other` reads a contiguous buffer of shape self.shape, which `self` maps to memory: the composed tracker."""
    if other.buffer_extent() > self.size:
      raise ValueError(f"a ShapeTracker reaching {other.buffer_extent()} elements cannot index a view of shape "
                       f"{self.shape} ({self.size} elements)")
    return ShapeTracker(self.views + other.views).simplify()

  def simplify(self) -> ShapeTracker:
    """Merge adjacent views wherever the later one folds into the earlier, until none does."""
    if self.size == 0: return ShapeTracker((View.create(self.shape),))
    views = list(self.views)
    merged_any = True
    while merged_any and len(views) > 1:
      merged_any = False
      for k in range(len(views) - 1, 0, -1):
        if (merged := _merge_views(views[k - 1], views[k])) is not None:
          views[k - 1:k + 1] = [merged]
          merged_any = True
          break
    return ShapeTracker(tuple(views))

  # ---- index math
  def to_indexed(self, idxs: Sequence[UOp]) -> tuple[UOp, UOp]:
    """(memory index, valid) for loop indices with 0 <= idxs[d] < shape[d], both simplified."""
    index, valid = simplify_given_valid(*self.views[-1].to_indexed(idxs))
    for view in reversed(self.views[:-1]):
      view_index, view_valid = view.to_indexed(unravel(index, view.shape))
      index, valid = simplify_given_valid(view_index, valid & view_valid)
    return index, valid

  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[int], ...]:
    """Per axis the memory stride when moving along that axis adds a constant, else None. An axis the mask depends
    on is None too, unless `ignore_valid` (positions that are masked off touch no memory)."""
    if self.size == 0: return (0,) * len(self.shape)
    if len(self.views) == 1 and (ignore_valid or self.views[0].mask is None): return self.views[0].strides
    idxs = [loop_index(d, s) for d, s in enumerate(self.shape)]
    index, valid = self.to_indexed(idxs)
    terms, _ = split_terms(index)
    nonlinear = {u for t in terms if t not in idxs for u in t.toposort()}
    in_valid = set() if ignore_valid else set(valid.toposort())
    return tuple(None if idx in nonlinear or idx in in_valid else terms.get(idx, 0) for idx in idxs)

  def unit_stride_axes(self) -> list[int]: return [d for d, st in enumerate(self.real_strides()) if st == 1]

  def buffer_extent(self) -> int:
    """1 + the largest memory index a valid position touches (0 when none does): exact for one View, an upper bound
    for several (the extent of views[0], or of the index's range if that is smaller)."""
    if self.size == 0: return 0
    extent = _view_extent(self.views[0])
    if len(self.views) > 1 and extent > 0:
      index, valid = self.to_indexed([loop_index(d, s) for d, s in enumerate(self.shape)])
      if valid.op is Ops.CONST and not valid.arg: return 0
      extent = min(extent, index.vmax + 1)
    return extent

def _view_extent(view: View) -> int:
  if view.size == 0 or view.is_fully_masked(): return 0
  ranges = view.valid_ranges()
  return 1 + view.offset + sum((hi - 1) * st if st > 0 else lo * st for (lo, hi), st in zip(ranges, view.strides))
