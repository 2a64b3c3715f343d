"""Value semantics of in-place writes (docs/semantics.md), checked against a NumPy model of the same program.

A value computed by an op sees its inputs as they were when it was built, whatever is realized first; views, detach,
contiguous() of a row-major tensor and same-dtype casts alias their source as in torch (a write through one is seen
through all at once); pad and flip are copies, as in torch. The randomized test interleaves builds, in-place writes
(setitem, assign, +=, optimizer steps), views and realizes in seeded random orders; NumPy runs the same program
eagerly, with numpy views where torch has views, and every tensor is compared with its NumPy twin at the end and at
random points in between (reading a tensor is itself one of the interleaved events).
"""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
from tgrad.nn.optim import SGD

PROGRAMS = 100          # seeded random programs
EVENTS_PER_PROGRAM = 40
SHAPE = (4, 6)

class _Program:
  """Pairs of (tgrad Tensor, numpy array) that the random events grow and write; numpy arrays alias as torch does."""
  def __init__(self, rng: np.random.Generator):
    self.rng, self.pairs, self.trace = rng, [], []
  def data(self, shape) -> np.ndarray: return self.rng.integers(-9, 10, shape).astype(np.float32)
  def pick(self, predicate=lambda t, a: True):
    options = [(t, a) for t, a in self.pairs if predicate(t, a)]
    return options[self.rng.integers(len(options))] if options else None
  def add(self, t: Tensor, a: np.ndarray, how: str) -> None:
    self.trace.append(f"t{len(self.pairs)} = {how}")
    self.pairs.append((t, a))
  def name(self, t: Tensor) -> str: return f"t{next(k for k, (u, _) in enumerate(self.pairs) if u is t)}"

  # ---- events
  def make(self) -> None:
    a = self.data(SHAPE)
    t = Tensor(a.copy())
    realized = self.rng.random() < 0.5
    if realized: t.realize()
    self.add(t, a, f"Tensor(data){'.realize()' if realized else ''}")
  def compute(self) -> None:
    t, a = self.pick()
    kind = self.rng.integers(3)
    n = self.name(t)
    # a computed value is row-major in tgrad (torch keeps the layout of a permuted input): so is its numpy twin
    if kind == 0: self.add(t * 2 + 1, np.ascontiguousarray(a * 2 + 1), f"{n} * 2 + 1")
    elif kind == 1:
      self.add(t.sum(axis=-1, keepdim=True) + t, np.ascontiguousarray(a.sum(axis=-1, keepdims=True) + a),
               f"{n}.sum(-1) + {n}")
    else: self.add((t - 3).relu(), np.ascontiguousarray(np.maximum(a - 3, 0)), f"({n} - 3).relu()")
  def view(self) -> None:
    t, a = self.pick(lambda t, a: a.ndim == 2)
    kind = self.rng.integers(7)
    rows = int(self.rng.integers(0, a.shape[0]))
    n = self.name(t)
    if kind == 0: self.add(t[rows:], a[rows:], f"{n}[{rows}:]")
    elif kind == 1: self.add(t.T, a.T, f"{n}.T")
    elif kind == 2: self.add(t.detach(), a, f"{n}.detach()")
    elif kind == 3:   # contiguous(): the tensor itself when already row-major (numpy and torch agree), else a copy
      self.add(t.contiguous(), np.ascontiguousarray(a), f"{n}.contiguous()")
    elif kind == 4: self.add(t.float(), a, f"{n}.float()")
    elif kind == 5: self.add(t[:, 1::2], a[:, 1::2], f"{n}[:, 1::2]")
    else: self.add(t.flip(0), a[::-1].copy(), f"{n}.flip(0)")   # flip copies in torch
  def write(self) -> None:
    t, a = self.pick(lambda t, a: a.ndim == 2 and a.shape[0] > 0 and a.shape[1] > 0)
    kind = self.rng.integers(4)
    if kind == 0:
      i, j = int(self.rng.integers(a.shape[0])), int(self.rng.integers(a.shape[1]))
      value = float(self.rng.integers(-50, 50))
      t[i, j] = value
      a[i, j] = value
      self.trace.append(f"{self.name(t)}[{i}, {j}] = {value}")
    elif kind == 1:
      new = self.data(a.shape)
      t.assign(Tensor(new.copy()))
      a[...] = new
      self.trace.append(f"{self.name(t)}.assign(data)")
    elif kind == 2:
      row = int(self.rng.integers(a.shape[0]))
      t[row] = Tensor(np.arange(a.shape[1], dtype=np.float32))
      a[row] = np.arange(a.shape[1], dtype=np.float32)
      self.trace.append(f"{self.name(t)}[{row}] = arange")
    else:
      with Tensor.no_grad(): t += 5
      a += 5
      self.trace.append(f"{self.name(t)} += 5")
  def realize(self) -> None:
    t, _ = self.pick()
    t.realize()
    self.trace.append(f"{self.name(t)}.realize()")
  def read(self) -> None:
    t, a = self.pick()
    self.trace.append(f"read {self.name(t)}")
    np.testing.assert_array_equal(t.numpy(), a, err_msg="\n".join(self.trace))

  def run(self, events: int) -> None:
    self.make()
    choices = [self.make, self.compute, self.view, self.write, self.realize, self.read]
    weights = np.array([1, 3, 3, 3, 2, 1], dtype=float)
    for _ in range(events): choices[self.rng.choice(len(choices), p=weights / weights.sum())]()
    order = self.rng.permutation(len(self.pairs))   # read back in a random order: realizing one must not move another
    for k in order:
      t, a = self.pairs[k]
      self.trace.append(f"read t{k}")
      np.testing.assert_array_equal(t.numpy(), a, err_msg="\n".join(self.trace))

@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_random_programs_match_numpy(seed):
  _Program(np.random.default_rng(seed)).run(EVENTS_PER_PROGRAM)

def test_the_issue_probes():
  x = Tensor([1.0, 2, 3]).realize()
  b = x + 1
  x[0] = 7
  x.realize()
  assert b.tolist() == [2, 3, 4]
  x = Tensor([1.0, 2, 3]).realize()
  b = x + 1
  x.assign(Tensor([10.0, 20, 30]))
  assert b.tolist() == [2, 3, 4] and x.tolist() == [10, 20, 30]
  for read_b_first in (False, True):
    x = Tensor([1.0, 2, 3]).realize()
    b = x * 2
    x.assign(x + 1)
    if read_b_first: assert b.tolist() == [2, 4, 6]
    assert x.tolist() == [2, 3, 4] and b.tolist() == [2, 4, 6]
  for alias in (lambda x: x.detach(), lambda x: x.contiguous(), lambda x: x.float(), lambda x: x.to(x.device)):
    for read_first in (False, True):
      x = Tensor([1.0, 2, 3]).realize()
      y = alias(x)
      y[0] = 5
      if read_first: assert y.tolist() == [5, 2, 3]
      assert x.tolist() == [5, 2, 3] and y.tolist() == [5, 2, 3]
  x = Tensor([1.0, 2, 3]).realize()
  v = x[1:]
  x[1] = 9
  assert v.tolist() == [9, 3]
  x = Tensor([1.0, 2, 3]).realize()
  y = x[2:]
  y[0] = 99
  assert x.tolist() == [1, 2, 99]

def test_in_place_op_on_a_contiguous_buffer_with_autograd():
  # h is the buffer of x * 2 (contiguous() of a computed value aliases it): += stays a recorded op, as before
  x = Tensor([1.0, 2, 3], requires_grad=True)
  y = x * 2
  h = y.contiguous()
  h += 1
  (h * h).sum().backward()
  assert x.grad.tolist() == [12.0, 20.0, 28.0] and y.tolist() == [3.0, 5.0, 7.0]

def test_writing_an_expanded_view_raises():
  x = Tensor([1.0, 2, 3]).realize()
  y = x.reshape(1, 3).expand(2, 3)
  with pytest.raises(RuntimeError, match="share memory"): y[0, 0] = 5
  assert x.tolist() == [1, 2, 3]

def _mlp_step(read_loss_after_step: bool):
  rng = np.random.default_rng(0)
  x, labels = Tensor(rng.standard_normal((16, 8)).astype(np.float32)), Tensor(rng.integers(0, 3, 16))
  w1 = Tensor(rng.standard_normal((8, 12)).astype(np.float32) * 0.3)
  w2 = Tensor(rng.standard_normal((12, 3)).astype(np.float32) * 0.3)
  opt = SGD([w1, w2], lr=0.5)
  losses, after = [], []
  for _ in range(3):
    with Tensor.train():
      loss = (x @ w1).relu().matmul(w2).sparse_categorical_crossentropy(labels)
      opt.zero_grad()
      loss.backward()
      if not read_loss_after_step: loss.realize()
      opt.step()
      losses.append(loss.item())
      after.append((x @ w1).relu().matmul(w2).sparse_categorical_crossentropy(labels).item())
  return losses, after

def test_training_loop_reads_the_loss_before_the_step():
  # loss.backward(); opt.step(); loss.item(): the loss of the weights it was computed with, as in PyTorch
  late, after = _mlp_step(read_loss_after_step=True)
  early, _ = _mlp_step(read_loss_after_step=False)
  np.testing.assert_allclose(late, early, rtol=1e-6)
  np.testing.assert_allclose(late[1:], after[:-1], rtol=1e-6)   # each step's loss is the previous step's after-loss
  assert all(a < b for a, b in zip(after, late))

def test_jit_replay_keeps_old_values_for_pending_readers():
  w = Tensor([1.0, 2, 3]).realize()
  @TinyJit
  def step(d: Tensor) -> Tensor:
    w.assign(w + d).realize()
    return (w * 1.5).realize()
  for k in range(5):
    before = w.numpy().copy()
    pending = w[1:] * 10    # built before the call, read after it
    step(Tensor([1.0, 1, 1]))
    np.testing.assert_array_equal(pending.numpy(), before[1:] * 10)
    np.testing.assert_array_equal(w.numpy(), before + 1, err_msg=f"call {k}")

def test_no_copy_when_nothing_pending_reads_the_old_value():
  import tgrad.schedule as schedule
  x = Tensor(np.arange(6, dtype=np.float32)).realize()
  kernels_before = x.lazydata.pending_readers()
  assert kernels_before == []
  x.assign(x * 2)
  items = schedule.create_schedule([x.lazydata])
  assert len([i for i in items if i.ast.op.name == "SINK"]) == 1
  x.realize()
  assert x.tolist() == [0, 2, 4, 6, 8, 10]
