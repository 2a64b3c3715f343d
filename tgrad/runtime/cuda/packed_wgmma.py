"""The warpgroup-MMA matmul (wgmma.py) with a packed GGUF weight as B: out[M×N] = x[M×K] · Wᵀ, W an (N, K) weight kept
as llama.cpp's blocks (Q8_0, Q5_0, Q4_K, Q6_K), dequantized per K tile into shared memory, never into global memory.

Per pipeline stage a block holds, besides the A tile (x's rows, copied by cp.async as wgmma.py does) and the B tile
(block_n rows × BLOCK_K = 64 half values, 128-byte-swizzled K-major: what the wgmma descriptors read), a *staging*
area: for each of the block's weight rows the packed bytes of its 64 values of the K tile. A K tile of a row is a few
byte ranges of the row (`PackedFormat.ranges`: two 34-byte Q8_0 blocks; a Q4_K super-block's 16-byte header and the
32 bytes of nibbles of its quarter; ...). Blocks are not 16-byte aligned in general (34, 22 or 210 bytes), so each
range is copied as the 16-byte chunks that cover it from its start rounded down to 16 bytes (`cp.async.cg`, the bytes
past the weight's end zero-filled); a range's `skew` (its start mod 16) says where its first byte landed.

The block's warps are specialized (`PackedConfig`): consumer warpgroups run the wgmmas (64 rows of x each), producer
warpgroups copy and dequantize, and a full and an empty mbarrier per stage hand the stages between them. Producer
iteration t: wait until the consumers are done with tile t's stage (its tile t - stages); cp.async of x's tile t and
of the warp's own rows' staged bytes; then wait for this thread's copies of tile t - lag (lag = stages - 2), a warp
barrier (each warp stages and dequantizes only its own rows, so no block barrier is needed), dequantize whole 16-byte
chunks of the B tile (8 values of one row: float32 values as llama.cpp computes them, rounded once to half, stored at
the swizzled place), `fence.proxy.async` (generic stores and copies, read by the async proxy), arrive on the stage's
full barrier. Consumer iteration t: wait on tile t's full barrier, its wgmmas (wgmma.py's `k_tile_wgmmas`), and once
tile t - 1's wgmmas are done arrive on its empty barrier.

So the dequantization of one tile overlaps the wgmmas of the tile before and the copies of the tiles after. M may be
symbolic (a prompt's rows: the kernel takes the variables as int64 parameters after its buffers); N and K are known, K
a multiple of 64 (and of the type's block); rows of W past N read zeros, rows of x past M read zeros and are not
stored. The output is the inputs' half dtype. Tests: test/unit/test_packed_wgmma.py (NVRTC for sm_90a, the CPU
emulator against numpy).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from tgrad.dtype import DType, dtypes
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX
from tgrad.runtime.cuda.wgmma import (BLOCK_K, CHUNK_BYTES, COPY_CHUNK_LINES, MAX_SHARED_BYTES, MBARRIER_BYTES,
                                      ROW_CHUNKS, SWIZZLE_ATOM_BYTES, SWIZZLE_BYTES, WARP_THREADS, WARPGROUP_THREADS,
                                      WGMMA_TYPES, CExpr, MatmulShape, WgmmaConfig, _epilogue, _rows_check,
                                      block_prologue, consumer_loop_lines, k_major_offset, rows_line,
                                      stage_barrier_lines)

VALUES_PER_CHUNK = CHUNK_BYTES // 2   # half values in one 16-byte chunk of the B tile
WARPS_PER_WARPGROUP = WARPGROUP_THREADS // WARP_THREADS
DEQUANT_ROW_QUANTUM = WARP_THREADS // ROW_CHUNKS   # a producer warp's rows come in fours: 8 chunks a row, 32 lanes
MAX_CONSUMERS = 2      # 64 rows of x each
MAX_PRODUCERS = 2
MIN_PACKED_STAGES = 3  # one tile being multiplied, one being dequantized, at least one being copied

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
  and the C lines that compute `v[8]` (float32), values 8·c.. of the tile, from the row's staged bytes `staged` (a
  16-byte aligned byte pointer), the offsets there of its ranges' first bytes `s0`, `s1`, ..., and `tile`, `c` (see
  the module doc)."""
  name: str
  block_values: int
  block_bytes: int
  ranges: Callable[[], tuple[ByteRange, ...]]
  dequantize: tuple[str, ...]
  def row_bytes(self, k: int) -> int: return k // self.block_values * self.block_bytes
  @property
  def staged_chunks(self) -> int: return sum(r.chunks for r in self.ranges())
  @property
  def first_chunks(self) -> list[int]:
    """Each range's first chunk in a row's staged chunks (range after range)."""
    ranges = self.ranges()
    return [sum(r.chunks for r in ranges[:i]) for i in range(len(ranges))]

def _alignment(block_bytes: int) -> int: return block_bytes & -block_bytes   # the largest power of two dividing it

# The dequantization's arithmetic is the producers' work, so it avoids the slow conversions: a quant q (an unsigned
# byte-sized integer) becomes a float by exponent bits, 2^23 + q = the float with bits 0x4B000000 | q (one byte permute
# puts the byte under those bits), less 2^23 (+ the quant's bias) exactly; two values round to half in one
# cvt.rn.f16x2.f32. Bytes are read as 32-bit words: `words_at(o, a, b)` gives the 8 bytes at staged offset o (2-byte
# aligned) as two little-endian words, funnel-shifted from the three aligned words that cover them.
MAGIC = 8388608.0    # 2^23: the float with bits 0x4B000000
def _from_byte(word: str, j: str, bias: int) -> str:
  """C: the float value of byte j (0-3) of `word`, less `bias`, exactly."""
  return f"(__int_as_float(__byte_perm({word}, 0x4B000000, 0x7540 | {j})) - {MAGIC + bias:.1f}f)"

def _half_at(offset: str) -> str:
  """C: the float32 value of the little-endian float16 at staged offset `offset` (even)."""
  return f"half_to_float(*(const unsigned short*)(staged + {offset}))"

# Q8_0: d (fp16), 32 int8 quants; value d·q. A K tile is two blocks (68 bytes at 68·tile).
Q8_0_BYTES = 34
Q8_0 = PackedFormat("Q8_0", 32, Q8_0_BYTES, lambda: (ByteRange(f"tile * {2 * Q8_0_BYTES}", 2 * Q8_0_BYTES,
                                                                _alignment(Q8_0_BYTES)),), (
  f"const int block = s0 + (c / 4) * {Q8_0_BYTES};",
  f"const float d = {_half_at('block')};",
  "unsigned int w0, w1;",
  "words_at(block + 2 + (c % 4) * 8, w0, w1);",
  "w0 ^= 0x80808080u; w1 ^= 0x80808080u;   // int8 q as the byte q + 128",
  "#pragma unroll",
  f"for (int j = 0; j < 4; ++j) {{ v[j] = d * {_from_byte('w0', 'j', 128)}; "
  f"v[4 + j] = d * {_from_byte('w1', 'j', 128)}; }}"))

# Q5_0: d (fp16), qh (32 fifth bits, a little-endian uint32), 16 bytes of nibbles (values 0-15 low, 16-31 high);
# value d·(q − 16). A K tile is two blocks (44 bytes at 44·tile). Four fifth bits go to bit 4 of four bytes by one
# multiply (bit j to bit 8j: the shifted copies of a 4-bit number by 0, 7, 14, 21 do not overlap).
Q5_0_BYTES = 22
SPREAD_BITS = 0x00204081
Q5_0 = PackedFormat("Q5_0", 32, Q5_0_BYTES, lambda: (ByteRange(f"tile * {2 * Q5_0_BYTES}", 2 * Q5_0_BYTES,
                                                                _alignment(Q5_0_BYTES)),), (
  f"const int block = s0 + (c / 4) * {Q5_0_BYTES};",
  f"const float d = {_half_at('block')};",
  "const int first = (c % 4) * 8;   // the block's values first..first + 7",
  "const unsigned int fifth = (((unsigned int)*(const unsigned short*)(staged + block + 2) | "
  "((unsigned int)*(const unsigned short*)(staged + block + 4) << 16)) >> first) & 0xFFu;",
  "unsigned int w0, w1;",
  "words_at(block + 6 + first % 16, w0, w1);",
  "const int shift = 4 * (first / 16);",
  f"w0 = ((w0 >> shift) & 0x0F0F0F0Fu) | ((((fifth & 15u) * 0x{SPREAD_BITS:08X}u) & 0x01010101u) << 4);",
  f"w1 = ((w1 >> shift) & 0x0F0F0F0Fu) | ((((fifth >> 4) * 0x{SPREAD_BITS:08X}u) & 0x01010101u) << 4);",
  "#pragma unroll",
  f"for (int j = 0; j < 4; ++j) {{ v[j] = d * {_from_byte('w0', 'j', 16)}; v[4 + j] = d * {_from_byte('w1', 'j', 16)}; "
  "}"))

# Q4_K: a super-block of 256 values: d, dmin (fp16), 12 bytes of 6-bit scales and mins of 8 sub-blocks of 32, 128
# bytes of nibbles (bytes 32p.. hold sub-block 2p in low nibbles, 2p + 1 in high ones); value (d·scale)·q − dmin·min.
# K tile `tile` is quarter p = tile % 4 of super-block tile / 4: its 16-byte header and its 32 bytes of nibbles. A
# super-block (144 bytes) and a row (a whole number of them) are 16-byte multiples, so both ranges are word-aligned.
Q4_K_BYTES = 144
Q4_K = PackedFormat("Q4_K", 256, Q4_K_BYTES, lambda: (
  ByteRange(f"(tile / 4) * {Q4_K_BYTES}", 16, _alignment(Q4_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q4_K_BYTES} + 16 + (tile % 4) * 32", 32, _alignment(Q4_K_BYTES))), (
  f"const float d = {_half_at('s0')}, dmin = {_half_at('s0 + 2')};",
  "const unsigned char* scales = staged + s0 + 4;",
  "const int sub = 2 * (tile % 4) + c / 4;   // the sub-block of 32 values",
  "const unsigned int scale = sub < 4 ? scales[sub] & 63 : (scales[sub + 4] & 15) | ((scales[sub - 4] >> 6) << 4);",
  "const unsigned int min = sub < 4 ? scales[sub + 4] & 63 : (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);",
  f"const float factor = d * (__int_as_float(0x4B000000 | scale) - {MAGIC:.1f}f), "
  f"offset = dmin * (__int_as_float(0x4B000000 | min) - {MAGIC:.1f}f);",
  "const unsigned int* nibbles = (const unsigned int*)(staged + s1 + (c % 4) * 8);",
  "const unsigned int w0 = (nibbles[0] >> (4 * (c / 4))) & 0x0F0F0F0Fu, w1 = (nibbles[1] >> (4 * (c / 4))) & "
  "0x0F0F0F0Fu;",
  "#pragma unroll",
  f"for (int j = 0; j < 4; ++j) {{ v[j] = fmaf(factor, {_from_byte('w0', 'j', 0)}, -offset); "
  f"v[4 + j] = fmaf(factor, {_from_byte('w1', 'j', 0)}, -offset); }}"))

# Q6_K: a super-block of 256 values: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (sub-blocks of
# 16 values), d (fp16) at 208. Value o = 128a + 64b + 32k + i takes nibble b of low byte 64a + 32k + i and bits
# 4b + 2k.. of high byte 128 + 32a + i; value (d·scale)·(q − 32). K tile `tile` is quarter (a, b) = (p / 2, p % 2),
# p = tile % 4: 64 low bytes, 32 high bytes, and the scales with d (18 bytes from 192).
Q6_K_BYTES = 210
Q6_K = PackedFormat("Q6_K", 256, Q6_K_BYTES, lambda: (
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + (tile % 4) / 2 * 64", 64, _alignment(Q6_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + 128 + (tile % 4) / 2 * 32", 32, _alignment(Q6_K_BYTES)),
  ByteRange(f"(tile / 4) * {Q6_K_BYTES} + 192", 18, _alignment(Q6_K_BYTES))), (
  f"const float d = {_half_at('s2 + 16')};",
  "const int quarter = tile % 4, low_shift = 4 * (quarter % 2), k = c / 4, first = (c % 4) * 8;",
  "const unsigned int scale_byte = staged[s2 + (64 * quarter + 8 * c) / 16] ^ 0x80u;   // int8 scale + 128",
  f"const float factor = d * (__int_as_float(0x4B000000 | scale_byte) - {MAGIC + 128:.1f}f);",
  "unsigned int l0, l1, g0, g1;",
  "words_at(s0 + 32 * k + first, l0, l1);",
  "words_at(s1 + first, g0, g1);",
  "const int high_shift = low_shift + 2 * k;",
  "const unsigned int w0 = ((l0 >> low_shift) & 0x0F0F0F0Fu) | (((g0 >> high_shift) & 0x03030303u) << 4);",
  "const unsigned int w1 = ((l1 >> low_shift) & 0x0F0F0F0Fu) | (((g1 >> high_shift) & 0x03030303u) << 4);",
  "#pragma unroll",
  f"for (int j = 0; j < 4; ++j) {{ v[j] = factor * {_from_byte('w0', 'j', 32)}; "
  f"v[4 + j] = factor * {_from_byte('w1', 'j', 32)}; }}"))

FORMATS: dict[str, PackedFormat] = {f.name: f for f in (Q8_0, Q5_0, Q4_K, Q6_K)}

@dataclass(frozen=True)
class PackedConfig(WgmmaConfig):
  """A warp-specialized tile (see the module doc): `warpgroups` consumer warpgroups (the wgmmas, 64 rows of x each)
  and `producers` producer warpgroups (the copies and the dequantization) over `block_n` weight rows, `stages`
  buffers. A stage holds the A tile, the B tile (K-major, swizzled) and the staging area (`staging_bytes`, a multiple
  of a swizzle atom, so every stage starts on one); the stages' full and empty mbarriers follow the last stage. Each
  producer warp stages and dequantizes its own `rows_per_producer_warp` rows (a multiple of 4: 8 chunks a row over 32
  lanes), and each producer thread copies whole 16-byte chunks of A (4·warpgroups / producers of them)."""
  producers: int = 1
  staging_bytes: int = 0
  def __post_init__(self):
    ok = 1 <= self.warpgroups <= MAX_CONSUMERS and 1 <= self.producers <= MAX_PRODUCERS and \
      16 <= self.block_n <= 256 and self.block_n % (WARPS_PER_WARPGROUP * self.producers * DEQUANT_ROW_QUANTUM) == 0 \
      and WARP_THREADS % self.rows_per_producer_warp == 0 \
      and (self.block_m * ROW_CHUNKS) % self.producer_threads == 0 and self.stages >= MIN_PACKED_STAGES and \
      not (self.b_n_major or self.tma or self.split_tf32 or self.a_registers)
    if not ok:
      raise ValueError(f"packed wgmma tile {self}: needs 1-{MAX_CONSUMERS} consumer and 1-{MAX_PRODUCERS} producer "
                       f"warpgroups, block_n in 16..256 a multiple of {WARPS_PER_WARPGROUP * DEQUANT_ROW_QUANTUM} per "
                       f"producer warpgroup, A's chunks a whole number per producer thread, stages >= "
                       f"{MIN_PACKED_STAGES}, a K-major cp.async B")
    if self.shared_bytes > MAX_SHARED_BYTES:
      raise ValueError(f"packed wgmma tile {self}: {self.shared_bytes} bytes of shared memory > {MAX_SHARED_BYTES}")
  @property
  def producer_threads(self) -> int: return self.producers * WARPGROUP_THREADS
  @property
  def threads(self) -> int: return self.consumer_threads + self.producer_threads
  @property
  def rows_per_producer_warp(self) -> int: return self.block_n // (self.producers * WARPS_PER_WARPGROUP)
  @property
  def lag(self) -> int: return self.stages - 2   # tiles in flight: tile t is dequantized while t + lag are copied
  @property
  def staging_offset(self) -> int: return (self.block_m + self.block_n) * SWIZZLE_BYTES
  @property
  def stage_bytes(self) -> int: return self.staging_offset + self.staging_bytes
  @property
  def shared_bytes(self) -> int: return self.stages * self.stage_bytes + SWIZZLE_ATOM_BYTES + \
    2 * MBARRIER_BYTES * self.stages
  def __str__(self) -> str:
    return f"{self.block_m}x{self.block_n}x{BLOCK_K}/{self.stages} {self.producers} producer(s)"

def staging_bytes(fmt: PackedFormat, block_n: int) -> int:
  """The staging area of one stage: every row's staged chunks, rounded up to a swizzle atom."""
  raw = block_n * fmt.staged_chunks * CHUNK_BYTES
  return -(-raw // SWIZZLE_ATOM_BYTES) * SWIZZLE_ATOM_BYTES

def make_config(fmt: PackedFormat, warpgroups: int, producers: int, block_n: int, stages: int) -> PackedConfig:
  return PackedConfig(warpgroups, block_n, stages, producers=producers, staging_bytes=staging_bytes(fmt, block_n))

# (consumer warpgroups, producer warpgroups, block_n, stages): the tiles tried, largest first; `packed_config` takes
# the first that fits in shared memory and gives a wave of blocks (WAVE_BLOCKS), else the one with the most blocks.
PACKED_TILES = ((2, 1, 128, 4), (1, 1, 128, 5), (2, 1, 64, 5), (1, 1, 64, 6))
WAVE_BLOCKS = 118   # 0.9 of an H100's 132 SMs (warpgroup_mma.py's WAVE_FRACTION)

def packed_config(fmt: PackedFormat, m_rows: int, n: int) -> PackedConfig:
  """The tile for an M×N output of a weight in `fmt` (m_rows: a symbolic M at the rows it is typically bound to)."""
  fitting = []
  for warpgroups, producers, block_n, stages in PACKED_TILES:
    try: fitting.append(make_config(fmt, warpgroups, producers, block_n, stages))
    except ValueError: continue
  def blocks(c: PackedConfig) -> int: return -(-m_rows // c.block_m) * -(-n // c.block_n)
  return next((c for c in fitting if blocks(c) >= WAVE_BLOCKS), max(fitting, key=blocks))

def check_packed(fmt: PackedFormat, n: int, k: int, dtype: DType) -> None:
  if dtype not in (dtypes.float16, dtypes.bfloat16):
    raise ValueError(f"packed wgmma matmul: x must be float16 or bfloat16, not {dtype}")
  if n < 1 or k < 1 or k % BLOCK_K or k % fmt.block_values:
    raise ValueError(f"packed wgmma matmul: a {fmt.name} weight of shape ({n}, {k}) needs K a multiple of {BLOCK_K} "
                     f"and of {fmt.block_values}")

def _a_copy_lines(c: PackedConfig, shape: MatmulShape) -> list[str]:
  """The producer thread's copies of x's K tile `tile` into the A tile at `stage_address`: chunk (ptid mod 8) of rows
  ptid / 8 + (producer threads / 8)·i, zeros past M."""
  lines = []
  step = c.producer_threads // ROW_CHUNKS
  for i in range(c.block_m * ROW_CHUNKS // c.producer_threads):
    row = CExpr(f"(producer_thread / {ROW_CHUNKS} + {i * step})")
    offset = k_major_offset(row, CExpr(f"(producer_thread % {ROW_CHUNKS})"))
    valid = " && ".join(_rows_check(shape.m, c.block_m, f"block_row + {row}")) or "true"
    lines.append(f"        copy_chunk(stage_address + {offset}, a_source + {i * step * shape.k}LL + tile * {BLOCK_K}, "
                 f"a, {valid});")
  return lines

def _staging_setup_lines(c: PackedConfig, fmt: PackedFormat, n: int, k: int) -> list[str]:
  """Before the tile loop, what a producer thread's staging copies keep from tile to tile: for its copy i (chunk e =
  lane + 32·i of its warp's rows × CH staged chunks, CH = the format's chunks per row, range after range) the row's
  first byte in the weight, the range the chunk belongs to, the chunk's distance from the range's first chunk (bytes)
  and its place in the staging area."""
  ranges, per_row, firsts = fmt.ranges(), fmt.staged_chunks, fmt.first_chunks
  rows = c.rows_per_producer_warp
  range_of = "0"
  for r in range(1, len(ranges)): range_of = f"(w >= {firsts[r]} ? {r} : {range_of})"
  copies = -(-rows * per_row // WARP_THREADS)
  lines = [f"  long long copy_row[{copies}];   // the byte of the weight where the copy's row starts",
           f"  int copy_range[{copies}], copy_skip[{copies}], copy_target[{copies}];",
           f"  bool copy_valid[{copies}];",
           "  #pragma unroll",
           f"  for (int i = 0; i < {copies}; ++i) {{",
           f"    const int e = producer_lane + {WARP_THREADS} * i, row = producer_warp * {rows} + e / {per_row}, "
           f"w = e % {per_row};",
           f"    copy_valid[i] = block_col + row < {n};   // a row past N reads zeros",
           f"    copy_row[i] = (long long)(block_col + row) * {fmt.row_bytes(k)};",
           f"    copy_range[i] = {range_of};",
           f"    const int firsts[{len(ranges)}] = {{{', '.join(str(f) for f in firsts)}}};",
           f"    copy_skip[i] = {CHUNK_BYTES} * (w - {_select('copy_range[i]', 'firsts', len(ranges))});",
           f"    copy_target[i] = {c.staging_offset} + row * {per_row * CHUNK_BYTES} + w * {CHUNK_BYTES};",
           "  }"]
  return lines

def _select(index: str, array: str, size: int) -> str:
  """C: element `index` of a small array as a chain of selects (a runtime index into a local array would put it in
  local memory)."""
  text = f"{array}[{size - 1}]"
  for r in reversed(range(size - 1)): text = f"({index} == {r} ? {array}[{r}] : {text})"
  return text

def _range_starts(fmt: PackedFormat) -> list[str]:
  """C: `start[r]`, the first byte of range r of K tile `tile` in a row."""
  ranges = fmt.ranges()
  return [f"const int start[{len(ranges)}] = {{{', '.join(f'({r.start})' for r in ranges)}}};"]

def _staging_copy_lines(c: PackedConfig, fmt: PackedFormat, n: int, k: int) -> list[str]:
  """The producer thread's copies of K tile `tile` of its warp's rows into the stage's staging area: each range as
  the 16-byte chunks that cover it from its first byte rounded down to 16 (the bytes past the weight's end zeros)."""
  total_bytes = n * fmt.row_bytes(k)
  copies = -(-c.rows_per_producer_warp * fmt.staged_chunks // WARP_THREADS)
  last = c.rows_per_producer_warp * fmt.staged_chunks - (copies - 1) * WARP_THREADS   # lanes with a last copy
  guard = f"if (i < {copies - 1} || producer_lane < {last}) " if last < WARP_THREADS else ""
  range_start = _select("copy_range[i]", "start", len(fmt.ranges()))
  return [*("        " + line for line in _range_starts(fmt)),
          "        #pragma unroll",
          f"        for (int i = 0; i < {copies}; ++i) {guard}{{   // a lane past the warp's chunks copies nothing",
          f"          const long long from = ((copy_row[i] + {range_start}) & ~15LL) + copy_skip[i];",
          f"          const long long left = {total_bytes}LL - from;",
          "          const bool valid = copy_valid[i] && left > 0;",
          "          copy_bytes(stage_address + copy_target[i], b + (valid ? from : 0), "
          "valid ? (left < 16 ? (int)left : 16) : 0);",
          "        }"]

def _dequantize_lambda(c: PackedConfig, fmt: PackedFormat, k: int, dtype: DType) -> list[str]:
  """`dequantize_tile(tile, stage)`: the producer thread's 16-byte chunks of the B tile, from the staged bytes, at
  their swizzled offsets. A lane dequantizes chunks q, q + L, q + 2L, ... (L lanes a row, q = lane mod L) of one of
  its warp's rows, all computed before any is stored, so what chunks of a row share (a scale, a block's fifth bits,
  the bytes of two nibble halves) is read once."""
  ranges, per_row = fmt.ranges(), fmt.staged_chunks
  rows = c.rows_per_producer_warp
  lanes_per_row = WARP_THREADS // rows
  chunks = ROW_CHUNKS // lanes_per_row
  cvt = "cvt.rn.f16x2.f32" if dtype == dtypes.float16 else "cvt.rn.bf16x2.f32"
  firsts = fmt.first_chunks
  lines = [
    "  auto pack = [](float low, float high) -> unsigned int {   // two values rounded to half, low in the low bits",
    f'    unsigned int h; asm("{cvt} %0, %1, %2;" : "=r"(h) : "f"(high), "f"(low)); return h;',
    "  };",
    "  auto half_to_float = [](unsigned short h) -> float {",
    '    float x; asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h)); return x;',
    "  };",
    f"  const int dequant_row = producer_warp * {rows} + producer_lane / {lanes_per_row}, "
    f"dequant_first = producer_lane % {lanes_per_row};",
    f"  const int dequant_row_skew = (int)(((long long)(block_col + dequant_row) * {fmt.row_bytes(k)}) & 15);",
    "  auto dequantize_tile = [&](int tile, int stage) {",
    f"    unsigned char* const stage_start = aligned_shared + stage * {c.stage_bytes};",
    f"    const unsigned char* const staged = stage_start + {c.staging_offset} + dequant_row * "
    f"{per_row * CHUNK_BYTES};",
    "    auto words_at = [&](int offset, unsigned int& a, unsigned int& b) {   // the 8 bytes at staged + offset",
    "      const unsigned int* w = (const unsigned int*)(staged + (offset & ~3));",
    "      const unsigned int x0 = w[0], x1 = w[1], x2 = w[2], shift = 8 * (offset & 3);",
    "      a = __funnelshift_r(x0, x1, shift);",
    "      b = __funnelshift_r(x1, x2, shift);",
    "    };",
    *("    " + line for line in _range_starts(fmt)),
    *(f"    const int s{r} = {firsts[r] * CHUNK_BYTES} + ((dequant_row_skew + start[{r}]) & 15);"
      for r in range(len(ranges))),
    f"    uint4 out[{chunks}];",
    "    #pragma unroll",
    f"    for (int j = 0; j < {chunks}; ++j) {{",
    f"      const int c = dequant_first + {lanes_per_row} * j;",
    "      float v[8];",
    *("      " + line for line in fmt.dequantize),
    "      out[j] = make_uint4(pack(v[0], v[1]), pack(v[2], v[3]), pack(v[4], v[5]), pack(v[6], v[7]));",
    "    }",
    "    #pragma unroll",
    f"    for (int j = 0; j < {chunks}; ++j) {{",
    f"      const int c = dequant_first + {lanes_per_row} * j;",
    f"      *(uint4*)(stage_start + {c.b_offset} + {k_major_offset(CExpr('dequant_row'), CExpr('c'))}) = out[j];",
    "    }",
    "  };"]
  return lines

def packed_matmul_source(name: str, fmt: PackedFormat, shape: MatmulShape, dtype: DType, config: PackedConfig,
                         parameters: tuple[str, ...] = ()) -> str:
  """CUDA C of `name(out, x, packed, *parameters)`: out[M×N] (`dtype`) = x[M×K] (`dtype`, row-major) · Wᵀ with W the
  (N, K) weight of `fmt` blocks in `packed` (row-major bytes), float32 sums (see the module doc). `shape.m` is an int
  or C text of the int64 `parameters` (a symbolic M). Compile for sm_90a."""
  m, n, k = shape.m, shape.n, shape.k
  check_packed(fmt, n, k, dtype)
  c = config
  if not isinstance(c, PackedConfig): raise ValueError(f"packed wgmma matmul: {c} is not a PackedConfig")
  tiles = k // BLOCK_K
  parameter_list = ", ".join(["element* __restrict__ out", "const element* __restrict__ a",
                              "const unsigned char* __restrict__ b"] + [f"long long {p}" for p in parameters])
  lines = [
    "typedef unsigned short element;",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    f'extern "C" __global__ void __launch_bounds__({c.threads}, 1) {name}({parameter_list}) {{',
    *block_prologue(c), *rows_line(shape),
    "  unsigned char* const aligned_shared = shared + (shared_base - (unsigned int)__cvta_generic_to_shared(shared));",
    f"  const int producer_thread = tid - {c.consumer_threads}, producer_lane = producer_thread % {WARP_THREADS}, "
    f"producer_warp = producer_thread / {WARP_THREADS};",
    *stage_barrier_lines(c.stages, c.stages * c.stage_bytes, c.producer_threads, c.consumer_threads),
    *COPY_CHUNK_LINES,
    "  auto copy_bytes = [](unsigned int target, const unsigned char* source, int size) {",
    '    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(target), "l"(source), "r"(size) : '
    '"memory");',
    "  };",
    *_dequantize_lambda(c, fmt, k, dtype),
    *_staging_setup_lines(c, fmt, n, k),
    f"  if (warpgroup >= {c.warpgroups}) {{   // a producer: copies tile t while it dequantizes tile t - {c.lag}",
    f"    const element* a_source = a + (long long)(block_row + producer_thread / {ROW_CHUNKS}) * {k} + "
    f"(producer_thread % {ROW_CHUNKS}) * {VALUES_PER_CHUNK};",
    "    int stage = 0, ready = 0;   // the stages of tiles t and t - lag",
    "    unsigned int phase = 0;",
    f"    for (int t = 0; t < {tiles + c.lag}; ++t) {{",
    f"      if (t < {tiles}) {{",
    f"        wait(empty_barriers + {MBARRIER_BYTES} * stage, phase ^ 1);   // its last tile's wgmmas are done",
    "        const int tile = t;",
    f"        const unsigned int stage_address = shared_base + stage * {c.stage_bytes};",
    *_a_copy_lines(c, shape), *_staging_copy_lines(c, fmt, n, k),
    f"        if (++stage == {c.stages}) {{ stage = 0; phase ^= 1; }}",
    "      }",
    '      asm volatile("cp.async.commit_group;" ::: "memory");',
    f"      if (t >= {c.lag}) {{",
    f'        asm volatile("cp.async.wait_group {c.lag};" ::: "memory");   // this thread\'s copies of tile t - lag',
    "        __syncwarp();   // and its warp's staged bytes",
    f"        dequantize_tile(t - {c.lag}, ready);",
    '        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // visible to wgmma (the async proxy)',
    f'        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(full_barriers + {MBARRIER_BYTES} * ready) '
    ': "memory");',
    f"        if (++ready == {c.stages}) ready = 0;",
    "      }",
    "    }",
    "  } else {   // a consumer warpgroup",
    *consumer_loop_lines(c, WGMMA_TYPES[dtype], tiles)]
  lines += ["  " + line for line in _epilogue(c, n, m, dtype, CExpr("lane_thread"), CExpr("warpgroup"))]
  lines += ["  }", "}"]
  return "\n".join(lines) + "\n"

def grid(config: PackedConfig, m: int, n: int) -> tuple[int, int, int]:
  """blockIdx.x over column tiles, blockIdx.y over row tiles."""
  return (-(-n // config.block_n), -(-max(m, 1) // config.block_m), 1)
