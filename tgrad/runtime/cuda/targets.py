"""What the CUDA renderer and the hand-written kernels beside it (wgmma.py) agree on about their targets: GPU
architecture names and the marker globals a kernel's module carries for the runtime (runtime.py reads them).

A leaf of the CUDA backend: it imports nothing of tgrad's, so renderer.py and wgmma.py both build on it.
"""
from __future__ import annotations

# Above the static limit a kernel's shared arrays live in one dynamic allocation; the kernel's module carries its size
# in this global (runtime/cuda/runtime.py reads it, opts the function in and launches with it).
DYNAMIC_SHARED_SUFFIX = "_dynamic_shared_bytes"
# A kernel that loads through tensor maps (TMA) takes them as its first parameters; its module says how to make each
# from the buffer arguments in this global (tensor_map.py: TensorMapSpec.marker_values), which runtime.py reads.
TENSOR_MAPS_SUFFIX = "_tensor_maps"
WARPGROUP_MMA_ARCH = "sm_90a"   # wgmma.mma_async (PTX ISA 8.0): Hopper's arch-specific target

def sm_number(arch: str) -> int:
  """80 for sm_80, 90 for sm_90a."""
  return int(arch.removeprefix("sm_").rstrip("af"))
