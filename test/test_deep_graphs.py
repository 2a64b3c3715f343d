"""Deep graphs: building, hashing, scheduling, rewriting and lowering walk graphs on their own stacks, so a chain of
100,000 lazy ops realizes (in one kernel) with Python's default recursion limit, and importing tgrad leaves that
limit alone. Also: long chains of movement ops and of reduces schedule in time, and the explicit-stack walks visit
nodes in the same order as the recursive walks they replaced (checked against plain recursive references)."""
import pickle, random, subprocess, sys, time
import numpy as np
import pytest
from tgrad.tensor import Tensor
from tgrad.dtype import dtypes
from tgrad.ops import UOp, UPat, Ops, PatternMatcher, graph_rewrite, simplify, symbolic, split_terms
from tgrad.schedule import create_schedule, MAX_INLINED_VIEWS
from tgrad.helpers import run_nested
from tgrad import schedule_cache
from tgrad.realize import run_schedule

def kernel_count(items) -> int: return sum(1 for item in items if item.ast.op is Ops.SINK)

def test_import_leaves_the_recursion_limit_alone():
  code = ("import sys; before = sys.getrecursionlimit(); import tgrad, tgrad.tensor, tgrad.realize, tgrad.schedule, "
          "tgrad.codegen.linearizer, tgrad.codegen.search, tgrad.models.gemma3; "
          "print(before, sys.getrecursionlimit())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  assert out[0] == out[1], f"importing tgrad changed the recursion limit from {out[0]} to {out[1]}"

CHAIN_STEPS = 50_000   # a multiply and an add per step: 100,000 lazy ops
SCALE, SHIFT = 1.0001, 0.0001

@pytest.mark.slow
def test_chain_of_100k_elementwise_ops_is_one_kernel():
  x = Tensor.rand(16).realize()
  start = np.float32(x.numpy())
  out = x
  began = time.perf_counter()
  for _ in range(CHAIN_STEPS): out = out * SCALE + SHIFT
  items = schedule_cache.schedule([out.lazydata])   # what realize schedules (scheduled once: the walks take seconds)
  assert kernel_count(items) == 1
  run_schedule(items)
  got = out.numpy()
  seconds = time.perf_counter() - began
  # numpy doing the same float32 steps; and float64 with the constants the kernel holds (float32 1.0001 is 1.7e-8
  # larger: 0.085% after 50,000 steps). The float32 rounding drifts 2.5e-4 from float64 here; a kernel that fuses each
  # multiply-add rounds differently, so both references get 1e-3 of room.
  expected32, expected64 = start.copy(), start.astype(np.float64)
  scale, shift = np.float32(SCALE), np.float32(SHIFT)
  for _ in range(CHAIN_STEPS):
    expected32, expected64 = expected32 * scale + shift, expected64 * float(scale) + float(shift)
  np.testing.assert_allclose(got, expected32, rtol=1e-3)
  np.testing.assert_allclose(got, expected64, rtol=1e-3)
  assert seconds < 300, f"the 100k chain took {seconds:.0f} s"

LOW_RECURSION_LIMIT = 300   # pytest and tgrad's own call depth fit; any walk that recursed per node would not

@pytest.fixture
def low_recursion_limit():
  saved = sys.getrecursionlimit()
  sys.setrecursionlimit(LOW_RECURSION_LIMIT)
  try: yield
  finally: sys.setrecursionlimit(saved)

def test_walks_never_recurse_per_node(low_recursion_limit):
  """Chains of every kind of op under a recursion limit of 300: elementwise with a transcendental, a masked pad, a fused
  reduce, and integer math on arange, realized and compared with numpy."""
  data = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
  x, ref = Tensor(data), data.astype(np.float64)
  for i in range(600):
    x, ref = (x.exp2() * 0.5).log2() if i % 100 == 0 else x * 0.999 + 0.001, \
             np.log2(np.exp2(ref) * 0.5) if i % 100 == 0 else ref * 0.999 + 0.001
  x, ref = x.pad(((1, 0), (0, 1))) * 2, np.pad(ref, ((1, 0), (0, 1))) * 2
  for i in range(600): x, ref = x.maximum(-1.0) - 0.0001, np.maximum(ref, -1.0) - 0.0001
  total, ref_total = x.sum(axis=1), ref.sum(axis=1)
  for i in range(600): total, ref_total = total + 0.5, ref_total + 0.5
  np.testing.assert_allclose(total.numpy(), ref_total, rtol=1e-3, atol=1e-3)
  index, expected = Tensor.arange(7), np.arange(7)
  for _ in range(600): index, expected = (index * 3 + 1) % 7, (expected * 3 + 1) % 7
  np.testing.assert_array_equal(index.numpy(), expected)

def test_long_chain_of_movement_ops_schedules():
  """3,000 elementwise ops with a reshape of a transpose, a transpose or a pad/shrink between each: every third op adds
  a View that can't merge, so a kernel inlines at most MAX_INLINED_VIEWS of them and the rest are realized."""
  data = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
  x, ref = Tensor(data).realize(), data.astype(np.float64)
  for i in range(3000):
    if i % 3 == 0: x, ref = x.reshape(6, 4) * 0.999, ref.reshape(6, 4) * 0.999
    elif i % 3 == 1: x, ref = x.permute(1, 0) + 0.001, ref.T + 0.001
    else: x, ref = x.pad(((1, 1), (0, 0)))[1:-1] - 0.0005, np.pad(ref, ((1, 1), (0, 0)))[1:-1] - 0.0005
  began = time.perf_counter()
  items = create_schedule([x.lazydata])
  assert time.perf_counter() - began < 60
  views = [u.arg for item in items for u in item.ast.toposort() if u.op is Ops.VIEW]
  assert max(len(st.views) for st in views) <= MAX_INLINED_VIEWS + 1
  assert 3000 // (3 * (MAX_INLINED_VIEWS + 1)) <= kernel_count(items) <= 3000 // 3
  np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-5)

def test_long_chain_of_reduces_schedules():
  """2,000 alternating row/column means, each expanded back: each mean and its scaled expansion is one row kernel
  (schedule.py rule 2b), whose output the next mean reads along the other axis."""
  data = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
  y, ref = Tensor(data).realize(), data.astype(np.float64)
  for i in range(2000):
    axis = i % 2
    y = y.sum(axis=axis, keepdim=True).expand(8, 8) * 0.125
    ref = np.broadcast_to(ref.sum(axis=axis, keepdims=True), (8, 8)) * 0.125
  items = create_schedule([y.lazydata])
  assert kernel_count(items) == 2000
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-6)

# ---- UOp-level walks on deep graphs

def test_deep_uop_chain_hashes_ranges_rewrites_and_pickles(low_recursion_limit):
  x = UOp.variable("x", 0, 10)
  deep = x
  for i in range(20_000): deep = deep + 1 if i % 2 == 0 else deep * 1
  assert (deep.vmin, deep.vmax) == (10_000, 10_010)
  assert len(deep.key) == 64 and len(deep.toposort()) == 20_000 + 2   # and x and the constant 1
  assert simplify(deep) is x + 10_000
  again = pickle.loads(pickle.dumps(deep))
  assert again is deep
  small = x
  for _ in range(500): small = small + 1
  assert small.render() == "(" * 500 + "x" + "+1)" * 500
  doubled = deep.substitute({x: x * 2})
  assert (doubled.vmin, doubled.vmax) == (10_000, 10_020)

def test_key_is_the_same_however_it_is_first_computed():
  """A key computed bottom-up on a stack equals the sha256 definition applied recursively."""
  import hashlib
  from tgrad.ops import _stable_repr
  def reference(u: UOp) -> str:
    h = hashlib.sha256(f"{u.op.name}|{u.dtype.name}|{_stable_repr(u.arg)}|".encode())
    for s in u.src: h.update(reference(s).encode())
    return h.hexdigest()
  rng = random.Random(3)
  for _ in range(20):
    expr = random_index_expression(rng, depth=6)
    assert expr.key == reference(expr)

def random_index_expression(rng: random.Random, depth: int) -> UOp:
  if depth == 0 or rng.random() < 0.2:
    return UOp.variable(rng.choice("abc"), 0, rng.randint(1, 20)) if rng.random() < 0.6 else \
           UOp.const(dtypes.index, rng.randint(-5, 30))
  op = rng.choice([Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX])
  left = random_index_expression(rng, depth - 1)
  right = UOp.const(dtypes.index, rng.randint(1, 9)) if op in (Ops.IDIV, Ops.MOD, Ops.MUL) else \
          random_index_expression(rng, depth - 1)
  return left.alu(op, right)

def recursive_graph_rewrite(root: UOp, matcher: PatternMatcher) -> UOp:
  """The recursive definition graph_rewrite implements: children first, then the rules to a fixpoint."""
  memo: dict = {}
  def rewrite(u: UOp) -> UOp:
    if (done := memo.get(u)) is not None: return done
    new_src = tuple(rewrite(s) for s in u.src)
    node = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
    if (replacement := matcher.rewrite(node)) is not None: node = rewrite(replacement)
    memo[u] = node
    memo[node] = node
    return node
  return rewrite(root)

def test_graph_rewrite_matches_the_recursive_definition():
  rng = random.Random(4)
  for _ in range(200):
    expr = random_index_expression(rng, depth=rng.randint(1, 7))
    assert graph_rewrite(expr, symbolic) is recursive_graph_rewrite(expr, symbolic)

def test_graph_rewrite_rules_that_never_settle_raise():
  x = UOp.variable("x", 0, 4)
  wraps_itself = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: u + 0)])   # u -> u + 0 contains u again
  with pytest.raises(RuntimeError, match="graph_rewrite"): graph_rewrite(x * 3, wraps_itself)

def test_split_terms_keeps_first_appearance_order():
  a, b, c = (UOp.variable(n, 0, 9) for n in "abc")
  expr = ((c * 2 + a) + (b + c * 3)) + 7
  terms, constant = split_terms(expr)
  assert list(terms.items()) == [(c, 5), (a, 1), (b, 1)] and constant == 7

def test_run_nested_matches_plain_recursion():
  """run_nested drives generator-written recursion exactly as Python would: same results, same visiting order, and
  exceptions come out of the innermost call."""
  rng = random.Random(5)
  for _ in range(50):
    children = {n: [rng.randrange(n) for _ in range(rng.randint(0, 3))] if n else [] for n in range(40)}
    order_recursive, order_nested = [], []
    def recursive(n: int) -> int:
      order_recursive.append(n)
      return n + sum(recursive(c) * 3 for c in children[n]) % 1_000_003
    def nested(n: int):
      order_nested.append(n)
      total = 0
      for c in children[n]: total += (yield nested(c)) * 3
      return n + total % 1_000_003
    assert run_nested(nested(39)) == recursive(39)
    assert order_nested == order_recursive
  def failing(depth: int):
    if depth == 0: raise ValueError("at the bottom")
    return (yield failing(depth - 1))
  with pytest.raises(ValueError, match="at the bottom"): run_nested(failing(50_000))
