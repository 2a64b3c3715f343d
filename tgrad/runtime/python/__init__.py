"""The PYTHON device (DEVICE=PYTHON), registered here: renderer.py writes each kernel as a Python function, runtime.py
runs it on numpy byte arrays through the ops' written semantics (exec_alu). A slow, exact reference, and the smallest
example of a device package: nothing outside this folder names it.
"""
from tgrad.backend import Backend, DeviceTraits, register_backend

def _start():
  from tgrad.runtime.python.runtime import create_device
  return create_device()

def _fingerprint() -> dict:
  import platform
  import numpy as np
  from tgrad.helpers import cpu_model
  return {"device": "PYTHON", "cpu_model": cpu_model(), "machine": platform.machine(),
          "python_version": platform.python_version(), "numpy_version": np.__version__}

PYTHON = register_backend(Backend("PYTHON", _start, DeviceTraits(has_local=False), fingerprint=_fingerprint,
                                  languages=("python",)))
