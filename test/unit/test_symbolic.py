"""The UOp simplifier (`symbolic`, `simplify`) must preserve value: random int/bool index expressions are evaluated
before and after simplification at every combination of leaf values (exec_alu semantics), and every node's value
must lie in its [vmin, vmax]. A second generator puts leaves, constants, scales and divisors near and above 2^31 and
2^32 (up to ~2^40): 64-bit index math must stay exact there, and int32 data math must wrap exactly as the kernels do.
sympy is the algebra oracle for linear expressions and for // and % of nonnegative
operands. Targeted tests check the simplifications the shape layer relies on.
"""
import itertools, random
import pytest
import sympy
from tgrad.dtype import dtypes
import tgrad.ops as ops_module
from tgrad.ops import Ops, UOp, exec_alu, graph_rewrite, simplify, symbolic

INDEX = dtypes.index
SEED = 1234
N_RANDOM_EXPRESSIONS = 2000
N_NARROW_DTYPE_EXPRESSIONS = 400
N_BIG_EXPRESSIONS = 1500          # 64-bit index math with values near and past 2^31, 2^32, up to ~2^40
N_BIG_INT32_EXPRESSIONS = 400     # the same generator in int32: everything near 2^31 wraps
N_SYMPY_LINEAR = 300
N_SYMPY_DIVMOD = 40
MAX_DEPTH = 5
MAX_LEAVES = 3

def rng_range(lo: int, hi: int, axis: int, dtype=INDEX) -> UOp:
  """A loop index running over [lo, hi)."""
  return UOp(Ops.RANGE, dtype, (UOp.const(dtype, lo), UOp.const(dtype, hi)), arg=axis)

def leaves_of(u: UOp) -> list[UOp]: return [n for n in u.toposort() if n.op in (Ops.RANGE, Ops.DEFINE_VAR)]

def leaf_values(leaf: UOp) -> range: return range(leaf.vmin, leaf.vmax + 1)

class Evaluator:
  """Evaluates a UOp node by node with exec_alu for many leaf bindings, checking each node lies in [vmin, vmax]."""
  def __init__(self, root: UOp):
    self.nodes = root.toposort()
    position = {node: k for k, node in enumerate(self.nodes)}
    self.steps = [(node, node.op, node.dtype, tuple(position[s] for s in node.src), node.vmin, node.vmax)
                  for node in self.nodes]
  def __call__(self, env: dict):
    values: list = []
    for node, op, dtype, srcs, vmin, vmax in self.steps:
      if node in env: value = env[node]
      elif op is Ops.CONST: value = node.arg
      else: value = exec_alu(op, dtype, tuple(values[k] for k in srcs))
      if not vmin <= value <= vmax:
        raise AssertionError(f"{node.render()} = {value} outside [{vmin}, {vmax}] at {env}")
      values.append(value)
    return values[-1]

def evaluate(u: UOp, env: dict): return Evaluator(u)(env)

def assert_same_function(original: UOp, simplified: UOp, context: str = ""):
  leaves = leaves_of(original)
  assert set(leaves_of(simplified)) <= set(leaves), f"{context}: new leaves in {simplified.render()}"
  assert simplified.dtype == original.dtype
  evaluate_original, evaluate_simplified = Evaluator(original), Evaluator(simplified)
  for combo in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
    env = dict(zip(leaves, combo))
    before, after = evaluate_original(env), evaluate_simplified(env)
    assert before == after, (f"{context}: {original.render()} = {before} but simplified {simplified.render()} = "
                             f"{after} at {({leaf.render(): v for leaf, v in env.items()})}")

# ---------------------------------------------------------------------------------------------------------------
# random expressions

class ExpressionGenerator:
  """Random int and bool index expressions over a few leaves with small ranges (some negative)."""
  def __init__(self, rng: random.Random, dtype=INDEX, leaf_offset: int = 0):
    self.rng, self.dtype = rng, dtype
    self.leaves = [self._leaf(k, leaf_offset) for k in range(rng.randint(1, MAX_LEAVES))]

  def _leaf(self, k: int, offset: int) -> UOp:
    if self.rng.random() < 0.5:
      lo = self.rng.choice((0, 0, 0, 1, 2)) + offset
      return rng_range(lo, lo + self.rng.randint(1, 8), k, self.dtype)
    lo = self.rng.randint(-8, 4) + offset
    return UOp.variable(f"v{k}", lo, lo + self.rng.randint(0, 7), self.dtype)

  def const(self) -> UOp: return UOp.const(self.dtype, self.rng.randint(-10, 12))
  def divisor(self) -> int: return self.rng.choice((1, 2, 2, 3, 3, 4, 4, 5, 6, 8, 16, -1, -2, -3, -4, 0))

  def affine(self) -> UOp:
    """Σ cᵢ·leafᵢ + k, the shape of most index math."""
    out = UOp.const(self.dtype, self.rng.randint(-6, 8))
    for leaf in self.rng.sample(self.leaves, self.rng.randint(1, len(self.leaves))):
      out = out + leaf * self.rng.choice((1, 1, 2, 3, 4, 6, 8, -1, -2, -4))
    return out

  def int_expr(self, depth: int) -> UOp:
    rng = self.rng
    if depth == 0 or rng.random() < 0.1: return rng.choice(self.leaves) if rng.random() < 0.85 else self.const()
    a = self.int_expr(depth - 1)
    kind = rng.choice(("add", "add", "sub", "mul_const", "mul_const", "mul", "idiv", "idiv", "mod", "mod", "max",
                       "where", "neg", "add_const", "affine", "affine", "affine_divmod", "affine_divmod"))
    if kind == "affine": return self.affine() + a * rng.choice((1, 2, 3, 4, -1))
    if kind == "affine_divmod":
      divided = self.affine() + a * rng.choice((0, 1, 4))
      return divided // rng.choice((2, 3, 4, 8)) if rng.random() < 0.5 else divided % rng.choice((2, 3, 4, 8))
    if kind == "add": return a + self.int_expr(depth - 1)
    if kind == "sub": return a - self.int_expr(depth - 1)
    if kind == "add_const": return a + rng.randint(-12, 12)
    if kind == "mul_const": return a * rng.choice((2, 3, 4, 8, -1, -2, 5, 0, 1))
    if kind == "mul": return a * self.int_expr(depth - 1)
    if kind == "idiv": return a // self.divisor()
    if kind == "mod": return a % self.divisor()
    if kind == "max": return a.maximum(self.int_expr(depth - 1))
    if kind == "where": return self.bool_expr(depth - 1).where(a, self.int_expr(depth - 1))
    return a.alu(Ops.NEG)

  def bool_expr(self, depth: int) -> UOp:
    rng = self.rng
    if depth <= 0: return UOp.const(dtypes.bool, rng.random() < 0.5)
    kind = rng.choice(("lt", "lt", "lt_const", "const_lt", "affine_lt", "ne", "and", "or", "not"))
    if kind == "lt": return self.int_expr(depth - 1).lt(self.int_expr(depth - 1))
    if kind == "lt_const": return self.int_expr(depth - 1).lt(rng.randint(-8, 12))
    if kind == "affine_lt": return self.affine().lt(rng.randint(-8, 20)) if rng.random() < 0.5 else \
      UOp.const(self.dtype, rng.randint(-8, 20)).lt(self.affine() // self.divisor())
    if kind == "const_lt": return UOp.const(self.dtype, rng.randint(-8, 12)).lt(self.int_expr(depth - 1))
    if kind == "ne": return self.int_expr(depth - 1).ne(self.int_expr(depth - 1) if rng.random() < 0.5 else
                                                        self.const())
    if kind == "and": return self.bool_expr(depth - 1) & self.bool_expr(depth - 1)
    if kind == "or": return self.bool_expr(depth - 1) | self.bool_expr(depth - 1)
    return self.bool_expr(depth - 1).logical_not()

  def expr(self) -> UOp:
    depth = self.rng.randint(2, MAX_DEPTH)
    return self.bool_expr(depth) if self.rng.random() < 0.3 else self.int_expr(depth)

# Values where 32-bit index math would break: around 2^31 and 2^32 (signed and unsigned wrap), and far above.
BIG_OFFSETS = (0, 2 ** 31 - 5, 2 ** 31, 2 ** 32 - 4, 2 ** 32 + 1, 2 ** 40, -2 ** 31 - 3, 3 * 2 ** 30, 2 ** 31 - 20,
               -2 ** 31 + 12)
BIG_CONSTANTS = (2 ** 31, 2 ** 31 - 1, 2 ** 31 + 1, -2 ** 31, -2 ** 31 - 1, 2 ** 32, 2 ** 32 - 1, 2 ** 32 + 1,
                 3 * 2 ** 30, 2 ** 40, 2 ** 40 + 7, 1_000_000_007)
BIG_SCALES = (65536, 1 << 20, 1 << 31, 1 << 32, 3 << 29, 4_000_000_000, 1 << 24, 1000, -65536, -(1 << 31))
BIG_DIVISORS = (65536, 1 << 20, 1 << 31, (1 << 31) - 1, (1 << 31) + 1, 1 << 32, 3 << 30, 1_000_000_007, 7, -(1 << 31))

class BigExpressionGenerator(ExpressionGenerator):
  """ExpressionGenerator with leaves that start near 2^31, 2^32 or 2^40 and constants, scales and divisors of that
  size, mixed with the small ones (so small-divisor rules meet big values too)."""
  def _leaf(self, k: int, offset: int) -> UOp:
    # a leaf's own values must fit its dtype (in int32 the big offsets are the ones just below ±2^31)
    fitting = [o for o in BIG_OFFSETS if dtypes.min(self.dtype) + 16 <= offset + o <= dtypes.max(self.dtype) - 16]
    return super()._leaf(k, offset + self.rng.choice(fitting or (0,)))
  def const(self) -> UOp: return UOp.const(self.dtype, self.rng.choice(BIG_CONSTANTS)) if self.rng.random() < 0.6 \
    else super().const()
  def divisor(self) -> int: return self.rng.choice(BIG_DIVISORS) if self.rng.random() < 0.5 else super().divisor()
  def affine(self) -> UOp:
    out = self.const()
    for leaf in self.rng.sample(self.leaves, self.rng.randint(1, len(self.leaves))):
      out = out + leaf * (self.rng.choice(BIG_SCALES) if self.rng.random() < 0.5 else self.rng.choice((1, 2, -1, 4)))
    return out
  def int_expr(self, depth: int) -> UOp:
    if depth > 0 and self.rng.random() < 0.2:   # a scaled sum, divided or reduced by a big divisor: strides past 2^31
      scaled = self.int_expr(depth - 1) * self.rng.choice(BIG_SCALES) + self.const()
      return scaled // self.divisor() if self.rng.random() < 0.5 else scaled % self.divisor()
    return super().int_expr(depth)

def test_random_expressions_keep_their_value():
  for n in range(N_RANDOM_EXPRESSIONS):
    rng = random.Random(SEED * 100_003 + n)
    expression = ExpressionGenerator(rng).expr()
    assert_same_function(expression, simplify(expression), f"seed {SEED * 100_003 + n}")

@pytest.mark.parametrize("dtype,leaf_offset", [(dtypes.int8, 0), (dtypes.int8, 110), (dtypes.uint8, 10),
                                               (dtypes.uint8, 240)])
def test_random_expressions_in_narrow_dtypes_keep_their_value(dtype, leaf_offset):
  # int8/uint8 wrap around within the fuzzed ranges: every rule must notice when its exact-integer reasoning fails
  for n in range(N_NARROW_DTYPE_EXPRESSIONS):
    seed = SEED * 100_003 + n
    expression = ExpressionGenerator(random.Random(seed), dtype, leaf_offset).expr()
    assert_same_function(expression, simplify(expression), f"{dtype} seed {seed}")

def test_random_big_expressions_keep_their_value():
  # 64-bit index math past 2^31: no rule may reason in 32 bits, and vmin/vmax must hold there (every node is checked)
  for n in range(N_BIG_EXPRESSIONS):
    seed = SEED * 7_919 + n
    expression = BigExpressionGenerator(random.Random(seed)).expr()
    assert_same_function(expression, simplify(expression), f"big seed {seed}")

def test_random_big_expressions_in_int32_keep_their_value():
  # the same values in int32 wrap around: the rules must see where exact-integer reasoning stops holding
  for n in range(N_BIG_INT32_EXPRESSIONS):
    seed = SEED * 7_919 + n
    expression = BigExpressionGenerator(random.Random(seed), dtypes.int32).expr()
    assert_same_function(expression, simplify(expression), f"int32 big seed {seed}")

def test_big_expressions_match_python_ints():
  # index math values far from 2^63 are plain Python ints: exec_alu's int64 never wraps on them, so the simplified
  # form equals a direct evaluation with Python's unbounded ints and C-rounded division
  checked = 0
  for n in range(N_BIG_EXPRESSIONS // 5):
    rng = random.Random(SEED * 31 + n)
    leaves = [rng_range(offset, offset + rng.randint(1, 6), k) for k, offset in
              enumerate(rng.sample(BIG_OFFSETS, rng.randint(1, 2)))]
    expression = UOp.const(INDEX, rng.choice(BIG_CONSTANTS))
    for leaf in leaves: expression = expression + leaf * rng.choice(BIG_SCALES)
    if not -2 ** 62 < expression.vmin <= expression.vmax < 2 ** 62: continue   # int64 itself would wrap (2^32·2^31)
    divisor = rng.choice(BIG_DIVISORS)
    bound = rng.choice(BIG_CONSTANTS)
    for candidate in (expression // divisor, expression % divisor, (expression // divisor).lt(bound)):
      simplified = simplify(candidate)
      for combo in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
        env = dict(zip(leaves, combo))
        total = candidate.src[0].src[0] if candidate.op is Ops.CMPLT else candidate.src[0]
        exact = _python_value(total, env)
        quotient = abs(exact) // abs(divisor) * (1 if (exact >= 0) == (divisor >= 0) else -1)   # C: toward zero
        expected = quotient if candidate.op is Ops.IDIV else exact - quotient * divisor if candidate.op is Ops.MOD \
          else quotient < candidate.src[1].arg
        assert evaluate(simplified, env) == expected, f"{candidate.render()} -> {simplified.render()} at {combo}"
        checked += 1
  assert checked > 1000

def _python_value(u: UOp, env: dict) -> int:
  """Σ coefficient·leaf + constant with Python's unbounded ints."""
  if u in env: return env[u]
  if u.op is Ops.CONST: return u.arg
  if u.op is Ops.ADD: return _python_value(u.src[0], env) + _python_value(u.src[1], env)
  if u.op is Ops.MUL: return _python_value(u.src[0], env) * _python_value(u.src[1], env)
  raise NotImplementedError(u.op)

def test_simplify_is_idempotent_on_random_expressions():
  """The rules' fixpoint is one: rewriting a simplified expression again (without simplify's memo, which would
  answer from what it stored) changes nothing."""
  for n in range(N_RANDOM_EXPRESSIONS // 5):
    expression = ExpressionGenerator(random.Random(SEED + n)).expr()
    once = simplify(expression)
    again = graph_rewrite(once, symbolic)
    assert again is once, f"{expression.render()} -> {once.render()} -> {again.render()}"

def test_simplify_memo_answers_as_the_rules_and_stays_bounded(monkeypatch):
  """simplify remembers its results: each answer is what the rules give a fresh rewrite, a repeated call returns the
  same UOp, and the memo never holds more than its limit (it is cleared when full)."""
  monkeypatch.setattr(ops_module, "SIMPLIFY_MEMO_LIMIT", 64)
  monkeypatch.setattr(ops_module, "_simplified", {})
  for n in range(300):
    expression = ExpressionGenerator(random.Random(SEED + 7919 * n)).expr()
    answer = simplify(expression)
    assert answer is graph_rewrite(expression, symbolic) and simplify(expression) is answer
    assert len(ops_module._simplified) <= 64 + 2

# ---------------------------------------------------------------------------------------------------------------
# sympy as the oracle

def to_sympy(u: UOp, symbols: dict):
  """u as a sympy expression; // and % only for nonnegative dividends and positive divisors (floor semantics)."""
  if u.op is Ops.CONST: return sympy.Integer(u.arg)
  if u.op in (Ops.RANGE, Ops.DEFINE_VAR): return symbols[u]
  args = [to_sympy(s, symbols) for s in u.src]
  if u.op is Ops.ADD: return args[0] + args[1]
  if u.op is Ops.MUL: return args[0] * args[1]
  if u.op is Ops.NEG: return -args[0]
  if u.op in (Ops.IDIV, Ops.MOD):
    assert u.src[0].vmin >= 0 and u.src[1].op is Ops.CONST and u.src[1].arg > 0, f"not floor-safe: {u.render()}"
    return sympy.floor(args[0] / args[1]) if u.op is Ops.IDIV else sympy.Mod(args[0], args[1])
  raise NotImplementedError(u.op)

def _symbols(leaves: list[UOp]) -> dict:
  return {leaf: sympy.Symbol(f"s{k}", integer=True, nonnegative=leaf.vmin >= 0) for k, leaf in enumerate(leaves)}

def _linear_expr(rng: random.Random, leaves: list[UOp], depth: int) -> UOp:
  if depth == 0 or rng.random() < 0.25:
    return rng.choice(leaves) if rng.random() < 0.8 else UOp.const(INDEX, rng.randint(-9, 9))
  a, b = _linear_expr(rng, leaves, depth - 1), _linear_expr(rng, leaves, depth - 1)
  kind = rng.choice(("add", "sub", "scale", "scale_sum"))
  if kind == "add": return a + b
  if kind == "sub": return a - b
  if kind == "scale": return a * rng.randint(-5, 5)
  return (a + b) * rng.randint(-4, 4)

def test_linear_expressions_match_sympy():
  for n in range(N_SYMPY_LINEAR):
    rng = random.Random(SEED + n)
    leaves = [leaf for leaf in ExpressionGenerator(rng).leaves if leaf.vmax > leaf.vmin] or [rng_range(0, 5, 0)]
    expression = _linear_expr(rng, leaves, rng.randint(1, 5))
    simplified = simplify(expression)
    symbols = _symbols(leaves)
    difference = sympy.expand(to_sympy(expression, symbols) - to_sympy(simplified, symbols))
    assert difference == 0, f"{expression.render()} -> {simplified.render()}: differs by {difference}"
    # a linear expression simplifies to a flat sum: each leaf at most once, at most one constant
    alu = [u for u in simplified.toposort() if u.op in (Ops.ADD, Ops.MUL)]
    assert all(u.op is not Ops.MUL or u.src[1].op is Ops.CONST for u in alu), simplified.render()
    assert len([u for u in alu if u.op is Ops.ADD]) <= len(leaves), simplified.render()

def _nonnegative_divmod_expr(rng: random.Random, leaves: list[UOp], depth: int) -> UOp:
  if depth == 0 or rng.random() < 0.25:
    return rng.choice(leaves) if rng.random() < 0.8 else UOp.const(INDEX, rng.randint(0, 9))
  a = _nonnegative_divmod_expr(rng, leaves, depth - 1)
  kind = rng.choice(("add", "scale", "idiv", "mod"))
  if kind == "add": return a + _nonnegative_divmod_expr(rng, leaves, depth - 1)
  if kind == "scale": return a * rng.randint(1, 8)
  return a // rng.randint(1, 9) if kind == "idiv" else a % rng.randint(1, 9)

def test_nonnegative_div_mod_match_sympy():
  for n in range(N_SYMPY_DIVMOD):
    rng = random.Random(SEED + n)
    leaves = [rng_range(0, rng.randint(1, 12), k) for k in range(rng.randint(1, 2))]
    expression = _nonnegative_divmod_expr(rng, leaves, rng.randint(2, 4))
    simplified = simplify(expression)
    symbols = _symbols(leaves)
    oracle = to_sympy(expression, symbols)
    for combo in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
      expected = int(oracle.subs({symbols[leaf]: v for leaf, v in zip(leaves, combo)}))
      assert evaluate(simplified, dict(zip(leaves, combo))) == expected, f"{expression.render()} at {combo}"

# ---------------------------------------------------------------------------------------------------------------
# targeted simplifications

i, j, k = rng_range(0, 4, 0), rng_range(0, 8, 1), rng_range(0, 3, 2)
x = UOp.variable("x", -20, 20)
n = UOp.variable("n", 0, 100)

@pytest.mark.parametrize("expression,expected", [
  (lambda: ((i * 8 + j) // 8) % 4, lambda: i),
  (lambda: (i * 8 + j) % 8, lambda: j),
  (lambda: (j * 4 + i) // 4, lambda: j),
  (lambda: (x // 5) * 5 + x % 5, lambda: x),
  (lambda: (n // 7) * 7 + n % 7, lambda: n),
  (lambda: (i * 6) // 3, lambda: i * 2),
  (lambda: (n // 4) // 2, lambda: n // 8),
  (lambda: (n % 8) % 4, lambda: n % 4),
  (lambda: i.lt(10), lambda: UOp.const(dtypes.bool, True)),
  (lambda: i.lt(0), lambda: UOp.const(dtypes.bool, False)),
  (lambda: UOp.const(INDEX, 3).lt(i), lambda: UOp.const(dtypes.bool, False)),
  (lambda: x.ne(100), lambda: UOp.const(dtypes.bool, True)),
  (lambda: (i + 2).lt(3), lambda: i.lt(1)),
  (lambda: i.maximum(0), lambda: i),
  (lambda: (x + 3) * 2 + x, lambda: x * 3 + 6),
  (lambda: x * 0, lambda: UOp.const(INDEX, 0)),
  (lambda: x // 1, lambda: x),
  (lambda: x % 1, lambda: UOp.const(INDEX, 0)),
  (lambda: UOp.const(INDEX, -7) // 2, lambda: UOp.const(INDEX, -3)),   # C: rounds toward zero
  (lambda: UOp.const(INDEX, -7) % 2, lambda: UOp.const(INDEX, -1)),    # C: sign of the dividend
  (lambda: UOp.const(dtypes.bool, True).where(i, j), lambda: i),
  (lambda: (i.lt(2) & UOp.const(dtypes.bool, True)), lambda: i.lt(2)),
  (lambda: k % 3, lambda: k),
  (lambda: (i * 8 + j - 8 * i), lambda: j),
])
def test_targeted(expression, expected):
  assert simplify(expression()) is expected(), simplify(expression()).render()

def test_div_mod_edges_keep_their_value():
  shifted = rng_range(1, 3, 0)   # 4*shifted + j - 1 >= 0, but its part j - 1 that is not a multiple of 4 can be -1
  for expression in ((shifted * 4 + j - 1) % 4, (shifted * 4 + j - 1) // 4, (shifted * 4 + j * 3 + 2) % 4,
                     (shifted * 4 + j * 3 + 2) // 4, (x * 6 + 4) // 4, (x * -4 + 8) // 4, (n * 3 - 5) % 3):
    assert_same_function(expression, simplify(expression), expression.render())

def test_rules_respect_division_by_zero_semantics():
  # IDIV(x, 0) = 0 and MOD(x, 0) = 0 by definition; no rule may assume a nonzero divisor it did not check
  for expression in ((n % 0) % 4, (x % 0) % 2, (n // 0) // 3, (n // 3) // 0, (n * 0) // 5, x % 0 + (x // 0) * 0):
    assert_same_function(expression, simplify(expression), expression.render())

def test_rules_respect_int32_wraparound():
  int32 = dtypes.int32
  big, low = UOp.variable("big", 2 ** 30, 2 ** 30 + 3, int32), UOp.variable("low", -2 ** 31, -2 ** 31 + 3, int32)
  for expression in ((big + 2 ** 30).lt(0), (low // 65536) // 32768, (big * 4) // 4, (low // -1).lt(0)):
    assert_same_function(expression, simplify(expression), expression.render())

def test_rules_respect_int64_wraparound():
  big, low = UOp.variable("big", 2 ** 62, 2 ** 62 + 3), UOp.variable("low", -2 ** 63, -2 ** 63 + 3)
  for expression in ((big + 2 ** 62).lt(0), (low // 2 ** 32) // 2 ** 31, (big * 4) // 4, (low // -1).lt(0)):
    assert_same_function(expression, simplify(expression), expression.render())

def test_index_math_past_2_31_is_exact():
  # the wrap: a stride of 2^31 became -2^31 in 32-bit constants
  row = rng_range(0, 4, 0)
  index = simplify(row * 2 ** 31 + rng_range(0, 2 ** 31, 1))
  assert (index.vmin, index.vmax) == (0, 4 * 2 ** 31 - 1)
  assert simplify((row * 2 ** 31 + 5) // 2 ** 31) is row and simplify((row * 2 ** 32 + 7) % 2 ** 32).arg == 7
  assert simplify(row.lt(2 ** 31)).arg is True

def test_cuda_narrowing_keeps_every_value():
  # the CUDA renderer computes an index value in 32 bits where its operands and vmin/vmax fit: evaluating those nodes
  # with int32 semantics (wrapping) must give the same values as 64-bit math, at every leaf binding
  from tgrad.runtime.cuda.renderer import narrow_index_values
  narrowed = 0
  for n in range(N_BIG_EXPRESSIONS // 3):
    seed = SEED * 104_729 + n
    expression = simplify(BigExpressionGenerator(random.Random(seed)).int_expr(4))
    nodes = expression.toposort()
    narrow = narrow_index_values(nodes)
    narrowed += len(narrow)
    leaves = leaves_of(expression)
    for combo in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
      wide: dict = {}
      as_int: dict = {}
      for node in nodes:
        if node in leaves: wide[node] = as_int[node] = combo[leaves.index(node)]
        elif node.op is Ops.CONST: wide[node] = as_int[node] = node.arg
        else:
          wide[node] = exec_alu(node.op, node.dtype, tuple(wide[s] for s in node.src))
          as_int[node] = exec_alu(node.op, dtypes.int32 if node in narrow else node.dtype,
                                  tuple(as_int[s] for s in node.src))
        assert as_int[node] == wide[node], f"seed {seed}: {node.render()} narrowed to 32 bits is {as_int[node]}"
  assert narrowed > 100

def test_evaluate_matches_python_on_random_expressions():
  """sint.evaluate (its steps planned once per expression and reused) against the same arithmetic in Python: seeded
  random expressions over two variables, evaluated twice each at random values, BINDs included."""
  import random
  from tgrad.shape.sint import Variable, evaluate
  rng = random.Random(5)
  n, m = Variable("n", 1, 60), Variable("m", 0, 40)
  for _ in range(150):
    expr, fn = n, (lambda a, b: a)
    for _ in range(rng.randint(1, 5)):
      op, c = rng.choice("+*/%"), rng.randint(1, 9)
      other, ofn = rng.choice([(m, lambda a, b: b), (c, lambda a, b, c=c: c)])
      if op == "+": expr, fn = expr + other, (lambda a, b, f=fn, g=ofn: f(a, b) + g(a, b))
      elif op == "*": expr, fn = expr * other, (lambda a, b, f=fn, g=ofn: f(a, b) * g(a, b))
      elif op == "/": expr, fn = expr // c, (lambda a, b, f=fn, c=c: f(a, b) // c)
      else: expr, fn = expr % c, (lambda a, b, f=fn, c=c: f(a, b) % c)
    for _ in range(2):
      a, b = rng.randint(1, 60), rng.randint(0, 40)
      assert evaluate(expr, {"n": a, "m": b}) == fn(a, b), (expr, a, b)
    if isinstance(expr, int): continue
    bound = expr.substitute({n: n.bind(7)}) if hasattr(expr, "substitute") else expr
    assert evaluate(bound, {"m": 3}) == fn(7, 3), expr
