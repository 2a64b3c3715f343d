"""The CUDA devices through pycuda: the primary context of each GPU, a caching allocator, host↔device copies, launches.

Allocator: device memory handles (pycuda DeviceAllocation); freed blocks are kept and reused by exact size; large
copies stream through two pinned host buffers so the host-side copy of one chunk overlaps the DMA of the other;
small stream-ordered copies (copyin_async / copyout_async) go through a ring of pinned slots without synchronizing.
Compiler: NVRTC (nvrtc.py) for the GPU's own sm_XX. Program: a cubin loaded as a module, its kernel `prepare`d with
pointer arguments and launched with `prepared_call`; `wait=True` times the launch with CUDA events (seconds). A
kernel whose shared arrays exceed the static 48 KiB says how much dynamic shared memory it needs in a module global;
the program opts the function in to that size and launches with it. A kernel that loads through tensor maps (TMA:
wgmma_tma.py) lists them in a module global (tensor_map.py); the program makes them from each launch's buffer
pointers (cached per pointer tuple) and passes them by value before the pointers, every argument by reference
(cuLaunchKernel's kernelParams: kernel_params.py says why a packed buffer misplaces the maps).
Limits (threads, block/grid dims, shared memory) come from the device's attributes into its CUDARenderer.
A view of an allocation is its address plus the offset (an int, which every pycuda call and launch accepts);
`prepare` binds a launch's grid, block and argument tuple once, for replaying it in a tight loop.
Several GPUs (`create_device(ordinal)`): each has its own primary context, caching allocator, pinned staging and
renderer limits. The first device started in a process is *resident*: its context stays current on the main thread,
so its allocator and programs are the plain classes below, with no per-call context switch (one GPU costs exactly
what it always did). Every later device is a *guest*: its allocator, programs and device methods push its context
before each call and pop it after (GuestAllocator, GuestProgram). Copies between two GPUs are peer.py's.
Fork: the driver can't start again in a child forked after the parent's cuInit (it fails with "initialization
error"), so such a child forgets the parent's contexts and starting CUDA there raises CUDAForkError (use 'spawn').
"""
from __future__ import annotations
import atexit, collections, functools, os
from typing import Callable, Optional
import numpy as np
import pycuda.driver as cuda
from tgrad.backend import device_name
from tgrad.device import Allocator, BinaryLoadError, Compiled, OutOfMemoryError, PendingRead
from tgrad.runtime.cuda.renderer import CUDARenderer, DEPENDENT_LAUNCH_SUFFIX, DYNAMIC_SHARED_SUFFIX, \
  NON_PORTABLE_CLUSTER_SUFFIX, WARPGROUP_MMA_ARCH
from tgrad.runtime.cuda.nvrtc import NVRTCCompiler, arch_of
from tgrad.runtime.cuda.driver import FUNCTION_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, STREAM_NON_BLOCKING, \
  clusters_that_fit
from tgrad.runtime.cuda.targets import TENSOR_MAPS_SUFFIX
from tgrad.runtime.cuda.tensor_map import TENSOR_MAP_CACHE_ENTRIES, TensorMapCache, specs_of_marker

DEFAULT_ORDINAL = 0   # the GPU `CUDA` names without an index
HOPPER_CAPABILITY = (9, 0)   # H100/H200: the only GPUs that run sm_90a code (wgmma)
# Copies at least this big go through pinned staging: below it the staging setup costs more than pageable copies lose.
PINNED_COPY_THRESHOLD = 1 << 20
# Size of each of the two pinned staging chunks: big enough to reach full PCIe/NVLink bandwidth per DMA.
PINNED_CHUNK_BYTES = 8 << 20
# Stream-ordered copies (copyin_async / copyout_async) stage through a ring of pinned slots of this size; a bigger
# copy is done synchronously. Enough slots that a host loop a few steps ahead of the GPU never waits for one.
ASYNC_SLOT_BYTES, ASYNC_SLOTS = 64 << 10, 8

class CUDAForkError(RuntimeError):
  """CUDA used in a process forked after its parent started the driver: the driver refuses (cuInit fails)."""

class _DriverState:
  """Which process started the driver (cuInit), and the contexts it made: a forked child inherits both but can use
  neither, so `_after_fork_in_child` forgets the contexts and makes every later start raise CUDAForkError."""
  started_in_pid: Optional[int] = None
  forked_from_pid: Optional[int] = None
  contexts: list[CUDAContext] = []
  resident_ordinal: Optional[int] = None   # the GPU whose context stays current (the first one started)
  devices: dict[int, CUDADevice] = {}      # started devices by ordinal (for guest_context and the collectives)

def _start_driver() -> None:
  if _DriverState.forked_from_pid is not None:
    raise CUDAForkError(f"CUDA was started in process {_DriverState.forked_from_pid} before this process "
                        f"({os.getpid()}) was forked from it, and the driver can't start again in a forked child: "
                        "create worker processes with multiprocessing's 'spawn' or 'forkserver' start method "
                        "(multiprocessing.get_context('spawn')), or use DEVICE=LLVM in the child")
  cuda.init()
  _DriverState.started_in_pid = os.getpid()

def _after_fork_in_child() -> None:
  """In a forked child: the parent's contexts, allocations and streams are not this process's. Drop the contexts
  (closing them would call the driver), and make the device registry start CUDA again, which now raises
  CUDAForkError (and `Device.available('CUDA')` answers False, so the default device is LLVM)."""
  if _DriverState.started_in_pid is None: return   # the parent never started the driver: the child may
  _DriverState.forked_from_pid = _DriverState.started_in_pid
  _DriverState.started_in_pid = None
  for context in _DriverState.contexts: context.context = None
  _DriverState.contexts, _DriverState.resident_ordinal, _DriverState.devices = [], None, {}
  from tgrad.device import Device
  Device.forget()

os.register_at_fork(after_in_child=_after_fork_in_child)

class CUDAContext:
  """The primary context of one GPU. The resident one (the first started in the process) is made current on the
  thread that creates it (the main thread) and stays current; a guest's is current only between `enter()` and
  `leave()`, which its device's operations call around themselves."""
  def __init__(self, ordinal: int = DEFAULT_ORDINAL):
    _start_driver()
    from tgrad.runtime.cuda.driver import current_context
    self.ordinal = ordinal
    self.device = cuda.Device(ordinal)
    self.context = self.device.retain_primary_context()
    self.resident = _DriverState.resident_ordinal in (None, ordinal)
    self.context.push()
    self.handle = current_context()   # the CUcontext, for driver calls that name a context (peer copies)
    if self.resident: _DriverState.resident_ordinal = ordinal
    else: self.context.pop()
    _DriverState.contexts.append(self)
    atexit.register(self.close)
  def enter(self) -> None:
    """Make this context current (on top of the resident one) until the matching `leave()`."""
    self.context.push()
  def leave(self) -> None: cuda.Context.pop()
  def close(self) -> None:
    if self.context is None: return
    try:
      if self.resident:
        cuda.Context.synchronize()
        self.context.pop()
      else:
        self.context.push()
        cuda.Context.synchronize()
        cuda.Context.pop()
    except cuda.Error: pass   # already popped or the driver is shutting down
    self.context = None
  def attribute(self, name: str) -> int: return self.device.get_attribute(getattr(cuda.device_attribute, name))
  @property
  def compute_capability(self) -> tuple[int, int]: return self.device.compute_capability()

def _in_context(method: Callable) -> Callable:
  """`method` of a guest device's object, run with the object's context current."""
  @functools.wraps(method)
  def run(self, *args, **kwargs):
    self.context.enter()
    try: return method(self, *args, **kwargs)
    finally: self.context.leave()
  return run

class CUDAAllocator(Allocator):
  """Device memory with a cache of freed blocks, reused by exact size; the cache is emptied when memory runs out."""
  def __init__(self):
    self.cache: dict[int, list] = collections.defaultdict(list)
    self.cached_bytes = 0
    self.stream = cuda.Stream()
    self.staging: Optional[list[np.ndarray]] = None   # two pinned chunks, made at the first large copy
    self.staged = [cuda.Event(), cuda.Event()]
    self.async_slots: Optional[list[tuple[np.ndarray, cuda.Event]]] = None   # made at the first async copy
    self.next_async_slot = 0
    self.slot_readers: dict[int, PendingRead] = {}   # slot → the read whose bytes are still in it

  def alloc(self, nbytes: int):
    if self.cache[nbytes]:
      self.cached_bytes -= nbytes
      return self.cache[nbytes].pop()
    try: return cuda.mem_alloc(nbytes)
    except cuda.MemoryError:
      self.free_cache()
      try: return cuda.mem_alloc(nbytes)
      except cuda.MemoryError as e:
        raise OutOfMemoryError("CUDA", nbytes, cuda.mem_get_info()[0], "an allocation") from e

  def free(self, handle, nbytes: int) -> None:
    self.cache[nbytes].append(handle)
    self.cached_bytes += nbytes

  def view(self, handle, offset: int, nbytes: int) -> int: return int(handle) + offset
  def available(self) -> int: return cuda.mem_get_info()[0] + self.cached_bytes

  def free_cache(self) -> None:
    for blocks in self.cache.values():
      for block in blocks: block.free()
    self.cache.clear()
    self.cached_bytes = 0

  # ---- stream-ordered copies: on the legacy default stream, where kernels and CUDA graphs run, so a copy lands
  # between the work queued before it and the work queued after it
  def _async_slot(self) -> tuple[np.ndarray, "cuda.Event"]:
    """The next pinned slot of the ring, free: the copy that last used it has completed, and a read still waiting
    for its owner has been taken out of it."""
    if self.async_slots is None:
      self.async_slots = [(cuda.pagelocked_empty(ASYNC_SLOT_BYTES, np.uint8), cuda.Event()) for _ in range(ASYNC_SLOTS)]
    slot = self.async_slots[self.next_async_slot]
    self.next_async_slot = (self.next_async_slot + 1) % ASYNC_SLOTS
    if (reader := self.slot_readers.pop(id(slot[0]), None)) is not None: reader.wait()
    slot[1].synchronize()
    return slot

  def copyin_async(self, handle, src: memoryview) -> None:
    host = np.frombuffer(src, dtype=np.uint8)
    if host.nbytes > ASYNC_SLOT_BYTES: return self.copyin(handle, src)   # pageable: ordered on the default stream
    staging, copied = self._async_slot()
    staging[:host.nbytes] = host
    cuda.memcpy_htod_async(handle, staging[:host.nbytes], None)
    copied.record(None)

  def copyout_async(self, handle, nbytes: int) -> PendingRead:
    if nbytes > ASYNC_SLOT_BYTES: return super().copyout_async(handle, nbytes)
    staging, copied = self._async_slot()
    cuda.memcpy_dtoh_async(staging[:nbytes], handle, None)
    copied.record(None)
    def finish() -> np.ndarray:
      copied.synchronize()
      self.slot_readers.pop(id(staging), None)
      return staging[:nbytes].copy()
    read = self.slot_readers[id(staging)] = PendingRead(finish=finish)
    return read

  def _chunks(self) -> list[np.ndarray]:
    if self.staging is None: self.staging = [cuda.pagelocked_empty(PINNED_CHUNK_BYTES, np.uint8) for _ in range(2)]
    return self.staging

  def copyin(self, handle, src: memoryview) -> None:
    host = np.frombuffer(src, dtype=np.uint8)
    if host.nbytes < PINNED_COPY_THRESHOLD: return cuda.memcpy_htod(handle, host)
    chunks = self._chunks()
    for i, start in enumerate(range(0, host.nbytes, PINNED_CHUNK_BYTES)):
      part = host[start:start + PINNED_CHUNK_BYTES]
      slot = i % 2
      self.staged[slot].synchronize()   # the DMA that last read this chunk is done
      chunks[slot][:part.nbytes] = part
      cuda.memcpy_htod_async(int(handle) + start, chunks[slot][:part.nbytes], self.stream)
      self.staged[slot].record(self.stream)
    self.stream.synchronize()

  def copyout(self, dst: memoryview, handle) -> None:
    host = np.frombuffer(dst, dtype=np.uint8)
    cuda.Context.synchronize()   # kernels run on the default stream; their results must be written
    if host.nbytes < PINNED_COPY_THRESHOLD: return cuda.memcpy_dtoh(host, handle)
    chunks = self._chunks()
    starts = list(range(0, host.nbytes, PINNED_CHUNK_BYTES))
    def fetch(i: int) -> None:
      size = min(PINNED_CHUNK_BYTES, host.nbytes - starts[i])
      cuda.memcpy_dtoh_async(chunks[i % 2][:size], int(handle) + starts[i], self.stream)
      self.staged[i % 2].record(self.stream)
    fetch(0)
    for i, start in enumerate(starts):
      if i + 1 < len(starts): fetch(i + 1)   # the next chunk's DMA overlaps this chunk's host copy
      self.staged[i % 2].synchronize()
      size = min(PINNED_CHUNK_BYTES, host.nbytes - start)
      host[start:start + size] = chunks[i % 2][:size]

class CUDAProgram:
  """One kernel of a cubin. Call with device buffers, global_size/local_size (x first), and DEFINE_VAR values."""
  def __init__(self, name: str, binary: bytes):
    from pycuda._pvt_struct import pack   # the packer prepared_call uses; imported once a real device loads a kernel
    self.name, self.pack_args, self.binary = name, pack, binary
    try:
      self.module = cuda.module_from_buffer(binary)
      self.function = self.module.get_function(name)
    except cuda.Error as error:   # the driver rejected the cubin (CUDA_ERROR_INVALID_IMAGE, NOT_FOUND, ...)
      raise BinaryLoadError(f"kernel {name}: {type(error).__name__}: {error}") from error
    self.prepared_args = -1
    self.shared_bytes = 0   # dynamic shared memory: the module says how much (runtime/cuda/renderer.py)
    address = self._marker_address(name + DYNAMIC_SHARED_SUFFIX)
    if address is not None:
      size = np.zeros(1, np.uint32)
      cuda.memcpy_dtoh(size, address)
      self.shared_bytes = int(size[0])
      self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared_bytes)
    if self._marker_address(name + NON_PORTABLE_CLUSTER_SUFFIX) is not None:   # clusters of more than 8 blocks
      self.function.set_attribute(cuda.function_attribute(FUNCTION_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED), 1)
    # tensor maps (TMA) the kernel takes first, made from the buffer pointers of each launch; None when it takes none
    self.tensor_maps: Optional[TensorMapCache] = None
    try: marker_address, marker_bytes = self.module.get_global(name + TENSOR_MAPS_SUFFIX)
    except cuda.LogicError: marker_address = None
    if marker_address is not None:
      values = np.zeros(marker_bytes // 8, np.uint64)
      cuda.memcpy_dtoh(values, marker_address)
      self.tensor_maps = TensorMapCache(specs_of_marker([int(v) for v in values]))
    self.identity: Optional[tuple[int, int, int]] = None   # a TMA kernel's (func, kern, ctx), learned at first launch
    self.arguments_by_key: dict[tuple, object] = {}        # a TMA kernel's KernelArguments per (pointers, variables)
    # rendered with the dependent-launch prologue: a CUDA graph may start it before its predecessor ends
    self.waits_for_prior_grids = self._marker_address(name + DEPENDENT_LAUNCH_SUFFIX) is not None
    self.start, self.end = cuda.Event(), cuda.Event()
    self.last_sizes: tuple = (None, None)   # the (global_size, local_size) objects last_dims was made from
    self.last_dims: tuple = ((1, 1, 1), (1, 1, 1))

  def clusters_that_fit(self, cluster: int, block_threads: int) -> Optional[int]:
    """How many of this kernel's thread block clusters (its compile-time size, `cluster` blocks of `block_threads`
    threads) the device holds at once: 0 where it cannot place one, None where the driver can't say
    (driver.clusters_that_fit)."""
    non_portable = self._marker_address(self.name + NON_PORTABLE_CLUSTER_SUFFIX) is not None
    return clusters_that_fit(self.binary, self.name, cluster, block_threads, self.shared_bytes, non_portable)

  def _marker_address(self, global_name: str) -> Optional[int]:
    """The device address of a module global the renderer emits as a marker, or None when the module has none."""
    try: return self.module.get_global(global_name)[0]
    except cuda.LogicError: return None

  def __call__(self, *buffers, global_size=(1,), local_size=(1,), vals=(), wait: bool = False) -> Optional[float]:
    """Launch now (the eager path): the arguments packed in the prepared format and handed straight to the launch
    that pycuda's prepared_call ends in (skipping its per-call keyword and texture handling, which tgrad never
    uses), with the grid and block of the last launch reused when the sizes are the same tuples (a CompiledKernel
    passes its own every time). A kernel that takes tensor maps is launched with its arguments by reference."""
    if self.prepared_args != len(buffers) + len(vals): self._prepare_arguments(len(buffers), len(vals))
    if global_size is self.last_sizes[0] and local_size is self.last_sizes[1]: grid, block = self.last_dims
    else:
      grid, block = _launch_dims(global_size, local_size)
      if type(global_size) is tuple and type(local_size) is tuple:   # immutable: the same object, the same sizes
        self.last_sizes, self.last_dims = (global_size, local_size), (grid, block)
    if self.tensor_maps is not None: return self._timed(self._by_reference(buffers, grid, block, vals), wait)
    args = self.pack_args(self.function.arg_format, *map(int, buffers), *map(int, vals))
    if not wait:
      self.function._launch_kernel(grid, block, args, self.shared_bytes, None)
      return None
    self.start.record()
    self.function._launch_kernel(grid, block, args, self.shared_bytes, None)
    self.end.record()
    self.end.synchronize()
    return self.start.time_till(self.end) * 1e-3

  def _timed(self, launch: Callable[[], None], wait: bool) -> Optional[float]:
    """Run `launch`; with `wait`, between two events, and its time in seconds once it has finished."""
    if not wait: return launch()
    self.start.record()
    launch()
    self.end.record()
    self.end.synchronize()
    return self.start.time_till(self.end) * 1e-3

  def _by_reference(self, buffers, grid, block, vals) -> Callable[[], None]:
    """A launch of this tensor-map kernel with its arguments by reference (kernel_params.py): the maps of these
    pointers, the pointers, the variables, kept per (pointers, variables) tuple; the kernel's driver handle is learned
    at the first launch (graph.kernel_identity: pycuda does not expose it)."""
    from tgrad.runtime.cuda.kernel_params import TENSOR_MAP_KIND, KernelArguments, launch_by_reference
    pointers, values = tuple(int(b) for b in buffers), tuple(int(v) for v in vals)
    assert self.tensor_maps is not None
    if (arguments := self.arguments_by_key.get((pointers, values))) is None:
      maps = self.tensor_maps(pointers)
      arguments = KernelArguments([*maps, *pointers, *values],
                                  TENSOR_MAP_KIND * len(maps) + "P" * len(pointers) + "q" * len(values))
      if len(self.arguments_by_key) >= TENSOR_MAP_CACHE_ENTRIES:   # the oldest tuple goes first
        self.arguments_by_key.pop(next(iter(self.arguments_by_key)))
      self.arguments_by_key[(pointers, values)] = arguments
    if self.identity is None:
      from tgrad.runtime.cuda.graph import KernelLaunch, kernel_identity
      self.identity = kernel_identity(KernelLaunch.for_program(self, pointers, grid, block, values))
    return functools.partial(launch_by_reference, self.identity, grid, block, self.shared_bytes, arguments)

  def _prepare_arguments(self, buffers: int, vals: int) -> None:
    self.function.prepare("P" * buffers + "q" * vals)   # variables are 64-bit parameters (runtime/cuda/renderer.py)
    self.prepared_args = buffers + vals

  def prepare(self, buffers, global_size=(1,), local_size=(1,), vals=()) -> Callable[[], None]:
    """A no-argument callable that launches this kernel with these arguments (grid, block and pointers fixed here)."""
    if self.prepared_args != len(buffers) + len(vals): self._prepare_arguments(len(buffers), len(vals))
    grid, block = _launch_dims(global_size, local_size)
    if self.tensor_maps is not None: return self._by_reference(buffers, grid, block, vals)   # arguments made once
    args = [int(b) for b in buffers] + [int(v) for v in vals]
    return functools.partial(self.function.prepared_call, grid, block, *args, shared_size=self.shared_bytes)

class GuestAllocator(CUDAAllocator):
  """A guest GPU's allocator: every call runs with its context current (its streams, events, memory and pinned
  staging belong to that context)."""
  def __init__(self, context: CUDAContext):
    self.context = context
    context.enter()
    try: super().__init__()
    finally: context.leave()
  alloc = _in_context(CUDAAllocator.alloc)
  free_cache = _in_context(CUDAAllocator.free_cache)
  available = _in_context(CUDAAllocator.available)
  copyin = _in_context(CUDAAllocator.copyin)
  copyout = _in_context(CUDAAllocator.copyout)
  copyin_async = _in_context(CUDAAllocator.copyin_async)
  def copyout_async(self, handle, nbytes: int) -> PendingRead:
    self.context.enter()
    try: pending = CUDAAllocator.copyout_async(self, handle, nbytes)
    finally: self.context.leave()
    def finish() -> np.ndarray:
      self.context.enter()
      try: return pending.wait()
      finally: self.context.leave()
    return PendingRead(finish=finish)

class GuestProgram(CUDAProgram):
  """A kernel loaded into a guest GPU's context, launched with that context current."""
  def __init__(self, context: CUDAContext, name: str, binary: bytes):
    self.context = context
    context.enter()
    try: super().__init__(name, binary)
    finally: context.leave()
  __call__ = _in_context(CUDAProgram.__call__)
  def prepare(self, buffers, global_size=(1,), local_size=(1,), vals=()) -> Callable[[], None]:
    self.context.enter()   # a tensor-map kernel learns its driver handle here, by a capture in its own context
    try: launch = CUDAProgram.prepare(self, buffers, global_size, local_size, vals)
    finally: self.context.leave()
    def launch_in_context() -> None:
      self.context.enter()
      try: launch()
      finally: self.context.leave()
    return launch_in_context

def _launch_dims(global_size, local_size) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(grid, block) as pycuda takes them: three dims each, x first."""
  return tuple(global_size) + (1,) * (3 - len(global_size)), tuple(local_size) + (1,) * (3 - len(local_size))

class CUDADevice(Compiled):
  """One GPU: `ordinal` is its index among the driver's devices, `context` its CUDAContext. Kernels, copies and
  graphs run on its context's legacy default stream (DEFAULT_STREAM); `capture_stream()` is a private stream that
  stream capture records on (the legacy stream can't be captured)."""
  def __init__(self, ordinal: int = DEFAULT_ORDINAL):
    self.ordinal = ordinal
    self.context = context = CUDAContext(ordinal)
    attr = self.context.attribute
    # compute capability 9.0 compiles for sm_90a (a superset of sm_90 that runs only there): wgmma (OptOps.WGMMA)
    self.arch = WARPGROUP_MMA_ARCH if context.compute_capability == HOPPER_CAPABILITY else \
      arch_of(context.compute_capability)
    renderer = CUDARenderer(
      arch=self.arch, max_local_size=attr("MAX_THREADS_PER_BLOCK"),
      max_grid=(attr("MAX_GRID_DIM_X"), attr("MAX_GRID_DIM_Y"), attr("MAX_GRID_DIM_Z")),
      max_local_dims=(attr("MAX_BLOCK_DIM_X"), attr("MAX_BLOCK_DIM_Y"), attr("MAX_BLOCK_DIM_Z")),
      shared_memory_bytes=attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"))   # beyond 48 KiB: dynamic (see CUDAProgram)
    self.sm_count = attr("MULTIPROCESSOR_COUNT")
    if context.resident: allocator, program = CUDAAllocator(), CUDAProgram
    else: allocator, program = GuestAllocator(context), functools.partial(GuestProgram, context)
    self._capture_stream: Optional[cuda.Stream] = None
    super().__init__(device_name("CUDA", ordinal), allocator, NVRTCCompiler(self.arch), renderer, program, self.arch)
    _DriverState.devices[ordinal] = self
  def synchronize(self) -> None:
    if self.context.resident: return cuda.Context.synchronize()
    self.context.enter()
    try: cuda.Context.synchronize()
    finally: self.context.leave()
  def profile_mark(self) -> "cuda.Event":
    """An event recorded on the legacy default stream, where kernels, copies and CUDA graphs run."""
    if not self.context.resident: self.context.enter()
    try:
      event = cuda.Event()
      event.record()
    finally:
      if not self.context.resident: self.context.leave()
    return event
  def profile_elapsed(self, start: "cuda.Event", end: "cuda.Event") -> float:
    end.synchronize()
    return start.time_till(end) * 1e-3   # milliseconds → seconds
  def capture_stream(self) -> int:
    """The handle of this GPU's capture stream (non-blocking, made on first use in its context)."""
    if self._capture_stream is None:
      self.context.enter()
      try: self._capture_stream = cuda.Stream(flags=STREAM_NON_BLOCKING)
      finally: self.context.leave()
    return self._capture_stream.handle
  def copy_from_peer(self, dst, src_device: Compiled, src, nbytes: int) -> bool:
    """Buffer.copy_from between two GPUs: peer to peer where they reach each other, else staged (peer.py)."""
    self.copy_between(self, dst, src_device, src, nbytes)   # type: ignore[arg-type]
    return True
  @staticmethod
  def copy_between(dst_device: CUDADevice, dst_handle, src_device: CUDADevice, src_handle, nbytes: int) -> None:
    """Copy nbytes from src_handle on src_device to dst_handle on dst_device, ordered after the work queued on both
    and before the work queued later on the destination (peer.py)."""
    from tgrad.runtime.cuda.peer import copy_between
    copy_between(dst_device, dst_handle, src_device, src_handle, nbytes)

def device_count() -> int:
  """How many GPUs the driver sees (starting it if needed)."""
  _start_driver()
  return cuda.Device.count()

def create_device(ordinal: int = DEFAULT_ORDINAL) -> Compiled:
  """The device of GPU `ordinal` (one per ordinal and process: a started one is returned again)."""
  if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
    raise ValueError(f"a GPU ordinal is an int >= 0, got {ordinal!r}")
  if (started := _DriverState.devices.get(ordinal)) is not None and started.context.context is not None:
    return started
  if ordinal >= (count := device_count()):
    raise ValueError(f"GPU {ordinal} does not exist: the driver sees {count} GPU(s) (ordinals 0 to {count - 1}; "
                     "check CUDA_VISIBLE_DEVICES)")
  return CUDADevice(ordinal)

def guest_context(name: str) -> Optional[CUDAContext]:
  """The context of the started device `name` ('CUDA', 'CUDA:1') if it is a guest, else None (resident, not started,
  or not a CUDA name): what graph.py makes current around that device's graphs."""
  _, _, index = name.partition(":")
  device = _DriverState.devices.get(int(index) if index.isdigit() else DEFAULT_ORDINAL)
  return None if device is None or device.context.resident else device.context

def is_usable() -> bool:
  """Whether a GPU is there, without creating a context (the device is started on first use). False in a child
  forked after the parent started the driver."""
  if _DriverState.forked_from_pid is not None: return False
  _start_driver()
  return cuda.Device.count() > 0
