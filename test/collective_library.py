"""A stand-in for a device kind's collectives library (nccl.NCCLCollectives' interface) on LLVM devices, for the
collective-step tests: `HostLibrary` runs the four collectives through host copies and numpy and records each call;
the `host_library` fixture (conftest.py) gives the LLVM backend one, as CUDA's Backend.collectives gives NCCL's."""
import numpy as np

REDUCTIONS = {"sum": np.add, "max": np.maximum, "prod": np.multiply}

class HostLibrary:
  """A stand-in for NCCLCollectives on LLVM devices: its four collectives over allocator handles through host copies,
  recording each call as (kind, op, dtype, count, streams); `capture` makes it `per_device`, as NCCL's is."""
  def __init__(self, devices):
    self.devices, self.calls = devices, []
  def _read(self, handles, dtype, count):
    values = []
    for device, handle in zip(self.devices, handles):
      out = np.empty(count, dtype.np)
      device.allocator.copyout(memoryview(out.view(np.uint8)), handle)
      values.append(out)
    return values
  def _write(self, handles, values):
    for device, handle, value in zip(self.devices, handles, values):
      device.allocator.copyin(handle, memoryview(np.ascontiguousarray(value).view(np.uint8)))
  def all_reduce(self, inputs, op, dtype, count, outputs=None, streams=None):
    self.calls.append(("all_reduce", op, dtype, count, streams))
    total = REDUCTIONS[op].reduce(self._read(inputs, dtype, count))
    self._write(outputs, [total] * len(self.devices))
  def all_gather(self, inputs, outputs, dtype, count, streams=None):
    self.calls.append(("all_gather", None, dtype, count, streams))
    self._write(outputs, [np.concatenate(self._read(inputs, dtype, count))] * len(self.devices))
  def reduce_scatter(self, inputs, outputs, op, dtype, count, streams=None):
    self.calls.append(("reduce_scatter", op, dtype, count, streams))
    total = REDUCTIONS[op].reduce(self._read(inputs, dtype, count * len(self.devices)))
    self._write(outputs, [total[r * count:(r + 1) * count] for r in range(len(self.devices))])
  def broadcast(self, buffers, dtype, count, root=0, streams=None):
    self.calls.append(("broadcast", root, dtype, count, streams))
    value = self._read(buffers, dtype, count)[root]
    self._write(buffers, [value] * len(self.devices))
