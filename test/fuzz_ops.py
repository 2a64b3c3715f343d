"""A fuzz run at scale: random chains of tensor ops built in tgrad, mirrored in numpy, realized and compared.

    python test/fuzz_ops.py --seed 0 --cases 10000 [--device LLVM|CUDA] [--start I] [--case I] [--max-seconds S]

A case is a short chain of values `v0, v1, ...`: leaves made from seeded numpy arrays or by tgrad's constructors
(shapes with 0, 1, odd and a few large sizes; float32, float16, int32, int8, uint8, bool, int64; floats sometimes
holding NaN, ±inf and -0.0), then movement ops, basic and tensor indexing, gather, x[i] = y, elementwise math,
comparisons, where, casts, reductions and matmuls, each written once as tgrad code and once as its numpy mirror (the
`R` functions below, which state tgrad's documented semantics). The last value (sometimes with an earlier one) is
realized and compared with the mirror: dtype and shape exactly, integers and bools exactly, floats exactly where the
generator knows the math is exact, else within an error bound it carries along the chain (see `Value`). Case i of
seed s draws from its own random streams, so `--seed s --case i` replays exactly that case, and a failure is printed
as runnable tgrad code: the shortest prefix of the chain that already fails. A summary counts cases, passes and
failures by category (the op that first goes wrong) and kind (exception, dtype, shape, value; "reference" is a
mistake of the fuzzer itself), with the rate in cases/s.

Semantics mirrored (tgrad's `Ops` docstring and docs/design-notes.md): numpy's type promotion with weak Python
scalars (an int tensor plus 2.5 is float32, a bool tensor plus 2 is int32); integer + - * wrap; `//` and `%` round
toward -inf and give 0 for a zero divisor, INT_MIN // -1 wraps; shifts by amounts outside [0, bits) shift out every
bit; float functions of int tensors compute in float32; sums and products of bools and signed ints are int64
(uint64 for unsigned), as numpy's, float16 reduces accumulate in float32. Inputs stay where tgrad's answer is defined:
float to int casts only of values in range, Python scalars inside the tensor's dtype, indices inside their axis.

On a GPU: `--device CUDA` (everything else is the same; split long runs with --start/--cases or --max-seconds).
Without a GPU, `--cuda-codegen-check` also renders and NVRTC-compiles every kernel for sm_90. Not collected by
pytest (the name has no test_ prefix); test/test_fuzz_smoke.py runs a few dozen cases in CI.
"""
from __future__ import annotations
import argparse, collections, faulthandler, math, os, random, sys, tempfile, time, traceback, types, warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
import numpy as np

# ---------------------------------------------------------------------------------------------------------------
# limits: small enough that a case costs a few kernel compiles, big enough to cross vector widths and tile sizes

MAX_NUMEL = 4096              # elements of any value in an ordinary case
BIG_NUMEL = 1 << 20           # ... in a big case
BIG_CASE_FRACTION = 0.04      # share of cases with one big leaf (few ops apply: no O(n^2) gathers)
MAX_STEPS = 6                 # ops per chain after the first leaf
GATHER_COST_LIMIT = 1 << 16   # gathers cost (indexed elements x axis length) in the one-hot compare
MATMUL_COST_LIMIT = 1 << 18   # multiply-adds of one matmul in an ordinary case (big: x16)
SAFE_FLOAT_BOUND = {"float16": 1000.0, "float32": 1e15, "float64": 1e100}   # |values| kept far below overflow
EXP_INPUT_LIMIT = {"float16": 6.0, "float32": 30.0, "float64": 30.0}        # exp only of values this small
RUNNER_CACHE_CASES = 500      # drop the compiled kernels this often (an MCJIT engine each; cases rarely share them)
SIGNIFICAND_BITS = {"float16": 11, "float32": 24, "float64": 53}
ROUNDING_ULPS = 2             # fresh error of one rounded op, in units of roundoff of the result's bound
TRANSCENDENTAL_ULPS = 8       # ... of exp/log/sin/sigmoid (tgrad's polynomials are within 4 ulp)
TOLERANCE_SAFETY = 4          # the carried error bound times this is the absolute tolerance at the end
RELATIVE_ULPS = 16            # plus this many units of roundoff of each expected element
CONSTRUCTOR_FRACTION = 0.12   # leaves made by Tensor.full / arange / eye / zeros / ones instead of from data
SPECIAL_FRACTION = 0.12       # float leaves with NaN, ±inf and -0.0 among their elements
BASE_DTYPES = ["float32", "float32", "float16", "int32", "int8", "uint8", "bool", "int64"]
CATEGORY_WEIGHTS = {"movement": 26, "slice": 8, "index": 7, "unary": 14, "binary": 18, "compare": 8, "cast": 8,
                    "reduce": 12, "matmul": 5, "assign": 4, "composite": 5}

# ---------------------------------------------------------------------------------------------------------------
# dtypes and promotion, as tgrad documents them (numpy's table; Python scalars are weak)

def is_float(dt: str) -> bool: return np.dtype(dt).kind == 'f'
def is_int(dt: str) -> bool: return np.dtype(dt).kind in 'iu'
def is_unsigned(dt: str) -> bool: return np.dtype(dt).kind == 'u'
def int_limits(dt: str) -> tuple[int, int]:
  if dt == "bool": return 0, 1
  info = np.iinfo(dt)
  return int(info.min), int(info.max)
def roundoff(dt: str) -> float: return 2.0 ** -SIGNIFICAND_BITS[dt] if is_float(dt) else 0.0

def weak_scalar_dtype(tensor_dtype: str, scalar) -> str:
  """The dtype of `tensor op scalar`: the tensor's, unless the scalar's kind is higher."""
  if isinstance(scalar, bool): return tensor_dtype
  if isinstance(scalar, int): return "int32" if tensor_dtype == "bool" else tensor_dtype
  return tensor_dtype if is_float(tensor_dtype) else "float32"

def result_dtype(a: str, b) -> str:
  """a is a tensor dtype; b another tensor dtype (a str) or a Python scalar."""
  return np.promote_types(a, b).name if isinstance(b, str) else weak_scalar_dtype(a, b)

def float_of(dt: str) -> str: return dt if is_float(dt) else "float32"

def sum_dtype(dt: str) -> str:
  """numpy's: bools and signed ints sum to int64, unsigned ints to uint64 (docs/design-notes.md)."""
  if dt == "bool" or dt in ("int8", "int16", "int32", "int64"): return "int64"
  return "uint64" if dt in ("uint8", "uint16", "uint32", "uint64") else dt

def accumulate_dtype(dt: str) -> str: return "float32" if dt == "float16" else dt

# ---------------------------------------------------------------------------------------------------------------
# R: the numpy mirror of each tgrad op (reference semantics; never tgrad code)

def _python_scalar_dtype(values) -> str:
  if any(isinstance(v, float) for v in values): return "float32"
  return "int32" if any(isinstance(v, int) and not isinstance(v, bool) for v in values) else "bool"

def _array(x):
  """numpy scalars (what numpy returns for 0-d results) as 0-d arrays; Python scalars stay Python scalars."""
  return np.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else x

def _operand_dtype(a, b) -> str:
  a, b = _array(a), _array(b)
  if isinstance(a, np.ndarray) and isinstance(b, np.ndarray): return np.promote_types(a.dtype, b.dtype).name
  if isinstance(a, np.ndarray): return weak_scalar_dtype(a.dtype.name, b)
  if isinstance(b, np.ndarray): return weak_scalar_dtype(b.dtype.name, a)
  return _python_scalar_dtype([a, b])

_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
            "ne": np.not_equal}
_BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}

def ref_binary(op: str, a, b) -> np.ndarray:
  a, b = _array(a), _array(b)
  dt = _operand_dtype(a, b)
  a, b = np.asarray(a, dtype=dt), np.asarray(b, dtype=dt)
  if op in _COMPARE: return _COMPARE[op](a, b)
  if op in _BITWISE: return _BITWISE[op](a, b)
  if dt == "bool" and op in ("floordiv", "mod", "lshift", "rshift", "pow"): a, b, dt = a.astype("int32"), b.astype(
    "int32"), "int32"
  if op == "add": return np.logical_or(a, b) if dt == "bool" else a + b
  if op == "sub": return a - b
  if op == "mul": return np.logical_and(a, b) if dt == "bool" else a * b
  if op == "div": return a.astype(float_of(dt)) / b.astype(float_of(dt))
  # floats as numpy and torch: from the exact fmod (tgrad's float_divmod), so 2.0**40 % 3.0 is 1 and 7 // -inf is -1
  if op == "floordiv": return np.floor_divide(a, b)
  if op == "mod": return np.mod(a, b)
  if op == "maximum": return np.logical_or(a, b) if dt == "bool" else np.maximum(a, b)
  if op == "minimum": return np.logical_and(a, b) if dt == "bool" else np.minimum(a, b)
  if op == "lshift": return np.left_shift(a, b)     # numpy: amounts outside [0, bits) shift out every bit
  if op == "rshift": return np.right_shift(a, b)
  if op == "pow": return np.power(a, b)
  raise ValueError(f"unknown binary op {op}")

_FLOAT_FUNCTIONS: dict[str, Callable] = {
  "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos,
  "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "reciprocal": lambda x: 1 / x}

def ref_float_function(name: str, x: np.ndarray) -> np.ndarray:
  """A float function of x (ints compute in float32), evaluated in float64 and rounded to the result dtype."""
  x = np.asarray(x)
  return _FLOAT_FUNCTIONS[name](x.astype(np.float64)).astype(float_of(x.dtype.name))

def ref_unary(name: str, x: np.ndarray) -> np.ndarray:
  x = np.asarray(x)
  dt = x.dtype.name
  if name == "neg": return -x
  if name == "abs": return x if dt == "bool" else np.abs(x)
  if name == "relu": return np.maximum(x, np.asarray(0, dtype=dt))
  if name in ("floor", "ceil", "trunc", "round"): return getattr(np, name)(x) if is_float(dt) else x
  if name == "sign":
    if dt == "bool": return x
    return np.sign(x) if not is_unsigned(dt) else (x > 0).astype(dt)
  if name == "logical_not": return np.logical_not(x)
  if name == "bitwise_not": return np.invert(x)
  if name == "isnan": return np.isnan(x) if is_float(dt) else np.zeros(x.shape, bool)
  if name == "square": return ref_binary("mul", x, x)
  raise ValueError(f"unknown unary op {name}")

def _axes(x: np.ndarray, axis) -> tuple[int, ...]:
  if axis is None: return tuple(range(x.ndim))
  return tuple(a % x.ndim for a in (axis if isinstance(axis, tuple) else (axis,)))

def ref_sum(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  out = sum_dtype(x.dtype.name)
  acc = accumulate_dtype(out)
  return np.sum(x.astype(acc), axis=axis, dtype=acc, keepdims=keepdim).astype(out)

def ref_prod(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  out = sum_dtype(x.dtype.name)
  acc = accumulate_dtype(out)
  return np.prod(x.astype(acc), axis=axis, dtype=acc, keepdims=keepdim).astype(out)

def ref_max(x: np.ndarray, axis, keepdim: bool) -> np.ndarray: return np.max(x, axis=axis, keepdims=keepdim)
def ref_min(x: np.ndarray, axis, keepdim: bool) -> np.ndarray: return np.min(x, axis=axis, keepdims=keepdim)

def ref_mean(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  out = float_of(x.dtype.name)
  acc = accumulate_dtype(out)
  count = math.prod(x.shape[a] for a in _axes(x, axis))
  total = np.sum(x.astype(acc), axis=axis, dtype=acc, keepdims=keepdim)
  return (total / np.asarray(count, dtype=acc)).astype(out)

def ref_any(x: np.ndarray, axis, keepdim: bool) -> np.ndarray: return np.any(x != 0, axis=axis, keepdims=keepdim)
def ref_all(x: np.ndarray, axis, keepdim: bool) -> np.ndarray: return np.all(x != 0, axis=axis, keepdims=keepdim)

def ref_argmax(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  return np.asarray(np.argmax(x, axis=axis, keepdims=keepdim), dtype=np.int32)

def ref_argmin(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  return np.asarray(np.argmin(x, axis=axis, keepdims=keepdim), dtype=np.int32)

def ref_softmax(x: np.ndarray, axis: int) -> np.ndarray:
  y = x.astype(np.float64)
  e = np.exp(y - y.max(axis=axis, keepdims=True))
  return (e / e.sum(axis=axis, keepdims=True)).astype(float_of(x.dtype.name))

def ref_logsumexp(x: np.ndarray, axis, keepdim: bool) -> np.ndarray:
  y = x.astype(np.float64)
  peak = y.max(axis=axis, keepdims=True)
  peak = np.where(np.isinf(peak), 0, peak)   # tgrad: rows of all ±inf shift by 0 instead of making NaN
  out = np.log(np.exp(y - peak).sum(axis=axis, keepdims=True)) + peak
  if not keepdim: out = out.reshape([s for i, s in enumerate(x.shape) if i not in _axes(x, axis)])
  return out.astype(float_of(x.dtype.name))

def ref_var(x: np.ndarray, axis, keepdim: bool, correction: int) -> np.ndarray:
  y = x.astype(np.float64)
  squared = np.square(y - y.mean(axis=axis, keepdims=True)) if y.size else y
  count = math.prod(x.shape[a] for a in _axes(x, axis))
  return (squared.sum(axis=axis, keepdims=keepdim) / max(0, count - correction)).astype(float_of(x.dtype.name))

def ref_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
  y = x.astype(np.float64)
  shifted = y - y.max(axis=axis, keepdims=True)
  return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(float_of(x.dtype.name))

def ref_one_hot(x: np.ndarray, classes: int) -> np.ndarray:
  return (x[..., None] == np.arange(classes)).astype(np.int32)

def ref_cast(x: np.ndarray, dt: str) -> np.ndarray: return x.astype(dt)

def ref_where(condition, a, b) -> np.ndarray:
  a, b = _array(a), _array(b)
  dt = _operand_dtype(a, b)
  return np.where(np.asarray(condition) != 0, np.asarray(a, dtype=dt), np.asarray(b, dtype=dt))

def ref_clip(x: np.ndarray, low, high) -> np.ndarray:
  out = x if low is None else ref_where(ref_binary("lt", x, low), low, x)
  return out if high is None else ref_where(ref_binary("gt", out, high), high, out)

def ref_shrink(x: np.ndarray, bounds) -> np.ndarray:
  return x[tuple(slice(None) if b is None else slice(b[0], b[1]) for b in bounds)]

def ref_pad(x: np.ndarray, padding, value) -> np.ndarray:
  """Constant padding; negative amounts cut."""
  cut = x[tuple(slice(max(-lo, 0), s - max(-hi, 0)) for s, (lo, hi) in zip(x.shape, padding))]
  grow = tuple((max(lo, 0), max(hi, 0)) for lo, hi in padding)
  return np.pad(cut, grow, constant_values=np.asarray(value, dtype=x.dtype)) if cut.ndim else cut

def ref_squeeze(x: np.ndarray, dim) -> np.ndarray:
  if dim is None: return x.reshape([s for s in x.shape if s != 1])
  return np.squeeze(x, dim) if x.shape[dim] == 1 else x

def ref_flatten(x: np.ndarray, start: int, end: int) -> np.ndarray:
  if x.ndim == 0: return x.reshape(1)
  start, end = start % x.ndim, end % x.ndim
  return x.reshape(x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:])

def ref_cat(arrays: list, dim: int) -> np.ndarray:
  dt = np.result_type(*[a.dtype for a in arrays])
  return np.concatenate([a.astype(dt) for a in arrays], axis=dim)

def ref_stack(arrays: list, dim: int) -> np.ndarray:
  dt = np.result_type(*[a.dtype for a in arrays])
  return np.stack([a.astype(dt) for a in arrays], axis=dim)

def ref_gather(x: np.ndarray, dim: int, index: np.ndarray) -> np.ndarray:
  dim %= x.ndim
  region = x[tuple(slice(None) if d == dim else slice(0, i) for d, i in enumerate(index.shape))]
  return np.take_along_axis(region, index.astype(np.int64), axis=dim)

def ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  dt = np.promote_types(a.dtype, b.dtype).name
  compute = accumulate_dtype(dt)
  return np.matmul(a.astype(compute), b.astype(compute)).astype(dt)

R = types.SimpleNamespace(
  bin=ref_binary, fn=ref_float_function, un=ref_unary, sum=ref_sum, prod=ref_prod, max=ref_max, min=ref_min,
  mean=ref_mean, any=ref_any, all=ref_all, argmax=ref_argmax, argmin=ref_argmin, softmax=ref_softmax,
  logsumexp=ref_logsumexp, var=ref_var, log_softmax=ref_log_softmax, one_hot=ref_one_hot, cast=ref_cast,
  where=ref_where, clip=ref_clip, shrink=ref_shrink, pad=ref_pad,
  squeeze=ref_squeeze, flatten=ref_flatten, cat=ref_cat, stack=ref_stack, gather=ref_gather, matmul=ref_matmul)

def rng(*key: int) -> np.random.Generator:
  """The input data of a case: numpy's generator keyed by (seed, case, leaf)."""
  return np.random.default_rng(key)

# ---------------------------------------------------------------------------------------------------------------
# a case: values, the lines that make them, and the bookkeeping that says how close tgrad must come

@dataclass(frozen=True)
class Value:
  """One value of a chain. `bound`: the largest |finite element| of the mirror on this case's data. Floats: `err`
  bounds |tgrad − mirror| (0: they agree exactly); `grid` = q when every element is a multiple of 2**-q held
  exactly, so exact inputs give exact sums and products while they fit the significand. Ops that jump (comparisons,
  floor, casts to int) are applied only to values with err == 0. `special`: may also hold NaN and ±inf (IEEE rules
  propagate them the same way in both worlds; `bound` speaks of the finite elements). `terminal`: its finite
  elements are unbounded too (x / 0), so the chain stops there."""
  name: str
  shape: tuple[int, ...]
  dtype: str
  bound: float
  err: float = 0.0
  grid: Optional[int] = None
  terminal: bool = False
  special: bool = False
  @property
  def exact(self) -> bool: return not is_float(self.dtype) or (self.err == 0 and self.grid is not None)
  @property
  def agrees(self) -> bool: return not is_float(self.dtype) or self.err == 0
  @property
  def numel(self) -> int: return math.prod(self.shape)
  @property
  def ndim(self) -> int: return len(self.shape)

@dataclass(frozen=True)
class Line:
  name: str
  category: str           # "leaf" or one of CATEGORY_WEIGHTS
  tgrad: str              # expression over earlier names (tgrad Tensors)
  mirror: str             # the same over numpy arrays, with R
  inputs: tuple[str, ...]
  statement: bool = False   # tgrad and mirror are statements that bind `name` (x[i] = y), not expressions

  def code(self) -> str: return self.tgrad if self.statement else f"{self.name} = {self.tgrad}"

@dataclass
class Case:
  seed: int
  index: int
  big: bool
  lines: list[Line]
  values: dict[str, Value]
  outputs: list[str]

def fits(bound: float, grid: Optional[int], dtype: str) -> bool:
  """Multiples of 2**-grid no larger than bound are all exact in dtype."""
  if not is_float(dtype): return True
  if grid is None or grid > SIGNIFICAND_BITS[dtype]: return bound == 0 and grid is not None
  return bound * 2.0 ** grid <= 2.0 ** SIGNIFICAND_BITS[dtype]

class Builder:
  """Draws one case: its structure from random.Random((seed, index)), its data from rng(seed, index, leaf)."""
  def __init__(self, seed: int, index: int):
    self.seed, self.index = seed, index
    self.rng = random.Random(f"tgrad-fuzz:{seed}:{index}")
    self.big = self.rng.random() < BIG_CASE_FRACTION
    self.max_numel = BIG_NUMEL if self.big else MAX_NUMEL
    self.lines: list[Line] = []
    self.values: dict[str, Value] = {}
    self.leaf_count = 0
    self.arrays: dict[str, Any] = {}   # the mirror's namespace, filled as lines are added
    self.consumed: set[str] = set()   # values whose buffer a later x[i] = y may have written (torch aliasing)

  # ---- bookkeeping
  def add(self, category: str, tgrad: str, mirror: str, inputs: tuple[str, ...], shape, dtype: str, bound: float,
          err: float = 0.0, grid: Optional[int] = None, terminal: bool = False, special: bool = False,
          statement: bool = False) -> Value:
    """Append a line; `bound` is the op's a-priori bound, which decides exactness. The value's bound is then the
    largest finite |element| of the mirror on this case's data (data is fixed per case), so errors carried further
    are not inflated by bounds that were never reached."""
    name = self.next_name()
    line = Line(name, category, tgrad, mirror, inputs, statement)
    array = np.asarray(run_reference([line], self.arrays)[name])
    finite = array[np.isfinite(array)] if is_float(dtype) else array
    actual = float(np.abs(finite.astype(np.float64)).max()) if finite.size else 0.0
    special = is_float(dtype) and (special or any(self.values[n].special for n in inputs) or finite.size < array.size)
    if is_float(dtype):
      if grid is not None and (err != 0 or not fits(bound, grid, dtype)): grid = None
      if grid is None and err == 0 and category not in ("leaf", "movement", "slice", "index") and not terminal:
        err = ROUNDING_ULPS * roundoff(dtype) * actual
    else: err, grid = 0.0, None
    value = Value(name, tuple(int(s) for s in shape), dtype, actual, err, grid, terminal, special)
    self.lines.append(line)
    self.values[name] = value
    return value

  def next_name(self) -> str: return f"v{len(self.lines)}"
  def usable(self, w: Value) -> bool: return not w.terminal and w.name not in self.consumed
  def choice(self, options: list): return options[self.rng.randrange(len(options))]
  def chance(self, p: float) -> bool: return self.rng.random() < p

  # ---- shapes and leaves
  def random_dim(self) -> int:
    r = self.rng.random()
    if r < 0.03: return 0
    if r < 0.28: return 1
    if r < 0.73: return self.rng.randint(2, 7)
    if r < 0.93: return self.choice([8, 9, 11, 13, 15, 16, 17, 31, 32, 33])
    return self.rng.randint(40, 300)

  def random_shape(self, ndim: Optional[int] = None) -> tuple[int, ...]:
    if ndim is None: ndim = self.choice([0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4])
    shape = [self.random_dim() for _ in range(ndim)]
    while math.prod(shape) > MAX_NUMEL:
      biggest = max(range(ndim), key=lambda i: shape[i])
      shape[biggest] = max(1, shape[biggest] // 3)
    return tuple(shape)

  def big_shape(self) -> tuple[int, ...]:
    kind = self.rng.randrange(3)
    if kind == 0: return (self.rng.randint(5000, BIG_NUMEL),)
    if kind == 1: return (self.rng.randint(200, 1100), self.rng.randint(200, 900))
    return (self.rng.randint(1, 5), self.rng.randint(100, 300), self.rng.randint(100, 600))

  def leaf(self, shape: tuple[int, ...], dtype: str, category: str = "leaf") -> Value:
    if self.chance(CONSTRUCTOR_FRACTION) and (made := self.constructor_leaf(shape, dtype)) is not None: return made
    key = f"{self.seed}, {self.index}, {self.leaf_count}"
    self.leaf_count += 1
    grid, bound, special = None, 0.0, False
    if dtype == "bool":
      recipe, bound = f"rng({key}).integers(0, 2, {shape!r}).astype(bool)", 1
    elif is_int(dtype):
      low, high = int_limits(dtype)
      if self.chance(0.7): low, high = max(low, -10), min(high, 10)
      elif dtype == "int64": low, high = -(1 << 40), 1 << 40
      recipe, bound = f"rng({key}).integers({low}, {high}, {shape!r}, endpoint=True, dtype=np.{dtype})", max(-low, high)
    else:
      style = self.rng.randrange(3)
      if self.chance(SPECIAL_FRACTION):   # small multiples of 1/8 with some NaN, inf, -inf and -0.0 among them
        recipe = (f"np.where(rng({key}, 1).random({shape!r}) < 0.25, rng({key}, 2).choice(np.array([np.nan, np.inf, "
                  f"-np.inf, -0.0], np.{dtype}), {shape!r}), (rng({key}).integers(-16, 16, {shape!r}, endpoint=True) "
                  f"/ 8).astype(np.{dtype}))")
        bound, grid, special = 2.0, 3, True
      elif style == 0:     # small multiples of 1/8: sums and products stay exact, so comparisons and floors are fair
        half = self.choice([4, 8, 32])
        recipe = f"(rng({key}).integers({-half}, {half}, {shape!r}, endpoint=True) / 8).astype(np.{dtype})"
        bound, grid = half / 8, 3
      elif style == 1:   # small integers
        half = self.choice([3, 10, 100 if dtype != "float16" else 30])
        recipe = f"rng({key}).integers({-half}, {half}, {shape!r}, endpoint=True).astype(np.{dtype})"
        bound, grid = half, 0
      else:
        scale = self.choice([1.0, 3.0, 10.0] if dtype == "float16" else [1.0, 3.0, 10.0, 100.0])
        recipe = f"rng({key}).uniform({-scale}, {scale}, {shape!r}).astype(np.{dtype})"
        bound = scale
    return self.add(category, f"Tensor({recipe}, device=DEVICE)", recipe, (), shape, dtype, bound, grid=grid,
                    special=special)

  def constructor_leaf(self, shape: tuple[int, ...], dtype: str) -> Optional[Value]:
    """A leaf made by a tgrad constructor (constants and ARANGE take their own paths through the scheduler)."""
    kind, n = self.choice(["full", "full", "arange", "arange", "eye", "zeros", "ones"]), math.prod(shape)
    dtype_code = f"dtype=dtypes.{dtype}, device=DEVICE"
    if kind == "full":
      value = self.choice([0.5, -1.25, 3.0, 0.0]) if is_float(dtype) else self.scalar_for(dtype, allow_float=False)
      if dtype == "bool": value = self.choice([True, False])
      return self.add("leaf", f"Tensor.full({shape!r}, {value!r}, {dtype_code})",
                      f"np.full({shape!r}, {value!r}, dtype=np.{dtype})", (), shape, dtype, abs(float(value)),
                      grid=_scalar_grid(value))
    if kind in ("zeros", "ones"):
      return self.add("leaf", f"Tensor.{kind}({shape!r}, {dtype_code})", f"np.{kind}({shape!r}, dtype=np.{dtype})", (),
                      shape, dtype, 1.0, grid=0)
    if kind == "eye":
      if len(shape) != 2: return None
      return self.add("leaf", f"Tensor.eye({shape[0]}, {shape[1]}, {dtype_code})",
                      f"np.eye({shape[0]}, {shape[1]}, dtype=np.{dtype})", (), shape, dtype, 1.0, grid=0)
    if dtype == "bool": return None
    start = self.choice([0, 0, -3, 5])
    step = self.choice([1, 1, 2, -1] + ([0.5, -0.25] if is_float(dtype) else []))
    stop = start + n * step
    low, high = (min(start, stop), max(start, stop))
    if is_int(dtype) and (low < int_limits(dtype)[0] or high > int_limits(dtype)[1]): return None
    if dtype == "float16" and max(abs(low), abs(high)) > 2048: return None
    return self.add("leaf", f"Tensor.arange({start!r}, {stop!r}, {step!r}, {dtype_code}).reshape({shape!r})",
                    f"np.arange({start!r}, {stop!r}, {step!r}, dtype=np.{dtype}).reshape({shape!r})", (), shape, dtype,
                    float(max(abs(low), abs(high))), grid=_scalar_grid(step))

  def index_leaf(self, shape: tuple[int, ...], size: int, negative: bool) -> Value:
    """Int indices into an axis of `size` (numpy's range: [-size, size), or [0, size) for gather)."""
    key = f"{self.seed}, {self.index}, {self.leaf_count}"
    self.leaf_count += 1
    dtype = self.choice(["int32", "int32", "int64"])
    low = -size if negative else 0
    if size == 0: shape = tuple(0 if i == 0 else s for i, s in enumerate(shape)) if shape else (0,)
    high = max(size - 1, 0)
    recipe = f"rng({key}).integers({low}, {high}, {shape!r}, endpoint=True, dtype=np.{dtype})"
    return self.add("leaf", f"Tensor({recipe}, device=DEVICE)", recipe, (), shape, dtype, max(size, 1))

  def scalar_for(self, dtype: str, allow_float: bool = True):
    """A Python scalar that fits dtype (a weak operand); sometimes of a higher kind (int tensor + float)."""
    if dtype == "bool":
      return self.choice([True, False, 2, 3] + ([0.5, -1.5] if allow_float else []))
    if is_int(dtype):
      low, high = int_limits(dtype)
      if allow_float and self.chance(0.15): return self.choice([0.5, -2.25, 3.0])
      if self.chance(0.1): return self.choice([low, high])
      return self.rng.randint(max(low, -7), min(high, 7))
    return self.choice([0.5, -1.0, 2.0, 3.0, -0.25, 1.5, 0.0, 7.0])

  # ---- the chain
  def build(self) -> Case:
    shape = self.big_shape() if self.big else self.random_shape()
    current = self.leaf(shape, self.choice(BASE_DTYPES))
    for _ in range(self.rng.randint(1, MAX_STEPS)):
      for _attempt in range(12):
        category = self.rng.choices(list(CATEGORY_WEIGHTS), weights=list(CATEGORY_WEIGHTS.values()))[0]
        made = GENERATORS[category](self, current)
        if made is not None: break
      else: continue
      current = made
      if current.terminal: break
    outputs = [current.name]
    earlier = [line.name for line in self.lines[:-1] if line.category != "leaf" and self.usable(self.values[line.name])]
    if earlier and self.chance(0.15): outputs.append(self.choice(earlier))
    return Case(self.seed, self.index, self.big, self.lines, self.values, outputs)

  # ---- operands
  def broadcast_partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape` (dims set to 1, dropped in front, or a 1 of `shape` grown)."""
    out = []
    for s in shape:
      r = self.rng.random()
      if s == 1 and r < 0.3: out.append(self.rng.randint(2, 5))
      elif r < 0.25: out.append(1)
      else: out.append(s)
    drop = self.rng.randint(0, len(out)) if self.chance(0.3) else 0
    out = out[drop:]
    if self.chance(0.1): out = [self.rng.randint(1, 3)] + out
    return tuple(out)

  def operand(self, v: Value, dtype: Optional[str] = None, allow_scalar: bool = True):
    """Another operand for v: a new leaf, a Python scalar, an earlier value, or v itself (flipped)."""
    r = self.rng.random()
    if allow_scalar and r < 0.25: return self.scalar_for(v.dtype)
    if r < 0.45:
      partners = [w for w in self.values.values() if w.name != v.name and self.usable(w) and
                  _broadcast(v.shape, w.shape) is not None and (dtype is None or w.dtype == dtype)]
      if partners: return self.choice(partners)
    if r < 0.55 and v.ndim and (dtype is None or dtype == v.dtype):
      axis = self.rng.randrange(v.ndim)
      return self.add("movement", f"{v.name}.flip({axis})", f"np.flip({v.name}, {axis})", (v.name,), v.shape,
                      v.dtype, v.bound, v.err, v.grid)
    if r < 0.6 and (dtype is None or dtype == v.dtype): return v
    shape = self.broadcast_partner_shape(v.shape)
    out_shape = _broadcast(v.shape, shape)
    if out_shape is None or math.prod(out_shape) > self.max_numel: shape = v.shape
    if dtype is None: dtype = v.dtype if self.chance(0.6) else self.choice(BASE_DTYPES)
    return self.leaf(shape, dtype)

def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> Optional[tuple[int, ...]]:
  try: return tuple(int(s) for s in np.broadcast_shapes(a, b))
  except ValueError: return None

def _shape_of(expression: Callable[[np.ndarray], Any], shape: tuple[int, ...]) -> Optional[tuple[int, ...]]:
  """The shape numpy gives for an indexing expression on an array of `shape` (None if numpy rejects it)."""
  try: return tuple(expression(np.empty(shape, dtype=np.int8)).shape)
  except (IndexError, ValueError): return None

def _code(x) -> str:
  """A value's name, or a Python scalar as source."""
  return x.name if isinstance(x, Value) else repr(x)

def _axis_choice(b: Builder, v: Value, allow_none: bool = True):
  """A reduce axis argument: None, an int (maybe negative) or a tuple of distinct axes."""
  if v.ndim == 0 or (allow_none and b.chance(0.2)): return None
  axes = sorted(b.rng.sample(range(v.ndim), b.rng.randint(1, v.ndim)))
  axes = [a - v.ndim if b.chance(0.3) else a for a in axes]
  return axes[0] if len(axes) == 1 and b.chance(0.6) else tuple(axes)

def _reduced(v: Value, axis, keepdim: bool) -> tuple[tuple[int, ...], int]:
  axes = range(v.ndim) if axis is None else [a % v.ndim for a in (axis if isinstance(axis, tuple) else (axis,))]
  axes = set(axes)
  shape = tuple(1 if i in axes else s for i, s in enumerate(v.shape) if keepdim or i not in axes)
  return shape, math.prod(v.shape[i] for i in axes)

def _power(base: float, exponent: int) -> float:
  """base ** exponent for base >= 1, saturating far below float overflow."""
  return math.exp(min(exponent * math.log(base), 700))

def _summation_ulps(count: int) -> float: return min(count, 4 * math.sqrt(count) + 8)

# ---------------------------------------------------------------------------------------------------------------
# generators: each appends one line (or a few) to the case and returns the new value, or None if it does not apply

def gen_movement(b: Builder, v: Value) -> Optional[Value]:
  """One to three movement ops in a row (views compose: pad then flip then reshape is one View stack)."""
  made = None
  for _ in range(b.choice([1, 2, 2, 3, 3])):
    step = _gen_one_movement(b, v)
    if step is None: continue
    made = v = step
  return made

def _gen_one_movement(b: Builder, v: Value) -> Optional[Value]:
  kind = b.choice(["reshape", "reshape", "permute", "permute", "expand", "pad", "pad", "shrink", "flip", "contiguous",
                   "transpose", "squeeze", "unsqueeze", "flatten", "cat", "stack", "repeat"])
  keep = dict(dtype=v.dtype, bound=v.bound, err=v.err, grid=v.grid)
  n, name = v.numel, v.name
  if kind == "reshape":
    shape = _random_reshape(b, v.shape)
    if shape is None: return None
    code = list(shape)
    if n and code and b.chance(0.3): code[b.rng.randrange(len(code))] = -1
    return b.add("movement", f"{name}.reshape({tuple(code)!r})", f"np.reshape({name}, {tuple(shape)!r})", (name,),
                 shape, **keep)
  if kind in ("permute", "transpose"):
    if v.ndim < 2: return None
    if kind == "transpose":
      d0, d1 = b.rng.sample(range(-v.ndim, v.ndim), 2)
      if d0 % v.ndim == d1 % v.ndim: return None
      shape = list(v.shape)
      shape[d0], shape[d1] = shape[d1], shape[d0]
      return b.add("movement", f"{name}.transpose({d0}, {d1})", f"np.swapaxes({name}, {d0}, {d1})", (name,), shape,
                   **keep)
    order = list(range(v.ndim))
    b.rng.shuffle(order)
    return b.add("movement", f"{name}.permute({tuple(order)!r})", f"np.transpose({name}, {tuple(order)!r})", (name,),
                 tuple(v.shape[i] for i in order), **keep)
  if kind == "expand":
    lead = tuple(b.rng.randint(1, 4) for _ in range(b.rng.randint(0, 2)))
    shape = lead + tuple(b.rng.randint(2, 6) if s == 1 and b.chance(0.7) else s for s in v.shape)
    if shape == v.shape or math.prod(shape) > b.max_numel: return None
    code = lead + tuple(-1 if s == t and b.chance(0.3) else t for s, t in zip(v.shape, shape[len(lead):]))
    return b.add("movement", f"{name}.expand({code!r})", f"np.broadcast_to({name}, {shape!r})", (name,), shape, **keep)
  if kind == "pad":
    if v.ndim == 0: return None
    padding = []
    for s in v.shape:
      lo, hi = b.rng.randint(0, 3), b.rng.randint(0, 3)
      if s > 2 and b.chance(0.15): lo = -b.rng.randint(1, s // 2)
      padding.append((lo, hi) if b.chance(0.8) else (0, 0))
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(v.shape, padding))
    if math.prod(shape) > b.max_numel: return None
    value = 0 if v.dtype == "bool" or b.chance(0.5) else b.choice([1, 2, -1] if is_int(v.dtype) else [1.0, -0.5, 2.0])
    if is_unsigned(v.dtype): value = abs(value)
    if v.dtype == "bool" and b.chance(0.3): value = True
    grid = None if v.grid is None else max(v.grid, 1)
    bound = max(v.bound, abs(float(value)))
    code = f"{name}.pad({tuple(padding)!r}" + (f", value={value!r})" if value != 0 else ")")
    return b.add("movement", code, f"R.pad({name}, {tuple(padding)!r}, {value!r})", (name,), shape, v.dtype, bound,
                 v.err, grid)
  if kind == "shrink":
    if v.ndim == 0: return None
    bounds = []
    for s in v.shape:
      if b.chance(0.25): bounds.append(None); continue
      lo = b.rng.randint(0, s)
      bounds.append((lo, b.rng.randint(lo, s)))
    shape = tuple(s if bd is None else bd[1] - bd[0] for s, bd in zip(v.shape, bounds))
    return b.add("movement", f"{name}.shrink({tuple(bounds)!r})", f"R.shrink({name}, {tuple(bounds)!r})", (name,),
                 shape, **keep)
  if kind == "flip":
    if v.ndim == 0: return None
    axes = tuple(b.rng.sample(range(v.ndim), b.rng.randint(1, v.ndim)))
    return b.add("movement", f"{name}.flip({axes!r})", f"np.flip({name}, {axes!r})", (name,), v.shape, **keep)
  if kind == "contiguous":
    method = b.choice(["contiguous()", "realize()"])
    return b.add("movement", f"{name}.{method}", name, (name,), v.shape, **keep)
  if kind == "squeeze":
    if b.chance(0.4) or v.ndim == 0:
      return b.add("movement", f"{name}.squeeze()", f"R.squeeze({name}, None)", (name,),
                   tuple(s for s in v.shape if s != 1), **keep)
    dim = b.rng.randrange(-v.ndim, v.ndim)
    shape = v.shape if v.shape[dim] != 1 else v.shape[:dim % v.ndim] + v.shape[dim % v.ndim + 1:]
    return b.add("movement", f"{name}.squeeze({dim})", f"R.squeeze({name}, {dim})", (name,), shape, **keep)
  if kind == "unsqueeze":
    dim = b.rng.randrange(-v.ndim - 1, v.ndim + 1)
    shape = _shape_of(lambda x: np.expand_dims(x, dim), v.shape)
    return b.add("movement", f"{name}.unsqueeze({dim})", f"np.expand_dims({name}, {dim})", (name,), shape, **keep)
  if kind == "flatten":
    if v.ndim == 0:
      return b.add("movement", f"{name}.flatten()", f"R.flatten({name}, 0, -1)", (name,), (1,), **keep)
    start = b.rng.randrange(v.ndim)
    end = b.rng.randrange(start, v.ndim)
    start_code = start - v.ndim if b.chance(0.3) else start
    end_code = end - v.ndim if b.chance(0.5) else end
    shape = v.shape[:start] + (math.prod(v.shape[start:end + 1]),) + v.shape[end + 1:]
    return b.add("movement", f"{name}.flatten({start_code}, {end_code})",
                 f"R.flatten({name}, {start_code}, {end_code})", (name,), shape, **keep)
  if kind in ("cat", "stack"):
    if kind == "cat" and v.ndim == 0: return None
    dim = b.rng.randrange(v.ndim) if kind == "cat" else b.rng.randrange(v.ndim + 1)
    if kind == "cat":
      other_shape = tuple(b.rng.randint(0, 4) if i == dim else s for i, s in enumerate(v.shape))
      shape = tuple(s + o if i == dim else s for i, (s, o) in enumerate(zip(v.shape, other_shape)))
    else:
      other_shape, shape = v.shape, v.shape[:dim] + (2,) + v.shape[dim:]
    if math.prod(shape) > b.max_numel: return None
    same = [w for w in b.values.values() if w.shape == other_shape and b.usable(w)]
    other = b.choice(same) if same and b.chance(0.5) else b.leaf(
      other_shape, v.dtype if b.chance(0.7) else b.choice(BASE_DTYPES))
    dtype = np.promote_types(v.dtype, other.dtype).name
    both = [v, other]
    grid = None if v.grid is None or other.grid is None else max(v.grid, other.grid)
    if kind == "cat":
      code, mirror = f"{name}.cat({other.name}, dim={dim})", f"R.cat([{name}, {other.name}], {dim})"
    else: code, mirror = f"Tensor.stack({name}, {other.name}, dim={dim})", f"R.stack([{name}, {other.name}], {dim})"
    return b.add("movement", code, mirror, (name, other.name), shape, dtype, max(w.bound for w in both),
                 max(w.err for w in both), grid)
  # repeat
  repeats = tuple(b.rng.randint(1, 3) for _ in range(v.ndim + b.rng.randint(0, 1)))
  if not repeats: repeats = (2,)
  shape = tuple(int(s) for s in np.tile(np.empty(v.shape, np.int8), repeats).shape)
  if math.prod(shape) > b.max_numel: return None
  return b.add("movement", f"{name}.repeat({repeats!r})", f"np.tile({name}, {repeats!r})", (name,), shape, **keep)

def _random_reshape(b: Builder, shape: tuple[int, ...]) -> Optional[tuple[int, ...]]:
  n = math.prod(shape)
  if n == 0:
    dims = [b.rng.randint(1, 5) for _ in range(b.rng.randint(1, 3))]
    dims[b.rng.randrange(len(dims))] = 0
    return tuple(dims)
  factors, m, p = [], n, 2
  while p * p <= m:
    while m % p == 0: factors.append(p); m //= p
    p += 1
  if m > 1: factors.append(m)
  dims = [1] * b.rng.randint(1, 4)
  for f in factors: dims[b.rng.randrange(len(dims))] *= f
  if b.chance(0.2): dims.insert(b.rng.randrange(len(dims) + 1), 1)
  if n == 1 and b.chance(0.3): dims = []
  return tuple(dims)

def gen_slice(b: Builder, v: Value) -> Optional[Value]:
  if v.ndim == 0: return None
  text, shape = _basic_index(b, v)
  if shape is None: return None
  return b.add("slice", f"{v.name}[{text}]", f"{v.name}[{text}]", (v.name,), shape, v.dtype, v.bound, v.err, v.grid)

def _basic_index(b: Builder, v: Value, allow_new_axes: bool = True) -> tuple[str, Optional[tuple[int, ...]]]:
  """numpy basic indexing: ints, slices with any step and out-of-range bounds, None, Ellipsis; and its shape."""
  items = []
  for s in v.shape:
    r = b.rng.random()
    if r < 0.3: items.append(":")
    elif r < 0.45 and s > 0: items.append(str(b.rng.randrange(-s, s)))
    elif r < 0.55 and allow_new_axes: items.append("None")
    else:
      step = b.choice([1, 2, 3, -1, -2, -3])
      start = b.choice(["", str(b.rng.randint(-s - 2, s + 2))])
      stop = b.choice(["", str(b.rng.randint(-s - 2, s + 2))])
      items.append(f"{start}:{stop}" + (f":{step}" if step != 1 or b.chance(0.3) else ""))
  if b.chance(0.15): items.insert(b.rng.randrange(len(items) + 1), "...")
  while items and items[-1] == ":" and b.chance(0.5): items.pop()
  text = ", ".join(items) if items else "..."
  return text, _shape_of(lambda x: eval(f"x[{text}]", {"x": x}), v.shape)

def gen_index(b: Builder, v: Value) -> Optional[Value]:
  if v.ndim == 0 or b.big: return None
  if b.chance(0.35): return _gen_gather(b, v)
  made = _tensor_index(b, v)
  if made is None: return None
  text, shape, indices = made
  inputs = (v.name,) + tuple(w.name for w in indices)
  return b.add("index", f"{v.name}[{text}]", f"{v.name}[{text}]", inputs, shape, v.dtype, v.bound, v.err, v.grid)

def _tensor_index(b: Builder, v: Value) -> Optional[tuple[str, tuple[int, ...], list[Value]]]:
  """Indexing with one or two int tensors (in range, negative allowed) among slices: (text, shape, index leaves)."""
  count = 1 if v.ndim == 1 or b.chance(0.6) else 2
  dims = sorted(b.rng.sample(range(v.ndim), count))
  index_shape = b.choice([(), (b.rng.randint(0, 5),), (b.rng.randint(1, 3), b.rng.randint(1, 4))])
  indices = {}
  for d in dims:
    shape = index_shape if not index_shape or b.chance(0.7) else tuple(1 for _ in index_shape[:-1]) + index_shape[-1:]
    indices[d] = b.index_leaf(shape, v.shape[d], negative=True)
  items = [indices[d].name if d in indices else f"{b.rng.randint(0, 1)}:" if b.chance(0.2) and v.shape[d] > 1 else ":"
           for d in range(v.ndim)]
  if dims[0] > 0 and b.chance(0.2): items = ["..."] + items[dims[0]:]
  else:
    while items[-1] == ":": items.pop()
  text = ", ".join(items)
  dummy = {w.name: np.zeros(w.shape, dtype=np.int64) for w in indices.values()}
  shape = _shape_of(lambda x: eval(f"x[{text}]", {"x": x, **dummy}), v.shape)
  if shape is None: return None
  n_axis = max(v.shape[d] for d in dims)
  if math.prod(shape) * max(n_axis, 1) > GATHER_COST_LIMIT or math.prod(shape) > b.max_numel: return None
  return text, shape, list(indices.values())

def _gen_gather(b: Builder, v: Value) -> Optional[Value]:
  dim = b.rng.randrange(v.ndim)
  shape = tuple(b.rng.randint(0, 5) if d == dim else b.rng.randint(min(1, s), s) for d, s in enumerate(v.shape))
  if v.shape[dim] == 0: shape = tuple(0 if d == dim else s for d, s in enumerate(shape))
  if math.prod(shape) * max(v.shape[dim], 1) > GATHER_COST_LIMIT: return None
  index = b.index_leaf(shape, v.shape[dim], negative=False)
  dim_code = dim - v.ndim if b.chance(0.3) else dim
  return b.add("index", f"{v.name}.gather({dim_code}, {index.name})", f"R.gather({v.name}, {dim_code}, {index.name})",
               (v.name, index.name), index.shape, v.dtype, v.bound, v.err, v.grid)

def _float_unary_plan(b: Builder, v: Value):
  """(tgrad code, mirror code, bound, err) of a float function on a safe domain, or None."""
  dt, u = float_of(v.dtype), roundoff(float_of(v.dtype))
  bound, err, name = v.bound, v.err, v.name
  kind = b.choice(["exp", "exp2", "log", "log2", "sqrt", "sin", "cos", "sigmoid", "tanh", "reciprocal"])
  fresh = TRANSCENDENTAL_ULPS * u
  if kind in ("exp", "exp2"):
    if bound > EXP_INPUT_LIMIT[dt]: return None
    out = math.exp(bound) if kind == "exp" else 2.0 ** bound
    return f"{name}.{kind}()", f"R.fn('{kind}', {name})", out, out * (err + fresh * (1 + bound))
  if kind in ("log", "log2"):   # of |x| + 1 ≥ 1
    if v.dtype == "bool": return None
    out = math.log(bound + 1) / (math.log(2) if kind == "log2" else 1)
    return (f"({name}.abs() + 1).{kind}()", f"R.fn('{kind}', R.bin('add', R.un('abs', {name}), 1))", out,
            2 * err + fresh * (2 + out))
  if kind == "sqrt":
    if v.dtype == "bool": return None
    out = math.sqrt(bound)
    return f"{name}.abs().sqrt()", f"R.fn('sqrt', R.un('abs', {name}))", out, math.sqrt(err) + fresh * (1 + out)
  if kind in ("sin", "cos"):
    if bound > 1e4: return None
    return f"{name}.{kind}()", f"R.fn('{kind}', {name})", 1.0, err + fresh * (1 + bound)
  if kind in ("sigmoid", "tanh"):   # they saturate: the rounding of a large input does not matter
    return f"{name}.{kind}()", f"R.fn('{kind}', {name})", 1.0, 2 * err + 4 * fresh
  if v.dtype == "bool": return None   # reciprocal of |x| + 1
  return (f"({name}.abs() + 1).reciprocal()", f"R.fn('reciprocal', R.bin('add', R.un('abs', {name}), 1))", 1.0,
          err + fresh * 2)

def gen_unary(b: Builder, v: Value) -> Optional[Value]:
  name, dt = v.name, v.dtype
  if b.chance(0.45):
    plan = _float_unary_plan(b, v)
    if plan is None: return None
    code, mirror, bound, err = plan
    return b.add("unary", code, mirror, (name,), v.shape, float_of(dt), bound, err)
  kind = b.choice(["neg", "abs", "relu", "square", "floor", "ceil", "trunc", "round", "sign", "bitwise_not", "clip",
                   "pow"])
  if kind in ("neg", "relu") and dt == "bool": return None
  if kind == "bitwise_not" and is_float(dt): return None
  if kind in ("floor", "ceil", "trunc", "round", "sign") and not v.agrees: return None
  if kind == "neg": return b.add("unary", f"-{name}", f"R.un('neg', {name})", (name,), v.shape, dt, v.bound, v.err,
                                 v.grid)
  if kind in ("abs", "relu"):
    return b.add("unary", f"{name}.{kind}()", f"R.un('{kind}', {name})", (name,), v.shape, dt, v.bound, v.err, v.grid)
  if kind in ("floor", "ceil", "trunc", "round"):
    return b.add("unary", f"{name}.{kind}()", f"R.un('{kind}', {name})", (name,), v.shape, dt, math.floor(v.bound) + 1,
                 grid=0)
  if kind == "sign": return b.add("unary", f"{name}.sign()", f"R.un('sign', {name})", (name,), v.shape, dt, 1, grid=0)
  if kind == "bitwise_not":
    return b.add("unary", f"~{name}", f"R.un('bitwise_not', {name})", (name,), v.shape, dt, v.bound + 1)
  if kind == "clip":
    if dt == "bool": return None
    low, high = sorted(b.scalar_for(dt, allow_float=False) for _ in range(2))
    if is_float(dt): low, high = float(low), float(high)
    low_code, high_code = (None if b.chance(0.2) else low), (None if b.chance(0.2) else high)
    if low_code is None and high_code is None: low_code = low
    bound = max(v.bound, abs(low), abs(high))
    return b.add("unary", f"{name}.clip({low_code!r}, {high_code!r})", f"R.clip({name}, {low_code!r}, {high_code!r})",
                 (name,), v.shape, dt, bound, v.err, None if v.grid is None else max(v.grid, 0))
  # square and small integer powers: repeated multiplication in the dtype (ints wrap)
  power = 2 if kind == "square" else b.choice([0, 1, 2, 3])
  out_dtype = "int32" if dt == "bool" else dt
  bound = v.bound ** power
  if is_float(dt) and bound > SAFE_FLOAT_BOUND[dt]: return None
  grid = None if v.grid is None else v.grid * power
  err = 0.0 if power == 0 else power * v.bound ** (power - 1) * v.err * 2 + ROUNDING_ULPS * power * roundoff(dt) * bound
  if v.exact and is_float(dt) and fits(bound, grid, dt): err = 0.0
  code, mirror = (f"{name}.square()", f"R.un('square', {name})") if kind == "square" else (
    f"{name} ** {power}", f"R.bin('pow', {name}, {power})")
  if kind == "square": out_dtype = dt
  return b.add("unary", code, mirror, (name,), v.shape, out_dtype, bound if power else 1, err,
               grid if power else 0)

_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}
_BITWISE_OPS = {"and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}

def gen_binary(b: Builder, v: Value) -> Optional[Value]:
  op = b.choice(["add", "add", "sub", "mul", "mul", "div", "floordiv", "mod", "maximum", "minimum", "and", "or", "xor",
                 "lshift", "rshift"])
  other = b.operand(v)
  reverse = b.chance(0.3) and op not in ("maximum", "minimum")
  if isinstance(other, Value) and other.terminal: return None
  out_dtype = _operand_dtype_planned(v, other)
  if op in _BITWISE_OPS and is_float(out_dtype): return None
  if op == "sub" and out_dtype == "bool": return None
  if op in ("lshift", "rshift") and not isinstance(other, Value):
    bits = 32 if out_dtype == "bool" else np.dtype(out_dtype).itemsize * 8
    if isinstance(other, bool) or not 0 <= other < bits:
      other = b.rng.randrange(bits)
    out_dtype = _operand_dtype_planned(v, other)
    reverse = False
  if out_dtype == "bool" and op in ("floordiv", "mod", "lshift", "rshift"): out_dtype = "int32"   # bools as ints
  x, y = (other, v) if reverse else (v, other)
  if not isinstance(x, Value) and not isinstance(y, Value): return None
  bound_x = x.bound if isinstance(x, Value) else abs(float(x))
  bound_y = y.bound if isinstance(y, Value) else abs(float(y))
  err_x = x.err if isinstance(x, Value) else 0.0
  err_y = y.err if isinstance(y, Value) else 0.0
  grids = [w.grid if isinstance(w, Value) else _scalar_grid(w) for w in (x, y)]
  exact = all(w.exact if isinstance(w, Value) else _scalar_grid(w) is not None for w in (x, y))
  agree = all(w.agrees if isinstance(w, Value) else True for w in (x, y))
  grid = None if any(g is None for g in grids) else max(grids)
  shape = _broadcast(v.shape, other.shape if isinstance(other, Value) else ())
  if shape is None or math.prod(shape) > b.max_numel: return None
  inputs = tuple(w.name for w in (x, y) if isinstance(w, Value))
  mirror = f"R.bin('{op}', {_code(x)}, {_code(y)})"
  dt, u = out_dtype, roundoff(out_dtype)
  terminal, err = False, 0.0
  if op in ("maximum", "minimum"):
    code = f"{_code(x)}.{op}({_code(y)})" if isinstance(x, Value) else f"{_code(y)}.{op}({_code(x)})"
    return b.add("binary", code, mirror, inputs, shape, dt, max(bound_x, bound_y), max(err_x, err_y), grid)
  code = f"{_code(x)} {_ARITHMETIC.get(op) or _BITWISE_OPS[op]} {_code(y)}"
  if op in _BITWISE_OPS:
    bits = 32 if dt == "bool" else np.dtype(dt).itemsize * 8
    return b.add("binary", code, mirror, inputs, shape, dt, 2.0 ** bits)
  if op in ("add", "sub"):
    bound = bound_x + bound_y
    err = err_x + err_y + ROUNDING_ULPS * u * bound
  elif op == "mul":
    bound = bound_x * bound_y
    err = err_x * bound_y + err_y * bound_x + err_x * err_y + ROUNDING_ULPS * u * bound
    grid = None if grid is None else grids[0] + grids[1]
  elif op == "div":
    dt = float_of(dt)
    raw_ok = isinstance(y, Value) and y.agrees and (not isinstance(x, Value) or x.agrees)   # then only 1 rounding
    if raw_ok and b.chance(0.25):   # raw: x / 0 gives inf or NaN, so the chain ends
      return b.add("binary", code, mirror, inputs, shape, dt, math.inf, 0.0, None, terminal=True)
    if not isinstance(y, Value):
      if y == 0: return None
      bound, grid = bound_x / abs(y), None
      err = err_x / abs(y) + ROUNDING_ULPS * roundoff(dt) * bound
    else:   # x / (|y| + 1): the divisor is at least 1
      code = f"{_code(x)} / ({y.name}.abs() + 1)"
      mirror = f"R.bin('div', {_code(x)}, R.bin('add', R.un('abs', {y.name}), 1))"
      if y.dtype == "bool": return None
      bound, err, grid = bound_x, err_x + bound_x * err_y + 2 * ROUNDING_ULPS * roundoff(dt) * bound_x, None
  else:   # floordiv, mod: ints always; floats only on exact values (floor jumps)
    if is_float(dt):
      if not (exact and agree): return None
      if isinstance(y, Value) or y == 0: terminal = True
    if op == "floordiv":
      smallest_divisor = 2.0 ** -(grids[1] or 0) if is_float(dt) else 1.0
      bound, grid = bound_x / smallest_divisor + 1, 0
    else: bound = bound_y
    if terminal: return b.add("binary", code, mirror, inputs, shape, dt, math.inf, 0.0, None, terminal=True)
  if is_float(dt) and bound > SAFE_FLOAT_BOUND[dt]: return None
  if is_float(dt) and exact and fits(bound, grid, dt) and op != "div": err = 0.0
  return b.add("binary", code, mirror, inputs, shape, dt, bound, err, grid)

def _operand_dtype_planned(v: Value, other) -> str:
  return np.promote_types(v.dtype, other.dtype).name if isinstance(other, Value) else weak_scalar_dtype(v.dtype, other)

def _scalar_fits(x, dtype: str) -> bool:
  """A Python scalar that the dtype holds (out-of-range scalars are an error case, not fuzzed here)."""
  if not is_int(dtype) or isinstance(x, bool): return True
  low, high = int_limits(dtype)
  return low <= x <= high

def _scalar_grid(x) -> Optional[int]:
  """q with x a multiple of 2**-q (small q), or None."""
  for q in range(8):
    if float(x) * 2 ** q == int(float(x) * 2 ** q): return q
  return None

def gen_compare(b: Builder, v: Value) -> Optional[Value]:
  kind = b.choice(["cmp", "cmp", "cmp", "where", "where", "logical_not", "isnan"])
  name = v.name
  if kind == "logical_not":
    if not v.agrees: return None
    return b.add("compare", f"{name}.logical_not()", f"R.un('logical_not', {name})", (name,), v.shape, "bool", 1)
  if kind == "isnan":
    return b.add("compare", f"{name}.isnan()", f"R.un('isnan', {name})", (name,), v.shape, "bool", 1)
  if kind == "cmp":
    if not v.agrees: return None
    other = b.operand(v)
    if isinstance(other, Value) and (not other.agrees or other.terminal): return None
    op = b.choice(list(_COMPARE))
    symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
    shape = _broadcast(v.shape, other.shape if isinstance(other, Value) else ())
    if shape is None or math.prod(shape) > b.max_numel: return None
    inputs = (name,) + ((other.name,) if isinstance(other, Value) else ())
    return b.add("compare", f"({name} {symbol} {_code(other)})", f"R.bin('{op}', {name}, {_code(other)})", inputs,
                 shape, "bool", 1)
  # where: v (if it agrees exactly) or a comparison of v picks between two operands
  if v.agrees and b.chance(0.5): condition = v
  else:
    if not v.agrees: return None
    condition = b.add("compare", f"({name} > 0)", f"R.bin('gt', {name}, 0)", (name,), v.shape, "bool", 1)
  a, c = b.operand(v, allow_scalar=True), b.operand(v, allow_scalar=True)
  if not isinstance(a, Value) and not isinstance(c, Value) and b.chance(0.7): a = v
  if any(isinstance(w, Value) and w.terminal for w in (a, c)): return None
  shapes = [condition.shape] + [w.shape for w in (a, c) if isinstance(w, Value)]
  shape = _broadcast(*shapes[:2]) if len(shapes) >= 2 else condition.shape
  for s in shapes[2:]: shape = None if shape is None else _broadcast(shape, s)
  if shape is None or math.prod(shape) > b.max_numel: return None
  if isinstance(a, Value): dt = _operand_dtype_planned(a, c)
  elif isinstance(c, Value): dt = _operand_dtype_planned(c, a)
  else: dt = _python_scalar_dtype([a, c])
  if not all(_scalar_fits(w, dt) for w in (a, c) if not isinstance(w, Value)): return None
  parts = [w if isinstance(w, Value) else None for w in (a, c)]
  bound = max(w.bound if isinstance(w, Value) else abs(float(w)) for w in (a, c))
  err = max(w.err if w is not None else 0.0 for w in parts)
  grids = [w.grid if isinstance(w, Value) else _scalar_grid(w) for w in (a, c)]
  grid = None if any(g is None for g in grids) else max(grids)
  inputs = tuple(dict.fromkeys([condition.name] + [w.name for w in (a, c) if isinstance(w, Value)]))
  return b.add("compare", f"{condition.name}.where({_code(a)}, {_code(c)})",
               f"R.where({condition.name}, {_code(a)}, {_code(c)})", inputs, shape, dt, bound, err, grid)

def gen_cast(b: Builder, v: Value) -> Optional[Value]:
  target = b.choice(BASE_DTYPES + ["int16", "float64", "uint32"])
  if target == v.dtype: return None
  name = v.name
  code, mirror = f"{name}.cast(dtypes.{target})", f"R.cast({name}, '{target}')"
  if is_float(v.dtype) and not is_float(target):
    if not v.agrees or (v.special and target != "bool"): return None
    if target != "bool":
      low, high = int_limits(target)
      if is_unsigned(target):   # cast |x| (negative floats to unsigned ints are undefined)
        code, mirror = f"{name}.abs().cast(dtypes.{target})", f"R.cast(R.un('abs', {name}), '{target}')"
      if v.bound >= min(-low if low else high, high): return None
    return b.add("cast", code, mirror, (name,), v.shape, target, math.floor(v.bound) if target != "bool" else 1)
  if is_float(target):
    grid = 0 if not is_float(v.dtype) else v.grid
    if is_float(v.dtype) and v.bound > SAFE_FLOAT_BOUND[target]: return None
    if not is_float(v.dtype) and v.bound > SAFE_FLOAT_BOUND[target]:
      if target != "float16" or v.bound < 2 ** 20: return None
    err = v.err + (0.0 if fits(v.bound, grid, target) else ROUNDING_ULPS * roundoff(target) * v.bound)
    if not is_float(v.dtype) and v.bound < 2.0 ** 53: err = 0.0   # int -> float rounds the same way everywhere
    return b.add("cast", code, mirror, (name,), v.shape, target, v.bound, err, grid)
  return b.add("cast", code, mirror, (name,), v.shape, target, v.bound)

def gen_reduce(b: Builder, v: Value) -> Optional[Value]:
  kind = b.choice(["sum", "sum", "sum", "max", "max", "min", "mean", "mean", "prod", "any", "all", "argmax", "argmin",
                   "softmax", "logsumexp"])
  name, keepdim = v.name, b.chance(0.4)
  if kind in ("argmax", "argmin"):
    if not v.agrees or v.ndim == 0: return None
    axis = None if b.chance(0.3) else b.rng.randrange(-v.ndim, v.ndim)
    shape, count = _reduced(v, axis, keepdim)
    if count == 0: return None
    if axis is None and not keepdim: shape = ()
    return b.add("reduce", f"{name}.{kind}({axis!r}, keepdim={keepdim})", f"R.{kind}({name}, {axis!r}, {keepdim})",
                 (name,), shape, "int32", count)
  dt = float_of(v.dtype)
  u = roundoff(accumulate_dtype(dt))   # softmax and logsumexp of half floats compute in float32, then round once
  if kind == "softmax":
    if v.ndim == 0 or v.shape[-1] == 0 or v.bound > EXP_INPUT_LIMIT["float32"]: return None
    axis = b.rng.randrange(-v.ndim, v.ndim)
    if v.shape[axis] == 0: return None
    err = 2 * v.err + TRANSCENDENTAL_ULPS * u * (2 + 2 * v.bound) * 4 + ROUNDING_ULPS * roundoff(dt)
    return b.add("reduce", f"{name}.softmax({axis})", f"R.softmax({name}, {axis})", (name,), v.shape, dt, 1.0, err)
  axis = _axis_choice(b, v)
  shape, count = _reduced(v, axis, keepdim)
  code, mirror = f"{name}.{kind}({axis!r}, keepdim={keepdim})", f"R.{kind}({name}, {axis!r}, {keepdim})"
  if kind in ("any", "all"):
    if not v.agrees: return None
    return b.add("reduce", code, mirror, (name,), shape, "bool", 1)
  if kind in ("max", "min"):
    if count == 0: return None   # over an empty axis: an error, as in numpy
    return b.add("reduce", code, mirror, (name,), shape, v.dtype, v.bound, v.err, v.grid)
  if kind == "logsumexp":
    if v.ndim == 0 or count == 0 or v.bound > EXP_INPUT_LIMIT["float32"]: return None
    out = v.bound + math.log(max(count, 1))
    err = (v.err + TRANSCENDENTAL_ULPS * u * (2 * out + 2) + ROUNDING_ULPS * u * _summation_ulps(count) +
           ROUNDING_ULPS * roundoff(dt) * out)
    return b.add("reduce", code, mirror, (name,), shape, dt, out, err)
  out_dtype = sum_dtype(v.dtype) if kind in ("sum", "prod") else float_of(v.dtype)
  acc = accumulate_dtype(out_dtype)
  u = roundoff(acc) if is_float(acc) else 0.0
  if kind == "prod":
    if count > 24 and is_float(out_dtype) and v.bound > 1: return None
    bound = _power(v.bound, count) if v.bound > 1 else 1.0
    if is_float(out_dtype) and bound > SAFE_FLOAT_BOUND[out_dtype]: return None
    grid = None if v.grid is None else v.grid * count
    err = count * _power(max(v.bound, 1), max(count - 1, 0)) * v.err + (count + 1) * roundoff(out_dtype) * bound
    exact = v.exact and fits(bound, grid, out_dtype)
    return b.add("reduce", code, mirror, (name,), shape, out_dtype, bound, 0.0 if exact else err, grid)
  bound = v.bound * count
  if kind == "mean":
    grid = v.grid + int(math.log2(count)) if v.grid is not None and count and count & (count - 1) == 0 else None
    err = v.err + (ROUNDING_ULPS * u * _summation_ulps(count) + roundoff(out_dtype)) * v.bound * 2
    exact = v.exact and grid is not None and fits(bound * 2.0 ** grid, 0, acc) and fits(v.bound, grid, out_dtype)
    return b.add("reduce", code, mirror, (name,), shape, out_dtype, v.bound, 0.0 if exact else err, grid)
  if is_float(out_dtype) and bound > SAFE_FLOAT_BOUND[out_dtype]: return None
  err = count * v.err + (ROUNDING_ULPS * u * _summation_ulps(count) + roundoff(out_dtype)) * bound
  exact = v.exact and fits(bound, v.grid, out_dtype) and fits(bound, v.grid, acc)
  return b.add("reduce", code, mirror, (name,), shape, out_dtype, bound, 0.0 if exact else err, v.grid)

def gen_matmul(b: Builder, v: Value) -> Optional[Value]:
  if v.ndim == 0: return None
  k = v.shape[-1]
  r = b.rng.random()
  if r < 0.25: other_shape = (k,)
  elif r < 0.8: other_shape = (k, b.choice([1, 2, 3, 5, 8, 16, 17, 33]))
  else: other_shape = (v.shape[0] if v.ndim >= 3 and b.chance(0.5) else 1, k, b.rng.randint(1, 9))
  try: shape = _shape_of(lambda x: np.matmul(x, np.empty(other_shape, np.int8)), v.shape)
  except TypeError: return None
  if shape is None or math.prod(shape) > b.max_numel: return None
  if math.prod(shape) * max(k, 1) > MATMUL_COST_LIMIT * (16 if b.big else 1): return None
  dtype = v.dtype if b.chance(0.7) else b.choice(BASE_DTYPES)
  w = b.leaf(other_shape, dtype)
  if v.ndim == 1 and w.ndim == 1: shape = ()
  out_dtype = np.promote_types(v.dtype, w.dtype).name
  bound = max(k, 1) * v.bound * w.bound
  if is_float(out_dtype) and bound > SAFE_FLOAT_BOUND[out_dtype]: return None
  u = roundoff(accumulate_dtype(out_dtype)) if is_float(out_dtype) else 0.0
  err = (k * (v.err * w.bound + w.err * v.bound) + ROUNDING_ULPS * u * _summation_ulps(k) * bound +
         ROUNDING_ULPS * roundoff(out_dtype) * bound)
  grid = None if v.grid is None or w.grid is None else v.grid + w.grid
  if not is_float(v.dtype): grid = None if w.grid is None else w.grid
  if not is_float(w.dtype) and grid is None and v.grid is not None: grid = v.grid
  if not is_float(v.dtype) and not is_float(w.dtype): grid = 0
  exact = v.exact and w.exact and fits(bound, grid, out_dtype)
  return b.add("matmul", f"{v.name} @ {w.name}", f"R.matmul({v.name}, {w.name})", (v.name, w.name), shape,
               out_dtype, bound, 0.0 if exact else err, grid)

def gen_assign(b: Builder, v: Value) -> Optional[Value]:
  """`t = v.contiguous(); t[index] = value` (realized first or still lazy), where value is a scalar, a new tensor or
  a rearranged piece of v itself. contiguous() may return v's own buffer, as in torch, so v is not used again."""
  if v.ndim == 0 or v.terminal or (b.big and b.chance(0.5)): return None
  index_names: list[str] = []
  if b.chance(0.7): text, shape = _basic_index(b, v, allow_new_axes=False)
  else:
    made = _tensor_index(b, v) if not b.big else None
    if made is None or math.prod(made[1]) * v.numel > GATHER_COST_LIMIT: return None
    text, shape, index_values = made
    index_names = [w.name for w in index_values]
  if shape is None: return None
  r, value_inputs = b.rng.random(), []
  if r < 0.3:
    scalar = b.scalar_for(v.dtype, allow_float=False) if not is_float(v.dtype) else b.choice([0.5, -2.0, 3.25])
    value_code = value_mirror = _code(scalar)
    bound, err, value_grid, special = abs(float(scalar)), 0.0, _scalar_grid(scalar), False
  elif r < 0.5 and len(shape) >= 1:   # the target's own elements, rearranged: read before they are overwritten
    axis = b.rng.randrange(len(shape))
    value_code, value_mirror = f"{v.name}[{text}].flip({axis})", f"np.flip({v.name}[{text}], {axis})"
    bound, err, value_grid, special = v.bound, v.err, v.grid, v.special
  else:
    value = b.leaf(b.broadcast_partner_shape(shape) if b.chance(0.3) else shape, v.dtype if b.chance(0.7) else
                   b.choice(BASE_DTYPES))
    if _broadcast(value.shape, shape) != shape: return None
    if is_float(value.dtype) and not is_float(v.dtype):   # float into int: in range, never NaN
      if not value.agrees or value.special or is_unsigned(v.dtype): return None
      if value.bound >= min(abs(x) for x in int_limits(v.dtype) if x) - 1: return None
    value_code = value_mirror = value.name
    bound, err, value_grid, special = value.bound, value.err, value.grid, value.special
    if value.dtype != v.dtype and is_float(v.dtype): err += ROUNDING_ULPS * roundoff(v.dtype) * value.bound
    value_inputs = [value.name]
  name, realize = b.next_name(), ".realize()" if b.chance(0.5) else ""
  b.consumed.add(v.name)
  grid = None if v.grid is None or value_grid is None else max(v.grid, value_grid)
  inputs = tuple(dict.fromkeys([v.name, *value_inputs, *index_names]))
  return b.add("assign", f"{name} = {v.name}.contiguous(){realize}; {name}[{text}] = {value_code}",
               f"{name} = {v.name}.copy(); {name}[{text}] = {value_mirror}", inputs, v.shape, v.dtype,
               max(v.bound, bound), max(v.err, err), grid, special=v.special or special, statement=True)

def gen_composite(b: Builder, v: Value) -> Optional[Value]:
  """Tensor methods built from several primitives: var, std, log_softmax, tril, triu, one_hot."""
  kind, name = b.choice(["var", "std", "log_softmax", "tril", "triu", "one_hot"]), v.name
  if kind in ("tril", "triu"):
    if v.ndim < 2: return None
    diagonal = b.rng.randint(-3, 3)
    return b.add("composite", f"{name}.{kind}({diagonal})", f"np.{kind}({name}, {diagonal})", (name,), v.shape,
                 v.dtype, v.bound, v.err, v.grid)
  if kind == "one_hot":   # of int values that all lie in [0, classes)
    data = b.arrays[name]
    if not is_int(v.dtype) or (data.size and data.min() < 0): return None
    classes = (int(data.max()) + 1 if data.size else 1) + b.rng.randint(0, 2)
    if v.numel * classes > b.max_numel: return None
    return b.add("composite", f"{name}.one_hot({classes})", f"R.one_hot({name}, {classes})", (name,),
                 v.shape + (classes,), "int32", 1)
  if v.ndim == 0 or float_of(v.dtype) == "float16" and v.bound > 30: return None
  u, dt = roundoff(float_of(v.dtype)), float_of(v.dtype)
  if kind == "log_softmax":
    axis = b.rng.randrange(-v.ndim, v.ndim)
    if v.shape[axis] == 0: return None
    out = 2 * v.bound + math.log(v.shape[axis])
    computed = roundoff(accumulate_dtype(dt))   # in float32 for half floats, then rounded once
    err = 2 * v.err + TRANSCENDENTAL_ULPS * computed * (out + 4) + ROUNDING_ULPS * u * out
    return b.add("composite", f"{name}.log_softmax({axis})", f"R.log_softmax({name}, {axis})", (name,), v.shape, dt,
                 2 * v.bound + math.log(v.shape[axis]), err)
  axis, keepdim, correction = _axis_choice(b, v), b.chance(0.4), b.choice([0, 1, 1])
  shape, count = _reduced(v, axis, keepdim)
  if count - correction <= 0: return None
  variance = 4 * v.bound ** 2
  rounding = (ROUNDING_ULPS * u * _summation_ulps(count) + 4 * u) * variance * count / (count - correction)
  err = 4 * v.bound * v.err + rounding
  if variance > SAFE_FLOAT_BOUND[dt]: return None
  code = f"{name}.{kind}({axis!r}, keepdim={keepdim}, correction={correction})"
  mirror = f"R.var({name}, {axis!r}, {keepdim}, {correction})"
  if kind == "std": mirror, err = f"R.fn('sqrt', {mirror})", math.sqrt(err) + 4 * u * math.sqrt(variance)
  return b.add("composite", code, mirror, (name,), shape, dt, variance, err)

GENERATORS: dict[str, Callable[[Builder, Value], Optional[Value]]] = {
  "movement": gen_movement, "slice": gen_slice, "index": gen_index, "unary": gen_unary, "binary": gen_binary,
  "compare": gen_compare, "cast": gen_cast, "reduce": gen_reduce, "matmul": gen_matmul, "assign": gen_assign,
  "composite": gen_composite}

def build_case(seed: int, index: int) -> Case: return Builder(seed, index).build()

# ---------------------------------------------------------------------------------------------------------------
# running and comparing

@dataclass
class Failure:
  kind: str          # "exception", "dtype", "shape", "value", "reference" (the mirror itself failed: a fuzzer bug)
  category: str      # the category of the line that first goes wrong
  value: str         # its name
  message: str
  case: Optional[Case] = None
  lines: list[Line] = field(default_factory=list)

def _closure(case: Case, names: list[str]) -> list[Line]:
  by_name = {line.name: line for line in case.lines}
  needed, stack = set(), list(names)
  while stack:
    name = stack.pop()
    if name in needed: continue
    needed.add(name)
    stack.extend(by_name[name].inputs)
  return [line for line in case.lines if line.name in needed]

def run_reference(lines: list[Line], namespace: Optional[dict[str, Any]] = None) -> dict[str, Any]:
  """Run the mirror of `lines` (in `namespace`, which it extends, or a fresh one); returns the namespace."""
  if namespace is None: namespace = {}
  namespace.update(np=np, R=R, rng=rng)
  with np.errstate(all="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for line in lines:
      if line.statement: exec(line.mirror, namespace)
      else: namespace[line.name] = np.asarray(eval(line.mirror, namespace))
  return namespace

def run_tgrad(lines: list[Line], outputs: list[str], device: str) -> tuple[list, Optional[tuple[str, str]]]:
  """Build the lines in tgrad and realize the outputs: ([(dtype name, array)], None) or ([], (line name, error))."""
  from tgrad import Tensor, dtypes
  namespace: dict[str, Any] = {"Tensor": Tensor, "dtypes": dtypes, "np": np, "rng": rng, "DEVICE": device}
  current = ""
  try:
    for line in lines:
      current = line.name
      if line.statement: exec(line.tgrad, namespace)
      else: namespace[line.name] = eval(line.tgrad, namespace)
    current = outputs[0]
    tensors = [namespace[name] for name in outputs]
    tensors[0].realize(*tensors[1:])
    return [(t.dtype.name, t.numpy()) for t in tensors], None
  except Exception as error:   # any exception tgrad raises on a valid chain is a finding
    return [], (current, f"{type(error).__name__}: {error}".strip()[:600])

def compare(value: Value, dtype: str, got: np.ndarray, want: np.ndarray) -> Optional[tuple[str, str]]:
  """None if tgrad's (dtype, array) matches the mirror for this value, else (kind, message)."""
  if dtype != value.dtype or want.dtype.name != value.dtype:
    kind = "dtype" if want.dtype.name == value.dtype else "reference"
    return kind, f"dtype: tgrad {dtype}, mirror {want.dtype.name}, expected {value.dtype}"
  if got.shape != want.shape or want.shape != value.shape:
    kind = "shape" if want.shape == value.shape else "reference"
    return kind, f"shape: tgrad {got.shape}, mirror {want.shape}, expected {value.shape}"
  if not is_float(dtype):
    bad = got != want
    if not bad.any(): return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return "value", (f"{int(bad.sum())} of {bad.size} elements differ; at {where}: tgrad {got[where]!r}, "
                     f"want {want[where]!r}")
  got64, want64 = got.astype(np.float64), want.astype(np.float64)
  same_special = (np.isnan(got64) & np.isnan(want64)) | (np.isinf(want64) & (got64 == want64))
  if value.exact: tolerance = np.zeros_like(want64)
  else:
    with np.errstate(all="ignore"):
      tolerance = TOLERANCE_SAFETY * value.err + RELATIVE_ULPS * roundoff(dtype) * np.abs(want64)
      tolerance = np.where(np.isfinite(tolerance), tolerance, 0)
  with np.errstate(all="ignore"): error = np.abs(got64 - want64)
  bad = ~same_special & ~(error <= tolerance)
  if not bad.any(): return None
  where = tuple(int(i) for i in np.argwhere(bad)[0])
  kind = "exact" if value.exact else f"within {TOLERANCE_SAFETY * value.err:.3g} + {RELATIVE_ULPS} ulp"
  return "value", (f"{int(bad.sum())} of {bad.size} elements differ ({kind}); at {where}: tgrad {got64[where]!r}, want "
                   f"{want64[where]!r}, |err| {error[where]:.3g}")

def check(case: Case, lines: list[Line], outputs: list[str], device: str) -> Optional[Failure]:
  """Run the lines in both worlds and compare the outputs; None if they all match."""
  try: reference = run_reference(lines)
  except Exception as error:
    return Failure("reference", "fuzzer", outputs[0], f"the numpy mirror failed: {type(error).__name__}: {error}")
  results, problem = run_tgrad(lines, outputs, device)
  if problem is not None:
    name, message = problem
    category = next((line.category for line in lines if line.name == name), "?")
    return Failure("exception", category, name, message)
  for name, (dtype, got) in zip(outputs, results):
    verdict = compare(case.values[name], dtype, got, reference[name])
    if verdict is not None:
      category = next(line.category for line in case.lines if line.name == name)
      return Failure(verdict[0], category, name, verdict[1])
  return None

def minimize(case: Case, failure: Failure, device: str) -> Failure:
  """The shortest prefix of the chain whose last value already fails, with only the lines it needs."""
  if failure.kind == "reference":
    failure.lines = _closure(case, case.outputs)
    return failure
  for line in case.lines:
    if line.category == "leaf" or case.values[line.name].terminal and line.name != case.outputs[0]: continue
    lines = _closure(case, [line.name])
    found = check(case, lines, [line.name], device)
    if found is not None:
      found.lines = lines
      return found
    if line.name in case.outputs and line.name == failure.value: break
  failure.lines = _closure(case, case.outputs)
  return failure

def snippet(case: Case, failure: Failure, device: str) -> str:
  """A failure as runnable tgrad code, with the numpy mirror as comments."""
  last = failure.lines[-1].name if failure.lines else failure.value
  value = case.values.get(last)
  header = [f"# fuzz_ops seed {case.seed} case {case.index}: {failure.kind} in {failure.value} "
            f"({failure.category}): {failure.message}",
            f"# replay: python test/fuzz_ops.py --seed {case.seed} --case {case.index} --device {device}"]
  if value is not None: header.append(f"# expected {value.dtype} {value.shape}")
  body = ["import numpy as np", "from tgrad import Tensor, dtypes", f"DEVICE = {device!r}",
          "rng = lambda *key: np.random.default_rng(key)"]
  body += [line.code() for line in failure.lines]
  body.append(f"print({last}.numpy())")
  mirror = ["# numpy mirror (R = test/fuzz_ops.py's reference functions):"]
  mirror += [f"#   {line.mirror}" if line.statement else f"#   {line.name} = {line.mirror}" for line in failure.lines
             if line.category != "leaf"]
  return "\n".join(header + body + mirror)

def run_case(seed: int, index: int, device: str) -> tuple[Case, Optional[Failure]]:
  try: case = build_case(seed, index)
  except Exception:
    return Case(seed, index, False, [], {}, []), Failure("reference", "generator", "-", traceback.format_exc())
  failure = check(case, case.lines, case.outputs, device)
  if failure is not None:
    failure = minimize(case, failure, device)
    failure.case = case
  return case, failure

# ---------------------------------------------------------------------------------------------------------------
# the command line

def _set_device(device: str) -> str:
  """Choose the device before tgrad is imported (internal tensors follow DEVICE too) and open it; returns its
  canonical name. Raises ValueError for an unknown name or a device that cannot start."""
  os.environ["DEVICE"] = device
  from tgrad.device import Device, canonical_device
  name = canonical_device(device)
  try: Device[name]
  except Exception as error: raise ValueError(f"device {name} cannot start: {type(error).__name__}: {error}") from None
  return name

def check_cuda_codegen_too() -> None:
  """Every kernel the run builds is also optimized with the GPU heuristics, rendered as CUDA C and compiled by NVRTC
  for sm_90 (no GPU needed): a render or compile error raises inside the case, which then fails as an exception."""
  import tgrad.realize, tgrad.schedule_cache
  from cuda_codegen_check import checking_cuda
  tgrad.realize.get_runner = checking_cuda(tgrad.realize.get_runner, "fuzz_cuda_check")

def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default 0)")
  parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
  parser.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
  parser.add_argument("--case", type=int, default=None, help="run only this case index (replay a failure)")
  parser.add_argument("--device", default="LLVM", help="LLVM or CUDA (default LLVM)")
  parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long and say where to resume")
  parser.add_argument("--cuda-codegen-check", action="store_true",
                      help="also render and NVRTC-compile every kernel for sm_90 (no GPU needed)")
  parser.add_argument("--verbose", action="store_true", help="print each case's code before running it")
  parser.add_argument("--progress", type=int, default=250, help="print a progress line every N cases (0: never)")
  parser.add_argument("--keep-cache", action="store_true", help="use the normal kernel cache, not a throwaway one")
  args = parser.parse_args(argv)
  if args.cases < 0 or args.start < 0: parser.error("--cases and --start must be nonnegative")
  if not args.keep_cache and "TGRAD_CACHE" not in os.environ:   # compile every kernel, leave the user's cache alone
    os.environ["TGRAD_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="tgrad-fuzz-"), "cache.db")
  try: device = _set_device(args.device)
  except ValueError as error: parser.error(str(error))
  faulthandler.enable()   # a crash inside a kernel still prints where (rerun that --case with --verbose)
  if args.cuda_codegen_check: check_cuda_codegen_too()
  indices = [args.case] if args.case is not None else list(range(args.start, args.start + args.cases))
  import tgrad.realize, tgrad.schedule_cache
  tally: collections.Counter = collections.Counter()
  coverage: collections.Counter = collections.Counter()
  failures: list[Failure] = []
  start, done = time.perf_counter(), 0
  for index in indices:
    if done and done % RUNNER_CACHE_CASES == 0:   # the schedule cache's eager plans hold runners too
      tgrad.realize._runner_cache.clear()
      tgrad.schedule_cache.clear()
    if args.max_seconds and time.perf_counter() - start > args.max_seconds:
      print(f"stopped after {args.max_seconds:g} s: resume with --seed {args.seed} --start {index} "
            f"--cases {indices[-1] + 1 - index}", flush=True)
      break
    if args.verbose: print(f"--- case {index}", flush=True)
    case, failure = run_case(args.seed, index, device)
    done += 1
    if args.verbose: print("\n".join(line.code() for line in case.lines), flush=True)
    coverage.update({line.category for line in case.lines} - {"leaf"})
    if case.big: coverage["big case"] += 1
    if failure is None: tally["passed"] += 1
    else:
      failures.append(failure)
      tally[(failure.category, failure.kind)] += 1
      print((snippet(case, failure, device) if case.lines else failure.message) + "\n", flush=True)
    if args.progress and done % args.progress == 0:
      elapsed = time.perf_counter() - start
      print(f"[{done}/{len(indices)}] {len(failures)} failed, {done / elapsed:.2f} cases/s, "
            f"{tgrad.realize._kernel_counter} kernels compiled", flush=True)
  elapsed = time.perf_counter() - start
  print(f"== fuzz_ops seed {args.seed} on {device}: {done} cases, {tally['passed']} passed, {len(failures)} failed "
        f"in {elapsed:.1f} s ({done / max(elapsed, 1e-9):.2f} cases/s, "
        f"{tgrad.realize._kernel_counter} kernels compiled)")
  print("cases using each op category: " + ", ".join(f"{k} {v}" for k, v in sorted(coverage.items())))
  if failures:
    print("failures by category and kind: " + ", ".join(
      f"{category}/{kind} {count}" for (category, kind), count in sorted(
        (k, v) for k, v in tally.items() if k != "passed")))
  return 1 if failures else 0

if __name__ == "__main__":
  # python puts test/ first on the path: put this checkout's root before it, so the tgrad under test is this one
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
