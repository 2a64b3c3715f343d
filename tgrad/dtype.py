"""Data types and numpy-like type promotion.

A `DType` is a frozen value: its name, byte size, kind ('b' bool, 'i' signed, 'u' unsigned, 'f' float) and the
numpy dtype used to move data in and out of buffers. `promote_types` is torch's promotion table (numpy's between
ints and between floats, bfloat16 promoting like float16; an int with a float gives the float), and
`least_upper_dtype` folds it over many dtypes.
"""
from __future__ import annotations
from dataclasses import dataclass, field
import functools
import numpy as np

@dataclass(frozen=True, order=True)
class DType:
  priority: int   # order within a kind; also a stable total order
  itemsize: int
  name: str
  kind: str       # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float, 'v' void
  np_name: str    # the numpy dtype name with the same bit layout ('uint16' stands in for bfloat16)
  def __repr__(self): return f"dtypes.{self.name}"
  # Equality and hashing are on every eager op's path (casts, promotion, the schedule cache's keys): the dataclass's
  # own compare field tuples each time. The dtypes are module singletons, so identity answers almost every compare;
  # a DType made elsewhere (a copy, an unpickled one) still compares by its fields. The hash is computed once.
  def __eq__(self, other) -> bool:
    if self is other: return True
    if other.__class__ is not DType: return NotImplemented
    return self._fields() == other._fields()
  def __ne__(self, other) -> bool:
    if self is other: return False
    if other.__class__ is not DType: return NotImplemented
    return self._fields() != other._fields()
  def __hash__(self) -> int:
    try: return self.__dict__["_hash"]
    except KeyError:
      value = self.__dict__["_hash"] = hash(self._fields())
      return value
  def __getstate__(self) -> dict:   # string hashes differ between processes: a pickle carries no cached hash
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}
  def _fields(self) -> tuple: return (self.priority, self.itemsize, self.name, self.kind, self.np_name)
  # The kind tests are read on every op (autograd records only floats, promotion, casts): plain attributes, set once,
  # not properties (a property is a function call per read).
  is_float: bool = field(init=False, repr=False, compare=False)
  is_int: bool = field(init=False, repr=False, compare=False)
  is_unsigned: bool = field(init=False, repr=False, compare=False)
  is_bool: bool = field(init=False, repr=False, compare=False)
  # The fields written out: a stand-in for the dtype in keys that are hashed on every op (the schedule cache's), equal
  # exactly when the dtypes are and hashed without a Python call (a string keeps its hash: a tuple's is recomputed).
  key: str = field(init=False, repr=False, compare=False)
  def __post_init__(self):
    self.__dict__.update(is_float=self.kind == 'f', is_int=self.kind in ('i', 'u'), is_unsigned=self.kind == 'u',
                         is_bool=self.kind == 'b', key=repr(self._fields()))
  @functools.cached_property
  def np(self) -> np.dtype: return np.dtype(self.np_name)   # made once per dtype: every copy to the host reads it
  @property
  def bits(self) -> int: return self.itemsize * 8
  @property
  def min(self): return dtypes.min(self)     # the lowest value (−inf for floats), as tinygrad's dtype.min
  @property
  def max(self): return dtypes.max(self)

class UnknownDTypeError(AttributeError, TypeError):
  """A dtype name that names no dtype: an AttributeError, as tinygrad's `getattr(dtypes, name)` raises, and a
  TypeError, as Python's convention for a bad argument (either `except` catches it)."""

class dtypes:
  """The dtype namespace, as in tinygrad: `dtypes.float32`, `dtypes.from_np(...)`, `dtypes.default_float`."""
  void = DType(-1, 0, "void", 'v', 'void')
  bool = DType(0, 1, "bool", 'b', 'bool')
  int8 = DType(1, 1, "int8", 'i', 'int8')
  uint8 = DType(2, 1, "uint8", 'u', 'uint8')
  int16 = DType(3, 2, "int16", 'i', 'int16')
  uint16 = DType(4, 2, "uint16", 'u', 'uint16')
  int32 = DType(5, 4, "int32", 'i', 'int32')
  uint32 = DType(6, 4, "uint32", 'u', 'uint32')
  int64 = DType(7, 8, "int64", 'i', 'int64')
  uint64 = DType(8, 8, "uint64", 'u', 'uint64')
  float16 = DType(9, 2, "float16", 'f', 'float16')
  bfloat16 = DType(10, 2, "bfloat16", 'f', 'uint16')
  float32 = DType(11, 4, "float32", 'f', 'float32')
  float64 = DType(12, 8, "float64", 'f', 'float64')
  # aliases
  half, float, double, int, long, uchar, char, short = float16, float32, float64, int32, int64, uint8, int8, int16
  default_float = float32
  default_int = int32
  # the dtype of index arithmetic in kernels: 64-bit, so sizes, strides and offsets of any buffer a device can hold are
  # exact; a renderer may compute a value in 32 bits where its vmin/vmax prove it fits (runtime/cuda/renderer.py does)
  index = int64

  @staticmethod
  def all() -> list[DType]:
    return [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
            dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
  @staticmethod
  def from_np(npdtype) -> DType:
    name = np.dtype(npdtype).name
    for dt in dtypes.all():
      if dt.name == name: return dt
    raise TypeError(f"numpy dtype {name} has no tgrad dtype")
  @staticmethod
  def from_name(name: str) -> DType:
    for dt in dtypes.all():
      if dt.name == name: return dt
    alias = getattr(dtypes, name, None)
    if isinstance(alias, DType): return alias
    raise UnknownDTypeError(f"unknown dtype name {name!r}")
  @staticmethod
  def from_py(x) -> DType:
    """The dtype a Python scalar or (nested) list gets: bool, then default_int, then default_float."""
    if isinstance(x, (list, tuple)):   # Python scalars are weak: any float → default_float, any int → default_int
      kinds = {dtypes.from_py(v) for v in x}
      if not kinds: return dtypes.default_float
      return max(kinds, key=lambda d: {'b': 0, 'i': 1, 'u': 1, 'f': 2}[d.kind] * 100 + d.priority)
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    raise TypeError(f"cannot infer a dtype for {type(x).__name__} {x!r}")
  @staticmethod
  def min(dt: DType):
    if dt.is_bool: return False
    if dt.is_int: return 0 if dt.is_unsigned else -(1 << (dt.bits - 1))
    return float("-inf")
  @staticmethod
  def max(dt: DType):
    if dt.is_bool: return True
    if dt.is_int: return (1 << dt.bits) - 1 if dt.is_unsigned else (1 << (dt.bits - 1)) - 1
    return float("inf")

def _promote_int_uint(i: DType, u: DType) -> DType:
  # numpy: a signed type wide enough for both, float64 when none is (uint64 with any signed int)
  for cand in (dtypes.int16, dtypes.int32, dtypes.int64):
    if cand.itemsize > u.itemsize and cand.itemsize >= i.itemsize: return cand
  return dtypes.float64

def promote_types(a: DType, b: DType) -> DType:
  """numpy's `promote_types` between ints and between floats (bfloat16 behaving like float16, bfloat16+float16 →
  float32); an int with a float gives the float, whatever the int's width (torch's and tinygrad's rule: an int32
  tensor times a float32 tensor is float32, where numpy says float64)."""
  if a == b: return a
  if a.is_bool: return b
  if b.is_bool: return a
  if a.is_float and b.is_float:
    if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
    return max(a, b, key=lambda d: d.itemsize)
  if a.is_float or b.is_float: return a if a.is_float else b   # torch's and tinygrad's rule: the float wins
  if a.kind == b.kind: return max(a, b, key=lambda d: d.itemsize)
  i, u = (a, b) if a.kind == 'i' else (b, a)
  return _promote_int_uint(i, u)

def least_upper_dtype(*ds: DType) -> DType:
  out = ds[0]
  for d in ds[1:]: out = promote_types(out, d)
  return out

def least_upper_float(dt: DType) -> DType:
  """The float dtype an op like exp or mean computes in: the dtype itself if float, else default_float."""
  return dt if dt.is_float else dtypes.default_float

def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
  """bfloat16 values held as their 16 bits (how buffers and host copies keep them) as float32: the bits are the upper
  half of the float32 with the same value."""
  return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)

# TF32 (the tensor cores' "tensor float 32"): float32's sign and 8 exponent bits with the top 10 of its 23 mantissa
# bits. A float32 is rounded to it (to nearest, ties away from zero, as PTX cvt.rna.tf32.f32) by adding half of the
# last kept bit to its 32 bits and clearing the 13 dropped ones: a carry into the exponent is the right rounding up,
# past the largest finite value to inf. A NaN's payload could carry into the sign, so NaN is kept as it is.
# tensor_ops/composite.round_to_tf32 builds this; codegen/tensor_cores.tf32_rounded_load recognizes it.
TF32_MANTISSA_BITS = 10
TF32_DROPPED_BITS = 23 - TF32_MANTISSA_BITS                                  # 13
TF32_ROUNDING_BIAS = 1 << (TF32_DROPPED_BITS - 1)                            # 0x1000
TF32_KEEP_MASK = (0xFFFFFFFF >> TF32_DROPPED_BITS) << TF32_DROPPED_BITS      # 0xFFFFE000

def to_dtype(x) -> DType:
  """Accept a DType, a dtype name, or a numpy dtype."""
  if isinstance(x, DType): return x
  if isinstance(x, str): return dtypes.from_name(x)
  try: return dtypes.from_np(x)
  except TypeError: raise TypeError(f"not a dtype: {x!r}") from None
