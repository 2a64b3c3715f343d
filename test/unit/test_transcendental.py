"""The polynomial exp2/log2/sin used on the CPU, against numpy over the whole float32 range and special values."""
import numpy as np
import pytest
from tgrad.tensor import Tensor
from tgrad import dtypes

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.17e-38, 3.4e38, -3.4e38], dtype=np.float32)

def ulp_error(actual: np.ndarray, expected: np.ndarray) -> float:
  finite = np.isfinite(expected)
  spacing = np.spacing(np.abs(expected[finite]).astype(np.float32))
  return float(np.max(np.abs(actual[finite].astype(np.float64) - expected[finite]) / spacing, initial=0.0))

def test_exp2_float32():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.uniform(-160, 140, 20000), rng.uniform(-1, 1, 5000), SPECIALS]).astype(np.float32)
  out = Tensor(x).exp2().numpy()
  expected = np.exp2(x.astype(np.float64))
  assert ulp_error(out, expected.astype(np.float32).astype(np.float64)) <= 2
  np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
  np.testing.assert_array_equal(out[np.isinf(expected)], expected[np.isinf(expected)])

def test_log2_float32():
  rng = np.random.default_rng(1)
  x = np.concatenate([np.exp(rng.uniform(-100, 88, 20000)), rng.uniform(0.5, 2, 5000), SPECIALS,
                      [1e-40, 5e-42, -1.0, 1.0, 2.0]]).astype(np.float32)
  out = Tensor(x).log2().numpy()
  with np.errstate(all="ignore"): expected = np.log2(x.astype(np.float64))
  assert ulp_error(out, expected.astype(np.float32).astype(np.float64)) <= 4
  np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
  np.testing.assert_array_equal(out[np.isinf(expected)], expected[np.isinf(expected)])

def test_sin_float32_is_exact_for_huge_arguments():
  x = np.array([1e7, 3e9, 1e30, -2.5e12], np.float32)
  np.testing.assert_allclose(Tensor(x).sin().numpy(), np.sin(x.astype(np.float64)), atol=1e-6)

def test_sin_float32():
  rng = np.random.default_rng(2)
  x = np.concatenate([rng.uniform(-100, 100, 20000), rng.uniform(-1e4, 1e4, 2000)]).astype(np.float32)
  np.testing.assert_allclose(Tensor(x).sin().numpy(), np.sin(x.astype(np.float64)), atol=4e-7, rtol=0)
  assert np.isnan(Tensor(np.array([np.inf, -np.inf, np.nan], np.float32)).sin().numpy()).all()

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_half_types_compute_in_float32(dtype):
  x = np.linspace(-8, 8, 101, dtype=np.float32)
  rounded_input = Tensor(x, dtype=dtype).cast(dtypes.float32).numpy()
  out = Tensor(x, dtype=dtype).exp2().numpy().astype(np.float32)
  tolerance = 2 ** -11 if dtype == dtypes.float16 else 2 ** -8   # half an ulp of the result's format
  np.testing.assert_allclose(out, np.exp2(rounded_input), rtol=tolerance)
