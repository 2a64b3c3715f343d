"""3xTF32 on the Hopper warpgroup MMA (runtime/cuda/wgmma_split.py, OptOps.TF32X3) without a GPU: the split of a float32
into big and small TF32 parts, the tiles, NVRTC compiles for sm_90a, the CPU emulator of test/cuda_on_cpu.py running the
kernel (both B layouts, ragged M, N and K, a symbolic M) against a float64 product, and what the heuristics, the
setting F32_MATMUL and BEAM's actions do with it. The emulator's TF32 wgmma keeps only the TF32 bits of what it reads
(the hardware's truncation), so a kernel that skipped the split would read truncated floats; the same source with its
small-part wgmmas removed is checked to fail the tolerance, so the check can fail."""
import re
import numpy as np
import pytest
from tgrad import Tensor, Variable
from tgrad.helpers import Context, SettingError, settings_key
from tgrad.schedule import create_schedule
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.search import ACTIONS
from tgrad.codegen.warpgroup_mma import SPLIT_TILES, default_split_tile, matmul_of
from tgrad.dtype import dtypes
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.cuda.wgmma_split import split_matmul_source, split_parts

HOPPER = "sm_90a"
MAX_ERROR_RATIO = 4.0   # 3xTF32's worst error (relative to Σ|a·b|) may be this many times numpy float32's
RNG_SEED = 29

def configs(b_n_major: bool) -> list[wgmma.WgmmaConfig]:
  return [split_config(tile, b_n_major) for tile in SPLIT_TILES]

def split_config(tile: tuple[int, int, int, bool], b_n_major: bool) -> wgmma.WgmmaConfig:
  warpgroups, block_n, stages, a_registers = tile
  return wgmma.WgmmaConfig(warpgroups, block_n, stages, b_n_major=b_n_major, split_tf32=True, a_registers=a_registers)

def operands(m: int, n: int, k: int, b_n_major: bool, seed: int = RNG_SEED) -> tuple[np.ndarray, np.ndarray]:
  """a M×K and b (K×N if b_n_major, else N×K) of float32 values with all 24 significant bits in use."""
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k)).astype(np.float32)
  return a, rng.standard_normal((k, n) if b_n_major else (n, k)).astype(np.float32)

def relative_error(got: np.ndarray, a: np.ndarray, b_kn: np.ndarray) -> float:
  """The worst |got − a·b| over Σ|a·b| (float64 reference): a float32 dot product's error is a few 2^-24 of it."""
  reference = a.astype(np.float64) @ b_kn.astype(np.float64)
  return float(np.max(np.abs(got - reference) / (np.abs(a.astype(np.float64)) @ np.abs(b_kn.astype(np.float64)))))

def tolerance(k: int) -> float:
  """Σ|a·b| times this bounds a 3xTF32 sum's error: operands carried to 2^-22 (small keeps 11 of the 13 missing bits,
  small·small dropped) and three float32 accumulations per K step of 8."""
  return 4 * 2.0 ** -22 + (3 * k / 8 + 4) * 2.0 ** -24

def check(got: np.ndarray, a: np.ndarray, b_kn: np.ndarray) -> None:
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  error, float32_error = relative_error(got, a, b_kn), relative_error(a @ b_kn, a, b_kn)
  assert error <= tolerance(a.shape[1]), (error, tolerance(a.shape[1]))
  assert error <= MAX_ERROR_RATIO * float32_error, (error, float32_error)

# ---- the split

def test_split_parts_are_tf32_and_sum_to_x():
  x = np.random.default_rng(1).standard_normal(10000).astype(np.float32) * np.float32(2.0) ** \
    np.random.default_rng(2).integers(-60, 60, 10000).astype(np.float32)
  big, small = split_parts(x)
  for part in (big, small): assert not np.any(part.view(np.uint32) & 0x1FFF), "parts keep TF32 bits only"
  assert np.all(np.abs(big.astype(np.float64) + small - x) <= 2.0 ** -22 * np.abs(x))
  assert np.all(np.abs(big.astype(np.float64) - x) <= 2.0 ** -11 * np.abs(x))

def test_split_parts_of_specials():
  x = np.array([np.inf, -np.inf, np.nan, np.finfo(np.float32).max, 0.0, -0.0], np.float32)
  big, small = split_parts(x)
  assert big[0] == np.inf and big[1] == -np.inf and np.isnan(big[2]) and not np.any(small[:3])
  assert (big[2:3].view(np.uint32) & 0x7FFFE000) > 0x7F800000   # a NaN even as the tensor core truncates it
  assert np.isfinite(big[3]) and big[3] + np.float64(small[3]) == pytest.approx(float(x[3]), rel=2.0 ** -22)
  assert not np.any(big[4:]) and not np.any(small[4:])

# ---- the kernel's source

def test_every_tile_fits_both_b_layouts():
  for b_n_major in (False, True):
    for c in configs(b_n_major): assert c.shared_bytes <= wgmma.MAX_SHARED_BYTES and c.stages >= wgmma.MIN_STAGES
  with pytest.raises(ValueError, match="shared memory"): wgmma.WgmmaConfig(2, 256, 3, split_tf32=True)
  with pytest.raises(ValueError, match="3xTF32"):
    wgmma.wgmma_matmul_source("k", 64, 64, 64, dtypes.float32, configs(False)[0])
  with pytest.raises(ValueError, match="multiple of 4"): split_matmul_source("k", 64, 64, 66, configs(False)[0])
  with pytest.raises(ValueError, match="multiple of 4"): split_matmul_source("k", 64, 66, 64, configs(True)[0])

@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
@pytest.mark.parametrize("tile", [(2, 128, 4, False), (1, 64, 8, False), (2, 128, 5, True)], ids=str)
def test_source_compiles_for_sm_90a(tile, b_n_major):
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  c = split_config(tile, b_n_major)
  src = split_matmul_source("k", 300, 2 * c.block_n + 4, 200, c)
  assert src.count(f"m64n{c.block_n}k8.f32.tf32.tf32") == 3 * 4   # three wgmmas per K step of 8, 4 steps a tile
  assert src.index("split_tile(stage, small_shift);") < src.index("fence.proxy.async") < src.index("wgmma.mma_async")
  assert ("transpose_tile(stage, small_shift);" in src) == b_n_major
  assert len(nvrtc.compile_cuda(src, HOPPER)) > 1000

def run_source(src: str, config: wgmma.WgmmaConfig, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
  from cuda_on_cpu import run_on_cpu
  out = np.full(a.shape[0] * n, np.nan, np.float32)
  run_on_cpu(src, "k", *wgmma.launch_dims(config, a.shape[0], n), [out, a, b], [])
  return out.reshape(a.shape[0], n)

def test_emulated_kernel_is_float32_class_and_needs_its_small_parts():
  """a·wᵀ (w N×K) with M, N and K off the tile (200 is 6 K tiles of 32 and a partial one: the 5 stages and the 3
  slots of small parts are reused): within the tolerance and MAX_ERROR_RATIO of numpy float32; the same source without
  its two small-part wgmmas (one TF32 pass) is not."""
  from cuda_on_cpu import cpu_available
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = 70, 72, 200
  config = wgmma.WgmmaConfig(1, 64, 5, split_tf32=True)
  a, w = operands(m, n, k, False)
  src = split_matmul_source("k", m, n, k, config)
  check(run_source(src, config, a, w, n), a, w.T)
  blocks = re.findall(r"\{\n *const unsigned long long desc_a.*?\n *\}\n", src, re.DOTALL)
  assert len(blocks) == 12
  single = src
  for i, block in enumerate(blocks):
    if i % 3 != 2: single = single.replace(block, "", 1)   # big·big only
  assert single.count("tf32.tf32") == 4
  assert relative_error(run_source(single, config, a, w, n), a, w.T) > 20 * tolerance(k)

@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
def test_emulated_kernel_with_a_in_registers(b_n_major):
  """A split in each thread's registers (its wgmma fragment read from the stage's swizzled tile), B's parts in the
  slots: two warpgroups (the second's rows 64 on), M, N and K off the tile; float32-class on the emulator, whose
  register-A wgmma gathers the fragments by the PTX ISA's layout."""
  from cuda_on_cpu import cpu_available
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = 150, 72, 200
  config = wgmma.WgmmaConfig(2, 64, 4, b_n_major=b_n_major, split_tf32=True, a_registers=True)
  a, b = operands(m, n, k, b_n_major)
  src = split_matmul_source("k", m, n, k, config)
  assert src.count("split(*(const float*)(a_tile + ") == 16 and "wgmma.wait_group.sync.aligned 0;" in src
  check(run_source(src, config, a, b, n), a, b if b_n_major else b.T)

# ---- the opt

def llvm(x: np.ndarray) -> Tensor: return Tensor(x, device="LLVM")

def last_kernel(out: Tensor, arch: str = HOPPER) -> Kernel:
  return Kernel(create_schedule([out.lazydata])[-1].ast, CUDARenderer(arch))

def test_rendered_kernel_with_a_k_by_n_b_and_a_symbolic_m_runs_on_cpu():
  """x[:T]·b (b K×N, T a prompt length bound to 70 of 130 rows) through the heuristics: one 3xTF32 kernel whose
  rows come from the variable; on the CPU emulator its rows match float64 and nothing past T is written."""
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  rows, m, n, k = 130, 70, 136, 72
  x, b = operands(rows, n, k, True, seed=5)
  out = llvm(x)[:Variable("prompt_len", 1, rows).bind(m)] @ llvm(b)
  kernel = last_kernel(out)
  kernel.apply_opt(Opt(OptOps.TF32X3, 0, SPLIT_TILES.index((1, 64, 5, False))))
  use = kernel.warpgroup_matmul
  assert use.split_tf32 and use.b_n_major and use.variables == ("prompt_len",)
  src, _ = render_source(kernel)
  result = np.full(rows * n, np.nan, np.float32)
  buffers = {"out": result, "a": x, "b": b}
  (gx, gy), local = kernel.launch_dims()
  grid = (gx, -(-m // use.block_m))   # the runner's grid for prompt_len = m
  run_on_cpu(src, kernel.function_name, grid, local, [buffers[r] for r in use.arguments], [m])
  got = result.reshape(rows, n)
  check(got[:m], x[:m], b)
  assert np.isnan(got[m:]).all(), "rows past the prompt are not stored"

def test_plain_float32_matmuls_qualify_as_3xtf32_with_either_b_layout():
  a, b, w = (np.zeros(shape, np.float32) for shape in ((512, 640), (640, 2048), (2048, 640)))
  for out, n_major in ((llvm(a) @ llvm(b), True), (llvm(a) @ llvm(w).T, False)):
    use = matmul_of(last_kernel(out).state)
    assert use.split_tf32 and (use.m, use.n, use.k, use.dtype, use.b_n_major) == (512, 2048, 640, dtypes.float32,
                                                                                 n_major)
    with pytest.raises(KernelOptError, match="TF32X3"): last_kernel(out).apply_opt(Opt(OptOps.WGMMA, 0, 0))
  half = llvm(a.astype(np.float16)) @ llvm(b.astype(np.float16))
  with pytest.raises(KernelOptError, match="plain float32"): last_kernel(half).apply_opt(Opt(OptOps.TF32X3, 0, 0))
  relu = (llvm(a) @ llvm(b)).relu()
  with pytest.raises(KernelOptError): last_kernel(relu).apply_opt(Opt(OptOps.TF32X3, 0, 0))

@Context(F32_MATMUL="3xtf32")
def test_heuristics_take_3xtf32_on_sm_90a_only_under_the_setting():
  a, b = llvm(np.zeros((2048, 512), np.float32)), llvm(np.zeros((512, 1024), np.float32))
  for out in (a @ b, a @ b.T.contiguous().T):
    with Context(F32_MATMUL="simt"):   # the default: the CUDA-core template everywhere
      default = last_kernel(out)
      hand_coded_optimizations(default)
      assert default.applied_opts[0].op is OptOps.SGEMM
    kernel = last_kernel(out)
    hand_coded_optimizations(kernel)
    assert kernel.applied_opts == [Opt(OptOps.TF32X3, 0, default_split_tile(2048, 1024))]
    for arch in ("sm_90", "sm_80"):   # no wgmma: the CUDA-core template, as before
      other = last_kernel(out, arch)
      hand_coded_optimizations(other)
      assert other.applied_opts[0].op is OptOps.SGEMM
    with Context(F32_MATMUL="simt"):
      simt = last_kernel(out)
      hand_coded_optimizations(simt)
      assert simt.applied_opts[0].op is OptOps.SGEMM
    with Context(WGMMA=0):   # WGMMA governs half/bfloat16 and TF32-rounded inputs, not plain float32
      kernel = last_kernel(out)
      hand_coded_optimizations(kernel)
      assert kernel.applied_opts[0].op is OptOps.TF32X3
  assert default_split_tile(512, 2048) == SPLIT_TILES.index((2, 64, 6, True))   # 128 blocks: a wave of 132 SMs
  assert default_split_tile(512, 1536) == SPLIT_TILES.index((2, 64, 6, True))   # 96 blocks: SPLIT_WAVE_FRACTION
  assert default_split_tile(512, 640) == SPLIT_TILES.index((1, 64, 8, True))   # no wave: the most blocks
  assert default_split_tile(4096, 4096) == SPLIT_TILES.index((2, 128, 5, True))

def test_the_setting_and_beams_actions():
  for tile in range(len(SPLIT_TILES)): assert Opt(OptOps.TF32X3, 0, tile) in ACTIONS
  with Context(F32_MATMUL="simt"): simt_key = settings_key()
  with Context(F32_MATMUL="3xTF32"): assert settings_key() != simt_key   # a code setting: in every cache key
  with pytest.raises(SettingError, match="F32_MATMUL"): Context(F32_MATMUL="tf32")
