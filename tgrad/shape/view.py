"""View: one strided window onto a flat buffer, optionally masked (the masked-off part reads as padding).

A View maps an index tuple `i` of `shape` to the memory position `offset + Σ i[d]·strides[d]`, valid only where
every `mask[d][0] <= i[d] < mask[d][1]`. Movement ops (reshape, permute, expand, pad, shrink, flip, stride) take a
View to a new View without copying; `reshape` returns None when one View cannot express the result.
`to_indexed(idxs)` turns loop-index UOps into a (memory index, valid) pair of `dtypes.index`/bool UOps.
"""
from __future__ import annotations
import functools, operator
from dataclasses import dataclass
from typing import Optional, Sequence
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import UOp

Mask = tuple[tuple[int, int], ...]
EMPTY_RANGE = (0, 0)   # the canonical valid range of a dim in a view where nothing is valid

def as_int_tuple(values: Sequence, what: str) -> tuple[int, ...]:
  """Python/numpy integers as a tuple of int; anything else is a TypeError naming `what`."""
  try: return tuple(map(operator.index, values))
  except TypeError: raise TypeError(f"{what} must be integers, got {tuple(values)!r}") from None

# Views are immutable values, and graph building asks for the same few again and again (every op's output shape,
# every broadcast constant): canonical Views and row-major strides are remembered, keyed by their arguments.
VIEW_CACHE_SIZE = 1 << 16

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def strides_for_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  """Row-major strides of a contiguous buffer, with the canonical stride 0 on size-1 dims."""
  strides, step = [], 1
  for size in reversed(shape):
    strides.append(0 if size == 1 else step)
    step *= size
  return tuple(reversed(strides))

def _ceil_div(a: int, b: int) -> int: return -(-a // b)

def _split_range(lo: int, hi: int, sizes: tuple[int, ...]) -> Optional[list[tuple[int, int]]]:
  """The non-empty flat range [lo, hi) of a dim of size prod(sizes), as one range per dim of `sizes` (row-major),
  or None when the flat range is not such a product."""
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
    shape = as_int_tuple(shape, "shape")
    if strides is not None: strides = as_int_tuple(strides, "strides")
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
  def is_fully_masked(self) -> bool: return self.mask is not None and any(lo >= hi for lo, hi in self.mask)

  def _check_arity(self, args: Sequence, what: str):
    if len(args) != self.ndim: raise ValueError(f"{what} {tuple(args)} needs one entry per dim of shape {self.shape}")

  # ---- movement ops
  def reshape(self, new_shape: Sequence[int]) -> Optional[View]:
    """The same elements in row-major order with a new shape, or None when no single View expresses that."""
    new_shape = as_int_tuple(new_shape, "reshape shape")
    if any(s < 0 for s in new_shape): raise ValueError(f"cannot reshape {self.shape} to {new_shape}: negative dim")
    if prod(new_shape) != self.size: raise ValueError(f"cannot reshape {self.shape} (size {self.size}) to {new_shape}")
    if new_shape == self.shape: return self
    if self.size == 0 or self.contiguous: return View.create(new_shape)
    if self.is_fully_masked():   # a 0-d View cannot be masked: the ShapeTracker keeps the masked view under it
      return View.create(new_shape, mask=(EMPTY_RANGE,) * len(new_shape)) if new_shape else None
    # Drop size-1 dims, then cut old and new dims into the smallest groups with equal products. Each group of old dims
    # must merge into one flat strided dim whose valid part is one range, which is then split into the new dims.
    old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.valid_ranges()) if s != 1]
    new = [s for s in new_shape if s != 1]
    offset, new_strides, new_mask = self.offset, [], []
    i = j = 0
    while i < len(old):
      i_end, j_end, old_size, new_size = i + 1, j + 1, old[i][0], new[j]
      while old_size != new_size:
        if old_size < new_size: old_size, i_end = old_size * old[i_end][0], i_end + 1
        else: new_size, j_end = new_size * new[j_end], j_end + 1
      merged = _merge_dims(old[i:i_end])
      if merged is None: return None
      stride, (lo, hi), offset_change = merged
      group_sizes = tuple(new[j:j_end])
      ranges = _split_range(lo, hi, group_sizes)
      if ranges is None: return None
      offset += offset_change
      new_strides += [stride * prod(group_sizes[d + 1:]) for d in range(len(group_sizes))]
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
    new_shape = as_int_tuple(new_shape, "expand shape")
    self._check_arity(new_shape, "expand shape")
    if any(s != n and (s != 1 or n < 0) for s, n in zip(self.shape, new_shape)):
      raise ValueError(f"cannot expand {self.shape} to {new_shape}: only size-1 dims can change")
    mask = None
    if self.mask is not None:
      mask = tuple(m if s == n or m == EMPTY_RANGE else (0, n) for m, s, n in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def pad(self, padding: Sequence[tuple[int, int]]) -> View:
    """Add `before` and `after` masked-off elements to each dim."""
    self._check_arity(padding, "padding")
    padding = tuple(as_int_tuple(p, "padding") for p in padding)
    if any(len(p) != 2 or p[0] < 0 or p[1] < 0 for p in padding):
      raise ValueError(f"padding {padding} of shape {self.shape} must be nonnegative (before, after) pairs")
    if all(p == (0, 0) for p in padding): return self
    shape = tuple(s + before + after for s, (before, after) in zip(self.shape, padding))
    offset = self.offset - sum(before * st for (before, _), st in zip(padding, self.strides))
    mask = tuple((lo + before, hi + before) for (lo, hi), (before, _) in zip(self.valid_ranges(), padding))
    if self.size == 0: mask = (EMPTY_RANGE,) * self.ndim
    return View.create(shape, self.strides, offset, mask)

  def shrink(self, bounds: Sequence[tuple[int, int]]) -> View:
    """Keep [start, end) of each dim."""
    self._check_arity(bounds, "shrink bounds")
    bounds = tuple(as_int_tuple(b, "shrink bounds") for b in bounds)
    if any(len(b) != 2 or not 0 <= b[0] <= b[1] <= s for b, s in zip(bounds, self.shape)):
      raise ValueError(f"shrink bounds {bounds} are out of range for shape {self.shape}")
    shape = tuple(end - start for start, end in bounds)
    offset = self.offset + sum(start * st for (start, _), st in zip(bounds, self.strides))
    mask = None
    if self.mask is not None:
      mask = tuple((max(lo, start) - start, min(hi, end) - start) for (lo, hi), (start, end) in zip(self.mask, bounds))
    return View.create(shape, self.strides, offset, mask)

  def flip(self, axes: Sequence[bool]) -> View:
    """Reverse the dims where `axes` is True."""
    self._check_arity(axes, "flip axes")
    if self.size == 0: return self
    offset = self.offset + sum((s - 1) * st for s, st, f in zip(self.shape, self.strides, axes) if f)
    strides = tuple(-st if f else st for st, f in zip(self.strides, axes))
    mask = None
    if self.mask is not None: mask = tuple((s - hi, s - lo) if f else (lo, hi) for (lo, hi), s, f in
                                           zip(self.mask, self.shape, axes))
    return View.create(self.shape, strides, offset, mask)

  def stride(self, steps: Sequence[int]) -> View:
    """`x[::step]` along each dim; a negative step walks the dim backwards from its last element."""
    steps = as_int_tuple(steps, "stride steps")
    self._check_arity(steps, "stride steps")
    if 0 in steps: raise ValueError(f"stride steps {steps} for shape {self.shape} must be nonzero")
    view = self.flip(tuple(k < 0 for k in steps)) if any(k < 0 for k in steps) else self
    steps = tuple(abs(k) for k in steps)
    shape = tuple(_ceil_div(s, k) for s, k in zip(view.shape, steps))
    strides = tuple(st * k for st, k in zip(view.strides, steps))
    mask = None
    if view.mask is not None:
      mask = tuple((_ceil_div(lo, k), _ceil_div(hi, k)) for (lo, hi), k in zip(view.mask, steps))
    return View.create(shape, strides, view.offset, mask)

  # ---- index math
  def to_indexed(self, idxs: Sequence[UOp]) -> tuple[UOp, UOp]:
    """(memory index, valid) for loop indices `idxs` with 0 <= idxs[d] < shape[d]; not simplified."""
    if len(idxs) != self.ndim: raise ValueError(f"{len(idxs)} indices for a view of shape {self.shape}")
    index = UOp.const(dtypes.index, self.offset)
    for idx, size, st in zip(idxs, self.shape, self.strides):
      if size != 1 and st != 0: index = index + (idx if st == 1 else idx * st)
    valid = UOp.const(dtypes.bool, not self.is_fully_masked())
    if self.mask is None or self.is_fully_masked(): return index, valid
    for idx, size, (lo, hi) in zip(idxs, self.shape, self.mask):
      if lo > 0: valid = valid & UOp.const(dtypes.index, lo - 1).lt(idx)
      if hi < size: valid = valid & idx.lt(hi)
    return index, valid

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _canonical_view(shape: tuple[int, ...], strides: Optional[tuple[int, ...]], offset: int, mask: Optional[Mask]
                    ) -> View:
  """View.create on integer tuples (the key of the cache). Every value is made a plain int here, so a cached View
  never holds a bool or numpy integer that compared equal to the int a later call asks with."""
  shape = tuple(map(int, shape))
  if any(s < 0 for s in shape): raise ValueError(f"shape {shape} has a negative dimension")
  strides = strides_for_shape(shape) if strides is None else tuple(map(int, strides))
  if len(strides) != len(shape): raise ValueError(f"strides {strides} do not match shape {shape}")
  if 0 in shape: return View(shape, strides_for_shape(shape), 0, None, True)
  offset = operator.index(offset)
  strides = tuple(0 if size == 1 else st for size, st in zip(shape, strides))
  if mask is not None:
    if len(mask) != len(shape): raise ValueError(f"mask {tuple(mask)} does not match shape {shape}")
    if any(len(m) != 2 for m in mask): raise ValueError(f"mask {mask} must be (start, end) pairs")
    mask = tuple((max(0, int(operator.index(lo))), min(size, int(operator.index(hi))))
                 for (lo, hi), size in zip(mask, shape))
    if any(lo >= hi for lo, hi in mask): return View(shape, (0,) * len(shape), 0, (EMPTY_RANGE,) * len(shape), False)
    if all(m == (0, size) for m, size in zip(mask, shape)): mask = None
    else:
      offset += sum(lo * st for (lo, hi), st in zip(mask, strides) if hi - lo == 1)
      strides = tuple(0 if hi - lo == 1 else st for (lo, hi), st in zip(mask, strides))
  contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
  return View(shape, strides, int(offset), mask, contiguous)

def _merge_dims(dims: list[tuple[int, int, tuple[int, int]]]) -> Optional[tuple[int, tuple[int, int], int]]:
  """Merge (size, stride, valid range) dims, outer to inner, into one flat dim whose valid part is one range.
  Returns (stride, valid range, offset change), or None when that is impossible."""
  size, stride, (lo, hi) = dims[-1]
  offset_change = 0
  for outer_size, outer_stride, (outer_lo, outer_hi) in reversed(dims[:-1]):
    if outer_hi - outer_lo == 1:   # one valid outer index: its memory part is a constant, whatever the stride
      offset_change += outer_lo * (outer_stride - size * stride)
      lo, hi = outer_lo * size + lo, outer_lo * size + hi
    elif (lo, hi) == (0, size) and outer_stride == size * stride: lo, hi = outer_lo * size, outer_hi * size
    else: return None
    size *= outer_size
  return stride, (lo, hi), offset_change
