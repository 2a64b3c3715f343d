"""UOp basics: hash-consing, the cross-process stable `key`, UPat matching, PatternMatcher rule order, graph_rewrite
reaching a fixpoint, and the value ranges (vmin, vmax) of every op, checked for soundness by brute force.
"""
import itertools, math, os, subprocess, sys
import pytest
from tgrad.dtype import dtypes
from tgrad.ops import Ops, UOp, UPat, PatternMatcher, graph_rewrite, exec_alu

INDEX = dtypes.index
I32 = dtypes.int32
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def loop(lo: int, hi: int, axis: int = 0) -> UOp:
  return UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, lo), UOp.const(INDEX, hi)), arg=axis)

# ---------------------------------------------------------------------------------------------------------------
# hash-consing

def test_same_node_is_same_object():
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  assert (a + b) * 3 is (a + b) * 3
  assert UOp(Ops.CONST, dtypes.float32, (), 1.5) is UOp.const(dtypes.float32, 1.5)
  assert a + b is not b + a   # structure, not value: ADD(a, b) and ADD(b, a) are different nodes
  assert UOp.variable("a", 0, 9) is a and UOp.variable("a", 0, 10) is not a

def test_args_that_compare_equal_stay_distinct():
  assert UOp.const(dtypes.float32, -0.0) is not UOp.const(dtypes.float32, 0.0)
  assert UOp(Ops.CONST, INDEX, (), 1) is not UOp(Ops.CONST, INDEX, (), True)
  assert UOp(Ops.CONST, INDEX, (), (1, 2)) is not UOp(Ops.CONST, INDEX, (), (True, 2))
  assert UOp.const(dtypes.float32, math.nan) is UOp.const(dtypes.float32, math.nan)   # NaN is one constant
  assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.float32, 1.0)

def test_uop_is_immutable():
  with pytest.raises(AttributeError): UOp.const(INDEX, 3).arg = 4

# ---------------------------------------------------------------------------------------------------------------
# key: a content hash, stable across processes and hash seeds

KEY_GRAPH_SOURCE = """
from tgrad.dtype import dtypes
from tgrad.ops import Ops, UOp
i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), UOp.const(dtypes.index, 16)), arg=0)
buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), ("data0", 3))
load = UOp(Ops.LOAD, dtypes.float32, (buf, i * 4 + 1))
value = load * UOp.const(dtypes.float32, -0.0) + UOp.const(dtypes.float32, 2.5)
root = UOp(Ops.REDUCE_AXIS, dtypes.float32, (value,), (Ops.ADD, (0, 1)))
keys = [root.key, UOp.const(dtypes.float32, 0.0).key, UOp.variable("n", 1, 4096).key,
        UOp(Ops.SINK, dtypes.void, (root,)).key]
"""

def _keys_here() -> list[str]:
  scope: dict = {}
  exec(KEY_GRAPH_SOURCE, scope)
  return scope["keys"]

def test_key_is_stable_across_processes_and_hash_seeds():
  here = _keys_here()
  for seed in ("1", "12345"):
    result = subprocess.run([sys.executable, "-c", KEY_GRAPH_SOURCE + "\nprint(repr(keys))"], capture_output=True,
                            text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
    assert eval(result.stdout.strip()) == here

def test_key_tells_nodes_apart():
  keys = _keys_here()
  assert len(set(keys)) == len(keys) and all(len(k) == 64 for k in keys)
  assert UOp.const(dtypes.float32, -0.0).key != UOp.const(dtypes.float32, 0.0).key
  assert UOp(Ops.CONST, INDEX, (), 1).key != UOp(Ops.CONST, INDEX, (), True).key
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  assert (a + b).key != (b + a).key and (a + b).key == (a + b).key

# ---------------------------------------------------------------------------------------------------------------
# UPat and PatternMatcher

a, b, c = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9), UOp.variable("c", 0, 9)

def _match(pattern: UPat, u: UOp):
  captures: dict = {}
  return captures if pattern.match(u, captures) else None

def test_upat_ordered_src():
  pattern = UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c")))
  assert _match(pattern, a // 4) == {"x": a, "c": UOp.const(INDEX, 4)}
  assert _match(pattern, UOp.const(INDEX, 4).alu(Ops.IDIV, a)) is None   # order matters
  assert _match(pattern, a % 4) is None and _match(UPat(Ops.IDIV, src=(UPat.var("x"),)), a // 4) is None

def test_upat_commutative_list_src():
  pattern = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("c")])
  assert _match(pattern, a + 3) == {"x": a, "c": UOp.const(INDEX, 3)}
  assert _match(pattern, UOp.const(INDEX, 3) + a) == {"x": a, "c": UOp.const(INDEX, 3)}
  assert _match(pattern, a + b) is None
  # the first order that matches fully wins, and a failed order leaves no stale captures behind
  both = UPat(Ops.ADD, src=[UPat(Ops.MUL, name="m"), UPat.var("y")])
  assert _match(both, b + a * 2) == {"m": a * 2, "y": b}

def test_upat_repeated_name_must_be_the_same_node():
  pattern = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
  assert _match(pattern, a + a) == {"x": a}
  assert _match(pattern, a + b) is None
  nested = UPat(Ops.MUL, src=[UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), UPat.var("x")])
  assert _match(nested, (a + b) * a) is not None and _match(nested, a * (a + b)) is not None
  assert _match(nested, (a + b) * b) is None

def test_upat_filters():
  assert _match(UPat((Ops.ADD, Ops.MUL), name="u"), a * b) == {"u": a * b}
  assert _match(UPat(dtype=dtypes.float32), a) is None and _match(UPat(dtype=(dtypes.float32, INDEX)), a) is not None
  assert _match(UPat(Ops.CONST, arg=0), UOp.const(INDEX, 0)) is not None
  assert _match(UPat(Ops.CONST, arg=0), UOp.const(INDEX, 1)) is None
  every_src = UPat(Ops.ADD, src=UPat(Ops.DEFINE_VAR))
  assert _match(every_src, a + b) is not None and _match(every_src, a + 1) is None

def test_pattern_matcher_rule_order_and_fallthrough():
  calls: list[str] = []
  def declines(x):
    calls.append("declines")
    return None
  matcher = PatternMatcher([
    (UPat(Ops.ADD, src=[UPat.var("x"), UPat(Ops.CONST, arg=0)]), declines),
    (UPat(Ops.ADD, src=[UPat.var("x"), UPat(Ops.CONST, arg=0)]), lambda x: x),
    (UPat(Ops.ADD, name="u"), lambda u: UOp.const(INDEX, 99)),
  ])
  assert matcher.rewrite(a + 0) is a and calls == ["declines"]   # a None result falls through to the next rule
  assert matcher.rewrite(a + b) is UOp.const(INDEX, 99)
  assert matcher.rewrite(a * b) is None
  combined = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: u.src[0])]) + matcher
  assert combined.rewrite(a * b) is a and combined.rewrite(a + 0) is a

def test_rule_without_op_applies_to_every_node():
  to_index = (UPat(name="u", dtype=dtypes.float32), lambda u: u.cast(INDEX) if u.op is Ops.CONST else None)
  matcher = PatternMatcher([to_index])
  assert matcher.rewrite(UOp.const(dtypes.float32, 2.0)) is UOp.const(dtypes.float32, 2.0).cast(INDEX)

# ---------------------------------------------------------------------------------------------------------------
# graph_rewrite

def test_graph_rewrite_reaches_a_fixpoint():
  # each rewrite exposes a new match: x+0 -> x, then (x*1) -> x, then x+0 again at the parent
  drop_zero = (UPat(Ops.ADD, src=[UPat.var("x"), UPat(Ops.CONST, arg=0)]), lambda x: x)
  drop_one = (UPat(Ops.MUL, src=[UPat.var("x"), UPat(Ops.CONST, arg=1)]), lambda x: x)
  matcher = PatternMatcher([drop_zero, drop_one])
  assert graph_rewrite(((((a + 0) * 1) + 0) * 1 + 0) * b, matcher) is a * b
  # a rule whose output another rule rewrites: the result is rewritten again, to the end of the chain
  count_down = (UPat(Ops.CONST, dtype=INDEX, name="c"), lambda c: UOp.const(INDEX, c.arg - 1) if c.arg > 0 else None)
  assert graph_rewrite(a + 5, PatternMatcher([count_down])) is a + 0
  assert graph_rewrite(a + 5, PatternMatcher([count_down, drop_zero])) is a

def test_graph_rewrite_visits_a_shared_node_once():
  visits: list[UOp] = []
  def record(u):
    visits.append(u)
    return None
  shared = a * b
  graph_rewrite((shared + shared) * shared, PatternMatcher([(UPat(Ops.MUL, name="u"), record)]))
  assert visits.count(shared) == 1

def test_graph_rewrite_keeps_unchanged_graphs_identical():
  root = (a + b) * c
  assert graph_rewrite(root, PatternMatcher([(UPat(Ops.IDIV, name="u"), lambda u: u.src[0])])) is root

def test_graph_rewrite_handles_deep_graphs():
  deep = a
  for k in range(3000): deep = deep + (k % 3)
  assert graph_rewrite(deep, PatternMatcher([])) is deep

# ---------------------------------------------------------------------------------------------------------------
# vmin / vmax

@pytest.mark.parametrize("make,expected", [
  (lambda: UOp.const(INDEX, -4), (-4, -4)),
  (lambda: UOp.variable("v", -3, 7), (-3, 7)),
  (lambda: loop(2, 9), (2, 8)),
  (lambda: UOp(Ops.SPECIAL, INDEX, (), ("gidx0", 32)), (0, 31)),
  (lambda: loop(0, 4) + UOp.variable("v", -3, 7), (-3, 10)),
  (lambda: UOp.variable("v", -3, 7) * -2, (-14, 6)),
  (lambda: UOp.variable("v", -3, 7) * UOp.variable("w", -2, 5), (-15, 35)),
  (lambda: UOp.variable("v", -3, 7).alu(Ops.NEG), (-7, 3)),
  (lambda: UOp.variable("v", -7, 9) // 2, (-3, 4)),
  (lambda: UOp.variable("v", -7, 9) // -2, (-4, 3)),
  (lambda: UOp.variable("v", 3, 9) // 0, (0, 0)),
  (lambda: loop(0, 100) % 8, (0, 7)),
  (lambda: loop(0, 5) % 8, (0, 4)),
  (lambda: UOp.variable("v", -20, -1) % 8, (-7, 0)),
  (lambda: UOp.variable("v", -3, 20) % 8, (-3, 7)),
  (lambda: UOp.variable("v", -3, 20) % -8, (-3, 7)),
  (lambda: UOp.variable("v", -3, 7).maximum(UOp.variable("w", 0, 5)), (0, 7)),
  (lambda: loop(0, 4).lt(2).where(UOp.variable("v", -3, 7), UOp.const(INDEX, 10)), (-3, 10)),
  (lambda: UOp.variable("v", 0, 300).cast(dtypes.uint8), (0, 255)),
  (lambda: UOp.variable("v", 0, 200).cast(dtypes.uint8), (0, 200)),
  (lambda: loop(0, 4).lt(4), (True, True)),
  (lambda: loop(0, 4).lt(0), (False, False)),
  (lambda: loop(0, 4).lt(2), (False, True)),
  (lambda: loop(0, 4).ne(7), (True, True)),
  (lambda: UOp.const(INDEX, 3).ne(3), (False, False)),
  (lambda: loop(0, 4).lt(9) & loop(0, 4, 1).lt(2), (False, True)),
  (lambda: loop(0, 4).lt(9) | loop(0, 4, 1).lt(2), (True, True)),
  (lambda: UOp.variable("v", 0, 2 ** 30, I32) * 4, (dtypes.min(I32), dtypes.max(I32))),   # would wrap: full range
  (lambda: UOp.variable("v", -2 ** 31, 0, I32) // -1, (dtypes.min(I32), dtypes.max(I32))),
  (lambda: UOp.variable("v", 0, 2 ** 30) * 4, (0, 2 ** 32)),   # 64-bit index math is exact past 2^31
  (lambda: UOp.variable("v", 0, 2 ** 61) * 4, (dtypes.min(INDEX), dtypes.max(INDEX))),
  (lambda: UOp.const(dtypes.float32, 1.0) + UOp.const(dtypes.float32, 2.0), (-math.inf, math.inf)),
])
def test_vmin_vmax(make, expected):
  u = make()
  assert (u.vmin, u.vmax) == expected

SMALL_RANGES = [(-5, -1), (-3, 4), (0, 0), (0, 6), (2, 9)]
BINARY_INT_OPS = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE]
TIGHT_OPS = {Ops.ADD, Ops.MUL, Ops.MAX}   # for independent operands these ranges are exact, not just bounds

@pytest.mark.parametrize("op", BINARY_INT_OPS)
def test_binary_ranges_are_sound(op):
  for (lo0, hi0), (lo1, hi1) in itertools.product(SMALL_RANGES, SMALL_RANGES):
    u = UOp.variable("p", lo0, hi0).alu(op, UOp.variable("q", lo1, hi1))
    values = [exec_alu(op, u.dtype, (p, q)) for p in range(lo0, hi0 + 1) for q in range(lo1, hi1 + 1)]
    assert u.vmin <= min(values) and max(values) <= u.vmax, (op, (lo0, hi0), (lo1, hi1))
    if op in TIGHT_OPS: assert (u.vmin, u.vmax) == (min(values), max(values))

@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD])
@pytest.mark.parametrize("divisor", [-4, -1, 0, 1, 3, 8])
def test_division_ranges_are_sound(op, divisor):
  for lo, hi in SMALL_RANGES + [(-20, 20), (5, 7), (-17, -9)]:
    u = UOp.variable("p", lo, hi).alu(op, divisor)
    values = [exec_alu(op, u.dtype, (p, divisor)) for p in range(lo, hi + 1)]
    assert u.vmin <= min(values) and max(values) <= u.vmax, (op, divisor, (lo, hi))
    if op is Ops.IDIV: assert (u.vmin, u.vmax) == (min(values), max(values))
