"""The runners of a collective step (a ScheduleItem whose AST is a COLLECTIVE: one output and one input Buffer per
device, in rank order), made by realize.lower_schedule:

  LibraryCollective  the device kind's own collectives (Backend.collectives: NCCL on CUDA). A call queues one group
                     over every device, on each device's stream; `cuda_child_graph(device, bufs)` records the group
                     once for these buffers (on every device at once) and gives that device's part, which a CUDA graph
                     runner embeds as one node of the device's graph (so it is `per_device`: jit.py puts it in each
                     device's run of instructions, not between them).
  CopyCollective     any other kind: the inputs copied to the first device, one fold kernel there (inputs in rank
                     order), the result copied to the other devices: every device ends with the same bits.
Runners take the Buffers at each call (a TinyJit replays them over its own planned buffers), as every runner does.
"""
from __future__ import annotations
import time
from typing import Any, Callable, Optional, Sequence
from tgrad.device import Buffer, Device
from tgrad.ops import CollectiveSpec, Ops

# The name each reduction has in a collective library's interface (nccl.REDUCE_OPS)
LIBRARY_REDUCTIONS = {Ops.ADD: "sum", Ops.MUL: "prod", Ops.MAX: "max"}

def _split(bufs: Sequence[Buffer]) -> tuple[Sequence[Buffer], Sequence[Buffer]]:
  ranks = len(bufs) // 2
  return bufs[:ranks], bufs[ranks:]

def _elapsed(devices: Sequence[str], start: float) -> float:
  for device in devices: Device[device].synchronize()
  return time.perf_counter() - start

class LibraryCollective:
  """An all-reduce by a library's collectives object (nccl.NCCLCollectives' interface: all_reduce(inputs, op, dtype,
  count, outputs=, streams=) and, for graphs, capture(record))."""
  flops = 0
  def __init__(self, spec: CollectiveSpec, devices: Sequence[str], collectives: Any, nbytes: int):
    if spec.kind != "all_reduce": raise NotImplementedError(f"collective {spec.kind!r}")
    self.spec, self.devices, self.collectives = spec, tuple(devices), collectives
    self.reduction = LIBRARY_REDUCTIONS[spec.op]
    self.name = f"all_reduce {self.reduction} x{len(devices)}"
    self.nbytes = nbytes * len(devices)
    self.per_device = hasattr(collectives, "capture")
    self._recorded: Optional[tuple[tuple, Any]] = None   # (buffer handles, the recording) last made

  def _queue(self, bufs: Sequence[Buffer], streams: Optional[Sequence[int]] = None) -> None:
    outputs, inputs = _split(bufs)
    self.collectives.all_reduce([b.handle for b in inputs], self.reduction, outputs[0].dtype, outputs[0].size,
                                outputs=[b.handle for b in outputs], streams=streams)

  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    self._queue(bufs)
    return _elapsed(self.devices, start) if wait else None

  def cuda_child_graph(self, device: str, bufs: Sequence[Buffer]) -> Any:
    """`device`'s part of the all-reduce over these buffers, recorded (not run) with every device's part on first
    use: a graph.ChildGraph. The recording keeps its pointers; other buffers record it again."""
    handles = tuple(b.handle for b in bufs)   # held with the recording: their ids stay theirs
    if self._recorded is None or tuple(map(id, self._recorded[0])) != tuple(map(id, handles)):
      self._recorded = (handles, self.collectives.capture(lambda streams: self._queue(bufs, streams)))
    return self._recorded[1].child(self.devices.index(device))

class CopyCollective:
  """An all-reduce as copies and a kernel: inputs 1.. copied into scratch Buffers on the first device, `fold`
  (a compiled kernel taking [output 0, input 0, scratch 1, ...] in the order `fold_order` gives) writes output 0, and
  output 0 is copied to the other outputs."""
  flops = 0
  def __init__(self, spec: CollectiveSpec, devices: Sequence[str], fold: Callable, fold_order: Sequence[int],
               scratch: Sequence[Buffer]):
    self.spec, self.devices, self.fold, self.fold_order, self.scratch = spec, tuple(devices), fold, fold_order, scratch
    self.name = f"all_reduce {spec.op.name.lower()} x{len(devices)} (copies)"
    self.nbytes = sum(b.nbytes for b in scratch) * 2

  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    outputs, inputs = _split(bufs)
    for staged, source in zip(self.scratch, inputs[1:]): staged.copy_from(source)
    roles = [outputs[0], inputs[0], *self.scratch]
    self.fold([roles[i] for i in self.fold_order], False, var_vals or {})
    for output in outputs[1:]: output.copy_from(outputs[0])
    return _elapsed(self.devices, start) if wait else None
