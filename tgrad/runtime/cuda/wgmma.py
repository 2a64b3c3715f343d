"""Hopper warpgroup MMA (PTX `wgmma.mma_async`, sm_90a): a half/bfloat16 matmul kernel C = A·Bᵀ (or A·B) with
float32 accumulators, both operands read by the tensor cores from 128-byte-swizzled shared memory through matrix
descriptors; or a TF32 one of float32 inputs (C = A·Bᵀ only: 4-byte elements, `block_k` 32, m64nNk8, each thread's
landed chunks rounded to TF32 in place before the proxy fence: `_rounding_lambda`). The 3xTF32 kernel of plain
float32 inputs (`WgmmaConfig.split_tf32`, float32-class) builds on this one in wgmma_split.py.

Every index formula the kernel uses is one Python function here (`copy_k_major`, `copy_n_major`, `k_major_offset`,
`n_major_offset`, `accumulator_position`, `encode_descriptor`, `descriptor_start`), called with ints by the CPU
emulation in the tests and with `CExpr`s (C expression text) by `wgmma_matmul_source`, so what the tests check is
what the kernel computes; the emulation reads the operands back through the descriptors with the hardware's swizzle
written independently from the PTX ISA (`read_operand`).

  - **Operands.** A is M×K and B is N×K, both row-major (K contiguous: "K-major" for wgmma; a linear layer's weight
    is stored so); with `b_n_major` B is K×N row-major (a plain a·b, N a multiple of 8), staged N-major and read with
    imm-trans-b = 1. Each block computes a BM×BN tile of C with `warpgroups` warpgroups of 128 threads, one per 64
    rows, each issuing `wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{f16,bf16}.{f16,bf16}` per K step of 16.
  - **Shared layout: 128-byte swizzle** (PTX ISA "Shared Memory Matrix Layout", swizzle mode 1). A K tile is
    BLOCK_K = 64 elements: one 128-byte row per matrix row. K-major tiles (A, and B unless `b_n_major`) put row r at
    128·r with its 16-byte chunk c at chunk c ⊕ (r mod 8); descriptors: stride byte offset (SBO) 1024 (the next 8
    rows), leading byte offset unused (16), a K step of 16 elements starts 32 bytes further on. An N-major B tile is
    BN/64 "atoms" of 64 K-rows × 64 N-elements (8 KiB apart: the LBO), K-row k at 128·k, N chunk j at j ⊕ (k mod 8);
    SBO 1024 (the next 8 K-rows), a K step starts 2048 bytes further on. Every tile starts on a 1024-byte boundary
    (the swizzle is a function of the address bits 4-9); the dynamic shared array is aligned to it at run time.
  - **Copies.** `cp.async.cg` of 16-byte chunks by every thread, each thread's chunks a fixed stride apart (rows
    threads/8 apart for a K-major tile), so one base pointer per operand per thread plus compile-time offsets; 8
    consecutive threads read one row's 128 contiguous bytes; rows or K beyond the matrix read 0 bytes (zero fill).
  - **Pipeline** of `stages` ≥ 3 buffers, STAGES - 2 K tiles in flight ahead of the one being multiplied. Iteration t:
    wait for tile t's copies (`cp.async.wait_group stages-3`), `fence.proxy.async.shared::cta` (the copies are
    generic-proxy writes; wgmma reads through the async proxy), `__syncthreads()`; issue tile t + stages - 2's
    copies into the buffer of tile t - 2; `wgmma.fence`, the 4 wgmmas of tile t, `wgmma.commit_group`,
    `wgmma.wait_group 1` (tile t - 1's group has finished, so after the next barrier every warpgroup is done with
    tile t - 2's buffer: the one the next iteration overwrites).
  - **Accumulators** (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16", D): thread t of a warpgroup holds
    BN/2 floats; register i is row 16·(t / 32) + (t % 32) / 4 + 8·((i % 4) / 2), column 8·(i / 4) + 2·(t % 4) +
    i % 2. The epilogue rounds them to the inputs' dtype and stores them (pairs as one 32-bit store when N is even).

The kernel is specialized to (N, K) and to M, or takes M as a variable parameter (`MatmulShape`: a prompt's rows; the
grid's rows are the runner's, rows past M are zero-filled copies and masked stores); A may be read in K segments of
whole tiles (heads [H, T, D] as T×(H·D)); the output is float32 (the sums) or a 16-bit float. K must be a multiple
of 8 (16-byte rows for cp.async). Tests:
test/unit/test_wgmma.py (NVRTC for sm_90a, the emitted sequence, the CPU emulation), test/test_wgmma_gpu.py (GPU).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Union
import numpy as np
from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS, DType, dtypes
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX, WARPGROUP_MMA_ARCH, sm_number

WARPGROUP_THREADS = 128
WARP_THREADS = 32
WGMMA_M = 64            # rows of one warpgroup's wgmma
WGMMA_K = 16            # K of one wgmma with 16-bit inputs
ELEMENT_BYTES = 2
CHUNK_BYTES = 16        # one cp.async; the unit the swizzle permutes
CHUNK_ELEMENTS = CHUNK_BYTES // ELEMENT_BYTES
SWIZZLE_BYTES = 128     # the 128-byte swizzle: rows of 128 bytes, 8 of them (1024 bytes) per repeat of the pattern
SWIZZLE_ROWS = 8
SWIZZLE_ATOM_BYTES = SWIZZLE_BYTES * SWIZZLE_ROWS
BLOCK_K = SWIZZLE_BYTES // ELEMENT_BYTES          # K per pipeline stage: one swizzled row
ROW_CHUNKS = SWIZZLE_BYTES // CHUNK_BYTES         # 8 chunks in a row
DESCRIPTOR_ADDRESS_SHIFT = 4                     # addresses and offsets are encoded in 16-byte units
DESCRIPTOR_FIELD_MASK = (1 << 14) - 1            # 14 bits each
DESCRIPTOR_LEADING_SHIFT, DESCRIPTOR_STRIDE_SHIFT, DESCRIPTOR_SWIZZLE_SHIFT = 16, 32, 62
SWIZZLE_NONE, SWIZZLE_128B = 0, 1                # the descriptor's layout type (bits 62-63)
UNUSED_LEADING_BYTES = 16                        # a K-major swizzled descriptor ignores its LBO; 1 (16 bytes) by custom
MAX_SHARED_BYTES = 227 * 1024                    # sm_90's opt-in dynamic shared memory per block
# the inputs' PTX type; float32 inputs are multiplied as TF32 (rounded in shared memory first: `_rounding_lines`)
WGMMA_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "tf32"}
TF32 = dtypes.float32
STEP_BYTES = WGMMA_K * ELEMENT_BYTES   # K of one wgmma in bytes (k16 of 16-bit elements, k8 of TF32): 32
MIN_STAGES = 3       # cp.async: stages - 2 tiles in flight while one is multiplied and one is being released
MIN_TMA_STAGES = 2   # TMA: the producer refills a stage as soon as the consumers release it (mbarriers)
MBARRIER_BYTES = 8
SPLIT_SLOTS = 3      # 3xTF32's buffers of small parts (wgmma_split.py): one per K tile, reused three tiles on

Index = Union[int, "CExpr"]
Size = Union[int, str]   # a size or stride known when the kernel is written (an int), or C text read at run time

@dataclass(frozen=True)
class MatmulShape:
  """What a kernel of `wgmma_matmul_source` is specialized to beyond its tile: `m` rows (an int, or C text of the
  kernel's variable parameters: a symbolic row count, evaluated once per launch; rows past it read zeros and are not
  stored), A's layout (element (row, kk) of A at row·a_row_stride + (kk / a_segment)·a_segment_stride + kk % a_segment:
  K cut into segments of a multiple of BLOCK_K elements, each contiguous, e.g. attention heads laid out [heads, T, D]
  read as a T×(heads·D) matrix; a_segment 0: one segment, row-major M×K), the output's dtype (the float32 sums
  stored, or rounded to a 16-bit float) and the 64-bit variables the kernel takes after its buffers (their C names
  `{name}_arg`, as the CUDA renderer's)."""
  m: Size
  n: int
  k: int
  a_row_stride: Size = 0     # 0: K (row-major A)
  a_segment: int = 0         # 0: K (one segment)
  a_segment_stride: Size = 0
  out_dtype: Optional[DType] = None   # None: the inputs' dtype
  variables: tuple[str, ...] = ()
  m_max: int = 0             # a symbolic m's largest value (0: m is an int)
  @property
  def plain_a(self) -> bool: return self.a_segment in (0, self.k) and self.a_row_stride in (0, self.k)
  @property
  def row_stride(self) -> Size: return self.a_row_stride or self.k

class CExpr:
  """C expression text that combines with ints and other CExprs under + * // % ^, so one Python formula yields both a
  number (tests) and the kernel's C (all operands non-negative: C's / and % agree with Python's // and %)."""
  def __init__(self, text: str): self.text = text
  def __str__(self) -> str: return self.text
  @staticmethod
  def _binary(a, op: str, b) -> CExpr: return CExpr(f"({a} {op} {b})")
  def __add__(self, other): return self if isinstance(other, int) and other == 0 else CExpr._binary(self, "+", other)
  def __radd__(self, other): return self if isinstance(other, int) and other == 0 else CExpr._binary(other, "+", self)
  def __mul__(self, other):
    if isinstance(other, int) and other in (0, 1): return self if other == 1 else 0   # type: ignore[return-value]
    return CExpr._binary(self, "*", other)
  def __rmul__(self, other): return self.__mul__(other)
  def __floordiv__(self, other): return self if isinstance(other, int) and other == 1 else \
    CExpr._binary(self, "/", other)
  def __mod__(self, other): return CExpr._binary(self, "%", other)
  def __xor__(self, other): return CExpr._binary(self, "^", other)
  def __rxor__(self, other): return CExpr._binary(other, "^", self)

@dataclass(frozen=True)
class WgmmaConfig:
  """One block's tile: `warpgroups` × 64 rows (BM), `block_n` columns (BN, the wgmma's N), K in tiles of BLOCK_K (64),
  `stages` shared-memory buffers. K-major B: block_n a multiple of 8 up to 256 with every thread copying the same
  number of chunks (block_n a multiple of threads/8); N-major B: block_n a multiple of 64 whose row of chunks divides
  the threads. With `tma` the tiles are loaded by the tensor-memory accelerator (wgmma_tma.py): one more warpgroup
  (the producer) issues the copies, `warpgroups` are the consumers, stages >= 2, and block_n need only be a multiple
  of 8 (K-major B) or of 64 (N-major B: one 64-column box per atom)."""
  warpgroups: int = 2
  block_n: int = 256
  stages: int = 4
  b_n_major: bool = False   # b is K×N (N contiguous: a plain a·b) instead of N×K; wgmma reads it transposed
  tma: bool = False         # tensor-map loads by a producer warpgroup (wgmma_tma.py) instead of cp.async by all
  split_tf32: bool = False  # 3xTF32 of float32 inputs (wgmma_split.py): + SPLIT_SLOTS stages' room for small parts
  a_registers: bool = False  # 3xTF32 with A split in registers (wgmma_split.py): the small slots hold B's parts only
  def __post_init__(self):
    if self.split_tf32:   # K×N B: staged row-major (threads a whole number of rows of BN/4 chunks), then transposed
      b_ok = not self.tma and self.block_n % 8 == 0 and (self.block_n * ROW_CHUNKS) % self.threads == 0 and \
        (not self.b_n_major or self.threads % (self.block_n // 4) == 0)
    elif self.tma: b_ok = self.block_n % (64 if self.b_n_major else 8) == 0
    elif self.b_n_major: b_ok = self.block_n % 64 == 0 and self.threads % (self.block_n // CHUNK_ELEMENTS) == 0
    else: b_ok = self.block_n % 8 == 0 and (self.block_n * ROW_CHUNKS) % self.threads == 0
    min_stages = MIN_TMA_STAGES if self.tma else MIN_STAGES
    if not (1 <= self.warpgroups <= 4 and 8 <= self.block_n <= 256 and b_ok and self.stages >= min_stages):
      raise ValueError(f"wgmma tile {self}: needs 1-4 warpgroups, block_n in 8..256 (a multiple of 8 and of "
                       f"threads/8, or for an N-major B a multiple of 64 whose chunks divide the threads; with TMA a "
                       f"multiple of 8, or of 64 for an N-major B), stages >= {min_stages}")
    if self.a_registers and not self.split_tf32:
      raise ValueError(f"wgmma tile {self}: A from registers is a 3xTF32 tile's (split_tf32)")
    if self.shared_bytes > MAX_SHARED_BYTES:
      raise ValueError(f"wgmma tile {self}: {self.shared_bytes} bytes of shared memory > {MAX_SHARED_BYTES}")
  @property
  def block_m(self) -> int: return self.warpgroups * WGMMA_M
  @property
  def block_k(self) -> int: return BLOCK_K
  @property
  def consumer_threads(self) -> int: return self.warpgroups * WARPGROUP_THREADS   # the threads that run the wgmmas
  @property
  def threads(self) -> int: return self.consumer_threads + (WARPGROUP_THREADS if self.tma else 0)   # + the producer
  @property
  def accumulators(self) -> int: return self.block_n // 2   # floats per thread
  @property
  def b_offset(self) -> int: return self.block_m * SWIZZLE_BYTES   # B's tile follows A's in a stage
  @property
  def stage_bytes(self) -> int: return (self.block_m + self.block_n) * SWIZZLE_BYTES
  @property
  def small_slot_bytes(self) -> int:   # one of 3xTF32's SPLIT_SLOTS buffers of small parts: A's and B's, or B's
    return self.block_n * SWIZZLE_BYTES if self.a_registers else self.stage_bytes
  @property
  def shared_bytes(self) -> int:   # the stages (and 3xTF32's small parts), alignment slack, TMA's mbarriers
    small = SPLIT_SLOTS * self.small_slot_bytes if self.split_tf32 else 0
    return self.stages * self.stage_bytes + small + SWIZZLE_ATOM_BYTES + \
      (2 * MBARRIER_BYTES * self.stages if self.tma else 0)
  @property
  def n_atom_bytes(self) -> int: return BLOCK_K * SWIZZLE_BYTES   # an N-major atom: 64 K-rows × 64 N-elements
  def descriptor_offsets(self, operand_b: bool) -> tuple[int, int]:
    """(leading, stride) byte offsets of an operand's descriptors."""
    if operand_b and self.b_n_major: return self.n_atom_bytes, SWIZZLE_ATOM_BYTES
    return UNUSED_LEADING_BYTES, SWIZZLE_ATOM_BYTES
  def __str__(self) -> str:
    return f"{self.block_m}x{self.block_n}x{BLOCK_K}/{self.stages}" + (" B K×N" if self.b_n_major else "") + \
      (" TMA" if self.tma else "") + (" 3xTF32" if self.split_tf32 else "") + \
      (" A in registers" if self.a_registers else "")

# ---- the layout formulas (ints for the tests, CExprs for the kernel)

def block_k(dtype: DType) -> int:
  """K elements of a pipeline stage: one 128-byte swizzled row (64 16-bit elements, 32 TF32)."""
  return SWIZZLE_BYTES // dtype.itemsize

def chunk_elements(dtype: DType) -> int: return CHUNK_BYTES // dtype.itemsize   # elements of one 16-byte copy

def wgmma_k(dtype: DType) -> int: return STEP_BYTES // dtype.itemsize   # K of one wgmma: 16, or 8 for TF32

def k_major_offset(row: Index, chunk: Index) -> Index:
  """Byte offset in a K-major tile of 16-byte chunk `chunk` (0..7: K 8·chunk..) of row `row`: rows 128 bytes apart,
  the chunk moved to chunk ⊕ (row mod 8)."""
  return row * SWIZZLE_BYTES + (chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES

def n_major_offset(config: WgmmaConfig, k_row: Index, n_chunk: Index) -> Index:
  """Byte offset in an N-major B tile of the chunk of N-elements 8·n_chunk.. in K-row `k_row`: atoms of 64 N-elements
  `n_atom_bytes` apart, K-rows 128 bytes apart within one, the chunk moved to (n_chunk mod 8) ⊕ (k_row mod 8)."""
  return (n_chunk // ROW_CHUNKS) * config.n_atom_bytes + k_row * SWIZZLE_BYTES + \
    ((n_chunk % ROW_CHUNKS) ^ (k_row % SWIZZLE_ROWS)) * CHUNK_BYTES

def copy_k_major(config: WgmmaConfig, thread: Index, i: int) -> tuple[Index, Index]:
  """(row, chunk) of a K-major tile that `thread` copies in its copy `i`: 8 consecutive threads cover one row, the
  next copy is threads/8 rows further (a multiple of 8: the same swizzle phase)."""
  return thread // ROW_CHUNKS + i * (config.threads // ROW_CHUNKS), thread % ROW_CHUNKS

def copy_n_major(config: WgmmaConfig, thread: Index, i: int) -> tuple[Index, Index]:
  """(K-row, N chunk) of an N-major B tile that `thread` copies in its copy `i`: consecutive threads along the row of
  BN/8 chunks (contiguous in global memory), the next copy threads/(BN/8) K-rows further."""
  row_chunks = config.block_n // CHUNK_ELEMENTS
  return thread // row_chunks + i * (config.threads // row_chunks), thread % row_chunks

def copies(config: WgmmaConfig, operand_b: bool) -> int:
  """How many chunks each thread copies of an operand's tile per stage."""
  rows = config.block_n if operand_b else config.block_m
  return rows * ROW_CHUNKS // config.threads

def accumulator_position(thread: Index, register: int) -> tuple[Index, Index]:
  """(row, column) in the warpgroup's 64×N tile of accumulator `register` of `thread` (0..127)."""
  lane = thread % WARP_THREADS
  row = (thread // WARP_THREADS) * 16 + lane // 4 + 8 * ((register % 4) // 2)
  return row, 8 * (register // 4) + (lane % 4) * 2 + register % 2

def encode_descriptor(start: int, leading: int, stride: int, swizzle: int = SWIZZLE_NONE) -> int:
  """The 64-bit shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address,
  16-29 leading byte offset, 32-45 stride byte offset, each >> 4; 62-63 the swizzle mode (1: 128-byte)."""
  for name, value in (("start", start), ("leading", leading), ("stride", stride)):
    if value % (1 << DESCRIPTOR_ADDRESS_SHIFT) or value >> DESCRIPTOR_ADDRESS_SHIFT > DESCRIPTOR_FIELD_MASK:
      raise ValueError(f"descriptor {name} {value}: must be a multiple of 16 below 2^18")
  return (start >> DESCRIPTOR_ADDRESS_SHIFT) | (leading >> DESCRIPTOR_ADDRESS_SHIFT) << DESCRIPTOR_LEADING_SHIFT | \
    (stride >> DESCRIPTOR_ADDRESS_SHIFT) << DESCRIPTOR_STRIDE_SHIFT | swizzle << DESCRIPTOR_SWIZZLE_SHIFT

def decode_descriptor(descriptor: int) -> tuple[int, int, int, int]:
  """(start, leading, stride, swizzle) of a descriptor, in bytes."""
  def field(shift: int) -> int: return ((descriptor >> shift) & DESCRIPTOR_FIELD_MASK) << DESCRIPTOR_ADDRESS_SHIFT
  swizzle = descriptor >> DESCRIPTOR_SWIZZLE_SHIFT
  return field(0), field(DESCRIPTOR_LEADING_SHIFT), field(DESCRIPTOR_STRIDE_SHIFT), swizzle

def descriptor_start(config: WgmmaConfig, stage: Index, operand_b: bool, warpgroup: Index, k_step: int) -> Index:
  """Byte offset from the aligned shared base of the first element of a wgmma's A (warpgroup's 64 rows) or B slice
  at K step `k_step` (16 elements) of a stage."""
  base = stage * config.stage_bytes + (config.b_offset if operand_b else 0)
  if operand_b and config.b_n_major: return base + k_step * WGMMA_K * SWIZZLE_BYTES
  rows = 0 if operand_b else warpgroup * WGMMA_M * SWIZZLE_BYTES
  return base + rows + k_step * STEP_BYTES

# ---- what the hardware computes, on the CPU (the tests' reference for the layouts)

def swizzled_address(address: np.ndarray) -> np.ndarray:
  """The 128-byte swizzle as the PTX ISA states it on shared-memory addresses: bits 4-6 (the 16-byte chunk within a
  128-byte row) XOR bits 7-9 (the row within 1024 bytes)."""
  return address ^ (((address >> 7) & 7) << 4)

def read_operand(shared: np.ndarray, descriptor: int, rows: int, dtype: DType, transposed: bool = False) -> np.ndarray:
  """The rows×16 operand (rows: M or N) a 128-byte-swizzled descriptor addresses in `shared` (bytes, address 0
  1024-aligned), as float32, from the PTX ISA's canonical layouts (T = 8 elements of 16 bits): K-major (imm-trans 0)
  ((8,m),(T,2k)):((8T,SBO),(1,T)): element (r, k) at start + (r / 8)·SBO + (r % 8)·128 + 2k; MN-major
  (imm-trans 1) ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): element (r, k) at start + (r / 64)·LBO + (k / 8)·SBO +
  (k % 8)·128 + 2·(r % 64); then swizzled. TF32 (float32 dtype, K-major only): rows×8, element (r, k) at start +
  (r / 8)·SBO + (r % 8)·128 + 4k, of which the tensor core keeps the TF32 bits (`float_of_bits`). Written
  independently of the kernel's copy formulas."""
  start, leading, stride, swizzle = decode_descriptor(descriptor)
  assert swizzle == SWIZZLE_128B, "only the 128-byte swizzle is emulated"
  assert not (transposed and dtype == TF32), "TF32 operands are K-major"
  size = dtype.itemsize
  r, k = np.arange(rows)[:, None], np.arange(wgmma_k(dtype))[None, :]
  if transposed: at = start + (r // 64) * leading + (k // 8) * stride + (k % 8) * SWIZZLE_BYTES + (r % 64) * 2
  else: at = start + (r // 8) * stride + (r % 8) * SWIZZLE_BYTES + k * size
  at = swizzled_address(at)
  bits = sum(shared[at + byte].astype(np.uint32) << (8 * byte) for byte in range(size))   # little-endian elements
  return float_of_bits(bits, dtype)

def float_of_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
  """16-bit half or bfloat16 patterns as float32; float32 patterns as the TF32 values a tensor core reads from them
  (the low 13 bits dropped: truncation)."""
  if dtype == TF32: return (bits.astype(np.uint32) & TF32_KEEP_MASK).view(np.float32)
  if dtype == dtypes.float16: return bits.astype(np.uint16).view(np.float16).astype(np.float32)
  return (bits.astype(np.uint32) << 16).view(np.float32)

def round_to_tf32_bits(bits: np.ndarray) -> np.ndarray:
  """float32 patterns rounded to TF32 as the kernel's `round_chunk` (and the graph's round_to_tf32) does."""
  bits = bits.astype(np.uint32)
  is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
  return np.where(is_nan, bits, (bits + np.uint32(TF32_ROUNDING_BIAS)) & np.uint32(TF32_KEEP_MASK)).astype(np.uint32)

def emulate_block(config: WgmmaConfig, a: np.ndarray, b: np.ndarray, dtype: DType, block_row: int = 0,
                  block_col: int = 0) -> np.ndarray:
  """One block's C tile (float32, clipped to the matrix) computed the way the kernel does: every thread's chunks
  copied to their `copy_*`/`*_offset` place in a fresh, poisoned stage buffer per K tile (a byte the wgmma reads but
  no copy wrote shows up as garbage), each wgmma reading its operands through the descriptors the kernel builds
  (`descriptor_start`), each accumulator register added at `accumulator_position`. a: M×K and b: N×K (K×N for an
  N-major B) uint16 bits (uint32 float32 bits for TF32: each thread's chunks rounded where they land, as
  `round_tile`)."""
  m, k_size = a.shape
  n = b.shape[1] if config.b_n_major else b.shape[0]
  accumulators = np.zeros((config.warpgroups, WARPGROUP_THREADS, config.accumulators), np.float32)
  threads, registers = np.arange(WARPGROUP_THREADS)[:, None], np.arange(config.accumulators)[None, :]
  acc_rows, acc_columns = accumulator_position(threads, registers)   # type: ignore[arg-type]
  thread = np.arange(config.threads)
  tile_k, chunk_size = block_k(dtype), chunk_elements(dtype)
  for tile in range(-(-k_size // tile_k)):
    stage = tile % config.stages
    shared = np.full(config.stages * config.stage_bytes, 0xFF, np.uint8)   # 0xFFFF is NaN in half and bfloat16
    written = []
    for operand_b in (False, True):
      n_major = operand_b and config.b_n_major
      base = stage * config.stage_bytes + (config.b_offset if operand_b else 0)
      source, first = (b, block_col) if operand_b else (a, block_row)
      for i in range(copies(config, operand_b)):
        if n_major:
          k_row, n_chunk = copy_n_major(config, thread, i)   # type: ignore[arg-type]
          g_row, g_col = tile * tile_k + k_row, first + n_chunk * chunk_size
          valid = (g_row < k_size) & (g_col < n)
          at = base + n_major_offset(config, k_row, n_chunk)   # type: ignore[arg-type]
        else:
          row, chunk = copy_k_major(config, thread, i)   # type: ignore[arg-type]
          g_row, g_col = first + row, tile * tile_k + chunk * chunk_size
          valid = (g_row < source.shape[0]) & (g_col < k_size)
          at = base + k_major_offset(row, chunk)   # type: ignore[arg-type]
        padded = np.zeros((source.shape[0] + 1, source.shape[1] + chunk_size), source.dtype)   # clipped reads land
        padded[:source.shape[0], :source.shape[1]] = source                                      # in the zeros
        values = padded[np.minimum(g_row, source.shape[0])[:, None],
                        np.minimum(g_col, source.shape[1])[:, None] + np.arange(chunk_size)]
        values = np.where(valid[:, None], values, 0).astype(source.dtype)
        if dtype == TF32: values = round_to_tf32_bits(values)   # round_tile: each thread's chunks where they land
        shared[at[:, None] + np.arange(CHUNK_BYTES)] = values.view(np.uint8).reshape(len(thread), CHUNK_BYTES)
        written += at.tolist()
    assert len(set(written)) == len(written) == config.stage_bytes // CHUNK_BYTES, "each chunk written exactly once"
    for warpgroup in range(config.warpgroups):
      for k_step in range(SWIZZLE_BYTES // STEP_BYTES):
        desc_a, desc_b = (encode_descriptor(descriptor_start(config, stage, operand_b, warpgroup, k_step),  # type: ignore[arg-type]
                                            *config.descriptor_offsets(operand_b), SWIZZLE_128B)
                          for operand_b in (False, True))
        b_tile = read_operand(shared, desc_b, config.block_n, dtype, transposed=config.b_n_major)
        product = read_operand(shared, desc_a, WGMMA_M, dtype) @ b_tile.T
        accumulators[warpgroup] += product[acc_rows, acc_columns]
  out = np.full((config.block_m, config.block_n), np.nan, np.float32)
  for warpgroup in range(config.warpgroups):
    out[warpgroup * WGMMA_M + acc_rows, acc_columns] = accumulators[warpgroup]
  return out[:max(0, min(config.block_m, m - block_row)), :max(0, min(config.block_n, n - block_col))]

# ---- the kernel's source

def check_shapes(m: Size, n: int, k: int, dtype: DType, b_n_major: bool = False, split_tf32: bool = False) -> None:
  if dtype not in WGMMA_TYPES: raise ValueError(f"wgmma matmul: dtype {dtype} is not one of {list(WGMMA_TYPES)}")
  if min(m if isinstance(m, int) else 1, n, k) < 1 or k % chunk_elements(dtype):
    raise ValueError(f"wgmma matmul: A {m}×{k} · B {n}×{k}ᵀ needs sizes ≥ 1 and K a multiple of "
                     f"{chunk_elements(dtype)} (16-byte rows of {dtype})")
  if b_n_major and dtype == TF32 and not split_tf32:
    raise ValueError(f"wgmma matmul: TF32 operands must both be K-major (B stored N×K), not a K×N B of {k}×{n}")
  if b_n_major and n % chunk_elements(dtype):
    raise ValueError(f"wgmma matmul: A {m}×{k} · B {k}×{n} needs N a multiple of {chunk_elements(dtype)} (16-byte "
                     f"rows of B)")

def launch_dims(config: WgmmaConfig, m: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(grid, block) of the kernel: blockIdx.x over column tiles, blockIdx.y over row tiles."""
  return (-(-n // config.block_n), -(-m // config.block_m), 1), (config.threads, 1, 1)

def wgmma_arch(arch: str) -> Optional[str]:
  """The NVRTC target for the wgmma kernel on a GPU of `arch` (sm_90 → sm_90a), or None where there is no wgmma."""
  return WARPGROUP_MMA_ARCH if sm_number(arch) == sm_number(WARPGROUP_MMA_ARCH) else None

ROWS = "rows"   # the kernel's local holding a symbolic row count

def _rows_check(m: Size, block: int, row: str) -> list[str]:
  """The bound check of a row against M: none when M is a multiple of the block's rows."""
  if not isinstance(m, int): return [f"{row} < {ROWS}"]
  return [f"{row} < {m}"] if m % block else []

def _a_tile_offset(shape: MatmulShape, tile_k: int = BLOCK_K) -> str:
  """Elements from a row's start to K tile `tile` of A (a K segment holds whole tiles of `tile_k`)."""
  if shape.a_segment in (0, shape.k): return f"tile * {tile_k}"
  return f"(long long)(tile * {tile_k} / {shape.a_segment}) * {shape.a_segment_stride} + tile * {tile_k} % " \
         f"{shape.a_segment}"

# a 16-byte cp.async of one chunk, or a zero fill where it lies outside the operand (`any`: a valid address to name)
COPY_CHUNK_LINES = (
  "  auto copy_chunk = [](unsigned int target, const element* source, const element* any, bool valid) {",
  '    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(target), "l"(valid ? source : any), '
  '"r"(valid ? 16 : 0) : "memory");',
  "  };")

def pipeline_start_lines(c: WgmmaConfig, tiles: int) -> list[str]:
  """The pipeline's first stages - 2 tiles asked for before the main loop (one commit group each, empty past the
  last tile), as every cp.async template of this family starts."""
  return [f"  #pragma unroll\n  for (int s = 0; s < {c.stages - 2}; ++s) {{", f"    if (s < {tiles}) copy_tile(s, s);",
          '    asm volatile("cp.async.commit_group;" ::: "memory");', "  }"]

def tile_ready_lines(c: WgmmaConfig, tiles: int) -> list[str]:
  """Inside the main loop, once tile t is in its stage as the wgmmas read it: made visible to the async proxy, every
  thread past the barrier, the tile stages - 2 ahead asked for into the stage freed two tiles ago, and the wgmma fence
  before the tile's MMAs (the same in every cp.async template of this family)."""
  return ['    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // visible to wgmma (the async proxy)',
          "    __syncthreads();",
          f"    if (t + {c.stages - 2} < {tiles}) copy_tile(t + {c.stages - 2}, stage >= 2 ? stage - 2 : stage + "
          f"{c.stages - 2});",
          '    asm volatile("cp.async.commit_group;" ::: "memory");',
          '    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");']

def _copy_lines(c: WgmmaConfig, operand_b: bool, shape: MatmulShape, dtype: DType = dtypes.float16) -> list[str]:
  """The C that copies K tile `tile` of one operand into stage `stage` (inside the copy lambda)."""
  m, n, k = shape.m, shape.n, shape.k
  tile_k, chunk_size = block_k(dtype), chunk_elements(dtype)
  name = "b" if operand_b else "a"
  n_major = operand_b and c.b_n_major
  base = f"stage_address + {c.b_offset}" if operand_b else "stage_address"
  lines = []
  for i in range(copies(c, operand_b)):
    if n_major:
      k_row, n_chunk = copy_n_major(c, CExpr("tid"), i)
      offset = n_major_offset(c, k_row, n_chunk)
      checks = ([f"tile * {tile_k} + {k_row} < {k}"] if k % tile_k else []) + \
               ([f"block_col + {n_chunk * chunk_size} < {n}"] if n % c.block_n else [])
      source = f"{name}_source + (long long)(tile * {tile_k} + {k_row}) * {n}"
    else:
      row, chunk = copy_k_major(c, CExpr("tid"), i)
      offset = k_major_offset(row, chunk)
      checks = (_rows_check(n, c.block_n, f"block_col + {row}") if operand_b else
                _rows_check(m, c.block_m, f"block_row + {row}")) + \
               ([f"tile * {tile_k} + {chunk * chunk_size} < {k}"] if k % tile_k else [])
      row_stride = k if operand_b else shape.row_stride
      rows_ahead = i * (c.threads // ROW_CHUNKS)
      ahead = rows_ahead * row_stride if isinstance(row_stride, int) else f"(long long){rows_ahead} * {row_stride}"
      tile_offset = f"tile * {tile_k}" if operand_b else _a_tile_offset(shape, tile_k)
      source = f"{name}_source + {ahead} + {tile_offset}"
    valid = " && ".join(checks) or "true"
    lines.append(f"    copy_chunk({base} + {offset}, {source}, {name}, {valid});")
  return lines

PARAMETERS = {"out": "element* __restrict__ out", "a": "const element* __restrict__ a",
              "b": "const element* __restrict__ b"}
FLOAT_OUT = "float* __restrict__ out"
VARIABLE_SUFFIX = "_arg"   # a variable `v` is the parameter `long long v_arg` (the CUDA renderer's convention)

def parameter_list(arguments: tuple[str, ...], shape: MatmulShape) -> str:
  """The kernel's buffer parameters in the order `arguments` names them, then its variables (64-bit)."""
  float_out = shape.out_dtype == dtypes.float32
  buffers = [FLOAT_OUT if role == "out" and float_out else PARAMETERS[role] for role in arguments]
  return ", ".join(buffers + [f"long long {v}{VARIABLE_SUFFIX}" for v in shape.variables])

def rows_line(shape: MatmulShape) -> list[str]:
  """The local holding a symbolic row count (none for a known one)."""
  return [] if isinstance(shape.m, int) else [f"  const int {ROWS} = (int)({shape.m});"]

def block_prologue(c: WgmmaConfig) -> list[str]:
  """The opening of a warpgroup-MMA kernel's body, shared by the cp.async kernel here and the TMA kernel
  (wgmma_tma.py): the dynamic shared memory, the thread's warpgroup, the block's output corner, and `shared_base`
  (shared memory rounded up to a swizzle atom)."""
  return [
    "  extern __shared__ __align__(1024) unsigned char shared[];",
    "  const int tid = threadIdx.x;",
    f"  const int warpgroup = tid / {WARPGROUP_THREADS}, lane_thread = tid % {WARPGROUP_THREADS};",
    f"  const int block_row = blockIdx.y * {c.block_m}, block_col = blockIdx.x * {c.block_n};",
    f"  // the swizzle is a function of address bits 4-9: every tile starts on a {SWIZZLE_ATOM_BYTES}-byte boundary",
    f"  const unsigned int shared_base = ((unsigned int)__cvta_generic_to_shared(shared) + {SWIZZLE_ATOM_BYTES - 1}) "
    f"& ~{SWIZZLE_ATOM_BYTES - 1}u;"]

def stage_barrier_lines(stages: int, offset: int, full_arrivals: int, empty_arrivals: int) -> list[str]:
  """A warp-specialized kernel's pipeline barriers, shared by the TMA kernel (wgmma_tma.py) and the packed one
  (packed_wgmma.py): stage s is full (its tile is in place) at full_barriers + 8s, empty (its wgmmas are done) at
  empty_barriers + 8s, `offset` bytes past shared_base; thread 0 initializes them with the arrivals each phase takes,
  a block barrier, and `wait(barrier, parity)`, which returns once the phase of that parity has completed."""
  return [
    f"  // stage s is full (its copies have landed) at full_barriers + {MBARRIER_BYTES}s, empty (its wgmmas are done) "
    f"at empty_barriers + {MBARRIER_BYTES}s",
    f"  const unsigned int full_barriers = shared_base + {offset}, empty_barriers = full_barriers + "
    f"{MBARRIER_BYTES * stages};",
    "  if (tid == 0) {",
    f"    for (int s = 0; s < {stages}; ++s) {{",
    f'      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(full_barriers + {MBARRIER_BYTES} * s), '
    f'"r"({full_arrivals}) : "memory");',
    f'      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(empty_barriers + {MBARRIER_BYTES} * s), '
    f'"r"({empty_arrivals}) : "memory");',
    "    }",
    '    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");   // visible to the copy engine',
    "  }",
    "  __syncthreads();",
    "  auto wait = [](unsigned int barrier, unsigned int parity) {   // until the phase of this parity has completed",
    "    unsigned int done = 0;",
    '    while (!done) asm volatile("{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n'
    'selp.u32 %0, 1, 0, p;\\n}\\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");',
    "  };"]

def consumer_loop_lines(c: WgmmaConfig, type_name: str, tiles: int) -> list[str]:
  """A warp-specialized kernel's consumer warpgroup (after stage_barrier_lines): its accumulators, and for each K
  tile, wait until it has landed, its wgmmas (k_tile_wgmmas), and once tile t - 1's wgmmas are done, arrive on that
  tile's empty barrier; then wait for the last wgmmas. The epilogue follows."""
  a_bits, b_bits = descriptor_bits(c)
  return [
    f"    float acc[{c.accumulators}];",
    f"    #pragma unroll\n    for (int i = 0; i < {c.accumulators}; ++i) acc[i] = 0.0f;",
    f"    const unsigned long long a_bits = {a_bits}ull, b_bits = {b_bits}ull;   // LBO, SBO, 128-byte swizzle",
    "    int stage = 0, previous = 0;",
    "    unsigned int phase = 0;",
    f"    for (int t = 0; t < {tiles}; ++t) {{",
    f"      wait(full_barriers + {MBARRIER_BYTES} * stage, phase);   // tile t has landed",
    '      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");',
    *k_tile_wgmmas(c, type_name, "      "),
    f'      if (t > 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(empty_barriers + '
    f'{MBARRIER_BYTES} * previous) : "memory");',
    "      previous = stage;",
    f"      if (++stage == {c.stages}) {{ stage = 0; phase ^= 1; }}",
    "    }",
    '    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");']

def descriptor_bits(c: WgmmaConfig) -> tuple[int, int]:
  """The fixed fields (LBO, SBO, 128-byte swizzle) of A's and B's shared-memory matrix descriptors."""
  return tuple(encode_descriptor(0, *c.descriptor_offsets(operand_b), SWIZZLE_128B) for operand_b in (0, 1))

def wgmma_statement(instruction: str, accumulators: str, count: int, a_inputs: list[str], b_input: str,
                    immediates: str) -> str:
  """One wgmma as inline PTX: `count` accumulators of the array `accumulators` (read and written), A as one input (a
  descriptor) or several (its fragment's registers, in braces), B's descriptor, scale-d as a predicate set from an
  immediate 1, then `immediates` (scale-a, scale-b and any transposes)."""
  registers = ", ".join(f"%{i}" for i in range(count))
  a_first, b, one = count, count + len(a_inputs), count + len(a_inputs) + 1
  a_text = f"%{a_first}" if len(a_inputs) == 1 else \
    "{" + ", ".join(f"%{a_first + i}" for i in range(len(a_inputs))) + "}"
  outputs = ", ".join(f'"+f"({accumulators}[{i}])' for i in range(count))
  return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{one}, 0;\\n{instruction} {{{registers}}}, {a_text}, '
          f'%{b}, p, {immediates};\\n}}\\n" : {outputs} : {", ".join(a_inputs)}, {b_input}, "n"(1) : "memory");')

def k_tile_wgmmas(c: WgmmaConfig, type_name: str, indent: str,
                  parts: tuple[tuple[Index, Index, str], ...] = ((0, 0, "acc"),)) -> list[str]:
  """The wgmmas of one K tile (BLOCK_K / WGMMA_K of them, from the stage `stage`, descriptors from `a_bits`, `b_bits`
  and `shared_base`), their commit, and the wait for the previous tile's: a loop body's lines at `indent`, shared by
  the cp.async kernel here, the TMA kernel (wgmma_tma.py) and the 3xTF32 kernel (wgmma_split.py), whose `parts` are
  the (A, B) byte offsets (ints or C) from the stage's tiles and the accumulator array of each wgmma of a K step (its
  big and small parts)."""
  tf32 = type_name == WGMMA_TYPES[TF32]
  instruction = f"wgmma.mma_async.sync.aligned.m64n{c.block_n}k{8 if tf32 else 16}.f32.{type_name}.{type_name}"
  # scale-a, scale-b 1; a 16-bit type also takes imm-trans-a 0 and imm-trans-b (B N-major); TF32 has no transpose
  immediates = "1, 1" if tf32 else f"1, 1, 0, {int(c.b_n_major)}"
  lines: list[str] = []
  for k_step in range(SWIZZLE_BYTES // STEP_BYTES):
    for a_part, b_part, accumulators in parts:
      start_a = descriptor_start(c, CExpr("stage"), False, CExpr("warpgroup"), k_step) + a_part
      start_b = descriptor_start(c, CExpr("stage"), True, CExpr("warpgroup"), k_step) + b_part
      lines += [
        "{",
        f"  const unsigned long long desc_a = a_bits | (((shared_base + {start_a}) >> 4) & {DESCRIPTOR_FIELD_MASK});",
        f"  const unsigned long long desc_b = b_bits | (((shared_base + {start_b}) >> 4) & {DESCRIPTOR_FIELD_MASK});",
        "  " + wgmma_statement(instruction, accumulators, c.accumulators, ['"l"(desc_a)'], '"l"(desc_b)', immediates),
        "}"]
  lines += ['asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");',
            'asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // tile t - 1\'s wgmmas are done']
  return [indent + line for line in lines]

def wgmma_matmul_source(name: str, m: Size, n: int, k: int, dtype: DType = dtypes.float16,
                        config: WgmmaConfig = WgmmaConfig(), arguments: tuple[str, ...] = ("out", "a", "b"),
                        shape: Optional[MatmulShape] = None) -> str:
  """CUDA C of `name(out, a, b)` (parameters in the order `arguments` names them, then `shape.variables`):
  out[M×N] = a[M×K] · b[N×K]ᵀ (a · b[K×N] when b_n_major) in `dtype` (the output in shape.out_dtype), float32
  accumulators (see the module doc; `shape` for a symbolic M, a segmented A, a float32 output). Compile for sm_90a
  (wgmma is an sm_90a feature)."""
  shape = shape or MatmulShape(m, n, k)
  check_shapes(m, n, k, dtype, config.b_n_major)
  tile_k, chunk_size = block_k(dtype), chunk_elements(dtype)
  if shape.a_segment and (shape.a_segment % tile_k or k % shape.a_segment):
    raise ValueError(f"wgmma matmul: A's K segments of {shape.a_segment} must be whole K tiles of {tile_k} in K={k}")
  if config.tma: raise ValueError(f"wgmma matmul: tile {config} loads by TMA: wgmma_tma.tma_matmul_source writes it")
  if config.split_tf32: raise ValueError(f"wgmma matmul: tile {config} is 3xTF32: wgmma_split.split_matmul_source "
                                         "writes it")
  if sorted(arguments) != sorted(PARAMETERS): raise ValueError(f"wgmma matmul: arguments {arguments} must order "
                                                               f"{list(PARAMETERS)}")
  c = config
  tiles = -(-k // tile_k)
  type_name = WGMMA_TYPES[dtype]
  tid = CExpr("tid")
  a_row, a_chunk = copy_k_major(c, tid, 0)
  if c.b_n_major:
    b_row, b_chunk = copy_n_major(c, tid, 0)
    b_start = f"b + block_col + {b_chunk * chunk_size}"   # K-row b_row is added per copy (with the tile)
  else:
    b_row, b_chunk = copy_k_major(c, tid, 0)
    b_start = f"b + (long long)(block_col + {b_row}) * {k} + {b_chunk * chunk_size}"
  lines = [
    f"typedef {'float' if dtype == TF32 else 'unsigned short'} element;",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    f'extern "C" __global__ void __launch_bounds__({c.threads}, 1) {name}({parameter_list(arguments, shape)}) {{',
    *block_prologue(c), *rows_line(shape),
    f"  const element* a_source = a + (long long)(block_row + {a_row}) * {shape.row_stride} + "
    f"{a_chunk * chunk_size};",
    f"  const element* b_source = {b_start};",
    f"  float acc[{c.accumulators}];",
    f"  #pragma unroll\n  for (int i = 0; i < {c.accumulators}; ++i) acc[i] = 0.0f;",
    *COPY_CHUNK_LINES,
    "  auto copy_tile = [&](int tile, int stage) {",
    f"    const unsigned int stage_address = shared_base + stage * {c.stage_bytes};",
    *_copy_lines(c, False, shape, dtype), *_copy_lines(c, True, shape, dtype),
    "  };"]
  if dtype == TF32: lines += _rounding_lambda(c)
  lines += [
    *pipeline_start_lines(c, tiles),
    "  int stage = 0;",
    f"  for (int t = 0; t < {tiles}; ++t) {{",
    f'    asm volatile("cp.async.wait_group {c.stages - 3};" ::: "memory");   // tile t has landed (this thread)',
    *(["    round_tile(stage);   // this thread's chunks of tile t to TF32, in place"] if dtype == TF32 else []),
    *tile_ready_lines(c, tiles),
  ]
  a_bits, b_bits = descriptor_bits(c)
  lines += [f"    const unsigned long long a_bits = {a_bits}ull, b_bits = {b_bits}ull;   // LBO, SBO, 128-byte swizzle"]
  lines += k_tile_wgmmas(c, type_name, "    ")
  lines += [
    f"    stage = stage + 1 == {c.stages} ? 0 : stage + 1;",
    "  }",
    '  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");',
  ]
  lines += _epilogue(c, n, m, shape.out_dtype or dtype, CExpr("lane_thread"), CExpr("warpgroup"))
  lines.append("}")
  return "\n".join(lines) + "\n"

def _rounding_lambda(c: WgmmaConfig) -> list[str]:
  """`round_tile(stage)`: the 16-byte chunks this thread copied into `stage` (the same offsets as its copies: they
  have landed after its cp.async.wait_group) rounded in place to TF32, as the graph's round_to_tf32 does (to nearest,
  ties away from zero: add half of the dropped bits, clear them; a NaN kept). The tensor core would otherwise drop
  the low 13 bits of each float (truncation). The kernel's fence.proxy.async that follows makes these generic-proxy
  stores visible to the wgmmas, as it does the copies."""
  offsets = [k_major_offset(*copy_k_major(c, CExpr("tid"), i)) for i in range(copies(c, False))] + \
            [c.b_offset + k_major_offset(*copy_k_major(c, CExpr("tid"), i)) for i in range(copies(c, True))]
  return [
    "  unsigned char* const aligned_shared = shared + (shared_base - (unsigned int)__cvta_generic_to_shared(shared));",
    "  auto round_chunk = [](unsigned char* at) {   // 4 floats to TF32",
    "    float4 v = *(float4*)at;",
    "    float* x = &v.x;",
    "    #pragma unroll",
    "    for (int i = 0; i < 4; ++i) x[i] = x[i] != x[i] ? x[i] : "
    f"__uint_as_float((__float_as_uint(x[i]) + 0x{TF32_ROUNDING_BIAS:X}u) & 0x{TF32_KEEP_MASK:X}u);",
    "    *(float4*)at = v;",
    "  };",
    "  auto round_tile = [&](int stage) {",
    f"    unsigned char* const stage_start = aligned_shared + stage * {c.stage_bytes};",
    *[f"    round_chunk(stage_start + {offset});" for offset in offsets],
    "  };"]

def _epilogue(c: WgmmaConfig, n: int, m: Size, dtype: DType, tid_in_group: CExpr, warpgroup: CExpr) -> list[str]:
  """Each accumulator rounded to the output dtype (a float32 output: stored as summed) and stored at its (row,
  column); an even N stores the two adjacent columns of registers 2j, 2j + 1 as one 32-bit word (a float2 for
  float32)."""
  pairs = n % 2 == 0
  checks = _rows_check(m, c.block_m, "row") + ([f"column < {n}"] if n % c.block_n else [])
  guard = f"if ({' && '.join(checks)}) " if checks else ""
  if dtype == dtypes.float32:
    lines = []
    for register in range(0, c.accumulators, 2 if pairs else 1):
      row, column = accumulator_position(tid_in_group, register)
      value = f"make_float2(acc[{register}], acc[{register + 1}])" if pairs else f"acc[{register}]"
      target = f"*(float2*)(out + (long long)row * {n} + column)" if pairs else f"out[(long long)row * {n} + column]"
      lines += ["  {", f"    const int row = block_row + {warpgroup * WGMMA_M + row}, column = block_col + {column};",
                f"    {guard}{target} = {value};", "  }"]
    return lines
  cvt = "cvt.rn.f16.f32" if dtype == dtypes.float16 else "cvt.rn.bf16.f32"
  lines = ["  auto to_element = [](float x) -> element {",
           f'    element h; asm("{cvt} %0, %1;" : "=h"(h) : "f"(x)); return h;',
           "  };"]
  for register in range(0, c.accumulators, 2 if pairs else 1):
    row, column = accumulator_position(tid_in_group, register)
    lines.append("  {")
    lines.append(f"    const int row = block_row + {warpgroup * WGMMA_M + row}, column = block_col + {column};")
    if pairs:
      lines += [f"    {guard}*(unsigned int*)(out + (long long)row * {n} + column) = "
                f"(unsigned int)to_element(acc[{register}]) | ((unsigned int)to_element(acc[{register + 1}]) << 16);"]
    else:
      lines.append(f"    {guard}out[(long long)row * {n} + column] = "
                   f"to_element(acc[{register}]);")
    lines.append("  }")
  return lines

def compile_wgmma_matmul(name: str, m: int, n: int, k: int, dtype: DType = dtypes.float16,
                         config: WgmmaConfig = WgmmaConfig()) -> bytes:
  """The kernel's cubin for sm_90a (NVRTC). Load it with runtime.CUDAProgram (which opts it into its dynamic shared
  memory) and launch it on `launch_dims(config, m, n)` with (out, a, b) device pointers."""
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  return compile_cuda(wgmma_matmul_source(name, m, n, k, dtype, config), WARPGROUP_MMA_ARCH)
