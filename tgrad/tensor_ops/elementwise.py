"""Elementwise ops: arithmetic with broadcasting and promotion (+ − × ÷ // % **, maximum, where), comparisons and
bitwise ops (no gradient), unary math and activations (exp, log, sin, sigmoid, relu, gelu, ...), rounding, and the
Python operators (`a + b`, `a += b`, `a < b`, ...) that call them.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Optional
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops
from tgrad.tensor_ops.args import HALF_FLOATS, broadcast_shape, _scalar_dtype, _int_overflow_side, _python_dtype
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

LOG2_E = 1 / math.log(2)
LN2 = math.log(2)
GELU_CUBIC_COEFFICIENT = 0.044715       # the tanh approximation of GELU (Hendrycks & Gimpel)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
QUICK_GELU_SCALE = 1.702                # x·sigmoid(1.702x), the approximation CLIP uses
POW_UNROLL_LIMIT = 64                   # integer exponents up to this size become repeated multiplication

class ElementwiseMixin:
  """Tensor's elementwise methods and operators."""
  # ---- arithmetic
  def add(self, x: Any, reverse: bool = False) -> Tensor: return F.Add.apply(*self._operands(x, reverse))
  def sub(self, x: Any, reverse: bool = False) -> Tensor:
    a, b = self._operands(x, reverse)
    if a.dtype.is_bool: raise TypeError("subtraction of bool tensors: use ^ (logical xor) instead")
    return F.Sub.apply(a, b)
  def mul(self, x: Any, reverse: bool = False) -> Tensor: return F.Mul.apply(*self._operands(x, reverse))
  def div(self, x: Any, reverse: bool = False, rounding_mode: Optional[str] = None) -> Tensor:
    """True division (ints give floats); rounding_mode "floor" is `//`, "trunc" rounds toward zero."""
    if rounding_mode == "floor": return self.floordiv(x, reverse)
    a, b = self._operands(x, reverse)
    if rounding_mode == "trunc":
      return self._nograd(a.lazydata.alu(Ops.IDIV, b.lazydata)) if not a.dtype.is_float else (a / b).trunc()
    if rounding_mode is not None:
      raise ValueError(f"rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    return F.Div.apply(a._to_float(), b._to_float())
  def floordiv(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's `//`: rounds toward −∞. Integer division by zero gives 0 (as numpy)."""
    a, b = self._operands(x, reverse)
    if a.dtype.is_float: return (a / b).floor()
    if a.dtype.is_bool: a, b = a.int(), b.int()
    quotient = a.lazydata.alu(Ops.IDIV, b.lazydata)
    if a.dtype.is_unsigned: return self._nograd(quotient)
    return self._nograd(quotient) - _needs_floor_fix(a, b).cast(a.dtype)
  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's `%`: the result has the sign of the divisor. Integer x % 0 gives 0 (as numpy)."""
    a, b = self._operands(x, reverse)
    if a.dtype.is_float: return a - b * (a / b).floor()
    if a.dtype.is_bool: a, b = a.int(), b.int()
    remainder = self._nograd(a.lazydata.alu(Ops.MOD, b.lazydata))
    if a.dtype.is_unsigned: return remainder
    return _needs_floor_fix(a, b).where(remainder + b, remainder)
  def pow(self, exponent: Any, reverse: bool = False) -> Tensor:
    """numpy's `**`: negative bases with integer exponents keep their sign; with other exponents they give NaN."""
    if not reverse and isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
      if math.isfinite(exponent) and exponent == int(exponent) and abs(exponent) <= POW_UNROLL_LIMIT:
        if exponent < 0 and not self.dtype.is_float and not isinstance(exponent, float):
          raise ValueError(f"integers to negative integer powers are not allowed: {self.dtype} ** {exponent}")
        base = self.int() if self.dtype.is_bool else self
        base = base.cast(_scalar_dtype(base.dtype, exponent))
        power = _power_by_squaring(base, abs(int(exponent)))
        return power.reciprocal() if exponent < 0 else power
      if exponent == 0.5: return self._to_float().sqrt()
    base, power = self._operands(exponent, reverse)
    if base.dtype.is_bool: base, power = base.int(), power.int()
    if base.dtype.is_float: return _float_pow(base, power)
    return _int_pow(base, power)
  def maximum(self, x: Any) -> Tensor:
    a, b = self._operands(x)
    if a.dtype.is_bool: return a | b
    return F.Maximum.apply(a, b)
  def minimum(self, x: Any) -> Tensor:
    a, b = self._operands(x)
    if a.dtype.is_bool: return a & b
    return a._order_flip().maximum(b._order_flip())._order_flip()
  def _order_flip(self) -> Tensor:
    """An order-reversing bijection: −x for floats, ~x for ints (no overflow), not for bools."""
    return -self if self.dtype.is_float else ~self
  def where(self, x: Any, y: Any) -> Tensor:
    """`cond.where(a, b)`: a where cond is true, else b (broadcast and promoted like a binary op)."""
    condition = self if self.dtype.is_bool else self != 0
    if isinstance(x, Tensor): a, b = x._operands(y)
    elif isinstance(y, Tensor): b, a = y._operands(x)
    else: a, b = Tensor(x, dtype=_python_dtype([x, y]), device=self.device)._operands(y)
    shape = broadcast_shape(condition.shape, a.shape)
    return F.Where.apply(condition._broadcast_to(shape), a._broadcast_to(shape), b._broadcast_to(shape))
  def lerp(self, end: Any, weight: Any) -> Tensor: return self + (end - self) * weight

  # ---- comparisons and bitwise (no gradient)
  def _compare(self, op: Ops, other: Any, reverse: bool = False) -> Tensor:
    a, b = self._operands(other, reverse)
    return self._nograd(a.lazydata.alu(op, b.lazydata))
  def _compare_out_of_range(self, x: Any, below_if_above: bool) -> Optional[Tensor]:
    """A comparison with a Python int the int dtype can't hold has one answer everywhere, as in numpy 2:
    `below_if_above` is the answer when x is above the dtype's range (self < x, self <= x, self != x)."""
    side = _int_overflow_side(_scalar_dtype(self.dtype, x), x) if isinstance(x, int) else 0
    if not side: return None
    return Tensor.full(self.shape, below_if_above == (side > 0), dtype=dtypes.bool, device=self.device)
  def __lt__(self, x: Any) -> Tensor:
    known = self._compare_out_of_range(x, True)
    return known if known is not None else self._compare(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> Tensor:
    known = self._compare_out_of_range(x, False)
    return known if known is not None else self._compare(Ops.CMPLT, x, reverse=True)
  def __le__(self, x: Any) -> Tensor:
    if (known := self._compare_out_of_range(x, True)) is not None: return known
    a, b = self._operands(x)
    if a.dtype.is_float: return (a < b) | (a == b)      # NaN-correct: NaN <= anything is False
    return (b < a).logical_not()
  def __ge__(self, x: Any) -> Tensor:
    if (known := self._compare_out_of_range(x, False)) is not None: return known
    a, b = self._operands(x)
    return b <= a
  def __ne__(self, x: Any) -> Tensor:  # type: ignore[override]
    if isinstance(x, int) and _int_overflow_side(_scalar_dtype(self.dtype, x), x):
      return Tensor.full(self.shape, True, dtype=dtypes.bool, device=self.device)
    return self._compare(Ops.CMPNE, x)
  def __eq__(self, x: Any) -> Tensor: return (self != x).logical_not()  # type: ignore[override]
  def logical_not(self) -> Tensor:
    if self.dtype.is_bool: return self._nograd(self.lazydata.alu(Ops.CMPNE, self.lazydata.const(True)))
    return self == 0
  def _bitwise(self, op: Ops, other: Any, reverse: bool, name: str) -> Tensor:
    a, b = self._int_operands(other, reverse, name)
    return self._nograd(a.lazydata.alu(op, b.lazydata))
  def bitwise_and(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.AND, x, reverse, "&")
  def bitwise_or(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.OR, x, reverse, "|")
  def xor(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.XOR, x, reverse, "^")
  def bitwise_not(self) -> Tensor:
    if self.dtype.is_float: raise TypeError(f"~ needs an int or bool tensor, got {self.dtype}")
    if self.dtype.is_bool: return self.logical_not()
    return self._nograd(self.lazydata.alu(Ops.XOR, self.lazydata.const(-1 if not self.dtype.is_unsigned else
                                                                       dtypes.max(self.dtype))))
  def _shift(self, amount: Any, reverse: bool, left: bool) -> Tensor:
    x, shift = self._int_operands(amount, reverse, "<<" if left else ">>")
    if x.dtype.is_bool: x, shift = x.int(), shift.int()
    bits = x.dtype.bits
    if isinstance(amount, int) and not reverse and not 0 <= amount < bits:
      raise ValueError(f"shift amount {amount} is outside [0, {bits}) for {x.dtype}")
    in_range = (shift >= 0) & (shift < bits)
    safe = in_range.where(shift, 0)
    shifted = self._nograd(x.lazydata.alu(Ops.SHL if left else Ops.SHR, safe.lazydata))
    overflow = 0 if left or x.dtype.is_unsigned else (x < 0).where(-1, 0)   # numpy: shifting out every bit
    return in_range.where(shifted, overflow).cast(x.dtype)
  def lshift(self, x: Any, reverse: bool = False) -> Tensor: return self._shift(x, reverse, left=True)
  def rshift(self, x: Any, reverse: bool = False) -> Tensor: return self._shift(x, reverse, left=False)

  # ---- unary math
  def neg(self) -> Tensor:
    if self.dtype.is_bool: raise TypeError("negation of a bool tensor: use logical_not or ~ instead")
    return F.Neg.apply(self)
  def _float_math(self, fn) -> Tensor:
    """Apply a float function; float16/bfloat16 inputs are computed in float32 and rounded back once."""
    x = self._to_float()
    return fn(x.cast(dtypes.float32)).cast(x.dtype) if x.dtype in HALF_FLOATS else fn(x)
  def exp2(self) -> Tensor: return self._float_math(F.Exp2.apply)
  def log2(self) -> Tensor: return self._float_math(F.Log2.apply)
  def exp(self) -> Tensor: return self._float_math(lambda x: F.Exp2.apply(x * LOG2_E))
  def log(self) -> Tensor: return self._float_math(lambda x: F.Log2.apply(x) * LN2)
  def sqrt(self) -> Tensor: return self._float_math(F.Sqrt.apply)
  def rsqrt(self) -> Tensor: return self._float_math(lambda x: F.Reciprocal.apply(F.Sqrt.apply(x)))
  def reciprocal(self) -> Tensor: return self._float_math(F.Reciprocal.apply)
  def sin(self) -> Tensor: return self._float_math(F.Sin.apply)
  def cos(self) -> Tensor: return self._float_math(lambda x: F.Sin.apply((math.pi / 2) - x))
  def tan(self) -> Tensor: return self._float_math(lambda x: F.Sin.apply(x) / F.Sin.apply((math.pi / 2) - x))
  def square(self) -> Tensor: return self * self
  def sigmoid(self) -> Tensor: return self._float_math(F.Sigmoid.apply)
  def tanh(self) -> Tensor: return self._float_math(lambda x: 2.0 * F.Sigmoid.apply(2.0 * x) - 1.0)
  def relu(self) -> Tensor: return F.Relu.apply(self)
  def relu6(self) -> Tensor: return self.relu() - (self - 6).relu()
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor: return self.relu() - (-self).relu() * neg_slope
  def elu(self, alpha: float = 1.0) -> Tensor:
    negative_part = (self._to_float().minimum(0).exp() - 1) * alpha   # exp(min(x, 0)): finite, and so is its grad
    return (self > 0).where(self._to_float(), negative_part)
  def gelu(self) -> Tensor:
    x = self._to_float()
    return 0.5 * x * (1 + (SQRT_2_OVER_PI * (x + GELU_CUBIC_COEFFICIENT * x * x * x)).tanh())
  def quick_gelu(self) -> Tensor: return self * (self * QUICK_GELU_SCALE).sigmoid()
  def silu(self) -> Tensor: return self * self.sigmoid()
  def swish(self) -> Tensor: return self.silu()
  def softplus(self, beta: float = 1.0) -> Tensor:
    x = self._to_float() * beta   # log(1 + eˣ) = relu(x) + log(1 + e^−|x|): never overflows
    return (x.relu() + ((-x.abs()).exp() + 1).log()) * (1 / beta)
  def mish(self) -> Tensor: return self * self.softplus().tanh()
  def abs(self) -> Tensor:
    if self.dtype.is_bool or self.dtype.is_unsigned: return self
    return self.maximum(-self)
  def sign(self) -> Tensor:
    """−1, 0 or 1 (NaN stays NaN); no gradient."""
    x = self.detach()
    if x.dtype.is_bool: return x
    signs = (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype) if not x.dtype.is_unsigned else (x > 0).cast(x.dtype)
    return x.isnan().where(x, signs) if x.dtype.is_float else signs
  def clip(self, min_: Any = None, max_: Any = None) -> Tensor:
    """torch.clamp: NaN stays NaN, and the gradient is 1 wherever min_ <= x <= max_ (bounds included)."""
    if min_ is None and max_ is None: raise ValueError("clip needs min_ or max_")
    if self.dtype.is_int:   # a Python int bound beyond the dtype clips nothing on that side (numpy's np.clip)
      min_, max_ = (_clamp_to_dtype(b, self.dtype) if isinstance(b, int) else b for b in (min_, max_))
    out = self if min_ is None else (self < min_).where(min_, self)
    return out if max_ is None else (out > max_).where(max_, out)
  def clamp(self, min_: Any = None, max_: Any = None) -> Tensor: return self.clip(min_, max_)
  def isnan(self) -> Tensor: return self != self if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    out = self.full_like(False, dtype=dtypes.bool)
    if not self.dtype.is_float: return out
    if detect_positive: out = out | (self == math.inf)
    return out | (self == -math.inf) if detect_negative else out
  def trunc(self) -> Tensor:
    if not self.dtype.is_float: return self
    return self._nograd(self.lazydata.alu(Ops.TRUNC))
  def floor(self) -> Tensor:
    if not self.dtype.is_float: return self
    truncated = self.trunc()
    return (self.detach() < truncated).where(truncated - 1, truncated)
  def ceil(self) -> Tensor:
    if not self.dtype.is_float: return self
    truncated = self.trunc()
    return (self.detach() > truncated).where(truncated + 1, truncated)
  def round(self) -> Tensor:
    """Round half to even, as numpy."""
    if not self.dtype.is_float: return self
    x = self.detach()
    low = x.floor()
    fraction = x - low                      # exact in floating point
    low_is_even = (low * 0.5).floor() * 2 == low
    round_up = (fraction > 0.5) | ((fraction == 0.5) & low_is_even.logical_not())
    return round_up.where(-(-low - 1), low)   # = low + 1, but −0.0 for x in [−0.5, 0), as numpy

  # ---- operators
  def __neg__(self) -> Tensor: return self.neg()
  def __invert__(self) -> Tensor: return self.bitwise_not()
  def __abs__(self) -> Tensor: return self.abs()
  def __add__(self, x) -> Tensor: return self.add(x)
  def __sub__(self, x) -> Tensor: return self.sub(x)
  def __mul__(self, x) -> Tensor: return self.mul(x)
  def __truediv__(self, x) -> Tensor: return self.div(x)
  def __floordiv__(self, x) -> Tensor: return self.floordiv(x)
  def __mod__(self, x) -> Tensor: return self.mod(x)
  def __pow__(self, x) -> Tensor: return self.pow(x)
  def __matmul__(self, x) -> Tensor: return self.matmul(x)
  def __and__(self, x) -> Tensor: return self.bitwise_and(x)
  def __or__(self, x) -> Tensor: return self.bitwise_or(x)
  def __xor__(self, x) -> Tensor: return self.xor(x)
  def __lshift__(self, x) -> Tensor: return self.lshift(x)
  def __rshift__(self, x) -> Tensor: return self.rshift(x)
  def __radd__(self, x) -> Tensor: return self.add(x, reverse=True)
  def __rsub__(self, x) -> Tensor: return self.sub(x, reverse=True)
  def __rmul__(self, x) -> Tensor: return self.mul(x, reverse=True)
  def __rtruediv__(self, x) -> Tensor: return self.div(x, reverse=True)
  def __rfloordiv__(self, x) -> Tensor: return self.floordiv(x, reverse=True)
  def __rmod__(self, x) -> Tensor: return self.mod(x, reverse=True)
  def __rpow__(self, x) -> Tensor: return self.pow(x, reverse=True)
  def __rmatmul__(self, x) -> Tensor: return self.matmul(x, reverse=True)
  def __rand__(self, x) -> Tensor: return self.bitwise_and(x, reverse=True)
  def __ror__(self, x) -> Tensor: return self.bitwise_or(x, reverse=True)
  def __rxor__(self, x) -> Tensor: return self.xor(x, reverse=True)
  def __rlshift__(self, x) -> Tensor: return self.lshift(x, reverse=True)
  def __rrshift__(self, x) -> Tensor: return self.rshift(x, reverse=True)
  def __iadd__(self, x) -> Tensor: return self._inplace(self._snapshot() + x)
  def __isub__(self, x) -> Tensor: return self._inplace(self._snapshot() - x)
  def __imul__(self, x) -> Tensor: return self._inplace(self._snapshot() * x)
  def __itruediv__(self, x) -> Tensor: return self._inplace(self._snapshot() / x)
  def __ifloordiv__(self, x) -> Tensor: return self._inplace(self._snapshot() // x)
  def __imod__(self, x) -> Tensor: return self._inplace(self._snapshot() % x)
  def __ipow__(self, x) -> Tensor: return self._inplace(self._snapshot() ** x)
  def __imatmul__(self, x) -> Tensor: return self._inplace(self._snapshot() @ x)
  def __iand__(self, x) -> Tensor: return self._inplace(self._snapshot() & x)
  def __ior__(self, x) -> Tensor: return self._inplace(self._snapshot() | x)
  def __ixor__(self, x) -> Tensor: return self._inplace(self._snapshot() ^ x)
  def __ilshift__(self, x) -> Tensor: return self._inplace(self._snapshot() << x)
  def __irshift__(self, x) -> Tensor: return self._inplace(self._snapshot() >> x)

def _needs_floor_fix(a: Tensor, b: Tensor) -> Tensor:
  """Where C's truncating division differs from floor division: a nonzero remainder whose sign differs from b's."""
  remainder = Tensor(a.lazydata.alu(Ops.MOD, b.lazydata), requires_grad=False)
  return (remainder != 0) & ((remainder < 0) != (b < 0))

def _clamp_to_dtype(value: int, dtype: DType) -> int: return min(max(value, dtypes.min(dtype)), dtypes.max(dtype))

def _power_by_squaring(base: Tensor, exponent: int) -> Tensor:
  if exponent == 0: return base.ones_like()
  result: Optional[Tensor] = None
  square = base
  while exponent:
    if exponent & 1: result = square if result is None else result * square
    exponent >>= 1
    if exponent: square = square * square
  assert result is not None
  return result

def _float_pow(base: Tensor, exponent: Tensor) -> Tensor:
  """|b|^e through exp2/log2, then numpy's sign rules: a negative base keeps a sign for integer e, else NaN."""
  magnitude = (exponent * base.abs().log2()).exp2()
  integer_exponent = exponent == exponent.trunc()
  half = exponent.detach() * 0.5
  odd_exponent = integer_exponent & (half != half.trunc())
  negative = base.detach() < 0
  signed = (negative & odd_exponent).where(-magnitude, magnitude)
  out = (negative & integer_exponent.logical_not()).where(math.nan, signed)
  return ((exponent.detach() == 0) | (base.detach() == 1)).where(1.0, out)

def _int_pow(base: Tensor, exponent: Tensor) -> Tensor:
  """Integer power by squaring over the exponent's bits. A negative exponent gives 1/b^|e| rounded toward 0:
  1 for b = 1, ±1 for b = −1, 0 otherwise (numpy raises instead)."""
  base, exponent = base.detach(), exponent.detach()
  result, square = base.ones_like(), base
  for bit in range(exponent.dtype.bits - (0 if exponent.dtype.is_unsigned else 1)):
    result = ((exponent & (1 << bit)) != 0).where(result * square, result)
    square = square * square
  if exponent.dtype.is_unsigned: return result
  odd = (exponent & 1) != 0
  negative_power = (base == 1).where(1, (base == -1).where(odd.where(-1, 1), 0))
  return (exponent < 0).where(negative_power.cast(base.dtype), result)
