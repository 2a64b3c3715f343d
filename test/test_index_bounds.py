"""Out-of-range integer indices raise IndexError naming the value and the size, as torch does on the CPU.

Every entry point (tensor indexing and item assignment, gather, scatter, one_hot, nn.Embedding, class labels of
cross_entropy / sparse_categorical_crossentropy / nll_loss) is checked both ways: index values still on the host
raise when the op is built; values computed on a device raise at the next Tensor-level realize (`.numpy()`,
`.item()`, `.tolist()`, `Tensor.realize`), which computes the check with the tensors asked for. In-range indices
give the same values as before (numpy/torch).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tgrad import Tensor, dtypes
from tgrad.nn import Embedding
from tgrad.bounds import drop_pending_checks, pending_checks

RNG = np.random.default_rng(3)

def on_device(values, dtype=dtypes.int32) -> Tensor:
  """An index tensor whose values a kernel computes (so they are not known on the host when an op is built)."""
  return (Tensor(np.asarray(values), dtype=dtype).realize() + 0).cast(dtype)

@pytest.fixture(autouse=True)
def no_leftover_checks():
  """A test must not leave a pending check behind for the next one (that would raise in an unrelated test)."""
  yield
  leftover = pending_checks()
  drop_pending_checks()
  assert not leftover, f"{leftover} pending index checks left behind"

# ---- every entry point, host-known and device-computed indices: (name, build(index) -> Tensor, bad, message)
TABLE = np.arange(12, dtype=np.float32).reshape(3, 4)
LOGITS = RNG.normal(size=(2, 3)).astype(np.float32)
ENTRY_POINTS = [
  ("getitem", lambda i: Tensor(TABLE)[i], [0, 5], "index 5 is out of bounds for dimension 0 with size 3"),
  ("getitem_negative", lambda i: Tensor(TABLE)[i], [-4, 1], "index -4 is out of bounds for dimension 0 with size 3"),
  ("getitem_dim1", lambda i: Tensor(TABLE)[:, i], [[1, 4]], "index 4 is out of bounds for dimension 1 with size 4"),
  ("gather", lambda i: Tensor(TABLE).gather(1, i), [[0], [4], [1]], "gather: index 4 .* dimension 1 with size 4"),
  ("gather_negative", lambda i: Tensor(TABLE).gather(0, i), [[0, -1, 0, 0]], "gather: index -1 .* size 3"),
  ("scatter", lambda i: Tensor(TABLE).scatter(0, i, 1.0), [[3, 0, 0, 0]], "scatter: index 3 .* dimension 0 .* 3"),
  ("one_hot", lambda i: i.one_hot(4), [1, 4], "one_hot: class 4 is out of range for num_classes 4"),
  ("one_hot_negative", lambda i: i.one_hot(4), [-1, 2], "one_hot: class -1 is out of range for num_classes 4"),
  ("sparse_categorical_crossentropy", lambda i: Tensor(LOGITS).sparse_categorical_crossentropy(i), [7, 1],
   r"class index 7 is out of bounds for 3 classes"),
  ("cross_entropy", lambda i: Tensor(LOGITS).cross_entropy(i), [1, 3], r"class index 3 is out of bounds for 3 classes"),
  ("cross_entropy_negative", lambda i: Tensor(LOGITS).cross_entropy(i), [-2, 0], "class index -2 .* 3 classes"),
  ("nll_loss", lambda i: Tensor(LOGITS).log_softmax(1).nll_loss(i), [0, 9], "class index 9 is out of bounds for 3"),
]

@pytest.mark.parametrize("name, build, bad, message", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_host_indices_raise_when_the_op_is_built(name, build, bad, message):
  with pytest.raises(IndexError, match=message): build(Tensor(bad))
  with pytest.raises(IndexError, match=message): build(Tensor(np.array(bad, dtype=np.int64)).cast(dtypes.int32))

@pytest.mark.parametrize("name, build, bad, message", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_device_indices_raise_at_the_next_realize(name, build, bad, message):
  out = build(on_device(bad))          # nothing is computed yet, so nothing can be known
  with pytest.raises(IndexError, match=message): out.numpy()
  assert out.numpy() is not None       # the check was reported once; the value itself was computed

def test_device_check_surfaces_at_any_realize():
  for realize in (lambda t: t.numpy(), lambda t: t.item(), lambda t: t.tolist(), lambda t: t.realize(),
                  lambda t: Tensor.realize(t)):
    Tensor(TABLE)[on_device([9])]
    unrelated = Tensor([1.0]) * 2
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 3"): realize(unrelated)
    assert unrelated.item() == 2.0

def test_setitem_with_an_out_of_range_tensor_index():
  t = Tensor(TABLE.copy())
  with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"): t[Tensor([0, 3])] = 1.0
  t[on_device([1, 7])] = 1.0
  with pytest.raises(IndexError, match="index 7 .* size 3"): t.numpy()

def test_python_indices_are_checked_at_once():
  t = Tensor(TABLE)
  with pytest.raises(IndexError, match="index 3 is out of bounds for dim 0 with size 3"): t[3]
  with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 1 with size 4"): t[:, [0, -5]]
  with pytest.raises(IndexError, match="index 3 is out of bounds"): t[np.array([3])]

def test_embedding():
  embedding = Embedding(5, 3)
  for bad, value in (([[0, 5]], 5), ([[-1, 2]], -1)):   # torch's Embedding takes no negative indices either
    with pytest.raises(IndexError, match=f"Embedding: index {value} is out of range for a vocabulary of size 5"):
      embedding(Tensor(bad))
    out = embedding(on_device(bad))
    with pytest.raises(IndexError, match=f"index {value}"): out.realize()
  with pytest.raises(IndexError): torch.nn.Embedding(5, 3)(torch.tensor([[0, 5]]))
  ids = RNG.integers(0, 5, (2, 7))
  np.testing.assert_array_equal(embedding(on_device(ids)).numpy(), embedding.weight.numpy()[ids])

def test_ignore_index_is_allowed():
  labels = np.array([1, -100])
  want = F.cross_entropy(torch.tensor(LOGITS), torch.tensor(labels)).item()
  assert Tensor(LOGITS).cross_entropy(on_device(labels)).item() == pytest.approx(want, rel=1e-6)
  assert Tensor(LOGITS).cross_entropy(Tensor(labels)).item() == pytest.approx(want, rel=1e-6)
  tinygrad_style = Tensor(LOGITS).sparse_categorical_crossentropy(on_device([2, -1])).item()   # ignore_index=-1
  assert tinygrad_style == pytest.approx(F.cross_entropy(torch.tensor(LOGITS[:1]), torch.tensor([2])).item(), rel=1e-6)

def test_wide_and_unsigned_index_dtypes():
  """The check reads the index in its own dtype: an int64 index of 2^32 + 1 must not pass as 1 after a cast."""
  t = Tensor([1.0, 2.0, 3.0])
  with pytest.raises(IndexError, match="index 4294967297 is out of bounds"):
    t[Tensor([2 ** 32 + 1], dtype=dtypes.int64)]
  with pytest.raises(IndexError, match="index 4294967297 is out of bounds"):
    t[on_device([2 ** 32 + 1], dtypes.int64)].numpy()
  with pytest.raises(IndexError, match="index 255 is out of bounds"): t[on_device([255], dtypes.uint8)].numpy()
  assert t[on_device([2], dtypes.uint8)].tolist() == [3.0]
  assert t[on_device([-1], dtypes.int8)].tolist() == [3.0]
  with pytest.raises(IndexError, match="class index 200"):   # a uint8 label never equals ignore_index -100
    Tensor(LOGITS).cross_entropy(on_device([200, 0], dtypes.uint8)).numpy()

def test_the_first_bad_value_in_order_is_named():
  index = RNG.integers(0, 10, 1000)
  index[[17, 400]] = [12, -30]
  with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 10"):
    Tensor(np.arange(10.0))[on_device(index)].numpy()

@pytest.mark.parametrize("seed", range(6))
def test_in_range_indices_unchanged(seed):
  """Random in-range indices (negative ones included where allowed) give numpy's / torch's values and no error."""
  rng = np.random.default_rng(seed)
  rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, 9))
  x = rng.normal(size=(rows, cols)).astype(np.float32)
  index = rng.integers(-rows, rows, size=int(rng.integers(1, 12)))
  for idx in (Tensor(index), on_device(index)):
    np.testing.assert_array_equal(Tensor(x)[idx].numpy(), x[index])
  gather_index = rng.integers(0, cols, size=(rows, 5))
  want = torch.gather(torch.tensor(x), 1, torch.tensor(gather_index)).numpy()
  np.testing.assert_array_equal(Tensor(x).gather(1, on_device(gather_index)).numpy(), want)
  labels = rng.integers(0, cols, rows)
  want = F.cross_entropy(torch.tensor(x), torch.tensor(labels)).item()
  assert Tensor(x).cross_entropy(on_device(labels)).item() == pytest.approx(want, rel=1e-5, abs=1e-6)
  np.testing.assert_array_equal(on_device(labels).one_hot(cols).numpy(), np.eye(cols, dtype=np.int32)[labels])

@pytest.mark.parametrize("seed", range(6))
def test_random_out_of_range_positions(seed):
  """One random position of a random index tensor holds a random out-of-range value: it is the one reported."""
  rng = np.random.default_rng(100 + seed)
  size = int(rng.integers(1, 50))
  index = rng.integers(-size, size, int(rng.integers(1, 300)))
  bad = int(rng.choice([rng.integers(size, 3 * size + 1), rng.integers(-3 * size - 1, -size)]))
  index[rng.integers(len(index))] = bad
  with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size {size}"):
    Tensor(np.arange(size))[on_device(index)].numpy()
  with pytest.raises(IndexError, match=f"index {bad} is out of bounds"): Tensor(np.arange(size))[Tensor(index)]
