"""The eager-path caches (canonical Views, constant trackers, scalar roundings, device names, schedule templates)
must never hand back a wrong value: a seeded random stream of small eager ops over many constants, shapes and
dtypes, realized one by one and mixed with realized constants and assigns into them, matches numpy."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
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
