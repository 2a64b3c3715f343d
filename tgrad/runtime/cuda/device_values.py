"""Int64 values that kernels read from device memory instead of taking them as arguments: a kernel node of a replayed
CUDA graph then keeps its arguments while the values change.

A decode step's flash-decoding launches take the step's key count and cache slot; as kernel arguments, every replay
set them in every such node (`cuGraphExecKernelNodeSetParams`: 18 of the 19 node updates of a gemma-3-270m step, most
of an H200 host's ~235 µs of replay work a step, docs/benchmarks.md "twentieth session"). A device's `ValueTable`
holds such values in device memory instead, one slot per variable name (every kernel that reads a name reads its
slot). `stage` writes the values that changed on the legacy default stream, where every kernel, copy and graph of the
device runs, so a launch queued after it reads the new values and one queued before it the old: all of a call's
writes are one batch of stream memory operations (cuStreamBatchMemOp: the values travel in the call, nothing is read
from host memory later); on a device without 64-bit stream memory operations, one copy of the table from host
memory (cuMemcpyHtoDAsync from pageable memory: the driver takes the bytes before the call returns).
Only `stage` writes the table: what it last wrote is what the device holds once the queued work has run.
"""
from __future__ import annotations
import ctypes
from typing import Any, Sequence
from tgrad.runtime.cuda.driver import DEFAULT_STREAM, check, driver

VALUE_BYTES = 8
TABLE_SLOTS = 64   # variable names a device's table holds (a model's decode step names three)
STREAM_MEM_OP_WRITE_VALUE_64 = 5   # CUstreamBatchMemOpType CU_STREAM_MEM_OP_WRITE_VALUE_64
WRITE_VALUE_DEFAULT = 0            # CU_STREAM_WRITE_VALUE_DEFAULT: ordered after the stream's earlier work

class WriteValueOp(ctypes.Structure):
  """CUstreamBatchMemOpParams (cuda.h), its writeValue member: the operation, the address, the 64-bit value, flags
  and a field for the driver, in the union's 48 bytes."""
  _fields_ = [("operation", ctypes.c_uint), ("pad0", ctypes.c_uint), ("address", ctypes.c_uint64),
              ("value", ctypes.c_uint64), ("flags", ctypes.c_uint), ("pad1", ctypes.c_uint),
              ("alias", ctypes.c_uint64), ("pad2", ctypes.c_uint64)]

class ValueTable:
  """A device's TABLE_SLOTS int64 values in device memory (`address`), a slot per variable name, written by `stage`."""
  def __init__(self, allocator: Any):
    self.memory = allocator.alloc(TABLE_SLOTS * VALUE_BYTES)   # kept: freed with the table
    self.address = int(self.memory)
    self.slots: dict[str, int] = {}
    self.written: list[int | None] = [None] * TABLE_SLOTS
    self.host = (ctypes.c_int64 * TABLE_SLOTS)()
    lib = driver()
    self._batch = getattr(lib, "cuStreamBatchMemOp_v2", None)   # typed by driver(), where the driver has it
    self._copy = lib.cuMemcpyHtoDAsync_v2
    self.ops = (WriteValueOp * TABLE_SLOTS)()
  def slot_of(self, name: str) -> int:
    """The slot of a variable name (given on first ask)."""
    if (slot := self.slots.get(name)) is None:
      if len(self.slots) == TABLE_SLOTS: raise ValueError(f"the device value table holds {TABLE_SLOTS} variables")
      slot = self.slots[name] = len(self.slots)
    return slot
  def stage(self, values: Sequence[tuple[int, int]]) -> None:
    """Queue the writes that make the table hold these (slot, value) pairs for launches queued after this call."""
    changed = [(slot, value) for slot, value in values if self.written[slot] != value]
    if not changed: return
    for slot, value in changed: self.host[slot] = value   # the table as the device will hold it
    if self._batch is not None:
      for op, (slot, value) in zip(self.ops, changed):
        op.operation, op.address, op.value, op.flags = STREAM_MEM_OP_WRITE_VALUE_64, \
          self.address + VALUE_BYTES * slot, value & ((1 << 64) - 1), WRITE_VALUE_DEFAULT
      if self._batch(DEFAULT_STREAM, len(changed), ctypes.addressof(self.ops), 0) != 0:   # no 64-bit stream memory
        self._batch = None                                    # operations on this device: copies from now on
    if self._batch is None:
      check(self._copy(self.address, ctypes.addressof(self.host), TABLE_SLOTS * VALUE_BYTES, DEFAULT_STREAM),
            "cuMemcpyHtoDAsync_v2 (device values)")
    for slot, value in changed: self.written[slot] = value

_tables: dict[str, ValueTable] = {}

def value_table(device: str, allocator: Any) -> ValueTable:
  """The device's table (made on first ask, in the device's memory)."""
  if (table := _tables.get(device)) is None: table = _tables[device] = ValueTable(allocator)
  return table

def stage_all(pairs: Sequence[tuple[ValueTable, str, int]]) -> None:
  """Stage one call's values, (table, variable name, value) each, one batch a table; ValueError where a name is given
  two values (two launches of one graph reading one slot at different values can't both be served)."""
  by_table: dict[int, tuple[ValueTable, dict[int, int]]] = {}
  for table, name, value in pairs:
    slots = by_table.setdefault(id(table), (table, {}))[1]
    slot = table.slot_of(name)
    if slots.setdefault(slot, value) != value:
      raise ValueError(f"variable {name!r} read from device memory at two values ({slots[slot]} and {value}) in one "
                       "graph: run it with FLASH_DEVICE_VALUES=0")
  for table, slots in by_table.values(): table.stage(list(slots.items()))
