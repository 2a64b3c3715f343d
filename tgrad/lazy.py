"""The lazy graph: immutable values that say how to compute themselves, and nothing runs until `realize`.

A LazyBuffer is either a *base* — an op (ALU, REDUCE_AXIS, CONST, ARANGE, GATHER, COPY, EMPTY, CONTIGUOUS, ASSIGN,
CUSTOM)
over source LazyBuffers, with a contiguous shape, that may hold a realized device `Buffer` — or a *view*: a base seen
through a ShapeTracker. Movement ops only make new views; they never copy. Graph building does no fusion:
the scheduler (schedule.py) decides what becomes a kernel.
"""
from __future__ import annotations
import functools
from typing import Any, Optional
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, UOp, COMPARISON, FLOAT_ONLY_REDUCES, REDUCE_OPS, truncate_to
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.view import VIEW_CACHE_SIZE, as_shape_tuple
from tgrad.shape.sint import is_symbolic, sym_eq
from tgrad.device import Buffer, DEVICE_TRAITS, canonical_device
from tgrad.helpers import prod, cpu_count
from tgrad.scalars import is_liftable

_SCALAR_TRACKER = ShapeTracker.from_shape(())

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _const_tracker(shape: tuple[int, ...]) -> ShapeTracker:
  """The view of a 0-d constant at `shape`: reshaped to all ones, then expanded."""
  return _SCALAR_TRACKER.reshape((1,) * len(shape)).expand(shape)

# truncate_to rounds through numpy (microseconds); the weak Python scalars of elementwise ops repeat, so their
# roundings are remembered. Keyed by the value's type too (True == 1 == 1.0); floats equal to 0 (0.0 and -0.0
# compare equal) and NaN (never equal to itself) are not remembered.
_truncations: dict[tuple, Any] = {}
MAX_TRUNCATIONS = 4096

def _truncated(value, dtype: DType):
  kind = type(value)
  if (kind is int or kind is float or kind is bool) and value == value and value != 0:
    key = (kind, value, dtype)
    if (known := _truncations.get(key)) is not None or key in _truncations: return known
    if len(_truncations) >= MAX_TRUNCATIONS: _truncations.clear()
    result = _truncations[key] = truncate_to(value, dtype)
    return result
  return truncate_to(value, dtype)

class LazyBuffer:
  """One lazy value. Public fields: device, dtype, shape, st; `base` is itself for a base, else the viewed base.
  `region`: the composite op (tensor_ops/composite.py Region) whose output this base is, set by `composite` only; a
  class default, so building any other value sets nothing."""
  region: Any = None
  lifted: bool = False   # a CONST base of a Python scalar that kernels take as a parameter (tgrad/scalars.py)
  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Optional[Ops] = None,
               srcs: tuple[LazyBuffer, ...] = (), arg: Any = None, base: Optional[LazyBuffer] = None):
    self.device, self.st, self.dtype = device, st, dtype
    self.shape: tuple[int, ...] = st.shape
    if base is None:
      self.op, self.srcs, self.arg = op, srcs, arg
      self.buffer: Optional[Buffer] = None   # set once realized
      self._base: Optional[LazyBuffer] = None
    else:
      assert base.base is base, "a view's base must be a base"
      self._base = base

  @property
  def base(self) -> LazyBuffer: return self._base if self._base is not None else self
  @property
  def is_base(self) -> bool: return self._base is None
  @property
  def realized(self) -> Optional[Buffer]: return self.base.buffer
  @property
  def size(self) -> int: return prod(self.shape)
  def __repr__(self):
    state = "realized" if self.realized else ""
    if self.is_base: return f"<LB {self.device} {self.shape} {self.dtype} {self.op} {state}>"
    return f"<LB {self.device} {self.shape} {self.dtype} view of {self.base!r}>"

  # ---- creation
  @staticmethod
  def loadop(op: Ops, shape: tuple[int, ...], dtype: DType, device: str, arg: Any = None,
             srcs: tuple[LazyBuffer, ...] = ()) -> LazyBuffer:
    return LazyBuffer(canonical_device(device), ShapeTracker.from_shape(shape), dtype, op, srcs, arg)
  @staticmethod
  def const_of(value, dtype: DType, device: str, shape: tuple[int, ...] = (), weak: bool = False) -> LazyBuffer:
    """A constant of any shape, stored as a 0-d CONST base expanded by a view (no memory is ever used). Each call
    makes new LazyBuffers (a realized constant holds a Buffer that an assign may change); only the value's
    rounding and the immutable ShapeTrackers are remembered. `weak`: a Python scalar operand of an elementwise op,
    which kernels take as a parameter unless its value is one the simplifiers fold (tgrad/scalars.py)."""
    # a symbolic value (an index UOp over bound variables, e.g. a mean's count) stays a UOp: the kernel computes it
    arg = value if isinstance(value, UOp) else _truncated(value, dtype)
    scalar = LazyBuffer(canonical_device(device), _SCALAR_TRACKER, dtype, Ops.CONST, (), arg)
    if weak and is_liftable(arg, dtype): scalar.lifted = True
    if not shape: return scalar
    return LazyBuffer(scalar.device, _const_tracker(as_shape_tuple(shape, "constant shape")), dtype, base=scalar)
  @staticmethod
  def from_host(data: np.ndarray, device: str, dtype: Optional[DType] = None) -> LazyBuffer:
    """Host data to be copied to the device when realized. The array is referenced, not copied: don't mutate it.
    `dtype` reinterprets the bytes (e.g. uint16 data as bfloat16); it must have the array's item size."""
    dtype = dtype or dtypes.from_np(data.dtype)
    if dtype.itemsize != data.dtype.itemsize:
      raise TypeError(f"host data of dtype {data.dtype} can't be read as {dtype}: item sizes differ")
    return LazyBuffer.loadop(Ops.COPY, tuple(data.shape), dtype, device, arg=data)
  @staticmethod
  def from_buffer(buffer: Buffer, shape: tuple[int, ...]) -> LazyBuffer:
    out = LazyBuffer.loadop(Ops.EMPTY, shape, buffer.dtype, buffer.device)
    out.buffer = buffer
    return out
  def const(self, value, shape: Optional[tuple[int, ...]] = None) -> LazyBuffer:
    return LazyBuffer.const_of(value, self.dtype, self.device, self.shape if shape is None else shape)
  def is_unrealized_const(self) -> bool: return self.base.op is Ops.CONST and self.base.buffer is None
  def const_value(self): return self.base.arg

  # ---- compute
  def alu(self, op: Ops, *others: LazyBuffer, arg: Any = None) -> LazyBuffer:
    """An elementwise op; every operand must already have this shape (broadcasting is the Tensor's job). `arg` names
    how a kernel computes a transcendental (EXP2/LOG2/TANH: see tensor_ops/composite.py); None is the default."""
    srcs = (self, *others)
    shape, device = self.shape, self.device
    for s in others:
      if s.shape != shape: raise ValueError(f"{op.name}: operand shapes differ: {[x.shape for x in srcs]}")
      if s.device != device: raise ValueError(f"{op.name}: operands on devices {[x.device for x in srcs]}")
    if op is Ops.WHERE:
      if srcs[0].dtype != dtypes.bool: raise TypeError(f"WHERE condition must be bool, got {srcs[0].dtype}")
      out_dtype = srcs[1].dtype
      value_dtypes = [srcs[1].dtype, srcs[2].dtype]
    else:
      out_dtype = dtypes.bool if op in COMPARISON else self.dtype
      value_dtypes = [s.dtype for s in srcs]
    first = value_dtypes[0]
    for d in value_dtypes:   # a plain loop: a generator in any() costs more than the check on this per-op path
      if d is not first and d != first: raise TypeError(f"{op.name}: operand dtypes differ: {value_dtypes}")
    st = self.st if self._base is None else ShapeTracker.from_shape(shape)   # a base's tracker is already that
    return LazyBuffer(device, st, out_dtype, op, srcs, arg)
  def cast(self, dtype: DType, bitcast: bool = False) -> LazyBuffer:
    if dtype == self.dtype: return self
    if bitcast and dtype.itemsize != self.dtype.itemsize:
      raise TypeError(f"bitcast needs equal item sizes: {self.dtype} → {dtype}")
    return LazyBuffer.loadop(Ops.BITCAST if bitcast else Ops.CAST, self.shape, dtype, self.device, srcs=(self,))
  def r(self, op: Ops, axes: tuple[int, ...], dtype: Optional[DType] = None) -> LazyBuffer:
    """Reduce over `axes` (ADD, MUL, MAX, or LOGADDEXP of floats); reduced dims stay as size 1. `dtype`, for a
    LOGADDEXP only, is its result's (a float at least as wide as self's: the state stays in self's dtype)."""
    if op not in REDUCE_OPS: raise ValueError(f"{op} is not a reduce op")
    if op in FLOAT_ONLY_REDUCES and not self.dtype.is_float:
      raise TypeError(f"{op.name} reduces floats, not {self.dtype}")
    if dtype is not None and dtype != self.dtype and (op is not Ops.LOGADDEXP or not dtype.is_float or
                                                      dtype.itemsize < self.dtype.itemsize):
      raise TypeError(f"a {op.name} reduce of {self.dtype.name} can't give {dtype.name}")
    axes = tuple(sorted(set(axes)))
    if any(not 0 <= a < len(self.shape) for a in axes): raise IndexError(f"reduce axes {axes} for shape {self.shape}")
    if not axes: return self.cast(dtype or self.dtype)
    if (split := _split_reduce(self, op, axes, dtype or self.dtype)) is not None: return split
    return self._reduce(op, axes, dtype=dtype)
  def _reduce(self, op: Ops, axes: tuple[int, ...], of_partials: bool = False,
              dtype: Optional[DType] = None) -> LazyBuffer:
    """The reduce itself; of_partials marks a reduce of partial sums (arg (op, axes, True)): a float sum of them adds
    with compensation in the kernel."""
    new_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    return LazyBuffer.loadop(Ops.REDUCE_AXIS, new_shape, dtype or self.dtype, self.device,
                             arg=(op, axes, True) if of_partials else (op, axes), srcs=(self,))
  def gather(self, index: LazyBuffer, axis: int) -> LazyBuffer:
    """out[i] = self[i with i[axis] := index[i]], of index's shape: self (the table) has that shape except along
    `axis`. A data-dependent load (GATHER): a kernel reads one table element per output element, never the whole
    axis. Index values must lie in [0, self.shape[axis]) (the caller checks them; a kernel clamps them into range)."""
    if not index.dtype.is_int: raise TypeError(f"gather: the index must be an int, got {index.dtype}")
    if len(index.shape) != len(self.shape) or not 0 <= axis < len(self.shape) or \
       any(a != b for d, (a, b) in enumerate(zip(self.shape, index.shape)) if d != axis):
      raise ValueError(f"gather along axis {axis}: table {self.shape} and index {index.shape} must agree elsewhere")
    if index.device != self.device: raise ValueError(f"gather: table on {self.device}, index on {index.device}")
    if self.shape[axis] == 0: raise IndexError(f"gather along axis {axis} of an empty table {self.shape}")
    # the kernel moves along the axis by a constant stride: a view that can't (a pad or reshape across it) is copied
    table = self if self.st.real_strides()[axis] is not None else self.contiguous()
    return LazyBuffer.loadop(Ops.GATHER, index.shape, self.dtype, self.device, arg=axis, srcs=(table, index))
  def contiguous(self) -> LazyBuffer:
    """This value in its own buffer, row-major: a realized base is already that; anything else gets a CONTIGUOUS
    op, which the scheduler always realizes (so `x.contiguous()` also stops x from being recomputed)."""
    if self.is_base and (self.buffer is not None or self.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.EMPTY)): return self
    return LazyBuffer.loadop(Ops.CONTIGUOUS, self.shape, self.dtype, self.device, srcs=(self,))
  def copy_to_device(self, device: str) -> LazyBuffer:
    device = canonical_device(device)
    if device == self.device: return self
    # a copy moves a whole buffer's bytes: a view that reorders or selects elements is made contiguous first
    source = self.base if self.st.contiguous and self.size == self.base.size else self.contiguous()
    return LazyBuffer.loadop(Ops.COPY, self.shape, self.dtype, device, srcs=(source,))
  @staticmethod
  def custom(kernel: Any, srcs: tuple[LazyBuffer, ...], shape: tuple[int, ...], dtype: DType) -> LazyBuffer:
    """The value a CustomKernel (tgrad/custom.py) computes from srcs, on srcs' device: each source is passed as a
    whole row-major buffer of its shape (a view that reorders or selects elements is made contiguous first)."""
    name = getattr(kernel, "name", kernel)
    if not srcs: raise ValueError(f"custom kernel {name!r} needs at least one input")
    device = srcs[0].device
    if any(s.device != device for s in srcs):
      raise ValueError(f"custom kernel {name!r}: inputs on devices {[s.device for s in srcs]}")
    whole = tuple(s.base if s.st.contiguous and s.size == s.base.size and s.base.op is not Ops.CONST
                  else s.contiguous() for s in srcs)
    return LazyBuffer.loadop(Ops.CUSTOM, shape, dtype, device, arg=kernel, srcs=whole)
  def assign(self, value: LazyBuffer, region: Optional[ShapeTracker] = None) -> LazyBuffer:
    """Write `value` into this (realized, base) buffer when realized; returns the new lazy value of the buffer.
    With `region` (a view of this buffer, e.g. a shrink, whose shape is the value's) only those elements are written:
    the kernel runs over the value and stores through the region (the arg), and the result is the whole buffer."""
    target_shape = self.shape if region is None else region.shape
    if value.shape != target_shape or value.dtype != self.dtype:
      raise ValueError(f"assign of {value.shape} {value.dtype} into {target_shape} {self.dtype}")
    return LazyBuffer.loadop(Ops.ASSIGN, self.shape, self.dtype, self.device, arg=region, srcs=(self, value))

  # ---- movement: new views, never copies
  def _view(self, st: ShapeTracker) -> LazyBuffer:
    if st.shape == self.base.shape and st.contiguous: return self.base
    return LazyBuffer(self.device, st, self.dtype, base=self.base)
  def reshape(self, shape: tuple[int, ...]) -> LazyBuffer:
    if sym_eq(prod(shape), self.size) is not True: raise ValueError(f"cannot reshape {self.shape} to {shape}")
    return self if shape == self.shape else self._view(self.st.reshape(shape))
  def permute(self, order: tuple[int, ...]) -> LazyBuffer:
    return self if order == tuple(range(len(order))) else self._view(self.st.permute(order))
  def expand(self, shape: tuple[int, ...]) -> LazyBuffer:
    return self if shape == self.shape else self._view(self.st.expand(shape))
  def pad(self, padding: tuple[tuple[int, int], ...]) -> LazyBuffer:
    return self if all(p == (0, 0) for p in padding) else self._view(self.st.pad(padding))
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> LazyBuffer:
    return self if bounds == tuple((0, s) for s in self.shape) else self._view(self.st.shrink(bounds))
  def flip(self, axes: tuple[bool, ...]) -> LazyBuffer:
    return self if not any(axes) else self._view(self.st.flip(axes))
  def stride(self, steps: tuple[int, ...]) -> LazyBuffer:
    return self if all(s == 1 for s in steps) else self._view(self.st.stride(steps))


def unrealized_bases(roots: list[LazyBuffer]) -> list[LazyBuffer]:
  """Every unrealized base reachable from roots (through views), sources before their users; an explicit stack, so
  graphs of any depth are walked (the scheduler's and the graph simplifier's order)."""
  order: list[LazyBuffer] = []
  seen: set[int] = set()
  stack = [(r.base, False) for r in roots]
  while stack:
    lb, expanded = stack.pop()
    if id(lb) in seen: continue
    if expanded or lb.buffer is not None:
      seen.add(id(lb))
      order.append(lb)
      continue
    stack.append((lb, True))
    stack.extend((s.base, False) for s in lb.srcs if id(s.base) not in seen)
  return [lb for lb in order if lb.buffer is None]


# A big reduce with few outputs runs as two: partial reduces of chunks, then a reduce of the partials. As one kernel,
# each output's reduce is one GPU block or one CPU core (a 64M-element sum would use 1 of 132 SMs); split, the
# partials run in parallel. Thresholds as in tinygrad's split_reduceop: inputs per output ≥ 2^15, and here fewer
# outputs than an H100 holds blocks at once (132 SMs × 8 blocks); parts: the largest of SPLIT_REDUCE_PARTS dividing.
# On a CPU the THREAD opt already spreads outputs over cores, so only reduces with fewer outputs than cores split.
# The split is about parallelism only: the accuracy of long float sums is the kernel's (codegen/reduces.py sums
# blocks of ACCUMULATE_BLOCK values and adds the block totals with Kahan compensation), so it needs no extra kernels.
# The reduce of the partials is marked (REDUCE_AXIS arg (op, axes, True)): a float sum of them is compensated too
# (hundreds of large, alike values, the case where a plain running sum rounds at every step).
SPLIT_REDUCE_MIN_INPUTS = 1 << 15
SPLIT_REDUCE_MAX_OUTPUTS = 1024
SPLIT_REDUCE_PARTS = (256, 128, 64, 32, 16, 8)

def _split_reduce(x: LazyBuffer, op: Ops, axes: tuple[int, ...], dtype: DType) -> Optional[LazyBuffer]:
  """x.r(op, axes, dtype) as two reduces when it is big and has few outputs (see SPLIT_REDUCE_*), else None; the
  partials have the result's dtype."""
  if is_symbolic(x.shape): return None   # the split needs the sizes; a symbolic reduce stays one kernel
  inputs = prod(x.shape[a] for a in axes)
  max_outputs = SPLIT_REDUCE_MAX_OUTPUTS if DEVICE_TRAITS[x.device].has_local else cpu_count()   # no device start
  if inputs < SPLIT_REDUCE_MIN_INPUTS or prod(x.shape) // inputs >= max_outputs: return None
  for axis in sorted(axes, key=lambda a: -x.shape[a]):
    parts = next((p for p in SPLIT_REDUCE_PARTS if x.shape[axis] % p == 0), None)
    if parts is not None: break
  else: return None
  split_shape = x.shape[:axis] + (parts, x.shape[axis] // parts) + x.shape[axis + 1:]
  chunk_axes = tuple(a + (a > axis) for a in axes if a != axis) + (axis + 1,)   # everything reduced but the parts
  partials = x.reshape(split_shape)._reduce(op, tuple(sorted(chunk_axes)), dtype=dtype)
  out_shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
  return partials._reduce(op, (axis,), of_partials=True).reshape(out_shape)
