"""Hopper warpgroup MMA (PTX `wgmma.mma_async`, sm_90a): a half/bfloat16 matmul kernel C = A·Bᵀ (or A·B) with
float32 accumulators, both operands read by the tensor cores from shared memory through matrix descriptors.

Every index formula the kernel uses is one Python function here (`shared_offset`, `copy_chunk`,
`accumulator_position`, `encode_descriptor`), called with ints by the CPU emulation in the tests and with `CExpr`s
(C expression text) by `wgmma_matmul_source`, so what the tests check is what the kernel computes.

  - **Operands.** A is M×K and B is N×K, both row-major (K contiguous: "K-major" for wgmma; a linear layer's weight
    is stored so); with `b_n_major` B is K×N row-major (a plain a·b, N a multiple of 8), staged N-major (core
    matrices of 8 K-rows × 8 N-elements) and read with imm-trans-b = 1. Each block computes a BM×BN tile of C:
    `warpgroups` warpgroups of 128 threads, one per 64 rows, each issuing
    `wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{f16,bf16}.{f16,bf16}` per K step of 16.
  - **Shared layout.** A stage holds A's BM×BK tile and B's BN×BK tile in the K-major layout without swizzling
    (PTX ISA "Shared Memory Matrix Layout", canonical ((8,m),(T,2k)):((1T,SBO),(1,LBO)), T = 8 16-bit elements):
    "core matrices" of 8 rows × 16 bytes, each 128 contiguous bytes (row r at 16·r); the core matrices of one
    8-row group follow each other along K (leading byte offset LBO = 128), and 8-row groups are BK·2·8 bytes apart
    (stride byte offset SBO). A descriptor addresses a 64×16 (A) or BN×16 (B) slice: its start is the slice's first
    core matrix.
  - **Copies.** Each thread copies 16-byte chunks (8 elements of one row) with `cp.async.cg` (rows or K beyond the
    matrix read 0 bytes and fill zeros), one commit group per tile; a warp's chunks are 8 rows × 4 chunks, so the
    8 threads of a shared-memory phase write one core matrix (128 contiguous bytes, no bank conflicts).
  - **Pipeline** of `stages` ≥ 3 buffers. Iteration t: wait for tile t's copies (`cp.async.wait_group stages-3`),
    `fence.proxy.async.shared::cta` (the copies are generic-proxy writes; wgmma reads through the async proxy),
    `__syncthreads()`; issue tile t + stages - 2's copies into the buffer of tile t - 2; `wgmma.fence`, the BK/16
    wgmmas of tile t, `wgmma.commit_group`, `wgmma.wait_group 1` (tile t - 1's group has finished, so after the
    next barrier every warpgroup is done with tile t - 2's buffer: the one the next iteration overwrites).
  - **Accumulators** (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16", D): thread t of a warpgroup holds
    BN/2 floats; register i is row 16·(t / 32) + (t % 32) / 4 + 8·((i % 4) / 2), column 8·(i / 4) + 2·(t % 4) +
    i % 2. The epilogue rounds them to the inputs' dtype and stores them (pairs as one 32-bit store when N is even).

The kernel is specialized to (M, N, K); K must be a multiple of 8 (16-byte rows for cp.async). Tests:
test/unit/test_wgmma.py (NVRTC for sm_90a, the emitted sequence, the CPU emulation), test/test_wgmma_gpu.py (GPU).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional, Union
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.runtime.cuda.renderer import DYNAMIC_SHARED_SUFFIX, WARPGROUP_MMA_ARCH, sm_number

WARPGROUP_THREADS = 128
WARP_THREADS = 32
WGMMA_M = 64            # rows of one warpgroup's wgmma
WGMMA_K = 16            # K of one wgmma with 16-bit inputs
CORE_ROWS = 8           # a core matrix: 8 rows of 16 bytes
CORE_ROW_BYTES = 16
CORE_BYTES = CORE_ROWS * CORE_ROW_BYTES
CHUNK_BYTES = 16        # one cp.async
DESCRIPTOR_ADDRESS_SHIFT = 4                     # addresses and offsets are encoded in 16-byte units
DESCRIPTOR_FIELD_MASK = (1 << 14) - 1            # 14 bits each
DESCRIPTOR_LEADING_SHIFT, DESCRIPTOR_STRIDE_SHIFT, DESCRIPTOR_SWIZZLE_SHIFT = 16, 32, 62
SWIZZLE_NONE = 0
MAX_SHARED_BYTES = 227 * 1024                    # sm_90's opt-in dynamic shared memory per block
WGMMA_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}
MIN_STAGES = 3

Index = Union[int, "CExpr"]

class CExpr:
  """C expression text that combines with ints and other CExprs under + * // %, so one Python formula yields both a
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

@dataclass(frozen=True)
class WgmmaConfig:
  """One block's tile: `warpgroups` × 64 rows (BM), `block_n` columns (BN, the wgmma's N: a multiple of 8 up to 256),
  `block_k` of K per pipeline stage (a multiple of 16), `stages` shared-memory buffers."""
  warpgroups: int = 2
  block_n: int = 128
  block_k: int = 64
  stages: int = 4
  b_n_major: bool = False   # b is K×N (N contiguous: a plain a·b) instead of N×K; wgmma reads it transposed
  def __post_init__(self):
    if not (1 <= self.warpgroups <= 4 and self.block_n % 8 == 0 and 8 <= self.block_n <= 256 and
            self.block_k % WGMMA_K == 0 and self.block_k > 0 and self.stages >= MIN_STAGES):
      raise ValueError(f"wgmma tile {self}: needs 1-4 warpgroups, block_n a multiple of 8 in 8..256, block_k a "
                       f"multiple of {WGMMA_K}, stages >= {MIN_STAGES}")
    if self.shared_bytes > MAX_SHARED_BYTES:
      raise ValueError(f"wgmma tile {self}: {self.shared_bytes} bytes of shared memory > {MAX_SHARED_BYTES}")
  @property
  def block_m(self) -> int: return self.warpgroups * WGMMA_M
  @property
  def threads(self) -> int: return self.warpgroups * WARPGROUP_THREADS
  @property
  def accumulators(self) -> int: return self.block_n // 2   # floats per thread
  def tile_bytes(self, rows: int) -> int: return rows * self.block_k * 2
  @property
  def b_offset(self) -> int: return self.tile_bytes(self.block_m)   # B's tile follows A's in a stage
  @property
  def stage_bytes(self) -> int: return self.tile_bytes(self.block_m) + self.tile_bytes(self.block_n)
  @property
  def shared_bytes(self) -> int: return self.stages * self.stage_bytes
  @property
  def leading_bytes(self) -> int: return CORE_BYTES                                 # next core matrix along K
  @property
  def stride_bytes(self) -> int: return self.block_k * 2 * CORE_ROWS                # next 8-row group

# ---- the layout formulas (ints for the tests, CExprs for the kernel)

def shared_offset(config: WgmmaConfig, row: Index, k: Index) -> Index:
  """Byte offset of element (row, k) (k a multiple of 8 for a chunk's start) in a K-major tile without swizzle."""
  return (row // CORE_ROWS) * config.stride_bytes + (k // 8) * config.leading_bytes + (row % CORE_ROWS) * \
    CORE_ROW_BYTES + (k % 8) * 2

def shared_offset_n_major(config: WgmmaConfig, n: Index, k: Index) -> Index:
  """Byte offset of element (n, k) (n a multiple of 8 for a chunk's start) in an N-major tile without swizzle
  (canonical ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))): core matrices of 8 K-rows × 8 N-elements (128 contiguous bytes),
  the next 8 K-rows `leading_bytes` on, the next 8 N-elements `stride_bytes` on."""
  return (n // 8) * config.stride_bytes + (k // CORE_ROWS) * config.leading_bytes + (k % CORE_ROWS) * \
    CORE_ROW_BYTES + (n % 8) * 2

def copy_chunk_n_major(config: WgmmaConfig, chunk: Index) -> tuple[Index, Index]:
  """(n, k) of an N-major tile's 16-byte chunk number `chunk` (8 N-elements of one K-row): 8 K-rows fastest, then
  the N chunks, then the next 8 K-rows."""
  chunks_n = config.block_n // 8
  k8, rest = chunk % CORE_ROWS, chunk // CORE_ROWS
  return (rest % chunks_n) * 8, (rest // chunks_n) * CORE_ROWS + k8

def copy_chunk(config: WgmmaConfig, chunk: Index) -> tuple[Index, Index]:
  """(row, k) of a tile's 16-byte chunk number `chunk` (thread + i·threads): 8 rows fastest, then 4 chunks of K,
  then the next 8 rows, then the next 4 chunks of K."""
  chunks_k = config.block_k // 8
  k_group = 4 if chunks_k % 4 == 0 else 2   # block_k is a multiple of 16: chunks_k is even
  row8, rest = chunk % CORE_ROWS, chunk // CORE_ROWS
  k_inner, rest = rest % k_group, rest // k_group
  k_outer, row_group = rest % (chunks_k // k_group), rest // (chunks_k // k_group)
  return row_group * CORE_ROWS + row8, (k_outer * k_group + k_inner) * 8

def accumulator_position(thread: Index, register: int) -> tuple[Index, Index]:
  """(row, column) in the warpgroup's 64×N tile of accumulator `register` of `thread` (0..127)."""
  lane = thread % WARP_THREADS
  row = (thread // WARP_THREADS) * 16 + lane // 4 + 8 * ((register % 4) // 2)
  return row, 8 * (register // 4) + (lane % 4) * 2 + register % 2

def encode_descriptor(start: int, leading: int, stride: int, swizzle: int = SWIZZLE_NONE) -> int:
  """The 64-bit shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address,
  16-29 leading byte offset, 32-45 stride byte offset, each >> 4; 62-63 the swizzle mode (0: none)."""
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
  """Byte offset in the dynamic shared array of the first core matrix of a wgmma's A (warpgroup's 64 rows) or B
  slice at K step `k_step` of a stage."""
  rows = 0 if operand_b else warpgroup * (WGMMA_M // CORE_ROWS) * config.stride_bytes
  return stage * config.stage_bytes + (config.b_offset if operand_b else 0) + rows + \
    k_step * (WGMMA_K // 8) * config.leading_bytes

# ---- what the hardware computes, on the CPU (the tests' reference for the layouts)

def read_operand(shared: np.ndarray, descriptor: int, rows: int, dtype: DType, transposed: bool = False) -> np.ndarray:
  """The rows×16 operand (rows: M or N) a no-swizzle descriptor addresses in `shared` (bytes), as float32. K-major
  (imm-trans 0): element (r, k) is at start + (r / 8)·stride + (k / 8)·leading + (r % 8)·16 + (k % 8)·2 (canonical
  ((8,m),(T,2k)):((1T,SBO),(1,LBO))); MN-major (imm-trans 1): at start + (r / 8)·stride + (k / 8)·leading +
  (k % 8)·16 + (r % 8)·2 (canonical ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))), written independently of the kernel's
  formulas from the PTX ISA's layouts."""
  start, leading, stride, swizzle = decode_descriptor(descriptor)
  assert swizzle == SWIZZLE_NONE, "only the no-swizzle layout is emulated"
  r, k = np.arange(rows)[:, None], np.arange(WGMMA_K)[None, :]
  inner, row_of_core = (r % 8, k % 8) if transposed else (k % 8, r % 8)
  at = start + (r // 8) * stride + (k // 8) * leading + row_of_core * CORE_ROW_BYTES + inner * 2
  bits = shared[at].astype(np.uint16) | shared[at + 1].astype(np.uint16) << 8   # little-endian 16-bit elements
  return float_of_bits(bits, dtype)

def float_of_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
  """16-bit half or bfloat16 patterns as float32."""
  if dtype == dtypes.float16: return bits.astype(np.uint16).view(np.float16).astype(np.float32)
  return (bits.astype(np.uint32) << 16).view(np.float32)

def emulate_block(config: WgmmaConfig, a: np.ndarray, b: np.ndarray, dtype: DType, block_row: int = 0,
                  block_col: int = 0) -> np.ndarray:
  """One block's C tile (float32, clipped to the matrix) computed the way the kernel does: every chunk copied to its
  `copy_chunk`/`shared_offset` place in a fresh, poisoned stage buffer per K tile (a byte the wgmma reads but no
  copy wrote shows up as garbage), each wgmma reading its operands through the descriptors the kernel builds
  (`descriptor_start`), each accumulator register added at `accumulator_position`. a: M×K and b: N×K uint16 bits."""
  m, k_size = a.shape
  n = b.shape[1] if config.b_n_major else b.shape[0]
  accumulators = np.zeros((config.warpgroups, WARPGROUP_THREADS, config.accumulators), np.float32)
  threads, registers = np.arange(WARPGROUP_THREADS)[:, None], np.arange(config.accumulators)[None, :]
  acc_rows, acc_columns = accumulator_position(threads, registers)   # type: ignore[arg-type]
  for tile in range(-(-k_size // config.block_k)):
    stage = tile % config.stages
    shared = np.full(config.shared_bytes, 0xFF, np.uint8)   # 0xFFFF is NaN in half and bfloat16
    for operand, rows, source, first_row in ((0, config.block_m, a, block_row), (1, config.block_n, b, block_col)):
      n_major = bool(operand) and config.b_n_major
      base = stage * config.stage_bytes + (config.b_offset if operand else 0)
      chunk = np.arange(rows * config.block_k // 8)
      row, k = (copy_chunk_n_major if n_major else copy_chunk)(config, chunk)   # type: ignore[arg-type]
      assert len(set(zip(row.tolist(), k.tolist()))) == len(chunk), "every chunk of the tile is copied once"
      g_row, g_k = first_row + row, tile * config.block_k + k
      # a chunk is 8 elements along the contiguous axis: K for a K-major operand, N (rows) for an N-major one
      matrix = source.T if n_major else source   # rows × K either way
      limit = matrix.shape[0]
      valid = (g_row < limit) & (g_k < k_size)
      padded = np.zeros((limit + 8, k_size + 8), np.uint16)
      padded[:limit, :k_size] = matrix
      run = np.arange(8)
      r_idx = np.minimum(g_row, limit)[:, None] + (run if n_major else 0)
      k_idx = np.minimum(g_k, k_size)[:, None] + (0 if n_major else run)
      values = np.where(valid[:, None], padded[r_idx, k_idx], 0).astype(np.uint16)
      offset = shared_offset_n_major if n_major else shared_offset
      at = base + offset(config, row, k)   # type: ignore[arg-type]
      shared[at[:, None] + np.arange(CHUNK_BYTES)] = values.view(np.uint8).reshape(len(chunk), CHUNK_BYTES)
    for warpgroup in range(config.warpgroups):
      for k_step in range(config.block_k // WGMMA_K):
        desc_a, desc_b = (encode_descriptor(descriptor_start(config, stage, operand_b, warpgroup, k_step),
                                            config.leading_bytes, config.stride_bytes) for operand_b in (False, True))
        b_tile = read_operand(shared, desc_b, config.block_n, dtype, transposed=config.b_n_major)
        product = read_operand(shared, desc_a, WGMMA_M, dtype) @ b_tile.T
        accumulators[warpgroup] += product[acc_rows, acc_columns]
  out = np.full((config.block_m, config.block_n), np.nan, np.float32)
  for warpgroup in range(config.warpgroups):
    out[warpgroup * WGMMA_M + acc_rows, acc_columns] = accumulators[warpgroup]
  return out[:max(0, min(config.block_m, m - block_row)), :max(0, min(config.block_n, n - block_col))]

# ---- the kernel's source

def check_shapes(m: int, n: int, k: int, dtype: DType, b_n_major: bool = False) -> None:
  if dtype not in WGMMA_TYPES: raise ValueError(f"wgmma matmul: dtype {dtype} is not one of {list(WGMMA_TYPES)}")
  if min(m, n, k) < 1 or k % 8:
    raise ValueError(f"wgmma matmul: A {m}×{k} · B {n}×{k}ᵀ needs sizes ≥ 1 and K a multiple of 8 (16-byte rows)")
  if b_n_major and n % 8:
    raise ValueError(f"wgmma matmul: A {m}×{k} · B {k}×{n} needs N a multiple of 8 (16-byte rows of B)")

def launch_dims(config: WgmmaConfig, m: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(grid, block) of the kernel: blockIdx.x over column tiles, blockIdx.y over row tiles."""
  return (-(-n // config.block_n), -(-m // config.block_m), 1), (config.threads, 1, 1)

def wgmma_arch(arch: str) -> Optional[str]:
  """The NVRTC target for the wgmma kernel on a GPU of `arch` (sm_90 → sm_90a), or None where there is no wgmma."""
  return WARPGROUP_MMA_ARCH if sm_number(arch) == sm_number(WARPGROUP_MMA_ARCH) else None

def wgmma_matmul_source(name: str, m: int, n: int, k: int, dtype: DType = dtypes.float16,
                        config: WgmmaConfig = WgmmaConfig()) -> str:
  """CUDA C of `name(out, a, b)`: out[M×N] = a[M×K] · b[N×K]ᵀ in `dtype`, float32 accumulators (see the module doc).
  Compile for sm_90a (wgmma is an sm_90a feature)."""
  check_shapes(m, n, k, dtype, config.b_n_major)
  c = config
  tiles = -(-k // c.block_k)
  tid_in_group, warpgroup = CExpr("lane_thread"), CExpr("warpgroup")
  type_name = WGMMA_TYPES[dtype]
  lines = [
    "typedef unsigned short element;",
    f'extern "C" __device__ const unsigned int {name}{DYNAMIC_SHARED_SUFFIX} = {c.shared_bytes};',
    f'extern "C" __global__ void __launch_bounds__({c.threads}) {name}(element* __restrict__ out, '
    "const element* __restrict__ a, const element* __restrict__ b) {",
    "  extern __shared__ __align__(128) unsigned char shared[];",
    "  const int tid = threadIdx.x;",
    f"  const int warpgroup = tid / {WARPGROUP_THREADS}, lane_thread = tid % {WARPGROUP_THREADS};",
    f"  const int block_row = blockIdx.y * {c.block_m}, block_col = blockIdx.x * {c.block_n};",
    "  const unsigned int shared_base = (unsigned int)__cvta_generic_to_shared(shared);",
    f"  float acc[{c.accumulators}];",
    f"  #pragma unroll\n  for (int i = 0; i < {c.accumulators}; ++i) acc[i] = 0.0f;",
  ]
  # the copy of K tile `tile` into stage `stage`: each operand's chunks, `threads` apart
  copy = ["  auto copy_tile = [&](int tile, int stage) {"]
  for operand, rows, limit, first in (("a", c.block_m, m, "block_row"), ("b", c.block_n, n, "block_col")):
    n_major = operand == "b" and c.b_n_major
    chunks = rows * c.block_k // 8
    base = f"stage * {c.stage_bytes}" + (f" + {c.b_offset}" if operand == "b" else "")
    copy.append(f"    #pragma unroll\n    for (int i = 0; i < {-(-chunks // c.threads)}; ++i) {{")
    copy.append(f"      const int chunk = tid + i * {c.threads};")
    if chunks % c.threads: copy.append(f"      if (chunk >= {chunks}) break;")
    row, kk = (copy_chunk_n_major if n_major else copy_chunk)(c, CExpr("chunk"))
    offset = (shared_offset_n_major if n_major else shared_offset)(c, CExpr("row"), CExpr("k"))
    element = "(long long)global_k * {n} + global_row" if n_major else "(long long)global_row * {k} + global_k"
    copy += [f"      const int row = {row}, k = {kk};",
             f"      const int global_row = {first} + row, global_k = tile * {c.block_k} + k;",
             f"      const bool valid = global_row < {limit} && global_k < {k};",
             f"      const element* source = {operand} + (valid ? {element.format(n=n, k=k)} : 0);",
             f"      const unsigned int target = shared_base + {base} + {offset};",
             '      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(target), "l"(source), '
             '"r"(valid ? 16 : 0) : "memory");',
             "    }"]
  copy.append("  };")
  lines += copy
  desc_bits = encode_descriptor(0, c.leading_bytes, c.stride_bytes)
  lines += [
    f"  const unsigned long long descriptor_bits = {desc_bits}ull;   // leading {c.leading_bytes} B, stride "
    f"{c.stride_bytes} B, no swizzle",
    f"  #pragma unroll\n  for (int s = 0; s < {c.stages - 2}; ++s) {{",
    f"    if (s < {tiles}) copy_tile(s, s);",
    '    asm volatile("cp.async.commit_group;" ::: "memory");',
    "  }",
    f"  for (int t = 0; t < {tiles}; ++t) {{",
    f'    asm volatile("cp.async.wait_group {c.stages - 3};" ::: "memory");   // tile t has landed (this thread)',
    '    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // visible to wgmma (the async proxy)',
    "    __syncthreads();",
    f"    if (t + {c.stages - 2} < {tiles}) copy_tile(t + {c.stages - 2}, (t + {c.stages - 2}) % {c.stages});",
    '    asm volatile("cp.async.commit_group;" ::: "memory");',
    f"    const int stage = t % {c.stages};",
    '    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");',
  ]
  outputs = ", ".join(f'"+f"(acc[{i}])' for i in range(c.accumulators))
  registers = ", ".join(f"%{i}" for i in range(c.accumulators))
  da, db, one = c.accumulators, c.accumulators + 1, c.accumulators + 2
  instruction = f"wgmma.mma_async.sync.aligned.m64n{c.block_n}k16.f32.{type_name}.{type_name}"
  for k_step in range(c.block_k // WGMMA_K):
    start_a = descriptor_start(c, CExpr("stage"), False, warpgroup, k_step)
    start_b = descriptor_start(c, CExpr("stage"), True, warpgroup, k_step)
    lines += [
      "    {",
      f"      const unsigned long long desc_a = descriptor_bits | ((shared_base + {start_a}) >> 4);",
      f"      const unsigned long long desc_b = descriptor_bits | ((shared_base + {start_b}) >> 4);",
      f'      asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{one}, 0;\\n{instruction} {{{registers}}}, %{da}, '
      f'%{db}, p, 1, 1, 0, {int(c.b_n_major)};\\n}}\\n" : {outputs} : "l"(desc_a), "l"(desc_b), "r"(1) : "memory");',
      "    }"]
  lines += [
    '    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");',
    '    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // tile t - 1\'s wgmmas are done',
    "  }",
    '  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");',
  ]
  lines += _epilogue(c, n, m, dtype, tid_in_group, warpgroup)
  lines.append("}")
  return "\n".join(lines) + "\n"

def _epilogue(c: WgmmaConfig, n: int, m: int, dtype: DType, tid_in_group: CExpr, warpgroup: CExpr) -> list[str]:
  """Each accumulator rounded to the output dtype and stored at its (row, column); an even N stores the two
  adjacent columns of registers 2j, 2j + 1 as one 32-bit word."""
  cvt = "cvt.rn.f16.f32" if dtype == dtypes.float16 else "cvt.rn.bf16.f32"
  lines = ["  auto to_element = [](float x) -> element {",
           f'    element h; asm("{cvt} %0, %1;" : "=h"(h) : "f"(x)); return h;',
           "  };"]
  pairs = n % 2 == 0
  for register in range(0, c.accumulators, 2 if pairs else 1):
    row, column = accumulator_position(tid_in_group, register)
    lines.append("  {")
    lines.append(f"    const int row = block_row + {warpgroup * WGMMA_M + row}, column = block_col + {column};")
    if pairs:
      lines += [f"    if (row < {m} && column < {n}) *(unsigned int*)(out + (long long)row * {n} + column) = "
                f"(unsigned int)to_element(acc[{register}]) | ((unsigned int)to_element(acc[{register + 1}]) << 16);"]
    else:
      lines.append(f"    if (row < {m} && column < {n}) out[(long long)row * {n} + column] = "
                   f"to_element(acc[{register}]);")
    lines.append("  }")
  return lines

def compile_wgmma_matmul(name: str, m: int, n: int, k: int, dtype: DType = dtypes.float16,
                         config: WgmmaConfig = WgmmaConfig()) -> bytes:
  """The kernel's cubin for sm_90a (NVRTC). Load it with runtime.CUDAProgram (which opts it into its dynamic shared
  memory) and launch it on `launch_dims(config, m, n)` with (out, a, b) device pointers."""
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  return compile_cuda(wgmma_matmul_source(name, m, n, k, dtype, config), WARPGROUP_MMA_ARCH)
