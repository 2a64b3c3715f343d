"""Reductions and scans: sum/prod/max/min/mean/var/std, argmax/argmin, any/all, softmax/log_softmax/logsumexp, and
the running forms cumsum/cumprod/cummax/cummin/logcumsumexp (a blocked scan: O(n·SCAN_BLOCK) work in O(log n) kernels).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional
from tgrad.dtype import DType, dtypes, least_upper_float, to_dtype
from tgrad.helpers import prod
from tgrad.ops import UOp
from tgrad.shape.sint import canonical, smax, vmax_of
from tgrad.tensor_ops.args import Scalar, HALF_FLOATS, _accumulator_dtype, _resolve_axis, _sum_dtype
from tgrad.regions import composite
from tgrad.lazy import SPLIT_REDUCE_MIN_INPUTS, SPLIT_REDUCE_PARTS
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

def _argmax_chunks(size: Any, devices: int = 1) -> int:
  """How many chunks argmax splits an axis of `size` into (_argmax_in_chunks), 0 for one pass: a concrete axis at
  least as long as a reduce that would be split (lazy.SPLIT_REDUCE_MIN_INPUTS), by the largest part count dividing
  it. On a tensor over `devices` devices the count is a multiple of theirs, so an axis split over them splits the
  chunks whole (each device holds its own chunks: tgrad/multi's reshape rule) instead of being gathered."""
  if isinstance(size, UOp) or size < SPLIT_REDUCE_MIN_INPUTS: return 0
  counts = [parts for parts in SPLIT_REDUCE_PARTS if parts % devices == 0] or \
    [parts * devices for parts in SPLIT_REDUCE_PARTS]
  return next((parts for parts in counts if size % parts == 0), 0)

class ReduceMixin:
  """Tensor's reductions and scans."""
  # ---- reductions
  def _reduce_axes(self, axis) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    # as torch: a 0-d tensor takes axis 0 or -1 (its one element), and reducing over it is a no-op
    resolved = tuple(_resolve_axis(a, max(self.ndim, 1), self.shape) for a in axes)
    if len(set(resolved)) != len(resolved): raise ValueError(f"repeated axis in {axis} for shape {self.shape}")
    return resolved if self.ndim else ()
  def _reduce(self, function: type[F.Function], axes: tuple[int, ...], keepdim: bool) -> Tensor:
    if not axes: return self
    # F.applied: Function.apply without its *inputs call; the reduced dims dropped by a shape valid by construction,
    # without Tensor.reshape's checks (an eager sum's host time is mostly such steps, each a few Python calls)
    out = F.applied(function, (self,), {"axes": axes})
    if keepdim: return out
    kept = []   # a loop, not a comprehension (a call of its own)
    for i, size in enumerate(out.lazydata.shape):
      if i not in axes: kept.append(size)
    return F.applied(F.Reshape, (out,), {"shape": tuple(kept)})
  def _reduced_shape(self, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(self.shape) if keepdim or i not in axes)
  def _accumulate(self, function: type[F.Function], axis, keepdim: bool, acc_dtype) -> Tensor:
    lb = self.lazydata
    axes = tuple(range(len(lb.shape))) if axis is None else self._reduce_axes(axis)
    dtype = lb.dtype
    out_dtype = _sum_dtype(dtype)
    acc = to_dtype(acc_dtype) if acc_dtype is not None else _accumulator_dtype(out_dtype)
    out = (self if acc is dtype else self.cast(acc))._reduce(function, axes, keepdim)
    return out if out_dtype is acc else out.cast(out_dtype)
  def sum(self, axis=None, keepdim: bool = False, acc_dtype: Any = None, dtype: Any = None) -> Tensor:
    """Sum over `axis` (int, tuple, None: all). As numpy: bools and signed ints sum to int64, unsigned ints to uint64;
    float16/bfloat16 accumulate in float32. dtype (torch's): cast the input to it first; the result has it."""
    if dtype is not None: return self.cast(to_dtype(dtype))._accumulate(F.Sum, axis, keepdim, acc_dtype).cast(dtype)
    return self._accumulate(F.Sum, axis, keepdim, acc_dtype)
  def prod(self, axis=None, keepdim: bool = False, acc_dtype: Any = None, dtype: Any = None) -> Tensor:
    """Product over `axis`, in sum's dtype; dtype (torch's): cast the input to it first; the result has it."""
    if dtype is not None: return self.cast(to_dtype(dtype))._accumulate(F.Prod, axis, keepdim, acc_dtype).cast(dtype)
    return self._accumulate(F.Prod, axis, keepdim, acc_dtype)
  def max(self, axis=None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if any(self.shape[a] == 0 for a in axes):
      raise ValueError(f"max over an empty axis: shape {self.shape}, axis {axis}")
    if self.dtype.is_bool: return self.cast(dtypes.uint8).max(axis, keepdim).cast(dtypes.bool)
    return self._reduce(F.Max, axes, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> Tensor:
    if self.dtype.is_bool: return self.logical_not().max(axis, keepdim).logical_not()
    return self._order_flip().max(axis, keepdim)._order_flip()
  def mean(self, axis=None, keepdim: bool = False) -> Tensor:
    dtype = self.dtype
    float_dtype = least_upper_float(dtype)
    acc_dtype = _accumulator_dtype(float_dtype)
    total = (self if acc_dtype is dtype else self.cast(acc_dtype)).sum(axis, keepdim)
    count = prod(self.shape[a] for a in self._reduce_axes(axis))
    out = total / count   # 0 / 0 is NaN for an empty axis, as numpy
    return out if out.dtype is float_dtype else out.cast(float_dtype)
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Computed in float32 for float16/bfloat16 (_float_math): a count over 65504 is inf in float16."""
    count = prod(self.shape[a] for a in self._reduce_axes(axis))
    def spread(x: Tensor) -> Tensor:
      return (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim) / smax(0, canonical(count - correction))
    return self._float_math(spread)
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    return self.var(axis, keepdim, correction).sqrt()
  def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    """(var, mean) over `axis`, as torch.var_mean."""
    return self.var(axis, keepdim, correction), self._to_float().mean(axis, keepdim)
  def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    """(std, mean) over `axis`, as torch.std_mean."""
    return self.std(axis, keepdim, correction), self._to_float().mean(axis, keepdim)
  def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """The index (int32; int64 on an axis past 2^31 elements) of the first maximum; NaN counts as the maximum, as in
    numpy."""
    if axis is None:
      out = self.flatten().argmax(0)
      return out.reshape((1,) * self.ndim) if keepdim else out
    if self.ndim == 0:   # as torch: axis 0 or -1 of a 0-d tensor is its one element, at index 0
      _resolve_axis(axis, 1, self.shape)
      return self.reshape(1).argmax(0)
    axis = _resolve_axis(axis, self.ndim, self.shape)
    size = self.shape[axis]
    if size == 0: raise ValueError(f"argmax over an empty axis: shape {self.shape}, axis {axis}")
    x = self.detach()
    index_dtype = dtypes.int32 if vmax_of(size) <= dtypes.max(dtypes.int32) else dtypes.int64
    chunks = _argmax_chunks(size, len(self.device) if isinstance(self.device, tuple) else 1)
    if chunks: return x._argmax_in_chunks(axis, keepdim, chunks, index_dtype)
    is_max = x == x.max(axis, keepdim=True)
    if x.dtype.is_float: is_max = is_max | x.isnan()
    if isinstance(size, UOp):   # a symbolic axis: size - i, with the size computed in the kernel
      shape = (size,) + (1,) * (self.ndim - axis - 1)
      countdown = (Tensor.arange(size, dtype=index_dtype, device=self.device) * -1 + size).reshape(shape)
      return is_max.where(countdown, 0).max(axis, keepdim) * -1 + size
    countdown = Tensor.arange(size, 0, -1, dtype=index_dtype, device=self.device).reshape((size,) + (1,) *
                                                                                        (self.ndim - axis - 1))
    return size - is_max.where(countdown, 0).max(axis, keepdim)
  def _argmax_in_chunks(self, axis: int, keepdim: bool, chunks: int, index_dtype: DType) -> Tensor:
    """argmax over a long concrete axis in two kernels: the first maximum of each of `chunks` equal chunks (a row
    kernel: the chunk's max and the first index holding it are two reduces over the same row), then over the chunks'
    maxima, read back from each chunk through its index (a gather within the chunk), the first chunk holding the
    largest. As one reduce each, the max and the index search would each be split in two (lazy._split_reduce): four
    kernels. The first maximum (or first NaN) overall lies in the first chunk whose own first maximum is the largest
    (or NaN). Every read stays inside its chunk, so an axis split over devices (tgrad/multi: the chunks axis is then
    split) needs no gather between devices: the chunks' maxima and indices are two all-reduces of one value a row."""
    x = self.transpose(axis, -1) if axis != self.ndim - 1 else self
    size = x.shape[-1]
    chunk = size // chunks
    chunked = x.reshape(*x.shape[:-1], chunks, chunk)
    local = chunked.argmax(-1, keepdim=True).cast(index_dtype).contiguous()   # [..., chunks, 1]: the first kernel's
    values = F.Gather.apply(chunked, local, axis=chunked.ndim - 1).reshape(*x.shape[:-1], chunks)   # chunk maxima
    offsets = Tensor.arange(0, size, chunk, dtype=index_dtype, device=self.device)
    first = local.reshape(*x.shape[:-1], chunks) + offsets                    # indices into x's axis
    is_max = values == values.max(-1, keepdim=True)
    if values.dtype.is_float: is_max = is_max | values.isnan()
    # the smallest index among the chunks holding the maximum: the largest of size - index
    out = size - is_max.where(size - first, 0).max(-1, keepdim=True)
    if axis != self.ndim - 1: out = out.transpose(axis, -1)
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i != axis))
  def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    flipped = self.detach().logical_not() if self.dtype.is_bool else self.detach()._order_flip()
    return flipped.argmax(axis, keepdim)
  def any(self, axis=None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if any(self.shape[a] == 0 for a in axes):
      return Tensor.full(self._reduced_shape(axes, keepdim), False, device=self.device)
    return (self != 0).max(axis, keepdim)
  def all(self, axis=None, keepdim: bool = False) -> Tensor:
    return self.logical_not().any(axis, keepdim).logical_not()
  # softmax and log_softmax are composites (tensor_ops/composite.py: computed in float32 for float16/bfloat16)
  def softmax(self, axis: int = -1) -> Tensor: return composite("softmax", (self,), axis=axis)
  def softmin(self, axis: int = -1) -> Tensor: return (-self._to_float()).softmax(axis)
  def log_softmax(self, axis: int = -1) -> Tensor: return composite("log_softmax", (self,), axis=axis)
  def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
    """log Σ exp over `axis`, a composite (tensor_ops/composite.py: the default shifts by the max; "online" is one
    pass); float16/bfloat16 compute in float32."""
    return composite("logsumexp", (self,), axis=tuple(axis) if isinstance(axis, list) else axis, keepdim=keepdim)
  # ---- scans: an associative op run along one axis, blocked so the work is O(n·SCAN_BLOCK) in O(log n) kernels
  def _scan(self, axis: int, kind: str) -> Tensor:
    """The inclusive scan of `kind` (a key of SCAN_KINDS) along `axis`, in self's dtype (the caller casts)."""
    axis = _resolve_axis(axis, max(self.ndim, 1), self.shape)   # a 0-d tensor takes axis 0 or -1, as torch
    if self.ndim and isinstance(self.shape[axis], UOp):
      raise NotImplementedError(f"a scan ({kind}) over the symbolic axis {axis} of {self.shape}: its blocks need "
                                "a known size")
    if self.ndim == 0 or self.shape[axis] <= 1: return self
    return _scan_last(self.transpose(axis, -1), SCAN_KINDS[kind]).transpose(axis, -1)
  def cumsum(self, axis: int = 0) -> Tensor:
    """Running sum along `axis`, in sum's dtype (bools and signed ints give int64, unsigned uint64, as numpy)."""
    out_dtype = _sum_dtype(self.dtype)
    return self.cast(_accumulator_dtype(out_dtype))._scan(axis, "sum").cast(out_dtype)
  def cumprod(self, axis: int = 0) -> Tensor:
    """Running product along `axis`, in sum's dtype. float32 multiplies in float64 (torch's CPU accumulator): the
    blocked order multiplies factors near 1 together, where float32 drops the small cross terms (a 10^4-long product
    of 1 ± 1e-4 factors drifted 3e-5 in float32, against 5e-6 for a sequential loop)."""
    out_dtype = _sum_dtype(self.dtype)
    acc_dtype = dtypes.float64 if out_dtype == dtypes.float32 else dtypes.float32 if out_dtype in HALF_FLOATS else \
      out_dtype
    return self.cast(acc_dtype)._scan(axis, "prod").cast(out_dtype)
  def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(values, indices) of the running maximum along `axis`, as torch.cummax (and tinygrad): indices (int32; int64
    on an axis past 2^31 elements) name where each running maximum was last reached. NaN propagates, and its index
    is that of the latest NaN."""
    if self.dtype.is_bool: values = self.cast(dtypes.uint8)._scan(axis, "max").cast(dtypes.bool)
    else: values = self._scan(axis, "max")
    return values, self._running_extreme_indices(values, axis)
  def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """(values, indices) of the running minimum along `axis`, as torch.cummin (see cummax)."""
    if self.dtype.is_bool: values = self.logical_not().cummax(axis)[0].logical_not()
    else: values = self._order_flip()._scan(axis, "max")._order_flip()
    return values, self._running_extreme_indices(values, axis)
  def _running_extreme_indices(self, values: Tensor, axis: int) -> Tensor:
    """Where the running extreme `values` along `axis` was last reached: a position is a record where the input
    equals the running value (or is NaN), and the index is the running maximum of the record positions (the value
    only changes at a record, so the last record holds the current value)."""
    axis = _resolve_axis(axis, max(self.ndim, 1), self.shape)
    size = self.shape[axis] if self.ndim else 1
    index_dtype = dtypes.int32 if vmax_of(size) <= dtypes.max(dtypes.int32) else dtypes.int64
    if self.ndim == 0: return Tensor(0, dtype=index_dtype, device=self.device)
    x = self.detach()
    record = x == values.detach()
    if x.dtype.is_float: record = record | x.isnan()
    positions = Tensor.arange(size, dtype=index_dtype, device=self.device).reshape((size,) + (1,) *
                                                                                    (self.ndim - axis - 1))
    return record.where(positions, 0)._scan(axis, "max")
  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, computed without overflow or underflow (each block shifts by its running
    max; blocks combine by logaddexp), as torch.logcumsumexp."""
    x = self._to_float()
    return x.cast(dtypes.float32)._scan(axis, "logsumexp").cast(x.dtype) if x.dtype in HALF_FLOATS else \
      x._scan(axis, "logsumexp")

# ---------------------------------------------------------------------------------------------------------------
# scans (cumsum, cumprod, cummax, logcumsumexp): blocked, O(n·SCAN_BLOCK) work in O(log n) kernels

# A scan splits the axis into blocks of SCAN_BLOCK. The prefix inside each block is a (block × block) lower-triangle
# reduce, fused in one kernel with taking in the carry; the block totals (one more kernel) are scanned the same way,
# recursively; the carry of a block is the scan of the totals before it. A level shrinks the axis SCAN_BLOCK-fold,
# so n elements take 2·⌈log_B n⌉ − 1 kernels and n·B work per level. The block size was chosen by timing a 10^6
# cumsum on the CPU (docs/design-notes.md, "Scans").
SCAN_BLOCK = 32

@dataclass(frozen=True)
class _ScanKind:
  """An associative op for `_scan_last`: its identity for a dtype; the inclusive prefix along the last axis (of one
  block, given the (B, B) lower-triangle mask); each block's total; and how a block's prefix takes in its carry."""
  identity: Callable[[DType], Scalar]
  block_prefix: Callable[[Tensor, Tensor], Tensor]
  block_total: Callable[[Tensor], Tensor]
  combine: Callable[[Tensor, Tensor], Tensor]

def _triangle_windows(x: Tensor, mask: Tensor, identity: Scalar) -> Tensor:
  """(..., B) → (..., B, B): row i holds x[j] for j <= i and the identity after it."""
  return mask.where(x.unsqueeze(-2), identity)

def _max_identity(dtype: DType) -> Scalar: return -math.inf if dtype.is_float else dtypes.min(dtype)

def _logsumexp_prefix(x: Tensor, mask: Tensor) -> Tensor:
  """log Σ_{j<=i} exp(x_j) per row, shifted by the row's running max so that nothing underflows to log(0)."""
  windows = _triangle_windows(x, mask, -math.inf)
  peak = windows.max(-1, keepdim=True).detach()
  peak = peak.isinf().where(0, peak)       # all −inf (or an +inf): shift by 0, as logsumexp does
  return (windows - peak).exp().sum(-1).log() + peak.squeeze(-1)

SCAN_KINDS = {
  "sum": _ScanKind(lambda dtype: 0, lambda x, mask: _triangle_windows(x, mask, 0).sum(-1), lambda x: x.sum(-1),
                   lambda a, b: a + b),
  "prod": _ScanKind(lambda dtype: 1, lambda x, mask: _triangle_windows(x, mask, 1).prod(-1), lambda x: x.prod(-1),
                    lambda a, b: a * b),
  "max": _ScanKind(_max_identity, lambda x, mask: _triangle_windows(x, mask, _max_identity(x.dtype)).max(-1),
                   lambda x: x.max(-1), lambda a, b: a.maximum(b)),
  "logsumexp": _ScanKind(lambda dtype: -math.inf, _logsumexp_prefix, lambda x: x.logsumexp(-1),
                         lambda a, b: a.logaddexp(b)),
}

def _scan_last(x: Tensor, kind: _ScanKind) -> Tensor:
  """The inclusive scan of `kind` along the last axis of x (see SCAN_BLOCK)."""
  n, lead = x.shape[-1], x.shape[:-1]
  block = min(n, SCAN_BLOCK)
  positions = Tensor.arange(block, device=x.device)
  mask = positions.reshape(1, block) <= positions.reshape(block, 1)      # mask[i, j] = j <= i
  if n <= SCAN_BLOCK: return kind.block_prefix(x, mask)
  count, identity, whole_lead = -(-n // block), kind.identity(x.dtype), ((0, 0),) * len(lead)
  blocks = x.pad(whole_lead + ((0, count * block - n),), value=identity).reshape(*lead, count, block)
  totals = _scan_last(kind.block_total(blocks), kind)                    # (..., count): inclusive over blocks
  carry = totals.pad(whole_lead + ((1, 0),), value=identity).shrink(tuple((0, s) for s in lead) + ((0, count),))
  out = kind.combine(kind.block_prefix(blocks, mask), carry.unsqueeze(-1)).reshape(*lead, count * block)
  return out.shrink(tuple((0, s) for s in lead) + ((0, n),))
