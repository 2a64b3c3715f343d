"""Matrix–vector products (tgrad/codegen/matvec_rules.py `matvec_layout` and the GPU matvec rules).

Without a GPU: the layout detection; the opts the heuristics choose for gemma-3-270m's decode shapes on the CUDA
renderer, rendered and compiled with NVRTC, and that W is read with 16-byte loads (float4, 8 halves as a uint4); the
same opts' UPCAST/UNROLL part on LLVM against numpy for regular and odd sizes. With a GPU (marked `gpu`): the kernels
the heuristics build, on poisoned outputs, against numpy for odd K and N, M = 1 and M = 3, float32 and float16.
"""
import math, re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.matvec_rules import matvec_layout
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.device import Buffer, Device
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, UOp
from tgrad.realize import compile_kernel
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.schedule import create_schedule

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
ARCH = "sm_90"
FLOAT32_RTOL = 1e-4
HALF_RTOL = 4 * 2.0 ** -11   # 4 unit roundoffs: each product and the output are rounded to half

def matvec_ast(m: int, n: int, k: int, layout: str, dtype: DType) -> UOp:
  """The one kernel of y = x·Wᵀ (layout "nk": W[N, K], as gemma3's Linear) or y = x·W ("kn": W[K, N])."""
  x = Tensor.empty(m, k, dtype=dtype, device="LLVM")
  w = Tensor.empty(*((n, k) if layout == "nk" else (k, n)), dtype=dtype, device="LLVM")
  out = x @ w.T if layout == "nk" else x @ w
  (item,) = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  assert [b.size for b in item.inputs] == [x.numel(), w.numel()] and m != n   # parameters: y, x, W
  return item.ast

def heuristic_kernel(ast: UOp, renderer) -> Kernel:
  kernel = Kernel(ast, renderer)
  hand_coded_optimizations(kernel)
  return kernel

def opts_of(*spec) -> list[Opt]: return [Opt(OptOps[op], axis, amount) for op, axis, amount in spec]

# ---- layout detection

@pytest.mark.parametrize("m,n,k,layout,expected", [
  (1, 2048, 640, "nk", (0, 1, (), True)), (1, 640, 2048, "kn", (0, 1, (), False)),
  (4, 2048, 640, "nk", (1, 2, (0,), True)), (3, 100, 64, "kn", (1, 2, (0,), False))])
def test_matvec_layout(m, n, k, layout, expected):
  found = matvec_layout(Kernel(matvec_ast(m, n, k, layout, dtypes.float32), CUDARenderer()))
  assert found is not None
  assert (found.n_axis, found.k_axis, found.m_axes, found.k_contiguous) == expected

def test_matvec_layout_refuses_other_reduces():
  renderer = CUDARenderer()
  assert matvec_layout(Kernel(matvec_ast(16, 256, 64, "nk", dtypes.float32), renderer)) is None   # M > 8: a matmul
  row_sums = Tensor.empty(512, 640, device="LLVM").sum(axis=1)                                   # one input only
  (item,) = [i for i in create_schedule([row_sums.lazydata]) if i.ast.op is Ops.SINK]
  assert matvec_layout(Kernel(item.ast, renderer)) is None
  kernel = Kernel(matvec_ast(1, 256, 64, "nk", dtypes.float32), renderer)
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  assert matvec_layout(kernel) is None   # only fresh kernels: the heuristics never stack on other opts

# ---- the chosen opts on the CUDA renderer, compiled, with vector loads of W

HEAD, GATE, DOWN = (262144, 640), (2048, 640), (640, 2048)
ROWS_F32 = opts_of(("UNROLL", 0, 4), ("GROUP", 0, 80), ("UNROLL", 1, 2), ("LOCAL", 0, 4))
ROWS_F16 = opts_of(("UNROLL", 0, 8), ("GROUP", 0, 40), ("UNROLL", 1, 2), ("LOCAL", 0, 4))
CHOICES = [
  (HEAD, "nk", dtypes.float32, ROWS_F32, 2), (HEAD, "nk", dtypes.float16, ROWS_F16, 2),
  (GATE, "nk", dtypes.float32, ROWS_F32, 2), (GATE, "nk", dtypes.float16, ROWS_F16, 2),
  (DOWN, "nk", dtypes.float32, opts_of(("UNROLL", 0, 4), ("GROUP", 0, 128), ("UNROLL", 1, 4), ("LOCAL", 0, 2)), 4),
  (DOWN, "nk", dtypes.float16, opts_of(("UNROLL", 0, 8), ("GROUP", 0, 128), ("UNROLL", 1, 2), ("LOCAL", 0, 2)), 2),
  # few columns: 2 per thread (more threads beat wider loads there), so W's loads stay scalar
  (GATE, "kn", dtypes.float32, opts_of(("UPCAST", 0, 2), ("LOCAL", 0, 8), ("GROUPTOP", 0, 32), ("UNROLL", 1, 4)), 0),
  (GATE, "kn", dtypes.float16, opts_of(("UPCAST", 0, 2), ("LOCAL", 0, 8), ("GROUPTOP", 0, 32), ("UNROLL", 1, 4)), 0),
  (DOWN, "kn", dtypes.float32, opts_of(("UPCAST", 0, 2), ("LOCAL", 0, 8), ("GROUPTOP", 0, 64), ("UNROLL", 1, 4)), 0),
  # many columns: 16-byte vectors along N
  ((16384, 640), "kn", dtypes.float32,
   opts_of(("UPCAST", 0, 4), ("LOCAL", 0, 8), ("GROUPTOP", 0, 32), ("UNROLL", 1, 4)), 4),
  ((16384, 640), "kn", dtypes.float16,
   opts_of(("UPCAST", 0, 8), ("LOCAL", 0, 8), ("GROUPTOP", 0, 32), ("UNROLL", 1, 4)), 4)]
VECTOR_OF = {dtypes.float32: "float4", dtypes.float16: "uint4"}   # 16 bytes either way

def weight_loads(src: str, dtype: DType) -> tuple[int, int]:
  """(16-byte vector loads, scalar loads) of W (data2) in a kernel's source."""
  return len(re.findall(rf"\(const {VECTOR_OF[dtype]}\*\)\(data2 ", src)), len(re.findall(r"data2\[", src))

@needs_nvrtc
@pytest.mark.parametrize("shape,layout,dtype,expected,vectors", CHOICES,
                         ids=lambda x: getattr(x, "name", None) or (str(x) if isinstance(x, (tuple, str)) else None))
def test_heuristic_opts_compile_and_vectorize(shape, layout, dtype, expected, vectors):
  kernel = heuristic_kernel(matvec_ast(1, *shape, layout, dtype), CUDARenderer())
  assert kernel.applied_opts == expected
  src = kernel.renderer.render("matvec", linearize(kernel))
  assert compile_cuda(src, ARCH)[:4] == b"\x7fELF"
  vector_loads, scalar_loads = weight_loads(src, dtype)
  assert vector_loads == vectors, src
  if vectors: assert scalar_loads == 0, "every load of W is a 16-byte vector"

@needs_nvrtc
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_small_m_shares_each_weight_load(dtype):
  """M = 4 rows of x: each thread reads W once (8 halves in one 16-byte load) for all four outputs."""
  kernel = heuristic_kernel(matvec_ast(4, 2048, 640, "nk", dtype), CUDARenderer())
  assert kernel.applied_opts[0] == Opt(OptOps.UPCAST, 0, 0)
  src = kernel.renderer.render("matvec", linearize(kernel))
  compile_cuda(src, ARCH)
  assert len(re.findall(r"\(const uint4\*\)\(data2 ", src)) == 2 and "data2[" not in src
  assert src.count("data0[") == 4, "one store per row of x"

@needs_nvrtc
def test_masked_wide_loads_compile():
  """Rows padded to a multiple of the block (PADTO): the 8-half loads of a padded row read zeros."""
  kernel = Kernel(matvec_ast(1, 1001, 640, "nk", dtypes.float16), CUDARenderer())
  for opt in [Opt(OptOps.PADTO, 0, 4)] + ROWS_F16: kernel.apply_opt(opt)
  src = kernel.renderer.render("matvec", linearize(kernel))
  compile_cuda(src, ARCH)
  assert "make_uint4(0, 0, 0, 0)" in src and weight_loads(src, dtypes.float16) == (2, 0)

# ---- numbers: the opts' UPCAST/UNROLL part on the CPU, the full kernels on a GPU

ODD_CASES = [(1, 2048, 640, "nk", dtypes.float32), (1, 640, 2048, "kn", dtypes.float32),
             (1, 37, 333, "nk", dtypes.float32), (1, 333, 1001, "kn", dtypes.float32),
             (3, 130, 96, "nk", dtypes.float16), (3, 96, 130, "kn", dtypes.float16),
             (1, 257, 520, "nk", dtypes.float16), (2, 520, 257, "kn", dtypes.float32)]

def random_problem(m: int, n: int, k: int, layout: str, dtype: DType, seed: int):
  """x ~ N(0, 1), W ~ N(0, 1/K) in the dtype; the float64 reference from their exact values and its tolerance."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, k), dtype=np.float32).astype(dtype.np)
  w = (rng.standard_normal((n, k) if layout == "nk" else (k, n), dtype=np.float32) / math.sqrt(k)).astype(dtype.np)
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  ref = (x64 @ (w64.T if layout == "nk" else w64)).reshape(-1)
  rtol = FLOAT32_RTOL if dtype == dtypes.float32 else HALF_RTOL
  typical = math.sqrt(k) * np.sqrt(np.mean(x64 ** 2)) * np.sqrt(np.mean(w64 ** 2))
  return x, w, ref, rtol * (np.abs(ref) + typical)

def run_kernel(device: str, kernel: Kernel, x: np.ndarray, w: np.ndarray, outputs: int) -> np.ndarray:
  """Compile and run on fresh buffers, the output poisoned with NaN (an unwritten element fails)."""
  dtype = kernel.memops[0].src[2].dtype
  runner = compile_kernel(device, kernel)
  buffers = [Buffer(device, outputs, dtype).copyin(np.full(outputs, np.nan, dtype.np)),
             Buffer(device, x.size, dtype).copyin(x), Buffer(device, w.size, dtype).copyin(w)]
  runner(buffers)
  return buffers[0].copyout().astype(np.float64)

@pytest.mark.parametrize("m,n,k,layout,dtype", ODD_CASES, ids=str)
def test_cpu_runs_the_upcasts_and_unrolls(m, n, k, layout, dtype):
  """On LLVM (no threads on a block, no shared memory) the GPU choice's UPCAST and UNROLL opts that apply, in order."""
  ast = matvec_ast(m, n, k, layout, dtype)
  kernel = Kernel(ast, Device["LLVM"].renderer)
  applied = 0
  for opt in heuristic_kernel(ast, CUDARenderer()).applied_opts:
    if opt.op not in (OptOps.UPCAST, OptOps.UNROLL): continue
    try:
      kernel.apply_opt(opt)
      applied += 1
    except KernelOptError: pass
  if n % 2 == 0 and k % 2 == 0: assert applied, "even sizes get vector upcasts or unrolls"
  x, w, ref, tol = random_problem(m, n, k, layout, dtype, seed=n * k)
  out = run_kernel("LLVM", kernel, x, w, m * n)
  assert np.all(np.abs(out - ref) <= tol), f"max err/tol {np.max(np.abs(out - ref) / tol)}"

@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,layout,dtype", ODD_CASES + [(1, 262144, 640, "nk", dtypes.float16)], ids=str)
def test_gpu_matvec_matches_numpy(m, n, k, layout, dtype):
  kernel = heuristic_kernel(matvec_ast(m, n, k, layout, dtype), Device["CUDA"].renderer)
  assert kernel.group_for_reduces == 1, "K is split across threads"
  x, w, ref, tol = random_problem(m, n, k, layout, dtype, seed=n + k)
  out = run_kernel("CUDA", kernel, x, w, m * n)
  assert np.all(np.abs(out - ref) <= tol), f"max err/tol {np.max(np.abs(out - ref) / tol)}"
