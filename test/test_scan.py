"""Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) against numpy and torch: long axes, every dtype, any axis.

The scan is blocked (tgrad/tensor_ops/reduce.py, SCAN_BLOCK): these tests cover lengths at and just past block and
2^15 boundaries, 10^6 elements, random shapes/axes/dtypes, gradients against torch and the kernel count of a long scan.
"""
import numpy as np
import pytest
import torch
from tgrad import Tensor, dtypes
from tgrad.schedule import create_schedule
from tgrad.tensor_ops.reduce import SCAN_BLOCK
from torch_compare import compare_with_torch

RNG = np.random.default_rng(10)
LONG_SIZES = [1, SCAN_BLOCK, SCAN_BLOCK + 1, 32768, 32769, 10 ** 6]

def float32_atol(reference: np.ndarray) -> float:
  """A float32 running sum is off by about eps·|partial sums| per level; allow 16 float32 ulps of the largest one."""
  return 16 * float(np.finfo(np.float32).eps) * max(1.0, float(np.abs(reference).max(initial=0)))

@pytest.mark.parametrize("n", LONG_SIZES)
def test_cumsum_long_float(n):
  x = RNG.uniform(-1, 1, n).astype(np.float32)
  want = np.cumsum(x.astype(np.float64))
  np.testing.assert_allclose(Tensor(x).cumsum().numpy(), want, rtol=0, atol=float32_atol(want))

@pytest.mark.parametrize("n", LONG_SIZES)
def test_cumsum_long_int_exact(n):
  x = RNG.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)   # int32 sums are int64, as numpy's
  got = Tensor(x).cumsum()
  assert got.dtype == dtypes.int64
  np.testing.assert_array_equal(got.numpy(), np.cumsum(x))

def test_cumsum_ones_past_2_31_window():
  """The old O(n²) window view passed 2^31 elements at n = 32769 and returned zeros."""
  np.testing.assert_array_equal(Tensor.ones(50000, dtype=dtypes.int32).cumsum().numpy(), np.arange(1, 50001))

@pytest.mark.parametrize("n", [SCAN_BLOCK + 1, 32769, 10 ** 6])
def test_cumprod_long(n):
  x = RNG.uniform(0.999, 1.001, n)     # stays near 1: no overflow over 10^6 factors
  np.testing.assert_allclose(Tensor(x).cumprod().numpy(), np.cumprod(x), rtol=1e-12)
  ints = RNG.integers(-3, 4, n).astype(np.int32)     # int64 products wrap long before the end: exact modular products
  np.testing.assert_array_equal(Tensor(ints).cumprod().numpy(), np.cumprod(ints))
  small = RNG.uniform(0.9999, 1.0001, min(n, 32769)).astype(np.float32)
  np.testing.assert_allclose(Tensor(small).cumprod().numpy(), np.cumprod(small.astype(np.float64)), rtol=2e-7)

@pytest.mark.parametrize("n", [SCAN_BLOCK + 1, 10 ** 6])
def test_cummax_cummin_long(n):
  x = RNG.normal(size=n).astype(np.float32)
  x[RNG.integers(0, n, max(1, n // 100))] = -np.inf
  x[RNG.integers(0, n, 3)] = np.inf
  np.testing.assert_array_equal(Tensor(x).cummax()[0].numpy(), np.maximum.accumulate(x))
  np.testing.assert_array_equal(Tensor(x).cummin()[0].numpy(), np.minimum.accumulate(x))
  ints = RNG.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
  ints[0] = np.iinfo(np.int32).min     # the identity of max for int32 must not be mistaken for a value
  np.testing.assert_array_equal(Tensor(ints).cummax()[0].numpy(), np.maximum.accumulate(ints))
  np.testing.assert_array_equal(Tensor(ints).cummin()[0].numpy(), np.minimum.accumulate(ints))
  descending = -np.arange(n, dtype=np.float32) - 1    # -inf never wins, the first value carries all the way
  np.testing.assert_array_equal(Tensor(descending).cummax()[0].numpy(), np.full(n, -1, np.float32))

def test_cummax_nan_propagates_like_numpy():
  x = np.array([1, 3, np.nan, 5, -np.inf] * 20, np.float32)
  np.testing.assert_array_equal(Tensor(x).cummax()[0].numpy(), np.maximum.accumulate(x))
  np.testing.assert_array_equal(Tensor(x).cummin()[0].numpy(), np.minimum.accumulate(x))

NUMPY_SCANS = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
               "cummin": np.minimum.accumulate}
SCAN_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.uint32, np.bool_]

def random_values(shape: tuple, dtype, op: str) -> np.ndarray:
  if dtype == np.bool_: return RNG.random(shape) < 0.3
  if np.dtype(dtype).kind == "f":
    return (RNG.uniform(0.9, 1.1, shape) if op == "cumprod" else RNG.uniform(-3, 3, shape)).astype(dtype)
  info = np.iinfo(dtype)
  low, high = (-3, 4) if op == "cumprod" else (info.min, info.max)
  return RNG.integers(max(low, info.min), min(high, info.max), shape, endpoint=True).astype(dtype)

def numpy_scan(x: np.ndarray, op: str, axis: int, out_dtype) -> np.ndarray:
  """The numpy result in tgrad's dtype: sums and products of small ints and bools are int32 (they wrap there)."""
  wide = x.astype(np.float64) if x.dtype.kind == "f" else x
  if op in ("cumsum", "cumprod") and x.dtype.kind in "biu": wide = x.astype(np.int64 if x.dtype.kind != "u" else
                                                                               np.uint64)
  return NUMPY_SCANS[op](wide, axis=axis).astype(out_dtype)

@pytest.mark.parametrize("case", range(20))
def test_random_shapes_axes_dtypes(case):
  rng = np.random.default_rng(1000 + case)
  ndim = int(rng.integers(1, 4))
  shape = tuple(int(s) for s in rng.choice([1, 2, 3, 5, 31, 32, 33, 100, 1025, 3000], ndim))
  while np.prod(shape) > 200_000: shape = shape[1:]
  axis = int(rng.integers(-len(shape), len(shape)))
  dtype = SCAN_DTYPES[int(rng.integers(len(SCAN_DTYPES)))]
  op = ("cumsum", "cumprod", "cummax", "cummin")[int(rng.integers(4))]
  x = random_values(shape, dtype, op)
  got = getattr(Tensor(x), op)(axis)
  got = (got[0] if isinstance(got, tuple) else got).numpy()
  want = numpy_scan(x, op, axis, got.dtype)
  context = f"{op} of {shape} {np.dtype(dtype).name} along {axis}"
  if got.dtype.kind in "biu": np.testing.assert_array_equal(got, want, err_msg=context)
  else:
    rtol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=rtol, atol=float32_atol(want) if op == "cumsum" else 0,
                               err_msg=context)
  expected_dtype = {"cumsum": None, "cumprod": None}.get(op, np.dtype(dtype))
  if expected_dtype is not None: assert got.dtype == expected_dtype, context

def test_sum_dtypes_of_scans():
  assert Tensor([True, False]).cumsum().dtype == dtypes.int64     # numpy's: bools and signed ints sum to int64
  assert Tensor([1, 2], dtype=dtypes.uint8).cumsum().dtype == dtypes.uint64
  assert Tensor([1, 2], dtype=dtypes.int64).cumprod().dtype == dtypes.int64
  assert Tensor([1, 2], dtype=dtypes.float16).cumsum().dtype == dtypes.float16
  assert Tensor([1, 2], dtype=dtypes.int8).cummax()[0].dtype == dtypes.int8
  assert Tensor([True, False]).cummin()[0].dtype == dtypes.bool

def test_edge_shapes():
  assert Tensor.zeros(0).cumsum().shape == (0,)
  assert Tensor.zeros(40, 0).cumsum(0).shape == (40, 0) and Tensor.zeros(0, 40).cummax(1)[0].shape == (0, 40)
  assert Tensor(3.0).cumsum().item() == 3.0 and Tensor(3.0).cummax()[0].item() == 3.0
  with pytest.raises(IndexError, match="axis 2"): Tensor.ones(3, 4).cumsum(2)

def test_kernel_count_of_a_long_scan():
  """2 kernels per level (block totals; in-block prefix fused with the carry) and one for the last level."""
  x = Tensor(RNG.uniform(size=10 ** 6).astype(np.float32)).realize()
  levels = int(np.ceil(np.log(10 ** 6) / np.log(SCAN_BLOCK)))
  assert len(create_schedule([x.cumsum().lazydata])) == 2 * levels - 1

@pytest.mark.parametrize("shape, axis", [((1100,), 0), ((70, 2, 3), 0)])
def test_cumsum_gradient_matches_torch(shape, axis):
  compare_with_torch(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), [shape], atol=1e-4, rtol=1e-5, rng=RNG)

@pytest.mark.parametrize("shape, axis", [((3, 70), 1), ((5,), 0)])
def test_gradients_match_torch(shape, axis):
  compare_with_torch(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), [shape], atol=1e-4, rtol=1e-5, rng=RNG)
  compare_with_torch(lambda x: x.cumprod(axis), lambda x: x.cumprod(axis), [shape], low=0.99, high=1.01,
                     atol=1e-5, rtol=1e-4, rng=RNG)
  compare_with_torch(lambda x: x.logcumsumexp(axis), lambda x: x.logcumsumexp(axis), [shape], atol=1e-5,
                     rtol=1e-5, rng=RNG)
  distinct = [RNG.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32)]   # no ties
  compare_with_torch(lambda x: x.cummax(axis).values, lambda x: x.cummax(axis)[0], values=distinct, rng=RNG)
  compare_with_torch(lambda x: x.cummin(axis).values, lambda x: x.cummin(axis)[0], values=distinct, rng=RNG)

def test_logcumsumexp_extremes():
  x = np.array([-1000, 0, -np.inf, 5, 1000, 1000] + list(RNG.normal(size=100)) + [np.inf, 3], np.float32)
  want = torch.logcumsumexp(torch.tensor(x), 0).numpy()
  np.testing.assert_allclose(Tensor(x).logcumsumexp().numpy(), want, rtol=1e-6)
  all_minus_inf = np.full(70, -np.inf, np.float32)
  np.testing.assert_array_equal(Tensor(all_minus_inf).logcumsumexp().numpy(), all_minus_inf)
  long = RNG.normal(size=(2, 1500)).astype(np.float32) * 10
  np.testing.assert_allclose(Tensor(long).logcumsumexp(1).numpy(),
                             torch.logcumsumexp(torch.tensor(long, dtype=torch.float64), 1).numpy(), rtol=1e-5)
  assert Tensor([1, 2, 3]).logcumsumexp().dtype == dtypes.float32
