"""The LLVM (CPU) device: numpy-owned host memory, llvmlite compiling IR to native objects, ctypes launches.

Compiler: IR text → optimized (new pass manager, O3 with loop and SLP vectorization) → an object file for the
host CPU with all its features. Program: the object loaded into its own MCJIT engine; a THREAD launch calls the
function once per core index from a thread pool (ctypes releases the GIL, so the calls run in parallel).
"""
from __future__ import annotations
import ctypes, functools, hashlib, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import llvmlite
import llvmlite.binding as llvm
from tgrad.device import Allocator, Compiler, Compiled
from tgrad.codegen.llvmir import LLVMRenderer
from tgrad.helpers import cpu_count

BUFFER_ALIGNMENT = 64   # bytes: a cache line, and the widest vector load (AVX-512)
OPT_LEVEL = 3
# Past these sizes (lines of IR, about one instruction each) compile time would grow quadratically: LLVM 22's loop
# vectorizer takes 0.7 s on a 2,000-instruction loop body and 5 s on 4,000; instruction scheduling and selection at
# -O1 and above take 2.7 s on 40,000 instructions and 9 s on 80,000 (fast selection at -O0: 0.25 s). Only very long
# fused chains get there (the test suite's largest kernel has under 3,000 lines); they lose the loop vectorizer, and
# the longest also get -O0 code generation, so a chain of 100,000 ops compiles in seconds.
LOOP_VECTORIZE_MAX_LINES = 4096
FAST_CODEGEN_MIN_LINES = 16384

class LLVMAllocator(Allocator):
  def alloc(self, nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + BUFFER_ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % BUFFER_ALIGNMENT
    return raw[start:start + nbytes]
  def copyin(self, handle: np.ndarray, src: memoryview) -> None: handle[:len(src)] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dst: memoryview, handle: np.ndarray) -> None:
    np.frombuffer(dst, dtype=np.uint8)[:] = handle[:len(dst)]

def host_target_machine(opt: int = OPT_LEVEL) -> llvm.TargetMachine:
  """A new TargetMachine for the host CPU (an MCJIT engine takes ownership of the one it is given); `opt` is its
  code generation level."""
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=opt, reloc="pic", codemodel="default")

class LLVMCompiler(Compiler):
  def __init__(self):
    features = hashlib.sha256(llvm.get_host_cpu_features().flatten().encode()).hexdigest()[:16]
    self.target_machine = host_target_machine()
    self.fast_target_machine: llvm.TargetMachine | None = None   # -O0 code generation, for huge kernels
    self.cache_key = f"llvm-{llvmlite.__version__}-{llvm.get_host_cpu_name()}-{features}-O{OPT_LEVEL}"
  def compile(self, src: str) -> bytes:
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

@functools.cache
def _thread_pool() -> ThreadPoolExecutor:
  return ThreadPoolExecutor(max_workers=cpu_count())

class LLVMProgram:
  """A loaded kernel. Call with buffers (numpy handles) and global_size=(threads,)."""
  def __init__(self, name: str, binary: bytes):
    self.name = name
    self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_target_machine())
    self.engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
    self.engine.finalize_object()
    self.address = self.engine.get_function_address(name)
    if not self.address: raise RuntimeError(f"kernel {name} not found in its object file")
    self.fn = None
  def __call__(self, *buffers: np.ndarray, global_size=(1,), local_size=None, vals=(), wait: bool = False):
    if self.fn is None:
      self.fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(buffers)), ctypes.c_int32)(self.address)
    pointers = [b.ctypes.data for b in buffers]
    threads = global_size[0] if global_size else 1
    start = time.perf_counter()
    if threads <= 1: self.fn(*pointers, 0)
    else: list(_thread_pool().map(lambda core: self.fn(*pointers, core), range(threads)))
    return time.perf_counter() - start if wait else None

def create_device() -> Compiled:
  return Compiled("LLVM", LLVMAllocator(), LLVMCompiler(), LLVMRenderer(), LLVMProgram)
