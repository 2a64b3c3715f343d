"""Issue 16, parts 3 and 4: edge cases exactly as torch, each checked against torch (values, result dtype, gradient,
exception class): result dtypes of losses, reductions, interpolate, pow and div; matmul/einsum with 1-d and 0-d
operands; fancy indexing (lists, tensors, ints, slices, None/Ellipsis, bool masks); reshape/permute/flip/pad errors;
negative padding in every mode; asymmetric pooling padding; argument errors of linspace/one_hot/scatter; pow at
0, ±inf and negative bases with its gradients; activations at extreme inputs in float32 and float16; shifts of
floats; and the tinygrad Tensor methods added for the API count (bench/api_coverage.py).
"""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes
from torch_compare import compare, compare_with_torch

RNG = np.random.default_rng(1616)
ATOL, RTOL = 1e-5, 1e-5

def torch_dtype_name(t: torch.Tensor) -> str: return str(t.dtype).replace("torch.", "")

def assert_same_error(torch_fn, tgrad_fn, error=RuntimeError, match=None):
  """Both raise `error` (torch's class); tgrad's message matches `match` when given."""
  with pytest.raises(error): torch_fn()
  with pytest.raises(error, match=match): tgrad_fn()

# ---------------------------------------------------------------------------------------------------------------
# 1. result dtypes

class TestResultDtypes:
  @pytest.mark.parametrize("target_dtype", [dtypes.int32, dtypes.bool, dtypes.float32])
  def test_binary_crossentropy_keeps_float32(self, target_dtype):
    p, y = RNG.uniform(0.05, 0.95, (4, 3)).astype(np.float32), RNG.integers(0, 2, (4, 3))
    got = Tensor(p).binary_crossentropy(Tensor(y).cast(target_dtype))
    got_logits = Tensor(p).binary_crossentropy_logits(Tensor(y).cast(target_dtype))
    assert got.dtype == got_logits.dtype == dtypes.float32
    compare("bce", got, F.binary_cross_entropy(torch.tensor(p), torch.tensor(y, dtype=torch.float32)), ATOL, RTOL)
    compare("bce_logits", got_logits, F.binary_cross_entropy_with_logits(torch.tensor(p),
                                                                         torch.tensor(y, dtype=torch.float32)),
            ATOL, RTOL)

  @pytest.mark.parametrize("index_dtype", [dtypes.int32, dtypes.int64, dtypes.uint8])
  def test_class_losses_keep_float32(self, index_dtype):
    logits, y = RNG.standard_normal((5, 4)).astype(np.float32), np.array([0, 3, 1, 2, 3])
    for name, got, want in [
        ("cross_entropy", Tensor(logits).cross_entropy(Tensor(y, dtype=index_dtype)),
         F.cross_entropy(torch.tensor(logits), torch.tensor(y))),
        ("nll_loss", Tensor(logits).log_softmax(1).nll_loss(Tensor(y, dtype=index_dtype)),
         F.nll_loss(torch.tensor(logits).log_softmax(1), torch.tensor(y)))]:
      assert got.dtype == dtypes.float32, name
      compare(name, got, want, ATOL, RTOL)

  @pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
  @pytest.mark.parametrize("op", ["mean", "var", "std", "softmax", "log_softmax", "logsumexp", "pow2.5",
                                  "rpow", "pow_half", "div_floor", "div_trunc"])
  def test_float_ops_keep_their_dtype(self, dtype, op):
    x = RNG.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    fns = {"mean": lambda t: t.mean(), "var": lambda t: t.var(), "std": lambda t: t.std(),
           "softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1),
           "logsumexp": lambda t: t.logsumexp(-1), "pow2.5": lambda t: t ** 2.5,
           "rpow": lambda t: 2.5 ** t, "pow_half": lambda t: t ** 0.5,
           "div_floor": lambda t: t.div(0.3, rounding_mode="floor"),
           "div_trunc": lambda t: t.div(0.3, rounding_mode="trunc")}
    torch_x = torch.tensor(x, dtype=torch.float16 if dtype == dtypes.float16 else torch.float32)
    want, got = fns[op](torch_x), fns[op](Tensor(x, dtype=dtype))
    assert got.dtype.name == torch_dtype_name(want), f"{op}: {got.dtype} vs {want.dtype}"
    tolerance = 3e-3 if dtype == dtypes.float16 else 1e-5
    compare(op, got, want, tolerance, tolerance)

  @pytest.mark.parametrize("mode", [None, "trunc", "floor"])
  @pytest.mark.parametrize("dtype", ["int32", "int16", "uint8", "float32", "float16"])
  def test_div_rounding_mode_dtypes(self, mode, dtype):
    a = np.array([7, 9, 0, 5, 100, 13], dtype=dtype)
    b = np.array([2, 4, 3, 5, 7, 6], dtype=dtype)
    if dtype[0] != "u": a = a * np.array([1, -1, 1, -1, -1, 1], dtype=dtype)
    want = torch.tensor(a).div(torch.tensor(b), rounding_mode=mode)
    got = Tensor(a).div(Tensor(b), rounding_mode=mode)
    assert got.dtype.name == torch_dtype_name(want)
    compare(f"div {mode}", got, want, 1e-3, 1e-3)

  def test_div_bad_rounding_mode(self):
    assert_same_error(lambda: torch.ones(2).div(2, rounding_mode="round"),
                      lambda: Tensor.ones(2).div(2, rounding_mode="round"), match="rounding_mode")

  @pytest.mark.parametrize("exponent", [-1, -2, -70])
  def test_int_to_negative_int_power_raises(self, exponent):
    assert_same_error(lambda: torch.tensor([2, 3]) ** exponent, lambda: Tensor([2, 3]) ** exponent,
                      match="negative integer powers")
    assert_same_error(lambda: torch.tensor([True]) ** exponent, lambda: Tensor([True]) ** exponent)

  def test_int_powers_of_tensor_exponents_match_torch(self):
    base, exponent = np.array([2, -2, 1, -1, 0, 3], np.int32), np.array([-1, -3, -2, -3, 2, 2], np.int32)
    compare("int pow", Tensor(base) ** Tensor(exponent), torch.tensor(base) ** torch.tensor(exponent), 0, 0)

  @pytest.mark.parametrize("mode,size,align", [("nearest", (3, 3), False), ("nearest", (7, 6), False),
                                               ("nearest-exact", (3, 5), False), ("nearest-exact", (8, 8), False),
                                               ("bilinear", (3, 3), False), ("bilinear", (7, 5), True),
                                               ("bilinear", (11, 2), False), ("bilinear", (1, 9), True),
                                               ("bilinear", (4, 13), False)])
  def test_interpolate_uint8_stays_uint8(self, mode, size, align):
    image = RNG.integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
    kwargs = {"align_corners": True} if align else {}
    want = F.interpolate(torch.tensor(image), size=size, mode=mode, **kwargs)
    got = Tensor(image).interpolate(size, mode="linear" if mode == "bilinear" else mode, **kwargs)
    assert got.dtype == dtypes.uint8 and want.dtype == torch.uint8
    # nearest modes copy values; bilinear is torch's fixed point (int16 weights, a uint8 pass per axis), bit for bit
    np.testing.assert_array_equal(got.numpy(), want.numpy())

  def test_interpolate_uint8_bilinear_bit_exact_on_random_sizes(self):
    for _ in range(12):
      (height, width), (out_h, out_w) = RNG.integers(1, 30, 2), RNG.integers(1, 40, 2)
      align = bool(RNG.integers(2))
      image = RNG.integers(0, 256, (2, 3, height, width)).astype(np.uint8)
      want = F.interpolate(torch.tensor(image), size=(int(out_h), int(out_w)), mode="bilinear", align_corners=align)
      got = Tensor(image).interpolate((int(out_h), int(out_w)), mode="bilinear", align_corners=align)
      np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{image.shape} -> {(out_h, out_w)} {align}")

  def test_interpolate_float32_stays_float32(self):
    x = RNG.standard_normal((1, 1, 3, 4)).astype(np.float32)
    out = Tensor(x).interpolate((5, 7))
    assert out.dtype == dtypes.float32
    compare("bilinear", out, F.interpolate(torch.tensor(x), size=(5, 7), mode="bilinear"), 1e-5, 1e-5)

# ---------------------------------------------------------------------------------------------------------------
# 2. matmul, dot and einsum with 1-d and 0-d operands

class TestMatmulEinsum:
  @pytest.mark.parametrize("shapes", [[(3,), (3,)], [(2, 3), (3,)], [(3,), (3, 4)], [(2, 2, 3), (3,)],
                                      [(3,), (2, 3, 4)], [(1, 2, 3), (5, 3, 2)], [(4, 1, 2, 3), (3, 3, 1)]])
  def test_matmul_1d_and_batched(self, shapes):
    compare_with_torch(lambda a, b: a @ b, shapes=shapes, rng=RNG, atol=1e-5, rtol=1e-5)
    compare_with_torch(lambda a, b: a.matmul(b), shapes=shapes, rng=RNG, atol=1e-5, rtol=1e-5)

  @pytest.mark.parametrize("shapes", [[(), (3,)], [(3,), ()], [(), ()], [(2, 3), ()]])
  def test_matmul_and_dot_0d_raise(self, shapes):
    a, b = (torch.ones(s) for s in shapes)
    x, y = (Tensor.ones(*s) for s in shapes)
    assert_same_error(lambda: a @ b, lambda: x @ y, match="at least 1-D")
    assert_same_error(lambda: a.dot(b), lambda: x.dot(y))

  def test_matmul_mismatch_raises(self):
    assert_same_error(lambda: torch.ones(2, 3) @ torch.ones(2, 3), lambda: Tensor.ones(2, 3) @ Tensor.ones(2, 3),
                      match=r"\(2, 3\) @ \(2, 3\)")
    assert_same_error(lambda: torch.ones(2, 2, 3) @ torch.ones(3, 3, 1),
                      lambda: Tensor.ones(2, 2, 3) @ Tensor.ones(3, 3, 1), match="batch dims")

  @pytest.mark.parametrize("formula,shapes", [
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("i...->...", [(3, 2, 4)]), ("...ii->...i", [(2, 3, 3)]), ("b...,b...->b", [(2, 3, 4), (2, 3, 4)]),
    ("->", [()]), (",i->i", [(), (4,)]), ("i,->i", [(4,), ()]), (",->", [(), ()]), ("ij,->ji", [(2, 3), ()]),
    ("...,...->...", [(2, 3), (3,)]), ("...", [(2, 3)])])
  def test_einsum_ellipsis_and_0d(self, formula, shapes):
    compare_with_torch(lambda *xs: torch.einsum(formula, *xs), lambda *xs: Tensor.einsum(formula, *xs),
                       shapes=shapes, rng=RNG, atol=1e-5, rtol=1e-5)

  @pytest.mark.parametrize("formula,shapes", [("ij,jk->ik", [(2, 3), (4, 5)]), ("ij->iz", [(2, 3)]),
                                              ("ijk->ik", [(2, 3)]), ("ij,jk->ik", [(2, 3)])])
  def test_einsum_errors(self, formula, shapes):
    assert_same_error(lambda: torch.einsum(formula, *[torch.ones(s) for s in shapes]),
                      lambda: Tensor.einsum(formula, *[Tensor.ones(*s) for s in shapes]))

# ---------------------------------------------------------------------------------------------------------------
# 3. fancy indexing

FANCY_INDICES = [   # built twice: once with torch tensors, once with tgrad ones (T is the tensor constructor)
  lambda T: [0, 1, 0], lambda T: [-1, 0, -2], lambda T: ([0, 1], [2, -1]), lambda T: (1, [0, 2]),
  lambda T: (slice(None), [0, 2]), lambda T: ([0, 1], slice(None), [1, 3]), lambda T: (0, slice(None), [1, 3]),
  lambda T: ([1, 0], slice(None), 2), lambda T: (slice(None), 1, [1, 3]), lambda T: (None, [0, 1], slice(None), [2, 3]),
  lambda T: (Ellipsis, [0, 4]), lambda T: ([1], Ellipsis, [0, 4]), lambda T: ([[0], [1]], slice(None), [0, 1, 2]),
  lambda T: (slice(None), None, [0, 2], None), lambda T: T([1, 0, 1]), lambda T: (T(1), slice(None), T([0, 2])),
  lambda T: (slice(1, None), T([[2, 0], [1, 1]]), slice(None, None, 2)), lambda T: (T([-1, 0]), Ellipsis, T(-2)),
  lambda T: (slice(None), T([0, 2]), None, T([1, 3])), lambda T: [], lambda T: T([True, False]),
  lambda T: (slice(None), T([True, False, True])), lambda T: T(np.arange(6).reshape(2, 3) % 2 == 0),
  lambda T: (Ellipsis, T([True, False, False, True, True])), lambda T: ([True, False], 1, [0, 3]),
]

class TestFancyIndexing:
  @pytest.mark.parametrize("make_index", FANCY_INDICES)
  def test_against_torch(self, make_index):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    def torch_tensor(v): return torch.tensor(np.asarray(v))
    torch_index, tgrad_index = make_index(torch_tensor), make_index(Tensor)
    if isinstance(torch_index, list): torch_index = torch.tensor(torch_index, dtype=torch.long if not any(
      isinstance(i, bool) for i in torch_index) else torch.bool)   # torch reads a bare list as a tensor (2.9+)
    compare_with_torch(lambda t: t[torch_index], lambda t: t[tgrad_index], values=[x])

  def test_bool_mask_setitem(self):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    mask = x > 0
    want, got = torch.tensor(x), Tensor(x)
    want[torch.tensor(mask)] = -1.0
    got[Tensor(mask)] = -1.0
    compare("mask setitem", got, want, 0, 0)
    want[0, [1, 3]] = torch.tensor([7.0, 8.0])
    got[0, [1, 3]] = Tensor([7.0, 8.0])
    compare("list setitem", got, want, 0, 0)

  def test_mask_shape_mismatch_raises(self):
    assert_same_error(lambda: torch.ones(3, 4)[torch.tensor([True, False])],
                      lambda: Tensor.ones(3, 4)[Tensor([True, False])], error=IndexError, match="mask")

  def test_out_of_range_list_raises_index_error(self):
    with pytest.raises(IndexError): torch.ones(2, 3)[[0, 5]]
    with pytest.raises(IndexError, match="5"): Tensor.ones(2, 3)[[0, 5]].realize()
    with pytest.raises(IndexError): Tensor.ones(2, 3)[[-3]].realize()

  def test_0d_bool_index_raises(self):
    with pytest.raises(IndexError, match="0-d bool"): Tensor.ones(3)[Tensor(True)]

  def test_float_index_raises(self):
    assert_same_error(lambda: torch.ones(3)[torch.tensor([1.0])], lambda: Tensor.ones(3)[Tensor([1.0])],
                      error=IndexError)

# ---------------------------------------------------------------------------------------------------------------
# 4. reshape, permute, flip: torch's exception classes

class TestShapeErrors:
  @pytest.mark.parametrize("shape,error", [((-1, -1), RuntimeError), ((-2, 12), RuntimeError),
                                           ((5, 5), RuntimeError), ((5, -1), RuntimeError), ((0, -1), RuntimeError),
                                           ((-1, 2, -1), RuntimeError), ((2, -3, -4), RuntimeError)])
  def test_reshape(self, shape, error):
    assert_same_error(lambda: torch.ones(2, 3, 4).reshape(shape), lambda: Tensor.ones(2, 3, 4).reshape(shape), error,
                      match=r"\(2, 3, 4\)")

  @pytest.mark.parametrize("shape", [(-1,), (4, -1), (-1, 3, 2), (2, None, -1)])
  def test_reshape_infers_one_dim(self, shape):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    torch_shape = tuple(3 if s is None else s for s in shape)   # None keeps a dim (tinygrad's)
    compare("reshape", Tensor(x).reshape(shape), torch.tensor(x).reshape(torch_shape), 0, 0)

  def test_reshape_of_empty_with_minus_one_is_ambiguous(self):
    assert_same_error(lambda: torch.zeros(2, 0, 3).reshape(2, 0, -1), lambda: Tensor.zeros(2, 0, 3).reshape(2, 0, -1))

  @pytest.mark.parametrize("order,error", [((0, 0, 1), RuntimeError), ((0, -3, 1), RuntimeError),
                                           ((1, 0), RuntimeError), ((0, 1, 2, 3), RuntimeError),
                                           ((0, 1, 3), IndexError), ((0, 1, -4), IndexError)])
  def test_permute(self, order, error):
    assert_same_error(lambda: torch.ones(2, 3, 4).permute(order), lambda: Tensor.ones(2, 3, 4).permute(order), error)

  @pytest.mark.parametrize("dims,error", [((0, 0), RuntimeError), ((0, -3), RuntimeError), ((1, 2, -2), RuntimeError),
                                          ((3,), IndexError)])
  def test_flip(self, dims, error):
    assert_same_error(lambda: torch.ones(2, 3, 4).flip(dims), lambda: Tensor.ones(2, 3, 4).flip(dims), error)

  def test_transpose_out_of_range(self):
    assert_same_error(lambda: torch.ones(2, 3).transpose(0, 2), lambda: Tensor.ones(2, 3).transpose(0, 2), IndexError)

# ---------------------------------------------------------------------------------------------------------------
# 5. pad with negative amounts

NEGATIVE_PADS = [(-1, -1), (-1, 2), (2, -1), (-2, 1), (1, -3), (-3, 3), (1, -2, -1, 1), (-1, 0, 2, -2), (0, -4)]

class TestNegativePad:
  @pytest.mark.parametrize("pads", NEGATIVE_PADS)
  @pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
  def test_against_torch(self, pads, mode):
    shape = (1, 4, 5) if len(pads) == 2 else (1, 2, 4, 5)
    if mode == "circular" and any(p > 0 and p > s + min(0, q) for p, q, s in [(pads[0], pads[1], 5),
                                                                               (pads[1], pads[0], 5)]):
      pytest.skip("torch's circular wraps at most once around what is left")
    compare_with_torch(lambda x: F.pad(x, pads, mode=mode), lambda x: x.pad(pads, mode=mode), shapes=[shape], rng=RNG)

  @pytest.mark.parametrize("pads", [(1, -1), (-2, -1), (2, -3)])
  def test_constant_value_with_cuts(self, pads):
    compare_with_torch(lambda x: F.pad(x, pads, value=-7.5), lambda x: x.pad(pads, value=-7.5), shapes=[(3, 4)],
                       rng=RNG)

  @pytest.mark.parametrize("mode", ["reflect", "replicate"])
  def test_negative_size_raises_and_nothing_left_is_empty(self, mode):
    assert_same_error(lambda: F.pad(torch.ones(1, 1, 3, 3), (-2, -2, 0, 0), mode=mode),
                      lambda: Tensor.ones(1, 1, 3, 3).pad((-2, -2, 0, 0), mode=mode), match="negative size")
    # as torch's 2-d padding: cutting exactly the whole dim leaves it empty (its 1-d padding raises there instead)
    for pads in ((-2, -1, 0, 0), (1, -4, 0, 0), (0, 0, -3, 0)):
      want = F.pad(torch.ones(1, 1, 3, 3), pads, mode=mode)
      assert Tensor.ones(1, 1, 3, 3).pad(pads, mode=mode).shape == tuple(want.shape)

  def test_cut_too_much_raises(self):
    assert_same_error(lambda: F.pad(torch.ones(1, 2, 5), (-3, -3)), lambda: Tensor.ones(1, 2, 5).pad((-3, -3)))
    assert_same_error(lambda: F.pad(torch.ones(1, 2, 5), (1,)), lambda: Tensor.ones(1, 2, 5).pad((1,)))
    assert_same_error(lambda: F.pad(torch.ones(1, 2, 5), (1, 1), mode="wrap"),
                      lambda: Tensor.ones(1, 2, 5).pad((1, 1), mode="wrap"), NotImplementedError)

  @pytest.mark.parametrize("mode", ["circular", "constant"])
  def test_cut_to_empty(self, mode):
    compare("empty", Tensor.ones(1, 2, 5).pad((-2, -3), mode=mode), F.pad(torch.ones(1, 2, 5), (-2, -3), mode=mode),
            0, 0)

# ---------------------------------------------------------------------------------------------------------------
# 6. pooling with asymmetric padding (tinygrad's (left, right, top, bottom)) and torch's symmetric form

ASYMMETRIC_PADS = [(1, 0, 0, 1), (0, 1, 1, 0), (1, 1, 0, 0), (0, 0, 2, 1), (2, 0, 1, 1)]

class TestPoolingPadding:
  @pytest.mark.parametrize("pads", ASYMMETRIC_PADS)
  @pytest.mark.parametrize("kernel,stride", [((2, 2), None), ((3, 3), (2, 1)), ((2, 3), 1)])
  def test_max_pool_asymmetric(self, pads, kernel, stride):
    compare_with_torch(lambda x: F.max_pool2d(F.pad(x, pads, value=-math.inf), kernel, stride),
                       lambda x: x.max_pool2d(kernel, stride, padding=pads), shapes=[(2, 2, 5, 6)], rng=RNG)

  @pytest.mark.parametrize("pads", ASYMMETRIC_PADS)
  @pytest.mark.parametrize("kernel,stride", [((2, 2), None), ((3, 3), (2, 1))])
  @pytest.mark.parametrize("count_include_pad", [True, False])
  def test_avg_pool_asymmetric(self, pads, kernel, stride, count_include_pad):
    def reference(x):
      total = F.avg_pool2d(F.pad(x, pads), kernel, stride, divisor_override=1)
      if count_include_pad: return total / math.prod(kernel)
      return total / F.avg_pool2d(F.pad(torch.ones_like(x), pads), kernel, stride, divisor_override=1)
    compare_with_torch(reference, lambda x: x.avg_pool2d(kernel, stride, padding=pads,
                                                         count_include_pad=count_include_pad),
                       shapes=[(2, 2, 5, 6)], rng=RNG)

  @pytest.mark.parametrize("ceil_mode", [False, True])
  @pytest.mark.parametrize("count_include_pad", [True, False])
  @pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), ((2, 3), (2, 2), (1, 1)), (2, 2, 1), (3, 3, 1)])
  def test_symmetric_forms_agree(self, ceil_mode, count_include_pad, kernel, stride, padding):
    """torch's padding p is tinygrad's (p, p, p, p): both give torch's result, ceil_mode and count_include_pad too."""
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    flat = (pw, pw, ph, ph)
    for pad_arg in (padding, flat):
      compare_with_torch(lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad),
                         lambda x: x.avg_pool2d(kernel, stride, padding=pad_arg, ceil_mode=ceil_mode,
                                                count_include_pad=count_include_pad), shapes=[(1, 2, 7, 6)], rng=RNG)
      compare_with_torch(lambda x: F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode),
                         lambda x: x.max_pool2d(kernel, stride, padding=pad_arg, ceil_mode=ceil_mode),
                         shapes=[(1, 2, 7, 6)], rng=RNG)

  def test_max_pool_indices_with_asymmetric_padding(self):
    x = RNG.standard_normal((1, 1, 4, 5)).astype(np.float32)
    _, indices = Tensor(x).max_pool2d(2, 2, padding=(1, 0, 0, 1), return_indices=True)
    values = Tensor(x).max_pool2d(2, 2, padding=(1, 0, 0, 1)).numpy()
    np.testing.assert_array_equal(x.reshape(-1)[indices.numpy().reshape(-1)], values.reshape(-1))

  def test_symmetric_padding_over_half_the_kernel_raises(self):
    assert_same_error(lambda: F.max_pool2d(torch.ones(1, 1, 4, 4), 2, padding=2),
                      lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(2, padding=2), match="half")

# ---------------------------------------------------------------------------------------------------------------
# 7. argument errors: torch's classes, raised before any kernel runs

class TestArgumentErrors:
  def test_linspace(self):
    assert_same_error(lambda: torch.linspace(0, 1, -1), lambda: Tensor.linspace(0, 1, -1), match="non-negative")
    assert_same_error(lambda: torch.linspace(0, 1, 2.5), lambda: Tensor.linspace(0, 1, 2.5), TypeError, match="int")
    compare("linspace 0", Tensor.linspace(0, 1, 0), torch.linspace(0, 1, 0), 0, 0)
    compare("linspace 1", Tensor.linspace(2, 5, 1), torch.linspace(2, 5, 1), 0, 0)

  def test_one_hot(self):
    assert_same_error(lambda: F.one_hot(torch.tensor([0, 1]), -2), lambda: Tensor([0, 1]).one_hot(-2),
                      match="num_classes")
    assert_same_error(lambda: F.one_hot(torch.tensor([0.0, 1.0]), 2), lambda: Tensor([0.0, 1.0]).one_hot(2),
                      match="float32")
    assert_same_error(lambda: F.one_hot(torch.tensor([0, 3]), 2), lambda: Tensor([0, 3]).one_hot(2).realize(),
                      match="class 3")
    assert_same_error(lambda: F.one_hot(torch.tensor([0, -1]), 2), lambda: Tensor([0, -1]).one_hot(2).realize(),
                      match="class -1")

  @pytest.mark.parametrize("index,src,match", [
    ([[3, 0]], 1.0, "index 3"), ([[-1, 0]], 1.0, "index -1"), ([[1, 0, 0, 0, 0]], 1.0, r"\[1, 5\]"),
    ([1, 0], 1.0, "same number of dimensions"), ([[1.0, 0.0]], 1.0, "int index"),
    ([[1, 0]], np.array([[1, 2]]), "dtype"), ([[1, 0]], np.array([[1.0]], np.float32), r"\[1, 2\]")])
  def test_scatter(self, index, src, match):
    def run(lib):
      make = torch.tensor if lib == "torch" else Tensor
      src_arg = make(src) if isinstance(src, np.ndarray) else src
      return (make(np.zeros((3, 4), np.float32)).scatter(0, make(np.array(index)), src_arg))
    assert_same_error(lambda: run("torch"), lambda: run("tgrad").realize(), match=match)

  def test_scatter_dim_out_of_range(self):
    assert_same_error(lambda: torch.zeros(3, 4).scatter(2, torch.tensor([[0]]), 1.0),
                      lambda: Tensor.zeros(3, 4).scatter(2, Tensor([[0]]), 1.0), IndexError)

  def test_gather_out_of_range(self):
    assert_same_error(lambda: torch.zeros(3, 4).gather(0, torch.tensor([[3]])),
                      lambda: Tensor.zeros(3, 4).gather(0, Tensor([[3]])).realize(), match="index 3")

# ---------------------------------------------------------------------------------------------------------------
# 8. pow at 0, ±inf, negative bases, and its gradients

POW_BASES = [0., 0., 0., -2., -2., -2., -np.inf, -np.inf, np.inf, 2., 0., -0., 1., -1., np.nan, 0., -0.5, 0.5, -3.]
POW_EXPONENTS = [0., -1., 2., 2., 3., 0.5, 0.5, 2., -1., 0., 0.5, -1., np.nan, np.inf, 0., 1., -np.inf, np.inf, -2.]

def _compare_pow(torch_fn, tgrad_fn, inputs, tol=1e-5):
  torch_inputs = [torch.tensor(np.array(v, np.float32), requires_grad=True) for v in inputs]
  tgrad_inputs = [Tensor(np.array(v, np.float32), requires_grad=True) for v in inputs]
  want, got = torch_fn(*torch_inputs), tgrad_fn(*tgrad_inputs)
  np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol, err_msg="forward")
  want.sum().backward()
  got.sum().backward()
  for i, (t, g) in enumerate(zip(torch_inputs, tgrad_inputs)):
    np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol, err_msg=f"gradient {i}")

class TestPowEdges:
  def test_tensor_base_and_exponent(self):
    _compare_pow(lambda b, e: b ** e, lambda b, e: b ** e, [POW_BASES, POW_EXPONENTS])

  @pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, -3, 0.0, 0.5, -0.5, 1.5, 2.0, -1.5, 100, 1 / 3])
  def test_scalar_exponents(self, exponent):
    """(−inf is left out: torch computes x ** ±0.5 with sqrt/rsqrt, and its gradients of other exponents at −inf
    through those too, so they disagree with its own pow.)"""
    _compare_pow(lambda x: x ** exponent, lambda x: x ** exponent, [[0., 2., -2., 3., 1e-3, np.inf, 1., -0.5]])

  @pytest.mark.parametrize("base", [0.0, 2.0, -2.0, 0.5, 1.0])
  def test_scalar_bases(self, base):
    _compare_pow(lambda e: base ** e, lambda e: base ** e, [[0., -1., 2., 0.5, 1., -np.inf, np.inf, 3.]])

  @pytest.mark.parametrize("exponent", [-1, -2, -4])
  def test_negative_integer_exponents(self, exponent):
    """−1 and −2 are torch's exact reciprocals 1/x and 1/(x·x); −4 is pow (1e10 ** −4 is a denormal, not 1/inf)."""
    x = np.array([3.0, 7.0, -0.1, 1e-3, 1e10, 0.37], np.float32)
    want = (torch.tensor(x) ** exponent).numpy()
    if exponent > -4: np.testing.assert_array_equal((Tensor(x) ** exponent).numpy(), want)
    else: np.testing.assert_allclose((Tensor(x) ** exponent).numpy(), want, rtol=1e-5, atol=0)

  def test_square_gradient_at_zero(self):
    x = Tensor([0.0, -0.0], requires_grad=True)
    (x ** 2).sum().backward()
    assert x.grad.numpy().tolist() == [0.0, 0.0]

  def test_half(self):
    x = np.array([0., 2., -2., 0.5, 3.], np.float32)
    e = np.array([0., -1., 2., 0.5, 1.5], np.float32)
    want = torch.tensor(x, dtype=torch.float16) ** torch.tensor(e, dtype=torch.float16)
    got = Tensor(x, dtype=dtypes.float16) ** Tensor(e, dtype=dtypes.float16)
    assert got.dtype == dtypes.float16
    compare("half pow", got, want, 2e-3, 2e-3)

# ---------------------------------------------------------------------------------------------------------------
# 9. activations at extreme inputs

EXTREMES = [-np.inf, -1e4, -100., -20., -1., -1e-3, 0., 1e-3, 1., 20., 100., 1e4, np.inf]
ACTIVATIONS = {
  "sigmoid": (torch.sigmoid, lambda t: t.sigmoid()),
  "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), lambda t: t.gelu(approximate="tanh")),
  "gelu_none": (lambda t: F.gelu(t), lambda t: t.gelu(approximate="none")),
  "hardsigmoid": (F.hardsigmoid, lambda t: t.hardsigmoid()),
  "softplus": (F.softplus, lambda t: t.softplus()),
  "softplus_beta": (lambda t: F.softplus(t, beta=2.5), lambda t: t.softplus(beta=2.5)),
  "logsigmoid": (F.logsigmoid, lambda t: t.logsigmoid()),
  "silu": (F.silu, lambda t: t.silu()),
  "tanh": (torch.tanh, lambda t: t.tanh()),
  "mish": (F.mish, lambda t: t.mish()),
  "elu": (F.elu, lambda t: t.elu()),
  "elu_alpha": (lambda t: F.elu(t, alpha=0.5), lambda t: t.elu(0.5)),
  "celu": (lambda t: F.celu(t, alpha=2.0), lambda t: t.celu(2.0)),
  "selu": (F.selu, lambda t: t.selu()),
  "hardswish": (F.hardswish, lambda t: t.hardswish()),
  "logaddexp": (lambda t: torch.logaddexp(t, torch.zeros_like(t)), lambda t: t.logaddexp(0.0)),
}

class TestActivationExtremes:
  @pytest.mark.parametrize("name", ACTIVATIONS)
  @pytest.mark.parametrize("dtype", ["float32", "float16"])
  def test_values_and_gradients(self, name, dtype):
    torch_fn, tgrad_fn = ACTIVATIONS[name]
    x = np.array(EXTREMES, np.float32)
    torch_x = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
    tgrad_x = Tensor(x, dtype=getattr(dtypes, dtype), requires_grad=True)
    want, got = torch_fn(torch_x), tgrad_fn(tgrad_x)
    assert got.dtype == tgrad_x.dtype
    want.float().sum().backward()
    got.float().sum().backward()
    tolerance = 2e-3 if dtype == "float16" else 1e-5
    want_values, want_grads = want.detach().float().numpy(), torch_x.grad.float().numpy()
    got_values, got_grads = got.float().numpy(), tgrad_x.grad.float().numpy()
    # torch itself gives NaN in a few places (gelu('none') at +inf, gradients at ±inf): there any value is allowed
    for label, g, w in [("value", got_values, want_values), ("gradient", got_grads, want_grads)]:
      finite = np.isfinite(w)
      assert np.isfinite(g[finite]).all(), f"{name} {label}: non-finite where torch is finite: {g} vs {w}"
      np.testing.assert_allclose(g[~np.isnan(w)], w[~np.isnan(w)], rtol=tolerance, atol=tolerance,
                                 err_msg=f"{name} {label}")

  def test_tiny_tails_keep_their_precision(self):
    """softplus(-20) ≈ 2.06e-9 and logsigmoid(20) ≈ −2.06e-9, not 0 (log1p, not log(1 + tiny))."""
    x = np.array([-20.0, -30.0, -87.0], np.float32)
    np.testing.assert_allclose(Tensor(x).softplus().numpy(), F.softplus(torch.tensor(x)).numpy(), rtol=1e-5)
    np.testing.assert_allclose(Tensor(-x).logsigmoid().numpy(), F.logsigmoid(torch.tensor(-x)).numpy(), rtol=1e-5)

# ---------------------------------------------------------------------------------------------------------------
# 10. shifts

class TestShifts:
  @pytest.mark.parametrize("fn", [lambda x, y: x << y, lambda x, y: x >> y, lambda x, y: x.lshift(y) if hasattr(
    x, "lshift") else x.bitwise_left_shift(y)])
  def test_float_operands_raise(self, fn):
    for a, b in [(np.array([1.0]), 1), (np.array([1]), np.array([1.0])), (np.array([1.5]), np.array([1]))]:
      torch_b = torch.tensor(b) if isinstance(b, np.ndarray) else b
      tgrad_b = Tensor(b) if isinstance(b, np.ndarray) else b
      with pytest.raises(NotImplementedError): fn(torch.tensor(a), torch_b)
      with pytest.raises(NotImplementedError, match="int or bool"): fn(Tensor(a), tgrad_b)
      with pytest.raises(TypeError): fn(Tensor(a), tgrad_b)   # also a TypeError, Python's convention

  def test_float_list_amount_raises(self):
    with pytest.raises(NotImplementedError): Tensor([1, 2]) << [1.0, 2.0]

  @pytest.mark.parametrize("dtype", ["int32", "uint8", "int8"])
  @pytest.mark.parametrize("amount", [-1, 0, 3, 7, 8, 31, 32, 40])
  def test_amounts_outside_the_width(self, dtype, amount):
    x = np.array([-8, 5, 1, 100, -128], dtype=np.int64).astype(dtype)
    for op in (lambda a: a << amount, lambda a: a >> amount):
      compare(f"shift {amount}", op(Tensor(x)), op(torch.tensor(x)), 0, 0)

  def test_tensor_amounts(self):
    x, amounts = np.array([-8, 5, 1, 3], np.int32), np.array([-1, 40, 2, 31], np.int32)
    compare("<<", Tensor(x) << Tensor(amounts), torch.tensor(x) << torch.tensor(amounts), 0, 0)
    compare(">>", Tensor(x) >> Tensor(amounts), torch.tensor(x) >> torch.tensor(amounts), 0, 0)

# ---------------------------------------------------------------------------------------------------------------
# 11. the tinygrad methods added for the API count

class TestAddedMethods:
  def test_api_coverage_list_is_consistent(self):
    import sys
    sys.path.insert(0, "bench")
    from api_coverage import TINYGRAD_TENSOR_API, MISSING_REASONS, missing_names
    names = [n for group in TINYGRAD_TENSOR_API.values() for n in group]
    assert len(names) == len(set(names))
    assert set(missing_names()) == set(MISSING_REASONS), "docs/api_coverage.md's reasons must match what is missing"

  def test_kaiming_normal(self):
    Tensor.manual_seed(3)
    w = Tensor.kaiming_normal(128, 64, a=0.5).numpy()
    assert w.shape == (128, 64)
    assert abs(w.std() / (math.sqrt(2 / 1.25) / 8) - 1) < 0.05 and abs(w.mean()) < 0.01

  def test_randperm(self):
    Tensor.manual_seed(5)
    p = Tensor.randperm(50)
    assert p.dtype == dtypes.int32 and sorted(p.numpy().tolist()) == list(range(50))
    assert Tensor.randperm(0).shape == (0,)
    with pytest.raises(RuntimeError): Tensor.randperm(-1)

  def test_multinomial(self):
    Tensor.manual_seed(7)
    weights = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    samples = Tensor(weights).multinomial(40000, replacement=True)
    assert samples.dtype == dtypes.int32 and samples.shape == (40000,)
    np.testing.assert_allclose(np.bincount(samples.numpy(), minlength=4) / 40000, weights / weights.sum(), atol=0.01)
    rows = Tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]).multinomial(5, replacement=True).numpy()
    assert rows.tolist() == [[1] * 5, [0] * 5]
    assert Tensor([[0.2, 0.8]]).multinomial().shape == (1, 1)
    with pytest.raises(NotImplementedError): Tensor(weights).multinomial(2)
    with pytest.raises(RuntimeError): Tensor.ones(2, 2, 2).multinomial()

  @pytest.mark.parametrize("formula,sizes,reference", [
    ("b c h w -> b h w c", {}, lambda a: a.transpose(0, 2, 3, 1)),
    ("b c h w -> b (c h w)", {}, lambda a: a.reshape(2, -1)),
    ("b c (h1 h2) w -> b h1 c h2 w", {"h1": 2}, lambda a: a.reshape(2, 3, 2, 2, 5).transpose(0, 2, 1, 3, 4)),
    ("b c h w -> (w b) h c", {}, lambda a: a.transpose(3, 0, 2, 1).reshape(10, 4, 3)),
    ("... w -> w ...", {}, lambda a: a.transpose(3, 0, 1, 2)),
    ("b ... -> (b ...)", {}, lambda a: a.reshape(-1)),
    ("b c h w -> b () c h w 1", {}, lambda a: a.reshape(2, 1, 3, 4, 5, 1)),
    ("b c (h1 h2) (w1 w2) -> (b h1 w1) (c h2 w2)", {"h2": 2, "w1": 5},
     lambda a: a.reshape(2, 3, 2, 2, 5, 1).transpose(0, 2, 4, 1, 3, 5).reshape(20, 6))])
  def test_rearrange(self, formula, sizes, reference):
    a = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(Tensor(a).rearrange(formula, **sizes).numpy(), reference(a))

  @pytest.mark.parametrize("formula,sizes", [("b c h -> b c h", {}), ("b c h w -> b c h", {}),
                                             ("b c (h1 h2) w -> b c h1 h2 w", {}), ("b c h w -> b c h w", {"x": 2}),
                                             ("b c h w -> b c h h", {}), ("b c h w b c", {})])
  def test_rearrange_errors(self, formula, sizes):
    with pytest.raises(ValueError): Tensor.ones(2, 3, 4, 5).rearrange(formula, **sizes)

  def test_rearrange_gradient(self):
    compare_with_torch(lambda x: x.permute(0, 2, 1).reshape(2, -1),
                       lambda x: x.rearrange("b c n -> b (n c)"), shapes=[(2, 3, 4)], rng=RNG)

  def test_shrink_to_pad_to(self):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(Tensor(x).shrink_to(2, None).numpy(), x[:2])
    np.testing.assert_array_equal(Tensor(x).pad_to(None, 6).numpy(), np.pad(x, ((0, 0), (0, 2))))
    with pytest.raises(ValueError): Tensor(x).pad_to(4)

  def test_allclose_usum_uprod_eq_ne_xor(self):
    a, b = np.array([1.0, 2.0, np.nan], np.float32), np.array([1.0, 2.0 + 1e-6, np.nan], np.float32)
    for equal_nan in (False, True):
      assert Tensor(a).allclose(Tensor(b), equal_nan=equal_nan) == torch.allclose(torch.tensor(a), torch.tensor(b),
                                                                                  equal_nan=equal_nan)
    x, y, z = Tensor([1, 2]), Tensor([3, 4]), Tensor([5, 6])
    assert x.usum(y, z).tolist() == [9, 12] and x.uprod([y, z]).tolist() == [15, 48]
    assert Tensor([True, False]).usum(Tensor([False, False])).tolist() == [True, False]
    assert x.eq(Tensor([1, 3])).tolist() == [True, False] and x.ne(1).tolist() == [False, True]
    assert x.bitwise_xor(3).tolist() == (torch.tensor([1, 2]).bitwise_xor(3)).tolist()

  def test_dtype_helpers(self):
    x = Tensor([1.5, -2.0])
    assert x.bfloat16().dtype == dtypes.bfloat16 and x.short().dtype == dtypes.int16
    assert x.short().tolist() == [1, -2] and x.is_floating_point() and not x.int().is_floating_point()
    c = x.const_like(3)
    assert c.dtype == dtypes.float32 and c.tolist() == [3.0, 3.0]
    assert Tensor([1, 2]).ufix(2.5).dtype == dtypes.float32

  def test_replace_and_to_(self):
    x = Tensor([1.0, 2.0])
    assert x.replace(Tensor([3, 4])).tolist() == [3, 4] and x.dtype == dtypes.int32
    with pytest.raises(ValueError): x.replace(Tensor([1.0]))
    assert x.to_(x.device) is x and x.tolist() == [3, 4]

  def test_contiguous_backward(self):
    compare_with_torch(lambda x: (x * 2).sum(0), lambda x: (x.contiguous_backward() * 2).sum(0), shapes=[(3, 4)],
                       rng=RNG)

  def test_schedule_counts_kernels_without_running(self):
    a, b = Tensor(RNG.standard_normal((4, 4)).astype(np.float32)), Tensor(RNG.standard_normal(4).astype(np.float32))
    Tensor.realize(a, b)
    assert len((a * b + 1).sum().schedule()) == 1
    assert (a * b + 1).sum().numpy() == pytest.approx(float((a.numpy() * b.numpy() + 1).sum()), rel=1e-5)

  @pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3), (1, 1)])
  def test_qr(self, shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    q, r = Tensor(a).qr()
    want_q, want_r = torch.linalg.qr(torch.tensor(a), mode="complete")
    compare("Q", q, want_q, 1e-5, 1e-4)
    compare("R", r, want_r, 1e-5, 1e-4)

  def test_qr_of_triangular_and_gradient(self):
    a = np.triu(RNG.standard_normal((3, 3))).astype(np.float32)
    q, r = Tensor(a).qr()
    compare("Q", q, torch.linalg.qr(torch.tensor(a))[0], 1e-6, 1e-6)
    compare_with_torch(lambda x: sum(m.sum() * w for m, w in zip(torch.linalg.qr(x), (1.0, 0.5))),
                       lambda x: sum(m.sum() * w for m, w in zip(x.qr(), (1.0, 0.5))), shapes=[(4, 4)], rng=RNG,
                       atol=1e-4, rtol=1e-4)

  @pytest.mark.parametrize("shape", [(3, 3), (5, 3), (3, 5), (2, 3, 3), (1, 4)])
  @pytest.mark.parametrize("full_matrices", [True, False])
  def test_svd(self, shape, full_matrices):
    """torch's singular values and shapes; U·diag(S)·Vᵀ gives the input back and U, Vᵀ are orthonormal (singular
    vectors are unique only up to sign, so they are not compared one by one)."""
    a = RNG.standard_normal(shape).astype(np.float32)
    u, s, vt = (t.numpy() for t in Tensor(a).svd(full_matrices))
    want_u, want_s, want_vt = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
    assert (u.shape, s.shape, vt.shape) == (tuple(want_u.shape), tuple(want_s.shape), tuple(want_vt.shape))
    np.testing.assert_allclose(s, want_s.numpy(), rtol=1e-5, atol=1e-6)
    k = min(shape[-2:])
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :], a, atol=1e-5)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] +
                                                                            (u.shape[-1],) * 2), atol=1e-5)
    np.testing.assert_allclose(vt @ np.swapaxes(vt, -1, -2), np.broadcast_to(np.eye(vt.shape[-2]), vt.shape[:-2] +
                                                                              (vt.shape[-2],) * 2), atol=1e-5)

  def test_newton_schulz(self):
    g = RNG.standard_normal((4, 6)).astype(np.float32)
    params = (3.4445, -4.7750, 2.0315)
    x = g / (np.sqrt((g * g).sum()) + 1e-7)
    for _ in range(5):
      gram = x @ x.T
      x = params[0] * x + params[1] * gram @ x + params[2] * gram @ gram @ x
    np.testing.assert_allclose(Tensor(g).newton_schulz(5, params).numpy(), x, atol=1e-4)
    np.testing.assert_allclose(Tensor(g.T).newton_schulz(5, params).numpy(), x.T, atol=1e-4)
