"""Custom kernels: what a CUSTOM op computes (its arg, a CustomKernel) and the runners that launch one.

A CUSTOM op (tgrad/lazy.py `LazyBuffer.custom`) is a value written by a CustomKernel from its realized inputs, each a
whole row-major buffer of its shape; the scheduler realizes it and its sources, and `lower_schedule` asks the kernel
for its runner (`kernel.runner(device)`, made once per process). Two kinds:

- `HostFunction`: a Python function of numpy arrays, run on the host: the NUMPY backend. Its runner
  (`HostFunctionRunner`) copies the inputs out of their device, calls the function, and copies the result in, so a
  measured time includes both transfers. Floats reach the function as float64 (bfloat16 read from its bits), and
  the result is rounded to the output dtype.
- `SourceKernel`: a kernel as CUDA C source (compiled by NVRTC) or LLVM IR text (compiled by llvmlite with the LLVM
  device's passes), binaries cached on disk like every kernel's, launched by the device's Program. Argument
  convention: the output buffer first, then the inputs in order (pointers to their first element), then the int64
  scalars of its `Launch`; an LLVM kernel takes one more argument, last, the i32 index of its call: it is called
  `global_size[0]` times (in parallel, one call per index in [0, global_size[0])), as tgrad's own LLVM kernels are.
  A CUDA kernel is an `extern "C" __global__` function launched on grid `global_size` of blocks `local_size`.
"""
from __future__ import annotations
import hashlib, time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union
import numpy as np
from tgrad.backend import device_kind, language_devices
from tgrad.device import Buffer, Device
from tgrad.dtype import DType, bfloat16_to_float32, dtypes
from tgrad.helpers import prod, settings_key
from tgrad.shape.sint import evaluate, sint, unbind

NUMPY = "NUMPY"   # the name of the host backend in a path's parts (it is not a Device: its runner runs on the host)

@dataclass(frozen=True)
class Launch:
  """How to launch a SourceKernel: its grid (CUDA blocks; LLVM: calls), its block size (CUDA) and int64 scalars
  passed after the buffers."""
  global_size: tuple[int, ...]
  local_size: tuple[int, ...] = (1,)
  scalars: tuple[int, ...] = ()

def as_launch(value: Union[Launch, tuple]) -> Launch:
  """A launch rule's answer: a Launch, or a tuple (global_size, local_size[, scalars])."""
  if isinstance(value, Launch): return value
  if not isinstance(value, tuple) or len(value) not in (2, 3):
    raise TypeError(f"a launch rule returns a Launch or a tuple (global_size, local_size[, scalars]), got {value!r}")
  return Launch(*(tuple(int(v) for v in part) for part in value))

class CustomKernel:
  """What a CUSTOM op's arg provides: `name`, `part` (where its work runs: NUMPY for the host, None for the device
  of its inputs), `runner(device)` and `stable_repr()` (the kernel cache key's text for it)."""
  name: str
  part: Optional[str] = None
  def runner(self, device: str) -> Any: raise NotImplementedError
  def stable_repr(self) -> str: raise NotImplementedError

_runners: dict[tuple[CustomKernel, str, tuple], Any] = {}

def runner_for(kernel: CustomKernel, device: str) -> Any:
  """The kernel's runner on `device`, made (compiled, loaded) once per process and code settings (PDL, FLASH_CLUSTER:
  a runner's source follows them)."""
  key = (kernel, device, settings_key())
  if (runner := _runners.get(key)) is None: runner = _runners[key] = kernel.runner(device)
  return runner

# ---- the NUMPY backend: host functions

def concrete_shape(shape: tuple[sint, ...], var_vals: Optional[dict[str, int]] = None) -> tuple[int, ...]:
  """A site's shape at this launch: a symbolic size (a prefill's prompt length) at the launch's variable values, else
  at the value it was bound to when the graph was built."""
  def size(s: sint) -> int:
    unbound, bound = unbind(s)
    return evaluate(unbound, {**bound, **(var_vals or {})})
  return tuple(size(s) for s in shape)

def host_values(buffer: Buffer, shape: tuple[int, ...]) -> np.ndarray:
  """A buffer's first prod(shape) values as a numpy array of `shape` (floats as float64; bfloat16 from its bits)."""
  data = buffer.copyout()[:prod(shape)]
  if buffer.dtype == dtypes.bfloat16: data = bfloat16_to_float32(data)
  return (data.astype(np.float64) if buffer.dtype.is_float else data).reshape(shape)

def device_values(values: np.ndarray, dtype: DType) -> np.ndarray:
  """Host values rounded to `dtype`, in its bytes' numpy type (bfloat16: round to nearest even, as kernels do)."""
  if dtype != dtypes.bfloat16: return np.ascontiguousarray(values, dtype=dtype.np)
  with np.errstate(over="ignore", invalid="ignore"): bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
  rounded = (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16
  nan = np.isnan(values)
  return np.where(nan, np.uint16(0x7FC0), rounded.astype(np.uint16)).astype(np.uint16)

@dataclass(frozen=True)
class HostFunction(CustomKernel):
  """`fn(*input arrays, **params) -> array of out_shape`, on the host (see the module doc)."""
  name: str
  fn: Callable[..., np.ndarray]
  in_shapes: tuple[tuple[int, ...], ...]
  out_shape: tuple[int, ...]
  params: tuple[tuple[str, Any], ...] = ()
  part = NUMPY
  def runner(self, device: str) -> HostFunctionRunner: return HostFunctionRunner(self)
  def stable_repr(self) -> str:
    where = f"{getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
    return f"HostFunction({self.name},{where},{self.in_shapes},{self.out_shape},{self.params!r})"

class HostFunctionRunner:
  """Copy the inputs out, call the host function, copy the result into the output buffer; seconds when wait."""
  flops = 0
  def __init__(self, kernel: HostFunction):
    self.kernel, self.name = kernel, f"numpy:{kernel.name}"
    self.nbytes = 0
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    start = time.perf_counter()
    kernel = self.kernel
    inputs = [host_values(b, concrete_shape(shape, var_vals)) for b, shape in zip(bufs[1:], kernel.in_shapes)]
    with np.errstate(all="ignore"): result = np.asarray(kernel.fn(*inputs, **dict(kernel.params)))
    if result.shape != (out_shape := concrete_shape(kernel.out_shape, var_vals)):
      raise ValueError(f"host function {kernel.name!r} returned shape {result.shape}, not {out_shape}")
    out, values = bufs[0], device_values(result, bufs[0].dtype).reshape(-1)[:bufs[0].size]
    # a symbolic site's output buffer is allocated at the sizes' maximum: the values fill its start
    if values.size < out.size: out = Buffer(out.device, values.size, out.dtype, base=out)
    out.copyin(values)
    self.nbytes = sum(b.nbytes for b in bufs)
    return time.perf_counter() - start if wait else None

# ---- user kernels in CUDA C or LLVM IR

@dataclass(frozen=True)
class SourceKernel(CustomKernel):
  """A user kernel's source for one site: `launch(*in_shapes)` gives its Launch (see the module doc)."""
  name: str
  language: str
  source: str
  entry: str
  launch: Callable[..., Union[Launch, tuple]]
  in_shapes: tuple[tuple[int, ...], ...]
  out_shape: tuple[int, ...]
  def __post_init__(self):
    if self.language not in (languages := language_devices()):
      raise ValueError(f"kernel {self.name!r}: language {self.language!r}: use one of {sorted(languages)}")
  def runner(self, device: str) -> SourceKernelRunner: return SourceKernelRunner(self, device)
  def stable_repr(self) -> str:
    digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
    return f"SourceKernel({self.name},{self.language},{digest},{self.entry},{self.in_shapes},{self.out_shape})"

class SourceKernelRunner:
  """A compiled, loaded SourceKernel: launched on (output, *inputs) Buffers; seconds when wait."""
  flops = 0
  def __init__(self, kernel: SourceKernel, device: str):
    if (home := language_devices()[kernel.language]) != device_kind(device):
      raise ValueError(f"kernel {kernel.name!r} is {kernel.language} source: it runs on {home}, not {device}")
    dev = Device[device]
    self.name, self.kernel = f"user:{kernel.name}", kernel
    self.program = dev.load_program(kernel.entry, kernel.source)
    self.launch = as_launch(kernel.launch(*kernel.in_shapes))
    self.nbytes = 0
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    launch = self.launch
    self.nbytes = sum(b.nbytes for b in bufs)
    return self.program(*[b.handle for b in bufs], global_size=launch.global_size, local_size=launch.local_size,
                        vals=launch.scalars, wait=wait)
