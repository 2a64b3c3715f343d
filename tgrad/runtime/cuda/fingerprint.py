"""The CUDA device's hardware fingerprint (paths/fingerprint.py): the GPU, its driver, CUDA and NVRTC versions."""
from __future__ import annotations
from typing import Any

def fingerprint() -> dict:
  """This process's GPU, through the device registry (which starts CUDA once per process)."""
  from tgrad.device import Device
  device = Device["CUDA"]   # first: without pycuda or a GPU this raises DeviceUnavailable, saying why
  import pycuda.driver as cuda
  from tgrad.runtime.cuda.nvrtc import nvrtc_version
  return cuda_fingerprint(device.context, cuda.get_driver_version(), cuda.get_version(), nvrtc_version())

def cuda_fingerprint(context: Any, driver_version: int, cuda_version: tuple, nvrtc: tuple) -> dict:
  """The fingerprint of the GPU behind a CUDAContext (runtime.py: its pycuda `device`, `compute_capability` and
  `attribute(name)`), with the driver version (an int such as 12080), the CUDA version pycuda was built for and
  NVRTC's version (it compiles every kernel, so a new NVRTC can change a path's code)."""
  major, minor = context.compute_capability
  return {"device": "CUDA", "gpu_name": context.device.name(), "compute_capability": f"{major}.{minor}",
          "multiprocessors": int(context.attribute("MULTIPROCESSOR_COUNT")),
          "total_memory_bytes": int(context.device.total_memory()),
          "driver_version": _cuda_version_text(driver_version),
          "cuda_version": ".".join(str(part) for part in cuda_version),
          "nvrtc_version": ".".join(str(part) for part in nvrtc)}

def _cuda_version_text(version: int) -> str: return f"{version // 1000}.{version % 1000 // 10}"  # 12080 → "12.8"
