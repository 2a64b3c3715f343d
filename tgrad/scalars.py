"""Python scalars as kernel parameters: one compiled kernel serves `x * c` for every value of c.

A Python scalar operand of an elementwise op (`x * 0.3`, `2 - x`, `x < c`, `x ** 3.5`) is a *lifted* constant unless
its value is one the simplifiers fold (`is_liftable`): a 0-d CONST base with `lifted` set (LazyBuffer.const_of with
weak=True). The schedule cache keys it without its value; the scheduler makes it a scalar parameter of its kernel
(`scalar_param`: a DEFINE_VAR of the value's carrier dtype) and puts the value, as its 64-bit pattern (`param_bits`),
in the item's var_vals, which every runtime already passes to kernels as 64-bit arguments; the renderers reinterpret
the pattern. See docs/scalars.md.
"""
from __future__ import annotations
import math, struct
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, UOp

# A scalar parameter is named SCALAR_PARAM_PREFIX + its number in the kernel (by first use in the AST): isomorphic
# kernels get the same names, hence the same AST key. Variables of symbolic shapes may not use these names.
SCALAR_PARAM_PREFIX = "scalar"
# Values kept as literals: what graph_simplify and the codegen fold (x + 0, x · 1, x · 0 on ints, −x as x · −1,
# identities of reduces and pads), and the non-finite values masks and reduce starts use (±inf, NaN). Compared with
# ==, so 0 also keeps −0.0 literal (x + −0.0 is folded to x).
LITERAL_VALUES = (0, 1, -1)

def is_liftable(value, dtype: DType) -> bool:
  """Whether a weak Python scalar of `dtype` becomes a kernel parameter: any int or float value but the literal ones.
  Bools (two values) and symbolic constants (UOps, computed in the kernel) stay as they are."""
  if dtype.is_bool or type(value) not in (int, float) or value in LITERAL_VALUES: return False
  return not isinstance(value, float) or math.isfinite(value)

def carrier(dtype: DType) -> DType:
  """The dtype a parameter for a constant of `dtype` is passed in: float64, float32 (also for float16 and bfloat16,
  converted in the kernel: their values are float32 values) or int64 (any int, converted in the kernel)."""
  if not dtype.is_float: return dtypes.int64
  return dtypes.float64 if dtype.itemsize == 8 else dtypes.float32   # by size: no dtype compares (every eager op)

def param_bits(value, dtype: DType) -> int:
  """The 64-bit argument that carries `value` (already rounded to `dtype`, as const_of does): a float's IEEE bits
  (float32 in the low 32), an int wrapped to int64, as a signed int64 (how runtimes pack a variable)."""
  kind = carrier(dtype)
  if kind is dtypes.float64: return struct.unpack("<q", struct.pack("<d", value))[0]
  if kind is dtypes.float32: return struct.unpack("<i", struct.pack("<f", value))[0]
  value &= (1 << 64) - 1
  return value - (1 << 64) if value >= 1 << 63 else value

def param_value(bits: int, param: UOp):
  """`param_bits`' inverse for a scalar parameter: the value the kernel sees (tests and DEBUG read var_vals so)."""
  if param.dtype == dtypes.float64: return struct.unpack("<d", struct.pack("<q", bits))[0]
  if param.dtype == dtypes.float32: return struct.unpack("<f", struct.pack("<i", bits & 0xFFFFFFFF))[0]
  return bits

def param_name(index: int) -> str: return f"{SCALAR_PARAM_PREFIX}{index}"

def scalar_param(index: int, dtype: DType) -> UOp:
  """Parameter `index` of a kernel, for a constant of `dtype`: a DEFINE_VAR of its carrier dtype (not dtypes.index,
  which is what tells it from a symbolic size's variable), bounded by the carrier's range."""
  kind = carrier(dtype)
  return UOp.variable(param_name(index), dtypes.min(kind), dtypes.max(kind), kind)

def is_scalar_param(u: UOp) -> bool: return u.op is Ops.DEFINE_VAR and u.dtype != dtypes.index
