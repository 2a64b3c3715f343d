"""CUDA code generation without a GPU: kernels of every ALU op, dtype, cast and opt render to CUDA C NVRTC compiles.

Kernels are LazyBuffer graphs on the LLVM device (nothing runs): scheduled, optimized for CUDARenderer (explicit opts
or the GPU heuristics), linearized, rendered, and compiled to an sm_90 cubin. Skipped only when libnvrtc cannot be
found (`pip install nvidia-cuda-nvrtc`, part of the test extra). Results on a real GPU are in test/test_cuda.py.
"""
import re
from typing import Optional
import numpy as np
import pytest
from tgrad.dtype import DType, dtypes
from tgrad.ops import ALU, Ops, UOp, simplify
from tgrad.lazy import LazyBuffer
from tgrad.schedule import create_schedule
from tgrad.device import CompileError
from tgrad.helpers import Context
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps, fold_dims
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer, render_const, CUDA_MAX_GRID, CUDA_MAX_BLOCK, TENSOR_CORES
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.codegen.staging import stage_plan
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available, NVRTCCompiler

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

ARCH = "sm_90"
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
ALL = [dtypes.bool] + INTS + FLOATS

def host(shape: tuple[int, ...], dtype: DType = dtypes.float32) -> LazyBuffer:
  return LazyBuffer.from_host(np.zeros(shape, dtype.np), "LLVM", dtype)

def kernels(out: LazyBuffer, opts: tuple[Opt, ...] = (), heuristics: bool = False, renderer=None) -> list[Kernel]:
  """The kernels realizing `out`, optimized for CUDA with `opts` (applied to the last kernel) or the heuristics."""
  items = [item for item in create_schedule([out]) if item.ast.op is Ops.SINK]
  out_kernels = [Kernel(item.ast, renderer or CUDARenderer()) for item in items]
  for kernel in out_kernels:
    if heuristics: hand_coded_optimizations(kernel)
  for opt in opts: out_kernels[-1].apply_opt(opt)
  return out_kernels

def first_loop(src: str) -> int:
  """Where the kernel's first loop over a RANGE (ridx) opens, -1 for none (the L2 prefetch's loop is not one)."""
  match = re.search(r"for \((?:int|long long) ridx", src)
  return match.start() if match else -1

def compiled_source(kernel: Kernel, name: str = "test_kernel") -> str:
  """Render the kernel, compile it with NVRTC and return its source."""
  src = kernel.renderer.render(name, linearize(kernel))
  cubin = compile_cuda(src, ARCH)
  assert cubin[:4] == b"\x7fELF", "NVRTC must return an ELF cubin"
  return src

def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  (n, k), m = a.shape, b.shape[1]
  product = a.reshape((n, k, 1)).expand((n, k, m)).alu(Ops.MUL, b.reshape((1, k, m)).expand((n, k, m)))
  return product.r(Ops.ADD, (1,)).reshape((n, m))

def compile_all(out: LazyBuffer, opts: tuple[Opt, ...] = (), heuristics: bool = False) -> list[str]:
  return [compiled_source(k) for k in kernels(out, opts, heuristics)]

# ---- elementwise: every ALU op for every dtype it applies to, with the heuristics (UPCAST 4 → vector accesses)

FLOAT_UNARY = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC, Ops.TANH]
FLOAT_BINARY = [Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE]   # MOD: fmod
INT_BINARY = [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR,
              Ops.SHL, Ops.SHR]
BOOL_BINARY = [Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPLT, Ops.MAX]

def _op_cases():
  for dt in FLOATS:
    for op in FLOAT_UNARY + FLOAT_BINARY + [Ops.WHERE]: yield op, dt
  for dt in INTS:
    for op in INT_BINARY + [Ops.NEG, Ops.WHERE]: yield op, dt
  for op in BOOL_BINARY + [Ops.WHERE]: yield op, dtypes.bool

@pytest.mark.parametrize("op,dtype", list(_op_cases()), ids=lambda x: getattr(x, "name", str(x)))
def test_elementwise_op(op: Ops, dtype: DType):
  a, b = host((8, 64), dtype), host((8, 64), dtype)
  if op is Ops.WHERE: out = a.alu(Ops.CMPNE, b).alu(Ops.WHERE, a, b)
  elif op in FLOAT_UNARY or op is Ops.NEG: out = a.alu(op)
  else: out = a.alu(op, b)
  (src,) = compile_all(out, heuristics=True)
  if op in (Ops.IDIV, Ops.MOD) and not dtype.is_float: assert "== 0 ?" in src, "a divisor that may be 0 must be guarded"
  if op is Ops.MOD and dtype.is_float: assert "fmod" in src, "float MOD is C fmod (exact)"
  if dtype in (dtypes.float16, dtypes.bfloat16) and op in (Ops.ADD, Ops.MUL, Ops.FDIV, Ops.EXP2):
    assert "round_" in src, "half/bfloat16 math is done in float and rounded after every op"
  assert re.search(r"const \w+4? vec\d+ = ", src) or dtype.itemsize == 8, f"expected vector loads:\n{src}"

# the lowering args of EXP2/LOG2/TANH (tensor_ops/composite.py): "fast" is one MUFU instruction for 32-bit and
# narrower floats (float64 keeps the library call), "libm" the library call, "poly" tgrad's polynomial (no call)
LOWERING_CASES = [(op, arg, dt) for op in (Ops.EXP2, Ops.LOG2) for arg in ("fast", "libm", "poly") for dt in FLOATS] + \
  [(Ops.TANH, "fast", dt) for dt in FLOATS]

@pytest.mark.parametrize("op,arg,dtype", LOWERING_CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_transcendental_lowering_args(op: Ops, arg: str, dtype: DType):
  (src,) = compile_all(host((8, 64), dtype).alu(op, arg=arg), heuristics=True)
  call = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.TANH: "tanh"}[op] + ("(" if dtype == dtypes.float64 else "f(")
  if arg == "fast" and dtype != dtypes.float64: assert ".approx.f32" in src and call not in src, src
  elif arg == "poly" and dtype != dtypes.float64: assert call not in src and ("<<" in src or ">>" in src), src
  else: assert call in src, src

def test_constant_divisor_is_not_guarded():
  (src,) = compile_all(host((64,), dtypes.int32).alu(Ops.IDIV, host((64,), dtypes.int32).const(7)))
  assert "== 0 ?" not in src and "/ 7)" in src

@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_casts_from(dtype: DType):
  """One kernel casting to every dtype (and on to float64, summed): every conversion rule compiles."""
  x = host((4, 32), dtype)
  total = None
  for dst in ALL:
    if dst == dtype: continue
    term = x.cast(dst).cast(dtypes.float64)
    total = term if total is None else total.alu(Ops.ADD, term)
  (src,) = compile_all(total, heuristics=True)
  if dtype.is_float: assert "_rz(" in src, "float → int casts truncate and saturate (cvt.rzi)"

@pytest.mark.parametrize("dtype", [d for d in ALL if not d.is_bool], ids=lambda d: d.name)
def test_bitcasts_from(dtype: DType):
  x = host((4, 32), dtype)
  targets = [d for d in ALL if d.itemsize == dtype.itemsize and d != dtype and not d.is_bool]
  total = None
  for dst in targets:
    term = x.cast(dst, bitcast=True).cast(dtypes.float64)
    total = term if total is None else total.alu(Ops.ADD, term)
  if total is None: pytest.skip(f"no other dtype has {dtype.itemsize}-byte items")
  (src,) = compile_all(total)
  assert "bit_cast<" in src

# ---- reductions with GROUP, UNROLL, UPCAST and LOCAL

ROWS_REDUCE = [(), (Opt(OptOps.GROUP, 0, 16),), (Opt(OptOps.GROUPTOP, 0, 16),), (Opt(OptOps.UNROLL, 0, 4),),
               (Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 16)),
               (Opt(OptOps.GROUP, 0, 16), Opt(OptOps.UNROLL, 1, 4)),
               (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUP, 0, 8)),
               (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.UPCAST, 0, 2)),
               (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 0, 8))]

def _opts_id(opts) -> str: return "+".join(f"{o.op.name}{o.amount}" for o in opts) or "none"

@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL], ids=lambda o: o.name)
@pytest.mark.parametrize("opts", ROWS_REDUCE, ids=_opts_id)
def test_row_reduce_with_opts(op: Ops, opts: tuple[Opt, ...]):
  (src,) = compile_all(host((64, 256)).alu(Ops.EXP2).r(op, (1,)), opts)
  grouped = any(o.op in (OptOps.GROUP, OptOps.GROUPTOP) for o in opts)
  assert ("__syncthreads();" in src) == grouped and ("__shared__" in src) == grouped

@pytest.mark.parametrize("opts", [(), (Opt(OptOps.LOCAL, 0, 32), Opt(OptOps.GROUP, 0, 8)),
                                  (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4))], ids=str)
def test_column_reduce_with_opts(opts):
  compile_all(host((256, 64), dtypes.float16).r(Ops.ADD, (0,)), opts)

def test_group_partials_and_barrier_are_outside_the_group_loop():
  """The shared-memory store and barrier of a GROUP run once per thread, not once per iteration of the loop that
  reads the other threads' partials (the linearizer hoists what doesn't depend on a loop)."""
  (kernel,) = kernels(host((64, 256)).r(Ops.ADD, (1,)), (Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 16)))
  depth, barrier_depths, shared_load_depths = 0, [], []
  for u in linearize(kernel):
    if u.op in (Ops.RANGE, Ops.IF): depth += 1
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF): depth -= 1
    elif u.op is Ops.BARRIER: barrier_depths.append(depth)
    elif u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_LOCAL: shared_load_depths.append(depth)
  assert barrier_depths == [0]
  assert shared_load_depths == [2], "the partials are read in a loop under `if (first thread of the group)`"

def test_full_reduce_is_split_and_grouped():
  """A 16M-element sum: partial sums of chunks (one block each), then their sum — two kernels, both grouped."""
  ks = kernels(host((1 << 24,)).r(Ops.ADD, (0,)), heuristics=True)
  assert len(ks) == 2
  partials = ks[0]
  global_size, local_size = partials.launch_dims()
  assert global_size[0] >= 128 and local_size[0] >= 64, (global_size, local_size)
  srcs = [compiled_source(k) for k in ks]
  assert "const float4 vec" in srcs[0], "each thread reads 4 contiguous floats at once"

def test_softmax_like_chain():
  x = host((32, 1024))
  m = x.r(Ops.MAX, (1,))
  e = x.alu(Ops.ADD, m.expand((32, 1024)).alu(Ops.NEG)).alu(Ops.EXP2)
  out = e.alu(Ops.FDIV, e.r(Ops.ADD, (1,)).expand((32, 1024)))
  (src,) = compile_all(out, heuristics=True)   # one row kernel (schedule.py rule 2b), a block per row
  assert src.count("__syncthreads();") == 2, "each reduce is combined across the block before it is used"
  assert "if (" not in src, "every thread combines the partials and stores its share of the row"
  assert src.count("const float4 vec") == 3, "each pass reads the row as float4s"

def test_matmul_heuristics_tile_and_vectorize():
  (kernel,) = kernels(matmul(host((256, 128)), host((128, 512))), heuristics=True)
  assert [o.op for o in kernel.applied_opts].count(OptOps.UPCAST) == 2
  src = compiled_source(kernel)
  assert "make_float4" in src and "__launch_bounds__(256)" in src

def test_big_matmul_heuristics_stage_both_inputs():
  """A 2048² output under SGEMM=0 (else the float32 matmul template, test_sgemm.py): 8×8 register tiles (columns as
  two float4 groups), 8×16 threads, both inputs staged in shared memory: one copy before the loop and one per step
  (float4 global loads and shared stores where contiguous), a barrier after each, outer-product reads of float4s
  from the tiles."""
  with Context(SGEMM=0): (kernel,) = kernels(matmul(host((2048, 256)), host((256, 2048))), heuristics=True)
  opts = [(o.op, o.amount) for o in kernel.applied_opts]
  assert opts == [(OptOps.UPCAST, 4), (OptOps.UPCAST, 8), (OptOps.UNROLL, 8), (OptOps.LOCAL, 8), (OptOps.LOCAL, 16),
                  (OptOps.UPCAST, 2), (OptOps.SMEM, 0), (OptOps.SMEM, 0)]
  src = compiled_source(kernel)
  assert "__launch_bounds__(128)" in src and src.count("__syncthreads();") == 2
  assert src.count("__shared__ __align__(16) float tile") == 2
  loop = src[first_loop(src):]
  # the next step's copies: A's tile is transposed (float4 global loads into registers, stored as floats at the end of
  # the step), B's copied as it is with cp.async (16 bytes per thread and copy)
  assert loop.count("*((const float4*)(data") == 1 and loop.count("async_copy<16>(tile") == 2
  assert loop.index("async_copy<16>") < loop.index("*((const float4*)(tile"), "B's copy is issued before the math"
  assert loop.count("*((const float4*)(tile") == 32   # 8 K steps × (2 float4 of A + 2 of B)

@pytest.mark.parametrize("opts", [
  (Opt(OptOps.SMEM, 0, 0),), (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.SMEM, 1, 4), Opt(OptOps.UNROLL, 0, 3)),
  (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 13), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 0)),
  (Opt(OptOps.GROUP, 0, 8), Opt(OptOps.SMEM, 0, 0)), (Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.SMEM, 1, 0))],
  ids=_opts_id)
def test_staged_kernels_compile(opts):
  """Odd sizes (a tile that isn't a multiple of the block's threads: guarded copies), GROUP, no reduce loop."""
  src = compiled_source(kernels(matmul(host((24, 48)), host((48, 52))), opts)[-1])
  assert "__shared__" in src and "__syncthreads();" in src

def test_big_half_matmul_heuristics_stage_for_ldmatrix():
  """A 2048² half matmul: tensor cores with both inputs staged (2×2 warps of 4×8 tiles), fragments by ldmatrix; K
  unrolled by 2 within the static 48 KiB (by 4 where the GPU allows more, see test_dynamic_shared_memory_above_48k)."""
  out = half_dot(host((2048, 256), dtypes.float16), host((256, 2048), dtypes.float16))
  (kernel,) = kernels(out, heuristics=True)
  assert [(o.op, o.amount) for o in kernel.applied_opts] == [
    (OptOps.TC, 0), (OptOps.UPCAST, 4), (OptOps.UPCAST, 8), (OptOps.LOCAL, 2), (OptOps.LOCAL, 2), (OptOps.UNROLL, 2),
    (OptOps.SMEM, 8), (OptOps.SMEM, 8)]
  loop = (src := compiled_source(kernel))[first_loop(src):]
  assert loop.count("ldmatrix") == 2 * (4 + 8) and loop.count("mma.sync") == 2 * 4 * 8
  assert "__launch_bounds__(128)" in src

def test_dynamic_shared_memory_above_48k():
  """Tiles over the static 48 KiB are carved from one dynamic allocation whose size the module publishes."""
  opts = (Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 0, 2),
          Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.SMEM, 0, 8), Opt(OptOps.SMEM, 1, 8))
  out = half_dot(host((512, 512), dtypes.float16), host((512, 512), dtypes.float16))
  with pytest.raises(KernelOptError, match="shared memory"): kernels(out, opts)   # a GPU without the opt-in
  src = compiled_source(kernels(out, opts, renderer=CUDARenderer(shared_memory_bytes=227 * 1024))[-1])
  assert 'extern "C" __device__ unsigned int test_kernel_dynamic_shared_bytes = 71680;' in src
  assert "extern __shared__" in src and "__shared__ __align__(16) half" not in src
  assert src.count("ldmatrix") == 4 * (4 + 8) and "async_copy<16>" in src

@pytest.mark.parametrize("k", [40, 48, 64])
def test_staged_steps_never_write_the_buffer_they_read(k: int):
  """With two buffers per tile, every step's copy of the next tile must go to the buffer that step doesn't read, also
  on the last step (which copies step 0 again instead of a guard) and for an odd number of steps."""
  opts = (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.LOCAL, 0, 8),
          Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 0))
  kernel = kernels(matmul(host((64, k)), host((k, 64))), opts)[-1]
  uops = linearize(kernel)
  loop = next(u for u in uops if u.op is Ops.RANGE)
  body = uops[uops.index(loop) + 1:uops.index(next(u for u in uops if u.op is Ops.ENDRANGE and u.src[0] is loop))]
  specials = {u: UOp.const(u.dtype, 0) for u in uops if u.op is Ops.SPECIAL}
  tiles = {u.src[0] for u in body if u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_LOCAL}
  assert len(tiles) == 2
  steps = k // 8
  for step in range(steps):
    at = {**specials, loop: UOp.const(loop.dtype, step)}
    for tile in tiles:
      half = tile.arg[1] // 2   # one buffer
      def buffers(op, tile=tile, at=at, half=half) -> set[int]:
        return {simplify(u.src[1].substitute(at)).arg // half for u in body if u.op is op and u.src[0] is tile}
      assert buffers(Ops.LOAD) == {step % 2} and buffers(Ops.STORE) == {(step + 1) % 2}, (step, steps)

def test_fuzz_staged_kernels_compile():
  """Random legal opt sequences with SMEM (and TC for half inputs) on random matmul shapes all linearize, render and
  compile; test/test_cuda.py runs the same kind of fuzz on a GPU against numpy."""
  import random
  rng = random.Random(5)
  pool = [Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 4), Opt(OptOps.SMEM, 1, 8), Opt(OptOps.SMEM, 0, 1),
          Opt(OptOps.TC, 0, 0), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.GROUP, 0, 8)]
  pool += [Opt(op, axis, amount) for op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.PADTO) for axis in range(2)
           for amount in (2, 3, 4, 8)]
  staged = 0
  for _ in range(40):
    n, k, m = (rng.choice([8, 16, 24, 33, 64]) for _ in range(3))
    dtype = rng.choice([dtypes.float16, dtypes.float32])
    out = half_dot(host((n, k), dtype), host((k, m), dtype)) if dtype == dtypes.float16 else \
      matmul(host((n, k)), host((k, m)))
    kernel = kernels(out)[-1]
    for opt in rng.sample(pool, len(pool)):
      if len(kernel.applied_opts) == 6: break
      try: kernel.apply_opt(opt)
      except KernelOptError: pass
    staged += bool(kernel.staged)
    compiled_source(kernel)
  assert staged >= 20

def test_staged_refusals():
  """SMEM picks one of the loads of a single reduce, once; it needs shared memory and fits in it."""
  kernel = kernels(matmul(host((64, 64)), host((64, 64))))[-1]
  for opt in [Opt(OptOps.SMEM, 2, 0), Opt(OptOps.SMEM, None, 0), Opt(OptOps.SMEM, 0, 65)]:
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
  kernel.apply_opt(Opt(OptOps.SMEM, 0, 0))
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.SMEM, 0, 8))
  big = kernels(matmul(host((256, 4096)), host((4096, 256))))[-1]
  for opt in [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 64)]: big.apply_opt(opt)
  with pytest.raises(KernelOptError, match="shared memory"): big.apply_opt(Opt(OptOps.SMEM, 0, 0))
  assert not big.staged
  elementwise = kernels(host((64, 64)).alu(Ops.ADD, host((64, 64))))[-1]
  with pytest.raises(KernelOptError): elementwise.apply_opt(Opt(OptOps.SMEM, 0, 0))

def test_staged_tensor_core_tiles_copy_asynchronously():
  """On sm_80+ tensor-core tiles keep global memory's order (A: K innermost, B: its columns), so every copy is a
  cp.async issued at the top of the step, and fragments are read from the tiles with 8-byte vector loads."""
  opts = (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 2),
          Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 8))
  kernel = kernels(half_dot(host((256, 256), dtypes.float16), host((256, 256), dtypes.float16)), opts)[-1]
  a_plan, b_plan = (stage_plan(kernel, load, padding) for load, padding in kernel.staged)
  assert a_plan.axes[-1] == kernel.tc_upcast_axes[2] and a_plan.row == 16 and a_plan.direct
  assert not kernel.is_reduce_axis(b_plan.axes[-1]) and b_plan.row == 128 and b_plan.padding == 8 and b_plan.direct
  loop = (src := compiled_source(kernel))[first_loop(src):]
  assert "(const ushort4*)(data" not in loop and "bits" not in loop.split("mma.sync")[0]   # no register staging
  assert loop.index("async_copy<16>") < loop.index("mma.sync")   # two 8-byte runs per copy, merged
  assert loop.count("*((const ushort4*)(tile") >= 8

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.int8], ids=lambda d: d.name)
def test_low_precision_matmul(dtype: DType):
  compile_all(matmul(host((64, 32), dtype), host((32, 64), dtype)), heuristics=True)

# ---- tensor cores: OptOps.TC turns a half/bfloat16 matmul accumulated in float32 into mma.sync (sm_80+)

MMA = {dtypes.float16: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
       dtypes.bfloat16: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}
TC = Opt(OptOps.TC, 0, 0)

def half_dot(a: LazyBuffer, b: LazyBuffer, cast_first: bool = False) -> LazyBuffer:
  """a @ b as Tensor.dot builds it for half inputs: products in the inputs' dtype cast to float32, then summed (with
  cast_first: products of the float32 casts). a's leading axes are a batch; b is (k, m) or has the same batch."""
  *batch, n, k = a.shape
  m, batch = b.shape[-1], tuple(batch)
  x = a.reshape(batch + (n, k, 1)).expand(batch + (n, k, m))
  y = b.reshape(batch + (1, k, m) if len(b.shape) > 2 else (1,) * len(batch) + (1, k, m)).expand(batch + (n, k, m))
  product = x.cast(dtypes.float32).alu(Ops.MUL, y.cast(dtypes.float32)) if cast_first else \
    x.alu(Ops.MUL, y).cast(dtypes.float32)
  return product.r(Ops.ADD, (len(batch) + 1,)).reshape(batch + (n, m))

TC_SHAPES = [((16, 16), (16, 8)), ((64, 64), (64, 64)), ((48, 32), (32, 80)), ((32, 4096), (4096, 16)),
             ((3, 32, 64), (3, 64, 24)), ((2, 16, 48), (48, 32))]

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("shapes", TC_SHAPES, ids=str)
def test_tensor_core_matmul(dtype: DType, shapes):
  """One warp per 16×8 tile, one mma per 16 of K: the lanes are threadIdx.x (tig, 4) and .y (group, 8)."""
  (kernel,) = kernels(half_dot(host(shapes[0], dtype), host(shapes[1], dtype)), (TC,))
  assert kernel.launch_dims()[1] == (4, 8)
  src = compiled_source(kernel)
  assert src.count(MMA[dtype]) == 1, src
  assert (first_loop(src) >= 0) == (shapes[0][-1] > 16)   # K = 16: no reduce loop is left

TC_LATER_OPTS = [  # (opts after TC, mma instructions in the source)
  ((Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4)), 8),
  ((Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2)), 4),
  ((Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UNROLL, 0, 2)), 2),
  ((Opt(OptOps.PADTO, 0, 3), Opt(OptOps.LOCAL, 0, 3), Opt(OptOps.UPCAST, 1, 2)), 2)]

@pytest.mark.parametrize("opts,mmas", TC_LATER_OPTS, ids=[_opts_id(opts) for opts, _ in TC_LATER_OPTS])
@pytest.mark.parametrize("before", [(), (Opt(OptOps.UPCAST, 1, 2),), (Opt(OptOps.UNROLL, 0, 2),)], ids=_opts_id)
def test_tensor_core_with_other_opts(before, opts, mmas: int):
  """UPCAST multiplies the tiles per warp, UNROLL the K steps per loop iteration, LOCAL the warps per block; the
  lanes stay the innermost 32 threads. UPCAST and UNROLL may also come before TC."""
  (kernel,) = kernels(half_dot(host((128, 64), dtypes.float16), host((64, 128), dtypes.float16)), before + (TC,) + opts)
  mmas *= 2 if before else 1
  assert kernel.launch_dims()[1][:2] == (4, 8)
  assert compiled_source(kernel).count(MMA[dtypes.float16]) == mmas

def test_tensor_core_operand_loads():
  """Products of float32 casts also qualify. A lane reads its K positions of a step at 4·tig + 0..3 (linearizer
  k_order), so a K-contiguous operand is one 8-byte load per fragment row; at an offset of 2 it is 32-bit pair loads."""
  (kernel,) = kernels(half_dot(host((32, 64), dtypes.float16), host((64, 32), dtypes.float16), cast_first=True), (TC,))
  src = compiled_source(kernel)
  assert src.count("const ushort4 vec") == 2, "A is row-major: rows group and group + 8, 4 halves each"
  assert "data2 +" not in src, "B (k, n) is strided along K: its halves are loaded one by one"
  shifted = host((32, 68), dtypes.float16).shrink(((0, 32), (2, 66)))
  (kernel,) = kernels(half_dot(shifted, host((64, 32), dtypes.float16)), (TC,))
  assert compiled_source(kernel).count("*((const unsigned int*)(data1 + ") == 4

def test_tensor_core_heuristics():
  """The GPU heuristics use tensor cores for a half matmul: 8 column tiles per warp spread before TC (so each lane's
  columns are adjacent: vector loads of the row-major B, float4 stores), then 4 row tiles; one warp per block."""
  (kernel,) = kernels(half_dot(host((256, 128), dtypes.float16), host((128, 256), dtypes.float16)).cast(dtypes.float16),
                      heuristics=True)
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 1, 8), TC, Opt(OptOps.UPCAST, 0, 4)]
  assert kernel.launch_dims() == ((4, 4), (4, 8))
  src = compiled_source(kernel)
  assert src.count(MMA[dtypes.float16]) == 32 and src.count("const ushort4 vec") == 16

@pytest.mark.parametrize("case", ["llvm", "sm_75", "float32", "half_accumulator", "rows", "columns", "k", "not_first",
                                  "axis", "amount"])
def test_tensor_core_refusals(case: str):
  """TC raises KernelOptError where it can't apply, and leaves the kernel as it was."""
  a_shape, b_shape, dtype, renderer, opts = (32, 32), (32, 16), dtypes.float16, None, ()
  if case == "llvm": renderer = LLVMRenderer()
  if case == "sm_75": renderer = CUDARenderer(arch="sm_75")
  if case == "float32": dtype = dtypes.float32
  a_shape, b_shape = {"rows": ((40, 32), (32, 24)), "columns": ((32, 32), (32, 12)),
                      "k": ((32, 24), (24, 16))}.get(case, (a_shape, b_shape))
  if case == "not_first": opts = (Opt(OptOps.LOCAL, 0, 2),)
  a, b = host(a_shape, dtype), host(b_shape, dtype)
  out = matmul(a, b) if case == "half_accumulator" else half_dot(a, b)
  (kernel,) = kernels(out, opts, renderer=renderer)
  shape = kernel.full_shape
  tc = {"axis": Opt(OptOps.TC, 2, 0), "amount": Opt(OptOps.TC, 0, 1)}.get(case, TC)
  with pytest.raises(KernelOptError): kernel.apply_opt(tc)
  assert kernel.full_shape == shape and kernel.applied_opts == list(opts) and kernel.tensor_core is None

@pytest.mark.parametrize("opt", [Opt(OptOps.UPCAST, 3, 2), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.GROUP, 0, 2),
                                 Opt(OptOps.NOLOCALS), TC], ids=str)
def test_opts_after_tensor_core_keep_its_axes(opt: Opt):
  """The lanes (axes 2, 3 here) and the fragment axes belong to the tensor core: opts that would move them raise."""
  (kernel,) = kernels(half_dot(host((32, 64), dtypes.float16), host((64, 32), dtypes.float16)), (TC,))
  assert kernel.tc_lane_axes == (2, 3)
  with pytest.raises(KernelOptError): kernel.apply_opt(opt)
  assert kernel.applied_opts == [TC]

@pytest.mark.parametrize("core", TENSOR_CORES, ids=lambda c: c.dtype_in.name)
def test_fragment_layouts_cover_each_tile_once(core):
  """Over the 32 lanes, each operand's fragments hold every element of its tile exactly once, and C's layout is the
  one opts.tensor_core's axes assume (row = 8·(i // 2) + group, column = 2·tig + i % 2)."""
  rows, columns, depth = core.dims
  for layout, shape in ((core.a, (rows, depth)), (core.b, (depth, columns)), (core.c, (rows, columns))):
    seen = [layout.position(i, lane // 4, lane % 4) for lane in range(core.lanes) for i in range(len(layout.rows))]
    assert sorted(seen) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
  for lane in range(core.lanes):
    assert [core.c.position(i, lane // 4, lane % 4) for i in range(4)] == \
      [(lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2) for i in range(4)]

# ---- TF32 tensor cores: a float32 matmul whose inputs are rounded to TF32 in the graph (matmul lowering "tf32") runs
# on mma.sync m16n8k8 .tf32; plain float32 loads never do

MMA_TF32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
H100_SHARED = 227 * 1024   # shared memory per block an H100 kernel may opt in to
[TF32_CORE] = [core for core in TENSOR_CORES if core.tf32]

def tf32_dot(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> LazyBuffer:
  """The matmul lowering "tf32" of zeros of these shapes on the LLVM device (the kernels are only rendered)."""
  from tgrad import Tensor
  from tgrad.regions import LOWERINGS
  a, b = (Tensor(np.zeros(shape, np.float32)) for shape in (a_shape, b_shape))
  return LOWERINGS["matmul"]["tf32"].build(a, b).lazydata

def compiled_for(kernel: Kernel, arch: str) -> str:
  """The kernel's source (rendered for sm_90), compiled for `arch`: for an older GPU without the sm_90-only
  dependent-launch prologue."""
  from tgrad.runtime.cuda.renderer import DEPENDENT_LAUNCH_MIN_SM, sm_number
  with Context(PDL=int(sm_number(arch) >= DEPENDENT_LAUNCH_MIN_SM)):
    src = kernel.renderer.render("test_kernel", linearize(kernel))
  assert compile_cuda(src, arch)[:4] == b"\x7fELF"
  return src

def test_tf32_fragment_layouts_are_the_ptx_ones():
  """PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32: a0..a3 at (group, tig), (group + 8, tig), (group, tig + 4),
  (group + 8, tig + 4); b0, b1 at (tig, group), (tig + 4, group)."""
  assert TF32_CORE.dims == (16, 8, 8) and TF32_CORE.instruction == MMA_TF32 and TF32_CORE.dtype_in == dtypes.float32
  for lane in range(TF32_CORE.lanes):
    group, tig = lane // 4, lane % 4
    assert [TF32_CORE.a.position(i, group, tig) for i in range(4)] == \
      [(group, tig), (group + 8, tig), (group, tig + 4), (group + 8, tig + 4)]
    assert [TF32_CORE.b.position(i, group, tig) for i in range(2)] == [(tig, group), (tig + 4, group)]

TF32_SHAPES = [((16, 8), (8, 8)), ((64, 64), (64, 64)), ((128, 40), (40, 96)), ((3, 32, 64), (3, 64, 24)),
               ((2, 16, 48), (48, 32))]

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("shapes", TF32_SHAPES, ids=str)
def test_tf32_tensor_core_matmul(shapes, arch: str):
  """One warp per 16×8 tile, one m16n8k8 per 8 of K; each fragment element is its loaded float rounded to TF32 and
  passed as its bits."""
  (kernel,) = kernels(tf32_dot(*shapes), (TC,), renderer=CUDARenderer(arch))
  assert kernel.tensor_core is not None and kernel.tensor_core.core is TF32_CORE
  assert kernel.launch_dims()[1] == (4, 8)
  src = compiled_for(kernel, arch)
  assert src.count(MMA_TF32) == 1 and "m16n8k16" not in src
  assert src.count("__float_as_uint(") == 6, "4 A and 2 B registers"
  assert src.count("& 4294959104u") == 6, "each fragment element rounded once"
  assert (first_loop(src) >= 0) == (shapes[0][-1] > 8)   # K = 8: no reduce loop is left

def test_tf32_tensor_core_heuristics():
  """The GPU heuristics treat a TF32-rounded matmul as a half one: column tiles spread before TC, 4 row tiles; a big
  output stages both inputs in shared memory (fragments read from the tiles, as TF32 has no ldmatrix form)."""
  (kernel,) = kernels(tf32_dot((256, 128), (128, 256)), heuristics=True)
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 1, 8), TC, Opt(OptOps.UPCAST, 0, 4)]
  assert compiled_for(kernel, "sm_80").count(MMA_TF32) == 32
  (big,) = kernels(tf32_dot((2048, 64), (64, 2048)), heuristics=True)
  assert big.applied_opts[0] == TC and Opt(OptOps.SMEM, 0, 8) in big.applied_opts
  src = compiled_for(big, "sm_90")
  assert "async_copy<16>" in src and "ldmatrix" not in src and src.count(MMA_TF32) == 64
  # an H100's shared memory (227 KiB per block, opted in): K unrolled by 4, 74 KiB of float32 tiles, dynamic
  h100 = CUDARenderer(shared_memory_bytes=H100_SHARED)
  (big,) = kernels(tf32_dot((2048, 64), (64, 2048)), heuristics=True, renderer=h100)
  assert Opt(OptOps.UNROLL, 0, 4) in big.applied_opts and "dynamic_shared" in compiled_for(big, "sm_90")

STAGED_TF32_OPTS = [(Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.LOCAL, 1, 2),
                     Opt(OptOps.SMEM, 1, 0), Opt(OptOps.SMEM, 0, 0)),
                    (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 2),
                     Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.SMEM, 0, 8),
                     Opt(OptOps.SMEM, 1, 8))]

@pytest.mark.parametrize("opts", STAGED_TF32_OPTS, ids=_opts_id)
def test_tf32_tensor_core_with_staged_tiles(opts):
  (kernel,) = kernels(tf32_dot((128, 64), (64, 128)), (TC,) + opts)
  src = compiled_for(kernel, "sm_80")
  assert "__shared__" in src and src.count(MMA_TF32) > 1 and "ldmatrix" not in src

def test_default_float32_matmul_never_uses_a_tensor_core():
  """Plain float32 loads (the default matmul) don't qualify for the TF32 core: TC refuses, the heuristics keep FMA."""
  (kernel,) = kernels(matmul(host((64, 64)), host((64, 64))))
  with pytest.raises(KernelOptError, match="float32, float32"): kernel.apply_opt(TC)
  (kernel,) = kernels(matmul(host((256, 128)), host((128, 256))), heuristics=True)
  assert kernel.tensor_core is None and "mma" not in compiled_source(kernel)

def _rounded_dot(a_mask: Optional[int]) -> LazyBuffer:
  """a' @ b' of zeros (32×32 by 32×16) with b' = b rounded to TF32 and a' = a rounded as round_to_tf32 does but with
  `a_mask` (TF32's when 0xFFFFE000; None: a as it is)."""
  from tgrad import Tensor
  from tgrad.tensor_ops.composite import round_to_tf32
  a, b = Tensor(np.zeros((32, 32), np.float32)), round_to_tf32(Tensor(np.zeros((32, 16), np.float32)))
  if a_mask is not None:   # literal constants, as round_to_tf32's (Python scalars would be kernel parameters)
    bits = a.bitcast(dtypes.uint32)
    a = (a != a).where(a, ((bits + bits.const_like(0x1000)) & bits.const_like(a_mask)).bitcast(dtypes.float32))
  return (a.reshape(32, 32, 1) * b.reshape(1, 32, 16)).sum(1).lazydata

def test_tf32_operands_must_be_rounded_as_round_to_tf32_does():
  (kernel,) = kernels(_rounded_dot(0xFFFFE000), (TC,))   # the same graph by hand: the TF32 core
  assert kernel.tensor_core is not None and kernel.tensor_core.core.tf32

TF32_REFUSALS = {"other_mask": "not a sum of products", "one_plain": "multiplies \\(float32, float32 rounded to TF32",
                 "k": "0 \\(rows, columns, K\\) choices", "sm_75": "has no tensor core"}

@pytest.mark.parametrize("case", list(TF32_REFUSALS))
def test_tf32_tensor_core_refusals(case: str):
  """TC on the TF32 core needs both operands rounded exactly as round_to_tf32 does, K a multiple of 8, and sm_80+."""
  out = {"other_mask": lambda: _rounded_dot(0xFFFF0000), "one_plain": lambda: _rounded_dot(None),
         "k": lambda: tf32_dot((32, 36), (36, 16)), "sm_75": lambda: tf32_dot((32, 32), (32, 16))}[case]()
  (kernel,) = kernels(out, renderer=CUDARenderer("sm_75" if case == "sm_75" else "sm_90"))
  with pytest.raises(KernelOptError, match=TF32_REFUSALS[case]): kernel.apply_opt(TC)
  assert kernel.tensor_core is None and kernel.applied_opts == []

# ---- masks, offsets, ARANGE

def test_padded_loads_are_masked():
  (src,) = compile_all(host((30, 32)).pad(((1, 1), (0, 0))).alu(Ops.EXP2), heuristics=True)
  assert re.search(r"\? \*\(\(const float4\*\)", src), f"a masked float4 load: valid ? load : 0\n{src}"

def test_unaligned_loads_stay_scalar():
  """A shrink by 1 element: the load index is i+1, never a multiple of 4, so no vector load; the store still is."""
  (src,) = compile_all(host((65,)).shrink(((1, 65),)).alu(Ops.EXP2), heuristics=True)
  assert "const float4" not in src and "make_float4" in src

def test_arange_and_masked_arange():
  counter = LazyBuffer.loadop(Ops.ARANGE, (256,), dtypes.int32, "LLVM")
  compile_all(counter.cast(dtypes.float32).alu(Ops.MUL, host((256,)).const(2.0)), heuristics=True)
  compile_all(counter.pad(((3, 5),)).alu(Ops.ADD, LazyBuffer.const_of(1, dtypes.int32, "LLVM", (264,))))

# ---- launch limits

def test_fold_dims_respects_every_limit():
  grid = CUDA_MAX_GRID
  assert fold_dims((4, 70000), grid) == [(70000,), (4,)]
  assert fold_dims((70000, 4), grid) == [(70000, 4)]                # y can't hold 70000: everything on x
  assert fold_dims((3, 70000, 5), grid) == [(70000, 5), (3,)]         # folding the inner dims is what fits
  assert fold_dims((2, 3, 5, 7), grid) == [(7,), (5,), (2, 3)]       # leading dims fold onto z
  assert fold_dims((64, 64, 64), CUDA_MAX_BLOCK) == [(64,), (64,), (64,)]
  with pytest.raises(KernelOptError): fold_dims((2**31, 2), grid)

@pytest.mark.parametrize("shape", [(70000, 4), (3, 70000, 2), (2, 3, 5, 7)], ids=str)
def test_launch_dims_fit_the_grid(shape):
  (kernel,) = kernels(host(shape).alu(Ops.EXP2))
  global_size, local_size = kernel.launch_dims()
  assert len(global_size) <= 3 and all(g <= limit for g, limit in zip(global_size, CUDA_MAX_GRID))
  assert np.prod(global_size) == np.prod(shape)
  src = compiled_source(kernel)
  specials = {m for m in re.findall(r"const int (gidx\d) = blockIdx\.([xyz])", src)}
  assert len(specials) == len(global_size)

def test_renderer_limits_refuse_opts():
  small = CUDARenderer(max_local_size=64, shared_memory_bytes=1024)
  (kernel,) = kernels(host((64, 1024)).r(Ops.ADD, (1,)), renderer=small)
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.GROUP, 0, 128))     # 128 threads > 64
  kernel.apply_opt(Opt(OptOps.GROUP, 0, 64))
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.UPCAST, 0, 8))     # 8·64·4 bytes shared > 1024
  assert kernel.applied_opts == [Opt(OptOps.GROUP, 0, 64)]

# ---- rendering details

def test_special_constants():
  assert render_const(float("nan"), dtypes.float32) == "__int_as_float(0x7FC00000)"
  assert render_const(float("-inf"), dtypes.float32) == "__uint_as_float(0xFF800000u)"
  assert render_const(-0.0, dtypes.float32) == "(-0.0f)"
  assert render_const(0.1, dtypes.float64) == "0.1"
  assert render_const(-2**31, dtypes.int32) == "(-2147483647-1)"
  assert render_const(2**64 - 1, dtypes.uint64) == "18446744073709551615ull"

def test_alu_ops_of_constants_are_folded():
  """NVRTC treats `0.0f / 0.0f` as undefined: it folded `(-(0.0f / 0.0f)) != (-(0.0f / 0.0f))` to false, so an
  argmin over the NaN mean of an empty axis answered 1 on an H100 (fuzz_ops seed 0 case 1302). The linearizer folds
  every ALU op of constants with exec_alu, and NaN is rendered by its bits."""
  zero = LazyBuffer.const_of(0.0, dtypes.float32, "LLVM", (16,))
  minus_nan = zero.alu(Ops.FDIV, zero).alu(Ops.NEG)
  data = host((16,))
  out = minus_nan.alu(Ops.CMPNE, data).alu(Ops.OR, minus_nan.alu(Ops.CMPNE, minus_nan))
  (kernel,) = kernels(out, heuristics=True)
  program = linearize(kernel)
  assert not [u for u in program if u.op in ALU and u.src and all(s.op is Ops.CONST for s in u.src)]
  src = compiled_source(kernel)
  assert "0.0f / 0.0f" not in src and "__int_as_float(0x7FC00000)" in src

def test_signed_index_math_is_plain_but_data_math_wraps():
  """Index math is bounded by the range analysis, so it is plain C; int32 data may overflow, so it is computed in
  unsigned arithmetic (signed overflow is undefined in C++, two's complement wrap-around in tgrad)."""
  (src,) = compile_all(host((64,), dtypes.int32).alu(Ops.ADD, host((64,), dtypes.int32)))
  assert "(unsigned int)" in src and re.search(r"int alu\d+ = \(gidx0 \* 64\)|lidx0|gidx0", src)

def test_launch_bounds_is_the_block_size():
  transposed = host((64, 32)).permute((1, 0)).alu(Ops.EXP2)   # a transpose keeps both axes
  (kernel,) = kernels(transposed, (Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.LOCAL, 0, 4)))
  assert kernel.launch_dims()[1] == (4, 16)   # the last local axis applied (from axis 0) is threadIdx.x
  assert "__launch_bounds__(64)" in compiled_source(kernel)

def test_compile_error_shows_numbered_source_and_log():
  with pytest.raises(CompileError) as error: compile_cuda('extern "C" __global__ void k() {\n  undefined_name;\n}')
  assert "   2 |   undefined_name;" in str(error.value) and "undefined" in str(error.value)

def test_compiler_cache_key_names_version_arch_and_flags():
  key = NVRTCCompiler("sm_80").cache_key
  assert key.startswith("nvrtc-") and "sm_80" in key and "--std=c++17" in key

def test_every_linear_op_is_rendered():
  """The ops a linear program can hold (linearizer.py) all have a rendering; an unknown one raises."""
  u = UOp(Ops.CONTIGUOUS, dtypes.float32, (UOp.const(dtypes.float32, 1.0),))   # a lazy-graph op, never linear
  with pytest.raises(NotImplementedError): CUDARenderer().render("k", [u])
