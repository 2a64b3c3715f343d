"""The float32 matmul template (OptOps.SGEMM, codegen/simt_matmul.py): CUDA C of out[M×N] = a · b in float32 FMAs on
the CUDA cores, in the layout of the best SIMT GEMMs.

  - **Block tile.** Each block computes block_m × block_n outputs with (block_m / thread_m)·(block_n / thread_n)
    threads; a thread holds thread_m × thread_n accumulators as float4 groups: its rows are groups of 4 consecutive
    rows block_m / (thread_m / 4) apart, its columns likewise, so a thread reads each group of a K step from shared
    memory as one 128-bit load.
  - **Warps.** A warp's 32 threads are 4 rows × 8 columns of thread tiles (lane / 8, lane % 8): a quarter warp (8
    lanes, one 128-bit shared-memory wavefront) reads one float4 of A (a broadcast) and 8 consecutive float4 of B
    (128 contiguous bytes): no bank conflicts.
  - **Shared memory.** Two buffers (stages) of A and B, each K-major: BLOCK_K rows of block_m (block_n) floats plus
    PADDING, so a K step's fragment is a row. An operand stored K-contiguous (A M×K, B N×K) is loaded as float4 along K
    and written transposed (4 scalar stores; the padding of 4 floats puts the two K chunks of 16 consecutive rows in
    different banks); one stored M- or N-contiguous (A K×M, B K×N) is written as it is read (one float4 store).
  - **Pipeline.** The next K tile's float4 loads are issued into registers before the current tile's FMAs and stored
    into the other buffer after them: one barrier per K tile. K past its size and rows or columns past M or N read
    zeros; the epilogue stores float4 rows of each group (scalars when N is not a multiple of 4) inside M×N.

Each output is the sequential float32 FMA sum of its K products (K order). Sizes are compiled in (no variables).
Tests: test/unit/test_sgemm.py (NVRTC for sm_80 and sm_90, the kernel run on the CPU by test/cuda_on_cpu.py).
"""
from __future__ import annotations
from dataclasses import dataclass

BLOCK_K = 8          # K per shared-memory stage: 8 FMA steps per thread between barriers
VECTOR = 4           # floats in one 16-byte load or store
PADDING = 4          # floats after each shared-memory row: K chunks of a transposed store land in different banks
STAGES = 2           # shared-memory buffers: one being read while the next tile is stored into the other
WARP_THREADS = 32
WARP_ROWS, WARP_COLUMNS = 4, 8   # a warp's thread tiles: 4 rows × 8 columns (see the module doc)
MAX_THREADS = 1024
PARAMETERS = {"out": "float* __restrict__ out", "a": "const float* __restrict__ a",
              "b": "const float* __restrict__ b"}

@dataclass(frozen=True)
class SgemmConfig:
  """One block's tile: block_m × block_n outputs, thread_m × thread_n per thread (multiples of 4: float4 groups), and
  the blocks per SM the compiler must leave registers for (__launch_bounds__'s second argument)."""
  block_m: int = 128
  block_n: int = 128
  thread_m: int = 8
  thread_n: int = 8
  min_blocks: int = 1
  def __post_init__(self):
    rows, columns = self.block_m // max(1, self.thread_m), self.block_n // max(1, self.thread_n)
    ok = self.thread_m % VECTOR == 0 and self.thread_n % VECTOR == 0 and self.block_m % self.thread_m == 0 and \
      self.block_n % self.thread_n == 0 and rows % WARP_ROWS == 0 and columns % WARP_COLUMNS == 0 and \
      self.threads <= MAX_THREADS and self.min_blocks >= 1
    if ok:   # every thread loads whole float4s of each operand, whichever way it is stored
      ok = all(chunks % self.threads == 0 and self.threads % (extent // VECTOR) == 0
               for extent in (self.block_m, self.block_n) for chunks in [extent * BLOCK_K // VECTOR])
    if not ok:
      raise ValueError(f"sgemm tile {self}: thread tiles of float4 groups dividing the block, thread rows a multiple "
                       f"of {WARP_ROWS} and columns of {WARP_COLUMNS}, at most {MAX_THREADS} threads, and each "
                       f"operand's tile whole float4s per thread")
  @property
  def threads(self) -> int: return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)
  @property
  def warps_n(self) -> int: return self.block_n // self.thread_n // WARP_COLUMNS
  def group_stride(self, operand_b: bool) -> int:
    """Rows (columns for B) between a thread's float4 groups."""
    return self.block_n // (self.thread_n // VECTOR) if operand_b else self.block_m // (self.thread_m // VECTOR)
  def loads(self, operand_b: bool) -> int:
    """float4 loads per thread of one operand's K tile."""
    return (self.block_n if operand_b else self.block_m) * BLOCK_K // VECTOR // self.threads
  @property
  def shared_bytes(self) -> int: return STAGES * BLOCK_K * (self.block_m + self.block_n + 2 * PADDING) * 4

@dataclass(frozen=True)
class SgemmShape:
  """The sizes a kernel is specialized to and how its operands are stored: A M×K (K×M when a_m_major), B N×K (K×N
  when b_n_major); the output M×N row-major."""
  m: int
  n: int
  k: int
  a_m_major: bool = False
  b_n_major: bool = True

def check_shape(shape: SgemmShape) -> None:
  if min(shape.m, shape.n, shape.k) < 1:
    raise ValueError(f"sgemm: sizes must be >= 1, not {shape.m}×{shape.n}×{shape.k}")
  for name, contiguous in (("A", shape.m if shape.a_m_major else shape.k), ("B", shape.n if shape.b_n_major else
                                                                             shape.k)):
    if contiguous % VECTOR:
      raise ValueError(f"sgemm: {name}'s contiguous dimension {contiguous} must be a multiple of {VECTOR} (float4)")

def launch_dims(config: SgemmConfig, m: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(grid, block): blockIdx.x over column tiles, blockIdx.y over row tiles."""
  return (-(-n // config.block_n), -(-m // config.block_m), 1), (config.threads, 1, 1)

def _operand_lines(c: SgemmConfig, shape: SgemmShape, operand_b: bool) -> tuple[list[str], list[str], list[str]]:
  """(setup, load, store) lines of one operand: per-thread source pointers and bounds once; the float4 loads of K tile
  `next_tile` into registers `{x}_next`; their stores into shared buffer `next_stage`."""
  x = "b" if operand_b else "a"
  tile = c.block_n if operand_b else c.block_m
  size = shape.n if operand_b else shape.m
  origin = "block_col" if operand_b else "block_row"
  t_major = shape.b_n_major if operand_b else shape.a_m_major
  setup, load, store = [], [], []
  if t_major:   # K-rows of `tile` contiguous floats: thread -> (K-row, float4 of the row), consecutive along the row
    row_chunks = tile // VECTOR
    per_pass = c.threads // row_chunks
    setup.append(f"  const int {x}_k = tid / {row_chunks}, {x}_c = tid % {row_chunks};")
    in_size = f"{origin} + {VECTOR} * {x}_c < {size}" if size % tile else ""
    for i in range(c.loads(operand_b)):
      k_row = f"{x}_k + {i * per_pass}"
      setup.append(f"  const float* {x}_src{i} = {x} + (long long)({k_row}) * {size} + {origin} + {VECTOR} * {x}_c;")
      checks = [f"next_tile * {BLOCK_K} + {k_row} < {shape.k}"] if shape.k % BLOCK_K else []
      checks += [in_size] if in_size else []
      address = f"{x}_src{i} + (long long)next_tile * {BLOCK_K * size}"
      load.append(_guarded_load(f"{x}_next[{i}]", address, checks))
      store.append(f"      *(float4*)&{x}_tile[next_stage][{k_row}][{VECTOR} * {x}_c] = {x}_next[{i}];")
  else:         # rows of K contiguous floats: thread -> (row, float4 of K), the row's two float4 in neighbours
    k_chunks = BLOCK_K // VECTOR
    per_pass = c.threads // k_chunks
    setup.append(f"  const int {x}_r = tid / {k_chunks}, {x}_c = tid % {k_chunks};")
    for i in range(c.loads(operand_b)):
      row = f"{x}_r + {i * per_pass}"
      setup.append(f"  const float* {x}_src{i} = {x} + (long long)({origin} + {row}) * {shape.k} + {VECTOR} * {x}_c;")
      checks = [f"next_tile * {BLOCK_K} + {VECTOR} * {x}_c < {shape.k}"] if shape.k % BLOCK_K else []
      checks += [f"{origin} + {row} < {size}"] if size % tile else []
      load.append(_guarded_load(f"{x}_next[{i}]", f"{x}_src{i} + next_tile * {BLOCK_K}", checks))
      for j, lane in enumerate("xyzw"):
        store.append(f"      {x}_tile[next_stage][{VECTOR} * {x}_c + {j}][{row}] = {x}_next[{i}].{lane};")
  return setup, load, store

def _guarded_load(target: str, address: str, checks: list[str]) -> str:
  """A float4 load, or zeros where a check fails."""
  if not checks: return f"      {target} = *(const float4*)({address});"
  return f"      {target} = ({' && '.join(checks)}) ? *(const float4*)({address}) : make_float4(0.f, 0.f, 0.f, 0.f);"

def _fragment_lines(c: SgemmConfig, operand_b: bool) -> list[str]:
  """The thread's float4 groups of K step `kk` read from shared memory into `{x}_frag`."""
  x, groups = ("b", c.thread_n // VECTOR) if operand_b else ("a", c.thread_m // VECTOR)
  position = "tn" if operand_b else "tm"
  lines = []
  for g in range(groups):
    lines.append(f"      {{ const float4 v = *(const float4*)&{x}_tile[stage][kk][{g * c.group_stride(operand_b)} + "
                 f"{VECTOR} * {position}];")
    lines.append("        " + " ".join(f"{x}_frag[{VECTOR * g + j}] = v.{lane};" for j, lane in enumerate("xyzw")) +
                 " }")
  return lines

def _epilogue(c: SgemmConfig, shape: SgemmShape) -> list[str]:
  """Each accumulator group stored inside M×N: a float4 per group row when N is a multiple of 4, else scalars."""
  n = shape.n
  lines = []
  for g in range(c.thread_m // VECTOR):
    for j in range(VECTOR):
      i = VECTOR * g + j
      lines.append(f"  {{ const int row = block_row + {g * c.group_stride(False) + j} + {VECTOR} * tm;")
      row_check = f"row < {shape.m}" if shape.m % c.block_m else ""
      indent = "      " if row_check else "    "
      if row_check: lines.append(f"    if ({row_check}) {{")
      for h in range(c.thread_n // VECTOR):
        column = f"block_col + {h * c.group_stride(True)} + {VECTOR} * tn"
        values = [f"acc[{i}][{VECTOR * h + e}]" for e in range(VECTOR)]
        if n % VECTOR == 0:
          guard = f"if ({column} < {n}) " if n % c.block_n else ""
          lines.append(f"{indent}{guard}*(float4*)(out + (long long)row * {n} + {column}) = "
                       f"make_float4({', '.join(values)});")
        else:
          for e, value in enumerate(values):
            lines.append(f"{indent}if ({column} + {e} < {n}) out[(long long)row * {n} + {column} + {e}] = {value};")
      if row_check: lines.append("    }")
      lines.append("  }")
  return lines

def sgemm_source(name: str, shape: SgemmShape, config: SgemmConfig = SgemmConfig(),
                 arguments: tuple[str, ...] = ("out", "a", "b")) -> str:
  """CUDA C of `name(...)` (buffer parameters in the order `arguments` names them): out[M×N] = a · b in float32 (see
  the module doc). Plain CUDA C: compiles for any arch."""
  check_shape(shape)
  if sorted(arguments) != sorted(PARAMETERS):
    raise ValueError(f"sgemm: arguments {arguments} must order {list(PARAMETERS)}")
  c = config
  tiles = -(-shape.k // BLOCK_K)
  a_setup, a_load, a_store = _operand_lines(c, shape, False)
  b_setup, b_load, b_store = _operand_lines(c, shape, True)
  lines = [
    f'extern "C" __global__ void __launch_bounds__({c.threads}, {c.min_blocks}) '
    f'{name}({", ".join(PARAMETERS[role] for role in arguments)}) {{',
    f"  __shared__ __align__(16) float a_tile[{STAGES}][{BLOCK_K}][{c.block_m + PADDING}];",
    f"  __shared__ __align__(16) float b_tile[{STAGES}][{BLOCK_K}][{c.block_n + PADDING}];",
    f"  const int tid = threadIdx.x, warp = tid / {WARP_THREADS}, lane = tid % {WARP_THREADS};",
    f"  // the warp's thread tiles: {WARP_ROWS} rows × {WARP_COLUMNS} columns",
    f"  const int tm = (warp / {c.warps_n}) * {WARP_ROWS} + lane / {WARP_COLUMNS}, "
    f"tn = (warp % {c.warps_n}) * {WARP_COLUMNS} + lane % {WARP_COLUMNS};",
    f"  const int block_row = blockIdx.y * {c.block_m}, block_col = blockIdx.x * {c.block_n};",
    *a_setup, *b_setup,
    f"  float acc[{c.thread_m}][{c.thread_n}];",
    f"  #pragma unroll\n  for (int i = 0; i < {c.thread_m}; ++i) {{",
    f"    #pragma unroll\n    for (int j = 0; j < {c.thread_n}; ++j) acc[i][j] = 0.0f;",
    "  }",
    f"  float4 a_next[{c.loads(False)}], b_next[{c.loads(True)}];",
    "  {",
    "    const int next_tile = 0, next_stage = 0;",
    *a_load, *b_load, *a_store, *b_store,
    "  }",
    "  __syncthreads();",
    f"  for (int tile = 0; tile < {tiles}; ++tile) {{",
    "    const int stage = tile & 1, next_tile = tile + 1, next_stage = stage ^ 1;",
    f"    if (next_tile < {tiles}) {{   // the next tile's loads fly while this one's FMAs run",
    *a_load, *b_load,
    "    }",
    f"    #pragma unroll\n    for (int kk = 0; kk < {BLOCK_K}; ++kk) {{",
    f"      float a_frag[{c.thread_m}], b_frag[{c.thread_n}];",
    *_fragment_lines(c, False), *_fragment_lines(c, True),
    f"      #pragma unroll\n      for (int i = 0; i < {c.thread_m}; ++i) {{",
    f"        #pragma unroll\n        for (int j = 0; j < {c.thread_n}; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], "
    "acc[i][j]);",
    "      }",
    "    }",
    f"    if (next_tile < {tiles}) {{   // the other buffer: every thread passed the last barrier after reading it",
    *a_store, *b_store,
    "    }",
    "    __syncthreads();",
    "  }",
    *_epilogue(c, shape),
    "}"]
  return "\n".join(lines) + "\n"

def simt_matmul_source(name: str, matmul) -> str:
  """The kernel of an OptOps.SGEMM kernel (codegen/axes.py SimtMatmul: shape, layouts, tile, parameter order)."""
  config = SgemmConfig(matmul.block_m, matmul.block_n, matmul.thread_m, matmul.thread_n, matmul.min_blocks)
  shape = SgemmShape(matmul.m, matmul.n, matmul.k, matmul.a_m_major, matmul.b_n_major)
  return sgemm_source(name, shape, config, matmul.arguments)
