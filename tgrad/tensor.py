"""The user-facing Tensor: a numpy-like API with autograd, built only from LazyBuffer primitives.

Every method checks its arguments (shapes, dtypes, axes) and raises before any kernel runs, then composes a few
lazy ops: `alu`, `cast`, `r` (reduce), movement views, constants and ARANGE. Differentiable primitives go through
tgrad.function; everything else (exp, softmax, matmul, indexing, ...) is a composition of them, so gradients come
from the chain rule and fuse like forward code. Nothing runs until `realize`, `numpy`, `tolist` or `item`.
This file is the core (construction from data, getting data out, dtype and device, autograd, broadcasting and
in-place updates); the other methods live in mixins by concern in tgrad/tensor_ops/ (see its __init__.py).
"""
from __future__ import annotations
import time
from contextlib import ContextDecorator, ExitStack
from typing import Any, Callable, ClassVar, Optional
import numpy as np
from tgrad.dtype import DType, dtypes, promote_types, least_upper_float, to_dtype
from tgrad.lazy import LazyBuffer, latest, is_writable_view, view_root
from tgrad.multi import MultiLazyBuffer, check_split
from tgrad.ops import Ops, UOp
from tgrad.device import canonical_device
from tgrad.helpers import prod
from tgrad.shape.sint import evaluate
import tgrad.bounds as bounds_module
from tgrad.bounds import realize_with_checks
import tgrad.realize as realize_module
from tgrad.realize import copy_to_host, pre_realize_passes
from tgrad.schedule import create_schedule
from tgrad.scalars import SCALAR_PARAM_PREFIX
from tgrad.graph_simplify import is_constant_expression
import tgrad.function as F
from tgrad.tensor_ops import bind_tensor_class
from tgrad.tensor_ops.args import Scalar, broadcast_shape, _resolve_axis, _scalar_dtype, _check_scalar_fits, \
  _fit_python_int, _python_dtype, DTypeNotSupportedError
from tgrad.tensor_ops.creation import CreationMixin
from tgrad.tensor_ops.elementwise import ElementwiseMixin
from tgrad.tensor_ops.reduce import ReduceMixin
from tgrad.tensor_ops.movement import MovementMixin
from tgrad.tensor_ops.indexing import IndexingMixin
from tgrad.tensor_ops.linalg import LinalgMixin
from tgrad.tensor_ops.neural import NNMixin
from tgrad.tensor_ops.sorting import SortingMixin
from tgrad.tensor_ops.hashing import HashingMixin

def _shards(lbs) -> list[LazyBuffer]:
  """The per-device LazyBuffers of lazy values, a sharded value (MultiLazyBuffer) giving one per device."""
  return [s for lb in lbs for s in (lb.shards if isinstance(lb, MultiLazyBuffer) else (lb,))]

def _const_beside(lb: Any, value: Any, dtype: DType, shape: tuple) -> Any:
  """A constant on `lb`'s device (a sharded value's: split as it is when `shape` is its shape)."""
  if isinstance(lb, MultiLazyBuffer): return lb.const_with(value, dtype, shape)
  return LazyBuffer.const_of(value, dtype, lb.device, shape)

def _realize(*lbs: Any) -> None: _realize_all(lbs)

def _realize_all(lbs: tuple) -> None:
  """Every Tensor-level realize: in the contexts the registered pre-realize passes give (tgrad/realize.py; tgrad.paths
  registers path selection, which does nothing while the benchmark database has no record for the device), with the
  queued index checks (bounds.realize_with_checks). A sharded value realizes its shards. The common case (no context,
  no check queued: every eager op) calls realize straight. Its arguments are fixed (a tuple, not `*lbs`): a
  single value's realize calls it inline."""
  for lb in lbs:
    if isinstance(lb, MultiLazyBuffer):
      lbs = tuple(_shards(lbs))
      break
  contexts: Optional[list] = None
  for realize_pass in pre_realize_passes:
    if (context := realize_pass(lbs)) is not None: contexts = [context] if contexts is None else [*contexts, context]
  if contexts is None:
    if not bounds_module._pending: return realize_module.realize(*lbs)   # read each call: tests wrap it
    return realize_with_checks(*lbs)
  with ExitStack() as stack:
    for context in contexts: stack.enter_context(context)
    realize_with_checks(*lbs)

def _copy_to_host(lb: LazyBuffer) -> np.ndarray: return copy_to_host(lb.base.buffer)

# ---------------------------------------------------------------------------------------------------------------

class Tensor(CreationMixin, ElementwiseMixin, ReduceMixin, MovementMixin, IndexingMixin, LinalgMixin, NNMixin,
             SortingMixin, HashingMixin):
  """An n-dimensional array on a device, computed lazily.

  Autograd: `requires_grad` is None (undecided: no `.grad` unless an optimizer turns it on), True or False. Ops on
  tensors that don't all say False record a `Function` in `_ctx`; `loss.backward()` fills `.grad` of every tensor
  that requires grad (accumulating across calls; where none does, of every undecided float tensor, as tinygrad
  0.14), `loss.gradient(*targets)` returns gradients with respect to any
  tensors in the graph, undecided ones included, without touching `.grad`.
  Gradient recording is switched off in a scope with `with Tensor.no_grad():` (also a decorator); the flag it sets
  is `Tensor.grad_enabled`. Likewise `with Tensor.train():` sets `Tensor.training` (read by dropout).
  In-place forms (`+=`, `t[i] = v`, `assign`, `assign_region`) rebind the tensor to a new lazy value; `t[i] = v`
  and the assigns are not differentiable.
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
    if isinstance(device, (tuple, list)): device = tuple(canonical_device(d) for d in device)
    if isinstance(data, (LazyBuffer, MultiLazyBuffer)):
      if device is not None:
        data = MultiLazyBuffer.shard(data, device, None) if isinstance(device, tuple) and \
          isinstance(data, LazyBuffer) else data.copy_to_device(device)
      self._lazydata: Any = data if dtype is None else data.cast(dtype)
      return
    if isinstance(device, tuple):   # the same value on each device: a replicated sharded tensor
      check_split((), None, device)
      self._lazydata = MultiLazyBuffer([Tensor(data, dtype, d).lazydata for d in device], None)
      return
    device = canonical_device(device)
    if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):   # np.float64 is a float too
      dtype = dtype or _python_dtype(data)
      _check_scalar_fits(data, dtype)
      self.lazydata = LazyBuffer.const_of(data, dtype, device)
    elif isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
      # a list of tensors of one shape, as torch.tensor takes 0-d ones: stacked (copied) on `device`
      if not all(isinstance(x, Tensor) for x in data):
        raise TypeError(f"a list mixing Tensors and {sorted({type(x).__name__ for x in data} - {'Tensor'})} can't "
                        "make a Tensor: make every element a Tensor, or none")
      if len({x.shape for x in data}) != 1:
        raise ValueError(f"a list of Tensors of different shapes {[x.shape for x in data]} can't make a Tensor")
      stacked = Tensor.stack(*[x.detach().to(device) for x in data])
      self._lazydata = (stacked if dtype is None else stacked.cast(dtype)).contiguous().lazydata
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

  @staticmethod
  def of_lazy(lb: LazyBuffer, requires_grad: Optional[bool], ctx: Optional[F.Function] = None) -> Tensor:
    """The Tensor of a LazyBuffer an op just built (`ctx` its autograd record, or None): `Tensor(lb, ...)` without
    the argument checks, for an op's output (Function.apply makes its outputs the same way, inline)."""
    out = Tensor.__new__(Tensor)
    out.grad, out.requires_grad, out._ctx, out._lazydata = None, requires_grad, ctx, lb
    return out

  # ---- the value: `lazydata` follows writes into this tensor or into the tensor it is a view of (docs/semantics.md)
  _graph_freed = False   # backward freed the record of the ops that made this tensor
  _pinned = False   # a tensor standing for one fixed value (autograd's record of a value written over) never follows
  @property
  def lazydata(self) -> LazyBuffer:
    lb = self._lazydata
    if (lb.successor is not None or lb.origin is not None) and not self._pinned:
      if (now := latest(lb)) is not lb: self._lazydata = lb = now
    return lb
  @lazydata.setter
  def lazydata(self, lb: LazyBuffer) -> None: self._lazydata = lb

  # ---- properties
  @property
  def shape(self) -> tuple[int, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> Any:
    """The device's name; for a sharded tensor the tuple of its devices' names."""
    return self.lazydata.device
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
    if others: _realize(self.lazydata, *[t.lazydata for t in others])
    else:
      lb = self._lazydata   # Tensor.lazydata, inline where no in-place write moved it: this is every eager op
      _realize_all((lb if lb.successor is None and lb.origin is None else self.lazydata,))
    return self
  def schedule(self, *others: Tensor) -> list:
    """The kernels (ScheduleItems) that realizing this tensor (and others) would run, planned without running or
    committing anything (tinygrad's Tensor.schedule; count them to check fusion)."""
    return create_schedule(_shards([self.lazydata, *[t.lazydata for t in others]]))
  def schedule_with_vars(self, *others: Tensor) -> tuple[list, dict[str, int]]:
    """The plan of `schedule` and the values its kernels give the symbolic variables (bound Variables), by name
    (tinygrad's schedule_with_vars, whose keys are the Variables); the kernels' own scalar parameters (weak Python
    constants, tgrad/scalars.py) are left out."""
    items = self.schedule(*others)
    values: dict[str, int] = {}
    for item in items:
      values.update((name, value) for name, value in item.var_vals.items() if not _is_scalar_param_name(name))
    return items, values
  def numpy(self) -> np.ndarray:
    """The values as a numpy array (bfloat16 comes back as float32)."""
    lb = self.lazydata   # read once (a property: it follows in-place writes)
    out_dtype = dtypes.float32 if lb.dtype == dtypes.bfloat16 else lb.dtype
    shape = lb.shape
    for size in shape:   # a symbolic dim at its bound value (a plain loop: every eager read passes here)
      if type(size) is not int:
        shape = tuple(evaluate(s) for s in shape)
        break
    count = prod(shape)
    if count == 0: return np.zeros(shape, dtype=out_dtype.np)
    if isinstance(lb, MultiLazyBuffer):   # gathered to the first device
      return Tensor(lb.copy_to_device(self.device[0]), requires_grad=False).numpy()
    # a computed base is realized as itself (a row-major buffer of its shape: what contiguous() would commit to it
    # too), so an eager `(a + b).numpy()` is the one op `(a + b).realize()` is; so is a row-major view of all of its
    # base (a reduce's result with the reduced dims dropped, a reshape): its values are the buffer's. Anything else is
    # copied contiguous (a slice of a large buffer copies its own elements, not the buffer)
    if lb.dtype != out_dtype or (lb._base is not None and (not lb.st.contiguous or lb._base.op is Ops.CONST or
                                                           type(size := lb.size) is not int or size != lb._base.size)):
      lb = lb.cast(out_dtype).contiguous()
    _realize_all((lb,))   # realize computes a view's base into its buffer (a constant's view is copied above)
    values = _copy_to_host(lb)
    # a symbolic buffer is allocated at the variables' maximum; its first elements are the row-major values
    return (values if values.size == count else values[:count]).reshape(shape)
  def tolist(self) -> Any: return self.numpy().tolist()
  def item(self) -> Scalar:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()
  def data(self) -> memoryview: return memoryview(self.numpy())

  # ---- device and dtype
  def to(self, device: Any) -> Tensor:
    """This tensor on another device (a copy); a sharded tensor to one device is gathered there; to a tuple of
    devices, a tensor is replicated on them (a sharded one keeps its axis)."""
    if isinstance(device, (tuple, list)):
      devices = tuple(canonical_device(d) for d in device)
      if devices == self.device: return self
      axis = self.lazydata.axis if isinstance(self.lazydata, MultiLazyBuffer) else None
      return F.ToDevice.apply(self, device=devices, axis=axis)
    device = canonical_device(device)
    return self if device == self.device else F.ToDevice.apply(self, device=device)
  def shard(self, devices: Any, axis: Optional[int] = None) -> Tensor:
    """This tensor over several devices (tinygrad's name): split along `axis` into equal parts, part i on
    devices[i], or the whole on each when axis is None (replicated). Ops on the result follow the sharding rules
    (tgrad/multi/multilazy.py, docs/multi_device.md); `.to(device)` and `.numpy()` gather it. IndexError for an axis
    out of range, ValueError for an axis that does not divide evenly or repeated devices; differentiable."""
    devices = tuple(canonical_device(d) for d in devices)
    check_split(self.shape, axis, devices)
    return F.ToDevice.apply(self, device=devices, axis=axis)
  def shard_like(self, y: Tensor) -> Tensor:
    """This tensor placed as `y` is: sharded over y's devices along y's axis, or on y's one device."""
    if isinstance(y.lazydata, MultiLazyBuffer): return self.shard(y.device, y.lazydata.axis)
    return self.to(y.device)
  def shard_(self, devices: Any, axis: Optional[int] = None) -> Tensor:
    """Shard this tensor in place (its .grad too): it holds the sharded value from now on, as a leaf (as tinygrad's:
    autograd does not reach through to the value it held before, so a sharded weight gets its own .grad)."""
    sharded = self.shard(devices, axis)
    if self.grad is not None: self.grad = self.grad.shard(devices, axis)
    self.lazydata, self._ctx = sharded.lazydata, None
    return self
  def to_(self, device: str) -> Tensor:
    """Move this tensor (and its .grad) to `device` in place."""
    moved = self.to(device)
    if self.grad is not None: self.grad = self.grad.to(device)
    return self.replace(moved)
  def replace(self, x: Tensor) -> Tensor:
    """Make this tensor hold x's value (same shape; x's dtype and device), as tinygrad's replace; not differentiable
    through, and unlike assign no buffer is written."""
    if x.shape != self.shape: raise ValueError(f"replace: shape {x.shape} for a tensor of shape {self.shape}")
    self.lazydata, self._ctx = x.lazydata, x._ctx
    return self
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
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def short(self) -> Tensor: return self.cast(dtypes.int16)
  def is_floating_point(self) -> bool: return self.dtype.is_float
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def _to_float(self) -> Tensor:
    dtype = self.dtype
    return self if dtype.is_float else self.cast(least_upper_float(dtype))   # a float already: no cast call
  def contiguous(self) -> Tensor:
    """This tensor in row-major order. As torch, a tensor already laid out so (a realized buffer, or a row-major
    slice of one) is returned itself; anything else is copied into a buffer of its own."""
    lb = self.lazydata
    if not lb.is_base and lb.base.realized is not None and lb.st.row_major(): return self
    return F.Contiguous.apply(self)

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
      if node._ctx is not None:
        stack.extend((p, False) for p in node._ctx.parents if p is not None and id(p) not in visited)
    return order
  def _backprop(self, gradient: Optional[Tensor], is_target: Callable[[Tensor], bool]) -> tuple[list[Tensor],
                                                                                              dict[int, LazyBuffer]]:
    """Gradients of self, keyed by tensor id, for the tensors in the recorded graph on a path to a target. Every op
    learns from `needs_input_grad` which of its inputs lie on such a path: no gradient is built for the others
    (constants, undecided inputs no target depends on)."""
    if gradient is None:
      if self.numel() != 1:
        raise RuntimeError(f"backward without a gradient needs a tensor with one element, got shape {self.shape}")
      gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
    if gradient.shape != self.shape:
      raise RuntimeError(f"gradient of shape {gradient.shape} for a tensor of shape {self.shape}")
    nodes = self._toposort()
    on_path: set[int] = set()   # a target, or made (through recorded ops) from one
    for node in nodes:
      if is_target(node) or (node._ctx is not None and any(id(p) in on_path for p in node._ctx.parents)):
        on_path.add(id(node))
    grads: dict[int, LazyBuffer] = {id(self): gradient.cast(self.dtype).lazydata}
    for node in reversed(nodes):
      if node._ctx is None or id(node) not in grads or id(node) not in on_path: continue
      node._ctx.needs_input_grad = [id(p) in on_path for p in node._ctx.parents]
      parent_grads = node._ctx.backward(grads[id(node)])
      if not isinstance(parent_grads, tuple): parent_grads = (parent_grads,)
      for parent, grad in zip(node._ctx.parents, parent_grads):
        if grad is None or id(parent) not in on_path: continue
        assert grad.shape == parent.shape, f"gradient shape {grad.shape} for {parent.shape} from {node._ctx}"
        grad = grad.cast(parent.dtype)
        grads[id(parent)] = grads[id(parent)].alu(Ops.ADD, grad) if id(parent) in grads else grad
    return nodes, grads
  def backward(self, gradient: Optional[Tensor] = None, retain_graph: bool = False) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every tensor t in the graph with requires_grad=True (optimizers set
    it on their parameters). When no tensor in the graph says requires_grad=True, every undecided (requires_grad
    None) float tensor in it gets its `.grad` instead, as tinygrad 0.14's backward fills every float tensor in the
    graph (`t = Tensor([1., 2.]); t.sum().backward()` works; constants get none); with requires_grad=True tensors
    present, only they do (as torch and tinygrad up to 0.12: an input batch gets no gradient built). A graph with no
    tensor to fill (everything said requires_grad=False, was computed under Tensor.no_grad(), or went through a
    comparison or an int op, where tgrad's record stops) raises, as torch (tinygrad fills zeros there). As torch,
    the record of the graph is freed (unless `retain_graph`): the intermediate values it held die with it, so an
    optimizer step that overwrites the parameters next has nothing pending to keep old values for
    (docs/semantics.md); a second backward raises."""
    if self._graph_freed:
      raise RuntimeError(f"backward through the graph of a tensor of shape {self.shape} a second time: the first "
                         "backward freed it; pass retain_graph=True to the first one")
    wants_grad: Callable[[Tensor], bool] = lambda node: bool(node.requires_grad)   # noqa: E731
    if not self.requires_grad:
      nodes = self._toposort()
      if not any(node.requires_grad for node in nodes):   # tinygrad 0.14: every float tensor in the graph
        def wants_grad(node: Tensor) -> bool:
          return node.requires_grad is None and node.dtype.is_float and not node.lazydata.is_unrealized_const()
      if not any(wants_grad(node) for node in nodes):
        raise RuntimeError(f"backward of a tensor of shape {self.shape} that does not require grad: no float tensor "
                           "that may have a gradient went into it (everything said requires_grad=False, or it was "
                           "computed under Tensor.no_grad(), or through a comparison). Mark the inputs with "
                           "requires_grad=True, or use loss.gradient(*tensors)")
    nodes, grads = self._backprop(gradient, wants_grad)
    for node in nodes:
      if wants_grad(node) and id(node) in grads:
        grad = Tensor(grads[id(node)], requires_grad=False)
        node.grad = grad if node.grad is None else Tensor(node.grad.lazydata.alu(Ops.ADD, grad.lazydata))
    if not retain_graph:
      for node in nodes:
        if node._ctx is not None: node._ctx, node._graph_freed = None, True
    return self
  def gradient(self, *targets: Tensor, gradient: Optional[Tensor] = None) -> list[Tensor]:
    """d(self)/d(target) for each target, as new tensors; `.grad` is left alone. As tinygrad's functional gradients,
    a target is any float tensor, whether or not it was marked requires_grad: ops on undecided tensors are recorded
    too. Where no recorded op leads from a target to self (an unused target, a path through a comparison, detach or
    an op run under no_grad) the gradient is zeros, not an error."""
    for t in targets:
      if not t.dtype.is_float: raise RuntimeError(f"only float tensors have gradients, got a target of dtype {t.dtype}")
    target_ids = {id(t) for t in targets}
    _, grads = self._backprop(gradient, lambda node: id(node) in target_ids)
    return [Tensor(grads[id(t)], requires_grad=False) if id(t) in grads else t.detach().zeros_like() for t in targets]

  # ---- broadcasting and promotion
  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if len(shape) < self.ndim: raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
    x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
    if any(s != n and s != 1 for s, n in zip(x.shape, shape)):
      raise ValueError(f"cannot broadcast {self.shape} to {shape}")
    return F.Expand.apply(x, shape=shape) if x.shape != shape else x
  def const_like(self, value: Scalar) -> Tensor:
    """A constant of self's shape, dtype and device (no buffer: it folds into the kernels that read it)."""
    return Tensor(_const_beside(self.lazydata, value, self.dtype, self.shape), requires_grad=False)
  def ufix(self, x: Any) -> Tensor:
    """x as a tensor beside self: a Tensor as is, a Python scalar as a weak constant of self's kind (tinygrad's)."""
    return self._as_tensor(x)
  def _as_tensor(self, x: Any, dtype: Optional[DType] = None) -> Tensor:
    if isinstance(x, Tensor):
      if x.device != self.device: raise ValueError(f"tensors on different devices: {self.device} and {x.device}")
      return x
    if isinstance(x, (bool, int, float)):
      return Tensor(x, dtype=dtype or _scalar_dtype(self.dtype, x), device=self.device)
    if isinstance(x, UOp):   # a symbolic size as a value (e.g. a count over a symbolic axis)
      return Tensor(_const_beside(self.lazydata, x, dtype or _scalar_dtype(self.dtype, 1), ()), requires_grad=False)
    return Tensor(x, dtype=dtype, device=self.device)
  def _operands(self, other: Any, reverse: bool = False, dtype: Optional[DType] = None) -> tuple[Tensor, Tensor]:
    """self and other broadcast to one shape and promoted to one dtype (Python scalars are weak)."""
    if dtype is None and isinstance(other, Tensor):   # the common case, as is: one device, shape and dtype
      mine, theirs = self._lazydata, other._lazydata   # Tensor.lazydata, inline where no in-place write moved them
      if mine.successor is not None or mine.origin is not None: mine = self.lazydata
      if theirs.successor is not None or theirs.origin is not None: theirs = other.lazydata
      if mine.dtype is theirs.dtype and mine.device == theirs.device:
        if mine.shape == theirs.shape: return (other, self) if reverse else (self, other)
        if len(mine.shape) == len(theirs.shape):   # one dtype and rank: a row statistic against its rows
          shape = broadcast_shape(mine.shape, theirs.shape)   # (its error is the general path's)
          x = self if mine.shape == shape else F.Expand.apply(self, shape=shape)
          y = other if theirs.shape == shape else F.Expand.apply(other, shape=shape)
          return (y, x) if reverse else (x, y)
    if isinstance(other, (bool, int, float)):   # a constant made at self's shape: no reshape/expand ops to record
      mine = self.lazydata   # read once (a property: it follows in-place writes); this is every `t + 1`
      tensor_dtype = mine.dtype
      out_dtype = dtype or _scalar_dtype(tensor_dtype, other)
      if out_dtype.is_int: other, out_dtype = _fit_python_int(other, out_dtype, tensor_dtype)   # only ints overflow
      x = self if out_dtype is tensor_dtype else self.cast(out_dtype)
      # weak: a kernel parameter (tgrad/scalars.py), unless it joins a constant expression, which folds instead
      if isinstance(mine, MultiLazyBuffer):
        y = Tensor(mine.const_with(other, out_dtype, self.shape, weak=not is_constant_expression(mine.shards[0])),
                   requires_grad=False)
        return (y, x) if reverse else (x, y)
      y = Tensor.of_lazy(LazyBuffer.const_of(other, out_dtype, mine.device, mine.shape,
                                             weak=not is_constant_expression(mine)), False)
      return (y, x) if reverse else (x, y)
    y = self._as_tensor(other)
    out_dtype = dtype or promote_types(self.dtype, y.dtype)
    shape = broadcast_shape(self.shape, y.shape)
    x, y = self.cast(out_dtype)._broadcast_to(shape), y.cast(out_dtype)._broadcast_to(shape)
    return (y, x) if reverse else (x, y)
  def _int_operands(self, other: Any, reverse: bool, op_name: str) -> tuple[Tensor, Tensor]:
    other_dtype = other.dtype if isinstance(other, Tensor) else type(other).__name__
    if self.dtype.is_float or (isinstance(other, Tensor) and other.dtype.is_float) or isinstance(other, float):
      raise DTypeNotSupportedError(f"{op_name} needs int or bool operands, got {self.dtype} and {other_dtype}")
    x, y = self._operands(other, reverse)
    if x.dtype.is_float:
      raise DTypeNotSupportedError(f"{op_name} needs int or bool operands, got {self.dtype} and {other!r}")
    return x, y

  # ---- in-place updates: `t[i] = v` (indexing.py), `+=` and friends (elementwise.py) and assign rebind the tensor
  def assign(self, x: Any) -> Tensor:
    """Write x (same shape, or broadcast to it; cast to this dtype) into this tensor: every tensor sharing its storage
    (views, detach, ...) sees the new value, values computed from the old one keep it (docs/semantics.md). A realized
    buffer is written on realize (Ops.ASSIGN). Not tracked by autograd."""
    x = self._as_tensor(x, dtype=self.dtype if not isinstance(x, Tensor) else None)
    if x.shape != self.shape:
      x = x._broadcast_to(self.shape) if broadcast_shape(x.shape, self.shape) == self.shape else x
      if x.shape != self.shape: raise ValueError(f"assign of shape {x.shape} into a tensor of shape {self.shape}")
    self._write(x.cast(self.dtype).lazydata)
    self._ctx = None
    return self
  def assign_region(self, bounds, x: Tensor) -> Tensor:
    """Write x into `self.shrink(bounds)` of this realized tensor's buffer and nothing else (one kernel over x's
    elements: a one-token KV-cache write costs one row, not the cache; bounds may be symbolic, e.g. (pos, pos + 1)).
    This tensor becomes the whole buffer after the write. Not tracked by autograd. A sharded tensor writes the region
    on each device (a split tensor's region must cover its split axis whole)."""
    target = self.lazydata
    if isinstance(target, MultiLazyBuffer): return self._assign_region_shards(target, bounds, x)
    if not (target.is_base and target.realized is not None):
      raise ValueError(f"assign_region writes a realized buffer; this tensor of shape {self.shape} is unrealized")
    region = self.shrink(bounds)
    if x.shape != region.shape: raise ValueError(f"assign_region of shape {x.shape} into a region of {region.shape}")
    value = x.cast(self.dtype).lazydata
    if value.base is target: value = value.contiguous()   # reading the target itself: copy it out first
    target.successor = target.assign(value, region.lazydata.st)
    self.lazydata, self._ctx = target.successor, None
    return self
  def written_by_kernel(self, written: LazyBuffer) -> Tensor:
    """This realized tensor becomes `written`: the ASSIGN a custom kernel performs on its buffer in place
    (LazyBuffer.written_by, e.g. a KV-cache append inside a decode attention kernel). Not tracked by autograd."""
    target = self.lazydata
    if not isinstance(target, LazyBuffer) or written.op is not Ops.ASSIGN or written.srcs[0] is not target:
      raise ValueError(f"written_by_kernel: the write is not one of this tensor's buffer (shape {self.shape})")
    target.successor = written
    self.lazydata, self._ctx = written, None
    return self
  def _assign_region_shards(self, target: MultiLazyBuffer, bounds, x: Tensor) -> Tensor:
    """assign_region of a sharded tensor: each device's buffer gets its part of x in its part of the region."""
    if not isinstance(x.lazydata, MultiLazyBuffer) or x.device != target.device:
      raise ValueError(f"assign_region into a tensor on {target.device} of a value on {x.device}")
    axis = target.axis
    if axis is not None and bounds[axis] is not None and tuple(bounds[axis]) != (0, self.shape[axis]):
      raise ValueError(f"assign_region of a tensor split along axis {axis} (shape {self.shape}) must cover that axis "
                       f"whole, got bounds {bounds[axis]}")
    local_bounds = tuple(None if i == axis else b for i, b in enumerate(bounds))
    parts = x.cast(self.dtype).lazydata.to_axis(axis)
    written = [Tensor(shard, requires_grad=False).assign_region(local_bounds, Tensor(part, requires_grad=False))
               .lazydata for shard, part in zip(target.shards, parts.shards)]
    target.successor = MultiLazyBuffer(written, axis)
    self.lazydata, self._ctx = target.successor, None
    return self
  def _write(self, value: LazyBuffer) -> None:
    """Make `value` (this tensor's shape and dtype) the value of this tensor's storage. A view that aliases its base
    (reshape, permute, shrink, stride of it) writes the base's elements it covers, the base realized first if it is
    not; a realized base is written in place (an ASSIGN); the buffer of a computed value (its contiguous()) writes
    that value; anything else is a value of its own, replaced."""
    current = self.lazydata
    if (count := self.numel()) == 0 and isinstance(count, int): return   # nothing to write
    if isinstance(current, MultiLazyBuffer): return self._write_shards(current, value)
    copied = None   # the value whose contiguous() this tensor is the realized buffer of: it names the result too
    if current.origin is not None and current.origin[1] == "contiguous":   # the buffer of a value (its contiguous())
      if current.realized is not None: copied = current.origin[0]   # written in place, below
      else: current = current.origin[0]
    if copied is None and current.origin is not None:   # a view aliasing a storage: its elements under it are written
      root = view_root(current)
      if root.origin is not None:   # the buffer of a value (its contiguous()): that value is the storage
        storage = root.origin[0]
        if not storage.is_base:
          raise RuntimeError(f"can't write into a tensor of shape {self.shape}: a view of the contiguous() of a "
                             "view; write into that view, or realize the contiguous() first")
      elif root is not root.base:
        # a view of a value that is a copy in torch (a pad, a flip, a broadcast constant): that value gets a buffer
        storage = root.contiguous(alias=False)
        _realize(storage)
        root.successor = storage
        current = latest(current)
      else: storage = root
      if not is_writable_view(current):
        raise RuntimeError(f"can't write into a tensor of shape {self.shape} whose elements share memory (an "
                           "expanded view): make it contiguous() first")
      if storage.realized is None: _realize(storage)
      if value.base is storage: value = value.contiguous()   # a view of the target itself: copied out first
      storage.successor = storage.assign(value, current.st)
    elif current is current.base and current.realized is not None:
      # a rearranged view of the target itself must be copied out before it is written over
      current.successor = current.assign(value.contiguous() if value.base is current and value is not current
                                         else value)
      if copied is not None: copied.successor = current.successor
    else: current.successor = value
    self.lazydata = latest(self.lazydata)
  def _write_shards(self, current: MultiLazyBuffer, value: Any) -> None:
    """_write of a sharded tensor: each device's shard written with its part of `value` (on the same devices)."""
    if not isinstance(value, MultiLazyBuffer) or value.device != current.device:
      raise ValueError(f"write into a tensor on {current.device} of a value on {value.device}")
    written = []
    for shard, part in zip(current.shards, value.to_axis(current.axis).shards):
      one = Tensor(shard, requires_grad=False)
      one._write(part)
      written.append(one.lazydata)
    current.successor = MultiLazyBuffer(written, current.axis)
    self.lazydata = current.successor
  def _inplace(self, result: Tensor) -> Tensor:
    """`x += y` and friends: self, and every tensor sharing its storage, becomes the result; autograd sees the old
    value as its own node. Under no_grad (an update of a parameter, say) self keeps its requires_grad, as in torch."""
    origin = self.lazydata.origin
    if origin is not None and origin[1] != "contiguous":   # a view: the base's elements are written
      if result.requires_grad and Tensor.grad_enabled:
        raise RuntimeError(f"in-place op on a view (shape {self.shape}) of a tensor, with autograd on: tgrad does not "
                           "record it; compute out of place, or use Tensor.no_grad()")
      self._write(result.lazydata)
      self._ctx = None
      return self
    # self and the tensors sharing its value (with the value it is the contiguous() buffer of) now hold the result;
    # no buffer is written, so autograd records it as any op
    if origin is not None: origin[0].successor = result.lazydata
    self.lazydata.successor = self.lazydata = result.lazydata
    self._ctx = result._ctx
    if Tensor.grad_enabled: self.requires_grad = result.requires_grad
    return self
  def _snapshot(self) -> Tensor:
    if self.requires_grad and self._ctx is None and Tensor.grad_enabled:
      raise RuntimeError(f"in-place op on a leaf tensor that requires grad (shape {self.shape}); use Tensor.no_grad()")
    old = Tensor(self.lazydata, requires_grad=self.requires_grad)
    old._ctx, old._pinned = self._ctx, True
    return old

# ---------------------------------------------------------------------------------------------------------------
# helpers that build on Tensor

def _is_scalar_param_name(name: str) -> bool:
  return name.startswith(SCALAR_PARAM_PREFIX) and name[len(SCALAR_PARAM_PREFIX):].isdigit()

def _host_dtype(dtype: DType) -> np.dtype:
  return np.dtype(np.float32) if dtype == dtypes.bfloat16 else dtype.np

def _from_array(array: np.ndarray, dtype: DType, device: str) -> LazyBuffer:
  """Host data → a COPY leaf (the array is copied, so later changes to it don't leak in). bfloat16 arrives as
  float32 values and is rounded on the device by CAST."""
  if dtype == dtypes.bfloat16:
    return LazyBuffer.from_host(np.array(array, dtype=np.float32, order="C"), device).cast(dtypes.bfloat16)
  return LazyBuffer.from_host(np.array(array, dtype=dtype.np, order="C"), device)

# the mixins' bodies name `Tensor`: from here on it is this class (tgrad/tensor_ops/__init__.py)
bind_tensor_class(Tensor)
