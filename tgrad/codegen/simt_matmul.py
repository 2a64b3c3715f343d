"""A float32 matmul template in the opt space (OptOps.SGEMM): a whole float32 matmul kernel computed by the CUDA-core
(SIMT) kernel that runtime/cuda/sgemm.py writes (block tiles of 64-256 rows and columns, each thread an 8×8 or
wider register tile of float4 groups, A and B staged K-major in two shared-memory buffers, conflict-free 128-bit
shared reads), on targets whose renderer has `simt_matmul` (CUDA, every arch). Everything about it is here, in the
order it is used:

  1. which kernels qualify (`matmul_of`): the AST is exactly out = Σ_K a·b, the product of two float32 loads summed in
     float32 and stored as it is (no epilogue); one reduce over one K axis, two output axes (M, N), all three sizes
     known; each view plain (one view, no mask, offset 0): the output M×N contiguous, A M×K (K contiguous) or K×M (M
     contiguous, a transposed A), B N×K (a linear layer's weight) or K×N (a plain a·b); the dimension each operand is
     contiguous along a multiple of 4 (16-byte float4 loads). Anything else (a bias, a batch axis, a third buffer,
     half inputs, symbolic sizes) refuses it and keeps the generic opts (the heuristics' staged kernel).
  2. the opt's choices: SIMT_TILES, (block_m, block_n, thread_m, thread_n, min_blocks) each; Opt(OptOps.SGEMM, 0, i)
     takes tile i and must be the kernel's first and only opt (the kernel is the template). BEAM tries every tile
     (search.py's ACTIONS); the heuristics take `default_tile` for a matmul of at least MIN_MULTIPLY_ADDS.
  3. rendering: compile.render_source hands AxisState.simt_matmul to renderer.render_simt_matmul.
"""
from __future__ import annotations
import dataclasses
from typing import Optional, Union
from tgrad.codegen.axes import AxisState, KernelOptError, Opt, SimtMatmul
from tgrad.dtype import dtypes
from tgrad.ops import Ops

VECTOR = 4   # float32 elements per 16-byte load: the contiguous dimension of each operand is a multiple of it
# (block_m, block_n, thread_m, thread_n, min_blocks): 256, 128 or 64 threads, each thread's tile float4 groups of
# rows and columns; min_blocks 2 caps a thread's registers so that two blocks share an SM. Appended only: an index
# keeps its meaning for the BEAM winners cached before a new tile.
SIMT_TILES: tuple[tuple[int, int, int, int, int], ...] = (
  (128, 128, 8, 8, 1), (128, 128, 8, 8, 2), (128, 256, 8, 16, 1), (256, 128, 16, 8, 1), (128, 64, 8, 8, 2),
  (64, 128, 8, 8, 2), (64, 64, 8, 8, 2))
# The heuristics' tile: the first of DEFAULT_TILES that still gives a wave of blocks to an H100's 132 SMs (WAVE_FRACTION
# of them), else the one with the most blocks. Measured on an H100 (`python bench/sgemm.py`, CUDA events, torch float32
# with TF32 off = 1.0): 128×128 with two blocks an SM 0.87× (4096³, B K×N), 0.83× (B N×K), 0.87× (2048³), 0.89×
# (8192×8192×1024), ahead of the staged kernel (0.83, 0.73, 0.80, 0.87×) everywhere; with one block an SM 0.75-0.77×.
DEFAULT_TILES = ((128, 128, 8, 8, 2), (128, 64, 8, 8, 2), (64, 64, 8, 8, 2))
GPU_SMS = 132
WAVE_FRACTION = 0.9
# Below this many multiply-adds (M·N·K) the generic opts keep the matmul (BEAM may still pick SGEMM for any
# qualifying kernel). 2^26: a 512×512×256 product.
MIN_MULTIPLY_ADDS = 1 << 26

def _plain(state: AxisState, index: int) -> Optional[tuple]:
  """The strides of memop `index`'s tracker when it is one view without mask or offset, else None."""
  views = state.sts[index].views
  if len(views) != 1 or views[0].mask is not None or views[0].offset != 0: return None
  return tuple(views[0].strides)

def matmul_of(state: AxisState) -> Union[SimtMatmul, str]:
  """The kernel as a float32 matmul template (first tile), or why it is not one (see the module doc, 1.)."""
  if not state.renderer.simt_matmul: return f"{type(state.renderer).__name__} has no float32 matmul template"
  m, n, k = (state.full_shape + (1, 1, 1))[:3]
  if len(state.reduceops) != 1 or state.shape_len != 3 or state.first_reduce != 2 or \
     not all(isinstance(x, int) for x in (m, n, k)):
    return f"a float32 matmul template has two output axes and one reduce axis, all of known size, not " \
           f"{state.full_shape}"
  stores = [u for u in state.ast.src if u.op is Ops.STORE]
  if len(state.ast.src) != 1 or len(stores) != 1 or len(state.memops) != 3:
    return "a float32 matmul template reads two buffers and stores one"
  store, reduce = stores[0], state.reduceops[0]
  product = reduce.src[0]
  if reduce.arg[0] is not Ops.ADD or product.op is not Ops.MUL or any(x.op is not Ops.LOAD for x in product.src):
    return "the reduce is not a sum of products of two loads"
  if any(u.dtype != dtypes.float32 for u in (*product.src, reduce)) or store.src[2] is not reduce:
    return "a float32 matmul template stores the float32 sum of float32 products with nothing in between (no " \
           "epilogue)"
  strides = {u: _plain(state, i) for i, u in enumerate(state.memops)}
  if strides[store] != (n, 1, 0): return "the output must be a contiguous M×N matrix"
  a = next((x for x in product.src if strides[x] in ((k, 0, 1), (1, 0, m))), None)
  b = next((x for x in product.src if x is not a and strides[x] in ((0, k, 1), (0, 1, n))), None)
  if a is None or b is None:
    return "a must be a contiguous M×K or K×M matrix and b a contiguous N×K or K×N one"
  globals_ = {store.src[0]: "out", a.src[0]: "a", b.src[0]: "b"}
  if len(globals_) != 3: return "a float32 matmul template reads two buffers other than its output"
  a_m_major, b_n_major = strides[a] != (k, 0, 1), strides[b] != (0, k, 1)
  for name, contiguous in (("A", m if a_m_major else k), ("B", n if b_n_major else k)):
    if contiguous % VECTOR:
      return f"{name}'s contiguous dimension must be a multiple of {VECTOR} (float4 loads), not {m}×{n}×{k}"
  arguments = tuple(role for _, role in sorted(((g.arg, role) for g, role in globals_.items())))
  return SimtMatmul(m, n, k, a_m_major, b_n_major, arguments)

def simt_matmul(state: AxisState, opt: Opt) -> AxisState:
  """SGEMM: the whole kernel is the float32 matmul template with tile SIMT_TILES[opt.amount] (see the module doc)."""
  if state.applied_opts: raise KernelOptError(f"{opt}: SGEMM must be the kernel's first and only opt")
  if opt.axis not in (None, 0) or not (isinstance(opt.amount, int) and 0 <= opt.amount < len(SIMT_TILES)):
    raise KernelOptError(f"{opt}: SGEMM takes axis 0 and a tile index 0..{len(SIMT_TILES) - 1}")
  use = matmul_of(state)
  if isinstance(use, str): raise KernelOptError(f"{opt}: {use}")
  block_m, block_n, thread_m, thread_n, min_blocks = SIMT_TILES[opt.amount]
  return state.replace(simt_matmul=dataclasses.replace(use, block_m=block_m, block_n=block_n, thread_m=thread_m,
                                                       thread_n=thread_n, min_blocks=min_blocks))

def default_tile(m: int, n: int) -> int:
  """The heuristics' tile for an M×N output (an index into SIMT_TILES; see DEFAULT_TILES)."""
  def blocks(tile) -> int: return -(-m // tile[0]) * -(-n // tile[1])
  tile = next((t for t in DEFAULT_TILES if blocks(t) >= WAVE_FRACTION * GPU_SMS), DEFAULT_TILES[-1])
  return SIMT_TILES.index(tile)

def worth_it(use: SimtMatmul) -> bool:
  """Whether the heuristics give this matmul to the template (MIN_MULTIPLY_ADDS, and a block's worth of rows and
  columns)."""
  return use.m * use.n * use.k >= MIN_MULTIPLY_ADDS and min(use.m, use.n) >= 64
