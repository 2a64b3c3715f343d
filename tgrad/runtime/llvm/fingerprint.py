"""The LLVM device's hardware fingerprint (paths/fingerprint.py): the host CPU as LLVM compiles for it."""
from __future__ import annotations
import os, platform
from tgrad.helpers import cpu_model

def llvm_fingerprint() -> dict:
  """The host CPU as LLVM compiles for it: the model name, LLVM's name for it and the features it enables (which
  decide the vector code), the core count (THREAD opts) and llvmlite's version (it compiles every kernel)."""
  import llvmlite
  import llvmlite.binding as llvm
  features = sorted(name for name, enabled in llvm.get_host_cpu_features().items() if enabled)
  return {"device": "LLVM", "cpu_model": cpu_model(), "machine": platform.machine(),
          "llvm_cpu": llvm.get_host_cpu_name(), "cpu_features": ",".join(features), "cores": os.cpu_count() or 1,
          "llvmlite_version": llvmlite.__version__}
