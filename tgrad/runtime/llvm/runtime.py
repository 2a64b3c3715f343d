"""The LLVM (CPU) device: numpy-owned host memory, llvmlite compiling IR to native objects, ctypes launches.

Compiler: IR text → optimized (new pass manager, O3 with loop and SLP vectorization) → an object file for the
host CPU with all its features. Program: the object loaded into its own MCJIT engine; a THREAD launch calls the
function once per piece index on the calling thread and the core pool's workers, which claim pieces in native code
(cores.py). LLVM itself is only ever used by one thread at a time (target.llvm_lock: compiling, loading, and freeing
an engine, which waits for the next compile or load); a launch's callable keeps its program, and so its code, alive.
Memory is numpy bytes with their address (HostMemory); a buffer of HUGE_PAGE_MIN_BYTES or more is an anonymous
mapping of its own whose 2 MiB-aligned part is advised into transparent huge pages (`huge_page_bytes`); a view is a
slice with its address; `prepare` binds a launch's pointers once, for replaying it in a tight loop; `launcher` gives a
launch on handles with the function and thread count resolved once (an eager op's).
"""
from __future__ import annotations
import collections, ctypes, functools, hashlib, mmap, os, struct, sys, time
from typing import Callable
import numpy as np
import llvmlite
import llvmlite.binding as llvm
from tgrad.backend import device_name
from tgrad.device import Allocator, BinaryLoadError, Compiler, Compiled, OutOfMemoryError
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.runtime.llvm import target
from tgrad.runtime.llvm.cores import PieceLauncher, run_on_cores
from tgrad.runtime.llvm.target import CODE_MODEL, OPT_LEVEL, host_target_machine

BUFFER_ALIGNMENT = 64   # bytes: a cache line, and the widest vector load (AVX-512)
# Past these sizes (lines of IR, about one instruction each) compile time would grow quadratically: LLVM 22's loop
# vectorizer takes 0.7 s on a 2,000-instruction loop body and 5 s on 4,000; instruction scheduling and selection at
# -O1 and above take 2.7 s on 40,000 instructions and 9 s on 80,000 (fast selection at -O0: 0.25 s). Only very long
# fused chains get there (the test suite's largest kernel has under 3,000 lines); they lose the loop vectorizer, and
# the longest also get -O0 code generation, so a chain of 100,000 ops compiles in seconds.
LOOP_VECTORIZE_MAX_LINES = 4096
FAST_CODEGEN_MIN_LINES = 16384

# A buffer this big or bigger gets memory of its own, advised into transparent huge pages (where the kernel allows
# it: /sys/kernel/mm/transparent_hugepage/enabled reads `madvise` or `always`). A streaming kernel then crosses a page
# boundary every 2 MiB instead of every 4 KiB: the hardware prefetchers, which stop at a page's end, keep running and
# the TLB stops missing. Measured on this project's 2-core AMD EPYC (Zen 4) VM, a two-thread AVX-512 sum of 64 MiB,
# three buffers of each kind interleaved in one process: 2.0-2.1 ms on huge pages, 2.2-3.1 ms on 4 KiB pages. numpy's
# own advice does not take here (its blocks come back without the huge-page flag), and the mapping must be private:
# shared anonymous memory is shmem, which the kernel does not back with transparent huge pages.
HUGE_PAGE_BYTES = 2 << 20
HUGE_PAGE_MIN_BYTES = 2 << 20
HUGE_PAGES = hasattr(mmap, "MADV_HUGEPAGE")

def huge_page_bytes(nbytes: int) -> tuple[np.ndarray, int]:
  """`nbytes` of fresh zeroed memory in an anonymous mapping, starting on a 2 MiB boundary, its whole huge pages
  advised huge (the tail past the last whole one stays in small pages): the bytes and their address. The mapping is
  unmapped when the last view of the bytes goes."""
  mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE)
  whole = np.frombuffer(mapping, dtype=np.uint8)
  start = (-whole.ctypes.data) % HUGE_PAGE_BYTES
  if (huge := nbytes - nbytes % HUGE_PAGE_BYTES): mapping.madvise(mmap.MADV_HUGEPAGE, start, huge)
  return whole[start:start + nbytes], whole.ctypes.data + start

# Freed huge-page blocks are kept for reuse by size, up to this many bytes in all (past it, the blocks of the size
# freed least recently go back first, so a program whose sizes change does not keep its old ones): an op that makes a
# 16 MiB output every call then reuses warm pages. Mapped anew, each call would zero-fault them again (glibc's malloc,
# which numpy's blocks come from, keeps such blocks in its heap for the same reason): a 2048² softmax fell from 1.45x
# torch to 0.71x.
HUGE_POOL_MAX_BYTES = 256 << 20

# Freed blocks up to this size are kept for reuse by size (an eager op allocates its output every time), up to
# POOL_MAX_BYTES in all; bigger blocks go back to numpy at once.
POOL_MAX_BLOCK = 1 << 20
POOL_MAX_BYTES = 64 << 20

class HostMemory:
  """An LLVM buffer's memory: numpy bytes and their address, read once (numpy's `.ctypes.data` costs microseconds),
  and that address as the ctypes argument a launch passes (made once: converting an int per launch is what makes a
  ctypes call with declared argument types slow)."""
  __slots__ = ("array", "address", "pointer")
  def __init__(self, array: np.ndarray, address: int):
    self.array, self.address, self.pointer = array, address, ctypes.c_void_p(address)

class LLVMAllocator(Allocator):
  def __init__(self):
    self.pool: dict[int, list[HostMemory]] = collections.defaultdict(list)
    self.pooled_bytes = 0
    # freed huge-page blocks by size, the size freed least recently first: past HUGE_POOL_MAX_BYTES the oldest go
    self.huge_pool: collections.OrderedDict[int, list[HostMemory]] = collections.OrderedDict()
    self.huge_pooled_bytes = 0
  def alloc(self, nbytes: int) -> HostMemory:
    huge = HUGE_PAGES and nbytes >= HUGE_PAGE_MIN_BYTES
    if huge and (blocks := self.huge_pool.get(nbytes)):
      self.huge_pooled_bytes -= nbytes
      handle = blocks.pop()
      if not blocks: del self.huge_pool[nbytes]
      return handle
    if not huge and (blocks := self.pool.get(nbytes)):
      self.pooled_bytes -= nbytes
      return blocks.pop()
    if huge:
      try: return HostMemory(*huge_page_bytes(nbytes))
      except (MemoryError, OSError):   # the kept blocks go back to the system, then one more try
        self.drop_huge_pool()
        try: return HostMemory(*huge_page_bytes(nbytes))
        except (MemoryError, OSError) as error:   # mmap's ENOMEM, said as the device's out-of-memory error
          raise OutOfMemoryError("LLVM", nbytes, available_host_memory(), "an allocation") from error
    raw = np.empty(nbytes + BUFFER_ALIGNMENT, dtype=np.uint8)
    address = raw.ctypes.data
    start = (-address) % BUFFER_ALIGNMENT
    return HostMemory(raw[start:start + nbytes], address + start)
  def free(self, handle: HostMemory, nbytes: int) -> None:
    if HUGE_PAGES and nbytes >= HUGE_PAGE_MIN_BYTES:
      if nbytes > HUGE_POOL_MAX_BYTES: return
      while self.huge_pooled_bytes + nbytes > HUGE_POOL_MAX_BYTES:   # the size freed least recently gives a block
        oldest, blocks = next(iter(self.huge_pool.items()))
        blocks.pop(0)
        if not blocks: del self.huge_pool[oldest]
        self.huge_pooled_bytes -= oldest
      self.huge_pool.setdefault(nbytes, []).append(handle)
      self.huge_pool.move_to_end(nbytes)
      self.huge_pooled_bytes += nbytes
    elif nbytes <= POOL_MAX_BLOCK and self.pooled_bytes + nbytes <= POOL_MAX_BYTES:
      self.pool[nbytes].append(handle)
      self.pooled_bytes += nbytes
  def drop_huge_pool(self) -> None:
    """Give the kept huge-page blocks back to the system (their mappings go with their last view)."""
    self.huge_pool.clear()
    self.huge_pooled_bytes = 0
  def copyin(self, handle: HostMemory, src: memoryview) -> None:
    handle.array[:len(src)] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dst: memoryview, handle: HostMemory) -> None:
    if dst.ndim == 1 and dst.format == "B": dst[:] = handle.array[:len(dst)]   # bytes to bytes: a copy in C
    else: np.frombuffer(dst, dtype=np.uint8)[:] = handle.array[:dst.nbytes]
  def view(self, handle: HostMemory, offset: int, nbytes: int) -> HostMemory:
    return HostMemory(handle.array[offset:offset + nbytes], handle.address + offset)
  def available(self) -> int: return available_host_memory()
  def peer_copy(self, dst: HostMemory, src: HostMemory, nbytes: int) -> bool:
    """Every LLVM device is the host CPU: a copy between two of them is a memcpy."""
    dst.array[:nbytes] = src.array[:nbytes]
    return True

def available_host_memory() -> int:
  """Bytes of host memory that can still be allocated: MemAvailable from /proc/meminfo (free memory plus what the
  kernel can reclaim), else the free pages that sysconf reports."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"): return int(line.split()[1]) * 1024
  except OSError: pass
  return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

class LLVMCompiler(Compiler):
  def __init__(self):
    with target.llvm_lock:
      features = hashlib.sha256(llvm.get_host_cpu_features().flatten().encode()).hexdigest()[:16]
      self.target_machine = host_target_machine()
    self.fast_target_machine: llvm.TargetMachine | None = None   # -O0 code generation, for huge kernels
    self.cache_key = f"llvm-{llvmlite.__version__}-{llvm.get_host_cpu_name()}-{features}-O{OPT_LEVEL}-{CODE_MODEL}"
  def compile(self, src: str) -> bytes:
    with target.llvm_lock: return self._compile(src)
  def _compile(self, src: str) -> bytes:
    lines = src.count("\n")
    tm = self.target_machine
    if lines >= FAST_CODEGEN_MIN_LINES:
      if self.fast_target_machine is None: self.fast_target_machine = host_target_machine(opt=0)
      tm = self.fast_target_machine
    module = llvm.parse_assembly(src)
    module.triple = llvm.get_process_triple()
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    tuning.loop_vectorization = lines <= LOOP_VECTORIZE_MAX_LINES
    tuning.slp_vectorization = True
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(module, builder)
    return tm.emit_object(module)

# The ELF64 fields check_object reads (System V gABI): the file header, section headers, symbols and relocations.
ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")   # ident, type, machine, version, entry, phoff, shoff, flags, ehsize,
                                                 # phentsize, phnum, shentsize, shnum, shstrndx
ELF_SECTION = struct.Struct("<IIQQQQIIQQ")        # name, type, flags, addr, offset, size, link, info, align, entsize
ELF_SYMBOL = struct.Struct("<IBBHQQ")             # name, info, other, shndx, value, size
ELF_RELA = struct.Struct("<QQq")                  # offset, info (symbol << 32 | type), addend
ELF_MAGIC_64_LE = b"\x7fELF\x02\x01"             # ELF, 64-bit, little endian
ET_REL, SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHN_LORESERVE = 1, 2, 4, 8, 0xff00

def check_object(binary: bytes) -> None:
  """Raise BinaryLoadError unless `binary` is a well-formed relocatable ELF64 object: every section, symbol and
  relocation inside the file and pointing at sections and symbols that exist. llvmlite hands any bytes to LLVM's
  loader, which aborts or crashes the process on a malformed object instead of raising."""
  if len(binary) < ELF_HEADER.size or not binary.startswith(ELF_MAGIC_64_LE):
    raise BinaryLoadError(f"not a 64-bit little-endian ELF object ({len(binary)} bytes, starting {binary[:8]!r})")
  header = ELF_HEADER.unpack_from(binary)
  kind, section_table, section_size, sections, names = header[1], header[6], header[11], header[12], header[13]
  if kind != ET_REL or section_size != ELF_SECTION.size or names >= sections or \
     section_table + sections * ELF_SECTION.size > len(binary):
    raise BinaryLoadError(f"malformed ELF header: type {kind}, {sections} sections of {section_size} bytes at "
                          f"{section_table}, names in section {names}, file of {len(binary)} bytes")
  table = [ELF_SECTION.unpack_from(binary, section_table + i * ELF_SECTION.size) for i in range(sections)]
  for index, (_, section_type, _, _, offset, size, link, info, _, entry_size) in enumerate(table):
    if section_type != SHT_NOBITS and offset + size > len(binary):
      raise BinaryLoadError(f"ELF section {index} ({size} bytes at {offset}) runs past the file ({len(binary)} bytes)")
    if link >= sections: raise BinaryLoadError(f"ELF section {index} links to section {link} of {sections}")
    if section_type == SHT_SYMTAB:
      for start in range(offset, offset + size - ELF_SYMBOL.size + 1, ELF_SYMBOL.size):
        if sections <= (shndx := ELF_SYMBOL.unpack_from(binary, start)[3]) < SHN_LORESERVE:
          raise BinaryLoadError(f"ELF symbol at {start} is in section {shndx} of {sections}")
    if section_type == SHT_RELA:
      symbols = table[link][5] // ELF_SYMBOL.size
      if info >= sections or entry_size != ELF_RELA.size:
        raise BinaryLoadError(f"ELF relocations {index} apply to section {info} of {sections}, entries of {entry_size}")
      for start in range(offset, offset + size - ELF_RELA.size + 1, ELF_RELA.size):
        if (symbol := ELF_RELA.unpack_from(binary, start)[1] >> 32) >= symbols:
          raise BinaryLoadError(f"ELF relocation at {start} names symbol {symbol} of {symbols}")

class _EngineKeeper:
  """Keeps an MCJIT engine (and so the code of its functions) alive; when it goes, the engine is retired, to be freed
  under llvm_lock (at interpreter exit the module may be gone already: the process frees everything then)."""
  __slots__ = ("engine",)
  def __init__(self, engine): self.engine = engine
  def __del__(self):
    if (retired := getattr(target, "retired_engines", None)) is not None: retired.append(self.engine)

class LLVMProgram:
  """A loaded kernel. Call with buffers (numpy handles) and global_size=(threads,)."""
  def __init__(self, name: str, binary: bytes):
    self.name = name
    if sys.platform.startswith("linux"): check_object(binary)   # the host's objects are ELF there
    with target.llvm_lock:
      target.free_retired_engines()
      keeper = _EngineKeeper(llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_target_machine()))
      keeper.engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
      keeper.engine.finalize_object()
      self.address = keeper.engine.get_function_address(name)
    if not self.address: raise BinaryLoadError(f"kernel {name} not found in its object file")
    # no declared argument types: a launch passes ready ctypes arguments (`_arguments`) and a Python int for the core
    # index (an int without a declared type goes as a C int, the kernel's i32). Declared types would convert every
    # argument on every call, which is most of the cost of launching a small kernel.
    self.fn = ctypes.CFUNCTYPE(None)(self.address)
    self.fn.code = keeper   # whatever holds the function (a launcher, a prepared launch) keeps its code alive
  def __call__(self, *buffers: HostMemory, global_size=(1,), local_size=None, vals=(), wait: bool = False):
    arguments = _arguments(buffers, vals)
    threads = global_size[0] if global_size else 1
    start = time.perf_counter() if wait else 0.0
    if threads <= 1: self.fn(*arguments, 0)
    else: run_on_cores(self.fn, arguments, threads)
    return time.perf_counter() - start if wait else None
  def launcher(self, arguments: int, variables: int, global_size=(1,), local_size=None) -> Callable:
    """`launch(handles, vals)` on `arguments` HostMemory handles and `variables` values: __call__ without its keyword
    arguments and per-call thread-count lookups."""
    fn = self.fn
    threads = global_size[0] if global_size else 1
    def launch(handles, vals) -> None:   # on the calling thread alone: `_arguments` inline, a loop (not a
      pointers = []                      # comprehension, a call of its own)
      for h in handles: pointers.append(h.pointer)
      for value in vals: pointers.append(ctypes.c_int64(value))
      pointers.append(0)   # core 0
      fn(*pointers)
    if threads > 1:   # the kernel's address and thunk resolved here, not at every launch
      pieces = PieceLauncher(fn, arguments + variables, threads)
      def launch_on_cores(handles, vals) -> None:
        pointers = []
        for h in handles: pointers.append(h.address)
        pointers.extend(vals)
        pieces(pointers)
      return launch_on_cores
    # the usual eager kernels (a unary or binary op, a where: 2 to 4 buffers, no variable) pass their pointers
    # straight, with no argument list built per launch
    if variables == 0 and arguments == 2:
      def launch_2(handles, vals) -> None: fn(handles[0].pointer, handles[1].pointer, 0)
      return launch_2
    if variables == 0 and arguments == 3:
      def launch_3(handles, vals) -> None: fn(handles[0].pointer, handles[1].pointer, handles[2].pointer, 0)
      return launch_3
    if variables == 0 and arguments == 4:
      def launch_4(handles, vals) -> None:
        fn(handles[0].pointer, handles[1].pointer, handles[2].pointer, handles[3].pointer, 0)
      return launch_4
    return launch
  def prepare(self, buffers, global_size=(1,), local_size=None, vals=()) -> Callable[[], None]:
    """A no-argument callable that launches this kernel on these buffers: the arguments are made once, here."""
    arguments = _arguments(buffers, vals)
    threads = global_size[0] if global_size else 1
    if threads <= 1: return functools.partial(self.fn, *arguments, 0)
    return PieceLauncher(self.fn, len(arguments), threads).prepared(arguments)

def _arguments(handles, vals) -> list:
  """A launch's ctypes arguments but the core index: the handles' pointers, then the variables' values as int64."""
  arguments = []
  for h in handles: arguments.append(h.pointer)
  for value in vals: arguments.append(ctypes.c_int64(value))
  return arguments

def create_device(index: int = 0) -> Compiled:
  """LLVM device `index`: every index is the same host CPU, with an allocator of its own (so its buffers are distinct
  from every other index's)."""
  return Compiled(device_name("LLVM", index), LLVMAllocator(), LLVMCompiler(), LLVMRenderer(), LLVMProgram,
                  arch=llvm.get_host_cpu_name())
