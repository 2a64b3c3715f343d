"""Int64 values a kernel reads from device memory instead of taking them as arguments: a kernel node of a replayed
CUDA graph then keeps its arguments while the values change.

A decode step's flash-decoding launches take the step's key count and cache slot; as kernel arguments, every replay
set them in every such node (`cuGraphExecKernelNodeSetParams`: 19 nodes and ~180 µs of an H200 host's ~235 µs a
step for gemma-3-270m, docs/benchmarks.md "twentieth session"). `DeviceValues` holds a runner's values in device
memory instead; `stage(values)` writes the ones that changed on the legacy default stream, where every kernel, copy
and graph of the device runs, so a launch queued after it reads the new values and one queued before it the old.
A write is a stream memory operation (cuStreamWriteValue64: the value travels in the call, nothing is read from host
memory later), or, on a device without 64-bit stream memory operations, a copy of the values from host memory
(cuMemcpyHtoDAsync from pageable memory: the driver takes the bytes before the call returns).
Only `stage` writes the memory: what it last wrote is what the device holds once the queued work has run.
"""
from __future__ import annotations
import ctypes
from typing import Any, Optional, Sequence
from tgrad.runtime.cuda.driver import DEFAULT_STREAM, check, driver

VALUE_BYTES = 8
WRITE_VALUE_DEFAULT = 0   # CU_STREAM_WRITE_VALUE_DEFAULT: the write is ordered after the stream's earlier work

class DeviceValues:
  """`count` int64 values in device memory (`address`), written by `stage`."""
  def __init__(self, count: int, allocator: Any):
    self.count = count
    self.memory = allocator.alloc(max(1, count) * VALUE_BYTES)   # kept: freed with this object
    self.address = int(self.memory)
    self.written: list[Optional[int]] = [None] * count
    self.host = (ctypes.c_int64 * max(1, count))()
    lib = driver()
    self._write_value = getattr(lib, "cuStreamWriteValue64_v2", None)   # typed by driver(), where the driver has it
    self._copy = lib.cuMemcpyHtoDAsync_v2
  def stage(self, values: Sequence[int]) -> None:
    """Queue the writes that make the device memory hold `values` (in order) for launches queued after this call."""
    if len(values) != self.count: raise ValueError(f"{self.count} device values, given {len(values)}")
    changed = [i for i in range(self.count) if self.written[i] != values[i]]
    if not changed: return
    if self._write_value is not None:
      for i in changed:
        result = self._write_value(DEFAULT_STREAM, self.address + VALUE_BYTES * i, values[i] & ((1 << 64) - 1),
                                   WRITE_VALUE_DEFAULT)
        if result != 0:   # no 64-bit stream memory operations on this device: copies from now on
          self._write_value = None
          return self.stage(values)
        self.written[i] = values[i]
      return
    for i in range(self.count): self.host[i] = values[i]
    check(self._copy(self.address, ctypes.addressof(self.host), self.count * VALUE_BYTES, DEFAULT_STREAM),
          "cuMemcpyHtoDAsync_v2 (device values)")
    self.written = list(values)
