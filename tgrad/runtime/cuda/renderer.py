"""CUDA C renderer: linear UOps (linearizer.py) → the source of one `extern "C" __global__` kernel for NVRTC.

Buffers are `data0..N` (`const T* __restrict__` when only read); SPECIAL gidx0..2/lidx0..2 are blockIdx/threadIdx
.x..z; RANGE/ENDRANGE are `for` loops, DEFINE_ACC a local variable, DEFINE_LOCAL a `__shared__` array. Semantics are
the Ops docstring's, as llvm/renderer.py renders them: guarded integer division, NaN-propagating MAX,
saturating float→int casts, wrapping signed arithmetic, half/bfloat16 math done in float and rounded after every op.
Index math is 64-bit (dtypes.index); each value whose range (vmin/vmax) provably fits 32 bits is computed as `int`
instead, which GPUs do at twice the speed with half the registers (`narrow_index_values`). Runs of contiguous scalar
loads/stores become vector accesses (vectors.py: float4-style, 8 16-bit values per uint4, bytes in 32-bit words, with
funnel shifts where a byte run's alignment is unknown). On sm_80+ WMMA is an inline `mma.sync` (tensor cores):
fragments are scalar variables, half/bfloat16 pairs packed into 32-bit registers, TF32 operands one float's bits per
register.
"""
from __future__ import annotations
import math
from typing import Optional
from tgrad.dtype import DType, dtypes
from tgrad.ops import UOp, Ops, ALU, COMPARISON, split_terms
from tgrad.codegen.renderer import Renderer, FragmentLayout, MatrixLoad, TensorCore
from tgrad.helpers import Context, prod
from tgrad.runtime.cuda.prefetch import block_prefetch, prefetch_statements
from tgrad.runtime.cuda.sgemm import simt_matmul_source
from tgrad.runtime.cuda.targets import DYNAMIC_SHARED_SUFFIX, WARPGROUP_MMA_ARCH, sm_number
from tgrad.runtime.cuda.byte_lanes import (BYTE_BITS, BYTE_PERM_INTO_FLOAT, FLOAT_TWO_POW_23, FLOAT_TWO_POW_23_BITS,
                                           SIGN_FLIP, SIGN_FLIP_BIAS, FloatExit, LaneGroup, WordExpr, byte_lanes)
from tgrad.runtime.cuda.vectors import (BYTE_LOAD_TYPES, LANES, VECTOR_BYTES, WORD_BYTES, ByteRun, VectorAccess,
                                        VectorType, async_copies, byte_run_pieces, byte_runs, vector_groups,
                                        widen_async_copies)

# Limits of every CUDA GPU since compute capability 3.0 (CUDA C Programming Guide, "Technical Specifications");
# the runtime replaces them with the device's own attributes.
CUDA_MAX_THREADS_PER_BLOCK = 1024
CUDA_MAX_GRID = (2**31 - 1, 65535, 65535)       # gridDim.x, .y, .z
CUDA_MAX_BLOCK = (1024, 1024, 64)               # blockDim.x, .y, .z
CUDA_WARP_LANES = 32
FULL_WARP_MASK = "0xffffffffu"   # every lane of the warp takes part in a shuffle
CUDA_SHARED_MEMORY_BYTES = 48 * 1024            # static __shared__ per block without an opt-in
# Programmatic Dependent Launch (sm_90+, PTX ISA 7.8): a kernel rendered for it first waits for the grids it depends
# on (`griddepcontrol.wait`: they have completed and their writes are visible; a no-op when launched without a
# programmatic dependency), then lets its own dependents launch (`griddepcontrol.launch_dependents`), so their launch
# overlaps its work; before the wait only L2 prefetches (PDL_PREFETCH, prefetch.py) may ask for bytes early. Its
# module carries the global named by this suffix: runtime.py reads it, and graph.py gives only such kernels a
# programmatic edge from their predecessor (a kernel without the wait keeps a full dependency).
DEPENDENT_LAUNCH_MIN_SM = 90
DEPENDENT_LAUNCH_SUFFIX = "_waits_for_prior_grids"
# a kernel whose thread block clusters are larger than the portable 8 blocks (sm_90: up to 16) marks itself with a
# device global of this suffix; the runtime then allows the non-portable size on its function before any launch
NON_PORTABLE_CLUSTER_SUFFIX = "_non_portable_cluster"
THREAD_BLOCK_CLUSTER_MIN_SM = 90   # blocks of a cluster share their shared memory (flash decoding's combine)
DEPENDENT_LAUNCH_PROLOGUE = ('asm volatile("griddepcontrol.wait;" ::: "memory");',
                             'asm volatile("griddepcontrol.launch_dependents;" ::: "memory");')
VARIABLE_ARG_SUFFIX = "_arg"   # a DEFINE_VAR `pos` is the kernel parameter `long long pos_arg`

REGISTER_TYPES = {
  dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
  dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
  dtypes.uint64: "unsigned long long", dtypes.float16: "float", dtypes.bfloat16: "float", dtypes.float32: "float",
  dtypes.float64: "double"}
MEMORY_TYPES = {**REGISTER_TYPES, dtypes.float16: "half", dtypes.bfloat16: "bfloat16"}
# the type that holds the same bits, for wrapping arithmetic and bitcasts
UNSIGNED_OF = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_FLOAT_INTRINSICS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc",
                     Ops.TANH: "tanh"}
_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.FDIV: "/", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|",
          Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}
# float → integer conversions that round toward zero and saturate (NaN → 0), as llvm.fptosi.sat does
_FLOAT_TO_INT = {dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "ll", dtypes.uint64: "ull"}

# No CUDA headers: NVRTC's pip wheel ships none, and this keeps half/bfloat16 rounding identical to the LLVM renderer.
# half and bfloat16 are their raw 16 bits in memory; registers hold them as float, rounded after every op.
HALF_PRELUDE = """typedef unsigned short half;
__device__ __forceinline__ float half_to_float(half h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ half float_to_half(float f) {  // round to nearest even
  half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ half double_to_half(double d) {
  half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h;
}
__device__ __forceinline__ float round_half(float f) { return half_to_float(float_to_half(f)); }
"""
BFLOAT16_PRELUDE = """typedef unsigned short bfloat16;
__device__ __forceinline__ float bfloat16_to_float(bfloat16 b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ bfloat16 float_to_bfloat16(float f) {  // round to nearest even; NaN → quiet NaN
  unsigned int bits = __float_as_uint(f);
  return f != f ? (bfloat16)0x7FC0u : (bfloat16)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float round_bfloat16(float f) { return bfloat16_to_float(float_to_bfloat16(f)); }
"""
# max.NaN.f32 (PTX ISA 7.0, sm_80+): one instruction for a maximum that propagates NaN, instead of compare+select
MAX_NAN_MIN_SM = 80
MAX_NAN_PRELUDE = """__device__ __forceinline__ float max_nan(float a, float b) {
  float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
"""
# mma.sync.aligned.m16n8k16.row.col (PTX ISA 7.0, sm_80+), "Matrix Fragments for mma.m16n8k16 with floating point
# type": lane = 4·group + tig. A (16×16): a0,a1 = A[group][2·tig + 0/1], a2,a3 = A[group + 8][2·tig + 0/1], a4..a7
# the same 8 columns on; B (16×8): b0,b1 = B[2·tig + 0/1][group], b2,b3 = B[2·tig + 8 + 0/1][group]; C (16×8):
# c0,c1 = C[group][2·tig + 0/1], c2,c3 = C[group + 8][2·tig + 0/1].
MMA_M16N8K16 = {"a": FragmentLayout((1, 0), (0, 0, 8, 8, 0, 0, 8, 8), (0, 2), (0, 1, 0, 1, 8, 9, 8, 9)),
                "b": FragmentLayout((0, 2), (0, 1, 8, 9), (1, 0), (0, 0, 0, 0)),
                "c": FragmentLayout((1, 0), (0, 0, 8, 8), (0, 2), (0, 1, 0, 1))}
# mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (PTX ISA 7.0, sm_80+), "Matrix Fragments for mma.m16n8k8", .tf32:
# one 32-bit register per element (the float's bits; the core reads its TF32 part, so the graph rounds them first:
# tensor_cores.tf32_rounded_load). A (16×8): a0 = A[group][tig], a1 = A[group + 8][tig], a2, a3 the same at column
# tig + 4; B (8×8): b0 = B[tig][group], b1 = B[tig + 4][group]; C (16×8) as m16n8k16's.
MMA_M16N8K8_TF32 = {"a": FragmentLayout((1, 0), (0, 8, 0, 8), (0, 1), (0, 0, 4, 4)),
                    "b": FragmentLayout((0, 1), (0, 4), (1, 0), (0, 0)),
                    "c": MMA_M16N8K16["c"]}
TENSOR_CORES = tuple(TensorCore(f"mma.sync.aligned.m16n8k16.row.col.f32.{name}.{name}.f32", (16, 8, 16), dtype,
                                dtypes.float32, **MMA_M16N8K16) for dtype, name in ((dtypes.float16, "f16"),
                                                                                    (dtypes.bfloat16, "bf16"))) + \
  (TensorCore("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", (16, 8, 8), dtypes.float32, dtypes.float32,
              **MMA_M16N8K8_TF32, tf32=True),)
ASYNC_COPY_MIN_SM = 80    # cp.async global → shared: sm_80 (Ampere) and newer
ASYNC_COPY_PRELUDE = """template <int BYTES>
__device__ __forceinline__ void async_copy(void* shared, const void* global) {
  unsigned int address = (unsigned int)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(address), "l"(global), "n"(BYTES) : "memory");
}
"""
# The "fast" lowerings of exp, log and tanh (tensor_ops/composite.py): an EXP2/LOG2/TANH of arg "fast" on a 32-bit
# float is one MUFU instruction (PTX ex2.approx.f32 / lg2.approx.f32: about 2 ulp, inputs flushed to zero near the
# subnormals; tanh.approx.f32: about 2^-11 relative, sm_75+). Below FAST_TANH_MIN_SM a "fast" tanh is tanhf.
FAST_MATH = "fast"
FAST_TANH_MIN_SM = 75
FAST_INSTRUCTIONS = {Ops.EXP2: ("fast_exp2", "ex2.approx.f32"), Ops.LOG2: ("fast_log2", "lg2.approx.f32"),
                     Ops.TANH: ("fast_tanh", "tanh.approx.f32")}
FAST_PRELUDES = {name: f"""__device__ __forceinline__ float {name}(float x) {{
  float r; asm("{instruction} %0, %1;" : "=f"(r) : "f"(x)); return r;
}}
""" for name, instruction in FAST_INSTRUCTIONS.values()}
TENSOR_CORE_MIN_SM = 80   # mma.sync m16n8k16 f16/bf16 and m16n8k8 tf32, f32 accumulators: sm_80 (Ampere) and newer
PACKED_DTYPES = (dtypes.float16, dtypes.bfloat16)   # two per 32-bit register in a fragment

BITCAST_PRELUDE = """template <typename To, typename From> __device__ __forceinline__ To bit_cast(From x) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To y; memcpy(&y, &x, sizeof(To)); return y;
}
"""

class CUDARenderer(Renderer):
  device = "CUDA"
  has_local = True
  has_shared = True
  warp_lanes = CUDA_WARP_LANES
  max_local_size = CUDA_MAX_THREADS_PER_BLOCK
  max_global_dims = 3
  max_grid = CUDA_MAX_GRID
  max_local_dims = CUDA_MAX_BLOCK
  shared_memory_bytes = CUDA_SHARED_MEMORY_BYTES
  def __init__(self, arch: str = "sm_90", max_local_size: int = CUDA_MAX_THREADS_PER_BLOCK,
               max_grid: tuple[int, ...] = CUDA_MAX_GRID, max_local_dims: tuple[int, ...] = CUDA_MAX_BLOCK,
               shared_memory_bytes: int = CUDA_SHARED_MEMORY_BYTES):
    self.arch, self.max_local_size, self.max_grid = arch, max_local_size, tuple(max_grid)
    self.max_local_dims, self.shared_memory_bytes = tuple(max_local_dims), shared_memory_bytes
    self.tensor_cores = TENSOR_CORES if sm_number(arch) >= TENSOR_CORE_MIN_SM else ()
    self.async_copy = sm_number(arch) >= ASYNC_COPY_MIN_SM
    self.matrix_loads = bool(self.tensor_cores)
    self.dependent_launch = sm_number(arch) >= DEPENDENT_LAUNCH_MIN_SM
    self.thread_block_clusters = sm_number(arch) >= THREAD_BLOCK_CLUSTER_MIN_SM
    # wgmma is an arch-specific feature of sm_90a: code for it runs on compute capability 9.0 only
    self.warpgroup_mma = arch == WARPGROUP_MMA_ARCH
    self.simt_matmul = True   # plain CUDA C (float4 loads, shared memory, barriers): every arch
  def render(self, name: str, uops: list[UOp]) -> str:
    """The kernel's source; on sm_90+ under PDL=1 (a code setting, part of every cache key) with the dependent-launch
    prologue, and under PDL_PREFETCH=1 (another) the L2 prefetch of its largest read-only input before the wait
    (prefetch.py)."""
    dependent_launch = self.dependent_launch and bool(Context.PDL)
    prefetch = dependent_launch and bool(Context.PDL_PREFETCH)
    return _KernelWriter(name, uops, self.arch, dependent_launch, prefetch).write()
  def render_warpgroup_matmul(self, name: str, matmul) -> str:
    """The wgmma kernel (runtime/cuda/wgmma.py, or wgmma_tma.py for a TMA tile) of an axes.WarpgroupMatmul, its
    parameters in the kernel's order."""
    from tgrad.runtime.cuda.wgmma_tma import warpgroup_matmul_source   # wgmma.py builds on this module's names
    return warpgroup_matmul_source(name, matmul)
  def render_simt_matmul(self, name: str, matmul) -> str:
    """The float32 matmul template (runtime/cuda/sgemm.py) of an axes.SimtMatmul, its parameters in the kernel's
    order."""
    return simt_matmul_source(name, matmul)

# ---------------------------------------------------------------------------------------------------------------
# 64-bit index math, computed in 32 bits where the bounds prove it fits

NARROW_DTYPE = dtypes.int32   # the C `int` that index values fitting its range are computed in

def parameter_value(v: UOp, dtype: DType) -> str:
  """A DEFINE_VAR's value from its 64-bit parameter, in `dtype`: a symbolic size or an int scalar converted, a float
  scalar parameter (tgrad/scalars.py) reinterpreted from its bits (a float32's in the low 32)."""
  arg = f"{v.arg[0]}{VARIABLE_ARG_SUFFIX}"
  if v.dtype == dtypes.float64: return f"__longlong_as_double({arg})"
  if v.dtype == dtypes.float32: return f"__int_as_float((int){arg})"
  return f"({REGISTER_TYPES[dtype]}){arg}"

def _fits_narrow(lo, hi) -> bool: return dtypes.min(NARROW_DTYPE) <= lo and hi <= dtypes.max(NARROW_DTYPE)

def narrow_index_values(uops: list[UOp]) -> set[UOp]:
  """The 64-bit integer values (dtypes.index) that are computed as 32-bit `int`: thread ids; variables and loops whose
  bounds fit (a loop's end too, so `ridx++` can't overflow); casts of ints whose range fits (a gather's loaded index);
  and integer ALU ops whose own range and every operand fit (a narrow value or a constant that fits). vmin/vmax are
  exact or safely wide (a possible wrap gives the whole int64 range), so an op whose operands and result all fit 32
  bits gives the same value in 32-bit arithmetic. A 64-bit op that reads a narrow value converts it to `long long`
  first (see _KernelWriter.operand)."""
  narrow: set[UOp] = set()
  def fits(x: UOp) -> bool: return x in narrow or (x.op is Ops.CONST and _fits_narrow(x.arg, x.arg))
  for u in uops:
    if u.dtype != dtypes.index: continue
    if u.op is Ops.SPECIAL: narrow.add(u)
    elif u.op is Ops.DEFINE_VAR and _fits_narrow(u.vmin, u.vmax): narrow.add(u)
    elif u.op is Ops.RANGE and _fits_narrow(u.src[0].vmin, u.src[0].vmax) and _fits_narrow(u.src[1].vmin,
                                                                                          u.src[1].vmax):
      narrow.add(u)
    elif u.op in ALU and u.op not in COMPARISON and _fits_narrow(u.vmin, u.vmax) and \
         all(fits(s) for s in (u.src[1:] if u.op is Ops.WHERE else u.src)):
      narrow.add(u)
    elif u.op is Ops.CAST and u.src[0].dtype.is_int and _fits_narrow(u.vmin, u.vmax):   # a loaded int as an index
      narrow.add(u)
  return narrow

# ---------------------------------------------------------------------------------------------------------------
# rendering

def render_const(value, dtype: DType) -> str:
  if dtype.is_bool: return "true" if value else "false"
  if dtype.is_int:
    suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dtype, "")
    if value == dtypes.min(dtype) and not dtype.is_unsigned and dtype.bits >= 32:
      return f"({value + 1}{suffix}-1)"   # -2147483648 is the negation of an out-of-range literal in C
    text = f"{value}{suffix}"
    return f"({text})" if value < 0 else text
  double = dtype == dtypes.float64
  if math.isnan(value): return "__longlong_as_double(0x7FF8000000000000ll)" if double else "__int_as_float(0x7FC00000)"
  if math.isinf(value):
    bits = ("0x7FF0000000000000ll" if double else "0x7F800000") if value > 0 else \
           ("0xFFF0000000000000ull" if double else "0xFF800000")
    return f"__longlong_as_double({bits})" if double else f"__uint_as_float({bits}u)"
  text = repr(float(value)) + ("" if double else "f")
  return f"({text})" if text.startswith("-") else text

def _pairable(low: UOp, high: UOp) -> bool:
  """Whether two 16-bit loads are one 32-bit load: one buffer, indices i and i+1 with i provably even (so the
  address is 4-byte aligned: allocations and shared arrays are), the same valid."""
  if low.op is not Ops.LOAD or high.op is not Ops.LOAD or low.src[0] is not high.src[0]: return False
  if low.src[2:] != high.src[2:]: return False
  low_terms, low_constant = split_terms(low.src[1])
  high_terms, high_constant = split_terms(high.src[1])
  return low_terms == high_terms and high_constant == low_constant + 1 and low_constant % 2 == 0 and \
    all(coef % 2 == 0 for coef in low_terms.values())

# a uchar4 load whose bytes a byte-lane group reads as one word: one 32-bit word (uint1), each lane a shift of it
BYTE_WORD = VectorType("uint1", 4, "unsigned char", per_word=4)
WORD_OPS = {"and": "&", "or": "|", "xor": "^", "add": "+", "mul": "*"}

class _KernelWriter:
  def __init__(self, name: str, uops: list[UOp], arch: str = "sm_90", dependent_launch: bool = False,
               prefetch: bool = False):
    self.name, self.uops, self.dependent_launch = name, uops, dependent_launch
    self.prefetch = block_prefetch(uops) if prefetch else None
    self.has_max_nan = sm_number(arch) >= MAX_NAN_MIN_SM
    self.has_fast_tanh = sm_number(arch) >= FAST_TANH_MIN_SM
    self.names: dict[UOp, str] = {}
    self.acc_names: dict[int, str] = {}
    self.lines: list[str] = []
    self.depth = 1
    self.counter = 0
    self.byte_runs = byte_runs(uops)
    self.run_bytes: dict[int, list[tuple[str, int]]] = {}   # id of a ByteRun → (word, bit shift) of each byte
    self.vectors = vector_groups(uops, frozenset(self.byte_runs))
    copies = async_copies(uops, self.vectors) if sm_number(arch) >= ASYNC_COPY_MIN_SM else {}
    self.async_loads = {pos for access in copies.values() for pos in access.positions}
    self.async_copies = widen_async_copies(uops, copies, self.vectors)
    self.vector_names: dict[int, str] = {}   # id of a VectorAccess → its variable
    # uint8 chains on the four bytes of a word, computed on the word (byte_lanes.py); used_values decides which groups
    # are written, and a uchar4 load that is the word of one is read as a whole word instead
    self.lanes = byte_lanes(uops, self.vectors, self.byte_runs)
    self.group_at = {g.at: g for g in self.lanes.groups if g.expr is not None}
    self.live_groups: set[int] = set()
    self.lane_words: dict[int, str] = {}   # id of a LaneGroup → the C expression of its word
    # half values whose exact 16 bits are stored or bitcast: loads and bitcasts keep them, so a copy or a bitcast of
    # a NaN keeps its payload (cvt.f32.f16 → cvt.rn.f16.f32 would not)
    self.wants_bits = {u.src[2] for u in uops if u.op is Ops.STORE} | {u.src[0] for u in uops if u.op is Ops.BITCAST}
    self.half_bits: dict[UOp, str] = {}
    # tensor-core fragments: the variables of each element; half/bfloat16 elements are packed from their raw bits
    self.fragments: dict[UOp, list[str]] = {}
    self.acc_fragments: dict[int, list[str]] = {}
    self.packed = {s for u in uops if u.op is Ops.VECTORIZE and u.dtype in PACKED_DTYPES for s in u.src}
    self.read_as_float = {s for u in uops if u.op is not Ops.VECTORIZE for s in u.src}
    # adjacent packed halves that no vector access reads become one 32-bit load (pair_load); loads that only ever
    # feed such pairs are not written at all
    in_vectors = {uops[pos] for pos in self.vectors}
    self.pairs: set[tuple[UOp, UOp]] = set()
    unpaired = set(self.read_as_float)
    for u in uops:
      if u.op is not Ops.VECTORIZE or u.dtype not in PACKED_DTYPES: continue
      for low, high in zip(u.src[0::2], u.src[1::2]):
        if _pairable(low, high) and low not in in_vectors and high not in in_vectors: self.pairs.add((low, high))
        else: unpaired.update((low, high))
    self.pair_only = {x for pair in self.pairs for x in pair} - unpaired
    self.used = self.used_values()
    self.narrow = narrow_index_values(uops)
    # shared arrays, each 16-byte aligned; above the static limit they are carved from the dynamic allocation
    self.shared_offsets: dict[UOp, int] = {}
    shared_bytes = 0
    for u in uops:
      if u.op is Ops.DEFINE_LOCAL:
        self.shared_offsets[u] = shared_bytes
        shared_bytes += -(-u.arg[1] * u.dtype.itemsize // VECTOR_BYTES) * VECTOR_BYTES
    self.dynamic_shared = shared_bytes if shared_bytes > CUDA_SHARED_MEMORY_BYTES else 0
    dts = {u.dtype for u in uops} | {s.dtype for u in uops for s in u.src}
    self.needs = {"half": dtypes.float16 in dts, "bfloat16": dtypes.bfloat16 in dts,
                  "bit_cast": any(u.op is Ops.BITCAST for u in uops), "max_nan": False,
                  "async_copy": bool(self.async_copies), **{name: False for name in FAST_PRELUDES}}

  def used_values(self) -> set[UOp]:
    """Values some rendered op reads, found backwards from the ops that are always written (loads, stores,
    accumulators, control flow): an ALU op or cast nobody reads is not written, nor is what only it reads. The other
    lanes of a vector access read no index. A lane of a byte-lane group is computed from its group's word, and a
    float cast of a lane from the word too (byte_lanes.py): they mark their group written (and, after the walk, every
    group it reads), not their own sources."""
    used: set[UOp] = set()
    live: set[int] = set()
    for pos in range(len(self.uops) - 1, -1, -1):
      u = self.uops[pos]
      if u in self.pair_only: continue   # not written; pair_load reads its index and valid
      if (u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST)) and u not in used: continue
      if (member := self.lanes.member.get(u)) is not None:
        live.add(id(member[0]))
        continue
      if (exit_ := self.lanes.exits.get(u)) is not None:
        live.add(id(exit_.group))
        if exit_.select is not None: used.add(exit_.select[0])   # a folded select's condition
        continue
      if u.op is Ops.VECTORIZE: used.update(x for pair in zip(u.src[0::2], u.src[1::2]) if pair in self.pairs
                                            for x in pair[0].src[1:])
      access, run = self.vectors.get(pos), self.byte_runs.get(pos)
      for s in u.src:
        if access is not None and s is u.src[1] and pos != self.index_position(access): continue
        if run is not None and s is u.src[1] and pos != run.at: continue
        used.add(s)
    for group in reversed(self.lanes.groups):   # users come after what they read
      if id(group) in live: live.update(id(o) for o in group.operands)
    self.live_groups = live
    for group in self.lanes.groups:   # a uchar4 load that is a written group's word: read as one word
      if group.root is not None and group.root[0] == "vector" and id(group) in live:
        self.vectors[group.at].vector = BYTE_WORD   # (a root's position is its load's)
    return used

  def index_position(self, access: VectorAccess) -> int:
    """Whose index a vector access uses: a store's lane 0 (all lanes' indices exist by the last store), else its own."""
    return access.positions[0] if self.uops[access.at].op is Ops.STORE else access.at

  # ---- helpers
  def line(self, text: str) -> None: self.lines.append("  " * self.depth + text)
  def fresh(self, prefix: str) -> str:
    self.counter += 1
    return f"{prefix}{self.counter}"
  def value(self, u: UOp) -> str:
    if u.op is Ops.CONST: return render_const(u.arg, u.dtype)
    if u.op is Ops.DEFINE_ACC: return self.acc_names[u.arg]
    return self.names[u]
  def computed_dtype(self, u: UOp) -> DType:
    """The dtype u is computed in: its own, or NARROW_DTYPE for narrowed index math."""
    return NARROW_DTYPE if u in self.narrow else u.dtype
  def operand(self, x: UOp, narrow_user: bool) -> str:
    """x as an operand of an op computed in 32 bits (narrow_user) or in x's own dtype: a 64-bit index constant is
    written without its `ll` where it fits, a narrow value is widened to `long long` before 64-bit math."""
    if x.dtype != dtypes.index: return self.value(x)
    if x.op is Ops.CONST: return render_const(x.arg, NARROW_DTYPE if narrow_user and _fits_narrow(x.arg, x.arg) else
                                              x.dtype)
    return self.value(x) if narrow_user or x not in self.narrow else f"((long long){self.value(x)})"
  def define(self, u: UOp, expr: str, prefix: str = "val") -> None:
    name = self.fresh(prefix)
    self.line(f"{REGISTER_TYPES[self.computed_dtype(u)]} {name} = {expr};")
    self.names[u] = name

  def write(self) -> str:
    params: dict[int, str] = {}
    stored = {u.src[0] for u in self.uops if u.op is Ops.STORE}
    variables = sorted({u for u in self.uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
    for u in self.uops:
      if u.op is Ops.DEFINE_GLOBAL:
        const = "" if u in stored else "const "
        params[u.arg] = f"{const}{MEMORY_TYPES[u.dtype]}* __restrict__ data{u.arg}"
        self.names[u] = f"data{u.arg}"
    # a buffer no op reads any more (fully masked away) still takes its place in the argument list
    args = [params.get(i, f"const void* __restrict__ unused{i}") for i in range(max(params, default=-1) + 1)]
    # a variable arrives as a 64-bit parameter (the runtime packs every value so) and is narrowed where it fits
    args += [f"long long {v.arg[0]}{VARIABLE_ARG_SUFFIX}" for v in variables]
    if self.prefetch is not None: self.prefetch_lines()
    if self.dependent_launch:
      for statement in DEPENDENT_LAUNCH_PROLOGUE: self.line(statement)
    for v in variables:
      self.names[v] = v.arg[0]
      dtype = self.computed_dtype(v)
      self.line(f"const {REGISTER_TYPES[dtype]} {v.arg[0]} = {parameter_value(v, dtype)};")
    threads = prod(u.arg[1] for u in self.uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"))
    for pos, u in enumerate(self.uops): self.emit(pos, u)
    preludes = {"half": HALF_PRELUDE, "bfloat16": BFLOAT16_PRELUDE, "bit_cast": BITCAST_PRELUDE,
                "max_nan": MAX_NAN_PRELUDE, "async_copy": ASYNC_COPY_PRELUDE, **FAST_PRELUDES}
    prelude = "".join(text for need, text in preludes.items() if self.needs[need])
    head = f'extern "C" __global__ void __launch_bounds__({threads}) {self.name}({", ".join(args)}) {{'
    if self.dependent_launch:
      prelude += f'extern "C" __device__ unsigned int {self.name}{DEPENDENT_LAUNCH_SUFFIX} = 1;\n'
    if self.dynamic_shared:
      prelude += f'extern "C" __device__ unsigned int {self.name}{DYNAMIC_SHARED_SUFFIX} = {self.dynamic_shared};\n'
      head += f"\n  extern __shared__ __align__({VECTOR_BYTES}) unsigned char dynamic_shared[];"
    return prelude + head + "\n" + "\n".join(self.lines) + "\n}\n"

  def prefetch_lines(self) -> None:
    """Before the wait: the block's threads prefetch the bytes of the largest read-only input it reads (prefetch.py).
    Block indices and variables come straight from blockIdx and the parameters (nothing is defined yet)."""
    names = {v: parameter_value(v, dtypes.int64) for v in self.uops if v.op is Ops.DEFINE_VAR}
    dims = [1, 1, 1]
    for u in self.uops:
      if u.op is Ops.SPECIAL:
        lane = int(u.arg[0][-1])
        if u.arg[0].startswith("gidx"): names[u] = f"blockIdx.{LANES[lane]}"
        else: dims[lane] = u.arg[1]
    thread = f"threadIdx.x + {dims[0]} * (threadIdx.y + {dims[1]} * threadIdx.z)"
    for text in prefetch_statements(self.prefetch, self.names[self.prefetch.buffer], names, thread, prod(dims)):
      self.line(text)

  # ---- one op
  def emit(self, pos: int, u: UOp) -> None:
    op = u.op
    if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST): return
    if (group := self.group_at.get(pos)) is not None and id(group) in self.live_groups: self.lane_word(group)
    if (lane := self.lanes.member.get(u)) is not None:
      if u in self.used: self.define(u, self.lane_byte(*lane), "byte")
      return
    if (exit_ := self.lanes.exits.get(u)) is not None:
      if u in self.used: self.define(u, self.lane_float(exit_), "cast")
      return
    if (op in ALU or op in (Ops.CAST, Ops.BITCAST)) and u not in self.used: return
    if op is Ops.SPECIAL:
      name, size = u.arg
      source = {"g": "blockIdx", "l": "threadIdx"}[name[0]] + "." + LANES[int(name[-1])]
      self.line(f"const int {name} = {source};  /* {size} */")
      self.names[u] = name
    elif op is Ops.DEFINE_LOCAL:
      name, size = u.arg
      if self.dynamic_shared:
        self.line(f"{MEMORY_TYPES[u.dtype]}* {name} = ({MEMORY_TYPES[u.dtype]}*)(dynamic_shared + "
                  f"{self.shared_offsets[u]});")
      else: self.line(f"__shared__ __align__({VECTOR_BYTES}) {MEMORY_TYPES[u.dtype]} {name}[{size}];")
      self.names[u] = name
    elif op is Ops.DEFINE_ACC and u.src[0].op is Ops.VECTORIZE:
      names = [self.fresh(f"acc{u.arg}_") for _ in u.src[0].src]
      for name, init in zip(names, u.src[0].src): self.line(f"{REGISTER_TYPES[u.dtype]} {name} = {self.value(init)};")
      self.fragments[u] = self.acc_fragments[u.arg] = names
    elif op is Ops.DEFINE_ACC:
      name = f"acc{u.arg}" if u.arg not in self.acc_names else self.fresh(f"acc{u.arg}_")
      self.acc_names[u.arg] = name
      self.line(f"{REGISTER_TYPES[u.dtype]} {name} = {self.value(u.src[0])};")
    elif op is Ops.RANGE:
      name, narrow = f"ridx{u.arg}", u in self.narrow
      start, end = self.operand(u.src[0], narrow), self.operand(u.src[1], narrow)
      self.line(f"for ({REGISTER_TYPES[self.computed_dtype(u)]} {name} = {start}; {name} < {end}; {name}++) {{")
      self.names[u] = name
      self.depth += 1
    elif op in (Ops.ENDRANGE, Ops.ENDIF):
      self.depth -= 1
      self.line("}")
    elif op is Ops.IF:
      self.line(f"if ({self.value(u.src[0])}) {{")
      self.depth += 1
    elif op is Ops.BARRIER:
      if self.async_copies: self.line('asm volatile("cp.async.wait_all;" ::: "memory");')   # this thread's copies
      self.line("__syncthreads();")
    elif op is Ops.ASSIGN and u.src[0] in self.fragments:
      for acc, new in zip(self.fragments[u.src[0]], self.fragments[u.src[1]]): self.line(f"{acc} = {new};")
    elif op is Ops.ASSIGN: self.line(f"{self.value(u.src[0])} = {self.value(u.src[1])};")
    elif op is Ops.REDUCE and u.arg[0] is Ops.WMMA: self.fragments[u] = self.acc_fragments[u.arg[1]]
    elif op is Ops.REDUCE: self.names[u] = self.acc_names[u.arg[1]]
    elif op is Ops.VECTORIZE: self.vectorize(u)
    elif op is Ops.WMMA: self.wmma(u)
    elif op is Ops.SHUFFLE_XOR:
      self.define(u, f"__shfl_xor_sync({FULL_WARP_MASK}, {self.value(u.src[0])}, {u.arg})", "lane")
    elif op is Ops.GEP: self.names[u] = self.fragments[u.src[0]][u.arg]
    elif op is Ops.LOAD: self.load(pos, u)
    elif op is Ops.STORE: self.store(pos, u)
    elif op is Ops.CAST: self.render_cast(u)
    elif op is Ops.BITCAST:
      if u.dtype == dtypes.float16 and u in self.wants_bits:
        self.define(u, f"half_to_float({self.keep_half_bits(u, self.bitcast(u.src[0], dtypes.uint16))})", "cast")
      else: self.define(u, self.bitcast(u.src[0], u.dtype), "cast")
    else: self.define(u, self.alu(u), "alu")

  # ---- byte lanes (byte_lanes.py)
  def word_of(self, group: LaneGroup) -> str:
    """The C expression of a group's word: a loaded word's, or the variable its expression was written to."""
    if id(group) in self.lane_words: return self.lane_words[id(group)]
    assert group.root is not None, "a computed group's word is written at its first lane"
    if group.root[0] == "vector": word = f"{self.vector_names[group.root[1]]}.x"
    else:
      word = self.run_bytes[id(self.byte_runs[group.at])][WORD_BYTES * group.root[2]][0]
    self.lane_words[id(group)] = word
    return word

  def word_expr(self, e) -> str:
    if isinstance(e, LaneGroup): return self.word_of(e)
    if isinstance(e, int): return f"{e:#x}u"
    left = self.word_expr(e.left)
    if e.op == "same": return left
    if e.op in ("shl", "shr"): return f"({left} {'<<' if e.op == 'shl' else '>>'} {e.amount})"
    return f"({left} {WORD_OPS[e.op]} {self.word_expr(e.right)})"

  def lane_word(self, group: LaneGroup) -> None:
    """Write a computed group's word at its first lane's position (every word it reads is written by then)."""
    assert isinstance(group.expr, WordExpr)
    if group.expr.op == "same":
      self.lane_words[id(group)] = self.word_of(group.expr.left)
      return
    name = self.fresh("lanes")
    self.line(f"const unsigned int {name} = {self.word_expr(group.expr)};")
    self.lane_words[id(group)] = name

  def lane_byte(self, group: LaneGroup, lane: int) -> str:
    word = self.word_of(group)
    return f"(unsigned char)({word} >> {BYTE_BITS * lane})" if lane else f"(unsigned char){word}"

  def lane_float(self, exit_: FloatExit) -> str:
    """Lane k of the word plus an int8 offset, as float32: the byte moved into the low mantissa byte of 2^23 (the
    other bytes 0x00, 0x00, 0x4B), minus 2^23 less the offset; both steps exact. A signed lane is first flipped to
    its value + 128 (an xor of the word, which the compiler computes once for its four lanes). A folded select
    subtracts one of two such biases."""
    word, selector = self.word_of(exit_.group), BYTE_PERM_INTO_FLOAT + exit_.lane
    bias = FLOAT_TWO_POW_23 - exit_.offset
    if exit_.signed: word, bias = f"({word} ^ {SIGN_FLIP:#x}u)", bias + SIGN_FLIP_BIAS
    subtracted = render_const(float(bias), dtypes.float32)
    if exit_.select is not None:   # plus WHERE(condition, a, b): minus (bias - a) or (bias - b)
      condition, a, b = exit_.select
      subtracted = f"({self.value(condition)} ? {render_const(bias - a, dtypes.float32)} : " \
                   f"{render_const(bias - b, dtypes.float32)})"
    return f"(__int_as_float(__byte_perm({word}, {FLOAT_TWO_POW_23_BITS:#x}u, {selector:#x})) - {subtracted})"

  # ---- memory
  def load(self, pos: int, u: UOp) -> None:
    if u in self.pair_only or pos in self.async_loads: return   # (an asynchronous copy's load: see store)
    if isinstance(u.arg, MatrixLoad): return self.matrix_load(u, u.arg)
    valid = u.src[2] if len(u.src) > 2 and u.src[2].dtype == dtypes.bool else None
    if (vector := self.vectors.get(pos)) is not None: return self.vector_load(pos, u, vector, valid)
    if (run := self.byte_runs.get(pos)) is not None: return self.byte_run_load(pos, u, run)
    buffer, index = self.value(u.src[0]), self.value(u.src[1])
    element = f"{buffer}[{index}]"
    if (u.dtype == dtypes.float16 and u in self.wants_bits) or u in self.packed:
      zero = f"({MEMORY_TYPES[u.dtype]})0"
      element = self.keep_half_bits(u, element if valid is None else f"({self.value(valid)} ? {element} : {zero})")
      if u not in self.read_as_float: return   # only packed into fragments: the bits are all that is needed
      valid = None
    from_memory = self.from_memory(element, u.dtype)
    if valid is not None: from_memory = f"({self.value(valid)} ? {from_memory} : {render_const(0, u.dtype)})"
    self.define(u, from_memory)

  def keep_half_bits(self, u: UOp, bits: str) -> str:
    name = self.fresh("bits")
    self.line(f"{MEMORY_TYPES[u.dtype]} {name} = {bits};")
    self.half_bits[u] = name
    return name

  def vector_load(self, pos: int, u: UOp, access: VectorAccess, valid: Optional[UOp]) -> None:
    lane, vector = access.positions.index(pos), access.vector
    if pos == access.at:
      name = self.fresh("vec")
      self.vector_names[id(access)] = name
      loaded = f"*((const {vector.name}*)({self.value(u.src[0])} + {self.offset(u.src[1], lane)}))"
      if valid is not None:
        zeros = ", ".join(["0"] * (vector.lanes // vector.per_word))
        loaded = f"({self.value(valid)} ? {loaded} : make_{vector.name}({zeros}))"
      self.line(f"const {vector.name} {name} = {loaded};")
    element = vector.lane(self.vector_names[id(access)], lane)
    if u.dtype == dtypes.float16 or u in self.packed: self.half_bits[u] = element
    if u in self.packed and u not in self.read_as_float: return   # only packed into fragments: the bits suffice
    if vector.lane_type == REGISTER_TYPES[u.dtype]: self.names[u] = element   # the lane is the value
    else: self.define(u, self.from_memory(element, u.dtype))

  def byte_run_load(self, pos: int, u: UOp, run: ByteRun) -> None:
    """One byte of a run (vectors.byte_runs): the run's loads are written at its first position; each byte is a shift
    of the word that holds it."""
    lane = run.positions.index(pos)
    if pos == run.at: self.run_bytes[id(run)] = self.read_byte_run(u, run, lane)
    if u not in self.used: return   # read only as a byte-lane word
    word, shift = self.run_bytes[id(run)][lane]
    self.define(u, f"(unsigned char)({word} >> {shift})" if shift else f"(unsigned char){word}", "byte")

  def read_byte_run(self, u: UOp, run: ByteRun, lane: int) -> list[tuple[str, int]]:
    """The loads of a run (vectors.byte_run_pieces), from `u`, its byte `lane`: each 4 bytes at an unknown alignment
    are the low word shifted right by 8 × (start mod 4) with the high word's bits shifted in (a funnel shift; the high
    word is the one holding the 4th byte, the low word itself when the start is aligned)."""
    buffer, start = self.value(u.src[0]), f"({self.offset(u.src[1], lane)})"
    pieces = byte_run_pieces(len(run.positions), run.alignment)
    words: list[tuple[str, int]] = []
    if funnels := [p for p in pieces if p.funnel]:
      base, shift = self.fresh("words"), self.fresh("shift")
      misalignment = f"({start} & {WORD_BYTES - 1})"
      self.line(f"const int {shift} = (int){misalignment} * 8;")
      self.line(f"const unsigned int* {base} = (const unsigned int*)({buffer} + {start} - {misalignment});")
      low = [self.fresh("word") for _ in funnels] + [self.fresh("word")]
      for i, name in enumerate(low[:-1]): self.line(f"const unsigned int {name} = {base}[{i}];")
      self.line(f"const unsigned int {low[-1]} = {base}[{len(funnels) - 1} + ({shift} != 0)];")
      for i in range(len(funnels)):
        name = self.fresh("word")
        self.line(f"const unsigned int {name} = (unsigned int)((((unsigned long long){low[i + 1]}) << 32 | {low[i]}) "
                  f">> {shift});")
        words += [(name, 8 * k) for k in range(WORD_BYTES)]
    for piece in pieces:
      if piece.funnel: continue
      ctype, name = BYTE_LOAD_TYPES[piece.nbytes], self.fresh("word")
      self.line(f"const {ctype} {name} = *((const {ctype}*)({buffer} + {start} + {piece.offset}));")
      words += [(name if piece.nbytes <= WORD_BYTES else f"{name}.{LANES[k // WORD_BYTES]}", 8 * (k % WORD_BYTES))
                for k in range(piece.nbytes)]
    return words

  def offset(self, index: UOp, lane: int) -> str: return self.value(index) + (f" - {lane}" if lane else "")

  def from_memory(self, element: str, dtype: DType) -> str:
    if dtype == dtypes.float16: return f"half_to_float({element})"
    if dtype == dtypes.bfloat16: return f"bfloat16_to_float({element})"
    if dtype.is_bool: return f"({element} != 0)"
    return element

  def to_memory(self, u: UOp) -> str:
    if u in self.half_bits: return self.half_bits[u]
    value, dtype = self.value(u), u.dtype
    if dtype == dtypes.float16: return f"float_to_half({value})"
    if dtype == dtypes.bfloat16: return f"float_to_bfloat16({value})"
    return value

  def store(self, pos: int, u: UOp) -> None:
    guard = f"if ({self.value(u.src[3])}) " if len(u.src) > 3 else ""
    buffer, dtype = self.value(u.src[0]), u.src[2].dtype
    if (access := self.vectors.get(pos)) is not None:
      if pos != access.at: return   # the group's last store writes every lane
      vector = access.vector
      if id(access) in self.async_copies:
        if (copy := self.async_copies[id(access)]) is None: return   # its partner copies both
        leader = self.uops[copy.load.at]
        lane = copy.load.positions.index(copy.load.at)
        shared = f"{buffer} + {self.value(self.uops[self.index_position(copy.store)].src[1])}"
        source_address = f"{self.value(leader.src[0])} + {self.offset(leader.src[1], lane)}"
        self.line(f"{guard}async_copy<{copy.nbytes}>({shared}, {source_address});")
        return
      elements = [self.to_memory(self.uops[p].src[2]) for p in access.positions]
      if vector.lane_type != MEMORY_TYPES[dtype]: elements = [f"({vector.lane_type}){e}" for e in elements]
      index = self.value(self.uops[self.index_position(access)].src[1])
      self.line(f"{guard}*(({vector.name}*)({buffer} + {index})) = make_{vector.name}({', '.join(elements)});")
      return
    self.line(f"{guard}{buffer}[{self.value(u.src[1])}] = {self.to_memory(u.src[2])};")

  # ---- tensor cores
  def matrix_load(self, u: UOp, load: MatrixLoad) -> None:
    """A fragment loaded by the warp from shared memory: one 32-bit register per 8×8 matrix (PTX ldmatrix)."""
    registers = [self.fresh("frag") for _ in range(load.matrices)]
    self.line(f"unsigned int {', '.join(registers)};")
    shape = f"m8n8.x{load.matrices}{'.trans' if load.transposed else ''}.shared.b16"
    outputs = ", ".join(f"%{i}" for i in range(load.matrices))
    address = f"(unsigned int)__cvta_generic_to_shared({self.value(u.src[0])} + {self.value(u.src[1])})"
    self.line(f'asm volatile("ldmatrix.sync.aligned.{shape} {{{outputs}}}, [%{load.matrices}];" : '
              f'{", ".join(f"{chr(34)}=r{chr(34)}({r})" for r in registers)} : "r"({address}));')
    self.fragments[u] = registers

  def vectorize(self, u: UOp) -> None:
    """A fragment: float elements are used as they are; half/bfloat16 pairs (lower element in the low 16 bits, as
    PTX orders a fragment's elements) go into one 32-bit register, read with one 32-bit load when they are adjacent
    in memory and aligned."""
    if u.dtype not in PACKED_DTYPES:
      self.fragments[u] = [self.value(s) for s in u.src]
      return
    registers = []
    for low, high in zip(u.src[0::2], u.src[1::2]):
      name = self.fresh("pack")
      if (low, high) in self.pairs: packed = self.pair_load(low)
      else: packed = f"((unsigned int){self.to_memory(low)} | ((unsigned int){self.to_memory(high)} << 16))"
      self.line(f"unsigned int {name} = {packed};")
      registers.append(name)
    self.fragments[u] = registers

  def pair_load(self, low: UOp) -> str:
    """The 32 bits at `low` and the element after it (see _pairable), or 0 where they are masked off."""
    valid = low.src[2] if len(low.src) > 2 and low.src[2].dtype == dtypes.bool else None
    loaded = f"*((const unsigned int*)({self.value(low.src[0])} + {self.value(low.src[1])}))"
    return loaded if valid is None else f"({self.value(valid)} ? {loaded} : 0u)"

  def wmma(self, u: UOp) -> None:
    """D = A·B + C as inline PTX (no side effects, so plain `asm`: the compiler may schedule it like arithmetic)."""
    a, b, c = (self.fragments[s] for s in u.src)
    core: TensorCore = u.arg
    out = [self.fresh("wmma") for _ in c]
    for name, init in zip(out, c): self.line(f"{REGISTER_TYPES[u.dtype]} {name} = {init};")
    def operands(start: int, count: int) -> str: return ", ".join(f"%{i}" for i in range(start, start + count))
    d_operands = operands(0, len(out))
    text = (f"{core.instruction} {{{d_operands}}}, {{{operands(len(out), len(a))}}}, "
            f"{{{operands(len(out) + len(a), len(b))}}}, {{{d_operands}}};")
    outputs = ", ".join(f'"+f"({name})' for name in out)
    # 32-bit registers: packed half pairs as they are, a float's bits (TF32 operands) through __float_as_uint
    registers = [name if s.dtype in PACKED_DTYPES else f"__float_as_uint({name})"
                 for s, names in ((u.src[0], a), (u.src[1], b)) for name in names]
    inputs = ", ".join(f'"r"({name})' for name in registers)
    self.line(f'asm("{text}" : {outputs} : {inputs});')
    self.fragments[u] = out

  # ---- arithmetic
  def alu(self, u: UOp) -> str:
    op, dt = u.op, (u.src[-1].dtype if u.op is Ops.WHERE else u.src[0].dtype)
    values = u.src[1:] if op is Ops.WHERE else u.src
    # 32-bit math for a narrow value, and for a comparison of narrow values (C compares mixed widths exactly)
    narrow = u in self.narrow or (op in COMPARISON and all(x in self.narrow or x.op is Ops.CONST for x in values))
    s = [self.operand(x, narrow) for x in u.src]
    if op is Ops.RECIP and u.src[0].op is Ops.SQRT and u.src[0].dtype == dtypes.float32:
      # rsqrtf: within 2 ulp (CUDA C Programming Guide, its math functions' error table), where 1/sqrtf rounds twice
      # through IEEE division's and square root's longer sequences with their slow-path branches. A norm takes one
      # per row, on its critical path: the packed gate/up kernel of gemma-3-270m in a PDL chain, 5.73 → 5.39 µs
      out = f"rsqrtf({self.operand(u.src[0].src[0], narrow)})"
    elif dt.is_float: out = self.float_alu(op, dt, s, u.arg)
    else: out = self.int_alu(u, op, NARROW_DTYPE if u in self.narrow else dt, s)
    if u.dtype == dtypes.float16 and op not in (Ops.MAX, Ops.WHERE, Ops.NEG): return f"round_half({out})"
    if u.dtype == dtypes.bfloat16 and op not in (Ops.MAX, Ops.WHERE, Ops.NEG): return f"round_bfloat16({out})"
    return out

  def float_alu(self, op: Ops, dt: DType, s: list[str], arg=None) -> str:
    """One float op; `arg` FAST_MATH on an EXP2/LOG2/TANH of a 32-bit (or narrower) float picks its fast instruction
    (any other arg is the default call: CUDA's "libm" is its math library)."""
    suffix = "" if dt == dtypes.float64 else "f"
    if arg == FAST_MATH and op in FAST_INSTRUCTIONS and dt != dtypes.float64 and \
       (op is not Ops.TANH or self.has_fast_tanh):
      name = FAST_INSTRUCTIONS[op][0]
      self.needs[name] = True
      return f"{name}({s[0]})"
    if op in _FLOAT_INTRINSICS: return f"{_FLOAT_INTRINSICS[op]}{suffix}({s[0]})"
    if op is Ops.NEG: return f"(-{s[0]})"
    if op is Ops.RECIP: return f"({render_const(1.0, dt)} / {s[0]})"
    if op is Ops.MOD: return f"fmod{suffix}({s[0]}, {s[1]})"   # exact, as C's fmod
    if op is Ops.MAX and dt != dtypes.float64 and self.has_max_nan:
      self.needs["max_nan"] = True
      return f"max_nan({s[0]}, {s[1]})"
    if op is Ops.MAX: return f"(({s[0]} > {s[1]}) || ({s[0]} != {s[0]}) ? {s[0]} : {s[1]})"   # NaN wins
    if op is Ops.WHERE: return f"({s[0]} ? {s[1]} : {s[2]})"
    if op in _INFIX: return f"({s[0]} {_INFIX[op]} {s[1]})"
    raise NotImplementedError(f"CUDA renderer: no float rule for {op} on {dt}")

  def int_alu(self, u: UOp, op: Ops, dt: DType, s: list[str]) -> str:
    ctype = REGISTER_TYPES[dt]
    if op is Ops.WHERE: return f"({s[0]} ? {s[1]} : {s[2]})"
    if op is Ops.MAX: return f"({s[0]} > {s[1]} ? {s[0]} : {s[1]})"
    if op in (Ops.IDIV, Ops.MOD): return self.int_division(u, op, dt, s)
    if op in (Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL) and self.may_overflow(u, op, dt):
      # two's complement wrap-around, computed in an unsigned type where C++ defines it
      unsigned = UNSIGNED_OF[max(dt.itemsize, 4)]
      if op is Ops.NEG: return f"({ctype})(0u - ({unsigned}){s[0]})"
      if op is Ops.SHL: return f"({ctype})(({unsigned}){s[0]} << {s[1]})"
      return f"({ctype})(({unsigned}){s[0]} {_INFIX[op]} ({unsigned}){s[1]})"
    if op is Ops.NEG: return f"({ctype})(-{s[0]})"
    if op in _INFIX:   # narrower types are promoted to int: convert the result back
      return f"({ctype})({s[0]} {_INFIX[op]} {s[1]})" if dt.itemsize < 4 else f"({s[0]} {_INFIX[op]} {s[1]})"
    raise NotImplementedError(f"CUDA renderer: no integer rule for {op} on {dt}")

  @staticmethod
  def may_overflow(u: UOp, op: Ops, dt: DType) -> bool:
    """Whether C++ would overflow a signed type (undefined behaviour) computing this op plainly. Types narrower than
    int are promoted to int, where only a 16-bit unsigned product can overflow; a signed shift of a negative value is
    undefined; 32/64-bit signed math is safe when the range analysis keeps the result inside the type (index math)."""
    if dt.is_unsigned or dt.is_bool: return op is Ops.MUL and dt.itemsize < 4
    if op is Ops.SHL: return True
    if dt.itemsize < 4: return False
    return u.vmin <= dtypes.min(dt) or u.vmax >= dtypes.max(dt)

  def int_division(self, u: UOp, op: Ops, dt: DType, s: list[str]) -> str:
    """C division and remainder; x / 0 = 0 and x % 0 = 0; INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 = 0."""
    symbol = "/" if op is Ops.IDIV else "%"
    divisor = u.src[1]
    if divisor.op is Ops.CONST and divisor.arg not in (0, -1): return f"({s[0]} {symbol} {s[1]})"
    ctype = REGISTER_TYPES[dt]
    if dt.kind != 'i': return f"({s[1]} == 0 ? ({ctype})0 : ({ctype})({s[0]} {symbol} {s[1]}))"
    negated = f"({ctype})(0u - ({UNSIGNED_OF[max(dt.itemsize, 4)]}){s[0]})" if op is Ops.IDIV else f"({ctype})0"
    return f"({s[1]} == 0 ? ({ctype})0 : {s[1]} == -1 ? {negated} : ({ctype})({s[0]} {symbol} {s[1]}))"

  def render_cast(self, u: UOp) -> None:
    """A CAST. A float16 value that is stored (or bitcast) keeps its half bits from one conversion, so its store does
    not convert it again (float -> half -> float -> half was three conversions a value)."""
    source, src = u.src[0], u.src[0].dtype
    x = self.value(source)
    if u.dtype == dtypes.float16 and u in self.wants_bits and src.is_float:
      bits = f"double_to_half({x})" if src == dtypes.float64 else f"float_to_half({x})"
      self.define(u, f"half_to_float({self.keep_half_bits(u, bits)})", "cast")
    else: self.define(u, self.cast(x, src, self.computed_dtype(u)), "cast")

  def cast(self, x: str, src: DType, dst: DType) -> str:
    to = REGISTER_TYPES[dst]
    if dst.is_bool: return f"({x} != 0)"
    if src.is_float and dst.is_float:
      if dst == dtypes.float16 and src == dtypes.float64: return f"half_to_float(double_to_half({x}))"
      if dst == dtypes.float16: return f"round_half({x})"
      if dst == dtypes.bfloat16: return f"round_bfloat16((float){x})"
      return f"({to}){x}"
    if src.is_float:   # truncating and saturating (cvt.rzi), NaN → 0: like llvm.fpto[su]i.sat
      kind = "double" if src == dtypes.float64 else "float"
      if dst in _FLOAT_TO_INT: converted = f"__{kind}2{_FLOAT_TO_INT[dst]}_rz({x})"
      elif dst.is_unsigned: converted = f"min({dtypes.max(dst)}u, __{kind}2uint_rz({x}))"
      else: converted = f"max({dtypes.min(dst)}, min({dtypes.max(dst)}, __{kind}2int_rz({x})))"
      # cvt.rzi's NaN result depends on the instruction (measured on an H200: 0 for f32 → s32, INT_MIN for f64 → s32
      # and for 64-bit results), so NaN is tested first
      return f"({x} != {x} ? ({to})0 : ({to}){converted})"
    if dst.is_float:
      if dst == dtypes.float16: return f"round_half((float){x})"
      if dst == dtypes.bfloat16: return f"round_bfloat16((float){x})"
      return f"({to}){x}"
    return f"({to}){x}"   # integers: truncate, or extend by the source's signedness, as C does

  def bitcast(self, source: UOp, dst: DType) -> str:
    x, src = self.operand(source, narrow_user=False), source.dtype
    if src in (dtypes.float16, dtypes.bfloat16): x = self.to_memory(source)
    if dst == dtypes.float16: return f"half_to_float(bit_cast<half>({x}))"
    if dst == dtypes.bfloat16: return f"bfloat16_to_float(bit_cast<bfloat16>({x}))"
    return f"bit_cast<{REGISTER_TYPES[dst]}>({x})"
