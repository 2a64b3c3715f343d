"""tgrad.paths.equivalent: known pairs of equal and different tensor functions, each with the verdict it must get,
and fuzzers: random elementwise expressions against algebraically rewritten copies (never "different") and against
perturbed copies (never "proven")."""
import math, random
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.paths import equivalent, Verdict

def rand(*shape, dtype=dtypes.float32, seed=0):
  data = np.random.default_rng(seed).standard_normal(shape)
  if dtype.is_int: data = np.round(data * 4)
  return Tensor(data.astype(np.float32 if dtype == dtypes.bfloat16 else dtype.np), dtype=dtype)

def tanh_exp(x):
  e = (2 * x).exp()
  return (e - 1) / (e + 1)

def softmax_unshifted(x): return x.exp() / x.exp().sum(-1, keepdim=True)

X = (4, 5)
SQ = (4, 4)
BIG = (16, 8)   # more output positions than the prover's case split takes
F16 = dict(dtype=dtypes.float16)
I32 = dict(dtype=dtypes.int32)

# (name, f, g, input shapes (or (shape, dtype kwargs)), expected kind)
PAIRS = [
  # elementwise algebra: sympy's canonical forms or simplify prove these
  ("tanh vs exp form", lambda x: x.tanh(), tanh_exp, [X], "proven"),
  ("tanh vs 2 sigmoid(2x) - 1", lambda x: x.tanh(), lambda x: 2 * (2 * x).sigmoid() - 1, [X], "proven"),
  ("sigmoid vs 1/(1+exp(-x))", lambda x: x.sigmoid(), lambda x: 1 / (1 + (-x).exp()), [X], "proven"),
  ("sigmoid vs (tanh(x/2)+1)/2", lambda x: x.sigmoid(), lambda x: ((x / 2).tanh() + 1) / 2, [X], "proven"),
  ("a*(b+c) vs a*b+a*c", lambda a, b, c: a * (b + c), lambda a, b, c: a * b + a * c, [X, X, X], "proven"),
  ("(a+b)+c vs a+(b+c)", lambda a, b, c: (a + b) + c, lambda a, b, c: a + (b + c), [X, X, X], "proven"),
  ("(a*b)*c vs c*(b*a)", lambda a, b, c: (a * b) * c, lambda a, b, c: c * (b * a), [X, X, X], "proven"),
  ("x*2 vs x+x", lambda x: x * 2, lambda x: x + x, [X], "proven"),
  ("x*2 vs x+x float16", lambda x: x * 2, lambda x: x + x, [(X, F16)], "proven"),
  ("relu vs maximum(x, 0)", lambda x: x.relu(), lambda x: x.maximum(0), [X], "proven"),
  ("x-y vs x+(-y)", lambda x, y: x - y, lambda x, y: x + (-y), [X, X], "proven"),
  ("x/y vs x*(1/y)", lambda x, y: x / y, lambda x, y: x * y.reciprocal(), [X, X], "proven"),
  ("-(-x) vs x", lambda x: -(-x), lambda x: x, [X], "proven"),
  ("x*-1 vs -x", lambda x: x * -1, lambda x: -x, [X], "proven"),
  ("square vs x*x", lambda x: x.square(), lambda x: x * x, [X], "proven"),
  ("(a+b)^2 vs a^2+2ab+b^2", lambda a, b: (a + b) * (a + b), lambda a, b: a * a + 2 * a * b + b * b, [X, X], "proven"),
  ("cos vs sin(x + pi/2)", lambda x: x.cos(), lambda x: (x + math.pi / 2).sin(), [X], "proven"),
  ("exp(a)*exp(b) vs exp(a+b)", lambda a, b: a.exp() * b.exp(), lambda a, b: (a + b).exp(), [X, X], "proven"),
  ("silu vs x*sigmoid", lambda x: x.silu(), lambda x: x / (1 + (-x).exp()), [X], "proven"),
  ("int a*(b+c) vs a*b+a*c", lambda a, b, c: a * (b + c), lambda a, b, c: a * b + a * c, [(X, I32)] * 3, "proven"),
  ("int a-b vs -(b-a)", lambda a, b: a - b, lambda a, b: -(b - a), [(X, I32)] * 2, "proven"),
  ("float16 widened twice vs once", lambda x: x.float().double(), lambda x: x.double(), [(X, F16)], "proven"),
  # movement: views compare by the element each output position reads
  ("reshape.permute chain vs .T", lambda x: x.reshape(2, 2, 5).permute(2, 0, 1).reshape(5, 4), lambda x: x.T, [X],
   "proven"),
  ("permute twice vs identity", lambda x: x.permute(1, 0).permute(1, 0), lambda x: x, [X], "proven"),
  ("flip twice vs identity", lambda x: x.flip(0).flip(0), lambda x: x, [X], "proven"),
  ("pad then shrink vs identity", lambda x: x.pad(((1, 0), (0, 2)))[1:, :5], lambda x: x, [X], "proven"),
  ("broadcast add vs transposed", lambda a, b: a + b.reshape(1, 5), lambda a, b: (a.T + b.reshape(5, 1)).T, [X, (5,)],
   "proven"),
  ("reshape round trip vs identity", lambda x: x.reshape(20).reshape(2, 10).reshape(4, 5), lambda x: x, [X], "proven"),
  ("x[::2] vs x.reshape split", lambda x: x[::2], lambda x: x.reshape(2, 2, 5)[:, 0], [X], "proven"),
  ("cat halves vs identity", lambda x: x[:2].cat(x[2:]), lambda x: x, [X], "proven"),
  # reduces: a Sum over fresh variables, the same Sum whatever the movement around it
  ("(a@b).T vs b.T@a.T", lambda a, b: (a @ b).T, lambda a, b: b.T @ a.T, [(3, 4), (4, 5)], "proven"),
  ("a@b vs (b.T@a.T).T", lambda a, b: a @ b, lambda a, b: (b.T @ a.T).T, [(3, 4), (4, 5)], "proven"),
  ("sum(0) vs x.T.sum(1)", lambda x: x.sum(0), lambda x: x.T.sum(1), [X], "proven"),
  ("mean vs sum/n", lambda x: x.mean(1), lambda x: x.sum(1) / 5, [X], "proven"),
  ("einsum vs matmul", lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: a @ b, [(3, 4), (4, 5)],
   "proven"),
  ("softmax shifted vs unshifted", lambda x: x.softmax(-1), softmax_unshifted, [X], "proven"),
  ("sum of scaled vs scaled sum", lambda x: (2 * x).sum(1), lambda x: 2 * x.sum(1), [X], "proven"),
  # equal, but beyond the prover (or not equal over the reals everywhere): the numbers decide
  ("softmax shifted vs unshifted, big", lambda x: x.softmax(-1), softmax_unshifted, [BIG], "numeric"),
  ("attention scores, 1/sqrt(8) vs 8^-0.5", lambda q, k: (q @ k.transpose(-1, -2) / 8 ** 0.5).softmax(-1),
   lambda q, k: ((k @ q.transpose(-1, -2)).transpose(-1, -2) * 8 ** -0.5).softmax(-1), [(2, 4, 8)] * 2, "numeric"),
  ("softmax float16 vs unshifted", lambda x: x.softmax(-1), softmax_unshifted, [(X, F16)], "numeric"),
  ("sum both axes vs sum twice", lambda x: x.sum(), lambda x: x.sum(0).sum(0), [X], "proven"),
  ("where(x>0, x, 0) vs relu", lambda x: (x > 0).where(x, 0), lambda x: x.relu(), [X], "numeric"),
  ("abs vs relu(x)+relu(-x)", lambda x: x.abs(), lambda x: x.relu() + (-x).relu(), [X], "numeric"),
  ("int x*2^32 wraps to 0", lambda x: x * 65536 * 65536, lambda x: x * 0, [(X, I32)], "numeric"),
  ("gelu tanh vs erf, loose", lambda x: x.gelu(), lambda x: x.gelu(approximate="none"), [X], "numeric"),
  # near misses and plain differences
  ("x*1.0001 vs x", lambda x: x * 1.0001, lambda x: x, [X], "different"),
  ("x+1e-3 vs x", lambda x: x + 1e-3, lambda x: x, [X], "different"),
  ("off-by-one slice", lambda x: x[1:], lambda x: x[:-1], [X], "different"),
  ("wrong axis sum", lambda x: x.sum(0), lambda x: x.sum(1), [SQ], "different"),
  ("wrong axis sum, shapes differ", lambda x: x.sum(0), lambda x: x.sum(1), [X], "different"),
  ("a.T@b vs a@b.T", lambda a, b: a.T @ b, lambda a, b: a @ b.T, [SQ, SQ], "different"),
  ("x.T vs x (square)", lambda x: x.T, lambda x: x, [SQ], "different"),
  ("flip vs identity", lambda x: x.flip(1), lambda x: x, [X], "different"),
  ("gelu tanh vs erf", lambda x: x.gelu(), lambda x: x.gelu(approximate="none"), [X], "different"),
  ("int vs float dtype", lambda x: x, lambda x: x.float(), [(X, I32)], "different"),
  ("relu vs abs", lambda x: x.relu(), lambda x: x.abs(), [X], "different"),
  ("sigmoid vs tanh", lambda x: x.sigmoid(), lambda x: x.tanh(), [X], "different"),
  ("softmax axis 0 vs 1", lambda x: x.softmax(0), lambda x: x.softmax(1), [SQ], "different"),
  ("max vs sum", lambda x: x.max(0), lambda x: x.sum(0), [X], "different"),
  ("a*b vs a*c", lambda a, b, c: a * b, lambda a, b, c: a * c, [X, X, X], "different"),
  ("float16 round trip vs identity", lambda x: x.half().float(), lambda x: x, [X], "different"),
  ("int floordiv vs truncdiv", lambda x: x // 3, lambda x: x.div(3, rounding_mode="trunc"), [(X, I32)],
   "different"),
]

def _inputs(specs):
  out = []
  for k, spec in enumerate(specs):
    shape, kwargs = (spec if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict) else (spec, {}))
    out.append(rand(*shape, seed=k, **kwargs))
  return out

@pytest.mark.parametrize("name,f,g,specs,kind", PAIRS, ids=[p[0] for p in PAIRS])
def test_known_pairs(name, f, g, specs, kind):
  tolerance = dict(rtol=1e-3, atol=1e-3) if name.endswith("loose") else {}
  verdict = equivalent(f, g, *_inputs(specs), **tolerance)
  assert verdict.kind == kind, verdict.reason
  assert bool(verdict) == (kind != "different")
  if kind == "proven": assert verdict.max_error == 0.0 and verdict.counterexample is None

def test_verdict_fields():
  x = rand(4, 5)
  proven = equivalent(lambda x: x + x, lambda x: 2 * x, x)
  assert proven and proven.kind == "proven" and proven.max_error == 0.0 and proven.counterexample is None
  near = equivalent(lambda x: x * 1.0001, lambda x: x, x)
  assert not near and near.counterexample is not None
  example = near.counterexample
  k = example.position
  assert example.f_outputs[0][k] != example.g_outputs[0][k] and example.differs[k]
  np.testing.assert_array_equal(example.differs, ~np.isclose(example.f_outputs[0], example.g_outputs[0], 1e-5, 1e-6))
  np.testing.assert_allclose(example.f_outputs[0], example.inputs[0] * np.float32(1.0001), rtol=1e-6)
  numeric = equivalent(lambda x: x.softmax(-1), softmax_unshifted, rand(16, 8))
  assert numeric.kind == "numeric" and 0.0 < numeric.max_error < 1e-6
  with pytest.raises(TypeError): equivalent(lambda x: x, lambda x: x, np.zeros(3))
  assert isinstance(proven, Verdict)

def test_seeded_trials_are_repeatable():
  x = rand(8)
  first = equivalent(lambda x: x * 1.0001, lambda x: x, x, seed=3)
  second = equivalent(lambda x: x * 1.0001, lambda x: x, x, seed=3)
  np.testing.assert_array_equal(first.counterexample.inputs[0], second.counterexample.inputs[0])

def test_tolerance_arguments():
  x = rand(4, 5)
  assert equivalent(lambda x: x * 1.0001, lambda x: x, x, rtol=1e-3, atol=1e-3).kind == "numeric"
  assert equivalent(lambda x: x * 1.0001, lambda x: x, x).kind == "different"

# ---- fuzz: random elementwise expression trees

LEAF_CONSTANTS = (0.5, 2.0, 3.0, -1.5)
UNARY = ("neg", "tanh", "sigmoid", "exp")
BINARY = ("add", "sub", "mul")

def random_tree(rng: random.Random, depth: int, inputs: int):
  if depth == 0 or rng.random() < 0.2:
    return ("in", rng.randrange(inputs)) if rng.random() < 0.8 else ("const", rng.choice(LEAF_CONSTANTS))
  if rng.random() < 0.3:
    op = rng.choice(UNARY)
    child = random_tree(rng, depth - 1, inputs)
    return (op, ("mul", child, ("const", 0.25))) if op == "exp" else (op, child)   # exp of a small argument
  return (rng.choice(BINARY), random_tree(rng, depth - 1, inputs), random_tree(rng, depth - 1, inputs))

def rewritten(rng: random.Random, node):
  """An algebraically equal tree: operands commuted, subtraction as +(−x), x·2 as x+x, products distributed, tanh as
  2σ(2x)−1, negation as ×−1."""
  if node[0] in ("in", "const"): return node
  kids = [rewritten(rng, k) for k in node[1:]]
  op, choice = node[0], rng.random()
  if op == "add": return ("add", kids[1], kids[0]) if choice < 0.5 else ("sub", kids[0], ("neg", kids[1]))
  if op == "sub": return ("add", kids[0], ("neg", kids[1])) if choice < 0.5 else ("neg", ("sub", kids[1], kids[0]))
  if op == "mul":
    a, b = kids
    if b[0] == "add" and choice < 0.5: return ("add", ("mul", a, b[1]), ("mul", a, b[2]))
    if b == ("const", 2.0): return ("add", a, a)
    return ("mul", b, a)
  if op == "neg": return ("mul", kids[0], ("const", -1.0)) if choice < 0.5 else ("neg", ("neg", ("neg", kids[0])))
  if op == "tanh":
    return ("sub", ("mul", ("const", 2.0), ("sigmoid", ("mul", ("const", 2.0), kids[0]))), ("const", 1.0))
  return (op, *kids)

def perturbed(rng: random.Random, node, inputs: int):
  """The tree with one leaf changed (another input, or a constant scaled by 1.5): usually a different function."""
  leaves = []
  def walk(n, path):
    if n[0] in ("in", "const"): leaves.append(path)
    else:
      for i, k in enumerate(n[1:]): walk(k, path + (i + 1,))
  walk(node, ())
  target = rng.choice(leaves)
  def replace(n, path):
    if not path:
      return ("in", (n[1] + 1) % inputs) if n[0] == "in" and inputs > 1 else ("const", 1.5 * (n[1] if n[0] == "const"
                                                                                                else 1.0))
    return n[:path[0]] + (replace(n[path[0]], path[1:]),) + n[path[0] + 1:]
  return replace(node, target)

def evaluate(node, inputs):
  op = node[0]
  if op == "in": return inputs[node[1]]
  if op == "const": return node[1]
  kids = [evaluate(k, inputs) for k in node[1:]]
  tensor = next((k for k in kids if isinstance(k, Tensor)), None)
  if tensor is None: kids[0] = Tensor(float(kids[0]))   # constants only: still a Tensor
  a = kids[0] if isinstance(kids[0], Tensor) else tensor * 0 + kids[0]
  if op == "neg": return -a
  if op == "tanh": return a.tanh()
  if op == "sigmoid": return a.sigmoid()
  if op == "exp": return a.exp()
  if op == "add": return a + kids[1]
  if op == "sub": return a - kids[1]
  return a * kids[1]

FUZZ_CASES = 24

def test_fuzz_rewritten_trees_are_never_different():
  rng = random.Random(1234)
  inputs = [rand(3, 4, seed=k) for k in range(3)]
  kinds = []
  for _ in range(FUZZ_CASES):
    tree = random_tree(rng, 4, 3)
    copy = rewritten(rng, tree)
    verdict = equivalent(lambda a, b, c: evaluate(tree, [a, b, c]) + a * 0, lambda a, b, c: evaluate(copy, [a, b, c]) +
                         a * 0, *inputs)
    assert verdict.kind != "different", f"{tree} vs {copy}: {verdict.reason}"
    kinds.append(verdict.kind)
  assert kinds.count("proven") >= FUZZ_CASES * 3 // 4   # the rewrites are all within sympy's reach

def test_fuzz_proofs_agree_with_numbers():
  """Soundness: a perturbed tree is proven equal only when the numbers agree too."""
  rng = random.Random(99)
  inputs = [rand(3, 4, seed=k) for k in range(2)]
  kinds = []
  for _ in range(FUZZ_CASES):
    tree = random_tree(rng, 3, 2)
    other = perturbed(rng, rewritten(rng, tree), 2)
    def f(a, b): return evaluate(tree, [a, b]) + a * 0
    def g(a, b): return evaluate(other, [a, b]) + a * 0
    verdict = equivalent(f, g, *inputs)
    kinds.append(verdict.kind)
    if verdict.kind == "proven":
      np.testing.assert_allclose(f(*inputs).numpy(), g(*inputs).numpy(), rtol=1e-4, atol=1e-5,
                                 err_msg=f"{tree} {other}")
  assert kinds.count("different") >= FUZZ_CASES // 2, kinds

MOVES = [lambda t: t.T, lambda t: t.flip(0), lambda t: t.flip(1), lambda t: t.reshape(t.shape[1], t.shape[0]),
         lambda t: t.pad(((1, 0), (0, 1)))[1:, :-1], lambda t: t.reshape(-1).reshape(t.shape),
         lambda t: t.permute(1, 0).permute(1, 0)]

def test_fuzz_movement_chains():
  """Two random chains of movement ops on a square input: proven exactly when they read the same elements."""
  rng = random.Random(5)
  x = rand(4, 4)
  arange = np.arange(16, dtype=np.float32).reshape(4, 4)
  for _ in range(FUZZ_CASES):
    first, second = [rng.choice(MOVES) for _ in range(3)], [rng.choice(MOVES) for _ in range(3)]
    def f(t, chain=first):
      for move in chain: t = move(t)
      return t
    def g(t, chain=second):
      for move in chain: t = move(t)
      return t
    same = np.array_equal(f(Tensor(arange)).numpy(), g(Tensor(arange)).numpy())
    verdict = equivalent(f, g, x)
    assert verdict.kind == ("proven" if same else "different"), verdict.reason
