"""TF32 on the Hopper warpgroup-MMA kernel (runtime/cuda/wgmma.py, OptOps.WGMMA) without a GPU: a float32 matmul whose
inputs the graph rounds to TF32 (the matmul lowering "tf32") is one wgmma kernel on sm_90a when B is stored N×K
(a·wᵀ: both operands K-major, as TF32 wgmma requires), and keeps mma.sync when B is K×N. The kernel loads the raw
float32 values and rounds them in shared memory (to nearest, ties away, as round_to_tf32); the CPU emulator's TF32
wgmma keeps only the TF32 bits of what it reads (the hardware's truncation), so inputs whose low 13 bits make rounding
and truncation differ tell a kernel that rounds from one that does not. NVRTC compiles the sources for sm_90a."""
import numpy as np
import pytest
from tgrad import Tensor, Variable, dtypes
from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS
from tgrad.helpers import Context
from tgrad.regions import LOWERINGS
from tgrad.schedule import create_schedule
from tgrad.codegen.axes import WarpgroupMatmul
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.warpgroup_mma import WGMMA_TILES, default_tile, matmul_of
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.renderer import CUDARenderer

HOPPER = "sm_90a"
# low 13 bits the inputs carry: above, at and below the rounding threshold (0x1000 is a tie: away from zero)
LOW_BITS = np.array([0x1FFF, 0x1000, 0x1800, 0x0FFF, 0x0001], np.uint32)

def tf32_inputs(*shape: int, seed: int = 0) -> np.ndarray:
  """float32 values in ±[0.5, 1) whose dropped bits are LOW_BITS: rounded and truncated to TF32 they differ by up to
  2^-11 relative, mostly in one direction, so a K-long sum of their products differs by ~K·2^-11."""
  rng = np.random.default_rng(seed)
  top = rng.uniform(0.5, 1.0, shape).astype(np.float32).view(np.uint32) & TF32_KEEP_MASK
  signs = rng.choice(np.array([1, 1, 1, -1], np.float32), shape)
  return (top | rng.choice(LOW_BITS, shape)).view(np.float32) * signs

def as_tf32(x: np.ndarray, rounded: bool = True) -> np.ndarray:
  """x rounded (as round_to_tf32) or truncated to TF32, in float64."""
  bits = x.view(np.uint32)
  return (((bits + TF32_ROUNDING_BIAS) if rounded else bits) & TF32_KEEP_MASK).view(np.float32).astype(np.float64)

def assert_rounded_not_truncated(got: np.ndarray, a: np.ndarray, b_nk: np.ndarray) -> None:
  """got equals the float64 product of the TF32-rounded inputs to float32 accumulation error (a rounding per K step of
  8 into the float32 accumulator, and a few more), and is measurably not the product of the truncated ones."""
  rounded, truncated = as_tf32(a) @ as_tf32(b_nk).T, as_tf32(a, False) @ as_tf32(b_nk, False).T
  tolerance = (a.shape[1] / 8 + 4) * 2.0 ** -24 * (np.abs(as_tf32(a)) @ np.abs(as_tf32(b_nk)).T)
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  assert np.all(np.abs(got - rounded) <= tolerance), (np.abs(got - rounded) / tolerance).max()
  assert np.median(np.abs(rounded - truncated) / tolerance) > 10   # the inputs do tell the two apart
  assert np.mean(np.abs(got - truncated) > tolerance) > 0.9

def run_source(src: str, config: wgmma.WgmmaConfig, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  from cuda_on_cpu import run_on_cpu
  m, n = a.shape[0], b.shape[0]
  out = np.full(m * n, np.nan, np.float32)
  run_on_cpu(src, "k", *wgmma.launch_dims(config, m, n), [out, a, b], [])
  return out.reshape(m, n)

# ---- the kernel's source

@pytest.mark.parametrize("config", [wgmma.WgmmaConfig(1, 64, 3), wgmma.WgmmaConfig(2, 256, 4),
                                    wgmma.WgmmaConfig(1, 128, 6)], ids=str)
def test_tf32_source_compiles_for_sm_90a(config):
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  src = wgmma.wgmma_matmul_source("k", 300, 2 * config.block_n, 200, dtypes.float32, config)
  assert "typedef float element;" in src and src.count(f"m64n{config.block_n}k8.f32.tf32.tf32") == 4
  assert src.index("round_tile(stage);") < src.index("fence.proxy.async") < src.index("wgmma.mma_async")
  assert len(nvrtc.compile_cuda(src, HOPPER)) > 1000

def test_tf32_source_refuses_what_tf32_wgmma_cannot_read():
  with pytest.raises(ValueError, match="K-major"):
    wgmma.wgmma_matmul_source("k", 64, 64, 64, dtypes.float32, wgmma.WgmmaConfig(1, 64, 3, b_n_major=True))
  with pytest.raises(ValueError, match="multiple of 4"):
    wgmma.wgmma_matmul_source("k", 64, 64, 66, dtypes.float32, wgmma.WgmmaConfig(1, 64, 3))

@pytest.mark.parametrize("config,shape", [(wgmma.WgmmaConfig(1, 64, 3), (70, 72, 100)),
                                          (wgmma.WgmmaConfig(2, 256, 4), (130, 270, 72)),
                                          (wgmma.WgmmaConfig(1, 128, 6), (64, 136, 36)),
                                          (wgmma.WgmmaConfig(2, 128, 5), (200, 128, 64))], ids=str)
def test_python_emulation_of_every_block_rounds_like_the_graph(config, shape):
  """wgmma.emulate_block with TF32 (the kernel's copy offsets, each landed chunk rounded, the descriptors read as the
  ISA lays out 4-byte K-major elements, the core keeping TF32 bits) over the whole grid: the rounded inputs' product."""
  m, n, k = shape
  a, b = tf32_inputs(m, k), tf32_inputs(n, k, seed=1)
  (grid_x, grid_y, _), _ = wgmma.launch_dims(config, m, n)
  out = np.full((m, n), np.nan, np.float32)
  for by in range(grid_y):
    for bx in range(grid_x):
      r, c = by * config.block_m, bx * config.block_n
      block = wgmma.emulate_block(config, a.view(np.uint32), b.view(np.uint32), dtypes.float32, r, c)
      out[r:r + block.shape[0], c:c + block.shape[1]] = block
  assert_rounded_not_truncated(out, a, b)

def test_emulated_tf32_kernel_rounds_its_operands():
  """The source run on the CPU (partial tiles on M, N and K: 100 is 3 K tiles of 32 and a partial one) gives the
  product of the rounded inputs; the same source without its rounding gives the truncated product (the emulator's
  TF32 wgmma truncates, as the hardware does), so the check can fail."""
  from cuda_on_cpu import cpu_available
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = 70, 72, 100
  config = wgmma.WgmmaConfig(1, 64, 3)
  a, b = tf32_inputs(m, k), tf32_inputs(n, k, seed=1)
  src = wgmma.wgmma_matmul_source("k", m, n, k, dtypes.float32, config)
  assert_rounded_not_truncated(run_source(src, config, a, b), a, b)
  unrounded = run_source(src.replace("round_tile(stage);", ""), config, a, b)
  np.testing.assert_allclose(unrounded, as_tf32(a, False) @ as_tf32(b, False).T, rtol=1e-5, atol=1e-4)

# ---- the opt

def tf32_matmul(a: np.ndarray, b: np.ndarray) -> Tensor:
  """The matmul lowering "tf32" of a · b (LLVM tensors: the kernels are only rendered); a transposed view of b (a
  w.T of a numpy w) is a transposed view of w's tensor (B stored N×K)."""
  transposed = not b.flags.c_contiguous
  b_tensor = Tensor(np.ascontiguousarray(b.T), device="LLVM").T if transposed else Tensor(b, device="LLVM")
  return LOWERINGS["matmul"]["tf32"].build(Tensor(a, device="LLVM"), b_tensor)

def last_kernel(out: Tensor, arch: str = HOPPER) -> Kernel:
  return Kernel(create_schedule([out.lazydata])[-1].ast, CUDARenderer(arch))

def test_tf32_rounded_a_times_w_transposed_qualifies_and_the_other_layout_keeps_mma_sync():
  a, w = np.zeros((512, 640), np.float32), np.zeros((2048, 640), np.float32)
  use = matmul_of(last_kernel(tf32_matmul(a, w.T)).state)
  assert isinstance(use, WarpgroupMatmul), use
  assert (use.m, use.n, use.k, use.dtype, use.b_n_major, use.out_dtype) == (512, 2048, 640, dtypes.float32, False, None)
  assert "K-major" in matmul_of(last_kernel(tf32_matmul(a, np.zeros((640, 2048), np.float32))).state)
  plain = Tensor(a, device="LLVM") @ Tensor(w, device="LLVM").T   # float32 loads not rounded: 3xTF32, never one pass
  plain_use = matmul_of(last_kernel(plain).state)
  assert isinstance(plain_use, WarpgroupMatmul) and plain_use.split_tf32 and not use.split_tf32

def weight_product(m: int, n: int, k: int, seed: int = 0) -> tuple[Tensor, np.ndarray, np.ndarray]:
  a, w = tf32_inputs(m, k, seed=seed), tf32_inputs(n, k, seed=seed + 1)
  return tf32_matmul(a, w.T), a, w

def test_heuristics_pick_the_cp_async_kernel_for_big_tf32_matmuls_on_sm_90a():
  out, _, _ = weight_product(2048, 1024, 512)
  kernel = last_kernel(out)
  hand_coded_optimizations(kernel)   # WGMMA_TMA=1 by default: TF32 takes the cp.async tiles all the same
  assert kernel.applied_opts == [Opt(OptOps.WGMMA, 0, default_tile(2048, 1024))]
  assert kernel.warpgroup_matmul.dtype == dtypes.float32 and not kernel.warpgroup_matmul.tma
  for arch in ("sm_90", "sm_80"):
    other = last_kernel(out, arch)
    hand_coded_optimizations(other)
    assert Opt(OptOps.TC, 0, 0) in other.applied_opts
  with Context(WGMMA=0):
    off = last_kernel(out)
    hand_coded_optimizations(off)
    assert Opt(OptOps.TC, 0, 0) in off.applied_opts
  tma_tile = next(i for i, tile in enumerate(WGMMA_TILES) if tile[3])
  with pytest.raises(KernelOptError, match="16-bit inputs"): last_kernel(out).apply_opt(Opt(OptOps.WGMMA, 0, tma_tile))

def test_rendered_tf32_kernel_runs_on_cpu_and_rounds_like_the_graph():
  """The source OptOps.WGMMA renders for the "tf32" lowering of a·wᵀ (M, N, K not multiples of the tile), on the CPU
  emulator: the product of the TF32-rounded inputs, not of the truncated ones."""
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = 130, 136, 168
  out, a, w = weight_product(m, n, k, seed=3)
  kernel = last_kernel(out)
  kernel.apply_opt(Opt(OptOps.WGMMA, 0, WGMMA_TILES.index((2, 128, 5, False))))
  src, _ = render_source(kernel)
  result = np.full(m * n, np.nan, np.float32)
  buffers = {"out": result, "a": a, "b": w}
  run_on_cpu(src, kernel.function_name, *kernel.launch_dims(), [buffers[r] for r in kernel.warpgroup_matmul.arguments],
             [])
  assert_rounded_not_truncated(result.reshape(m, n), a, w)

def test_a_prompts_tf32_projection_with_a_symbolic_m_is_one_wgmma_kernel_that_compiles():
  """x[:T]·wᵀ through the "tf32" lowering, T the prompt length: the heuristics' TF32 warpgroup kernel takes M from the
  variable (a cp.async tile), and NVRTC compiles its source for sm_90a."""
  x, w = (Tensor(np.zeros(shape, np.float32), device="LLVM") for shape in ((520, 640), (1536, 640)))
  out = LOWERINGS["matmul"]["tf32"].build(x[:Variable("prompt_len", 1, 520).bind(1)], w.T)
  kernel = last_kernel(out)
  hand_coded_optimizations(kernel)
  use = kernel.warpgroup_matmul
  assert use is not None and use.dtype == dtypes.float32 and use.variables == ("prompt_len",) and not use.tma
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  src, _ = render_source(kernel)
  assert "k8.f32.tf32.tf32" in src and len(nvrtc.compile_cuda(src, HOPPER)) > 1000
