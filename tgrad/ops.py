"""The one node type, UOp, its op set with exact semantics, and the pattern-rewrite engine.

A `UOp(op, dtype, src, arg)` is immutable and hash-consed: building the same node twice returns the same object,
so equality is identity and common subexpressions are shared. `uop.key` is a content hash that is stable across
processes (the kernel-cache key). Integer UOps know their value range (`vmin`, `vmax`), which is what index
simplification (`symbolic`) runs on. `graph_rewrite(root, PatternMatcher([...]))` rewrites a graph to a fixpoint.
Every walk over a graph (hashing, ranges, toposort, rewriting, substitution, rendering) keeps its own stack, so graph
depth is bounded by memory, not by Python's recursion limit (a chain of 100,000 ops is an ordinary graph).
"""
from __future__ import annotations
import hashlib, math, struct, weakref
import numpy as np
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Callable, Optional
from tgrad.dtype import DType, dtypes

class Ops(Enum):
  """Every op of every level. Semantics of the ALU ops (what `exec_alu` computes, and what renderers must emit):

  EXP2, LOG2, SIN, SQRT, TANH: IEEE float functions (an EXP2/LOG2/TANH arg may name how a kernel computes it:
  see tgrad/tensor_ops/composite.py; None is the renderer's default). RECIP(x) = 1/x (RECIP(0) = inf); a float32
  RECIP(SQRT(x)) may be computed as one reciprocal square root within 2 ulp (CUDA's rsqrtf, as Tensor.rsqrt).
  NEG(x) = -x. TRUNC rounds a float toward zero. ADD, MUL: wrap around on integers (two's complement). FDIV: IEEE
  float division.
  IDIV: integer division rounding toward zero (C); IDIV(x, 0) = 0. MOD: remainder with the sign of the dividend
  (C `%`), so IDIV(a, b) * b + MOD(a, b) == a; MOD(x, 0) = 0. On floats MOD is C's fmod, exact: fmod(x, 0) and
  fmod(±inf, y) are NaN, fmod(x, ±inf) = x. MAX: the larger value, NaN if either is NaN.
  CMPLT (a < b) and CMPNE (a != b) return bool; any comparison with NaN is False except CMPNE, which is True.
  AND, OR, XOR: bitwise on ints and bools. SHL, SHR: shifts by an amount in [0, bits); SHR is arithmetic for
  signed, logical for unsigned. WHERE(c, a, b) = a if c else b. CAST converts value (float→int truncates; an
  out-of-range float→int cast gives an unspecified value, never a fault); BITCAST reinterprets the bits.
  """
  # by identity, in C: Enum's own hash is a Python call (hash of the name), paid by every key holding an op (the
  # schedule cache hashes one per node of each eager op); members are singletons, so equality is identity anyway
  __hash__ = object.__hash__
  # kernel AST and linear program structure
  SINK = auto(); DEFINE_GLOBAL = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto(); DEFINE_VAR = auto()  # noqa: E702
  SPECIAL = auto(); RANGE = auto(); ENDRANGE = auto(); IF = auto(); ENDIF = auto(); BARRIER = auto()  # noqa: E702
  # a symbolic dimension's value: src=(DEFINE_VAR, CONST value). Shapes above the scheduler hold BINDs; the scheduler
  # replaces each by its DEFINE_VAR (so kernels key on the variable, not the value) and passes the values at launch
  BIND = auto()
  VIEW = auto(); LOAD = auto(); STORE = auto(); CONST = auto(); REDUCE_AXIS = auto(); ASSIGN = auto()  # noqa: E702
  # fragments (tensor cores): VECTORIZE src=(x0..xn-1) of one dtype is a fragment of n values (its dtype is the
  # elements'); GEP src=(fragment,), arg=i is its element i; WMMA src=(a, b, c) fragments, arg=TensorCore (see
  # codegen/renderer.py), is one warp's D = A·B + C: the new c fragment, dtype the accumulator's. A LOAD with
  # arg=MatrixLoad (codegen/renderer.py) from shared memory is a fragment too: the warp loads it cooperatively, each
  # lane passing the address in src[1] of one row of one 8×8 matrix
  VECTORIZE = auto(); GEP = auto(); WMMA = auto()  # noqa: E702
  # a warp exchange (linear level, targets with Renderer.warp_lanes): src=(value,), arg=an int m; each lane gets the
  # value of the lane whose id is its own xor m. Every lane of the warp must reach it together (straight-line code)
  SHUFFLE_XOR = auto()
  # linear level: src=(value, *ranges), arg=(reduce op, accumulator id, unrolled terms[, True]): reads the accumulator;
  # the value is a left chain of `terms` unrolled values combined with the reduce op; a 4th field True makes an ADD
  # compensated (Kahan: a second accumulator carries the rounding error; the linearizer emits it). With reduce op WMMA
  # the value is a chain of WMMAs that reads the accumulator fragment (a DEFINE_ACC of a VECTORIZE) and replaces it
  REDUCE = auto()
  # lazy-graph ops that are not ALU
  EMPTY = auto(); COPY = auto(); CONTIGUOUS = auto()  # noqa: E702
  ARANGE = auto()   # a leaf whose value at flat position i of its buffer is i (AST: src=(VIEW,), masked → 0)
  # a data-dependent load. Lazy graph: src=(table, index), arg=axis; index has the output's shape, table the same
  # except along axis (its size there is the table's): out[i] = table[i with i[axis] := index[i]]. Kernel AST: a LOAD
  # src=(DEFINE_GLOBAL, index value, VIEW), arg=GatherAxis: VIEW maps the output position to the table row at
  # axis 0, and the address adds clamp(index value, 0, size - 1) · stride (a read never leaves the table)
  GATHER = auto()
  # a value computed outside the kernel pipeline. Lazy graph: src=(inputs), arg=a CustomKernel (tgrad/custom.py: a host
  # function, or a user kernel in CUDA C / LLVM IR) that writes the output buffer from the realized, row-major inputs;
  # the scheduler always realizes it and its sources (as COPY). Schedule AST: a sourceless UOp with the same arg
  CUSTOM = auto()
  # a collective over several devices (tgrad/multi/collectives.py). Lazy graph: one node per device (rank i on the
  # device of src i), src=(the shards, one per device, in rank order), arg=CollectiveArg (what it computes, the rank,
  # and the token its sibling nodes share); the scheduler realizes every sibling and every source together as one
  # step over all the devices' buffers. Schedule AST: a sourceless UOp, arg=the CollectiveArg's spec (kind, op)
  COLLECTIVE = auto()
  # unary ALU
  EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto(); TRUNC = auto()  # noqa: E702
  TANH = auto()   # the "native" lowering of the tanh composite (tensor_ops/composite.py), not Tensor.tanh's default
  CAST = auto(); BITCAST = auto()  # noqa: E702
  # binary ALU
  ADD = auto(); MUL = auto(); IDIV = auto(); FDIV = auto(); MOD = auto(); MAX = auto()  # noqa: E702
  CMPLT = auto(); CMPNE = auto(); AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()  # noqa: E702
  # ternary ALU
  WHERE = auto()
  # a reduce op only (REDUCE_AXIS/REDUCE arg[0], never an ALU node): log(e^a + e^b), the combine of an online
  # log-sum-exp. Associative and commutative, identity -inf; -inf with -inf is -inf, +inf wins over any non-NaN value,
  # NaN propagates (as torch.logsumexp). The linearizer keeps its state as two accumulators (codegen/reduces.py) in
  # the source's dtype; the REDUCE_AXIS's own dtype, that of its result, may be a wider float (LazyBuffer.r)
  LOGADDEXP = auto()
  def __repr__(self): return f"Ops.{self.name}"

@dataclass(frozen=True)
class GatherAxis:
  """The data-dependent part of a gather LOAD's address: `clamp(index value, 0, size - 1) · stride` elements on top
  of what its VIEW gives. The clamp makes every read land in the table whatever the index buffer holds (bad indices
  raise IndexError through tgrad/bounds.py; the kernel itself stays memory-safe)."""
  size: int
  stride: int

@dataclass(frozen=True)
class CollectiveSpec:
  """What a COLLECTIVE step computes over its devices' buffers (rank r: the r-th device), by `kind`:
    "all_reduce"      every output is the inputs combined elementwise with `op` (ADD, MUL or MAX), in rank order;
    "all_gather"      every output is the inputs joined end to end, in rank order (n times an input's size);
    "reduce_scatter"  output r is block r of the inputs combined with `op` in rank order (an n-th of an input);
    "broadcast"       one input, on rank `root`, which is that rank's output too (written nowhere): the outputs are the
                      other ranks' copies of it, in rank order.
  The schedule AST's arg."""
  kind: str
  op: Optional["Ops"] = None
  root: int = 0

class CollectiveGroup:
  """The token the nodes of one collective share (one per output device): how the scheduler finds a node's siblings.
  It holds them weakly: a sibling no one reads any more gets a scratch output on its device (`devices`, the nodes'
  devices in order). `made` counts the groups of the process (the scheduler looks for siblings only once there are
  any)."""
  made = 0
  def __init__(self, devices: tuple = ()):
    self.members: list = []   # weak references to the nodes, in order
    self.devices = tuple(devices)
    CollectiveGroup.made += 1

@dataclass(frozen=True)
class CollectiveArg:
  """A COLLECTIVE node's arg: the spec, its rank (its index among the step's outputs: its device's rank, but for a
  broadcast, whose root has no node), and its group. Equal
  args mean the same structure: the group is identity, not structure (the schedule cache keys graphs by structure)."""
  spec: CollectiveSpec
  rank: int
  group: CollectiveGroup = field(compare=False, repr=False)

def is_gather_load(u: UOp) -> bool:
  """Whether an AST node is a gather LOAD: its address along one axis comes from a loaded value (see GatherAxis)."""
  return u.op is Ops.LOAD and isinstance(u.arg, GatherAxis)

UNARY = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC, Ops.TANH}
BINARY = {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.FDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR,
          Ops.SHL, Ops.SHR}
TERNARY = {Ops.WHERE}
ALU = UNARY | BINARY | TERNARY
ELEMENTWISE = ALU | {Ops.CAST, Ops.BITCAST}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
COMPARISON = {Ops.CMPLT, Ops.CMPNE}
REDUCE_OPS = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.LOGADDEXP}   # the reductions REDUCE_AXIS can do (its arg[0])
FLOAT_ONLY_REDUCES = {Ops.LOGADDEXP}

def identity_of_reduce(op: Ops, dtype: DType) -> object:
  """The value a reduce of nothing gives (and its accumulator starts from): 0 for ADD, 1 for MUL, the least value for
  MAX, -inf for LOGADDEXP (log 0)."""
  if op is Ops.LOGADDEXP: return -math.inf
  return {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(dtype)}[op]

# ---------------------------------------------------------------------------------------------------------------
# exact semantics in Python: constant folding, and the oracle the rewrite fuzzers compare against

def _wrap_int(x: int, dtype: DType) -> int:
  bits = dtype.bits
  x &= (1 << bits) - 1
  return x - (1 << bits) if dtype.kind == 'i' and x >= (1 << (bits - 1)) else x

def truncate_to(x, dtype: DType):
  """A Python value as the dtype holds it: wrapped ints, rounded floats, bools."""
  if dtype.is_bool: return bool(x)
  if dtype.is_int:
    if isinstance(x, float):
      if not math.isfinite(x): return 0
      x = int(x)
    return _wrap_int(int(x), dtype)
  if dtype in (dtypes.float32, dtypes.float16):   # round to the format; out-of-range values become ±inf
    with np.errstate(over="ignore"): return float(np.array(x, dtype=dtype.np))
  if dtype == dtypes.bfloat16: return _round_bfloat16(float(x))
  return float(x)

def _round_bfloat16(x: float) -> float:
  """float32 rounding, then to the nearest bfloat16 (ties to even), as the kernels do."""
  if not math.isfinite(x): return x
  with np.errstate(over="ignore"): bits = int(np.array(x, dtype=np.float32).view(np.uint32))
  bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
  return float(np.array(bits, dtype=np.uint32).view(np.float32))

def _c_idiv(a: int, b: int) -> int:
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b >= 0) else -q

def _c_mod(a, b):
  if isinstance(a, float) or isinstance(b, float):   # C fmod, exact
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b): return math.nan
    return a if math.isinf(b) else math.fmod(a, b)
  return 0 if b == 0 else a - _c_idiv(a, b) * b

def _safe(fn, *args):
  try: return fn(*args)
  except (OverflowError, ValueError, ZeroDivisionError): return math.nan

def _fdiv(a, b):
  if b == 0: return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
  return a / b

def _logaddexp(a: float, b: float) -> float:
  """log(e^a + e^b) in float64, as the LOGADDEXP reduce combines (see Ops): equal infinities give themselves."""
  if math.isnan(a) or math.isnan(b): return math.nan
  high, low = max(a, b), min(a, b)
  if high == low and math.isinf(high): return high
  return high + math.log1p(math.exp(low - high))

def _max(a, b):
  if isinstance(a, float) and math.isnan(a): return a
  if isinstance(b, float) and math.isnan(b): return b
  return max(a, b)

_PY_ALU: dict[Ops, Callable] = {
  Ops.EXP2: lambda x: _safe(lambda v: 2.0 ** v if v < 1024 else math.inf, x),
  Ops.LOG2: lambda x: -math.inf if x == 0 else math.nan if x < 0 or math.isnan(x) else _safe(math.log2, x),
  Ops.SIN: lambda x: _safe(math.sin, x), Ops.SQRT: lambda x: math.sqrt(x) if x >= 0 else math.nan,
  Ops.TANH: math.tanh,
  Ops.RECIP: lambda x: _fdiv(1.0, x), Ops.NEG: lambda x: -x,
  Ops.TRUNC: lambda x: x if not math.isfinite(x) else math.copysign(float(math.trunc(x)), x),   # trunc(-0.5) = -0.0
  Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.FDIV: _fdiv, Ops.IDIV: _c_idiv, Ops.MOD: _c_mod,
  Ops.MAX: _max, Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
  Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
  Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.WHERE: lambda c, a, b: a if c else b,
  Ops.LOGADDEXP: _logaddexp,   # a reduce's combine: exec_alu is its oracle (no kernel has a LOGADDEXP ALU node)
}

def exec_alu(op: Ops, dtype: DType, operands: tuple):
  """Evaluate one ALU op on Python values exactly as the kernels do; the result is truncated to `dtype`."""
  if op is Ops.SHR and dtype.is_unsigned: return truncate_to(operands[0] >> operands[1], dtype)
  return truncate_to(_PY_ALU[op](*operands), dtype)

# ---------------------------------------------------------------------------------------------------------------
# UOp

def _arg_identity(arg):
  """What makes two args the same for hash-consing: -0.0 differs from 0.0, NaN equals NaN, 1 differs from True."""
  if isinstance(arg, float): return ("f", struct.pack("<d", arg))
  if isinstance(arg, tuple): return tuple(_arg_identity(a) for a in arg)
  if isinstance(arg, bool): return ("b", arg)
  return arg

def _stable_repr(arg) -> str:
  if isinstance(arg, UOp): return f"uop:{arg.key}"
  if hasattr(arg, "stable_repr"): return arg.stable_repr()   # ShapeTrackers: a complete text even with UOp sizes
  if isinstance(arg, Enum): return f"{type(arg).__name__}.{arg.name}"
  if isinstance(arg, float): return struct.pack("<d", arg).hex()
  if isinstance(arg, tuple): return "(" + ",".join(_stable_repr(a) for a in arg) + ")"
  return repr(arg)

class SymbolicState:
  """Whether any variable was ever bound: until then no shape holds one, and the scheduler skips looking for them."""
  bound = False

def symbolic_in_use() -> bool: return SymbolicState.bound

# index constants kept alive and found without building their identity (the oldest dropped past this many)
INDEX_CONST_MEMO = 4096
_index_consts: dict[int, UOp] = {}

class UOp:
  """An immutable, hash-consed node. Use the operators (+, *, //, %, .lt, .ne, .where, ...) to build index math."""
  __slots__ = ("op", "dtype", "src", "arg", "_key", "_bounds", "__weakref__")
  _interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
    identity = (op, dtype, src, _arg_identity(arg))
    if (existing := UOp._interned.get(identity)) is not None: return existing
    self = object.__new__(cls)
    object.__setattr__(self, "op", op)
    object.__setattr__(self, "dtype", dtype)
    object.__setattr__(self, "src", src)
    object.__setattr__(self, "arg", arg)
    object.__setattr__(self, "_key", None)
    object.__setattr__(self, "_bounds", None)
    UOp._interned[identity] = self
    return self
  def __setattr__(self, name, value): raise AttributeError("UOp is immutable")
  def __reduce__(self):   # the whole graph as a flat list (children first), so pickling never recurses down it
    nodes = self.toposort()
    position = {u: i for i, u in enumerate(nodes)}
    return (_graph_from_list, ([(u.op, u.dtype, tuple(position[s] for s in u.src), u.arg) for u in nodes],))
  def __repr__(self):
    if self.op in (Ops.DEFINE_VAR, Ops.BIND) or (self.op in ALU and self.dtype is dtypes.index and all(
        u.op in ALU or u.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND) for u in self.toposort())):
      return f"<{self.render()}>"   # a symbolic size, as it reads: <n=3>, <(n*64)>
    return f"UOp({self.op}, {self.dtype}, arg={self.arg!r}, src=({', '.join(s.op.name for s in self.src)}))"

  @property
  def key(self) -> str:
    """A sha256 over op, dtype, arg and the children's keys: stable across processes and Python hash seeds."""
    if self._key is None:
      for u in _unfilled_below(self, "_key"):   # children first, so each node hashes its children's keys
        h = hashlib.sha256(f"{u.op.name}|{u.dtype.name}|{_stable_repr(u.arg)}|".encode())
        for s in u.src: h.update(s._key.encode())
        object.__setattr__(u, "_key", h.hexdigest())
    return self._key

  # --- construction helpers
  @staticmethod
  def const(dtype: DType, value) -> UOp:
    if type(value) is int and dtype is dtypes.index:   # index math's constants: most of the linearizer's consts
      if (known := _index_consts.get(value)) is None:
        known = _index_consts[value] = UOp(Ops.CONST, dtype, (), truncate_to(value, dtype))
        if len(_index_consts) > INDEX_CONST_MEMO: _index_consts.pop(next(iter(_index_consts)))
      return known
    return UOp(Ops.CONST, dtype, (), truncate_to(value, dtype))
  @staticmethod
  def variable(name: str, min_value: int, max_value: int, dtype: DType = dtypes.index) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_value, max_value))
  def bind(self, value: int) -> UOp:
    """This variable standing for `value`: a BIND usable as a dimension; out of its bounds is a ValueError."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"only a Variable can be bound, not {self.render()}")
    name, lo, hi = self.arg
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise TypeError(f"Variable {name!r} can only be bound to an int, got {value!r}")
    if not lo <= value <= hi:
      raise ValueError(f"Variable {name!r} is bounded to [{lo}, {hi}]: it can't be bound to {value}")
    SymbolicState.bound = True
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, int(value))))
  def unbind(self) -> tuple[UOp, int]:
    """(the variable, its value) of a BIND."""
    if self.op is not Ops.BIND: raise TypeError(f"{self.render()} is not a bound variable")
    return self.src[0], self.src[1].arg
  def _lift(self, x) -> UOp: return x if isinstance(x, UOp) else UOp.const(self.dtype, x)
  def alu(self, op: Ops, *others) -> UOp:
    srcs = (self, *(self._lift(o) for o in others))
    out_dtype = dtypes.bool if op in COMPARISON else (srcs[1].dtype if op is Ops.WHERE else self.dtype)
    return UOp(op, out_dtype, srcs)
  def __add__(self, x): return self.alu(Ops.ADD, x)
  def __radd__(self, x): return self._lift(x).alu(Ops.ADD, self)
  def __mul__(self, x): return self.alu(Ops.MUL, x)
  def __rmul__(self, x): return self._lift(x).alu(Ops.MUL, self)
  def __neg__(self): return self.alu(Ops.NEG) if self.dtype.is_float else self * -1
  def __sub__(self, x): return self + (-self._lift(x))
  def __rsub__(self, x): return self._lift(x) + (-self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, x)
  def __mod__(self, x): return self.alu(Ops.MOD, x)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x)
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def lt(self, x) -> UOp: return self.alu(Ops.CMPLT, x)
  def ne(self, x) -> UOp: return self.alu(Ops.CMPNE, x)
  def eq(self, x) -> UOp: return self.ne(x).logical_not()
  def logical_not(self) -> UOp: return self.alu(Ops.CMPNE, True)
  def maximum(self, x) -> UOp: return self.alu(Ops.MAX, x)
  def where(self, a, b) -> UOp:
    a = a if isinstance(a, UOp) else (b.const_like(a) if isinstance(b, UOp) else UOp.const(dtypes.index, a))
    return UOp(Ops.WHERE, a.dtype, (self, a, a._lift(b)))
  def cast(self, dtype: DType) -> UOp: return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))
  def const_like(self, value) -> UOp: return UOp.const(self.dtype, value)
  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    """This graph with every node of `mapping` replaced (its own sources are not looked at)."""
    memo: dict[UOp, UOp] = {}
    for u in self.toposort():   # children first
      if u in mapping: memo[u] = mapping[u]
      else:
        new_src = tuple(memo[s] for s in u.src)
        memo[u] = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
    return memo[self]

  def toposort(self) -> list[UOp]:
    """Every node below and including self, children before parents."""
    order: list[UOp] = []
    seen: set[int] = set()
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, expanded = stack.pop()
      if id(node) in seen: continue
      if expanded:
        seen.add(id(node))
        order.append(node)
        continue
      stack.append((node, True))
      stack.extend((s, False) for s in reversed(node.src) if id(s) not in seen)
    return order

  # --- value ranges
  @property
  def vmin(self): return self._range()[0]
  @property
  def vmax(self): return self._range()[1]
  def _range(self) -> tuple:
    if self._bounds is None:   # children first, so _compute_range finds every child's range already known
      for u in _unfilled_below(self, "_bounds"): object.__setattr__(u, "_bounds", _compute_range(u))
    return self._bounds

  def render(self) -> str:
    """A readable infix form of index math, for messages and tests."""
    out: list[str] = []
    pending: list = [self]   # text still to write, in reverse: strings and nodes still to expand
    while pending:
      item = pending.pop()
      if isinstance(item, str): out.append(item)
      else: pending.extend(reversed(_render_pieces(item)))
    return "".join(out)

_RENDER_SYMBOLS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
                   Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.FDIV: "/"}

def _render_pieces(u: UOp) -> list:
  """One node of UOp.render: its text around its sources, which are rendered in their place."""
  if u.op is Ops.CONST: return [str(u.arg)]
  if u.op is Ops.DEFINE_VAR: return [u.arg[0]]
  if u.op is Ops.BIND: return [u.src[0].arg[0], f"={u.src[1].arg}"]
  if u.op in (Ops.RANGE, Ops.SPECIAL): return [str(u.arg[0]) if isinstance(u.arg, tuple) else f"r{u.arg}"]
  if u.op in _RENDER_SYMBOLS: return ["(", u.src[0], _RENDER_SYMBOLS[u.op], u.src[1], ")"]
  if u.op is Ops.WHERE: return ["(", u.src[0], "?", u.src[1], ":", u.src[2], ")"]
  pieces: list = [f"{u.op.name.lower()}("]
  for i, s in enumerate(u.src): pieces += [", ", s] if i else [s]
  return pieces + [")"]

def _unfilled_below(root: UOp, slot: str) -> list[UOp]:
  """The nodes below and including `root` whose cached `slot` (_key, _bounds) is still None, children first; the walk
  stops at nodes that have it. An explicit stack: graphs may be far deeper than Python's recursion limit."""
  order: list[UOp] = []
  seen: set[UOp] = set()
  stack: list[tuple[UOp, bool]] = [(root, False)]
  while stack:
    node, expanded = stack.pop()
    if expanded:
      order.append(node)
      continue
    if node in seen: continue
    seen.add(node)
    stack.append((node, True))
    stack.extend((s, False) for s in node.src if getattr(s, slot) is None and s not in seen)
  return order

def _graph_from_list(nodes: list[tuple]) -> UOp:
  """UOp.__reduce__'s inverse: rebuild (op, dtype, source positions, arg) entries, children first; the last is the
  root."""
  built: list[UOp] = []
  for op, dtype, src, arg in nodes: built.append(UOp(op, dtype, tuple(built[i] for i in src), arg))
  return built[-1]

def _dtype_range(dtype: DType) -> tuple:
  if dtype.is_bool: return (False, True)
  if dtype.is_int: return (dtypes.min(dtype), dtypes.max(dtype))
  return (-math.inf, math.inf)

def _compute_range(u: UOp) -> tuple:
  if u.op is Ops.CONST: return (u.arg, u.arg)
  if u.op is Ops.DEFINE_VAR: return (u.arg[1], u.arg[2])
  if u.op is Ops.BIND: return u.src[0]._range()   # the variable's bounds: what is simplified holds for every value
  if u.op is Ops.RANGE: return (u.src[0].vmin, u.src[1].vmax - 1)
  if u.op is Ops.SPECIAL: return (0, (u.arg[1].vmax if isinstance(u.arg[1], UOp) else u.arg[1]) - 1)
  if not (u.dtype.is_int or u.dtype.is_bool) or u.op not in ALU | {Ops.CAST}: return _dtype_range(u.dtype)
  full = _dtype_range(u.dtype)
  s = [x._range() for x in u.src]
  def clamp(lo, hi): return (lo, hi) if full[0] <= lo and hi <= full[1] else full
  if u.op is Ops.ADD: return clamp(s[0][0] + s[1][0], s[0][1] + s[1][1])
  if u.op is Ops.MUL:
    corners = [a * b for a in s[0] for b in s[1]]
    return clamp(min(corners), max(corners))
  if u.op is Ops.NEG: return clamp(-s[0][1], -s[0][0])
  if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST and u.src[1].arg == 0: return (0, 0)  # x//0 = x%0 = 0
  if u.op is Ops.IDIV and u.src[1].op is Ops.CONST:   # C division is monotonic in the dividend
    corners = [_c_idiv(a, u.src[1].arg) for a in s[0]]
    return clamp(min(corners), max(corners))
  if u.op is Ops.MOD and u.src[1].op is Ops.CONST:    # sign of the dividend, magnitude below |divisor|
    c, (lo, hi) = abs(u.src[1].arg), s[0]
    if lo >= 0: return (lo, hi) if hi < c else (0, c - 1)
    if hi <= 0: return (lo, hi) if lo > -c else (-(c - 1), 0)
    return (max(lo, -(c - 1)), min(hi, c - 1))
  if u.op is Ops.MAX: return (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
  if u.op is Ops.WHERE: return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
  if u.op is Ops.CAST:
    return s[0] if full[0] <= s[0][0] and s[0][1] <= full[1] and not u.src[0].dtype.is_float else full
  if u.op is Ops.CMPLT and u.dtype.is_bool:
    if s[0][1] < s[1][0]: return (True, True)
    if s[0][0] >= s[1][1]: return (False, False)
  if u.op is Ops.CMPNE and u.dtype.is_bool:
    if s[0][1] < s[1][0] or s[1][1] < s[0][0]: return (True, True)
    if s[0][0] == s[0][1] == s[1][0] == s[1][1]: return (False, False)
  if u.op is Ops.AND and u.dtype.is_bool: return (s[0][0] and s[1][0], s[0][1] and s[1][1])
  if u.op is Ops.OR and u.dtype.is_bool: return (s[0][0] or s[1][0], s[0][1] or s[1][1])
  return full

# ---------------------------------------------------------------------------------------------------------------
# patterns

class UPat:
  """A pattern over UOps. `op`/`dtype` may be one value or a tuple of allowed ones; `src` is a tuple (in order),
  a list (in any order, for commutative ops) or a single UPat every source must match; `name` captures the node.
  A name used twice must capture the same node."""
  __slots__ = ("op", "dtype", "src", "arg", "name")
  def __init__(self, op=None, dtype=None, src=None, arg=None, name: Optional[str] = None):
    self.op = (op,) if isinstance(op, Ops) else op
    self.dtype = (dtype,) if isinstance(dtype, DType) else dtype
    self.src, self.arg, self.name = src, arg, name
  @staticmethod
  def var(name: Optional[str] = None, dtype=None) -> UPat: return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: Optional[str] = None, dtype=None) -> UPat: return UPat(Ops.CONST, dtype=dtype, name=name)

  def match(self, u: UOp, captures: dict) -> bool:
    if self.op is not None and u.op not in self.op: return False
    if self.dtype is not None and u.dtype not in self.dtype: return False
    if self.arg is not None and u.arg != self.arg: return False
    if self.name is not None:
      if (prev := captures.get(self.name)) is not None and prev is not u: return False
    if self.src is not None:
      if isinstance(self.src, UPat):
        if not all(self.src.match(s, captures) for s in u.src): return False
      elif isinstance(self.src, list):
        if len(self.src) != len(u.src): return False
        for order in ((0, 1), (1, 0)) if len(u.src) == 2 else ((tuple(range(len(u.src)))),):
          trial = dict(captures)
          if all(p.match(u.src[i], trial) for p, i in zip(self.src, order)):
            captures.update(trial)
            break
        else: return False
      else:
        if len(self.src) != len(u.src) or not all(p.match(s, captures) for p, s in zip(self.src, u.src)): return False
    if self.name is not None: captures[self.name] = u
    return True

class PatternMatcher:
  """An ordered list of (UPat, fn) rules; fn gets the captures as keyword arguments and returns a UOp or None."""
  def __init__(self, rules: list[tuple[UPat, Callable]]):
    self.rules = rules
    self.by_op: dict[Optional[Ops], list[tuple[UPat, Callable]]] = {}
    for pat, fn in rules:
      for op in (pat.op or (None,)): self.by_op.setdefault(op, []).append((pat, fn))
  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)
  def rewrite(self, u: UOp) -> Optional[UOp]:
    for pat, fn in self.by_op.get(u.op, []) + self.by_op.get(None, []):
      captures: dict = {}
      if pat.match(u, captures):
        out = fn(**{k: v for k, v in captures.items()})
        if out is not None and out is not u: return out
    return None

# graph_rewrite's stack entries: what to do next with a node
_VISIT, _REBUILD, _ADOPT = 0, 1, 2

def graph_rewrite(root: UOp, matcher: PatternMatcher) -> UOp:
  """Rewrite children first, then apply the rules at each node until none matches (a fixpoint). A node's result is
  rewritten again, so `memo` maps every node seen to its fixpoint. Depth-first with an explicit stack, sources in
  order: the rules see nodes in the order a recursive walk would, at any graph depth."""
  memo: dict[UOp, UOp] = {}
  in_progress: set[UOp] = set()
  stack: list[tuple[int, UOp, Optional[UOp]]] = [(_VISIT, root, None)]
  while stack:
    action, u, replacement = stack.pop()
    if action is _VISIT:
      if u in memo: continue
      if u in in_progress: raise RuntimeError(f"graph_rewrite: the rules rewrite {u} into a graph that contains it")
      in_progress.add(u)
      stack.append((_REBUILD, u, None))
      stack.extend((_VISIT, s, None) for s in reversed(u.src))
      continue
    if action is _REBUILD:
      new_src = tuple(memo[s] for s in u.src)
      node = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
      if (replacement := matcher.rewrite(node)) is not None:   # rewrite the replacement, then adopt its fixpoint
        stack.append((_ADOPT, u, replacement))
        stack.append((_VISIT, replacement, None))
        continue
    else: node = memo[replacement]
    in_progress.discard(u)
    memo[u] = node
    memo[node] = node
  return memo[root]

# ---------------------------------------------------------------------------------------------------------------
# symbolic: integer and boolean index simplification, every rule value-preserving (fuzzed in test_symbolic.py)

def split_terms(x: UOp) -> tuple[dict[UOp, int], int]:
  """x as Σ coefficient·term + constant, looking through ADD and MUL-by-constant."""
  terms: dict[UOp, int] = {}
  constant = 0
  pending = [(x, 1)]   # (node, scale), left operand on top: terms are met in left-to-right order
  while pending:
    u, scale = pending.pop()
    if u.op is Ops.CONST: constant += u.arg * scale
    elif u.op is Ops.ADD: pending += [(u.src[1], scale), (u.src[0], scale)]
    elif u.op is Ops.MUL and u.src[1].op is Ops.CONST: pending.append((u.src[0], scale * u.src[1].arg))
    elif u.op is Ops.MUL and u.src[0].op is Ops.CONST: pending.append((u.src[1], scale * u.src[0].arg))
    else: terms[u] = terms.get(u, 0) + scale
  return {t: c for t, c in terms.items() if c != 0}, constant

def build_sum(terms: dict[UOp, int], constant: int, dtype: DType) -> UOp:
  out: Optional[UOp] = None
  for term, coef in terms.items():
    piece = term if coef == 1 else term * UOp.const(dtype, coef)
    out = piece if out is None else out + piece
  if out is None: return UOp.const(dtype, constant)
  return out if constant == 0 else out + UOp.const(dtype, constant)

def _fits(value: int, dtype: DType) -> bool: return dtypes.min(dtype) <= value <= dtypes.max(dtype)

def _sum_range(terms: dict[UOp, int], constant: int) -> tuple[int, int]:
  """The exact-integer range of Σ coefficient·term + constant (no wraparound), from the terms' ranges."""
  lo = hi = constant
  for t, a in terms.items():
    lo, hi = lo + min(a * t.vmin, a * t.vmax), hi + max(a * t.vmin, a * t.vmax)
  return lo, hi

MAX_RESIDUE_SEARCH_TERMS = 6   # _split_quotient tries both signs of each residue for at most this many terms

def _split_quotient(terms: dict[UOp, int], constant: int, divisor: int, dtype: DType) -> Optional[tuple[UOp, UOp]]:
  """Write x = Σ aᵢ·tᵢ + k as divisor·q + r with 0 <= r < divisor everywhere, or None. Each aᵢ keeps a residue of
  either sign (aᵢ mod divisor, or that minus divisor), the narrowest choices first; the constant then follows."""
  residue_terms = [t for t, a in terms.items() if a % divisor != 0]
  if len(residue_terms) > MAX_RESIDUE_SEARCH_TERMS: return None
  choices = []
  for signs in range(1 << len(residue_terms)):
    residues = {t: terms[t] % divisor - (divisor if signs >> bit & 1 else 0) for bit, t in enumerate(residue_terms)}
    lo, hi = _sum_range(residues, 0)
    choices.append((hi - lo, lo, hi, residues))
  for width, lo, hi, residues in sorted(choices, key=lambda choice: choice[0]):
    if width >= divisor: break
    residue_constant = -lo + (constant + lo) % divisor   # the one r constant (≡ k) that lifts r's minimum into [0, d)
    if hi + residue_constant >= divisor: continue
    quotient = {t: (a - residues.get(t, 0)) // divisor for t, a in terms.items() if a != residues.get(t, 0)}
    return (build_sum(quotient, (constant - residue_constant) // divisor, dtype),
            build_sum({t: r for t, r in residues.items() if r != 0}, residue_constant, dtype))
  return None

def _fold_div_mod(x: UOp, c: UOp, is_mod: bool) -> Optional[UOp]:
  """(Σ aᵢ·tᵢ + k) // c and % c for c > 0: for nonnegative x take out what c divides; a common gcd of c and every
  coefficient divides through (C division of exact multiples, any sign)."""
  divisor = c.arg
  terms, constant = split_terms(x)
  if divisor <= 0 or not all(_fits(v, x.dtype) for v in _sum_range(terms, constant)): return None   # no wraparound
  if x.vmin >= 0:
    # x = c·q + r exactly with 0 <= r < c: x // c = q and x % c = r
    if terms and (split := _split_quotient(terms, constant, divisor, x.dtype)) is not None:
      return split[1] if is_mod else split[0]
    # else take out only the terms that are exact multiples of c: x = c·q + r with r >= 0 gives x // c = q + r // c
    multiples = {t: a // divisor for t, a in terms.items() if a % divisor == 0}
    if multiples:
      rest = build_sum({t: a for t, a in terms.items() if a % divisor != 0}, constant, x.dtype)
      if rest.vmin >= 0: return rest % c if is_mod else build_sum(multiples, 0, x.dtype) + rest // c
  g = math.gcd(divisor, constant, *terms.values())
  if g > 1 and not is_mod and _fits(divisor // g, x.dtype):
    return build_sum({t: a // g for t, a in terms.items()}, constant // g, x.dtype) // UOp.const(x.dtype, divisor // g)
  return None

def _fold_const_alu(u: UOp) -> Optional[UOp]:
  if all(s.op is Ops.CONST for s in u.src) and u.src:
    try: return UOp.const(u.dtype, exec_alu(u.op, u.dtype, tuple(s.arg for s in u.src)))
    except (TypeError, OverflowError): return None
  return None

def _collapse_range(u: UOp) -> Optional[UOp]:
  """An int/bool ALU node whose range is a single value is that constant."""
  if (u.dtype.is_int or u.dtype.is_bool) and u.op in ALU and u.vmin == u.vmax: return UOp.const(u.dtype, u.vmin)
  return None

def _canonical_sum(u: UOp) -> Optional[UOp]:
  """A sum (or a scaled sum) in one form: like terms combined, in order of first appearance, the constant last."""
  canonical = build_sum(*split_terms(u), u.dtype)
  return canonical if canonical is not u else None

def _recombine_div_mod(u: UOp) -> Optional[UOp]:
  """(x // c) * c + x % c == x for any x (C semantics keep this identity for negatives too)."""
  terms, constant = split_terms(u)
  for t, coef in terms.items():
    if t.op is Ops.IDIV and t.src[1].op is Ops.CONST and coef == t.src[1].arg:
      partner = t.src[0] % t.src[1]
      if terms.get(partner) == 1:
        rest = {k: v for k, v in terms.items() if k is not t and k is not partner}
        rest[t.src[0]] = rest.get(t.src[0], 0) + 1
        return build_sum({k: v for k, v in rest.items() if v != 0}, constant, u.dtype)
  return None

def _fold_linear_cmp(x: UOp, bound: int, bound_on_left: bool) -> Optional[UOp]:
  """`x < bound` (or `bound < x`) for a sum x = d·z + s + k where the small part s cannot change the answer: the
  same comparison of z alone, with the constant k moved over. Exact integer reasoning, so only without wraparound."""
  terms, constant = split_terms(x)
  if not terms or not all(_fits(v, x.dtype) for v in _sum_range(terms, constant)): return None
  limit = bound - constant
  for d in sorted({abs(a) for a in terms.values()}, reverse=True):
    multiples = {t: a // d for t, a in terms.items() if a % d == 0}
    small_lo, small_hi = _sum_range({t: a for t, a in terms.items() if a % d != 0}, 0)
    if bound_on_left:   # limit < d·z + s  <=>  z >= ceil((limit + 1 - s) / d)
      lowest, highest = -((small_hi - limit - 1) // d), -((small_lo - limit - 1) // d)
    else:               # d·z + s < limit  <=>  z <= (limit - 1 - s) // d
      lowest, highest = (limit - 1 - small_hi) // d, (limit - 1 - small_lo) // d
    if lowest != highest: continue
    # z >= lowest (bound on the left) or z <= lowest; with z's first coefficient negative, compare -z instead
    if next(iter(multiples.values())) < 0:
      multiples, lowest, bound_on_left = {t: -a for t, a in multiples.items()}, -lowest, not bound_on_left
    z = build_sum(multiples, 0, x.dtype)
    if not all(_fits(v, x.dtype) for v in (*_sum_range(multiples, 0), lowest - 1, lowest + 1)): return None
    return UOp.const(x.dtype, lowest - 1).lt(z) if bound_on_left else z.lt(lowest + 1)
  return None

def _fold_div_cmp(x: UOp, d: int, bound: int, bound_on_left: bool) -> Optional[UOp]:
  """x // d < c  <=>  x < c·d, and c < x // d  <=>  (c+1)·d - 1 < x, for d > 0 (C division: needs c > 0 or x >= 0)."""
  if d <= 0: return None
  threshold = bound + 1 if bound_on_left else bound
  if not (threshold > 0 or x.vmin >= 0) or not _fits(threshold * d, x.dtype): return None
  return UOp.const(x.dtype, threshold * d - 1).lt(x) if bound_on_left else x.lt(threshold * d)

_INT = tuple(dt for dt in dtypes.all() if dt.is_int)
_INT_OR_BOOL = _INT + (dtypes.bool,)
_x, _y, _c1, _c2 = UPat.var("x"), UPat.var("y"), UPat.cvar("c1"), UPat.cvar("c2")
_TRUE = UPat(Ops.CONST, arg=True)

symbolic = PatternMatcher([
  # constants and ranges
  (UPat(tuple(ALU), name="u"), _fold_const_alu),
  (UPat(tuple(ALU), name="u"), _collapse_range),
  # identities
  (UPat(Ops.ADD, dtype=_INT, src=[_x, UPat(Ops.CONST, arg=0)]), lambda x: x),   # floats: -0.0 + 0 is +0.0
  (UPat(Ops.MUL, src=[_x, UPat(Ops.CONST, arg=1)]), lambda x: x),
  (UPat(Ops.MUL, dtype=_INT, src=[_x, UPat(Ops.CONST, arg=0, name="z")]), lambda x, z: z),
  (UPat(Ops.IDIV, src=(_x, UPat(Ops.CONST, arg=1))), lambda x: x),
  (UPat(Ops.MOD, dtype=_INT, src=(_x, UPat(Ops.CONST, arg=1))), lambda x: x.const_like(0)),
  (UPat(Ops.NEG, dtype=_INT, src=(_x,)), lambda x: x * -1),   # int negation is a scaled term, so sums see it
  # sums: one canonical form, so like terms meet
  (UPat(Ops.ADD, dtype=_INT, name="u"), _canonical_sum),
  (UPat(Ops.ADD, dtype=_INT, name="u"), _recombine_div_mod),
  (UPat(Ops.MUL, dtype=_INT, src=[UPat.var(), UPat(Ops.CONST)], name="u"), _canonical_sum),   # also c*x -> x*c
  # division and modulo; a negative divisor only flips the sign of C division, and does nothing to C modulo
  (UPat(Ops.IDIV, dtype=_INT, src=(_x, _c1)),
   lambda x, c1: (x // -c1.arg) * -1 if c1.arg < 0 and _fits(-c1.arg, x.dtype) else None),
  (UPat(Ops.MOD, dtype=_INT, src=(_x, _c1)),
   lambda x, c1: x % -c1.arg if c1.arg < 0 and _fits(-c1.arg, x.dtype) else None),
  (UPat(Ops.IDIV, dtype=_INT, src=(_x, _c1)), lambda x, c1: _fold_div_mod(x, c1, is_mod=False)),
  (UPat(Ops.MOD, dtype=_INT, src=(_x, _c1)), lambda x, c1: _fold_div_mod(x, c1, is_mod=True)),
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(_x, _c1)), _c2)),
   lambda x, c1, c2: x % c2 if c2.arg > 0 and c1.arg != 0 and c1.arg % c2.arg == 0 else None),
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(_x, _c1)), _c2)),
   lambda x, c1, c2: x // (c1.arg * c2.arg) if c1.arg > 0 and c2.arg > 0 and _fits(c1.arg * c2.arg, x.dtype) else None),
  # booleans and selects
  (UPat(Ops.AND, dtype=dtypes.bool, src=[_x, _TRUE]), lambda x: x),
  (UPat(Ops.AND, dtype=dtypes.bool, src=[_x, UPat(Ops.CONST, arg=False, name="f")]), lambda x, f: f),
  (UPat(Ops.OR, dtype=dtypes.bool, src=[_x, UPat(Ops.CONST, arg=False)]), lambda x: x),
  (UPat(Ops.OR, dtype=dtypes.bool, src=[_x, UPat(Ops.CONST, arg=True, name="t")]), lambda x, t: t),
  (UPat(Ops.AND, src=(_x, _x)), lambda x: x),
  (UPat(Ops.OR, src=(_x, _x)), lambda x: x),
  (UPat(Ops.CMPNE, dtype=dtypes.bool, src=(UPat(Ops.CMPNE, dtype=dtypes.bool, src=(_x, _TRUE)), _TRUE)),
   lambda x: x if x.dtype is dtypes.bool else None),   # not not x
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), _x, _y)), lambda c, x, y: x if c.arg else y),
  (UPat(Ops.WHERE, src=(UPat.var(), _x, _x)), lambda x: x),
  # comparisons: x < x is False (also for NaN); x != x is False for ints and bools
  (UPat(Ops.CMPLT, src=(_x, _x), name="u"), lambda x, u: u.const_like(False)),
  (UPat(Ops.CMPNE, src=(UPat.var("x", dtype=_INT_OR_BOOL), UPat.var("x")), name="u"), lambda x, u: u.const_like(False)),
  # comparisons of int sums with a constant: drop what cannot change the answer, move the constant over
  (UPat(Ops.CMPLT, src=(UPat(Ops.IDIV, dtype=_INT, src=(_x, _c1)), _c2)),
   lambda x, c1, c2: _fold_div_cmp(x, c1.arg, c2.arg, bound_on_left=False)),
  (UPat(Ops.CMPLT, src=(_c2, UPat(Ops.IDIV, dtype=_INT, src=(_x, _c1)))),
   lambda x, c1, c2: _fold_div_cmp(x, c1.arg, c2.arg, bound_on_left=True)),
  (UPat(Ops.CMPLT, src=(UPat.var("x", dtype=_INT), _c1)),
   lambda x, c1: _fold_linear_cmp(x, c1.arg, bound_on_left=False)),
  (UPat(Ops.CMPLT, src=(_c1, UPat.var("x", dtype=_INT))),
   lambda x, c1: _fold_linear_cmp(x, c1.arg, bound_on_left=True)),
  (UPat(Ops.MAX, src=[_x, _y]), lambda x, y: x if x.dtype.is_int and x.vmin >= y.vmax else None),
  (UPat(Ops.MAX, src=(_x, _x)), lambda x: x),
])

# simplify is a pure function of its (interned, immutable) UOp: results are remembered across calls, so the same
# index expression built again (every layer of a model, every kernel reading one view) is simplified once. Cleared
# when full (the entries keep their UOps alive).
SIMPLIFY_MEMO_LIMIT = 1 << 16
_simplified: dict[UOp, UOp] = {}

def simplify(u: UOp) -> UOp:
  """u in the `symbolic` rules' canonical form (a fixpoint: simplify(simplify(u)) is simplify(u))."""
  if (done := _simplified.get(u)) is not None: return done
  out = graph_rewrite(u, symbolic)
  if len(_simplified) >= SIMPLIFY_MEMO_LIMIT: _simplified.clear()
  _simplified[u] = _simplified[out] = out
  return out
