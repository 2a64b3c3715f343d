"""Eager ops against numpy: seeded random small ops (binary arithmetic and comparisons between tensors, with Python
scalars, unary math, casts, views of realized values: transposes, slices, broadcasts, a base read twice; sums and
maxes over an axis, whose results are views of their reduce) over random
shapes (0-d and size-1 included) and dtypes, each realized eagerly, repeatedly, so the first realize of a structure
fills the caches and the later ones take the eager hit (tgrad/realize.py `_launch_eager`: the output Buffer made with
its memory at once, the binary op built by `LazyBuffer.alu`'s two-operand path, the record's parents). Every result
must match numpy's on the same inputs, and a write (`assign`) between two realizes of one structure must be seen."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad import realize as realize_module

SEEDS = (11, 2026, 90210)
STEPS = 60
REPEATS = 3   # realizes of each drawn op: the first plans it, the others are eager hits
SHAPES = [(), (1,), (5,), (3, 4), (1, 4), (2, 1, 3)]
DTYPES = [dtypes.float32, dtypes.int32, dtypes.float16]
FLOAT_TOLERANCE = {dtypes.float32: 1e-6, dtypes.float16: 1e-3}
EXP_TOLERANCE = {dtypes.float32: 2e-6, dtypes.float16: 2e-3}
SUM_TOLERANCE = {dtypes.float32: 1e-5, dtypes.float16: 1e-3}

def _values(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
  if dtype.is_float: return rng.uniform(-2, 2, size=shape).astype(dtype.np)
  return rng.integers(-9, 10, size=shape).astype(dtype.np)

def _draw(rng: np.random.Generator):
  """One random op: (a function of tensors, the same function of numpy arrays, the inputs, its relative tolerance
  (None: exact))."""
  shape, dtype = SHAPES[rng.integers(len(SHAPES))], DTYPES[rng.integers(len(DTYPES))]
  x, y = _values(rng, shape, dtype), _values(rng, shape, dtype)
  npd = dtype.np
  scalar = int(rng.integers(1, 5)) if not dtype.is_float else float(rng.integers(-4, 5)) * 0.5
  tol = FLOAT_TOLERANCE.get(dtype)
  kind = int(rng.integers(12))
  if kind == 0: return (lambda a, b: a + b), (lambda a, b: a + b), (x, y), tol
  if kind == 1: return (lambda a, b: a * b + a), (lambda a, b: (a * b).astype(npd) + a), (x, y), tol
  if kind == 2: return (lambda a, b: a + scalar), (lambda a, b: (a + np.array(scalar, npd)).astype(npd)), (x, y), tol
  if kind == 3: return (lambda a, b: a < b), (lambda a, b: a < b), (x, y), None
  if kind == 4 and dtype.is_float:
    return (lambda a, b: a.exp()), (lambda a, b: np.exp(a.astype(np.float64)).astype(npd)), (x, y), EXP_TOLERANCE[dtype]
  if kind == 5 and len(shape) == 2:   # a transposed view of a realized value, against another
    return (lambda a, b: a.T * b.T), (lambda a, b: a.T * b.T), (x, y), tol
  if kind == 6 and len(shape) >= 1 and shape[0] > 1:   # slices of one base, read twice
    return (lambda a, b: a[1:] + a[:-1]), (lambda a, b: a[1:] + a[:-1]), (x, y), tol
  if kind == 7 and len(shape) == 2:   # a row broadcast against the matrix (an expanded view)
    return (lambda a, b: a + b[0]), (lambda a, b: a + b[0]), (x, y), tol
  if kind == 8: return (lambda a, b: a.cast(dtypes.float32)), (lambda a, b: a.astype(np.float32)), (x, y), None
  if kind in (9, 10) and shape:   # a reduce, its result a view of it unless keepdim (read from its buffer by numpy())
    axis, keepdim = int(rng.integers(len(shape))), bool(rng.integers(2))
    if kind == 9:   # a sum: float16 accumulates in float32 (numpy's float16 sum may round in between)
      sum_tol = SUM_TOLERANCE.get(dtype)
      return (lambda a, b: a.sum(axis, keepdim=keepdim)), \
        (lambda a, b: a.astype(np.float64).sum(axis, keepdims=keepdim).astype(npd if dtype.is_float else np.int64)), \
        (x, y), sum_tol
    return (lambda a, b: a.max(axis, keepdim=keepdim)), (lambda a, b: a.max(axis, keepdims=keepdim)), (x, y), None
  return (lambda a, b: a - b), (lambda a, b: a - b), (x, y), tol

def _check(got: np.ndarray, want: np.ndarray, tol, what: str) -> None:
  assert got.shape == want.shape and got.dtype == want.dtype, \
    f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
  if tol is None: np.testing.assert_array_equal(got, want, err_msg=what)
  else:
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, err_msg=what)

@pytest.mark.parametrize("seed", SEEDS)
def test_random_eager_ops_match_numpy(seed, monkeypatch):
  hits: list[int] = []
  launch = realize_module._launch_eager
  monkeypatch.setattr(realize_module, "_launch_eager", lambda *args: (hits.append(1), launch(*args))[1])
  rng = np.random.default_rng(seed)
  for step in range(STEPS):
    op, reference, (x, y), tol = _draw(rng)
    a, b = Tensor(x, device="LLVM").realize(), Tensor(y, device="LLVM").realize()
    want = reference(x, y)
    for repeat in range(REPEATS):
      _check(op(a, b).realize().numpy(), want, tol, f"seed {seed} step {step} realize {repeat}")
    # a write between realizes of one structure: the next eager hit reads the new data
    x2 = _values(rng, x.shape, a.dtype)
    a.assign(Tensor(x2, device="LLVM")).realize()
    _check(op(a, b).realize().numpy(), reference(x2, y), tol, f"seed {seed} step {step} after a write")
  assert len(hits) >= STEPS, f"only {len(hits)} eager hits in {STEPS * (REPEATS + 1)} realizes"

def test_a_size_one_and_a_0d_op_give_their_own_shapes():
  for shape in [(), (1,), (1, 1)]:
    x = np.full(shape, 1.5, np.float32)
    a = Tensor(x, device="LLVM").realize()
    for _ in range(REPEATS):
      out = (a + a).realize().numpy()
      assert out.shape == shape and np.all(out == 3.0)

def test_numpy_of_a_slice_copies_its_own_elements(monkeypatch):
  """numpy() of a view reads its base's buffer only where the view is all of it; a leading slice of a large buffer is
  copied out contiguous first (its own elements), not the whole buffer."""
  import tgrad.tensor as tensor_module
  copied: list[int] = []
  original = tensor_module._copy_to_host
  monkeypatch.setattr(tensor_module, "_copy_to_host", lambda lb: (copied.append(lb.base.buffer.size), original(lb))[1])
  values = np.arange(4096, dtype=np.float32).reshape(64, 64)
  x = Tensor(values, device="LLVM").realize()
  np.testing.assert_array_equal(x[:2].numpy(), values[:2])
  np.testing.assert_array_equal(x.sum(1).numpy(), values.sum(1))   # a view of all of its reduce: read in place
  np.testing.assert_array_equal(x.reshape(4096).numpy(), values.reshape(4096))
  assert copied == [128, 64, 4096], copied
