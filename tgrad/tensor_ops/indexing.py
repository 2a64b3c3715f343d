"""Indexing: numpy's `t[...]` and `t[...] = v` (basic indices are views; int tensors and lists gather), torch's gather
and scatter along one dim, and one_hot.

Gathers (`t[ids]`, `t.gather(dim, index)`, nn.Embedding) are data-dependent loads (LazyBuffer.gather, a GATHER in the
lazy graph): each output element reads one table element, so the work is proportional to the output, never to the
indexed axis (an embedding reads its rows, not its table). Out-of-range indices raise IndexError through
tgrad/bounds.py, as torch: at once for indices still on the host, else at the next realize (a lazy flag). Whatever the
index buffer holds, a gather kernel clamps each loaded index into [0, size), so it never reads outside the table.
Empty tensors keep the older one-hot formulation (a compare with ARANGE and a sum over the indexed axis), which also
serves as the reference the benchmark (bench/gather.py) compares with.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Optional
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import UOp
from tgrad.shape.sint import canonical, definitely_le, render
from tgrad.bounds import IndexBounds, check_index_bounds
from tgrad.tensor_ops.args import broadcast_shape, _resolve_axis
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")

class IndexingMixin:
  """Tensor's indexing, gather/scatter and one_hot."""
  # ---- indexing
  def __getitem__(self, indices) -> Tensor:
    """numpy indexing: ints (negative count from the end), slices (any step), None, Ellipsis, int Tensors or
    lists (a gather: one data-dependent load per output element, see `_gather`) and bool masks (through nonzero: a
    kernel runs). As torch, ints are basic indices beside tensor indices, so only tensor indices decide where the
    index dims go. Tensor indices may be negative down to -size; out-of-range ones raise IndexError, at once for host
    values, else at the next realize (see tgrad/bounds.py)."""
    plan = _IndexPlan(self.shape, indices, self.device)
    x = self.shrink(plan.bounds).flip(tuple(i for i, f in enumerate(plan.flips) if f))._stride(tuple(plan.steps))
    x = x.reshape(plan.view_shape)
    return x if not plan.tensor_indices else x._gather(plan)
  def _gather(self, plan: _IndexPlan) -> Tensor:
    """The tensor indices of `plan` (dims of self, the basic-indexed view): their dims are moved together (numpy puts
    the index dims where the first indexed dim was when the advanced indices are adjacent, else in front) and
    flattened into one; the indices, checked and normalized (negative ones count from the end), combine into one
    flat index; then `_take` gathers along the flattened dim. An empty tensor takes `_gather_one_hot`."""
    if self.numel() == 0: return self._gather_one_hot(plan)
    dims = [d for d, _ in plan.tensor_indices]
    rest = [d for d in range(self.ndim) if d not in dims]
    position = plan.advanced_position if plan.advanced_adjacent else 0
    x = self.permute(rest[:position] + dims + rest[position:])
    sizes = [self.shape[d] for d in dims]
    rows = math.prod(sizes)
    flat_dtype = dtypes.int32 if rows <= dtypes.max(dtypes.int32) else dtypes.int64
    flat: Optional[Tensor] = None
    for k, ((dim, index), input_dim) in enumerate(zip(plan.tensor_indices, plan.tensor_input_dims)):
      size = self.shape[dim]
      message = f"index {{value}} is out of bounds for dimension {input_dim} with size {{size}}"   # torch's words
      check_index_bounds(index.lazydata, IndexBounds(-size, size, message))
      index = index.cast(flat_dtype)
      index = (index < 0).where(index + size, index)
      stride = math.prod(sizes[k + 1:])
      term = index * stride if stride != 1 else index
      flat = term if flat is None else flat + term
    assert flat is not None
    index_shape = broadcast_shape(*[t.shape for _, t in plan.tensor_indices])
    x = x.reshape(x.shape[:position] + (rows,) + x.shape[position + len(dims):])
    return x._take(position, flat._broadcast_to(index_shape))
  def _take(self, dim: int, index: Tensor) -> Tensor:
    """self[:, ..., index, ...] with index at `dim` (numpy's take): shape self.shape[:dim] + index.shape +
    self.shape[dim + 1:]. Indices must already be in [0, size) (callers check and normalize them). One GATHER
    (LazyBuffer.gather) along the index's last dim, the table expanded over the index's other dims (a view)."""
    before, after, rows = self.shape[:dim], self.shape[dim + 1:], self.shape[dim]
    index_shape = index.shape or (1,)
    out_shape = before + index_shape + after
    table = self.reshape(before + (1,) * (len(index_shape) - 1) + (rows,) + after)
    table = table.expand(before + index_shape[:-1] + (rows,) + after)
    positions = index.reshape((1,) * len(before) + index_shape + (1,) * len(after)).expand(out_shape)
    gathered = F.Gather.apply(table, positions, axis=len(before) + len(index_shape) - 1)
    return gathered.reshape(before + index.shape + after)
  def _gather_one_hot(self, plan: _IndexPlan) -> Tensor:
    """The tensor indices of `plan` as a one-hot compare with ARANGE and a sum over the indexed dims: work
    proportional to output × indexed sizes. Only empty tensors use it (and bench/gather.py, as the baseline)."""
    dims = [d for d, _ in plan.tensor_indices]
    rest = [d for d in range(self.ndim) if d not in dims]
    index_shape = broadcast_shape(*[t.shape for _, t in plan.tensor_indices])
    ones_index, ones_rest, n_gathered = (1,) * len(index_shape), (1,) * len(rest), len(dims)
    x = self.permute(rest + dims)
    x = x.reshape(ones_index + x.shape)
    mask: Optional[Tensor] = None
    for k, ((dim, index), input_dim) in enumerate(zip(plan.tensor_indices, plan.tensor_input_dims)):
      size = self.shape[dim]
      message = f"index {{value}} is out of bounds for dimension {input_dim} with size {{size}}"   # torch's words
      check_index_bounds(index.lazydata, IndexBounds(-size, size, message))
      index = index.cast(dtypes.int32)
      index = (index < 0).where(index + size, index)._broadcast_to(index_shape)
      one_hot_shape = (1,) * k + (size,) + (1,) * (n_gathered - k - 1)
      positions = Tensor.arange(size, device=self.device).reshape(ones_index + ones_rest + one_hot_shape)
      hit = index.reshape(index_shape + ones_rest + (1,) * n_gathered) == positions
      mask = hit if mask is None else mask & hit
    assert mask is not None
    gathered_axes = tuple(range(x.ndim - n_gathered, x.ndim))
    out = mask.where(x, 0).sum(gathered_axes, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    if plan.advanced_adjacent and plan.advanced_position > 0:   # numpy: the index dims replace the indexed dims
      n_index, position = len(index_shape), plan.advanced_position
      before, after = range(n_index, n_index + position), range(n_index + position, out.ndim)
      order = list(before) + list(range(n_index)) + list(after)
      out = out.permute(order)
    return out
  def __setitem__(self, indices, value: Any) -> None:
    """In place on this Tensor: it is rebound to a lazy value with the selected positions replaced (and written into
    its buffer when that is realized). Basic indices cost O(numel); tensor indices O(numel × selected), where a
    repeated position takes the last value, as numpy. Not differentiable."""
    if self.requires_grad and Tensor.grad_enabled:
      raise RuntimeError(f"item assignment into a tensor that requires grad (shape {self.shape}); use Tensor.no_grad()")
    plan = _IndexPlan(self.shape, indices, self.device)
    value = self._as_tensor(value, dtype=self.dtype if not isinstance(value, Tensor) else None).cast(self.dtype)
    if plan.tensor_indices: new = self._scatter(indices, value)
    else:
      value = value.detach()._broadcast_to(plan.view_shape)
      placed = plan.place(value.lazydata)
      inside = plan.place(LazyBuffer.const_of(True, dtypes.bool, self.device, plan.view_shape))
      new = Tensor(inside).where(Tensor(placed), self.detach())
    self.assign(new)
  def _scatter(self, indices, value: Tensor) -> Tensor:
    positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[indices]
    value = value.detach()._broadcast_to(positions.shape).flatten()
    positions = positions.flatten()
    selected = positions.shape[0]
    if selected == 0: return self.detach()
    matches = Tensor.arange(self.numel(), device=self.device).reshape(-1, 1) == positions.reshape(1, -1)
    order = Tensor.arange(selected, device=self.device).reshape(1, -1)
    last = matches.where(order, -1).max(1, keepdim=True)        # the last write to each position wins
    chosen = matches & (order == last)
    written = chosen.where(value.reshape(1, -1), 0).sum(1, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    return (last.reshape(-1) >= 0).where(written, self.detach().flatten()).reshape(self.shape)

  # ---- classes as one-hot rows
  def one_hot(self, num_classes: int = -1) -> Tensor:
    """(..., num_classes) of 0/1 ints (default int dtype); num_classes = -1 reads max + 1 from the data (a kernel
    runs). A class outside [0, num_classes) raises IndexOutOfBoundsError, an IndexError and torch's RuntimeError
    (see tgrad/bounds.py for when)."""
    if not self.dtype.is_int:
      raise RuntimeError(f"one_hot is only applicable to index tensors (ints), got {self.dtype}")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < -1:
      raise RuntimeError(f"one_hot: num_classes must be a nonnegative int or -1 (inferred), got {num_classes!r}")
    if num_classes == -1:
      if self.numel() == 0: raise RuntimeError("Can not infer total number of classes from empty tensor.")
      num_classes = int(self.max().item()) + 1
    message = "one_hot: class {value} is out of range for num_classes {size} (classes must be in [0, num_classes))"
    check_index_bounds(self.lazydata, IndexBounds(0, num_classes, message))
    classes = Tensor.arange(num_classes, device=self.device)
    return (self.unsqueeze(-1) == classes).cast(dtypes.default_int)

  # ---- gather and scatter along one dim
  def _check_dim_index(self, dim: int, index: Tensor, name: str) -> int:
    if not isinstance(index, Tensor) or not index.dtype.is_int:
      raise RuntimeError(f"{name}(): expected an int index tensor, got {getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != self.ndim:
      raise RuntimeError(f"{name}(): Index tensor must have the same number of dimensions as input tensor: index "
                         f"{index.shape}, input {self.shape}")
    dim = _resolve_axis(dim, self.ndim, self.shape) if self.ndim else 0
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
      raise RuntimeError(f"{name}(): Size does not match at dimension {dim}: expected index {list(index.shape)} to be "
                         f"no larger than self {list(self.shape)} apart from dimension {dim}")
    return dim
  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[..., j, ...] = self[..., index[..., j, ...], ...] along `dim`, as torch.gather; index may be smaller
    than self in the other dims. One data-dependent load per output element (LazyBuffer.gather). Indices must be
    in [0, size): others raise IndexError (see tgrad/bounds.py for when)."""
    dim = self._check_dim_index(dim, index, "gather")
    check_index_bounds(index.lazydata, _dim_bounds("gather", dim, self.shape[dim] if self.ndim else 1))
    if self.ndim == 0: return self
    region = self.shrink(tuple(None if d == dim else (0, i) for d, i in enumerate(index.shape)))
    if index.numel() == 0 or self.numel() == 0: return region._gather_dim_one_hot(dim, index)
    return F.Gather.apply(region, index, axis=dim)
  def _gather_dim_one_hot(self, dim: int, index: Tensor) -> Tensor:
    """gather along `dim` of a region of index's shape but along dim, as a one-hot compare with ARANGE and a sum (for
    empty tensors, where there is nothing to load)."""
    size = self.shape[dim]
    values = self.transpose(dim, -1).unsqueeze(-2)                         # (..., 1, size)
    hit = index.transpose(dim, -1).unsqueeze(-1) == Tensor.arange(size, device=self.device)   # (..., P, size)
    out = hit.where(values, 0).sum(-1, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    return out.transpose(dim, -1)
  def scatter(self, dim: int, index: Tensor, src: Any, reduce: Optional[str] = None) -> Tensor:
    """A copy of self with src written at index along `dim`, as torch.scatter (src a tensor at least index's size,
    or a scalar): out[..., index[..., j, ...], ...] = src[..., j, ...]. reduce='add' or 'multiply' combines with
    the existing value instead. A repeated position takes the last write. Indices must be in [0, size): others
    raise IndexError (see tgrad/bounds.py for when)."""
    if reduce not in (None, "add", "multiply"): raise RuntimeError("reduce argument must be either add or multiply.")
    dim = self._check_dim_index(dim, index, "scatter")
    if isinstance(src, Tensor):
      if src.dtype != self.dtype:
        raise RuntimeError(f"scatter(): Expected self.dtype to be equal to src.dtype: {self.dtype} and {src.dtype}")
      if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise RuntimeError(f"scatter(): Expected index {list(index.shape)} to be no larger than src {list(src.shape)}")
      src = src.shrink(tuple((0, i) for i in index.shape)).cast(self.dtype)
    else: src = Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
    check_index_bounds(index.lazydata, _dim_bounds("scatter", dim, self.shape[dim] if self.ndim else 1))
    if self.ndim == 0 or index.numel() == 0: return self
    size, positions = self.shape[dim], index.shape[dim]
    hit = index.transpose(dim, -1).unsqueeze(-1) == Tensor.arange(size, device=self.device)   # (..., P, size)
    values = src.transpose(dim, -1).unsqueeze(-1)                                              # (..., P, 1)
    target = self.transpose(dim, -1)
    fill = tuple((0, t - i) for t, i in zip(target.shape[:-1], hit.shape[:-2])) + ((0, 0),)
    acc_dtype = _gather_acc_dtype(self.dtype)
    if reduce == "add":
      added = hit.where(values, 0).sum(-2, acc_dtype=acc_dtype).cast(self.dtype).pad(fill)
      return (target + added).transpose(dim, -1)
    if reduce == "multiply":
      factor = hit.where(values, 1).prod(-2, acc_dtype=acc_dtype).cast(self.dtype)
      return (target * factor.pad(fill, value=1)).transpose(dim, -1)
    order = Tensor.arange(positions, device=self.device).reshape(positions, 1)
    last = hit.where(order, -1).max(-2, keepdim=True)                      # the last write to each position wins
    chosen = hit & (order == last)
    written = chosen.where(values, 0).sum(-2, acc_dtype=acc_dtype).cast(self.dtype).pad(fill)
    touched = (last.squeeze(-2) >= 0).pad(fill, value=False)
    return touched.where(written, target).transpose(dim, -1)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """torch.scatter_reduce: combine src into a copy of self at index along `dim` with reduce 'sum', 'prod', 'mean',
    'amax' or 'amin'; include_self folds self's value at each written position in too (else it is replaced).
    Positions nothing is written to keep self. Integer 'mean' rounds down, as torch. One (positions × size) compare,
    as scatter."""
    if reduce not in SCATTER_REDUCTIONS:
      raise ValueError(f"scatter_reduce: reduce must be one of {SCATTER_REDUCTIONS}, got {reduce!r}")
    if not isinstance(src, Tensor): raise TypeError(f"scatter_reduce: src must be a Tensor, got {type(src).__name__}")
    dim = self._check_dim_index(dim, index, "scatter_reduce")
    if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
      raise ValueError(f"scatter_reduce: index {list(index.shape)} must be no larger than src {list(src.shape)}")
    check_index_bounds(index.lazydata, _dim_bounds("scatter_reduce", dim, self.shape[dim] if self.ndim else 1))
    if self.ndim == 0:
      return self.reshape(1).scatter_reduce(0, index.reshape(1), src.reshape(1), reduce, include_self).reshape(())
    if index.numel() == 0: return self
    src = src.shrink(tuple((0, i) for i in index.shape)).cast(self.dtype)
    hit = index.transpose(dim, -1).unsqueeze(-1) == Tensor.arange(self.shape[dim], device=self.device)  # (.., P, size)
    values = src.transpose(dim, -1).unsqueeze(-1)                                                       # (.., P, 1)
    target = self.transpose(dim, -1)
    fill = tuple((0, t - i) for t, i in zip(target.shape[:-1], hit.shape[:-2])) + ((0, 0),)
    acc_dtype = _gather_acc_dtype(self.dtype)
    if reduce in ("sum", "mean"): combined = hit.where(values, 0).sum(-2, acc_dtype=acc_dtype)
    elif reduce == "prod": combined = hit.where(values, 1).prod(-2, acc_dtype=acc_dtype)
    elif reduce == "amax": combined = hit.where(values, dtypes.min(self.dtype)).max(-2)
    else: combined = hit.where(values, dtypes.max(self.dtype)).min(-2)
    combined = combined.cast(self.dtype).pad(fill)
    touched = hit.any(-2).pad(fill, value=False)
    if reduce == "mean":
      count = hit.sum(-2).pad(fill).cast(self.dtype) + (1 if include_self else 0)
      total = combined + target if include_self else combined
      safe_count = touched.where(count, 1)
      combined = total / safe_count if self.dtype.is_float else total // safe_count
    elif include_self:
      combined = {"sum": target + combined, "prod": target * combined, "amax": target.maximum(combined),
                  "amin": target.minimum(combined)}[reduce]
    return touched.where(combined.cast(self.dtype), target).transpose(dim, -1)

  # ---- diagonals
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The `offset`-th diagonal of the (dim1, dim2) planes, as torch.diagonal: those dims go, the diagonal is a new
    last dim. A view (a strided read of the flattened plane)."""
    first, second = _resolve_axis(dim1, self.ndim, self.shape), _resolve_axis(dim2, self.ndim, self.shape)
    if first == second: raise ValueError(f"diagonal: dim1 {dim1} and dim2 {dim2} are the same dim of {self.shape}")
    rest = [d for d in range(self.ndim) if d not in (first, second)]
    x = self.permute(rest + [first, second])
    rows, cols = x.shape[-2:]
    lead = tuple((0, s) for s in x.shape[:-2])
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    row_start, col_start = min(max(-offset, 0), rows), min(max(offset, 0), cols)
    x = x.shrink(lead + ((row_start, row_start + length), (col_start, col_start + length)))
    if length == 0: return x.reshape(x.shape[:-2] + (0,))
    return x.reshape(x.shape[:-2] + (length * length,))._stride((1,) * len(lead) + (length + 1,))
  def diag(self, diagonal: int = 0) -> Tensor:
    """torch.diag: a 1-D tensor becomes the square matrix with it on the `diagonal`-th diagonal; a 2-D tensor
    gives its `diagonal`-th diagonal."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise ValueError(f"diag: expects a 1-D or 2-D tensor, got shape {self.shape}")
    n, shift = self.shape[0], abs(diagonal)
    size = n + shift
    rows = Tensor.arange(size, device=self.device).reshape(size, 1)
    on_diagonal = Tensor.arange(size, device=self.device).reshape(1, size) - rows == diagonal
    padded = self.pad(((0, shift),))      # the value of row i (diagonal >= 0) or of column j (below it)
    along = padded.reshape(size, 1) if diagonal >= 0 else padded.reshape(1, size)
    return on_diagonal.where(along, along.zeros_like())

  # ---- selections with a data-dependent shape: the count is read back to the host (a sync, as in torch), unless a
  # static `size` is given (torch's nonzero_static): then nothing is read back and the result is cut or padded to it
  def _compaction(self, mask: Tensor, size: Optional[int] = None) -> tuple[Tensor, Optional[Tensor]]:
    """(slots, n) bools for a flat bool mask (n,): row j is true at the j-th true position; slots is the count of
    true positions (read back to the host) or `size`. With a size, also the (size, 1) bools of the rows that hold a
    position (the rest are padding). O(slots·n) work."""
    if size is not None:
      if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
        raise RuntimeError(f"size must be a nonnegative int, got {size!r}")
      slots = int(size)
    else: slots = int(mask.sum().item())
    rank = mask.cast(dtypes.int32).cumsum(0) - 1
    slot = Tensor.arange(slots, device=self.device).reshape(slots, 1)
    selection = mask.reshape(1, -1) & (rank.cast(dtypes.int32).reshape(1, -1) == slot)
    return selection, (None if size is None else slot < mask.cast(dtypes.int32).sum().cast(dtypes.int32))
  def masked_select(self, mask: Tensor, size: Optional[int] = None, fill_value: Any = 0) -> Tensor:
    """The elements where the bool mask (broadcast with self) is true, as a 1-D tensor in row-major order, as
    torch.masked_select. The mask is realized to count them, unless `size` is given: then the result has exactly
    `size` elements, the first `size` selected ones and `fill_value` after them, with no sync. The selection is a
    compare and a sum (O(count·numel)), differentiable in self."""
    if not isinstance(mask, Tensor) or not mask.dtype.is_bool:
      raise TypeError(f"masked_select: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    shape = broadcast_shape(self.shape, mask.shape)
    values, flat_mask = self._broadcast_to(shape).flatten(), mask._broadcast_to(shape).flatten()
    selection, filled = self._compaction(flat_mask, size)
    out = selection.where(values.reshape(1, -1), 0).sum(1, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    return out if filled is None else filled.reshape(-1).where(out, fill_value).cast(self.dtype)
  def nonzero(self, size: Optional[int] = None, fill_value: int = 0) -> Tensor:
    """The (count, ndim) coordinates of the nonzero elements in row-major order, as torch.nonzero (int32, tinygrad's
    index dtype, where the numel fits; else int64). Realizes the mask to count them, unless `size` is given (torch's
    nonzero_static): then exactly `size` rows, the first `size` coordinates and rows of `fill_value` after them (0 by
    default, as tinygrad; torch's nonzero_static pads with -1), with no sync. O(count·numel)."""
    flat = (self != 0).flatten()
    index_dtype = dtypes.int32 if self.numel() <= dtypes.max(dtypes.int32) else dtypes.int64
    positions = Tensor.arange(self.numel(), dtype=index_dtype, device=self.device).reshape(1, -1)
    selection, filled = self._compaction(flat, size)
    flat_index = selection.where(positions, 0).sum(1, acc_dtype=index_dtype).cast(index_dtype)
    strides = [int(np.prod(self.shape[d + 1:], dtype=np.int64)) for d in range(self.ndim)]
    columns = [((flat_index // stride) % extent).reshape(-1, 1) for stride, extent in zip(strides, self.shape)]
    if not columns: return Tensor.zeros(flat_index.shape[0], 0, dtype=index_dtype, device=self.device)
    out = columns[0].cat(*columns[1:], dim=1) if len(columns) > 1 else columns[0]
    return out if filled is None else filled.where(out, fill_value).cast(index_dtype)

def _dim_bounds(name: str, dim: int, size: int) -> IndexBounds:
  """gather's and scatter's indices: 0 <= i < size, as torch (no negative indices)."""
  return IndexBounds(0, size, f"{name}: index {{value}} is out of bounds for dimension {dim} with size {{size}}")

def _gather_acc_dtype(dtype: DType) -> DType:
  """A sum that adds one selected value to zeros is exact in the value's own dtype (bools go through int32)."""
  return dtypes.int32 if dtype.is_bool else dtype

def _index_items(indices, shape: tuple[int, ...], device: str) -> list:
  """One index item per dim (plus the Nones): lists become Tensors (an empty one an int tensor), a bool mask becomes
  the int tensors of its True positions (one per dim it covers: a data-dependent shape, so a kernel runs now), the
  Ellipsis (or the end) becomes full slices."""
  items = list(indices) if isinstance(indices, tuple) else [indices]
  items = [_as_index_tensor(i, device) if isinstance(i, (list, tuple, np.ndarray)) else i for i in items]
  for i in items:
    if isinstance(i, bool) or not (i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice, Tensor))):
      raise TypeError(f"unsupported index {i!r}: use ints, slices, None, Ellipsis, int tensors or bool masks")
    if isinstance(i, Tensor) and not (i.dtype.is_int or i.dtype.is_bool):
      raise IndexError(f"tensor indices must be ints or bools (a mask), got {i.dtype}")
    if isinstance(i, Tensor) and i.dtype.is_bool and i.ndim == 0:
      raise IndexError("a 0-d bool index is not supported (it adds a dim or empties the tensor, by its value)")
  if sum(i is Ellipsis for i in items) > 1: raise IndexError("an index can only have a single ellipsis")
  def dims_taken(i) -> int: return 0 if i is None or i is Ellipsis else i.ndim if _is_mask(i) else 1
  consumed = sum(dims_taken(i) for i in items)
  if consumed > len(shape): raise IndexError(f"too many indices for a tensor of shape {shape}: {consumed} were given")
  fill = [slice(None)] * (len(shape) - consumed)
  at = next((k for k, i in enumerate(items) if i is Ellipsis), None)
  items = items + fill if at is None else items[:at] + fill + items[at + 1:]
  expanded, dim = [], 0
  for i in items:
    if _is_mask(i):
      if i.shape != shape[dim:dim + i.ndim]:
        raise IndexError(f"the shape of the mask {i.shape} at index {dim} does not match the shape "
                         f"{shape[dim:dim + i.ndim]} of the indexed tensor {shape} there")
      positions = i.nonzero()
      expanded.extend(positions[:, d] for d in range(i.ndim))
    else: expanded.append(i)
    dim += dims_taken(i)
  return expanded

def _as_index_tensor(index, device: str) -> Tensor:
  if isinstance(index, list) and not index: return Tensor.zeros(0, dtype=dtypes.default_int, device=device)
  return Tensor(index, device=device)

def _is_mask(index) -> bool: return isinstance(index, Tensor) and index.dtype.is_bool and index.ndim > 0

def _symbolic_slice(item: slice, size) -> bool:
  return any(isinstance(x, UOp) for x in (item.start, item.stop, item.step, size))

def _symbolic_slice_bounds(item: slice, size, dim: int) -> tuple:
  """(start, stop) of a slice with a symbolic bound or dim size: step 1, no negative counting from the end, and
  0 <= start <= stop <= size for every value of the variables."""
  if item.step not in (None, 1): raise IndexError(f"a slice of a symbolic size takes step 1, got {item.step!r}")
  start = 0 if item.start is None else item.start
  stop = size if item.stop is None else item.stop
  if not (definitely_le(0, start) and definitely_le(start, stop) and definitely_le(stop, size)):
    raise IndexError(f"slice {render(start)}:{render(stop)} of dim {dim} (size {render(size)}) must satisfy "
                     "0 <= start <= stop <= size for every value of its variables")
  return start, stop

class _IndexPlan:
  """A numpy index taken apart: the shrink/flip/stride that basic indices make, the view shape after ints are
  dropped and Nones added, and the tensor indices (by dim of that view) with numpy's rule for where their dims go
  (in front when they are not adjacent), as torch applies it: ints and 0-d tensors do not count as advanced."""
  def __init__(self, shape: tuple[int, ...], indices, device: str):
    items = _index_items(indices, shape, device)
    self.input_shape = shape
    self.bounds: list[tuple[int, int]] = []
    self.flips: list[bool] = []
    self.steps: list[int] = []
    self.strided_shape: list[int] = []
    self.tensor_indices: list[tuple[int, Tensor]] = []
    self.tensor_input_dims: list[int] = []   # the input dim each tensor index indexes (for error messages)
    # positions of the tensor indices among the items that are not ints (torch drops ints first, so only a None or a
    # slice between two tensor indices separates them)
    advanced_items: list[int] = []
    kept_items = 0
    self.advanced_position = 0       # the view dim where the index dims go when the advanced items are adjacent
    view: list[int] = []
    dim = 0
    for item in items:
      is_int = isinstance(item, (int, np.integer)) or (isinstance(item, Tensor) and item.ndim == 0)
      kept_items += not is_int
      if item is None:
        view.append(1)
        continue
      size = shape[dim]
      if isinstance(item, Tensor):
        if item.ndim:   # a 0-d tensor index adds no dims: torch places the others as if it were an int
          if not advanced_items: self.advanced_position = len(view) - len(self.tensor_indices)   # kept dims before
          advanced_items.append(kept_items)
        self.tensor_indices.append((len(view), item))
        self.tensor_input_dims.append(dim)
        self._keep(0, size, 1, False)
        view.append(size)
      elif isinstance(item, slice) and _symbolic_slice(item, size):
        start, stop = _symbolic_slice_bounds(item, size, dim)
        self._keep(start, stop, 1, False)
        view.append(canonical(stop - start))
      elif isinstance(item, slice):
        start, stop, step = item.indices(size)
        count = len(range(start, stop, step))
        if count == 0: self._keep(0, 0, 1, False)
        elif step > 0: self._keep(start, start + (count - 1) * step + 1, step, False)
        else: self._keep(start + (count - 1) * step, start + 1, -step, True)
        view.append(count)
      else:
        index = int(item)
        if not -size <= index < size: raise IndexError(f"index {index} is out of bounds for dim {dim} with size {size}")
        index %= size   # as torch (and tinygrad), an int is a basic index even beside tensor indices
        self._keep(index, index + 1, 1, False)
      dim += 1
    self.view_shape = tuple(view)
    self.advanced_adjacent = advanced_items == list(range(advanced_items[0], advanced_items[-1] + 1)) \
      if advanced_items else True
    if not self.advanced_adjacent: self.advanced_position = 0
  def _keep(self, begin: int, end: int, step: int, flip: bool) -> None:
    self.bounds.append((begin, end))
    self.steps.append(step)
    self.flips.append(flip)
    self.strided_shape.append(len(range(0, end - begin, step)) if step != 1 else canonical(end - begin))
  def place(self, value: LazyBuffer) -> LazyBuffer:
    """The inverse of the basic indexing: `value` (of view_shape) put back at its positions in the input shape,
    zeros (False) elsewhere."""
    placed = value.reshape(tuple(self.strided_shape))
    if any(s != 1 for s in self.steps):
      placed = F.spread_strided(placed, tuple(self.steps), tuple(hi - lo for lo, hi in self.bounds))
    placed = placed.flip(tuple(self.flips))
    return placed.pad(tuple((lo, size - hi) for size, (lo, hi) in zip(self.input_shape, self.bounds)))
