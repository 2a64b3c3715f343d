"""Hand-coded default optimizations: readable rules, each constant named with where it comes from.

`hand_coded_optimizations(kernel)` applies Opts to a Kernel in place; every rule tries its Opt and moves on if the
kernel refuses it (KernelOptError), so a rule never makes a kernel illegal. A rule that must know what an opt would do
first tries it on the kernel's AxisState (`tried`: states are values, so a trial costs no copy and needs no undo).
CPU (LLVM) rules: a register tile for reductions that reuse loads across two output axes (matmul-like), then THREAD
across cores for big kernels.
GPU rules live in `_gpu_rules`: a matrix–vector product (codegen/matvec_rules.py, `matvec_layout`: M ≤ 8 rows of
x times a weight matrix) gets the bandwidth rules of `_matvec`; a big half/bfloat16 matmul without an epilogue on
sm_90a is one warpgroup-MMA kernel (`_warpgroup_matmul`, OptOps.WGMMA); a big float32 one without an epilogue is
there one 3xTF32 warpgroup-MMA kernel (OptOps.TF32X3, F32_MATMUL=3xtf32: the default), else the float32 matmul
template
(`_simt_matmul`, OptOps.SGEMM); another half/bfloat16 matmul, or a float32 one whose inputs are rounded to TF32 in
the graph (the matmul lowering "tf32"), goes to tensor cores (`_tensor_cores`).
A kernel with symbolic sizes gets the same GPU rules on its known axes and guarded splits of its symbolic ones
(`_symbolic_rules`).
"""
from __future__ import annotations
import math
from typing import Optional
from tgrad.codegen.axes import Opt, OptOps
from tgrad.codegen.cpu_gemm import PACK_MIN_ELEMENTS, gemm_axes, gemm_tile
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.matvec_rules import (MATVEC_MAX_M, _matvec, _packed_matvec, _row_matvec,
                                        packed_matvec_layout)
from tgrad.codegen.rule_tools import divisor_at_most, tried, try_opt, try_opts
from tgrad.codegen.simt_matmul import default_tile as simt_default_tile, matmul_of as simt_matmul_of, \
  worth_it as simt_worth_it
from tgrad.codegen.staging import stageable_loads
from tgrad.codegen.warpgroup_mma import default_split_tile, default_tile, loads_by_tma, matmul_of, worth_it
from tgrad.ops import Ops
from tgrad.dtype import dtypes
from tgrad.helpers import Context, cpu_count, prod
from tgrad.shape.sint import divides, is_symbolic, sint, vmax_of

# CPU: an AVX-512 register holds 16 float32; an 8×16 tile of accumulators uses 8 of the 32 vector registers and
# reuses each loaded B vector 8 times (measured on Zen 5, 1024² matmul: 4×16 → 64, 8×16 → 126 GFLOP/s per core).
CPU_TILE_COLUMNS = 16
CPU_TILE_ROWS = 8
# Waking the thread pool costs ~20-50 µs; below this many loop iterations one core is faster.
CPU_THREAD_MIN_WORK = 1 << 17


def _load_strides(kernel: Kernel, axis: int) -> list:
  """Each LOAD's memory stride along `axis` (None where it is not one constant)."""
  return [st.real_strides()[axis] for u, st in zip(kernel.memops, kernel.sts) if u.op is Ops.LOAD]

def _known(kernel: Kernel, axis: int) -> bool: return isinstance(kernel.full_shape[axis], int)

def _register_tile(kernel: Kernel) -> None:
  """Upcast two output axes along which some input is reused (stride 0): the vector axis is contiguous in one
  input; the rows axis replicates the other input's loads. Axes of known size only (a symbolic one stays whole)."""
  if not kernel.reduceops: return
  candidates = [a for a in range(kernel.global_dims) if 0 in _load_strides(kernel, a) and _known(kernel, a)]
  vector_axis = next((a for a in candidates if 1 in _load_strides(kernel, a)
                      and kernel.full_shape[a] % CPU_TILE_COLUMNS == 0), None)
  if vector_axis is None: return
  if not try_opt(kernel, Opt(OptOps.UPCAST, vector_axis, CPU_TILE_COLUMNS)): return
  rows_axis = next((a for a in candidates if a != vector_axis and kernel.full_shape[a] % CPU_TILE_ROWS == 0), None)
  if rows_axis is not None: try_opt(kernel, Opt(OptOps.UPCAST, rows_axis, CPU_TILE_ROWS))

# A big reduce (a split sum's partials, softmax's rows, a column sum's columns) is cut into up to CPU_PIECES_PER_CORE
# pieces a core, which each core runs from its home range and then steals from the others' (runtime.run_on_cores): a
# core slowed by another process then takes fewer pieces instead of holding up the launch while the others wait. Each
# piece keeps CPU_PIECE_MIN_WORK loop iterations at least, so claiming it (about a µs) stays small against it. Measured
# (16M-float sum's partials, 2 Zen 3 cores shared with other work, load average 7): GB/s at the 25th percentile of 40
# launches 7-8 with 2 pieces, 17-18 with 32 or 64.
CPU_PIECES_PER_CORE = 16
CPU_PIECE_MIN_WORK = 1 << 16

def _threads(kernel: Kernel, pieces: bool = False) -> None:
  """Split the outermost output axis of known size across the cores when there is enough work (judged at the
  variables' bounds: a symbolic kernel's loops run to the values of the call); with `pieces`, a big concrete reduce
  into as many pieces a core (up to CPU_PIECES_PER_CORE, halving) as divide the axis and keep CPU_PIECE_MIN_WORK each
  (matmuls keep one piece a core)."""
  cores = cpu_count()
  if cores <= 1 or vmax_of(prod(kernel.full_shape)) < CPU_THREAD_MIN_WORK: return
  if kernel.global_dims == 0: return
  axis = 0 if not kernel.symbolic else \
    next((a for a in range(kernel.global_dims) if _known(kernel, a) and kernel.full_shape[a] > 1), None)
  if axis is None: return
  size = kernel.full_shape[axis]
  if pieces and kernel.reduceops and not kernel.symbolic:
    per_core = CPU_PIECES_PER_CORE
    while per_core > 1:
      count = cores * per_core
      if size % count == 0 and prod(kernel.full_shape) // count >= CPU_PIECE_MIN_WORK and \
         try_opt(kernel, Opt(OptOps.THREAD, axis, count)): return
      per_core //= 2
  for threads in range(cores, 1, -1):
    if size % threads == 0 and try_opt(kernel, Opt(OptOps.THREAD, axis, threads)): return

# A reduce along a strided axis whose input is contiguous along an output axis (a column sum: x.sum(0) of a row-major
# matrix) walks one column per loop and reads one float per row, a new cache line (and page) each step. Upcast the
# contiguous output axis by CPU_COLUMN_VECTORS SIMD vectors: each step of the reduce loop reads that run of one row
# into as many independent vector accumulators (LLVM keeps them in registers). Measured (4096² float32 x.sum(0),
# 2 shared Zen 3 cores, DEBUG=2 kernel time): one column a loop 220 ms; 8, 16, 32, 64 columns 40, 26, 12, 4.2 ms
# (64 is the 16 GB/s of a row sum).
CPU_COLUMN_VECTORS = 8

def _cpu_column_reduce(kernel: Kernel) -> None:
  """UPCAST the innermost output axis by CPU_COLUMN_VECTORS vectors (its largest divisor up to that: a narrow matrix's
  few columns are still read as one run a row) when the largest load is contiguous along it and strided along every
  reduce axis, in a kernel no earlier rule upcast."""
  if not kernel.reduceops or kernel.global_dims == 0 or kernel.first_upcast < kernel.shape_len: return
  if (largest := _largest_load(kernel)) is None: return
  axis, strides = kernel.global_dims - 1, kernel.sts[largest].real_strides()
  reduce_axes = [a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)]
  if strides[axis] != 1 or any(strides[a] in (0, 1) for a in reduce_axes) or not _known(kernel, axis): return
  lanes = max(1, kernel.renderer.vector_bytes // kernel.memops[largest].dtype.itemsize)
  columns = divisor_at_most(kernel.full_shape[axis], CPU_COLUMN_VECTORS * lanes)
  if columns > 1: try_opt(kernel, Opt(OptOps.UPCAST, axis, columns))

# An online log-sum-exp (a LOGADDEXP reduce: the "online" softmax) merges each step's state into its running (max,
# rescaled sum) with one exponential: unrolled, a step's values make their own state first (exponentials off the
# loop-carried path), one merge per CPU_ONLINE_UNROLL values, and the running sum rounds once per step, not per value.
# Measured on a 256×4096 float32 softmax (2 shared cores): unrolled by 1, 8, 16, 32: 3.6, 3.4, 3.1, 2.9 ms and
# 1.3e-5, 2.2e-6, 2.0e-6, 1.9e-6 relative error against float64; 16 keeps the kernel half as long as 32.
CPU_ONLINE_UNROLL = 16

def _unroll_online(kernel: Kernel) -> None:
  """Unroll the innermost reduce axis of a kernel with a LOGADDEXP reduce by its largest divisor up to
  CPU_ONLINE_UNROLL."""
  if not any(r.arg[0] is Ops.LOGADDEXP for r in kernel.reduceops) or kernel.first_reduce >= kernel.first_upcast: return
  axis = kernel.first_upcast - 1
  if (unroll := divisor_at_most(kernel.full_shape[axis], CPU_ONLINE_UNROLL)) > 1:
    try_opt(kernel, Opt(OptOps.UNROLL, axis - kernel.first_reduce, unroll))

# A packed matrix–vector product on a CPU (packed_matvec_layout): each weight byte is unpacked by a few integer ops, so
# the kernel is bound by that arithmetic unless it runs on vectors. Every axis inside a block is unrolled, so one loop
# iteration reads one whole block (its bytes contiguous, its scales once) and its products are one chain of summands
# into the row's accumulator, which the LLVM renderer lets the SLP vectorizer reorder (reorderable_summands): vector
# loads of the block, the bit fields unpacked by vector shifts and masks, float products on vectors, one horizontal sum
# per block. One row per loop (several rows' accumulators in one loop may not be reordered) and the rows across the
# cores. Measured on the 2 shared cores (gemma-3-270m's shapes, one kernel; docs/benchmarks.md has the table).
# A kernel with several sums (a norm fused into its projection: on the CPU, rms_normed_linear normalizes x once
# instead, nn/quant.py's ROW_COPIES) has several accumulators in that loop, none reorderable, so an unrolled block
# stays scalar: it keeps CPU_PACKED_ROWS rows per thread, which share x's loads and
# give LLVM independent chains (measured before the block rule: Q5_0 2048×640 2356 → 926 µs, Q6_K 640×2048 2624 →
# 1593; 8 rows, or the innermost block axis unrolled as well, were slower).
CPU_PACKED_ROWS = 4
# A super-block of sub-blocks (the K-quants: Q4_K's 8 sub-blocks of 32 values, Q6_K's 16 of 16) unrolled whole was
# vectorized by LLVM's SLP across its sub-blocks, not along their values: x gathered by inserts and the sub-blocks'
# 6-bit scales and mins unpacked lane by lane (~700 instructions per Q4_K super-block). Its innermost axis, a run of
# at least CPU_VALUE_LOOP_MIN neighbouring values, stays a loop instead, with the sub-blocks unrolled inside it: the
# LLVM renderer lets the loop vectorizer take that loop (unvectorized_loops), so each sub-block's nibbles unpack and
# multiply 8 values to a vector, and its scale and min, invariant in the loop, are unpacked once per super-block.
# Measured on the 2 shared cores (CPU µs, one kernel): Q4_K 640×1024 ~440 → ~220, Q6_K 640×2048 ~570 → ~350. A block
# of fewer sub-blocks is unrolled whole (Q4_0's two nibble halves of 16 values: as a loop, 4× slower).
CPU_VALUE_LOOP_MIN = 16
CPU_VALUE_LOOP_SUB_BLOCKS = 4

def _cpu_packed_matvec(kernel: Kernel) -> bool:
  if (layout := packed_matvec_layout(kernel)) is None: return False
  for axis in layout.m_axes: try_opt(kernel, Opt(OptOps.UPCAST, axis, 0))
  if len(kernel.reduceops) == 1: _unroll_block(kernel)
  elif kernel.full_shape[layout.n_axis] % CPU_PACKED_ROWS == 0:
    try_opt(kernel, Opt(OptOps.UPCAST, layout.n_axis, CPU_PACKED_ROWS))
  _threads(kernel)
  return True

def _unroll_block(kernel: Kernel) -> None:
  """UNROLL every reduce axis after the first (the blocks), innermost first, so the axis numbers left stay put; a block
  of sub-blocks keeps its innermost axis (its values) as a loop (CPU_VALUE_LOOP_MIN)."""
  last = kernel.first_upcast
  if kernel.full_shape[last - 1] >= CPU_VALUE_LOOP_MIN and \
     prod(kernel.full_shape[kernel.first_reduce + 1:last - 1]) >= CPU_VALUE_LOOP_SUB_BLOCKS: last -= 1
  for axis in reversed(range(kernel.first_reduce + 1, last)):
    try_opt(kernel, Opt(OptOps.UNROLL, axis - kernel.first_reduce, 0))
def _cpu_gemm(kernel: Kernel) -> bool:
  """A matmul (cpu_gemm.gemm_axes): the register tile sized for the SIMD registers (cpu_gemm.gemm_tile; fewer rows,
  the largest power of two that divides them, where the tile's doesn't), the columns' panels outermost (SWAP) so that
  one panel of B (packed by realize, cpu_gemm.pack_plan) stays in cache while every row tile walks it, and threads
  over the panels. All or nothing: a kernel whose columns don't divide into the tile's gets the generic register
  tile."""
  if (axes := gemm_axes(kernel.state)) is None: return False
  caps = kernel.renderer
  tile = gemm_tile(caps.vector_bytes, caps.vector_registers, kernel.reduceops[0].dtype)   # the accumulators'
  rows, columns = axes.rows, axes.columns
  if kernel.full_shape[columns] % tile.columns: return False
  opts = [Opt(OptOps.UPCAST, columns, tile.columns)]
  row_count = kernel.full_shape[rows]
  # a symbolic row count (a prompt's tokens) gets the whole tile where it is a multiple of it (cpu_gemm.pack_plan pads
  # it so); a guard would mask A's loads in the tile's inner loop
  if isinstance(row_count, int): tile_rows = math.gcd(row_count, tile.rows)
  else: tile_rows = tile.rows if divides(tile.rows, row_count) else 1
  if tile_rows > 1: opts.append(Opt(OptOps.UPCAST, rows, tile_rows))
  if rows < columns: opts.append(Opt(OptOps.SWAP, rows, columns))
  if not try_opts(kernel, opts): return False
  _threads(kernel)
  return True

# A copy into a matmul's column panels (cpu_gemm.pack_plan) reads each row of B one panel's width (64 bytes of float32
# on AVX2) at a time: a step over CPU_COPY_PANELS neighbouring panels reads that many panels' width of the row at once
# (256 contiguous bytes) and writes a row into each panel. Measured (4096×1024 float32 B, 2 shared Zen 3 cores, median
# of 20): 5.5 ms a copy → 2.4 ms; 2 panels 2.6 ms.
CPU_COPY_PANELS = 4
CPU_SHORT_RUN_BYTES = 64   # a cache line: a contiguous run this short gains from a wider step

def _cpu_short_rows(kernel: Kernel) -> bool:
  """An elementwise kernel whose innermost axis is a short contiguous run of the output (at most CPU_SHORT_RUN_BYTES)
  that its largest load continues along the outermost axis (that load's stride there is the run's length), as big as a
  packed B at least: UPCAST the outermost axis by CPU_COPY_PANELS."""
  if kernel.reduceops or kernel.shape_len < 2 or kernel.applied_opts or kernel.symbolic: return False
  if prod(kernel.full_shape) < PACK_MIN_ELEMENTS: return False
  inner, run = kernel.shape_len - 1, kernel.full_shape[-1]
  if (largest := _largest_load(kernel)) is None or kernel.sts[0].real_strides()[inner] != 1: return False
  strides = kernel.sts[largest].real_strides()
  if run * kernel.memops[largest].dtype.itemsize > CPU_SHORT_RUN_BYTES or strides[inner] != 1 or strides[0] != run:
    return False
  return kernel.full_shape[0] % CPU_COPY_PANELS == 0 and try_opt(kernel, Opt(OptOps.UPCAST, 0, CPU_COPY_PANELS))

def _cpu_rules(kernel: Kernel) -> None:
  if _cpu_packed_matvec(kernel): return
  if _cpu_gemm(kernel): return
  _cpu_short_rows(kernel)
  _register_tile(kernel)
  _cpu_column_reduce(kernel)
  _unroll_online(kernel)
  _threads(kernel, pieces=True)

# GPU: 256 threads per block (8 warps) keeps an SM's 2048 thread slots full with 8 blocks and leaves room for
# registers; the CUDA best-practices guide recommends 128–256.
GPU_THREADS_PER_BLOCK = 256
# A float4 access (16 bytes) per thread is the widest load/store; 4 outputs per thread amortize index math.
GPU_UPCAST = 4
# Reductions with at most this many outputs cannot fill the GPU with one thread per output (an H100 runs 270k
# threads at once): each output's reduce is split across a block of threads (GROUP) and combined in shared memory.
GPU_GROUP_MAX_OUTPUTS = 16384
GPU_GROUP_MIN_REDUCE = 256      # below this a block-wide combine costs more than one thread looping
# A row kernel (softmax, norms: AxisState.row_passes > 1) walks each row several times: a block shares each row whatever
# the number of rows, from a warp's worth of elements (one thread per row would read rows D elements apart, uncoalesced,
# and run the passes one after the other).
GPU_ROW_MIN_GROUP = 32
# A row kernel's threads each combine all of the group's partials after every pass (they all need the result), so its
# group grows with the row only until each thread walks GPU_ROW_STEPS_PER_THREAD steps (float4s) per pass, and to at
# most GPU_ROW_MAX_GROUP threads. Measured on an H100, softmax over rows of 4096 float32 (kernel alone; torch 60.7 µs):
# 64 threads 65.8 µs, 128 49.4, 256 99.6, 512 353; 2 rows of 64 60.7. Rows of 1024 (torch 49.5): 64 threads 48.7,
# 128 95.9. float16 rows of 4096 (torch 56.6): 128 threads 46.2.
GPU_ROW_STEPS_PER_THREAD = 8
GPU_ROW_MAX_GROUP = 128
# A row kernel of at most GPU_FEW_ROWS rows leaves the GPU nearly idle whatever its blocks do, so only its latency
# counts: where a group's partials combine by warp shuffles (Renderer.warp_lanes: a few shuffles and a slot a warp,
# not a slot a thread), a step a thread, in whole warps, up to GPU_GROUP_THREADS (gemma's final norm: 40 threads of
# four float4 steps → 160 of one).
GPU_FEW_ROWS = 8
GPU_GROUP_THREADS = 256
GPU_GROUP_MIN_THREADS = 64      # two warps: fewer threads per block can't hide memory latency
GPU_WARP = 32                   # threads of a warp: enough neighbours on one axis for a coalesced 128-byte access
# Register tile for reductions that reuse loads across two output axes (matmul): 4×4 accumulators per thread.
GPU_TILE = 4
GPU_TILE_THREADS = 16          # 16×16 threads of 4×4 tiles: a block computes a 64×64 output tile
# Big matmul outputs: 8×8 accumulators per thread load 16 values per 64 FMAs (4×4: 8 per 16), and 8×8 threads
# per block. Measured on an H200, 4096² fp32 (bench/matmul_sweep.py, TFLOP/s; torch 51): 4×4 tiles with 16×16
# threads 28.3; 8×8 tiles with 8×8 threads 32.4 (16×8 32.4, 8×16 32.2, 16×16 30.7); 8×4 ≤ 30.9; 4×8 ≤ 24.5; a
# thread's 8 columns as two float4 groups a warp apart ≤ 27.8; K unrolled by 2 or 8 instead of 4 is slower.
GPU_BIG_TILE = 8
GPU_BIG_TILE_THREADS = 8
# 8×8 tiles only from a 2048² output up: that is 65k threads, about the 132 SMs × 512 threads that ~128 registers
# per thread leave resident on an H200, so smaller outputs keep 4×4 tiles and more threads.
GPU_BIG_TILE_MIN_OUTPUTS = 2048 * 2048
# With both inputs staged in shared memory (OptOps.SMEM, software-pipelined, B copied with cp.async): 8×8 tiles whose
# 8 columns are two float4 groups 64 columns apart, 8×16 threads, K unrolled by 8. Measured on an H100, 4096² fp32
# (bench/matmul_sweep.py, TFLOP/s; torch 51.5): this 43.0, A's rows padded by 4 42.3, 8×32 threads 42.8 (43.8 padded),
# 8×8 41.9; K unrolled by 4 ≤ 35.7; earlier sweeps: 8×4 and 4×8 tiles ≤ 31.5, the best without shared memory 31.0.
GPU_STAGED_TILE_COLUMNS = 4        # contiguous columns per float4 group
GPU_STAGED_THREADS = (8, 16)       # (rows, columns)
GPU_STAGED_UNROLL = 8
GPU_STAGED_PADDING = (0, 0)        # (A, B) floats after each row of the shared tile
GPU_UNROLL = 4                  # unroll a reduce loop that is contiguous in some input: float4 loads

def _output_stride(kernel: Kernel, axis: int):
  return kernel.sts[0].real_strides()[axis]

def _thread_split(size: sint, limit: int) -> int:
  """Threads to spread an axis over (LOCAL, GROUP), at most `limit`: a known size's largest divisor; a symbolic size's
  largest power of two up to its bound, which the kernel pads when it doesn't divide every value (a guarded split,
  opts._split_symbolic_axis: the padding's threads load and store nothing)."""
  if isinstance(size, int): return divisor_at_most(size, limit)
  return 1 << (max(1, min(limit, vmax_of(size))).bit_length() - 1)

def _group_small_reduce(kernel: Kernel) -> bool:
  """A reduce with few outputs (a full sum, matrix–vector) or a row kernel's rows (GPU_ROW_MIN_GROUP): a block of
  threads per output, each thread reducing a strided share of the inputs, combined in shared memory."""
  if not kernel.reduceops or kernel.first_reduce >= kernel.first_upcast: return False
  rows = kernel.row_passes > 1
  if not rows and vmax_of(prod(kernel.output_shape[:kernel.first_reduce])) > GPU_GROUP_MAX_OUTPUTS: return False
  if kernel.full_shape[kernel.first_reduce] < (GPU_ROW_MIN_GROUP if rows else GPU_GROUP_MIN_REDUCE): return False
  threads = GPU_GROUP_THREADS
  # a reduce that is strided in memory: a warp's worth of threads on the output axis that is contiguous instead
  if 1 not in _load_strides(kernel, kernel.first_reduce):
    for out_axis in reversed(range(kernel.global_dims)):
      if 1 in _load_strides(kernel, out_axis):
        local = divisor_at_most(kernel.full_shape[out_axis], GPU_WARP)
        if local > 1 and try_opt(kernel, Opt(OptOps.LOCAL, out_axis, local)): threads //= local
        break
  # unroll first, then group what is left: thread g reads elements 4g..4g+3 of each 4·group chunk (a float4)
  axis = kernel.first_reduce
  if 1 in _load_strides(kernel, axis) and kernel.full_shape[axis] % GPU_UNROLL == 0 and \
     kernel.full_shape[axis] >= GPU_UNROLL * GPU_GROUP_MIN_THREADS:
    try_opt(kernel, Opt(OptOps.UNROLL, 0, GPU_UNROLL))
  # one thread then reduces the group's partials serially: balance those steps against each thread's share of the
  # reduce (group ≈ √reduce steps), keeping a few warps per block
  steps = kernel.full_shape[kernel.first_reduce]
  balanced = 1 << (math.isqrt(steps).bit_length() - 1)
  if rows: balanced = min(GPU_ROW_MAX_GROUP, steps // GPU_ROW_STEPS_PER_THREAD)
  group = divisor_at_most(steps, min(threads, max(GPU_GROUP_MIN_THREADS, balanced)))
  if rows and (lanes := kernel.renderer.warp_lanes) and isinstance(steps, int) and \
     vmax_of(prod(kernel.output_shape[:kernel.first_reduce])) <= GPU_FEW_ROWS:
    whole_warps = [d for d in range(lanes, min(threads, steps) + 1, lanes) if steps % d == 0]
    if whole_warps: group = whole_warps[-1]
  return group > 1 and try_opt(kernel, Opt(OptOps.GROUP, 0, group))

def _gpu_upcast(kernel: Kernel) -> int:
  """Elementwise: 4 outputs per thread along the contiguous output axis (float4 stores and loads). Reductions: a
  register tile over output axes along which an input is reused (stride 0), then unroll a contiguous reduce.
  Returns the threads per output axis that suit the tile (see _gpu_locals)."""
  if not kernel.reduceops:
    axis = next((a for a in reversed(range(kernel.global_dims)) if _output_stride(kernel, a) == 1), None)
    if axis is not None and divides(GPU_UPCAST, kernel.full_shape[axis]):
      try_opt(kernel, Opt(OptOps.UPCAST, axis, GPU_UPCAST))
    return GPU_TILE_THREADS
  # a symbolic kernel never takes big tiles: its sizes at the bound overstate the usual work (a 520-token prefill in a
  # 4096-position cache)
  big = not kernel.symbolic and prod(kernel.output_shape) >= GPU_BIG_TILE_MIN_OUTPUTS
  tile, threads = (GPU_BIG_TILE, GPU_BIG_TILE_THREADS) if big else (GPU_TILE, GPU_TILE_THREADS)
  # an axis keeps at least two tiles for its threads; in a symbolic kernel a symbolic axis is tiled with a guard
  # (opts.pad_symbolic_axis: a prefill matmul's prompt rows, 4×4 as a concrete matmul) and a known axis may be tiled
  # whole (attention's 4 heads): the symbolic axes have the threads
  def tile_of(size: sint) -> int:
    if not isinstance(size, int): return tile
    return tile if divides(tile * (1 if kernel.symbolic else 2), size) else 1
  reused = [a for a in reversed(range(kernel.global_dims)) if 0 in _load_strides(kernel, a)
            and tile_of(kernel.full_shape[a]) > 1][:2]
  # a symbolic axis is first padded to its block's share (the tile × its threads, opts.padto), every one before
  # any split, so the upcast and the LOCAL after it divide and each replica tests only its own position (row < n);
  # where that padding is refused (a small bound), the upcast is guarded alone
  for axis in reused:
    if not divides(tile, size := kernel.full_shape[axis]) and not isinstance(size, int):
      try_opt(kernel, Opt(OptOps.PADTO, axis, tile * threads))
  tiled = [try_opt(kernel, Opt(OptOps.UPCAST, axis, tile_of(kernel.full_shape[axis]))) for axis in reused]
  if kernel.first_reduce < kernel.first_upcast and 1 in _load_strides(kernel, kernel.first_reduce) and \
     divides(GPU_UNROLL, kernel.full_shape[kernel.first_reduce]):
    try_opt(kernel, Opt(OptOps.UNROLL, 0, GPU_UNROLL))
  return threads if tiled == [True, True] else GPU_TILE_THREADS

def _stageable_matmul_axes(kernel: Kernel) -> Optional[tuple[int, int]]:
  """(columns, rows) of a matmul-like reduce whose two inputs SMEM can stage, each reused (stride 0) along one output
  axis; None for any other kernel."""
  if not kernel.reduceops or len(stageable_loads(kernel)) != 2 or kernel.first_reduce >= kernel.first_upcast:
    return None
  reused = [a for a in reversed(range(kernel.global_dims)) if 0 in _load_strides(kernel, a)]
  return (reused[0], reused[1]) if len(reused) >= 2 else None

def _staged_matmul(kernel: Kernel) -> bool:
  """A big matmul-like reduce (two inputs, each reused along one output axis): the register tile of GPU_BIG_TILE
  rows and columns, both inputs' tiles staged in shared memory. All or nothing: the kernel is unchanged if any opt is
  refused."""
  if prod(kernel.output_shape) < GPU_BIG_TILE_MIN_OUTPUTS or (axes := _stageable_matmul_axes(kernel)) is None:
    return False
  return try_opts(kernel, _staged_opts(*axes))

def _staged_opts(columns: int, rows: int) -> list[Opt]:
  split = GPU_BIG_TILE // GPU_STAGED_TILE_COLUMNS
  return [Opt(OptOps.UPCAST, columns, GPU_STAGED_TILE_COLUMNS), Opt(OptOps.UPCAST, rows, GPU_BIG_TILE),
          Opt(OptOps.UNROLL, 0, GPU_STAGED_UNROLL), Opt(OptOps.LOCAL, rows, GPU_STAGED_THREADS[0]),
          Opt(OptOps.LOCAL, columns, GPU_STAGED_THREADS[1]), Opt(OptOps.UPCAST, columns, split),
          *[Opt(OptOps.SMEM, operand, padding) for operand, padding in enumerate(GPU_STAGED_PADDING)]]

# A symbolic prefill matmul (rows = the prompt length, columns and the reduce known) takes the staged 8×8 tiles at any
# size: its rows padded to a block's 64 first. Measured on an H100, float32 y = x[:n]·Wᵀ (bench/symbolic_matmul.py, µs,
# guarded 4×4 tiles → staged): 4096×640 at n = 7 / 100 / 520 / 2048: 94 / 99 / 468 / 1503 → 45 / 49 / 105 / 276;
# 1536×640 191 → 49 at 520; 640×1024 155 → 76; 640×2048 307 → 148.
GPU_STAGED_ROWS_PER_BLOCK = GPU_BIG_TILE * GPU_STAGED_THREADS[0]

def _staged_symbolic_matmul(kernel: Kernel) -> bool:
  """A float32 matmul-like reduce of known length whose rows axis is symbolic and columns known: PADTO the rows to a
  block's share, then the staged tiles (_staged_opts). All or nothing. Half inputs keep the unstaged tiles where
  tensor cores don't apply: staged, the float16 prefill's o_proj (its x computed in the kernel) made the 520-token
  prefill 12.1 → 14.2 ms on an H100."""
  if (axes := _stageable_matmul_axes(kernel)) is None or is_symbolic(kernel.full_shape[kernel.first_reduce:]) or \
     any(u.dtype != dtypes.float32 for u in stageable_loads(kernel)): return False
  columns, rows = axes
  if not _known(kernel, columns) or _known(kernel, rows): return False
  return try_opts(kernel, [Opt(OptOps.PADTO, rows, GPU_STAGED_ROWS_PER_BLOCK), *_staged_opts(columns, rows)])

def _gpu_locals(kernel: Kernel, tile_threads: int = GPU_TILE_THREADS) -> None:
  """Threads on the output axes up to GPU_THREADS_PER_BLOCK, the innermost axis served first (at most
  tile_threads of them per axis in a reduce, whose loads neighbouring rows and columns share through the cache). They
  are applied outermost first: the last local axis becomes threadIdx.x, so neighbouring threads touch neighbouring
  outputs."""
  budget = GPU_THREADS_PER_BLOCK // prod(kernel.local_axis_sizes)
  per_axis = tile_threads if kernel.reduceops and kernel.global_dims > 1 else budget
  amounts: dict[int, int] = {}
  for axis in reversed(range(kernel.global_dims)):
    if budget < 2: break
    if (local := _thread_split(kernel.full_shape[axis], min(budget, per_axis))) > 1:
      amounts[axis] = local
      budget //= local
  for axis in sorted(amounts): try_opt(kernel, Opt(OptOps.LOCAL, axis, amounts[axis]))

# Tensor cores (OptOps.TC, one warp per 16×8 tile): each warp computes GPU_TC_TILE_ROWS × GPU_TC_TILE_COLUMNS tiles,
# so an A fragment feeds every column tile and a B fragment every row tile (128 f32 accumulators per lane); the
# column tiles are spread (UPCAST before TC) so each lane's columns are adjacent in memory. Measured on an H200,
# 4096² fp16 (bench/tc_matmul.py): tiles 4×4 94, 4×8 108, spread 4×8 with 2×2 warps per block 194, with one warp per
# block 207 TFLOP/s (BEAM's pick: no shared memory, so a block's warps share nothing that the SM's other blocks don't);
# 8×8 spills registers (54). An UNROLL of 2 adds ~9% but doubles the code the linearizer writes. A later sweep
# (bench/matmul_sweep.py) found nothing better: default 210, + UNROLL 2 207, + 2×2 warps + UNROLL 2 212, 16×2 tiles
# 176, 8×2 143, 4×4 141; without shared memory the fragments' global (L1) loads bound it.
GPU_TC_TILE_ROWS = 4
GPU_TC_TILE_COLUMNS = 8
# Big half matmuls stage both inputs in shared memory (SMEM: cp.async copies, fragments by ldmatrix): 2×2 warps of
# 4×8 tiles (a 128×128 block tile), K unrolled by 4 (64 per step, 72 KiB of tiles: dynamic shared memory), rows
# padded by 8 halves so a matrix's 8 rows fall on different banks. Measured on an H100, 4096² fp16
# (bench/matmul_sweep.py, TFLOP/s; torch 701): this 354.5, K by 2 276.5 (fits 48 KiB), 4×1 warps 327.5, 8×4 tiles with
# 2×4 warps 320.9, 4×2 warps 309.6; without shared memory ≤ 212.
GPU_TC_STAGED_WARPS = (2, 2)
GPU_TC_STAGED_UNROLLS = (4, 2)     # the first whose tiles fit the GPU's shared memory
GPU_TC_STAGED_PADDING = 8

def _tc_column_spread(kernel: Kernel, columns: int) -> int:
  """The largest column-tile count (at most GPU_TC_TILE_COLUMNS) that can be upcast before TC with TC still tiling
  the same columns axis: then a lane's columns in those tiles are adjacent in memory (vector loads of a row-major B,
  float4 stores of C)."""
  for amount in range(GPU_TC_TILE_COLUMNS, 1, -1):
    trial = tried(kernel.state, [Opt(OptOps.UPCAST, columns, amount), Opt(OptOps.TC, 0, 0)])
    if trial is not None and trial.tensor_core is not None and trial.tensor_core.columns_axis == columns: return amount
  return 1

def _staged_tensor_cores(kernel: Kernel) -> bool:
  """A big tensor-core matmul with both inputs staged (see GPU_TC_STAGED_*); all or nothing."""
  if prod(kernel.output_shape) < GPU_BIG_TILE_MIN_OUTPUTS or len(stageable_loads(kernel)) != 2: return False
  trial = tried(kernel.state, [Opt(OptOps.TC, 0, 0)])
  if trial is None or trial.tensor_core is None: return False
  rows, columns = trial.tensor_core.rows_axis, trial.tensor_core.columns_axis   # the axes TC picks (and leaves)
  for unroll in GPU_TC_STAGED_UNROLLS:
    opts = [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, rows, GPU_TC_TILE_ROWS),
            Opt(OptOps.UPCAST, columns, GPU_TC_TILE_COLUMNS), Opt(OptOps.LOCAL, rows, GPU_TC_STAGED_WARPS[0]),
            Opt(OptOps.LOCAL, columns, GPU_TC_STAGED_WARPS[1]), Opt(OptOps.UNROLL, 0, unroll),
            Opt(OptOps.SMEM, 0, GPU_TC_STAGED_PADDING), Opt(OptOps.SMEM, 1, GPU_TC_STAGED_PADDING)]
    if try_opts(kernel, opts): return True
  return False

def _tensor_cores(kernel: Kernel) -> bool:
  """A sum of products of two half/bfloat16 loads (or TF32-rounded float32 loads: whatever TC accepts) into float32
  on a GPU with tensor cores: big ones staged in shared memory (_staged_tensor_cores); else the warp's column tiles
  (UPCAST before TC, see _tc_column_spread), TC, then its row tiles (UPCAST, the largest amount that divides); one
  warp per block. The constants were measured on half matmuls; TF32 has not been swept yet. A symbolic rows or
  columns axis (a prefill's prompt rows) is first padded to the warp's tiles (PADTO, the guard of a split: one test
  per row, rows × GPU_TC_TILE_ROWS), so the tiles divide it; symbolic kernels are never staged."""
  trial = tried(kernel.state, [Opt(OptOps.TC, 0, 0)]) if kernel.renderer.tensor_cores else None
  if trial is None or trial.tensor_core is None: return False
  if not kernel.symbolic and _staged_tensor_cores(kernel): return True
  rows_axis, columns = trial.tensor_core.rows_axis, trial.tensor_core.columns_axis
  tile_rows, tile_columns, _ = trial.tensor_core.core.dims
  for axis, warp_tile in ((rows_axis, tile_rows * GPU_TC_TILE_ROWS), (columns, tile_columns * GPU_TC_TILE_COLUMNS)):
    if not isinstance(kernel.full_shape[axis], int): try_opt(kernel, Opt(OptOps.PADTO, axis, warp_tile))
  if (spread := _tc_column_spread(kernel, columns)) > 1: kernel.apply_opt(Opt(OptOps.UPCAST, columns, spread))
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  use = kernel.tensor_core
  assert use is not None
  if (rows := divisor_at_most(kernel.full_shape[use.rows_axis], GPU_TC_TILE_ROWS)) > 1:
    try_opt(kernel, Opt(OptOps.UPCAST, use.rows_axis, rows))
  return True

def _warpgroup_matmul(kernel: Kernel) -> bool:
  """A big half/bfloat16 matmul with no epilogue on sm_90a (warpgroup_mma.py says which qualify and which are big
  enough: a symbolic M, a prompt's rows, at its maximum) is one warpgroup-MMA kernel with the tile `default_tile`
  picks (a TMA tile under WGMMA_TMA=1 where TMA can load it: a known M and a row-major A); WGMMA=0 turns this off.
  A big matmul of plain float32 loads is one 3xTF32 warpgroup-MMA kernel (OptOps.TF32X3, tile `default_split_tile`)
  under F32_MATMUL=3xtf32 (the default), whatever WGMMA says (it beat the CUDA-core template at every shape of
  bench/sgemm.py on an H100); F32_MATMUL=simt leaves it to the rules after this."""
  if not kernel.renderer.warpgroup_mma: return False
  use = matmul_of(kernel.state)
  if isinstance(use, str) or not worth_it(use): return False
  if use.split_tf32:
    return Context.F32_MATMUL == "3xtf32" and try_opt(kernel, Opt(OptOps.TF32X3, 0, default_split_tile(use.m, use.n)))
  return bool(Context.WGMMA) and \
    try_opt(kernel, Opt(OptOps.WGMMA, 0, default_tile(use.m, use.n, bool(Context.WGMMA_TMA) and loads_by_tma(use))))

def _simt_matmul(kernel: Kernel) -> bool:
  """A big float32 matmul with no epilogue (simt_matmul.py says which qualify and which are big enough) is the
  float32 matmul template with the tile `default_tile` picks; SGEMM=0 turns this off (the staged kernel instead)."""
  if not Context.SGEMM or not kernel.renderer.simt_matmul: return False
  use = simt_matmul_of(kernel.state)
  return not isinstance(use, str) and simt_worth_it(use) and \
    try_opt(kernel, Opt(OptOps.SGEMM, 0, simt_default_tile(use.m, use.n)))

def _gpu_rules(kernel: Kernel) -> None:
  if _matvec(kernel): return
  if _packed_matvec(kernel): return
  if _row_matvec(kernel): return
  if _warpgroup_matmul(kernel): return
  if _simt_matmul(kernel): return
  if _tensor_cores(kernel): return
  if _group_small_reduce(kernel): return   # its block is the group (and a warp of outputs for a strided reduce)
  if _staged_matmul(kernel): return
  _gpu_locals(kernel, _gpu_upcast(kernel))

# A kernel with symbolic sizes gets the GPU rules of a concrete kernel of its structure on every axis whose size is
# known (unrolls, register tiles, groups, locals), and guarded splits of its symbolic axes (opts._split_symbolic_axis:
# LOCAL and GROUP pad the axis and mask the padding; UPCAST and UNROLL only by what divides every value). A reduce
# over a symbolic axis with few outputs, or a row kernel's rows (decode attention over the filled cache slots, softmax
# over a symbolic row): a group of threads splits the reduce axis (_group_symbolic_reduce); otherwise the concrete
# rules. On a CPU the concrete CPU rules on the axes of known size: the register tile and the thread split (a
# prefill matmul's columns across the cores); a symbolic axis stays one loop (LLVM vectorizes it).
# Blocks a symbolic reduce's group layout keeps at least: two per SM of an H100 (132 SMs; MATVEC_MIN_BLOCKS's reason),
# as a power of two. Fewer blocks leave SMs idle and make each thread's loop longer: decode attention at position 2000
# ran 16 blocks of 64 threads, each looping over every key (117 µs a layer on an H100).
SYMBOLIC_MIN_BLOCKS = 256

def _largest_load(kernel: Kernel) -> Optional[int]:
  """The index in kernel.sts of the load that reads the most bytes (at the variables' maximum), None without loads."""
  loads = [i for i, u in enumerate(kernel.memops) if u.op is Ops.LOAD]
  if not loads: return None
  return max(loads, key=lambda i: kernel.sts[i].buffer_extent() * kernel.memops[i].dtype.itemsize)

def _group_symbolic_reduce(kernel: Kernel) -> bool:
  """A reduce over a symbolic axis with few outputs (at most GPU_GROUP_MAX_OUTPUTS at the variables' bounds), or a row
  kernel's rows: a block of GPU_GROUP_THREADS threads per output splits the reduce (a guarded GROUP: a max or a sum of
  exponentials sees its identity in the padding). When the biggest input is strided along the reduce and contiguous
  along an output axis (decode attention's values: keys × head dim), a few neighbouring outputs share the block along
  that axis, as many as keep SYMBOLIC_MIN_BLOCKS blocks, so a warp reads whole 32-byte sectors of each row."""
  if not kernel.reduceops or kernel.first_reduce >= kernel.first_upcast: return False
  reduce_size = kernel.full_shape[kernel.first_reduce]
  if isinstance(reduce_size, int): return False
  outputs = vmax_of(prod(kernel.output_shape[:kernel.first_reduce]))
  if kernel.row_passes <= 1 and outputs > GPU_GROUP_MAX_OUTPUTS: return False
  threads, local = GPU_GROUP_THREADS, 1
  if (largest := _largest_load(kernel)) is not None and kernel.sts[largest].real_strides()[kernel.first_reduce] != 1:
    strides = kernel.sts[largest].real_strides()
    out_axis = next((a for a in reversed(range(kernel.global_dims)) if strides[a] == 1), None)
    if out_axis is not None:
      local = divisor_at_most(kernel.full_shape[out_axis], GPU_WARP)
      while local > 1 and outputs // local < SYMBOLIC_MIN_BLOCKS: local //= 2
      if local > 1 and try_opt(kernel, Opt(OptOps.LOCAL, out_axis, local)): threads //= local
      else: local = 1
  # a group that fills the block when outputs share it; alone, group ≈ √(reduce steps at the bound), as
  # _group_small_reduce balances a thread's share of the reduce against the combine
  balanced = 1 << (math.isqrt(vmax_of(reduce_size)).bit_length() - 1)
  group = _thread_split(reduce_size, threads if local > 1 else min(threads, max(GPU_GROUP_MIN_THREADS, balanced)))
  return group > 1 and try_opt(kernel, Opt(OptOps.GROUP, 0, group))

def _group_known_reduce(kernel: Kernel) -> bool:
  """A reduce of known size with few outputs (at the bounds): _group_small_reduce's block per output, after the small
  known output axes along which the biggest input is reused are upcast whole (decode attention's scores: the 4 query
  heads of one key head read each key row once, as a matrix–vector product's rows of x). All or nothing."""
  if not kernel.reduceops or not isinstance(kernel.full_shape[kernel.first_reduce], int): return False
  trial = kernel.copy()
  if trial.row_passes <= 1 and (largest := _largest_load(trial)) is not None:
    strides, sizes = trial.sts[largest].real_strides(), trial.full_shape
    for axis in [a for a in range(trial.global_dims) if strides[a] == 0 and isinstance(sizes[a], int)
                 and 1 < sizes[a] <= MATVEC_MAX_M]:
      try_opt(trial, Opt(OptOps.UPCAST, axis, 0))   # whole axes: the axis numbers stay
  if not _group_small_reduce(trial): return False
  kernel.state = trial.state
  return True

# A symbolic kernel is threaded on the CPU when it has enough work with each symbolic size at this value (capped by its
# bound): a prefill of a prompt this long amortizes waking the threads. Judged at the bound instead, decode attention
# (its sizes the filled cache slots) was threaded too, and a tiny-Gemma step on 2 cores took 0.35 ms at position 100
# and 0.76 at 2000 where one core took 0.26 and 0.62.
CPU_THREAD_SYMBOLIC_SIZE = 64

def _symbolic_cpu_rules(kernel: Kernel) -> None:
  """The CPU rules on the axes of known size: the matmul's register tile or the generic one (a symbolic reduce into
  outputs of known count too, decode attention's values over the filled slots: its value rows are then read 16 wide,
  and each exponential serves 16 outputs; a prefill's p·v over the keys, its rows the prompt's, gains 2.5-3.5x at
  128 tokens), an online reduce's unroll, and the thread split of a known output axis when the work at
  CPU_THREAD_SYMBOLIC_SIZE is enough. Measured (2-core Zen 4, gemma's decode p·v, 4 heads × 256 over K filled slots,
  one kernel alone): K = 40 / 100 / 500: 81 / 256 / 790 µs untiled, 12 / 29 / 121 µs with the tile."""
  decode_like = not is_symbolic(kernel.full_shape[:kernel.first_reduce]) and \
    is_symbolic(kernel.full_shape[kernel.first_reduce:])
  if not decode_like and _cpu_gemm(kernel): return
  _register_tile(kernel)
  _unroll_online(kernel)
  if prod(s if isinstance(s, int) else min(vmax_of(s), CPU_THREAD_SYMBOLIC_SIZE) for s in kernel.full_shape) >= \
     CPU_THREAD_MIN_WORK: _threads(kernel)

def _symbolic_rules(kernel: Kernel) -> None:
  """The rules for a kernel whose loops have symbolic trip counts (see above)."""
  if not kernel.renderer.has_local:
    if kernel.renderer.has_threads: _symbolic_cpu_rules(kernel)
    return
  if _warpgroup_matmul(kernel): return   # a prefill projection (rows: the prompt length) on sm_90a
  if _group_symbolic_reduce(kernel) or _group_known_reduce(kernel) or _tensor_cores(kernel): return
  if _staged_symbolic_matmul(kernel): return
  _gpu_locals(kernel, _gpu_upcast(kernel))

def hand_coded_optimizations(kernel: Kernel) -> None:
  if kernel.symbolic: _symbolic_rules(kernel)
  elif kernel.renderer.has_local: _gpu_rules(kernel)
  elif kernel.renderer.has_threads: _cpu_rules(kernel)
