"""The wgmma matmul kernel (runtime/cuda/wgmma.py) on a Hopper GPU (compute capability 9.0: wgmma is sm_90a only):
out = a·bᵀ for float16 and bfloat16 against numpy's float32 product of the same rounded inputs, into outputs
poisoned with NaN (0xFFFF) so an element the kernel fails to write shows. Sizes: 4096², odd M and N with a partial K
tile, tiles smaller than a block, and every tile configuration the kernel offers a test for. Skipped without an
sm_90 GPU; the CPU-side checks are test/unit/test_wgmma.py."""
import numpy as np
import pytest
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
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
