"""ShapeTracker: a stack of Views, the whole history of movement ops between a buffer and the shape a kernel reads.

`views[-1]` is what loop indices index; each earlier view is indexed by the flat (row-major) position the view after
it produces, and `views[0]` maps into memory. Movement ops apply to the last view; a reshape that it cannot express
pushes a new contiguous View. `to_indexed(idxs)` gives the simplified (memory index, valid) UOps for loop indices.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Optional, Sequence
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import Ops, UOp, simplify as simplify_uop, split_terms
from tgrad.shape.view import View, EMPTY_RANGE, VIEW_CACHE_SIZE, as_shape_tuple, strides_for_shape
from tgrad.shape.sint import (sint, bind_values, canonical, canonical_product, is_symbolic, sym_eq, to_uop, unbind,
                              vmax_of)

def loop_index(axis: int, size: sint) -> UOp:
  """The loop variable of `axis` running over [0, size): the index UOps the shape layer reasons with."""
  return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), to_uop(size)), arg=axis)

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

def _times(a: sint, b: sint) -> sint: return a * b if isinstance(a, int) and isinstance(b, int) else canonical(a * b)

def _same_size(a: sint, b: sint) -> bool:
  """a == b for every value of the variables, products too whose factors the simplifier groups differently
  (((n+63)//64)·16384·((n+63)//64)·64 and ((n+63)//64)·65536·((n+63)//64)·16: two guarded splits' strides)."""
  if sym_eq(a, b) is True: return True
  return isinstance(a, UOp) and isinstance(b, UOp) and canonical_product(a) is canonical_product(b)

def split_indices(view: View, outer_shape: tuple[sint, ...], idxs: list[UOp]) -> Optional[list[UOp]]:
  """The indices of `outer_shape` for loop indices `idxs` of `view`, when `view` reads a contiguous buffer of that
  shape by splitting its dims, permuting the pieces and expanding (offset 0, the strides other than 0 a
  permuted row-major chain whose runs multiply to the outer dims): each outer index is its run's indices combined
  (i·inner + j), where unravelling the flat position would divide by the outer sizes (symbolic ones: 64-bit divisions
  in a kernel's loop). Else None. A mask of `view` stays the caller's (its valid comes from `view.to_indexed`); a dim
  masked to [0, hi) counts as hi long (a later guarded split padded it: the positions past hi are never valid)."""
  if not (isinstance(view.offset, int) and view.offset == 0): return None
  extent = [hi if view.mask is not None and isinstance(lo, int) and lo == 0 else size
            for size, (lo, hi) in zip(view.shape, view.mask or [(0, 0)] * len(view.shape))]
  # a dim of stride 0 (an expand) moves no flat position: the outer indices don't depend on it
  remaining = [d for d, size in enumerate(extent) if size != 1 and not (isinstance(view.strides[d], int)
                                                                        and view.strides[d] == 0)]
  chain, step = [], 1   # the view's dims, innermost (stride 1) first
  while remaining:
    d = next((d for d in remaining if _same_size(view.strides[d], step)), None)
    if d is None: return None
    chain.append(d)
    remaining.remove(d)
    step = _times(step, extent[d])
  out, position = [], 0
  for size in reversed(outer_shape):
    index, run = UOp.const(dtypes.index, 0), 1
    while not _same_size(run, size):
      if position == len(chain): return None
      d = chain[position]
      index, run, position = index + (idxs[d] if run == 1 else idxs[d] * run), _times(run, extent[d]), position + 1
    out.append(index)
  return out[::-1] if position == len(chain) else None

def _conjuncts(valid: UOp) -> list[UOp]:
  return [c for s in valid.src for c in _conjuncts(s)] if valid.op is Ops.AND else [valid]

def _bound_of(clause: UOp) -> Optional[tuple[UOp, int, int]]:
  """(x, lo, hi) when the clause says lo <= x < hi for an int x: `x < c`, `c < x`, `not (x < c)`, `not (c < x)`."""
  negated = clause.op is Ops.CMPNE and clause.src[1].op is Ops.CONST and clause.src[1].arg is True
  if negated: clause = clause.src[0]
  if clause.op is not Ops.CMPLT or not clause.src[0].dtype.is_int: return None
  left, right = clause.src
  if right.op is Ops.CONST and left.op is not Ops.CONST:   # left < c, or left >= c
    return (left, right.arg, left.vmax + 1) if negated else (left, left.vmin, right.arg)
  if left.op is Ops.CONST and right.op is not Ops.CONST:   # c < right, or right <= c
    return (right, right.vmin, left.arg + 1) if negated else (right, left.arg + 1, right.vmax + 1)
  return None

NARROWED_NAME = "\x00valid_narrowed"   # names of the stand-in variables; no user variable is called this
MAX_NARROWING_PASSES = 3   # each pass can turn compound bounds into bounds on their parts; a few passes suffice

def _and_all(clauses: list[UOp]) -> UOp:
  if any(c.op is Ops.CONST and not c.arg for c in clauses): return UOp.const(dtypes.bool, False)
  out: Optional[UOp] = None
  for c in clauses:
    if c.op is not Ops.CONST: out = c if out is None else out & c
  return UOp.const(dtypes.bool, True) if out is None else out

def simplify_given_valid(index: UOp, valid: UOp) -> tuple[UOp, UOp]:
  """Simplify (index, valid) where the index only matters while valid holds. Each bound `lo <= x < hi` in valid on
  an x with no other bounded expression inside narrows x to a variable of that range while the index and the other
  clauses are simplified; bounds on the same x merge into one."""
  index, valid = simplify_uop(index), simplify_uop(valid)
  for _ in range(MAX_NARROWING_PASSES):
    parsed = [(clause, _bound_of(clause)) for clause in _conjuncts(valid)]
    bounded = {bound[0] for _, bound in parsed if bound is not None}
    compound = {x for x in bounded if any(y is not x and y in bounded for y in x.toposort())}
    bounds: dict[UOp, tuple[int, int]] = {}
    others: list[UOp] = []
    for clause, bound in parsed:
      if bound is None or bound[0] in compound:
        others.append(clause)
        continue
      x, lo, hi = bound
      old_lo, old_hi = bounds.get(x, (x.vmin, x.vmax + 1))
      bounds[x] = (max(old_lo, lo), min(old_hi, hi))
    if any(lo >= hi for lo, hi in bounds.values()): return index, UOp.const(dtypes.bool, False)
    narrowed = {x: UOp.variable(f"{NARROWED_NAME}{k}", lo, hi - 1, x.dtype)
                for k, (x, (lo, hi)) in enumerate(bounds.items())}
    restore = {v: x for x, v in narrowed.items()}
    def given_bounds(u: UOp) -> UOp: return simplify_uop(simplify_uop(u.substitute(narrowed)).substitute(restore))
    clauses = [c for x, (lo, hi) in bounds.items() for c in
               ((UOp.const(x.dtype, lo - 1).lt(x),) if lo > x.vmin else ()) + ((x.lt(hi),) if hi <= x.vmax else ())]
    new_index, new_valid = given_bounds(index), _and_all(clauses + [given_bounds(c) for c in others])
    if new_index is index and new_valid is valid: break
    index, valid = new_index, new_valid
  return index, valid

def _view_from_index(shape: tuple[int, ...], idxs: list[UOp], index: UOp, valid: UOp) -> Optional[View]:
  """The View whose index math is (index, valid) over `idxs`, if index is linear in them and valid is a conjunction
  of bounds on single indices; else None."""
  if valid.op is Ops.CONST and not valid.arg:   # nothing valid; a 0-d View cannot say so (it has no mask)
    return View.create(shape, mask=[EMPTY_RANGE] * len(shape)) if shape else None
  terms, offset = split_terms(index)
  if any(all(t is not idx for idx in idxs) for t in terms): return None
  axis_of = {idx: d for d, idx in enumerate(idxs)}
  mask = [(0, s) for s in shape]
  for clause in _conjuncts(valid):
    if clause.op is Ops.CONST: continue   # True; False was handled above
    if (bound := _bound_of(clause)) is None or bound[0] not in axis_of: return None
    x, lo, hi = bound
    d = axis_of[x]
    mask[d] = (max(mask[d][0], lo), min(mask[d][1], hi))
  return View.create(shape, [terms.get(idx, 0) for idx in idxs], offset, mask)

# Merging views costs an index simplification (up to ~0.1 s for a masked 4-view stack, e.g. the gradient of sliding
# windows), and the scheduler composes the same stacks again for every load of a kernel: remember recent answers.
MERGE_CACHE_SIZE = 4096

@functools.lru_cache(maxsize=MERGE_CACHE_SIZE)
def _merge_views(views: tuple[View, ...]) -> Optional[View]:
  """One View equal to the stack `views` (the last indexing into the one before, and so on), or None."""
  first, last = views[0], views[-1]
  if len(views) == 2 and first.contiguous: return last
  if len(views) == 2 and last.contiguous and last.size == first.size: return first.reshape(last.shape)
  if any(v.is_fully_masked() for v in views) and last.ndim > 0:
    return View.create(last.shape, mask=(EMPTY_RANGE,) * last.ndim)
  idxs = [loop_index(d, s) for d, s in enumerate(last.shape)]
  return _view_from_index(last.shape, idxs, *ShapeTracker(views).to_indexed(idxs))

# The scheduler composes (and models reshape) the same trackers for every kernel of every step: remember them.
COMPOSE_CACHE_SIZE = 16384

@functools.lru_cache(maxsize=COMPOSE_CACHE_SIZE)
def _compose(first: ShapeTracker, second: ShapeTracker) -> ShapeTracker:
  if second.buffer_extent() > vmax_of(first.size):
    raise ValueError(f"a ShapeTracker reaching {second.buffer_extent()} elements cannot index a view of shape "
                     f"{first.shape} ({first.size} elements)")
  return ShapeTracker(first.views + second.views).simplify()

@functools.lru_cache(maxsize=COMPOSE_CACHE_SIZE)
def _reshape(st: ShapeTracker, new_shape: tuple) -> ShapeTracker:
  view = st.views[-1].reshape(new_shape)
  return st._with_last(view) if view is not None else ShapeTracker(st.views + (View.create(new_shape),))

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _from_shape(shape: tuple[int, ...]) -> ShapeTracker: return ShapeTracker((View.create(shape),))

@dataclass(frozen=True)
class ShapeTracker:
  """A stack of Views: views[-1] is indexed by the loop indices, views[0] maps into memory."""
  views: tuple[View, ...]

  def __hash__(self) -> int:   # computed once: trackers are keys of the shape caches and of the schedule cache
    try: return self.__dict__["_hash"]
    except KeyError:
      value = self.__dict__["_hash"] = hash(self.views)
      return value
  def __getstate__(self) -> dict:   # hashes of None differ between processes: a pickle carries no cached hash
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  @staticmethod
  def from_shape(shape: Sequence[sint]) -> ShapeTracker: return _from_shape(as_shape_tuple(shape, "shape"))
  @staticmethod
  def from_canonical_shape(shape: tuple[sint, ...]) -> ShapeTracker:
    """from_shape for a shape already checked and canonical (a tuple of ints and canonical UOps, e.g. another
    tracker's shape with some sizes set to 1): the remembered tracker, without the checks."""
    return _from_shape(shape)
  @functools.cached_property
  def shape(self) -> tuple[int, ...]: return self.views[-1].shape   # read for every value built: a call only once
  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous
  def row_major(self) -> bool:
    """Whether this reads its buffer in row-major order from some offset (one View, no mask, concrete shape)."""
    if len(self.views) != 1 or (view := self.views[0]).mask is not None or is_symbolic(view.shape): return False
    return all(stride == want for stride, want, size in zip(view.strides, strides_for_shape(view.shape), view.shape)
               if size != 1)
  def __repr__(self): return f"ShapeTracker(views={self.views!r})"
  @functools.cached_property
  def symbolic(self) -> bool:
    """Whether any size, stride, offset or mask bound holds a variable."""
    return any(is_symbolic(_view_fields(v)) for v in self.views)
  def stable_repr(self) -> str:
    """The text a kernel key hashes: the repr, with each symbolic value spelled out completely."""
    if not self.symbolic: return repr(self)
    return "ShapeTracker(" + ";".join(",".join(x.key if isinstance(x, UOp) else repr(x) for x in _view_fields(v))
                                      for v in self.views) + ")"
  def unbind(self) -> tuple[ShapeTracker, dict[str, int]]:
    """(this tracker with every bound variable replaced by its variable, {name: value})."""
    if not self.symbolic: return self, {}
    return _unbind_tracker(self)
  def bind(self, var_vals: dict[str, int]) -> ShapeTracker:
    """This tracker with its variables bound to (or rebound to) these values."""
    if not self.symbolic: return self
    return _map_sizes(self, lambda x: bind_values(x, var_vals))
  def variables(self) -> list[UOp]:
    """The DEFINE_VARs of an unbound tracker, by name."""
    found = {u for v in self.views for x in _view_fields(v) if isinstance(x, UOp) for u in x.toposort()
             if u.op is Ops.DEFINE_VAR}
    return sorted(found, key=lambda u: u.arg[0])

  # ---- movement ops
  def _with_last(self, view: View) -> ShapeTracker: return ShapeTracker(self.views[:-1] + (view,))
  def reshape(self, new_shape: Sequence[int]) -> ShapeTracker: return _reshape(self, tuple(new_shape))
  def permute(self, order: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].permute(order))
  def expand(self, new_shape: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].expand(new_shape))
  def pad(self, padding: Sequence[tuple[int, int]]) -> ShapeTracker: return self._with_last(self.views[-1].pad(padding))
  def pad_end_to(self, axis: int, new_size: sint) -> ShapeTracker:
    return self._with_last(self.views[-1].pad_end_to(axis, new_size))
  def shrink(self, bounds: Sequence[tuple[int, int]]) -> ShapeTracker:
    return self._with_last(self.views[-1].shrink(bounds))
  def flip(self, axes: Sequence[bool]) -> ShapeTracker: return self._with_last(self.views[-1].flip(axes))
  def stride(self, steps: Sequence[int]) -> ShapeTracker: return self._with_last(self.views[-1].stride(steps))

  # ---- composition
  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """`other` reads a contiguous buffer of shape self.shape, which `self` maps to memory: the composed tracker."""
    return _compose(self, other)

  def simplify(self) -> ShapeTracker:
    """Merge adjacent views wherever the later one folds into the earlier, until none does."""
    if self.size == 0: return ShapeTracker((View.create(self.shape),))
    views = list(self.views)
    merged_any = True
    while merged_any and len(views) > 1:   # try the longest runs of adjacent views first, the last ones first
      merged_any = False
      for length in range(len(views), 1, -1):
        for start in range(len(views) - length, -1, -1):
          if (merged := _merge_views(tuple(views[start:start + length]))) is not None:
            views[start:start + length] = [merged]
            merged_any = True
            break
        if merged_any: break
    return ShapeTracker(tuple(views))

  # ---- index math
  def to_indexed(self, idxs: Sequence[UOp]) -> tuple[UOp, UOp]:
    """(memory index, valid) for loop indices with 0 <= idxs[d] < shape[d], both simplified. A last view that only
    splits and permutes the dims of the view before it (a guarded split of a symbolic axis: the padded axis cut into
    blocks) hands that view its indices directly (`split_indices`), without a flat index to divide again."""
    views, idxs = list(self.views), list(idxs)
    valid = UOp.const(dtypes.bool, True)
    while len(views) > 1 and is_symbolic(views[-2].shape) and \
          (outer := split_indices(views[-1], views[-2].shape, idxs)) is not None:
      valid = valid & views[-1].to_indexed(idxs)[1]   # the split view's own mask (padding of a later guarded split)
      views, idxs = views[:-1], outer
    index, last_valid = views[-1].to_indexed(idxs)
    index, valid = simplify_given_valid(index, valid & last_valid)
    for view in reversed(views[:-1]):
      view_index, view_valid = view.to_indexed(unravel(index, view.shape))
      index, valid = simplify_given_valid(view_index, valid & view_valid)
    return index, valid

  @functools.cached_property
  def _loop_indexed(self) -> tuple[list[UOp], UOp, UOp]:
    """(loop indices over the shape, index, valid): the index math real_strides and buffer_extent read."""
    idxs = [loop_index(d, s) for d, s in enumerate(self.shape)]
    return (idxs, *self.to_indexed(idxs))

  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[int], ...]:
    """Per axis the memory stride when moving along that axis adds a constant, else None. An axis the mask depends
    on is None too, unless `ignore_valid` (positions that are masked off touch no memory)."""
    if self.size == 0: return (0,) * len(self.shape)
    if len(self.views) == 1 and (ignore_valid or self.views[0].mask is None): return self.views[0].strides
    idxs, index, valid = self._loop_indexed
    terms, _ = split_terms(index)
    nonlinear = {u for t in terms if t not in idxs for u in t.toposort()}
    in_valid = set() if ignore_valid else set(valid.toposort())
    return tuple(None if idx in nonlinear or idx in in_valid else terms.get(idx, 0) for idx in idxs)

  def unit_stride_axes(self) -> list[int]: return [d for d, st in enumerate(self.real_strides()) if st == 1]

  def buffer_extent_of_variables(self) -> sint:
    """`buffer_extent` as an expression of the variables for one View (a symbolic kernel's bytes at a call's values);
    with several Views, their bound (an int)."""
    return _view_extent_of_variables(self.views[0]) if len(self.views) == 1 else self.buffer_extent()

  def buffer_extent(self) -> int:
    """1 + the largest memory index a valid position touches (0 when none does): exact for one View, an upper bound
    for several (the extent of views[0], or of the index's range if that is smaller)."""
    if self.size == 0: return 0
    extent = _view_extent(self.views[0])
    if len(self.views) > 1 and extent > 0:
      _, index, valid = self._loop_indexed
      if valid.op is Ops.CONST and not valid.arg: return 0
      extent = min(extent, index.vmax + 1)
    return extent

def _view_extent(view: View) -> int:
  """1 + the largest memory index a valid position touches (an upper bound over the variables' values)."""
  return vmax_of(_view_extent_of_variables(view))

def _view_extent_of_variables(view: View) -> sint:
  """1 + the largest memory index a valid position touches, as an expression of the variables (exact for each value
  where the strides' signs don't depend on it)."""
  if view.size == 0 or view.is_fully_masked(): return 0
  ranges = view.valid_ranges()
  extent = 1 + view.offset + sum((hi - 1) * st if (st.vmin if isinstance(st, UOp) else st) >= 0 else lo * st
                                 for (lo, hi), st in zip(ranges, view.strides))
  return canonical(extent)

def _view_fields(view: View) -> tuple:
  """A View's values, flat: shape, strides, offset and mask bounds."""
  return view.shape + view.strides + (view.offset,) + tuple(x for m in (view.mask or ()) for x in m)

def _map_sizes(st: ShapeTracker, fn) -> ShapeTracker:
  """The tracker with `fn` applied to every size, stride, offset and mask bound (a renaming of variables: the views
  stay canonical)."""
  views = []
  for v in st.views:
    mask = tuple((fn(lo), fn(hi)) for lo, hi in v.mask) if v.mask is not None else None
    views.append(View(tuple(map(fn, v.shape)), tuple(map(fn, v.strides)), fn(v.offset), mask, v.contiguous))
  return ShapeTracker(tuple(views))

@functools.lru_cache(maxsize=COMPOSE_CACHE_SIZE)
def _unbind_tracker(st: ShapeTracker) -> tuple[ShapeTracker, dict[str, int]]:
  values: dict[str, int] = {}
  def unbound(x):
    new, found = unbind(x)
    values.update(found)
    return new
  return _map_sizes(st, unbound), values
