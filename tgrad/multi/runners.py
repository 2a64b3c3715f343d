"""The runners of a collective step (a ScheduleItem whose AST is a COLLECTIVE: ops.CollectiveSpec says what it
computes; its outputs, one per device in rank order, then its inputs: one per device, or a broadcast's one source on
its root, whose own output it is), made by realize.lower_schedule:

  LibraryCollective  the device kind's own collectives (Backend.collectives: NCCL on CUDA). A call queues one group
                     over every device, on each device's stream; `cuda_child_graph(device, bufs)` records the group
                     once for these buffers (on every device at once) and gives that device's part, which a CUDA graph
                     runner embeds as one node of the device's graph (so it is `per_device`: jit.py puts it in each
                     device's run of instructions, not between them).
  CopyCollective     any other kind, as copies between devices and fold kernels, every device ending with the bits
                     CopyCollectives (collectives.py) computes:
                       all_reduce      the inputs copied to the first device, one fold kernel there (inputs in rank
                                       order), the result copied to the other devices;
                       all_gather      each input copied into its block of the first output, which is copied to the
                                       others;
                       reduce_scatter  block r of every input copied to device r and folded there in rank order;
                       broadcast       the root's input copied to every output.
Runners take the Buffers at each call (a TinyJit replays them over its own planned buffers), as every runner does.
"""
from __future__ import annotations
import time
from typing import Any, Callable, Optional, Sequence
from tgrad.device import Buffer, Device
from tgrad.ops import CollectiveSpec, Ops

# The name each reduction has in a collective library's interface (nccl.REDUCE_OPS)
LIBRARY_REDUCTIONS = {Ops.ADD: "sum", Ops.MUL: "prod", Ops.MAX: "max"}
# The collectives a library runs (ops.CollectiveSpec's kinds)
LIBRARY_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

def rank_devices(spec: CollectiveSpec, outputs: Sequence[Buffer], inputs: Sequence[Buffer]) -> list[str]:
  """The devices of a collective step in rank order (a broadcast's root holds its input and has no output)."""
  devices = [b.device for b in outputs]
  if spec.kind == "broadcast": devices.insert(spec.root, inputs[0].device)
  return devices

def _output_count(spec: CollectiveSpec, bufs: Sequence[Buffer]) -> int:
  return len(bufs) - 1 if spec.kind == "broadcast" else len(bufs) // 2

def _block(buffer: Buffer, index: int, size: int) -> Buffer:
  """Elements [index·size, (index + 1)·size) of `buffer`, as a view of its memory."""
  return Buffer(buffer.device, size, buffer.dtype, base=buffer, offset=index * size * buffer.dtype.itemsize)

def _elapsed(devices: Sequence[str], start: float) -> float:
  for device in devices: Device[device].synchronize()
  return time.perf_counter() - start

class LibraryCollective:
  """A collective step by a library's collectives object (nccl.NCCLCollectives' interface: all_reduce(inputs, op,
  dtype, count, outputs=, streams=), all_gather(inputs, outputs, dtype, count, streams=), reduce_scatter(inputs,
  outputs, op, dtype, count, streams=), broadcast(buffers, dtype, count, root=, streams=) and, for graphs,
  capture(record))."""
  flops = 0
  def __init__(self, spec: CollectiveSpec, devices: Sequence[str], collectives: Any, nbytes: int):
    if spec.kind not in LIBRARY_KINDS: raise NotImplementedError(f"collective {spec.kind!r}")
    self.spec, self.devices, self.collectives = spec, tuple(devices), collectives
    self.reduction = None if spec.op is None else LIBRARY_REDUCTIONS[spec.op]
    self.name = f"{spec.kind}{'' if self.reduction is None else ' ' + self.reduction} x{len(devices)}"
    self.nbytes = nbytes
    self.per_device = hasattr(collectives, "capture")
    self._recorded: Optional[tuple[tuple, Any]] = None   # (buffer handles, the recording) last made

  def _queue(self, bufs: Sequence[Buffer], streams: Optional[Sequence[int]] = None) -> None:
    count = _output_count(self.spec, bufs)
    outputs, inputs = bufs[:count], bufs[count:]
    kind, dtype, library = self.spec.kind, inputs[0].dtype, self.collectives
    if kind == "all_reduce":
      library.all_reduce([b.handle for b in inputs], self.reduction, dtype, outputs[0].size,
                         outputs=[b.handle for b in outputs], streams=streams)
    elif kind == "all_gather":
      library.all_gather([b.handle for b in inputs], [b.handle for b in outputs], dtype, inputs[0].size,
                         streams=streams)
    elif kind == "reduce_scatter":
      library.reduce_scatter([b.handle for b in inputs], [b.handle for b in outputs], self.reduction, dtype,
                             outputs[0].size, streams=streams)
    else:   # broadcast: in place on the root (its input is its output); the others' send buffers are not read
      handles = [b.handle for b in outputs]
      handles.insert(self.spec.root, inputs[0].handle)
      library.broadcast(handles, dtype, inputs[0].size, root=self.spec.root, streams=streams)

  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    self._queue(bufs)
    return _elapsed(self.devices, start) if wait else None

  def cuda_child_graph(self, device: str, bufs: Sequence[Buffer]) -> Any:
    """`device`'s part of the collective over these buffers, recorded (not run) with every device's part on first
    use: a graph.ChildGraph. The recording keeps its pointers; other buffers record it again."""
    handles = tuple(b.handle for b in bufs)   # held with the recording: their ids stay theirs
    if self._recorded is None or tuple(map(id, self._recorded[0])) != tuple(map(id, handles)):
      self._recorded = (handles, self.collectives.capture(lambda streams: self._queue(bufs, streams)))
    return self._recorded[1].child(self.devices.index(device))

class CopyCollective:
  """A collective step as copies between devices and fold kernels (the module docstring). `folds[r]` is the compiled
  fold on the r-th device that folds (the first only for an all-reduce, every device for a reduce-scatter): it takes
  [output, the values in rank order] permuted by `fold_order`; `scratch[r]` holds the values copied to that device
  (an all-reduce: every input but the first, which is on it already; a reduce-scatter: every input's block)."""
  flops = 0
  def __init__(self, spec: CollectiveSpec, devices: Sequence[str], folds: Sequence[Callable] = (),
               fold_order: Sequence[int] = (), scratch: Sequence[Sequence[Buffer]] = ()):
    self.spec, self.devices = spec, tuple(devices)
    self.folds, self.fold_order, self.scratch = folds, fold_order, scratch
    reduction = "" if spec.op is None else f" {spec.op.name.lower()}"
    self.name = f"{spec.kind}{reduction} x{len(devices)} (copies)"
    self.nbytes = sum(b.nbytes for staged in scratch for b in staged) * 2

  def _fold(self, rank: int, output: Buffer, values: Sequence[Buffer], var_vals: dict[str, int]) -> None:
    roles = [output, *values]
    self.folds[rank]([roles[i] for i in self.fold_order], False, var_vals)

  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    count = _output_count(self.spec, bufs)
    outputs, inputs, kind = bufs[:count], bufs[count:], self.spec.kind
    if kind == "all_reduce":
      for staged, source in zip(self.scratch[0], inputs[1:]): staged.copy_from(source)
      self._fold(0, outputs[0], [inputs[0], *self.scratch[0]], var_vals or {})
    elif kind == "all_gather":
      for rank, source in enumerate(inputs): _block(outputs[0], rank, source.size).copy_from(source)
    elif kind == "reduce_scatter":
      for rank, output in enumerate(outputs):
        for staged, source in zip(self.scratch[rank], inputs): staged.copy_from(_block(source, rank, output.size))
        self._fold(rank, output, self.scratch[rank], var_vals or {})
    if kind in ("all_reduce", "all_gather"):
      for output in outputs[1:]: output.copy_from(outputs[0])
    if kind == "broadcast":
      for output in outputs: output.copy_from(inputs[0])
    return _elapsed(self.devices, start) if wait else None
