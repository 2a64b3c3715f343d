"""The lazy graph: immutable values that say how to compute themselves, and nothing runs until `realize`.

A LazyBuffer is either a *base* — an op (ALU, REDUCE_AXIS, CONST, ARANGE, GATHER, COPY, EMPTY, CONTIGUOUS, ASSIGN,
CUSTOM)
over source LazyBuffers, with a contiguous shape, that may hold a realized device `Buffer` — or a *view*: a base seen
through a ShapeTracker. Movement ops only make new views; they never copy. Graph building does no fusion:
the scheduler (schedule.py) decides what becomes a kernel.

Value semantics (docs/semantics.md): a LazyBuffer is a value, fixed when it is built. Two records keep that true
when a realized buffer is written in place (an ASSIGN): every base remembers, weakly, the unrealized values built
to read it (`readers`), so the realize that writes a buffer can first give the old value a copy when a reader is
still pending (`pending_readers`); and the value a Tensor *names* moves on through `successor` (set by the Tensor's
in-place writes) and `origin` (the aliasing movement a view was made by), which `latest` follows.

This module owns the graph: it alone changes a LazyBuffer's fields. Other layers walk the graph with `walk`, change
how a base computes its value with `rewrite` (a composite's lowering, copy coalescing: `as_built` still gives the
graph as the user built it), realize a base with `commit`, rebuild one over other sources with `with_sources`, and
mark a composite's output with `set_region`.
"""
from __future__ import annotations
import copy, functools, math, weakref
from typing import Any, Callable, Iterable, Iterator, Optional
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, UOp, COMPARISON, FLOAT_ONLY_REDUCES, REDUCE_OPS, truncate_to
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.view import VIEW_CACHE_SIZE, as_shape_tuple
from tgrad.shape.sint import sym_eq
from tgrad.device import Buffer, DEVICE_TRAITS, canonical_device
from tgrad.helpers import prod, cpu_count
from tgrad.scalars import is_liftable

_SCALAR_TRACKER = ShapeTracker.from_shape(())

@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _const_tracker(shape: tuple) -> ShapeTracker:
  """The view of a 0-d constant at `shape` (a tuple of sizes as given: checked and made canonical here, once per
  shape): reshaped to all ones, then expanded."""
  sizes = as_shape_tuple(shape, "constant shape")
  return _SCALAR_TRACKER.reshape((1,) * len(sizes)).expand(sizes)

# truncate_to rounds through numpy (microseconds); the weak Python scalars of elementwise ops repeat, so their
# roundings are remembered. Keyed by the value's type too (True == 1 == 1.0); floats equal to 0 (0.0 and -0.0
# compare equal) and NaN (never equal to itself) are not remembered.
_truncations: dict[tuple, Any] = {}
MAX_TRUNCATIONS = 4096
_WHERE = Ops.WHERE   # read by every elementwise op built: a module name, not the Enum class's slow attribute lookup
_BOOL = dtypes.bool  # likewise (`dtypes` is a class: its attributes are read through the generic lookup)
IN_PLACE = "in place"   # the arg of an ASSIGN that its value's CUSTOM kernel performs itself (`written_by`)

def _truncated(value, dtype: DType):
  kind = type(value)
  if (kind is int or kind is float or kind is bool) and value == value and value != 0:
    key = (kind, value, dtype.key)   # the key string hashes without a Python call (a DType's own hash is one)
    if (known := _truncations.get(key)) is not None or key in _truncations: return known
    if len(_truncations) >= MAX_TRUNCATIONS: _truncations.clear()
    result = _truncations[key] = truncate_to(value, dtype)
    return result
  return truncate_to(value, dtype)

class LazyBuffer:
  """One lazy value. Public fields: device, dtype, shape, st; `base` is itself for a base, else the viewed base.
  `region`: the composite op (tgrad/regions.py Region) whose output this base is, set through `set_region` by
  `regions.composite` only.
  Every field is written by `__init__`, in one order, even where it stays at its default: the interpreter reads an
  attribute that every instance holds at a fixed place by a specialized instruction, and one that falls back to a
  class default through the generic lookup (several times slower; these are read for every op built and realized)."""
  region: Any
  _built: Optional[tuple]   # (op, srcs, arg) as built, kept by the first `rewrite` that keeps it (as_built)
  lifted: bool   # a CONST base of a Python scalar that kernels take as a parameter (tgrad/scalars.py)
  successor: Optional[LazyBuffer]   # the value an in-place write of a Tensor holding this one gave it
  origin: Optional[tuple]           # (parent, method, arguments) of a value that aliases its parent: a view made by
                                    # reshape/permute/expand/shrink/stride, or a contiguous() of a base
  _readers: Any   # weak references (one, or a list) to the unrealized values built with this one as a source
  _self_ref: Optional[weakref.ref]
  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Optional[Ops] = None,
               srcs: tuple[LazyBuffer, ...] = (), arg: Any = None, base: Optional[LazyBuffer] = None):
    self.device, self.st, self.dtype = device, st, dtype
    self.shape: tuple[int, ...] = st.shape
    self.region = self._built = self.successor = self.origin = self._readers = self._self_ref = None
    self.lifted = False
    if base is None:
      self.op, self.srcs, self.arg = op, srcs, arg
      self.buffer: Optional[Buffer] = None   # set once realized
      self._base: Optional[LazyBuffer] = None
      if srcs:
        me = self._self_ref = weakref.ref(self)
        for s in srcs:   # _add_reader, its common cases inline (this runs for every op built)
          source = s if s._base is None else s._base
          if (readers := source._readers) is None: source._readers = me
          elif type(readers) is list and len(readers) < READERS_COMPACT_AT: readers.append(me)
          else: source._add_reader(me)
    else:
      assert base._base is None, "a view's base must be a base"
      self._base = base

  def _add_reader(self, reader: weakref.ref) -> None:
    # one reader (the common case) is kept as the bare weak reference: fewer objects for the garbage collector
    readers = self._readers
    if readers is None: self._readers = reader
    elif type(readers) is not list: self._readers = [readers, reader]
    else:
      if len(readers) >= READERS_COMPACT_AT and len(readers) & (len(readers) - 1) == 0:   # at powers of two
        readers[:] = [lb._self_ref for lb in self.pending_readers()]
      readers.append(reader)
  def pending_readers(self) -> list[LazyBuffer]:
    """The live unrealized values built to read this base: what an in-place write of its buffer would change."""
    readers = self._readers
    if readers is None: return []
    if type(readers) is not list: readers = [readers]
    return [lb for r in readers if (lb := r()) is not None and (lb._base is not None or lb.buffer is None)]
  def commit(self, buffer: Buffer, keep_arg: bool = False) -> None:
    """This base is realized into `buffer`: it keeps the Buffer and forgets its sources (and its arg, unless
    `keep_arg`), so the graph above a realized value is never walked again. The Buffer remembers, weakly, the values
    it holds, so a TinyJit replay that writes it can keep their old data for pending readers (`holders_of`)."""
    self.buffer, self.srcs = buffer, ()
    if not keep_arg: self.arg = None
    if self.region is not None: self.region = None   # a composite's region holds its inputs: let them go too
    if self._built is not None: self._built = None   # and so does the graph as built
    if buffer.holders is None: buffer.holders = [weakref.ref(self)]   # _hold's first holder, inline (every realize)
    else: _hold(buffer, self)
    if self.origin is not None and self.origin[1] == "contiguous" and self.origin[0].is_base and \
       self.origin[0].buffer is None:
      self.origin[0].commit(buffer)   # the value it is the buffer of: the same data, and its graph can go
  def rewrite(self, op: Ops, srcs: tuple[LazyBuffer, ...], arg: Any, keep_built: bool = True) -> None:
    """This unrealized base computes its value another way: `op` over `srcs` with `arg` (an alternative lowering of
    the composite it is the output of, tgrad/regions.py; the same value computed on another device, copy coalescing).
    With `keep_built` the first rewrite remembers the graph as built, which `as_built` goes on giving (a lowering is
    a choice for one realize: the benchmark database keys the graph as written); without it the new form is the graph
    as built from now on. ValueError for a view or a realized base."""
    if self._base is not None or self.buffer is not None:
      raise ValueError(f"only an unrealized base can be rewritten, not {self}")
    if keep_built:
      if self._built is None: self._built = (self.op, self.srcs, self.arg)
    elif self._built is not None: self._built = None
    self.op, self.srcs, self.arg = op, srcs, arg
  @property
  def as_built(self) -> tuple[Any, tuple[LazyBuffer, ...], Any]:
    """(op, srcs, arg) of this base as built: what it computed before any `rewrite` that kept the graph as built."""
    return self._built if self._built is not None else (self.op, self.srcs, self.arg)
  def set_region(self, region: Any) -> None:
    """Mark this base as the output of a composite `region` (tgrad/regions.py), or as no composite's (None): then
    the lowering it computes now is final, the graph as built from now on."""
    self.region = region
    if region is None and self._built is not None: self._built = None
  def with_sources(self, srcs: tuple[LazyBuffer, ...]) -> LazyBuffer:
    """A copy of this base over other sources, every other field kept (op, arg, dtype, view, region, ...): a node of
    a rebuilt graph (graph_simplify.simplify_graph)."""
    node = copy.copy(self)
    node.srcs = srcs
    return node
  def move_readers_to(self, old_value: LazyBuffer) -> None:
    """The pending readers of this realized base read `old_value` (a copy of its data) instead: what a TinyJit
    replay does before it writes this base's Buffer, which the tensors naming this base must go on seeing."""
    for reader in self.pending_readers():
      if reader._base is not None: reader._base = old_value   # a pad or flip of this base's data
      else: reader.srcs = tuple(old_value if s is self else old_value._view(s.st) if s.base is self else s
                                for s in reader.srcs)
      old_value._add_reader(reader._self_ref)
    self._readers = None
  def keep_value_in(self, buffer: Buffer) -> None:
    """This realized base's value now lives in `buffer` (a copy taken before its own Buffer was written in place)."""
    if self.buffer is None or buffer.size != self.buffer.size or buffer.dtype != self.buffer.dtype:
      raise ValueError(f"{self} can't move its value to {buffer}")
    self.buffer = buffer
    _hold(buffer, self)
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
    tracker = _const_tracker(shape if type(shape) is tuple else tuple(shape))
    return LazyBuffer(scalar.device, tracker, dtype, base=scalar)
  @staticmethod
  def from_host(data: np.ndarray, device: str, dtype: Optional[DType] = None) -> LazyBuffer:
    """Host data to be copied to the device when realized. The array is referenced, not copied: don't mutate it.
    `dtype` reinterprets the bytes (e.g. uint16 data as bfloat16); it must have the array's item size."""
    dtype = dtype or dtypes.from_np(data.dtype)
    if dtype.itemsize != data.dtype.itemsize:
      raise TypeError(f"host data of dtype {data.dtype} can't be read as {dtype}: item sizes differ")
    return LazyBuffer.loadop(Ops.COPY, tuple(data.shape), dtype, device, arg=data)
  @staticmethod
  def copy_of_buffer(buffer: Buffer) -> LazyBuffer:
    """A value (unrealized) that copies all of `buffer`'s data into a new Buffer: how an old value is kept before its
    Buffer is written in place (schedule.keep_old_values, realize.keep_old_values_of)."""
    source = LazyBuffer.from_buffer(buffer, (buffer.size,))
    return LazyBuffer.loadop(Ops.CONTIGUOUS, source.shape, source.dtype, source.device, srcs=(source,))
  @staticmethod
  def from_buffer(buffer: Buffer, shape: tuple[int, ...]) -> LazyBuffer:
    out = LazyBuffer.loadop(Ops.EMPTY, shape, buffer.dtype, buffer.device)
    out.buffer = buffer
    _hold(buffer, out)
    return out
  def const(self, value, shape: Optional[tuple[int, ...]] = None) -> LazyBuffer:
    return LazyBuffer.const_of(value, self.dtype, self.device, self.shape if shape is None else shape)
  def is_unrealized_const(self) -> bool: return self.base.op is Ops.CONST and self.base.buffer is None
  def const_value(self): return self.base.arg

  # ---- compute
  def binary(self, op: Ops, other: LazyBuffer) -> LazyBuffer:
    """`alu(op, other)`, for the hot binary ops (Add, Mul): a method of fixed arguments, which the interpreter calls
    inline (a call through `*others` goes the general way, several hundred instructions more). The same checks."""
    shape, device = self.shape, self.device
    if other.shape == shape and other.device == device and ((dtype := self.dtype) is other.dtype or
                                                            dtype == other.dtype):
      return LazyBuffer(device, self.st if self._base is None else ShapeTracker.from_shape(shape),
                        _BOOL if op in COMPARISON else dtype, op, (self, other))
    return self.alu(op, other)   # raises, naming what differs
  def alu(self, op: Ops, *others: LazyBuffer, arg: Any = None) -> LazyBuffer:
    """An elementwise op; every operand must already have this shape (broadcasting is the Tensor's job). `arg` names
    how a kernel computes a transcendental (EXP2/LOG2/TANH: see tensor_ops/composite.py); None is the default."""
    shape, device = self.shape, self.device
    if len(others) == 1:   # a binary op (most ops built): the checks below for two operands, without their loops
      other = others[0]
      if other.shape == shape and other.device == device and ((dtype := self.dtype) is other.dtype or
                                                              dtype == other.dtype):
        return LazyBuffer(device, self.st if self._base is None else ShapeTracker.from_shape(shape),
                          _BOOL if op in COMPARISON else dtype, op, (self, other), arg)
    srcs = (self, *others)
    for s in others:
      if s.shape != shape: raise ValueError(f"{op.name}: operand shapes differ: {[x.shape for x in srcs]}")
      if s.device != device: raise ValueError(f"{op.name}: operands on devices {[x.device for x in srcs]}")
    if op is _WHERE:
      if srcs[0].dtype != dtypes.bool: raise TypeError(f"WHERE condition must be bool, got {srcs[0].dtype}")
      out_dtype = srcs[1].dtype
      values = srcs[1:]
    else:
      out_dtype = dtypes.bool if op in COMPARISON else self.dtype
      values = srcs
    first = values[0].dtype
    for s in values:   # a plain loop: a generator or a comprehension costs more than the check on this per-op path
      if (d := s.dtype) is not first and d != first:
        raise TypeError(f"{op.name}: operand dtypes differ: {[x.dtype for x in values]}")
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
    if axes and (axes[0] < 0 or axes[-1] >= len(self.shape)):   # sorted: the ends decide
      raise IndexError(f"reduce axes {axes} for shape {self.shape}")
    if not axes: return self.cast(dtype or self.dtype)
    if (split := _split_reduce(self, op, axes, dtype or self.dtype)) is not None: return split
    return self._reduce(op, axes, dtype=dtype)
  def _reduce(self, op: Ops, axes: tuple[int, ...], of_partials: bool = False,
              dtype: Optional[DType] = None) -> LazyBuffer:
    """The reduce itself; of_partials marks a reduce of partial sums (arg (op, axes, True)): a float sum of them adds
    with compensation in the kernel."""
    new_shape = list(self.shape)   # a loop, not a generator: every reduce passes here
    for a in axes: new_shape[a] = 1
    # loadop's checks skipped: this device is canonical, and so is a shape made of this shape's sizes and 1s
    return LazyBuffer(self.device, ShapeTracker.from_canonical_shape(tuple(new_shape)), dtype or self.dtype,
                      Ops.REDUCE_AXIS, (self,), (op, axes, True) if of_partials else (op, axes))
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
  def contiguous(self, alias: bool = True) -> LazyBuffer:
    """This value in its own buffer, row-major: a realized base is already that; anything else gets a CONTIGUOUS
    op, which the scheduler always realizes (so `x.contiguous()` also stops x from being recomputed). With `alias`,
    the result names the same storage as self where torch's contiguous() would return self (see below)."""
    if self.is_base and (self.buffer is not None or self.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.EMPTY, Ops.ASSIGN)):
      return self
    out = LazyBuffer.loadop(Ops.CONTIGUOUS, self.shape, self.dtype, self.device, srcs=(self,))
    # contiguous() of a value already row-major (a computed value; a pad or flip, copies in torch; a row-major view) is
    # that value in a buffer, so a Tensor holding either names one storage, as in torch; else it is a copy
    if alias and (self.origin is None or self.st.row_major()): out.origin = (self, "contiguous", ())
    return out
  def copy_to_device(self, device: str) -> LazyBuffer:
    device = canonical_device(device)
    if device == self.device: return self
    # a copy moves a whole buffer's bytes: a view that reorders or selects elements is made contiguous first
    source = self.base if self.st.contiguous and self.size == self.base.size else self.contiguous()
    return LazyBuffer.loadop(Ops.COPY, self.shape, self.dtype, device, srcs=(source,))
  @staticmethod
  def custom(kernel: Any, srcs: tuple[LazyBuffer, ...], shape: tuple[int, ...], dtype: DType,
             views: bool = False) -> LazyBuffer:
    """The value a CustomKernel (tgrad/custom.py) computes from srcs, on srcs' device: each source is passed as a
    whole row-major buffer of its shape (a view that reorders or selects elements is made contiguous first). With
    `views`, the sources stay the views given and each is passed as its base's buffer: the kernel reads them in place
    through the layouts it was built with, and their symbolic sizes are the launch's variables."""
    name = getattr(kernel, "name", kernel)
    if not srcs: raise ValueError(f"custom kernel {name!r} needs at least one input")
    device = srcs[0].device
    if any(s.device != device for s in srcs):
      raise ValueError(f"custom kernel {name!r}: inputs on devices {[s.device for s in srcs]}")
    whole = srcs if views else tuple(s.base if s.st.contiguous and s.size == s.base.size and s.base.op is not Ops.CONST
                                     else s.contiguous() for s in srcs)
    return LazyBuffer.loadop(Ops.CUSTOM, shape, dtype, device, arg=kernel, srcs=whole)
  def written_by(self, writer: LazyBuffer) -> LazyBuffer:
    """This realized base after `writer`, a CUSTOM value whose kernel also writes this buffer in place (an attention
    kernel's KV-cache append), has run: an ASSIGN with no kernel of its own (arg IN_PLACE), which the scheduler makes
    a second output of the writer's step, so readers of the old data are ordered before it as for any ASSIGN."""
    if not (self.is_base and self.buffer is not None) or writer.op is not Ops.CUSTOM or self not in \
       [s.base for s in writer.srcs]:
      raise ValueError("written_by: a realized base that a CUSTOM value reads and writes")
    return LazyBuffer.loadop(Ops.ASSIGN, self.shape, self.dtype, self.device, arg=IN_PLACE, srcs=(self, writer))
  def assign(self, value: LazyBuffer, region: Optional[ShapeTracker] = None) -> LazyBuffer:
    """Write `value` into this (realized, base) buffer when realized; returns the new lazy value of the buffer.
    With `region` (a view of this buffer, e.g. a shrink, whose shape is the value's) only those elements are written:
    the kernel runs over the value and stores through the region (the arg), and the result is the whole buffer."""
    target_shape = self.shape if region is None else region.shape
    if value.shape != target_shape or value.dtype != self.dtype:
      raise ValueError(f"assign of {value.shape} {value.dtype} into {target_shape} {self.dtype}")
    return LazyBuffer.loadop(Ops.ASSIGN, self.shape, self.dtype, self.device, arg=region, srcs=(self, value))

  # ---- movement: new views, never copies
  # reshape, permute, expand, shrink and stride alias their source as torch's views do (the view records how it was
  # made, so `latest` can make it again over a source written in place); pad and flip are copies in torch: their
  # views are values of their own.
  def _view(self, st: ShapeTracker, origin: Optional[tuple] = None) -> LazyBuffer:
    # the base itself, when the view is all of it in order and aliases it (a flip, even of a size-1 axis, or a flip
    # of a flip, is a value of its own)
    base = self if self._base is None else self._base   # the `base` property, inline (every view passes here)
    if st.shape == base.shape and st.contiguous and origin is not None and \
       (self._base is None or view_root(self) is base):
      return base
    view = LazyBuffer(self.device, st, self.dtype, base=base)
    if origin is not None: view.origin = (self, origin[0], origin[1:])
    else:   # a pad or flip is a value of its own (a copy in torch) that reads the base's data: a reader of it
      view._self_ref = weakref.ref(view)
      view.base._add_reader(view._self_ref)
    return view
  def reshape(self, shape: tuple[int, ...]) -> LazyBuffer:
    new, old = math.prod(shape), math.prod(self.shape)   # sizes compared as ints where they are (every reshape)
    if not (new == old if type(new) is int and type(old) is int else sym_eq(prod(shape), self.size) is True):
      raise ValueError(f"cannot reshape {self.shape} to {shape}")
    return self if shape == self.shape else self._view(self.st.reshape(shape), ("reshape", shape))
  def permute(self, order: tuple[int, ...]) -> LazyBuffer:
    return self if order == tuple(range(len(order))) else self._view(self.st.permute(order), ("permute", order))
  def expand(self, shape: tuple[int, ...]) -> LazyBuffer:
    return self if shape == self.shape else self._view(self.st.expand(shape), ("expand", shape))
  def pad(self, padding: tuple[tuple[int, int], ...]) -> LazyBuffer:
    return self if all(p == (0, 0) for p in padding) else self._view(self.st.pad(padding))
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> LazyBuffer:
    if bounds == tuple((0, s) for s in self.shape): return self
    return self._view(self.st.shrink(bounds), ("shrink", bounds))
  def flip(self, axes: tuple[bool, ...]) -> LazyBuffer:
    return self if not any(axes) else self._view(self.st.flip(axes))
  def stride(self, steps: tuple[int, ...]) -> LazyBuffer:
    return self if all(s == 1 for s in steps) else self._view(self.st.stride(steps), ("stride", steps))


# A Buffer keeps weak references to the realized values that hold it (`holders_of`) in its `holders` field, which only
# this module reads or writes: the list goes with its Buffer, at no cost beyond the Buffer's own.
def _hold(buffer: Buffer, lb: LazyBuffer) -> None:
  if (holders := buffer.holders) is None: holders = buffer.holders = []
  elif len(holders) >= READERS_COMPACT_AT and len(holders) & (len(holders) - 1) == 0:   # at powers of two
    holders[:] = [weakref.ref(h) for h in holders_of(buffer)]
  holders.append(weakref.ref(lb))

def holders_of(buffer: Buffer) -> list[LazyBuffer]:
  """The live realized values whose data is in `buffer`."""
  return [h for r in buffer.holders or () if (h := r()) is not None and h.buffer is buffer]

# Dead and realized readers are dropped from a base's list when it reaches this length, and at each doubling after.
READERS_COMPACT_AT = 64

def latest(lb: LazyBuffer) -> LazyBuffer:
  """The value a Tensor holding `lb` names now: `lb`'s successor (an in-place write of a Tensor holding it, followed
  to the newest), or, for a view that aliases its source, the same view of the source's latest value."""
  chain: list[LazyBuffer] = []
  while True:   # up the aliasing views to the first value that was written, or to the top
    while lb.successor is not None: lb = lb.successor
    if lb.origin is None: break
    chain.append(lb)
    lb = lb.origin[0]
  for view in reversed(chain):   # down again, each view made anew over its source's latest value
    parent, method, args = view.origin
    lb = view if lb is parent else getattr(lb, method)(*args)
  return lb

def view_root(lb: LazyBuffer) -> LazyBuffer:
  """The value a chain of aliasing views starts from: a base, or a view that is a value of its own (pad, flip)."""
  while lb.origin is not None and lb.origin[1] != "contiguous": lb = lb.origin[0]
  return lb

def is_writable_view(lb: LazyBuffer) -> bool:
  """Whether writing through the aliasing view `lb` changes each element of its storage once: no element of the
  storage is seen at two positions (an expand not shrunk away) and none is padding."""
  view, broadcast = lb, False
  while view.origin is not None and view.origin[1] != "contiguous":
    parent, method, _ = view.origin
    broadcast |= method == "expand" and view.shape != parent.shape
    view = parent
  if lb.is_base: return True
  if any(v.mask is not None for v in lb.st.views): return False
  if len(lb.st.views) == 1:   # movement ops overlap positions only through a stride of 0 (an expand not shrunk away)
    return all(stride != 0 or size == 1 for stride, size in zip(lb.st.views[0].strides, lb.shape))
  return not broadcast


def walk(roots: Iterable[LazyBuffer], order: str = "pre", *, views: bool = True, realized: bool = True,
         stop: Optional[Callable[[LazyBuffer], bool]] = None, as_built: bool = False) -> Iterator[LazyBuffer]:
  """Every node of the graph above `roots` once, depth-first on an explicit stack (so graphs of any depth are walked):
    order "pre":  each node before the nodes it reads, from the first root and each node's first source on (the
                  order graph keys number nodes in);
    order "post": each node after the nodes it reads; the last root and each node's last source are walked first
                  (the scheduler's order).
  `views`: a view is a node that reads its base; without, only bases are nodes (each root and source is read as its
  base). `realized`: whether realized bases are yielded (nothing above one is walked: it has no sources). `stop`: a
  node for which it is true is neither yielded nor walked through. `as_built`: a base's sources as built
  (LazyBuffer.as_built), not as a rewrite left them."""
  if order == "pre": return _walk_pre(roots, views, realized, stop, as_built)
  if order == "post": return _walk_post(roots, views, realized, stop, as_built)
  raise ValueError(f"walk order {order!r}: use 'pre' or 'post'")

def _walk_pre(roots, views, realized, stop, as_built) -> Iterator[LazyBuffer]:
  seen: set[int] = set()
  stack = [r if views or r._base is None else r._base for r in roots][::-1]
  pop, push, extend = stack.pop, stack.append, stack.extend
  while stack:
    lb = pop()
    if id(lb) in seen: continue
    seen.add(id(lb))
    if stop is not None and stop(lb): continue
    if lb._base is not None:   # a view (only when views): it reads its base
      yield lb
      push(lb._base)
      continue
    if lb.buffer is not None:
      if realized: yield lb
      continue
    yield lb
    srcs = lb._built[1] if as_built and lb._built is not None else lb.srcs
    extend(srcs[::-1] if views else [s if s._base is None else s._base for s in srcs[::-1]])

def _walk_post(roots, views, realized, stop, as_built) -> Iterator[LazyBuffer]:
  seen: set[int] = set()
  stack = [(r if views or r._base is None else r._base, False) for r in roots]
  pop, push, extend = stack.pop, stack.append, stack.extend
  while stack:
    lb, expanded = pop()
    if id(lb) in seen: continue
    if expanded:
      seen.add(id(lb))
      yield lb
      continue
    if stop is not None and stop(lb):
      seen.add(id(lb))
      continue
    if lb._base is not None:   # a view (only when views): after its base
      push((lb, True))
      if id(lb._base) not in seen: push((lb._base, False))
      continue
    if lb.buffer is not None:
      seen.add(id(lb))
      if realized: yield lb
      continue
    push((lb, True))
    srcs = lb._built[1] if as_built and lb._built is not None else lb.srcs
    if not views: srcs = [s if s._base is None else s._base for s in srcs]
    extend([(s, False) for s in srcs if id(s) not in seen])

def unrealized_bases(roots: list[LazyBuffer]) -> list[LazyBuffer]:
  """Every unrealized base reachable from roots (through views), sources before their users (the scheduler's and the
  graph simplifier's order)."""
  return list(walk(roots, "post", views=False, realized=False))


# A big reduce with few outputs runs as two: partial reduces of chunks, then a reduce of the partials. As one kernel,
# each output's reduce is one GPU block or one CPU core (a 64M-element sum would use 1 of 132 SMs); split, the
# partials run in parallel. Thresholds as in tinygrad's split_reduceop: inputs per output ≥ 2^15, and here fewer
# outputs than an H100 holds blocks at once (132 SMs × 8 blocks); parts: the largest of SPLIT_REDUCE_PARTS dividing.
# On a CPU the THREAD opt already spreads outputs over cores, so only reduces with few outputs split: fewer than
# SPLIT_REDUCE_CPU_OUTPUTS_PER_CORE a core, where a core's outputs would be a piece of a cache line when they are
# neighbours in memory (a column sum of an (n, 4) matrix: each thread reads every line for its two columns; split, the
# threads take rows). Measured: (2^22, 4) float32 x.sum(0), 2 shared cores: 58 ms as one kernel (scalar, strided).
# The split is about parallelism only: the accuracy of long float sums is the kernel's (codegen/reduces.py sums
# blocks of ACCUMULATE_BLOCK values and adds the block totals with Kahan compensation), so it needs no extra kernels.
# The reduce of the partials is marked (REDUCE_AXIS arg (op, axes, True)): a float sum of them is compensated too
# (hundreds of large, alike values, the case where a plain running sum rounds at every step).
SPLIT_REDUCE_MIN_INPUTS = 1 << 15
SPLIT_REDUCE_MAX_OUTPUTS = 1024
SPLIT_REDUCE_PARTS = (256, 128, 64, 32, 16, 8)
SPLIT_REDUCE_CPU_OUTPUTS_PER_CORE = 16   # a 64-byte cache line of float32 outputs
# A CPU reduce over the contiguous rows of x (its last axes, x's view contiguous) streams its inputs from one core at
# the cache's speed, so splitting it pays only where half of that time beats the split's own cost (a second kernel and
# graph node, a THREAD launch: ~20 µs). Measured (2-core Zen 4, x.sum() of float32 end to end): 64K / 256K / 512K / 1M
# values 24 / 36 / 48 / 70 µs whole against 44 / 59 / 69 / 82 µs split; 1.5M 94-96 against 94-99; 2M 126-128
# against 105-113; 4M 260-277 against 166-174. Strided (column) reduces keep SPLIT_REDUCE_MIN_INPUTS: split, their
# threads take rows instead of reading every line for a few columns.
SPLIT_REDUCE_CPU_ROW_MIN_INPUTS = 1 << 21

def _split_reduce(x: LazyBuffer, op: Ops, axes: tuple[int, ...], dtype: DType) -> Optional[LazyBuffer]:
  """x.r(op, axes, dtype) as two reduces when it is big and has few outputs (see SPLIT_REDUCE_*), else None; the
  partials have the result's dtype."""
  shape = x.shape
  inputs = 1
  for size in shape:   # plain loops (every eager reduce passes here): a symbolic reduce stays one kernel
    if type(size) is not int: return None
  for a in axes: inputs *= shape[a]
  if inputs < SPLIT_REDUCE_MIN_INPUTS: return None
  has_local = DEVICE_TRAITS[x.device].has_local   # no device start
  max_outputs = SPLIT_REDUCE_MAX_OUTPUTS if has_local else cpu_count() * SPLIT_REDUCE_CPU_OUTPUTS_PER_CORE
  if prod(x.shape) // inputs >= max_outputs: return None
  if not has_local and inputs < SPLIT_REDUCE_CPU_ROW_MIN_INPUTS and x.st.contiguous and \
     tuple(sorted(axes)) == tuple(range(len(x.shape) - len(axes), len(x.shape))): return None   # a contiguous row
  for axis in sorted(axes, key=lambda a: -x.shape[a]):
    parts = next((p for p in SPLIT_REDUCE_PARTS if x.shape[axis] % p == 0), None)
    if parts is not None: break
  else: return _split_with_tail(x, op, axes, dtype)
  split_shape = x.shape[:axis] + (parts, x.shape[axis] // parts) + x.shape[axis + 1:]
  chunk_axes = tuple(a + (a > axis) for a in axes if a != axis) + (axis + 1,)   # everything reduced but the parts
  partials = x.reshape(split_shape)._reduce(op, tuple(sorted(chunk_axes)), dtype=dtype)
  out_shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
  return partials._reduce(op, (axis,), of_partials=True).reshape(out_shape)

# A reduce axis that none of SPLIT_REDUCE_PARTS divides (2^24 + 1 values, 4·1000003) would stay one kernel on one core:
# its first multiple of SPLIT_REDUCE_PARTS[0] values split as above, the rest (fewer than that) reduced on their own,
# and the two results combined by the reduce's op (ADD, MAX, MUL: one more elementwise op, fused into the kernel that
# combines the partials). The head's chunks keep at least SPLIT_TAIL_MIN_CHUNK values each.
SPLIT_TAIL_MIN_CHUNK = 64
TAIL_SPLIT_OPS = (Ops.ADD, Ops.MAX, Ops.MUL)

def _split_with_tail(x: LazyBuffer, op: Ops, axes: tuple[int, ...], dtype: DType) -> Optional[LazyBuffer]:
  """x.r(op, axes) as the reduce of a head whose length along the longest reduce axis divides into
  SPLIT_REDUCE_PARTS[0] parts (split) and of the tail past it, combined by op; None where that doesn't apply."""
  axis = max(axes, key=lambda a: x.shape[a])
  parts, size = SPLIT_REDUCE_PARTS[0], x.shape[axis]
  if op not in TAIL_SPLIT_OPS or dtype != x.dtype or size < parts * SPLIT_TAIL_MIN_CHUNK: return None
  head = size - size % parts
  def piece(start: int, end: int) -> LazyBuffer:
    return x.shrink(tuple((start, end) if a == axis else (0, s) for a, s in enumerate(x.shape)))
  return piece(0, head).r(op, axes).alu(op, piece(head, size).r(op, axes))
