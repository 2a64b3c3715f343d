"""The host cost of one small eager op, counted instead of timed: the Python function calls that `(a + b).realize()`
makes on LLVM once its kernel is compiled and its schedule cached. A count is deterministic on any machine, loaded or
not, and each call is a fraction of a microsecond of host time, so a regression in the eager path (a layer, a
comprehension or a property added per op) shows here as a number, not as noise. bench/eager_op.py gives the time."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad import bounds
from tgrad.helpers import Context
import tgrad.paths.select as select
from tgrad.profiler import python_calls_per_call

OPS = 128   # counted ops (after a warm-up): a base's reader list is compacted every 64 ops, which the average absorbs
# Python calls per op measured when these budgets were set: 6 to build `a + b` (was 29, then 14, then 8), 20 for the
# whole op (was 95, then 45 before the eager plan of tgrad/realize.py, then 32, then 24 before the eager key of
# tgrad/schedule_cache.py), 32 for `a + 1` (was 64, then 37). The margins leave room for a small change; more means the
# eager path grew a layer.
BUILD_CALLS = 9
OP_CALLS = 23
SCALAR_OP_CALLS = 36
# `a.sum().realize()` (the reduce, then its reduced dim dropped by a view): 107 calls before its base took the eager key
# through the view and the reduce stopped going through Tensor.reshape's checks, Function.apply's *inputs and dtype
# compares (and its `.numpy()` copied the view: 148), 66 after, 58 with plain loops in the reduce's own checks, 43 with
# its tracker made without loadop's checks and its input's lazy value read once, 37 with reshape's sizes compared as
# ints
SUM_OP_CALLS = 41

def _calls_per_op(fn) -> float: return python_calls_per_call(fn, OPS)

@pytest.fixture
def quiet_realize(monkeypatch):
  """No paths database records, observers, pending index checks or collectives made before: the realize every eager op
  of a one-device program pays (a process that made a sharded collective also scans each walk for a collective's
  siblings: about 11 calls more, measured in a full test run)."""
  from tgrad.ops import CollectiveGroup
  monkeypatch.setattr(CollectiveGroup, "made", 0)
  monkeypatch.setattr(select, "_has_records", {"LLVM": False})
  monkeypatch.setattr(select, "observers", [])
  monkeypatch.setattr(bounds, "_pending", [])

def _operands():
  rng = np.random.default_rng(0)
  a = Tensor(rng.standard_normal(16, dtype=np.float32), device="LLVM").realize()
  b = Tensor(rng.standard_normal(16, dtype=np.float32), device="LLVM").realize()
  return a, b

def test_building_one_op_calls_few_functions(quiet_realize):
  a, b = _operands()
  with Context(DEBUG=0):
    for _ in range(4): a + b
    assert _calls_per_op(lambda: a + b) <= BUILD_CALLS

def test_one_eager_op_calls_few_functions(quiet_realize):
  a, b = _operands()
  with Context(DEBUG=0):
    for _ in range(4): (a + b).realize()   # compiles the kernel and caches the schedule
    calls = _calls_per_op(lambda: (a + b).realize())
  assert calls <= OP_CALLS, f"{calls:.1f} Python calls per eager op (budget {OP_CALLS})"
  np.testing.assert_allclose((a + b).numpy(), a.numpy() + b.numpy(), rtol=1e-6)

def test_an_eager_op_with_a_python_scalar_calls_few_functions(quiet_realize):
  """`a + 1`: the scalar becomes a constant beside a's lazy value (read once) and a kernel parameter."""
  a, _ = _operands()
  with Context(DEBUG=0):
    for _ in range(4): (a + 1).realize()
    calls = _calls_per_op(lambda: (a + 1).realize())
  assert calls <= SCALAR_OP_CALLS, f"{calls:.1f} Python calls per eager `a + 1` (budget {SCALAR_OP_CALLS})"
  np.testing.assert_allclose((a + 1).numpy(), a.numpy() + 1, rtol=1e-6)

def test_an_in_place_write_is_still_seen_on_the_fast_path(quiet_realize):
  """The counted path keeps the value semantics: an op after `a += 1` reads the new value, one built before it the
  old one (docs/semantics.md)."""
  a, b = _operands()
  before_a = a.numpy()
  for _ in range(4): (a + b).realize()
  pending = a + b
  a += 1
  np.testing.assert_allclose((a + b).numpy(), before_a + 1 + b.numpy(), rtol=1e-6)
  np.testing.assert_allclose(pending.numpy(), before_a + b.numpy(), rtol=1e-6)

def test_an_eager_op_after_symbolic_shapes_calls_as_few(quiet_realize, monkeypatch):
  """Once any variable was bound in the process (a symbolic model ran), the schedule cache looks for bound variables in
  every walk; a walk with none must not pay per entry for it (it did: 109 calls per op after a Gemma run)."""
  from tgrad.ops import SymbolicState
  monkeypatch.setattr(SymbolicState, "bound", True)
  a, b = _operands()
  with Context(DEBUG=0):
    for _ in range(4): (a + b).realize()
    assert _calls_per_op(lambda: (a + b).realize()) <= OP_CALLS

def test_an_eager_sum_calls_few_functions(quiet_realize):
  """A whole-tensor sum: one reduce kernel (the result a view of it), realized through the eager key of its base."""
  a, _ = _operands()
  with Context(DEBUG=0):
    for _ in range(4): a.sum().realize()
    calls = _calls_per_op(lambda: a.sum().realize())
  assert calls <= SUM_OP_CALLS, f"{calls:.1f} Python calls per eager `a.sum()` (budget {SUM_OP_CALLS})"
  np.testing.assert_allclose(a.sum().numpy(), a.numpy().sum(), rtol=1e-5)
