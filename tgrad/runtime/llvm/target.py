"""The host's LLVM target and the rule for using LLVM from several threads.

`host_target_machine` makes a TargetMachine for this CPU with all its features (the large code model: below);
`llvm_lock` is held by whatever compiles IR, loads an object into an MCJIT engine or frees one (the kernels' runtime
and the core pool's native loops alike); `retired_engines` holds engines whose programs went away, freed by the next
holder of the lock.
"""
from __future__ import annotations
import os, threading
import llvmlite.binding as llvm

OPT_LEVEL = 3

# LLVM is used by one thread at a time: llvmlite releases the GIL in every LLVM call, and LLVM's shared state (the
# target registry, MCJIT's loader) is not documented as safe from several threads. (The finalize_object abort once
# suspected of that was a relocation overflow: CODE_MODEL below.) Compiling, loading an object into an engine and
# freeing an engine all hold this lock. An engine is freed only while it is held: a program that goes away (on
# whatever thread drops the last reference, a pool thread included) hands its engine to `retired_engines`, and the
# next compile or load frees them.
llvm_lock = threading.RLock()
retired_engines: list = []

def free_retired_engines() -> None:
  """Free the engines of programs that went away (with llvm_lock held)."""
  while retired_engines: retired_engines.pop()

def _new_llvm_lock() -> None:
  """In a forked child: a thread of the parent that held the lock is not there; the child starts with it free."""
  global llvm_lock
  llvm_lock = threading.RLock()

os.register_at_fork(after_in_child=_new_llvm_lock)

# The large code model: every address in the code is a 64-bit value. MCJIT maps an object's code and its constants
# (and the libm functions it calls) wherever mmap puts them; the small model's 32-bit PC-relative references then
# overflow when they land more than 2 GiB apart, which happens in a process with a large address space (a GPU driver
# loaded): RuntimeDyldELF's resolveX86_64Relocation aborts the process (isInt<32>(RealOffset)) in finalize_object.
CODE_MODEL = "large"

def host_target_machine(opt: int = OPT_LEVEL) -> llvm.TargetMachine:
  """A new TargetMachine for the host CPU (an MCJIT engine takes ownership of the one it is given); `opt` is its
  code generation level."""
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=opt, reloc="pic", codemodel=CODE_MODEL)
