"""GPU rules for matrix–vector products (decode's projections): dense weights (`_matvec`, `matvec_layout`), many
rows of a weight whose row is short (`_row_matvec`), and packed GGUF blocks (`_packed_matvec`,
`packed_matvec_layout`). codegen/heuristics.py's `_gpu_rules` calls them first for every kernel they recognize.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from tgrad.codegen.axes import Opt, OptOps
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.rule_tools import divisor_at_most, try_opt
from tgrad.ops import Ops, UOp, is_gather_load
from tgrad.helpers import prod

# Matrix–vector products (M ≤ MATVEC_MAX_M rows of x times a weight matrix W): memory bound, so every rule is about
# reading W once at full bandwidth with enough loads in flight. Constants from bench/matvec.py --sweep on an H100
# (gemma-3-270m's decode shapes; docs/benchmarks.md): the 262144×640 head reads W at 92–93% of DRAM bandwidth with
# these rules (torch: 91% fp32, 84% fp16); the 2048×640 and 640×2048 projections take ~4.5 µs, which is launch latency
# more than bandwidth, for every candidate.
MATVEC_MAX_M = 8
GPU_VECTOR_BYTES = 16          # the widest load: float4, 8 halves
# W[N, K] with K contiguous (torch.nn.Linear's layout, y = x·Wᵀ): a group of threads shares each row (GROUP, combined in
# shared memory), each thread reading MATVEC_ROW_BYTES of it in 16-byte loads, all unrolled; rows per block by LOCAL.
# Head sweep: 32 bytes per thread (fp32 80 threads, fp16 40) 92–93%; 64 bytes 93% fp32 but 84% fp16 with 2 rows per
# thread; more rows per thread (UPCAST) never helped.
MATVEC_ROW_BYTES = 32
MATVEC_MAX_ROW_THREADS = 128
MATVEC_MAX_UNROLL = 4          # a thread's loads of one row (or K steps) unrolled: all in flight at once
MATVEC_ROWS_PER_BLOCK = 4
MATVEC_MIN_BLOCKS = 264        # two blocks per SM of an H100 (132): rows per block shrink until there are this many
# W[K, N] with N contiguous (y = x·W): threads along N read neighbouring vectors of a row of W, a group of threads
# splits K in contiguous chunks (GROUPTOP), K unrolled. With few columns, narrower vectors give more threads: the
# 2048- and 640-wide sweeps' best used 2 elements per thread, 8 threads along N and 32 (K = 640) or 64 (K = 2048)
# along K.
MATVEC_MIN_COLUMN_THREADS = 1024
MATVEC_MIN_LANES = 2
MATVEC_COLUMN_THREADS = 8
MATVEC_MAX_K_GROUP = 64
MATVEC_MIN_K_PER_THREAD = 16   # rows of W each thread of the K group sums at least

@dataclass(frozen=True)
class MatvecLayout:
  """The axes of a matrix–vector product's kernel: n_axis (an output axis W varies along), k_axis (the reduce
  axis), m_axes (output axes along which W is reused: the rows of x) and whether W is contiguous along K."""
  n_axis: int
  k_axis: int
  m_axes: tuple[int, ...]
  k_contiguous: bool

def _weight_output_axes(kernel: Kernel, strides: tuple) -> Optional[tuple[tuple[int, ...], list[int]]]:
  """(m_axes, n_axes) of a matrix–vector product whose weight W is read with `strides`: the output axes W is reused
  along (x's rows) and those it varies along; None when it varies along none or is reused over more than MATVEC_MAX_M
  outputs (a matmul)."""
  outputs = [a for a in range(kernel.first_reduce) if kernel.full_shape[a] > 1]
  m_axes = tuple(a for a in outputs if strides[a] == 0)
  n_axes = [a for a in outputs if strides[a] not in (0, None)]
  if not n_axes or prod(kernel.full_shape[a] for a in m_axes) > MATVEC_MAX_M: return None
  return m_axes, n_axes

def matvec_layout(kernel: Kernel) -> Optional[MatvecLayout]:
  """The layout when an unoptimized kernel is a matrix–vector product: one sum over one reduce axis of a value that
  reads at least two buffers, the largest of which (W) varies along the reduce axis and an output axis, is
  contiguous along one of them, and is reused along output axes (M) of at most MATVEC_MAX_M outputs. Else None."""
  if len(kernel.reduceops) != 1 or kernel.reduceops[0].arg[0] is not Ops.ADD or kernel.applied_opts: return None
  reduce_axes = [a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)]
  if len(reduce_axes) != 1: return None
  under_reduce = set(kernel.reduceops[0].src[0].toposort())
  loads = [(u, st) for u, st in zip(kernel.memops, kernel.sts) if u.op is Ops.LOAD and u in under_reduce]
  if len({u.src[0] for u, _ in loads}) < 2: return None
  _, weight = max(loads, key=lambda load: load[1].buffer_extent() * load[0].dtype.itemsize)
  strides, k_axis = weight.real_strides(), reduce_axes[0]
  if strides[k_axis] in (0, None) or (axes := _weight_output_axes(kernel, strides)) is None: return None
  m_axes, n_axes = axes
  n_axis = next((a for a in n_axes if strides[a] == 1), n_axes[-1])
  if strides[k_axis] != 1 and strides[n_axis] != 1: return None
  return MatvecLayout(n_axis, k_axis, m_axes, strides[k_axis] == 1)

def _vector_lanes(kernel: Kernel, size: int, loads: Optional[list[UOp]] = None) -> int:
  """Elements per 16-byte access of the widest of `loads` (all the kernel's loads if None) that divide `size` (a power
  of two, 1 if none)."""
  itemsize = max(u.dtype.itemsize for u in (loads or [u for u in kernel.memops if u.op is Ops.LOAD]))
  lanes = GPU_VECTOR_BYTES // itemsize
  while lanes > 1 and size % lanes: lanes //= 2
  return lanes

def _matvec(kernel: Kernel) -> bool:
  """A matrix–vector product (see matvec_layout): the M outputs that share W's loads are upcast (each thread reads W
  once for all of them), then the rules for W's layout."""
  if (layout := matvec_layout(kernel)) is None: return False
  for axis in layout.m_axes: try_opt(kernel, Opt(OptOps.UPCAST, axis, 0))   # whole axes: the axis numbers stay
  if layout.k_contiguous: _matvec_rows(kernel, layout.n_axis)
  else: _matvec_columns(kernel, layout.n_axis)
  return True

def _unroll_loop(kernel: Kernel) -> None:
  """Unroll the reduce loop left after GROUP by its largest divisor up to MATVEC_MAX_UNROLL."""
  loop = kernel.first_reduce + kernel.group_for_reduces
  if loop < kernel.first_upcast and (unroll := divisor_at_most(kernel.full_shape[loop], MATVEC_MAX_UNROLL)) > 1:
    try_opt(kernel, Opt(OptOps.UNROLL, kernel.group_for_reduces, unroll))

def _k_group(kernel: Kernel, threads: int, power_of_two: bool) -> int:
  """Threads to split the reduce axis across: its largest divisor up to `threads` (a power of two if asked). When none
  reaches half of `threads` (an odd or prime K), K is first padded (PADTO: the padding adds zeros to the sum) to a
  multiple of the largest power of two up to `threads`."""
  if threads < 2: return 1
  def best(size: int) -> int:
    if not power_of_two: return divisor_at_most(size, threads)
    return max(d for d in (1 << i for i in range(threads.bit_length())) if d <= threads and size % d == 0)
  if 2 * (group := best(kernel.full_shape[kernel.first_reduce])) > threads: return group
  if try_opt(kernel, Opt(OptOps.PADTO, kernel.first_reduce, 1 << (threads.bit_length() - 1))):
    group = best(kernel.full_shape[kernel.first_reduce])
  return group

def _rows_per_block(kernel: Kernel, rows_axis: int, most: int) -> None:
  """LOCAL on a matvec's rows: the largest divisor of the rows up to `most`, smaller while that leaves fewer than
  MATVEC_MIN_BLOCKS blocks."""
  rows = kernel.full_shape[rows_axis]
  per_block = divisor_at_most(rows, most)
  while per_block > 1 and rows // per_block < MATVEC_MIN_BLOCKS: per_block = divisor_at_most(rows, per_block - 1)
  if per_block > 1: try_opt(kernel, Opt(OptOps.LOCAL, rows_axis, per_block))

def _matvec_rows(kernel: Kernel, n_axis: int) -> None:
  """W[N, K] with K contiguous: thread t of a row's group reads 16-byte vectors t, t + group, … of the row, so a
  warp's loads cover contiguous bytes; LOCAL puts several rows in a block."""
  k_size = kernel.full_shape[kernel.first_reduce]
  itemsize = max(u.dtype.itemsize for u in kernel.memops if u.op is Ops.LOAD)
  if (lanes := _vector_lanes(kernel, k_size)) > 1: try_opt(kernel, Opt(OptOps.UNROLL, 0, lanes))
  threads = min(MATVEC_MAX_ROW_THREADS, k_size * itemsize // MATVEC_ROW_BYTES)
  if (group := _k_group(kernel, threads, power_of_two=False)) > 1: try_opt(kernel, Opt(OptOps.GROUP, 0, group))
  _unroll_loop(kernel)
  _rows_per_block(kernel, n_axis, MATVEC_ROWS_PER_BLOCK)

def _matvec_columns(kernel: Kernel, n_axis: int) -> None:
  """W[K, N] with N contiguous: each thread reads `lanes` neighbouring columns per row of W; threads along N, and a
  group of threads along K, each summing a contiguous chunk of rows (GROUPTOP), unrolled."""
  columns = kernel.full_shape[n_axis]
  lanes = _vector_lanes(kernel, columns)
  while lanes > MATVEC_MIN_LANES and columns // lanes < MATVEC_MIN_COLUMN_THREADS: lanes //= 2
  if lanes > 1: try_opt(kernel, Opt(OptOps.UPCAST, n_axis, lanes))
  if (threads := divisor_at_most(kernel.full_shape[n_axis], MATVEC_COLUMN_THREADS)) > 1:
    try_opt(kernel, Opt(OptOps.LOCAL, n_axis, threads))
  threads = min(MATVEC_MAX_K_GROUP, kernel.full_shape[kernel.first_reduce] // MATVEC_MIN_K_PER_THREAD)
  if (group := _k_group(kernel, threads, power_of_two=True)) > 1: try_opt(kernel, Opt(OptOps.GROUPTOP, 0, group))
  _unroll_loop(kernel)

# A row kernel whose last pass is a matrix–vector product (an RMSNorm fused into the projection after it: each output
# row of W needs the normalized vector, so every block first walks the vector's row passes). One output row per block
# makes each block repeat those passes on its own, so the passes' loads (L2 hits) outweigh W's, and (before the warp
# shuffles, below) the serial combine of the group's partials (every thread of a row kernel combines them all) grew
# with the group. Several rows per block share the passes' loads through L1. Measured on an H100 (gemma-3-270m decode,
# gate/up 4096×640 with two fused norms, each kernel alone, the serial combine): one row of 40 threads 13.9 µs fp16 /
# 12.6 µs fp32; 8 rows of 20 threads 7.0–8.1 / 7.4; 4 rows of 20 6.4–7.6 fp32; 8 rows of 40 11–12; 80 threads per
# row ≥ 27. Since
# the decode's row kernels have 4 rows a block (MATVEC_MIN_BLOCKS), 40 threads a row is faster (2026-11-28, float16
# decode step, zero-data Q4_K_M file, two rounds alternated: H100 0.5598/0.5592 → 0.5349/0.5332 ms at position 40,
# H200 0.5166/0.5155 → 0.4983/0.4978; in a chain of PDL launches on the H200, qkv 4.60 → 4.28 µs, gate/up 5.89 →
# 5.66; 8 rows of 40: 5.26 and 6.22). Once the group's partials combined by warp shuffles (reduces.warp_combine: a
# larger group no longer lengthens every thread's combine), 80 threads a row (one 16-byte load of W each) and 2 rows a
# block were faster again (2026-11-28, H100, float16 decode step, zero-data Q4_K_M file, ms at positions 40 / 100):
# 40 threads × 4 rows 0.4518-0.4522 / 0.4999-0.5004 (three runs), 80 × 4 0.4439-0.4443 / 0.4968-0.4969, 80 × 2
# 0.4399-0.4416 / 0.4908-0.4921 (three runs), 20 × 4 0.5137 / 0.5624.
ROW_MATVEC_MIN_ROWS = 256        # fewer output rows than this: the generic row rules
ROW_MATVEC_GROUP = 80            # threads per row
ROW_MATVEC_ROWS_PER_BLOCK = 2

def _row_matvec(kernel: Kernel) -> bool:
  """A row kernel (AxisState.row_passes > 1) over one reduce axis whose output has at least ROW_MATVEC_MIN_ROWS rows
  along an axis some load (W) varies on while another (the vector) does not, both contiguous along the reduce (a
  softmax's rows, one load varying with its row, are not this): 16-byte loads of W (UNROLL), a group of
  ROW_MATVEC_GROUP threads per row, and ROW_MATVEC_ROWS_PER_BLOCK rows per block, fewer while that leaves under
  MATVEC_MIN_BLOCKS blocks."""
  k = kernel
  if k.row_passes < 2 or k.applied_opts or k.first_reduce + 1 != k.first_upcast: return False
  along_k = [(u, st.real_strides()) for u, st in zip(k.memops, k.sts) if u.op is Ops.LOAD and
             st.real_strides()[k.first_reduce] == 1]
  def is_matvec_rows(axis: int) -> bool:
    """W varies along `axis` and is contiguous along the reduce; the vector (another load) is shared by every row."""
    return k.full_shape[axis] >= ROW_MATVEC_MIN_ROWS and any(s[axis] not in (0, None) for _, s in along_k) and \
      any(s[axis] == 0 for _, s in along_k)
  rows_axis = next((a for a in reversed(range(k.first_reduce)) if is_matvec_rows(a)), None)
  if rows_axis is None or not isinstance(k.full_shape[k.first_reduce], int): return False
  # the UNROLL is sized by W's loads, not a wider vector's (a float16 model's float32 residual stream)
  w_loads = [u for u, s in along_k if s[rows_axis] not in (0, None)]
  if (lanes := _vector_lanes(k, k.full_shape[k.first_reduce], w_loads)) > 1: try_opt(k, Opt(OptOps.UNROLL, 0, lanes))
  if (group := divisor_at_most(k.full_shape[k.first_reduce], ROW_MATVEC_GROUP)) > 1:
    try_opt(k, Opt(OptOps.GROUP, 0, group))
  _rows_per_block(k, rows_axis, ROW_MATVEC_ROWS_PER_BLOCK)
  return True

# A matrix–vector product over a block-quantized weight (QuantizedTensor.linear, gemma3's fused decode kernels: one to
# three sums over the same axes, e.g. a norm's sum of squares beside the product): the sum runs over the weight's
# blocks and the axes inside a block, and the weight is bytes (the largest byte load) that vary along the rows and the
# blocks. Decode's projections are small (0.2-1.3 MB packed): less than the bytes a GPU must have in flight to reach
# its bandwidth (3 TB/s × ~0.6 µs of DRAM latency ≈ 2 MB), so the rule spreads every row over as many threads as it
# can, each issuing all its loads at once. The innermost block axis (the run of quant bytes, contiguous) is cut in
# PACKED_WORD_BYTES pieces: each thread reads one 32-bit word of it (the renderer loads it whole, vectors.py, with a
# funnel shift where the block size leaves its alignment unknown) and those words are spread over threads (GROUP), as
# are a row's blocks (a second GROUP), up to PACKED_MATVEC_ROW_THREADS per row; every other axis inside a block is
# unrolled, so a thread's loads of a block (its word of every sub-block, the scales once) are independent and in
# flight together. Rows per block of threads up to PACKED_MATVEC_BLOCK_THREADS. Before: a group over the blocks only
# (4-20 threads per row, 8-80 per block of threads), each thread walking a whole block a byte at a time: 16-81 GB/s on
# an H100 for gemma-3-270m's projections.
# A projection with many rows fills the GPU with fewer threads per row: the rows then give the threads, and each
# thread walks more blocks of its row (more loads in flight per thread, a smaller combine per row). The threads of a
# row are capped at PACKED_MATVEC_GPU_THREADS / rows (never below a row's word threads). Measured on an H100
# (`python bench/packed_matvec.py --dtype float16 --cases Q8_0:262144x640 --row-threads 8,16,32,64,128`, the tied
# head of gemma-3-270m's Q4_K_M file, 178 MB, back to back): 128 threads a row 319 µs (559 GB/s), 64 161 µs,
# 32 93 µs, 8 91 µs (1.95 TB/s; floor 55 µs); gemma's smaller projections (256-4096 rows) keep 128 (their times moved
# within the launch noise, 4.1-5.3 µs, in the same sweep).
# Rows per block of threads: enough for PACKED_MATVEC_BLOCK_THREADS threads at least (rounded up: a row of 40 threads
# takes 4 rows a block, not 2). Measured on an H100 (`python bench/projection_graph.py`, the plain projection in a
# graph): Q5_0 2048×640 2.73 → 1.89 µs; the packed decode step on the zero-data file (position 40 / 100, three rounds
# alternated) 0.4879-0.4914 / 0.5402-0.5420 → 0.4782-0.4808 / 0.5286-0.5314 ms.
# A thread whose share of a block is still PACKED_SPREAD_MIN_VALUES values or more after the two GROUPs (Q6_K: 64 of a
# 256-value super-block) takes a third: the outermost loop inside a block is spread over threads too (up to
# PACKED_MATVEC_ROW_THREADS a row), halving the thread's serial decoding. Measured the same way: Q6_K 640×2048 3.35 →
# 2.52 µs (0.49 → 0.66 of the floor probe); the packed step 0.4991 / 0.5519 → 0.4902 / 0.5416 ms. Spreading every
# type so (Q4_K, Q5_0: 32 and 16 values a thread) made them slower (Q4_K 640×1024 1.65 → 2.24 µs; the step 0.574 ms).
PACKED_WORD_BYTES = 4               # bytes of the quant run a thread reads per step: one 32-bit load
# In a weight of many rows (the many-rows layout below), a quant run whose every start is a multiple of
# PACKED_VECTOR_BYTES (a planar weight's: nn/quant.py) is read in pieces of that many bytes, one vector load each; the
# threads a row's words would have had go to its blocks instead (the blocks' GROUP), so a row keeps as many threads.
# Measured on an H200 (bench/probes/kernel_chain.py, gemma-3-270m's planar Q8_0 head, 262144×640): 16-byte pieces,
# 2 threads a block's run, 4 over the 20 blocks, 4 rows a thread and 4 a block of threads 49.5-50.2 µs; the same shape
# with 5 or 10 threads over the blocks 72.3 / 78.4; 8-byte pieces 75.5; the interleaved head under the word rule
# 60.2-61.1.
PACKED_VECTOR_BYTES = 16
PACKED_MATVEC_ROW_THREADS = 128     # threads sharing a row (MATVEC_MAX_ROW_THREADS's bound on the combine)
PACKED_MATVEC_BLOCK_THREADS = 128   # threads per block of threads (rows × row threads), at least
PACKED_SPREAD_MIN_VALUES = 64      # a thread decoding this many values of a block takes a third GROUP (above)
PACKED_MATVEC_GPU_THREADS = 1 << 20   # ~4 waves of an H100's resident threads (132 SMs × 2048)
# A weight whose rows alone give more than PACKED_MATVEC_GPU_THREADS threads at its row threads (the LM head: 262144
# rows of 640) has threads to spare and too few loads in flight per thread: each thread takes PACKED_ROWS_PER_THREAD
# rows (UPCAST, after LOCAL: a block's threads take neighbouring rows) and its loop over a row's blocks is unrolled
# whole when it has at most PACKED_MAX_UNROLLED_BLOCKS steps (BEAM's winner for the head). Measured on an H100
# (bench/packed_matvec.py --cases, back to back, docs/benchmarks.md): gemma-3-270m's Q8_0 head 93.2 → 70.9 µs.
PACKED_ROWS_PER_THREAD = 4
PACKED_MAX_UNROLLED_BLOCKS = 32

def packed_matvec_layout(kernel: Kernel) -> Optional[MatvecLayout]:
  """A packed matrix–vector product (see above): sums (ADD) over two or more reduce axes, the largest byte load varying
  along the first reduce axis (the blocks) and an output axis (the rows), reused along output axes of at most
  MATVEC_MAX_M outputs (x's rows). Else None."""
  if not kernel.reduceops or kernel.applied_opts or any(r.arg[0] is not Ops.ADD for r in kernel.reduceops): return None
  reduce_axes = [a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)]
  if len(reduce_axes) < 2 or not all(isinstance(kernel.full_shape[a], int) for a in range(kernel.shape_len)):
    return None
  if not _byte_loads(kernel): return None
  strides = _packed_strides(kernel)
  if strides[reduce_axes[0]] in (0, None) or (axes := _weight_output_axes(kernel, strides)) is None: return None
  m_axes, n_axes = axes
  return MatvecLayout(n_axes[-1], reduce_axes[0], m_axes, False)

def _packed_matvec(kernel: Kernel) -> bool:
  if (layout := packed_matvec_layout(kernel)) is None: return False
  for axis in layout.m_axes: try_opt(kernel, Opt(OptOps.UPCAST, axis, 0))
  blocks_axis, inner = kernel.first_reduce, kernel.first_upcast - 1   # inner: the innermost axis of a block
  rows = prod(kernel.full_shape[:kernel.first_reduce])
  byte_threads = word_threads = 1
  if inner > blocks_axis and kernel.is_reduce_axis(inner) and _bytes_contiguous(kernel, inner) and \
     (run := kernel.full_shape[inner]) % PACKED_WORD_BYTES == 0:
    vectors = rows * (run // PACKED_WORD_BYTES) > PACKED_MATVEC_GPU_THREADS and run % PACKED_VECTOR_BYTES == 0 and \
      _runs_aligned(kernel, inner, PACKED_VECTOR_BYTES)   # measured on the many-rows layout only (below)
    if try_opt(kernel, Opt(OptOps.UNROLL, inner - blocks_axis, PACKED_VECTOR_BYTES if vectors else PACKED_WORD_BYTES)):
      byte_threads, word_threads = kernel.full_shape[inner], run // PACKED_WORD_BYTES
  blocks = kernel.full_shape[blocks_axis]
  row_cap = min(PACKED_MATVEC_ROW_THREADS, max(1, PACKED_MATVEC_GPU_THREADS // rows))
  block_threads = divisor_at_most(blocks, max(1, max(row_cap, word_threads) // byte_threads))
  # (a whole axis is amount 0, as BEAM's actions name it)
  if block_threads > 1: try_opt(kernel, Opt(OptOps.GROUP, 0, 0 if block_threads == blocks else block_threads))
  # the word threads: the rest of the innermost block axis, now the last loop axis (after the blocks' GROUP, if any)
  if byte_threads > 1: try_opt(kernel, Opt(OptOps.GROUP, inner - blocks_axis, 0))
  if _values_per_thread(kernel) >= PACKED_SPREAD_MIN_VALUES: _spread_in_block(kernel, row_cap)
  # every loop inside a block unrolled, innermost first (the loop axes before it keep their numbers)
  loops = range(kernel.first_reduce + kernel.group_for_reduces + 1, kernel.first_upcast)
  for axis in reversed(loops): try_opt(kernel, Opt(OptOps.UNROLL, axis - kernel.first_reduce, 0))
  row_threads = _group_threads(kernel)
  blocks_loop = kernel.first_reduce + kernel.group_for_reduces   # the blocks a thread walks, after the GROUPs
  if rows * row_threads > PACKED_MATVEC_GPU_THREADS and PACKED_ROWS_PER_THREAD > 1 and \
     kernel.full_shape[layout.n_axis] % PACKED_ROWS_PER_THREAD == 0 and \
     blocks_loop < kernel.first_upcast and kernel.full_shape[blocks_loop] <= PACKED_MAX_UNROLLED_BLOCKS:
    _rows_per_block(kernel, layout.n_axis, max(1, PACKED_MATVEC_BLOCK_THREADS // row_threads // PACKED_ROWS_PER_THREAD))
    try_opt(kernel, Opt(OptOps.UNROLL, kernel.group_for_reduces, 0))   # the blocks loop (its number after the LOCAL)
    try_opt(kernel, Opt(OptOps.UPCAST, layout.n_axis, PACKED_ROWS_PER_THREAD))
    return True
  _rows_per_block(kernel, layout.n_axis, -(-PACKED_MATVEC_BLOCK_THREADS // row_threads))   # at least that many threads
  return True

def _group_threads(kernel: Kernel) -> int:
  """The threads sharing one row: the product of the GROUP axes' sizes."""
  return prod(kernel.full_shape[a] for a in range(kernel.first_reduce, kernel.first_reduce + kernel.group_for_reduces))

def _values_per_thread(kernel: Kernel) -> int:
  """A thread's share of a block: the sizes of the reduce axes inside a block (after the blocks' loop) that no GROUP
  spreads over threads, loops and unrolled alike."""
  inside = range(kernel.first_reduce + kernel.group_for_reduces + 1, kernel.shape_len)
  return prod(size for a in inside if kernel.is_reduce_axis(a) and isinstance(size := kernel.full_shape[a], int))

def _spread_in_block(kernel: Kernel, row_cap: int) -> None:
  """More threads a row while it has fewer than row_cap and a GROUP axis is left (opts.MAX_GROUP_AXES): the loops
  inside a block (after the blocks' loop), outermost first, each shared by threads as far as the cap allows."""
  row_threads = _group_threads(kernel)
  relative = 1   # the first loop inside a block, after the blocks' loop (left at size 1 when grouped whole)
  while row_threads * 2 <= row_cap and kernel.first_reduce + kernel.group_for_reduces + relative < kernel.first_upcast:
    size = kernel.full_shape[kernel.first_reduce + kernel.group_for_reduces + relative]
    amount = divisor_at_most(size, row_cap // row_threads) if isinstance(size, int) else 1
    if amount <= 1: break
    if not try_opt(kernel, Opt(OptOps.GROUP, relative, 0 if amount == size else amount)): break
    row_threads *= amount
    relative += 1   # the grouped loop stays in place at size 1 (or size / amount: then stop)
    if amount != size: break

def _byte_loads(kernel: Kernel) -> list[int]:
  """Positions (in kernel.memops) of the byte loads that may read a packed weight. A gather's table is never the
  weight, however large (a decode step's packed embedding row, recomputed inside the kernel that reads it, gathers one
  row of a 178 MB table)."""
  return [i for i, u in enumerate(kernel.memops)
          if u.op is Ops.LOAD and u.dtype.itemsize == 1 and not is_gather_load(u)]

def _packed_loads(kernel: Kernel) -> list[int]:
  """Positions (in kernel.memops) of the byte loads of the packed weight: the buffer of the largest byte load."""
  packed = _byte_loads(kernel)
  weight = kernel.memops[max(packed, key=lambda i: kernel.sts[i].buffer_extent())].src[0]
  return [i for i in packed if kernel.memops[i].src[0] is weight]

def _packed_strides(kernel: Kernel) -> tuple:
  """The strides of the packed weight's largest load (every load of it has the same strides on rows and blocks)."""
  return kernel.sts[max(_packed_loads(kernel), key=lambda i: kernel.sts[i].buffer_extent())].real_strides()

def _runs_aligned(kernel: Kernel, axis: int, alignment: int) -> bool:
  """Whether every load of the packed weight that reads consecutive bytes along `axis` starts each run on a multiple of
  `alignment` bytes: one view, unmasked, its offset and every other stride multiples of it (a buffer's start is)."""
  runs = [i for i in _packed_loads(kernel) if kernel.sts[i].real_strides()[axis] == 1]
  for i in runs:
    st = kernel.sts[i]
    if len(st.views) != 1 or (view := st.views[0]).mask is not None or not isinstance(view.offset, int) or \
       view.offset % alignment: return False
    if any(not isinstance(stride, int) or stride % alignment for a, stride in enumerate(view.strides) if a != axis):
      return False
  return bool(runs)

def _bytes_contiguous(kernel: Kernel, axis: int) -> bool:
  """Whether some load of the packed weight reads consecutive bytes along `axis` (the quants of a block)."""
  return any(kernel.sts[i].real_strides()[axis] == 1 for i in _packed_loads(kernel))
