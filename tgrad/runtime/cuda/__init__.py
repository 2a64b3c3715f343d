"""The CUDA device (NVIDIA GPUs), registered here: renderer.py writes CUDA C, nvrtc.py compiles it, runtime.py runs it
through pycuda (memory, launches, limits), graph.py replays JIT programs as CUDA graphs, fingerprint.py describes the
GPU. This file imports none of them, so importing tgrad loads neither pycuda nor the driver.
"""
from tgrad.backend import Backend, DeviceTraits, register_backend

def _start(ordinal: int = 0):
  from tgrad.runtime.cuda.runtime import create_device
  return create_device(ordinal)

def _is_usable() -> bool:
  from tgrad.runtime.cuda.runtime import is_usable
  return is_usable()

def _graph_runner():
  """CUDA graphs, unless CUDA_GRAPH=0 (then the JIT's plain loop)."""
  from tgrad.runtime.cuda.graph import CUDAGraphRunner, graphs_enabled   # the CUDA runtime is loaded by now
  return CUDAGraphRunner if graphs_enabled() else None

def _fingerprint() -> dict:
  from tgrad.runtime.cuda.fingerprint import fingerprint
  return fingerprint()

CUDA = register_backend(Backend(
  "CUDA", _start, DeviceTraits(has_local=True, lowerings=frozenset({"fast", "tf32"})), aliases=("GPU",),
  is_usable=_is_usable, fingerprint=_fingerprint, graph_runner=_graph_runner, languages=("cuda",),
  install="pip install -e '.[cuda]'",
  start_failure="no GPU is visible to the CUDA driver (check `nvidia-smi` and CUDA_VISIBLE_DEVICES); DEVICE=LLVM "
                "runs on the CPU",
  default_priority=1))
