"""argmax/argmin of sharded tensors on CPU devices LLVM:0..2 against numpy: over the split axis (short axes in one
pass, long ones in chunks), over another axis, keepdim, negative axes, ties across the devices' parts (the first
index wins, as numpy), NaN (the first NaN wins), ints and bools; the result is replicated with the same bits on every
device, and an argmax over the split axis moves nothing between devices but two all-reduces."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.ops import Ops
from tgrad.schedule import create_schedule

TWO = ("LLVM:0", "LLVM:1")
THREE = ("LLVM:0", "LLVM:1", "LLVM:2")
LONG = 3 * 2 ** 15   # past lazy.SPLIT_REDUCE_MIN_INPUTS: argmax runs in chunks; divides over two and three devices

def with_ties(rng: np.random.Generator, *shape: int) -> np.ndarray:
  """Small integers as float32: many equal maxima, across the devices' parts too."""
  return rng.integers(-3, 3, shape).astype(np.float32)

def shard_values(t: Tensor) -> list[np.ndarray]:
  return [Tensor(s, requires_grad=False).numpy() for s in t.lazydata.shards]

def check(a: np.ndarray, devices: tuple, split: int, axis, keepdim: bool = False, smallest: bool = False) -> None:
  x = Tensor(a).shard(devices, split)
  got = x.argmin(axis, keepdim) if smallest else x.argmax(axis, keepdim)
  want = np.argmin(a, axis, keepdims=keepdim) if smallest else np.argmax(a, axis, keepdims=keepdim)
  np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{a.shape} split {split} axis {axis}")
  assert got.shape == want.shape
  if got.lazydata.axis is None:   # replicated: every device holds the same bits
    for value in shard_values(got): np.testing.assert_array_equal(value, want)

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
@pytest.mark.parametrize("shape, split, axis", [((5, 6), 1, 1), ((5, 6), 1, -1), ((6, 7), 0, 0), ((6, 7), 0, -2),
                                                ((3, 12, 5), 1, 1), ((3, 12, 5), 1, -2), ((6, 7), 0, 1),
                                                ((5, 6), 1, 0), ((7, 6, 3), 1, 2)])
def test_argmax_and_argmin_of_sharded_tensors_equal_numpy(devices, shape, split, axis):
  rng = np.random.default_rng(sum(shape) + split + len(devices))
  for a in (rng.standard_normal(shape).astype(np.float32), with_ties(rng, *shape)):
    for keepdim in (False, True):
      check(a, devices, split, axis, keepdim)
      check(a, devices, split, axis, keepdim, smallest=True)

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
def test_argmax_over_every_axis_of_a_sharded_tensor(devices):
  rng = np.random.default_rng(5)
  a = with_ties(rng, 6, 5)
  check(a, devices, 0, None)
  check(a, devices, 0, None, keepdim=True)

@pytest.mark.parametrize("devices", [TWO, THREE], ids=["two", "three"])
def test_argmax_of_a_long_split_axis_runs_in_chunks_with_two_all_reduces(devices):
  rng = np.random.default_rng(len(devices))
  a = rng.standard_normal((3, LONG)).astype(np.float32)
  third = LONG // len(devices)
  a[0, [5, third + 1]] = 40.0                 # a tie across the first two parts: the first wins
  a[1, [LONG - 1, third]] = 41.0              # a tie whose later copy is on the last device
  a[2, [third + 7, LONG - 2]] = np.nan        # NaN counts as the largest, the first NaN wins
  check(a, devices, 1, 1)
  check(a, devices, 1, -1, keepdim=True)
  check(a, devices, 1, 1, smallest=True)
  got = Tensor(a).shard(devices, 1).realize().argmax(1)
  steps = create_schedule(list(got.lazydata.shards))
  assert [s.ast.op for s in steps].count(Ops.COLLECTIVE) == 2
  assert not [s for s in steps if s.ast.op is Ops.COPY]   # nothing gathered

@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_argmax_of_sharded_ints_and_bools(dtype):
  rng = np.random.default_rng(1)
  a = rng.integers(0, 2 if dtype is np.bool_ else 9, (4, 9)).astype(dtype)
  check(a, THREE, 1, 1)
  check(a, THREE, 1, 1, smallest=True)
