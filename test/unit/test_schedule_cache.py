"""The schedule cache: a graph with the structure of one scheduled before reuses its schedule, with its own Buffers
and host data, and gives the same kernels and values as scheduling it afresh (seeded random graphs)."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
import tgrad.schedule_cache as schedule_cache

UNARY = [(lambda t: t.relu(), lambda a: np.maximum(a, 0)), (lambda t: t.exp(), np.exp), (lambda t: -t, np.negative),
         (lambda t: t * 0.5 + 1.25, lambda a: a * np.float32(0.5) + np.float32(1.25))]

def random_program(seed: int):
  """A recipe (list of steps) over two random 2-D inputs, applied the same way to Tensors and to numpy arrays."""
  rng = np.random.default_rng(seed)
  steps = []
  for _ in range(int(rng.integers(2, 7))):
    kind = rng.choice(["unary", "binary", "reduce", "permute", "pad", "slice"])
    steps.append((str(kind), int(rng.integers(0, 1 << 30))))
  return steps

def apply(steps, x, y, numpy: bool):
  for kind, r in steps:
    if kind == "unary": x = UNARY[r % len(UNARY)][1 if numpy else 0](x)
    elif kind == "binary": x = (x + y[:1] * 0.25) if r % 2 else (x * (y if x.shape == y.shape else y[:1]))
    elif kind == "reduce":
      axis = r % 2
      if numpy: x = np.broadcast_to((x.max if r % 3 == 0 else x.sum)(axis=axis, keepdims=True), x.shape)
      else: x = (x.max(axis, keepdim=True) if r % 3 == 0 else x.sum(axis, keepdim=True)).expand(*x.shape)
    elif kind == "permute" and x.shape[0] == x.shape[1]: x = x.T
    elif kind == "pad":
      x = np.pad(x, ((1, 0), (0, 1)))[:-1, 1:] if numpy else x.pad(((1, 0), (0, 1)))[:-1, 1:]
    elif kind == "slice": x = np.concatenate([x[1:], x[:1]]) if numpy else x[1:].cat(x[:1])
  return x

def inputs(seed: int):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((5, 5), dtype=np.float32), rng.standard_normal((5, 5), dtype=np.float32)

@pytest.mark.parametrize("seed", range(12))
def test_cached_schedule_matches_a_fresh_one(seed: int):
  schedule_cache.clear()
  steps = random_program(seed)
  for data_seed in (100 + seed, 200 + seed):   # the first schedules and stores a template, the second reuses it
    a, b = inputs(data_seed)
    out = apply(steps, Tensor(a), Tensor(b), numpy=False)
    fresh = apply(steps, Tensor(a), Tensor(b), numpy=False)
    want = [item.ast for item in create_schedule([fresh.lazydata])]   # scheduling without commit changes nothing
    hits_before = len(schedule_cache._templates)
    items = schedule_cache.schedule([out.lazydata])
    assert [item.ast for item in items] == want
    if data_seed > 100 + seed: assert len(schedule_cache._templates) == hits_before   # a hit: nothing new stored
    from tgrad.realize import run, lower_schedule
    run(lower_schedule(items))
    np.testing.assert_allclose(out.numpy(), apply(steps, a, b, numpy=True), rtol=1e-5, atol=1e-5)

def test_host_data_and_constants_are_the_graphs_own():
  """A hit copies this graph's host arrays; a different constant is a different structure (its own kernel)."""
  schedule_cache.clear()
  for value in (1.0, 2.0, 2.0):
    data = np.arange(6, dtype=np.float32) * value
    np.testing.assert_array_equal((Tensor(data) + value).numpy(), data + value)
  assert len(schedule_cache._templates) == 2   # one structure per constant; the third call was a hit

def test_assign_reuses_the_target_buffer_on_a_hit():
  x = Tensor.zeros(8).contiguous().realize()
  buffer = x.lazydata.base.buffer
  for _ in range(4): x.assign(x + 1).realize()
  assert x.lazydata.base.buffer is buffer
  np.testing.assert_array_equal(x.numpy(), np.full(8, 4.0, np.float32))

def test_shared_realized_buffers_are_part_of_the_structure():
  """x + x reads one buffer; x + y with the same shapes reads two: different kernels, both right."""
  x, y = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.full(4, 3, np.float32)).realize()
  np.testing.assert_array_equal((x + x).numpy(), np.full(4, 2, np.float32))
  np.testing.assert_array_equal((x + y).numpy(), np.full(4, 4, np.float32))
  kernels = [i for i in create_schedule([(x + y).lazydata]) if i.ast.op is Ops.SINK]
  assert len(kernels) == 1 and len(kernels[0].inputs) == 2
