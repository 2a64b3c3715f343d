"""The methods of issue 16's second part against torch: forward values and gradients (helper_test_op's comparison),
0-d, size-1 and odd sizes, and the errors bad arguments raise.

Elementwise math and activations, softmin/var_mean/std_mean/normalize, movement (pad modes, roll, unfold, meshgrid,
repeat_interleave), diagonals, data-dependent selections (masked_select, nonzero), scatter_reduce, sort/argsort/topk,
losses, max_pool2d's indices and max_unpool2d, dtype.min/max, sum/prod(dtype=) and attention's enable_gqa.
"""
import math
import re
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes
from torch_compare import compare, compare_with_torch

RNG = np.random.default_rng(16)
FLOAT_ATOL, FLOAT_RTOL = 1e-6, 1e-5
APPROX_ATOL = 2e-6        # erf's Chebyshev fit and the atan series: absolute error ~1e-7 before float32 rounding
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4

def helper_test_op(shapes, torch_fn, tgrad_fn=None, atol=FLOAT_ATOL, rtol=FLOAT_RTOL, grad=True, grad_atol=GRAD_ATOL,
                   grad_rtol=GRAD_RTOL, low=-2.0, high=2.0, values=None):
  """Compare tgrad_fn (default: torch_fn) with torch_fn on float32 inputs of `shapes` (or the given `values`)."""
  compare_with_torch(torch_fn, tgrad_fn, shapes=shapes, values=values, atol=atol, rtol=rtol, grad_atol=grad_atol,
                     grad_rtol=grad_rtol, low=low, high=high, grad=grad, rng=RNG)

SHAPES = [(), (1,), (7,), (3, 5)]   # 0-d, size 1, odd sizes

# ---------------------------------------------------------------------------------------------------------------
# elementwise math

UNARY = [  # name, low, high, atol (inputs inside each function's domain, away from its singular points)
  ("atan", -5.0, 5.0, APPROX_ATOL), ("asin", -0.95, 0.95, APPROX_ATOL), ("acos", -0.95, 0.95, APPROX_ATOL),
  ("asinh", -5.0, 5.0, APPROX_ATOL), ("acosh", 1.05, 6.0, APPROX_ATOL), ("atanh", -0.95, 0.95, APPROX_ATOL),
  ("sinh", -3.0, 3.0, 1e-5), ("cosh", -3.0, 3.0, 1e-5), ("erf", -3.0, 3.0, APPROX_ATOL), ("log10", 0.1, 10.0, 1e-6),
]

class TestUnaryMath:
  @pytest.mark.parametrize("name,low,high,atol", UNARY)
  @pytest.mark.parametrize("shape", SHAPES)
  def test_against_torch(self, name, low, high, atol, shape):
    helper_test_op([shape], lambda x: getattr(x, name)(), atol=atol, grad_atol=1e-4, low=low, high=high)

  def test_special_values(self):
    special = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 1e-3, 1e20, -1e20, np.inf, -np.inf, np.nan], np.float32)
    for name in ("atan", "asin", "acos", "asinh", "acosh", "atanh", "sinh", "cosh", "erf", "log10"):
      with np.errstate(all="ignore"):
        got = getattr(Tensor(special), name)().numpy()
      want = getattr(torch, name)(torch.tensor(special)).numpy()
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6, err_msg=name)

  def test_int_inputs_give_floats(self):
    for name in ("atan", "erf", "sinh", "log10"):
      out = getattr(Tensor([1, 2, 3]), name)()
      assert out.dtype == dtypes.float32
      np.testing.assert_allclose(out.numpy(), getattr(torch, name)(torch.tensor([1, 2, 3])).numpy(), rtol=1e-5,
                                 atol=2e-6)

  def test_half_computes_in_float32(self):
    x = np.linspace(-0.9, 0.9, 11).astype(np.float16)
    out = Tensor(x).asin()
    assert out.dtype == dtypes.float16
    np.testing.assert_allclose(out.numpy(), torch.tensor(x).asin().numpy(), atol=1e-3)

class TestBinaryMath:
  @pytest.mark.parametrize("shapes", [[(), ()], [(1,), (5,)], [(3, 5), (5,)], [(7,), (7,)]])
  def test_logaddexp(self, shapes):
    helper_test_op(shapes, torch.logaddexp, Tensor.logaddexp, low=-5, high=5)

  def test_logaddexp_extremes(self):
    a = np.array([-np.inf, np.inf, -np.inf, 100.0, -100.0, 1e30], np.float32)
    b = np.array([-np.inf, 1.0, 3.0, 100.0, -101.0, 1e30], np.float32)
    np.testing.assert_allclose(Tensor(a).logaddexp(Tensor(b)).numpy(), torch.logaddexp(torch.tensor(a),
                                                                                       torch.tensor(b)).numpy())
    np.testing.assert_allclose(Tensor([1.0, 2.0]).logaddexp(0.5).numpy(),
                               torch.logaddexp(torch.tensor([1.0, 2.0]), torch.tensor(0.5)).numpy(), rtol=1e-6)

  def test_copysign(self):
    other = RNG.uniform(-2, 2, size=(3, 5)).astype(np.float32)   # gets no gradient (torch's is zeros)
    helper_test_op([(3, 5)], lambda x: torch.copysign(x, torch.tensor(other)), lambda x: x.copysign(Tensor(other)))
    signs = np.array([1.0, -1.0, 0.0, -0.0, np.inf, -np.inf], np.float32)
    got = Tensor(np.full(6, 2.5, np.float32)).copysign(Tensor(signs)).numpy()
    np.testing.assert_array_equal(got, torch.copysign(torch.full((6,), 2.5), torch.tensor(signs)).numpy())
    assert Tensor([1, -2]).copysign(-1).dtype == dtypes.float32
    np.testing.assert_array_equal(Tensor([1, -2]).copysign(-1).numpy(), [-1.0, -2.0])

  def test_fmod(self):
    helper_test_op([(3, 5), (3, 5)], torch.fmod, Tensor.fmod, values=[RNG.uniform(-9, 9, (3, 5)).astype(np.float32),
                                                                       RNG.uniform(0.5, 3, (3, 5)).astype(np.float32)])
    ints = np.array([7, -7, 7, -7, 0, 5], np.int32)
    divisors = np.array([3, 3, -3, -3, 2, 5], np.int32)
    np.testing.assert_array_equal(Tensor(ints).fmod(Tensor(divisors)).numpy(),
                                  torch.fmod(torch.tensor(ints), torch.tensor(divisors)).numpy())
    np.testing.assert_allclose(Tensor([-5.5, 5.5]).fmod(2).numpy(), [-1.5, 1.5])

  def test_isfinite_isclose(self):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0, 1e-9], np.float32)
    y = np.array([1.0 + 1e-6, np.inf, np.inf, np.nan, 1e-9, 0.0], np.float32)
    np.testing.assert_array_equal(Tensor(x).isfinite().numpy(), torch.isfinite(torch.tensor(x)).numpy())
    assert Tensor([1, 2]).isfinite().numpy().all() and Tensor(1.0).isfinite().shape == ()
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0, "atol": 1e-8}, {"rtol": 1e-3, "atol": 0}):
      np.testing.assert_array_equal(Tensor(x).isclose(Tensor(y), **kwargs).numpy(),
                                    torch.isclose(torch.tensor(x), torch.tensor(y), **kwargs).numpy(), err_msg=kwargs)
    np.testing.assert_array_equal(Tensor([1, 2, 3]).isclose(2).numpy(), [False, True, False])
    with pytest.raises(ValueError, match="rtol"): Tensor([1.0]).isclose(1.0, rtol=-1)

class TestActivations:
  @pytest.mark.parametrize("name,kwargs", [("hardsigmoid", {}), ("hardswish", {}), ("hardtanh", {}),
                                           ("hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("softsign", {}),
                                           ("celu", {}), ("celu", {"alpha": 0.5}), ("selu", {}), ("logsigmoid", {})])
  @pytest.mark.parametrize("shape", [(), (1,), (4, 7)])
  def test_against_torch(self, name, kwargs, shape):
    helper_test_op([shape], lambda x: getattr(F, name)(x, **kwargs), lambda x: getattr(x, name)(**kwargs), low=-5,
                   high=5)

  def test_extreme_inputs(self):
    x = np.array([-1e4, -100.0, -3.0, 3.0, 100.0, 1e4, -np.inf, np.inf], np.float32)
    for name in ("hardsigmoid", "hardswish", "softsign", "logsigmoid", "selu", "celu"):
      np.testing.assert_allclose(getattr(Tensor(x), name)().numpy(), getattr(F, name)(torch.tensor(x)).numpy(),
                                 rtol=1e-6, atol=1e-30, err_msg=name)

  @pytest.mark.parametrize("approximate", ["none", "tanh"])
  def test_gelu(self, approximate):
    helper_test_op([(4, 7)], lambda x: F.gelu(x, approximate=approximate), lambda x: x.gelu(approximate=approximate),
                   atol=2e-6, low=-5, high=5)

  def test_gelu_default_is_tinygrads_tanh(self):
    x = np.linspace(-4, 4, 9).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).gelu().numpy(), F.gelu(torch.tensor(x), approximate="tanh").numpy(),
                               atol=1e-6)

  def test_bad_arguments(self):
    with pytest.raises(ValueError, match="approximate"): Tensor([1.0]).gelu(approximate="exact")
    with pytest.raises(ValueError, match="min_val"): Tensor([1.0]).hardtanh(2, 1)
    with pytest.raises(ValueError, match="alpha"): Tensor([1.0]).celu(0)

class TestCloneMaskedFill:
  def test_clone(self):
    helper_test_op([(3, 5)], lambda x: x.clone() * 2)
    a = Tensor([1.0, 2.0, 3.0]).realize()
    copy = a.clone().realize()
    a.assign(Tensor([7.0, 8.0, 9.0])).realize()
    np.testing.assert_array_equal(copy.numpy(), [1.0, 2.0, 3.0])
    assert Tensor(5).clone().item() == 5 and Tensor(5).clone().dtype == dtypes.int32

  @pytest.mark.parametrize("mask_shape", [(3, 5), (5,), (1, 5), ()])
  def test_masked_fill(self, mask_shape):
    mask = RNG.uniform(size=mask_shape) > 0.5
    helper_test_op([(3, 5)], lambda x: x.masked_fill(torch.tensor(mask), -1.5),
                   lambda x: x.masked_fill(Tensor(mask), -1.5))

  def test_masked_fill_dtypes_and_errors(self):
    x = Tensor([1, 2, 3])
    out = x.masked_fill(Tensor([True, False, True]), 9)
    assert out.dtype == dtypes.int32 and out.tolist() == [9, 2, 9]
    assert x.masked_fill(Tensor([False, True, False]), Tensor(7.9)).tolist() == [1, 7, 3]   # cast to self's dtype
    with pytest.raises(TypeError, match="mask"): x.masked_fill(Tensor([1, 0, 1]), 0)
    with pytest.raises(ValueError, match="mask"): x.masked_fill(Tensor([[True], [False]]), 0)
    with pytest.raises(ValueError, match="value"): x.masked_fill(Tensor([True, False, True]), Tensor([1, 2, 3]))

# ---------------------------------------------------------------------------------------------------------------
# reductions

class TestReduceExtra:
  @pytest.mark.parametrize("shape,axis", [((1,), 0), ((7,), 0), ((3, 5), 1), ((3, 5), 0)])
  def test_softmin(self, shape, axis):
    helper_test_op([shape], lambda x: F.softmin(x, dim=axis), lambda x: x.softmin(axis))

  @pytest.mark.parametrize("name", ["std_mean", "var_mean"])
  @pytest.mark.parametrize("axis,keepdim,correction", [(None, False, 1), (1, True, 1), (0, False, 0),
                                                       ((0, 1), False, 1)])
  def test_std_var_mean(self, name, axis, keepdim, correction):
    def torch_fn(x): return getattr(torch, name)(x, dim=axis, keepdim=keepdim, correction=correction)
    def tgrad_fn(x): return getattr(x, name)(axis, keepdim=keepdim, correction=correction)
    for i in range(2):
      helper_test_op([(3, 5)], lambda x, i=i: torch_fn(x)[i], lambda x, i=i: tgrad_fn(x)[i])

  @pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (math.inf, 1), (0, 1), (-1.5, 0)])
  def test_normalize(self, p, dim):
    helper_test_op([(3, 5)], lambda x: F.normalize(x, p=p, dim=dim), lambda x: x.normalize(p=p, dim=dim))

  def test_normalize_zero_vector(self):
    np.testing.assert_array_equal(Tensor.zeros(2, 3).normalize().numpy(), np.zeros((2, 3), np.float32))
    for p in (0, -1.0):   # torch: p = 0 divides by the count of nonzeros, a negative p by (Σ|x|^p)^(1/p)
      values = np.array([[1.0, 0.0, -2.0], [0.0, 0.0, 0.0]], np.float32)
      np.testing.assert_allclose(Tensor(values).normalize(p=p).numpy(), F.normalize(torch.tensor(values), p=p).numpy())

  def test_sum_prod_dtype(self):
    x = np.array([[1, 2, 3], [4, 5, 250]], np.uint8)
    for dtype, torch_dtype in ((dtypes.float32, torch.float32), (dtypes.int16, torch.int16), ("int64", torch.int64)):
      for axis in (None, 0, 1):
        got_sum = Tensor(x).sum(axis, dtype=dtype)
        got_prod = Tensor(x).prod(axis, dtype=dtype)
        want_sum = torch.tensor(x).sum(dtype=torch_dtype) if axis is None else torch.tensor(x).sum(axis,
                                                                                                   dtype=torch_dtype)
        want_prod = torch.tensor(x).prod(dtype=torch_dtype) if axis is None else torch.tensor(x).prod(axis,
                                                                                                     dtype=torch_dtype)
        assert str(want_sum.dtype).endswith(got_sum.dtype.name) and str(want_prod.dtype).endswith(got_prod.dtype.name)
        compare("sum", got_sum, want_sum, 1e-6, 1e-6)
        compare("prod", got_prod, want_prod, 1e-6, 1e-6)
    helper_test_op([(3, 5)], lambda x: x.sum(1, dtype=torch.float64), lambda x: x.sum(1, dtype=dtypes.float64))

  def test_dtype_min_max(self):
    for dtype, torch_dtype in ((dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8), (dtypes.int32, torch.int32),
                               (dtypes.int64, torch.int64), (dtypes.int16, torch.int16)):
      assert dtype.min == torch.iinfo(torch_dtype).min and dtype.max == torch.iinfo(torch_dtype).max
    assert dtypes.float32.min == -math.inf and dtypes.float32.max == math.inf     # as tinygrad
    assert dtypes.bool.min is False and dtypes.bool.max is True
    assert dtypes.uint32.max == 2 ** 32 - 1 and dtypes.uint64.min == 0

# ---------------------------------------------------------------------------------------------------------------
# movement

class TestMovementExtra:
  @pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
  @pytest.mark.parametrize("shape,padding", [((2, 3, 5), (2, 1)), ((2, 3, 5), (1, 2, 2, 0)),
                                             ((1, 2, 4, 3, 5), (1, 1, 0, 2, 2, 1)), ((2, 1, 3), (2, 2)),
                                             ((1, 3, 4), (0, 3, 1, 0))])
  def test_pad_modes(self, mode, shape, padding):
    if mode == "reflect" and any(p >= s for p, s in zip(padding[::2] + padding[1::2],
                                                       [d for d in shape[::-1]][:len(padding) // 2] * 2)):
      pytest.skip("reflect padding must be smaller than the dim")
    helper_test_op([shape], lambda x: F.pad(x, padding, mode=mode), lambda x: x.pad(padding, mode=mode))

  def test_pad_mode_errors(self):
    x = Tensor.ones(2, 3)
    with pytest.raises(NotImplementedError, match="mode"): x.pad((1, 1), mode="wrap")
    with pytest.raises(RuntimeError, match="too large"): x.pad((3, 0), mode="reflect")
    with pytest.raises(RuntimeError, match="too large"): x.pad((0, 4), mode="circular")
    with pytest.raises(RuntimeError, match="negative size"): x.pad((-4, 0), mode="replicate")
    assert x.pad((-3, 0), mode="replicate").shape == (2, 0)   # as torch
    assert x.pad((2, 0), mode="reflect").shape == (2, 5) and x.pad((3, 3), mode="circular").shape == (2, 9)

  @pytest.mark.parametrize("shape,shifts,dims", [((7,), 3, 0), ((7,), -10, 0), ((3, 5), 2, None),
                                                 ((3, 5), (1, -2), (0, 1)), ((3, 5), (4, 4), (1, 1)), ((1,), 5, 0),
                                                 ((), 3, None), ((3, 5), 0, 1)])
  def test_roll(self, shape, shifts, dims):
    helper_test_op([shape], lambda x: torch.roll(x, shifts, dims), lambda x: x.roll(shifts, dims))

  def test_roll_errors(self):
    with pytest.raises(ValueError, match="shifts"): Tensor.ones(2, 3).roll((1, 2), 0)
    with pytest.raises(IndexError): Tensor.ones(2, 3).roll(1, 2)

  @pytest.mark.parametrize("shape,args", [((7,), (0, 3, 2)), ((7,), (0, 7, 1)), ((3, 8), (1, 3, 3)),
                                          ((3, 8), (0, 2, 1)), ((2, 5, 4), (-2, 2, 2)), ((1,), (0, 1, 1)),
                                          ((), (0, 1, 1)),
                                          ((4, 5), (1, 1, 4)), ((8,), (0, 0, 1)), ((3, 3, 3), (1, 0, 8)),
                                          ((), (0, 0, 1))])
  def test_unfold(self, shape, args):
    helper_test_op([shape], lambda x: x.unfold(*args))

  def test_unfold_errors(self):
    with pytest.raises(RuntimeError, match="size"): Tensor.ones(3).unfold(0, 4, 1)   # torch's class
    with pytest.raises(RuntimeError, match="step"): Tensor.ones(3).unfold(0, 2, 0)
    with pytest.raises(RuntimeError, match="step"): Tensor.ones(3).unfold(0, 1, -1)
    with pytest.raises(IndexError): Tensor.ones(3).unfold(1, 2, 1)

  @pytest.mark.parametrize("indexing", ["ij", "xy"])
  @pytest.mark.parametrize("shapes", [[(3,), (4,)], [(2,), (1,), (5,)], [(3,)], [(), (4,)]])
  def test_meshgrid(self, indexing, shapes):
    def weighted(grids): return sum(grid * (i + 1) for i, grid in enumerate(grids))   # every input gets a gradient
    helper_test_op(shapes, lambda *xs: weighted(torch.meshgrid(*xs, indexing=indexing)),
                   lambda *xs: weighted(Tensor.meshgrid(*xs, indexing=indexing)))
    grids = Tensor.meshgrid(*[Tensor.arange(max(1, math.prod(s))) for s in shapes], indexing=indexing)
    want = torch.meshgrid(*[torch.arange(max(1, math.prod(s))) for s in shapes], indexing=indexing)
    for got_grid, want_grid in zip(grids, want): np.testing.assert_array_equal(got_grid.numpy(), want_grid.numpy())

  def test_meshgrid_errors(self):
    with pytest.raises(ValueError, match="indexing"): Tensor.ones(2).meshgrid(Tensor.ones(3), indexing="ji")
    with pytest.raises(ValueError, match="1-d"): Tensor.ones(2, 2).meshgrid(Tensor.ones(3))

  @pytest.mark.parametrize("shape,repeats,dim", [((3, 5), 2, 1), ((3, 5), 3, 0), ((3, 5), 2, None),
                                                 ((3,), [1, 0, 3], 0), ((2, 3), [2, 1], 0), ((1,), 4, 0), ((), 3, None),
                                                 ((3, 5), 1, -1),
                                                 ((3, 5), 0, 1)])
  def test_repeat_interleave(self, shape, repeats, dim):
    want_repeats = torch.tensor(repeats) if isinstance(repeats, list) else repeats
    helper_test_op([shape], lambda x: torch.repeat_interleave(x, want_repeats, dim),
                   lambda x: x.repeat_interleave(repeats, dim))

  def test_repeat_interleave_tensor_repeats_and_errors(self):
    out = Tensor([[1, 2], [3, 4]]).repeat_interleave(Tensor([1, 2]), 0)
    assert out.tolist() == [[1, 2], [3, 4], [3, 4]]
    with pytest.raises(ValueError, match="repeats"): Tensor([1, 2]).repeat_interleave(-1)
    with pytest.raises(ValueError, match="repeats"): Tensor([1, 2]).repeat_interleave([1, 2, 3], 0)

# ---------------------------------------------------------------------------------------------------------------
# indexing

class TestDiagonals:
  @pytest.mark.parametrize("shape,args", [((4, 4), ()), ((3, 5), (1,)), ((3, 5), (-2,)), ((5, 3), (2, 1, 0)),
                                          ((2, 3, 4), (0, 0, 2)), ((2, 3, 4), (1, -1, 1)), ((3, 5), (7,)),
                                          ((1, 1), ()), ((2, 3, 4), (-1, 2, 0))])
  def test_diagonal(self, shape, args):
    helper_test_op([shape], lambda x: torch.diagonal(x, *args), lambda x: x.diagonal(*args))

  @pytest.mark.parametrize("shape,diagonal", [((4,), 0), ((3,), 2), ((3,), -1), ((1,), 0), ((3, 5), 0), ((3, 5), 2),
                                              ((5, 3), -1)])
  def test_diag(self, shape, diagonal):
    helper_test_op([shape], lambda x: torch.diag(x, diagonal), lambda x: x.diag(diagonal))

  def test_errors_and_dtypes(self):
    with pytest.raises(ValueError, match="dim1"): Tensor.ones(3, 3).diagonal(0, 1, 1)
    with pytest.raises(ValueError, match="1-D or 2-D"): Tensor.ones(2, 2, 2).diag()
    with pytest.raises(ValueError, match="1-D or 2-D"): Tensor(1.0).diag()
    assert Tensor([True, False]).diag().tolist() == [[True, False], [False, False]]
    assert Tensor([1, 2]).diag(1).tolist() == [[0, 1, 0], [0, 0, 2], [0, 0, 0]]

class TestDataDependent:
  @pytest.mark.parametrize("shape,mask_shape", [((3, 5), (3, 5)), ((3, 5), (5,)), ((7,), (7,)), ((), ()), ((1,), (1,)),
                                                ((4, 1), (1, 3))])
  def test_masked_select(self, shape, mask_shape):
    mask = RNG.uniform(size=mask_shape) > 0.4
    helper_test_op([shape], lambda x: torch.masked_select(x, torch.tensor(mask)),
                   lambda x: x.masked_select(Tensor(mask)))

  def test_masked_select_empty_and_errors(self):
    assert Tensor([1.0, 2.0]).masked_select(Tensor([False, False])).shape == (0,)
    assert Tensor([1, 2, 3]).masked_select(Tensor([True, False, True])).tolist() == [1, 3]
    with pytest.raises(TypeError, match="mask"): Tensor([1.0]).masked_select(Tensor([1]))
    with pytest.raises(ValueError): Tensor([1.0, 2.0]).masked_select(Tensor([True, False, True]))

  @pytest.mark.parametrize("values", [np.array([[0, 1.5, 0], [2, 0, -3]], np.float32), np.array([0, 0, 7], np.int32),
                                      np.array(3.0, np.float32), np.array(0, np.int32), np.zeros((2, 3), np.float32),
                                      np.array([[[True, False], [False, True]]]), np.array([np.nan, 0.0], np.float32)])
  def test_nonzero(self, values):
    got = Tensor(values).nonzero()
    want = torch.tensor(values).nonzero()
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())

class TestScatterReduce:
  @pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
  @pytest.mark.parametrize("include_self", [True, False])
  @pytest.mark.parametrize("dim", [0, 1, -1])
  def test_against_torch(self, reduce, include_self, dim):
    index = RNG.integers(0, 4 if dim == 0 else 5, size=(3, 4))
    def torch_fn(x, src): return x.scatter_reduce(dim, torch.tensor(index), src, reduce, include_self=include_self)
    def tgrad_fn(x, src): return x.scatter_reduce(dim, Tensor(index), src, reduce, include_self=include_self)
    helper_test_op([(4, 5), (3, 4)], torch_fn, tgrad_fn, low=0.5, high=2.0)
    helper_test_op([(4, 5), (3, 6)], torch_fn, tgrad_fn, low=0.5, high=2.0, grad=False)   # src larger than index

  @pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
  def test_ints_and_0d(self, reduce):
    x = np.array([[5, -3, 7], [2, 8, -6]], np.int32)
    index = np.array([[0, 0, 2], [1, 1, 1]])
    src = np.array([[4, -9, 3], [7, 1, 2]], np.int32)
    for include_self in (True, False):
      got = Tensor(x).scatter_reduce(1, Tensor(index), Tensor(src), reduce, include_self)
      want = torch.tensor(x).scatter_reduce(1, torch.tensor(index), torch.tensor(src), reduce,
                                            include_self=include_self)
      np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{reduce} {include_self}")
    got = Tensor(2.0).scatter_reduce(0, Tensor(0), Tensor(5.0), reduce)
    want = torch.tensor(2.0).scatter_reduce(0, torch.tensor(0), torch.tensor(5.0), reduce)
    assert got.shape == () and got.item() == pytest.approx(want.item())

  def test_errors(self):
    x, index = Tensor.zeros(2, 3), Tensor([[0, 1], [2, 0]])
    with pytest.raises(ValueError, match="reduce"): x.scatter_reduce(1, index, Tensor.ones(2, 2), "max")
    with pytest.raises(TypeError, match="src"): x.scatter_reduce(1, index, 1.0, "sum")
    with pytest.raises(ValueError, match="src"): x.scatter_reduce(1, index, Tensor.ones(2, 1), "sum")
    with pytest.raises(IndexError):
      x.scatter_reduce(1, Tensor([[0, 3], [0, 0]]), Tensor.ones(2, 2), "sum").realize()

# ---------------------------------------------------------------------------------------------------------------
# sorting

class TestSort:
  @pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -2), ((1,), 0), ((), 0),
                                         ((4, 1), 1)])
  @pytest.mark.parametrize("descending", [False, True])
  def test_sort_values_and_indices(self, shape, dim, descending):
    helper_test_op([shape], lambda x: torch.sort(x, dim=dim, descending=descending, stable=True)[0],
                   lambda x: x.sort(dim, descending)[0])
    values = RNG.uniform(-2, 2, size=shape).astype(np.float32)
    want = torch.sort(torch.tensor(values), dim=dim, descending=descending, stable=True)[1]
    np.testing.assert_array_equal(Tensor(values).sort(dim, descending)[1].numpy(), want.numpy())
    np.testing.assert_array_equal(Tensor(values).argsort(dim, descending).numpy(), want.numpy())

  @pytest.mark.parametrize("descending", [False, True])
  def test_stable_with_ties_nan_and_inf(self, descending):
    values = RNG.integers(0, 3, size=(4, 9)).astype(np.float32)
    values[0, [1, 5]] = np.nan
    values[1, 2], values[2, 0] = np.inf, -np.inf
    got_values, got_indices = Tensor(values).sort(-1, descending)
    want_values, want_indices = torch.sort(torch.tensor(values), dim=-1, descending=descending, stable=True)
    np.testing.assert_array_equal(got_values.numpy(), want_values.numpy())
    np.testing.assert_array_equal(got_indices.numpy(), want_indices.numpy())

  @pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64, np.bool_])
  def test_int_and_bool(self, dtype):
    values = RNG.integers(0, 2 if dtype == np.bool_ else 100, size=(3, 6)).astype(dtype)
    for descending in (False, True):
      got_values, got_indices = Tensor(values).sort(1, descending)
      want_values, want_indices = torch.sort(torch.tensor(values), dim=1, descending=descending, stable=True)
      assert got_values.dtype == dtypes.from_np(dtype)
      np.testing.assert_array_equal(got_values.numpy(), want_values.numpy())
      np.testing.assert_array_equal(got_indices.numpy(), want_indices.numpy())

  @pytest.mark.parametrize("shape,k,dim,largest", [((9,), 3, 0, True), ((9,), 3, 0, False), ((3, 7), 7, 1, True),
                                                   ((3, 7), 1, 0, False), ((3, 7), 0, 1, True), ((1,), 1, 0, True)])
  def test_topk(self, shape, k, dim, largest):
    helper_test_op([shape], lambda x: torch.topk(x, k, dim, largest)[0], lambda x: x.topk(k, dim, largest)[0])
    values = RNG.permutation(np.prod(shape)).reshape(shape).astype(np.float32)   # distinct: one right answer
    np.testing.assert_array_equal(Tensor(values).topk(k, dim, largest)[1].numpy(),
                                  torch.topk(torch.tensor(values), k, dim, largest)[1].numpy())

  def test_errors(self):
    with pytest.raises(ValueError, match="k"): Tensor.ones(3).topk(4)
    with pytest.raises(ValueError, match="k"): Tensor.ones(3).topk(-1)
    with pytest.raises(IndexError): Tensor.ones(3).sort(1)

# ---------------------------------------------------------------------------------------------------------------
# losses and pooling

class TestLosses:
  @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
  @pytest.mark.parametrize("shape", [(5,), (4, 5), (3, 5, 4), (2, 5, 3, 2)])
  @pytest.mark.parametrize("weighted,ignore_index", [(False, -100), (True, -100), (True, 1), (False, 2)])
  def test_nll_loss(self, reduction, shape, weighted, ignore_index):
    classes = shape[0] if len(shape) == 1 else shape[1]
    target = RNG.integers(0, classes, size=shape[:1] + shape[2:] if len(shape) > 1 else ())
    weight = RNG.uniform(0.5, 2, size=classes).astype(np.float32) if weighted else None
    def torch_fn(x):
      return F.nll_loss(x.log_softmax(0 if x.ndim == 1 else 1), torch.tensor(target),
                        None if weight is None else torch.tensor(weight), ignore_index=ignore_index,
                        reduction=reduction)
    def tgrad_fn(x):
      return x.log_softmax(0 if x.ndim == 1 else 1).nll_loss(Tensor(target), None if weight is None else Tensor(weight),
                                                           ignore_index=ignore_index, reduction=reduction)
    helper_test_op([shape], torch_fn, tgrad_fn)

  @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
  @pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
  @pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5), (5,)])
  def test_sparse_categorical_crossentropy(self, reduction, label_smoothing, shape):
    target = RNG.integers(-1, shape[-1], size=shape[:-1])   # -1: the ignored class (tinygrad's default)
    def torch_fn(x):
      logits = x.reshape(-1, shape[-1])
      loss = F.cross_entropy(logits, torch.tensor(target).reshape(-1), ignore_index=-1, reduction=reduction,
                             label_smoothing=label_smoothing)
      return loss.reshape(shape[:-1]) if reduction == "none" else loss
    def tgrad_fn(x):
      return x.sparse_categorical_crossentropy(Tensor(target), label_smoothing=label_smoothing, reduction=reduction)
    if shape == (5,): target = np.array(RNG.integers(0, 5))
    helper_test_op([shape], torch_fn, tgrad_fn)

  def test_loss_errors(self):
    x = Tensor.ones(3, 4)
    with pytest.raises(ValueError, match="reduction"): x.nll_loss(Tensor([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match="reduction"): x.sparse_categorical_crossentropy(Tensor([0, 1, 2]),
                                                                                        reduction="avg")

class TestPoolIndices:
  @pytest.mark.parametrize("shape,kwargs", [((2, 3, 6, 6), {"kernel_size": 2}),
                                            ((1, 2, 7, 5), {"kernel_size": 3, "stride": 2, "padding": 1}),
                                            ((2, 5, 7), {"kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1)}),
                                            ((1, 1, 5, 5), {"kernel_size": 2, "ceil_mode": True}),
                                            ((1, 1, 1, 1), {"kernel_size": 1})])
  def test_max_pool2d_indices(self, shape, kwargs):
    helper_test_op([shape], lambda x: F.max_pool2d(x, **kwargs, return_indices=True)[0],
                   lambda x: x.max_pool2d(**kwargs, return_indices=True)[0])
    values = RNG.normal(size=shape).astype(np.float32)
    got = Tensor(values).max_pool2d(**kwargs, return_indices=True)[1]
    want = F.max_pool2d(torch.tensor(values), **kwargs, return_indices=True)[1]
    assert got.dtype == dtypes.int32   # tinygrad's index dtype (torch: int64)
    np.testing.assert_array_equal(got.numpy(), want.numpy())

  def test_max_pool2d_indices_ints_and_ties(self):
    values = np.array([[[[1, 1, 2, 0], [1, 1, 2, 2], [5, 3, 3, 3], [3, 5, 3, 3]]]], np.int32)
    got = Tensor(values).max_pool2d(2, return_indices=True)[1]
    want = F.max_pool2d(torch.tensor(values).float(), 2, return_indices=True)[1]
    np.testing.assert_array_equal(got.numpy(), want.numpy())

  @pytest.mark.parametrize("shape,kwargs,output_size", [((2, 3, 6, 6), {"kernel_size": 2}, None),
                                                        ((1, 2, 7, 5), {"kernel_size": 3, "stride": 2, "padding": 1},
                                                         (7, 5)),
                                                        ((2, 5, 7), {"kernel_size": 2, "stride": 2}, (5, 7)),
                                                        ((1, 1, 4, 6), {"kernel_size": (2, 3)}, None)])
  def test_max_unpool2d(self, shape, kwargs, output_size):
    values = RNG.normal(size=shape).astype(np.float32)
    pooled, indices = F.max_pool2d(torch.tensor(values), **kwargs, return_indices=True)
    overlapping = kwargs.get("stride", kwargs["kernel_size"]) != kwargs["kernel_size"]
    helper_test_op([tuple(pooled.shape)],
                   lambda x: F.max_unpool2d(x, indices, **kwargs, output_size=output_size),
                   lambda x: x.max_unpool2d(Tensor(indices.numpy()), **kwargs, output_size=output_size),
                   grad=not overlapping, values=[pooled.numpy()])

  def test_max_unpool2d_round_trip_and_errors(self):
    # positive values: a window's maximum is still the maximum after unpooling fills the rest of it with zeros
    x = Tensor((np.abs(RNG.normal(size=(1, 2, 4, 4))) + 0.1).astype(np.float32))
    pooled, indices = x.max_pool2d(2, return_indices=True)
    restored = pooled.max_unpool2d(indices, 2)
    assert restored.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(restored.max_pool2d(2).numpy(), pooled.numpy())
    with pytest.raises(ValueError, match="indices"): pooled.max_unpool2d(indices.float(), 2)
    with pytest.raises(ValueError, match="indices"): pooled.max_unpool2d(indices[0], 2)
    with pytest.raises(IndexError): pooled.max_unpool2d(indices + 100, 2).realize()

class TestAttentionGQA:
  @pytest.mark.parametrize("q_heads,kv_heads,causal", [(4, 2, False), (6, 2, True), (3, 1, False), (2, 2, False)])
  def test_enable_gqa(self, q_heads, kv_heads, causal):
    keys = 5 if causal else 7
    helper_test_op([(2, q_heads, 5, 8), (2, kv_heads, keys, 8), (2, kv_heads, keys, 4)],
                   lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
                   lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=causal, enable_gqa=True), atol=1e-5)

  def test_enable_gqa_errors(self):
    q, k = Tensor.ones(1, 4, 2, 8), Tensor.ones(1, 3, 2, 8)
    with pytest.raises(ValueError, match="enable_gqa"): q.scaled_dot_product_attention(k, k, enable_gqa=True)

class TestZeroDimEdges:
  """Issue 16: 0-d tensors, matmul operand ranks, cat/stack of scalars, bad reshape/permute arguments, as torch."""
  SCALAR = 2.5
  REDUCTIONS = ["sum", "mean", "prod", "amax", "amin", "logsumexp", "softmax", "log_softmax", "cumsum"]

  @pytest.mark.parametrize("axis", [0, -1])
  @pytest.mark.parametrize("name", REDUCTIONS)
  def test_reductions_on_0d(self, name, axis):
    tgrad_name = {"amax": "max", "amin": "min"}.get(name, name)
    helper_test_op([()], lambda x: getattr(x, name)(axis), lambda x: getattr(x, tgrad_name)(axis))

  @pytest.mark.parametrize("axis", [0, -1])
  def test_keepdim_argmax_softmin_on_0d(self, axis):
    x = Tensor(self.SCALAR)
    for name in ["sum", "mean", "prod", "max", "min"]:
      out = getattr(x, name)(axis, keepdim=True)
      assert out.shape == () and out.item() == self.SCALAR
    for name in ["argmax", "argmin"]:
      out = getattr(x, name)(axis)
      want = getattr(torch.tensor(self.SCALAR), name)(axis)
      assert out.shape == tuple(want.shape) == () and out.item() == want.item()
    helper_test_op([()], lambda t: F.softmin(t, axis), lambda t: t.softmin(axis))

  @pytest.mark.parametrize("axis", [1, -2])
  def test_reductions_on_0d_out_of_range(self, axis):
    with pytest.raises(IndexError): torch.tensor(self.SCALAR).sum(axis)
    with pytest.raises(IndexError): torch.tensor(self.SCALAR).cumsum(axis)
    for name in ["sum", "max", "argmax", "softmax", "logsumexp", "cumsum", "cummax"]:
      with pytest.raises(IndexError, match="out of range"): getattr(Tensor(self.SCALAR), name)(axis)

  def test_reductions_on_0d_repeated_axis(self):
    """torch raises RuntimeError for dims (0, -1) of a 0-d tensor; tgrad's repeated-axis error is ValueError."""
    with pytest.raises(RuntimeError): torch.tensor(self.SCALAR).sum((0, -1))
    with pytest.raises(ValueError, match="repeated axis"): Tensor(self.SCALAR).sum((0, -1))
    helper_test_op([()], lambda x: x.sum((0,)), lambda x: x.sum((0,)))

  @pytest.mark.parametrize("shapes", [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((4, 2, 3), (3,)),
                                      ((3,), (4, 3, 2))])
  def test_matmul_vector_shapes(self, shapes):
    helper_test_op(list(shapes), lambda a, b: a @ b, lambda a, b: a @ b, atol=1e-5)
    helper_test_op(list(shapes), torch.matmul, lambda a, b: a.matmul(b), atol=1e-5)

  def test_dot_vectors_is_0d(self):
    helper_test_op([(3,), (3,)], torch.dot, lambda a, b: a.dot(b), atol=1e-5)

  @pytest.mark.parametrize("shapes", [((), (3,)), ((3,), ()), ((), ()), ((), (3, 2))])
  def test_matmul_0d_raises(self, shapes):
    """torch raises RuntimeError; so does tgrad, naming both shapes."""
    with pytest.raises(RuntimeError): torch.ones(shapes[0]) @ torch.ones(shapes[1])
    with pytest.raises(RuntimeError, match=re.escape(f"{shapes[0]} and {shapes[1]}")):
      Tensor.ones(*shapes[0]) @ Tensor.ones(*shapes[1])

  @pytest.mark.parametrize("dim", [0, -1])
  def test_stack_0d(self, dim):
    helper_test_op([(), (), ()], lambda a, b, c: torch.stack([a, b, c], dim),
                   lambda a, b, c: Tensor.stack(a, b, c, dim=dim))

  @pytest.mark.parametrize("shapes", [[(), ()], [(1,), ()], [(), (1,)]])
  def test_cat_0d_raises(self, shapes):
    with pytest.raises(RuntimeError): torch.cat([torch.ones(s) for s in shapes])
    with pytest.raises(ValueError, match=re.escape(str(shapes))): Tensor.cat([Tensor.ones(*s) for s in shapes])

  @pytest.mark.parametrize("shape", [(-1, -1), (-1, 2, -1)])
  def test_reshape_several_minus_one_raises(self, shape):
    with pytest.raises(RuntimeError): torch.ones(2, 3, 4).reshape(shape)
    with pytest.raises(RuntimeError, match="only one dim can be -1"): Tensor.ones(2, 3, 4).reshape(shape)

  @pytest.mark.parametrize("order", [(0, 0, 1), (0, -3, 1), (1, 0)])
  def test_permute_not_a_permutation_raises(self, order):
    with pytest.raises(RuntimeError): torch.ones(2, 3, 4).permute(order)
    with pytest.raises(RuntimeError, match="not a permutation"): Tensor.ones(2, 3, 4).permute(order)

  @pytest.mark.parametrize("order", [(0, 1, 3), (0, 1, -4)])
  def test_permute_out_of_range_raises(self, order):
    with pytest.raises(IndexError): torch.ones(2, 3, 4).permute(order)
    with pytest.raises(IndexError, match="out of range"): Tensor.ones(2, 3, 4).permute(order)

  @pytest.mark.parametrize("order", [(-1, 0, -2), (2, -2, 0), (-3, -2, -1)])
  def test_permute_negative_axes(self, order):
    helper_test_op([(2, 3, 4)], lambda x: x.permute(order), lambda x: x.permute(order))
