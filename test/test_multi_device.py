"""Devices with indices, copies between them, sharded tensors (tgrad/multi/) and their collectives, on CPU devices
LLVM:0..2, against numpy: every sharding rule on random data of odd sizes, the errors, autograd and data-parallel
training equal to one device."""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
import tgrad.nn as nn
from tgrad.backend import Backend, device_index, device_kind, register_backend, unregister_backend
from tgrad.device import Device, canonical_device
from tgrad.multi import CopyCollectives, MultiLazyBuffer, StepCollectives, collectives_for
from tgrad.nn.optim import Adam
from tgrad.nn.state import get_parameters
from tgrad.ops import Ops

TWO = ("LLVM:0", "LLVM:1")
THREE = ("LLVM:0", "LLVM:1", "LLVM:2")
TWO_NAMES = ("LLVM", "LLVM:1")   # TWO as the registry spells it: index 0 is the bare kind
RTOL, ATOL = 1e-5, 1e-5   # float32 sums split into per-device partials round differently

def rand(rng: np.random.Generator, *shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)

def shard_bits(t: Tensor) -> list[np.ndarray]:
  """Each device's shard of a sharded tensor, as host arrays."""
  return [Tensor(s, requires_grad=False).numpy() for s in t.lazydata.shards]

# ---- devices with indices

def test_index_zero_is_the_bare_kind_and_other_indices_are_devices_of_their_own():
  assert canonical_device("llvm:0") == canonical_device("cpu") == "LLVM"
  assert canonical_device("cpu:2") == "LLVM:2" and canonical_device("LLVM:007") == "LLVM:7"
  assert device_kind("CUDA:1") == "CUDA" and device_index("LLVM:3") == 3 and device_index("LLVM") == 0
  assert Device["llvm:0"] is Device["LLVM"] and Device["LLVM:1"] is not Device["LLVM"]
  assert Device["LLVM:1"].name == "LLVM:1" and Device["LLVM:1"].allocator is not Device["LLVM"].allocator
  for bad in ("LLVM:x", "LLVM:-1", "LLVM:", "LLVM:1.5"):
    with pytest.raises(ValueError, match="must be a non-negative integer"): canonical_device(bad)

def test_copies_between_cpu_devices_are_copy_items_and_keep_values():
  rng = np.random.default_rng(0)
  a = rand(rng, 5, 3)
  x = Tensor(a, device="LLVM").realize()
  moved = x.to("LLVM:1")
  items = moved.schedule()
  assert len(items) == 1 and items[0].ast.op is Ops.COPY and items[0].bufs[0].device == "LLVM:1"
  back = (moved * 2).to("llvm:0") + 1
  assert moved.device == "LLVM:1" and back.device == "LLVM"
  np.testing.assert_array_equal(back.numpy(), a * 2 + 1)
  assert moved.lazydata.base.buffer.handle.address != x.lazydata.base.buffer.handle.address
  with pytest.raises(ValueError, match="different devices"): x + moved
  # a copy of a constant expression: folded into the constant on the target device, or copied from a buffer of it
  six = (Tensor.full((3, 2), 3.0, device="LLVM") * 2).to("LLVM:1")
  np.testing.assert_array_equal(six.numpy(), np.full((3, 2), 6.0))
  np.testing.assert_array_equal(((Tensor.full((3, 2), 3.0) * 2).to("LLVM:1") + 1).numpy(), np.full((3, 2), 7.0))

# ---- shard: making, gathering, errors

@pytest.mark.parametrize("devices,axis", [(TWO, 0), (TWO, 1), (TWO, None), (THREE, 2), (THREE, -1), (THREE, 0)])
def test_shard_splits_evenly_and_gathers_back(devices, axis):
  rng = np.random.default_rng(1)
  a = rand(rng, 6, 4, 9)
  t = Tensor(a).shard(devices, axis)
  assert t.shape == a.shape and t.device == tuple(canonical_device(d) for d in devices)
  parts = shard_bits(t)
  expected = [a] * len(devices) if axis is None else np.split(a, len(devices), axis=axis)
  for got, want in zip(parts, expected): np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(t.numpy(), a)
  np.testing.assert_array_equal(t.to("LLVM:2").numpy(), a)
  assert t.to("LLVM:2").device == "LLVM:2"

def test_resharding_to_other_axes_and_device_sets():
  rng = np.random.default_rng(9)
  a = rand(rng, 6, 12)
  x = Tensor(a).shard(TWO, 0)
  for moved, axis in ((x.shard(THREE, 1), 1), (x.to(THREE), 0), (x.shard(TWO, None), None), (x.to(TWO), 0),
                      (Tensor(a).to(THREE), None)):
    assert moved.lazydata.axis == axis and len(moved.device) == len(moved.lazydata.shards)
    np.testing.assert_array_equal(moved.numpy(), a)
  np.testing.assert_array_equal(shard_bits(x.shard(THREE, 1))[2], a[:, 8:])
  like = Tensor(a).shard_like(x.shard(THREE, 1))
  assert like.device == x.shard(THREE, 1).device and like.lazydata.axis == 1
  assert Tensor(a).shard_like(Tensor(a, device="LLVM:2")).device == "LLVM:2"

def test_shard_errors_name_the_problem_before_anything_runs():
  t = Tensor(np.zeros((4, 5), np.float32))
  with pytest.raises(ValueError, match=r"axis 1 of shape \(4, 5\) \(size 5\) does not divide evenly over 2"):
    t.shard(TWO, 1)
  with pytest.raises(IndexError, match="axis 2 is out of range"): t.shard(TWO, 2)
  with pytest.raises(IndexError, match="out of range"): Tensor(1.0).shard(TWO, 0)
  with pytest.raises(ValueError, match="devices repeat"): t.shard(("LLVM:1", "llvm:1"), 0)
  with pytest.raises(ValueError, match="different devices"): t.shard(TWO, 0) + t.shard(("LLVM:0", "LLVM:2"), 0)
  with pytest.raises(ValueError, match="different devices"): t.shard(TWO, 0) + t
  with pytest.raises(NotImplementedError, match="gather it to one device first"):
    t.shard(TWO, 0).gather(0, Tensor(np.zeros((2, 5), np.int32)).shard(TWO))

def test_shard_in_place_and_zero_d_and_size_one():
  x = Tensor(np.arange(4, dtype=np.float32))
  assert x.shard_(TWO, 0) is x and x.device == TWO_NAMES and x.lazydata.axis == 0
  np.testing.assert_array_equal((x * x).numpy(), np.arange(4) ** 2)
  scalar = Tensor(2.5).shard(THREE)
  np.testing.assert_array_equal((scalar + 1).numpy(), 3.5)
  ones = Tensor(np.ones((1, 3), np.float32)).shard(THREE, 1)
  np.testing.assert_array_equal((ones * Tensor([[2.0]]).shard(THREE)).numpy(), np.full((1, 3), 2.0))

# ---- the sharding rules against numpy

def test_elementwise_same_axis_mixed_axes_replicated_broadcast_and_scalars():
  rng = np.random.default_rng(2)
  a, b, c = rand(rng, 6, 9), rand(rng, 6, 9), rand(rng, 9)
  x, y = Tensor(a).shard(THREE, 0), Tensor(b).shard(THREE, 0)
  np.testing.assert_allclose((x * y + 3).numpy(), a * b + 3, rtol=RTOL)
  np.testing.assert_allclose((x - Tensor(b).shard(THREE, 1)).numpy(), a - b, rtol=RTOL)    # two split axes
  row = Tensor(c).shard(THREE)                                                              # replicated, broadcast
  np.testing.assert_allclose((x / (row.abs() + 1)).numpy(), a / (np.abs(c) + 1), rtol=RTOL)
  np.testing.assert_allclose((Tensor(a).shard(THREE, 1) * row).numpy(), a * c, rtol=RTOL)
  np.testing.assert_allclose((2 - x).exp().numpy(), np.exp(2 - a), rtol=1e-5)
  np.testing.assert_array_equal((x > y).where(x, 0.5).numpy(), np.where(a > b, a, 0.5))
  counts = Tensor(np.arange(12, dtype=np.int32).reshape(6, 2)).shard(TWO, 0)
  np.testing.assert_array_equal((counts // 3 + counts % 5).numpy(), np.arange(12).reshape(6, 2) // 3 +
                                np.arange(12).reshape(6, 2) % 5)

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reduces_over_each_axis_all_reduce_to_the_same_bits_on_every_device(axis):
  rng = np.random.default_rng(3 + axis)
  a = rand(rng, 6, 3, 12)
  devices = THREE if a.shape[axis] % 3 == 0 else TWO
  x = Tensor(a).shard(devices, axis)
  for reduce_axis in (0, 1, 2, None):
    total = x.sum(reduce_axis)
    np.testing.assert_allclose(total.numpy(), a.sum(reduce_axis), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(x.max(reduce_axis, keepdim=True).numpy(), a.max(reduce_axis, keepdims=True))
    if reduce_axis in (axis, None):   # reduced over the split axis: replicated, one result copied
      assert total.lazydata.axis is None
      first, *others = shard_bits(total)
      for other in others: np.testing.assert_array_equal(first.view(np.uint32), other.view(np.uint32))
    else: assert total.lazydata.axis == (axis if reduce_axis is None or axis < reduce_axis else axis - 1)
  np.testing.assert_allclose(x.mean().numpy(), a.mean(), rtol=RTOL)
  np.testing.assert_allclose(x.softmax(axis).numpy(), np.exp(a) / np.exp(a).sum(axis, keepdims=True), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(x.logsumexp(axis).numpy(), np.log(np.exp(a).sum(axis)), rtol=1e-5)   # gathers first

def test_movement_ops_keep_move_or_gather_the_split_axis():
  rng = np.random.default_rng(4)
  a = rand(rng, 4, 6, 5)
  x = Tensor(a).shard(TWO, 1)
  cases = [
    (x.permute(2, 0, 1), a.transpose(2, 0, 1), 2),
    (x.reshape(4, 2, 3, 5), a.reshape(4, 2, 3, 5), 1),        # the split axis stays whole in front
    (x.reshape(4, 30), a.reshape(4, 30), 1),
    (x.reshape(24, 5), a.reshape(24, 5), None),              # merged with the axis before it: gathered
    (x[:, :, 1:4], a[:, :, 1:4], 1),
    (x[:, 1:5], a[:, 1:5], None),                            # a shrink of the split axis: gathered
    (x.pad(((1, 0), (0, 0), (2, 1))), np.pad(a, ((1, 0), (0, 0), (2, 1))), 1),
    (x.pad(((0, 0), (1, 1), (0, 0))), np.pad(a, ((0, 0), (1, 1), (0, 0))), None),
    (x.flip(0), a[::-1], 1), (x.flip(1), a[:, ::-1], None),
    (x.reshape(4, 6, 1, 5).expand(4, 6, 3, 5), np.broadcast_to(a.reshape(4, 6, 1, 5), (4, 6, 3, 5)), 1),
    (x[::2, :, ::2], a[::2, :, ::2], 1),
  ]
  for got, want, axis in cases:
    assert got.lazydata.axis == axis, (got.shape, got.lazydata.axis, axis)
    np.testing.assert_array_equal(got.numpy(), want)
  np.testing.assert_array_equal(x.contiguous().numpy(), a)

def test_matmul_contracting_the_split_axis_all_reduces_partial_products():
  rng = np.random.default_rng(5)
  a, w = rand(rng, 5, 6), rand(rng, 6, 7)
  x_cols = Tensor(a).shard(THREE, 1)
  row_split = Tensor(w).shard(THREE, 0)
  product = x_cols @ row_split                                     # k split: partial products, all-reduced
  assert product.lazydata.axis is None
  np.testing.assert_allclose(product.numpy(), a @ w, rtol=RTOL, atol=ATOL)
  w8 = rand(rng, 6, 8)
  column_parallel = Tensor(a).shard(TWO) @ Tensor(w8).shard(TWO, 1)   # output columns split
  assert column_parallel.lazydata.axis == 1
  np.testing.assert_allclose(column_parallel.numpy(), a @ w8, rtol=RTOL, atol=ATOL)
  batch = rand(rng, 4, 5, 6)
  batched = Tensor(batch).shard(TWO, 0) @ Tensor(w).shard(TWO)       # batch split, weight replicated
  assert batched.lazydata.axis == 0
  np.testing.assert_allclose(batched.numpy(), batch @ w, rtol=RTOL, atol=ATOL)
  vector = Tensor(w[:, 0].copy()).shard(TWO, 0)
  np.testing.assert_allclose((Tensor(a).shard(TWO, 1) @ vector).numpy(), a @ w[:, 0], rtol=RTOL, atol=ATOL)

def test_assign_writes_each_shard_in_place():
  rng = np.random.default_rng(6)
  a, b = rand(rng, 4, 3), rand(rng, 4, 3)
  x = Tensor(a).shard(TWO, 0).contiguous().realize()
  buffers = [s.base.buffer for s in x.lazydata.shards]
  view = x.detach()
  x.assign(Tensor(b).shard(TWO))   # a replicated value into a split tensor: each shard takes its part
  x.realize()
  assert [s.base.buffer for s in x.lazydata.shards] == buffers
  np.testing.assert_array_equal(x.numpy(), b)
  np.testing.assert_array_equal(view.numpy(), b)
  x += 1
  np.testing.assert_array_equal(x.numpy(), b + 1)

# ---- autograd

def test_gradients_through_sharded_tensors_match_one_device():
  rng = np.random.default_rng(7)
  a, w1, w2 = rand(rng, 6, 4), rand(rng, 4, 6), rand(rng, 6, 3)
  def loss_of(x, first, second): return ((x @ first).relu() @ second).square().mean()
  single = [Tensor(v, requires_grad=True) for v in (w1, w2)]
  loss_of(Tensor(a), *single).backward()
  for x_axis, w1_axis, w2_axis in ((0, None, None), (None, 1, 0), (1, 0, None)):
    weights = [Tensor(v, requires_grad=True) for v in (w1, w2)]
    weights[0].shard_(TWO, w1_axis)
    weights[1].shard_(TWO, w2_axis)
    loss = loss_of(Tensor(a).shard(TWO, x_axis), *weights)
    loss.backward()
    for sharded, one in zip(weights, single):
      assert sharded.grad.device == TWO_NAMES
      np.testing.assert_allclose(sharded.grad.numpy(), one.grad.numpy(), rtol=1e-4, atol=1e-6)
  x = Tensor(a, requires_grad=True, device="LLVM")
  (x.shard(TWO, 1) * 3).sum().backward()   # the gradient of a shard() goes back to the tensor's one device
  assert x.grad.device == "LLVM"
  np.testing.assert_array_equal(x.grad.numpy(), np.full_like(a, 3))

# ---- collectives

def test_collectives_on_cpu_devices():
  rng = np.random.default_rng(8)
  parts = [rand(rng, 6, 5) for _ in THREE]
  parts[1][0, 0], parts[2][1, 1] = -0.0, np.nan
  shards = [Tensor(p, device=d).lazydata for p, d in zip(parts, THREE)]
  ops = CopyCollectives()
  def values(lbs): return [Tensor(lb).numpy() for lb in lbs]
  summed = values(ops.all_reduce(Ops.ADD, shards))
  for got in summed: np.testing.assert_array_equal(got.view(np.uint32), summed[0].view(np.uint32))
  np.testing.assert_allclose(summed[0], parts[0] + parts[1] + parts[2], rtol=RTOL)
  for got in values(ops.all_reduce(Ops.MAX, shards)):
    np.testing.assert_array_equal(got, np.maximum(np.maximum(parts[0], parts[1]), parts[2]))
  for axis in (0, 1):
    for got in values(ops.all_gather(shards, axis)):   # bit for bit: -0.0 and NaN survive
      np.testing.assert_array_equal(got.view(np.uint32), np.concatenate(parts, axis).view(np.uint32))
  total = parts[0] + parts[1] + parts[2]
  for i, got in enumerate(values(ops.reduce_scatter(Ops.ADD, shards, 0))):
    np.testing.assert_allclose(got, total[2 * i:2 * i + 2], rtol=RTOL)
  with pytest.raises(ValueError, match="does not divide by 3"): ops.reduce_scatter(Ops.ADD, shards, 1)
  with pytest.raises(ValueError, match="reduces with one of"): ops.all_reduce(Ops.LOGADDEXP, shards)
  copies = ops.broadcast(shards[1], THREE)
  assert [c.device for c in copies] == [canonical_device(d) for d in THREE]
  for got in values(copies): np.testing.assert_array_equal(got.view(np.uint32), parts[1].view(np.uint32))
  flags = [Tensor(p > 0, device=d).lazydata for p, d in zip(parts, THREE)]
  np.testing.assert_array_equal(values(ops.all_gather(flags, 1))[2], np.concatenate([p > 0 for p in parts], 1))

def test_a_device_set_of_one_kind_gets_collective_steps_and_a_mixed_set_copies():
  register_backend(Backend("TOY", lambda: None))
  try:
    assert type(collectives_for(("TOY", "TOY:1"))) is StepCollectives
    assert type(collectives_for(("LLVM", "LLVM:1"))) is StepCollectives
    assert type(collectives_for(("TOY", "LLVM"))) is CopyCollectives   # a mixed set: copies and kernels
  finally: unregister_backend("TOY")

# ---- data-parallel training

class TinyNet:
  """An MLP, or a conv net with BatchNorm (whose batch statistics over a split batch are all-reduced: those of the
  whole batch). The conv has no bias: BatchNorm cancels it, so its gradient is rounding noise that Adam would blow up
  to a step of lr either way."""
  def __init__(self, conv: bool):
    self.conv = conv
    if conv: self.layers = [nn.Conv2d(1, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.Linear(3 * 3 * 3, 4)]
    else: self.layers = [nn.Linear(5, 16), nn.Linear(16, 4)]
  def __call__(self, x: Tensor) -> Tensor:
    if self.conv:
      conv, norm, head = self.layers
      return head(norm(conv(x)).relu().max_pool2d(2).flatten(1))
    return self.layers[1](self.layers[0](x).relu())

def train(conv: bool, devices, jit: bool, steps: int = 3) -> tuple[list[float], list[np.ndarray]]:
  Tensor.manual_seed(11)
  rng = np.random.default_rng(12)
  model = TinyNet(conv)
  params = get_parameters(model)
  if devices:
    for p in params: p.shard_(devices)
  opt = Adam(params, lr=0.05)
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  stepper = TinyJit(step) if jit else step
  losses = []
  with Tensor.train():
    for _ in range(steps):
      x = Tensor(rand(rng, 6, 1, 6, 6) if conv else rand(rng, 6, 5))
      y = Tensor(rng.integers(0, 4, 6).astype(np.int32))
      if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
      losses.append(stepper(x, y).item())
  if jit: assert stepper.captured is not None
  if devices:   # every replica took the same step
    for p in params:
      first, *others = shard_bits(p)
      for other in others: np.testing.assert_array_equal(first, other)
  return losses, [p.numpy() for p in params]

@pytest.mark.parametrize("conv,devices,jit", [(False, TWO, False), (False, THREE, True), (True, TWO, False)])
def test_data_parallel_training_matches_one_device(conv, devices, jit):
  one_losses, one_weights = train(conv, None, False)
  losses, weights = train(conv, devices, jit)
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for got, want in zip(weights, one_weights): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)

def test_multi_lazy_buffer_rejects_shards_that_do_not_fit():
  a = Tensor(np.zeros((2, 3), np.float32)).lazydata
  with pytest.raises(ValueError, match="shards differ"):
    MultiLazyBuffer([a, Tensor(np.zeros((3, 2), np.float32), device="LLVM:1").lazydata], 0)
  with pytest.raises(ValueError, match="share a device"): MultiLazyBuffer([a, a], None)

# ---- on two GPUs (marked `gpu`; skipped with fewer)

@pytest.mark.gpu
def test_copies_between_gpus_and_back(two_gpus):
  gpus = two_gpus
  x = np.random.default_rng(5).standard_normal((37, 129)).astype(np.float32)
  there = Tensor(x, device=gpus[0]).to(gpus[1])
  assert there.device == gpus[1]
  np.testing.assert_array_equal((there * 2).to(gpus[0]).numpy(), x * 2)

@pytest.mark.gpu
@pytest.mark.parametrize("jit", [False, True])
def test_data_parallel_training_on_two_gpus_matches_one(jit, two_gpus):
  gpus = two_gpus
  one_losses, one_weights = train(False, None, False)
  losses, weights = train(False, gpus, jit)
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
  for got, want in zip(weights, one_weights): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
