"""The PYTHON device: host memory in numpy byte arrays, kernels as Python functions (renderer.py), run one call per
core index. Written against the device contract alone (tgrad/device.py, codegen/renderer.py, ops.exec_alu): it shows
what a backend must provide, and is a slow, exact reference for the others.

Memory is a numpy uint8 array (a view is a slice of it); a kernel views it as the dtype it loads or stores (bfloat16
as its 16 bits). The compiler checks the source's syntax and keeps it as the binary; it never uses the disk cache,
since a cached binary here would be Python code read from disk (and compiling costs nothing).
"""
from __future__ import annotations
import functools, math, os, struct, time
from typing import Callable
import numpy as np
from tgrad.device import Allocator, BinaryLoadError, CompileError, Compiled, Compiler
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, exec_alu, truncate_to
from tgrad.runtime.python.renderer import PythonRenderer

class PythonAllocator(Allocator):
  def alloc(self, nbytes: int) -> np.ndarray: return np.empty(nbytes, dtype=np.uint8)
  def copyin(self, handle: np.ndarray, src: memoryview) -> None: handle[:len(src)] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dst: memoryview, handle: np.ndarray) -> None:
    np.frombuffer(dst, dtype=np.uint8)[:] = handle[:len(dst)]
  def view(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray: return handle[offset:offset + nbytes]
  def available(self) -> int: return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

class PythonCompiler(Compiler):
  cache_key = "python"
  def compile(self, src: str) -> bytes:
    try: compile(src, "<kernel>", "exec")
    except SyntaxError as error:
      numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))
      raise CompileError(f"{numbered}\n{type(error).__name__}: {error}") from error
    return src.encode()
  def compile_cached(self, src: str) -> bytes: return self.compile(src)

# ---- what a kernel's source calls (its whole namespace)

def typed(memory: np.ndarray, dtype: DType) -> np.ndarray:
  """A buffer's bytes as an array of the dtype's memory layout (whole elements only)."""
  itemsize = dtype.itemsize
  return memory[:len(memory) - len(memory) % itemsize].view(np.dtype(dtype.np_name))

def _bfloat16_value(bits: int) -> float: return struct.unpack("<f", struct.pack("<I", bits << 16))[0]

def _bfloat16_bits(value: float) -> int:
  """The bfloat16 nearest a float (ties to even; NaN stays a quiet NaN), as its 16 bits."""
  if math.isnan(value): return 0x7FC0
  bits = struct.unpack("<I", struct.pack("<f", truncate_to(value, dtypes.float32)))[0]
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF

def load(memory: np.ndarray, index: int, dtype: DType):
  value = memory.item(index)
  return _bfloat16_value(value) if dtype == dtypes.bfloat16 else value

def store(memory: np.ndarray, index: int, value, dtype: DType) -> None:
  memory[index] = _bfloat16_bits(value) if dtype == dtypes.bfloat16 else value

def cast(value, source: DType, dtype: DType):
  """CAST: float → int truncates (NaN and infinities give 0), anything → bool is `!= 0` (NaN is True)."""
  return truncate_to(value, dtype)

def bitcast(value, source: DType, dtype: DType):
  """BITCAST: the same bits read as the other dtype."""
  bits = _bfloat16_bits(value) if source == dtypes.bfloat16 else value
  raw = np.array(bits, dtype=np.dtype(source.np_name)).view(np.dtype(dtype.np_name)).item()
  return _bfloat16_value(raw) if dtype == dtypes.bfloat16 else raw

def parameter(bits: int, dtype: DType):
  """A DEFINE_VAR's value from its 64-bit launch value: a float scalar parameter's bits (tgrad/scalars.py)."""
  if dtype == dtypes.float64: return struct.unpack("<d", struct.pack("<q", bits))[0]
  if dtype == dtypes.float32: return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
  return bits

KERNEL_NAMESPACE = {"typed": typed, "load": load, "store": store, "cast": cast, "bitcast": bitcast,
                    "parameter": parameter, "exec_alu": exec_alu, "Ops": Ops, "dtypes": dtypes, "np": np,
                    "INF": math.inf, "NAN": math.nan}

class PythonProgram:
  """A loaded kernel: called with byte arrays, global_size=(calls,) and variable values, once per core index."""
  def __init__(self, name: str, binary: bytes):
    namespace = dict(KERNEL_NAMESPACE)
    exec(compile(binary.decode(), f"<kernel {name}>", "exec"), namespace)
    if not callable(function := namespace.get(name)): raise BinaryLoadError(f"kernel {name} is not in its source")
    self.name, self.function = name, function
  def __call__(self, *buffers: np.ndarray, global_size=(1,), local_size=None, vals=(), wait: bool = False):
    start = time.perf_counter()
    self.prepare(buffers, global_size, local_size, vals)()
    return time.perf_counter() - start if wait else None
  def prepare(self, buffers, global_size=(1,), local_size=None, vals=()) -> Callable[[], None]:
    calls = global_size[0] if global_size else 1
    launch = functools.partial(self.function, *buffers, *vals)
    def run() -> None:
      for core in range(calls): launch(core)
    return run

def create_device() -> Compiled:
  return Compiled("PYTHON", PythonAllocator(), PythonCompiler(), PythonRenderer(), PythonProgram, arch="python")
