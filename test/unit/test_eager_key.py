"""The eager key (tgrad/schedule_cache.py `eager_key`, used by tgrad/realize.py): one op over realized values and
constants goes from a flat key straight to the plan of the template its walk key names. It is a second way to find a
template, so it is checked against the first: seeded random programs of small eager ops (elementwise with tensors and
Python scalars, comparisons, casts between dtypes, reductions, views, in-place assigns, values left pending across a
write) run with the eager key and without it (every realize through the walk), and must give the same bits. Equal
eager keys must mean equal walk keys; graphs the eager key does not cover must get none."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad import realize as realize_module
from tgrad import schedule_cache
from tgrad.helpers import Context

SEEDS = (20261128, 7, 31337)
STEPS = 48
SHAPES = [(3, 4), (4,), (1,), ()]
DTYPES = [dtypes.float32, dtypes.int32, dtypes.float16]

def _random_value(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
  if dtype.is_float: return rng.uniform(-3, 3, size=shape).astype(dtype.np)
  return rng.integers(-9, 10, size=shape).astype(dtype.np)

class _Program:
  """A seeded sequence of eager steps over a pool of realized tensors. Every run of one seed builds the same graphs
  and realizes them in the same order, so two runs differ only in how realize finds each graph's plan."""
  def __init__(self, seed: int):
    self.rng = np.random.default_rng(seed)
    self.pool: list[Tensor] = []
    self.pending: list[Tensor] = []   # values built but not realized yet (read after later writes)
    self.outputs: list[np.ndarray] = []

  def pick(self, shape=None) -> Tensor:
    candidates = [t for t in self.pool if shape is None or t.shape == shape]
    return candidates[self.rng.integers(len(candidates))]

  def new_operand(self) -> None:
    shape, dtype = SHAPES[self.rng.integers(len(SHAPES))], DTYPES[self.rng.integers(len(DTYPES))]
    self.pool.append(Tensor(_random_value(self.rng, shape, dtype), device="LLVM").realize())

  def step(self) -> None:
    rng = self.rng
    kind = rng.integers(11)
    x = self.pick()
    if kind == 0: out = x + self.pick(x.shape)
    elif kind == 1: out = x * self.pick(x.shape)
    elif kind == 2: out = x - float(rng.integers(-4, 5)) * 0.5 if x.dtype.is_float else x + int(rng.integers(1, 5))
    elif kind == 3: out = (x < self.pick(x.shape)).where(x, x * 2)
    elif kind == 4: out = x.cast([dtypes.float32, dtypes.int32, dtypes.float16, dtypes.bool][rng.integers(4)])
    elif kind == 5: out = x.sum() if x.ndim == 0 else x.sum(axis=int(rng.integers(x.ndim)))
    elif kind == 6: out = x.T + 1 if x.ndim == 2 else x.maximum(x)   # a view of a realized value and a scalar
    elif kind == 7: out = x.reshape(-1)[::2] * x.reshape(-1)[::2] if x.ndim else -x   # views, one base twice
    elif kind == 8:   # an in-place write; a value read from the old data may still be pending
      if rng.integers(2): self.pending.append(x + 1)
      x.assign(x + self.pick(x.shape)).realize()
      out = x
    elif kind == 9:   # a broadcast of a row against a matrix (an expanded view)
      out = x + self.pick(x.shape) if x.ndim != 2 else x + x[0]
    else: out = x.maximum(self.pick(x.shape)) if x.dtype != dtypes.bool else x
    if self.pending and rng.integers(4) == 0: self.outputs.append(self.pending.pop(0).numpy())
    out = out.realize()
    self.outputs.append(out.numpy())
    if out.dtype in DTYPES and rng.integers(3): self.pool.append(out)

  def run(self) -> list[np.ndarray]:
    for _ in range(4): self.new_operand()
    for i in range(STEPS):
      if i % 8 == 0: self.new_operand()
      self.step()
    self.outputs += [t.numpy() for t in self.pending]
    return self.outputs

@pytest.fixture
def eager_hits(monkeypatch):
  """A list counting the eager hits (realizes launched from an eager key)."""
  hits: list[int] = []
  launch = realize_module._launch_eager
  def counted(*args):
    hits.append(1)
    return launch(*args)
  monkeypatch.setattr(realize_module, "_launch_eager", counted)
  return hits

def _same_bits(got: list[np.ndarray], want: list[np.ndarray]) -> None:
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    np.testing.assert_array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8), err_msg=f"output {i}")

@pytest.mark.parametrize("seed", SEEDS)
def test_random_eager_programs_give_the_plain_paths_bits(seed, monkeypatch):
  with monkeypatch.context() as patch:   # the plain path: no eager key, every realize walks its graph
    patch.setattr(realize_module, "eager_key", lambda root, riders: None)
    plain = _Program(seed).run()
    plain_again = _Program(seed).run()   # the schedule cache and plans warm: hits through the walk
  hits: list[int] = []
  launch = realize_module._launch_eager
  monkeypatch.setattr(realize_module, "_launch_eager", lambda *args: (hits.append(1), launch(*args))[1])
  eager = _Program(seed).run()
  eager_again = _Program(seed).run()
  assert len(hits) >= STEPS // 2, f"the eager key served only {len(hits)} realizes of {2 * STEPS} steps"
  _same_bits(plain, plain_again)
  _same_bits(eager, plain)
  _same_bits(eager_again, plain)

def _walk_key(out: Tensor) -> tuple:
  found = schedule_cache.look_up([out.lazydata])
  assert found is not None
  return found[1]

def test_equal_eager_keys_mean_equal_walk_keys():
  """Many small graphs: wherever two eager keys are equal, so are the walk keys (one template for both), and the
  other way round."""
  rng = np.random.default_rng(SEEDS[0])
  values = [Tensor(_random_value(rng, (3, 4), dtypes.float32), device="LLVM").realize() for _ in range(3)]
  ints = Tensor(_random_value(rng, (3, 4), dtypes.int32), device="LLVM").realize()
  a, b, c = values
  mask = (a < b).realize()
  graphs = [a + b, b + c, a + a, b * b, a + 1.5, a + 2.5, c + 1.5, a * 0, a + a.T.T, a.T.T + a,
            a[1:] + b[1:], a[1:] + a[1:], a[:2] + b[1:], a.sum(0), b.sum(0), a.sum(1), ints + 1, ints.float(),
            a.cast(dtypes.float16), mask.where(a, b), mask.where(b, a), a < b, a.maximum(b), -a, -b]
  by_eager_key: dict[tuple, tuple] = {}
  covered = 0
  for out in graphs:
    root = out.lazydata.base
    found = schedule_cache.eager_key(root, 0)
    if found is None: continue
    covered += 1
    walk_key = _walk_key(out)[1]
    assert by_eager_key.setdefault(found[0], walk_key) == walk_key, f"one eager key, two walk keys: {found[0]}"
  assert covered == len(graphs), "each is one op over realized values and constants"
  # and no coarser or finer: as many eager keys as walk keys (a, b, c are one structure, so a + b and b + c share)
  assert len(by_eager_key) == len(set(by_eager_key.values())) and len(by_eager_key) >= 15

def test_graphs_beyond_one_op_get_no_eager_key():
  rng = np.random.default_rng(1)
  a, b = (Tensor(_random_value(rng, (5,), dtypes.float32), device="LLVM").realize() for _ in range(2))
  assert schedule_cache.eager_key((a * b + a).lazydata.base, 0) is None   # a source still to compute
  assert schedule_cache.eager_key((a < b).where(a, b).lazydata.base, 0) is None
  host = Tensor(np.ones(5, dtype=np.float32), device="LLVM")   # host data, not copied yet
  assert schedule_cache.eager_key((a + host).lazydata.base, 0) is None
  without, with_riders = (schedule_cache.eager_key((a + b).lazydata.base, riders) for riders in (0, 1))
  assert without[0] != with_riders[0], "the schedule settings (RIDERS) are part of the key"
  assert schedule_cache.eager_key(a.assign(a + 1).lazydata.base, 0) is None   # a write
  assert schedule_cache.eager_key((a + b).lazydata.base, 0) is None   # a's value is now the pending write

def test_the_eager_key_is_not_used_while_debugging(eager_hits, capsys):
  rng = np.random.default_rng(2)
  a, b = (Tensor(_random_value(rng, (5,), dtypes.float32), device="LLVM").realize() for _ in range(2))
  for _ in range(3): (a + b).realize()
  assert eager_hits, "a repeated eager op should hit its eager key"
  eager_hits.clear()
  with Context(DEBUG=1): out = (a + b).realize()
  assert not eager_hits and "realized 1 schedule items" in capsys.readouterr().out
  np.testing.assert_array_equal(out.numpy(), a.numpy() + b.numpy())

def test_a_scalar_op_reads_each_calls_value_through_the_eager_key(eager_hits):
  a = Tensor(np.arange(6, dtype=np.float32), device="LLVM").realize()
  for s in (1.5, 2.5): (a * s).realize()
  eager_hits.clear()
  for s in (0.25, -7.5, 3.0):
    np.testing.assert_array_equal((a * s).numpy(), np.arange(6, dtype=np.float32) * np.float32(s))
  assert len(eager_hits) >= 3

def test_reductions_take_the_eager_hit_through_their_view(eager_hits):
  """A reduce whose result is a view of it (the reduced dims dropped: a reshape of the REDUCE_AXIS node) realizes its
  base through the base's eager key, from the second time on, with numpy's values."""
  rng = np.random.default_rng(5)
  data = rng.standard_normal((6, 7)).astype(np.float32)
  x = Tensor(data, device="LLVM").realize()
  for axis in (None, 0, 1):
    for _ in range(3):
      total, largest = x.sum(axis), x.max(axis)
      assert total.lazydata.base is not total.lazydata   # a view of the reduce
      np.testing.assert_allclose(total.numpy(), data.sum(axis), rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(largest.numpy(), data.max(axis))
  assert len(eager_hits) >= 3 * 2 * 2, eager_hits   # every realize after the first of each (axis, op)
