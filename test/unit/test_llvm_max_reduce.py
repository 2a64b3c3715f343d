"""A float max reduce on LLVM: its accumulator update is llvm.maximum with nsz (renderer.py MAX_REDUCE_FAST_MATH: x86
runs it as vmaxps and a NaN test), an elementwise maximum keeps the strict form. Seeded random rows with NaN and ±inf
at random places, long and short, must give numpy's maxima (a NaN anywhere in a row gives NaN); a row of zeros of
both signs gives a zero (which one is left open, as numpy's and torch's max leave it)."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.device import Device
from cuda_on_cpu import rendered_kernel

def llvm_source(out: Tensor) -> str: return rendered_kernel(out, renderer=Device["LLVM"].renderer)[2]

def test_the_reduce_update_ignores_zero_signs_and_an_elementwise_maximum_does_not():
  x = Tensor(np.ones((8, 512), np.float32), device="LLVM").realize()
  assert 'call nsz float @"llvm.maximum.f32"' in llvm_source(x.max(1))
  elementwise = llvm_source(x.maximum(x * 2))
  assert '@"llvm.maximum.f32"' in elementwise and "call nsz" not in elementwise

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("columns", [1, 7, 512, 4099])
def test_row_maxima_with_nan_and_inf_match_numpy(seed, columns):
  rng = np.random.default_rng(seed)
  rows = 37
  x = rng.standard_normal((rows, columns)).astype(np.float32) * 100
  for row in range(rows):   # a few specials at random places: NaN, +inf, -inf
    for special in rng.choice([np.nan, np.inf, -np.inf], size=int(rng.integers(0, 3))):
      x[row, rng.integers(columns)] = special
  x[0] = -np.inf                            # a row of -inf only
  got = Tensor(x, device="LLVM").max(1).numpy()
  np.testing.assert_array_equal(got, x.max(1))   # NaN where a row holds one (assert_array_equal matches NaNs)

def test_zeros_of_both_signs_give_a_zero():
  x = np.zeros((4, 1000), np.float32)
  x[:, ::2] = -0.0
  got = Tensor(x, device="LLVM").max(1).numpy()
  assert (got == 0).all()
  y = np.full((3, 1000), -5.0, np.float32)
  y[:, 500] = -0.0
  np.testing.assert_array_equal(Tensor(y, device="LLVM").max(1).numpy(), y.max(1))
