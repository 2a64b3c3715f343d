"""View: one strided window onto a flat buffer, optionally masked (the masked-off part reads as padding).

A View maps an index tuple `i` of `shape` to the memory position `offset + Σ i[d]·strides[d]`, valid only where
every `mask[d][0] <= i[d] < mask[d][1]`. Movement ops (reshape, permute, expand, pad, shrink, flip, stride) take a
View to a new View without copying; `reshape` returns None when one View cannot express the result.
`to_indexed(idxs)` turns loop-index UOps into a (memory index, valid) pair of `dtypes.index`/bool UOps.
Sizes, strides, the offset and mask bounds may be symbolic (`sint`, see sint.py): every rule that needs an order
between sizes decides it from the variables' bounds, and a reshape one View can't prove for every value returns None.
"""
from __future__ import annotations
import functools, operator
from dataclasses import dataclass
from typing import Optional, Sequence
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import UOp, Ops, split_terms
from tgrad.shape.sint import sint, canonical, ceil_div, definitely_le, is_symbolic, smax, smin, sym_eq, to_uop, vmin_of

Mask = tuple[tuple[sint, sint], ...]
EMPTY_RANGE = (0, 0)   # the canonical valid range of a dim in a view where nothing is valid

def as_int_tuple(values: Sequence, what: str) -> tuple[int, ...]:
  """Python/numpy integers as a tuple of int; anything else is a TypeError naming `what`."""
  try: return tuple(map(operator.index, values))
  except TypeError: raise TypeError(f"{what} must be integers, got {tuple(values)!r}") from None

def as_shape_tuple(values: Sequence, what: str) -> tuple[sint, ...]:
  """Sizes as a tuple of int or canonical index UOps (symbolic sizes); anything else is a TypeError naming `what`."""
  if not any(isinstance(v, UOp) for v in values): return as_int_tuple(values, what)
  out = []
  for v in values:
    if isinstance(v, UOp):
      if not v.dtype.is_int: raise TypeError(f"{what} must be integers, got {v.render()} of dtype {v.dtype}")
      out.append(canonical(v))
    else: out.append(operator.index(v))
  return tuple(out)

# Views are immutable values, and graph building asks for the same few again and again (every op's output shape,
# every broadcast constant): canonical Views and row-major strides are remembered, keyed by their arguments.
VIEW_CACHE_SIZE = 1 << 16

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  """Row-major strides of a contiguous buffer, with the canonical stride 0 on size-1 dims."""
  strides, step = [], 1
  for size in reversed(shape):
    strides.append(0 if size == 1 else step)
    step = step * size if type(step) is int and type(size) is int else canonical(step * size)
  return tuple(reversed(strides))

def _split_range(lo: int, hi: int, sizes: tuple[int, ...]) -> Optional[list[tuple[int, int]]]:
  """The non-empty flat range [lo, hi) of a dim of size prod(sizes), as one range per dim of `sizes` (row-major),
  or None when the flat range is not such a product."""
  if is_symbolic((lo, hi, *sizes)):   # symbolic: only the whole range, or one dim
    if sym_eq(lo, 0) is True and sym_eq(hi, prod(sizes)) is True: return [(0, s) for s in sizes]
    return [(lo, hi)] if len(sizes) == 1 else None
  out: list[tuple[int, int]] = []
  for d in range(len(sizes) - 1):
    inner = prod(sizes[d + 1:])
    if lo // inner == (hi - 1) // inner:   # inside one index of this dim: recurse into the inner dims
      out.append((lo // inner, lo // inner + 1))
      lo, hi = lo % inner, (hi - 1) % inner + 1
    elif lo % inner == 0 and hi % inner == 0:   # whole rows of the inner dims
      return out + [(lo // inner, hi // inner)] + [(0, s) for s in sizes[d + 1:]]
    else: return None
  return out + [(lo, hi)]

@dataclass(frozen=True)
class View:
  """One strided view of a contiguous buffer. Build it with `View.create`, which makes it canonical."""
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  offset: int
  mask: Optional[Mask]   # per dim the valid [start, end); None means everything is valid
  contiguous: bool       # offset 0, no mask, row-major strides: the index is the flat position

  def __hash__(self) -> int:   # computed once: Views are keys of the shape caches and of the schedule cache
    try: return self.__dict__["_hash"]
    except KeyError:
      value = self.__dict__["_hash"] = hash((self.shape, self.strides, self.offset, self.mask))
      return value
  def __getstate__(self) -> dict:   # hashes of None differ between processes: a pickle carries no cached hash
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  @staticmethod
  def create(shape: Sequence[int], strides: Optional[Sequence[int]] = None, offset: int = 0,
             mask: Optional[Sequence[tuple[int, int]]] = None) -> View:
    """The canonical View: stride 0 on size-1 dims and on dims with one valid index (its part moved into the offset),
    a mask covering everything becomes None, an empty mask becomes all EMPTY_RANGE with zero strides and offset."""
    shape = as_shape_tuple(shape, "shape")
    if strides is not None: strides = as_shape_tuple(strides, "strides")
    if isinstance(offset, UOp): offset = canonical(offset)
    if mask is not None:
      try: mask = tuple(map(tuple, mask))
      except TypeError: raise TypeError(f"mask must be (start, end) pairs, got {mask!r}") from None
    return _canonical_view(shape, strides, offset, mask)

  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def size(self) -> int: return prod(self.shape)
  def valid_ranges(self) -> Mask:
    """The mask with None spelled out as the full range of every dim."""
    return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)
  def is_fully_masked(self) -> bool: return self.mask is not None and any(definitely_le(hi, lo) for lo, hi in self.mask)

  def _check_arity(self, args: Sequence, what: str):
    if len(args) != self.ndim: raise ValueError(f"{what} {tuple(args)} needs one entry per dim of shape {self.shape}")

  # ---- movement ops
  def reshape(self, new_shape: Sequence[int]) -> Optional[View]:
    """The same elements in row-major order with a new shape, or None when no single View expresses that."""
    new_shape = as_shape_tuple(new_shape, "reshape shape")
    if any(vmin_of(s) < 0 for s in new_shape):
      raise ValueError(f"cannot reshape {self.shape} to {new_shape}: negative dim")
    if not sym_eq(prod(new_shape), self.size):
      raise ValueError(f"cannot reshape {self.shape} (size {self.size}) to {new_shape}")
    if new_shape == self.shape: return self
    if self.size == 0 or self.contiguous: return View.create(new_shape)
    if self.is_fully_masked():   # a 0-d View cannot be masked: the ShapeTracker keeps the masked view under it
      return View.create(new_shape, mask=(EMPTY_RANGE,) * len(new_shape)) if new_shape else None
    symbolic = is_symbolic(self.shape) or is_symbolic(new_shape)
    # Drop size-1 dims, then cut old and new dims into the smallest groups with equal products. Each group of old dims
    # must merge into one flat strided dim whose valid part is one range, which is then split into the new dims.
    old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.valid_ranges()) if s != 1]
    new = [s for s in new_shape if s != 1]
    offset, new_strides, new_mask = self.offset, [], []
    i = j = 0
    while i < len(old):
      i_end, j_end, old_size, new_size = i + 1, j + 1, old[i][0], new[j]
      while old_size != new_size:
        if not symbolic: grow_old = old_size < new_size
        elif sym_eq(old_size, new_size) is True: break
        elif _divides(old_size, new_size): grow_old = True
        elif _divides(new_size, old_size): grow_old = False
        else: return None   # symbolic sizes that don't group by factors: a View of its own
        if grow_old and i_end < len(old): old_size, i_end = prod((old_size, old[i_end][0])), i_end + 1
        elif not grow_old and j_end < len(new): new_size, j_end = prod((new_size, new[j_end])), j_end + 1
        else: return None
      merged = _merge_dims(old[i:i_end])
      if merged is None: return None
      stride, (lo, hi), offset_change = merged
      group_sizes = tuple(new[j:j_end])
      ranges = _split_range(lo, hi, group_sizes)
      if ranges is None: return None
      offset += offset_change
      new_strides += [canonical(stride * prod(group_sizes[d + 1:])) for d in range(len(group_sizes))]
      new_mask += ranges
      i, j = i_end, j_end
    strides_iter, mask_iter = iter(new_strides), iter(new_mask)
    full_strides = [0 if s == 1 else next(strides_iter) for s in new_shape]
    full_mask = [(0, 1) if s == 1 else next(mask_iter) for s in new_shape]
    return View.create(new_shape, full_strides, offset, full_mask)

  def permute(self, order: Sequence[int]) -> View:
    order = as_int_tuple(order, "permute order")
    if sorted(order) != list(range(self.ndim)):
      raise ValueError(f"permute order {order} is not a permutation of the {self.ndim} dims of shape {self.shape}")
    mask = tuple(self.mask[d] for d in order) if self.mask is not None else None
    return View.create(tuple(self.shape[d] for d in order), tuple(self.strides[d] for d in order), self.offset, mask)

  def expand(self, new_shape: Sequence[int]) -> View:
    """Broadcast size-1 dims to `new_shape` (stride 0); other dims must keep their size."""
    if type(new_shape) is tuple and self.mask is None and len(new_shape) == len(self.shape) and \
       all(type(n) is int and type(s) is int and (n == s or s == 1) and n >= 0 for n, s in zip(new_shape, self.shape)):
      return _canonical_view(new_shape, self.strides, self.offset, None)   # the common case: int sizes, no mask
    new_shape = as_shape_tuple(new_shape, "expand shape")
    self._check_arity(new_shape, "expand shape")
    if any(s != n and (s != 1 or vmin_of(n) < 0) for s, n in zip(self.shape, new_shape)):
      raise ValueError(f"cannot expand {self.shape} to {new_shape}: only size-1 dims can change")
    mask = None
    if self.mask is not None:
      mask = tuple(m if s == n or m == EMPTY_RANGE else (0, n) for m, s, n in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def pad(self, padding: Sequence[tuple[int, int]]) -> View:
    """Add `before` and `after` masked-off elements to each dim."""
    self._check_arity(padding, "padding")
    padding = tuple(as_shape_tuple(p, "padding") for p in padding)
    if any(len(p) != 2 or vmin_of(p[0]) < 0 or vmin_of(p[1]) < 0 for p in padding):
      raise ValueError(f"padding {padding} of shape {self.shape} must be nonnegative (before, after) pairs")
    if all(p == (0, 0) for p in padding): return self
    shape = tuple(canonical(s + before + after) for s, (before, after) in zip(self.shape, padding))
    offset = canonical(self.offset - sum(before * st for (before, _), st in zip(padding, self.strides)))
    mask = tuple((canonical(lo + before), canonical(hi + before))
                 for (lo, hi), (before, _) in zip(self.valid_ranges(), padding))
    if self.size == 0: mask = (EMPTY_RANGE,) * self.ndim
    return View.create(shape, self.strides, offset, mask)

  def pad_end_to(self, axis: int, new_size: sint) -> View:
    """Grow dim `axis` to `new_size` with masked-off positions at its end. For a symbolic size whose padded form the
    bounds can't order (ceil(n/4)*4 >= n): the caller knows new_size >= the size for every value."""
    if self.size == 0: return View.create(self.shape[:axis] + (new_size,) + self.shape[axis + 1:])
    # built directly, not through View.create: its clamp of the mask to the new size can't be proven for symbolic sizes
    # (min(n, ceil(n/4)*4) would stay a MAX in every index), and every other field is already canonical
    return View(self.shape[:axis] + (new_size,) + self.shape[axis + 1:], self.strides, self.offset,
                self.valid_ranges(), False)

  def shrink(self, bounds: Sequence[tuple[int, int]]) -> View:
    """Keep [start, end) of each dim."""
    self._check_arity(bounds, "shrink bounds")
    bounds = tuple(as_shape_tuple(b, "shrink bounds") for b in bounds)
    if any(len(b) != 2 or not (definitely_le(0, b[0]) and definitely_le(b[0], b[1]) and definitely_le(b[1], s))
           for b, s in zip(bounds, self.shape)):
      raise ValueError(f"shrink bounds {bounds} are out of range for shape {self.shape}"
                       + (" for some value of the variables" if is_symbolic(self.shape) or
                          any(is_symbolic(b) for b in bounds) else ""))
    shape = tuple(canonical(end - start) for start, end in bounds)
    offset = canonical(self.offset + sum(start * st for (start, _), st in zip(bounds, self.strides)))
    mask = None
    if self.mask is not None:
      mask = tuple((canonical(smax(lo, start) - start), canonical(smin(hi, end) - start))
                   for (lo, hi), (start, end) in zip(self.mask, bounds))
    return View.create(shape, self.strides, offset, mask)

  def flip(self, axes: Sequence[bool]) -> View:
    """Reverse the dims where `axes` is True."""
    self._check_arity(axes, "flip axes")
    if self.size == 0: return self
    offset = canonical(self.offset + sum((s - 1) * st for s, st, f in zip(self.shape, self.strides, axes) if f))
    strides = tuple(canonical(-st) if f else st for st, f in zip(self.strides, axes))
    mask = None
    if self.mask is not None:
      mask = tuple((canonical(s - hi), canonical(s - lo)) if f else (lo, hi)
                   for (lo, hi), s, f in zip(self.mask, self.shape, axes))
    return View.create(self.shape, strides, offset, mask)

  def stride(self, steps: Sequence[int]) -> View:
    """`x[::step]` along each dim; a negative step walks the dim backwards from its last element."""
    steps = as_int_tuple(steps, "stride steps")
    self._check_arity(steps, "stride steps")
    if 0 in steps: raise ValueError(f"stride steps {steps} for shape {self.shape} must be nonzero")
    view = self.flip(tuple(k < 0 for k in steps)) if any(k < 0 for k in steps) else self
    steps = tuple(abs(k) for k in steps)
    shape = tuple(ceil_div(s, k) for s, k in zip(view.shape, steps))
    strides = tuple(canonical(st * k) for st, k in zip(view.strides, steps))
    mask = None
    if view.mask is not None:
      mask = tuple((ceil_div(lo, k), ceil_div(hi, k)) for (lo, hi), k in zip(view.mask, steps))
    return View.create(shape, strides, view.offset, mask)

  # ---- index math
  def to_indexed(self, idxs: Sequence[UOp]) -> tuple[UOp, UOp]:
    """(memory index, valid) for loop indices `idxs` with 0 <= idxs[d] < shape[d]; not simplified."""
    if len(idxs) != self.ndim: raise ValueError(f"{len(idxs)} indices for a view of shape {self.shape}")
    index = to_uop(self.offset)
    for idx, size, st in zip(idxs, self.shape, self.strides):
      if size != 1 and st != 0: index = index + (idx if st == 1 else idx * st)
    valid = UOp.const(dtypes.bool, not self.is_fully_masked())
    if self.mask is None or self.is_fully_masked(): return index, valid
    for idx, size, (lo, hi) in zip(idxs, self.shape, self.mask):
      if not definitely_le(lo, 0): valid = valid & to_uop(canonical(lo - 1)).lt(idx)
      if not definitely_le(size, hi): valid = valid & idx.lt(to_uop(hi))
    return index, valid

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _canonical_view(shape: tuple[int, ...], strides: Optional[tuple[int, ...]], offset: int, mask: Optional[Mask]
                    ) -> View:
  """View.create on integer tuples (the key of the cache). Every value is made a plain int here, so a cached View
  never holds a bool or numpy integer that compared equal to the int a later call asks with."""
  shape = tuple(s if isinstance(s, UOp) else int(s) for s in shape)
  if any(vmin_of(s) < 0 for s in shape): raise ValueError(f"shape {shape} has a negative dimension")
  strides = strides_for_shape(shape) if strides is None else tuple(s if isinstance(s, UOp) else int(s) for s in strides)
  if len(strides) != len(shape): raise ValueError(f"strides {strides} do not match shape {shape}")
  if 0 in shape: return View(shape, strides_for_shape(shape), 0, None, True)
  offset = offset if isinstance(offset, UOp) else operator.index(offset)
  strides = tuple(0 if size == 1 else st for size, st in zip(shape, strides))
  if mask is not None:
    if len(mask) != len(shape): raise ValueError(f"mask {tuple(mask)} does not match shape {shape}")
    if any(len(m) != 2 for m in mask): raise ValueError(f"mask {mask} must be (start, end) pairs")
    def bound(x): return x if isinstance(x, UOp) else int(operator.index(x))
    mask = tuple((smax(0, bound(lo)), smin(size, bound(hi))) for (lo, hi), size in zip(mask, shape))
    if any(definitely_le(hi, lo) for lo, hi in mask):
      return View(shape, (0,) * len(shape), 0, (EMPTY_RANGE,) * len(shape), False)
    if all(m == (0, size) for m, size in zip(mask, shape)): mask = None
    else:
      single = [sym_eq(hi - lo, 1) is True for lo, hi in mask]
      offset = canonical(offset + sum(lo * st for (lo, _), st, one in zip(mask, strides, single) if one))
      strides = tuple(0 if one else st for one, st in zip(single, strides))
  contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
  return View(shape, strides, offset if isinstance(offset, UOp) else int(offset), mask, contiguous)

def _merge_dims(dims: list[tuple[int, int, tuple[int, int]]]) -> Optional[tuple[int, tuple[int, int], int]]:
  """Merge (size, stride, valid range) dims, outer to inner, into one flat dim whose valid part is one range.
  Returns (stride, valid range, offset change), or None when that is impossible."""
  size, stride, (lo, hi) = dims[-1]
  offset_change = 0
  for outer_size, outer_stride, (outer_lo, outer_hi) in reversed(dims[:-1]):
    if sym_eq(outer_hi - outer_lo, 1) is True:   # one valid outer index: its memory part is a constant
      offset_change = canonical(offset_change + outer_lo * (outer_stride - size * stride))
      lo, hi = canonical(outer_lo * size + lo), canonical(outer_lo * size + hi)
    elif (lo, hi) == (0, size) and sym_eq(outer_stride, size * stride) is True:
      lo, hi = canonical(outer_lo * size), canonical(outer_hi * size)
    else: return None
    size = prod((size, outer_size))
  return stride, (lo, hi), offset_change

def _monomial(x: sint) -> tuple[int, list]:
  """A size as coefficient × factors: an int, or c·v1·v2… over symbolic factors (any other expression is one
  factor). Reshapes group symbolic dims by these factors."""
  if not isinstance(x, UOp): return x, []
  terms, constant = split_terms(x)
  if constant != 0 or len(terms) != 1: return 1, [x]
  (term, coefficient), = terms.items()
  factors, pending = [], [term]
  while pending:
    u = pending.pop()
    if u.op is Ops.MUL and all(f.op is not Ops.CONST for f in u.src): pending.extend(u.src)
    else: factors.append(u)
  return coefficient, factors

def _divides(a: sint, b: sint) -> bool:
  """a divides b as monomials (its coefficient divides b's and its factors are among b's), and a != b."""
  (ca, fa), (cb, fb) = _monomial(a), _monomial(b)
  if ca == 0 or cb % ca: return False
  rest = list(fb)
  for f in fa:
    if f not in rest: return False
    rest.remove(f)
  return bool(rest) or cb != ca
