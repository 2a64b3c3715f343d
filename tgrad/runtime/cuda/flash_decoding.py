"""Flash decoding for CUDA: attention of one query position over a KV cache in one kernel, the keys split over blocks.

`flash_decoding_source(config, name, sizes, variables, buffers)` gives the CUDA C of `name(<buffers>, <int64
variables>)`: for each batch element and query head, softmax(transform(q·kᵀ·scale))·v over the cache's keys
[key_begin, S) (S, the key count, is a size expression: a decode step's filled slots), in float32 from float16,
bfloat16 or float32 inputs (ELEMENT_TYPES: a lane's row part loaded as 16-byte chunks of 8 halves or 4 floats).
Grid: (splits(S), kv heads, batch), config.block_threads threads; `splits` gives the split count of a key count (the
host's and the kernel's are the same formula).

  - **Rows.** A block serves one kv head and every query head of its group (GQA): their rows are in shared memory as
    float32, so each key and value row a block reads serves the whole group.
  - **Prologue** (optional, per config): each query row (and the new key) is RMS-normed over the head dim with a
    weight (`norm(x) = x / sqrt(mean(x²) + eps) · (norm_offset + w)`: qk-norm), then rotated (RoPE, half-split:
    dim d pairs with d + D/2, `x·cos + rotate_half(x)·sin_signed`, the tables for the query's position). A row is
    one warp's: its lanes load their D/32 elements with the weights and tables at once (one memory latency), sum the
    squares by shuffles and take the partner dims from lane ^ 16, all in registers, and the block meets once, when
    the rows are in shared memory (an H100, gemma-3-270m's float16 decode step: the earlier prologue, rows spread
    over the block with a barrier between its norm, scale and rotation, cost 2.9 µs a launch in the step's graph).
  - **Cache update** (optional): the step's new key (normed and rotated as the queries are, rounded to the cache's
    type) and value are written into the cache at `slot` by the first split's block, in the same launch. Every block
    reads the slot's key and value from the new ones (kept in shared memory), never from the cache, so no block
    waits for the write and none reads a half-written row.
  - **Keys.** Split s of the `splits` covers per_split consecutive keys. Each of the block's warps takes `keys` keys a
    step (the steps are uniform over the block, with no barrier between warps): a lane holds D/32 consecutive
    elements of each key and value row as loaded (16-byte loads where that is whole chunks). A warp's first rows are
    asked for before the prologue, and each step asks for the next step's rows as soon as it has converted its own,
    so they are in flight while it works. A lane dots its keys with its part of each query row, and the warp sums its
    keys·group dot products at once: each xor-shuffle level halves the values a lane keeps (4 shuffles, then 1, for
    16 sums, where one sum at a time takes 5 each; written out so the sums stay in registers); each score is then
    shuffled from its lane to all, and every lane updates each row's online softmax state (running max m, sum of
    exponentials l, in base 2: one rescale per step) and its D/32 elements of Σ p·v.
  - **Combine.** The warps' states meet in shared memory (rescaled by 2^(m_w − M)); with one split the block stores
    the output. With several, each block stores its (M, L, Σ p·v) partial in the scratch buffer, and the last block
    of its (batch, kv head) to finish (an atomic counter in the scratch, after a memory fence) rescales and sums the
    partials, stores the output and resets the counter to 0 for the next launch.
  - **Cluster combine** (sm_90+, `cluster` > 1: the kernel declares `__cluster_dims__(cluster, 1, 1)` and the grid's x
    is whole clusters). Up to cluster · CLUSTER_MAX_KEYS_PER_SPLIT keys are one cluster's splits (of at least
    CLUSTER_MIN_KEYS_PER_SPLIT keys), and the splits meet on chip: each block keeps its partial in its own shared
    memory (the query rows' space, free after the key loop), the cluster's blocks pass a cluster barrier, then each
    computes a share of the output elements from every split's partial, read from the other blocks' shared memory
    (`mapa`), and a second barrier keeps every block's shared memory alive until all have read it. Blocks past the
    splits only help that combine (or leave at once when there is one split). With more keys (splits of
    MIN_KEYS_PER_SPLIT or more), each cluster of splits combines its members the same way into one partial in the
    scratch, and the last block of the grid to finish (the atomic counter; every block counts) combines the clusters'
    partials: a few a row instead of every split's. An H200, gemma-3-270m's packed step: the scratch path's combine
    cost ~2.8 µs a launch more with 2 splits than with 1 (its fence, atomic and the last block's reads of L2); the
    step at position 100 went 0.432 → 0.380 ms. Clusters of more than 8 blocks (sm_90 allows 16, a non-portable
    size) mark the source with NON_PORTABLE_CLUSTER_SUFFIX, and the runtime allows that size on the function.

Scratch (float32 words): [batch, kv heads, MAX_SPLITS, group, D + 2] partials (Σ p·v, then m and l), then one
counter word per (batch, kv head); `scratch_words(config, batch)` is its size. It must be zero at the first launch.
Tests: test/unit/test_flash_decoding.py (NVRTC for sm_80 and sm_90; the emulator against numpy).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Optional
from tgrad.runtime.cuda.renderer import DEPENDENT_LAUNCH_SUFFIX, NON_PORTABLE_CLUSTER_SUFFIX

WARP_THREADS = 32
# Warps a block: 8 where their shared memory fits (every warp keeps its Σ p·v rows there for the block's combine), else
# 4. Eight warps keep twice the rows in flight per split (an H100, gemma-3-270m float16 decode step with this kernel:
# 0.738 / 0.761 ms at positions 100 / 2,000 with 4 warps, 0.654 / 0.680 with 8).
WARP_CHOICES = (8, 4)
# An H100 has 132 SMs: up to 128 splits a (batch, kv head) fill it for one kv head (gemma-3-270m's); a split of fewer
# than MIN_KEYS_PER_SPLIT keys costs more in its prologue, partial store and combine than it reads (an H200, gemma's
# 512-key sliding layer alone under ncu: 29.0 µs in 32 splits of 16 keys, 22.4 in 16 of 32, 21.1 in 8 of 64).
MAX_SPLITS = 128
MIN_KEYS_PER_SPLIT = 64
# Hopper's thread block clusters: up to `cluster` splits (FLASH_CLUSTER, at most CLUSTER_BLOCKS) are one cluster, whose
# blocks combine their partials through each other's shared memory (two cluster barriers) instead of global scratch,
# a fence and the last block's atomic. Keys up to CLUSTER_BLOCKS · CLUSTER_MAX_KEYS_PER_SPLIT are one cluster's, in
# splits of at least CLUSTER_MIN_KEYS_PER_SPLIT (a block's keys in one step: 8 warps × 4 keys for gemma's group of
# 4); more keys take splits of MIN_KEYS_PER_SPLIT or more, in several clusters. Measured on an H200 (gemma-3-270m's
# float16 step, its full layers at 513 and 1,001 keys): one cluster of 8 splits of 65 or 125 keys beat two clusters of
# splits of 64 (0.4192 → 0.4122 ms at position 512, 0.4190 → 0.4170 at 1,000); at 2,000 keys splits of 128 in two
# clusters and of 64 in four were level, and one cluster of 8 splits of 250 (a limit of 256) slower (0.4246 → 0.4305).
# Clusters of 16 blocks (non-portable: the runtime sets the function's attribute) halve a split's keys up to 2,048: a
# sliding layer's 512 keys are 16 splits of 32 (one step of a block's warps) instead of 8 of 64, and 2,000 keys one
# cluster of 16 splits of 125 instead of four clusters and the scratch's combine. An H200, the zero-data Q4_K_M file
# (two rounds, alternated with clusters of 8), float16 / packed step ms at 100, 512, 1,000, 2,000: clusters of 8
# 0.3845 0.4124 0.4173 0.4249 / 0.3806 0.4093 0.4140 0.4203; of 16 0.3850 0.4012 0.4016 0.4092 / 0.3786 0.3947 0.3953
# 0.4017; of 16 with at most 64 keys a split in a cluster (2,000 keys: two clusters and the scratch) 0.4119 / 0.4052 at
# 2,000, the rest level with 128.
CLUSTER_BLOCKS = 16                 # the most blocks of a cluster: sm_90's non-portable limit
PORTABLE_CLUSTER_BLOCKS = 8         # more need the function's non-portable attribute (the runtime sets it)
CLUSTER_MIN_KEYS_PER_SPLIT = 32
CLUSTER_MAX_KEYS_PER_SPLIT = 128
MAX_GROUP = 16                      # query heads per kv head held in a block's registers and shared memory
MAX_STEP_SCORES = 16                # keys · group dot products a warp sums at once (its keys a step: up to 4)
MAX_KEYS_PER_WARP = 4               # rows a lane holds at once: 4 keys and 4 values of D/32 floats each
STATIC_SHARED_LIMIT = 48 * 1024     # bytes of static shared memory a CUDA block may declare
LOG2_E = 1 / math.log(2)
HALF_TO_FLOAT = 'float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x)); return r;'
BFLOAT_TO_FLOAT = "return __uint_as_float(((unsigned int)x) << 16);"
@dataclass(frozen=True)
class ElementType:
  """An element type of q, k, v, the cache and the output, as the kernel's C source handles it."""
  ctype: str
  to_float: str                    # the body of element_float(x)
  from_float: str                  # the body of float_element(x): rounding to nearest even
  bytes: int
  word_elements: tuple[str, ...]   # C expressions of the elements a 32-bit word `w` holds, first to last

def _half_element(to_float: str, rounding: str) -> ElementType:
  return ElementType("unsigned short", to_float, f'element r; asm("{rounding} %0, %1;" : "=h"(r) : "f"(x)); return r;',
                     2, ("element_float((element)(w & 0xffffu))", "element_float((element)(w >> 16))"))
ELEMENT_TYPES = {"float16": _half_element(HALF_TO_FLOAT, "cvt.rn.f16.f32"),
                 "bfloat16": _half_element(BFLOAT_TO_FLOAT, "cvt.rn.bf16.f32"),
                 "float32": ElementType("float", "return x;", "return x;", 4, ("__uint_as_float(w)",))}
VECTOR_BYTES = 16   # a cache row's chunk a lane loads at once (uint4)
# the prologue's tables (norm weights, cos and sin) take the same types, independently of the elements' (a GGUF
# file keeps its norms in F32 under a float16 model)
# the buffers a kernel may take, in the roles the source names them by (pointer names in the kernel)
ROLES = ("out", "q", "k_cache", "v_cache", "k_new", "v_new", "q_weight", "k_weight", "cos", "sin", "scratch")
LAYOUT_ROLES = ("q", "k_cache", "v_cache", "k_new", "v_new")   # [B, H, N, D] inputs with an offset and 3 strides
TABLE_ROLES = ("q_weight", "k_weight", "cos", "sin")           # [D] inputs at an offset

@dataclass(frozen=True)
class DecodeConfig:
  """What one compiled flash-decoding kernel is specialized to."""
  dtype: str                        # "float16", "bfloat16" or "float32": q, k, v, the cache and the output
  head_dim: int                     # D: a multiple of 32 (each lane holds D/32 elements of a row)
  group: int                        # query heads per kv head
  kv_heads: int
  scale: float                      # multiplies q·k
  window: Optional[int] = None      # attend only the last `window` keys (the query is the last position)
  softcap: Optional[float] = None   # scores become softcap·tanh(score / softcap) (after the scale)
  norm: bool = False                # qk-norm: q and the new key RMS-normed with their weights
  norm_eps: float = 1e-6
  norm_offset: float = 0.0          # the norm multiplies by norm_offset + w (Gemma: 1)
  rotary: bool = False              # RoPE of q and the new key (half-split), with cos and sin_signed tables
  update: bool = False              # the new key and value written into the cache at `slot`, and read from there
  weight_dtype: str = "float16"     # the dtype of the norm weights (and of the rotary tables unless rotary_dtype)
  rotary_dtype: str = ""            # the dtype of the cos and sin tables ("": weight_dtype)
  def __post_init__(self):
    if self.dtype not in ELEMENT_TYPES or self.weight_dtype not in ELEMENT_TYPES or \
       self.rotary_dtype not in ("", *ELEMENT_TYPES):
      raise ValueError(f"flash decoding: dtypes {self.dtype!r}, {self.weight_dtype!r}, {self.rotary_dtype!r}: one of "
                       f"{list(ELEMENT_TYPES)}, for the elements and for the prologue's tables")
    if self.head_dim % WARP_THREADS or not 0 < self.head_dim <= 512:
      raise ValueError(f"flash decoding: head dim {self.head_dim} is not a multiple of {WARP_THREADS} up to 512")
    if not 1 <= self.group <= MAX_GROUP or self.kv_heads < 1:
      raise ValueError(f"flash decoding: group {self.group} (1 to {MAX_GROUP}), kv heads {self.kv_heads} (>= 1)")
    if self.window is not None and self.window < 1: raise ValueError(f"flash decoding: window {self.window} < 1")
    if self.softcap is not None and not self.softcap > 0:
      raise ValueError(f"flash decoding: softcap {self.softcap} must be positive")
    if self.rotary and self.head_dim % 2: raise ValueError("flash decoding: RoPE needs an even head dim")
    if self.shared_bytes > STATIC_SHARED_LIMIT:
      raise ValueError(f"flash decoding: group {self.group} × head dim {self.head_dim} needs {self.shared_bytes} bytes "
                       f"of shared memory, over {STATIC_SHARED_LIMIT}")
  @property
  def lane_elements(self) -> int: return self.head_dim // WARP_THREADS
  @property
  def vector_elements(self) -> int:
    """Elements of a 16-byte chunk (8 halves, 4 floats): a lane loads its row part so where it is whole chunks."""
    return VECTOR_BYTES // ELEMENT_TYPES[self.dtype].bytes
  @property
  def vector_loads(self) -> bool: return self.lane_elements % self.vector_elements == 0
  @property
  def keys_per_warp(self) -> int: return max(1, min(MAX_KEYS_PER_WARP, MAX_STEP_SCORES // self.group))
  @property
  def score_values(self) -> int:
    """The dot products a warp sums in a step, padded to a power of two (at most 32: one a lane at the end)."""
    return 1 << (self.keys_per_warp * self.group - 1).bit_length()
  @property
  def partial_words(self) -> int: return self.group * (self.head_dim + 2)
  def shared_bytes_with(self, warps: int) -> int:
    rows = self.group + 2   # the queries, the new key and value
    words = rows * self.head_dim + warps * self.group * (self.head_dim + 2) + 2 * MAX_SPLITS * self.group + 1
    return 4 * words
  @property
  def warps(self) -> int:
    return next((w for w in WARP_CHOICES if self.shared_bytes_with(w) <= STATIC_SHARED_LIMIT), WARP_CHOICES[-1])
  @property
  def block_threads(self) -> int: return self.warps * WARP_THREADS
  @property
  def shared_bytes(self) -> int: return self.shared_bytes_with(self.warps)
  def roles(self) -> tuple[str, ...]:
    """The buffer roles this kernel reads or writes, in ROLES order."""
    skip = set()
    if not self.update: skip |= {"k_new", "v_new", "k_weight"}   # the new key is the only key the kernel norms
    if not self.norm: skip |= {"q_weight", "k_weight"}
    if not self.rotary: skip |= {"cos", "sin"}
    return tuple(r for r in ROLES if r not in skip)

def clustered(visible: int, cluster: int) -> bool:
  """Whether `visible` keys take the cluster path with clusters of `cluster` blocks (0: none)."""
  return cluster > 1 and visible <= cluster * CLUSTER_MAX_KEYS_PER_SPLIT

def keys_per_split(visible: int, cluster: int = 0) -> int:
  """How many keys one split covers, for `visible` keys (>= 1), with clusters of `cluster` blocks (0: none)."""
  if clustered(visible, cluster): return max(CLUSTER_MIN_KEYS_PER_SPLIT, -(-visible // cluster))
  return max(MIN_KEYS_PER_SPLIT, -(-visible // MAX_SPLITS))

def splits(visible: int, cluster: int = 0) -> int:
  """How many splits cover `visible` keys (at most `cluster` on the cluster path)."""
  visible = max(1, visible)
  return -(-visible // keys_per_split(visible, cluster))

def visible_keys(config: DecodeConfig, keys: int) -> int:
  return max(1, min(keys, config.window) if config.window else keys)

def grid(config: DecodeConfig, keys: int, batch: int, cluster: int = 0) -> tuple[int, int, int]:
  """The launch grid: the splits (whole clusters of `cluster` blocks: the blocks past the splits leave at once, or
  only help the cluster's combine), kv heads, batch."""
  count = splits(visible_keys(config, keys), cluster)
  return (-(-count // cluster) * cluster if cluster > 1 else count, config.kv_heads, batch)

def scratch_words(config: DecodeConfig, batch: int) -> int:
  """float32 words of scratch a launch over `batch` needs: the partials, then the counters."""
  pairs = batch * config.kv_heads
  return pairs * MAX_SPLITS * config.partial_words + pairs

def _float_literal(x: float) -> str: return f"{float(x)!r}f"

def _score_transpose(config: DecodeConfig) -> str:
  """The xor levels of the warp's score sums, written out: every index a constant, so `sums` stays in registers (a
  loop over the levels leaves the halves' indices to the compiler, which then keeps the array in local memory)."""
  lines = []
  for level in range(config.score_values.bit_length() - 1):
    half, offset = config.score_values >> (level + 1), 16 >> level
    lines.append(f"    {{ const bool upper = (lane & {offset}) != 0;")
    for i in range(half):
      lines.append(f"      {{ const float low = sums[{i}], high = sums[{i + half}]; "
                   f"sums[{i}] = (upper ? high : low) + __shfl_xor_sync(0xffffffffu, upper ? low : high, {offset}); }}")
    lines.append("    }")
  return "\n".join(lines)

PROLOGUE = r"""typedef ELEMENT_TYPE element;
typedef WEIGHT_TYPE weight_element;
typedef ROTARY_TYPE rotary_element;
__device__ __forceinline__ float element_float(element x) { ELEMENT_TO_FLOAT }
__device__ __forceinline__ float weight_float(weight_element x) { WEIGHT_TO_FLOAT }
__device__ __forceinline__ float rotary_float(rotary_element x) { ROTARY_TO_FLOAT }
__device__ __forceinline__ element float_element(float x) { FLOAT_TO_ELEMENT }
__device__ __forceinline__ float exp2_approx(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
__device__ __forceinline__ float warp_sum(float x) {
  #pragma unroll
  for (int m = 16; m >= 1; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}
"""

BODY = r"""
// a key's (or value's) row of the cache as a lane loads it (its D/32 elements, raw), zeros past the split's end
__device__ __forceinline__ void load_raw(lane_row& target, int key, int end, const element* cache_rows,
                                         long long position_stride, int lane) {
  if (key < end) load_lane_row(target, cache_rows + key * position_stride + lane * LANE_ELEMENTS);
  else zero_lane_row(target);
}
// a loaded row as float32, or the new row (shared memory) at the slot this launch writes
__device__ __forceinline__ void row_values(float* target, const lane_row& loaded, int key, int new_slot,
                                           const float* new_row, int lane) {
  if (key == new_slot) {
    #pragma unroll
    for (int i = 0; i < LANE_ELEMENTS; ++i) target[i] = new_row[lane * LANE_ELEMENTS + i];
  } else lane_row_values(target, loaded);
}
extern "C" __global__ void CLUSTER_DIMS__launch_bounds__(BLOCK_THREADS, 1) NAME(PARAMETERS) {
  // the queries (normed, rotated), then the new key and value; after the key loop, on the cluster path, the block's
  // partial: Σ p·v rows, then each row's (m, l) in the row after them
  __shared__ float rows[GROUP + 2][HEAD_DIM];
  __shared__ float warp_acc[WARPS][GROUP][HEAD_DIM];    // each warp's Σ p·v, then its m and l
  __shared__ float warp_ml[WARPS][GROUP][2];
  __shared__ float factors[MAX_SPLITS][GROUP];          // the combine's weight of each split's partial
  __shared__ float split_sums[MAX_SPLITS][GROUP];       // each split's sum of exponentials
  __shared__ int last_block;
  const float negative_infinity = __uint_as_float(0xff800000u);
SIZES
  const int split = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int key_end = (int)S;
  const int key_begin = WINDOW > 0 && key_end > WINDOW ? key_end - WINDOW : 0;
  const int visible = key_end - key_begin > 1 ? key_end - key_begin : 1;
  // keys_per_split and splits of the module
  const bool clustered = CLUSTER > 1 && visible <= CLUSTER * CLUSTER_MAX_KEYS_PER_SPLIT;
  const int spread = clustered ? (visible + CLUSTER - 1) / CLUSTER : (visible + MAX_SPLITS - 1) / MAX_SPLITS;
  const int least = clustered ? CLUSTER_MIN_KEYS_PER_SPLIT : MIN_KEYS_PER_SPLIT;
  const int per_split = spread > least ? spread : least;
  const int split_count = (visible + per_split - 1) / per_split;
  // a block past the splits (the grid is whole clusters) leaves, unless it takes part in its cluster's combine
  const bool cluster_combine = CLUSTER > 1 && split_count > 1;
  if (split >= split_count && !cluster_combine) return;
  const int split_begin = key_begin + split * per_split;
  const int split_end = split_begin + per_split < key_end ? split_begin + per_split : key_end;
  const int new_slot = UPDATE ? (int)SLOT : -1;
  const element* k_rows = k_cache + k_cache_offset + batch * k_cache_batch + kv_head * k_cache_head;
  const element* v_rows = v_cache + v_cache_offset + batch * v_cache_batch + kv_head * v_cache_head;
  // the warp's first KEYS key and value rows, asked for before anything else (they are older than this launch)
  const int first_key = split_begin + warp * KEYS;
  lane_row key_rows[KEYS], value_rows[KEYS];
  #pragma unroll
  for (int k = 0; k < KEYS; ++k) {
    load_raw(key_rows[k], first_key + k, split_end, k_rows, k_cache_pos, lane);
    load_raw(value_rows[k], first_key + k, split_end, v_rows, v_cache_pos, lane);
  }
DEPENDENT_LAUNCH

  // prologue: the group's query rows and the new key and value, as float32 in shared memory. Each row is one
  // warp's (the warps take rows in turn): a lane loads its D/32 elements with their norm weights and rotary tables
  // at once (one memory latency), sums the squares by shuffles, scales, and rotates (dim d pairs with d ± D/2, which
  // lane ^ 16 holds), all in registers; the block meets once, when every row is in shared memory
  constexpr int ROW_COUNT = UPDATE ? GROUP + 2 : GROUP;
  constexpr int NORMED_ROWS = UPDATE ? GROUP + 1 : GROUP;   // the value is taken as it is
  for (int r0 = 0; r0 < ROW_COUNT; r0 += WARPS) {   // uniform steps: every warp shuffles, a warp past the rows on zeros
    const int r = r0 + warp, first = lane * LANE_ELEMENTS;
    const bool row = r < ROW_COUNT, normed = r < NORMED_ROWS;
    const element* source = r < GROUP ? q + q_offset + batch * q_batch + (kv_head * GROUP + r) * q_head
                            : r == GROUP ? k_new + k_new_offset + batch * k_new_batch + kv_head * k_new_head
                            : v_new + v_new_offset + batch * v_new_batch + kv_head * v_new_head;
    const weight_element* weight = r < GROUP ? (const weight_element*)q_weight + q_weight_offset
                                             : (const weight_element*)k_weight + k_weight_offset;
    float x[LANE_ELEMENTS], w[LANE_ELEMENTS], c[LANE_ELEMENTS], sn[LANE_ELEMENTS];
    #pragma unroll
    for (int i = 0; i < LANE_ELEMENTS; ++i) {
      x[i] = row ? element_float(source[first + i]) : 0.0f;
      w[i] = NORM && normed ? weight_float(weight[first + i]) : 0.0f;
      c[i] = ROTARY && normed ? rotary_float(cos[cos_offset + first + i]) : 0.0f;
      sn[i] = ROTARY && normed ? rotary_float(sin[sin_offset + first + i]) : 0.0f;
    }
    if (NORM) {
      float sum = 0.0f;
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) sum += x[i] * x[i];
      const float inverse_rms = 1.0f / sqrtf(warp_sum(sum) / HEAD_DIM + NORM_EPS);
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) if (normed) x[i] *= inverse_rms * (NORM_OFFSET + w[i]);
    }
    if (ROTARY) {   // x·cos + rotate_half(x)·sin_signed: the partner dim's value from lane ^ 16
      float partner[LANE_ELEMENTS];
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) partner[i] = __shfl_xor_sync(0xffffffffu, x[i], 16);
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) if (normed) x[i] = x[i] * c[i] + partner[i] * sn[i];
    }
    if (!row) continue;
    if (UPDATE && r >= GROUP) {   // the new key as the cache stores it (rounded); the first split writes both rows
      element* cache_row = r == GROUP ? k_cache + k_cache_offset + batch * k_cache_batch + kv_head * k_cache_head +
                                        new_slot * k_cache_pos
                                      : v_cache + v_cache_offset + batch * v_cache_batch + kv_head * v_cache_head +
                                        new_slot * v_cache_pos;
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) {
        const element stored = float_element(x[i]);
        if (r == GROUP) x[i] = element_float(stored);
        if (split == 0) cache_row[first + i] = stored;
      }
    }
    #pragma unroll
    for (int i = 0; i < LANE_ELEMENTS; ++i) rows[r][first + i] = x[i];
  }
  __syncthreads();

  // this lane's D/32 elements of each query row (scaled: scores in base 2 unless a softcap comes first)
  float query[GROUP][LANE_ELEMENTS], acc[GROUP][LANE_ELEMENTS], m[GROUP], l[GROUP];
  #pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    #pragma unroll
    for (int i = 0; i < LANE_ELEMENTS; ++i) {
      query[g][i] = rows[g][lane * LANE_ELEMENTS + i] * Q_SCALE;
      acc[g][i] = 0.0f;
    }
    m[g] = negative_infinity;
    l[g] = 0.0f;
  }
  // the same steps in every warp, each warp on its own keys with no barrier between them: the next step's rows are in
  // flight while a step's scores are summed and its values accumulated
  for (int step = split_begin; step < split_end; step += WARPS * KEYS) {
    const int base = step + warp * KEYS;
    float sums[SCORE_VALUES];
    #pragma unroll
    for (int k = 0; k < KEYS; ++k) {
      float key[LANE_ELEMENTS];
      row_values(key, key_rows[k], base + k, new_slot, rows[GROUP], lane);
      load_raw(key_rows[k], base + WARPS * KEYS + k, split_end, k_rows, k_cache_pos, lane);
      #pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float dot = 0.0f;
        #pragma unroll
        for (int i = 0; i < LANE_ELEMENTS; ++i) dot += query[g][i] * key[i];
        sums[k * GROUP + g] = dot;
      }
    }
    #pragma unroll
    for (int j = KEYS * GROUP; j < SCORE_VALUES; ++j) sums[j] = 0.0f;
    float values[KEYS][LANE_ELEMENTS];
    #pragma unroll
    for (int k = 0; k < KEYS; ++k) {
      row_values(values[k], value_rows[k], base + k, new_slot, rows[GROUP + 1], lane);
      load_raw(value_rows[k], base + WARPS * KEYS + k, split_end, v_rows, v_cache_pos, lane);
    }
    // the warp's KEYS·GROUP dot products summed over its lanes at once: each xor level halves the values a lane
    // keeps (the lanes with that bit keep the upper half), then plain sums; lane L ends with value L >> SCORE_SHIFT
SCORE_TRANSPOSE
    #pragma unroll
    for (int offset = 16 >> SCORE_LEVELS; offset >= 1; offset /= 2)
      sums[0] += __shfl_xor_sync(0xffffffffu, sums[0], offset);
    #pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      float p[KEYS], step_max = negative_infinity;
      #pragma unroll
      for (int k = 0; k < KEYS; ++k) {
        float s = __shfl_sync(0xffffffffu, sums[0], (k * GROUP + g) << SCORE_SHIFT);
        SOFTCAP
        p[k] = base + k < split_end ? s : negative_infinity;
        step_max = fmaxf(step_max, p[k]);
      }
      const float new_max = fmaxf(m[g], step_max);
      const float base2 = new_max == negative_infinity ? 0.0f : new_max;   // nothing kept yet: every term is 0
      const float alpha = exp2_approx(m[g] - base2);
      l[g] *= alpha;
      #pragma unroll
      for (int i = 0; i < LANE_ELEMENTS; ++i) acc[g][i] *= alpha;
      #pragma unroll
      for (int k = 0; k < KEYS; ++k) {
        p[k] = exp2_approx(p[k] - base2);
        l[g] += p[k];
        #pragma unroll
        for (int i = 0; i < LANE_ELEMENTS; ++i) acc[g][i] += p[k] * values[k][i];
      }
      m[g] = new_max;
    }
  }

  // the warps' states combined: the block's (M, L, Σ p·v) per row
  #pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    #pragma unroll
    for (int i = 0; i < LANE_ELEMENTS; ++i) warp_acc[warp][g][lane * LANE_ELEMENTS + i] = acc[g][i];
    if (lane == 0) { warp_ml[warp][g][0] = m[g]; warp_ml[warp][g][1] = l[g]; }
  }
  __syncthreads();
  float* partials = scratch + ((batch * KV_HEADS + kv_head) * MAX_SPLITS) * PARTIAL_WORDS;
  unsigned int* counter = (unsigned int*)(scratch + BATCH * KV_HEADS * MAX_SPLITS * PARTIAL_WORDS) +
                          batch * KV_HEADS + kv_head;
  const long long out_row = ((long long)batch * KV_HEADS + kv_head) * GROUP;
  for (int i = tid; i < GROUP * HEAD_DIM; i += BLOCK_THREADS) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float block_max = negative_infinity;
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) block_max = fmaxf(block_max, warp_ml[w][g][0]);
    const float base2 = block_max == negative_infinity ? 0.0f : block_max;
    float sum = 0.0f, value = 0.0f;
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = exp2_approx(warp_ml[w][g][0] - base2);
      sum += warp_ml[w][g][1] * f;
      value += warp_acc[w][g][d] * f;
    }
    if (split_count == 1) out[(out_row + g) * HEAD_DIM + d] = float_element(value / sum);
    else if (cluster_combine) {
      rows[g][d] = value;
      if (d == 0) { rows[GROUP][2 * g] = block_max; rows[GROUP][2 * g + 1] = sum; }
    } else {
      partials[split * PARTIAL_WORDS + g * HEAD_DIM + d] = value;
      if (d == 0) {
        partials[split * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g] = block_max;
        partials[split * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g + 1] = sum;
      }
    }
  }
  if (split_count == 1) return;
  int partial_count = split_count, arrivals = split_count;   // partials in the scratch, blocks that count
CLUSTER_COMBINE_STEP
  // the last block of this (batch, kv head) to finish combines the partials
  __threadfence();
  __syncthreads();
  if (tid == 0) last_block = atomicAdd(counter, 1u) == (unsigned int)(arrivals - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  // the partials are read through L2 (__ldcg: another SM wrote them, this SM's L1 may hold none of it), first every
  // split's (m, l), spread over the threads, then each output element's sum over the splits
  for (int i = tid; i < partial_count * GROUP; i += BLOCK_THREADS) {
    const int s = i / GROUP, g = i % GROUP;
    factors[s][g] = __ldcg(partials + s * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g);
    split_sums[s][g] = __ldcg(partials + s * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g + 1);
  }
  __syncthreads();
  for (int g = tid; g < GROUP; g += BLOCK_THREADS) {
    float total_max = negative_infinity;
    for (int s = 0; s < partial_count; ++s) total_max = fmaxf(total_max, factors[s][g]);
    const float base2 = total_max == negative_infinity ? 0.0f : total_max;
    float total = 0.0f;
    for (int s = 0; s < partial_count; ++s) {
      factors[s][g] = exp2_approx(factors[s][g] - base2);
      total += split_sums[s][g] * factors[s][g];
    }
    for (int s = 0; s < partial_count; ++s) factors[s][g] /= total;
  }
  __syncthreads();
  for (int i = tid; i < GROUP * HEAD_DIM; i += BLOCK_THREADS) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float value = 0.0f;
    const float* column = partials + g * HEAD_DIM + d;
    #pragma unroll 8
    for (int s = 0; s < partial_count; ++s) value += __ldcg(column + s * PARTIAL_WORDS) * factors[s][g];
    out[(out_row + g) * HEAD_DIM + d] = float_element(value);
  }
  if (tid == 0) *counter = 0u;   // ready for the next launch
}
"""

# The cluster path's pieces (sm_90+, only in a cluster kernel's source): the barrier and shared-memory addresses of a
# thread block cluster, and the combine of the splits' partials through the blocks' shared memory.
CLUSTER_HELPERS = r"""
// thread block clusters (sm_90): every thread of the cluster's blocks arrives, its shared-memory writes released to
// the cluster, and waits for the others' (acquired)
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// the generic address of the same shared-memory word in block `rank` of the cluster
__device__ __forceinline__ const float* cluster_shared(const float* local, unsigned int rank) {
  unsigned long long remote;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"(local), "r"(rank));
  return (const float*)remote;
}
"""
# (the cluster's blocks share the output elements, each read from every split's partial)
CLUSTER_COMBINE = r"""  if (cluster_combine) {
    cluster_barrier();
    const int rank = split % CLUSTER, first_split = split - rank, cluster_index = split / CLUSTER;
    const int members = split_count - first_split < CLUSTER ? split_count - first_split : CLUSTER;
    const int clusters = (split_count + CLUSTER - 1) / CLUSTER;
    const float* partial = &rows[0][0];
    for (int i = rank * BLOCK_THREADS + tid; i < GROUP * HEAD_DIM; i += CLUSTER * BLOCK_THREADS) {
      const int g = i / HEAD_DIM, d = i % HEAD_DIM;
      float maxima[CLUSTER], sums[CLUSTER], values[CLUSTER], total_max = negative_infinity;
      #pragma unroll
      for (int s = 0; s < CLUSTER; ++s) {
        if (s >= members) break;
        const float* remote = cluster_shared(partial, (unsigned int)s);
        maxima[s] = remote[GROUP * HEAD_DIM + 2 * g];
        sums[s] = remote[GROUP * HEAD_DIM + 2 * g + 1];
        values[s] = remote[g * HEAD_DIM + d];
      }
      #pragma unroll
      for (int s = 0; s < CLUSTER; ++s) if (s < members) total_max = fmaxf(total_max, maxima[s]);
      const float base2 = total_max == negative_infinity ? 0.0f : total_max;
      float total = 0.0f, value = 0.0f;
      #pragma unroll
      for (int s = 0; s < CLUSTER; ++s) {
        if (s >= members) break;
        const float f = exp2_approx(maxima[s] - base2);
        total += sums[s] * f;
        value += values[s] * f;
      }
      if (clusters == 1) out[(out_row + g) * HEAD_DIM + d] = float_element(value / total);
      else {   // the cluster's combined partial, for the scratch path's last block
        partials[cluster_index * PARTIAL_WORDS + g * HEAD_DIM + d] = value;
        if (d == 0) {
          partials[cluster_index * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g] = total_max;
          partials[cluster_index * PARTIAL_WORDS + GROUP * HEAD_DIM + 2 * g + 1] = total;
        }
      }
    }
    cluster_barrier();   // no block leaves while another still reads its shared memory
    if (clusters == 1) return;
    partial_count = clusters;            // then every block of the grid counts, and the last combines the clusters'
    arrivals = clusters * CLUSTER;
  }"""

SIZE_NAMES = ("S", "SLOT", *(f"{r}_{axis}" for r in LAYOUT_ROLES for axis in ("offset", "batch", "head", "pos")),
              *(f"{r}_offset" for r in TABLE_ROLES))

SCALAR_LOAD = r"""struct lane_row { element e[LANE_ELEMENTS]; };   // a lane's part of a row, as stored
__device__ __forceinline__ void load_lane_row(lane_row& target, const element* source) {
  #pragma unroll
  for (int i = 0; i < LANE_ELEMENTS; ++i) target.e[i] = source[i];
}
__device__ __forceinline__ void zero_lane_row(lane_row& target) {
  #pragma unroll
  for (int i = 0; i < LANE_ELEMENTS; ++i) target.e[i] = 0;
}
__device__ __forceinline__ void lane_row_values(float* target, const lane_row& row) {
  #pragma unroll
  for (int i = 0; i < LANE_ELEMENTS; ++i) target[i] = element_float(row.e[i]);
}
"""
VECTOR_LOAD = r"""struct lane_row { uint4 c[LANE_ELEMENTS / VECTOR_ELEMENTS]; };   // a lane's part: 16-byte chunks
__device__ __forceinline__ void load_lane_row(lane_row& target, const element* source) {
  const uint4* chunks = (const uint4*)source;
  #pragma unroll
  for (int c = 0; c < LANE_ELEMENTS / VECTOR_ELEMENTS; ++c) target.c[c] = chunks[c];
}
__device__ __forceinline__ void zero_lane_row(lane_row& target) {
  #pragma unroll
  for (int c = 0; c < LANE_ELEMENTS / VECTOR_ELEMENTS; ++c) target.c[c] = make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void lane_row_values(float* target, const lane_row& row) {
  #pragma unroll
  for (int c = 0; c < LANE_ELEMENTS / VECTOR_ELEMENTS; ++c) {
    const unsigned int words[4] = {row.c[c].x, row.c[c].y, row.c[c].z, row.c[c].w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int w = words[i];
WORD_DECODE
    }
  }
}
"""

# Programmatic Dependent Launch (sm_90+, PDL on; runtime/cuda/renderer.py): before waiting for the kernel before it
# (the qkv projection that makes q and the new key and value), each block asks L2 for its split's cached key and value
# rows (a hint: nothing is read before the wait; rows the previous steps wrote), then waits and lets its dependents
# (o_proj) launch, so their launch and prefetch overlap this kernel.
DEPENDENT_LAUNCH = r"""  {   // before the wait: this split's cached key and value rows into L2
    const int row_bytes = HEAD_DIM * (int)sizeof(element);
    const int row_lines = row_bytes / 128 + 2;   // the most 128-byte lines a row touches, at any alignment
    const int split_rows = split_end > split_begin ? split_end - split_begin : 0;
    for (int i = tid; i < split_rows * row_lines * 2; i += BLOCK_THREADS) {
      const int row = split_begin + i / (row_lines * 2), line = i % (row_lines * 2);
      const element* start = line < row_lines ? k_rows + row * k_cache_pos : v_rows + row * v_cache_pos;
      const unsigned long long address = ((unsigned long long)start & ~127ull) + (line % row_lines) * 128ull;
      if (address < (unsigned long long)start + row_bytes) asm volatile("prefetch.global.L2 [%0];" :: "l"(address));
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");"""

VALUES_PARAMETER = "step_values"   # with value_slots: the int64 table the variables' values are read from

def flash_decoding_source(config: DecodeConfig, name: str, sizes: dict[str, str], variables: tuple[str, ...],
                          buffers: tuple[str, ...], batch: int, dependent_launch: bool = False,
                          cluster: int = 0, value_slots: Optional[tuple[int, ...]] = None) -> str:
  """CUDA C of kernel `name` (see the module doc). `buffers`: the role of each pointer parameter, in order (each of
  config.roles() once; a name outside ROLES is a parameter the kernel does not read). `sizes`: a C expression (of
  `variables`, the int64 parameters after the buffers) for each of SIZE_NAMES that the config uses (missing ones
  are 0): the key count S, the new slot, each [B, H, N, D] input's element offset and strides over batch, head and
  position (its last dim contiguous), each table's offset. `batch`: B (the scratch's layout). `dependent_launch`: the
  PDL form (DEPENDENT_LAUNCH), for sm_90+ with PDL on. `cluster`: blocks of a thread block cluster (sm_90+; 0 or 1:
  none), whose splits combine through shared memory; launch it on grid(config, keys, batch, cluster).
  `value_slots`: the variables are not parameters; one `const long long*` parameter after the buffers points at a
  table of values, variable i's at value_slots[i], read at the kernel's start, before a dependent launch's wait
  (whoever writes them does so in stream order before the launch: a replayed graph's node keeps its arguments while
  they change; runtime/cuda/device_values.py)."""
  if cluster not in (0, 1) and not (1 < cluster <= CLUSTER_BLOCKS and cluster & (cluster - 1) == 0):
    raise ValueError(f"flash decoding: cluster of {cluster} blocks: a power of two up to {CLUSTER_BLOCKS}, or 0")
  if missing := [r for r in config.roles() if r not in buffers]:
    raise ValueError(f"flash decoding: no buffer for {missing}")
  if "S" not in sizes: raise ValueError("flash decoding: no size for the key count S")
  if config.update and "SLOT" not in sizes: raise ValueError("flash decoding: an update needs the SLOT size")
  element = ELEMENT_TYPES[config.dtype]
  # the caches are written only with `update`, but a dead store still needs a pointer it may write
  writes = {"out", "k_cache", "v_cache"}
  pointer_types = {"scratch": "float*"}
  declared, parameters = set(), []
  for i, role in enumerate(buffers):
    if role in declared: raise ValueError(f"flash decoding: buffer role {role!r} given twice")
    declared.add(role)
    if role not in ROLES: ctype = "const void*"   # a buffer the step passes that the kernel does not read
    elif role in ("cos", "sin"): ctype = "const rotary_element*"
    elif role in TABLE_ROLES: ctype = "const weight_element*"
    else: ctype = pointer_types.get(role, "element*" if role in writes else "const element*")
    parameters.append(f"{ctype} {role}")
  absent = [r for r in ("k_new", "v_new", "q_weight", "k_weight", "cos", "sin") if r not in declared]
  size_lines = "\n".join(f"  const long long {s} = {sizes.get(s, '0LL')};" for s in SIZE_NAMES)
  if value_slots is not None:
    if len(value_slots) != len(variables): raise ValueError(f"flash decoding: {len(variables)} variables, "
                                                            f"{len(value_slots)} value slots")
    size_lines = "".join(f"  const long long {v} = {VALUES_PARAMETER}[{slot}];\n"
                         for v, slot in zip(variables, value_slots)) + size_lines
    arguments = parameters + [f"const long long* __restrict__ {VALUES_PARAMETER}"]
  else: arguments = parameters + [f"long long {v}" for v in variables]
  # a role the config does not use still has names in the source: a null pointer it never reads
  size_lines += "".join(f"\n  const element* {r} = nullptr;" for r in absent)
  softcap = "" if config.softcap is None else \
    f"s = {_float_literal(config.softcap * LOG2_E)} * tanhf(s * {_float_literal(1 / config.softcap)});"
  q_scale = config.scale if config.softcap is not None else config.scale * LOG2_E
  values = {"BLOCK_THREADS": str(config.block_threads), "WARPS": str(config.warps), "GROUP": str(config.group),
            "HEAD_DIM": str(config.head_dim), "LANE_ELEMENTS": str(config.lane_elements),
            "VECTOR_ELEMENTS": str(config.vector_elements),
            "KV_HEADS": str(config.kv_heads), "MAX_SPLITS": str(MAX_SPLITS),
            "MIN_KEYS_PER_SPLIT": str(MIN_KEYS_PER_SPLIT), "CLUSTER": str(cluster if cluster > 1 else 0),
            "CLUSTER_MIN_KEYS_PER_SPLIT": str(CLUSTER_MIN_KEYS_PER_SPLIT),
            "CLUSTER_MAX_KEYS_PER_SPLIT": str(CLUSTER_MAX_KEYS_PER_SPLIT),
            "CLUSTER_DIMS": f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else "",
            "PARTIAL_WORDS": str(config.partial_words), "BATCH": str(batch), "WINDOW": str(config.window or 0),
            "UPDATE": "true" if config.update else "false", "NORM_OFFSET": _float_literal(config.norm_offset),
            "NORM_EPS": _float_literal(config.norm_eps), "NORM": "true" if config.norm else "false",
            "ROTARY": "true" if config.rotary else "false", "Q_SCALE": _float_literal(q_scale),
            "KEYS": str(config.keys_per_warp), "SCORE_VALUES": str(config.score_values),
            "SCORE_SHIFT": str(5 - config.score_values.bit_length() + 1),
            "SCORE_LEVELS": str(config.score_values.bit_length() - 1), "SCORE_TRANSPOSE": _score_transpose(config)}
  per_word = len(element.word_elements)
  word_decode = "\n".join(f"      target[{config.vector_elements} * c + {per_word} * i + {k}] = {expression};"
                          for k, expression in enumerate(element.word_elements))
  vector_load = VECTOR_LOAD.replace("WORD_DECODE", word_decode)
  body = (vector_load if config.vector_loads else SCALAR_LOAD) + BODY.replace("SOFTCAP", softcap)
  body = body.replace("DEPENDENT_LAUNCH", DEPENDENT_LAUNCH if dependent_launch else "")
  body = body.replace("CLUSTER_COMBINE_STEP", CLUSTER_COMBINE if cluster > 1 else "")
  for key in sorted(values, key=len, reverse=True): body = body.replace(key, values[key])
  body = body.replace("NAME", name).replace("PARAMETERS", ", ".join(arguments))
  body = body.replace("SIZES", size_lines)   # last: the expressions are the caller's text
  if dependent_launch: body = f'extern "C" __device__ unsigned int {name}{DEPENDENT_LAUNCH_SUFFIX} = 1;\n' + body
  if cluster > PORTABLE_CLUSTER_BLOCKS:
    body = f'extern "C" __device__ unsigned int {name}{NON_PORTABLE_CLUSTER_SUFFIX} = 1;\n' + body
  prologue = PROLOGUE.replace("FLOAT_TO_ELEMENT", element.from_float) + (CLUSTER_HELPERS if cluster > 1 else "")
  prologue = prologue.replace("ELEMENT_TO_FLOAT", element.to_float).replace("ELEMENT_TYPE", element.ctype)
  weight, rotary = ELEMENT_TYPES[config.weight_dtype], ELEMENT_TYPES[config.rotary_dtype or config.weight_dtype]
  prologue = prologue.replace("WEIGHT_TO_FLOAT", weight.to_float).replace("WEIGHT_TYPE", weight.ctype)
  prologue = prologue.replace("ROTARY_TO_FLOAT", rotary.to_float).replace("ROTARY_TYPE", rotary.ctype)
  return prologue + body
