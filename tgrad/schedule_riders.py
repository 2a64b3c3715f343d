"""Schedule rule 5, riders: a small kernel that nothing orders between it and a neighbouring kernel runs inside that
kernel (one launch fewer), its loops laid into the bigger kernel's loops.

Input: the scheduled steps (kernel ASTs over LazyBuffers, in run order) from tgrad/schedule.py. A kernel is a rider
of a host when
  - both have concrete loop sizes, one set of reduce axes for all their reduces, no reduce reading another, no
    store spanning the reduce axes (no row store) and no gather load (`_Loops.of`);
  - the rider's outputs and reduce sizes fit the host's (flattened to [outputs, reduce] they are no bigger) and
    padding them to the host's costs at most MAX_RIDER_PADDING times the rider's own loop count;
  - no step from the rider to the host (the host included) reads or writes a storage the rider writes, or writes one
    it reads: moving the rider to the host's place changes no value anyone sees;
  - both run on one device, and no step where devices meet (a collective, a copy between devices) lies between them.
Hosts are searched forward from the rider first (nearest first), then backward; a merged kernel can itself ride on.
The rider's memory ops read through its own views composed with a pad to the host's loops: outside its region loads
are masked, its reduces add their identity there (a masked WHERE) and its stores are masked, so each output is
computed exactly as alone. Its DEFINE_GLOBALs, and the host's inputs, are renumbered: outputs first (the host's,
then the rider's), then inputs; its lifted scalars follow the host's.
`Context.RIDERS=0` switches the rule off.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
from tgrad.dtype import dtypes
from tgrad.helpers import Context, prod
from tgrad.lazy import LazyBuffer
from tgrad.ops import UOp, Ops, is_gather_load, identity_of_reduce
from tgrad.scalars import SCALAR_PARAM_PREFIX, is_scalar_param, scalar_param
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import is_symbolic

# A rider padded to its host's loops runs the host's loop count: at most this many times its own.
MAX_RIDER_PADDING = 2
# A merged kernel takes at most this many buffers (each a kernel parameter).
MAX_RIDER_BUFFERS = 64

@dataclass(frozen=True)
class _Loops:
  """A kernel's loops: `full` the size of each axis, `axes` its reduce axes."""
  full: tuple[int, ...]
  axes: tuple[int, ...]
  @property
  def out_axes(self) -> list[int]: return [i for i in range(len(self.full)) if i not in self.axes]
  @property
  def outputs(self) -> int: return prod(self.full[i] for i in self.out_axes)
  @property
  def reduced(self) -> int: return prod(self.full[i] for i in self.axes)
  @property
  def reduced_shape(self) -> tuple[int, ...]: return tuple(1 if i in self.axes else s for i, s in enumerate(self.full))

  @staticmethod
  def of(ast: UOp) -> Optional[_Loops]:
    """The loops of a kernel AST that can be a rider or a host, else None."""
    nodes = ast.toposort()
    if any(u.op is Ops.LOAD and is_gather_load(u) for u in nodes): return None
    shapes = [u.arg.shape for u in nodes if u.op is Ops.VIEW]
    if not shapes or any(is_symbolic(s) for s in shapes) or len({len(s) for s in shapes}) != 1: return None
    full = tuple(max(s[i] for s in shapes) for i in range(len(shapes[0])))
    reduces = [u for u in nodes if u.op is Ops.REDUCE_AXIS]
    axes = tuple(reduces[0].arg[1]) if reduces else ()
    if any(tuple(r.arg[1]) != axes for r in reduces): return None
    if any(u.op is Ops.REDUCE_AXIS for r in reduces for u in r.src[0].toposort()): return None   # nested reduces
    loops = _Loops(full, axes)
    if any(s not in (full, loops.reduced_shape) for s in shapes): return None
    if any(u.op is Ops.STORE and u.src[1].arg.shape != loops.reduced_shape for u in nodes): return None   # row store
    return loops

  def embedded(self, st: ShapeTracker, host: _Loops) -> ShapeTracker:
    """`st` (over these loops, or their reduced shape) read inside `host`'s loops: these loops flattened to
    [outputs, reduce], padded to the host's, reshaped to the host's (output axes first) and permuted into place."""
    in_loop = bool(self.axes) and st.shape == self.full
    mine = self.out_axes + list(self.axes)
    flat = st.permute(mine).reshape((self.outputs, self.reduced if in_loop else 1))
    theirs = host.out_axes + list(host.axes)
    if in_loop:
      flat = flat.pad(((0, host.outputs - self.outputs), (0, host.reduced - self.reduced)))
      shape = tuple(host.full[i] for i in theirs)
    else:
      flat = flat.pad(((0, host.outputs - self.outputs), (0, 0)))
      shape = tuple(host.reduced_shape[i] for i in theirs)
    inverse = [theirs.index(i) for i in range(len(theirs))]
    return flat.reshape(shape).permute(inverse)

def _fits(rider: _Loops, host: _Loops) -> bool:
  if rider.outputs > host.outputs or rider.reduced > host.reduced: return False
  if rider.axes and not host.axes: return False
  own = rider.outputs * rider.reduced
  padded = host.outputs * host.reduced if rider.axes else host.outputs
  return padded <= MAX_RIDER_PADDING * own

def _storage(lb: LazyBuffer) -> int:
  """The storage a base names: its Buffer when it has one; an ASSIGN writes its target's."""
  while lb.buffer is None and lb.op is Ops.ASSIGN: lb = lb.srcs[0].base
  return id(lb.buffer) if lb.buffer is not None else id(lb)

def _rewrite(ast: UOp, globals_to: dict[int, int], view: Callable[[ShapeTracker], ShapeTracker],
             reduce_axes: Optional[tuple[int, ...]], valid: Optional[ShapeTracker], scalar_shift: int) -> UOp:
  """`ast` with DEFINE_GLOBAL i numbered globals_to[i], every VIEW through `view`, every scalar parameter k numbered
  k + scalar_shift, and (when `reduce_axes` is given) every reduce over those axes, reading its identity outside
  `valid`."""
  new: dict[UOp, UOp] = {}
  for u in ast.toposort():
    src = tuple(new[s] for s in u.src)
    arg = u.arg
    if u.op is Ops.DEFINE_GLOBAL: arg = globals_to[u.arg]
    elif u.op is Ops.VIEW: arg = view(u.arg)
    elif u.op is Ops.CONST and isinstance(arg, UOp) and is_scalar_param(arg) and scalar_shift:
      index = int(arg.arg[0][len(SCALAR_PARAM_PREFIX):])
      arg = scalar_param(index + scalar_shift, u.dtype)
    elif u.op is Ops.REDUCE_AXIS and reduce_axes is not None:
      assert valid is not None
      inside = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, dtypes.void, (), valid),), True)
      identity = UOp.const(src[0].dtype, identity_of_reduce(arg[0], u.dtype))
      src = (UOp(Ops.WHERE, src[0].dtype, (inside, src[0], identity)),)
      arg = (arg[0], reduce_axes) + tuple(arg[2:])
    new[u] = u if arg is u.arg and all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, arg)
  return new[ast]

def _merge(host, rider, host_loops: _Loops, rider_loops: _Loops, scalars_of: dict, make: Callable, max_scalars: int):
  """The host's step with the rider's stores added (see the module doc), or None when too many buffers or scalars."""
  inputs = list(host.inputs)
  for b in rider.inputs:
    if not any(b is x for x in inputs): inputs.append(b)
  outputs = host.outputs + rider.outputs
  if len(outputs) + len(inputs) > MAX_RIDER_BUFFERS: return None
  host_scalars, rider_scalars = scalars_of.get(host.outputs[0], []), scalars_of.get(rider.outputs[0], [])
  if len(host_scalars) + len(rider_scalars) > max_scalars: return None
  def index_of(b: LazyBuffer) -> int: return len(outputs) + next(i for i, x in enumerate(inputs) if x is b)
  host_globals = {i: i for i in range(len(host.outputs))}
  host_globals.update({len(host.outputs) + k: index_of(b) for k, b in enumerate(host.inputs)})
  rider_globals = {k: len(host.outputs) + k for k in range(len(rider.outputs))}
  rider_globals.update({len(rider.outputs) + k: index_of(b) for k, b in enumerate(rider.inputs)})
  host_ast = _rewrite(host.ast, host_globals, lambda st: st, None, None, 0)
  valid = rider_loops.embedded(ShapeTracker.from_shape(rider_loops.full), host_loops)
  rider_ast = _rewrite(rider.ast, rider_globals, lambda st: rider_loops.embedded(st, host_loops),
                       host_loops.axes if rider_loops.axes else None, valid, len(host_scalars))
  merged = make(UOp(Ops.SINK, dtypes.void, host_ast.src + rider_ast.src), outputs, tuple(inputs))
  scalars_of[outputs[0]] = list(host_scalars) + list(rider_scalars)
  return merged

def _device(step) -> str: return step.outputs[0].device

def _meeting_point(step) -> bool:
  """A step where devices meet (a collective, a copy between devices): a kernel moved across one would change what a
  device has done when the others reach it."""
  return step.ast.op is Ops.COLLECTIVE or len({b.device for b in step.outputs + step.inputs}) > 1

def ride_along(steps: Sequence, scalars_of: dict, make: Callable, max_scalars: int) -> list:
  """Rule 5 over `steps` (objects with .ast, .outputs, .inputs; `make(ast, outputs, inputs)` builds one): each rider
  merged into its host, in place of the host. `scalars_of` (first output → lifted scalars) is updated for merged
  kernels, which take at most `max_scalars` of them."""
  steps = list(steps)
  if not Context.RIDERS: return steps
  i = 0
  while i < len(steps):
    rider = steps[i]
    loops = _Loops.of(rider.ast) if rider.ast.op is Ops.SINK else None
    merged_at = None
    if loops is not None:
      writes = {_storage(b) for b in rider.outputs}
      reads = {_storage(b) for b in rider.inputs}
      for direction in (1, -1):
        j = i + direction
        while 0 <= j < len(steps) and merged_at is None:
          other = steps[j]
          if _meeting_point(other): break
          touched = {_storage(b) for b in other.outputs + other.inputs}
          if touched & writes or {_storage(b) for b in other.outputs} & reads: break
          host_loops = _Loops.of(other.ast) if _device(other) == _device(rider) else None
          if host_loops is not None and _fits(loops, host_loops) and \
             (merged := _merge(other, rider, host_loops, loops, scalars_of, make, max_scalars)) is not None:
            steps[j], merged_at = merged, j
          j += direction
        if merged_at is not None: break
    if merged_at is None: i += 1
    else: del steps[i]   # a forward host is now at index i or later and is visited as a rider in its turn
    # (a backward host stays before i: the next rider is at i)
  return steps
