"""OptOps.WGMMA (codegen/warpgroup_mma.py) without a GPU: which kernels qualify, what the heuristics and BEAM's
actions do with it, that the source it renders compiles with NVRTC for sm_90a with its parameters in the kernel's
order, that the CPU emulation of the kernel it picks (runtime/cuda/wgmma.py) computes the matmul numpy does, and that
the C source it renders, run on the CPU (test/cuda_on_cpu.py with stand-ins for its PTX), does too.
The GPU run (tgrad's realize against numpy, every tile) is test/test_wgmma_gpu.py."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.helpers import Context
from tgrad.schedule import create_schedule
from tgrad.codegen.axes import WarpgroupMatmul
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.search import ACTIONS
from tgrad.codegen.warpgroup_mma import WGMMA_TILES, default_tile, matmul_of
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.renderer import CUDARenderer

RNG = np.random.default_rng(31)
HOPPER = "sm_90a"

def data(*shape, dtype=dtypes.float16, seed=0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device="LLVM").cast(dtype) \
    .realize()

def last_kernel(out: Tensor, arch: str = HOPPER) -> Kernel:
  return Kernel(create_schedule([out.lazydata])[-1].ast, CUDARenderer(arch))

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_plain_matmuls_qualify_with_either_b_layout(dtype):
  a, b, w = data(512, 640, dtype=dtype), data(640, 2048, dtype=dtype, seed=1), data(2048, 640, dtype=dtype, seed=2)
  for out, n_major in ((a @ b, True), (a @ w.T, False)):
    use = matmul_of(last_kernel(out).state)
    assert isinstance(use, WarpgroupMatmul), use
    assert (use.m, use.n, use.k, use.dtype, use.b_n_major, use.arguments) == (512, 2048, 640, dtype, n_major,
                                                                             ("out", "a", "b"))

@pytest.mark.parametrize("build,why", [
  (lambda: (data(256, 128) @ data(128, 256, seed=1)).relu(), "no epilogue"),                # an epilogue
  (lambda: data(256, 128, dtype=dtypes.float64) @ data(128, 256, dtype=dtypes.float64), "products"),
  (lambda: data(4, 64, 32) @ data(4, 32, 64, seed=1), "output axes"),                         # batched
  (lambda: data(128, 256).T @ data(128, 64, seed=1), "contiguous"),                           # a stored K×M
  (lambda: data(64, 36) @ data(36, 64, seed=1), "multiples of 8"),                            # K not 16-byte rows
], ids=["epilogue", "float64", "batched", "a_transposed", "odd_k"])
def test_other_kernels_are_refused_with_a_reason(build, why):
  kernel = last_kernel(build())
  assert why in matmul_of(kernel.state)
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.WGMMA, 0, 0))

def test_only_sm_90a_has_it():
  for arch in ("sm_90", "sm_80", "sm_100a"):
    kernel = last_kernel(data(512, 256) @ data(256, 512, seed=1), arch)
    with pytest.raises(KernelOptError, match="no warpgroup MMA"): kernel.apply_opt(Opt(OptOps.WGMMA, 0, 0))

def test_wgmma_is_the_first_and_only_opt():
  kernel = last_kernel(data(512, 256) @ data(256, 512, seed=1))
  with pytest.raises(KernelOptError, match="tile index"):
    kernel.copy().apply_opt(Opt(OptOps.WGMMA, 0, len(WGMMA_TILES)))
  upcast = kernel.copy()
  upcast.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  with pytest.raises(KernelOptError, match="first"): upcast.apply_opt(Opt(OptOps.WGMMA, 0, 0))
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, 3))
  assert kernel.launch_dims() == ((4, 4), (256,))   # 512/128 column tiles, 512/128 row tiles, 2 warpgroups
  for opt in (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.TC, 0, 0), Opt(OptOps.WGMMA, 0, 0)):
    with pytest.raises(KernelOptError, match="warpgroup matmul"): kernel.copy().apply_opt(opt)

def test_every_tile_is_a_valid_kernel_configuration_for_both_layouts():
  for warpgroups, block_n, stages, tma in WGMMA_TILES:
    for n_major in (False, True):
      wgmma.WgmmaConfig(warpgroups, block_n, stages, n_major, tma)   # raises if the kernel can't take it
  tiles = [Opt(OptOps.WGMMA, 0, i) for i in range(len(WGMMA_TILES))]
  assert [opt for opt in ACTIONS if opt.op is OptOps.WGMMA] == tiles

def test_heuristics_pick_it_for_big_matmuls_on_sm_90a_only():
  big = data(2048, 512) @ data(512, 2048, seed=1)
  kernel = last_kernel(big)
  hand_coded_optimizations(kernel)
  assert kernel.applied_opts == [Opt(OptOps.WGMMA, 0, default_tile(2048, 2048, tma=True))] and kernel.warpgroup_matmul
  with Context(WGMMA_TMA=0):   # the cp.async loader's tile
    loads_by_copies = last_kernel(big)
    hand_coded_optimizations(loads_by_copies)
    assert loads_by_copies.applied_opts == [Opt(OptOps.WGMMA, 0, default_tile(2048, 2048))]
  for arch in ("sm_90", "sm_80"):   # other GPUs keep mma.sync
    other = last_kernel(big, arch)
    hand_coded_optimizations(other)
    assert Opt(OptOps.TC, 0, 0) in other.applied_opts
  with Context(WGMMA=0):
    off = last_kernel(big)
    hand_coded_optimizations(off)
    assert Opt(OptOps.TC, 0, 0) in off.applied_opts
  small = last_kernel(data(128, 64) @ data(64, 128, seed=1))   # below MIN_MULTIPLY_ADDS
  hand_coded_optimizations(small)
  assert Opt(OptOps.TC, 0, 0) in small.applied_opts

def test_default_tile_keeps_a_wave_of_blocks():
  assert WGMMA_TILES[default_tile(4096, 4096)] == (2, 256, 4, False)     # 512 blocks of 128×256
  assert WGMMA_TILES[default_tile(512, 2048)] == (1, 128, 6, False)      # 128 blocks of 64×128
  assert WGMMA_TILES[default_tile(512, 640)] == (1, 64, 8, False)        # the smallest tile: 80 blocks

def test_rendered_source_compiles_with_parameters_in_kernel_order():
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  with Context(WGMMA_TMA=0):   # the cp.async kernel (the TMA kernel's parameters: test_wgmma_tma.py)
    kernel = last_kernel(data(512, 640, dtype=dtypes.bfloat16) @ data(2048, 640, dtype=dtypes.bfloat16, seed=1).T)
    hand_coded_optimizations(kernel)
    src, uops = render_source(kernel)
  assert uops == [] and f"{kernel.function_name}(element* __restrict__ out, const element* __restrict__ a, " in src
  assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in src
  assert len(nvrtc.compile_cuda(src, HOPPER)) > 1000
  swapped = WarpgroupMatmul(64, 64, 64, dtypes.float16, False, ("a", "out", "b"), 1, 64, 4)
  assert "k(const element* __restrict__ a, element* __restrict__ out, const element* __restrict__ b)" in \
    CUDARenderer(HOPPER).render_warpgroup_matmul("k", swapped)

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("n_major", [False, True], ids=["b_NxK", "b_KxN"])
def test_emulated_kernel_of_the_opt_matches_numpy(dtype, n_major):
  """The kernel the opt describes (its shape, B layout and tile), emulated block by block on the CPU, equals numpy's
  product of the same inputs (M, N not multiples of the tile, K not a multiple of 64)."""
  m, n, k = 200, 136, 200
  a, b = data(m, k, dtype=dtype), data(k, n, dtype=dtype, seed=1)
  kernel = last_kernel(a @ b if n_major else a @ b.T.contiguous().realize().T)
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((1, 64, 4, False))))
  use = kernel.warpgroup_matmul
  config = wgmma.WgmmaConfig(use.warpgroups, use.block_n, use.stages, use.b_n_major)
  a_bits = a.numpy().astype(np.float32)
  b_np = b.numpy().astype(np.float32)
  expected = a_bits @ b_np
  a16 = _to_bits(a_bits, dtype)
  b16 = _to_bits(b_np if use.b_n_major else np.ascontiguousarray(b_np.T), dtype)
  (grid_x, grid_y, _), _ = wgmma.launch_dims(config, m, n)
  out = np.full((m, n), np.nan, np.float32)
  for by in range(grid_y):
    for bx in range(grid_x):
      r, c = by * config.block_m, bx * config.block_n
      block = wgmma.emulate_block(config, a16, b16, dtype, r, c)
      out[r:r + block.shape[0], c:c + block.shape[1]] = block
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)

def _to_bits(x: np.ndarray, dtype) -> np.ndarray:
  """Values already exact in `dtype` (they came from a tensor of it), as its 16-bit patterns."""
  if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
  return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

# ---- the rendered kernel itself, run on the CPU (test/cuda_on_cpu.py: one OS thread per CUDA thread)

# (each case compiles its kernel with g++ for ~10 s: two cases, both B layouts, both dtypes, one and two warpgroups)
CPU_CASES = [((200, 136, 200), (1, 64, 4, False), False, dtypes.float16),
             ((130, 128, 136), (2, 128, 5, False), True, dtypes.bfloat16)]

@pytest.mark.parametrize("shape,tile,n_major,dtype", CPU_CASES, ids=str)
def test_rendered_kernel_runs_on_cpu_and_matches_numpy(shape, tile, n_major, dtype):
  """The C source OptOps.WGMMA renders (pipeline stage arithmetic, copy addresses, bounds checks, descriptors,
  epilogue), compiled for the CPU with stand-ins for its PTX written from the ISA, into an output poisoned with NaN:
  numpy's product of the same inputs. Partial tiles on M, N and K."""
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = shape
  a, b = data(m, k, dtype=dtype), data(k, n, dtype=dtype, seed=1)
  b_arg = b if n_major else b.T.contiguous().realize()
  kernel = last_kernel(a @ (b_arg if n_major else b_arg.T))
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index(tile)))
  assert kernel.warpgroup_matmul.b_n_major == n_major
  src, _ = render_source(kernel)
  a_bits, b_bits = (_to_bits(x.numpy().astype(np.float32), dtype) for x in (a, b_arg))
  out = np.full(m * n, 0xFFFF, np.uint16)
  run_on_cpu(src, kernel.function_name, *kernel.launch_dims(), [out, a_bits, b_bits], [])
  got = wgmma.float_of_bits(out.reshape(m, n), dtype)
  expected = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  np.testing.assert_allclose(got, expected, rtol=2 ** -10 if dtype == dtypes.float16 else 2 ** -7, atol=1e-3)

# ---- the TMA tiles (runtime/cuda/wgmma_tma.py)

def test_tma_tiles_render_the_tma_kernel_and_wgmma_tma_makes_the_heuristics_pick_one():
  big = data(2048, 512) @ data(512, 2048, seed=1)
  tile = WGMMA_TILES.index((2, 128, 6, True))
  kernel = last_kernel(big)
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, tile))
  assert kernel.warpgroup_matmul.tma and kernel.launch_dims() == ((16, 16), (384,))   # + the producer warpgroup
  src, _ = render_source(kernel)
  assert "cp.async.bulk.tensor.2d" in src and "const __grid_constant__ TensorMap a_map" in src
  with Context(WGMMA_TMA=1):
    picked = last_kernel(big)
    hand_coded_optimizations(picked)
  assert picked.warpgroup_matmul.tma and WGMMA_TILES[picked.applied_opts[0].amount][3]
  assert WGMMA_TILES[default_tile(4096, 4096, tma=True)] == (2, 256, 4, True)

def test_rendered_tma_kernel_runs_on_cpu_and_matches_numpy():
  """The TMA kernel OptOps.WGMMA renders for a plain a·b (N-major B, bfloat16, partial tiles), on the CPU."""
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = 130, 128, 200
  a, b = data(m, k, dtype=dtypes.bfloat16), data(k, n, dtype=dtypes.bfloat16, seed=1)
  kernel = last_kernel(a @ b)
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((1, 64, 8, True))))
  src, _ = render_source(kernel)
  out = np.full(m * n, 0xFFFF, np.uint16)
  a_bits, b_bits = (_to_bits(x.numpy().astype(np.float32), dtypes.bfloat16) for x in (a, b))
  run_on_cpu(src, kernel.function_name, *kernel.launch_dims(), [out, a_bits, b_bits], [])
  got = wgmma.float_of_bits(out.reshape(m, n), dtypes.bfloat16)
  assert not np.isnan(got).any()
  np.testing.assert_allclose(got, a.numpy().astype(np.float64) @ b.numpy().astype(np.float64), rtol=2 ** -7, atol=1e-3)
