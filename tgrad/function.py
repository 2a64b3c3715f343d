"""Autograd primitives: one `Function` per differentiable LazyBuffer op.

`forward` maps input LazyBuffers to an output LazyBuffer; `backward` maps the output's gradient (a LazyBuffer) to
one gradient per input, or None where an input needs none. Both sides are built from the same lazy primitives,
so a backward pass is just more graph, scheduled and fused like the forward one. Composite ops (exp, tanh,
softmax, ...) live in tensor.py and get their gradients by the chain rule through these.
"""
from __future__ import annotations
import math
from typing import Any, Optional
from tgrad.dtype import DType, dtypes
from tgrad.lazy import LazyBuffer
from tgrad.multi import MultiLazyBuffer
from tgrad.ops import Ops

LN2 = math.log(2)
Tensor: Any = None   # tgrad.tensor.Tensor, which imports this module: bound by tensor_ops.bind_tensor_class
HALF_PRECISION = (dtypes.float16, dtypes.bfloat16)   # gradient sums over these accumulate in float32
# Read on every op: a module name is one specialized lookup, where `cls.__new__` and `Ops.ADD` go through the class's
# generic attribute lookup (Enum classes' `__getattr__` hook makes theirs several times slower still)
_new_object = object.__new__
_ADD, _OR, _MUL, _AND = Ops.ADD, Ops.OR, Ops.MUL, Ops.AND

class Function:
  """One recorded op. `parents` are the input Tensors, kept unless every input said requires_grad=False: undecided
  (None) inputs are recorded too, so that `loss.gradient(t)` reaches any tensor, as tinygrad's functional gradients.
  `needs_input_grad` says which inputs a backward builds gradients for; the autograd walk (Tensor._backprop) narrows
  it to the inputs on a path to a target before it calls `backward`. Only float tensors carry gradients (as in
  torch): an int or bool input counts as requires_grad=False and is kept as None among the parents,
  so the record never holds values no backward reads (an index built from a buffer that is then written in place
  would otherwise stay pending, and the write would copy the buffer for it: docs/semantics.md)."""
  def forward(self, *args, **kwargs) -> LazyBuffer: raise NotImplementedError(f"no forward for {type(self)}")
  def backward(self, grad_output: LazyBuffer): raise NotImplementedError(f"backward not implemented for {type(self)}")

  @classmethod
  def apply(cls, *inputs, **kwargs):
    """Run forward on the inputs' lazydata; record the op for backward when a gradient is wanted (`applied`)."""
    return applied(cls, inputs, kwargs)

def applied(cls: type[Function], inputs: tuple, kwargs: Optional[dict] = None) -> Any:
  """`cls.apply(*inputs, **kwargs)` with fixed arguments, for the hottest ops (a call through `*inputs` is not inlined
  by the interpreter: several hundred instructions more). The record's fields come from the same loop that reads each
  input's value (one plain loop: this runs for every op, and a comprehension is a call of its own): requires_grad is
  True where an input's is, else None where one is undecided, else False; an input that is not a float gets no
  gradient and is kept as None among the parents."""
  sources = []
  needs: list[bool] = []
  parents: list[Any] = []
  requires_grad: Optional[bool] = False
  for t in inputs:   # its value read once: the property follows in-place writes (a walk), needed only after one
    lb = t._lazydata
    if lb.successor is not None or lb.origin is not None: lb = t.lazydata
    sources.append(lb)
    if lb.dtype.is_float:
      flag = t.requires_grad
      if flag: requires_grad = True
      elif flag is None and requires_grad is False: requires_grad = None
      needs.append(flag is not False)
      parents.append(t)
    else:
      needs.append(False)
      parents.append(None)
  ctx = _new_object(cls)
  ctx.device, ctx.requires_grad, ctx.needs_input_grad = sources[0].device, requires_grad, needs
  if requires_grad is not False: ctx.parents = parents   # a list of its own: no tuple copied
  # under no_grad the output is a constant to autograd, as in torch: it does not require grad, so a backward
  # from it raises instead of silently reaching nothing
  if not Tensor.grad_enabled: requires_grad = False
  out = _new_object(Tensor)   # Tensor.of_lazy, inline
  out.grad, out.requires_grad, out._ctx = None, requires_grad, ctx if requires_grad is not False else None
  # no dict copied; one or two sources passed as they are (a call with *sources builds a tuple and reads `forward`
  # through the generic attribute lookup)
  if kwargs: out._lazydata = ctx.forward(*sources, **kwargs)
  elif len(sources) == 2: out._lazydata = ctx.forward(sources[0], sources[1])
  elif len(sources) == 1: out._lazydata = ctx.forward(sources[0])
  else: out._lazydata = ctx.forward(*sources)
  return out

def _mask_to(mask: LazyBuffer, dtype: DType) -> LazyBuffer: return mask.cast(dtype)
def _logical_not(mask: LazyBuffer) -> LazyBuffer:
  return mask.alu(Ops.CMPNE, mask.const(True))   # mask is bool: its const is too

# ---- unary

class Contiguous(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.contiguous()
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output

class Cast(Function):
  def forward(self, x: LazyBuffer, dtype: DType) -> LazyBuffer:
    self.input_dtype = x.dtype
    return x.cast(dtype)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.cast(self.input_dtype)

class ToDevice(Function):
  """A copy to another device, or to a tuple of devices: sharded along `axis` (None: replicated; tgrad/multi/). The
  gradient goes back the same way: gathered from a device set, or sharded as the input was."""
  def forward(self, x: Any, device: Any, axis: Optional[int] = None) -> Any:
    self.input_device, self.input_axis = x.device, x.axis if isinstance(x, MultiLazyBuffer) else None
    if isinstance(device, tuple):
      if isinstance(x, LazyBuffer): return MultiLazyBuffer.shard(x, device, axis)
      return x.copy_to_device(device).to_axis(axis)
    return x.copy_to_device(device)
  def backward(self, grad_output: Any) -> Any:
    if not isinstance(self.input_device, tuple): return grad_output.copy_to_device(self.input_device)
    if isinstance(grad_output, LazyBuffer):
      return MultiLazyBuffer.shard(grad_output, self.input_device, self.input_axis)
    return grad_output.copy_to_device(self.input_device).to_axis(self.input_axis)

class Neg(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.alu(Ops.NEG)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.alu(Ops.NEG)

class Reciprocal(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.RECIP)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:   # d(1/x) = -1/x²
    return grad_output.alu(Ops.NEG).alu(Ops.MUL, self.ret).alu(Ops.MUL, self.ret)

class Sqrt(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.SQRT)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:   # d√x = 1 / (2√x)
    return grad_output.alu(Ops.FDIV, self.ret.alu(Ops.MUL, self.ret.const(2)))

class Exp2(Function):
  """`lowering` (an EXP2 arg: "poly", "libm", "fast"; see tensor_ops/composite.py) says how a kernel computes it."""
  def forward(self, x: LazyBuffer, lowering: Optional[str] = None) -> LazyBuffer:
    self.ret = x.alu(Ops.EXP2, arg=lowering)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:   # d2ˣ = 2ˣ·ln2
    return grad_output.alu(Ops.MUL, self.ret.alu(Ops.MUL, self.ret.const(LN2)))

class Log2(Function):
  """`lowering` as Exp2's."""
  def forward(self, x: LazyBuffer, lowering: Optional[str] = None) -> LazyBuffer:
    self.x = x
    return x.alu(Ops.LOG2, arg=lowering)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:   # d log2(x) = 1 / (x·ln2)
    return grad_output.alu(Ops.FDIV, self.x.alu(Ops.MUL, self.x.const(LN2)))

class Sin(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.alu(Ops.SIN)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:   # d sin(x) = cos(x) = sin(π/2 − x)
    cos = self.x.const(math.pi / 2).alu(Ops.ADD, self.x.alu(Ops.NEG)).alu(Ops.SIN)
    return grad_output.alu(Ops.MUL, cos)

class Tanh(Function):
  """The TANH op (the "native" and "fast" lowerings of the tanh composite; `lowering` is its arg); gradient
  1 − tanh²."""
  def forward(self, x: LazyBuffer, lowering: Optional[str] = None) -> LazyBuffer:
    self.ret = x.alu(Ops.TANH, arg=lowering)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    one_minus_square = self.ret.const(1).alu(Ops.ADD, self.ret.alu(Ops.MUL, self.ret).alu(Ops.NEG))
    return grad_output.alu(Ops.MUL, one_minus_square)

class Sigmoid(Function):
  """1 / (1 + e^−x), with the gradient σ(1 − σ): finite where the composite's chain rule would give 0·∞."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    exp_neg = x.alu(Ops.MUL, x.const(-1 / LN2)).alu(Ops.EXP2)
    self.ret = exp_neg.alu(Ops.ADD, x.const(1)).alu(Ops.RECIP)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    one_minus = self.ret.const(1).alu(Ops.ADD, self.ret.alu(Ops.NEG))
    return self.ret.alu(Ops.MUL, one_minus).alu(Ops.MUL, grad_output)

class Relu(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.MAX, x.const(0))
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.const(0).alu(Ops.CMPLT, self.ret).alu(Ops.WHERE, grad_output, grad_output.const(0))

# ---- binary (operands already broadcast to one shape and promoted to one dtype by Tensor)

class Add(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.binary(_OR if x.dtype.is_bool else _ADD, y)
  def backward(self, grad_output: LazyBuffer):
    return (grad_output if self.needs_input_grad[0] else None, grad_output if self.needs_input_grad[1] else None)

class Sub(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(Ops.ADD, y.alu(Ops.NEG))
  def backward(self, grad_output: LazyBuffer):
    return (grad_output if self.needs_input_grad[0] else None,
            grad_output.alu(Ops.NEG) if self.needs_input_grad[1] else None)

def _zero_with_sign_of(x: LazyBuffer) -> LazyBuffer:
  """copysign(0, x): -0.0 where x is negative or -0.0 (1/x < 0), else +0.0."""
  zero = x.const(0.0)
  negative = x.alu(Ops.CMPLT, zero).alu(Ops.OR, x.alu(Ops.RECIP).alu(Ops.CMPLT, zero))
  return negative.alu(Ops.WHERE, x.const(-0.0), zero)

def float_divmod(a: LazyBuffer, b: LazyBuffer) -> tuple[LazyBuffer, LazyBuffer]:
  """(a // b, a % b) of floats as numpy (npy_divmod) and torch compute them: from the exact remainder fmod(a, b), so
  `2.0**40 % 3.0` is 1 (a - b*floor(a/b) rounds to 0 or 32768 in float32), 7 // -inf is -1 and 7 % -inf is -inf.
  a // 0 is a / 0 (±inf, or NaN for 0 // 0) and a % 0 is NaN."""
  zero, one = a.const(0.0), a.const(1.0)
  remainder = a.alu(Ops.MOD, b)
  quotient = a.alu(Ops.ADD, remainder.alu(Ops.NEG)).alu(Ops.FDIV, b)   # very nearly an integer
  remainder_nonzero = remainder.alu(Ops.CMPNE, zero)   # NaN counts as nonzero, as in C
  signs_differ = b.alu(Ops.CMPLT, zero).alu(Ops.CMPNE, remainder.alu(Ops.CMPLT, zero))
  to_floor = remainder_nonzero.alu(Ops.AND, signs_differ)   # fmod has the dividend's sign; % has the divisor's
  mod = to_floor.alu(Ops.WHERE, remainder.alu(Ops.ADD, b),
                     remainder_nonzero.alu(Ops.WHERE, remainder, _zero_with_sign_of(b)))
  quotient = to_floor.alu(Ops.WHERE, quotient.alu(Ops.ADD, one.alu(Ops.NEG)), quotient)
  truncated = quotient.alu(Ops.TRUNC)
  floored = quotient.alu(Ops.CMPLT, truncated).alu(Ops.WHERE, truncated.alu(Ops.ADD, one.alu(Ops.NEG)), truncated)
  above_half = a.const(0.5).alu(Ops.CMPLT, quotient.alu(Ops.ADD, floored.alu(Ops.NEG)))   # snap to the nearest
  floored = above_half.alu(Ops.WHERE, floored.alu(Ops.ADD, one), floored)
  ratio = a.alu(Ops.FDIV, b)
  floordiv = quotient.alu(Ops.CMPNE, zero).alu(Ops.WHERE, floored, _zero_with_sign_of(ratio))
  divisor_zero = _logical_not(b.alu(Ops.CMPNE, zero))
  return divisor_zero.alu(Ops.WHERE, ratio, floordiv), divisor_zero.alu(Ops.WHERE, remainder, mod)

class FloatMod(Function):
  """numpy's float `%` (float_divmod); the gradient is 1 for the dividend and -(a // b) for the divisor."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.floordiv, mod = float_divmod(x, y)
    return mod
  def backward(self, grad_output: LazyBuffer):
    return (grad_output if self.needs_input_grad[0] else None,
            grad_output.alu(Ops.MUL, self.floordiv).alu(Ops.NEG) if self.needs_input_grad[1] else None)

class Mul(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.binary(_AND if x.dtype.is_bool else _MUL, y)
  def backward(self, grad_output: LazyBuffer):
    return (grad_output.alu(Ops.MUL, self.y) if self.needs_input_grad[0] else None,
            grad_output.alu(Ops.MUL, self.x) if self.needs_input_grad[1] else None)

class Div(Function):
  """IEEE float division (FDIV); integer division is built in Tensor from IDIV and MOD."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(Ops.FDIV, y)
  def backward(self, grad_output: LazyBuffer):   # d(x/y) = dx/y − x·dy/y²
    grad_x = grad_output.alu(Ops.FDIV, self.y) if self.needs_input_grad[0] else None
    grad_y = None
    if self.needs_input_grad[1]:
      grad_y = grad_output.alu(Ops.NEG).alu(Ops.MUL, self.x).alu(Ops.FDIV, self.y.alu(Ops.MUL, self.y))
    return grad_x, grad_y

class Maximum(Function):
  """max(x, y); where x == y the gradient is split evenly between the two."""
  TIE_SHARE = 0.5
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(Ops.MAX, y)
  def backward(self, grad_output: LazyBuffer):
    dtype = grad_output.dtype
    x_wins = _mask_to(self.y.alu(Ops.CMPLT, self.x), dtype)
    tie = _mask_to(_logical_not(self.x.alu(Ops.CMPNE, self.y)), dtype)
    x_share = x_wins.alu(Ops.ADD, tie.alu(Ops.MUL, tie.const(self.TIE_SHARE)))
    y_share = x_share.const(1).alu(Ops.ADD, x_share.alu(Ops.NEG))
    return (grad_output.alu(Ops.MUL, x_share) if self.needs_input_grad[0] else None,
            grad_output.alu(Ops.MUL, y_share) if self.needs_input_grad[1] else None)

class Where(Function):
  def forward(self, condition: LazyBuffer, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.condition = condition
    return condition.alu(Ops.WHERE, x, y)
  def backward(self, grad_output: LazyBuffer):
    zero = grad_output.const(0)
    return (None,
            self.condition.alu(Ops.WHERE, grad_output, zero) if self.needs_input_grad[1] else None,
            self.condition.alu(Ops.WHERE, zero, grad_output) if self.needs_input_grad[2] else None)

# ---- reductions (reduced axes stay as size 1; Tensor reshapes them away)

def _reduce(x: LazyBuffer, op: Ops, axes: tuple[int, ...], identity) -> LazyBuffer:
  """x.r(op, axes), except that a reduce over an empty axis is the op's identity, decided here without a kernel."""
  shape = x.shape
  for a in axes:   # a loop, not any() over a generator: every eager reduce passes here
    if shape[a] == 0: return x.const(identity, shape=tuple(1 if i in axes else s for i, s in enumerate(shape)))
  return x.r(op, axes)

class Sum(Function):
  def forward(self, x: LazyBuffer, axes: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return _reduce(x, Ops.ADD, axes, 0)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.expand(self.input_shape)

class Max(Function):
  """The gradient goes to the positions that hold the max, split evenly among ties."""
  def forward(self, x: LazyBuffer, axes: tuple[int, ...]) -> LazyBuffer:
    self.x, self.axes = x, axes
    self.ret = x.r(Ops.MAX, axes)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    is_max = _logical_not(self.x.alu(Ops.CMPNE, self.ret.expand(self.x.shape))).cast(grad_output.dtype)
    count = is_max.r(Ops.ADD, self.axes).expand(self.x.shape)
    return is_max.alu(Ops.FDIV, count).alu(Ops.MUL, grad_output.expand(self.x.shape))

class LogSumExp(Function):
  """log Σ exp(x) over `axes` in one pass over x (the LOGADDEXP reduce: the online softmax's running max and rescaled
  sum), in `dtype` (default x's; wider keeps the result's rounding off x − lse); log 0 = −inf over an empty axis. The
  gradient is the softmax exp(x − lse), NaN where lse is ±inf (as torch)."""
  def forward(self, x: LazyBuffer, axes: tuple[int, ...], dtype: Optional[DType] = None) -> LazyBuffer:
    self.x = x
    dtype = dtype or x.dtype
    if any(x.shape[a] == 0 for a in axes):
      self.ret = LazyBuffer.const_of(-math.inf, dtype, x.device, tuple(1 if i in axes else s
                                                                       for i, s in enumerate(x.shape)))
    else: self.ret = x.r(Ops.LOGADDEXP, axes, dtype)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    x, shape = self.x, self.x.shape
    shifted = x.cast(self.ret.dtype).alu(Ops.ADD, self.ret.expand(shape).alu(Ops.NEG)).cast(x.dtype)
    softmax = shifted.alu(Ops.MUL, shifted.const(1 / LN2)).alu(Ops.EXP2)
    return softmax.alu(Ops.MUL, grad_output.expand(shape).cast(x.dtype))

class Prod(Function):
  """The gradient of a product is the product of the others; written to stay finite when inputs are zero."""
  def forward(self, x: LazyBuffer, axes: tuple[int, ...]) -> LazyBuffer:
    self.x, self.axes = x, axes
    return _reduce(x, Ops.MUL, axes, 1)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    x, shape = self.x, self.x.shape
    is_zero = _logical_not(x.alu(Ops.CMPNE, x.const(0)))
    nonzero_prod = is_zero.alu(Ops.WHERE, x.const(1), x).r(Ops.MUL, self.axes).expand(shape)
    zero_count = is_zero.cast(x.dtype).r(Ops.ADD, self.axes).expand(shape)
    no_zeros = zero_count.alu(Ops.CMPLT, x.const(0.5))
    one_zero_here = is_zero.alu(Ops.AND, zero_count.alu(Ops.CMPLT, x.const(1.5)))
    others = no_zeros.alu(Ops.WHERE, nonzero_prod.alu(Ops.FDIV, is_zero.alu(Ops.WHERE, x.const(1), x)),
                          one_zero_here.alu(Ops.WHERE, nonzero_prod, x.const(0)))
    return others.alu(Ops.MUL, grad_output.expand(shape))

# ---- data-dependent loads

class Gather(Function):
  """out = table.gather(index, axis) (see LazyBuffer.gather): one table element read per output element. The table's
  gradient is the scatter-add of grad_output into the rows the index picked, built as a one-hot compare of the index
  with ARANGE over the table's axis and a sum over the index's positions along that axis (work: index elements ×
  table rows along the axis). 16-bit floats add in float32. The index gets no gradient."""
  def forward(self, table: LazyBuffer, index: LazyBuffer, axis: int) -> LazyBuffer:
    self.table_shape, self.table_dtype, self.index, self.axis = table.shape, table.dtype, index, axis
    return table.gather(index, axis)
  def backward(self, grad_output: LazyBuffer):
    if not self.needs_input_grad[0]: return None, None
    axis, rows, shape = self.axis, self.table_shape[self.axis], grad_output.shape
    spread = shape[:axis + 1] + (rows,) + shape[axis + 1:]   # (..., index positions, table rows, ...)
    def per_row(x: LazyBuffer) -> LazyBuffer:   # index-shaped, repeated for every table row
      return x.reshape(shape[:axis + 1] + (1,) + shape[axis + 1:]).expand(spread)
    row_dtype = dtypes.int32 if rows <= dtypes.max(dtypes.int32) else dtypes.int64
    row_numbers = LazyBuffer.loadop(Ops.ARANGE, (rows,), row_dtype, grad_output.device)
    row_numbers = row_numbers.reshape((1,) * (axis + 1) + (rows,) + (1,) * (len(shape) - axis - 1)).expand(spread)
    hit = _logical_not(per_row(self.index.cast(row_dtype)).alu(Ops.CMPNE, row_numbers))
    acc_dtype = dtypes.float32 if self.table_dtype.is_float and self.table_dtype.itemsize < 4 else self.table_dtype
    picked = hit.alu(Ops.WHERE, per_row(grad_output.cast(acc_dtype)), LazyBuffer.const_of(0, acc_dtype,
                                                                                           grad_output.device, spread))
    return _reduce(picked, Ops.ADD, (axis,), 0).reshape(self.table_shape).cast(self.table_dtype), None

# ---- movement

class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.reshape(self.input_shape)

class Permute(Function):
  def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
    self.inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return x.permute(order)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.permute(self.inverse)

class Expand(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.expanded_axes = tuple(i for i, (old, new) in enumerate(zip(x.shape, shape)) if old != new)
    return x.expand(shape)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    """The sum over the broadcast axes; float16/bfloat16 gradients add up in float32 and are rounded once (as
    Tensor.sum: a matmul's weight gradient is such a sum, and half precision loses 1e-2 over 64 terms)."""
    if grad_output.dtype in HALF_PRECISION:
      return grad_output.cast(dtypes.float32).r(Ops.ADD, self.expanded_axes).cast(grad_output.dtype)
    return grad_output.r(Ops.ADD, self.expanded_axes)

class Pad(Function):
  def forward(self, x: LazyBuffer, padding: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.bounds = tuple((before, before + size) for size, (before, _) in zip(x.shape, padding))
    return x.pad(padding)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.shrink(self.bounds)

class Shrink(Function):
  def forward(self, x: LazyBuffer, bounds: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.padding = tuple((begin, size - end) for size, (begin, end) in zip(x.shape, bounds))
    return x.shrink(bounds)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.pad(self.padding)

class Flip(Function):
  def forward(self, x: LazyBuffer, axes: tuple[bool, ...]) -> LazyBuffer:
    self.axes = axes
    return x.flip(axes)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.flip(self.axes)

class Stride(Function):
  """Every `step`-th element per axis (steps are positive). Backward spreads the gradient back with zeros between."""
  def forward(self, x: LazyBuffer, steps: tuple[int, ...]) -> LazyBuffer:
    self.input_shape, self.steps = x.shape, steps
    return x.stride(steps)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return spread_strided(grad_output, self.steps, self.input_shape)

def spread_strided(x: LazyBuffer, steps: tuple[int, ...], shape: tuple[int, ...]) -> LazyBuffer:
  """The inverse placement of `stride`: x's values at every `step`-th position of `shape`, zeros between.
  Per axis: (kept,) → (kept, 1) → pad to (kept, step) → (kept·step,) → shrink to the original size."""
  for axis, (size, step) in enumerate(zip(shape, steps)):
    if step == 1: continue
    kept = x.shape[axis]
    spread = x.reshape(x.shape[:axis] + (kept, 1) + x.shape[axis + 1:])
    spread = spread.pad(tuple((0, step - 1) if i == axis + 1 else (0, 0) for i in range(len(spread.shape))))
    spread = spread.reshape(x.shape[:axis] + (kept * step,) + x.shape[axis + 1:])
    x = spread.shrink(tuple((0, size) if i == axis else (0, s) for i, s in enumerate(spread.shape)))
  return x
