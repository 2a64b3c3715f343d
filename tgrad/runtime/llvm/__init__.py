"""The LLVM device (the host CPU), registered here: renderer.py writes LLVM IR, runtime.py compiles it with llvmlite
and runs it on numpy-owned host memory across the cores, fingerprint.py describes the CPU. This file imports none of
them; the device starts on first use.
"""
from tgrad.backend import Backend, DeviceTraits, register_backend

def _start(index: int = 0):
  from tgrad.runtime.llvm.runtime import create_device
  return create_device(index)

def _fingerprint() -> dict:
  from tgrad.runtime.llvm.fingerprint import llvm_fingerprint
  return llvm_fingerprint()

LLVM = register_backend(Backend("LLVM", _start, DeviceTraits(has_local=False), aliases=("CPU",),
                                fingerprint=_fingerprint, languages=("llvm",)))
