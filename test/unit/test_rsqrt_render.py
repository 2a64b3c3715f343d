"""A float32 reciprocal square root renders as CUDA's rsqrtf (tgrad/ops.py: within 2 ulp), a float64 one as IEEE
square root and division. Rendered here; run on the CPU's emulation against numpy, and on a GPU against float64
within 2 ulp (special values included)."""
import numpy as np
import pytest
from tgrad import Tensor
from cuda_on_cpu import cpu_available, rendered_kernel, run_kernel_emulated

RSQRT_ULPS = 2

def cuda_source(out: Tensor) -> str: return rendered_kernel(out, arch="sm_90")[2]

def test_float32_rsqrt_is_one_call():
  x = Tensor(np.ones(37, np.float32), device="LLVM").realize()
  source = cuda_source(x.rsqrt())
  assert "rsqrtf(" in source and "1.0f /" not in source, source

def test_float16_rsqrt_is_computed_in_float32_too():
  x = Tensor(np.ones(37, np.float16), device="LLVM").realize()
  assert "rsqrtf(" in cuda_source(x.rsqrt())   # Tensor's float math on halves runs in float32, rounded at the end

def test_float64_keeps_ieee_division_and_square_root():
  x = Tensor(np.ones(37, np.float64), device="LLVM").realize()
  source = cuda_source(x.rsqrt())
  assert "rsqrtf(" not in source and "sqrt(" in source, source

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
def test_norm_values_on_emulated_cuda():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((5, 77)).astype(np.float32)
  t = Tensor(x, device="LLVM").realize()
  got, source = run_kernel_emulated(t * ((t * t).mean(-1, keepdim=True) + 1e-6).rsqrt())
  assert "rsqrtf(" in source
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(got.reshape(x.shape), x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6), rtol=2e-6)

def ulps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """How many float32 values lie between a and b (same-sign finite values; equal specials are 0)."""
  ai, bi = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
  return np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0, np.abs(ai - bi))

@pytest.mark.gpu
def test_rsqrt_on_the_gpu_within_two_ulps():
  rng = np.random.default_rng(0)
  x = np.concatenate([np.exp(rng.uniform(-80, 80, 100_000)).astype(np.float32),
                      np.array([0.0, -0.0, np.inf, -1.0, np.nan, 1e-45, 3e38], np.float32)])
  got = Tensor(x, device="CUDA").rsqrt().numpy()
  with np.errstate(divide="ignore", invalid="ignore"):
    want = (1 / np.sqrt(x.astype(np.float64))).astype(np.float32)
  assert ulps_apart(got, want).max() <= RSQRT_ULPS
