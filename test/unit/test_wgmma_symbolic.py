"""OptOps.WGMMA for a prefill's projections (codegen/warpgroup_mma.py, runtime/cuda/wgmma.py) without a GPU: a symbolic
row count M (the prompt length: one compiled kernel for every length, its grid from the variable, rows past it read
as zeros and not stored), A read in K segments (attention's heads laid out [H, T, D], read as a T×(H·D) matrix: the
segment stride is T·D, symbolic too) and a float32 output (the sums stored unrounded, as a norm after the projection
reads them). Which kernels qualify, what the heuristics pick, that the rendered sources compile with NVRTC for sm_90a,
and that one rendered source run on the CPU emulator (test/cuda_on_cpu.py) at many values of M equals numpy, every
row past M left as it was."""
import numpy as np
import pytest
from tgrad import Tensor, Variable, dtypes
from tgrad.helpers import Context
from tgrad.schedule import create_schedule
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.warpgroup_mma import WGMMA_TILES, matmul_of
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.cuda import wgmma
from tgrad.shape.sint import evaluate

HOPPER = "sm_90a"
BOUND = 520          # the prompt length's maximum: the rows the buffers hold
POISON = np.nan
NORM_EPS = 1e-6

def data(*shape, dtype=dtypes.float16, seed=0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device="LLVM").cast(dtype) \
    .realize()

def last_kernel(out: Tensor) -> Kernel:
  """The schedule's matmul kernel (the one kernel of two output axes and a reduce)."""
  kernels = [Kernel(item.ast, CUDARenderer(HOPPER)) for item in create_schedule([out.lazydata])]
  (matmul,) = [k for k in kernels if len(k.full_shape) == 3 and k.reduceops]
  return matmul

def rows() -> Variable: return Variable("prompt_len", 1, BOUND)

def projection(n: int, k: int, float_out: bool = False, seed: int = 0) -> Tensor:
  """y = x[:T] · wᵀ, T the prompt length (bound at 1 to build the graph); with float_out y is normed in float32 after
  it (as Gemma's post-norms do), which has the matmul store its float32 sums."""
  x, w = data(BOUND, k, seed=seed), data(n, k, seed=seed + 1)
  y = x[:rows().bind(1)] @ w.T
  return y.float().rms_norm(-1, NORM_EPS) if float_out else y

def heads_projection(heads: int, head_dim: int, n: int) -> Tensor:
  """o = attn · woᵀ in float32 with attn [heads, T, head_dim] computed in the schedule (a buffer of T rows per head,
  so a head starts T·head_dim elements after the one before), read as T×(heads·head_dim)."""
  t = rows().bind(1)
  attn = (data(heads, BOUND, head_dim)[:, :t, :] * 1.5).contiguous()
  o = attn.permute(1, 0, 2).reshape(t, heads * head_dim) @ data(n, heads * head_dim, seed=1).T
  return o.float().rms_norm(-1, NORM_EPS)

def test_prefill_projections_qualify_with_a_symbolic_m():
  qkv = matmul_of(last_kernel(projection(1536, 640)).state)
  assert not isinstance(qkv, str), qkv
  assert (qkv.n, qkv.k, qkv.out_dtype, qkv.variables, qkv.a_segment) == (1536, 640, None, ("prompt_len",), 0)
  assert qkv.m.vmax == BOUND
  down = matmul_of(last_kernel(projection(640, 2048, float_out=True)).state)
  assert not isinstance(down, str) and down.out_dtype == dtypes.float32 and down.a_row_stride == 0
  o_proj = matmul_of(last_kernel(heads_projection(4, 256, 640)).state)
  assert not isinstance(o_proj, str), o_proj
  assert (o_proj.a_row_stride, o_proj.a_segment, o_proj.out_dtype) == (256, 256, dtypes.float32)
  assert evaluate(o_proj.a_segment_stride, {"prompt_len": 37}) == 37 * 256

def test_heuristics_pick_a_cp_async_tile_and_tma_tiles_are_refused():
  for out in (projection(1536, 640), projection(640, 2048, float_out=True), heads_projection(4, 256, 640)):
    kernel = last_kernel(out)
    hand_coded_optimizations(kernel)
    assert [o.op for o in kernel.applied_opts] == [OptOps.WGMMA], kernel.applied_opts
    assert not kernel.warpgroup_matmul.tma   # the tensor maps are made per buffer: a known M only
    grid, _ = kernel.launch_dims()
    assert evaluate(grid[1], {"prompt_len": 65}) == -(-65 // kernel.warpgroup_matmul.block_m)
    tma = last_kernel(out)
    with pytest.raises(KernelOptError, match="TMA"):
      tma.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((1, 64, 8, True))))
    with Context(WGMMA=0):
      off = last_kernel(out)
      hand_coded_optimizations(off)
      assert OptOps.WGMMA not in [o.op for o in off.applied_opts]

def test_small_symbolic_matmuls_are_left_to_mma_sync():
  x, w = data(64, 128), data(64, 128, seed=1)
  kernel = last_kernel(x[:Variable("t", 1, 64).bind(1)] @ w.T)   # at most 64·64·128 multiply-adds
  hand_coded_optimizations(kernel)
  assert OptOps.WGMMA not in [o.op for o in kernel.applied_opts]

def test_rendered_prefill_kernels_compile_for_sm_90a():
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  for out in (projection(1536, 640), projection(640, 2048, float_out=True), heads_projection(4, 256, 640)):
    kernel = last_kernel(out)
    hand_coded_optimizations(kernel)
    src, _ = render_source(kernel)
    assert "long long prompt_len_arg" in src and "< rows" in src
    assert len(nvrtc.compile_cuda(src, HOPPER)) > 1000

def _bits(x: np.ndarray) -> np.ndarray: return x.astype(np.float16).view(np.uint16)

# (each case compiles its kernel once with g++ and runs it at every M of M_VALUES)
M_VALUES = (1, 7, 63, 64, 65, 200, 512)

def _run(kernel: Kernel, arrays: dict, m: int) -> None:
  from cuda_on_cpu import run_on_cpu
  src, _ = render_source(kernel)
  global_size, local_size = kernel.launch_dims()
  grid = tuple(evaluate(g, {"prompt_len": m}) for g in global_size)
  run_on_cpu(src, kernel.function_name, grid, local_size, [arrays[r] for r in kernel.warpgroup_matmul.arguments], [m])

def test_symbolic_m_on_the_cpu_matches_numpy_at_every_length():
  """A half projection (N and K not multiples of the tile), one source for every M: rows < M are numpy's product,
  the rest of the output untouched."""
  from cuda_on_cpu import cpu_available
  if not cpu_available(): pytest.skip("no g++")
  n, k = 136, 200
  kernel = last_kernel(projection(n, k))
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((1, 64, 4, False))))
  x = np.random.default_rng(3).standard_normal((BOUND, k)).astype(np.float16)
  w = np.random.default_rng(4).standard_normal((n, k)).astype(np.float16)
  for m in M_VALUES:
    x_m = x.copy()
    x_m[m:] = np.nan   # rows past M are never read
    out = np.full(BOUND * n, 0x7E00, np.uint16)   # NaN bits
    _run(kernel, {"out": out, "a": _bits(x_m), "b": _bits(w)}, m)
    got = out.view(np.float16).reshape(BOUND, n).astype(np.float64)
    np.testing.assert_allclose(got[:m], x[:m].astype(np.float64) @ w.T.astype(np.float64), rtol=2 ** -10, atol=1e-2,
                               err_msg=f"M={m}")
    assert np.isnan(got[m:]).all(), f"M={m}: rows past M were written"

def test_heads_layout_and_float32_output_on_the_cpu_match_numpy():
  """o = attn · woᵀ with attn [2 heads, M, 128] (a head M·128 elements after the other) into float32, two
  warpgroups per block, at every M: the float32 sums of numpy's product."""
  from cuda_on_cpu import cpu_available
  if not cpu_available(): pytest.skip("no g++")
  heads, head_dim, n = 2, 128, 128
  kernel = last_kernel(heads_projection(heads, head_dim, n))
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((2, 128, 5, False))))
  use = kernel.warpgroup_matmul
  assert use.a_segment == head_dim and use.out_dtype == dtypes.float32
  rng = np.random.default_rng(5)
  w = rng.standard_normal((n, heads * head_dim)).astype(np.float16)
  for m in M_VALUES:
    attn = rng.standard_normal((heads, m, head_dim)).astype(np.float16)
    buffer = np.full(heads * BOUND * head_dim, np.nan, np.float16)   # the buffer holds T = M rows per head
    buffer[:attn.size] = attn.reshape(-1)
    out = np.full(BOUND * n, POISON, np.float32)
    _run(kernel, {"out": out, "a": buffer.view(np.uint16), "b": _bits(w)}, m)
    a = attn.transpose(1, 0, 2).reshape(m, heads * head_dim).astype(np.float64)
    got = out.reshape(BOUND, n)
    np.testing.assert_allclose(got[:m], a @ w.T.astype(np.float64), rtol=1e-5, atol=1e-3, err_msg=f"M={m}")
    assert np.isnan(got[m:]).all(), f"M={m}: rows past M were written"

def test_emulated_blocks_with_zero_filled_rows_match_numpy():
  """wgmma.emulate_block (the kernel's index formulas with ints) over the rows of an M the tile does not divide."""
  m, n, k = 65, 64, 128
  config = wgmma.WgmmaConfig(1, 64, 4)
  a, b = (np.random.default_rng(s).standard_normal(shape).astype(np.float16) for s, shape in ((6, (m, k)), (7, (n, k))))
  out = np.concatenate([wgmma.emulate_block(config, _bits(a), _bits(b), dtypes.float16, r) for r in (0, 64)])
  np.testing.assert_allclose(out, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-4, atol=1e-3)
