"""The eager-path caches (canonical Views, constant trackers, scalar roundings, device names, schedule templates)
must never hand back a wrong value: a seeded random stream of small eager ops over many constants, shapes and
dtypes, realized one by one and mixed with realized constants and assigns into them, matches numpy."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.dtype import promote_types
from tgrad.shape.view import View
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.device import canonical_device

SHAPES = [(), (1,), (3,), (2, 3), (4, 1), (1, 5), (2, 1, 3)]
CONSTANTS = [0, 1, -1, 2, 3, 0.5, -0.0, 0.0, 1.5, 2.0, 1e-3, -7.25, True, False]
DTYPES = [(dtypes.float32, np.float32), (dtypes.int32, np.int32), (dtypes.float16, np.float16)]

def _reference(op: str, x: np.ndarray, c, np_dtype) -> np.ndarray:
  c = np.asarray(c).astype(np_dtype) if np.issubdtype(np_dtype, np.floating) or not isinstance(c, float) else c
  if op == "add": return x + c
  if op == "mul": return x * c
  if op == "sub": return x - c
  return np.maximum(x, c)

@pytest.mark.parametrize("seed", [0, 1])
def test_random_eager_ops_match_numpy(seed):
  rng = np.random.default_rng(seed)
  realized_constants = []
  for step in range(120):
    shape = SHAPES[rng.integers(len(SHAPES))]
    dtype, np_dtype = DTYPES[rng.integers(len(DTYPES))]
    c = CONSTANTS[rng.integers(len(CONSTANTS))]
    if np.issubdtype(np_dtype, np.integer) and isinstance(c, float): c = int(c)
    data = (rng.standard_normal(shape) * 4).astype(np_dtype)
    x = Tensor(data, device="LLVM").realize()
    op = ["add", "mul", "sub", "max"][rng.integers(4)]
    out = {"add": lambda: x + c, "mul": lambda: x * c, "sub": lambda: x - c, "max": lambda: x.maximum(c)}[op]()
    out.realize()
    expected = _reference(op, data, c, np_dtype)
    tol = 1e-2 if np_dtype == np.float16 else 1e-6
    np.testing.assert_allclose(out.numpy(), expected.astype(np_dtype), rtol=tol, atol=tol, err_msg=f"step {step}")
    # a realized constant gets a Buffer; an assign into it must not reach any other constant of the same value
    if step % 5 == 0:
      k = Tensor.full(shape, c, dtype=dtype, device="LLVM").contiguous().realize()
      k.assign(Tensor.full(shape, 9, dtype=dtype, device="LLVM")).realize()
      realized_constants.append((k, shape, np_dtype))
      fresh = Tensor.full(shape, c, dtype=dtype, device="LLVM") + 0
      np.testing.assert_array_equal(fresh.numpy(), np.full(shape, c).astype(np_dtype))
      scalar = Tensor(c, dtype=dtype, device="LLVM").realize()
      np.testing.assert_array_equal((x + scalar).numpy(), (data + np.asarray(c).astype(np_dtype)).astype(np_dtype))
  for k, shape, np_dtype in realized_constants: np.testing.assert_array_equal(k.numpy(), np.full(shape, 9, np_dtype))

def test_negative_zero_and_nan_constants_are_not_confused():
  x = Tensor(np.ones(3, np.float32), device="LLVM").realize()
  for _ in range(2):
    assert np.signbit((x * 0.0).numpy()).tolist() == [False] * 3
    assert np.signbit((x * -0.0).numpy()).tolist() == [True] * 3
    assert np.isnan((x + float("nan")).numpy()).all()
    assert ((x + 1).numpy() == 2).all() and ((x + True).numpy() == 2).all()

def test_view_cache_validates_and_normalizes():
  assert View.create((True, 2)).shape == (1, 2) and type(View.create((True, 2)).shape[0]) is int
  assert View.create([np.int64(2), 3]) is View.create((2, 3))
  with pytest.raises(TypeError): View.create((2.0, 3))
  with pytest.raises(TypeError): ShapeTracker.from_shape((2.0,))
  with pytest.raises(ValueError): View.create((2, -1))
  v = View.create((4, 5), mask=[[0, 2], [0, 5]])
  assert v.mask == ((0, 2), (0, 5)) and v is View.create((4, 5), mask=((0, 2), (0, 5)))
  assert canonical_device("cpu") == "LLVM" and canonical_device("LLVM") == "LLVM"
  with pytest.raises(ValueError): canonical_device("tpu")

# ---- the eager fast paths (one-op schedule walk, same-shape operands, settings read once per realize)

import pickle  # noqa: E402
import tgrad.schedule_cache as schedule_cache  # noqa: E402
import tgrad.realize as realize_module  # noqa: E402
from tgrad.dtype import DType  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.lazy import LazyBuffer  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

RANDOM_OP_STEPS = 300
RANDOM_OP_SHAPES = 3   # the first shapes of SHAPES: few enough that structures repeat
BINARY_OPS = {"add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract),
              "mul": (lambda x, y: x * y, np.multiply), "max": (lambda x, y: x.maximum(y), np.maximum),
              "lt": (lambda x, y: x < y, np.less), "rsub": (lambda x, y: x.sub(y, reverse=True), lambda x, y: y - x)}
RANDOM_DTYPES = [(dtypes.float32, np.float32), (dtypes.int32, np.int32), (dtypes.float16, np.float16)]

def _realized(data: np.ndarray) -> Tensor: return Tensor(data, device="LLVM").realize()

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_eager_binary_ops_match_numpy_with_cache_hits(seed, monkeypatch):
  """Many small binary ops between realized tensors, eagerly: same shape and dtype (the fast paths), operands that
  broadcast or promote (the general ones), a tensor with itself, and results kept alive while later ops reuse freed
  output memory. Every value matches numpy; most realizes are schedule-cache hits."""
  rng = np.random.default_rng(seed)
  schedule_cache.clear()
  misses = []
  def counting_create_schedule(*args, **kwargs):
    misses.append(1)
    return create_schedule(*args, **kwargs)
  monkeypatch.setattr(schedule_cache, "create_schedule", counting_create_schedule)
  kept: list[tuple[Tensor, np.ndarray]] = []
  op_misses = 0
  for step in range(RANDOM_OP_STEPS):
    shape = SHAPES[rng.integers(RANDOM_OP_SHAPES)]
    (_, np_x), (_, np_y) = (RANDOM_DTYPES[i] for i in rng.integers(len(RANDOM_DTYPES), size=2))
    if rng.random() < 0.7: np_y = np_x                 # mostly one dtype: the fast path
    other_shape = shape if rng.random() < 0.8 else (1,) * len(shape)     # sometimes a broadcast
    data_x = (rng.standard_normal(shape) * 4).astype(np_x)
    data_y = (rng.standard_normal(other_shape) * 4).astype(np_y)
    x = _realized(data_x)
    y = x if rng.random() < 0.1 and other_shape == shape and np_x == np_y else _realized(data_y)
    if y is x: data_y = data_x
    name = list(BINARY_OPS)[rng.integers(len(BINARY_OPS))]
    tensor_op, numpy_op = BINARY_OPS[name]
    misses_before = len(misses)
    out = tensor_op(x, y).realize()
    op_misses += len(misses) - misses_before
    common = promote_types(dtypes.from_np(data_x.dtype), dtypes.from_np(data_y.dtype)).np   # torch's rule: an int
    expected = numpy_op(data_x.astype(common), data_y.astype(common))                     # with a float is the float
    assert out.dtype.np == expected.dtype, (step, name, out.dtype, expected.dtype)
    tol = 1e-2 if expected.dtype == np.float16 else 1e-6
    np.testing.assert_allclose(out.numpy(), expected, rtol=tol, atol=tol, err_msg=f"step {step} {name}")
    if step % 7 == 0: kept.append((out, expected))
  for out, expected in kept:   # outputs that stayed alive were not handed to later ops
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-2, atol=1e-2)
  assert op_misses < RANDOM_OP_STEPS * 3 // 5, op_misses   # structures repeat: many op realizes were cache hits

def test_one_op_walk_gives_the_general_walks_key():
  """The schedule cache's one-op walk gives the same key, nodes and Buffers as the general walk: distinct inputs, one
  tensor twice, two LazyBuffers of one Buffer, sourceless ops, host data, constants (0-d and expanded), views of
  realized values; graphs it doesn't take (nested ops) take the general walk."""
  a, b = _realized(np.ones((3, 4), np.float32)), _realized(np.full((3, 4), 2, np.float32))
  alias = LazyBuffer.from_buffer(a.lazydata.base.buffer, (3, 4))
  scalar = _realized(np.float32(3.0))
  host = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="LLVM")   # unrealized host data
  graphs = [(a + b).lazydata, (a + a).lazydata, (a < b).lazydata, a.cast(dtypes.int32).lazydata,
            a.lazydata.alu(Ops.ADD, alias), Tensor.empty(3, device="LLVM").lazydata,
            Tensor([1.0, 2.0], device="LLVM").lazydata, (a * 2).lazydata, (2 - a).lazydata, (scalar + 1).lazydata,
            (a.T.T + b).lazydata, (a.permute(1, 0) + b.permute(1, 0)).lazydata, (a[:, :2] * b[:, 1:3]).lazydata,
            (a + host).lazydata, (host + 1).lazydata, (a * a[:1]).lazydata, (a < 0.5).where(a, b).lazydata,
            (a + (b + 1)).lazydata, a.sum(0).lazydata, (Tensor.empty(3, 4, device="LLVM") + a).lazydata]
  one_op_graphs = 0
  for lb in graphs:
    one_op_graphs += schedule_cache._is_one_op(lb.base)
    fast = schedule_cache._one_op_walk(lb.base)
    assert (fast is not None) == schedule_cache._is_one_op(lb.base)
    if fast is None: continue
    general = schedule_cache._Walk([lb.base])
    assert fast.key == general.key and fast.unrealized == general.unrealized
    assert [id(n) for n in fast.nodes] == [id(n) for n in general.nodes]
    assert [id(b) for b in fast.leaf_buffers] == [id(b) for b in general.leaf_buffers]
  assert one_op_graphs >= len(graphs) - 3   # all but the nested ones (the where, a + (b + 1), the sum's reduce)
  one_buffer_twice = schedule_cache._one_op_walk(a.lazydata.alu(Ops.ADD, alias))
  assert len(one_buffer_twice.leaf_buffers) == 1   # a different structure from a + b: two nodes, one Buffer

def test_a_cache_hit_reads_this_graphs_buffers():
  """Two graphs of one structure over different Buffers: the second (a hit) computes with its own inputs."""
  schedule_cache.clear()
  for value in (1.0, 5.0, -3.0):
    a, b = _realized(np.full(4, value, np.float32)), _realized(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal((a + b).numpy(), value + np.arange(4, dtype=np.float32))
  a = _realized(np.arange(4, dtype=np.float32))
  np.testing.assert_array_equal((a + a).numpy(), 2 * np.arange(4, dtype=np.float32))   # not the a + b template

def test_settings_are_reread_when_a_context_changes_them(capsys):
  """The settings a realize reads once (the kernel settings, DEBUG) follow every Context change, in and out."""
  outside = realize_module._settings()
  with Context(NOOPT=1): assert realize_module._settings() != outside
  with Context(BEAM=2): assert realize_module._settings()[0] == 2
  assert realize_module._settings() == outside
  a = _realized(np.ones(4, np.float32))
  with Context(NOOPT=1):   # its own kernel: the runner cache is keyed by the settings read once
    runners_before = len(realize_module._runner_cache)
    np.testing.assert_array_equal((a + a).numpy(), np.full(4, 2, np.float32))
    noopt_runners = len(realize_module._runner_cache)
  assert noopt_runners > runners_before or any(k[-1] == (1,) for k in realize_module._runner_cache)
  capsys.readouterr()
  with Context(DEBUG=1): (a + a).realize()
  assert "schedule items" in capsys.readouterr().out
  (a + a).realize()
  assert capsys.readouterr().out == ""

def test_operands_of_another_device_still_raise():
  """The same-shape, same-dtype operand fast path checks the device too (CUDA here is never started: the graph
  is only built)."""
  a = Tensor.empty(3, device="LLVM")
  other = Tensor(LazyBuffer.loadop(Ops.EMPTY, (3,), dtypes.float32, "CUDA"))
  with pytest.raises(ValueError, match="different devices"): a + other
  with pytest.raises(ValueError, match="different devices"): other.sub(a, reverse=True)

def test_dtype_equality_and_hash_survive_copies():
  """DTypes compare by identity first, by fields otherwise: a pickled copy is equal, hashes the same, keys a dict."""
  for dtype in dtypes.all():
    copy = pickle.loads(pickle.dumps(dtype))
    assert copy == dtype and not copy != dtype and hash(copy) == hash(dtype) and {dtype: 1}[copy] == 1
    assert "_hash" not in pickle.loads(pickle.dumps(copy)).__dict__ or copy is dtype
  assert dtypes.float32 != dtypes.int32 and dtypes.float32 != "float32" and not dtypes.float32 == 1
  assert sorted([dtypes.float32, dtypes.int8]) == [dtypes.int8, dtypes.float32]
  assert DType(11, 4, "float32", 'f', 'float32') == dtypes.float32

def test_gc_paused_nests_and_restores_the_collector():
  """gc_paused (without contextlib now) pauses the collector in its scope, nested or not, raising or not, and
  leaves it as it found it."""
  import gc
  from tgrad.helpers import gc_paused
  @gc_paused()
  def failing():
    assert not gc.isenabled()
    raise KeyError("inside")
  was_enabled = gc.isenabled()
  gc.enable()
  try:
    pause = gc_paused()
    with pause:
      with pause:
        assert not gc.isenabled()
      assert not gc.isenabled()
      with pytest.raises(KeyError): failing()
      assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError): failing()
    assert gc.isenabled()
    gc.disable()
    with gc_paused(): pass
    assert not gc.isenabled()   # it was off before: it stays off
  finally:
    if was_enabled: gc.enable()
    else: gc.disable()
