"""3xTF32 (OptOps.TF32X3, runtime/cuda/wgmma_split.py) on a Hopper GPU (compute capability 9.0): tgrad's plain float32
matmul kernels with every tile of SPLIT_TILES, both B layouts (a·b with b K×N, a·wᵀ with w N×K), whole and ragged
tiles, into outputs poisoned with NaN, against a float64 product: within a float32-class bound and MAX_ERROR_RATIO of
numpy's float32 product; then realize (the heuristics' default on sm_90a) and F32_MATMUL=simt. Skipped without an
sm_90 GPU; the CPU-side checks (NVRTC, the CPU emulator) are test/unit/test_wgmma_split.py."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.warpgroup_mma import SPLIT_TILES
from tgrad.device import Device
from tgrad.helpers import Context
from tgrad.schedule import create_schedule
from test_wgmma_gpu import hopper, run_last_kernel  # the last kernel with one opt, on a poisoned output

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(3)
SHAPES = [(512, 640, 1024), (200, 136, 44)]   # (M, N, K): whole tiles; partial tiles on M, N and K
# the tensor cores' float32 accumulation (each wgmma's sum truncated) adds to the split's error: 4.2-4.3x numpy
# float32's on an H100 at 4096³ (bench/sgemm.py); a lost small-part term would be ~1000x
MAX_ERROR_RATIO = 6.0

def product(m: int, n: int, k: int, b_n_major: bool):
  """(lazy a·b on CUDA, a, b as K×N numpy) with b stored K×N or N×K."""
  a = RNG.standard_normal((m, k)).astype(np.float32)
  b = RNG.standard_normal((k, n) if b_n_major else (n, k)).astype(np.float32)
  b_tensor = Tensor(b, device="CUDA")
  out = Tensor(a, device="CUDA") @ (b_tensor if b_n_major else b_tensor.T)
  return out, a, (b if b_n_major else b.T)

def relative_error(got: np.ndarray, a: np.ndarray, b_kn: np.ndarray) -> float:
  a64, b64 = a.astype(np.float64), b_kn.astype(np.float64)
  return float(np.max(np.abs(got - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))

def check(got: np.ndarray, a: np.ndarray, b_kn: np.ndarray) -> None:
  """float32-class: within 2^-20 + K/2 float32 roundings of Σ|a·b|, and MAX_ERROR_RATIO of numpy float32's error."""
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  error, float32_error = relative_error(got, a, b_kn), relative_error(a @ b_kn, a, b_kn)
  assert error <= 2.0 ** -20 + (a.shape[1] / 2 + 4) * 2.0 ** -24, error
  assert error <= MAX_ERROR_RATIO * float32_error, (error, float32_error)

@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("tile", range(len(SPLIT_TILES)), ids=lambda i: "x".join(map(str, SPLIT_TILES[i])))
def test_tf32x3_opt_is_float32_class(tile, shape, b_n_major):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  out, a, b_kn = product(*shape, b_n_major)
  check(run_last_kernel(out, Opt(OptOps.TF32X3, 0, tile)), a, b_kn)

@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
def test_realize_picks_3xtf32_for_a_big_float32_matmul_by_default_and_simt_under_the_setting(b_n_major):
  if not hopper(): pytest.skip("wgmma needs compute capability 9.0 (sm_90a)")
  with Context():   # the default F32_MATMUL=3xtf32
    out, a, b_kn = product(1024, 2048, 512, b_n_major)
    kernel = Kernel(create_schedule([out.lazydata])[-1].ast, Device["CUDA"].renderer)
    hand_coded_optimizations(kernel)
    assert kernel.applied_opts[0].op is OptOps.TF32X3, kernel.applied_opts
    check(out.numpy(), a, b_kn)
  with Context(F32_MATMUL="simt"):
    out, a, b_kn = product(1024, 2048, 512, b_n_major)
    kernel = Kernel(create_schedule([out.lazydata])[-1].ast, Device["CUDA"].renderer)
    hand_coded_optimizations(kernel)
    assert kernel.simt_matmul is not None, kernel.applied_opts
    got = out.numpy()
  np.testing.assert_allclose(got, a.astype(np.float64) @ b_kn, rtol=1e-4, atol=1e-4 * np.sqrt(512))
