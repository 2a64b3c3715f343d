"""Kernel arguments passed by reference: the `kernelParams` array that cuLaunchKernel and a CUDA-graph kernel node
take (one pointer per argument), from which the driver copies each argument to the offset the compiled kernel gives it.

Why not a packed buffer (pycuda's prepared calls, CU_LAUNCH_PARAM_BUFFER_POINTER): the compiler places a parameter at
its alignment *in the constant bank* the parameters live in, and that bank's parameter area does not start on a
64-byte boundary (on sm_90 it starts at 0x210). A 64-byte-aligned parameter, such as a tensor map passed
`const __grid_constant__` (tensor_map.py), therefore sits at offset 48 of the kernel's parameter block, not at 0, and
everything after it moves too. A buffer packed by adding up sizes puts the map at 0: the kernel reads 128 bytes that
are not a tensor map and the TMA traps ("an illegal instruction was encountered"). Only the kernel (its cubin's
parameter table, which the driver reads) knows the offsets, so every launch of a kernel that takes tensor maps hands
the driver one pointer per argument (`KernelArguments`) and lets it place them: `launch_by_reference` eagerly, the
graph's kernel nodes (graph.py) in a CUDA graph.

Argument kinds: "M" a tensor map (128 bytes by value), "P" a device pointer (uint64), "q" an int64, "i" an int32.
"""
from __future__ import annotations
import ctypes
from typing import Sequence
from tgrad.runtime.cuda.driver import CUstream, DEFAULT_STREAM, check, driver
from tgrad.runtime.cuda.tensor_map import TENSOR_MAP_ALIGNMENT, TENSOR_MAP_BYTES

TENSOR_MAP_KIND = "M"   # a tensor map (tensor_map.py): 128 bytes passed by value, before every other argument
CTYPE_OF_KIND = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "q": ctypes.c_int64}

class TensorMapValue:
  """A tensor map argument's storage: 128 bytes at a 64-byte-aligned address (CUtensorMap's alignment), `value`
  settable like a ctypes scalar's."""
  def __init__(self, value: bytes):
    self.storage = (ctypes.c_char * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGNMENT))()
    self.address = -(-ctypes.addressof(self.storage) // TENSOR_MAP_ALIGNMENT) * TENSOR_MAP_ALIGNMENT
    self.value = value
  @property
  def value(self) -> bytes: return ctypes.string_at(self.address, TENSOR_MAP_BYTES)
  @value.setter
  def value(self, value: bytes) -> None: ctypes.memmove(self.address, value, TENSOR_MAP_BYTES)

class KernelArguments:
  """The values of one launch's arguments (`kinds`: one letter each) in ctypes storage, and `pointers`, the
  kernelParams array pointing at them. `values[i].value = x` changes argument i for the next launch."""
  def __init__(self, args: Sequence, kinds: str):
    if len(args) != len(kinds): raise ValueError(f"{len(args)} kernel arguments but {len(kinds)} kinds ({kinds!r})")
    self.kinds = kinds
    self.values = [TensorMapValue(a) if kind == TENSOR_MAP_KIND else CTYPE_OF_KIND[kind](a)
                   for kind, a in zip(kinds, args)]
    addresses = [v.address if isinstance(v, TensorMapValue) else ctypes.addressof(v) for v in self.values]
    self.pointers = (ctypes.c_void_p * max(1, len(self.values)))(*addresses)
  def array(self) -> ctypes._Pointer:   # type: ignore[name-defined]
    """The kernelParams argument of the driver calls: a void** to the first pointer."""
    return ctypes.cast(self.pointers, ctypes.POINTER(ctypes.c_void_p))

def launch_by_reference(identity: tuple[int, int, int], grid: Sequence[int], block: Sequence[int], shared_bytes: int,
                        arguments: KernelArguments, stream: int = DEFAULT_STREAM) -> None:
  """cuLaunchKernel of the kernel `identity` names ((func, kern, ctx) as graph.kernel_identity learns it: a CUfunction,
  or a CUkernel, which the driver launches in the current context) with `arguments` by reference, on `stream` (the
  legacy default stream unless given, where tgrad's eager kernels run)."""
  func, kern, _ = identity
  gx, gy, gz = grid
  bx, by, bz = block
  check(driver().cuLaunchKernel(func or kern, gx, gy, gz, bx, by, bz, shared_bytes, CUstream(stream),
                                arguments.array(), None),
        f"cuLaunchKernel (grid {tuple(grid)}, block {tuple(block)}, {shared_bytes} shared bytes)")
