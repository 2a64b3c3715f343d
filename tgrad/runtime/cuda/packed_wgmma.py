"""The warpgroup-MMA matmul (wgmma.py) with a packed GGUF weight as B: out[M×N] = x[M×K] · Wᵀ, W an (N, K) weight kept
as llama.cpp's blocks (Q8_0, Q5_0, Q4_K, Q6_K), dequantized per K tile into shared memory, never into global memory.

Per pipeline stage a block holds, besides the A tile (x's rows, copied by cp.async as wgmma.py does) and the B tile
(block_n rows × BLOCK_K = 64 half values, 128-byte-swizzled K-major: what the wgmma descriptors read), a *staging*
area: for each of the block's weight rows the packed bytes of its 64 values of the K tile. A K tile of a row is a few
byte ranges of the row (`PackedFormat.ranges`: two 34-byte Q8_0 blocks; a Q4_K super-block's 16-byte header and the
32 bytes of nibbles of its quarter; ...). Blocks are not 16-byte aligned in general (34, 22 or 210 bytes), so each
range is copied as the 16-byte chunks that cover it from its start rounded down to 16 bytes (`cp.async.cg`, the bytes
past the weight's end zero-filled); a range's `skew` (its start mod 16) says where its first byte landed. Iteration t:

  wait for this thread's copies of tile t; barrier (every thread's staged bytes are visible); each thread dequantizes
  whole 16-byte chunks of the B tile (8 values of one row: float32 values as llama.cpp computes them, rounded once to
  half, stored at the swizzled place); `fence.proxy.async` (generic stores, read by the async proxy); barrier; issue
  tile t + stages - 2's copies; the wgmmas of tile t (wgmma.py's `k_tile_wgmmas`), as in the half kernel.

The dequantization of tile t overlaps the wgmmas of tile t - 1, which are still running. M may be symbolic (a prompt's
rows: the kernel takes the variables as int64 parameters after its buffers); N and K are known, K a multiple of 64
(and of the type's block); rows of W past N read zeros, rows of x past M read zeros and are not stored. The output is
the inputs' half dtype. Tests: test/unit/test_packed_wgmma.py (NVRTC for sm_90a, the CPU emulator against numpy).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from tgrad.dtype import DType, dtypes
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX
from tgrad.runtime.cuda.wgmma import (BLOCK_K, CHUNK_BYTES, COPY_CHUNK_LINES, MAX_SHARED_BYTES, ROW_CHUNKS,
                                      SWIZZLE_ATOM_BYTES, SWIZZLE_BYTES, WGMMA_TYPES, CExpr, MatmulShape, WgmmaConfig,
                                      _copy_lines, _epilogue, block_prologue, copy_k_major, descriptor_bits,
                                      k_tile_wgmmas, k_major_offset, pipeline_start_lines, rows_line, tile_ready_lines)

VALUES_PER_CHUNK = CHUNK_BYTES // 2   # half values in one 16-byte chunk of the B tile

@dataclass(frozen=True)
class ByteRange:
  """Bytes of a weight row that K tile `tile` needs: from `start` (C text of `tile`, an offset in the row), at most
  `length` bytes; `alignment` is what the offsets are multiples of (a block's size in bytes: 34 → 2)."""
  start: str
  length: int
  alignment: int
  @property
  def chunks(self) -> int:
    """16-byte chunks that cover the range from its start rounded down to 16 bytes, at the worst skew."""
    worst_skew = CHUNK_BYTES - self.alignment if self.alignment < CHUNK_BYTES else 0
    return -(-(worst_skew + self.length) // CHUNK_BYTES)

@dataclass(frozen=True)
class PackedFormat:
  """A ggml block type as the kernel reads it: its block (values, bytes), the byte ranges of a row a K tile needs,
  and the C lines that compute `v[8]` (float32), values 8·c.. of the tile, from the staged ranges `r0`, `r1`, ...
  (byte pointers) and `tile`, `c` (see the module doc)."""
  name: str
  block_values: int
  block_bytes: int
  ranges: Callable[[], tuple[ByteRange, ...]]
  dequantize: tuple[str, ...]
  def row_bytes(self, k: int) -> int: return k // self.block_values * self.block_bytes
  @property
  def staged_chunks(self) -> int: return sum(r.chunks for r in self.ranges())

def _alignment(block_bytes: int) -> int: return block_bytes & -block_bytes   # the largest power of two dividing it

def _half_of(low: str, high: str) -> str:
  """C: the float32 value of the little-endian float16 in bytes `low`, `high`."""
  return f"half_to_float((unsigned short)({low} | ({high} << 8)))"

# Q8_0: d (fp16), 32 int8 quants; value d·q. A K tile is two blocks (68 bytes at 68·tile).
Q8_0_BYTES = 34
Q8_0 = PackedFormat("Q8_0", 32, Q8_0_BYTES, lambda: (ByteRange(f"tile * {2 * Q8_0_BYTES}", 2 * Q8_0_BYTES,
                                                                _alignment(Q8_0_BYTES)),), (
  f"const unsigned char* block = r0 + (c / 4) * {Q8_0_BYTES};",
  f"const float d = {_half_of('block[0]', 'block[1]')};",
  "#pragma unroll",
  "for (int j = 0; j < 8; ++j) v[j] = d * (float)(signed char)block[2 + (c % 4) * 8 + j];"))

# Q5_0: d (fp16), qh (32 fifth bits, a little-endian uint32), 16 bytes of nibbles (values 0-15 low, 16-31 high);
# value d·(q − 16). A K tile is two blocks (44 bytes at 44·tile).
Q5_0_BYTES = 22
Q5_0 = PackedFormat("Q5_0", 32, Q5_0_BYTES, lambda: (ByteRange(f"tile * {2 * Q5_0_BYTES}", 2 * Q5_0_BYTES,
                                                                _alignment(Q5_0_BYTES)),), (
  f"const unsigned char* block = r0 + (c / 4) * {Q5_0_BYTES};",
  f"const float d = {_half_of('block[0]', 'block[1]')};",
  "const unsigned int high = block[2] | (block[3] << 8) | (block[4] << 16) | ((unsigned int)block[5] << 24);",
  "#pragma unroll",
  "for (int j = 0; j < 8; ++j) {",
  "  const int i = (c % 4) * 8 + j;",
  "  const int q = ((block[6 + i % 16] >> (4 * (i / 16))) & 15) | (((high >> i) & 1) << 4);",
  "  v[j] = d * (float)(q - 16);",
  "}"))

# Q4_K: a super-block of 256 values: d, dmin (fp16), 12 bytes of 6-bit scales and mins of 8 sub-blocks of 32, 128
# bytes of nibbles (bytes 32p.. hold sub-block 2p in low nibbles, 2p + 1 in high ones); value (d·scale)·q − dmin·min.
# K tile `tile` is quarter p = tile % 4 of super-block tile / 4: its 16-byte header and its 32 bytes of nibbles.
Q4_K_BYTES = 144
Q4_K = PackedFormat("Q4_K", 256, Q4_K_BYTES, lambda: (
  ByteRange(f"(tile / 4) * {Q4_K_BYTES}", 16, _alignment(Q4_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q4_K_BYTES} + 16 + (tile % 4) * 32", 32, _alignment(Q4_K_BYTES))), (
  f"const float d = {_half_of('r0[0]', 'r0[1]')}, dmin = {_half_of('r0[2]', 'r0[3]')};",
  "const unsigned char* scales = r0 + 4;",
  "const int sub = 2 * (tile % 4) + c / 4;   // the sub-block of 32 values",
  "const int scale = sub < 4 ? scales[sub] & 63 : (scales[sub + 4] & 15) | ((scales[sub - 4] >> 6) << 4);",
  "const int min = sub < 4 ? scales[sub + 4] & 63 : (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);",
  "const float factor = d * (float)scale, offset = dmin * (float)min;",
  "#pragma unroll",
  "for (int j = 0; j < 8; ++j) v[j] = factor * (float)((r1[(c % 4) * 8 + j] >> (4 * (c / 4))) & 15) - offset;"))

# Q6_K: a super-block of 256 values: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (sub-blocks of
# 16 values), d (fp16) at 208. Value o = 128a + 64b + 32k + i takes nibble b of low byte 64a + 32k + i and bits
# 4b + 2k.. of high byte 128 + 32a + i; value (d·scale)·(q − 32). K tile `tile` is quarter (a, b) = (p / 2, p % 2),
# p = tile % 4: 64 low bytes, 32 high bytes, and the scales with d (18 bytes from 192).
Q6_K_BYTES = 210
Q6_K = PackedFormat("Q6_K", 256, Q6_K_BYTES, lambda: (
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + (tile % 4) / 2 * 64", 64, _alignment(Q6_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + 128 + (tile % 4) / 2 * 32", 32, _alignment(Q6_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + 192", 18, _alignment(Q6_K_BYTES))), (
  f"const float d = {_half_of('r2[16]', 'r2[17]')};",
  "const int quarter = tile % 4, low_shift = 4 * (quarter % 2), k = c / 4;",
  "const float factor = d * (float)(signed char)r2[(64 * quarter + 8 * c) / 16];",
  "#pragma unroll",
  "for (int j = 0; j < 8; ++j) {",
  "  const int i = (c % 4) * 8 + j;",
  "  const int q = ((r0[32 * k + i] >> low_shift) & 15) | (((r1[i] >> (low_shift + 2 * k)) & 3) << 4);",
  "  v[j] = factor * (float)(q - 32);",
  "}"))

FORMATS: dict[str, PackedFormat] = {f.name: f for f in (Q8_0, Q5_0, Q4_K, Q6_K)}

@dataclass(frozen=True)
class PackedConfig(WgmmaConfig):
  """A wgmma tile (K-major B) whose stages also hold the staged packed bytes: `staging_bytes` per stage after the B
  tile (a multiple of a swizzle atom, so every stage starts on one)."""
  staging_bytes: int = 0
  @property
  def staging_offset(self) -> int: return (self.block_m + self.block_n) * SWIZZLE_BYTES
  @property
  def stage_bytes(self) -> int: return self.staging_offset + self.staging_bytes
  @property
  def shared_bytes(self) -> int: return self.stages * self.stage_bytes + SWIZZLE_ATOM_BYTES

def staging_bytes(fmt: PackedFormat, block_n: int) -> int:
  """The staging area of one stage: every row's staged chunks, rounded up to a swizzle atom."""
  raw = block_n * fmt.staged_chunks * CHUNK_BYTES
  return -(-raw // SWIZZLE_ATOM_BYTES) * SWIZZLE_ATOM_BYTES

# (warpgroups, block_n, stages): the tiles tried, largest first; `packed_config` takes the first that fits in shared
# memory and gives a wave of blocks (WAVE_BLOCKS), else the one with the most blocks. block_n stays at most 128: the
# staged bytes of a Q6_K row take 160 bytes a stage, and more stages hide more of global memory's latency.
PACKED_TILES = ((2, 128, 4), (2, 128, 3), (1, 128, 5), (1, 128, 4), (1, 64, 6), (1, 64, 4))
WAVE_BLOCKS = 118   # 0.9 of an H100's 132 SMs (warpgroup_mma.py's WAVE_FRACTION)

def packed_config(fmt: PackedFormat, m_rows: int, n: int) -> PackedConfig:
  """The tile for an M×N output of a weight in `fmt` (m_rows: a symbolic M at the rows it is typically bound to)."""
  fitting = []
  for warpgroups, block_n, stages in PACKED_TILES:
    staging = staging_bytes(fmt, block_n)
    if stages * ((warpgroups * 64 + block_n) * SWIZZLE_BYTES + staging) + SWIZZLE_ATOM_BYTES > MAX_SHARED_BYTES:
      continue
    fitting.append(PackedConfig(warpgroups, block_n, stages, staging_bytes=staging))
  def blocks(c: PackedConfig) -> int: return -(-m_rows // c.block_m) * -(-n // c.block_n)
  return next((c for c in fitting if blocks(c) >= WAVE_BLOCKS), max(fitting, key=blocks))

def check_packed(fmt: PackedFormat, n: int, k: int, dtype: DType) -> None:
  if dtype not in (dtypes.float16, dtypes.bfloat16):
    raise ValueError(f"packed wgmma matmul: x must be float16 or bfloat16, not {dtype}")
  if n < 1 or k < 1 or k % BLOCK_K or k % fmt.block_values:
    raise ValueError(f"packed wgmma matmul: a {fmt.name} weight of shape ({n}, {k}) needs K a multiple of {BLOCK_K} "
                     f"and of {fmt.block_values}")

def _staging_copy_lines(c: PackedConfig, fmt: PackedFormat, n: int, k: int) -> list[str]:
  """The C (inside copy_tile) that copies K tile `tile` of the block's weight rows into the stage's staging area:
  chunk e of the stage is row e / CH, staged chunk e % CH (CH = the format's chunks per row, range after range)."""
  ranges, per_row = fmt.ranges(), fmt.staged_chunks
  total_bytes = n * fmt.row_bytes(k)
  chunks = c.block_n * per_row
  lines = []
  for i in range(-(-chunks // c.threads)):
    first = i * c.threads
    guard = f"if (e < {chunks}) " if first + c.threads > chunks else ""
    firsts = [sum(x.chunks for x in ranges[:r]) for r in range(len(ranges) + 1)]   # each range's first chunk
    start, slot = f"({ranges[-1].start})", str(firsts[-2])
    for r in reversed(range(len(ranges) - 1)):   # a chain of ternaries: the range staged chunk w belongs to
      start = f"(w < {firsts[r + 1]} ? ({ranges[r].start}) : {start})"
      slot = f"(w < {firsts[r + 1]} ? {firsts[r]} : {slot})"
    lines += [
      "    {",
      f"      const int e = tid + {first};",
      f"      {guard}{{",
      f"        const int row = e / {per_row}, w = e % {per_row};",
      f"        const long long from = (((long long)(block_col + row) * {fmt.row_bytes(k)} + {start}) & ~15LL) + "
      f"16LL * (w - {slot});",
      f"        const long long left = {total_bytes}LL - from;",
      f"        const bool valid = block_col + row < {n} && left > 0;",
      f"        copy_bytes(stage_address + {c.staging_offset} + row * {per_row * CHUNK_BYTES} + w * {CHUNK_BYTES}, "
      "b + (valid ? from : 0), valid ? (left < 16 ? (int)left : 16) : 0);",
      "      }",
      "    }"]
  return lines

def _dequantize_lambda(c: PackedConfig, fmt: PackedFormat, k: int, dtype: DType) -> list[str]:
  """`dequantize_tile(tile, stage)`: this thread's 16-byte chunks of the B tile (8 values of one row each: row e / 8,
  chunk e % 8), from the staged bytes, at their swizzled offsets."""
  ranges, per_row = fmt.ranges(), fmt.staged_chunks
  cvt = "cvt.rn.f16.f32" if dtype == dtypes.float16 else "cvt.rn.bf16.f32"
  lines = [
    "  auto to_half = [](float x) -> unsigned short {",
    f'    unsigned short h; asm("{cvt} %0, %1;" : "=h"(h) : "f"(x)); return h;',
    "  };",
    "  auto half_to_float = [](unsigned short h) -> float {",
    '    float x; asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h)); return x;',
    "  };",
    "  auto dequantize_tile = [&](int tile, int stage) {",
    f"    unsigned char* const stage_start = aligned_shared + stage * {c.stage_bytes};"]
  chunks = c.block_n * ROW_CHUNKS
  for i in range(-(-chunks // c.threads)):
    guard = f"if (e < {chunks}) " if (i + 1) * c.threads > chunks else ""
    lines += [
      "    {",
      f"      const int e = tid + {i * c.threads};",
      f"      {guard}{{",
      f"        const int row = e / {ROW_CHUNKS}, c = e % {ROW_CHUNKS};",
      f"        const long long row_start = (long long)(block_col + row) * {fmt.row_bytes(k)};",
      f"        const unsigned char* const staged = stage_start + {c.staging_offset} + row * {per_row * CHUNK_BYTES};"]
    before = 0
    for r, byte_range in enumerate(ranges):
      lines.append(f"        const unsigned char* const r{r} = staged + {before * CHUNK_BYTES} + "
                   f"(int)((row_start + ({byte_range.start})) & 15);")
      before += byte_range.chunks
    lines += ["        float v[8];"] + [f"        {line}" for line in fmt.dequantize] + [
      "        unsigned short h[8];",
      "        #pragma unroll",
      "        for (int j = 0; j < 8; ++j) h[j] = to_half(v[j]);",
      f"        *(uint4*)(stage_start + {c.b_offset} + {k_major_offset(CExpr('row'), CExpr('c'))}) = make_uint4("
      "h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));",
      "      }",
      "    }"]
  return lines + ["  };"]

def packed_matmul_source(name: str, fmt: PackedFormat, shape: MatmulShape, dtype: DType, config: PackedConfig,
                         parameters: tuple[str, ...] = ()) -> str:
  """CUDA C of `name(out, x, packed, *parameters)`: out[M×N] (`dtype`) = x[M×K] (`dtype`, row-major) · Wᵀ with W the
  (N, K) weight of `fmt` blocks in `packed` (row-major bytes), float32 sums (see the module doc). `shape.m` is an int
  or C text of the int64 `parameters` (a symbolic M). Compile for sm_90a."""
  m, n, k = shape.m, shape.n, shape.k
  check_packed(fmt, n, k, dtype)
  c = config
  if c.b_n_major or c.tma: raise ValueError(f"packed wgmma matmul: tile {c} must be a cp.async K-major one")
  tiles = k // BLOCK_K
  a_row, a_chunk = copy_k_major(c, CExpr("tid"), 0)
  parameter_list = ", ".join(["element* __restrict__ out", "const element* __restrict__ a",
                              "const unsigned char* __restrict__ b"] + [f"long long {p}" for p in parameters])
  lines = [
    "typedef unsigned short element;",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    f'extern "C" __global__ void __launch_bounds__({c.threads}, 1) {name}({parameter_list}) {{',
    *block_prologue(c), *rows_line(shape),
    "  unsigned char* const aligned_shared = shared + (shared_base - (unsigned int)__cvta_generic_to_shared(shared));",
    f"  const element* a_source = a + (long long)(block_row + {a_row}) * {k} + {a_chunk * VALUES_PER_CHUNK};",
    f"  float acc[{c.accumulators}];",
    f"  #pragma unroll\n  for (int i = 0; i < {c.accumulators}; ++i) acc[i] = 0.0f;",
    *COPY_CHUNK_LINES,
    "  auto copy_bytes = [](unsigned int target, const unsigned char* source, int size) {",
    '    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(target), "l"(source), "r"(size) : '
    '"memory");',
    "  };",
    "  auto copy_tile = [&](int tile, int stage) {",
    f"    const unsigned int stage_address = shared_base + stage * {c.stage_bytes};",
    *_copy_lines(c, False, shape, dtype), *_staging_copy_lines(c, fmt, n, k),
    "  };",
    *_dequantize_lambda(c, fmt, k, dtype),
    *pipeline_start_lines(c, tiles),
    "  int stage = 0;",
    f"  for (int t = 0; t < {tiles}; ++t) {{",
    f'    asm volatile("cp.async.wait_group {c.stages - 3};" ::: "memory");   // tile t has landed (this thread)',
    "    __syncthreads();   // every thread's staged bytes of tile t",
    "    dequantize_tile(t, stage);",
    *tile_ready_lines(c, tiles)]
  a_bits, b_bits = descriptor_bits(c)
  lines += [f"    const unsigned long long a_bits = {a_bits}ull, b_bits = {b_bits}ull;   // LBO, SBO, 128-byte swizzle"]
  lines += k_tile_wgmmas(c, WGMMA_TYPES[dtype], "    ")
  lines += [
    f"    stage = stage + 1 == {c.stages} ? 0 : stage + 1;",
    "  }",
    '  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");']
  lines += _epilogue(c, n, m, dtype, CExpr("lane_thread"), CExpr("warpgroup"))
  lines.append("}")
  return "\n".join(lines) + "\n"

def grid(config: PackedConfig, m: int, n: int) -> tuple[int, int, int]:
  """blockIdx.x over column tiles, blockIdx.y over row tiles."""
  return (-(-n // config.block_n), -(-max(m, 1) // config.block_m), 1)
