"""Symbolic sizes: a dimension, stride, offset or mask bound is an `int` or an index UOp over variables (a `sint`).

Above the scheduler a symbolic size holds BINDs (a variable with its value, `Variable("n", 1, 64).bind(5)`); in a
kernel AST it holds the bare DEFINE_VARs. Every expression is kept in the `symbolic` simplifier's canonical form, so
two equal sizes built the same way are the same (hash-consed) UOp and `==` on sizes is identity. Comparisons that
must hold for every value use the bounds (`vmin`/`vmax`): `definitely_le`, `sym_eq`. `evaluate` gives the value for
given variable values, `unbind` splits the BINDs out of a size.
"""
from __future__ import annotations
import functools
from typing import Any, Optional, Union
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, simplify, exec_alu, split_terms, build_sum

sint = Union[int, UOp]

def canonical(x: sint) -> sint:
  """An int stays; an index UOp is simplified, and becomes an int when it is a constant."""
  if isinstance(x, UOp):
    x = simplify(x) if x.op not in (Ops.DEFINE_VAR, Ops.BIND) else x
    return x.arg if x.op is Ops.CONST else x
  return x

def canonical_product(x: UOp) -> sint:
  """A product of sizes in one form whatever the order of its factors: the factors under its MULs (sums and other
  expressions are single factors), the symbolic ones sorted by key, times the product of the ints. So 14·(n+1)·(n+3)
  and 7·(n+3)·(n+1)·2 are the same UOp (the simplifier alone would distribute 14·(n+1) and lose the factor)."""
  coefficient, factors, pending = 1, [], [x]
  while pending:
    u = pending.pop()
    if u.op is Ops.MUL: pending.extend(u.src)
    elif u.op is Ops.CONST: coefficient *= u.arg
    else: factors.append(canonical(u))
  if coefficient == 0: return 0
  product: Optional[UOp] = None
  for f in sorted(factors, key=lambda f: f.key):
    if isinstance(f, int): coefficient *= f
    else: product = f if product is None else UOp(Ops.MUL, f.dtype, (product, f))
  return coefficient if product is None else canonical(product * coefficient)

def is_symbolic(shape) -> bool: return any(isinstance(s, UOp) for s in shape)
def to_uop(x: sint) -> UOp: return x if isinstance(x, UOp) else UOp.const(dtypes.index, x)
def offset_by(index: UOp, delta: int) -> UOp:
  """index + delta, with the constant folded into index's own sum (replicas of a kernel differ by such constants)."""
  return index if delta == 0 else _offset_by(index, delta)

# The replicas of a register tile and the candidates of one BEAM search offset the same indices again and again
OFFSET_MEMO = 1 << 16

@functools.lru_cache(maxsize=OFFSET_MEMO)
def _offset_by(index: UOp, delta: int) -> UOp:
  terms, constant = split_terms(index)
  return build_sum(terms, constant + delta, index.dtype)
def vmax_of(x: sint) -> int: return x.vmax if isinstance(x, UOp) else x
def vmin_of(x: sint) -> int: return x.vmin if isinstance(x, UOp) else x

def sym_eq(a: sint, b: sint) -> Optional[bool]:
  """True when a == b for every value of the variables, False when never, None when it depends."""
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a == b
  if a is b: return True
  diff = canonical(to_uop(a) - to_uop(b))
  if isinstance(diff, int): return diff == 0
  return False if diff.vmin > 0 or diff.vmax < 0 else None

def definitely_le(a: sint, b: sint) -> bool:
  """a <= b for every value of the variables: from the bounds of b - a, else, where b is a size rounded to a
  multiple (the padding of a guarded split), from what it is at least."""
  if not isinstance(a, UOp) and not isinstance(b, UOp): return a <= b
  if vmin_of(canonical(to_uop(b) - to_uop(a))) >= 0: return True
  return (lower := _rounded_lower_bound(b)) is not None and definitely_le(a, lower)

def _rounded_lower_bound(x: sint) -> Optional[sint]:
  """For x = ((y + c) // d) * d (ceil_div(y, d) * d when c = d - 1), the bound x >= y + c - (d - 1); else None. The
  bounds alone can't see it: ceil(n/64)*64 - n spans [64 - 4096, 4095] for n in [1, 4096]."""
  if not isinstance(x, UOp) or x.op is not Ops.MUL or x.src[0].op is not Ops.IDIV: return None
  divided, multiple = x.src[0], x.src[1]
  divisor = divided.src[1]
  if multiple.op is not Ops.CONST or divisor.op is not Ops.CONST or multiple.arg != divisor.arg or divisor.arg < 1:
    return None
  return canonical(divided.src[0] - (divisor.arg - 1))

def smax(a: sint, b: sint) -> sint:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return max(a, b)
  if definitely_le(b, a): return a
  if definitely_le(a, b): return b
  return canonical(to_uop(a).maximum(to_uop(b)))

def smin(a: sint, b: sint) -> sint:
  if not isinstance(a, UOp) and not isinstance(b, UOp): return min(a, b)
  if definitely_le(a, b): return a
  if definitely_le(b, a): return b
  return canonical((to_uop(a) * -1).maximum(to_uop(b) * -1) * -1)

def divides(amount: int, size: sint) -> bool:
  """Whether `amount` divides `size` for every value of its variables (4 divides n*64, not n)."""
  return canonical(size % amount) == 0

def ceil_div(a: sint, b: int) -> sint:
  """ceil(a / b) for a >= 0 and b > 0."""
  return -(-a // b) if not isinstance(a, UOp) else canonical((a + (b - 1)) // b)

def variables_of(x: sint) -> list[UOp]:
  """The DEFINE_VARs in a size (under its BINDs too), in a fixed order."""
  if not isinstance(x, UOp): return []
  return sorted({u for u in x.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])

@functools.lru_cache(maxsize=1 << 14)
def _unbind_uop(x: UOp) -> tuple[UOp, tuple[tuple[str, int], ...]]:
  binds = [u for u in x.toposort() if u.op is Ops.BIND]
  if not binds: return x, ()
  return x.substitute({b: b.src[0] for b in binds}), tuple(sorted((b.src[0].arg[0], b.src[1].arg) for b in binds))

def unbind(x: sint) -> tuple[sint, dict[str, int]]:
  """(x with each BIND replaced by its variable, {variable name: bound value})."""
  if not isinstance(x, UOp): return x, {}
  unbound, values = _unbind_uop(x)
  return unbound, dict(values)

def bind_values(x: sint, var_vals: dict[str, int]) -> sint:
  """A size with each variable named in `var_vals` bound to that value (a bound one is rebound)."""
  if not isinstance(x, UOp): return x
  x = unbind(x)[0]
  found = {u: u.bind(var_vals[u.arg[0]]) for u in x.toposort() if u.op is Ops.DEFINE_VAR and u.arg[0] in var_vals}
  return x.substitute(found) if found else x

# An expression's evaluation steps, made once per expression (the hash-consed UOp): a symbolic program's launches
# evaluate the same few sizes (a grid, a split count) at every replay, where walking the graph again cost most of it.
EVALUATION_PLANS = 4096

@functools.lru_cache(maxsize=EVALUATION_PLANS)
def _evaluation_plan(x: UOp) -> tuple[tuple, tuple]:
  """(steps, binds): per node of x, children first (x last), (op, dtype, arg, indices of its sources); and the
  (name, value) of each BIND below x."""
  nodes = x.toposort()
  index = {id(u): i for i, u in enumerate(nodes)}
  steps = tuple((u.op, u.dtype, u.src[1].arg if u.op is Ops.BIND else u.arg, tuple(index[id(s)] for s in u.src))
                for u in nodes)
  return steps, tuple((u.src[0].arg[0], u.src[1].arg) for u in nodes if u.op is Ops.BIND)

def evaluate(x: sint, var_vals: Optional[dict[str, int]] = None) -> int:
  """The value of a size with the variables at `var_vals` (a BIND brings its own value)."""
  if not isinstance(x, UOp): return x
  steps, binds = _evaluation_plan(x)
  if binds: var_vals = {**(var_vals or {}), **dict(binds)}
  values: list[Any] = []
  for op, dtype, arg, sources in steps:
    if op is Ops.CONST or op is Ops.BIND: values.append(arg)
    elif op is Ops.DEFINE_VAR:
      if var_vals is None or arg[0] not in var_vals:
        raise ValueError(f"the value of variable {arg[0]!r} is needed to evaluate {x.render()}")
      values.append(var_vals[arg[0]])
    else: values.append(exec_alu(op, dtype, tuple(values[i] for i in sources)))
  return values[-1]

def to_sympy(x: sint):
  """A size as a sympy expression (variables are integer sympy Symbols of their names): for showing and evaluating
  memory as a function of the variables. sympy is imported only here."""
  import sympy
  if not isinstance(x, UOp): return sympy.Integer(x)
  values: dict[UOp, Any] = {}
  for u in unbind(x)[0].toposort():
    s = [values[v] for v in u.src]
    if u.op is Ops.CONST: values[u] = sympy.Integer(u.arg)
    elif u.op is Ops.DEFINE_VAR: values[u] = sympy.Symbol(u.arg[0], integer=True, nonnegative=True)
    elif u.op is Ops.ADD: values[u] = s[0] + s[1]
    elif u.op is Ops.MUL: values[u] = s[0] * s[1]
    elif u.op is Ops.NEG: values[u] = -s[0]
    elif u.op is Ops.IDIV: values[u] = sympy.floor(s[0] / s[1])   # sizes are nonnegative: C division is floor
    elif u.op is Ops.MOD: values[u] = sympy.Mod(s[0], s[1])
    elif u.op is Ops.MAX: values[u] = sympy.Max(s[0], s[1])
    else: raise ValueError(f"no sympy form for {u.op} in the size {x.render()}")
  return values[unbind(x)[0]]

def render(x: sint) -> str: return x.render() if isinstance(x, UOp) else str(x)

def Variable(name: str, min_value: int, max_value: int) -> UOp:
  """A symbolic size `name` in [min_value, max_value]; `.bind(value)` makes it stand for one value (a BIND), which
  can be used as a dimension (reshape, shrink, pad, slices, Tensor.empty/zeros/ones/full)."""
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f"a Variable's name must be an identifier, got {name!r}")
  if any(isinstance(b, bool) or not isinstance(b, int) for b in (min_value, max_value)) or \
     not 0 <= min_value <= max_value:
    raise ValueError(f"Variable {name!r} needs int bounds 0 <= min <= max, got [{min_value}, {max_value}]")
  return UOp.variable(name, min_value, max_value)
