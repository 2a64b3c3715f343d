"""Values a CPU thread would recompute for every output row, computed once per thread into a scratch array.

On a CPU a thread walks the kernel's output axes as loops (value_graph.axis_indices) with each reduce's loops inside
them. A value under a reduce that varies only along reduce axes — the vector of a matrix–vector product when it is an
expression: a norm's scaling of x, GELU(gate)·up, a residual sum — would be computed again in every iteration of the
output loops (gemma-3-270m's decode step spent most of its time on its MLP's GELU, recomputed for each of the 640 rows
of down). Instead:

  1. `varying_axes`: the axes each AST node varies along (a memory op: the axes its view moves on or masks by; a
     reduce: its source's, less its own axes);
  2. `ScratchValues.of`: the largest subexpressions that vary only along reduce axes and take at least
     SCRATCH_MIN_OPS operations, within SCRATCH_MAX_BYTES of scratch per thread (a stack array: DEFINE_LOCAL),
     past widening integer casts: an int8 activation is kept as int8, not as the int32 its products take;
  3. the value graph (value_graph.py) builds each at fresh loops over its axes (`precompute`: the scratch's STOREs,
     which the emitter places before the output loops) and reads it back wherever the reduce needs it (`read`: a
     LOAD at the position of its axes, the innermost contiguous, so an unrolled block reads a contiguous run).

Only for targets without thread blocks (on a GPU the output axes are thread ids, not loops), and only where an output
loop runs more than once. A value that varies along no axis at all (a norm's sum of squares) needs no scratch: the
emitter places it before the output loops (emit.py).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Iterator, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ELEMENTWISE, simplify
from tgrad.codegen.kernel import Kernel
from tgrad.shape.sint import to_uop
from tgrad.helpers import prod

SCRATCH_MIN_OPS = 3            # a subexpression of fewer operations costs about what reading it back does
SCRATCH_MAX_BYTES = 64 * 1024  # per thread, on its stack: twice a Zen 3 core's L1 data cache, well inside L2
SCRATCH_LOOP_ARG = 100_000     # RANGE arg of group g's precompute loop over axis a: SCRATCH_LOOP_ARG·(g+1) + a
SCRATCH_EXACT_FLOAT_SOURCE_BYTES = 2   # an int of at most 16 bits converts to float32 exactly: kept as the int

def varying_axes(kernel: Kernel) -> dict[UOp, frozenset[int]]:
  """Per AST node the kernel axes its value varies along. Every reduce of a kernel reduces all of its reduce axes (the
  REDUCE_AXIS args number the AST's axes, not the kernel's after opts)."""
  view_of = dict(zip(kernel.memops, kernel.sts))
  reduce_axes = {a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)}
  out: dict[UOp, frozenset[int]] = {}
  for u in kernel.ast.toposort():
    axes = frozenset().union(*(out[s] for s in u.src if s in out))
    if u in view_of: axes |= {a for a, stride in enumerate(view_of[u].real_strides()) if stride != 0}
    if u.op is Ops.REDUCE_AXIS: axes -= reduce_axes
    out[u] = frozenset(axes)
  return out

def _reads_memory(node: UOp) -> bool:
  """Whether node's expression loads from a buffer. One that doesn't (constants and aranges: a bit field's shift
  along an unrolled axis) folds to literals where its axes are unrolled, and costs a few integer ops where not."""
  return any(u.op is Ops.LOAD for u in node.toposort())

def _narrowest(node: UOp, only_reduce: Callable[[UOp], bool]) -> UOp:
  """The value to keep in scratch for node: past widening integer casts, whose source is narrower to store and is
  widened again after each read (an int8 activation kept as int8, not as the int32 its products take)."""
  while node.op is Ops.CAST and node.src[0].dtype.is_int and not node.src[0].dtype.is_bool and \
      node.dtype.itemsize > node.src[0].dtype.itemsize and only_reduce(node.src[0]) and \
      (node.dtype.is_int or node.src[0].dtype.itemsize <= SCRATCH_EXACT_FLOAT_SOURCE_BYTES):
    node = node.src[0]
  return node

def _operations(node: UOp) -> int:
  """Elementwise operations in node's expression (not counting those inside a reduce, whose loop runs once anyway)."""
  count, seen, stack = 0, set(), [node]
  while stack:
    u = stack.pop()
    if u in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE_AXIS: continue
    if u.op in ELEMENTWISE: count += 1
    stack.extend(u.src)
  return count

@dataclass(frozen=True)
class ScratchSlot:
  """Where one subexpression lives: its array, the axes it varies along, and each axis's element stride there."""
  buffer: UOp
  axes: tuple[int, ...]
  strides: tuple[int, ...]
  def index(self, idxs: tuple[UOp, ...]) -> UOp:
    position = to_uop(0)
    for axis, stride in zip(self.axes, self.strides): position = position + idxs[axis] * stride
    return simplify(position)

class ScratchValues:
  """The kernel's subexpressions computed into scratch arrays (`slots`) and read back from them."""
  def __init__(self, kernel: Kernel, slots: dict[UOp, ScratchSlot]):
    self.kernel, self.slots = kernel, slots
    self.reading = True   # False while the precompute builds the values themselves

  @staticmethod
  def of(kernel: Kernel, indices: list[Optional[UOp]], ids: Iterator[int]) -> Optional[ScratchValues]:
    """The scratch values of a kernel (None when there are none): its output loops must run more than once."""
    if kernel.renderer.has_local or kernel.row_store or not kernel.reduceops: return None
    loops = [i for a, i in enumerate(indices) if not kernel.is_reduce_axis(a) and i is not None and i.op is Ops.RANGE]
    if not loops or any(not isinstance(i.src[1].arg, int) for i in loops) or prod(i.src[1].arg for i in loops) < 2:
      return None
    reduce_axes = {a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)}
    if any(not isinstance(kernel.full_shape[a], int) for a in reduce_axes): return None
    axes_of = varying_axes(kernel)
    def only_reduce(u: UOp) -> bool:
      return bool(axes_of[u]) and axes_of[u] <= reduce_axes and u.op in ELEMENTWISE and u.dtype not in \
        (dtypes.index, dtypes.bool)
    users: dict[UOp, list[UOp]] = {}
    for u in kernel.ast.toposort():
      for s in u.src: users.setdefault(s, []).append(u)
    chosen = list(dict.fromkeys(_narrowest(u, only_reduce) for u in kernel.ast.toposort()
                                if only_reduce(u) and _operations(u) >= SCRATCH_MIN_OPS and _reads_memory(u) and
                                any(p.op is not Ops.STORE and axes_of[p] - reduce_axes for p in users.get(u, ()))))
    slots: dict[UOp, ScratchSlot] = {}
    budget = SCRATCH_MAX_BYTES
    for u in chosen:
      axes = tuple(sorted(axes_of[u]))
      sizes = [kernel.full_shape[a] for a in axes]
      if (nbytes := prod(sizes) * u.dtype.itemsize) > budget: continue
      budget -= nbytes
      strides = tuple(prod(sizes[i + 1:]) for i in range(len(sizes)))
      buffer = UOp(Ops.DEFINE_LOCAL, u.dtype, (), (f"scratch{next(ids)}", prod(sizes)))
      slots[u] = ScratchSlot(buffer, axes, strides)
    return ScratchValues(kernel, slots) if slots else None

  def read(self, node: UOp, idxs: tuple[UOp, ...]) -> Optional[UOp]:
    """node's value at idxs read back from its scratch (None if it has none, or while the precompute builds)."""
    if not self.reading or (slot := self.slots.get(node)) is None: return None
    return UOp(Ops.LOAD, node.dtype, (slot.buffer, slot.index(idxs)))

  def precompute(self, build: Callable[[UOp, tuple[UOp, ...]], UOp]) -> tuple[tuple[tuple[UOp, ...], tuple[UOp, ...]],
                                                                                ...]:
    """Per set of axes: (its loops, the STOREs of every value varying along them at each position of those loops),
    built by `build` (the value graph's ValueBuilder.build) at the loops and at 0 on every other axis."""
    groups: dict[tuple[int, ...], list[UOp]] = {}
    for node, slot in self.slots.items(): groups.setdefault(slot.axes, []).append(node)
    self.reading = False
    nests = []
    for g, (axes, nodes) in enumerate(groups.items()):
      loops = {a: UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(self.kernel.full_shape[a])),
                      SCRATCH_LOOP_ARG * (g + 1) + a) for a in axes}
      idxs = tuple(loops.get(a, to_uop(0)) for a in range(self.kernel.shape_len))
      stores = tuple(UOp(Ops.STORE, dtypes.void, (self.slots[n].buffer, self.slots[n].index(idxs), build(n, idxs)))
                     for n in nodes)
      nests.append((tuple(loops[a] for a in axes), stores))
    self.reading = True
    return tuple(nests)
