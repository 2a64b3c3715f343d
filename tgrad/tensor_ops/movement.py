"""Movement ops: views that rearrange elements without computing (reshape, permute, expand, pad, shrink, flip,
strides, squeeze/unsqueeze/flatten) and the joins and cuts built on them (repeat, cat, stack, split, chunk).
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Optional
import numpy as np
from tgrad.dtype import dtypes, least_upper_dtype
from tgrad.lazy import LazyBuffer
from tgrad.helpers import prod
from tgrad.ops import UOp
from tgrad.shape.sint import canonical, definitely_le, smax, smin, sym_eq
from tgrad.tensor_ops.args import Scalar, _shape_arg, _check_shape, _resolve_axis
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

class MovementMixin:
  """Tensor's movement ops, joins and cuts."""
  # ---- movement
  def reshape(self, shape, *args) -> Tensor:
    """New shape; one dim may be -1 (inferred) and None keeps that dim. A bad shape raises RuntimeError, as torch."""
    shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(_shape_arg(shape, args)))
    for i, s in enumerate(shape):
      if isinstance(s, UOp): continue   # a symbolic size (docs/symbolic.md)
      if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
        raise TypeError(f"reshape of {self.shape}: sizes must be ints, got {s!r} in {shape}")
      if s < -1: raise RuntimeError(f"reshape of {self.shape}: invalid size {s} at index {i} of {shape}")
    if shape.count(-1) > 1: raise RuntimeError(f"reshape of {self.shape}: only one dim can be -1, got {shape}")
    if -1 in shape:
      known, numel = prod(s for s in shape if s != -1), self.numel()
      inferred = numel // known if isinstance(known, int) and known != 0 else None
      if inferred is None or sym_eq(canonical(inferred * known), numel) is not True:
        raise RuntimeError(f"cannot reshape tensor of shape {self.shape} ({self.numel()} elements) to {shape}")
      shape = tuple(canonical(inferred) if s == -1 else s for s in shape)
    shape = _check_shape(shape)
    if sym_eq(prod(shape), self.numel()) is not True:
      raise RuntimeError(f"cannot reshape tensor of shape {self.shape} ({self.numel()} elements) to {shape}")
    return self if shape == self.shape else F.Reshape.apply(self, shape=shape)
  def view(self, shape, *args) -> Tensor: return self.reshape(shape, *args)
  def permute(self, order, *args) -> Tensor:
    """Reorder the dims. As torch: a wrong count or a repeated dim raises RuntimeError, an out-of-range one
    IndexError."""
    given = _shape_arg(order, args)
    if len(given) != self.ndim:
      raise RuntimeError(f"permute order {tuple(given)} is not a permutation of the {self.ndim} dims of {self.shape}: "
                         f"it names {len(given)} dims")
    order = tuple(_resolve_axis(a, self.ndim, self.shape) for a in given)
    if len(set(order)) != len(order):
      raise RuntimeError(f"permute order {tuple(given)} is not a permutation of the {self.ndim} dims of {self.shape}: "
                         "a dim repeats")
    return self if order == tuple(range(self.ndim)) else F.Permute.apply(self, order=order)
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = _resolve_axis(dim0, self.ndim, self.shape), _resolve_axis(dim1, self.ndim, self.shape)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))
  def expand(self, shape, *args) -> Tensor:
    """Broadcast to `shape` (-1 keeps a dim; new dims go in front)."""
    shape = _shape_arg(shape, args)
    if len(shape) < self.ndim: raise ValueError(f"cannot expand {self.shape} to fewer dims: {shape}")
    current = (1,) * (len(shape) - self.ndim) + self.shape
    target = tuple(c if s == -1 else s for s, c in zip(shape, current))
    if any(c != t and c != 1 for c, t in zip(current, _check_shape(target))):
      raise ValueError(f"cannot expand {self.shape} to {shape}")
    return self._broadcast_to(target)
  def pad(self, padding, value: Scalar = 0.0, mode: str = "constant") -> Tensor:
    """Pad with `value`: `padding` is ((before, after) or None per dim), or torch's flat (left, right, top, bottom,
    ...) starting from the last dim. Negative amounts cut. mode (torch's): 'constant'; 'reflect' (mirror without
    the edge, amounts < the dim), 'replicate' (repeat the edge), 'circular' (wrap around, amounts <= the dim)."""
    if mode not in PAD_MODES: raise NotImplementedError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    padding = _normalize_padding(padding, self.shape)
    if mode != "constant": return self._pad_from_edges(padding, mode)
    if all(p == (0, 0) for p in padding): return self
    bounds = tuple((canonical(-smin(b, 0)), canonical(s + smin(a, 0))) for s, (b, a) in zip(self.shape, padding))
    if any(not definitely_le(lo, hi) for lo, hi in bounds):
      raise RuntimeError(f"padding {padding} cuts more than shape {self.shape}")
    x = self.shrink(bounds)
    grow = tuple((smax(b, 0), smax(a, 0)) for b, a in padding)
    padded = F.Pad.apply(x, padding=grow) if any(p != (0, 0) for p in grow) else x
    if value == 0 or padded is x: return padded
    inside = Tensor(LazyBuffer.const_of(True, dtypes.bool, self.device, x.shape).pad(grow))
    return inside.where(padded, value)
  def _pad_from_edges(self, padding: tuple[tuple[int, int], ...], mode: str) -> Tensor:
    """reflect / replicate / circular padding: per dim, cat the pieces cut (and flipped) from the input's edges.
    Negative amounts cut, as torch: reflect and replicate pad the whole input and then cut; circular cuts first and
    wraps what is left. Amounts too large for the input raise RuntimeError (torch's class)."""
    x = self
    for dim, (before, after) in enumerate(padding):
      if before == after == 0: continue
      size = x.shape[dim]
      if size + before + after == 0:   # as torch: padding that cuts exactly the whole dim leaves it empty
        x = x.shrink(tuple((0, 0) if i == dim else None for i in range(x.ndim)))
        continue
      if mode == "circular":
        if size + min(before, 0) + min(after, 0) < 0:
          raise RuntimeError(f"pad: padding {(before, after)} cuts more than dim {dim} of size {size} "
                             f"(shape {self.shape})")
        x = x.shrink(tuple((max(-before, 0), size - max(-after, 0)) if i == dim else None for i in range(x.ndim)))
        size, before, after = x.shape[dim], max(before, 0), max(after, 0)
        if before == after == 0: continue
      elif size + before + after < 0:
        raise RuntimeError(f"pad: mode {mode!r} padding {(before, after)} leaves a negative size of dim {dim} of "
                           f"size {size} (shape {self.shape})")
      limit = size - 1 if mode == "reflect" else size if mode == "circular" else math.inf
      if max(before, after) > limit or size == 0:
        raise RuntimeError(f"pad: mode {mode!r} padding {(before, after)} is too large for dim {dim} of size {size} "
                           f"(shape {self.shape})")
      def cut(start: int, end: int, tensor: Tensor = x, axis: int = dim) -> Tensor:
        return tensor.shrink(tuple((start, end) if i == axis else None for i in range(tensor.ndim)))
      grow_before, grow_after = max(before, 0), max(after, 0)
      if mode == "reflect":
        left, right = cut(1, grow_before + 1).flip(dim), cut(size - 1 - grow_after, size - 1).flip(dim)
      elif mode == "circular": left, right = cut(size - grow_before, size), cut(0, grow_after)
      else:
        edge_shape = lambda count: tuple(count if i == dim else s for i, s in enumerate(x.shape))  # noqa: E731
        left, right = cut(0, 1).expand(edge_shape(grow_before)), cut(size - 1, size).expand(edge_shape(grow_after))
      x = Tensor.cat(*[piece for piece, count in ((left, grow_before), (x, 1), (right, grow_after)) if count], dim=dim)
      if before < 0 or after < 0: x = cut(max(-before, 0), x.shape[dim] - max(-after, 0), x)
    return x
  def roll(self, shifts, dims=None) -> Tensor:
    """Shift elements along dims, wrapping around (torch.roll); dims=None rolls the flattened tensor."""
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims): raise ValueError(f"roll: shifts {shifts} and dims {dims} differ in length")
    x = self
    for shift, dim in zip(shifts, dims):
      dim = _resolve_axis(dim, self.ndim, self.shape) if self.ndim else 0
      size = x.shape[dim] if x.ndim else 1
      amount = int(shift) % size if size else 0
      if amount == 0: continue
      x = x.pad(tuple((amount, 0) if i == dim else (0, 0) for i in range(x.ndim)), mode="circular")
      x = x.shrink(tuple((0, size) if i == dim else None for i in range(x.ndim)))
    return x
  def unfold(self, dimension: int, size: int, step: int) -> Tensor:
    """torch's Tensor.unfold: every window of `size` along `dimension`, `step` apart; the windows replace that dim
    and their elements go in a new last dim. A view (no copy)."""
    if self.ndim == 0: return self.reshape(1).unfold(dimension, size, step).reshape(size)
    dim = _resolve_axis(dimension, self.ndim, self.shape)
    if not isinstance(size, int) or not 0 <= size <= self.shape[dim]:
      raise RuntimeError(f"unfold: size {size} must be in [0, {self.shape[dim]}] for dim {dim} of shape {self.shape}")
    if not isinstance(step, int) or step <= 0: raise RuntimeError(f"unfold: step must be positive, got {step}")
    if size == 0:   # as torch: (length // step + 1) empty windows
      empty = self.transpose(dim, -1).shrink(tuple((0, 0) if i == self.ndim - 1 else None for i in range(self.ndim)))
      return empty.reshape(*empty.shape[:-1], self.shape[dim] // step + 1, 0).transpose(dim, -2)
    windows = self.transpose(dim, -1)._pool((size,), (step,), (1,))     # (..., windows, size)
    return windows.transpose(dim, -2)
  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 1-D (or 0-d) tensors, as torch.meshgrid: 'ij' gives shape (len(a), len(b), ...), 'xy'
    swaps the first two dims (Cartesian). `a.meshgrid(b)` or `Tensor.meshgrid(a, b)`."""
    if indexing not in ("ij", "xy"): raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    tensors = [t.flatten() if t.ndim == 0 else t for t in _tensor_list((self, *args), "meshgrid")]
    for t in tensors:
      if t.ndim != 1: raise ValueError(f"meshgrid: expects 0-d or 1-d tensors, got shape {t.shape}")
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1: axes[0], axes[1] = 1, 0
    shape = [0] * len(tensors)
    for t, axis in zip(tensors, axes): shape[axis] = t.shape[0]
    return tuple(t.reshape(tuple(s if i == axis else 1 for i, s in enumerate(shape))).expand(tuple(shape))
                 for t, axis in zip(tensors, axes))
  def repeat_interleave(self, repeats, dim: Optional[int] = None) -> Tensor:
    """Repeat each element along `dim` (None: of the flattened tensor) `repeats` times, as torch: an int, or one
    count per element (a list, or an int Tensor, which is read back to the host: the output shape depends on it)."""
    if dim is None: return self.flatten().repeat_interleave(repeats, 0)
    dim = _resolve_axis(dim, self.ndim, self.shape) if self.ndim else 0
    x = self.reshape(1) if self.ndim == 0 else self
    if isinstance(repeats, Tensor): repeats = repeats.tolist()
    if isinstance(repeats, list) and len(repeats) == 1: repeats = repeats[0]
    if isinstance(repeats, (int, np.integer)):
      if repeats < 0: raise ValueError(f"repeat_interleave: repeats must be nonnegative, got {repeats}")
      spread = x.unsqueeze(dim + 1).expand(x.shape[:dim + 1] + (int(repeats),) + x.shape[dim + 1:])
      return spread.flatten(dim, dim + 1)
    counts = [int(r) for r in np.asarray(repeats).reshape(-1)]
    if len(counts) != x.shape[dim] or any(c < 0 for c in counts):
      raise ValueError(f"repeat_interleave: repeats {counts} needs {x.shape[dim]} nonnegative counts for dim {dim}")
    source = [i for i, c in enumerate(counts) for _ in range(c)]     # host-side: which input each output takes
    if not source: return x.shrink(tuple((0, 0) if i == dim else None for i in range(x.ndim)))
    return x[(slice(None),) * dim + (Tensor(source, device=x.device),)]
  def shrink_to(self, shape, *args) -> Tensor:
    """Keep the first `shape[i]` elements of each dim (None keeps the dim): tinygrad's shrink from 0."""
    shape = _shape_arg(shape, args)
    if len(shape) != self.ndim: raise ValueError(f"shrink_to: shape {shape} for a tensor of shape {self.shape}")
    return self.shrink(tuple(None if s is None else (0, s) for s in shape))
  def pad_to(self, shape, *args) -> Tensor:
    """Pad at the end of each dim up to `shape[i]` (None keeps the dim), with zeros."""
    shape = _shape_arg(shape, args)
    if len(shape) != self.ndim: raise ValueError(f"pad_to: cannot pad shape {self.shape} to {shape}")
    return self.pad(tuple((0, 0) if s is None else (0, s - n) for n, s in zip(self.shape, shape)))
  def rearrange(self, formula: str, **sizes: int) -> Tensor:
    """einops' rearrange: "b c (h w) -> b h w c" style formulas of axis names, parenthesized groups (split on the
    left, merged on the right), "..." for the dims not named, and "()" or "1" for a unit dim; `sizes` give the
    sizes a split needs (one per group may be left out). A reshape, a permute and a reshape."""
    return _rearrange(self, formula, sizes)
  def shrink(self, bounds) -> Tensor:
    """Keep [start, end) per dim (None keeps the dim)."""
    if len(bounds) != self.ndim:
      raise ValueError(f"shrink needs {self.ndim} bounds for shape {self.shape}, got {bounds}")
    bounds = tuple((0, s) if b is None else _amount_pair(b, "shrink bounds", bounds)
                   for s, b in zip(self.shape, bounds))
    if any(not (definitely_le(0, lo) and definitely_le(lo, hi) and definitely_le(hi, s))
           for s, (lo, hi) in zip(self.shape, bounds)):
      raise ValueError(f"shrink bounds {bounds} are outside shape {self.shape}")
    return self if bounds == tuple((0, s) for s in self.shape) else F.Shrink.apply(self, bounds=bounds)
  def flip(self, axis, *args) -> Tensor:
    """Reverse the order of elements along the given axes; an axis named twice raises RuntimeError, as torch."""
    given = _shape_arg(axis, args)
    resolved = [_resolve_axis(a, self.ndim, self.shape) for a in given]
    if len(set(resolved)) != len(resolved):
      raise RuntimeError(f"flip of shape {self.shape}: dims {tuple(given)} name one axis more than once")
    axes = set(resolved)
    if not axes: return self
    return F.Flip.apply(self, axes=tuple(i in axes for i in range(self.ndim)))
  def _stride(self, steps: tuple[int, ...]) -> Tensor:
    return self if all(s == 1 for s in steps) else F.Stride.apply(self, steps=steps)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    start, end = _resolve_axis(start_dim, self.ndim, self.shape), _resolve_axis(end_dim, self.ndim, self.shape)
    if start > end: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return self.reshape(self.shape[:start] + (prod(self.shape[start:end + 1]),) + self.shape[end + 1:])
  def unflatten(self, dim: int, sizes) -> Tensor:
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1:])
  def squeeze(self, dim: Optional[int] = None) -> Tensor:
    """Drop size-1 dims (all of them, or `dim` if it has size 1; other sizes are left alone, as in torch)."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    if self.ndim == 0 and dim in (0, -1): return self
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self if self.shape[dim] != 1 else self.reshape(self.shape[:dim] + self.shape[dim + 1:])
  def unsqueeze(self, dim: int) -> Tensor:
    dim = _resolve_axis(dim, self.ndim + 1, self.shape)
    return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])
  def repeat(self, repeats, *args) -> Tensor:
    """Tile like torch's repeat: `repeats` has one count per dim (more dims add leading ones)."""
    repeats = _shape_arg(repeats, args)
    if len(repeats) < self.ndim:
      raise ValueError(f"repeat needs at least {self.ndim} counts for {self.shape}, got {repeats}")
    base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    interleaved = base.reshape(tuple(d for s in base.shape for d in (1, s)))
    tiled = interleaved.expand(tuple(d for r, s in zip(repeats, base.shape) for d in (r, s)))
    return tiled.reshape(tuple(r * s for r, s in zip(repeats, base.shape)))
  def cat(*args: Tensor, dim: int = 0) -> Tensor:
    """Join along `dim`: `a.cat(b, c, dim=0)` or `Tensor.cat(a, b, c)` or `Tensor.cat([a, b, c])`; nothing to join
    raises ValueError, as torch."""
    tensors = _tensor_list(args, "cat", ValueError)
    first = tensors[0]
    if any(t.ndim == 0 for t in tensors):   # as torch, any 0-d operand is an error, not only the first
      raise ValueError(f"cat of 0-d tensors (shapes {[t.shape for t in tensors]}): use stack")
    dim = _resolve_axis(dim, first.ndim, first.shape)
    for t in tensors:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim):
        raise ValueError(f"cat along dim {dim}: shapes {[x.shape for x in tensors]} differ outside that dim")
    dtype = least_upper_dtype(*[t.dtype for t in tensors])
    total = sum(t.shape[dim] for t in tensors)
    out, offset = None, 0
    for t in tensors:
      padding = tuple((offset, total - offset - t.shape[dim]) if i == dim else (0, 0) for i in range(first.ndim))
      piece = t.cast(dtype).pad(padding)
      out = piece if out is None else out + piece
      offset += t.shape[dim]
    return out
  def stack(*args: Tensor, dim: int = 0) -> Tensor:
    """Join along a new `dim`: `a.stack(b, dim=0)`, `Tensor.stack(a, b)` or `Tensor.stack([a, b])`; nothing to stack
    raises RuntimeError, as torch."""
    tensors = _tensor_list(args, "stack")
    for t in tensors:
      if t.shape != tensors[0].shape: raise ValueError(f"stack needs one shape, got {[x.shape for x in tensors]}")
    dim = _resolve_axis(dim, tensors[0].ndim + 1, tensors[0].shape)
    expanded = [t.unsqueeze(dim) for t in tensors]
    return expanded[0].cat(*expanded[1:], dim=dim)
  def split(self, sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces along `dim`: of `sizes` each (an int; the last may be smaller) or of the listed sizes."""
    dim = _resolve_axis(dim, self.ndim, self.shape)
    length = self.shape[dim]
    if isinstance(sizes, int):
      if sizes <= 0: raise ValueError(f"split size must be positive, got {sizes}")
      sizes = [min(sizes, length - start) for start in range(0, length, sizes)] or [0]
    if sum(sizes) != length:
      raise ValueError(f"split sizes {list(sizes)} do not add up to {length} (shape {self.shape})")
    pieces, start = [], 0
    for size in sizes:
      pieces.append(self.shrink(tuple((start, start + size) if i == dim else None for i in range(self.ndim))))
      start += size
    return tuple(pieces)
  def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    if chunks <= 0: raise ValueError(f"chunk needs a positive count, got {chunks}")
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self.split(max(1, math.ceil(self.shape[dim] / chunks)), dim)

PAD_MODES = ("constant", "reflect", "replicate", "circular")

def _tensor_list(args: tuple, name: str, empty_error: type[Exception] = RuntimeError) -> list[Tensor]:
  """The tensors of `f(a, b)`, `a.f(b)` or `f([a, b])` (a list or tuple first, then more tensors); none raises
  `empty_error` (torch's class for `name`)."""
  first, rest = (args[0], args[1:]) if args else ((), ())
  tensors = list(first) + list(rest) if isinstance(first, (list, tuple)) else [first, *rest]
  if not tensors: raise empty_error(f"{name} expects a non-empty list of Tensors")
  for t in tensors:
    if not isinstance(t, Tensor): raise TypeError(f"expected Tensors, got {type(t).__name__}")
  return tensors

def _normalize_padding(padding, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  ndim = len(shape)
  if padding and all(p is None or isinstance(p, (tuple, list)) for p in padding):
    if len(padding) != ndim: raise ValueError(f"padding {padding} needs one entry per dim of shape {shape}")
    return tuple((0, 0) if p is None else _amount_pair(p, "padding", padding) for p in padding)
  amounts = [_size_arg(p, "padding", padding) for p in padding]   # torch's flat form, last dim first
  if len(amounts) % 2 or len(amounts) > 2 * ndim:
    raise RuntimeError(f"flat padding {padding} needs an even count of at most {2 * ndim} for shape {shape}")
  pairs = [(0, 0)] * ndim
  for i in range(len(amounts) // 2): pairs[ndim - 1 - i] = (amounts[2 * i], amounts[2 * i + 1])
  return tuple(pairs)

def _amount_pair(pair, argument: str, given) -> tuple:
  if len(pair) != 2: raise ValueError(f"{argument}: each entry must be a (start, end) pair, got {pair!r} in {given}")
  return _size_arg(pair[0], argument, given), _size_arg(pair[1], argument, given)

def _size_arg(x, argument: str, given):
  """An int, or a symbolic size (a bound Variable or an expression of one) as it is; anything else (a float, which
  would be truncated, a bool) raises TypeError naming the argument."""
  if isinstance(x, UOp): return canonical(x)
  if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)): return int(x)
  raise TypeError(f"{argument} must hold ints, got {x!r} ({type(x).__name__}) in {given!r}")

def _rearrange_side(side: str) -> list[list[str]]:
  """One side of a rearrange formula as groups of axis names ("..." is a name; "()" and "1" are empty groups)."""
  groups: list[list[str]] = []
  current: Optional[list[str]] = None
  for token in side.replace("(", " ( ").replace(")", " ) ").split():
    if token == "(":
      if current is not None: raise ValueError(f"rearrange: nested parentheses in {side!r}")
      current = []
    elif token == ")":
      if current is None: raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
      groups.append(current)
      current = None
    elif token == "1": (current if current is not None else groups).append([] if current is None else "1")
    elif not (token == "..." or token.isidentifier()): raise ValueError(f"rearrange: bad axis name {token!r}")
    elif current is not None: current.append(token)
    else: groups.append([token])
  if current is not None: raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
  return [[n for n in g if n != "1"] for g in groups]

def _rearrange(x: Tensor, formula: str, sizes: dict[str, int]) -> Tensor:
  if formula.count("->") != 1: raise ValueError(f"rearrange: need exactly one '->' in {formula!r}")
  lhs, rhs = (_rearrange_side(side) for side in formula.split("->"))
  if sum(g.count("...") for g in lhs) > 1: raise ValueError(f"rearrange: more than one '...' in {formula!r}")
  if any("..." in g and len(g) > 1 for g in lhs): raise ValueError("rearrange: '...' inside a group on the left")
  named_dims = sum(1 for g in lhs if g != ["..."])
  ellipsis = [f"...{i}" for i in range(x.ndim - named_dims)] if ["..."] in lhs else []
  if named_dims + len(ellipsis) != x.ndim:
    raise ValueError(f"rearrange: {formula!r} names {named_dims} dims, the tensor has shape {x.shape}")
  def expand(groups: list[list[str]]) -> list[list[str]]:   # "..." alone: one group per dim; in a group: merged
    out: list[list[str]] = []
    for g in groups:
      if g == ["..."]: out.extend([n] for n in ellipsis)
      else: out.append([m for n in g for m in (ellipsis if n == "..." else [n])])
    return out
  lhs, rhs = expand(lhs), expand(rhs)
  left, right = [n for g in lhs for n in g], [n for g in rhs for n in g]
  if sorted(left) != sorted(right) or len(set(left)) != len(left):
    raise ValueError(f"rearrange: the axes of {formula!r} differ between the sides or repeat")
  for name in sizes:
    if name not in left: raise ValueError(f"rearrange: size given for {name!r}, which {formula!r} does not use")
  axis_size: dict[str, int] = {}
  for group, dim in zip(lhs, x.shape):
    unknown = [n for n in group if n not in sizes]
    known = prod(sizes[n] for n in group if n in sizes)
    if len(unknown) > 1: raise ValueError(f"rearrange: give sizes for all but one of {group} in {formula!r}")
    if (unknown and (known == 0 or dim % known)) or (not unknown and known != dim):
      raise ValueError(f"rearrange: dim of size {dim} cannot be split as {group} with sizes {sizes}")
    for n in group: axis_size[n] = sizes[n] if n in sizes else dim // known
  split = x.reshape(tuple(axis_size[n] for n in left))
  moved = split.permute(tuple(left.index(n) for n in right))
  return moved.reshape(tuple(prod(axis_size[n] for n in g) for g in rhs))
