"""3xTF32 on the Hopper warpgroup MMA (sm_90a): a float32 matmul C = A·Bᵀ (B stored N×K, a linear layer's weight) or
C = A·B (B stored K×N) to float32-class accuracy on the TF32 tensor cores. Each float32 operand x is split into two
TF32 numbers, big = tf32(x) (to nearest, ties away from zero) and small = tf32(x − big) (x − big is exact in float32),
and C = Σ small_a·big_b + big_a·small_b + big_a·big_b, summed in the float32 accumulators; the small·small term (about
2^-22 of a product) is dropped, and small keeps 11 of the 13 bits big lacks, so an operand is carried to about 2^-22
relative: a few float32 roundings. Three wgmmas per K step of 8, a third of the TF32 kernel's rate.

The kernel is wgmma.py's cp.async kernel (its copies, pipeline of `stages` buffers, descriptors and epilogue: read its
docstring) for float32 elements (a K tile of 32, 16-byte chunks of 4), with these differences:
  - **Shared layout.** The `stages` buffers hold A's and B's tiles as wgmma.py lays them out (K-major, 128-byte
    swizzle): the big parts. After them come SPLIT_SLOTS (3) buffers of the same layout for the small parts, tile t's
    in slot t mod 3 (`small_shift`: bytes from a big part to its small part this iteration). Three suffice: tile t's
    small parts are written before iteration t's barrier, and once past the barrier of iteration t + 2 every
    warpgroup has waited for tile t's wgmmas (`wgmma.wait_group 1` at the end of iteration t + 1). So the small
    parts cost 3 stages' bytes whatever `stages` is (warpgroup_mma.SPLIT_TILES).
  - **Split in place.** After its cp.async.wait_group each thread splits the K-major chunks it copied itself (A's,
    and B's when B is N×K): big over the float32 chunk, small at the same place in the slot's tiles (`split_tile`).
  - **B stored K×N** (a plain a·b). TF32 wgmma reads K-major operands only, so B's float32 tile is staged row-major
    in B's region (K-row k at k·4·BN, cp.async of 16-byte runs of N: `copy_row_major`, `row_major_offset`), and after
    a barrier every thread reads its chunks of the transpose (4 K-values of one column: `transpose_chunk`;
    consecutive threads take consecutive columns, so a warp's reads hit 32 banks and each 8 threads' float4 writes 8
    different swizzled chunks) into registers; after a second barrier it writes their big and small parts K-major
    (`transpose_tile`).
  - **A in registers** (`a_registers`, the default tiles): A's tile stays as it landed; after the barrier each thread
    reads its wgmma fragment of every K step from it (`a_fragment_position`: PTX ISA, "Matrix Fragments for
    wgmma.mma_async.m64nNk8", multiplicand A), splits it in registers and gives the wgmmas registers for A; only B is
    split in shared memory, and the slots hold B's small parts alone (`small_slot_bytes`). A step's A values are read
    just before its wgmmas, which follow the previous step's on the tensor cores; the tile's wgmmas are one commit
    group, waited for at the next tile's start (their A registers are then rewritten). Measured on an H100 at 4096³:
    1.49× (B K×N) and 1.58× (B N×K) cuBLAS float32, against 1.24× / 1.40× for the tiles that split A in shared memory.
  - **The split** is `cvt.rna.tf32.f32` (to nearest, ties away), its rest, and that rounded: about a third of the
    integer formulation's instructions, which bounded the kernel (without any split the same wgmmas ran 2.8× cuBLAS).
  - **Per K step** three `wgmma.mma_async.m64nNk8.f32.tf32.tf32`: small_a·big_b and big_a·small_b into accumulators
    of their own (`acc_small`), big_a·big_b into `acc`; the two are added once, before the epilogue. The tensor
    core rounds its sum once per wgmma (by truncation on the GPUs studied so far), so `acc` takes one rounding per
    K step of 8, as a single TF32 pass does, and the cross terms' roundings are 2^-11 smaller; summed into one
    accumulator it would take three.
Infinities and NaNs: a non-finite x has big x (a NaN as a quiet NaN the tensor core reads as one) and small 0; a
finite x that would round past the largest float is truncated instead. M known or symbolic, A in K segments, a
float32 output, K (and a K×N B's N) a multiple of 4, ragged edges zero-filled: as wgmma.py.
Tests: test/unit/test_wgmma_split.py (NVRTC for sm_90a; the CPU emulator of test/cuda_on_cpu.py against float64).
"""
from __future__ import annotations
import dataclasses
from typing import Optional
import numpy as np
from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS, dtypes
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX, WARPGROUP_MMA_ARCH
from tgrad.runtime.cuda.wgmma import (COPY_CHUNK_LINES, DESCRIPTOR_FIELD_MASK, PARAMETERS, SPLIT_SLOTS, WGMMA_M,
                                      WGMMA_TYPES, CExpr, Index, MatmulShape, Size, WgmmaConfig, _copy_lines,
                                      _epilogue, block_k, block_prologue, check_shapes, chunk_elements, copies,
                                      copy_k_major, descriptor_bits, descriptor_start, k_major_offset,
                                      k_tile_wgmmas, parameter_list, pipeline_start_lines, rows_line,
                                      tile_ready_lines, wgmma_statement)

F32 = dtypes.float32
FLOAT_BYTES = 4
TILE_K = block_k(F32)              # K of a stage: 32 floats, one 128-byte swizzled row
CHUNK_FLOATS = chunk_elements(F32)   # 4 floats to a 16-byte copy
EXPONENT_BITS = 0x7F800000
MANTISSA_BITS = 0x007FFFFF
QUIET_NAN = 0x7FFFFFFF             # a NaN whose TF32 bits are a NaN too
INFINITE = "__uint_as_float(0x7F800000u)"

def small_base(c: WgmmaConfig) -> int:
  """Bytes from the aligned shared base to the first of the SPLIT_SLOTS buffers of small parts (after the stages)."""
  return c.stages * c.stage_bytes

def small_shift_line(c: WgmmaConfig) -> str:
  """The C of `small_shift`: bytes from a big part of B in stage `stage` to its small part in slot `slot` (and, with
  A's parts in shared memory too, from A's big to small parts: a slot is then laid out as a stage)."""
  if c.a_registers:
    return f"const int small_shift = {small_base(c) - c.b_offset} + slot * {c.small_slot_bytes} - stage * " \
           f"{c.stage_bytes};"
  return f"const int small_shift = {small_base(c)} + slot * {c.stage_bytes} - stage * {c.stage_bytes};"

# A's fragment in registers (A from registers: PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk8", multiplicand
# A): per K step of 8 the thread holds 4 TF32 values, register i of row 16·warp + lane / 4 + 8·(i % 2) and K
# column lane % 4 + 4·(i / 2) of its warpgroup's 64 rows (warp and lane within the warpgroup)
A_FRAGMENT = 4
K_STEPS = TILE_K // 8   # TF32 wgmmas (k8) in a K tile
A_REGISTERS = A_FRAGMENT * K_STEPS   # A's fragments of a whole K tile

def a_fragment_position(thread: Index, register: int) -> tuple[Index, Index]:
  """(row in the warpgroup's 64, K in the step's 8) of A-fragment register `register` of `thread` (0..127)."""
  lane = thread % 32
  return (thread // 32) * 16 + lane // 4 + 8 * (register % 2), lane % 4 + 4 * (register // 2)

def row_major_offset(c: WgmmaConfig, k_row: Index, column: Index) -> Index:
  """Byte offset of element (k_row, column) of a K×N B tile staged row-major (before its transpose)."""
  return k_row * (c.block_n * FLOAT_BYTES) + column * FLOAT_BYTES

def copy_row_major(c: WgmmaConfig, thread: Index, i: int) -> tuple[Index, Index]:
  """(K-row, chunk of 4 columns) of a K×N B tile that `thread` copies in its copy `i`: consecutive threads along a
  K-row's BN/4 chunks (contiguous in global memory), the next copy threads/(BN/4) K-rows further (the chunk fixed)."""
  row_chunks = c.block_n // CHUNK_FLOATS
  return thread // row_chunks + i * (c.threads // row_chunks), thread % row_chunks

def transpose_chunk(c: WgmmaConfig, thread: Index, i: int) -> tuple[Index, Index]:
  """(column, K chunk of 4) of B's K-major tile that `thread` writes in its transposed chunk `i`."""
  index = thread + i * c.threads
  return index % c.block_n, index // c.block_n

def split_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(big, small) float32 arrays of float32 `x` as the kernel's `split` makes them (the tests' reference)."""
  def to_tf32(v: np.ndarray) -> np.ndarray:
    bits = v.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(TF32_ROUNDING_BIAS)) & np.uint32(TF32_KEEP_MASK)
    finite = (bits & np.uint32(EXPONENT_BITS)) != EXPONENT_BITS
    special = np.where((bits & np.uint32(MANTISSA_BITS)) != 0, np.uint32(QUIET_NAN), bits)
    overflow = (rounded & np.uint32(EXPONENT_BITS)) == EXPONENT_BITS
    kept = np.where(overflow, bits & np.uint32(TF32_KEEP_MASK), rounded)
    return np.where(finite, kept, special).astype(np.uint32).view(np.float32)
  big = to_tf32(x)
  with np.errstate(invalid="ignore"): rest = x.astype(np.float32) - big
  return big, np.where(np.isfinite(rest), to_tf32(np.nan_to_num(rest)), np.float32(0))

def _split_function_lines() -> list[str]:
  """`aligned_shared` (the generic address of the aligned shared base) and `split(x, small)`: big returned, both
  TF32."""
  return [
    "  unsigned char* const aligned_shared = shared + (shared_base - (unsigned int)__cvta_generic_to_shared(shared));",
    "  auto to_tf32 = [](float x) -> float {   // to nearest, ties away (a NaN stays one, past the largest: infinite)",
    "    unsigned int bits;",
    '    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));',
    "    return __uint_as_float(bits);",
    "  };",
    "  auto split = [&](float x, float& small) -> float {   // x = big + small (+ 2 bits dropped), both TF32",
    "    float big = to_tf32(x), rest = x - big;",
    f"    if (!(fabsf(rest) < {INFINITE}) && fabsf(x) < {INFINITE}) {{   // a finite x rounded past the largest float",
    f"      big = __uint_as_float(__float_as_uint(x) & 0x{TF32_KEEP_MASK:X}u);   // is truncated instead",
    "      rest = x - big;",
    "    }",
    f"    small = fabsf(rest) < {INFINITE} ? to_tf32(rest) : 0.0f;   // 0 beside a big that is infinite or NaN",
    "    return big;",
    "  };"]

def _split_lambdas(c: WgmmaConfig) -> list[str]:
  """`split(x, small)` (big returned), `split_chunk(at, shift)` (4 floats: big in place, small `shift` bytes on) and
  `split_tile(stage, shift)`: the K-major chunks this thread copied into `stage` (their copies have landed for it)."""
  a_copies = 0 if c.a_registers else copies(c, False)   # A split in registers: nothing of A's to split here
  offsets = [k_major_offset(*copy_k_major(c, CExpr("tid"), i)) for i in range(a_copies)]
  if not c.b_n_major:
    offsets += [c.b_offset + k_major_offset(*copy_k_major(c, CExpr("tid"), i)) for i in range(copies(c, True))]
  if not offsets:   # A split in registers and B transposed: nothing to split where it landed
    return [*_split_function_lines(), "  auto split_tile = [&](int, int) {};"]
  return [
    *_split_function_lines(),
    "  auto split_chunk = [&](unsigned char* at, int shift) {",
    "    float4 v = *(float4*)at, s;",
    "    v.x = split(v.x, s.x); v.y = split(v.y, s.y); v.z = split(v.z, s.z); v.w = split(v.w, s.w);",
    "    *(float4*)at = v; *(float4*)(at + shift) = s;",
    "  };",
    "  auto split_tile = [&](int stage, int shift) {",
    f"    unsigned char* const stage_start = aligned_shared + stage * {c.stage_bytes};",
    *[f"    split_chunk(stage_start + {offset}, shift);" for offset in offsets],
    "  };"]

def _transpose_lambda(c: WgmmaConfig) -> list[str]:
  """`transpose_tile(stage, shift)` for a K×N B: its row-major float32 tile (every thread's copies landed and visible
  after the barrier before it) read column-wise into registers, a barrier, and written as big and small K-major tiles
  (the small ones `shift` bytes on)."""
  count = copies(c, True)
  lines = ["  auto transpose_tile = [&](int stage, int shift) {",
           f"    unsigned char* const b_tile = aligned_shared + stage * {c.stage_bytes} + {c.b_offset};",
           f"    float column[{count}][{CHUNK_FLOATS}];"]
  for i in range(count):
    n, k_chunk = transpose_chunk(c, CExpr("tid"), i)
    for j in range(CHUNK_FLOATS):
      lines.append(f"    column[{i}][{j}] = *(const float*)(b_tile + "
                   f"{row_major_offset(c, k_chunk * CHUNK_FLOATS + j, n)});")
  lines.append("    __syncthreads();   // the whole row-major tile is read before the K-major one is written over it")
  for i in range(count):
    n, k_chunk = transpose_chunk(c, CExpr("tid"), i)
    lines += ["    {",
              "      float4 v, s;",
              f"      v.x = split(column[{i}][0], s.x); v.y = split(column[{i}][1], s.y); "
              f"v.z = split(column[{i}][2], s.z); v.w = split(column[{i}][3], s.w);",
              f"      unsigned char* const at = b_tile + {k_major_offset(n, k_chunk)};",
              "      *(float4*)at = v; *(float4*)(at + shift) = s;",
              "    }"]
  return lines + ["  };"]

def _row_major_copy_lines(c: WgmmaConfig, shape: MatmulShape) -> list[str]:
  """The C that copies K tile `tile` of a K×N B row-major into stage `stage` (inside the copy lambda)."""
  lines = []
  for i in range(copies(c, True)):
    k_row, chunk = copy_row_major(c, CExpr("tid"), i)
    checks = ([f"tile * {TILE_K} + {k_row} < {shape.k}"] if shape.k % TILE_K else []) + \
             ([f"block_col + {chunk * CHUNK_FLOATS} < {shape.n}"] if shape.n % c.block_n else [])
    source = f"b_source + (long long)(tile * {TILE_K} + {k_row}) * {shape.n}"
    lines.append(f"    copy_chunk(stage_address + {c.b_offset} + {row_major_offset(c, k_row, chunk * CHUNK_FLOATS)}, "
                 f"{source}, b, {' && '.join(checks) or 'true'});")
  return lines

def a_fragment_offset(thread: Index, warpgroup: Index, k_step: int, register: int) -> Index:
  """Byte offset in a stage's A tile (K-major, swizzled) of A-fragment register `register` of K step `k_step` for
  `thread` (0..127) of `warpgroup`."""
  row, _ = a_fragment_position(thread, register)
  word = (thread % 32) % 4   # the K column within the 16-byte chunk (register // 2 picks the chunk)
  return k_major_offset(warpgroup * WGMMA_M + row, 2 * k_step + register // 2) + word * FLOAT_BYTES

def register_a_wgmmas(c: WgmmaConfig, indent: str) -> list[str]:
  """A K tile's wgmmas with A from registers: the previous tile's wgmmas waited for (they read the registers about to
  be overwritten; so by the next barrier this tile's stage and slot are free once more), then per K step of 8 this
  thread's 4 A values read from the stage and split (big and small), the wgmma fence, and the three wgmmas
  small_a·big_b and big_a·small_b into `acc_small`, big_a·big_b into `acc` (a step's reads overlap the previous
  step's wgmmas); one commit group for the tile. (A commit group per step, each step waiting only for its own
  registers' previous group, measured slower: 0.92-0.95× cuBLAS float32 against 0.96-0.98× at 4096³.)"""
  instruction = f"wgmma.mma_async.sync.aligned.m64n{c.block_n}k8.f32.tf32.tf32"
  lines = ['asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");   // tile t - 1\'s wgmmas read their A',
           f"const unsigned char* const a_tile = aligned_shared + stage * {c.stage_bytes};"]
  for k_step in range(K_STEPS):
    for register in range(A_FRAGMENT):
      at = a_fragment_offset(CExpr("lane_thread"), CExpr("warpgroup"), k_step, register)
      index = k_step * A_FRAGMENT + register
      lines.append(f"a_big[{index}] = split(*(const float*)(a_tile + {at}), a_small[{index}]);")
    lines.append('asm volatile("wgmma.fence.sync.aligned;" ::: "memory");   // the A registers are written')
    start_b = descriptor_start(c, CExpr("stage"), True, CExpr("warpgroup"), k_step)
    lines.append("{")
    lines.append(f"  const unsigned long long desc_big = b_bits | (((shared_base + {start_b}) >> 4) & "
                 f"{DESCRIPTOR_FIELD_MASK});")
    lines.append(f"  const unsigned long long desc_small = b_bits | (((shared_base + {start_b} + small_shift) >> 4) & "
                 f"{DESCRIPTOR_FIELD_MASK});")
    for a_part, b_desc, accumulators in (("a_small", "desc_big", "acc_small"), ("a_big", "desc_small", "acc_small"),
                                         ("a_big", "desc_big", "acc")):
      a_inputs = [f'"r"(__float_as_uint({a_part}[{k_step * A_FRAGMENT + i}]))' for i in range(A_FRAGMENT)]
      lines.append("  " + wgmma_statement(instruction, accumulators, c.accumulators, a_inputs, f'"l"({b_desc})',
                                          "1, 1"))
    lines.append("}")
  lines.append('asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");')
  return [indent + line for line in lines]

def split_matmul_source(name: str, m: Size, n: int, k: int, config: WgmmaConfig,
                        arguments: tuple[str, ...] = ("out", "a", "b"), shape: Optional[MatmulShape] = None) -> str:
  """CUDA C of `name(out, a, b)` (parameters in the order `arguments` names them, then `shape.variables`):
  out[M×N] = a[M×K] · b[N×K]ᵀ (a · b[K×N] when config.b_n_major) of float32 inputs by 3xTF32 (see the module doc),
  the float32 sums stored. Compile for sm_90a."""
  shape = shape or MatmulShape(m, n, k)
  c = config
  if not c.split_tf32: raise ValueError(f"3xTF32 matmul: tile {c} is not a 3xTF32 tile (split_tf32)")
  check_shapes(m, n, k, F32, c.b_n_major, split_tf32=True)
  if shape.a_segment and (shape.a_segment % TILE_K or k % shape.a_segment):
    raise ValueError(f"3xTF32 matmul: A's K segments of {shape.a_segment} must be whole K tiles of {TILE_K} in K={k}")
  if sorted(arguments) != sorted(PARAMETERS):
    raise ValueError(f"3xTF32 matmul: arguments {arguments} must order {list(PARAMETERS)}")
  if (shape.out_dtype or F32) != F32: raise ValueError(f"3xTF32 matmul: the output is float32, not {shape.out_dtype}")
  tiles = -(-k // TILE_K)
  tid = CExpr("tid")
  a_row, a_chunk = copy_k_major(c, tid, 0)
  if c.b_n_major:
    _, b_chunk = copy_row_major(c, tid, 0)
    b_start = f"b + block_col + {b_chunk * CHUNK_FLOATS}"   # K-row is added per copy (with the tile)
    b_copies = _row_major_copy_lines(c, shape)
  else:
    b_row, b_chunk = copy_k_major(c, tid, 0)
    b_start = f"b + (long long)(block_col + {b_row}) * {k} + {b_chunk * CHUNK_FLOATS}"
    b_copies = _copy_lines(c, True, shape, F32)
  lines = [
    "typedef float element;",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    f'extern "C" __global__ void __launch_bounds__({c.threads}, 1) {name}({parameter_list(arguments, shape)}) {{',
    *block_prologue(c), *rows_line(shape),
    f"  const element* a_source = a + (long long)(block_row + {a_row}) * {shape.row_stride} + "
    f"{a_chunk * CHUNK_FLOATS};",
    f"  const element* b_source = {b_start};",
    f"  float acc[{c.accumulators}];",
    f"  float acc_small[{c.accumulators}];   // the cross terms small_a·big_b + big_a·small_b",
    f"  #pragma unroll\n  for (int i = 0; i < {c.accumulators}; ++i) acc[i] = acc_small[i] = 0.0f;",
    *([f"  float a_big[{A_REGISTERS}], a_small[{A_REGISTERS}];   // A's fragments of a K tile, split"]
      if c.a_registers else []),
    *COPY_CHUNK_LINES,
    "  auto copy_tile = [&](int tile, int stage) {",
    f"    const unsigned int stage_address = shared_base + stage * {c.stage_bytes};",
    *_copy_lines(c, False, shape, F32), *b_copies,
    "  };",
    *_split_lambdas(c), *(_transpose_lambda(c) if c.b_n_major else []),
    *pipeline_start_lines(c, tiles),
    "  int stage = 0, slot = 0;   // tile t's stage, and its small parts' slot (t mod SPLIT_SLOTS)",
    f"  for (int t = 0; t < {tiles}; ++t) {{",
    f"    {small_shift_line(c)}",
    f'    asm volatile("cp.async.wait_group {c.stages - 3};" ::: "memory");   // tile t has landed (this thread)',
    "    split_tile(stage, small_shift);   // this thread's K-major chunks of tile t: big in place, small in the slot",
    *(["    __syncthreads();   // every thread's row-major chunks of B have landed",
       "    transpose_tile(stage, small_shift);   // B K-major, big and small"] if c.b_n_major else []),
    *tile_ready_lines(c, tiles)]
  k_major = dataclasses.replace(c, b_n_major=False)   # the descriptors: a K×N B is K-major once transposed
  a_bits, b_bits = descriptor_bits(k_major)
  small = CExpr("small_shift")
  lines += [f"    const unsigned long long b_bits = {b_bits}ull;   // LBO, SBO, 128-byte swizzle" if c.a_registers else
            f"    const unsigned long long a_bits = {a_bits}ull, b_bits = {b_bits}ull;   // LBO, SBO, 128-byte swizzle"]
  if c.a_registers: lines += register_a_wgmmas(k_major, "    ")
  else: lines += k_tile_wgmmas(k_major, WGMMA_TYPES[F32], "    ",
                               parts=((small, 0, "acc_small"), (0, small, "acc_small"), (0, 0, "acc")))
  lines += [
    f"    stage = stage + 1 == {c.stages} ? 0 : stage + 1;",
    f"    slot = slot + 1 == {SPLIT_SLOTS} ? 0 : slot + 1;",
    "  }",
    '  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");',
    f"  #pragma unroll\n  for (int i = 0; i < {c.accumulators}; ++i) acc[i] += acc_small[i];",
  ]
  lines += _epilogue(c, n, shape.m, F32, CExpr("lane_thread"), CExpr("warpgroup"))
  lines.append("}")
  return "\n".join(lines) + "\n"

def compile_split_matmul(name: str, m: int, n: int, k: int, config: WgmmaConfig) -> bytes:
  """The kernel's cubin for sm_90a (NVRTC); launch it on wgmma.launch_dims(config, m, n) with (out, a, b)."""
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  return compile_cuda(split_matmul_source(name, m, n, k, config), WARPGROUP_MMA_ARCH)
