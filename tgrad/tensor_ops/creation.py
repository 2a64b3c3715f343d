"""Making tensors from nothing but a shape: full/zeros/ones/empty, arange/linspace/eye, the *_like forms, and
random numbers (rand/randn/randint/uniform/normal and the initializers), a counter-based hash computed on the device.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Optional
import numpy as np
from tgrad.dtype import dtypes, to_dtype
from tgrad.lazy import LazyBuffer
from tgrad.multi import MultiLazyBuffer
from tgrad.ops import Ops, UOp
from tgrad.shape.sint import canonical
from tgrad.device import Buffer, canonical_device
from tgrad.helpers import prod
from tgrad.tensor_ops.args import Scalar, HALF_FLOATS, _shape_arg, _varargs_shape, _check_shape, _check_scalar_fits, \
  _python_dtype, _int_overflow_side, DTypeNotSupportedError
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

# random numbers: a counter-based hash. Constants of the murmur3 32-bit finalizer (a bijection with full avalanche)
# and the 32-bit golden ratio, used to spread (counter, seed, call) over all 32 bits before mixing.
MURMUR_MULTIPLIER_1, MURMUR_MULTIPLIER_2 = 0x85EBCA6B, 0xC2B2AE35
GOLDEN_RATIO_32 = 0x9E3779B9
UINT32_MASK = 0xFFFFFFFF
# how many random bits make a uniform float in [0, 1): the format's significand, so every value is exact and < 1
RANDOM_FLOAT_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 32}

class CreationMixin:
  """Tensor's constructors (static methods) and the *_like forms."""
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
    if isinstance(device, (tuple, list)):   # the constant on each device: replicated (tgrad/multi/)
      return Tensor(MultiLazyBuffer([LazyBuffer.const_of(fill_value, dtype, canonical_device(d), shape)
                                     for d in device], None), **kwargs)
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
    if isinstance(device, (tuple, list)):   # the values on each device: replicated (tgrad/multi/)
      return Tensor(MultiLazyBuffer([Tensor.arange(start, stop, step, dtype, d).lazydata for d in device], None),
                    **kwargs)
    if isinstance(stop, UOp) and start == 0 and step == 1:   # 0, 1, ..., n-1 for a symbolic n
      counter_dtype = dtypes.int32 if stop.vmax <= dtypes.max(dtypes.int32) + 1 else dtypes.int64
      counter = LazyBuffer.loadop(Ops.ARANGE, (canonical(stop),), counter_dtype, canonical_device(device))
      return Tensor(Tensor(counter).cast(to_dtype(dtype) if dtype is not None else dtypes.default_int).lazydata,
                    **kwargs)
    count = max(0, math.ceil((stop - start) / step))
    dtype = to_dtype(dtype) if dtype is not None else _python_dtype([start, stop, step])
    if dtype == dtypes.default_int and any(_int_overflow_side(dtype, v) for v in (start, start + (count - 1) * step)):
      dtype = dtypes.int64   # values past int32 widen the inferred dtype (torch's default int is int64 anyway)
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
    """`steps` values from start to stop inclusive, evenly spaced. As torch: steps must be an int (TypeError) and
    nonnegative (RuntimeError)."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
      raise TypeError(f"linspace: steps must be an int, got {type(steps).__name__} {steps!r}")
    if steps < 0: raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    dtype = to_dtype(dtype or dtypes.default_float)
    if dtype.is_bool: raise DTypeNotSupportedError("linspace is not implemented for bool (torch's NotImplementedError)")
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
  @staticmethod
  def kaiming_normal(*shape, a: float = 0.01, **kwargs) -> Tensor:
    """He/Kaiming normal: mean 0, std gain/√fan_in, gain = √(2 / (1 + a²)) (torch's kaiming_normal_ for leaky relu)."""
    shape = _varargs_shape(shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shape[1:]))
    return Tensor.normal(*shape, mean=0.0, std=std, **kwargs)
  @staticmethod
  def randperm(n: int, device: Optional[str] = None, dtype: Any = None, **kwargs) -> Tensor:
    """A random permutation of 0..n−1 (int32 by default, as tinygrad): the argsort of n uniform draws."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
      raise RuntimeError(f"randperm: n must be a nonnegative int, got {n!r}")
    order = Tensor.rand(int(n), device=device).argsort() if n else Tensor.zeros(0, device=device)
    return Tensor(order.cast(to_dtype(dtype or dtypes.int32)).lazydata, **kwargs)
  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Indices drawn from the categorical distributions given by the rows of self (1-D or 2-D nonnegative weights,
    not necessarily summing to 1), as torch.multinomial: (num_samples,) or (rows, num_samples), int32. Without
    replacement only one sample per row is supported (tinygrad's limit). Each draw counts the cumulative
    probabilities that a uniform number is at or above. Weights that are negative, inf or nan, or a row that sums to
    0, raise ValueError (torch raises for the same rows): checking realizes the weights with one small reduction
    and reads back two flags, a sync per call."""
    if self.ndim not in (1, 2): raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {self.shape}")
    if not isinstance(num_samples, int) or num_samples <= 0:
      raise RuntimeError(f"multinomial: cannot sample num_samples={num_samples!r} (must be a positive int)")
    if not replacement and num_samples > 1:
      raise NotImplementedError("multinomial without replacement supports num_samples=1 only")
    weights = self._to_float().reshape(-1, self.shape[-1])
    _check_distributions(weights)
    cumulative = weights.cumsum(1)
    cdf = cumulative / cumulative[:, -1:]
    draws = Tensor.rand(num_samples, weights.shape[0], 1, device=self.device)
    picked = (draws >= cdf.unsqueeze(0)).sum(-1).permute(1, 0).minimum(self.shape[-1] - 1).cast(dtypes.int32)
    return picked.reshape(num_samples) if self.ndim == 1 else picked
  def rand_like(self, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
    kwargs.setdefault("device", self.device)
    return Tensor.rand(self.shape, **kwargs)
  def randn_like(self, **kwargs) -> Tensor:
    kwargs.setdefault("dtype", self.dtype if self.dtype.is_float else dtypes.default_float)
    kwargs.setdefault("device", self.device)
    return Tensor.randn(self.shape, **kwargs)

def _check_distributions(weights: Tensor) -> None:
  """Raise ValueError unless every row of `weights` [rows, classes] is finite, nonnegative and sums to more than 0.
  The weights are realized together with the two flags, so the sampling that follows reads them, not their graph."""
  bad_entries = ((weights < 0) | (weights != weights) | (weights.abs() == math.inf)).any()
  empty_rows = (weights.sum(1) <= 0).any()
  weights.realize(bad_entries, empty_rows)
  if bad_entries.item():
    raise ValueError(f"multinomial: weights of shape {weights.shape} hold a negative, inf or nan entry")
  if empty_rows.item():
    raise ValueError(f"multinomial: a row of the weights of shape {weights.shape} sums to 0 (no category to draw)")

def _float_default(kwargs: dict) -> dict:
  kwargs.setdefault("dtype", dtypes.default_float)
  return kwargs
