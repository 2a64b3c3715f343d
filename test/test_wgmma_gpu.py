"""The wgmma matmul kernel (runtime/cuda/wgmma.py) on a Hopper GPU (compute capability 9.0: wgmma is sm_90a only):
out = a·bᵀ for float16 and bfloat16 against numpy's float32 product of the same rounded inputs, into outputs
poisoned with NaN (0xFFFF) so an element the kernel fails to write shows. Sizes: 4096², odd M and N with a partial K
tile, tiles smaller than a block, and every tile configuration the kernel offers a test for. Skipped without an
sm_90 GPU; the CPU-side checks are test/unit/test_wgmma.py. Then OptOps.WGMMA: tgrad's matmul kernels with every
tile of WGMMA_TILES (both B layouts, both dtypes) into poisoned outputs, and realize (the heuristics pick WGMMA) against
numpy; the CPU-side checks of the opt are test/unit/test_wgmma_opt.py. TF32 (the "tf32" lowering of a·wᵀ): every
cp.async tile against the product of the rounded inputs, and not of the truncated ones (test/unit/test_wgmma_tf32.py
on the CPU)."""
import os, subprocess, sys
from typing import Optional
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.compile import compile_kernel
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.warpgroup_mma import WGMMA_TILES
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.realize import run_schedule
from tgrad.schedule import create_schedule
from tgrad.runtime.cuda import wgmma
from tgrad.runtime.cuda.wgmma import WgmmaConfig

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(90)
POISON = 0xFFFF   # NaN in half and bfloat16

def hopper() -> bool:
  return wgmma.wgmma_arch(Device["CUDA"].renderer.arch) is not None

def bits(x: np.ndarray, dtype) -> np.ndarray:
  if dtype == dtypes.float16: return x.astype(np.float16).view(np.uint16)
  u = x.astype(np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def run_wgmma(a: np.ndarray, b: np.ndarray, dtype, config: WgmmaConfig) -> np.ndarray:
  """out (uint16 bits) = a·bᵀ on the GPU (a·b for an N-major b), a: M×K and b: N×K (K×N) uint16 bits, the output
  poisoned first."""
  from tgrad.runtime.cuda.runtime import CUDAProgram
  (m, k), n = a.shape, (b.shape[1] if config.b_n_major else b.shape[0])
  name = f"wgmma_matmul_{m}_{n}_{k}"
  program = CUDAProgram(name, wgmma.compile_wgmma_matmul(name, m, n, k, dtype, config))
  assert program.shared_bytes == config.shared_bytes
  buffers = [Buffer("CUDA", x.size, dtypes.uint16).copyin(np.ascontiguousarray(x).reshape(-1))
             for x in (np.full((m, n), POISON, np.uint16), a, b)]
  grid, block = wgmma.launch_dims(config, m, n)
  program(*[buf.handle for buf in buffers], global_size=grid, local_size=block, wait=True)
  return buffers[0].copyout().reshape(m, n)

CASES = [((4096, 4096, 4096), WgmmaConfig()), ((1001, 777, 520), WgmmaConfig()), ((37, 45, 24), WgmmaConfig()),
         ((512, 2048, 640), WgmmaConfig(2, 128, 5)), ((300, 200, 136), WgmmaConfig(1, 64, 3)),
         ((130, 90, 104), WgmmaConfig(1, 48, 6)), ((4096, 4096, 4096), WgmmaConfig(b_n_major=True)),
         ((1001, 776, 520), WgmmaConfig(b_n_major=True)), ((70, 40, 88), WgmmaConfig(1, 64, 3, b_n_major=True)),
         ((520, 1000, 200), WgmmaConfig(2, 128, 4, b_n_major=True))]

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("shape,config", CASES, ids=str)
def test_wgmma_matmul_matches_numpy(shape, config, dtype):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  m, n, k = shape
  a, b = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((n, k)), dtype)
  expected = wgmma.float_of_bits(a, dtype).astype(np.float64) @ wgmma.float_of_bits(b, dtype).astype(np.float64).T
  out = wgmma.float_of_bits(run_wgmma(a, np.ascontiguousarray(b.T) if config.b_n_major else b, dtype, config), dtype)
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} outputs never written"
  # one rounding to the output format (half: 2^-11, bfloat16: 2^-8 relative) after float32 sums of exact products
  # (the core's additions may truncate: about 2^-23 of a partial sum ~√K each, K of them, a random walk)
  rtol = 2 ** -10 if dtype == dtypes.float16 else 2 ** -7
  np.testing.assert_allclose(out, expected, rtol=rtol, atol=2e-6 * k)
  # a wrong layout or descriptor gives errors of the size of the values themselves (~√K), far above that

# ---- OptOps.WGMMA: tgrad's own matmul kernels, every tile, and what realize picks

def run_last_kernel(out: Tensor, opt: Opt) -> np.ndarray:
  """out's inputs realized, then its last kernel run on CUDA with `opt` (its only opt) into a buffer poisoned with
  NaN: the output in out's shape, float32 values or a 16-bit float's patterns (uint16)."""
  items = create_schedule([out.lazydata])
  run_schedule(items[:-1])
  kernel = Kernel(items[-1].ast, Device["CUDA"].renderer)
  kernel.apply_opt(opt)
  runner = compile_kernel("CUDA", kernel, opt.op.name.lower())
  size = items[-1].outputs[0].size
  poison = np.full(size, np.nan, np.float32) if out.dtype == dtypes.float32 else np.full(size, POISON, np.uint16)
  result = Buffer("CUDA", size, out.dtype).copyin(poison)
  runner([result] + list(items[-1].inputs), wait=True)
  return result.copyout().view(poison.dtype).reshape(out.shape)

def run_wgmma_opt(out: Tensor, tile: int) -> np.ndarray:
  """The last kernel of a half/bfloat16 `out` as a warpgroup matmul with WGMMA_TILES[tile]: its 16-bit patterns."""
  return run_last_kernel(out, Opt(OptOps.WGMMA, 0, tile))

OPT_SHAPES = [(512, 640, 2048), (200, 136, 200), (4096, 4096, 4096)]

CP_ASYNC_TILES = [i for i, tile in enumerate(WGMMA_TILES) if not tile[-1]]
TMA_TILES = [i for i, tile in enumerate(WGMMA_TILES) if tile[-1]]   # tested last, after a check in a subprocess
def tile_id(i: int) -> str: return "x".join(map(str, WGMMA_TILES[i]))

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("n_major", [False, True], ids=["b_NxK", "b_KxN"])
@pytest.mark.parametrize("shape", OPT_SHAPES, ids=str)
@pytest.mark.parametrize("tile", CP_ASYNC_TILES, ids=tile_id)
def test_wgmma_opt_matches_numpy(tile, shape, n_major, dtype):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  if shape[0] == 4096 and tile not in (0, 3): pytest.skip("4096² for two tiles only (time)")
  check_opt_tile(tile, shape, n_major, dtype)

def check_opt_tile(tile: int, shape: tuple[int, int, int], n_major: bool, dtype) -> None:
  """OptOps.WGMMA with WGMMA_TILES[tile] on a·b (B K×N) or a·bᵀ (B N×K) of `shape` against numpy."""
  m, n, k = shape
  a_bits, b_bits = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((k, n)), dtype)
  a = Tensor(a_bits, device="CUDA").bitcast(dtype).realize()
  b = Tensor(b_bits if n_major else np.ascontiguousarray(b_bits.T), device="CUDA").bitcast(dtype).realize()
  out = wgmma.float_of_bits(run_wgmma_opt(a @ (b if n_major else b.T), tile), dtype)
  expected = wgmma.float_of_bits(a_bits, dtype).astype(np.float64) @ \
    wgmma.float_of_bits(b_bits, dtype).astype(np.float64)
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} outputs never written"
  rtol = 2 ** -10 if dtype == dtypes.float16 else 2 ** -7
  np.testing.assert_allclose(out, expected, rtol=rtol, atol=2e-6 * k)

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_realize_picks_wgmma_for_a_big_matmul_and_matches_numpy(dtype):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  m, n, k = 1024, 2048, 512
  a_bits, b_bits = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((k, n)), dtype)
  a = Tensor(a_bits, device="CUDA").bitcast(dtype).realize()
  b = Tensor(b_bits, device="CUDA").bitcast(dtype).realize()
  kernel = Kernel(create_schedule([(a @ b).lazydata])[-1].ast, Device["CUDA"].renderer)
  hand_coded_optimizations(kernel)
  assert kernel.warpgroup_matmul is not None, kernel.applied_opts
  out = (a @ b).realize().bitcast(dtypes.uint16).numpy()
  expected = wgmma.float_of_bits(a_bits, dtype).astype(np.float64) @ \
    wgmma.float_of_bits(b_bits, dtype).astype(np.float64)
  rtol = 2 ** -10 if dtype == dtypes.float16 else 2 ** -7
  np.testing.assert_allclose(wgmma.float_of_bits(out, dtype), expected, rtol=rtol, atol=2e-6 * k)

# ---- TF32: the matmul lowering "tf32" of a·wᵀ (float32 inputs rounded in the graph), every cp.async tile

TF32_KEEP, TF32_HALF = 0xFFFFE000, 0x1000   # the bits a TF32 value keeps; half of the dropped ones (round_to_tf32)

def tf32_rounded(x: np.ndarray, rounded: bool = True) -> np.ndarray:
  bits = x.astype(np.float32).view(np.uint32)
  return (((bits + TF32_HALF) if rounded else bits) & TF32_KEEP).view(np.float32).astype(np.float64)

def tf32_product(m: int, n: int, k: int):
  """(the lowering's lazy a·wᵀ on CUDA, float64 product of the rounded inputs, of the truncated ones, a float32 sum's
  error scale): inputs in ±[0.5, 1) whose dropped 13 bits are 0x1FFF or 0x0FFF (rounding and truncation differ)."""
  from tgrad.regions import LOWERINGS
  a, w = (((RNG.uniform(0.5, 1, shape).astype(np.float32).view(np.uint32) & TF32_KEEP) |
           RNG.choice(np.array([0x1FFF, 0x0FFF], np.uint32), shape)).view(np.float32) * RNG.choice([1, 1, -1], shape)
          for shape in ((m, k), (n, k)))
  a, w = a.astype(np.float32), w.astype(np.float32)
  out = LOWERINGS["matmul"]["tf32"].build(Tensor(a, device="CUDA").realize(), Tensor(w, device="CUDA").realize().T)
  scale = (k / 8 + 8) * 2.0 ** -24 * (np.abs(tf32_rounded(a)) @ np.abs(tf32_rounded(w)).T)
  return out, tf32_rounded(a) @ tf32_rounded(w).T, tf32_rounded(a, False) @ tf32_rounded(w, False).T, scale

def check_tf32(got: np.ndarray, rounded: np.ndarray, truncated: np.ndarray, scale: np.ndarray) -> None:
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  assert np.all(np.abs(got - rounded) <= scale), (np.abs(got - rounded) / scale).max()
  assert np.mean(np.abs(got - truncated) > scale) > 0.9, "the operands were truncated, not rounded"

@pytest.mark.parametrize("shape", OPT_SHAPES[:2], ids=str)
@pytest.mark.parametrize("tile", CP_ASYNC_TILES, ids=tile_id)
def test_wgmma_tf32_opt_rounds_like_the_graph(tile, shape):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  out, rounded, truncated, scale = tf32_product(*shape)
  check_tf32(run_last_kernel(out, Opt(OptOps.WGMMA, 0, tile)), rounded, truncated, scale)

def test_realize_picks_wgmma_for_a_big_tf32_matmul():
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  out, rounded, truncated, scale = tf32_product(1024, 2048, 512)
  kernel = Kernel(create_schedule([out.lazydata])[-1].ast, Device["CUDA"].renderer)
  hand_coded_optimizations(kernel)
  assert kernel.warpgroup_matmul is not None and kernel.warpgroup_matmul.dtype == dtypes.float32, kernel.applied_opts
  check_tf32(out.realize().numpy(), rounded, truncated, scale)

# ---- TMA tiles, last: a TMA kernel that traps (an illegal instruction) kills this process's CUDA context and fails
# every test after it, so each module run first launches one in a child process (bench/tma_probe.py) and, if that
# fails, fails the TMA tests with its verdict instead of running them here

TMA_PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tma_probe.py")
TMA_PROBE_CASES = ("box_eager", "mm_2x256x4_split")   # the box kernel, then the largest TMA tile
TMA_PROBE_SECONDS = 180

@pytest.fixture(scope="module")
def tma_failure() -> Optional[str]:
  """None if the probe's cases pass in a child process (or there is no Hopper GPU to try), else what went wrong."""
  if not hopper(): return None
  for case in TMA_PROBE_CASES:
    try:
      done = subprocess.run([sys.executable, TMA_PROBE, "--case", case], capture_output=True, text=True,
                            timeout=TMA_PROBE_SECONDS)
    except subprocess.TimeoutExpired: return f"{case}: no result in {TMA_PROBE_SECONDS} s (a hang)"
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if not results or not results[-1].startswith("RESULT ok"):
      tail = results[-1:] or (done.stderr or done.stdout).strip().splitlines()[-3:]
      return f"{case} (exit {done.returncode}): {' | '.join(tail)}"
  return None

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("n_major", [False, True], ids=["b_NxK", "b_KxN"])
@pytest.mark.parametrize("shape", OPT_SHAPES, ids=str)
@pytest.mark.parametrize("tile", TMA_TILES, ids=tile_id)
def test_wgmma_tma_opt_matches_numpy(tile, shape, n_major, dtype, tma_failure):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  if shape[0] == 4096 and tile != TMA_TILES[0]: pytest.skip("4096² for one TMA tile only (time)")
  if tma_failure: pytest.fail(f"a TMA kernel failed in a child process, so none runs here: {tma_failure}")
  check_opt_tile(tile, shape, n_major, dtype)

@pytest.mark.parametrize("graphs", [1, 0], ids=["cuda_graph", "plain_loop"])
def test_tma_matmul_in_a_jit_with_new_inputs_each_call(graphs, tma_failure):
  """WGMMA_TMA=1: a jitted a·b is the TMA kernel; every call gets new input buffers, so the replay (a CUDA graph node
  patched with re-encoded tensor maps, or the plain loop's launches) must load from the new pointers."""
  from tgrad import TinyJit
  from tgrad.helpers import Context
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  if tma_failure: pytest.fail(f"a TMA kernel failed in a child process, so none runs here: {tma_failure}")
  m, n, k, dtype = 1024, 2048, 512, dtypes.float16
  with Context(WGMMA_TMA=1, CUDA_GRAPH=graphs):
    probe = Kernel(create_schedule([(Tensor.empty(m, k, dtype=dtype, device="CUDA") @
                                     Tensor.empty(k, n, dtype=dtype, device="CUDA")).lazydata])[-1].ast,
                   Device["CUDA"].renderer)
    hand_coded_optimizations(probe)
    assert probe.warpgroup_matmul is not None and probe.warpgroup_matmul.tma, probe.applied_opts
    jitted = TinyJit(lambda a, b: (a @ b).realize())
    for step in range(4):
      a_bits, b_bits = bits(RNG.standard_normal((m, k)), dtype), bits(RNG.standard_normal((k, n)), dtype)
      a = Tensor(a_bits, device="CUDA").bitcast(dtype).realize()
      b = Tensor(b_bits, device="CUDA").bitcast(dtype).realize()
      out = wgmma.float_of_bits(jitted(a, b).bitcast(dtypes.uint16).numpy(), dtype)
      expected = wgmma.float_of_bits(a_bits, dtype).astype(np.float64) @ \
        wgmma.float_of_bits(b_bits, dtype).astype(np.float64)
      np.testing.assert_allclose(out, expected, rtol=2 ** -10, atol=2e-6 * k, err_msg=f"call {step}")
