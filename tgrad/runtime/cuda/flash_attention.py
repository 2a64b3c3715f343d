"""Flash attention for CUDA (sm_80+): softmax(q·kᵀ·scale + mask)·v in one kernel, the score matrix never stored.

`flash_attention_source(config, name, sizes)` gives the CUDA C of `name(out, q, k, v, <int64 variables>)` for half or
bfloat16 inputs with float32 accumulators. Grid: (ceil(rows / BLOCK_ROWS), kv heads, batch), BLOCK_THREADS threads.

  - **Rows.** A kv head's query heads (its group, GQA) are attended together: row R of kv head h is query position
    R / group of query head h·group + R % group, so the K and V tiles a block stages serve every head of the group.
    Each of the 4 warps owns 16 rows of the block's BLOCK_ROWS.
  - **Shared memory**, one dynamic array: the block's Q tile [BLOCK_ROWS × D], then two stages of (K tile, V tile)
    [block_n × D] each. A row of D 16-bit elements is D/8 16-byte chunks; chunk c of row r sits at chunk
    `swizzled_chunk(r, c)` (its low bits XOR r mod 8), so the 8 rows an ldmatrix reads hit 8 different bank groups.
  - **Copies.** `cp.async.cg` of 16-byte chunks (a row past the sequence reads 0 bytes: zero fill); Q and the first
    K/V tile are one group; each iteration issues the next tile's group into the other stage before it waits
    (`cp.async.wait_group 1`) for its own, so one tile's copies overlap the previous tile's math.
  - **Scores.** Per K tile and warp, S = Q·Kᵀ (16 × block_n) by `mma.sync.m16n8k16` (float32 accumulate): A from the
    Q tile by `ldmatrix.x4`, B from the K tile by `ldmatrix.x4` (a K row is a B column). Masked scores (a key past
    the sequence, after the query with `causal`, `window` or more positions before it) are -inf.
  - **Online softmax** in registers, in base 2 (scores times scale·log2 e): a row's running max m and sum l (a row's
    four lanes agree on m through two xor-shuffles; l is summed across them at the end); a new max rescales l and
    the output accumulators by 2^(m_old − m_new); a row that has seen only masked keys keeps m = −inf and adds 0.
  - **Weighted sum.** The probabilities, rounded to the input type, are the A fragments of P·V directly (the mma's
    C layout of two n-tiles is its A layout), B from the V tile by `ldmatrix.x4.trans`; the 16 × D output
    accumulators of a warp stay in registers (D/2 floats a thread) until the end, divided by l and stored.

Sizes the graph knows only at launch (the sequence lengths, strides over a symbolic length) are C expressions of the
kernel's int64 variable parameters (`sizes`); the head dim, the group, the masks and the scale are compiled in.
Tests: test/unit/test_flash_attention.py (NVRTC for sm_80 and sm_90, the kernel on the CPU emulator against numpy).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Optional
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX

WARP_THREADS = 32
WARPS = 4
BLOCK_THREADS = WARPS * WARP_THREADS
MMA_M, MMA_N, MMA_K = 16, 8, 16                 # mma.sync.m16n8k16
BLOCK_ROWS = WARPS * MMA_M                      # query rows (positions × heads of a group) per block
ELEMENT_BYTES = 2
CHUNK_BYTES = 16                                # one cp.async, one ldmatrix row
CHUNK_ELEMENTS = CHUNK_BYTES // ELEMENT_BYTES
SWIZZLE_ROWS = 8                                # the rows one ldmatrix matrix reads
STAGES = 2                                      # K/V tiles in shared memory: the one in use and the next
SUPPORTED_HEAD_DIMS = (64, 128, 256)            # D/8 chunks a multiple of 8: the swizzle permutes whole rows of 8
# keys per tile: the scores take block_n/2 float registers a thread, the output D/2. For D = 256 both 32 and 64 keys
# spill a little (255 registers; 88 and 60 bytes), and 64 measured faster on an H100 (bench/attention.py, Gemma's
# 4 heads over 1 kv head, causal): 30.2 µs against 45.0 at 512 positions, 291 against 336 µs at 4,096; its shared
# memory (160 KiB) still fits an sm_80 block
BLOCK_N_FOR_HEAD_DIM = {64: 64, 128: 64, 256: 64}
MAX_SHARED_BYTES_SM80 = 163 * 1024              # the opt-in shared memory per block of sm_80 (the smallest target)
LOG2_E = 1 / math.log(2)
TYPES = {"float16": ("f16", "cvt.rn.f16.f32"), "bfloat16": ("bf16", "cvt.rn.bf16.f32")}
SIZE_NAMES = ("L", "S", "q_offset", "q_batch", "q_head", "q_pos", "k_offset", "k_batch", "k_head", "k_pos", "v_offset",
              "v_batch", "v_head", "v_pos")

@dataclass(frozen=True)
class FlashConfig:
  """What one compiled flash-attention kernel is specialized to."""
  dtype: str                    # "float16" or "bfloat16"
  head_dim: int                 # D, of q, k and v
  group: int                    # query heads per kv head
  kv_heads: int
  scale: float                  # multiplies q·k
  causal: bool                  # key s attends to query l only where s <= l (top-left aligned, as torch's is_causal)
  window: Optional[int] = None  # with causal: also l - s < window (a sliding window)
  def __post_init__(self):
    if self.dtype not in TYPES: raise ValueError(f"flash attention: dtype {self.dtype!r}, not one of {list(TYPES)}")
    if self.head_dim not in SUPPORTED_HEAD_DIMS:
      raise ValueError(f"flash attention: head dim {self.head_dim} is not one of {SUPPORTED_HEAD_DIMS}")
    if self.group < 1 or self.kv_heads < 1: raise ValueError(f"flash attention: group {self.group}, kv heads "
                                                             f"{self.kv_heads}: both must be >= 1")
    if self.window is not None and (not self.causal or self.window < 1):
      raise ValueError(f"flash attention: a window ({self.window}) needs causal and >= 1")
  @property
  def block_n(self) -> int: return BLOCK_N_FOR_HEAD_DIM[self.head_dim]
  @property
  def row_bytes(self) -> int: return self.head_dim * ELEMENT_BYTES
  @property
  def q_bytes(self) -> int: return BLOCK_ROWS * self.row_bytes
  @property
  def tile_bytes(self) -> int: return self.block_n * self.row_bytes
  @property
  def shared_bytes(self) -> int: return self.q_bytes + STAGES * 2 * self.tile_bytes

def swizzled_chunk(row: int, chunk: int) -> int:
  """Where 16-byte chunk `chunk` of a shared row sits: its low 3 bits XOR row mod 8 (the kernel's `swizzle`)."""
  return chunk ^ (row % SWIZZLE_ROWS)

def grid(config: FlashConfig, length: int, batch: int) -> tuple[int, int, int]:
  """The launch grid for `length` query positions."""
  return (max(1, -(-length * config.group // BLOCK_ROWS)), config.kv_heads, batch)

def _float_literal(x: float) -> str: return f"{float(x)!r}f" if math.isfinite(x) else "INFINITY"

PROLOGUE = r"""typedef unsigned short element;
__device__ __forceinline__ unsigned int swizzle(int row, int chunk) { return (unsigned int)(chunk ^ (row & 7)); }
__device__ __forceinline__ void copy_chunk(unsigned int target, const element* source, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(target), "l"(source), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void load_matrices(unsigned int* r, unsigned int address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void load_matrices_transposed(unsigned int* r, unsigned int address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void mma(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
  asm volatile("MMA {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float exp2_approx(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
__device__ __forceinline__ unsigned int pack(float lo, float hi) {
  unsigned short a, b;
  asm("CVT %0, %1;" : "=h"(a) : "f"(lo));
  asm("CVT %0, %1;" : "=h"(b) : "f"(hi));
  return (unsigned int)a | ((unsigned int)b << 16);
}
"""

BODY = r"""
extern "C" __device__ const unsigned int NAME_SHARED_SUFFIX = SHARED_BYTES;
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, 1) NAME(element* __restrict__ out,
    const element* __restrict__ q_buffer, const element* __restrict__ k_buffer, const element* __restrict__ v_buffer
    PARAMETERS) {
  extern __shared__ __align__(128) unsigned char shared[];
  const float negative_infinity = __uint_as_float(0xff800000u);
SIZES
  const element* q = q_buffer + q_offset;
  const element* k = k_buffer + k_offset;
  const element* v = v_buffer + v_offset;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int batch = blockIdx.z, kv_head = blockIdx.y;
  const int rows = (int)(L * GROUP), row0 = blockIdx.x * BLOCK_ROWS, length = (int)S;
  const unsigned int q_base = (unsigned int)__cvta_generic_to_shared(shared);
  const unsigned int kv_base = q_base + Q_BYTES;
  const element* k_head = k + batch * k_batch + kv_head * k_head_stride;
  const element* v_head = v + batch * v_batch + kv_head * v_head_stride;
  // Q rows: (position, head of the group), zero-filled past the last row
  #pragma unroll
  for (int c = tid; c < BLOCK_ROWS * CHUNKS; c += BLOCK_THREADS) {
    const int r = c / CHUNKS, chunk = c % CHUNKS;
    const int row = row0 + r, position = row / GROUP, head = kv_head * GROUP + row % GROUP;
    const bool valid = row < rows;
    const element* source = valid ? q + batch * q_batch + head * q_head + position * q_pos + chunk * 8 : q;
    copy_chunk(q_base + r * ROW_BYTES + swizzle(r, chunk) * 16, source, valid);
  }
  auto copy_tile = [&](int tile, int stage) {
    const unsigned int k_tile = kv_base + stage * 2 * TILE_BYTES, v_tile = k_tile + TILE_BYTES;
    #pragma unroll
    for (int c = tid; c < BLOCK_N * CHUNKS; c += BLOCK_THREADS) {
      const int r = c / CHUNKS, chunk = c % CHUNKS;
      const int key = tile * BLOCK_N + r;
      const bool valid = key < length;
      const unsigned int at = r * ROW_BYTES + swizzle(r, chunk) * 16;
      copy_chunk(k_tile + at, valid ? k_head + key * k_pos + chunk * 8 : k, valid);
      copy_chunk(v_tile + at, valid ? v_head + key * v_pos + chunk * 8 : v, valid);
    }
  };
  // the keys this block's rows may see
  const int first_position = row0 / GROUP;
  const int last_position = ((row0 + BLOCK_ROWS < rows ? row0 + BLOCK_ROWS : rows) - 1) / GROUP;
  int key_end = length, key_begin = 0;
  if (CAUSAL) key_end = last_position + 1 < length ? last_position + 1 : length;
  if (WINDOW > 0) key_begin = first_position - WINDOW + 1 > 0 ? first_position - WINDOW + 1 : 0;
  const int tile_begin = key_begin / BLOCK_N, tile_end = (key_end + BLOCK_N - 1) / BLOCK_N;
  if (tile_begin < tile_end) copy_tile(tile_begin, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");

  const int group_id = lane / 4, thread_in_group = lane % 4;
  int position[2];   // this thread's two rows: warp·16 + group_id and 8 rows on
  #pragma unroll
  for (int h = 0; h < 2; ++h) position[h] = (row0 + warp * 16 + group_id + 8 * h) / GROUP;
  float o[HEAD_DIM / 8][4];
  #pragma unroll
  for (int j = 0; j < HEAD_DIM / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {negative_infinity, negative_infinity}, l[2] = {0.0f, 0.0f};
  // ldmatrix row addresses of this lane (before the swizzle): A of Q, B of K, B of V (transposed)
  const int q_row = warp * 16 + lane % 16, q_chunk = lane / 16;
  const int k_row = lane % 8 + (lane / 16) * 8, k_chunk = (lane / 8) % 2;
  const int v_row = lane % 8 + ((lane / 8) % 2) * 8, v_chunk = lane / 16;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) % 2;
    if (tile + 1 < tile_end) {
      copy_tile(tile + 1, stage ^ 1);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    const unsigned int k_tile = kv_base + stage * 2 * TILE_BYTES, v_tile = k_tile + TILE_BYTES;
    float s[BLOCK_N / 8][4];
    #pragma unroll
    for (int j = 0; j < BLOCK_N / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      unsigned int a[4];
      load_matrices(a, q_base + q_row * ROW_BYTES + swizzle(q_row, 2 * kk + q_chunk) * 16);
      #pragma unroll
      for (int np = 0; np < BLOCK_N / 16; ++np) {
        unsigned int b[4];
        const int r = np * 16 + k_row;
        load_matrices(b, k_tile + r * ROW_BYTES + swizzle(r, 2 * kk + k_chunk) * 16);
        mma(s[2 * np], a, b[0], b[1]);
        mma(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    // mask, scale to base 2, and the rows' new maxima
    float tile_max[2] = {negative_infinity, negative_infinity};
    #pragma unroll
    for (int j = 0; j < BLOCK_N / 8; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile * BLOCK_N + j * 8 + 2 * thread_in_group + (e & 1), p = position[e / 2];
        bool keep = key < length;
        if (CAUSAL) keep = keep && key <= p;
        if (WINDOW > 0) keep = keep && p - key < WINDOW;
        s[j][e] = keep ? s[j][e] * SCALE_LOG2 : negative_infinity;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
      }
    }
    float base[2], alpha[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float new_max = fmaxf(m[h], tile_max[h]);
      base[h] = new_max == negative_infinity ? 0.0f : new_max;   // no key kept yet: every term is 0
      alpha[h] = exp2_approx(m[h] - base[h]);
      m[h] = new_max;
      l[h] *= alpha[h];
    }
    #pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
      o[j][0] *= alpha[0]; o[j][1] *= alpha[0]; o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
    }
    #pragma unroll
    for (int j = 0; j < BLOCK_N / 8; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2_approx(s[j][e] - base[e / 2]);
        l[e / 2] += s[j][e];
      }
    }
    // o += p · v: two score n-tiles are one A fragment
    #pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
      unsigned int a[4] = {pack(s[2 * kk][0], s[2 * kk][1]), pack(s[2 * kk][2], s[2 * kk][3]),
                           pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int r = kk * 16 + v_row;
      #pragma unroll
      for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
        unsigned int b[4];
        load_matrices_transposed(b, v_tile + r * ROW_BYTES + swizzle(r, 2 * dp + v_chunk) * 16);
        mma(o[2 * dp], a, b[0], b[1]);
        mma(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();   // every warp is done with this stage before the next iteration's copies overwrite it
  }
  // out[batch, head, position, :] = o / l (rows past the end are not stored)
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = row0 + warp * 16 + group_id + 8 * h;
    if (row >= rows) continue;
    const int head = kv_head * GROUP + row % GROUP;
    const float inverse = 1.0f / l[h];
    const long long first = (((long long)batch * KV_HEADS * GROUP + head) * L + position[h]) * HEAD_DIM;
    unsigned int* target = (unsigned int*)(out + first);
    #pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j)
      target[j * 4 + thread_in_group] = pack(o[j][2 * h] * inverse, o[j][2 * h + 1] * inverse);
  }
}
"""

def flash_attention_source(config: FlashConfig, name: str, sizes: dict[str, str], variables: tuple[str, ...] = ()
                           ) -> str:
  """CUDA C of kernel `name` (see the module doc). `sizes`: a C expression (of `variables`, the kernel's int64
  parameters after the buffers) for each of SIZE_NAMES: the query and key lengths L and S, and for q, k and v the
  element offset of their first element in their buffer and their strides in elements over batch, head and position
  (their last dim must be contiguous, each row 16-byte aligned). The output is a new [batch, heads, L, D] array."""
  if missing := [s for s in SIZE_NAMES if s not in sizes]: raise ValueError(f"flash attention: no size for {missing}")
  type_name, convert = TYPES[config.dtype]
  renamed = {"k_head": "k_head_stride", "v_head": "v_head_stride"}   # k_head, v_head name the heads' pointers
  size_lines = "\n".join(f"  const long long {renamed.get(s, s)} = {sizes[s]};" for s in SIZE_NAMES)
  values = {"NAME_SHARED_SUFFIX": name + DYNAMIC_SHARED_SUFFIX, "SHARED_BYTES": str(config.shared_bytes),
            "BLOCK_THREADS": str(BLOCK_THREADS), "BLOCK_ROWS": str(BLOCK_ROWS), "BLOCK_N": str(config.block_n),
            "CHUNKS": str(config.head_dim // CHUNK_ELEMENTS), "ROW_BYTES": str(config.row_bytes),
            "TILE_BYTES": str(config.tile_bytes), "Q_BYTES": str(config.q_bytes), "HEAD_DIM": str(config.head_dim),
            "GROUP": str(config.group), "KV_HEADS": str(config.kv_heads),
            "CAUSAL": "true" if config.causal else "false",
            "WINDOW": str(config.window or 0), "SCALE_LOG2": _float_literal(config.scale * LOG2_E),
            }
  body = BODY
  for key in sorted(values, key=len, reverse=True): body = body.replace(key, values[key])
  body = body.replace("NAME", name).replace("PARAMETERS", "".join(f", long long {v}" for v in variables))
  body = body.replace("SIZES", size_lines)   # last: the expressions are the caller's text
  prologue = PROLOGUE.replace("MMA", f"mma.sync.aligned.m16n8k16.row.col.f32.{type_name}.{type_name}.f32")
  return prologue.replace("CVT", convert) + body
