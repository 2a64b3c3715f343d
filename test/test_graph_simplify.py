"""Graph simplification before scheduling (tgrad/graph_simplify.py): constants folded with the kernels' semantics,
identities removed only where they hold for every value (NaN, inf and −0.0 included), fewer ops and kernels, and the
same values as numpy."""
import math
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.graph_simplify import simplify_graph
from tgrad.ops import Ops, ELEMENTWISE
from tgrad.schedule import create_schedule

def graph_ops(t: Tensor, simplified: bool) -> int:
  """Elementwise and reduce ops among the unrealized bases above t, before or after simplification."""
  root = t.lazydata.base
  if simplified: root = simplify_graph([root])[0][0].base
  seen, stack, count = set(), [root], 0
  while stack:
    lb = stack.pop()
    if id(lb) in seen or lb.buffer is not None: continue
    seen.add(id(lb))
    count += lb.op in ELEMENTWISE or lb.op is Ops.REDUCE_AXIS
    stack.extend(s.base for s in lb.srcs)
  return count

def kernel_count(*ts: Tensor) -> int:
  return sum(item.ast.op is Ops.SINK for item in create_schedule([t.lazydata for t in ts]))

def realized(data, dtype=None) -> Tensor: return Tensor(np.asarray(data), dtype=dtype).realize()

def test_constant_chain_folds():
  x = realized(np.array([1.0, -2.0, 3.0], np.float32))
  out = (Tensor.full((3,), 3.0) * 2 + 1).sqrt() * x
  assert (graph_ops(out, False), graph_ops(out, True)) == (4, 1)
  np.testing.assert_allclose(out.numpy(), np.sqrt(7.0) * np.array([1.0, -2.0, 3.0]), rtol=1e-6)

def test_int_folding_wraps_around():
  x = realized(np.zeros(3, np.int32))
  out = (Tensor.full((3,), 2**31 - 1, dtype=dtypes.int32) + 1) * 3 + x
  assert graph_ops(out, True) == 1
  expected = (np.full(3, 2**31 - 1, np.int32) + np.int32(1)) * np.int32(3)
  np.testing.assert_array_equal(out.numpy(), expected)

def test_uint8_folding_wraps_around():
  x = realized(np.zeros(2, np.uint8))
  out = Tensor.full((2,), 250, dtype=dtypes.uint8) * 3 + x
  np.testing.assert_array_equal(out.numpy(), np.full(2, 250 * 3 % 256, np.uint8))

def test_float16_folding_rounds_each_op():
  x = realized(np.zeros(3, np.float16))
  one, tiny = Tensor.full((3,), 1.0, dtype=dtypes.float16), 2.0**-11   # half an ulp of 1.0: ties to even
  out = (one + tiny) + tiny + x
  expected = (np.float16(1.0) + np.float16(tiny)) + np.float16(tiny)
  assert expected == np.float16(1.0)
  assert graph_ops(out, True) == 1
  np.testing.assert_array_equal(out.numpy(), np.full(3, expected, np.float16))
  big = Tensor.full((3,), 60000.0, dtype=dtypes.float16) * 2 + x   # overflows to inf, as the kernels do
  assert np.all(np.isinf(big.numpy()))

def test_cast_folds():
  x = realized(np.zeros(3, np.int32))
  out = Tensor.full((3,), -2.7).cast(dtypes.int32) + x
  assert graph_ops(out, True) == 1
  np.testing.assert_array_equal(out.numpy(), np.full(3, -2, np.int32))
  half = Tensor.full((3,), 0.1).cast(dtypes.float16).cast(dtypes.float32) + realized(np.zeros(3, np.float32))
  np.testing.assert_array_equal(half.numpy(), np.full(3, np.float32(np.float16(0.1))))

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.float16, dtypes.float32])
@pytest.mark.parametrize("op", ["add", "mul", "sub", "max", "lt", "div"])
def test_folded_constants_match_kernels(op, dtype):
  """Each binary op on two constants, folded, against the same op in a kernel (constants made buffers first)."""
  a, b = (100, 57) if dtype.is_int else (1.2345, -0.3)
  def apply(x, y):
    if op == "add": return x + y
    if op == "mul": return x * y
    if op == "sub": return x - y
    if op == "max": return x.maximum(y)
    if op == "lt": return x < y
    return x / y
  folded = apply(Tensor.full((2,), a, dtype=dtype), Tensor.full((2,), b, dtype=dtype))
  kernel = apply(Tensor.full((2,), a, dtype=dtype).contiguous(), Tensor.full((2,), b, dtype=dtype).contiguous())
  np.testing.assert_array_equal(folded.numpy(), kernel.numpy())

def test_float_times_zero_is_not_folded():
  data = np.array([1.0, np.nan, np.inf, -np.inf, -2.0], np.float32)
  x = realized(data)
  out = x * 0
  assert graph_ops(out * 2, True) == graph_ops(out * 2, False) == 2
  with np.errstate(invalid="ignore"): expected = data * 0
  np.testing.assert_array_equal(out.numpy(), expected)   # NaN where x is NaN or ±inf

def test_int_times_zero_folds():
  x, y = realized(np.arange(5, dtype=np.int32)), realized(np.full(5, 7, np.int32))
  out = x * 0 + y
  assert (graph_ops(out, False), graph_ops(out, True)) == (2, 1)
  np.testing.assert_array_equal(out.numpy(), np.full(5, 7, np.int32))

def test_plus_zero_keeps_negative_zero():
  data = np.array([-0.0, 1.0, np.nan], np.float32)
  x = realized(data)
  plus_zero = (x + 0) * 1   # x + 0.0 turns −0.0 into +0.0: not removed; x · 1 is
  assert graph_ops(plus_zero, True) == 2   # the root (· 1) and + 0
  assert math.copysign(1, plus_zero.numpy()[0]) == 1.0
  minus_zero = (x - 0) * 1   # x + (−0.0) is x for every x (−0.0 + −0.0 = −0.0): removed
  assert graph_ops(minus_zero, False) == 3 and graph_ops(minus_zero, True) == 1
  result = minus_zero.numpy()
  assert math.copysign(1, result[0]) == -1.0 and result[1] == 1.0 and np.isnan(result[2])

def test_identities_removed():
  data = np.array([0.5, -3.0, np.inf, np.nan], np.float32)
  x = realized(data)
  for expression in (lambda x: (x * 1).exp(), lambda x: (x / 1).exp(), lambda x: (-(-x)).exp(),
                     lambda x: (1 * x).exp()):
    out = expression(x)
    assert graph_ops(out, True) == 2, out   # exp(x) = exp2(x · log2(e)): the identity is gone
    np.testing.assert_allclose(out.numpy(), np.exp(data), rtol=1e-6)

def test_int_plus_zero_and_bool_identities():
  x = realized(np.arange(4, dtype=np.int32))
  assert graph_ops((x + 0) * 2, True) == 1
  np.testing.assert_array_equal(((x + 0) * 2).numpy(), np.arange(4) * 2)
  b = realized(np.array([True, False, True, False]))
  assert graph_ops((b | False) & True, True) == 1
  np.testing.assert_array_equal(((b | False) & True).numpy(), [True, False, True, False])

def test_where_with_constant_condition():
  x, y = realized(np.ones(3, np.float32)), realized(np.full(3, 2.0, np.float32))
  out = Tensor.full((3,), True).where(x, y) * 3
  assert (graph_ops(out, False), graph_ops(out, True)) == (2, 1)
  np.testing.assert_array_equal(out.numpy(), np.full(3, 3.0))

def test_identity_through_a_view():
  data = np.arange(6, dtype=np.float32).reshape(2, 3)
  x = realized(data)
  out = (x * 1).T.exp()   # the identity's replacement is read through the transpose
  assert graph_ops(out, True) == 2
  np.testing.assert_allclose(out.numpy(), np.exp(data.T), rtol=1e-6)

def test_movement_identities_are_free_at_build_time():
  x = realized(np.zeros((2, 3), np.float32))
  assert x.permute(1, 0).permute(1, 0).lazydata is x.lazydata
  assert x.reshape(6).reshape(2, 3).lazydata is x.lazydata
  assert x.expand(2, 3).lazydata is x.lazydata
  assert x.cast(dtypes.float32).lazydata is x.lazydata

MAX_RECOMPUTE_CHAIN = 9   # more ops than schedule.MAX_RECOMPUTE_OPS: a shared value this long gets its own kernel

def test_removed_identities_save_a_kernel():
  data = np.random.default_rng(0).random((4, 4), dtype=np.float32)
  x = realized(data)
  def shared_chain(scale):
    h = x
    for _ in range(MAX_RECOMPUTE_CHAIN): h = h * scale
    return h.sum(0), h.sum(1)   # two kernels read h
  assert kernel_count(*shared_chain(1.5)) == 3   # h gets a kernel of its own, then the two reduces
  rows, columns = shared_chain(1.0)
  assert kernel_count(rows, columns) == 2        # h is x
  Tensor.realize(rows, columns)
  np.testing.assert_allclose(rows.numpy(), data.sum(0), rtol=1e-5)
  np.testing.assert_allclose(columns.numpy(), data.sum(1), rtol=1e-5)

def test_roots_keep_their_identity_and_buffers():
  x = realized(np.arange(4, dtype=np.float32))
  for _ in range(2):   # the second realize takes the schedule cache's template
    y = x * 1
    z = (y * 2).sum()
    w = z + (y * 1).max()
    Tensor.realize(z, w)
    assert z.lazydata.base.realized is not None and w.lazydata.base.realized is not None
    assert z.item() == 12.0 and w.item() == 15.0

@pytest.mark.parametrize("dtype,rtol", [(dtypes.float32, 1e-6), (dtypes.float16, 1e-3)])
def test_folded_chains_match_kernels(dtype, rtol):
  """Random chains of unary and binary ops on constants, folded, against the same chains computed by a kernel."""
  rng = np.random.default_rng(7)
  steps = [lambda t: t.exp(), lambda t: (t.abs() + 1).log(), lambda t: t.sigmoid(), lambda t: t * 1.7 - 0.3,
           lambda t: t.square().sqrt(), lambda t: 1 / (t + 3), lambda t: t.maximum(0.25), lambda t: t.sin()]
  for _ in range(10):
    chain = [steps[i] for i in rng.integers(0, len(steps), 5)]
    start = float(rng.standard_normal())
    folded, kernel = Tensor.full((2,), start, dtype=dtype), Tensor.full((2,), start, dtype=dtype).contiguous()
    for step in chain: folded, kernel = step(folded), step(kernel)
    assert graph_ops(folded, True) <= 1   # the whole chain is one constant (read by the root)
    np.testing.assert_allclose(folded.numpy().astype(np.float64), kernel.numpy().astype(np.float64), rtol=rtol)
