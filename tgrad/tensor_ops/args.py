"""Argument checks and dtype rules shared by Tensor and its mixins: pure Python on shapes, dtypes and scalars.

They raise the user-facing errors (a bad shape, axis or scalar) before any lazy op is built, and say which dtype a
Python scalar, Python data or a sum takes. Nothing here makes a Tensor, so every tensor_ops file may import it.
"""
from __future__ import annotations
from typing import Any, Union
import numpy as np
from tgrad.helpers import prod
from tgrad.dtype import DType, dtypes
from tgrad.ops import UOp
from tgrad.shape.sint import canonical

Scalar = Union[bool, int, float]

class DTypeNotSupportedError(NotImplementedError, TypeError):
  """An op with no meaning for an operand's dtype (a shift of floats, say). torch raises NotImplementedError there,
  Python's convention is TypeError: this is both, so either `except` catches it."""
HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)   # reductions over these accumulate in float32

def _shape_arg(shape, rest: tuple = ()) -> tuple:
  """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` all mean shape (2, 3)."""
  if isinstance(shape, (tuple, list)):
    if rest: raise TypeError(f"give a shape either as one tuple or as separate ints, not {shape!r} and {rest!r}")
    return tuple(shape)
  return (shape, *rest)

def _varargs_shape(args: tuple) -> tuple:
  """The shape from `*shape` arguments: none (0-d), several ints, or one tuple."""
  return _shape_arg(args[0], args[1:]) if args else ()

def _check_shape(shape: tuple) -> tuple:
  """Nonnegative ints, or symbolic sizes (bound Variables and expressions of them, see shape/sint.py)."""
  for s in shape:
    if isinstance(s, UOp):
      if not s.dtype.is_int or s.vmin < 0: raise ValueError(f"a shape needs nonnegative sizes, got {s.render()}")
    elif not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
      raise ValueError(f"a shape needs nonnegative ints, got {shape}")
  out = tuple(canonical(s) if isinstance(s, UOp) else int(s) for s in shape)
  if (count := prod(s for s in out if not isinstance(s, UOp))) > MAX_ELEMENTS:
    raise ValueError(f"a shape of {count} elements ({shape}) is more than any device can index (2^62)")
  return out

# Kernels index elements with 64-bit ints and address bytes from them (an element is up to 8 bytes): a tensor of more
# than 2^62 elements can't be indexed, and no device holds it anyway.
MAX_ELEMENTS = 1 << 62

def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  """numpy's broadcasting: align on the right; each dim pair must be equal or contain a 1. Two shapes of one rank (a
  broadcast binary op's case, on every call) take one plain loop."""
  if len(shapes) == 2 and len(shapes[0]) == len(shapes[1]):
    out = []
    for x, y in zip(*shapes):
      if x == y or y == 1: out.append(x)
      elif x == 1: out.append(y)
      else: _not_broadcastable(shapes)
    return tuple(out)
  ndim = max((len(s) for s in shapes), default=0)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    sizes = {d for d in dims if d != 1}
    if len(sizes) > 1: _not_broadcastable(shapes)
    out.append(sizes.pop() if sizes else 1)
  return tuple(out)

def _not_broadcastable(shapes: tuple) -> None:
  raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")

def _resolve_axis(axis: int, ndim: int, shape: tuple) -> int:
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise TypeError(f"an axis must be an int, got {axis!r}")
  if not -ndim <= axis < ndim: raise IndexError(f"axis {axis} is out of range for a tensor of shape {shape}")
  return int(axis) % ndim

def _scalar_dtype(tensor_dtype: DType, scalar: Scalar) -> DType:
  """Python scalars are weak: they take the tensor's dtype unless their kind is higher (int tensor + 2.5 → float)."""
  if isinstance(scalar, bool): return tensor_dtype
  if isinstance(scalar, int): return dtypes.default_int if tensor_dtype.is_bool else tensor_dtype
  if isinstance(scalar, float): return tensor_dtype if tensor_dtype.is_float else dtypes.default_float
  raise TypeError(f"expected a Python scalar, got {type(scalar).__name__}")

def _int_overflow_side(dtype: DType, value: Any) -> int:
  """+1 if value is a Python int above what the int dtype holds, −1 if below, 0 if it fits (or is not such a pair)."""
  if not dtype.is_int or not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)): return 0
  return 1 if value > dtypes.max(dtype) else -1 if value < dtypes.min(dtype) else 0

def _check_scalar_fits(value: Any, dtype: DType) -> None:
  """numpy 2's rule (NEP 50): a Python int that the int dtype it meets can't hold raises OverflowError (int8 + 300,
  uint8 + (-1), int32 + 2**40), instead of wrapping."""
  if _int_overflow_side(dtype, value):
    hint = " (pass dtype=dtypes.int64 for a wider tensor)" if dtype == dtypes.default_int else ""
    raise OverflowError(f"Python integer {value} out of bounds for {dtype.name}{hint}")

def _fit_python_int(value: Scalar, dtype: DType, tensor_dtype: DType) -> tuple[Scalar, DType]:
  """A Python scalar operand of a binary op with a tensor of `tensor_dtype`, where the op computes in `dtype`: an int
  the int dtype can't hold wraps to it, two's complement (torch's and tinygrad's int32_tensor | 2**40, int8 + 300),
  except beside a bool tensor, where the inferred int32 widens to int64 first (bool + 2**40 is 2**40 + 1, as torch)."""
  if not _int_overflow_side(dtype, value): return value, dtype
  if tensor_dtype.is_bool and dtype == dtypes.default_int:
    dtype = dtypes.int64
    if not _int_overflow_side(dtype, value): return value, dtype
  bits = dtype.itemsize * 8
  wrapped = int(value) % (1 << bits)
  if not dtype.is_unsigned and wrapped >= 1 << (bits - 1): wrapped -= 1 << bits
  return wrapped, dtype

def _python_dtype(data) -> DType:
  """The dtype of Python data (nested lists of scalars): any float → default float, else any int → default int,
  else bool. Scalars are weak, so [1.0, 2] is float32 (numpy's promotion of float32 with int32 would say float64)."""
  kinds: set[type] = set()
  stack = [data]
  while stack:
    item = stack.pop()
    if isinstance(item, (list, tuple)): stack.extend(item)
    elif isinstance(item, (bool, int, float)):   # by isinstance: np.float64 is a float
      kinds.add(bool if isinstance(item, bool) else int if isinstance(item, int) else float)
    else: raise TypeError(f"cannot infer a dtype for {type(item).__name__} {item!r}")
  if float in kinds or not kinds: return dtypes.default_float
  return dtypes.default_int if int in kinds else dtypes.bool

def _accumulator_dtype(dtype: DType) -> DType:
  """The dtype a sum or mean of `dtype` values accumulates in: float32 for float16 and bfloat16 (HALF_FLOATS, the
  2-byte floats: told by kind and size, no dtype compares, as every eager reduce asks), else `dtype` itself."""
  return dtypes.float32 if dtype.is_float and dtype.itemsize == 2 else dtype

def _sum_dtype(dtype: DType) -> DType:
  """The dtype a sum (prod, cumsum) returns, as numpy's: bools and signed ints sum to int64, unsigned ints to uint64,
  floats keep theirs (docs/design-notes.md, "Accumulation dtypes")."""
  if dtype.is_bool or dtype.kind == 'i': return dtypes.int64
  if dtype.kind == 'u': return dtypes.uint64
  return dtype
