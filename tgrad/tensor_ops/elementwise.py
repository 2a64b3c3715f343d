"""Elementwise ops: arithmetic with broadcasting and promotion (+ − × ÷ // % **, maximum, where), comparisons and
bitwise ops (no gradient), unary math and activations (exp, log, sin, sigmoid, relu, gelu, ...), rounding, and the
Python operators (`a + b`, `a += b`, `a < b`, ...) that call them.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Optional
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops
from tgrad.lazy import LazyBuffer
from tgrad.multi import MultiLazyBuffer
from tgrad.tensor_ops.args import HALF_FLOATS, broadcast_shape, _scalar_dtype, _int_overflow_side, _python_dtype, \
  _check_scalar_fits, DTypeNotSupportedError
from tgrad.regions import composite
from tgrad.tensor_ops.composite import LN2
import tgrad.function as F
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

QUICK_GELU_SCALE = 1.702                # x·sigmoid(1.702x), the approximation CLIP uses
POW_UNROLL_LIMIT = 64                   # positive integer exponents up to this size become repeated multiplication
LOG10_2 = math.log10(2)
SELU_ALPHA = 1.6732632423543772848170429916717     # Klambauer et al., "Self-Normalizing Neural Networks"
SELU_SCALE = 1.0507009873554804934193349852946
# The most frequent ops recorded through `F.applied` (fixed arguments: `F.Add.apply(a, b)` is a classmethod read through
# the class, a generic lookup, and a call through *inputs, which the interpreter does not inline)
_applied, _Add, _Mul = F.applied, F.Add, F.Mul
ATAN_HALVINGS = 2     # atan(x) = 2·atan(x / (1 + √(1 + x²))): two halvings take |x| <= 1 to |x| <= tan(π/16) ≈ 0.2
ATAN_SERIES_TERMS = 8  # x − x³/3 + ... − x¹⁵/15 at |x| <= 0.2: truncation error 0.2¹⁷/17 ≈ 8e-14
# erfc(|x|) ≈ t·exp(−x² + P(t)) with t = 1 / (1 + |x|/2): the Chebyshev fit of Numerical Recipes (erfcc), relative
# error below 1.2e-7 everywhere; P's coefficients from the constant term up
ERFC_CHEBYSHEV = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
                  -0.82215223, 0.17087277)
LARGE_ARGUMENT = 2.0 ** 60  # asinh/acosh of |x| beyond this are log(2|x|) to float64 precision (x² would overflow)

class ElementwiseMixin:
  """Tensor's elementwise methods and operators."""
  # ---- arithmetic
  def add(self, x: Any, reverse: bool = False) -> Tensor:
    return _applied(_Add, self._operands(x, reverse))
  def sub(self, x: Any, reverse: bool = False) -> Tensor:
    a, b = self._operands(x, reverse)
    if a.dtype.is_bool: raise TypeError("subtraction of bool tensors: use ^ (logical xor) instead")
    return F.Sub.apply(a, b)
  def mul(self, x: Any, reverse: bool = False) -> Tensor:
    return _applied(_Mul, self._operands(x, reverse))
  def div(self, x: Any, reverse: bool = False, rounding_mode: Optional[str] = None) -> Tensor:
    """True division (ints give floats); rounding_mode "floor" is `//`, "trunc" rounds toward zero (both keep an
    int dtype, as torch). Another rounding_mode raises RuntimeError, as torch."""
    if rounding_mode not in (None, "floor", "trunc"):
      raise RuntimeError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    if rounding_mode == "floor": return self.floordiv(x, reverse)
    a, b = self._operands(x, reverse)
    if rounding_mode == "trunc":
      return self._nograd(a.lazydata.alu(Ops.IDIV, _literal(b).lazydata)) if not a.dtype.is_float else (a / b).trunc()
    return F.applied(F.Div, (a._to_float(), b._to_float()))
  def floordiv(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's `//`: rounds toward −∞. Integer division by zero gives 0 (as numpy)."""
    a, b = self._operands(x, reverse)
    if a.dtype in HALF_FLOATS: return a.cast(dtypes.float32).floordiv(b.cast(dtypes.float32)).cast(a.dtype)
    if a.dtype.is_float: return self._nograd(F.float_divmod(a.lazydata, b.lazydata)[0])   # numpy's, from fmod
    if a.dtype.is_bool: a, b = a.int(), b.int()
    b = _literal(b)
    quotient = a.lazydata.alu(Ops.IDIV, b.lazydata)
    if a.dtype.is_unsigned: return self._nograd(quotient)
    return self._nograd(quotient) - _needs_floor_fix(a, b).cast(a.dtype)
  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's `%`: the result has the sign of the divisor. Integer x % 0 gives 0 (as numpy)."""
    a, b = self._operands(x, reverse)
    if a.dtype in HALF_FLOATS: return a.cast(dtypes.float32).mod(b.cast(dtypes.float32)).cast(a.dtype)
    if a.dtype.is_float: return F.FloatMod.apply(a, b)   # numpy's, from the exact fmod
    if a.dtype.is_bool: a, b = a.int(), b.int()
    b = _literal(b)
    remainder = self._nograd(a.lazydata.alu(Ops.MOD, b.lazydata))
    if a.dtype.is_unsigned: return remainder
    return _needs_floor_fix(a, b).where(remainder + b, remainder)
  def pow(self, exponent: Any, reverse: bool = False) -> Tensor:
    """`**` with C's (torch's) values: negative bases with integer exponents keep their sign, with other exponents
    they give NaN; ±0, ±inf and NaN as C's pow. Small positive integer Python exponents are repeated multiplication,
    −1 and −2 its reciprocal (as torch); float gradients are torch's (see _FloatPow). A Python int the int dtype can't
    hold raises OverflowError (torch raises too; it doesn't wrap here, as other arithmetic does)."""
    if isinstance(exponent, int) and not isinstance(exponent, bool) and not self.dtype.is_float:
      _check_scalar_fits(exponent, _scalar_dtype(self.dtype, exponent))
    if not reverse and isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
      if isinstance(exponent, int) and exponent < 0 and not self.dtype.is_float:
        raise RuntimeError(f"integers to negative integer powers are not allowed: {self.dtype} ** {exponent} "
                           "(cast the base to a float dtype first)")
      if math.isfinite(exponent) and exponent == int(exponent) and 0 < exponent <= POW_UNROLL_LIMIT:
        base = self.int() if self.dtype.is_bool else self
        base = base.cast(_scalar_dtype(base.dtype, exponent))
        return _power_by_squaring(base, int(exponent))
      if exponent == 0.5: return self._to_float().sqrt()
      if exponent == -0.5: return self._to_float().rsqrt()   # torch's: (−0) ** −0.5 is −inf there, not C's +inf
    base, power = self._operands(exponent, reverse)
    if base.dtype.is_bool: base, power = base.int(), power.int()
    if base.dtype.is_float:
      small_negative = not reverse and isinstance(exponent, (int, float)) and math.isfinite(exponent) and \
        exponent in (-1, -2)   # torch's 1/x and 1/(x·x), bit for bit; larger ones go through exp2/log2 as powf
      return _FloatPow.apply(base, power, integer_exponent=int(exponent) if small_negative else None)
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
    for tensor, scalar in ((x, y), (y, x)):   # as torch: a Python int the tensor's int dtype can't hold raises
      if isinstance(tensor, Tensor) and isinstance(scalar, int) and not tensor.dtype.is_bool:
        _check_scalar_fits(scalar, _scalar_dtype(tensor.dtype, scalar))
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
  def ne(self, x: Any) -> Tensor: return self != x
  def eq(self, x: Any) -> Tensor: return self == x
  def logical_not(self) -> Tensor:
    if self.dtype.is_bool: return self._nograd(self.lazydata.alu(Ops.CMPNE, self.lazydata.const(True)))
    return self == 0
  def _bitwise(self, op: Ops, other: Any, reverse: bool, name: str) -> Tensor:
    a, b = self._int_operands(other, reverse, name)
    return self._nograd(a.lazydata.alu(op, b.lazydata))
  def bitwise_and(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.AND, x, reverse, "&")
  def bitwise_or(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.OR, x, reverse, "|")
  def xor(self, x: Any, reverse: bool = False) -> Tensor: return self._bitwise(Ops.XOR, x, reverse, "^")
  def bitwise_xor(self, x: Any, reverse: bool = False) -> Tensor: return self.xor(x, reverse)
  def bitwise_not(self) -> Tensor:
    if self.dtype.is_float: raise DTypeNotSupportedError(f"~ needs an int or bool tensor, got {self.dtype}")
    if self.dtype.is_bool: return self.logical_not()
    return self._nograd(self.lazydata.alu(Ops.XOR, self.lazydata.const(-1 if not self.dtype.is_unsigned else
                                                                       dtypes.max(self.dtype))))
  def _shift(self, amount: Any, reverse: bool, left: bool) -> Tensor:
    if not reverse and isinstance(amount, int) and not isinstance(amount, bool) and not self.dtype.is_float and \
        not 0 <= amount < self.dtype.bits:   # every bit shifted out, as torch (the amount may not fit the dtype)
      x = self.int() if self.dtype.is_bool else self
      return x.zeros_like() if left or x.dtype.is_unsigned else (x < 0).where(-1, 0).cast(x.dtype)
    x, shift = self._int_operands(amount, reverse, "<<" if left else ">>")
    if x.dtype.is_bool: x, shift = x.int(), shift.int()
    shift = _literal(shift)
    bits = x.dtype.bits   # as torch, an amount outside [0, bits) shifts out every bit
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
  def exp(self) -> Tensor: return composite("exp", (self,))      # exp2(x·log2 e) (tensor_ops/composite.py)
  def log(self) -> Tensor: return composite("log", (self,))      # log2(x)·ln 2
  def sqrt(self) -> Tensor: return self._float_math(F.Sqrt.apply)
  def rsqrt(self) -> Tensor: return self._float_math(lambda x: F.Reciprocal.apply(F.Sqrt.apply(x)))
  def reciprocal(self) -> Tensor: return self._float_math(F.Reciprocal.apply)
  def sin(self) -> Tensor: return self._float_math(F.Sin.apply)
  def cos(self) -> Tensor: return self._float_math(lambda x: F.Sin.apply((math.pi / 2) - x))
  def tan(self) -> Tensor: return self._float_math(lambda x: F.Sin.apply(x) / F.Sin.apply((math.pi / 2) - x))
  def square(self) -> Tensor: return self * self
  def log10(self) -> Tensor: return self._float_math(lambda x: F.Log2.apply(x) * LOG10_2)
  def sinh(self) -> Tensor: return self._float_math(lambda x: (x.exp() - (-x).exp()) * 0.5)
  def cosh(self) -> Tensor: return self._float_math(lambda x: (x.exp() + (-x).exp()) * 0.5)
  def atan(self) -> Tensor:
    """Built from sqrt and a short series: |x| > 1 maps to π/2 − atan(1/|x|), then ATAN_HALVINGS halvings of the
    angle bring |x| to <= 0.2, where ATAN_SERIES_TERMS terms of the Taylor series are exact in float32."""
    return self._float_math(_atan)
  def asin(self) -> Tensor:
    """atan(x / √((1 − x)(1 + x))): ±π/2 at ±1, NaN outside [−1, 1]."""
    return self._float_math(lambda x: _atan(x / ((1 - x) * (1 + x)).sqrt()))
  def acos(self) -> Tensor:
    """2·atan(√((1 − x) / (1 + x))): accurate near 1, where π/2 − asin(x) would cancel."""
    return self._float_math(lambda x: 2 * _atan(((1 - x) / (1 + x)).sqrt()))
  def asinh(self) -> Tensor:
    """sign(x)·log(|x| + √(x² + 1)), and log(2|x|) beyond LARGE_ARGUMENT where x² would overflow."""
    def fn(x: Tensor) -> Tensor:
      magnitude = x.abs()
      large = magnitude > LARGE_ARGUMENT
      safe = large.where(1.0, magnitude)    # keeps the unused branch finite, so its gradient is 0, not NaN
      out = large.where(magnitude.log() + LN2, (safe + (safe * safe + 1).sqrt()).log())
      return (x < 0).where(-out, out)
    return self._float_math(fn)
  def acosh(self) -> Tensor:
    """a(x) = log(x + √((x − 1)(x + 1))) for x >= 1, log(2x) beyond LARGE_ARGUMENT; NaN below 1. For x < −1 it is
    NaN − a(−x), whose gradient is torch's 1/√(x² − 1) (computed at |x|, without the cancellation of x + √(x² − 1));
    in (−1, 1) the root of a negative number gives NaN, and a NaN gradient, as torch."""
    def fn(x: Tensor) -> Tensor:
      magnitude = x.abs()
      large = magnitude > LARGE_ARGUMENT
      safe = large.where(1.0, magnitude)    # keeps the unused branch finite, so its gradient is 0, not NaN
      at_magnitude = large.where(magnitude.log() + LN2, (safe + ((safe - 1) * (safe + 1)).sqrt()).log())
      return (x < 0).where(math.nan - at_magnitude, at_magnitude)
    return self._float_math(fn)
  def atanh(self) -> Tensor:
    """½·log((1 + x) / (1 − x)): ±inf at ±1, NaN outside [−1, 1]."""
    return self._float_math(lambda x: ((1 + x) / (1 - x)).log() * 0.5)
  def erf(self) -> Tensor:
    """The error function, as 1 − erfc(|x|) with erfc's Chebyshev fit ERFC_CHEBYSHEV (absolute error < 1.2e-7),
    signed. Its gradient comes from the chain rule through the fit."""
    def fn(x: Tensor) -> Tensor:
      magnitude = x.abs()
      t = 1 / (1 + 0.5 * magnitude)
      polynomial = t * 0 + ERFC_CHEBYSHEV[-1]
      for coefficient in reversed(ERFC_CHEBYSHEV[:-1]): polynomial = polynomial * t + coefficient
      out = 1 - t * (polynomial - magnitude * magnitude).exp()
      return (x < 0).where(-out, out)
    return self._float_math(fn)
  def logaddexp(self, other: Any) -> Tensor:
    """log(exp(self) + exp(other)) = max + log1p(exp(−|self − other|)): nothing overflows, an infinite max is the
    result (−inf and −inf give −inf), and the gradients are torch's 1 / (1 + exp(other − self)) — 0.5 each at a tie,
    finite at ±inf. float16/bfloat16 compute in float32."""
    a, b = self._operands(other)
    a, b = a._to_float(), b._to_float()
    if a.dtype in HALF_FLOATS: return a.cast(dtypes.float32).logaddexp(b.cast(dtypes.float32)).cast(a.dtype)
    a_wins = a >= b
    peak = a_wins.where(a, b)
    gap = a_wins.where(b - a, a - b)                           # −|a − b|, split evenly between a and b at a tie
    return peak.isinf().where(peak, peak + _log1p(gap.exp()))
  def copysign(self, other: Any) -> Tensor:
    """|self| with the sign bit of other (so −0.0 and negative NaNs count as negative), in a float dtype."""
    a, b = self._operands(other)
    a = a._to_float()
    b = b.cast(a.dtype).detach()
    negative = b.bitcast(SIGNED_OF_SIZE[b.dtype.itemsize]) < 0
    magnitude = a.abs()
    return negative.where(-magnitude, magnitude)
  def fmod(self, other: Any) -> Tensor:
    """C's fmod, as torch.fmod: the remainder of division rounded toward zero, with the sign of self."""
    a, b = self._operands(other)
    if a.dtype.is_bool: a, b = a.int(), b.int()
    if a.dtype.is_float: return a - b * (a / b).trunc().detach()
    return self._nograd(a.lazydata.alu(Ops.MOD, b.lazydata))
  def isfinite(self) -> Tensor:
    if not self.dtype.is_float: return self.full_like(True, dtype=dtypes.bool)
    return (self.isinf() | self.isnan()).logical_not()
  def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self − other| <= atol + rtol·|other| elementwise, as torch.isclose (infinities are close only to
    themselves; NaNs to each other only with equal_nan)."""
    if rtol < 0 or atol < 0: raise ValueError(f"isclose: rtol {rtol} and atol {atol} must be nonnegative")
    a, b = self._operands(other)
    a, b = a.detach(), b.detach()
    exact = a == b
    if not a.dtype.is_float: a, b = a._to_float(), b._to_float()
    finite = (a.isinf() | b.isinf()).logical_not()          # an infinity is close only to itself
    close = exact | (finite & ((a - b).abs() <= atol + rtol * b.abs()))
    return close | (a.isnan() & b.isnan()) if equal_nan else close
  def clone(self) -> Tensor:
    """A copy in a buffer of its own (writes into self, e.g. `self.assign(...)`, don't reach it); differentiable."""
    return _Clone.apply(self)
  def contiguous_backward(self) -> Tensor:
    """self unchanged; in the backward pass its gradient is made contiguous (realized as one buffer) there."""
    return _ContiguousBackward.apply(self)
  def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element is isclose to other (a kernel runs)."""
    return bool(self.isclose(other, rtol=rtol, atol=atol, equal_nan=equal_nan).all().item())
  def usum(self, *others: Any) -> Tensor:
    """self + others[0] + ... (| for bools), tinygrad's n-ary sum."""
    out = self
    for x in _flat_args(others): out = out | x if out.dtype.is_bool else out + x
    return out
  def uprod(self, *others: Any) -> Tensor:
    """self · others[0] · ... (& for bools), tinygrad's n-ary product."""
    out = self
    for x in _flat_args(others): out = out & x if out.dtype.is_bool else out * x
    return out
  def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
    """value where the bool mask is true, self elsewhere (mask broadcasts against self; the result keeps self's
    shape and dtype)."""
    if not isinstance(mask, Tensor) or not mask.dtype.is_bool:
      raise TypeError(f"masked_fill: mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if broadcast_shape(mask.shape, self.shape) != self.shape:
      raise ValueError(f"masked_fill: mask of shape {mask.shape} does not broadcast to {self.shape}")
    if isinstance(value, Tensor) and value.ndim != 0:
      raise ValueError(f"masked_fill: value must be a scalar or a 0-d tensor, got shape {value.shape}")
    fill = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype, device=self.device)
    return mask.where(fill, self)
  def sigmoid(self) -> Tensor: return composite("sigmoid", (self,))
  def tanh(self) -> Tensor: return composite("tanh", (self,))    # 2·sigmoid(2x) − 1 by default
  def relu(self) -> Tensor: return F.Relu.apply(self)
  def relu6(self) -> Tensor: return self.relu() - (self - 6).relu()
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor: return self.relu() - (-self).relu() * neg_slope
  def elu(self, alpha: float = 1.0) -> Tensor:
    """x for x > 0, else alpha·(exp(x) − 1); the gradient at 0 is alpha, as torch."""
    def fn(x: Tensor) -> Tensor:
      positive = x > 0
      return positive.where(x, (positive.where(0.0, x).exp() - 1) * alpha)   # exp of a clamped x: finite grads
    return self._float_math(fn)
  def gelu(self, approximate: str = "tanh") -> Tensor:
    """x·Φ(x). approximate='tanh' (the default, as tinygrad) is the tanh approximation of Φ; 'none' is exact,
    0.5·(1 + erf(x/√2)), torch's default."""
    if approximate not in ("none", "tanh"):
      raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return composite("gelu", (self,), approximate=approximate)
  def quick_gelu(self) -> Tensor: return self * (self * QUICK_GELU_SCALE).sigmoid()
  def silu(self) -> Tensor: return self * self.sigmoid()
  def swish(self) -> Tensor: return self.silu()
  def softplus(self, beta: float = 1.0) -> Tensor:
    """log(1 + exp(beta·x)) / beta, as logaddexp(beta·x, 0): no overflow, torch's tiny values for very negative x
    (log1p), gradient 0.5 at 0."""
    return self._float_math(lambda x: (x * beta).logaddexp(0.0) * (1 / beta))
  def mish(self) -> Tensor: return self * self.softplus().tanh()
  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
    """clip(alpha·x + beta, 0, 1); torch's hardsigmoid is the default alpha and beta, relu6(x + 3) / 6. The gradient
    is alpha strictly inside (0, 1) and 0 at and past the corners, as torch."""
    scaled = self._to_float() * alpha + beta
    return (scaled <= 0).where(0.0, (scaled >= 1).where(1.0, scaled))
  def hardswish(self) -> Tensor:
    """x·relu6(x + 3) / 6, as torch (−inf gives NaN, inf gives inf; the clip keeps inf − inf out of relu6)."""
    x = self._to_float()
    return x * (x + 3).clip(0, 6) * (1 / 6)
  def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
    if min_val > max_val: raise ValueError(f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    return self.clip(min_val, max_val)
  def softsign(self) -> Tensor: return self / (1 + self.abs())
  def celu(self, alpha: float = 1.0) -> Tensor:
    """max(0, x) + min(0, alpha·(exp(x / alpha) − 1))."""
    if alpha == 0: raise ValueError("celu: alpha must not be 0 (it divides x)")
    def fn(x: Tensor) -> Tensor:
      positive = x > 0
      return positive.where(x, ((positive.where(0.0, x) * (1 / alpha)).exp() - 1) * alpha)
    return self._float_math(fn)
  def selu(self) -> Tensor:
    """scale·(max(0, x) + alpha·(exp(min(0, x)) − 1)), with the constants of Klambauer et al."""
    return self.elu(SELU_ALPHA) * SELU_SCALE
  def logsigmoid(self) -> Tensor: return -(-self).softplus()
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
    if min_ is None and max_ is None: raise RuntimeError("clip: at least one of min_ or max_ must not be None")
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
  __add__, __sub__, __mul__, __truediv__ = add, sub, mul, div   # the methods themselves: one call fewer per op
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

SIGNED_OF_SIZE = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}   # a float's bits, read as an int: sign bit

def _flat_args(args: tuple) -> tuple:
  return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else args

class _ContiguousBackward(F.Function):
  """Identity forward; the gradient flowing back is made contiguous (tinygrad's contiguous_backward)."""
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.contiguous()

class _Clone(F.Function):
  """A copy into a new buffer (an explicit CONTIGUOUS, even of a realized buffer); the gradient passes through."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    return LazyBuffer.loadop(Ops.CONTIGUOUS, x.shape, x.dtype, x.device, srcs=(x,))
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output

def _atan(x: Tensor) -> Tensor:
  magnitude = x.abs()
  outside = magnitude > 1
  reduced = outside.where(1 / outside.where(magnitude, 1.0), magnitude)   # in [0, 1]; no 1/0 on the unused side
  for _ in range(ATAN_HALVINGS): reduced = reduced / (1 + (1 + reduced * reduced).sqrt())
  square, power, series = reduced * reduced, reduced, reduced
  for k in range(1, ATAN_SERIES_TERMS):
    power = power * square
    series = series + power * ((-1) ** k / (2 * k + 1))
  angle = series * 2 ** ATAN_HALVINGS
  angle = outside.where(math.pi / 2 - angle, angle)
  return (x < 0).where(-angle, angle)

def _log1p(x: Tensor) -> Tensor:
  """log(1 + x) for finite x > −1, exact for tiny x too: log(u)·x / (u − 1) with u = 1 + x corrects u's rounding
  (Goldberg's trick)."""
  u = x + 1
  return (u == 1).where(x, u.log() * (x / (u == 1).where(1.0, u - 1)))

def _literal(x: Tensor) -> Tensor:
  """x, with a Python scalar that kernels would take as a parameter (a lifted constant: tgrad/scalars.py) made a
  literal again. For integer divisors and shift amounts: division by a known constant is a multiply and a shift that
  vectorizes, by a parameter it is a division per element (x86 has no vector integer division)."""
  lb = x.lazydata
  lifted = lb.shards[0].base.lifted if isinstance(lb, MultiLazyBuffer) else lb.base.lifted
  return x.const_like(lb.const_value()) if lifted else x

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
  """C's pow (torch's values), from |b|^e = exp2(e·log2|b|): a negative base keeps its sign for odd integer e and
  gives NaN for a non-integer e (unless it is −inf); x^0 = 1^y = (−1)^±inf = 1 (NaNs included); ±0 and ±inf give
  C's signed zeros and infinities. float16/bfloat16 compute in float32."""
  if base.dtype in HALF_FLOATS:
    return _float_pow(base.cast(dtypes.float32), exponent.cast(dtypes.float32)).cast(base.dtype)
  magnitude = (exponent * base.abs().log2()).exp2()
  integer_exponent = exponent == exponent.trunc()   # ±inf included, NaN not
  half = exponent * 0.5
  odd_exponent = integer_exponent & (half != half.trunc())
  sign_bit = (base < 0) | ((base == 0) & (base.reciprocal() < 0))   # −0 too
  signed = (sign_bit & odd_exponent).where(-magnitude, magnitude)
  out = ((base < 0) & base.isfinite() & integer_exponent.logical_not()).where(math.nan, signed)
  is_one = (exponent == 0) | (base == 1) | ((base.abs() == 1) & exponent.isinf())
  return is_one.where(1.0, out)

class _FloatPow(F.Function):
  """base ** exponent for floats, with torch's gradients: d/db = e·b^(e−1) (0 where e = 0) and d/de = b^e·ln b (0
  where b = 0 and e >= 0), so x² at 0, 0^y and the like have finite gradients where torch's do, instead of the
  0·inf NaNs of the chain rule through exp2/log2. Both sides are built from Tensor ops on unrecorded inputs."""
  def forward(self, base: LazyBuffer, exponent: LazyBuffer, integer_exponent: Optional[int] = None) -> LazyBuffer:
    """integer_exponent: −1 or −2, computed as 1 / b^|e| by multiplication (torch's values)."""
    self.base, self.exponent = Tensor(base, requires_grad=False), Tensor(exponent, requires_grad=False)
    self.integer_exponent = integer_exponent
    self.ret = self._power(self.base, self.exponent, integer_exponent)
    return self.ret.lazydata
  @staticmethod
  def _power(base: Tensor, exponent: Tensor, integer_exponent: Optional[int]) -> Tensor:
    if integer_exponent is None: return _float_pow(base, exponent)
    if integer_exponent == 0: return base.ones_like()
    power = _power_by_squaring(base, abs(integer_exponent))
    return power.reciprocal() if integer_exponent < 0 else power
  def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    grad, base, exponent = Tensor(grad_output, requires_grad=False), self.base, self.exponent
    base_grad = exponent_grad = None
    if self.needs_input_grad[0]:
      below = None if self.integer_exponent is None else self.integer_exponent - 1
      slope = (exponent == 0).where(0.0, exponent * self._power(base, exponent - 1, below))
      base_grad = (grad * slope).lazydata
    if self.needs_input_grad[1]:
      slope = ((base == 0) & (exponent >= 0)).where(0.0, self.ret * base.log())
      exponent_grad = (grad * slope).lazydata
    return base_grad, exponent_grad

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
