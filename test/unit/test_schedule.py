"""Scheduler fusion rules, checked by counting kernels (and checking the values the fused kernels compute)."""
import numpy as np
import pytest
from tgrad.tensor import Tensor
from tgrad.ops import Ops
from tgrad.schedule import create_schedule

def kernel_count(*tensors: Tensor) -> int:
  items = create_schedule([t.lazydata for t in tensors])
  return sum(1 for item in items if item.ast.op is Ops.SINK)

def realized(*shape) -> Tensor: return Tensor(np.random.default_rng(0).random(shape, dtype=np.float32)).realize()

def test_multiply_add_sum_is_one_kernel():
  a, b, c = realized(64, 64), realized(64, 64), realized(64, 64)
  out = (a * b + c).sum()
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), (a.numpy() * b.numpy() + c.numpy()).sum(), rtol=1e-5)

def test_linear_relu_is_one_kernel():
  x, w, b = realized(16, 32), realized(32, 8), realized(8)
  out = (x @ w + b).relu()
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w.numpy() + b.numpy(), 0), rtol=1e-5, atol=1e-6)

def test_softmax_is_at_most_three_kernels():
  x = realized(32, 100)
  out = x.softmax(axis=-1)
  assert kernel_count(out) <= 3
  e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)

def test_chain_of_twenty_elementwise_ops_is_one_kernel():
  x = realized(1000)
  out = x
  for i in range(20): out = (out * 1.01 + 0.5) if i % 2 == 0 else out.relu()
  assert kernel_count(out) == 1
  expected = x.numpy()
  for i in range(20):
    expected = (expected * np.float32(1.01) + np.float32(0.5)) if i % 2 == 0 else np.maximum(expected, 0)
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)

@pytest.mark.parametrize("movement", ["reshape", "permute", "pad"])
def test_movement_between_elementwise_ops_still_one_kernel(movement):
  x = realized(6, 8)
  first = (x * 2).exp()
  moved = {"reshape": lambda t: t.reshape(4, 12), "permute": lambda t: t.permute(1, 0),
           "pad": lambda t: t.pad(((1, 1), (2, 0)))}[movement](first)
  out = moved + 1
  assert kernel_count(out) == 1
  np_first = np.exp(x.numpy() * 2)
  np_moved = {"reshape": lambda t: t.reshape(4, 12), "permute": lambda t: t.T,
              "pad": lambda t: np.pad(t, ((1, 1), (2, 0)))}[movement](np_first)
  np.testing.assert_allclose(out.numpy(), np_moved + 1, rtol=1e-5)

def test_reduce_read_through_expand_is_realized():
  x = realized(8, 8)
  out = x + x.sum(axis=1).reshape(1, 8)   # row i's sum is read along a column: its own kernel, then the addition
  assert kernel_count(out) == 2
  np.testing.assert_allclose(out.numpy(), x.numpy() + x.numpy().sum(1)[None, :], rtol=1e-5)

def test_reduce_read_back_over_its_rows_is_one_kernel():
  x = realized(8, 8)
  out = x - x.mean(axis=1, keepdim=True)   # a row kernel (schedule.py rule 2b): reduce each row, then store it
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), x.numpy() - x.numpy().mean(1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_two_reduces_of_the_same_shape_share_a_kernel():
  x = realized(16, 16)
  out = x.sum(axis=1) + x.max(axis=1)
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), x.numpy().sum(1) + x.numpy().max(1), rtol=1e-5)

def test_nested_reduce_is_split():
  x = realized(8, 8, 8)
  out = (x.sum(axis=2) + 1).sum(axis=1)
  assert kernel_count(out) == 2
  np.testing.assert_allclose(out.numpy(), (x.numpy().sum(2) + 1).sum(1), rtol=1e-5)

def test_realized_inputs_and_constants_need_no_kernel():
  x = realized(4, 4)
  assert kernel_count(x) == 0
  assert kernel_count(x + 0 * x) == 1

@pytest.mark.parametrize("order", ["assign_first", "assign_last"])
def test_an_assign_runs_after_every_kernel_reading_the_old_value(order):
  # write-after-read: b reads a's old value, a is overwritten in the same schedule (an optimizer step reads every
  # parameter for the others' gradients); whatever order the outputs are given in, b must see the old a
  a, b = Tensor([1.0, 2.0, 3.0]).realize(), Tensor([0.0, 0.0, 0.0]).realize()
  b.assign(a * 2)
  a.assign(a + 1)
  Tensor.realize(*((a, b) if order == "assign_first" else (b, a)))
  assert b.tolist() == [2.0, 4.0, 6.0] and a.tolist() == [2.0, 3.0, 4.0]

def test_a_kernel_reading_the_old_and_the_new_value_reads_a_snapshot():
  # fuzz_ops seed 0 cases 4290, 7915, 9802: a value built from x before x2[i] = v (x2 aliases x: contiguous() of a
  # realized x is x itself, as in torch) is read with the new value by one kernel; the old value is copied before
  # the assign
  data = np.arange(-8, 10, dtype=np.int32).reshape(3, 6)
  x2 = Tensor(data).realize()
  x = x2 + 0
  x2[1:, ::2] = x[1:, ::2].flip(0) * 3
  want_new = data.copy()
  want_new[1:, ::2] = data[1:, ::2][::-1] * 3
  out = x2.clip(None, 2**31 - 1) % x
  with np.errstate(divide="ignore"): want = np.where(data == 0, 0, want_new % np.where(data == 0, 1, data))
  np.testing.assert_array_equal(out.numpy(), want)
  # an index assign (scatter) into a copy of a realized value, then the difference with the value
  y2 = Tensor(data.astype(np.float32)).realize()
  y = y2 + 0
  y2[Tensor([[1]]), Tensor([[0], [4], [5]])] = Tensor([[100.0], [200.0], [300.0]])
  want_y2 = data.astype(np.float32)
  want_y2[1, [0, 4, 5]] = [100.0, 200.0, 300.0]
  np.testing.assert_allclose((y2 - y).numpy(), want_y2 - data, atol=0, rtol=0)

def test_the_snapshot_is_one_copy_before_the_assign():
  x2 = Tensor(np.arange(6, dtype=np.float32)).realize()
  x = x2 + 0
  x2[1:3] = Tensor([10.0, 20.0])
  diff = x2 - x
  kernels = [item for item in create_schedule([diff.lazydata]) if item.ast.op is Ops.SINK]
  assert len(kernels) == 3   # the snapshot of x, the assign, the difference
  np.testing.assert_array_equal(diff.numpy(), [0.0, 9.0, 18.0, 0.0, 0.0, 0.0])

def test_a_lazy_value_built_before_an_assign_realized_with_it_sees_the_old_data():
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  before = x + 1
  x[0] = 7
  Tensor.realize(x, before)
  assert before.tolist() == [1.0, 2.0, 3.0, 4.0] and x.tolist() == [7.0, 1.0, 2.0, 3.0]

def test_a_lazy_value_built_before_an_assign_realized_first_sees_the_old_data():
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  before = x + 1
  x[0] = 7
  x.realize()
  assert before.tolist() == [1.0, 2.0, 3.0, 4.0]
