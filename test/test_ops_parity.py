"""tinygrad 0.14's Tensor API where it follows torch, checked against torch (values, dtypes, shapes, gradients and
exception classes): return values (cummax/cummin indices, a static size= for masked_select and nonzero, int32
max_pool2d indices), exception classes, Python lists and tuples as indices with torch's shape rules, backward()
without requires_grad, integer widths (arange past int32, Python ints that wrap), edge inputs (unfold size 0, conv2d
negative padding, normalize p = 0, padding that empties a dim), and values (acosh's gradient below −1, sigmoid at
extreme inputs, float16 matmul gradients, uint8 bilinear interpolate). docs/api_coverage.md lists what still differs.
"""
import hashlib
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, Variable, dtypes
from torch_compare import compare, compare_with_torch
import tgrad.tensor_ops.hashing as hashing

RNG = np.random.default_rng(3232)

# ---------------------------------------------------------------------------------------------------------------
# return values

class TestReturnValues:
  @pytest.mark.parametrize("name", ["cummax", "cummin"])
  @pytest.mark.parametrize("shape,axis", [((7,), 0), ((4, 40), 1), ((3, 5, 2), 0), ((2, 0, 3), 1), ((1,), -1)])
  def test_cumulative_extremes_give_values_and_indices(self, name, shape, axis):
    x = RNG.permutation(max(1, int(np.prod(shape)))).astype(np.float32)[:int(np.prod(shape))].reshape(shape)
    values, indices = getattr(Tensor(x), name)(axis)
    want = getattr(torch, name)(torch.tensor(x), axis)
    compare("values", values, want.values, 0, 0)
    assert indices.dtype == dtypes.int32   # tinygrad's index dtype (torch: int64)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    compare_with_torch(lambda t: getattr(torch, name)(t, axis).values, lambda t: getattr(t, name)(axis)[0],
                       values=[x], grad=x.size > 0)

  def test_cumulative_extremes_ties_nan_ints_bools_and_0d(self):
    cases = [np.array([1, 3, 3, 2, 3, 5, 5], np.float32), np.array([1, 3, math.nan, 2, math.nan, 5], np.float32),
             np.array([4, -1, 4, -1, 9], np.int32), np.array([True, False, True, True])]
    for x in cases:
      for name in ("cummax", "cummin"):
        values, indices = getattr(Tensor(x), name)(0)
        want = getattr(torch, name)(torch.tensor(x), 0)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy(), err_msg=f"{name} {x}")
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy(), err_msg=f"{name} {x}")   # the last tie
    values, indices = Tensor(3.0).cummax(0)
    assert values.item() == 3.0 and indices.shape == () and indices.item() == 0
    with pytest.raises(IndexError): Tensor.ones(3).cummin(1)

  def test_nonzero_with_a_static_size(self):
    x = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], np.float32)
    for size, fill in ((5, -1), (2, -1), (0, 7), (3, 0)):
      want = torch.nonzero_static(torch.tensor(x), size=size, fill_value=fill)
      got = Tensor(x).nonzero(size=size, fill_value=fill)
      assert got.dtype == dtypes.int32 and got.shape == tuple(want.shape)
      np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert Tensor(x).nonzero(size=4).tolist()[-1] == [0, 0]   # tinygrad's default fill_value is 0
    np.testing.assert_array_equal(Tensor(x).nonzero().numpy(), torch.nonzero(torch.tensor(x)).numpy())
    with pytest.raises(RuntimeError, match="size"): Tensor(x).nonzero(size=-1)

  def test_masked_select_with_a_static_size(self):
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    mask = x > 0
    selected = x[mask]
    for size in (0, 3, selected.size, selected.size + 4):
      got = Tensor(x).masked_select(Tensor(mask), size=size, fill_value=-9.5)
      want = np.concatenate([selected, np.full(max(0, size - selected.size), -9.5, np.float32)])[:size]
      assert got.shape == (size,) and got.dtype == dtypes.float32
      np.testing.assert_array_equal(got.numpy(), want)
    broadcast = Tensor(x).masked_select(Tensor(mask[0]), size=25)   # the mask broadcasts, as torch's
    np.testing.assert_array_equal(broadcast.numpy()[:int(mask[0].sum()) * 4],
                                  torch.masked_select(torch.tensor(x), torch.tensor(mask[0])).numpy())
    t = Tensor(x, requires_grad=True)
    t.masked_select(Tensor(mask), size=30).sum().backward()   # differentiable; padding takes no gradient
    np.testing.assert_array_equal(t.grad.numpy(), mask.astype(np.float32))

  def test_max_pool2d_indices_are_int32(self):
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    values, indices = Tensor(x).max_pool2d(3, stride=2, padding=1, return_indices=True)
    want_values, want_indices = F.max_pool2d(torch.tensor(x), 3, stride=2, padding=1, return_indices=True)
    assert indices.dtype == dtypes.int32
    compare("values", values, want_values, 0, 0)
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())

# ---------------------------------------------------------------------------------------------------------------
# exception classes

def assert_both_raise(torch_fn, tgrad_fn, error):
  with pytest.raises(error): torch_fn()
  with pytest.raises(error): tgrad_fn()

class TestExceptionClasses:
  def test_clip_without_bounds(self):
    assert_both_raise(lambda: torch.ones(3).clip(), lambda: Tensor.ones(3).clip(), RuntimeError)

  def test_unknown_dtype_names(self):
    for fn in (lambda: Tensor([1.0, 2.0]).sum(dtype=""), lambda: Tensor([1.0, 2.0]).prod(dtype="float31"),
               lambda: Tensor([1.0]).cast("nope")):
      with pytest.raises(AttributeError): fn()   # tinygrad's class: getattr(dtypes, name)
      with pytest.raises(TypeError): fn()        # and Python's for a bad argument
    assert Tensor([1.0, 2.0]).sum(dtype="float64").dtype == dtypes.float64

  def test_linspace_of_bools(self):
    assert_both_raise(lambda: torch.linspace(5, 10, 3, dtype=torch.bool),
                      lambda: Tensor.linspace(5, 10, 3, dtype="bool"), RuntimeError)
    with pytest.raises(NotImplementedError): Tensor.linspace(0, 1, 2, dtype=dtypes.bool)   # torch's exact class

  def test_stack_and_cat_of_nothing(self):
    assert_both_raise(lambda: torch.stack([]), lambda: Tensor.stack(), RuntimeError)
    assert_both_raise(lambda: torch.stack([]), lambda: Tensor.stack([]), RuntimeError)
    assert_both_raise(lambda: torch.cat([]), lambda: Tensor.cat([]), ValueError)   # torch's class for cat
    a = Tensor([1, 2])
    assert a.stack(a, dim=1).tolist() == [[1, 1], [2, 2]] and Tensor.cat([a, a]).tolist() == [1, 2, 1, 2]

  def test_one_hot_with_a_negative_class_count(self):
    assert_both_raise(lambda: F.one_hot(torch.tensor([1]), -2), lambda: Tensor([1]).one_hot(-2), RuntimeError)
    assert Tensor([0, 2]).one_hot(-1).tolist() == F.one_hot(torch.tensor([0, 2]), -1).tolist()   # inferred

  def test_unfold_errors(self):
    x = torch.ones(8)
    assert_both_raise(lambda: x.unfold(0, 9, 3), lambda: Tensor.ones(8).unfold(0, 9, 3), RuntimeError)
    assert_both_raise(lambda: x.unfold(0, 1, -1), lambda: Tensor.ones(8).unfold(0, 1, -1), RuntimeError)
    assert_both_raise(lambda: x.unfold(1, 8, 3), lambda: Tensor.ones(8).unfold(1, 8, 3), IndexError)

# ---------------------------------------------------------------------------------------------------------------
# Python lists and tuples as indices

INDEX_SHAPE = (2, 5, 6, 5, 3)
INDEX_CASES = [
  ([0, 1],), ((0, 1), slice(None)), (slice(None), (4, 0, 2)), ([[1], [0]], (2, 3)), (((0,),),), ((1, 0), [2, 3], 0),
  (None, [1, 0], 4, (0, 2)), (None, 1, [1, 2], None), ([0, 1], None, [1, 2]),
  (1, (2, 1, 0), None, (0, 1, 4), (2, 1, 0)), (Ellipsis, 1, [0, 2], None), ([1], 2, None, [3, 4], 1),
  (slice(None), 0, slice(None), [0, 1]), ([1, 0], slice(1, 4), 2),
  ((0, -1), [[-1], [2]], slice(None, None, 2)), (0, None, [1, 2]), ([True, False, True, False, True][:2], 1),
]

class TestListAndTupleIndices:
  @pytest.mark.parametrize("index", INDEX_CASES, ids=lambda i: repr(i)[:40])
  def test_shapes_and_values_as_torch(self, index):
    x = np.arange(np.prod(INDEX_SHAPE), dtype=np.float32).reshape(INDEX_SHAPE)
    want = torch.tensor(x)[index]
    got = Tensor(x)[index]
    assert got.shape == tuple(want.shape), f"{index}: {got.shape} != {tuple(want.shape)}"
    np.testing.assert_array_equal(got.numpy(), want.numpy())

  def test_mixed_with_tensors_and_gradients(self):
    i = np.array([[1], [0]], np.int32)
    compare_with_torch(lambda t: t[torch.tensor(i, dtype=torch.int64), 2, None, (3, 4)],
                       lambda t: t[Tensor(i), 2, None, (3, 4)], shapes=[INDEX_SHAPE], rng=RNG)
    compare_with_torch(lambda t: t[(0, 1), :, [2, 2]], shapes=[(3, 4, 5)], rng=RNG)

  def test_setitem_with_lists_and_tuples(self):
    for index in (((0, 2), slice(None)), ([1, 0], 1, (3, 4)), (None, [2], slice(1, 3))):
      want = torch.zeros(3, 4, 5)
      values = torch.arange(want[index].numel(), dtype=torch.float32).reshape(want[index].shape) + 1
      want[index] = values
      got = Tensor.zeros(3, 4, 5).contiguous()
      got[index] = Tensor(values.numpy())
      np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=str(index))

  def test_bad_indices_raise(self):
    with pytest.raises(IndexError): Tensor.ones(3, 4)[(0, 4)]   # a tuple of ints is one int per dim: out of bounds
    with pytest.raises(IndexError): Tensor.ones(3, 4)[[0, 1.5]]
    with pytest.raises(IndexError): Tensor.ones(3, 4)[(0, 5), :].realize()

# ---------------------------------------------------------------------------------------------------------------
# backward without requires_grad (tinygrad 0.14 fills .grad of every float tensor in the graph)

class TestBackwardWithoutRequiresGrad:
  def test_undecided_leaves_get_gradients(self):
    t = Tensor([1.0, 2.0, 3.0])
    t.sum().backward()
    assert t.grad.tolist() == [1.0, 1.0, 1.0]

  @pytest.mark.parametrize("compare_op", [lambda a: a != 0, lambda a: a < 0, lambda a: a >= 0.5])
  def test_through_comparisons_as_torch(self, compare_op):
    x = RNG.standard_normal(6).astype(np.float32)
    tt = Tensor(x)
    (tt * compare_op(tt)).sum().backward()
    t = torch.tensor(x, requires_grad=True)
    (t * compare_op(t)).sum().backward()
    np.testing.assert_allclose(tt.grad.numpy(), t.grad.numpy(), rtol=1e-6)

  def test_requires_grad_tensors_take_precedence(self):
    w, x = Tensor([2.0, -1.0], requires_grad=True), Tensor([3.0, 4.0])
    (w * x).sum().backward()
    assert w.grad.tolist() == [3.0, 4.0] and x.grad is None   # as torch: only tensors that require grad

  def test_nothing_to_fill_raises_as_torch(self):
    a, b = Tensor.ones(4, requires_grad=True), Tensor.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"): (a < b).sum().backward()
    with pytest.raises(RuntimeError): (torch.ones(4, requires_grad=True) < torch.ones(4)).sum().backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
      (Tensor([1.0], requires_grad=False) * 2).sum().backward()

# ---------------------------------------------------------------------------------------------------------------
# integers

class TestIntegerWidths:
  @pytest.mark.parametrize("args", [(2 ** 31, 2 ** 31 + 3), (-2 ** 31 - 2, -2 ** 31 + 1), (0, 2 ** 40, 2 ** 38),
                                    (2 ** 33, 2 ** 33 - 6, -2)])
  def test_arange_past_int32_infers_int64(self, args):
    got, want = Tensor.arange(*args), torch.arange(*args)
    assert got.dtype == dtypes.int64
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert Tensor.arange(5).dtype == dtypes.int32 and Tensor.arange(2 ** 31 - 3, 2 ** 31).dtype == dtypes.int32

  @pytest.mark.parametrize("op", ["|", "&", "^", "+", "-", "*"])
  @pytest.mark.parametrize("scalar", [2 ** 40, 2 ** 33 + 7, -2 ** 40 - 3, 2 ** 63 + 5])
  def test_large_python_ints_wrap_as_torch(self, op, scalar):
    fn = {"|": lambda a, s: a | s, "&": lambda a, s: a & s, "^": lambda a, s: a ^ s, "+": lambda a, s: a + s,
          "-": lambda a, s: a - s, "*": lambda a, s: a * s}[op]
    values = np.array([1, -8, 1 << 20, 7], np.int32)
    try: want = fn(torch.tensor(values), scalar)
    except RuntimeError: pytest.skip("torch can't take this int")   # torch raises past int64
    got = fn(Tensor(values), scalar)
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), want.numpy())

  def test_pow_with_an_int_the_dtype_cannot_hold_raises(self):
    for exponent in (2 ** 40, 2 ** 31):
      with pytest.raises(RuntimeError): torch.tensor([2], dtype=torch.int32) ** exponent
      with pytest.raises(OverflowError, match="out of bounds for int32"): Tensor([2]) ** exponent
      with pytest.raises(OverflowError, match="out of bounds for int32"): exponent ** Tensor([2])

  def test_small_dtypes_and_bools(self):
    for dtype, torch_dtype in ((dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8), (dtypes.int16, torch.int16)):
      values = np.array([1, 100, 3], dtype.np)
      np.testing.assert_array_equal((Tensor(values) + 300).numpy(), (torch.tensor(values) + 300).numpy())
      np.testing.assert_array_equal((Tensor(values) ^ 1000).numpy(), (torch.tensor(values) ^ 1000).numpy())
    got, want = Tensor([True, False]) + 2 ** 40, torch.tensor([True, False]) + 2 ** 40
    assert got.dtype == dtypes.int64 and got.tolist() == want.tolist()

# ---------------------------------------------------------------------------------------------------------------
# edge inputs

class TestEdgeInputs:
  @pytest.mark.parametrize("shape,args", [((8,), (0, 0, 1)), ((8,), (0, 0, 3)), ((3, 3, 3), (1, 0, 8)),
                                          ((), (0, 0, 1)), ((2, 5), (-1, 0, 2))])
  def test_unfold_with_size_zero(self, shape, args):
    x = torch.ones(shape)
    assert Tensor.ones(*shape).unfold(*args).shape == tuple(x.unfold(*args).shape)

  @pytest.mark.parametrize("padding,crop", [(-1, (1, -1, 1, -1)), ((-1, 0, -1, 0), (1, None, 1, None)),
                                            ((-2, 1), (2, -2, None, None))])
  def test_conv2d_with_negative_padding_crops(self, padding, crop):
    top, bottom, left, right = crop
    def torch_fn(x, w):
      x = x[:, :, top:bottom, left:right]
      return F.conv2d(F.pad(x, (1, 1)) if padding == (-2, 1) else x, w)
    compare_with_torch(torch_fn, lambda x, w: x.conv2d(w, padding=padding), shapes=[(2, 2, 10, 9), (3, 2, 3, 3)],
                       rng=RNG, atol=1e-5, rtol=1e-4)

  @pytest.mark.parametrize("p", [0, -1.0, -2.5])
  def test_normalize_with_p_zero_and_negative(self, p):
    values = np.array([[1.0, 0.0, -2.0, 0.5], [0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 0.0, 2.0]], np.float32)
    compare("normalize", Tensor(values).normalize(p=p), F.normalize(torch.tensor(values), p=p), 1e-6, 1e-5)
    compare("normalize dim 0", Tensor(values).normalize(p=p, dim=0), F.normalize(torch.tensor(values), p=p, dim=0),
            1e-6, 1e-5)

  @pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
  @pytest.mark.parametrize("pads", [(-2, -1, 0, 0), (0, 0, -3, 0), (2, -5, 0, 0), (-1, 0, 2, -5), (-2, -2, 0, 0)])
  def test_padding_that_empties_a_dim(self, mode, pads):
    x = torch.ones(1, 1, 3, 3)
    try: want = F.pad(x, pads, mode=mode)
    except RuntimeError:
      with pytest.raises(RuntimeError): Tensor.ones(1, 1, 3, 3).pad(pads, mode=mode)
      return
    assert Tensor.ones(1, 1, 3, 3).pad(pads, mode=mode).shape == tuple(want.shape)

# ---------------------------------------------------------------------------------------------------------------
# values

class TestValues:
  def test_acosh_gradient_below_minus_one(self):
    values = np.array([-300.0, -3.0, -2.0, -1.5, 1.5, 3.0, 300.0], np.float32)
    x, t = Tensor(values), torch.tensor(values, requires_grad=True)
    got_grad = x.acosh().sum().gradient(x)[0]
    t.acosh().sum().backward()
    np.testing.assert_allclose(got_grad.numpy(), t.grad.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(np.isnan(x.acosh().numpy()), np.isnan(t.acosh().detach().numpy()))

  @pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
  def test_sigmoid_at_extreme_inputs(self, dtype):
    values = [-1000.0, -400.0, -90.0, 0.0, 90.0, 400.0, 1000.0, math.inf, -math.inf]
    x, t = Tensor(values, dtype=str(dtype).replace("torch.", "")), torch.tensor(values, dtype=dtype, requires_grad=True)
    y = x.sigmoid()
    grad = y.sum().gradient(x)[0]
    t.sigmoid().sum().backward()
    assert not np.isnan(y.numpy()).any() and not np.isnan(grad.numpy()).any()
    np.testing.assert_array_equal(y.numpy(), t.sigmoid().detach().numpy())
    np.testing.assert_array_equal(grad.numpy(), t.grad.numpy())

  @pytest.mark.parametrize("shapes", [((64, 64), (64, 64)), ((3, 40, 33), (33, 17)), ((130,), (130, 9))])
  def test_half_matmul_gradients_accumulate_in_float32(self, shapes):
    # the gradients of sum(x.half() @ y.half()) are sums over the broadcast dims, added in float32 and within 5e-3 of
    # torch's; the forward multiplies in float16 (torch's CPU rounds only the float32 sum): an element that cancels
    # can be 1e-2 off (docs/api_coverage.md)
    x, y = (RNG.uniform(-2, 2, s).astype(np.float32) for s in shapes)
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    want = tx.half() @ ty.half()
    want.sum().backward()
    gx, gy = Tensor(x), Tensor(y)
    got = gx.half() @ gy.half()
    compare("forward", got, want, 2e-2, 5e-3)
    for mine, theirs in zip(got.sum().gradient(gx, gy), (tx.grad, ty.grad)):
      compare("gradient", mine, theirs, 5e-3, 5e-3)

  def test_uint8_bilinear_interpolate_is_fixed_point(self):
    image = RNG.integers(0, 256, (2, 3, 64, 64)).astype(np.uint8)
    for size in ((10, 10), (77, 31)):
      want = F.interpolate(torch.tensor(image), size=size, mode="bilinear")
      got = Tensor(image).interpolate(size, mode="linear")
      assert got.dtype == dtypes.uint8
      np.testing.assert_array_equal(got.numpy(), want.numpy())

# ---------------------------------------------------------------------------------------------------------------
# keccak and hash (tinygrad's names, checked against hashlib)

class TestHashing:
  def test_keccak_against_hashlib(self):
    messages = np.random.default_rng(7).integers(0, 256, (2, 3, 137)).astype(np.uint8)   # one byte past a block
    references = {"sha3_256": lambda b: hashlib.sha3_256(b).digest(),
                  "sha3_512": lambda b: hashlib.sha3_512(b).digest(),
                  "shake_128": lambda b: hashlib.shake_128(b).digest(16)}
    for cfg, reference in references.items():
      got = Tensor(messages).keccak(cfg)
      assert got.dtype == dtypes.uint8 and got.shape == (2, 3, len(reference(b"")))
      for i in range(2):
        for j in range(3): assert bytes(got.numpy()[i, j]) == reference(messages[i, j].tobytes()), (cfg, i, j)
    for length in (0, 135, 136):   # empty; the domain byte and the final mark in one byte; a whole extra block
      message = np.arange(length, dtype=np.uint8)
      assert bytes(Tensor(message).keccak().numpy()) == hashlib.sha3_256(message.tobytes()).digest(), length

  def test_keccak_errors(self):
    with pytest.raises(TypeError, match="byte"): Tensor([1.0, 2.0]).keccak()
    with pytest.raises(ValueError, match="cfg"): Tensor([1], dtype=dtypes.uint8).keccak("md5")

  def test_hash_is_tinygrads_shake_128_tree(self, monkeypatch):
    # the tree's shape with small chunks (the real ones, 1 MiB of 4 KiB leaves, take a minute on the CPU device)
    monkeypatch.setattr(hashing, "HASH_CHUNK_BYTES", 512)
    monkeypatch.setattr(hashing, "HASH_LEAF_BYTES", 128)
    def tree(data: bytes) -> bytes:   # one chunk: its 128-byte leaves hashed, then their digests
      return hashlib.shake_128(b"".join(hashlib.shake_128(data[i:i + 128]).digest(16)
                                        for i in range(0, 512, 128))).digest(16)
    def reference(data: bytes) -> bytes:
      while len(data) > 512:
        data = data + bytes(-len(data) % 512)
        data = b"".join(tree(data[i:i + 512]) for i in range(0, len(data), 512))
      return tree(data + bytes(512 - len(data)))
    for length in (5, 512, 1500):
      message = np.random.default_rng(length).integers(0, 256, length).astype(np.uint8)
      got = Tensor(message).hash()
      assert got.shape == (16,) and bytes(got.numpy()) == reference(message.tobytes()), length

def test_schedule_with_vars_names_the_bound_variables():
  rows = Variable("rows", 1, 8).bind(5)
  x = Tensor(np.arange(8, dtype=np.float32))
  items, values = (x.shrink(((0, rows),)) * 2.5).schedule_with_vars()
  assert values == {"rows": 5} and len(items) == len(x.shrink(((0, rows),)).mul(2.5).schedule())
  assert Tensor.ones(3).sum().schedule_with_vars()[1] == {}
