"""Graph equivalence: whether two tensor functions compute the same values, proven or checked on random inputs.

`equivalent(f, g, *example_inputs) -> Verdict`. Input: two Python functions of Tensors and example Tensors that give
the inputs' shapes, dtypes and devices. Output: a Verdict whose kind is "proven", "numeric" or "different".
1. Proof. Both functions run on placeholder inputs (unrealized EMPTY buffers of the examples' shapes): nothing runs,
   only the lazy graphs are built. Each graph becomes one sympy expression for the output element at a symbolic
   position (i0, i1, ...): every movement op is folded into the index at which an input is read (the ShapeTracker's
   own index math, `to_indexed`), so an input read is `in0(3*i1 + i0)`; a reduce is a Sum / Product / ReduceMax of
   its body over fresh index variables (named by a hash of what the reduce computes), which makes `(a@b).T` and
   `b.T@a.T` the same Sum; constants are exact (see `_exact_constant`). sympy's own canonical forms do the rest:
   + and × chains flattened and sorted, constants folded, x − y as x + (−1)·y, x / y as x·y⁻¹, −(−x) = x. Equal
   expressions are proven; otherwise `simplify` of their difference, with exp/log/tanh rewritten into exp, must be 0,
   or, for small outputs, the difference at every output position (reduces expanded into their terms). A proof holds
   over the real numbers, wherever both sides are defined: float rounding is not modeled, so (a + b) + c and
   a + (b + c) are proven equal although their float32 results may differ in the last bit, and neither are IEEE
   overflow, inf and NaN: x / x is proven equal to 1, and tanh to its exp form, which overflows to NaN for x > 44 in
   float32. Casts that lose precision, comparisons, selects, integer division and bit ops stay uninterpreted
   functions, compared structurally.
2. Numbers. Without a proof both functions run on `trials` seeded random input sets (the first of edge values:
   zeros, ±1, small integers; then normal(0, 1) floats, small ints, random bools) on the examples' device, and the
   outputs are compared at `rtol`/`atol` (defaults per output dtype: DEFAULT_TOLERANCES; ints and bools exact; NaN
   equals NaN at the same place). Equal everywhere: "numeric" with the largest absolute error seen; else "different"
   with the first counterexample. Outputs of different shapes or dtypes are "different" before anything runs.
"""
from __future__ import annotations
import hashlib, math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
import numpy as np
import sympy
from tgrad.dtype import DType, dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops, UOp, simplify as simplify_index, truncate_to
from tgrad.shape.shapetracker import loop_index, unravel
from tgrad.tensor import Tensor

# (rtol, atol) of the numeric check per output dtype. float32: a few ulps (2^-23 ≈ 1.2e-7) of error per op over a
# short chain; float16 (2^-10 ≈ 1e-3 per op) and bfloat16 (2^-7) alike; float64 keeps 1e-10 for chains of a few
# hundred ops. Ints and bools compare exactly.
DEFAULT_TOLERANCES: dict[DType, tuple[float, float]] = {
  dtypes.float64: (1e-10, 1e-12), dtypes.float32: (1e-5, 1e-6), dtypes.float16: (1e-2, 1e-3),
  dtypes.bfloat16: (2e-2, 1e-2)}
EDGE_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, 0.25)   # the first trial's float values, repeated over the input
EDGE_INTS = (0, 1, -1, 2, -3, 5, 7, -8)
RANDOM_INT_RANGE = (-8, 9)   # [low, high) of random signed ints; unsigned ones draw from [0, high)
# sympy's steps grow with the expression (expand can multiply its size by 10, simplify takes minutes on a few
# thousand ops, e.g. gelu's erf polynomial): an expression bigger than this before a step is left to the numbers
MAX_SIMPLIFY_OPS = 300

@dataclass(frozen=True, eq=False)
class Counterexample:
  """Inputs (as numpy arrays) on which the functions' outputs differ, both outputs, and the first differing place."""
  inputs: tuple[np.ndarray, ...]
  f_outputs: tuple[np.ndarray, ...]
  g_outputs: tuple[np.ndarray, ...]
  output: int                 # which output differs
  position: tuple[int, ...]   # the first index where it differs
  differs: np.ndarray         # bool, the output's shape: where it differs beyond tolerance

@dataclass(frozen=True)
class Verdict:
  """kind: "proven" (equal as real-valued functions), "numeric" (equal on every trial, within tolerance) or
  "different". max_error: the largest absolute difference seen (0.0 when proven). Truthy unless different."""
  kind: str
  max_error: float
  counterexample: Optional[Counterexample]
  reason: str
  def __bool__(self) -> bool: return self.kind != "different"

def equivalent(f: Callable, g: Callable, *example_inputs: Tensor, trials: int = 8, seed: int = 0,
               rtol: Optional[float] = None, atol: Optional[float] = None, thorough: bool = True) -> Verdict:
  """Whether f and g compute the same outputs for inputs like `example_inputs` (see the module docstring).
  thorough=False: the proof only compares canonical forms (no sympy simplification, which takes ~0.5 s to fail on
  a small graph) before the numbers: for a caller checking many candidates."""
  for t in example_inputs:
    if not isinstance(t, Tensor): raise TypeError(f"equivalent: example inputs must be Tensors, got {type(t).__name__}")
  placeholders = [Tensor(LazyBuffer.loadop(Ops.EMPTY, t.shape, t.dtype, t.device)) for t in example_inputs]
  with Tensor.no_grad():
    f_outs, g_outs = _outputs(f, placeholders, "f"), _outputs(g, placeholders, "g")
  if (mismatch := _signature_mismatch(f_outs, g_outs)) is not None:
    return Verdict("different", math.inf, None, mismatch)
  proof = prove(f_outs, g_outs, [t.lazydata.base for t in placeholders], thorough)
  if proof is not None: return Verdict("proven", 0.0, None, proof)
  tolerances = [DEFAULT_TOLERANCES.get(o.dtype, (0.0, 0.0)) for o in f_outs]
  tolerances = [(r if rtol is None else rtol, a if atol is None else atol) for r, a in tolerances]
  return _compare_numerically(f, g, example_inputs, trials, seed, tolerances)

def _outputs(fn: Callable, inputs: Sequence[Tensor], name: str) -> tuple[Tensor, ...]:
  out = fn(*inputs)
  outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
  for o in outs:
    if not isinstance(o, Tensor): raise TypeError(f"equivalent: {name} must return Tensors, got {type(o).__name__}")
  return outs

def _signature_mismatch(f_outs: Sequence[Tensor], g_outs: Sequence[Tensor]) -> Optional[str]:
  if len(f_outs) != len(g_outs): return f"f returns {len(f_outs)} outputs, g returns {len(g_outs)}"
  for k, (a, b) in enumerate(zip(f_outs, g_outs)):
    if a.shape != b.shape: return f"output {k}: shapes differ: f gives {a.shape}, g gives {b.shape}"
    if a.dtype != b.dtype: return f"output {k}: dtypes differ: f gives {a.dtype}, g gives {b.dtype}"
  return None

# ---------------------------------------------------------------------------------------------------------------
# proof: each output as a sympy expression of one element at a symbolic position

class _Unprovable(Exception):
  """Raised for a graph the expression builder has no exact meaning for (a gather, an assign, a symbolic size)."""

# exact constants a float constant may be the rounding of: tgrad's composites write exp(x) as 2^(x·log2(e)),
# cos(x) as sin(π/2 − x), gelu with √(2/π), erf with 1/√2, ...
KNOWN_CONSTANTS = (sympy.log(2), 1 / sympy.log(2), sympy.log(10), 1 / sympy.log(10), sympy.log(2) / sympy.log(10),
                   sympy.log(10) / sympy.log(2), sympy.pi, sympy.pi / 2, 1 / sympy.pi, 2 * sympy.pi, sympy.sqrt(2),
                   1 / sympy.sqrt(2), sympy.sqrt(2 / sympy.pi), sympy.sqrt(sympy.pi), sympy.E, 1 / sympy.E)

def _exact_constant(value, dtype: DType) -> sympy.Expr:
  """The exact number a constant stands for. An int or bool is itself. A float is the known constant (KNOWN_CONSTANTS,
  either sign) whose rounding to `dtype` it is, else its exact binary value as a rational. The choice is a function of
  the rounded value alone, so equal constants always read as equal numbers."""
  if isinstance(value, UOp): raise _Unprovable("a symbolic constant")
  if isinstance(value, bool) or dtype.is_bool: return sympy.true if value else sympy.false
  if not dtype.is_float: return sympy.Integer(int(value))
  if not math.isfinite(value): return sympy.nan if math.isnan(value) else (sympy.oo if value > 0 else -sympy.oo)
  if value != 0 and value != int(value):
    for known in KNOWN_CONSTANTS:
      if truncate_to(float(known), dtype) == abs(value): return known if value > 0 else -known
  return sympy.Rational(value)

def _index_to_sympy(u: UOp, symbols: dict[UOp, sympy.Symbol]) -> sympy.Expr:
  """An index UOp (loop variables, +, ×, //, %, <, ...) as a sympy integer expression or condition."""
  if u.op is Ops.CONST: return sympy.true if u.arg is True else sympy.false if u.arg is False else sympy.Integer(u.arg)
  if u.op is Ops.RANGE: return symbols[u]
  src = [_index_to_sympy(s, symbols) for s in u.src]
  if u.op is Ops.ADD: return src[0] + src[1]
  if u.op is Ops.MUL: return src[0] * src[1]
  if u.op is Ops.NEG: return -src[0]
  if u.op in (Ops.IDIV, Ops.MOD) and u.src[0].vmin >= 0 and u.src[1].op is Ops.CONST and u.src[1].arg > 0:
    return sympy.floor(src[0] / src[1]) if u.op is Ops.IDIV else sympy.Mod(src[0], src[1])
  if u.op is Ops.MAX: return sympy.Max(src[0], src[1])
  if u.op is Ops.CMPLT: return sympy.Le(src[0], src[1] - 1)   # integers: a < b is a <= b - 1, which sympy folds better
  if u.op is Ops.CMPNE: return sympy.Not(src[0]) if u.src[1].op is Ops.CONST and u.src[1].arg is True else \
    sympy.Ne(src[0], src[1])
  if u.op is Ops.AND: return sympy.And(src[0], src[1])
  if u.op is Ops.OR: return sympy.Or(src[0], src[1])
  if u.op is Ops.WHERE: return sympy.Piecewise((src[1], src[0]), (src[2], True))
  raise _Unprovable(f"index op {u.op}")

def _opaque(name: str, *args: sympy.Expr, commutative: bool = False) -> sympy.Expr:
  """An uninterpreted function application: equal only to itself (its arguments sorted when it commutes)."""
  if commutative: args = tuple(sorted(args, key=sympy.default_sort_key))
  return sympy.Function(name)(*args)

def _as_number(x: sympy.Expr) -> sympy.Expr:
  """A bool read as a number (an arithmetic op on bools is rare: they use OR/AND)."""
  return sympy.Piecewise((1, x), (0, True)) if isinstance(x, sympy.logic.boolalg.Boolean) else x

_ARITHMETIC: dict[Ops, Callable[..., sympy.Expr]] = {
  Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.NEG: lambda a: -a, Ops.RECIP: lambda a: 1 / a,
  Ops.FDIV: lambda a, b: a / b, Ops.EXP2: lambda a: sympy.exp(a * sympy.log(2)),
  Ops.LOG2: lambda a: sympy.log(a) / sympy.log(2), Ops.SQRT: sympy.sqrt, Ops.SIN: sympy.sin,
  Ops.MAX: lambda a, b: sympy.Max(a, b)}
_EXACT_WIDENINGS = {(dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float64),
                    (dtypes.float32, dtypes.float64), (dtypes.bfloat16, dtypes.float32),
                    (dtypes.bfloat16, dtypes.float64)}

def _cast_is_exact(source: DType, target: DType) -> bool:
  """Whether every value of `source` is a value of `target` (so the cast is the identity on numbers)."""
  if (source, target) in _EXACT_WIDENINGS: return True
  if source.is_int and target.is_int: return dtypes.min(target) <= dtypes.min(source) and \
    dtypes.max(source) <= dtypes.max(target)
  return False

# ops whose exact meaning the prover does not model (selects, comparisons, C division, shifts): compared structurally
_UNINTERPRETED = {Ops.CMPLT, Ops.WHERE, Ops.IDIV, Ops.MOD, Ops.TRUNC, Ops.SHL, Ops.SHR}
REDUCE_NAME_DIGITS = 12   # hex digits of a reduce variable's content hash (48 bits: a collision is never expected)

class _ExpressionBuilder:
  """Builds the sympy expression of a lazy value at given index UOps (one per dim of its shape). Inputs are the
  functions in0, in1, ... of a flat index; other leaves (realized tensors, host data) are functions named by their
  buffer or data, so the same leaf in both graphs is the same function."""
  def __init__(self, inputs: Sequence[LazyBuffer]):
    self.input_names = {id(lb): f"in{k}" for k, lb in enumerate(inputs)}
    self.symbols: dict[UOp, sympy.Symbol] = {}
    self.reduce_count = 0
    self.memo: dict[tuple, sympy.Expr] = {}

  def output(self, lb: LazyBuffer) -> sympy.Expr:
    idxs = tuple(loop_index(d, s) for d, s in enumerate(lb.shape))
    for d, idx in enumerate(idxs): self.symbols[idx] = sympy.Symbol(f"i{d}", integer=True, nonnegative=True)
    return self.value(lb, idxs)

  def value(self, lb: LazyBuffer, idxs: tuple[UOp, ...]) -> sympy.Expr:
    if any(isinstance(s, UOp) for s in lb.shape): raise _Unprovable("a symbolic shape")
    key = (id(lb), idxs)
    if (known := self.memo.get(key)) is not None: return known
    if lb.is_base: out = self._base_value(lb, idxs)
    else:
      index, valid = lb.st.to_indexed(idxs)
      base = lb.base
      out = self._base_value(base, tuple(simplify_index(i) for i in unravel(index, base.shape)))
      if not (valid.op is Ops.CONST and valid.arg is True):   # padding reads 0
        out = sympy.Piecewise((out, _index_to_sympy(valid, self.symbols)), (0, True))
    self.memo[key] = out
    return out

  def _leaf(self, name: str, lb: LazyBuffer, idxs: tuple[UOp, ...]) -> sympy.Expr:
    return sympy.Function(name)(_index_to_sympy(_flat_index(idxs, lb.shape), self.symbols))

  def _base_value(self, lb: LazyBuffer, idxs: tuple[UOp, ...]) -> sympy.Expr:
    if (name := self.input_names.get(id(lb))) is not None: return self._leaf(name, lb, idxs)
    if lb.buffer is not None: return self._leaf(f"buffer{id(lb.buffer)}", lb, idxs)
    op = lb.op
    if op is Ops.CONST: return _exact_constant(lb.arg, lb.dtype)
    if op is Ops.COPY and not lb.srcs:   # host data: named by its contents
      digest = hashlib.sha256(np.ascontiguousarray(lb.arg).tobytes() + str(lb.dtype).encode()).hexdigest()[:16]
      return self._leaf(f"data{digest}", lb, idxs)
    if op in (Ops.CONTIGUOUS, Ops.COPY): return self.value(lb.srcs[0], idxs)
    if op is Ops.ARANGE:
      return _index_to_sympy(_flat_index(idxs, lb.shape), self.symbols)
    if op is Ops.REDUCE_AXIS: return self._reduce(lb, idxs)
    if op is Ops.CAST:
      source = lb.srcs[0]
      inner = self.value(source, idxs)
      return inner if _cast_is_exact(source.dtype, lb.dtype) else _opaque(f"cast_{lb.dtype.name}", inner)
    if op is Ops.BITCAST: return _opaque(f"bitcast_{lb.dtype.name}", self.value(lb.srcs[0], idxs))
    srcs = [self.value(s, idxs) for s in lb.srcs]
    numeric = lb.dtype.is_float or (lb.dtype.is_int and op in (Ops.ADD, Ops.MUL, Ops.NEG))   # ints: a ring mod 2^n
    if op in _ARITHMETIC and numeric: return _ARITHMETIC[op](*[_as_number(s) for s in srcs])
    if op is Ops.MAX and lb.dtype.is_int: return sympy.Max(*srcs)
    if op in (Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR) or (op is Ops.MAX and lb.dtype.is_bool):
      return _opaque(op.name.lower(), *srcs, commutative=True)
    if op in _UNINTERPRETED: return _opaque(f"{op.name.lower()}_{lb.dtype.name}", *srcs)
    raise _Unprovable(f"no exact meaning for {op}")

  def _reduce(self, lb: LazyBuffer, idxs: tuple[UOp, ...]) -> sympy.Expr:
    """A reduce at `idxs`: its body over fresh variables along the reduced axes, summed (multiplied; a max or a
    log Σ exp is an uninterpreted function of the body, named after its op)."""
    source = lb.srcs[0]
    op, axes = lb.arg[:2]
    source_idxs, bounds = list(idxs), []
    for d in axes:
      var = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), UOp.const(dtypes.index, source.shape[d])),
                arg=("reduce", self.reduce_count))
      symbol = self.symbols[var] = sympy.Symbol(f"t{self.reduce_count}", integer=True, nonnegative=True)
      self.reduce_count += 1
      source_idxs[d] = var
      bounds.append((symbol, 0, source.shape[d] - 1))
    body = self.value(source, tuple(source_idxs))
    # each variable is named after what its reduce computes (op, sizes and the body with placeholders for the
    # variables): two reduces of the same thing bind the same names, in whatever order they were met
    placeholders = {t: sympy.Symbol(f"_{k}") for k, (t, _, _) in enumerate(bounds)}
    content = f"{op.name}{[hi for _, _, hi in bounds]}{sympy.srepr(body.xreplace(placeholders))}"
    digest = hashlib.sha256(content.encode()).hexdigest()[:REDUCE_NAME_DIGITS]
    names = {t: sympy.Symbol(f"r{digest}_{k}", integer=True, nonnegative=True) for k, (t, _, _) in enumerate(bounds)}
    body, bounds = body.xreplace(names), [(names[t], lo, hi) for t, lo, hi in bounds]
    if op is Ops.ADD: return sympy.Sum(body, *bounds)
    if op is Ops.MUL: return sympy.Product(body, *bounds)
    return _opaque(f"reduce_{op.name.lower()}", body, *(b[0] for b in bounds))   # MAX, LOGADDEXP: uninterpreted

def _flat_index(idxs: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  """The row-major position of per-dim indices in a buffer of `shape`, simplified."""
  flat, step = UOp.const(dtypes.index, 0), 1
  for idx, size in zip(reversed(idxs), reversed(shape)):
    flat = flat + idx * step
    step *= size
  return simplify_index(flat)

def prove(f_outs: Sequence[Tensor], g_outs: Sequence[Tensor], inputs: Sequence[LazyBuffer],
          thorough: bool = True) -> Optional[str]:
  """How f's and g's outputs (built on the placeholder `inputs`) were proven equal, or None without a proof;
  thorough=False stops after comparing canonical forms."""
  how = "canonical forms are equal"
  for a, b in zip(f_outs, g_outs):
    try:
      fe = _ExpressionBuilder(inputs).output(a.lazydata)
      ge = _ExpressionBuilder(inputs).output(b.lazydata)
      if fe == ge: continue
      if not thorough: return None if fe - ge != 0 else how
      difference = (fe - ge).rewrite(sympy.exp)
      if difference == 0: continue
      if _is_zero(difference): how = "sympy simplifies the difference to 0"
      elif _is_zero_at_every_position(difference, a.shape): how = "the difference is 0 at every output position"
      else: return None
    except Exception: return None   # no exact meaning for an op (_Unprovable), a graph too deep, a sympy failure
  return how

def _is_zero(expr: sympy.Expr, steps: tuple = (sympy.expand, sympy.cancel, sympy.simplify)) -> bool:
  """Whether sympy can show expr == 0: cheap canonical steps first, then `simplify`."""
  for step in steps:
    if sympy.count_ops(expr) > MAX_SIMPLIFY_OPS: return False
    # simplify's sum rules take seconds on a softmax-sized difference (10 s for attention scores): sums are left to
    # the case split
    if step is sympy.simplify and expr.has(sympy.Sum, sympy.Product): return False
    try: expr = step(expr)
    except Exception: return False   # sympy's steps raise many kinds of errors on odd input: no proof, never a crash
    if expr == 0: return True
  return False

# A case split over output positions (each index variable replaced by each of its values, reduces expanded into
# their terms) proves what sympy can't see symbolically: pieces of a concatenation, a scale pulled out of a Sum, a
# sum over two axes against two sums. It costs one simplification per position: only for outputs this small.
MAX_CASE_SPLIT_POSITIONS = 64

def _is_zero_at_every_position(expr: sympy.Expr, shape: tuple[int, ...]) -> bool:
  if math.prod(shape) > MAX_CASE_SPLIT_POSITIONS: return False
  symbols = {s.name: s for s in expr.free_symbols}
  for position in np.ndindex(*shape):
    point = expr.subs({symbols[f"i{d}"]: v for d, v in enumerate(position) if f"i{d}" in symbols}).doit()
    if point != 0 and not _is_zero(point, (sympy.expand, sympy.cancel)): return False
  return True

# ---------------------------------------------------------------------------------------------------------------
# numeric comparison on seeded random inputs

def _trial_input(example: Tensor, rng: np.random.Generator, edge: bool) -> np.ndarray:
  shape, dtype = example.shape, example.dtype
  if dtype.is_bool: values = rng.random(shape) < 0.5 if not edge else np.resize([False, True], shape)
  elif dtype.is_int:
    if edge: values = np.resize(np.array([abs(v) if dtype.is_unsigned else v for v in EDGE_INTS]), shape)
    else: values = rng.integers(0 if dtype.is_unsigned else RANDOM_INT_RANGE[0], RANDOM_INT_RANGE[1], shape)
  else: values = np.resize(np.array(EDGE_FLOATS), shape) if edge else rng.standard_normal(shape)
  return np.asarray(values).astype(np.float32 if dtype == dtypes.bfloat16 else dtype.np)

def _run(fn: Callable, arrays: Sequence[np.ndarray], examples: Sequence[Tensor]) -> tuple[np.ndarray, ...]:
  with Tensor.no_grad():
    inputs = [Tensor(a, dtype=e.dtype, device=e.device) for a, e in zip(arrays, examples)]
    outs = _outputs(fn, inputs, "the function")
    return tuple(o.float().numpy() if o.dtype == dtypes.bfloat16 else o.numpy() for o in outs)

def _mismatch(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[np.ndarray, float]:
  """(where a and b differ beyond tolerance, the largest absolute difference where both are finite)."""
  if a.dtype.kind in "biu":
    bad = a != b
    error = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
  else:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bad = ~np.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
    finite = np.isfinite(a64) & np.isfinite(b64)
    error = float(np.max(np.abs(a64 - b64)[finite], initial=0.0))
  return np.asarray(bad), error

def _compare_numerically(f: Callable, g: Callable, examples: Sequence[Tensor], trials: int, seed: int,
                         tolerances: Sequence[tuple[float, float]]) -> Verdict:
  """Both functions on `trials` input sets; `tolerances` holds (rtol, atol) per output."""
  rng = np.random.default_rng(seed)
  max_error = 0.0
  for trial in range(trials):
    arrays = tuple(_trial_input(e, rng, edge=trial == 0) for e in examples)
    f_outs, g_outs = _run(f, arrays, examples), _run(g, arrays, examples)
    for k, (a, b) in enumerate(zip(f_outs, g_outs)):
      if a.shape != b.shape:
        return Verdict("different", math.inf, None, f"output {k}: shapes differ: {a.shape} and {b.shape}")
      differs, error = _mismatch(a, b, *tolerances[k])
      max_error = max(max_error, error)
      if differs.any():
        position = tuple(int(i) for i in np.argwhere(differs)[0])
        example = Counterexample(arrays, f_outs, g_outs, k, position, differs)
        return Verdict("different", max_error, example,
                       f"output {k} differs at {position} in trial {trial}: f gives {a[position]!r}, g {b[position]!r}")
  return Verdict("numeric", max_error, None, f"no proof; equal within tolerance on {trials} random input sets")
