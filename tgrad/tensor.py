"""The user-facing Tensor: a numpy-like API with autograd, built only from LazyBuffer primitives.

Every method checks its arguments (shapes, dtypes, axes) and raises before any kernel runs, then composes a few
lazy ops: `alu`, `cast`, `r` (reduce), movement views, constants and ARANGE. Differentiable primitives go through
tgrad.function; everything else (exp, softmax, matmul, indexing, ...) is a composition of them, so gradients come
from the chain rule and fuse like forward code. Nothing runs until `realize`, `numpy`, `tolist` or `item`.
"""
from __future__ import annotations
import functools, math, time
from contextlib import ContextDecorator
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Sequence, Union
import numpy as np
from tgrad.dtype import DType, dtypes, promote_types, least_upper_dtype, least_upper_float, to_dtype
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.device import Buffer, canonical_device
from tgrad.helpers import prod
from tgrad.bounds import IndexBounds, check_index_bounds, realize_with_checks
import tgrad.function as F

Scalar = Union[bool, int, float]
LOG2_E = 1 / math.log(2)
LN2 = math.log(2)
# random numbers: a counter-based hash. Constants of the murmur3 32-bit finalizer (a bijection with full avalanche)
# and the 32-bit golden ratio, used to spread (counter, seed, call) over all 32 bits before mixing.
MURMUR_MULTIPLIER_1, MURMUR_MULTIPLIER_2 = 0x85EBCA6B, 0xC2B2AE35
GOLDEN_RATIO_32 = 0x9E3779B9
UINT32_MASK = 0xFFFFFFFF
# how many random bits make a uniform float in [0, 1): the format's significand, so every value is exact and < 1
RANDOM_FLOAT_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 32}
GELU_CUBIC_COEFFICIENT = 0.044715       # the tanh approximation of GELU (Hendrycks & Gimpel)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
QUICK_GELU_SCALE = 1.702                # x·sigmoid(1.702x), the approximation CLIP uses
POW_UNROLL_LIMIT = 64                   # integer exponents up to this size become repeated multiplication
HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)   # reductions over these accumulate in float32
LOSS_REDUCTIONS = ("none", "mean", "sum")
BCE_LOG_FLOOR = -100.0    # torch's BCELoss clamps log(p) and log(1 − p) here, so p = 0 or 1 gives a finite loss
TORCH_IGNORE_INDEX = -100  # torch's default ignore_index for cross_entropy
INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")

# ---------------------------------------------------------------------------------------------------------------
# argument checking helpers (pure Python on shapes; they raise the user-facing errors)

def _shape_arg(shape, rest: tuple = ()) -> tuple:
  """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` all mean shape (2, 3)."""
  if isinstance(shape, (tuple, list)):
    if rest: raise TypeError(f"give a shape either as one tuple or as separate ints, not {shape!r} and {rest!r}")
    return tuple(shape)
  return (shape, *rest)

def _varargs_shape(args: tuple) -> tuple:
  """The shape from `*shape` arguments: none (0-d), several ints, or one tuple."""
  return _shape_arg(args[0], args[1:]) if args else ()

def _check_shape(shape: tuple) -> tuple[int, ...]:
  for s in shape:
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
      raise ValueError(f"a shape needs nonnegative ints, got {shape}")
  return tuple(int(s) for s in shape)

def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  """numpy's broadcasting: align on the right; each dim pair must be equal or contain a 1."""
  ndim = max((len(s) for s in shapes), default=0)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    sizes = {d for d in dims if d != 1}
    if len(sizes) > 1:
      raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")
    out.append(sizes.pop() if sizes else 1)
  return tuple(out)

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

def _sum_dtype(dtype: DType) -> DType:
  """The dtype a sum (prod, cumsum) returns, as numpy's: bools and signed ints sum to int64, unsigned ints to uint64,
  floats keep theirs (docs/design-notes.md, "Accumulation dtypes")."""
  if dtype.is_bool or dtype.kind == 'i': return dtypes.int64
  if dtype.kind == 'u': return dtypes.uint64
  return dtype

def _copy_to_host(lb: LazyBuffer) -> np.ndarray:
  from tgrad.realize import copy_to_host
  return copy_to_host(lb.base.buffer)

# ---------------------------------------------------------------------------------------------------------------

class Tensor:
  """An n-dimensional array on a device, computed lazily.

  Autograd: `requires_grad` is None (undecided: no gradient unless an optimizer turns it on), True or False. Ops on
  tensors that require grad record a `Function` in `_ctx`; `loss.backward()` fills `.grad` of every tensor that
  requires grad (accumulating across calls), `loss.gradient(*targets)` returns gradients without touching `.grad`.
  Gradient recording is switched off in a scope with `with Tensor.no_grad():` (also a decorator); the flag it sets
  is `Tensor.grad_enabled`. Likewise `with Tensor.train():` sets `Tensor.training` (read by dropout).
  In-place forms (`+=`, `t[i] = v`, `assign`) rebind the tensor to a new lazy value; `t[i] = v` and `assign`
  are not differentiable.
  """
  training: ClassVar[bool] = False
  grad_enabled: ClassVar[bool] = True
  _seed: ClassVar[int] = int(time.time())
  _rng_state: ClassVar[dict[str, LazyBuffer]] = {}   # per device: the lazy value of [seed, calls so far] (uint32)

  class train(ContextDecorator):
    """`with Tensor.train():` (or `train(False)`) sets `Tensor.training` for the scope."""
    def __init__(self, mode: bool = True): self.mode = mode
    def __enter__(self): self.previous, Tensor.training = Tensor.training, self.mode
    def __exit__(self, *exc): Tensor.training = self.previous

  class no_grad(ContextDecorator):
    """`with Tensor.no_grad():` records no autograd graph in the scope (`Tensor.grad_enabled` is False)."""
    def __enter__(self): self.previous, Tensor.grad_enabled = Tensor.grad_enabled, False
    def __exit__(self, *exc): Tensor.grad_enabled = self.previous

  def __init__(self, data: Any, dtype: Any = None, device: Optional[str] = None, requires_grad: Optional[bool] = None):
    dtype = to_dtype(dtype) if dtype is not None else None
    self.grad: Optional[Tensor] = None
    self.requires_grad: Optional[bool] = requires_grad
    self._ctx: Optional[F.Function] = None
    if isinstance(data, Tensor): data = data.lazydata
    if isinstance(data, LazyBuffer):
      if device is not None: data = data.copy_to_device(device)
      self.lazydata: LazyBuffer = data if dtype is None else data.cast(dtype)
      return
    device = canonical_device(device)
    if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):   # np.float64 is a float too
      dtype = dtype or _python_dtype(data)
      _check_scalar_fits(data, dtype)
      self.lazydata = LazyBuffer.const_of(data, dtype, device)
    elif isinstance(data, (list, tuple)):
      try: inferred = _python_dtype(data)
      except TypeError: inferred = dtypes.from_np(np.asarray(data).dtype)   # e.g. a list of numpy scalars
      # numpy converts each Python int straight to the target dtype: one it can't hold raises OverflowError
      host_dtype = dtype if dtype is not None and dtype.is_int and inferred.is_int else inferred
      self.lazydata = _from_array(np.asarray(data, dtype=_host_dtype(host_dtype)), dtype or inferred, device)
    elif isinstance(data, (np.ndarray, np.generic)):
      array = np.asarray(data)
      if array.dtype.kind not in "biuf": raise TypeError(f"cannot make a Tensor from numpy dtype {array.dtype}")
      self.lazydata = _from_array(array, dtype or dtypes.from_np(array.dtype), device)
    else: raise TypeError(f"cannot make a Tensor from {type(data).__name__}")

  # ---- properties
  @property
  def shape(self) -> tuple[int, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> str: return self.lazydata.device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.element_size()
  def size(self, dim: Optional[int] = None):
    return self.shape if dim is None else self.shape[_resolve_axis(dim, self.ndim, self.shape)]
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __iter__(self):
    for i in range(len(self)): yield self[i]
  def __repr__(self):
    grad = self.grad.lazydata if self.grad is not None else None
    return f"<Tensor {self.lazydata!r} on {self.device} with grad {grad!r}>"
  def __hash__(self): return id(self)
  def __bool__(self): raise TypeError("the truth value of a Tensor is ambiguous: use .item(), .any() or .all()")
  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    self.requires_grad = requires_grad
    return self
  def detach(self) -> Tensor: return Tensor(self.lazydata, requires_grad=False)
  def _nograd(self, lb: LazyBuffer) -> Tensor: return Tensor(lb, requires_grad=False)

  # ---- getting data out
  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor now (its buffer stays on the device); `Tensor.realize(a, b, ...)` or `a.realize(b, ...)`
    computes several in one schedule, so their kernels are planned together."""
    realize_with_checks(self.lazydata, *[t.lazydata for t in others])
    return self
  def numpy(self) -> np.ndarray:
    """The values as a numpy array (bfloat16 comes back as float32)."""
    out_dtype = dtypes.float32 if self.dtype == dtypes.bfloat16 else self.dtype
    if self.numel() == 0: return np.zeros(self.shape, dtype=out_dtype.np)
    lb = self.lazydata.cast(out_dtype).contiguous()
    realize_with_checks(lb)
    return _copy_to_host(lb).reshape(self.shape)
  def tolist(self) -> Any: return self.numpy().tolist()
  def item(self) -> Scalar:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()
  def data(self) -> memoryview: return memoryview(self.numpy())

  # ---- device and dtype
  def to(self, device: str) -> Tensor:
    device = canonical_device(device)
    return self if device == self.device else F.ToDevice.apply(self, device=device)
  def cast(self, dtype: Any) -> Tensor:
    dtype = to_dtype(dtype)
    return self if dtype == self.dtype else F.Cast.apply(self, dtype=dtype)
  def bitcast(self, dtype: Any) -> Tensor:
    dtype = to_dtype(dtype)
    if dtype.itemsize != self.dtype.itemsize:
      raise TypeError(f"bitcast needs dtypes of one size: {self.dtype} ({self.dtype.itemsize} bytes) → {dtype}")
    return self if dtype == self.dtype else self._nograd(self.lazydata.cast(dtype, bitcast=True))
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def _to_float(self) -> Tensor: return self.cast(least_upper_float(self.dtype))
  def contiguous(self) -> Tensor: return F.Contiguous.apply(self)

  # ---- creation
  @staticmethod
  def empty(*shape, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    shape = _check_shape(_varargs_shape(shape))
    lb = LazyBuffer.loadop(Ops.EMPTY, shape, to_dtype(dtype or dtypes.default_float), canonical_device(device))
    return Tensor(lb, **kwargs)
  @staticmethod
  def full(shape, fill_value: Scalar, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    shape = _check_shape(_shape_arg(shape))
    dtype = to_dtype(dtype) if dtype is not None else _python_dtype(fill_value)
    _check_scalar_fits(fill_value, dtype)
    return Tensor(LazyBuffer.const_of(fill_value, dtype, canonical_device(device), shape), **kwargs)
  @staticmethod
  def zeros(*shape, **kwargs) -> Tensor: return Tensor.full(_varargs_shape(shape), 0.0, **_float_default(kwargs))
  @staticmethod
  def ones(*shape, **kwargs) -> Tensor: return Tensor.full(_varargs_shape(shape), 1.0, **_float_default(kwargs))
  @staticmethod
  def arange(start, stop=None, step=1, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    """Values start, start+step, ... below stop; an int dtype unless an argument is a float."""
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange step must not be zero")
    count = max(0, math.ceil((stop - start) / step))
    dtype = to_dtype(dtype) if dtype is not None else _python_dtype([start, stop, step])
    counter_dtype = dtypes.int32 if count <= dtypes.max(dtypes.int32) + 1 else dtypes.int64   # positions past 2^31
    counter = LazyBuffer.loadop(Ops.ARANGE, (count,), counter_dtype, canonical_device(device))
    if dtype.is_float:   # compute the values in a float dtype: start + i*step
      compute = dtypes.float32 if dtype in HALF_FLOATS else dtype
      values = Tensor(counter).cast(compute) * step + start
    elif step < 0 and dtype.kind == 'u':   # a negative step of an unsigned dtype counts down from start (torch)
      values = int(start) - Tensor(counter).cast(dtype) * int(-step)
    else: values = Tensor(counter).cast(dtype) * int(step) + int(start)
    return Tensor(values.cast(dtype).lazydata, **kwargs)
  @staticmethod
  def linspace(start: Scalar, stop: Scalar, steps: int, dtype: Any = None, device: Optional[str] = None, **kwargs):
    if steps < 0: raise ValueError(f"linspace needs steps >= 0, got {steps}")
    dtype = to_dtype(dtype or dtypes.default_float)
    if steps == 1: return Tensor.full((1,), start, dtype=dtype, device=device, **kwargs)
    index = Tensor.arange(steps, dtype=dtypes.float32 if dtype in HALF_FLOATS or not dtype.is_float else dtype,
                          device=device)
    values = index * ((stop - start) / max(steps - 1, 1)) + start
    values = (index == steps - 1).where(stop, values)   # the last value is exactly stop, as in numpy
    return Tensor(values.cast(dtype).lazydata, **kwargs)
  @staticmethod
  def eye(n: int, m: Optional[int] = None, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    m = n if m is None else m
    rows = Tensor.arange(n, device=device).reshape(n, 1)
    cols = Tensor.arange(m, device=device).reshape(1, m)
    return Tensor((rows == cols).cast(to_dtype(dtype or dtypes.default_float)).lazydata, **kwargs)
  def full_like(self, fill_value: Scalar, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype)
    kwargs.setdefault("device", self.device)
    return Tensor.full(self.shape, fill_value, **kwargs)
  def zeros_like(self, **kwargs) -> Tensor: return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs) -> Tensor: return self.full_like(1, **kwargs)
  def empty_like(self, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype)
    kwargs.setdefault("device", self.device)
    return Tensor.empty(self.shape, **kwargs)

  # ---- random numbers: uint32 hash of (position, seed, call number); same seed ⇒ same numbers
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    Tensor._seed, Tensor._rng_state = int(seed), {}
  @staticmethod
  def _random_bits(count: int, device: str) -> LazyBuffer:
    """`count` random uint32 values. Each call uses a fresh key, so calls differ; the numbers are a pure function of
    (seed, call number, position), computed in the kernel with MUL/XOR/SHR. The seed and the call count live in a
    device buffer that every call increments (an ASSIGN), so a TinyJit replay draws new numbers too, and every
    call reuses the same compiled kernels. The call's two keys are computed into a buffer of their own: a kernel
    that uses the numbers of several calls then reads their keys, never two versions of the counter."""
    def const(value: int, size: int) -> LazyBuffer: return LazyBuffer.const_of(value, dtypes.uint32, device, (size,))
    def mix(x: LazyBuffer) -> LazyBuffer:   # murmur3 fmix32
      n = x.shape[0]
      x = x.alu(Ops.XOR, x.alu(Ops.SHR, const(16, n))).alu(Ops.MUL, const(MURMUR_MULTIPLIER_1, n))
      x = x.alu(Ops.XOR, x.alu(Ops.SHR, const(13, n))).alu(Ops.MUL, const(MURMUR_MULTIPLIER_2, n))
      return x.alu(Ops.XOR, x.alu(Ops.SHR, const(16, n)))
    if (state := Tensor._rng_state.get(device)) is None:   # [seed, 0], copied in when the buffer is first used
      initial = np.array([Tensor._seed & UINT32_MASK, 0], dtype=np.uint32)
      state = LazyBuffer.from_buffer(Buffer(device, 2, dtypes.uint32, initial=initial), (2,))
    one_more_call = LazyBuffer.loadop(Ops.ARANGE, (2,), dtypes.int32, device).cast(dtypes.uint32)   # [0, 1]
    state = Tensor._rng_state[device] = state.assign(state.alu(Ops.ADD, one_more_call))
    seed, calls = (state.shrink(((i, i + 1),)) for i in range(2))
    key = mix(seed.alu(Ops.MUL, const(GOLDEN_RATIO_32, 1)).alu(Ops.ADD, mix(calls)))
    second_key = mix(key.alu(Ops.XOR, const(GOLDEN_RATIO_32, 1)))
    keys = key.pad(((0, 1),)).alu(Ops.ADD, second_key.pad(((1, 0),))).contiguous()   # [key, second key]
    def key_at(i: int) -> LazyBuffer: return keys.shrink(((i, i + 1),)).expand((count,))
    counter = LazyBuffer.loadop(Ops.ARANGE, (count,), dtypes.int32, device).cast(dtypes.uint32)
    x = mix(counter.alu(Ops.MUL, const(GOLDEN_RATIO_32, count)).alu(Ops.ADD, key_at(0)))
    return mix(x.alu(Ops.XOR, key_at(1)))
  @staticmethod
  def rand(*shape, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    """Uniform in [0, 1): the top bits of a random uint32, as many as the float format holds exactly."""
    shape = _check_shape(_varargs_shape(shape))
    dtype, device = to_dtype(dtype or dtypes.default_float), canonical_device(device)
    if not dtype.is_float: raise TypeError(f"rand makes floats, not {dtype}")
    bits = RANDOM_FLOAT_BITS[dtype]
    random = Tensor._random_bits(prod(shape), device)
    if bits < 32: random = random.alu(Ops.SHR, random.const(32 - bits))
    compute = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    values = random.cast(compute).alu(Ops.MUL, LazyBuffer.const_of(2.0 ** -bits, compute, device, (prod(shape),)))
    return Tensor(values.cast(dtype).reshape(shape), **kwargs)
  @staticmethod
  def randn(*shape, dtype: Any = None, device: Optional[str] = None, **kwargs) -> Tensor:
    """Standard normal by Box–Muller on two uniforms."""
    shape = _check_shape(_varargs_shape(shape))
    dtype = to_dtype(dtype or dtypes.default_float)
    compute = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    uniform = Tensor.rand(2, prod(shape), dtype=compute, device=device)
    radius = ((1 - uniform[0]).log() * -2).sqrt()
    values = radius * (uniform[1] * (2 * math.pi)).cos()
    return Tensor(values.cast(dtype).reshape(shape).lazydata, **kwargs)
  @staticmethod
  def randint(*shape, low: int = 0, high: int = 10, dtype: Any = None, device: Optional[str] = None, **kwargs):
    """Uniform ints in [low, high). tinygrad's `randint(*shape, low=, high=)`; torch's `randint(low, high, shape)`
    (three positional arguments, the last a tuple) is accepted too."""
    if len(shape) == 3 and isinstance(shape[2], (tuple, list)): low, high, shape = shape[0], shape[1], tuple(shape[2])
    shape = _check_shape(_varargs_shape(shape))
    if high <= low: raise ValueError(f"randint needs low < high, got low={low}, high={high}")
    dtype, device = to_dtype(dtype or dtypes.default_int), canonical_device(device)
    random = Tensor._random_bits(prod(shape), device)
    offset = random.alu(Ops.MOD, random.const(high - low)).cast(dtypes.int64 if dtype.itemsize > 4 else dtypes.int32)
    return Tensor((Tensor(offset) + low).cast(dtype).reshape(shape).lazydata, **kwargs)
  @staticmethod
  def uniform(*shape, low: float = 0.0, high: float = 1.0, dtype: Any = None, **kwargs) -> Tensor:
    requires_grad = kwargs.pop("requires_grad", None)
    values = Tensor.rand(*shape, dtype=dtype, **kwargs) * (high - low) + low
    return Tensor(values.lazydata, requires_grad=requires_grad)
  @staticmethod
  def normal(*shape, mean: float = 0.0, std: float = 1.0, dtype: Any = None, **kwargs) -> Tensor:
    requires_grad = kwargs.pop("requires_grad", None)
    values = Tensor.randn(*shape, dtype=dtype, **kwargs) * std + mean
    return Tensor(values.lazydata, requires_grad=requires_grad)
  @staticmethod
  def scaled_uniform(*shape, **kwargs) -> Tensor:
    """Uniform in ±1/√numel."""
    shape = _varargs_shape(shape)
    return Tensor.uniform(shape, low=-1.0, high=1.0, **kwargs) * (prod(shape) ** -0.5)
  @staticmethod
  def glorot_uniform(*shape, **kwargs) -> Tensor:
    """Xavier/Glorot: uniform in ±√(6 / (fan_in + fan_out))."""
    shape = _varargs_shape(shape)
    bound = math.sqrt(6 / (shape[0] + prod(shape[1:])))
    return Tensor.uniform(shape, low=-bound, high=bound, **kwargs)
  @staticmethod
  def kaiming_uniform(*shape, a: float = 0.01, **kwargs) -> Tensor:
    """He/Kaiming: uniform in ±√3·gain/√fan_in, gain = √(2 / (1 + a²)) (torch's default for leaky relu)."""
    shape = _varargs_shape(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shape[1:]))
    return Tensor.uniform(shape, low=-bound, high=bound, **kwargs)
  def rand_like(self, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
    kwargs.setdefault("device", self.device)
    return Tensor.rand(self.shape, **kwargs)
  def randn_like(self, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
    kwargs.setdefault("device", self.device)
    return Tensor.randn(self.shape, **kwargs)

  # ---- autograd
  def _toposort(self) -> list[Tensor]:
    """Every tensor in the recorded graph below self, inputs before the tensors made from them."""
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(self, False)]
    while stack:
      node, inputs_done = stack.pop()
      if inputs_done:
        order.append(node)
        continue
      if id(node) in visited: continue
      visited.add(id(node))
      stack.append((node, True))
      if node._ctx is not None: stack.extend((p, False) for p in node._ctx.parents if id(p) not in visited)
    return order
  def _check_differentiable(self, name: str) -> None:
    """As torch: differentiating a tensor with no gradient graph is an error, not a silent no-op."""
    if not self.requires_grad:
      raise RuntimeError(f"{name} of a tensor of shape {self.shape} that does not require grad and has no gradient "
                         "graph: it was computed under Tensor.no_grad() or only from tensors that don't require grad")
  def _backprop(self, gradient: Optional[Tensor]) -> tuple[list[Tensor], dict[int, LazyBuffer]]:
    if gradient is None:
      if self.numel() != 1:
        raise RuntimeError(f"backward without a gradient needs a tensor with one element, got shape {self.shape}")
      gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
    if gradient.shape != self.shape:
      raise RuntimeError(f"gradient of shape {gradient.shape} for a tensor of shape {self.shape}")
    nodes = self._toposort()
    grads: dict[int, LazyBuffer] = {id(self): gradient.cast(self.dtype).lazydata}
    for node in reversed(nodes):
      if node._ctx is None or id(node) not in grads: continue
      parent_grads = node._ctx.backward(grads[id(node)])
      if not isinstance(parent_grads, tuple): parent_grads = (parent_grads,)
      for parent, grad in zip(node._ctx.parents, parent_grads):
        if grad is None or not parent.requires_grad: continue
        assert grad.shape == parent.shape, f"gradient shape {grad.shape} for {parent.shape} from {node._ctx}"
        grad = grad.cast(parent.dtype)
        grads[id(parent)] = grads[id(parent)].alu(Ops.ADD, grad) if id(parent) in grads else grad
    return nodes, grads
  def backward(self, gradient: Optional[Tensor] = None) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every tensor t in the graph that requires grad."""
    self._check_differentiable("backward")
    nodes, grads = self._backprop(gradient)
    for node in nodes:
      if node.requires_grad and id(node) in grads:
        grad = Tensor(grads[id(node)], requires_grad=False)
        node.grad = grad if node.grad is None else Tensor(node.grad.lazydata.alu(Ops.ADD, grad.lazydata))
    return self
  def gradient(self, *targets: Tensor, gradient: Optional[Tensor] = None) -> list[Tensor]:
    """d(self)/d(target) for each target, as new tensors; `.grad` is left alone. Unused targets get zeros."""
    self._check_differentiable("gradient")
    for t in targets:
      if not t.requires_grad: raise RuntimeError(f"gradient target of shape {t.shape} does not require grad")
    _, grads = self._backprop(gradient)
    return [Tensor(grads[id(t)], requires_grad=False) if id(t) in grads else t.detach().zeros_like() for t in targets]

  # ---- broadcasting and promotion
  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if len(shape) < self.ndim: raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
    x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
    if any(s != n and s != 1 for s, n in zip(x.shape, shape)):
      raise ValueError(f"cannot broadcast {self.shape} to {shape}")
    return F.Expand.apply(x, shape=shape) if x.shape != shape else x
  def _as_tensor(self, x: Any, dtype: Optional[DType] = None) -> Tensor:
    if isinstance(x, Tensor):
      if x.device != self.device: raise ValueError(f"tensors on different devices: {self.device} and {x.device}")
      return x
    if isinstance(x, (bool, int, float)):
      return Tensor(x, dtype=dtype or _scalar_dtype(self.dtype, x), device=self.device)
    return Tensor(x, dtype=dtype, device=self.device)
  def _operands(self, other: Any, reverse: bool = False, dtype: Optional[DType] = None) -> tuple[Tensor, Tensor]:
    """self and other broadcast to one shape and promoted to one dtype (Python scalars are weak)."""
    if isinstance(other, (bool, int, float)):   # a constant made at self's shape: no reshape/expand ops to record
      out_dtype = dtype or _scalar_dtype(self.dtype, other)
      _check_scalar_fits(other, out_dtype)
      x = self if out_dtype is self.lazydata.dtype else self.cast(out_dtype)
      y = Tensor(LazyBuffer.const_of(other, out_dtype, self.device, self.shape))
      return (y, x) if reverse else (x, y)
    y = self._as_tensor(other)
    out_dtype = dtype or promote_types(self.dtype, y.dtype)
    shape = broadcast_shape(self.shape, y.shape)
    x, y = self.cast(out_dtype)._broadcast_to(shape), y.cast(out_dtype)._broadcast_to(shape)
    return (y, x) if reverse else (x, y)
  def _int_operands(self, other: Any, reverse: bool, op_name: str) -> tuple[Tensor, Tensor]:
    x, y = self._operands(other, reverse)
    if x.dtype.is_float: raise TypeError(f"{op_name} needs int or bool tensors, got {self.dtype} and {y.dtype}")
    return x, y

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
    if a.dtype in HALF_FLOATS: return a.cast(dtypes.float32).floordiv(b.cast(dtypes.float32)).cast(a.dtype)
    if a.dtype.is_float: return self._nograd(F.float_divmod(a.lazydata, b.lazydata)[0])   # numpy's, from fmod
    if a.dtype.is_bool: a, b = a.int(), b.int()
    quotient = a.lazydata.alu(Ops.IDIV, b.lazydata)
    if a.dtype.is_unsigned: return self._nograd(quotient)
    return self._nograd(quotient) - _needs_floor_fix(a, b).cast(a.dtype)
  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """Python's `%`: the result has the sign of the divisor. Integer x % 0 gives 0 (as numpy)."""
    a, b = self._operands(x, reverse)
    if a.dtype in HALF_FLOATS: return a.cast(dtypes.float32).mod(b.cast(dtypes.float32)).cast(a.dtype)
    if a.dtype.is_float: return F.FloatMod.apply(a, b)   # numpy's, from the exact fmod
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

  # ---- reductions
  def _reduce_axes(self, axis) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    resolved = tuple(_resolve_axis(a, self.ndim, self.shape) for a in axes)
    if len(set(resolved)) != len(resolved): raise ValueError(f"repeated axis in {axis} for shape {self.shape}")
    return resolved
  def _reduce(self, function: type[F.Function], axes: tuple[int, ...], keepdim: bool) -> Tensor:
    out = function.apply(self, axes=axes) if axes else self
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def _reduced_shape(self, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(self.shape) if keepdim or i not in axes)
  def _accumulate(self, function: type[F.Function], axis, keepdim: bool, acc_dtype) -> Tensor:
    axes = self._reduce_axes(axis)
    out_dtype = _sum_dtype(self.dtype)
    if acc_dtype is None: acc_dtype = dtypes.float32 if out_dtype in HALF_FLOATS else out_dtype
    return self.cast(to_dtype(acc_dtype))._reduce(function, axes, keepdim).cast(out_dtype)
  def sum(self, axis=None, keepdim: bool = False, acc_dtype: Any = None) -> Tensor:
    """Sum over `axis` (int, tuple, None: all). As numpy: bools and signed ints sum to int64, unsigned ints to uint64;
    float16/bfloat16 accumulate in float32."""
    return self._accumulate(F.Sum, axis, keepdim, acc_dtype)
  def prod(self, axis=None, keepdim: bool = False, acc_dtype: Any = None) -> Tensor:
    return self._accumulate(F.Prod, axis, keepdim, acc_dtype)
  def max(self, axis=None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if any(self.shape[a] == 0 for a in axes):
      raise ValueError(f"max over an empty axis: shape {self.shape}, axis {axis}")
    if self.dtype.is_bool: return self.cast(dtypes.uint8).max(axis, keepdim).cast(dtypes.bool)
    return self._reduce(F.Max, axes, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> Tensor:
    if self.dtype.is_bool: return self.logical_not().max(axis, keepdim).logical_not()
    return self._order_flip().max(axis, keepdim)._order_flip()
  def mean(self, axis=None, keepdim: bool = False) -> Tensor:
    float_dtype = least_upper_float(self.dtype)
    acc_dtype = dtypes.float32 if float_dtype in HALF_FLOATS else float_dtype
    total = self.cast(acc_dtype).sum(axis, keepdim)
    count = prod(self.shape[a] for a in self._reduce_axes(axis))
    return (total / count).cast(float_dtype)   # 0 / 0 is NaN for an empty axis, as numpy
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Computed in float32 for float16/bfloat16 (_float_math): a count over 65504 is inf in float16."""
    count = prod(self.shape[a] for a in self._reduce_axes(axis))
    def spread(x: Tensor) -> Tensor:
      return (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim) / max(0, count - correction)
    return self._float_math(spread)
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    return self.var(axis, keepdim, correction).sqrt()
  def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """The index (int32; int64 on an axis past 2^31 elements) of the first maximum; NaN counts as the maximum, as in
    numpy."""
    if axis is None:
      out = self.flatten().argmax(0)
      return out.reshape((1,) * self.ndim) if keepdim else out
    axis = _resolve_axis(axis, self.ndim, self.shape)
    size = self.shape[axis]
    if size == 0: raise ValueError(f"argmax over an empty axis: shape {self.shape}, axis {axis}")
    x = self.detach()
    is_max = x == x.max(axis, keepdim=True)
    if x.dtype.is_float: is_max = is_max | x.isnan()
    index_dtype = dtypes.int32 if size <= dtypes.max(dtypes.int32) else dtypes.int64
    countdown = Tensor.arange(size, 0, -1, dtype=index_dtype, device=self.device).reshape((size,) + (1,) *
                                                                                        (self.ndim - axis - 1))
    return size - is_max.where(countdown, 0).max(axis, keepdim)
  def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    flipped = self.detach().logical_not() if self.dtype.is_bool else self.detach()._order_flip()
    return flipped.argmax(axis, keepdim)
  def any(self, axis=None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if any(self.shape[a] == 0 for a in axes):
      return Tensor.full(self._reduced_shape(axes, keepdim), False, device=self.device)
    return (self != 0).max(axis, keepdim)
  def all(self, axis=None, keepdim: bool = False) -> Tensor:
    return self.logical_not().any(axis, keepdim).logical_not()
  # softmax and friends compute float16/bfloat16 in float32 (_float_math): their sum of exponentials reaches the
  # axis length, and over 65504 elements a float16 sum is inf (softmax would be all zeros)
  def softmax(self, axis: int = -1) -> Tensor:
    def stable(x: Tensor) -> Tensor:
      exponentials = (x - x.max(axis, keepdim=True).detach()).exp()
      return exponentials / exponentials.sum(axis, keepdim=True)
    return self._float_math(stable)
  def log_softmax(self, axis: int = -1) -> Tensor:
    def stable(x: Tensor) -> Tensor:
      shifted = x - x.max(axis, keepdim=True).detach()
      return shifted - shifted.exp().sum(axis, keepdim=True).log()
    return self._float_math(stable)
  def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
    def stable(x: Tensor) -> Tensor:
      peak = x.max(axis, keepdim=True).detach()
      peak = peak.isinf().where(0, peak)     # all −inf (or +inf) rows: shift by 0 instead of producing NaN
      return (x - peak).exp().sum(axis, keepdim=True).log() + peak
    out = self._float_math(stable)
    return out if keepdim else out.reshape(self._reduced_shape(self._reduce_axes(axis), keepdim=False))
  # ---- scans: an associative op run along one axis, blocked so the work is O(n·SCAN_BLOCK) in O(log n) kernels
  def _scan(self, axis: int, kind: str) -> Tensor:
    """The inclusive scan of `kind` (a key of SCAN_KINDS) along `axis`, in self's dtype (the caller casts)."""
    axis = _resolve_axis(axis, self.ndim, self.shape) if self.ndim else 0
    if self.ndim == 0 or self.shape[axis] <= 1: return self
    return _scan_last(self.transpose(axis, -1), SCAN_KINDS[kind]).transpose(axis, -1)
  def cumsum(self, axis: int = 0) -> Tensor:
    """Running sum along `axis`, in sum's dtype (bools and signed ints give int64, unsigned uint64, as numpy)."""
    out_dtype = _sum_dtype(self.dtype)
    return self.cast(dtypes.float32 if out_dtype in HALF_FLOATS else out_dtype)._scan(axis, "sum").cast(out_dtype)
  def cumprod(self, axis: int = 0) -> Tensor:
    """Running product along `axis`, in sum's dtype. float32 multiplies in float64 (torch's CPU accumulator): the
    blocked order multiplies factors near 1 together, where float32 drops the small cross terms (a 10^4-long product
    of 1 ± 1e-4 factors drifted 3e-5 in float32, against 5e-6 for a sequential loop)."""
    out_dtype = _sum_dtype(self.dtype)
    acc_dtype = dtypes.float64 if out_dtype == dtypes.float32 else dtypes.float32 if out_dtype in HALF_FLOATS else \
      out_dtype
    return self.cast(acc_dtype)._scan(axis, "prod").cast(out_dtype)
  def cummax(self, axis: int = 0) -> Tensor:
    """Running maximum along `axis` (the values only, as tinygrad; torch also returns indices). NaN propagates."""
    if self.dtype.is_bool: return self.cast(dtypes.uint8)._scan(axis, "max").cast(dtypes.bool)
    return self._scan(axis, "max")
  def cummin(self, axis: int = 0) -> Tensor:
    """Running minimum along `axis` (the values only). NaN propagates."""
    if self.dtype.is_bool: return self.logical_not().cummax(axis).logical_not()
    return self._order_flip()._scan(axis, "max")._order_flip()
  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, computed without overflow or underflow (each block shifts by its running
    max; blocks combine by logaddexp), as torch.logcumsumexp."""
    x = self._to_float()
    return x.cast(dtypes.float32)._scan(axis, "logsumexp").cast(x.dtype) if x.dtype in HALF_FLOATS else \
      x._scan(axis, "logsumexp")

  # ---- movement
  def reshape(self, shape, *args) -> Tensor:
    """New shape; one dim may be -1 (inferred) and None keeps that dim."""
    shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(_shape_arg(shape, args)))
    if shape.count(-1) > 1: raise ValueError(f"reshape of {self.shape}: only one dim can be -1, got {shape}")
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape tensor of shape {self.shape} to {shape}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    shape = _check_shape(shape)
    if prod(shape) != self.numel(): raise ValueError(f"cannot reshape tensor of shape {self.shape} to {shape}")
    return self if shape == self.shape else F.Reshape.apply(self, shape=shape)
  def view(self, shape, *args) -> Tensor: return self.reshape(shape, *args)
  def permute(self, order, *args) -> Tensor:
    order = tuple(_resolve_axis(a, self.ndim, self.shape) for a in _shape_arg(order, args))
    if sorted(order) != list(range(self.ndim)):
      raise ValueError(f"permute order {order} is not a permutation of the {self.ndim} dims of {self.shape}")
    return self if order == tuple(range(self.ndim)) else F.Permute.apply(self, order=order)
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = _resolve_axis(dim0, self.ndim, self.shape), _resolve_axis(dim1, self.ndim, self.shape)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))
  def expand(self, shape, *args) -> Tensor:
    """Broadcast to `shape` (-1 keeps a dim; new dims go in front)."""
    shape = _shape_arg(shape, args)
    if len(shape) < self.ndim: raise ValueError(f"cannot expand {self.shape} to fewer dims: {shape}")
    current = (1,) * (len(shape) - self.ndim) + self.shape
    target = tuple(c if s == -1 else s for s, c in zip(shape, current))
    if any(c != t and c != 1 for c, t in zip(current, _check_shape(target))):
      raise ValueError(f"cannot expand {self.shape} to {shape}")
    return self._broadcast_to(target)
  def pad(self, padding, value: Scalar = 0.0, mode: str = "constant") -> Tensor:
    """Pad with `value`: `padding` is ((before, after) or None per dim), or torch's flat (left, right, top, bottom,
    ...) starting from the last dim. Negative amounts cut."""
    if mode != "constant": raise ValueError(f"only constant padding is supported, got mode {mode!r}")
    padding = _normalize_padding(padding, self.shape)
    if all(p == (0, 0) for p in padding): return self
    bounds = tuple((-min(b, 0), s + min(a, 0)) for s, (b, a) in zip(self.shape, padding))
    if any(lo > hi for lo, hi in bounds): raise ValueError(f"padding {padding} cuts more than shape {self.shape}")
    x = self.shrink(bounds)
    grow = tuple((max(b, 0), max(a, 0)) for b, a in padding)
    padded = F.Pad.apply(x, padding=grow) if any(p != (0, 0) for p in grow) else x
    if value == 0 or padded is x: return padded
    inside = Tensor(LazyBuffer.const_of(True, dtypes.bool, self.device, x.shape).pad(grow))
    return inside.where(padded, value)
  def shrink(self, bounds) -> Tensor:
    """Keep [start, end) per dim (None keeps the dim)."""
    if len(bounds) != self.ndim:
      raise ValueError(f"shrink needs {self.ndim} bounds for shape {self.shape}, got {bounds}")
    bounds = tuple((0, s) if b is None else (int(b[0]), int(b[1])) for s, b in zip(self.shape, bounds))
    if any(not 0 <= lo <= hi <= s for s, (lo, hi) in zip(self.shape, bounds)):
      raise ValueError(f"shrink bounds {bounds} are outside shape {self.shape}")
    return self if bounds == tuple((0, s) for s in self.shape) else F.Shrink.apply(self, bounds=bounds)
  def flip(self, axis, *args) -> Tensor:
    axes = {_resolve_axis(a, self.ndim, self.shape) for a in _shape_arg(axis, args)}
    if not axes: return self
    return F.Flip.apply(self, axes=tuple(i in axes for i in range(self.ndim)))
  def _stride(self, steps: tuple[int, ...]) -> Tensor:
    return self if all(s == 1 for s in steps) else F.Stride.apply(self, steps=steps)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    start, end = _resolve_axis(start_dim, self.ndim, self.shape), _resolve_axis(end_dim, self.ndim, self.shape)
    if start > end: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return self.reshape(self.shape[:start] + (prod(self.shape[start:end + 1]),) + self.shape[end + 1:])
  def unflatten(self, dim: int, sizes) -> Tensor:
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1:])
  def squeeze(self, dim: Optional[int] = None) -> Tensor:
    """Drop size-1 dims (all of them, or `dim` if it has size 1; other sizes are left alone, as in torch)."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    if self.ndim == 0 and dim in (0, -1): return self
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self if self.shape[dim] != 1 else self.reshape(self.shape[:dim] + self.shape[dim + 1:])
  def unsqueeze(self, dim: int) -> Tensor:
    dim = _resolve_axis(dim, self.ndim + 1, self.shape)
    return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])
  def repeat(self, repeats, *args) -> Tensor:
    """Tile like torch's repeat: `repeats` has one count per dim (more dims add leading ones)."""
    repeats = _shape_arg(repeats, args)
    if len(repeats) < self.ndim:
      raise ValueError(f"repeat needs at least {self.ndim} counts for {self.shape}, got {repeats}")
    base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    interleaved = base.reshape(tuple(d for s in base.shape for d in (1, s)))
    tiled = interleaved.expand(tuple(d for r, s in zip(repeats, base.shape) for d in (r, s)))
    return tiled.reshape(tuple(r * s for r, s in zip(repeats, base.shape)))
  def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Join along `dim`: `a.cat(b, c, dim=0)` or `Tensor.cat(a, b, c)` or `Tensor.cat([a, b, c])`."""
    tensors = _tensor_list(self, args)
    first = tensors[0]
    if first.ndim == 0: raise ValueError("cat of 0-d tensors: use stack")
    dim = _resolve_axis(dim, first.ndim, first.shape)
    for t in tensors:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim):
        raise ValueError(f"cat along dim {dim}: shapes {[x.shape for x in tensors]} differ outside that dim")
    dtype = least_upper_dtype(*[t.dtype for t in tensors])
    total = sum(t.shape[dim] for t in tensors)
    out, offset = None, 0
    for t in tensors:
      padding = tuple((offset, total - offset - t.shape[dim]) if i == dim else (0, 0) for i in range(first.ndim))
      piece = t.cast(dtype).pad(padding)
      out = piece if out is None else out + piece
      offset += t.shape[dim]
    return out
  def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Join along a new `dim`: `a.stack(b, dim=0)`, `Tensor.stack(a, b)` or `Tensor.stack([a, b])`."""
    tensors = _tensor_list(self, args)
    for t in tensors:
      if t.shape != tensors[0].shape: raise ValueError(f"stack needs one shape, got {[x.shape for x in tensors]}")
    dim = _resolve_axis(dim, tensors[0].ndim + 1, tensors[0].shape)
    expanded = [t.unsqueeze(dim) for t in tensors]
    return expanded[0].cat(*expanded[1:], dim=dim)
  def split(self, sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces along `dim`: of `sizes` each (an int; the last may be smaller) or of the listed sizes."""
    dim = _resolve_axis(dim, self.ndim, self.shape)
    length = self.shape[dim]
    if isinstance(sizes, int):
      if sizes <= 0: raise ValueError(f"split size must be positive, got {sizes}")
      sizes = [min(sizes, length - start) for start in range(0, length, sizes)] or [0]
    if sum(sizes) != length:
      raise ValueError(f"split sizes {list(sizes)} do not add up to {length} (shape {self.shape})")
    pieces, start = [], 0
    for size in sizes:
      pieces.append(self.shrink(tuple((start, start + size) if i == dim else None for i in range(self.ndim))))
      start += size
    return tuple(pieces)
  def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    if chunks <= 0: raise ValueError(f"chunk needs a positive count, got {chunks}")
    dim = _resolve_axis(dim, self.ndim, self.shape)
    return self.split(max(1, math.ceil(self.shape[dim] / chunks)), dim)

  # ---- indexing
  def __getitem__(self, indices) -> Tensor:
    """numpy indexing: ints (negative count from the end), slices (any step), None, Ellipsis, and int Tensors or
    lists (a gather, built as a one-hot compare with ARANGE and a sum). Tensor indices may be negative down to
    -size; out-of-range ones raise IndexError, at once for host values, else at the next realize (see
    tgrad/bounds.py)."""
    plan = _IndexPlan(self.shape, indices, self.device)
    x = self.shrink(plan.bounds).flip(tuple(i for i, f in enumerate(plan.flips) if f))._stride(tuple(plan.steps))
    x = x.reshape(plan.view_shape)
    return x if not plan.tensor_indices else x._gather(plan)
  def _gather(self, plan: _IndexPlan) -> Tensor:
    dims = [d for d, _ in plan.tensor_indices]
    rest = [d for d in range(self.ndim) if d not in dims]
    index_shape = broadcast_shape(*[t.shape for _, t in plan.tensor_indices])
    ones_index, ones_rest, n_gathered = (1,) * len(index_shape), (1,) * len(rest), len(dims)
    x = self.permute(rest + dims)
    x = x.reshape(ones_index + x.shape)
    mask: Optional[Tensor] = None
    for k, ((dim, index), input_dim) in enumerate(zip(plan.tensor_indices, plan.tensor_input_dims)):
      size = self.shape[dim]
      message = f"index {{value}} is out of bounds for dimension {input_dim} with size {{size}}"   # torch's words
      check_index_bounds(index.lazydata, IndexBounds(-size, size, message))
      index = index.cast(dtypes.int32)
      index = (index < 0).where(index + size, index)._broadcast_to(index_shape)
      one_hot_shape = (1,) * k + (size,) + (1,) * (n_gathered - k - 1)
      positions = Tensor.arange(size, device=self.device).reshape(ones_index + ones_rest + one_hot_shape)
      hit = index.reshape(index_shape + ones_rest + (1,) * n_gathered) == positions
      mask = hit if mask is None else mask & hit
    assert mask is not None
    gathered_axes = tuple(range(x.ndim - n_gathered, x.ndim))
    out = mask.where(x, 0).sum(gathered_axes, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    if plan.advanced_adjacent and plan.advanced_position > 0:   # numpy: the index dims replace the indexed dims
      n_index, position = len(index_shape), plan.advanced_position
      before, after = range(n_index, n_index + position), range(n_index + position, out.ndim)
      order = list(before) + list(range(n_index)) + list(after)
      out = out.permute(order)
    return out
  def __setitem__(self, indices, value: Any) -> None:
    """In place on this Tensor: it is rebound to a lazy value with the selected positions replaced (and written into
    its buffer when that is realized). Basic indices cost O(numel); tensor indices O(numel × selected), where a
    repeated position takes the last value, as numpy. Not differentiable."""
    if self.requires_grad and Tensor.grad_enabled:
      raise RuntimeError(f"item assignment into a tensor that requires grad (shape {self.shape}); use Tensor.no_grad()")
    plan = _IndexPlan(self.shape, indices, self.device)
    value = self._as_tensor(value, dtype=self.dtype if not isinstance(value, Tensor) else None).cast(self.dtype)
    if plan.tensor_indices: new = self._scatter(indices, value)
    else:
      value = value.detach()._broadcast_to(plan.view_shape)
      placed = plan.place(value.lazydata)
      inside = plan.place(LazyBuffer.const_of(True, dtypes.bool, self.device, plan.view_shape))
      new = Tensor(inside).where(Tensor(placed), self.detach())
    self.assign(new)
  def _scatter(self, indices, value: Tensor) -> Tensor:
    positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[indices]
    value = value.detach()._broadcast_to(positions.shape).flatten()
    positions = positions.flatten()
    selected = positions.shape[0]
    if selected == 0: return self.detach()
    matches = Tensor.arange(self.numel(), device=self.device).reshape(-1, 1) == positions.reshape(1, -1)
    order = Tensor.arange(selected, device=self.device).reshape(1, -1)
    last = matches.where(order, -1).max(1, keepdim=True)        # the last write to each position wins
    chosen = matches & (order == last)
    written = chosen.where(value.reshape(1, -1), 0).sum(1, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    return (last.reshape(-1) >= 0).where(written, self.detach().flatten()).reshape(self.shape)
  def assign(self, x: Any) -> Tensor:
    """Replace this tensor's value with x (same shape; cast to this dtype). When this tensor holds a realized buffer,
    the buffer itself is written on realize (Ops.ASSIGN). Not tracked by autograd."""
    x = self._as_tensor(x, dtype=self.dtype if not isinstance(x, Tensor) else None)
    if x.shape != self.shape:
      x = x._broadcast_to(self.shape) if broadcast_shape(x.shape, self.shape) == self.shape else x
      if x.shape != self.shape: raise ValueError(f"assign of shape {x.shape} into a tensor of shape {self.shape}")
    value = x.cast(self.dtype).lazydata
    target = self.lazydata
    if not (target.is_base and target.realized is not None): self.lazydata = value
    else:   # a rearranged view of the target itself must be copied out before it is written over
      self.lazydata = target.assign(value.contiguous() if value.base is target and value is not target else value)
    self._ctx = None
    return self
  def _inplace(self, result: Tensor) -> Tensor:
    """`x += y` and friends: self becomes the result; autograd sees the old value as its own node. Under no_grad
    (an update of a parameter, say) self keeps its requires_grad, as in torch."""
    self.lazydata, self._ctx = result.lazydata, result._ctx
    if Tensor.grad_enabled: self.requires_grad = result.requires_grad
    return self
  def _snapshot(self) -> Tensor:
    if self.requires_grad and self._ctx is None and Tensor.grad_enabled:
      raise RuntimeError(f"in-place op on a leaf tensor that requires grad (shape {self.shape}); use Tensor.no_grad()")
    old = Tensor(self.lazydata, requires_grad=self.requires_grad)
    old._ctx = self._ctx
    return old

  # ---- matrix products
  def dot(self, w: Tensor, acc_dtype: Any = None) -> Tensor:
    """numpy's matmul: 1-D operands are vectors, leading dims broadcast as a batch."""
    w = self._as_tensor(w)
    if self.ndim == 0 or w.ndim == 0:
      raise ValueError(f"matmul needs at least 1-D operands, got {self.shape} and {w.shape}")
    x, y = self.reshape(1, -1) if self.ndim == 1 else self, w.reshape(-1, 1) if w.ndim == 1 else w
    if x.shape[-1] != y.shape[-2]:
      raise ValueError(f"matmul: inner dimensions differ: {self.shape} @ {w.shape} ({x.shape[-1]} != {y.shape[-2]})")
    try: batch = broadcast_shape(x.shape[:-2], y.shape[:-2])
    except ValueError: raise ValueError(f"matmul: batch dims of {self.shape} and {w.shape} do not broadcast") from None
    dtype = promote_types(x.dtype, y.dtype)
    n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
    x = x.cast(dtype)._broadcast_to(batch + (n, k)).reshape(batch + (n, 1, k))
    y = y.cast(dtype)._broadcast_to(batch + (k, m)).transpose(-1, -2).reshape(batch + (1, m, k))
    out = (x * y).sum(-1, acc_dtype=acc_dtype).cast(dtype)
    if self.ndim == 1: out = out.squeeze(-2)
    if w.ndim == 1: out = out.squeeze(-1)
    return out
  def matmul(self, x: Tensor, reverse: bool = False) -> Tensor:
    return self._as_tensor(x).dot(self) if reverse else self.dot(x)
  def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """tinygrad's linear: x·weight (weight is (in, out)), plus bias."""
    out = self * weight if weight.ndim == 1 else self.dot(weight)
    return out + bias if bias is not None else out
  def sequential(self, layers: Sequence) -> Tensor:
    """Apply callables in order: `x.sequential([layer1, Tensor.relu, layer2])`."""
    return functools.reduce(lambda x, layer: layer(x), layers, self)
  @staticmethod
  def einsum(formula: str, *operands, acc_dtype: Any = None) -> Tensor:
    """Einstein summation, e.g. "ij,jk->ik", "bij,bjk->bik", "ii->i" (diagonal), "ii" (trace), "i,j->ij",
    "...ij->...ji". Built from diagonal views, permutes, broadcast multiplies and one sum."""
    tensors = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    return _einsum(formula, tensors, acc_dtype)

  # ---- triangles
  def _triangle_mask(self, diagonal: int, lower: bool) -> Tensor:
    """True on and below (lower) or on and above the `diagonal`-th diagonal of the last two dims."""
    if self.ndim < 2:
      raise RuntimeError(f"{'tril' if lower else 'triu'}: input tensor must have at least 2 dimensions, got shape "
                         f"{self.shape}")
    rows, cols = self.shape[-2:]
    column = Tensor.arange(cols, device=self.device).reshape(1, cols)
    offset = column - Tensor.arange(rows, device=self.device).reshape(rows, 1)   # column − row
    return offset <= diagonal if lower else offset >= diagonal
  def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (column − row <= diagonal); zeros elsewhere."""
    return self._triangle_mask(diagonal, lower=True).where(self, self.zeros_like())
  def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (column − row >= diagonal); zeros elsewhere."""
    return self._triangle_mask(diagonal, lower=False).where(self, self.zeros_like())

  # ---- sliding windows: convolution and pooling
  def _pool(self, kernel_size: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(kernel_size) dims, as a view: (..., *in) → (..., *out, *kernel), where
    window o holds x[o·stride + k·dilation] at kernel position k. Nothing is copied; movement ops only.
    Windows that don't overlap (kernel <= stride, no dilation) are a reshape into (out, stride) blocks. Otherwise,
    per dim of size i: repeat x (expand), flatten, and re-cut into rows of length r ≡ dilation (mod i), so row k
    starts k·dilation further into x; keep every stride-th column of the first out·stride."""
    count = len(kernel_size)
    lead, spatial = self.shape[:-count], self.shape[-count:]
    out = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel_size, stride, dilation))
    keep_lead = tuple((0, n) for n in lead)
    def interleave(*groups) -> tuple: return lead + tuple(v for group in zip(*groups) for v in group)
    if all(k <= s and d == 1 for k, s, d in zip(kernel_size, stride, dilation)):
      fitted = self.pad(((0, 0),) * len(lead) + tuple((0, o * s - i) for i, o, s in zip(spatial, out, stride)))
      blocks = fitted.reshape(interleave(out, stride))
      windows = blocks.shrink(keep_lead + tuple(b for o, k in zip(out, kernel_size) for b in ((0, o), (0, k))))
      return windows.permute(tuple(range(len(lead))) + tuple(len(lead) + 2 * j for j in range(count)) +
                             tuple(len(lead) + 2 * j + 1 for j in range(count)))
    rows = tuple(d + i * max(1, math.ceil((o * s - d) / i)) for i, o, s, d in zip(spatial, out, stride, dilation))
    repeats = tuple(math.ceil(k * r / i) for k, r, i in zip(kernel_size, rows, spatial))
    x = self.reshape(interleave((1,) * count, spatial)).expand(interleave(repeats, spatial))
    x = x.reshape(lead + tuple(e * i for e, i in zip(repeats, spatial)))
    x = x.shrink(keep_lead + tuple((0, k * r) for k, r in zip(kernel_size, rows)))
    x = x.reshape(interleave(kernel_size, rows))
    x = x.shrink(keep_lead + tuple(b for k, o, s in zip(kernel_size, out, stride) for b in ((0, k), (0, o * s))))
    x = x.reshape(lead + tuple(v for k, o, s in zip(kernel_size, out, stride) for v in (k, o, s)))
    x = x.shrink(keep_lead + tuple(b for k, o in zip(kernel_size, out) for b in ((0, k), (0, o), (0, 1))))
    x = x.reshape(interleave(kernel_size, out))
    return x.permute(tuple(range(len(lead))) + tuple(len(lead) + 2 * j + 1 for j in range(count)) +
                     tuple(len(lead) + 2 * j for j in range(count)))

  def conv2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride=1, dilation=1,
             padding: Any = 0, acc_dtype: Any = None) -> Tensor:
    """Cross-correlation, as torch's conv2d, over the last weight.ndim − 2 dims (so it is conv1d/conv3d too).
    self (N, C_in, *spatial) or unbatched (C_in, *spatial); weight (C_out, C_in / groups, *kernel); bias (C_out,).
    padding: an int, one per dim, torch's flat (left, right, top, bottom) order, 'same' or 'valid'.
    Built as pad → window view (`_pool`) → broadcast multiply with the weight → sum over (C_in / groups, *kernel)."""
    if weight.ndim < 3: raise RuntimeError(f"conv weight must have at least 3 dims, got shape {weight.shape}")
    if weight.dtype != self.dtype or (bias is not None and bias.dtype != self.dtype):   # torch does not promote here
      raise RuntimeError(f"conv input, weight and bias must have one dtype, got {self.dtype}, {weight.dtype}"
                         f"{'' if bias is None else f' and {bias.dtype}'}")
    count = weight.ndim - 2
    if self.ndim == count + 1:
      return self.unsqueeze(0).conv2d(weight, bias, groups, stride, dilation, padding, acc_dtype).squeeze(0)
    if self.ndim != count + 2:
      raise RuntimeError(f"expected {count + 1}D (unbatched) or {count + 2}D (batched) input for weight of shape "
                         f"{weight.shape}, got input of shape {self.shape}")
    stride, dilation = _int_tuple(stride, count, "stride"), _int_tuple(dilation, count, "dilation")
    if any(s <= 0 for s in stride): raise RuntimeError(f"non-positive stride is not supported, got {stride}")
    if any(d <= 0 for d in dilation): raise RuntimeError(f"dilation should be greater than zero, got {dilation}")
    out_channels, group_channels, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups <= 0: raise RuntimeError(f"non-positive groups is not supported: {groups}")
    if out_channels % groups:
      raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                         f"weight of size {list(weight.shape)} instead")
    if self.shape[1] != group_channels * groups:
      raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input"
                         f"{list(self.shape)} to have {group_channels * groups} channels, but got {self.shape[1]} "
                         "channels instead")
    if bias is not None and bias.shape != (out_channels,):
      raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                         f"{out_channels} elements, but got bias of size {list(bias.shape)} instead")
    pads = _conv_padding(padding, kernel, dilation, stride)
    padded_size = tuple(i + b + a for i, (b, a) in zip(self.shape[2:], pads))
    if any(p < d * (k - 1) + 1 for p, k, d in zip(padded_size, kernel, dilation)):
      raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, padded_size))}). Kernel "
                         f"size: ({' x '.join(str(d * (k - 1) + 1) for k, d in zip(kernel, dilation))}). Kernel size "
                         "can't be greater than actual input size")
    batch = self.shape[0]
    x = self.pad(((0, 0), (0, 0)) + pads)._pool(kernel, stride, dilation)       # (N, C_in, *out, *kernel)
    out = x.shape[2:2 + count]
    x = x.reshape(batch, groups, 1, group_channels, *out, *kernel)
    x = x.permute(0, 1, 2, *range(4, 4 + count), 3, *range(4 + count, 4 + 2 * count))  # (N, G, 1, *out, C/G, *k)
    w = weight.reshape(1, groups, out_channels // groups, *(1,) * count, group_channels, *kernel)
    reduce_axes = tuple(range(-1 - count, 0))
    product = x * w
    result = product.sum(reduce_axes, acc_dtype=acc_dtype).cast(product.dtype).reshape(batch, out_channels, *out)
    return result if bias is None else result + bias.reshape(1, out_channels, *(1,) * count)

  def conv_transpose2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride=1, dilation=1,
                       padding=0, output_padding=0) -> Tensor:
    """The gradient of conv2d with respect to its input, as torch's conv_transpose2d: weight (C_in, C_out / groups,
    *kernel). The input is spread out by the stride (zeros between), padded by dilation·(kernel − 1) − padding
    (plus output_padding after), and convolved with the flipped, group-transposed weight."""
    if weight.ndim < 3: raise RuntimeError(f"conv weight must have at least 3 dims, got shape {weight.shape}")
    if weight.dtype != self.dtype or (bias is not None and bias.dtype != self.dtype):   # torch does not promote here
      raise RuntimeError(f"conv input, weight and bias must have one dtype, got {self.dtype}, {weight.dtype}"
                         f"{'' if bias is None else f' and {bias.dtype}'}")
    count = weight.ndim - 2
    if self.ndim == count + 1:
      return self.unsqueeze(0).conv_transpose2d(weight, bias, groups, stride, dilation, padding,
                                                output_padding).squeeze(0)
    if self.ndim != count + 2:
      raise RuntimeError(f"expected {count + 1}D (unbatched) or {count + 2}D (batched) input for weight of shape "
                         f"{weight.shape}, got input of shape {self.shape}")
    stride, dilation = _int_tuple(stride, count, "stride"), _int_tuple(dilation, count, "dilation")
    padding, output_padding = _int_tuple(padding, count, "padding"), _int_tuple(output_padding, count, "output_padding")
    if any(s <= 0 for s in stride): raise RuntimeError(f"non-positive stride is not supported, got {stride}")
    if any(d <= 0 for d in dilation): raise RuntimeError(f"dilation should be greater than zero, got {dilation}")
    if any(p < 0 for p in padding + output_padding): raise RuntimeError("negative padding is not supported")
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
      raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got output_padding "
                         f"{output_padding}, stride {stride}, dilation {dilation}")
    in_channels, group_out, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups <= 0 or in_channels % groups:
      raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                         f"weight of size {list(weight.shape)} instead")
    if self.shape[1] != in_channels:
      raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input"
                         f"{list(self.shape)} to have {in_channels} channels, but got {self.shape[1]} channels instead")
    if bias is not None and bias.shape != (group_out * groups,):
      raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected bias to be 1-dimensional "
                         f"with {group_out * groups} elements, but got bias of size {list(bias.shape)} instead")
    out_size = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in
                     zip(self.shape[2:], stride, padding, dilation, kernel, output_padding))
    if any(o <= 0 for o in out_size):
      raise RuntimeError(f"conv_transpose2d of input {self.shape} with weight {weight.shape} gives output size "
                         f"{out_size}, which is too small")
    flipped = weight.reshape(groups, in_channels // groups, group_out, *kernel).transpose(1, 2)
    flipped = flipped.flip(tuple(range(3, 3 + count))).reshape(groups * group_out, in_channels // groups, *kernel)
    x = self
    if any(s > 1 for s in stride):   # (…, i) → (…, i, 1) → pad to (…, i, s) → (…, i·s) → first (i − 1)·s + 1
      batch_channels, spatial = x.shape[:2], x.shape[2:]
      x = x.reshape(*batch_channels, *[v for i in spatial for v in (i, 1)])
      x = x.pad(((0, 0),) * 2 + tuple(p for s in stride for p in ((0, 0), (0, s - 1))))
      x = x.reshape(*batch_channels, *[i * s for i, s in zip(spatial, stride)])
      x = x.shrink(((0, batch_channels[0]), (0, batch_channels[1])) +
                   tuple((0, (i - 1) * s + 1) for i, s in zip(spatial, stride)))
    edges = tuple((d * (k - 1) - p, d * (k - 1) - p + extra)
                  for d, k, p, extra in zip(dilation, kernel, padding, output_padding))
    x = x.pad(((0, 0), (0, 0)) + edges)
    return x.conv2d(flipped, bias, groups=groups, dilation=dilation)

  def _pool_geometry(self, kernel_size, stride, dilation, padding, ceil_mode: bool, name: str) -> _PoolGeometry:
    """Check the pooling arguments as torch does (RuntimeError) and work out the windows over the last dims."""
    count = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    if self.ndim < count:
      raise RuntimeError(f"{name}: expected an input with at least {count} dims, got shape {self.shape}")
    kernel = _int_tuple(kernel_size, count, "kernel_size")
    no_stride = stride is None or (isinstance(stride, (tuple, list)) and not stride)
    stride = kernel if no_stride else _int_tuple(stride, count, "stride")
    dilation, padding = _int_tuple(dilation, count, "dilation"), _int_tuple(padding, count, "padding")
    if any(k <= 0 for k in kernel): raise RuntimeError(f"{name}: kernel size should be greater than zero, got {kernel}")
    if any(s <= 0 for s in stride): raise RuntimeError(f"{name}: stride should not be zero, got {stride}")
    if any(d <= 0 for d in dilation):
      raise RuntimeError(f"{name}: dilation should be greater than zero, got {dilation}")
    if any(p < 0 or p > (d * (k - 1) + 1) // 2 for p, k, d in zip(padding, kernel, dilation)):
      raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, but got pad={padding}, "
                         f"kernel_size={kernel} and dilation={dilation}")
    extra = []
    for i, k, s, d, p in zip(self.shape[-count:], kernel, stride, dilation, padding):
      span = i + 2 * p - d * (k - 1) - 1
      out = (-(-span // s) if ceil_mode else span // s) + 1
      if ceil_mode and (out - 1) * s >= i + p: out -= 1   # the last window must start inside the input or left pad
      if out <= 0: raise RuntimeError(f"{name}: given input size {self.shape}, the output size {out} is too small")
      extra.append(max(0, (out - 1) * s + d * (k - 1) + 1 - (i + 2 * p)))
    return _PoolGeometry(kernel, stride, dilation, padding, tuple(extra))
  def _pool_windows(self, geometry: _PoolGeometry, pad_value: Scalar) -> Tensor:
    """(..., *out, *kernel): the input padded with pad_value (and ceil_mode's extra cells), cut into windows."""
    lead = ((0, 0),) * (self.ndim - len(geometry.kernel))
    padded = self.pad(lead + tuple((p, p + e) for p, e in zip(geometry.padding, geometry.extra)), value=pad_value)
    return padded._pool(geometry.kernel, geometry.stride, geometry.dilation)

  def max_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False) -> Tensor:
    """The max of each window over the last len(kernel_size) dims (2 for an int); stride defaults to the kernel.
    Padding is −inf (the dtype's min for ints), so it never wins."""
    geometry = self._pool_geometry(kernel_size, stride, dilation, padding, ceil_mode, "max_pool2d")
    pad_value = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
    return self._pool_windows(geometry, pad_value).max(geometry.window_axes)

  def avg_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> Tensor:
    """The mean of each window, as torch: with count_include_pad the divisor counts the zero padding (but not
    ceil_mode's extra cells past it); without, only the input cells in the window. The divisors are the window
    sums of a constant tensor of ones padded the same way, so they are computed in the kernel."""
    geometry = self._pool_geometry(kernel_size, stride, dilation, padding, ceil_mode, "avg_pool2d")
    total = self._to_float()._pool_windows(geometry, 0.0).sum(geometry.window_axes)
    if not any(geometry.extra) and (count_include_pad or not any(geometry.padding)):
      return total / prod(geometry.kernel)
    counted = Tensor.ones(self.shape[-len(geometry.kernel):], dtype=total.dtype, device=self.device)
    counted = counted.pad(tuple((p, p) for p in geometry.padding), value=1.0 if count_include_pad else 0.0)
    counted = counted.pad(tuple((0, e) for e in geometry.extra))._pool(geometry.kernel, geometry.stride,
                                                                       geometry.dilation)
    return total / counted.sum(geometry.window_axes)

  def _adaptive_pool(self, output_size, reduce: str) -> Tensor:
    count = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * count
    if self.ndim < count: raise RuntimeError(f"adaptive pool: expected at least {count} dims, got shape {self.shape}")
    x = self._to_float() if reduce == "mean" else self
    for k, target in enumerate(sizes):
      axis = self.ndim - count + k
      size = self.shape[axis]
      target = size if target is None else int(target)
      if target <= 0 or size == 0:
        raise RuntimeError(f"adaptive pool: output size {tuple(sizes)} must be positive for input shape {self.shape}")
      if size % target == 0:   # equal bins: a reshape and one reduce
        binned = x.reshape(*x.shape[:axis], target, size // target, *x.shape[axis + 1:])
        x = getattr(binned, reduce)(axis + 1)
        continue
      pieces = []   # torch's bins: [floor(j·size/target), ceil((j + 1)·size/target))
      for j in range(target):
        start, end = (j * size) // target, -(-((j + 1) * size) // target)
        piece = x.shrink(tuple((start, end) if a == axis else None for a in range(x.ndim)))
        pieces.append(getattr(piece, reduce)(axis, keepdim=True))
      x = pieces[0].cat(*pieces[1:], dim=axis)
    return x
  def adaptive_avg_pool2d(self, output_size) -> Tensor:
    """Mean over torch's adaptive bins of the last len(output_size) dims (an int means a square output)."""
    return self._adaptive_pool(output_size, "mean")
  def adaptive_max_pool2d(self, output_size) -> Tensor:
    """Max over torch's adaptive bins of the last len(output_size) dims (an int means a square output)."""
    return self._adaptive_pool(output_size, "max")

  def interpolate(self, size, mode: str = "linear", align_corners: bool = False) -> Tensor:
    """Resize the last len(size) dims, as torch's F.interpolate(x, size=...): mode 'nearest', 'nearest-exact',
    or 'linear' ('bilinear'/'trilinear' are the same here: linear along each dim). Each axis is one multiply by a
    resampling matrix built from the shapes, so the gradient comes for free."""
    if mode not in INTERPOLATE_MODES:
      raise NotImplementedError(f"interpolate mode {mode!r}; known: {INTERPOLATE_MODES}")
    if align_corners and mode.startswith("nearest"):
      raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                       "trilinear")
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if len(size) > self.ndim or any(not isinstance(s, int) or s <= 0 for s in size):
      raise ValueError(f"interpolate size {size} does not fit an input of shape {self.shape}")
    x = self._to_float()
    for k, out_size in enumerate(size):
      axis = self.ndim - len(size) + k
      if out_size == self.shape[axis]: continue   # every mode maps an axis onto itself unchanged
      matrix = Tensor(_interpolation_matrix(self.shape[axis], out_size, mode, align_corners), device=self.device)
      x = (x.transpose(axis, -1) @ matrix.cast(x.dtype)).transpose(axis, -1)
    return x

  # ---- regularization and normalization
  def dropout(self, p: float = 0.5) -> Tensor:
    """While `Tensor.training`: zero each element with probability p and scale the rest by 1 / (1 − p)."""
    if not 0 <= p <= 1: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not Tensor.training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))
  def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
    """(x − mean) / sqrt(var + eps) over `axis` (biased variance); no affine part (nn.LayerNorm adds it)."""
    x = self._to_float()
    centered = x - x.mean(axis, keepdim=True)
    return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()
  def rmsnorm(self, axis=-1, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x²) + eps) over `axis`; no scale (nn.RMSNorm adds it)."""
    x = self._to_float()
    return x * (x.square().mean(axis, keepdim=True) + eps).rsqrt()
  def batchnorm(self, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor,
                axis=1) -> Tensor:
    """(x − mean)·invstd·weight + bias, where the statistics and parameters are indexed by `axis` (an int or a tuple;
    each has the shape of those dims) and broadcast over the rest. invstd is 1 / sqrt(var + eps)."""
    axes = self._reduce_axes(axis)
    shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
    kept = tuple(self.shape[i] for i in axes)
    for name, t in (("weight", weight), ("bias", bias), ("mean", mean), ("invstd", invstd)):
      if t is not None and t.shape != kept:
        raise RuntimeError(f"batchnorm: {name} of shape {t.shape} for input {self.shape} normalized over dims {axes}")
    x = (self - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    return x if bias is None else x + bias.reshape(shape)

  # ---- attention
  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                   dropout_p: float = 0.0, is_causal: bool = False,
                                   scale: Optional[float] = None) -> Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (..., L, E), k (..., S, E), v (..., S, Ev); scale defaults to 1/√E.
    A bool mask keeps True positions; a float mask is added. is_causal keeps key s <= query l. Dropout on the
    attention weights applies only while `Tensor.training` (as tinygrad; torch's functional applies it always)."""
    if is_causal and attn_mask is not None:
      raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True")
    if min(self.ndim, key.ndim, value.ndim) < 2 or self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
      raise RuntimeError(f"scaled_dot_product_attention: query {self.shape}, key {key.shape} and value {value.shape} "
                         "need (..., L, E), (..., S, E) and (..., S, Ev)")
    scale = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
    scores = (self @ key.transpose(-2, -1)) * scale
    if is_causal: attn_mask = Tensor.ones(scores.shape[-2:], dtype=dtypes.bool, device=self.device).tril()
    if attn_mask is not None:
      scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
    return scores.softmax(-1).dropout(dropout_p) @ value

  # ---- classes and losses
  def one_hot(self, num_classes: int = -1) -> Tensor:
    """(..., num_classes) of 0/1 ints (default int dtype); num_classes = -1 reads max + 1 from the data (a kernel
    runs). A class outside [0, num_classes) raises IndexError (see tgrad/bounds.py for when)."""
    if not self.dtype.is_int:
      raise RuntimeError(f"one_hot is only applicable to index tensors (ints), got {self.dtype}")
    if num_classes == -1:
      if self.numel() == 0: raise RuntimeError("Can not infer total number of classes from empty tensor.")
      num_classes = int(self.max().item()) + 1
    message = "one_hot: class {value} is out of range for num_classes {size} (classes must be in [0, num_classes))"
    check_index_bounds(self.lazydata, IndexBounds(0, num_classes, message))
    classes = Tensor.arange(num_classes, device=self.device)
    return (self.unsqueeze(-1) == classes).cast(dtypes.default_int)
  def _class_hits(self, target: Tensor, axis: int, ignore_index: int) -> Tensor:
    """(target == class) as a bool tensor of self's shape (classes on `axis`), after checking the class indices
    (ignore_index allowed)."""
    classes = self.shape[axis]
    message = (f"class index {{value}} is out of bounds for {{size}} classes (input of shape {self.shape}, "
               f"ignore_index {ignore_index})")
    check_index_bounds(target.lazydata, IndexBounds(0, classes, message, ignore=ignore_index))
    positions = Tensor.arange(classes, device=self.device).reshape((classes,) + (1,) * (self.ndim - axis - 1))
    return target.unsqueeze(axis) == positions
  def _class_nll(self, target: Tensor, axis: int, ignore_index: int, label_smoothing: float, reduction: str) -> Tensor:
    """Cross entropy of logits `self` (classes on `axis`) against class indices: (1 − ε)·nll + ε·mean(−log p),
    skipping targets equal to ignore_index; 'mean' divides by the count of targets kept."""
    log_probs = self.log_softmax(axis)
    picked = self._class_hits(target, axis, ignore_index).where(log_probs, 0).sum(axis)
    loss = -picked if label_smoothing == 0 else -(1 - label_smoothing) * picked - label_smoothing * log_probs.mean(axis)
    kept = target != ignore_index
    loss = kept.where(loss, 0)
    return loss.sum() / kept.sum().cast(loss.dtype) if reduction == "mean" else _reduce_loss(loss, reduction)
  def nll_loss(self, Y: Tensor, weight: Optional[Tensor] = None, ignore_index: int = TORCH_IGNORE_INDEX,
               reduction: str = "mean") -> Tensor:
    """torch's nll_loss of log-probabilities (N, C, *d) or (C,) against int class indices Y (N, *d): −self at each
    target class, times weight[class] (one per class, default 1); targets equal to ignore_index are skipped and
    'mean' divides by the summed weights of the targets kept."""
    _check_reduction(reduction)
    if self.ndim == 0: raise RuntimeError("nll_loss needs log-probabilities with a class dim, got a 0-d tensor")
    axis = 1 if self.ndim >= 2 else 0
    if Y.shape != self.shape[:axis] + self.shape[axis + 1:] or not Y.dtype.is_int:
      raise RuntimeError(f"nll_loss: target of shape {Y.shape} and dtype {Y.dtype} for input {self.shape}: expected "
                         f"int class indices of shape {self.shape[:axis] + self.shape[axis + 1:]}")
    if weight is not None and weight.shape != (self.shape[axis],):
      raise RuntimeError(f"nll_loss: weight of shape {weight.shape} for {self.shape[axis]} classes")
    hits = self._class_hits(Y, axis, ignore_index)
    picked = hits.where(self, 0).sum(axis)
    class_weight = Tensor.ones(self.shape[axis], dtype=self.dtype, device=self.device) if weight is None else weight
    target_weight = hits.where(class_weight.reshape((-1,) + (1,) * (self.ndim - axis - 1)), 0).sum(axis)
    target_weight = (Y != ignore_index).where(target_weight, 0)
    loss = -picked * target_weight
    return loss.sum() / target_weight.sum() if reduction == "mean" else _reduce_loss(loss, reduction)
  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                    ignore_index: int = TORCH_IGNORE_INDEX) -> Tensor:
    """torch's cross_entropy of logits (N, C, *d) or (C,): Y holds class indices (N, *d) — ints, where ignore_index
    is skipped — or class probabilities of the logits' shape (floats)."""
    _check_reduction(reduction)
    if not 0 <= label_smoothing <= 1:
      raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if self.ndim == 0: raise RuntimeError("cross_entropy needs logits with a class dim, got a 0-d tensor")
    axis = 1 if self.ndim >= 2 else 0
    index_shape = self.shape[:axis] + self.shape[axis + 1:]
    if Y.shape == self.shape and Y.dtype.is_float:
      target = Y if label_smoothing == 0 else Y * (1 - label_smoothing) + label_smoothing / self.shape[axis]
      return _reduce_loss(-(self.log_softmax(axis) * target).sum(axis), reduction)
    if Y.ndim == len(index_shape) and self.ndim >= 2 and Y.ndim >= 1 and Y.shape[0] != self.shape[0]:
      raise ValueError(f"Expected input batch_size ({self.shape[0]}) to match target batch_size ({Y.shape[0]}).")
    if Y.shape != index_shape:
      raise RuntimeError(f"cross_entropy: target of shape {Y.shape} for logits {self.shape}: expected class indices "
                         f"of shape {index_shape} or probabilities of shape {self.shape}")
    if not Y.dtype.is_int: raise RuntimeError(f"expected class indices of an int dtype, got {Y.dtype}")
    return self._class_nll(Y, axis, ignore_index, label_smoothing, reduction)
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """tinygrad's name: cross entropy of logits (..., C) — classes on the last dim — against int class indices
    (...); targets equal to ignore_index are skipped."""
    _check_reduction(reduction)
    if self.ndim == 0 or Y.shape != self.shape[:-1]:
      raise RuntimeError(f"sparse_categorical_crossentropy: target of shape {Y.shape} for logits {self.shape}: expected"
                         f" shape {self.shape[:-1]}")
    if not Y.dtype.is_int: raise RuntimeError(f"expected class indices of an int dtype, got {Y.dtype}")
    return self._class_nll(Y, self.ndim - 1, ignore_index, label_smoothing, reduction)
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    """−(y·log p + (1 − y)·log(1 − p)) for probabilities p = self; each log is clamped at −100, as torch."""
    _check_reduction(reduction)
    if Y.shape != self.shape: raise ValueError(f"Target size {Y.shape} must be the same as input size {self.shape}")
    log_p, log_not_p = self.log().maximum(BCE_LOG_FLOOR), (1 - self).log().maximum(BCE_LOG_FLOOR)
    return _reduce_loss(-(Y * log_p + (1 - Y) * log_not_p), reduction)
  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Optional[Tensor] = None):
    """binary_crossentropy of sigmoid(self), computed stably from the logits: (1 − y)·x + w·log(1 + e^−x) with
    w = 1 + (pos_weight − 1)·y (log(1 + e^−x) = softplus(−x) never overflows)."""
    _check_reduction(reduction)
    if Y.shape != self.shape: raise ValueError(f"Target size {Y.shape} must be the same as input size {self.shape}")
    weight = 1 if pos_weight is None else 1 + (pos_weight - 1) * Y
    return _reduce_loss((1 - Y) * self + weight * (-self).softplus(), reduction)

  # ---- gather and scatter along one dim
  def _check_dim_index(self, dim: int, index: Tensor, name: str) -> int:
    if not isinstance(index, Tensor) or not index.dtype.is_int:
      raise RuntimeError(f"{name}(): expected an int index tensor, got {getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != self.ndim:
      raise RuntimeError(f"{name}(): Index tensor must have the same number of dimensions as input tensor: index "
                         f"{index.shape}, input {self.shape}")
    dim = _resolve_axis(dim, self.ndim, self.shape) if self.ndim else 0
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
      raise RuntimeError(f"{name}(): Size does not match at dimension {dim}: expected index {list(index.shape)} to be "
                         f"no larger than self {list(self.shape)} apart from dimension {dim}")
    return dim
  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[..., j, ...] = self[..., index[..., j, ...], ...] along `dim`, as torch.gather; index may be smaller
    than self in the other dims. A one-hot compare with ARANGE and a sum. Indices must be in [0, size): others
    raise IndexError (see tgrad/bounds.py for when)."""
    dim = self._check_dim_index(dim, index, "gather")
    check_index_bounds(index.lazydata, _dim_bounds("gather", dim, self.shape[dim] if self.ndim else 1))
    if self.ndim == 0: return self
    size = self.shape[dim]
    region = self.shrink(tuple(None if d == dim else (0, i) for d, i in enumerate(index.shape)))
    values = region.transpose(dim, -1).unsqueeze(-2)                       # (..., 1, size)
    hit = index.transpose(dim, -1).unsqueeze(-1) == Tensor.arange(size, device=self.device)   # (..., P, size)
    out = hit.where(values, 0).sum(-1, acc_dtype=_gather_acc_dtype(self.dtype)).cast(self.dtype)
    return out.transpose(dim, -1)
  def scatter(self, dim: int, index: Tensor, src: Any, reduce: Optional[str] = None) -> Tensor:
    """A copy of self with src written at index along `dim`, as torch.scatter (src a tensor at least index's size,
    or a scalar): out[..., index[..., j, ...], ...] = src[..., j, ...]. reduce='add' or 'multiply' combines with
    the existing value instead. A repeated position takes the last write. Indices must be in [0, size): others
    raise IndexError (see tgrad/bounds.py for when)."""
    if reduce not in (None, "add", "multiply"): raise RuntimeError("reduce argument must be either add or multiply.")
    dim = self._check_dim_index(dim, index, "scatter")
    if isinstance(src, Tensor):
      if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise RuntimeError(f"scatter(): Expected index {list(index.shape)} to be no larger than src {list(src.shape)}")
      src = src.shrink(tuple((0, i) for i in index.shape)).cast(self.dtype)
    else: src = Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
    check_index_bounds(index.lazydata, _dim_bounds("scatter", dim, self.shape[dim] if self.ndim else 1))
    if self.ndim == 0 or index.numel() == 0: return self
    size, positions = self.shape[dim], index.shape[dim]
    hit = index.transpose(dim, -1).unsqueeze(-1) == Tensor.arange(size, device=self.device)   # (..., P, size)
    values = src.transpose(dim, -1).unsqueeze(-1)                                              # (..., P, 1)
    target = self.transpose(dim, -1)
    fill = tuple((0, t - i) for t, i in zip(target.shape[:-1], hit.shape[:-2])) + ((0, 0),)
    acc_dtype = _gather_acc_dtype(self.dtype)
    if reduce == "add":
      added = hit.where(values, 0).sum(-2, acc_dtype=acc_dtype).cast(self.dtype).pad(fill)
      return (target + added).transpose(dim, -1)
    if reduce == "multiply":
      factor = hit.where(values, 1).prod(-2, acc_dtype=acc_dtype).cast(self.dtype)
      return (target * factor.pad(fill, value=1)).transpose(dim, -1)
    order = Tensor.arange(positions, device=self.device).reshape(positions, 1)
    last = hit.where(order, -1).max(-2, keepdim=True)                      # the last write to each position wins
    chosen = hit & (order == last)
    written = chosen.where(values, 0).sum(-2, acc_dtype=acc_dtype).cast(self.dtype).pad(fill)
    touched = (last.squeeze(-2) >= 0).pad(fill, value=False)
    return touched.where(written, target).transpose(dim, -1)

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

# ---------------------------------------------------------------------------------------------------------------
# helpers that build on Tensor

def _float_default(kwargs: dict) -> dict:
  kwargs.setdefault("dtype", dtypes.default_float)
  return kwargs

def _host_dtype(dtype: DType) -> np.dtype:
  return np.dtype(np.float32) if dtype == dtypes.bfloat16 else dtype.np

def _from_array(array: np.ndarray, dtype: DType, device: str) -> LazyBuffer:
  """Host data → a COPY leaf (the array is copied, so later changes to it don't leak in). bfloat16 arrives as
  float32 values and is rounded on the device by CAST."""
  if dtype == dtypes.bfloat16:
    return LazyBuffer.from_host(np.array(array, dtype=np.float32, order="C"), device).cast(dtypes.bfloat16)
  return LazyBuffer.from_host(np.array(array, dtype=dtype.np, order="C"), device)

def _tensor_list(first: Any, rest: tuple) -> list[Tensor]:
  tensors = list(first) + list(rest) if isinstance(first, (list, tuple)) else [first, *rest]
  if not tensors: raise ValueError("need at least one tensor")
  for t in tensors:
    if not isinstance(t, Tensor): raise TypeError(f"expected Tensors, got {type(t).__name__}")
  return tensors

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

# ---------------------------------------------------------------------------------------------------------------
# scans (cumsum, cumprod, cummax, logcumsumexp): blocked, O(n·SCAN_BLOCK) work in O(log n) kernels

# A scan splits the axis into blocks of SCAN_BLOCK. The prefix inside each block is a (block × block) lower-triangle
# reduce, fused in one kernel with taking in the carry; the block totals (one more kernel) are scanned the same way,
# recursively; the carry of a block is the scan of the totals before it. A level shrinks the axis SCAN_BLOCK-fold,
# so n elements take 2·⌈log_B n⌉ − 1 kernels and n·B work per level. The block size was chosen by timing a 10^6
# cumsum on the CPU (docs/design-notes.md, "Scans").
SCAN_BLOCK = 32

@dataclass(frozen=True)
class _ScanKind:
  """An associative op for `_scan_last`: its identity for a dtype; the inclusive prefix along the last axis (of one
  block, given the (B, B) lower-triangle mask); each block's total; and how a block's prefix takes in its carry."""
  identity: Callable[[DType], Scalar]
  block_prefix: Callable[[Tensor, Tensor], Tensor]
  block_total: Callable[[Tensor], Tensor]
  combine: Callable[[Tensor, Tensor], Tensor]

def _triangle_windows(x: Tensor, mask: Tensor, identity: Scalar) -> Tensor:
  """(..., B) → (..., B, B): row i holds x[j] for j <= i and the identity after it."""
  return mask.where(x.unsqueeze(-2), identity)

def _max_identity(dtype: DType) -> Scalar: return -math.inf if dtype.is_float else dtypes.min(dtype)

def _logsumexp_prefix(x: Tensor, mask: Tensor) -> Tensor:
  """log Σ_{j<=i} exp(x_j) per row, shifted by the row's running max so that nothing underflows to log(0)."""
  windows = _triangle_windows(x, mask, -math.inf)
  peak = windows.max(-1, keepdim=True).detach()
  peak = peak.isinf().where(0, peak)       # all −inf (or an +inf): shift by 0, as logsumexp does
  return (windows - peak).exp().sum(-1).log() + peak.squeeze(-1)

def _logaddexp(a: Tensor, b: Tensor) -> Tensor:
  peak = a.maximum(b).detach()
  peak = peak.isinf().where(0, peak)
  return ((a - peak).exp() + (b - peak).exp()).log() + peak

SCAN_KINDS = {
  "sum": _ScanKind(lambda dtype: 0, lambda x, mask: _triangle_windows(x, mask, 0).sum(-1), lambda x: x.sum(-1),
                   lambda a, b: a + b),
  "prod": _ScanKind(lambda dtype: 1, lambda x, mask: _triangle_windows(x, mask, 1).prod(-1), lambda x: x.prod(-1),
                    lambda a, b: a * b),
  "max": _ScanKind(_max_identity, lambda x, mask: _triangle_windows(x, mask, _max_identity(x.dtype)).max(-1),
                   lambda x: x.max(-1), lambda a, b: a.maximum(b)),
  "logsumexp": _ScanKind(lambda dtype: -math.inf, _logsumexp_prefix, lambda x: x.logsumexp(-1), _logaddexp),
}

def _scan_last(x: Tensor, kind: _ScanKind) -> Tensor:
  """The inclusive scan of `kind` along the last axis of x (see SCAN_BLOCK)."""
  n, lead = x.shape[-1], x.shape[:-1]
  block = min(n, SCAN_BLOCK)
  positions = Tensor.arange(block, device=x.device)
  mask = positions.reshape(1, block) <= positions.reshape(block, 1)      # mask[i, j] = j <= i
  if n <= SCAN_BLOCK: return kind.block_prefix(x, mask)
  count, identity, whole_lead = -(-n // block), kind.identity(x.dtype), ((0, 0),) * len(lead)
  blocks = x.pad(whole_lead + ((0, count * block - n),), value=identity).reshape(*lead, count, block)
  totals = _scan_last(kind.block_total(blocks), kind)                    # (..., count): inclusive over blocks
  carry = totals.pad(whole_lead + ((1, 0),), value=identity).shrink(tuple((0, s) for s in lead) + ((0, count),))
  out = kind.combine(kind.block_prefix(blocks, mask), carry.unsqueeze(-1)).reshape(*lead, count * block)
  return out.shrink(tuple((0, s) for s in lead) + ((0, n),))

def _dim_bounds(name: str, dim: int, size: int) -> IndexBounds:
  """gather's and scatter's indices: 0 <= i < size, as torch (no negative indices)."""
  return IndexBounds(0, size, f"{name}: index {{value}} is out of bounds for dimension {dim} with size {{size}}")

def _gather_acc_dtype(dtype: DType) -> DType:
  """A sum that adds one selected value to zeros is exact in the value's own dtype (bools go through int32)."""
  return dtypes.int32 if dtype.is_bool else dtype

def _int_tuple(value: Any, count: int, name: str) -> tuple[int, ...]:
  """An int or a sequence of `count` ints (torch's convention for kernel_size, stride, ...) as a tuple."""
  values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * count
  if len(values) != count or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
    raise RuntimeError(f"expected {name} to be a single integer value or a list of {count} values, got {name}={value}")
  return tuple(int(v) for v in values)

@dataclass(frozen=True)
class _PoolGeometry:
  """Checked pooling arguments, one entry per pooled dim; `extra` is ceil_mode's padding after the end (windows
  that start inside the input but run past it, as torch allows)."""
  kernel: tuple[int, ...]
  stride: tuple[int, ...]
  dilation: tuple[int, ...]
  padding: tuple[int, ...]
  extra: tuple[int, ...]
  @property
  def window_axes(self) -> tuple[int, ...]: return tuple(range(-len(self.kernel), 0))

def _conv_padding(padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...],
                  stride: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """(before, after) per spatial dim from: an int, one int per dim, torch's flat (left, right, top, bottom) order
  (last dim first), 'valid', or 'same' (stride 1 only; an odd total puts the extra element after, as torch)."""
  count = len(kernel)
  if isinstance(padding, str):
    if padding == "valid": return ((0, 0),) * count
    if padding != "same": raise ValueError(f"invalid padding string {padding!r}, should be one of 'valid', 'same'")
    if any(s != 1 for s in stride): raise RuntimeError("padding='same' is not supported for strided convolutions")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((t // 2, t - t // 2) for t in totals)
  if isinstance(padding, (tuple, list)) and len(padding) == 2 * count:
    flat = _int_tuple(padding, 2 * count, "padding")
    pairs = tuple((flat[2 * i], flat[2 * i + 1]) for i in range(count))[::-1]
  else: pairs = tuple((p, p) for p in _int_tuple(padding, count, "padding"))
  if any(p < 0 for pair in pairs for p in pair): raise RuntimeError(f"negative padding is not supported: {padding}")
  return pairs

def _check_reduction(reduction: str) -> None:
  if reduction not in LOSS_REDUCTIONS: raise ValueError(f"{reduction} is not a valid value for reduction")

def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
  return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()

def _interpolation_matrix(in_size: int, out_size: int, mode: str, align_corners: bool) -> np.ndarray:
  """The (in_size, out_size) float32 matrix that resamples one axis, with torch's source positions computed in
  float32 as torch does: nearest floor(dst·in/out), nearest-exact floor((dst + ½)·in/out), linear at
  (dst + ½)·in/out − ½ clamped at 0 (or dst·(in − 1)/(out − 1) with align_corners)."""
  dst = np.arange(out_size, dtype=np.float32)
  matrix = np.zeros((in_size, out_size), dtype=np.float32)
  columns = np.arange(out_size)
  if mode.startswith("nearest"):
    scale = np.float32(in_size) / np.float32(out_size)
    offset = np.float32(0.5) if mode == "nearest-exact" else np.float32(0)
    source = np.minimum(np.floor((dst + offset) * scale).astype(np.int64), in_size - 1)
    if out_size == in_size: source = columns   # torch's exact shortcut
    matrix[source, columns] = 1
    return matrix
  if align_corners:
    scale = np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0)
    position = dst * scale
  else:
    scale = np.float32(in_size) / np.float32(out_size)
    position = np.maximum(scale * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0))
  low = position.astype(np.int64)
  high = low + (low < in_size - 1)
  upper_weight = position - low.astype(np.float32)
  np.add.at(matrix, (low, columns), np.float32(1) - upper_weight)
  np.add.at(matrix, (high, columns), upper_weight)
  return matrix

def _normalize_padding(padding, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  ndim = len(shape)
  if all(isinstance(p, (int, np.integer)) for p in padding):
    if len(padding) % 2 or len(padding) > 2 * ndim:
      raise ValueError(f"flat padding {padding} needs an even count of at most {2 * ndim} for shape {shape}")
    pairs = [(0, 0)] * ndim
    for i in range(len(padding) // 2): pairs[ndim - 1 - i] = (int(padding[2 * i]), int(padding[2 * i + 1]))
    return tuple(pairs)
  if len(padding) != ndim: raise ValueError(f"padding {padding} needs one entry per dim of shape {shape}")
  return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)

def _index_items(indices, shape: tuple[int, ...], device: str) -> list:
  """One index item per dim (plus the Nones): lists become Tensors, the Ellipsis (or the end) becomes full slices."""
  items = list(indices) if isinstance(indices, tuple) else [indices]
  items = [Tensor(i, device=device) if isinstance(i, (list, np.ndarray)) else i for i in items]
  for i in items:
    if isinstance(i, bool) or not (i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice, Tensor))):
      raise TypeError(f"unsupported index {i!r}: use ints, slices, None, Ellipsis or int tensors")
    if isinstance(i, Tensor) and not i.dtype.is_int:
      raise IndexError(f"tensor indices must be ints, got {i.dtype} (boolean masks have a data-dependent shape)")
  if sum(i is Ellipsis for i in items) > 1: raise IndexError("an index can only have a single ellipsis")
  consumed = sum(i is not None and i is not Ellipsis for i in items)
  if consumed > len(shape): raise IndexError(f"too many indices for a tensor of shape {shape}: {consumed} were given")
  fill = [slice(None)] * (len(shape) - consumed)
  at = next((k for k, i in enumerate(items) if i is Ellipsis), None)
  return items + fill if at is None else items[:at] + fill + items[at + 1:]

class _IndexPlan:
  """A numpy index taken apart: the shrink/flip/stride that basic indices make, the view shape after ints are
  dropped and Nones added, and the tensor indices (by dim of that view) with numpy's rule for where their dims go."""
  def __init__(self, shape: tuple[int, ...], indices, device: str):
    items = _index_items(indices, shape, device)
    self.input_shape = shape
    self.bounds: list[tuple[int, int]] = []
    self.flips: list[bool] = []
    self.steps: list[int] = []
    self.strided_shape: list[int] = []
    self.tensor_indices: list[tuple[int, Tensor]] = []
    self.tensor_input_dims: list[int] = []   # the input dim each tensor index indexes (for error messages)
    advanced_items: list[int] = []   # positions in `items` of tensor (and, with them, int) indices
    self.advanced_position = 0       # the view dim where the index dims go when the advanced items are adjacent
    view: list[int] = []
    dim = 0
    has_tensor = any(isinstance(i, Tensor) for i in items)
    for k, item in enumerate(items):
      if item is None:
        view.append(1)
        continue
      size = shape[dim]
      if isinstance(item, Tensor):
        if not advanced_items: self.advanced_position = len(view)
        advanced_items.append(k)
        self.tensor_indices.append((len(view), item))
        self.tensor_input_dims.append(dim)
        self._keep(0, size, 1, False)
        view.append(size)
      elif isinstance(item, slice):
        start, stop, step = item.indices(size)
        count = len(range(start, stop, step))
        if count == 0: self._keep(0, 0, 1, False)
        elif step > 0: self._keep(start, start + (count - 1) * step + 1, step, False)
        else: self._keep(start + (count - 1) * step, start + 1, -step, True)
        view.append(count)
      else:
        index = int(item)
        if not -size <= index < size: raise IndexError(f"index {index} is out of bounds for dim {dim} with size {size}")
        index %= size
        if has_tensor:
          if not advanced_items: self.advanced_position = len(view)
          advanced_items.append(k)
        self._keep(index, index + 1, 1, False)
      dim += 1
    self.view_shape = tuple(view)
    self.advanced_adjacent = advanced_items == list(range(advanced_items[0], advanced_items[-1] + 1)) \
      if advanced_items else True
    if not self.advanced_adjacent: self.advanced_position = 0
  def _keep(self, begin: int, end: int, step: int, flip: bool) -> None:
    self.bounds.append((begin, end))
    self.steps.append(step)
    self.flips.append(flip)
    self.strided_shape.append(len(range(0, end - begin, step)))
  def place(self, value: LazyBuffer) -> LazyBuffer:
    """The inverse of the basic indexing: `value` (of view_shape) put back at its positions in the input shape,
    zeros (False) elsewhere."""
    placed = value.reshape(tuple(self.strided_shape))
    if any(s != 1 for s in self.steps):
      placed = F.spread_strided(placed, tuple(self.steps), tuple(hi - lo for lo, hi in self.bounds))
    placed = placed.flip(tuple(self.flips))
    return placed.pad(tuple((lo, size - hi) for size, (lo, hi) in zip(self.input_shape, self.bounds)))

def _einsum(formula: str, tensors: list[Tensor], acc_dtype: Any) -> Tensor:
  formula = formula.replace(" ", "")
  lhs, arrow, rhs = formula.partition("->")
  specs = lhs.split(",")
  if len(specs) != len(tensors): raise ValueError(f"einsum {formula!r} names {len(specs)} operands, got {len(tensors)}")
  spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in formula]
  ellipsis_ndim = max((t.ndim - (len(s) - 3) for s, t in zip(specs, tensors) if "..." in s), default=0)
  ellipsis_letters = "".join(spare[:ellipsis_ndim])
  letters_per_operand = []
  for spec, t in zip(specs, tensors):
    if "..." in spec:
      own = t.ndim - (len(spec) - 3)
      if own < 0: raise ValueError(f"einsum operand {spec!r} has more letters than dims of shape {t.shape}")
      spec = spec.replace("...", ellipsis_letters[len(ellipsis_letters) - own:])
    if len(spec) != t.ndim or not spec.isalpha():
      raise ValueError(f"einsum operand {spec!r} does not match a tensor of shape {t.shape}")
    letters_per_operand.append(spec)
  if arrow:
    out_letters = rhs.replace("...", ellipsis_letters)
    if not out_letters.isalpha() and out_letters: raise ValueError(f"bad einsum output {rhs!r}")
  else:
    counts = {c: sum(s.count(c) for s in letters_per_operand) for c in set("".join(letters_per_operand))}
    single = sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis_letters)
    out_letters = ellipsis_letters + "".join(single)
  # take diagonals where a letter repeats within one operand
  prepared = []
  for spec, t in zip(letters_per_operand, tensors):
    while (repeated := next((c for c in spec if spec.count(c) > 1), None)) is not None:
      a = spec.index(repeated)
      b = spec.index(repeated, a + 1)
      if t.shape[a] != t.shape[b]:
        raise ValueError(f"einsum: letter {repeated!r} has sizes {t.shape[a]} and {t.shape[b]} in shape {t.shape}")
      others = [i for i in range(t.ndim) if i not in (a, b)]
      n = t.shape[a]
      t = t.permute(others + [a, b]).reshape(*[t.shape[i] for i in others], n * n)
      t = t._stride((1,) * len(others) + (n + 1,))
      spec = "".join(spec[i] for i in others) + repeated
    prepared.append((spec, t))
  sizes: dict[str, int] = {}
  for spec, t in prepared:
    for c, s in zip(spec, t.shape):
      if c in sizes and 1 not in (sizes[c], s) and sizes[c] != s:
        raise ValueError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s} in {formula!r}")
      if c not in sizes or sizes[c] == 1: sizes[c] = s
  for c in out_letters:
    if c not in sizes: raise ValueError(f"einsum output letter {c!r} is not in any operand of {formula!r}")
    if out_letters.count(c) > 1: raise ValueError(f"einsum output letter {c!r} repeats in {formula!r}")
  summed = [c for c in sizes if c not in out_letters]
  order = list(out_letters) + summed
  product: Optional[Tensor] = None
  for spec, t in prepared:   # put each operand's axes in the global order, with size-1 axes for missing letters
    axes_in_order = sorted(range(len(spec)), key=lambda i: order.index(spec[i]))
    own_sizes = {spec[i]: t.shape[i] for i in axes_in_order}
    aligned = t.permute(axes_in_order).reshape(tuple(own_sizes.get(c, 1) for c in order))
    product = aligned if product is None else product * aligned
  assert product is not None
  product = product._broadcast_to(tuple(sizes[c] for c in order))
  out = product.sum(tuple(range(len(out_letters), len(order))), acc_dtype=acc_dtype) if summed else product
  return out.cast(least_upper_dtype(*[t.dtype for t in tensors]))
