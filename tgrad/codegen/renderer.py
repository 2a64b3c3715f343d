"""The renderer contract: what a target can do (its capabilities) and `render(name, uops) -> source`.

The Kernel asks a renderer's capabilities (local threads, shared memory, CPU threads, size limits) to decide which
OptOps are legal; the linearizer asks them how to index the iteration space (thread ids vs loops).
"""
from __future__ import annotations
from tgrad.ops import UOp

class Renderer:
  device: str = ""
  has_local: bool = False      # thread ids within a block (CUDA threadIdx)
  has_shared: bool = False     # block-shared memory and barriers
  has_threads: bool = False    # the CPU runtime splits a THREAD axis across cores
  max_local_size: int = 1      # threads per block
  max_global_dims: int = 1     # how many grid dimensions exist
  max_grid: tuple[int, ...] = (2**31 - 1,)           # size limit of each grid dimension, x first
  max_local_dims: tuple[int, ...] = (1,)             # size limit of each block dimension, x first
  shared_memory_bytes: int = 0
  decompose_transcendentals: bool = False   # exp2/log2/sin as polynomials (see transcendental.py), e.g. for SIMD CPUs
  def render(self, name: str, uops: list[UOp]) -> str: raise NotImplementedError
