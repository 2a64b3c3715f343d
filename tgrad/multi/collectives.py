"""Collectives over a device set: all-reduce, all-gather, reduce-scatter and broadcast of per-device lazy values.

Every function takes one LazyBuffer per device (the shards, in device order) and returns one per device, as lazy
values: nothing runs until they are realized, and what runs is scheduled like any other graph (so a TinyJit captures
it). Two implementations:

`StepCollectives` (every device set of one kind) makes each collective one COLLECTIVE node per output device (ops.py:
CollectiveSpec lists the kinds): the scheduler turns the siblings into one step over every device's buffers, and
lowering (realize.py) runs it with the kind's own collectives (Backend.collectives: NCCL on CUDA, one group call on
each GPU's stream, captured into each GPU's CUDA graph by a TinyJit) or, for a kind without them, as copies between
devices and fold kernels (tgrad/multi/runners.py), bit for bit what CopyCollectives computes. A step reads and writes
whole buffers end to end, so an all-gather or reduce-scatter along an axis that is not outermost in memory moves that
axis to the front first (a permute and a contiguous kernel per shard) and the result is a permuted view back; a
broadcast's root keeps its own buffer (NCCL broadcasts in place there). Bools that must be folded, constants and empty
values take CopyCollectives' way.

`CopyCollectives` (a set mixing kinds) builds every collective as lazy copies between devices (Allocator.peer_copy: a
memcpy between CPU devices) and tgrad kernels on one device.

CopyCollectives' rules, chosen so every device ends with the same bits:
  all_reduce(op, shards)            shards copied to the first device and folded there in device order (one kernel),
                                    then that one result copied to every other device;
  all_gather(shards, axis)          the shards concatenated along `axis` on the first device (bit-exact: each piece is
                                    padded with zeros and the pieces are OR-ed as unsigned integers), then copied;
  reduce_scatter(op, shards, axis)  piece i of the reduced value (the i-th equal slice along `axis`) folded on device i
                                    from that slice of every shard, in device order;
  broadcast(value, devices)         a copy of `value` on each device.
The traffic of all_reduce is 2·(n−1) shard copies through the first device, not a ring: on CPU devices a copy is a
memcpy and the fold is one kernel over n inputs.
"""
from __future__ import annotations
import weakref
from typing import Optional, Protocol, Sequence
from tgrad.backend import device_kind
from tgrad.dtype import DType, dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import CollectiveArg, CollectiveGroup, CollectiveSpec, Ops

# The elementwise op that combines two partial results of each reduce an all-reduce can finish.
COMBINING_OPS = (Ops.ADD, Ops.MAX, Ops.MUL)
# The unsigned integer of each item size: how all_gather moves any dtype's bits exactly
_BITS = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}

class Collectives(Protocol):
  """What a kind of device provides for sharded tensors (tgrad/multi/multilazy.py); the shards are in device order."""
  def all_reduce(self, op: Ops, shards: Sequence[LazyBuffer]) -> list[LazyBuffer]: ...
  def all_gather(self, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]: ...
  def reduce_scatter(self, op: Ops, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]: ...
  def broadcast(self, value: LazyBuffer, devices: Sequence[str]) -> list[LazyBuffer]: ...

def _check_op(op: Ops) -> None:
  if op not in COMBINING_OPS:
    raise ValueError(f"a collective reduces with one of {[o.name for o in COMBINING_OPS]}, not {op.name}")

def fold(op: Ops, values: Sequence[LazyBuffer]) -> LazyBuffer:
  """values[0] op values[1] op ... in that order (bools combine with OR/AND, as Tensor's + and * of bools)."""
  if values[0].dtype.is_bool: op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND, Ops.MAX: Ops.OR}[op]
  total = values[0]
  for value in values[1:]: total = total.alu(op, value)
  return total

def concatenate(pieces: Sequence[LazyBuffer], axis: int) -> LazyBuffer:
  """The pieces (one device, equal shapes but along `axis`) joined along `axis`, bit for bit (a -0.0 or a NaN's
  payload survives): each piece's bits are padded with zeros to the whole and OR-ed together."""
  if len(pieces) == 1: return pieces[0]
  dtype: DType = pieces[0].dtype
  bits = dtypes.bool if dtype.is_bool else _BITS[dtype.itemsize]
  total_length = sum(p.shape[axis] for p in pieces)
  placed, offset = [], 0
  for piece in pieces:
    padding = tuple((offset, total_length - offset - piece.shape[axis]) if i == axis else (0, 0)
                    for i in range(len(piece.shape)))
    placed.append(piece.cast(bits, bitcast=bits != dtype and not dtype.is_bool).pad(padding))
    offset += piece.shape[axis]
  joined = placed[0]
  for p in placed[1:]: joined = joined.alu(Ops.OR, p)
  return joined if dtype.is_bool else joined.cast(dtype, bitcast=True)

def slice_along(value: LazyBuffer, axis: int, index: int, parts: int) -> LazyBuffer:
  """The `index`-th of `parts` equal slices of `value` along `axis` (a view: no copy)."""
  length = value.shape[axis] // parts
  return value.shrink(tuple((index * length, (index + 1) * length) if i == axis else (0, s)
                            for i, s in enumerate(value.shape)))

class CopyCollectives:
  """Collectives as copies between devices and tgrad kernels on one (the rules in the module docstring)."""
  def all_reduce(self, op: Ops, shards: Sequence[LazyBuffer]) -> list[LazyBuffer]:
    _check_op(op)
    root = shards[0].device
    total = fold(op, [s.copy_to_device(root) for s in shards]).contiguous()
    return self.broadcast(total, [s.device for s in shards])
  def all_gather(self, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]:
    root = shards[0].device
    joined = concatenate([s.copy_to_device(root) for s in shards], axis).contiguous()
    return self.broadcast(joined, [s.device for s in shards])
  def reduce_scatter(self, op: Ops, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]:
    _check_op(op)
    parts = len(shards)
    if shards[0].shape[axis] % parts:
      raise ValueError(f"reduce_scatter of shape {shards[0].shape} along axis {axis} over {parts} devices: "
                       f"{shards[0].shape[axis]} does not divide by {parts}")
    return [fold(op, [slice_along(s, axis, i, parts).copy_to_device(target.device) for s in shards]).contiguous()
            for i, target in enumerate(shards)]
  def broadcast(self, value: LazyBuffer, devices: Sequence[str]) -> list[LazyBuffer]:
    return [value.copy_to_device(device) for device in devices]

COPY_COLLECTIVES = CopyCollectives()

def _whole(value: LazyBuffer) -> LazyBuffer:
  """A base holding `value` row-major in a buffer of its own size (a collective reads and writes whole buffers)."""
  if value.st.contiguous and value.size == value.base.size and value.base.op is not Ops.CONST: return value.base
  return value.contiguous()

def collective_nodes(spec: CollectiveSpec, sources: Sequence[LazyBuffer], shape: tuple[int, ...],
                     devices: Sequence[str]) -> list[LazyBuffer]:
  """One COLLECTIVE node of `shape` per device of `devices` (the step's outputs, in order), each reading every source
  (whole buffers, in rank order) and sharing one CollectiveGroup (ops.py, schedule.py rule 4)."""
  group = CollectiveGroup(devices)
  nodes = [LazyBuffer.loadop(Ops.COLLECTIVE, shape, sources[0].dtype, device, arg=CollectiveArg(spec, rank, group),
                             srcs=tuple(sources)) for rank, device in enumerate(devices)]
  group.members = [weakref.ref(node) for node in nodes]
  return nodes

def all_reduce_nodes(op: Ops, shards: Sequence[LazyBuffer]) -> list[LazyBuffer]:
  """One COLLECTIVE node per shard's device: each is `op` over every shard, in device order (ops.py, schedule.py
  rule 4). Its value has each shard's shape, as a base (reshape it back to a view's shape)."""
  _check_op(op)
  sources = [_whole(s) for s in shards]
  return collective_nodes(CollectiveSpec("all_reduce", op), sources, sources[0].shape, [s.device for s in shards])

def _inverse(order: tuple[int, ...]) -> tuple[int, ...]: return tuple(order.index(i) for i in range(len(order)))

def _axis_in_front(shards: Sequence[LazyBuffer], axis: int
                   ) -> tuple[list[LazyBuffer], tuple[int, ...], int, Optional[tuple[int, ...]]]:
  """The shards as whole buffers whose equal blocks end to end are their slices along `axis`: (sources, their logical
  shape, where `axis` is in it, the permutation that put it there or None). Where every axis before `axis` has size 1
  the buffers already are; else `axis` is moved to the front (a permute, then a contiguous kernel per shard)."""
  shape = shards[0].shape
  if all(size == 1 for size in shape[:axis]): return [_whole(s) for s in shards], shape, axis, None
  order = (axis, *[i for i in range(len(shape)) if i != axis])
  moved = [s.permute(order) for s in shards]
  return [_whole(m) for m in moved], moved[0].shape, 0, order

def _resized(shape: tuple[int, ...], axis: int, length: int) -> tuple[int, ...]:
  return tuple(length if i == axis else size for i, size in enumerate(shape))

def _by_copies(values: Sequence[LazyBuffer]) -> bool:
  """Whether a collective of these values takes CopyCollectives' way: constants (the graph simplifier folds a copy of
  one) and empty values."""
  return any(v.is_unrealized_const() for v in values) or values[0].size == 0

class StepCollectives(CopyCollectives):
  """Each collective one step over the devices' buffers (the module docstring)."""
  def all_reduce(self, op: Ops, shards: Sequence[LazyBuffer]) -> list[LazyBuffer]:
    _check_op(op)
    # bools fold with OR/AND, which no collective library reduces with
    if shards[0].dtype.is_bool or _by_copies(shards): return super().all_reduce(op, shards)
    return [node.reshape(s.shape) for node, s in zip(all_reduce_nodes(op, shards), shards)]

  def all_gather(self, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]:
    if _by_copies(shards): return super().all_gather(shards, axis)
    sources, shape, along, order = _axis_in_front(shards, axis)
    whole = _resized(shape, along, shape[along] * len(shards))
    nodes = collective_nodes(CollectiveSpec("all_gather"), sources, whole, [s.device for s in shards])
    return nodes if order is None else [node.permute(_inverse(order)) for node in nodes]

  def reduce_scatter(self, op: Ops, shards: Sequence[LazyBuffer], axis: int) -> list[LazyBuffer]:
    _check_op(op)
    if shards[0].dtype.is_bool or _by_copies(shards) or shards[0].shape[axis] % len(shards):
      return super().reduce_scatter(op, shards, axis)   # (which names a length that does not divide)
    sources, shape, along, order = _axis_in_front(shards, axis)
    part = _resized(shape, along, shape[along] // len(shards))
    nodes = collective_nodes(CollectiveSpec("reduce_scatter", op), sources, part, [s.device for s in shards])
    return nodes if order is None else [node.permute(_inverse(order)) for node in nodes]

  def broadcast(self, value: LazyBuffer, devices: Sequence[str]) -> list[LazyBuffer]:
    """The root (value's device) keeps `value`; every other device gets one node of the broadcast step. A value on a
    device outside the set is copied to each (a collective's root is one of its devices)."""
    if value.device not in devices or _by_copies([value]) or len(devices) == 1:
      return super().broadcast(value, devices)
    root = list(devices).index(value.device)
    others = [d for d in devices if d != value.device]
    source = _whole(value)
    nodes = iter(collective_nodes(CollectiveSpec("broadcast", root=root), [source], source.shape, others))
    return [value if d == value.device else next(nodes).reshape(value.shape) for d in devices]

STEP_COLLECTIVES = StepCollectives()

def collectives_for(devices: Sequence[str]) -> Collectives:
  """The collectives of a device set: StepCollectives when every device is of one kind, else CopyCollectives."""
  return STEP_COLLECTIVES if len({device_kind(d) for d in devices}) == 1 else COPY_COLLECTIVES
