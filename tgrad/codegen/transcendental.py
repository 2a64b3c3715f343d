"""exp2 and log2 as plain arithmetic UOps, so CPU loops over them vectorize (a libm call does not).

`decompose(stores, by_default)` rewrites EXP2 and LOG2 of float32 (and of float16/bfloat16, computed in float32) into
range reduction + polynomial + exponent bit tricks: those with arg "poly" always, those with arg None when the
renderer decomposes by default (`by_default`); "libm" and "fast" (composite.py's lowerings) keep the device's call.
float64 and sin keep the native call. Accuracy (measured against
numpy in test/unit/test_transcendental.py): exp2 within 2 ulp and log2 within 4 ulp over the whole float range
(subnormals, ±inf, NaN included).
"""
from __future__ import annotations
import math
from typing import Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, UPat, Ops, PatternMatcher, graph_rewrite

F32 = dtypes.float32
I32 = dtypes.int32
FLOAT32_MANTISSA_BITS = 23
FLOAT32_EXPONENT_BIAS = 127
FLOAT32_EXPONENT_MASK = 0xFF
FLOAT32_MANTISSA_MASK = 0x7FFFFF
FLOAT32_ONE_BITS = 0x3F800000
SMALLEST_NORMAL_F32 = 2.0 ** -126
SUBNORMAL_SCALE_BITS = 23            # multiplying by 2^23 makes every subnormal normal
# exp2 clamps its input here: below, 2^x rounds to 0; above, it overflows to inf (and both keep 2^n in 2 factors)
EXP2_MIN_INPUT, EXP2_MAX_INPUT = -150.0, 130.0
EXP2_TAYLOR_TERMS = 8                # Taylor series of 2^f = e^(f ln2) on |f| <= 1/2: last term ~5e-9 relative
# Adding 1.5·2^23 to a float of magnitude below 2^22 rounds it to the nearest integer (ties to even), which then sits in
# the low bits of the sum's mantissa: subtracting the constant again gives the integer as a float, and the sum's bits
# minus the constant's bits give it as an int32. No float → int conversion: AVX2 has no saturating one, and LLVM
# turned the saturating cast of every lane into a scalar conversion (the exponential then ran at scalar speed).
ROUND_MAGIC = 1.5 * 2.0 ** FLOAT32_MANTISSA_BITS
ROUND_MAGIC_BITS = 0x4B400000        # the bits of ROUND_MAGIC as a float32
LOG_SERIES_TERMS = 6                 # ln(m) = 2 atanh(s) with |s| <= 0.172: s^13/13 ~ 1e-11

def _f(value: float) -> UOp: return UOp.const(F32, value)
def _i(value: int) -> UOp: return UOp.const(I32, value)
def _bitcast(x: UOp, dtype) -> UOp: return UOp(Ops.BITCAST, dtype, (x,))
def _horner(x: UOp, coefficients: list[float]) -> UOp:
  """c0 + c1·x + c2·x² + …, highest power innermost."""
  out = _f(coefficients[-1])
  for c in reversed(coefficients[:-1]): out = out * x + c
  return out
def _pow2_int(n: UOp) -> UOp:
  """2^n for an int32 n in [-126, 127], built from the exponent bits."""
  return _bitcast((n + FLOAT32_EXPONENT_BIAS).alu(Ops.SHL, _i(FLOAT32_MANTISSA_BITS)), F32)

def exp2_f32(x: UOp) -> UOp:
  x = x.lt(EXP2_MIN_INPUT).where(_f(EXP2_MIN_INPUT), x)
  x = _f(EXP2_MAX_INPUT).lt(x).where(_f(EXP2_MAX_INPUT), x)
  shifted = x + ROUND_MAGIC
  fraction = x - (shifted - ROUND_MAGIC)
  poly = _horner(fraction, [math.log(2) ** k / math.factorial(k) for k in range(EXP2_TAYLOR_TERMS)])
  whole = _bitcast(shifted, I32) - ROUND_MAGIC_BITS
  half = whole.alu(Ops.SHR, _i(1))   # 2^n as 2^half · 2^(n-half): both factors stay normal
  return poly * _pow2_int(half) * _pow2_int(whole - half)

def log2_f32(x: UOp) -> UOp:
  subnormal = x.lt(SMALLEST_NORMAL_F32)
  scaled = subnormal.where(x * float(2 ** SUBNORMAL_SCALE_BITS), x)
  bits = _bitcast(scaled, I32)
  exponent = (bits.alu(Ops.SHR, _i(FLOAT32_MANTISSA_BITS)).alu(Ops.AND, _i(FLOAT32_EXPONENT_MASK)) -
              subnormal.where(_i(FLOAT32_EXPONENT_BIAS + SUBNORMAL_SCALE_BITS), _i(FLOAT32_EXPONENT_BIAS)))
  mantissa = _bitcast(bits.alu(Ops.AND, _i(FLOAT32_MANTISSA_MASK)).alu(Ops.OR, _i(FLOAT32_ONE_BITS)), F32)  # [1, 2)
  high = _f(math.sqrt(2)).lt(mantissa)
  mantissa = high.where(mantissa * 0.5, mantissa)   # now in [sqrt(1/2), sqrt(2)]
  exponent = exponent + high.where(_i(1), _i(0))
  s = (mantissa - 1.0) / (mantissa + 1.0)
  ln_mantissa = s * 2.0 * _horner(s * s, [1.0 / (2 * k + 1) for k in range(LOG_SERIES_TERMS)])
  out = exponent.cast(F32) + ln_mantissa * (1 / math.log(2))
  out = x.ne(math.inf).where(out, _f(math.inf))
  out = x.ne(0.0).where(out, _f(-math.inf))
  return (x.lt(0.0) | x.ne(x)).where(_f(math.nan), out)

# sin keeps the exact libm call: a float32 polynomial needs a Payne–Hanek reduction to stay right for huge |x|.
_DECOMPOSE = {Ops.EXP2: exp2_f32, Ops.LOG2: log2_f32}
_DECOMPOSED_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32)

POLYNOMIAL = "poly"   # the arg of an EXP2/LOG2 that is decomposed on every device

def _decompose(u: UOp) -> Optional[UOp]:
  x = u.src[0].cast(F32)
  return _DECOMPOSE[u.op](x).cast(u.dtype)

def _decompose_requested(u: UOp) -> Optional[UOp]: return _decompose(u) if u.arg == POLYNOMIAL else None
def _decompose_default(u: UOp) -> Optional[UOp]: return _decompose(u) if u.arg in (None, POLYNOMIAL) else None

_TRANSCENDENTAL = UPat(tuple(_DECOMPOSE), dtype=_DECOMPOSED_DTYPES, name="u")
decompositions = PatternMatcher([(_TRANSCENDENTAL, _decompose_default)])       # for renderers that decompose
requested_decompositions = PatternMatcher([(_TRANSCENDENTAL, _decompose_requested)])   # for those that don't

def decompose(stores: list[UOp], by_default: bool) -> list[UOp]:
  """The kernel's stores with its EXP2/LOG2 decomposed as their args say (see the module docstring). A kernel of a
  renderer that doesn't decompose by default, with no "poly" op, is returned as it is (no rewrite pass)."""
  sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
  if not by_default and not any(u.arg == POLYNOMIAL for u in sink.toposort() if u.op in _DECOMPOSE): return stores
  return list(graph_rewrite(sink, decompositions if by_default else requested_decompositions).src)
