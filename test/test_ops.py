"""Tensor ops against numpy and torch: values, dtypes, gradients and user errors.

`helper_test_op` runs one function on torch and on tgrad with the same random inputs and compares the outputs and
(by default) the gradients of a scalar made from them. Integer and bool results are compared exactly.
"""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes
from torch_compare import compare, compare_with_torch

RNG = np.random.default_rng(0)
FLOAT_ATOL, FLOAT_RTOL = 1e-6, 1e-5          # float32 arithmetic
TRANSCENDENTAL_RTOL = 1e-5                   # exp, log, sin, ... (relative)
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4

def helper_test_op(shapes, torch_fn, tgrad_fn=None, atol=FLOAT_ATOL, rtol=FLOAT_RTOL, grad=True, grad_atol=GRAD_ATOL,
                   grad_rtol=GRAD_RTOL, low=-2.0, high=2.0, values=None):
  """Compare tgrad_fn (default: torch_fn) with torch_fn on float32 inputs of `shapes` (or the given `values`)."""
  compare_with_torch(torch_fn, tgrad_fn, shapes=shapes, values=values, atol=atol, rtol=rtol, grad_atol=grad_atol,
                     grad_rtol=grad_rtol, low=low, high=high, grad=grad, rng=RNG)

# ---------------------------------------------------------------------------------------------------------------
# creation

class TestCreation:
  def test_from_list_and_scalars(self):
    assert Tensor([1, 2, 3]).dtype == dtypes.int32
    assert Tensor([1.0, 2]).dtype == dtypes.float32
    assert Tensor([True, False]).dtype == dtypes.bool
    assert Tensor(2.5).shape == () and Tensor(2.5).item() == 2.5
    assert Tensor(3).dtype == dtypes.int32 and Tensor(3).item() == 3
    np.testing.assert_array_equal(Tensor([[1, 2], [3, 4]]).numpy(), np.array([[1, 2], [3, 4]], dtype=np.int32))
    assert Tensor([]).shape == (0,) and Tensor([]).numpy().shape == (0,)
    assert Tensor([1, 2], dtype=dtypes.float16).numpy().dtype == np.float16

  @pytest.mark.parametrize("npdtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8, np.bool_])
  def test_from_numpy_keeps_dtype(self, npdtype):
    data = (RNG.uniform(-50, 50, size=(3, 5)) > 0) if npdtype == np.bool_ else RNG.uniform(-50, 50, size=(3, 5))
    data = np.abs(data).astype(npdtype) if npdtype == np.uint8 else data.astype(npdtype)
    out = Tensor(data).numpy()
    assert out.dtype == data.dtype
    np.testing.assert_array_equal(out, data)

  def test_from_numpy_scalars(self):
    # np.float64 subclasses Python's float: it made a bool tensor (found by test/fuzz_ops.py)
    for scalar in (np.float64(0.125), np.float32(-2.5), np.float16(1.5), np.int64(-3), np.int8(7), np.bool_(True)):
      t = Tensor(scalar)
      assert t.shape == () and t.dtype == dtypes.from_np(scalar.dtype), (scalar, t.dtype)
      assert t.item() == scalar
    assert Tensor([np.float64(0.5)]).dtype == dtypes.float32 and Tensor([np.float64(0.5)]).item() == 0.5

  def test_host_array_is_copied(self):
    data = np.arange(4, dtype=np.float32)
    t = Tensor(data)
    data[0] = 100
    assert t.numpy()[0] == 0

  def test_bfloat16_rounds_like_torch(self):
    values = np.concatenate([RNG.normal(size=200).astype(np.float32) * 100,
                             np.array([1 + 2 ** -8, 1 + 3 * 2 ** -9, 65504.0, -0.0, np.inf, -np.inf], np.float32)])
    got = Tensor(values, dtype=dtypes.bfloat16)
    assert got.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(got.numpy(), torch.tensor(values).bfloat16().float().numpy())

  def test_full_zeros_ones_empty(self):
    np.testing.assert_array_equal(Tensor.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(Tensor.ones((4,)).numpy(), np.ones(4, np.float32))
    assert Tensor.full((2, 2), 7).dtype == dtypes.int32 and Tensor.full((2, 2), 7).numpy().sum() == 28
    assert Tensor.full((), 1.5).item() == 1.5
    assert Tensor.empty(3, 2).shape == (3, 2) and Tensor.empty(3, 2).numpy().shape == (3, 2)
    assert Tensor.zeros(0, 4).numpy().shape == (0, 4)
    x = Tensor([[1, 2]], dtype=dtypes.int8)
    for like, value in ((x.zeros_like(), 0), (x.ones_like(), 1), (x.full_like(5), 5)):
      assert like.dtype == dtypes.int8 and like.shape == (1, 2) and (like.numpy() == value).all()
    assert x.empty_like().shape == (1, 2)

  @pytest.mark.parametrize("args", [(5,), (2, 9), (2, 9, 3), (10, 2, -3), (0.5, 3.0, 0.25), (3, 3), (-2.5, 2.5, 0.7)])
  def test_arange(self, args):
    got, want = Tensor.arange(*args).numpy(), np.arange(*args)
    assert got.dtype == (np.float32 if any(isinstance(a, float) for a in args) else np.int32)
    np.testing.assert_allclose(got, want, atol=1e-6)

  @pytest.mark.parametrize("args", [(0, 0, -1), (5, 4, -1), (200, 3, -7), (10, 0, -3), (255, -1, -1)])
  @pytest.mark.parametrize("npdtype", [np.uint8, np.uint64])
  def test_arange_unsigned_negative_step(self, args, npdtype):
    # fuzz_ops seed 0 cases 3632, 7301: a negative step raised OverflowError for unsigned dtypes (torch allows it)
    got = Tensor.arange(*args, dtype=dtypes.uint8 if npdtype is np.uint8 else dtypes.uint64).numpy()
    want = np.arange(*args).astype(npdtype)
    assert got.dtype == npdtype
    np.testing.assert_array_equal(got, want)

  def test_linspace_eye(self):
    np.testing.assert_allclose(Tensor.linspace(-1, 3, 7).numpy(), np.linspace(-1, 3, 7), rtol=1e-6)
    np.testing.assert_allclose(Tensor.linspace(0, 1, 1).numpy(), np.linspace(0, 1, 1))
    np.testing.assert_array_equal(Tensor.eye(3).numpy(), np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal(Tensor.eye(2, 4, dtype=dtypes.int32).numpy(), np.eye(2, 4, dtype=np.int32))

class TestRandom:
  def test_rand_range_and_moments(self):
    Tensor.manual_seed(1)
    x = Tensor.rand(100_000).numpy()
    assert x.dtype == np.float32 and x.min() >= 0 and x.max() < 1
    assert abs(x.mean() - 0.5) < 0.01 and abs(x.var() - 1 / 12) < 0.005
    assert len(np.unique(x)) > 99_000   # not a short cycle

  def test_rand_half_stays_below_one(self):
    x = Tensor.rand(50_000, dtype=dtypes.float16).numpy()
    assert x.dtype == np.float16 and x.min() >= 0 and x.max() < 1

  def test_seed_determinism_and_fresh_calls(self):
    Tensor.manual_seed(42)
    a, b = Tensor.rand(64).numpy(), Tensor.rand(64).numpy()
    Tensor.manual_seed(42)
    np.testing.assert_array_equal(Tensor.rand(64).numpy(), a)
    assert not np.array_equal(a, b)
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(64).numpy(), a)

  def test_randn(self):
    Tensor.manual_seed(3)
    x = Tensor.randn(200, 500).numpy()
    assert x.shape == (200, 500) and abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01
    assert abs(((x - x.mean()) ** 3).mean()) < 0.03   # symmetric
    assert np.isfinite(x).all()

  def test_randint_uniform_normal(self):
    Tensor.manual_seed(5)
    r = Tensor.randint(1000, low=-3, high=4).numpy()
    assert r.dtype == np.int32 and r.min() == -3 and r.max() == 3
    r2 = Tensor.randint(2, 8, (10, 10)).numpy()      # torch's (low, high, shape) form
    assert r2.shape == (10, 10) and r2.min() >= 2 and r2.max() < 8
    u = Tensor.uniform(10_000, low=-2, high=6).numpy()
    assert u.min() >= -2 and u.max() < 6 and abs(u.mean() - 2) < 0.1
    n = Tensor.normal(20_000, mean=3, std=0.5).numpy()
    assert abs(n.mean() - 3) < 0.02 and abs(n.std() - 0.5) < 0.02

  def test_init_helpers(self):
    for fn, bound in ((Tensor.scaled_uniform, (20 * 30) ** -0.5), (Tensor.glorot_uniform, math.sqrt(6 / 50)),
                      (Tensor.kaiming_uniform, math.sqrt(3) * math.sqrt(2 / (1 + 0.01 ** 2)) / math.sqrt(30))):
      w = fn(20, 30).numpy()
      assert w.shape == (20, 30) and np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    x = Tensor.zeros(3, 4)
    assert x.rand_like().shape == (3, 4) and x.randn_like().dtype == dtypes.float32

# ---------------------------------------------------------------------------------------------------------------
# elementwise

BINARY_SHAPES = [[(45, 65), (45, 65)], [(3, 1, 5), (4, 1)], [(), (7,)], [(1,), (2, 3)], [(0, 3), (3,)]]

class TestBinary:
  @pytest.mark.parametrize("shapes", BINARY_SHAPES)
  def test_add_sub_mul(self, shapes):
    helper_test_op(shapes, lambda x, y: x + y)
    helper_test_op(shapes, lambda x, y: x - y)
    helper_test_op(shapes, lambda x, y: x * y)

  @pytest.mark.parametrize("shapes", BINARY_SHAPES[:3])
  def test_div(self, shapes):
    helper_test_op(shapes, lambda x, y: x / y, low=0.5, high=3)
    helper_test_op(shapes, lambda x, y: x / (y - 4), low=0.5, high=3)

  def test_scalars_and_reflected(self):
    helper_test_op([(3, 4)], lambda x: 2 - x)
    helper_test_op([(3, 4)], lambda x: 2 / (x + 3))
    helper_test_op([(3, 4)], lambda x: 1.5 * x + 0.5)
    helper_test_op([(3, 4)], lambda x: torch.clamp(x, min=0.25), lambda x: x.maximum(0.25))

  def test_maximum_minimum(self):
    helper_test_op([(5, 7), (5, 7)], torch.maximum, Tensor.maximum)
    helper_test_op([(5, 7), (7,)], torch.minimum, Tensor.minimum)
    ties = [np.array([1, 2, 3, -1], np.float32), np.array([1, 0, 3, 4], np.float32)]
    helper_test_op(None, torch.maximum, Tensor.maximum, values=ties)
    a = np.array([3, -5, 2 ** 31 - 1, -2 ** 31], np.int32)
    b = np.array([-7, 4, 0, 5], np.int32)
    np.testing.assert_array_equal(Tensor(a).minimum(Tensor(b)).numpy(), np.minimum(a, b))
    np.testing.assert_array_equal(Tensor(a).maximum(Tensor(b)).numpy(), np.maximum(a, b))
    nan = Tensor([np.nan, 1.0]).maximum(Tensor([0.0, np.nan])).numpy()
    assert np.isnan(nan).all()

  def test_int_floordiv_mod_match_python(self):
    a = np.array([7, -7, 7, -7, 0, 5, -5, 13, -13, 2 ** 31 - 1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 0, 0, 5, -5, 7], np.int32)
    with np.errstate(all="ignore"):
      np.testing.assert_array_equal((Tensor(a) // Tensor(b)).numpy(), a // b)
      np.testing.assert_array_equal((Tensor(a) % Tensor(b)).numpy(), a % b)
    np.testing.assert_array_equal((Tensor(a) // 3).numpy(), a // 3)
    np.testing.assert_array_equal((Tensor(a) % -3).numpy(), a % -3)
    np.testing.assert_array_equal((17 // Tensor(b[:5])).numpy(), 17 // b[:5])
    assert (Tensor(a) // Tensor(b)).dtype == dtypes.int32

  def test_float_floordiv_mod(self):
    helper_test_op([(4, 5), (4, 5)], lambda x, y: x // y, low=0.5, high=4, grad=False)
    a = RNG.uniform(-5, 5, 30).astype(np.float32)
    b = (RNG.uniform(0.5, 2, 30) * RNG.choice([-1, 1], 30)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) % Tensor(b)).numpy(), np.mod(a, b).astype(np.float32), atol=1e-5)

  @pytest.mark.parametrize("npdtype", [np.float16, np.float32, np.float64])
  def test_float_floordiv_mod_edge_cases_match_numpy(self, npdtype):
    # numpy's (and torch's) float // and % come from the exact fmod; a - b*floor(a/b) differed: 7 // -inf was -0.0
    # (numpy: -1), 7 % -inf NaN (numpy: -inf), and signs of zero and huge quotients were off
    a = np.array([7, -7, 7, -7, np.inf, -np.inf, 7, 0, -0.0, 5, 1e30, 3, 5.5, -5.5, 0.0, -0.0, 1, -1, 1e-45, np.nan, 2],
                 np.float32).astype(npdtype)
    b = np.array([-np.inf, np.inf, np.inf, -np.inf, 2, 2, 0, 0, 3, -0.0, 3e-30, 1e30, 2, 2, -3, -3, 0.1, 0.1, -3, 1,
                  np.nan], np.float32).astype(npdtype)
    with np.errstate(all="ignore"):
      for got, want in (((Tensor(a) // Tensor(b)).numpy(), np.floor_divide(a, b)),
                        ((Tensor(a) % Tensor(b)).numpy(), np.remainder(a, b))):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))

  def test_float_mod_of_big_ints_is_exact(self):
    # fuzz_ops seed 0 case 3999: int64 values near 2^40 % 3.0 are float32 % float32, exactly as numpy computes it
    # (a - b*floor(a/b) in float32 gave 32768 or 0 for remainders 0, 1, 2)
    x = np.random.default_rng(3999).integers(-2**40, 2**40, (143, 6), endpoint=True, dtype=np.int64)
    got, want = (Tensor(x) % 3.0).numpy(), x.astype(np.float32) % np.float32(3.0)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal((Tensor(x) // 3.0).numpy(), x.astype(np.float32) // np.float32(3.0))
    helper_test_op([(4, 5), (4, 5)], lambda x, y: x % y, low=0.5, high=4)   # gradients: 1 and -(x // y)

  def test_int_division_is_float(self):
    out = Tensor([1, 2, 3]) / Tensor([2, 2, 2])
    assert out.dtype == dtypes.float32
    np.testing.assert_allclose(out.numpy(), [0.5, 1, 1.5])
    assert (Tensor([7, -7]).div(2, rounding_mode="trunc")).tolist() == [3, -3]
    assert (Tensor([7, -7]).div(2, rounding_mode="floor")).tolist() == [3, -4]

  def test_pow(self):
    helper_test_op([(4, 5)], lambda x: x ** 2)
    helper_test_op([(4, 5)], lambda x: x ** 3)
    helper_test_op([(4, 5)], lambda x: x ** -1, low=0.5, high=2)
    helper_test_op([(4, 5)], lambda x: x ** 0.5, low=0.1, high=2, rtol=1e-5)
    helper_test_op([(4, 5)], lambda x: x ** 1.7, low=0.1, high=2, rtol=1e-5)
    helper_test_op([(4, 5), (4, 5)], lambda x, y: x ** y, low=0.2, high=2, rtol=2e-5, grad_rtol=1e-3)
    helper_test_op([(6,)], lambda x: 2.0 ** x, rtol=1e-5)

  def test_pow_numpy_semantics(self):
    base = np.array([-2, -2, -2, -0.5, 0, 0, 0, 3, np.nan, 1], np.float32)
    exponent = np.array([3, 2, 0.5, -3, 2, 0, -1, 0, 0, np.nan], np.float32)
    with np.errstate(all="ignore"):
      np.testing.assert_allclose((Tensor(base) ** Tensor(exponent)).numpy(), base ** exponent, rtol=1e-6)
    assert (Tensor([-3.0]) ** 3).item() == -27.0
    i = np.array([-3, 0, 2, 5, 1, -1], np.int32)
    e = np.array([3, 4, 0, 5, 9, 7], np.int32)
    np.testing.assert_array_equal((Tensor(i) ** Tensor(e)).numpy(), i ** e)
    np.testing.assert_array_equal((Tensor(i) ** 3).numpy(), i ** 3)
    assert (Tensor(i) ** 2).dtype == dtypes.int32

  def test_comparisons(self):
    a = RNG.integers(-3, 3, size=(4, 6)).astype(np.float32)
    b = RNG.integers(-3, 3, size=(6,)).astype(np.float32)
    for fn in (lambda x, y: x < y, lambda x, y: x <= y, lambda x, y: x > y, lambda x, y: x >= y,
               lambda x, y: x == y, lambda x, y: x != y):
      got = fn(Tensor(a), Tensor(b))
      assert got.dtype == dtypes.bool
      np.testing.assert_array_equal(got.numpy(), fn(a, b))
    np.testing.assert_array_equal((Tensor(a) <= 1).numpy(), a <= 1)
    np.testing.assert_array_equal((1 < Tensor(a)).numpy(), 1 < a)
    with_nan = np.array([np.nan, 1, 2], np.float32)
    for fn in (lambda x, y: x <= y, lambda x, y: x >= y, lambda x, y: x == y, lambda x, y: x != y):
      np.testing.assert_array_equal(fn(Tensor(with_nan), 1.0).numpy(), fn(with_nan, 1.0))

  def test_bitwise_and_shifts(self):
    a = RNG.integers(-100, 100, size=(5, 4)).astype(np.int32)
    b = RNG.integers(-100, 100, size=(4,)).astype(np.int32)
    for fn in (lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y):
      np.testing.assert_array_equal(fn(Tensor(a), Tensor(b)).numpy(), fn(a, b))
    np.testing.assert_array_equal((~Tensor(a)).numpy(), ~a)
    np.testing.assert_array_equal((Tensor(a) << 3).numpy(), a << 3)
    np.testing.assert_array_equal((Tensor(a) >> 2).numpy(), a >> 2)
    u = np.array([1, 2 ** 31, 2 ** 32 - 1], np.uint32)
    np.testing.assert_array_equal((Tensor(u) >> 4).numpy(), u >> 4)
    np.testing.assert_array_equal((~Tensor(u)).numpy(), ~u)
    shifts = np.array([0, 1, 31, 5], np.int32)
    minus_eight = np.full(4, -8, np.int32)
    np.testing.assert_array_equal((Tensor(minus_eight) >> Tensor(shifts)).numpy(), minus_eight >> shifts)
    p, q = np.array([True, True, False]), np.array([True, False, False])
    np.testing.assert_array_equal((Tensor(p) & Tensor(q)).numpy(), p & q)
    np.testing.assert_array_equal((Tensor(p) ^ Tensor(q)).numpy(), p ^ q)
    np.testing.assert_array_equal((~Tensor(p)).numpy(), ~p)
    np.testing.assert_array_equal(Tensor(p).logical_not().numpy(), ~p)

  def test_where(self):
    helper_test_op([(3, 4), (3, 4)], lambda x, y: torch.where(x > 0, x, y), lambda x, y: (x > 0).where(x, y))
    helper_test_op([(3, 1), (4,)], lambda x, y: torch.where(x > y, x, y), lambda x, y: Tensor.where(x > y, x, y))
    c = np.array([True, False, True])
    np.testing.assert_array_equal(Tensor(c).where(1, 0).numpy(), np.where(c, 1, 0))
    assert Tensor(c).where(1, 0.5).dtype == dtypes.float32
    assert Tensor(c).where(Tensor([1, 2, 3]), 0).dtype == dtypes.int32
    np.testing.assert_array_equal(Tensor([0, 2, 0]).where(1.0, 2.0).numpy(), [2.0, 1.0, 2.0])

  def test_lerp(self):
    helper_test_op([(4, 3), (4, 3), (3,)], torch.lerp, Tensor.lerp, low=0, high=1)

class TestPromotion:
  @pytest.mark.parametrize("tensor_dtype, scalar, want", [
    (dtypes.int32, 2.5, dtypes.float32), (dtypes.int32, 2, dtypes.int32), (dtypes.float16, 3, dtypes.float16),
    (dtypes.float16, 3.5, dtypes.float16), (dtypes.bool, 2, dtypes.int32), (dtypes.bool, True, dtypes.bool),
    (dtypes.uint8, 3, dtypes.uint8), (dtypes.int8, 1.0, dtypes.float32), (dtypes.bfloat16, 2, dtypes.bfloat16)])
  def test_weak_scalars(self, tensor_dtype, scalar, want):
    t = Tensor([1, 0, 1], dtype=tensor_dtype)
    assert (t + scalar).dtype == want and (scalar * t).dtype == want

  @pytest.mark.parametrize("a, b", [(dtypes.int8, dtypes.uint8), (dtypes.int32, dtypes.float16),
                                    (dtypes.float16, dtypes.bfloat16), (dtypes.bool, dtypes.int16),
                                    (dtypes.uint8, dtypes.float16), (dtypes.int32, dtypes.int64)])
  def test_tensor_promotion_like_torch(self, a, b):   # torch's table: int32 + float16 → float16 (numpy: float64)
    x, y = Tensor([1, 2], dtype=a), Tensor([3, 4], dtype=b)
    expected = str(torch.promote_types(getattr(torch, a.name), getattr(torch, b.name))).removeprefix("torch.")
    assert (x + y).dtype.name == expected and (y * x).dtype.name == expected

  def test_bool_arithmetic(self):
    p, q = Tensor([True, True, False]), Tensor([True, False, False])
    assert (p + q).tolist() == [True, True, False] and (p * q).tolist() == [True, False, False]
    assert (p + 1).tolist() == [2, 2, 1] and (p + 1).dtype == dtypes.int32
    assert p.sum().item() == 2 and p.sum().dtype == dtypes.int64   # numpy: bool sums are int64

OVERFLOW_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                   dtypes.uint64, dtypes.float16, dtypes.float32]
OVERFLOW_SCALARS = [300, -1, -129, 255, 2 ** 40 + 5, 2 ** 63, -2 ** 63 - 1, 2 ** 64 - 1, 2.5, True]
ARITHMETIC_OPS = {"+": lambda a, s: a + s, "r-": lambda a, s: s - a, "*": lambda a, s: a * s, "&": lambda a, s: a & s,
                  "maximum": lambda a, s: a.maximum(s) if isinstance(a, Tensor) else np.maximum(a, s)}
COMPARISON_OPS = {"<": lambda a, s: a < s, "<=": lambda a, s: a <= s, ">": lambda a, s: a > s,
                  ">=": lambda a, s: a >= s, "==": lambda a, s: a == s, "!=": lambda a, s: a != s,
                  "r<": lambda a, s: s < a}

def numpy_outcome(fn, array: np.ndarray, scalar):
  """numpy 2's result, or the exception type it raises."""
  try:
    with np.errstate(all="ignore"): return fn(array, scalar)
  except (OverflowError, TypeError) as error: return type(error)

def wrapped_to(dtype, scalar: int) -> int:
  """A Python int wrapped into an int dtype, two's complement (what torch does to an operand it can't hold)."""
  bits = dtype.itemsize * 8
  value = scalar % (1 << bits)
  return value - (1 << bits) if not dtype.is_unsigned and value >= 1 << (bits - 1) else value

class TestScalarOverflow:
  """A Python int that the tensor's int dtype can't hold wraps to the dtype in arithmetic and bitwise ops, as torch
  and tinygrad (numpy 2 raises OverflowError); creation, item assignment and where raise, as torch."""
  @pytest.mark.parametrize("dtype", OVERFLOW_DTYPES, ids=lambda d: d.name)
  def test_wraps_where_numpy_raises(self, dtype):
    array = np.array([1, 0, 3], dtype=dtype.np)
    for name, fn in ARITHMETIC_OPS.items():
      for scalar in OVERFLOW_SCALARS:
        want = numpy_outcome(fn, array, scalar)
        if want is TypeError or (name == "&" and dtype.is_float): continue   # float & int is a TypeError in both
        got = fn(Tensor(array), scalar)
        if isinstance(want, type):   # numpy 2 raises: the scalar wraps into the dtype
          with np.errstate(all="ignore"): want = fn(array, np.array(wrapped_to(dtype, scalar), dtype=dtype.np))
          assert got.dtype.np == want.dtype, f"{name} {scalar} {dtype}"
        np.testing.assert_array_equal(got.numpy(), want.astype(got.dtype.np), err_msg=f"{name} {scalar} {dtype}")

  def test_wrapping_matches_torch(self):
    cases = [(torch.int8, lambda t: t + 300), (torch.int32, lambda t: t | 2 ** 40),
             (torch.int32, lambda t: t * 2 ** 33),
             (torch.int32, lambda t: t + (-2 ** 40 - 5)), (torch.uint8, lambda t: t - 300),
             (torch.int32, lambda t: t ^ (2 ** 33 + 7)), (torch.int16, lambda t: t & -70000)]
    for torch_dtype, fn in cases:
      values = torch.tensor([1, 100, -3 if torch_dtype != torch.uint8 else 3], dtype=torch_dtype)
      got, want = fn(Tensor(values.numpy())), fn(values)
      assert got.dtype.np == want.numpy().dtype
      np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert (Tensor([True, False]) + 2 ** 40).tolist() == (torch.tensor([True, False]) + 2 ** 40).tolist()
    assert (Tensor([True, False]) + 2 ** 40).dtype == dtypes.int64   # a bool tensor widens the inferred int

  @pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint64], ids=lambda d: d.name)
  def test_comparisons_with_out_of_range_ints_answer_like_numpy(self, dtype):
    array = np.array([1, 0, dtypes.max(dtype)], dtype=dtype.np)
    for name, fn in COMPARISON_OPS.items():
      for scalar in (300, -1, -129, 2 ** 64, -2 ** 70, dtypes.max(dtype)):
        np.testing.assert_array_equal(fn(Tensor(array), scalar).numpy(), fn(array, scalar), err_msg=f"{name} {scalar}")

  def test_values_where_numpy_does_not_raise(self):
    for dtype, scalar in ((dtypes.int8, -128), (dtypes.uint8, 255), (dtypes.int64, 2 ** 63 - 1),
                          (dtypes.uint64, 2 ** 64 - 1), (dtypes.int32, 2.5), (dtypes.float16, 10 ** 6)):
      array = np.array([1, 0, 3], dtype=dtype.np)
      with np.errstate(all="ignore"): want = array + scalar
      np.testing.assert_array_equal((Tensor(array) + scalar).numpy(), want.astype(np.float32 if scalar == 2.5 else
                                                                                   want.dtype), err_msg=str(dtype))
    assert (Tensor([1], dtype=dtypes.uint8) - 1).tolist() == [0]

  def test_creation_and_assignment(self):
    for make in (lambda: Tensor(300, dtype=dtypes.int8), lambda: Tensor([1, 300], dtype=dtypes.int8),
                 lambda: Tensor.full((2,), 300, dtype=dtypes.int8),
                 lambda: Tensor([1, 2], dtype=dtypes.int8).full_like(300)):
      with pytest.raises(OverflowError, match="out of bounds for (u)?int8"): make()
    for start, stop in ((-5, 5), (250, 260)):   # arange into a dtype too small wraps, as torch
      want = torch.arange(start, stop, dtype=torch.uint8).tolist()
      assert Tensor.arange(start, stop, dtype=dtypes.uint8).tolist() == want
    with pytest.raises(OverflowError, match="out of bounds for int8"): np.array([1, 300], dtype=np.int8)
    with pytest.raises(OverflowError, match="pass dtype=dtypes.int64"): Tensor(2 ** 40)
    assert Tensor([2 ** 40, -1], dtype=dtypes.int64).tolist() == [2 ** 40, -1]
    t = Tensor([1, 2], dtype=dtypes.int8)
    with pytest.raises(OverflowError, match="300 out of bounds for int8"): t[0] = 300
    with pytest.raises(OverflowError, match="300 out of bounds for int8"): (t > 0).where(300, t)
    with pytest.raises(OverflowError, match="300 out of bounds for int8"): (t > 0).where(t, 300)

  def test_floats_promote_and_clip_bounds_saturate(self):
    assert (Tensor([1, 2], dtype=dtypes.int8) * 1e300).dtype == dtypes.float32   # a float scalar makes a float result
    x = np.array([1, -2, 100], np.int8)
    np.testing.assert_array_equal(Tensor(x).clip(0, 300).numpy(), np.clip(x, 0, 300))
    np.testing.assert_array_equal(Tensor(x).clip(-1000, 50).numpy(), np.clip(x, -1000, 50))

UNARY_CASES = [  # (name, torch fn, tgrad fn, low, high, rtol)
  ("neg", lambda x: -x, None, -3, 3, FLOAT_RTOL), ("exp", torch.exp, Tensor.exp, -5, 5, TRANSCENDENTAL_RTOL),
  ("exp2", torch.exp2, Tensor.exp2, -5, 5, TRANSCENDENTAL_RTOL),
  ("log", torch.log, Tensor.log, 0.01, 10, TRANSCENDENTAL_RTOL),
  ("log2", torch.log2, Tensor.log2, 0.01, 10, TRANSCENDENTAL_RTOL),
  ("sqrt", torch.sqrt, Tensor.sqrt, 0.01, 10, FLOAT_RTOL), ("rsqrt", torch.rsqrt, Tensor.rsqrt, 0.01, 10, FLOAT_RTOL),
  ("sin", torch.sin, Tensor.sin, -6, 6, TRANSCENDENTAL_RTOL),
  ("cos", torch.cos, Tensor.cos, -6, 6, TRANSCENDENTAL_RTOL),
  ("tan", torch.tan, Tensor.tan, -1.3, 1.3, 2e-5), ("tanh", torch.tanh, Tensor.tanh, -5, 5, TRANSCENDENTAL_RTOL),
  ("sigmoid", torch.sigmoid, Tensor.sigmoid, -8, 8, TRANSCENDENTAL_RTOL),
  ("relu", torch.relu, Tensor.relu, -3, 3, FLOAT_RTOL),
  ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), lambda x: x.leaky_relu(0.1), -3, 3, FLOAT_RTOL),
  ("elu", F.elu, Tensor.elu, -3, 3, TRANSCENDENTAL_RTOL),
  ("gelu", lambda x: F.gelu(x, approximate="tanh"), Tensor.gelu, -4, 4, TRANSCENDENTAL_RTOL),
  ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), Tensor.quick_gelu, -4, 4, TRANSCENDENTAL_RTOL),
  ("silu", F.silu, Tensor.silu, -6, 6, TRANSCENDENTAL_RTOL),
  ("softplus", F.softplus, Tensor.softplus, -30, 30, TRANSCENDENTAL_RTOL),
  ("mish", F.mish, Tensor.mish, -5, 5, TRANSCENDENTAL_RTOL),
  ("abs", torch.abs, Tensor.abs, -3, 3, FLOAT_RTOL),
  ("reciprocal", torch.reciprocal, Tensor.reciprocal, 0.2, 3, FLOAT_RTOL),
  ("square", torch.square, Tensor.square, -3, 3, FLOAT_RTOL),
  ("clip", lambda x: x.clip(-0.5, 0.7), None, -2, 2, FLOAT_RTOL),
  ("relu6", F.relu6, Tensor.relu6, -3, 9, FLOAT_RTOL),
]

class TestUnary:
  @pytest.mark.parametrize("name, torch_fn, tgrad_fn, low, high, rtol", UNARY_CASES, ids=[c[0] for c in UNARY_CASES])
  def test_unary(self, name, torch_fn, tgrad_fn, low, high, rtol):
    helper_test_op([(45, 65)], torch_fn, tgrad_fn, low=low, high=high, rtol=rtol, atol=1e-6)
    helper_test_op([()], torch_fn, tgrad_fn, low=low, high=high, rtol=rtol, atol=1e-6)

  def test_unary_on_ints_gives_float(self):
    assert Tensor([1, 2]).exp().dtype == dtypes.float32 and Tensor([1, 4]).sqrt().tolist() == [1.0, 2.0]

  def test_sigmoid_extremes_have_finite_grads(self):
    x = Tensor([-200.0, 200.0, 0.0], requires_grad=True)
    x.sigmoid().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 0.25])
    y = Tensor([100.0, -100.0], requires_grad=True)
    y.elu().sum().backward()
    assert np.isfinite(y.grad.numpy()).all()

  def test_sign_isnan_isinf(self):
    x = np.array([-2, -0.0, 0, 3, np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(Tensor(x).sign().numpy(), np.sign(x))
    np.testing.assert_array_equal(Tensor(x).isnan().numpy(), np.isnan(x))
    np.testing.assert_array_equal(Tensor(x).isinf().numpy(), np.isinf(x))
    np.testing.assert_array_equal(Tensor(x).isinf(detect_negative=False).numpy(), np.isposinf(x))
    np.testing.assert_array_equal(Tensor([-3, 0, 5]).sign().numpy(), [-1, 0, 1])
    np.testing.assert_array_equal(Tensor([-3, 0, 5]).abs().numpy(), [3, 0, 5])

  def test_rounding(self):
    x = np.concatenate([RNG.uniform(-10, 10, 100), np.arange(-4.5, 5, 0.5), [0.49999997, -0.49999997, 2 ** 23 + 1]])
    x = np.concatenate([x, [np.inf, -np.inf]]).astype(np.float32)
    for name in ("trunc", "floor", "ceil", "round"):
      np.testing.assert_array_equal(getattr(Tensor(x), name)().numpy(), getattr(np, name)(x), err_msg=name)
    assert Tensor([3, -2]).floor().dtype == dtypes.int32

  @pytest.mark.parametrize("dtype", [np.float32, np.float16])
  def test_rounding_keeps_the_sign_of_zero(self, dtype):
    x = np.array([-0.5, -0.4, -0.0, 0.0, 0.3, 0.5, -0.7, -1e-3], dtype)   # found by test/fuzz_ops.py: 3 / round(-0.4)
    for name in ("trunc", "floor", "ceil", "round"):
      out, want = getattr(Tensor(x), name)().numpy(), getattr(np, name)(x)
      np.testing.assert_array_equal(out, want, err_msg=name)
      np.testing.assert_array_equal(np.signbit(out), np.signbit(want), err_msg=f"sign of {name}")

# ---------------------------------------------------------------------------------------------------------------
# reductions

REDUCE_SHAPES = [((45, 3), None), ((45, 3), 0), ((3, 4, 5), (0, 2)), ((3, 4, 5), -1), ((1,), 0), ((), None)]

class TestReduce:
  @pytest.mark.parametrize("shape, axis", REDUCE_SHAPES)
  def test_sum_mean(self, shape, axis):
    dims = tuple(range(len(shape))) if axis is None else axis
    helper_test_op([shape], lambda x: x.sum(dims), lambda x: x.sum(axis))
    helper_test_op([shape], lambda x: x.sum(dims, keepdim=True), lambda x: x.sum(axis, keepdim=True))
    helper_test_op([shape], lambda x: x.mean(dims), lambda x: x.mean(axis))

  @pytest.mark.parametrize("shape, axis", REDUCE_SHAPES)
  def test_max_min(self, shape, axis):
    torch_max = (lambda x: x.max()) if axis is None else (lambda x: torch.amax(x, axis))
    torch_min = (lambda x: x.min()) if axis is None else (lambda x: torch.amin(x, axis))
    helper_test_op([shape], torch_max, lambda x: x.max(axis))
    helper_test_op([shape], torch_min, lambda x: x.min(axis))

  def test_max_grad_splits_ties(self):
    x = Tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    x.max(1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)

  def test_prod(self):
    helper_test_op([(3, 4)], lambda x: x.prod(1), lambda x: x.prod(1), low=0.5, high=1.5)
    values = [np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 1.5], [1.0, 2.0, 4.0]], np.float32)]
    helper_test_op(None, lambda x: x.prod(1), lambda x: x.prod(1), values=values)
    np.testing.assert_array_equal(Tensor([[1, 2, 3], [4, 5, 6]]).prod(0).numpy(), [4, 10, 18])

  def test_var_std(self):
    helper_test_op([(5, 7)], lambda x: x.var(1), lambda x: x.var(1))
    helper_test_op([(5, 7)], lambda x: x.std(0, correction=0), lambda x: x.std(0, correction=0))
    helper_test_op([(5, 7)], lambda x: x.var(), lambda x: x.var())

  @pytest.mark.parametrize("shape", [(3, 1), (1, 2), (3, 4), (2, 100), (2, 5000), (6, 16)])
  @pytest.mark.parametrize("npdtype", [np.float16, np.float32, np.float64])
  def test_sum_of_negative_zeros_is_positive_zero(self, shape, npdtype):
    # numpy and torch sum from +0.0, so -0.0s sum to +0.0; tgrad gave -0.0 where a reduce was a size-1 axis, fully
    # unrolled, or a loop whose accumulator LLVM was allowed to start at -0.0 ("nsz"); x // sum was then -inf
    x = np.full(shape, -0.0, npdtype)
    for axis in (None, 0, 1):
      got, want = Tensor(x).sum(axis).numpy(), x.sum(axis)
      np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"axis {axis}")
      np.testing.assert_array_equal(got, want)

  def test_int_and_bool_sums(self):
    a = RNG.integers(-50, 50, size=(6, 7)).astype(np.int32)
    assert Tensor(a).sum().item() == a.sum() and Tensor(a).sum(0).dtype == dtypes.from_np(a.sum(0).dtype)
    big = np.full(5, 2 ** 30, np.int32)   # numpy promotes int32 sums to int64: no wrap past 2^31
    assert Tensor(big).sum().item() == big.sum() == 5 * 2 ** 30 and Tensor(big).cumsum().numpy().dtype == np.int64
    assert Tensor(a.astype(np.uint8)).sum().dtype == dtypes.from_np(a.astype(np.uint8).sum().dtype) == dtypes.uint64
    np.testing.assert_array_equal(Tensor(a).max(1).numpy(), a.max(1))
    np.testing.assert_array_equal(Tensor(a).min(0).numpy(), a.min(0))
    np.testing.assert_array_equal(Tensor(a.astype(np.int8)).sum(1).numpy(), a.sum(1))
    b = a > 0
    np.testing.assert_array_equal(Tensor(b).any(1).numpy(), b.any(1))
    np.testing.assert_array_equal(Tensor(b).all(0).numpy(), b.all(0))
    np.testing.assert_array_equal(Tensor(a).any().numpy(), a.any())
    extremes = np.array([-2 ** 31, 2 ** 31 - 1, 0], np.int32)
    assert Tensor(extremes).min().item() == -2 ** 31 and Tensor(extremes).max().item() == 2 ** 31 - 1

  def test_mean_of_ints_is_float(self):
    assert Tensor([1, 2]).mean().dtype == dtypes.float32 and Tensor([1, 2]).mean().item() == 1.5

  def test_empty_axes(self):
    x = Tensor.zeros(0, 3)
    np.testing.assert_array_equal(x.sum(0).numpy(), np.zeros(3))
    np.testing.assert_array_equal(x.prod(0).numpy(), np.ones(3))
    assert x.sum().item() == 0 and x.sum(1).shape == (0,)
    assert x.any().item() is False and x.all().item() is True
    assert np.isnan(x.mean().item())
    with pytest.raises(ValueError, match=r"\(0, 3\)"): x.max(0)
    with pytest.raises(ValueError, match=r"\(0, 3\)"): x.argmax(0)

  @pytest.mark.parametrize("shape, axis", [((9,), None), ((4, 5), 1), ((4, 5), 0), ((2, 3, 4), -2)])
  def test_argmax_argmin(self, shape, axis):
    x = RNG.integers(0, 4, size=shape).astype(np.float32)   # many ties: first occurrence wins
    got_max, got_min = Tensor(x).argmax(axis), Tensor(x).argmin(axis)
    assert got_max.dtype == dtypes.int32
    np.testing.assert_array_equal(got_max.numpy(), np.argmax(x, axis))
    np.testing.assert_array_equal(got_min.numpy(), np.argmin(x, axis))
    assert Tensor(x).argmax(axis, keepdim=True).shape == np.argmax(x, axis, keepdims=True).shape
    assert Tensor([1.0, np.nan, 3.0, np.nan]).argmax().item() == 1

  def test_argmin_of_the_nan_mean_of_an_empty_axis(self):
    # fuzz_ops seed 0 case 1302: the mean of an empty axis is a constant NaN (0/0) that the kernel computed, and NVRTC
    # mis-folded `x != x` of it, so argmin answered 1 on CUDA; kernels now fold constant ALU ops themselves
    x = np.full((6, 1), 3.0, np.float32)[:, -3::-3]
    got = Tensor(x).unsqueeze(0).repeat((3, 1, 1, 3)).permute((1, 0, 2, 3)).mean(-1).argmin(-3)
    want = np.argmin(np.transpose(np.tile(x[None], (3, 1, 1, 3)), (1, 0, 2, 3)).mean(-1), -3)
    np.testing.assert_array_equal(got.numpy(), want)
    nan = Tensor.full((4, 3), 0.0) / 0.0
    np.testing.assert_array_equal((-nan).argmin(0).numpy(), np.zeros(3, np.int32))
    np.testing.assert_array_equal((-nan).argmax(1).numpy(), np.zeros(4, np.int32))

  @pytest.mark.parametrize("shape, axis", [((5, 7), -1), ((3, 4, 5), 1), ((1,), 0)])
  def test_softmax_family(self, shape, axis):
    helper_test_op([shape], lambda x: x.softmax(axis), lambda x: x.softmax(axis), rtol=1e-5)
    helper_test_op([shape], lambda x: x.log_softmax(axis), lambda x: x.log_softmax(axis), rtol=1e-5)
    helper_test_op([shape], lambda x: x.logsumexp(axis), lambda x: x.logsumexp(axis), rtol=1e-5)

  def test_softmax_large_and_infinite(self):
    x = np.array([[1000, 1001, 999], [-np.inf, 0, -np.inf]], np.float32)
    np.testing.assert_allclose(Tensor(x).softmax().numpy(), torch.tensor(x).softmax(-1).numpy(), rtol=1e-6)
    all_inf = np.array([-np.inf, -np.inf], np.float32)
    assert Tensor(all_inf).logsumexp(0).item() == -np.inf

  @pytest.mark.parametrize("shape, axis", [((7,), 0), ((4, 9), 1), ((5, 3), 0), ((2, 1, 3), 1)])
  def test_cumsum(self, shape, axis):
    helper_test_op([shape], lambda x: x.cumsum(axis), lambda x: x.cumsum(axis))
    helper_test_op([shape], lambda x: x.cumprod(axis), lambda x: x.cumprod(axis), low=0.5, high=1.5)
    ints = RNG.integers(-9, 9, size=shape).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).cumsum(axis).numpy(), np.cumsum(ints, axis))

  def test_cumsum_long(self):
    x = RNG.uniform(-1, 1, 1500).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).cumsum().numpy(), np.cumsum(x.astype(np.float64)), atol=2e-4)

# ---------------------------------------------------------------------------------------------------------------
# movement

class TestMovement:
  def test_reshape_view(self):
    helper_test_op([(4, 6)], lambda x: x.reshape(3, 8))
    helper_test_op([(4, 6)], lambda x: x.reshape(-1, 2, 3), lambda x: x.reshape((-1, 2, 3)))
    helper_test_op([()], lambda x: x.reshape(1, 1))
    helper_test_op([(4, 6)], lambda x: x.view(24))
    assert Tensor.zeros(0, 3).reshape(3, 0).shape == (3, 0)

  def test_permute_transpose(self):
    helper_test_op([(2, 3, 4)], lambda x: x.permute(2, 0, 1))
    helper_test_op([(2, 3, 4)], lambda x: x.permute(-1, 1, 0), lambda x: x.permute((-1, 1, 0)))
    helper_test_op([(2, 3, 4)], lambda x: x.transpose(0, 2))
    helper_test_op([(3, 5)], lambda x: x.T)

  def test_expand(self):
    helper_test_op([(3, 1)], lambda x: x.expand(2, 3, 4))
    helper_test_op([(3, 1)], lambda x: x.expand(-1, 5))

  def test_pad(self):
    helper_test_op([(3, 4)], lambda x: F.pad(x, (1, 2, 0, 3)), lambda x: x.pad(((0, 3), (1, 2))))
    helper_test_op([(3, 4)], lambda x: F.pad(x, (1, 2)), lambda x: x.pad((1, 2)))
    helper_test_op([(3, 4)], lambda x: F.pad(x, (1, 1, 2, 0), value=-2.5),
                   lambda x: x.pad(((2, 0), (1, 1)), value=-2.5))
    helper_test_op([(3, 4)], lambda x: F.pad(x, (-1, 2)), lambda x: x.pad((None, (-1, 2))))

  def test_an_element_of_the_padding(self):
    # found by test/fuzz_ops.py: indexing into the padding of a realized buffer read the data next to it
    x = Tensor(np.array([3, 7], np.int32)).realize()
    assert x.pad(((1, 0),))[0].item() == 0 and (x + 1).pad(((1, 0),))[0].item() == 0
    assert x.pad(((1, 0),), value=5)[0].item() == 5 and x.pad(((0, 2),))[-1].item() == 0

  def test_shrink_flip(self):
    helper_test_op([(5, 6)], lambda x: x[1:4, 2:5], lambda x: x.shrink(((1, 4), (2, 5))))
    helper_test_op([(5, 6)], lambda x: x[:, 2:5], lambda x: x.shrink((None, (2, 5))))
    helper_test_op([(5, 6)], lambda x: x.flip(0), lambda x: x.flip(0))
    helper_test_op([(2, 5, 6)], lambda x: x.flip((0, 2)), lambda x: x.flip((0, 2)))

  def test_flatten_unflatten_squeeze_unsqueeze(self):
    helper_test_op([(2, 3, 4)], lambda x: x.flatten())
    helper_test_op([(2, 3, 4)], lambda x: x.flatten(1))
    helper_test_op([(2, 3, 4, 5)], lambda x: x.flatten(1, 2))
    helper_test_op([(2, 12)], lambda x: x.unflatten(1, (3, 4)))
    helper_test_op([(1, 3, 1)], lambda x: x.squeeze())
    helper_test_op([(1, 3, 1)], lambda x: x.squeeze(-1))
    helper_test_op([(1, 3, 1)], lambda x: x.squeeze(1))
    helper_test_op([(3, 4)], lambda x: x.unsqueeze(0))
    helper_test_op([(3, 4)], lambda x: x.unsqueeze(-1))
    helper_test_op([()], lambda x: x.flatten())

  def test_repeat(self):
    helper_test_op([(2, 3)], lambda x: x.repeat(2, 3))
    helper_test_op([(2, 3)], lambda x: x.repeat(2, 1, 2))

  def test_cat_stack(self):
    helper_test_op([(2, 3), (4, 3), (1, 3)], lambda a, b, c: torch.cat((a, b, c), 0),
                   lambda a, b, c: a.cat(b, c, dim=0))
    helper_test_op([(2, 3), (2, 5)], lambda a, b: torch.cat((a, b), -1), lambda a, b: Tensor.cat(a, b, dim=-1))
    helper_test_op([(2, 3), (2, 3)], lambda a, b: torch.stack((a, b), 1), lambda a, b: Tensor.stack(a, b, dim=1))
    helper_test_op([(2, 3), (2, 3), (2, 3)], lambda a, b, c: torch.stack((a, b, c)),
                   lambda a, b, c: Tensor.stack([a, b, c]))
    helper_test_op([(), ()], lambda a, b: torch.stack((a, b)), lambda a, b: a.stack(b))
    mixed = Tensor([1, 2], dtype=dtypes.int8).cat(Tensor([0.5]))
    assert mixed.dtype == dtypes.float32 and mixed.tolist() == [1.0, 2.0, 0.5]
    assert Tensor([True]).cat(Tensor([False, True])).tolist() == [True, False, True]

  def test_split_chunk(self):
    x = np.arange(22, dtype=np.float32).reshape(11, 2)
    got = [p.numpy() for p in Tensor(x).split(4)]
    want = [p.numpy() for p in torch.tensor(x).split(4)]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    got = [p.numpy() for p in Tensor(x).split([3, 8])]
    assert [g.shape for g in got] == [(3, 2), (8, 2)] and np.array_equal(got[1], x[3:])
    got = [p.numpy() for p in Tensor(x).chunk(3)]
    want = [p.numpy() for p in torch.tensor(x).chunk(3)]
    assert [g.shape for g in got] == [w.shape for w in want]
    assert [p.shape for p in Tensor(x).split(1, dim=1)] == [(11, 1), (11, 1)]

# ---------------------------------------------------------------------------------------------------------------
# indexing

BASIC_INDICES = [
  (1,), (-1,), (slice(1, 4),), (slice(None, None, 2),), (slice(None, None, -1),), (slice(4, 0, -2),),
  (slice(None), 2), (Ellipsis, 1), (None, 0), (1, None, slice(None, None, 3)), (slice(-3, None), slice(None, -1)),
  (slice(10, 20),), (Ellipsis,), (2, -3, 1), (slice(None), None, Ellipsis, None), (slice(5, 1),),
]

class TestIndexing:
  @pytest.mark.parametrize("index", BASIC_INDICES, ids=[str(i) for i in BASIC_INDICES])
  def test_basic_getitem(self, index):
    x = RNG.uniform(-1, 1, size=(5, 6, 4)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x)[index].numpy(), x[index])
    # torch has no negative slice steps: give it the same positions as an index list
    torch_index = tuple(torch.tensor(np.arange(x.shape[0])[i].copy()) if isinstance(i, slice) and (i.step or 1) < 0
                        else i for i in index)   # (negative steps only appear first in BASIC_INDICES)
    helper_test_op(None, lambda t: t[torch_index], lambda t: t[index], values=[x])

  @pytest.mark.parametrize("make_index", [
    lambda: ([0, 2, -1],), lambda: (slice(None), [[1, 0], [3, 3]]), lambda: ([1, 2], [0, 5]),
    lambda: ([1, 2], slice(None), [0, 3]), lambda: (slice(None), [2], [1, 0]), lambda: (0, slice(1, 5), [1, 3]),
    lambda: (Ellipsis, [3, 0]), lambda: ([[0], [4]], [1, 2, 3]), lambda: (slice(1, None, 2), [0, 0, 5]),
    lambda: (np.array([4, 0]), None)])
  def test_tensor_getitem(self, make_index):
    x = RNG.uniform(-1, 1, size=(5, 6, 4)).astype(np.float32)
    np_index = make_index()
    tg_index = tuple(Tensor(np.array(i, np.int32)) if isinstance(i, (list, np.ndarray)) else i for i in np_index)
    torch_index = tuple(torch.tensor(i) if isinstance(i, (list, np.ndarray)) else i for i in np_index)
    # torch (and tinygrad) apply an int index first: an int and a tensor index separated by a slice are not
    # "non-adjacent advanced indices" as in numpy, so there tgrad follows torch, not numpy
    if not any(isinstance(i, int) for i in np_index): np.testing.assert_array_equal(Tensor(x)[tg_index].numpy(),
                                                                                   x[np_index])
    helper_test_op(None, lambda t: t[torch_index], lambda t: t[tg_index], values=[x])

  def test_gather_ints_and_negative(self):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(Tensor(x)[[2, 0]].numpy(), x[[2, 0]])
    np.testing.assert_array_equal(Tensor(x)[:, Tensor([3, -4])].numpy(), x[:, [3, -4]])
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 3"): Tensor(x)[Tensor([7])]
    b = Tensor([True, False, True])
    assert b[Tensor([2, 1])].tolist() == [True, False]

  def test_setitem_basic(self):
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    t = Tensor(x.copy())
    t[1] = 7.0
    x[1] = 7.0
    t[:, ::-2] = Tensor(np.full((5, 3), -1, np.float32))
    x[:, ::-2] = -1
    t[2:4, 1] = Tensor([100.0, 200.0])
    x[2:4, 1] = [100.0, 200.0]
    np.testing.assert_array_equal(t.numpy(), x)
    t[..., 0] = 5   # into a realized buffer: an ASSIGN
    x[..., 0] = 5
    np.testing.assert_array_equal(t.numpy(), x)

  def test_setitem_tensor_index(self):
    x = np.zeros((4, 3), np.int32)
    t = Tensor(x.copy())
    t[Tensor([0, 2, 0])] = Tensor([[1, 1, 1], [2, 2, 2], [3, 3, 3]])
    x[[0, 2, 0]] = [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
    np.testing.assert_array_equal(t.numpy(), x)
    t[1, Tensor([2, 0])] = 9
    x[1, [2, 0]] = 9
    np.testing.assert_array_equal(t.numpy(), x)

  def test_iter_len(self):
    t = Tensor([[1, 2], [3, 4], [5, 6]])
    assert len(t) == 3 and [r.tolist() for r in t] == [[1, 2], [3, 4], [5, 6]]

# ---------------------------------------------------------------------------------------------------------------
# matmul and einsum

class TestMatmul:
  @pytest.mark.parametrize("shapes", [[(7, 9), (9, 5)], [(9,), (9, 5)], [(7, 9), (9,)], [(9,), (9,)],
                                      [(3, 7, 9), (9, 5)], [(2, 1, 4, 3), (5, 3, 6)], [(4, 0), (0, 3)]])
  def test_matmul(self, shapes):
    helper_test_op(shapes, lambda a, b: a @ b, atol=1e-5)

  def test_matmul_ints_and_dot_linear(self):
    a, b = RNG.integers(-5, 5, (4, 3)).astype(np.int32), RNG.integers(-5, 5, (3, 2)).astype(np.int32)
    out = Tensor(a) @ Tensor(b)
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), a @ b)
    helper_test_op([(4, 3), (3, 2), (2,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b), atol=1e-5)
    helper_test_op([(4, 3), (3, 2)], lambda x, w: x @ w, lambda x, w: x.dot(w), atol=1e-5)

  def test_matmul_signed_zeros_and_floordiv(self):
    # fuzz_ops seed 0 cases 7834, 8843: products that are all -0.0 sum to +0.0 in numpy's matmul (and torch's sums);
    # tgrad gave -0.0 (K = 1 and K = 2), so 7 // (a @ b) was -inf instead of inf
    a = np.array([[-0.5], [0.5], [0.0], [-1.0]], np.float32)
    b = np.array([[0.0, -0.0, np.inf, -np.inf, 2.0]], np.float32)
    with np.errstate(all="ignore"):
      for got, want in (((Tensor(a) @ Tensor(b)).numpy(), a @ b),
                        ((7.0 // (Tensor(a) @ Tensor(b))).numpy(), 7.0 // (a @ b)),
                        ((Tensor(a) // (Tensor(a) @ Tensor(b)).minimum(Tensor(b))).numpy(), a // np.minimum(a @ b, b))):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
      c = np.array([[[-1.0, 2.0], [0.0, -3.0]]], np.float16)
      d = np.array([[[0, 0, 1], [0, 0, 0]]], np.int32)
      got, want = (7.0 // (Tensor(c) @ Tensor(d))).numpy(), 7.0 // (c @ d.astype(np.float16))
      assert got.dtype == want.dtype == np.float16   # int32 with float16 is float16, as torch
      np.testing.assert_array_equal(got, want)

  @pytest.mark.parametrize("formula, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("i,j->ij", [(3,), (5,)]), ("ij->", [(3, 4)]), ("ij->j", [(3, 4)]),
    ("ij,ij->i", [(3, 4), (3, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk,kl", [(2, 3), (3, 4), (4, 2)]), ("iij->j", [(3, 3, 2)])])
  def test_einsum(self, formula, shapes):
    helper_test_op(shapes, lambda *xs: torch.einsum(formula, *xs), lambda *xs: Tensor.einsum(formula, *xs), atol=1e-5)

# ---------------------------------------------------------------------------------------------------------------
# half precision

class TestLowPrecision:
  @pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
  def test_var_std_over_more_than_65504_elements(self, dtype):
    # the count 149999 was a float16 inf: var came out 0 (or NaN when the sum overflowed too; found by
    # test/fuzz_ops.py); they compute in float32 like the other float functions of half tensors
    t = Tensor(RNG.uniform(0, 2, (2, 150000)).astype(np.float32), dtype=dtype)
    x = t.float().numpy().astype(np.float64)
    for name, got, want in [("var", t.var(1), x.var(1, ddof=1)), ("std", t.std(1, correction=0), x.std(1)),
                            ("var all", t.var(), x.var(ddof=1))]:
      assert got.dtype == dtype, name
      np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=1e-2, err_msg=name)

  @pytest.mark.parametrize("dtype, np_dtype", [(dtypes.float16, np.float16), (dtypes.bfloat16, np.float32)])
  def test_softmax_family_over_more_than_65504_elements(self, dtype, np_dtype):
    # the sum of exponentials passes float16's largest value: softmax was all zeros, log_softmax -inf (found by
    # test/fuzz_ops.py); they compute in float32 like the other float functions of half tensors
    x = RNG.uniform(-0.25, 0.25, (2, 140000)).astype(np_dtype).astype(np.float32)   # Σ exp(x − max) ≈ 110,000
    t = Tensor(x, dtype=dtype)
    shifted = x - x.max(1, keepdims=True)
    log_total = np.log(np.exp(shifted.astype(np.float64)).sum(1, keepdims=True))
    for name, got, want in [("softmax", t.softmax(), np.exp(shifted - log_total)),
                            ("log_softmax", t.log_softmax(), shifted - log_total),
                            ("logsumexp", t.logsumexp(1), (log_total + x.max(1, keepdims=True))[:, 0])]:
      assert got.dtype == dtype, name
      np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=1e-2, atol=1e-7, err_msg=name)

  @pytest.mark.parametrize("dtype, torch_dtype, rtol", [(dtypes.float16, torch.float16, 2e-3),
                                                        (dtypes.bfloat16, torch.bfloat16, 1.6e-2)])
  def test_ops(self, dtype, torch_dtype, rtol):
    a = RNG.uniform(-2, 2, (8, 16)).astype(np.float32)
    b = RNG.uniform(-2, 2, (16, 4)).astype(np.float32)
    ta, tb = torch.tensor(a).to(torch_dtype), torch.tensor(b).to(torch_dtype)
    ga, gb = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
    for name, got, want in [("add", ga + 1, ta + 1), ("mul", ga * ga, ta * ta), ("exp", ga.exp(), ta.exp()),
                            ("sum", ga.sum(1), ta.sum(1)),
                            ("softmax", ga.softmax(), ta.float().softmax(-1).to(torch_dtype)),
                            ("half * 3", ga * 3, ta * 3), ("max", ga.max(0), ta.amax(0))]:
      assert got.dtype == dtype, name
      compare(name, got, want, atol=rtol, rtol=rtol)
    # a matmul's error is relative to the size of its terms, not of its (possibly cancelled) result: rounding each
    # product to the format (the LLVM path) or not (tensor cores) may differ by half an ulp of every term
    exact_a, exact_b = ta.double().numpy(), tb.double().numpy()
    term_scale = np.abs(exact_a) @ np.abs(exact_b)
    half_ulp = 2.0 ** -11 if dtype == dtypes.float16 else 2.0 ** -8
    product = (ga @ gb).numpy().astype(np.float64)
    assert (ga @ gb).dtype == dtype
    assert np.all(np.abs(product - exact_a @ exact_b) <= rtol * np.abs(exact_a @ exact_b) + half_ulp * term_scale)
    assert (ga * 3).numpy().dtype == (np.float16 if dtype == dtypes.float16 else np.float32)

  def test_casts(self):
    x = RNG.uniform(-300, 300, 64).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).cast(dtypes.int32).numpy(), x.astype(np.int32))
    np.testing.assert_array_equal(Tensor(x).half().numpy(), x.astype(np.float16))
    np.testing.assert_array_equal(Tensor(x).cast(dtypes.bfloat16).numpy(), torch.tensor(x).bfloat16().float().numpy())
    np.testing.assert_array_equal(Tensor(x).bool().numpy(), x.astype(bool))
    np.testing.assert_array_equal(Tensor(x).bitcast(dtypes.uint32).numpy(), x.view(np.uint32))
    assert Tensor(x).int().dtype == dtypes.int32 and Tensor([1]).float().dtype == dtypes.float32

# ---------------------------------------------------------------------------------------------------------------
# autograd

class TestAutograd:
  def test_chain_against_torch(self):
    helper_test_op([(4, 5), (5, 3), (3,)], lambda x, w, b: (x @ w + b).relu().softmax(-1).log().mean(),
                   lambda x, w, b: (x @ w + b).relu().softmax(-1).log().mean(), atol=1e-5)
    helper_test_op([(3, 4)], lambda x: F.pad(x.exp(), (1, 1, 0, 2)).permute(1, 0)[1:4].expand(2, 3, 5),
                   lambda x: x.exp().pad(((0, 2), (1, 1))).permute(1, 0)[1:4].expand(2, 3, 5))
    helper_test_op([(6, 4)], lambda x: (x[::2] * x[1::2]).sum(0) / x.max())
    helper_test_op([(6, 4)], lambda x: x.flip(0)[::3, ::2], lambda x: x[::-3, ::2])

  def test_grad_accumulates_and_gradient_api(self):
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4, 6, 8])
    y = Tensor([0.5, -1.0], requires_grad=True)
    unused = Tensor([1.0], requires_grad=True)
    dy, du = (y.exp() * 3).sum().gradient(y, unused)
    np.testing.assert_allclose(dy.numpy(), 3 * np.exp([0.5, -1.0]), rtol=1e-6)
    assert du.tolist() == [0.0] and y.grad is None

  def test_shared_subexpressions(self):
    x = Tensor([2.0], requires_grad=True)
    a = x * 3
    (a * a + a).sum().backward()    # d/dx (9x² + 3x) = 18x + 3
    assert x.grad.item() == pytest.approx(39.0)

  def test_backward_needs_scalar(self):
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"\(2,\)"): (x * 2).backward()
    (x * 2).backward(Tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]

  def test_no_grad_detach_and_train(self):
    x = Tensor([1.0], requires_grad=True)
    with Tensor.no_grad():
      y = x * 2
    assert y._ctx is None and Tensor.grad_enabled
    assert not (x.detach() * 2).requires_grad
    with pytest.raises(RuntimeError): (x.detach() * 2).sum().backward()
    assert Tensor.training is False
    with Tensor.train():
      assert Tensor.training is True
    assert Tensor.training is False

  def test_inplace_ops(self):
    x = Tensor([1.0, 2.0])
    x += 1
    x *= Tensor([2.0, 3.0])
    assert x.tolist() == [4.0, 9.0]
    w = Tensor([1.0, 2.0], requires_grad=True)
    h = w * 2
    h += 1                        # in-place on a non-leaf keeps the graph
    h.sum().backward()
    assert w.grad.tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError): w += 1
    with Tensor.no_grad():
      w -= 1
    assert w.tolist() == [0.0, 1.0]

  def test_assign(self):
    x = Tensor([1.0, 2.0, 3.0]).realize()
    x.assign(x * 10)
    assert x.tolist() == [10.0, 20.0, 30.0]
    x.assign(x.flip(0))           # reads the buffer it writes through another view: copied first
    assert x.tolist() == [30.0, 20.0, 10.0]
    with pytest.raises(ValueError, match=r"\(2,\)"): x.assign(Tensor([1.0, 2.0]))

  def test_embedding_style_gather_grad(self):
    table = RNG.uniform(-1, 1, (10, 4)).astype(np.float32)
    index = np.array([[1, 3, 1], [9, 0, 1]], np.int32)
    helper_test_op(None, lambda t: t[torch.tensor(index, dtype=torch.long)], lambda t: t[Tensor(index)], values=[table])

  def test_no_grad_decorator(self):
    @Tensor.no_grad()
    def double(t): return t * 2
    out = double(Tensor([1.0], requires_grad=True))
    assert out._ctx is None and Tensor.grad_enabled

# ---------------------------------------------------------------------------------------------------------------
# misc API and user errors (all raised before any kernel runs)

class TestAPI:
  def test_properties(self):
    t = Tensor.zeros(2, 3, 4, dtype=dtypes.float16)
    assert t.ndim == 3 and t.numel() == 24 and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert t.element_size() == 2 and t.nbytes() == 48 and len(t) == 2
    assert "Tensor" in repr(t)
    assert Tensor([[1, 2]]).tolist() == [[1, 2]] and Tensor(3.5).item() == 3.5
    assert t.to(t.device).device == t.device and t.contiguous().shape == t.shape
    assert Tensor([1.0]).requires_grad_().requires_grad is True

class TestErrors:
  @pytest.fixture(autouse=True)
  def no_kernels(self, monkeypatch):
    """User errors must surface while the graph is built: running anything here fails the test."""
    def refuse(*lbs): raise AssertionError("a kernel ran before the error was raised")
    monkeypatch.setattr("tgrad.realize.realize", refuse)

  def test_broadcast_mismatch(self):
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(5,\)"): Tensor.ones(3, 4) + Tensor.ones(5)
    with pytest.raises(ValueError, match=r"\(2, 3\)"): Tensor.ones(2, 3).expand(4, 3)

  def test_matmul(self):
    with pytest.raises(RuntimeError, match=r"\(3, 4\).*\(5, 2\)"): Tensor.ones(3, 4) @ Tensor.ones(5, 2)
    with pytest.raises(RuntimeError, match=r"\(2, 3, 4\).*\(5, 4, 2\)"): Tensor.ones(2, 3, 4) @ Tensor.ones(5, 4, 2)
    with pytest.raises(RuntimeError): Tensor(1.0) @ Tensor.ones(3)

  def test_reshape_and_cat(self):
    with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(4, 2\)"): Tensor.ones(2, 3).reshape(4, 2)
    with pytest.raises(RuntimeError, match=r"\(2, 3\)"): Tensor.ones(2, 3).reshape(-1, 4)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"): Tensor.ones(2, 3).cat(Tensor.ones(2, 4))
    with pytest.raises(ValueError): Tensor.ones(2, 3).stack(Tensor.ones(3, 2))
    with pytest.raises(ValueError, match=r"\(3,\)"): Tensor.ones(3).split([1, 1])

  def test_axes(self):
    with pytest.raises(IndexError, match=r"\(2, 3\)"): Tensor.ones(2, 3).sum(2)
    with pytest.raises(IndexError, match=r"\(2, 3\)"): Tensor.ones(2, 3).max(-3)
    with pytest.raises(IndexError): Tensor.ones(2, 3).permute(0, 2)
    with pytest.raises(RuntimeError): Tensor.ones(2, 3).permute(0, 0)
    with pytest.raises(IndexError): Tensor.ones(2, 3).transpose(0, 5)
    with pytest.raises(IndexError): Tensor.ones(2, 3).unsqueeze(3)
    with pytest.raises(IndexError, match="size 2"): Tensor.ones(2, 3)[2]
    with pytest.raises(IndexError, match=r"\(2, 3\)"): Tensor.ones(2, 3)[0, 0, 0]
    with pytest.raises(IndexError): Tensor.ones(3)[Tensor([1.0])]

  def test_dtypes(self):
    with pytest.raises(TypeError, match="float32"): Tensor([1.0]) & Tensor([2.0])
    with pytest.raises(TypeError, match="float32"): Tensor([1.0]) << 1
    with pytest.raises(TypeError): ~Tensor([1.0])
    with pytest.raises(TypeError): Tensor([True]) - Tensor([False])
    with pytest.raises(TypeError): -Tensor([True])
    with pytest.raises(TypeError, match="uint16"): Tensor([1.0]).bitcast(dtypes.uint16)
    with pytest.raises(TypeError): Tensor(["a"])
    with pytest.raises(RuntimeError): Tensor([2, 3]) ** -1

  def test_setitem(self):
    x = Tensor.zeros(3, 4)
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"): x[:, 1] = Tensor.ones(2)
    with pytest.raises(IndexError): x[5] = 1.0
    with pytest.raises(RuntimeError): Tensor.zeros(2, requires_grad=True)[0] = 1.0

  def test_item_and_misc(self):
    with pytest.raises(ValueError, match=r"\(2,\)"): Tensor([1, 2]).item()
    with pytest.raises(TypeError): bool(Tensor([1]))
    with pytest.raises(TypeError): len(Tensor(1.0))
    with pytest.raises(RuntimeError): Tensor.einsum("ij,jk->ik", Tensor.ones(2, 3), Tensor.ones(4, 5))
    with pytest.raises(ValueError): Tensor.ones(2).pad(((1, 1), (1, 1)))
    with pytest.raises(ValueError): Tensor.ones(2, 2).shrink(((0, 3), None))
