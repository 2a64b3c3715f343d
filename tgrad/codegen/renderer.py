"""The renderer contract: what a target can do (its capabilities) and `render(name, uops) -> source`.

The Kernel asks a renderer's capabilities (local threads, shared memory, CPU threads, size limits) to decide which
OptOps are legal; the linearizer asks them how to index the iteration space (thread ids vs loops). `TensorCore`
describes one warp-wide matrix instruction a target offers (OptOps.TC): its tile shape, dtypes and fragment layouts.
"""
from __future__ import annotations
from dataclasses import dataclass
from tgrad.dtype import DType
from tgrad.ops import UOp

@dataclass(frozen=True)
class FragmentLayout:
  """Where one lane's fragment elements lie in an operand's tile. A lane of the warp is (group, tig) = (lane // 4,
  lane % 4); its element i sits at row = group·row_lane[0] + tig·row_lane[1] + rows[i], and col likewise."""
  row_lane: tuple[int, int]
  rows: tuple[int, ...]
  col_lane: tuple[int, int]
  cols: tuple[int, ...]
  def position(self, element: int, group, tig) -> tuple:
    """(row, col) of `element` for the lane (group, tig): ints, or index UOps when group and tig are UOps."""
    return (group * self.row_lane[0] + tig * self.row_lane[1] + self.rows[element],
            group * self.col_lane[0] + tig * self.col_lane[1] + self.cols[element])

@dataclass(frozen=True)
class TensorCore:
  """D = A·B + C for one warp: A is dims[0]×dims[2] (M×K), B is K×N, C and D are M×N, each lane holding fragments
  of them as its layouts say. `instruction` is the target's name for it (e.g. a PTX mma)."""
  instruction: str
  dims: tuple[int, int, int]   # (M, N, K)
  dtype_in: DType
  dtype_acc: DType
  a: FragmentLayout
  b: FragmentLayout
  c: FragmentLayout
  lanes: int = 32
  lanes_per_group: int = 4     # lane = group·lanes_per_group + tig
  tf32: bool = False           # float32 inputs used as TF32: only loads rounded to TF32 in the graph qualify

@dataclass(frozen=True)
class MatrixLoad:
  """A warp's load of a tensor-core fragment from shared memory (PTX ldmatrix): `matrices` 8×8 matrices of 16-bit
  elements, each row 16 contiguous bytes; lane l passes the address of row l % 8 of matrix l // 8 and receives one
  32-bit register per matrix (elements (l // 4, 2·(l % 4)) and the next). `transposed` loads each matrix transposed
  (a row-major K×N operand becomes the column fragment of B)."""
  matrices: int
  transposed: bool

class Renderer:
  device: str = ""
  has_local: bool = False      # thread ids within a block (CUDA threadIdx)
  has_shared: bool = False     # block-shared memory and barriers
  has_threads: bool = False    # the CPU runtime splits a THREAD axis across cores
  warp_lanes: int = 0          # threads of a warp that exchange registers (Ops.SHUFFLE_XOR); 0: no such exchange
  max_local_size: int = 1      # threads per block
  max_global_dims: int = 1     # how many grid dimensions exist
  max_grid: tuple[int, ...] = (2**31 - 1,)           # size limit of each grid dimension, x first
  max_local_dims: tuple[int, ...] = (1,)             # size limit of each block dimension, x first
  shared_memory_bytes: int = 0
  decompose_transcendentals: bool = False   # exp2/log2/sin as polynomials (see transcendental.py), e.g. for SIMD CPUs
  tensor_cores: tuple[TensorCore, ...] = ()  # warp-wide matrix instructions OptOps.TC can use (none: TC is refused)
  async_copy: bool = False     # a global → shared copy can be issued without waiting for it (CUDA cp.async)
  matrix_loads: bool = False   # tensor-core fragments can be loaded from shared memory by the warp (MatrixLoad)
  warpgroup_mma: bool = False  # warpgroup MMAs on shared-memory operands (CUDA sm_90a wgmma: runtime/cuda/wgmma.py)
  simt_matmul: bool = False    # a hand-written float32 matmul template (OptOps.SGEMM: runtime/cuda/sgemm.py)
  vector_bytes: int = 16       # bytes per SIMD register (CPU register tiles): SSE 16, AVX2 32, AVX-512 64
  vector_registers: int = 16   # SIMD registers the code may hold at once: 16 (SSE, AVX2), 32 (AVX-512)
  def render(self, name: str, uops: list[UOp]) -> str: raise NotImplementedError
  def render_warpgroup_matmul(self, name: str, matmul) -> str:
    """The whole source of a warpgroup matmul kernel (OptOps.WGMMA: an axes.WarpgroupMatmul), where warpgroup_mma."""
    raise NotImplementedError(f"{type(self).__name__} has no warpgroup MMA")
  def render_simt_matmul(self, name: str, matmul) -> str:
    """The whole source of a float32 matmul template kernel (OptOps.SGEMM: an axes.SimtMatmul), where simt_matmul."""
    raise NotImplementedError(f"{type(self).__name__} has no float32 matmul template")
