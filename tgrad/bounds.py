"""Index bounds checks: an out-of-range gather index raises IndexError naming the value, without a host round trip.

Input: an int index LazyBuffer and its `IndexBounds`. Index values still on the host (data not realized yet, a
constant) are checked at once. Otherwise a lazy one-byte flag (any index out of range) is queued, and
`realize_with_checks(*lbs)` — the realize every Tensor-level realize goes through — computes the queued flags in the
same schedule as lbs, reads them and raises IndexError for the first one set (docs/design-notes.md, "Index bounds").
Memory safety never rests on these checks: a gather kernel clamps every index it loads into its table's rows
(codegen/value_graph.py, `clamp_index`), so a bad index that no check saw reads a valid row, never outside the buffer.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from tgrad.dtype import dtypes
from tgrad.lazy import LazyBuffer
from tgrad.multi import MultiLazyBuffer
from tgrad.ops import Ops

class IndexOutOfBoundsError(IndexError, RuntimeError):
  """An index out of range. numpy-style code catches IndexError; torch raises RuntimeError for gather, scatter and
  one_hot (IndexError for `t[i]`): this is both."""

@dataclass(frozen=True)
class IndexBounds:
  """Valid indices are low <= i < size, except `ignore` (a loss's ignore_index), which is always allowed. `message`
  names the op and the dim, with {value} (the first bad index) and {size} filled in."""
  low: int
  size: int
  message: str = "index {value} is out of bounds for dimension 0 with size {size}"
  ignore: Optional[int] = None
  def out_of_range(self, values: np.ndarray) -> np.ndarray:
    bad = (values < self.low) | (values >= self.size)
    return bad & (values != self.ignore) if self.ignore is not None else bad
  def error(self, values: np.ndarray) -> IndexError:
    flat = np.asarray(values).reshape(-1)
    bad = flat[self.out_of_range(flat)]
    return IndexOutOfBoundsError(self.message.format(value=bad[0].item() if bad.size else "?", size=self.size))

@dataclass(frozen=True)
class _PendingCheck:
  flag: LazyBuffer      # uint8 of one element: nonzero when some index is out of range
  index: LazyBuffer     # the index values, copied to the host only to name the bad one
  bounds: IndexBounds

_pending: list[_PendingCheck] = []

def host_values(lb: LazyBuffer) -> Optional[np.ndarray]:
  """The values of `lb` if they are still on the host: Python or numpy data not realized yet (maybe reshaped, cast
  from one int dtype to another or moved to another device), or a constant. None when a device computes them."""
  shape, casts = lb.shape, []
  while True:
    if not (lb.is_base or (lb.st.contiguous and lb.size == lb.base.size)): return None   # a view that picks values
    base = lb.base
    if base.buffer is not None: return None
    if base.op is Ops.CONST: values = np.full(shape, base.arg)
    elif base.op is Ops.COPY and isinstance(base.arg, np.ndarray):   # the bytes may be read as another int dtype
      values = base.arg if base.arg.dtype == base.dtype.np else base.arg.view(base.dtype.np)
    elif base.op is Ops.COPY or (base.op is Ops.CAST and base.dtype.is_int and base.srcs[0].dtype.is_int):
      if base.op is Ops.CAST: casts.append(base.dtype)
      lb = base.srcs[0]
      continue
    else: return None
    for dtype in reversed(casts): values = values.astype(dtype.np)   # wraps as the device's CAST does
    return values.reshape(shape)

def _out_of_range_flag(index: LazyBuffer, bounds: IndexBounds) -> LazyBuffer:
  """max over the index of (i out of bounds), as uint8. Compared in 64 bits: the bounds may not fit the index dtype,
  and an int64 index is judged before any cast to int32."""
  unsigned = index.dtype.is_unsigned
  wide = index.cast(dtypes.uint64 if unsigned else dtypes.int64)
  def below(value: int) -> LazyBuffer: return wide.alu(Ops.CMPLT, wide.const(value))
  def logical_not(x: LazyBuffer) -> LazyBuffer: return x.alu(Ops.CMPNE, x.const(True))
  valid = below(bounds.size)
  if not unsigned: valid = valid.alu(Ops.AND, logical_not(below(bounds.low)))
  if bounds.ignore is not None and (bounds.ignore >= 0 or not unsigned):
    valid = valid.alu(Ops.OR, logical_not(wide.alu(Ops.CMPNE, wide.const(bounds.ignore))))
  return logical_not(valid).cast(dtypes.uint8).r(Ops.MAX, tuple(range(len(index.shape))))

def check_index_bounds(index: LazyBuffer, bounds: IndexBounds) -> None:
  """Raise IndexError now if the index values are on the host and one is out of bounds; else queue a lazy check. A
  sharded index (tgrad/multi/) is checked shard by shard."""
  if isinstance(index, MultiLazyBuffer):
    for shard in index.shards: check_index_bounds(shard, bounds)
    return
  if index.size == 0: return
  if not index.dtype.is_int: raise TypeError(f"index bounds of a {index.dtype} tensor: indices must be ints")
  values = host_values(index)
  if values is None: _pending.append(_PendingCheck(_out_of_range_flag(index, bounds), index, bounds))
  elif bounds.out_of_range(values).any(): raise bounds.error(values)

def _copy_to_host(lb: LazyBuffer) -> np.ndarray:
  from tgrad.realize import realize
  contiguous = lb.contiguous()
  realize(contiguous)
  return contiguous.base.buffer.copyout().reshape(lb.shape)

@functools.cache
def _realize_module() -> Any:
  """tgrad.realize, imported on first use: the runtime is needed only to compute."""
  import tgrad.realize
  return tgrad.realize

def realize_with_checks(*lbs: LazyBuffer) -> None:
  """Realize lbs together with every queued check; then raise IndexError for the first check that failed."""
  module = _realize_module()
  realize = module.realize   # read each call: tests wrap it
  if not _pending or module.is_capturing():   # a TinyJit records kernels without running them: flags are read after it
    realize(*lbs)
    return
  checks = _pending[:]
  _pending.clear()
  realize(*lbs, *[check.flag for check in checks])
  for check in checks:
    if check.flag.base.buffer.copyout().any(): raise check.bounds.error(_copy_to_host(check.index))

def pending_checks() -> int:
  """How many checks wait for the next realize (tests use it)."""
  return len(_pending)

def drop_pending_checks(keep: int = 0) -> None:
  """Forget the queued checks but the first `keep` (a trace that schedules without running, e.g.
  bench/decode_kernels.py, drops the checks it queued on values that are never computed)."""
  del _pending[keep:]
