"""A lazy value over several devices: one LazyBuffer per device, and the axis it is split along (None: replicated).

`MultiLazyBuffer(shards, axis)` is what a sharded Tensor holds as its `lazydata`. It answers the LazyBuffer methods
the front end uses (alu, cast, r, the movement ops, const, contiguous, copy_to_device, assign), each by the sharding
rules below, so Tensor methods and autograd work on it unchanged. `shape` is the logical shape (the shards joined
along `axis`); `device` is the tuple of device names. The shards split `axis` evenly: shard i holds the i-th of n
equal slices (`Tensor.shard` raises ValueError for an axis that does not divide).

The rules (docs/multi_device.md):
  elementwise   operands on one device set; per shard when every sharded operand is split along one axis; a
                replicated operand beside a sharded one is sliced to each device's part (a view, no copy); operands
                split along two different axes: the later ones are gathered (all-gather) and sliced.
  reduce        over axes that leave the split axis alone: per shard. Over the split axis: each shard reduces its
                part, then an all-reduce (sum, max, product) combines the partials; the result is replicated, the
                same bits on every device. A reduce that partials can't finish (LOGADDEXP) gathers first.
                Tensor.argmax over the split axis is this rule twice (the maxima, then the first index holding one,
                each device's index offset by its part's start): two all-reduces, nothing gathered.
  movement      permute moves the axis; expand and a pad/shrink/flip/stride that leave the split axis whole are per
                shard; a reshape keeps the split where the axis stays whole (its leading elements unchanged);
                anything else on the split axis (a reshape that merges it with the axes before it, a pad, a shrink,
                a flip, a stride of it) gathers to a replicated value first: correct, and it costs an all-gather.
  matmul        is a broadcast multiply and a sum (tensor_ops/composite.py), so a contraction over the split axis is
                a per-shard partial product and an all-reduce, and a split batch or output axis stays split.
  gather        (indexing by a tensor) per device: from a replicated table split as the index is, from a table split
                along another axis split alike; along the split axis it raises.
  copy_to_device(one device) gathers to that device; copy_to_device(a device tuple) reshards.
  resharding    (to_axis) a split value to another axis or replicated: an all-gather, then a slice (a view); a
                replicated value that is an all-reduce not yet run, to an axis: a reduce-scatter of its partials.
  shard         of a one-device value, replicated: a broadcast from its device when that is one of the set (it keeps
                its buffer there), else a copy to each; split: a copy of each slice.
"""
from __future__ import annotations
from typing import Any, Optional, Sequence
from tgrad.dtype import DType
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.helpers import prod
from tgrad.multi.collectives import COMBINING_OPS, collectives_for, concatenate, slice_along

def _local(shape: tuple, axis: Optional[int], parts: int) -> tuple:
  return shape if axis is None else tuple(s // parts if i == axis else s for i, s in enumerate(shape))

def check_split(shape: tuple, axis: Optional[int], devices: Sequence[str]) -> Optional[int]:
  """The axis (resolved from negative) that `shape` can be split along over `devices`, or None for replicated;
  IndexError for an axis out of range, ValueError for one that does not divide or for repeated devices."""
  if len(set(devices)) != len(devices): raise ValueError(f"shard: devices repeat: {tuple(devices)}")
  if not devices: raise ValueError("shard: no devices")
  if axis is None: return None
  if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
    raise IndexError(f"shard: axis {axis} is out of range for shape {shape}")
  axis = axis % len(shape)
  if not isinstance(shape[axis], int) or shape[axis] % len(devices):
    raise ValueError(f"shard: axis {axis} of shape {shape} (size {shape[axis]}) does not divide evenly over "
                     f"{len(devices)} devices {tuple(devices)}")
  return axis

class MultiLazyBuffer:
  """One LazyBuffer per device (`shards`, in device order) and the axis they split (None: each holds the whole)."""
  successor: Optional[MultiLazyBuffer] = None   # as LazyBuffer's: the value an in-place write gave this one's tensor
  origin = None                                 # a sharded value never aliases another (lazy.latest reads this)
  is_base = True                                # a value of its own (Tensor.contiguous reads this)
  def __init__(self, shards: Sequence[LazyBuffer], axis: Optional[int]):
    shards = tuple(shards)
    if len({s.shape for s in shards}) != 1 or len({s.dtype for s in shards}) != 1:
      raise ValueError(f"shards differ: {[(s.shape, s.dtype) for s in shards]}")
    if len({s.device for s in shards}) != len(shards): raise ValueError(f"shards share a device: {shards}")
    self.shards, self.axis = shards, axis
    local = shards[0].shape
    self.shape = local if axis is None else tuple(s * len(shards) if i == axis else s for i, s in enumerate(local))
  @property
  def device(self) -> tuple[str, ...]: return tuple(s.device for s in self.shards)
  @property
  def dtype(self) -> DType: return self.shards[0].dtype
  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def realized(self) -> bool: return all(s.realized is not None for s in self.shards)
  def __repr__(self): return f"<MLB axis={self.axis} {self.shape} {self.dtype} on {self.device}>"
  def _with(self, shards: Sequence[LazyBuffer], axis: Optional[int] = -1) -> MultiLazyBuffer:
    return MultiLazyBuffer(shards, self.axis if axis == -1 else axis)
  def _collectives(self): return collectives_for(self.device)

  # ---- making and moving
  @staticmethod
  def shard(value: LazyBuffer, devices: Sequence[str], axis: Optional[int]) -> MultiLazyBuffer:
    """`value` (on one device) split along `axis` over `devices` (each device gets a copy of its slice), or copied
    whole to each when axis is None. The axis is checked (check_split)."""
    axis = check_split(value.shape, axis, devices)
    if axis is None: return MultiLazyBuffer(collectives_for(devices).broadcast(value, devices), None)
    return MultiLazyBuffer([slice_along(value, axis, i, len(devices)).copy_to_device(d)
                            for i, d in enumerate(devices)], axis)
  def to_axis(self, axis: Optional[int]) -> MultiLazyBuffer:
    """The same value split along `axis` (None: replicated): a replicated value is sliced on each device (a view),
    but one that is an all-reduce not yet run is a reduce-scatter of its partials instead (each device folds only
    its part); a split one is all-gathered first."""
    if axis == self.axis: return self
    if self.axis is None and axis is not None and (reduced := self._all_reduce_partials()) is not None:
      check_split(self.shape, axis, self.device)
      return self._with(self._collectives().reduce_scatter(reduced[0], reduced[1], axis), axis)
    full = self if self.axis is None else self._with(self._collectives().all_gather(self.shards, self.axis), None)
    if axis is None: return full
    check_split(self.shape, axis, self.device)
    return self._with([slice_along(s, axis, i, len(self.shards)) for i, s in enumerate(full.shards)], axis)
  def gathered(self) -> MultiLazyBuffer: return self.to_axis(None)
  def _all_reduce_partials(self) -> Optional[tuple[Ops, list[LazyBuffer]]]:
    """(op, partials in this value's shape) when each shard is, as a plain reshape, its rank's output of one
    unrealized all-reduce step (collectives.all_reduce_nodes); else None."""
    nodes = [s.base for s in self.shards]
    if any(node.op is not Ops.COLLECTIVE or node.buffer is not None for node in nodes): return None
    first = nodes[0]
    if first.arg.spec.kind != "all_reduce" or len(first.srcs) != len(nodes): return None
    for rank, (shard, node) in enumerate(zip(self.shards, nodes)):
      if node.arg.group is not first.arg.group or node.arg.rank != rank or not shard.st.contiguous or \
         shard.size != node.size: return None
    return first.arg.spec.op, [source.reshape(self.shards[0].shape) for source in first.srcs]
  def copy_to_device(self, device: Any) -> Any:
    """To one device: the whole value there (a LazyBuffer); to a tuple of devices: the same value on those devices,
    split along the same axis (ValueError if their count differs from this one's when split)."""
    if isinstance(device, (tuple, list)):
      devices = tuple(device)
      if devices == self.device: return self
      if self.axis is not None and len(devices) != len(self.shards):
        return MultiLazyBuffer.shard(self.copy_to_device(devices[0]), devices, self.axis)
      source = self.shards if self.axis is not None else [self.shards[0]] * len(devices)
      return MultiLazyBuffer([s.copy_to_device(d) for s, d in zip(source, devices)], self.axis)
    if self.axis is None:
      here = [s for s in self.shards if s.device == device]
      return (here[0] if here else self.shards[0]).copy_to_device(device)
    return concatenate([s.copy_to_device(device) for s in self.shards], self.axis)

  # ---- compute
  def binary(self, op: Ops, other: MultiLazyBuffer) -> MultiLazyBuffer:
    """`alu(op, other)` (LazyBuffer.binary's counterpart: the hot binary Functions build through it)."""
    return self.alu(op, other)
  def alu(self, op: Ops, *others: MultiLazyBuffer, arg: Any = None) -> MultiLazyBuffer:
    operands = (self, *others)
    for other in others:
      if not isinstance(other, MultiLazyBuffer) or other.device != self.device:
        where = other.device if hasattr(other, "device") else type(other).__name__
        raise ValueError(f"{op.name}: operands on different device sets: {self.device} and {where}")
    axis = next((o.axis for o in operands if o.axis is not None), None)
    aligned = [o.to_axis(axis) for o in operands]
    return self._with([first.alu(op, *rest, arg=arg) for first, *rest in zip(*[a.shards for a in aligned])], axis)
  def cast(self, dtype: DType, bitcast: bool = False) -> MultiLazyBuffer:
    return self._with([s.cast(dtype, bitcast) for s in self.shards])
  def r(self, op: Ops, axes: tuple[int, ...], dtype: Optional[DType] = None) -> MultiLazyBuffer:
    if self.axis is None or self.axis not in axes: return self._with([s.r(op, axes, dtype) for s in self.shards])
    if op not in COMBINING_OPS: return self.gathered().r(op, axes, dtype)
    partials = [s.r(op, axes, dtype) for s in self.shards]
    return self._with(self._collectives().all_reduce(op, partials), None)
  def contiguous(self, alias: bool = True) -> MultiLazyBuffer: return self._with([s.contiguous() for s in self.shards])
  def const(self, value, shape: Optional[tuple] = None) -> MultiLazyBuffer:
    """A constant of this value's shape (split as it is) or of another `shape` (replicated)."""
    if shape is None or shape == self.shape: return self._with([s.const(value) for s in self.shards])
    return self._with([s.const(value, shape) for s in self.shards], None)
  def const_with(self, value, dtype: DType, shape: tuple, weak: bool = False) -> MultiLazyBuffer:
    """A constant of `dtype` and `shape` on these devices: split as this value is when `shape` is its shape."""
    axis = self.axis if shape == self.shape else None
    local = _local(shape, axis, len(self.shards))
    return self._with([LazyBuffer.const_of(value, dtype, s.device, local, weak) for s in self.shards], axis)
  def is_unrealized_const(self) -> bool: return all(s.is_unrealized_const() for s in self.shards)
  def const_value(self): return self.shards[0].const_value()
  def assign(self, value: MultiLazyBuffer) -> MultiLazyBuffer:
    """Each shard's buffer written with its part of `value` (resplit to this value's axis first)."""
    value = value.to_axis(self.axis)
    return self._with([s.assign(v) for s, v in zip(self.shards, value.shards)])
  def gather(self, index: Any, axis: int) -> Any:
    """A data-dependent load along `axis` (LazyBuffer.gather), per device: from a replicated table (an embedding held
    on every device) with each device's part of the index, split as the index is; from a table split along another
    axis with the index split alike. A table split along the gathered axis raises (an index may point anywhere)."""
    if self.axis == axis:
      raise NotImplementedError(f"indexing a sharded tensor {self} by a tensor along its split axis {axis} is not "
                                "supported: gather it to one device first (.to(device))")
    if not isinstance(index, MultiLazyBuffer) or index.device != self.device:
      raise ValueError(f"gather: table on {self.device}, index on {getattr(index, 'device', None)}")
    if self.axis is not None:   # the index has the table's shape but along `axis`: it splits as the table does
      index = index.to_axis(self.axis)
      return self._with([t.gather(i, axis) for t, i in zip(self.shards, index.shards)])
    # an index split along another axis than the gathered one reads the matching slice of the table
    tables = self if index.axis is None or index.axis == axis else self.to_axis(index.axis)
    return self._with([t.gather(i, axis) for t, i in zip(tables.shards, index.shards)], index.axis)

  # ---- movement
  def _whole_axis(self, changes: Sequence[Any], unchanged: Any) -> bool:
    return self.axis is None or changes[self.axis] == unchanged
  def reshape(self, shape: tuple[int, ...]) -> MultiLazyBuffer:
    if shape == self.shape: return self
    if self.axis is None: return self._with([s.reshape(shape) for s in self.shards])
    parts, leading = len(self.shards), prod(self.shape[:self.axis])
    for new_axis in range(len(shape)):
      if prod(shape[:new_axis]) == leading and shape[new_axis] % parts == 0 and \
         prod(shape[new_axis:]) == prod(self.shape[self.axis:]) and shape[new_axis] >= parts:
        return self._with([s.reshape(_local(shape, new_axis, parts)) for s in self.shards], new_axis)
    return self.gathered().reshape(shape)
  def permute(self, order: tuple[int, ...]) -> MultiLazyBuffer:
    axis = None if self.axis is None else order.index(self.axis)
    return self._with([s.permute(order) for s in self.shards], axis)
  def expand(self, shape: tuple[int, ...]) -> MultiLazyBuffer:
    return self._with([s.expand(_local(shape, self.axis, len(self.shards))) for s in self.shards])
  def pad(self, padding: tuple[tuple[int, int], ...]) -> MultiLazyBuffer:
    if not self._whole_axis(padding, (0, 0)): return self.gathered().pad(padding)
    return self._with([s.pad(padding) for s in self.shards])
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> MultiLazyBuffer:
    if self.axis is not None and bounds[self.axis] != (0, self.shape[self.axis]): return self.gathered().shrink(bounds)
    local = bounds if self.axis is None else \
      tuple((0, self.shards[0].shape[i]) if i == self.axis else b for i, b in enumerate(bounds))
    return self._with([s.shrink(local) for s in self.shards])
  def flip(self, axes: tuple[bool, ...]) -> MultiLazyBuffer:
    if not self._whole_axis(axes, False): return self.gathered().flip(axes)
    return self._with([s.flip(axes) for s in self.shards])
  def stride(self, steps: tuple[int, ...]) -> MultiLazyBuffer:
    if not self._whole_axis(steps, 1): return self.gathered().stride(steps)
    return self._with([s.stride(steps) for s in self.shards])
