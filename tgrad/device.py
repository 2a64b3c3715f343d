"""Devices and buffers: the contract every backend implements, and the started devices.

A backend (a package tgrad/runtime/<name>/, registered in tgrad/backend.py) provides a `Compiled` device: an
`Allocator` (alloc, free, copyin, copyout, and view: a window of an allocation), a `Compiler` (source → bytes), a
`Program` factory (bytes → callable on buffers, with `prepare` for a launch whose arguments are fixed), a renderer that
turns linear UOps into its source, and how much memory it can still give. `Buffer` is one device allocation (or a view
of one) with a dtype and element count. `Device[name]` starts device `name` once (one per kind and index: 'LLVM:1' is
a device of its own, with its own allocator); `canonical_device` resolves a device's spellings ('cpu:0' → 'LLVM');
`DEVICE_TRAITS[name]` is what graph building may know of a device without starting it.
"""
from __future__ import annotations
import functools, os, time
from typing import Any, Callable, Optional
import numpy as np
from tgrad.backend import HOST_DEVICE, INDEX_SEPARATOR, DeviceTraits, backend, backend_name, device_index, \
  device_kind, device_name, device_spellings, known_devices, on_registry_change, preferred_devices
from tgrad.dtype import DType
from tgrad.helpers import Context
from tgrad import profiler

class DeviceUnavailable(RuntimeError):
  """A device that can't start: the message says why, and what to install or check."""

class _TraitsByDevice:
  """`DEVICE_TRAITS[name]`: a registered device's traits, read without starting it."""
  def __getitem__(self, name: str) -> DeviceTraits: return backend(canonical_device(name)).traits

DEVICE_TRAITS = _TraitsByDevice()

class OutOfMemoryError(MemoryError):
  """A device cannot give the bytes asked for; the message names the device, the bytes needed and those available."""
  def __init__(self, device: str, needed: int, available: int, what: str = ""):
    self.device, self.needed, self.available = device, needed, available
    super().__init__(f"{device}: {what or 'allocation'} needs {needed} bytes ({needed / 2**20:.1f} MiB), only "
                     f"{available} bytes ({available / 2**20:.1f} MiB) are available")

# Names already resolved: every op's device goes through canonical_device. Forgotten when a backend is (un)registered.
_canonical_names: dict[str, str] = {}
MAX_DEVICE_NAMES = 1024   # bounds the memo of spellings ('cuda:0', 'Cpu', ...) a program may use
on_registry_change(_canonical_names.clear)

def canonical_device(name: Optional[str]) -> str:
  """'cuda:0' → 'CUDA', 'cpu' → 'LLVM', 'llvm:1' → 'LLVM:1', None → the default device. Index 0 is spelled as the bare
  kind. Unknown names and indices that are not non-negative integers raise ValueError."""
  if name is None: return Device.default()
  if type(name) is str and (known := _canonical_names.get(name)) is not None: return known
  if not isinstance(name, str): raise TypeError(f"device must be a str such as {HOST_DEVICE!r}, got {name!r}")
  kind, separator, index = name.partition(INDEX_SEPARATOR)
  base = backend_name(kind)
  if base is None: raise ValueError(f"unknown device {name!r}; known: {', '.join(known_devices())}")
  if separator and not (index.isascii() and index.isdigit()):
    raise ValueError(f"device {name!r}: the index after {INDEX_SEPARATOR!r} must be a non-negative integer")
  canonical = device_name(base, int(index) if separator else 0)
  if type(name) is str and len(_canonical_names) < MAX_DEVICE_NAMES: _canonical_names[name] = canonical
  return canonical

class PendingRead:
  """A device→host copy that may still be in flight: `wait()` blocks until it is done and returns the bytes (a uint8
  array the caller owns). A device whose copies are synchronous makes one that is already done."""
  def __init__(self, data: Optional[np.ndarray] = None, finish: Optional[Callable[[], np.ndarray]] = None):
    self._data, self._finish = data, finish
  def wait(self) -> np.ndarray:
    if self._data is None:
      assert self._finish is not None
      self._data, self._finish = self._finish(), None
    return self._data

class Allocator:
  """alloc(nbytes) → opaque handle; free(handle); copyin(handle, host bytes view); copyout(host view, handle);
  view(handle, offset, nbytes) → a handle for `nbytes` bytes at byte `offset` of an allocation (not freed by itself:
  it lives as long as the allocation); available() → bytes the device can still allocate.
  Stream-ordered copies, for a host loop that keeps the device busy: `copyin_async` writes after the device work
  queued so far and before any queued later, and returns at once (the source may be reused: it is staged);
  `copyout_async` reads the value the queued work leaves and returns a PendingRead. On a device whose work runs
  synchronously they are copyin and copyout."""
  def alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def free(self, handle: Any, nbytes: int) -> None: pass
  def copyin(self, handle: Any, src: memoryview) -> None: raise NotImplementedError
  def copyout(self, dst: memoryview, handle: Any) -> None: raise NotImplementedError
  def copyin_async(self, handle: Any, src: memoryview) -> None: self.copyin(handle, src)
  def copyout_async(self, handle: Any, nbytes: int) -> PendingRead:
    out = np.empty(nbytes, dtype=np.uint8)
    self.copyout(memoryview(out), handle)
    return PendingRead(out)
  def view(self, handle: Any, offset: int, nbytes: int) -> Any: raise NotImplementedError
  def available(self) -> int: raise NotImplementedError
  def peer_copy(self, dst: Any, src: Any, nbytes: int) -> bool:
    """Copy `nbytes` from `src`, an allocation of another device of this kind, into `dst` (an allocation of this
    one) without staging through host memory, and say whether it did: False (the default) means this kind has no
    direct path, and the caller stages the copy through host bytes. CPU devices copy memory to memory; a GPU
    backend copies peer to peer where the GPUs allow it."""
    return False

class CompileError(Exception):
  """A compiler rejected a kernel's source; the message holds the numbered source and the compiler's log."""

class BinaryLoadError(Exception):
  """A runtime rejected a binary (malformed, or not for this device): raised by a Program factory before it runs any of
  the binary's code, so the caller can drop a cached binary and compile again."""

class Compiler:
  """Source text → binary bytes. `cache_key` names the target and flags; compiled bytes are cached on disk."""
  cache_key: str = ""
  def compile(self, src: str) -> bytes: raise NotImplementedError
  def compile_cached(self, src: str) -> bytes:
    from tgrad.cache import get_cache
    cache = get_cache()
    if (binary := cache.get_binary(src, self.cache_key)) is not None: return binary
    binary = self.compile(src)
    cache.put_binary(src, self.cache_key, binary)
    return binary

class Compiled:
  """One device: its allocator, compiler, renderer and program loader, plus its limits. `arch` names the processor
  its timings belong to (the GPU architecture, the host CPU's name), part of the search cache key."""
  def __init__(self, name: str, allocator: Allocator, compiler: Compiler, renderer: Any,
               program: Callable[[str, bytes], Callable], arch: str = ""):
    self.name, self.allocator, self.compiler, self.renderer, self.program = name, allocator, compiler, renderer, program
    self.arch = arch
  def synchronize(self) -> None: pass
  def profile_mark(self) -> Any:
    """A point in this device's queue of work, for the profiler. A device whose launches return when their work is
    done marks with the host clock; a device with a queue (CUDA) records an event in it."""
    return time.perf_counter()
  def profile_elapsed(self, start: Any, end: Any) -> float:
    """Seconds of device time from mark `start` to mark `end` (waiting until `end` is reached)."""
    return end - start
  def copy_from_peer(self, dst: Any, src_device: Compiled, src: Any, nbytes: int) -> bool:
    """Copy `nbytes` from allocation `src` of `src_device` (another device of this kind) into allocation `dst` of this
    one without staging through host memory, and say whether it did (Allocator.peer_copy by default; a device whose
    copies need both devices' queues overrides this)."""
    return self.allocator.peer_copy(dst, src, nbytes)
  def available_memory(self) -> int:
    """Bytes this device can still allocate (host memory on a CPU device, free GPU memory on a GPU)."""
    return self.allocator.available()
  def load_program(self, name: str, src: str) -> Callable:
    """The program `name` of `src`, from its cached binary; a cached binary the runtime rejects (BinaryLoadError) is
    dropped from the cache with a warning and compiled afresh."""
    try: return self.program(name, self.compiler.compile_cached(src))
    except BinaryLoadError as error:
      from tgrad.cache import get_cache
      get_cache().drop_binary(src, self.compiler.cache_key, f"rejected by the {self.name} loader: {error}")
    return self.program(name, self.compiler.compile_cached(src))

_buffers_created = 0

def newest_buffer_serial() -> int:
  """The serial of the newest Buffer (0 before any): a Buffer made later has a higher one."""
  return _buffers_created

class Buffer:
  """`size` elements of `dtype` on `device`; memory is allocated on first use (`handle`). With `base`, the Buffer is
  a view of `base`'s memory starting `offset` bytes in (nothing is allocated or freed for it). With `initial`, host
  bytes are copied in when the memory is allocated (a value that exists without any kernel or copy being scheduled).
  `serial` numbers Buffers in creation order; `newest_buffer_serial()` is the newest serial. A Buffer of a symbolic
  size is allocated at its maximum; `symbolic_size` (set by the scheduler) is its size in the variables. With
  `allocator` (`allocators[device]`, the device's own) a Buffer of its own memory is allocated at once."""
  symbolic_size: Any
  holders: Optional[list]   # weak references to the lazy values that hold this Buffer (kept by tgrad/lazy.py)
  def __init__(self, device: str, size: int, dtype: DType, base: Optional[Buffer] = None, offset: int = 0,
               initial: Optional[np.ndarray] = None, allocator: Optional[Allocator] = None):
    self.device, self.size, self.dtype = device, size, dtype
    self.nbytes: int = size * dtype.itemsize   # read on every allocation and free: an attribute, not a property
    self.base, self.offset, self.initial = base, offset, initial
    self.symbolic_size = self.holders = None   # written here (not class defaults): read by specialized instructions
    if base is not None and (offset < 0 or offset + self.nbytes > base.nbytes or base.device != device):
      raise ValueError(f"a view of {self.nbytes} bytes at offset {offset} does not fit {base}")
    global _buffers_created   # a module counter: writing a class attribute would void every Buffer's attribute caches
    _buffers_created += 1
    self.serial = _buffers_created
    self.writes = 0   # of the memory's owner (`version`): bumped by every write that goes through tgrad
    self._handle: Any = None
    if allocator is not None and base is None and initial is None:   # allocated now (what `handle` does on first use),
      self._allocator = allocator                                    # for a launch that writes it at once
      self._handle = allocator.alloc(self.nbytes or 1)
      if profiler.ENABLED: profiler.buffer_allocated(self)
  @property
  def handle(self) -> Any:
    if self._handle is None:
      if (allocator := allocators.get(self.device)) is None:
        allocator = allocators[self.device] = Device[self.device].allocator
      self._allocator = allocator   # kept for __del__: no lookup there
      if self.base is not None: self._handle = allocator.view(self.base.handle, self.offset, max(self.nbytes, 1))
      else:
        self._handle = allocator.alloc(self.nbytes or 1)   # an empty buffer gets one byte
        if profiler.ENABLED: profiler.buffer_allocated(self)
      if self.initial is not None:
        initial, self.initial = self.initial, None
        self.copyin(initial)
    return self._handle
  @property
  def is_allocated(self) -> bool: return self._handle is not None
  @property
  def version(self) -> int:
    """How many times this buffer's memory was written (copies in, and the launches that list it as an output: run,
    ExecItem.run, TinyJit replays): a copy made from its data is current while this is unchanged. A view counts
    the writes of its base's memory, through any view."""
    return self._owner().writes
  def wrote(self) -> None:
    """Note a write of this buffer's memory (see `version`)."""
    owner = self   # _owner, inline: every launch notes its outputs' writes
    while owner.base is not None: owner = owner.base
    owner.writes += 1
  def _owner(self) -> Buffer:
    owner = self
    while owner.base is not None: owner = owner.base
    return owner
  def __del__(self):
    if self._handle is not None and self.base is None:
      try:
        self._allocator.free(self._handle, self.nbytes or 1)
        if profiler.ENABLED: profiler.buffer_freed(self)
      except Exception: pass   # interpreter shutdown
  def _bytes_of(self, data: np.ndarray) -> memoryview:
    """data's bytes for a copy into this buffer (checked to be exactly its size)."""
    data = np.ascontiguousarray(data)
    if data.nbytes != self.nbytes: raise ValueError(f"copyin of {data.nbytes} bytes into a {self.nbytes}-byte buffer")
    return memoryview(data.reshape(-1).view(np.uint8))
  def copyin(self, data: np.ndarray) -> Buffer:
    Device[self.device].allocator.copyin(self.handle, self._bytes_of(data))
    self.wrote()
    return self
  def copy_from(self, src: Buffer) -> Buffer:
    """Copy all of `src` (same size and dtype, any device) into this buffer: directly when both are devices of one
    kind and it has a direct path (Compiled.copy_from_peer), else through host memory."""
    if src.nbytes != self.nbytes: raise ValueError(f"copy of {src} into {self}: sizes differ")
    if not self.nbytes: return self
    if device_kind(src.device) == device_kind(self.device) and \
       Device[self.device].copy_from_peer(self.handle, Device[src.device], src.handle, self.nbytes):
      self.wrote()
      return self
    return self.copyin(src.copyout())
  def copyout(self) -> np.ndarray:
    out = np.empty(self.size, dtype=self.dtype.np)
    if self.size:
      handle = self.handle   # allocated now: its allocator is kept beside it
      self._allocator.copyout(memoryview(out).cast("B"), handle)   # its bytes, without a numpy view
    return out
  def copyin_async(self, data: np.ndarray) -> Buffer:
    """copyin ordered with the device's queued work, returning before it lands (Allocator.copyin_async)."""
    Device[self.device].allocator.copyin_async(self.handle, self._bytes_of(data))
    self.wrote()
    return self
  def copyout_async(self) -> PendingRead:
    """The value the device's queued work leaves here, read without waiting: `.wait()` gives the array (of the
    buffer's dtype)."""
    raw = Device[self.device].allocator.copyout_async(self.handle, self.nbytes)
    dtype = self.dtype.np
    return PendingRead(finish=lambda: raw.wait().view(dtype))
  def __repr__(self):
    where = f" view at {self.offset} of {self.base!r}" if self.base is not None else ""
    return f"<Buffer {self.device} {self.size} {self.dtype}{where}>"

class _DeviceRegistry:
  """`Device["LLVM:1"]` starts device 1 of the registered backend LLVM once (tgrad/backend.py) and returns its Compiled
  device; every spelling of one device ('cpu', 'LLVM', 'llvm:0') gives the same one."""
  @functools.cache
  def __getitem__(self, name: str) -> Compiled: return self._started(canonical_device(name))
  @functools.cache
  def _started(self, name: str) -> Compiled:
    found, index = backend(name), device_index(name)
    try: return found.start(index) if index else found.start()
    except ImportError as error:
      package = (error.name or "").split(".")[0]
      if package == "tgrad": raise   # a bug in tgrad, not a missing package
      raise DeviceUnavailable(f"device {name} needs the Python package {package or error}, which is not "
                              f"installed: {found.install}") from error
    except Exception as error:
      raise DeviceUnavailable(f"device {name} can't start: {found.start_failure} "
                              f"({type(error).__name__}: {error})") from error
  @functools.cache
  def available(self, name: str) -> bool:
    """Whether the device can be used; a backend's `is_usable()` answers without starting the device."""
    try:
      found, index = backend(canonical_device(name)), device_index(canonical_device(name))
      if found.is_usable is not None and not found.is_usable(): return False
      if found.is_usable is not None and index == 0: return True
      self[name]
      return True
    except Exception:
      return False
  def forget(self) -> None:
    """Drop the started devices and availability answers (a backend was registered or unregistered, or a forked
    child can't use its parent's devices)."""
    type(self).__getitem__.cache_clear()
    type(self)._started.cache_clear()
    type(self).available.cache_clear()
    allocators.clear()
  def default(self) -> str:
    """DEVICE if set (an unknown name raises ValueError naming it), else the first usable preferred device (a
    backend's default_priority: CUDA), else the host device (LLVM)."""
    if (chosen := Context.DEVICE or os.environ.get("DEVICE", "").strip()):
      try: return canonical_device(chosen)
      except ValueError:
        raise ValueError(f"DEVICE={chosen!r} is not a device; allowed: {', '.join(device_spellings())} (any case, "
                         f"optionally with ':N'), or unset for the first usable of "
                         f"{', '.join(preferred_devices() + [HOST_DEVICE])}") from None
    return next((name for name in preferred_devices() if self.available(name)), HOST_DEVICE)

Device = _DeviceRegistry()
# each started device's allocator by the name a Buffer holds: a Buffer's first use reads it with one dict lookup (the
# registry's cached lookup makes a bound method and a key per call); forgotten with the started devices
allocators: dict[str, Allocator] = {}
on_registry_change(Device.forget)
