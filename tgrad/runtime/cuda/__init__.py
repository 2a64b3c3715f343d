"""The CUDA device (NVIDIA GPUs), registered here: renderer.py writes CUDA C, nvrtc.py compiles it, runtime.py runs it
through pycuda (memory, launches, limits; one device per GPU ordinal), graph.py replays JIT programs as CUDA graphs
(driver.py: the driver calls pycuda lacks), peer.py copies between GPUs, nccl.py runs collectives between them,
fingerprint.py describes the GPU. This file imports none of them, so importing tgrad loads neither pycuda nor the
driver nor NCCL.
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

def collectives(devices):
  """The collectives between started CUDA devices of distinct GPUs (NCCL: nccl.NCCLCollectives), or None where NCCL
  does not load (a sharded tensor's collectives then run as copies and kernels: tgrad/multi/runners.py)."""
  from tgrad.runtime.cuda.nccl import NCCLCollectives, is_available
  if not is_available() or len({device.ordinal for device in devices}) != len(devices): return None
  return NCCLCollectives(devices)

def collectives_available() -> bool:
  """Whether NCCL loads, without a GPU or a communicator."""
  from tgrad.runtime.cuda.nccl import is_available
  return is_available()

# the traits: "fast" intrinsics, "tf32" and half ("half_gemm": a prompt times a packed weight, nn/quant.py) matmuls on
# tensor cores, "flash" attention, "packed_wgmma" (that prompt as one kernel over the packed blocks, on sm_90a only:
# tgrad/packed_gemm_kernel.py asks the started device's renderer), "row_copies" (a normed product recomputes the norm
# in every output row's copy of x: one kernel, nn/quant.py)
CUDA_TRAITS = DeviceTraits(has_local=True, lowerings=frozenset({"fast", "tf32", "flash", "half_gemm",
                                                                             "packed_wgmma", "row_copies"}))

CUDA = register_backend(Backend(
  "CUDA", _start, CUDA_TRAITS, aliases=("GPU",),
  is_usable=_is_usable, fingerprint=_fingerprint, graph_runner=_graph_runner, languages=("cuda",),
  install="pip install -e '.[cuda]'",
  start_failure="no GPU is visible to the CUDA driver (check `nvidia-smi` and CUDA_VISIBLE_DEVICES); DEVICE=LLVM "
                "runs on the CPU",
  default_priority=1, collectives=collectives))
