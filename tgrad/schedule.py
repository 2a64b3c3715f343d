"""The scheduler: cuts a lazy graph into kernels. Input: the LazyBuffers to realize. Output: ScheduleItems.
First the graph is simplified (graph_simplify.py: constants folded, identities such as x·1 removed); then the
fusion rules, which all live here:
  1. Elementwise ops never get a kernel of their own: they are inlined into every kernel that reads them (through
     any view, padding included), so chains, reshapes, permutes and pads between elementwise ops cost nothing.
     An elementwise value read by several kernels is recomputed in each only while it is small (at most
     MAX_RECOMPUTE_BUFFERS inputs and MAX_RECOMPUTE_OPS ops, a gather counting as one op and its table as an input:
     softmax's exp(x - max), an embedding lookup times a constant); a bigger one is
     realized once, which also stops a residual stream from growing into every later kernel. Such a value that,
     once the values above it are decided, only one kernel reads (a packed embedding row's block scales, read only by
     the row's dequantization, itself realized) is inlined into that kernel again (`_inline_values_read_once`).
  1b. A gather (GATHER: a data-dependent load) is inlined like an elementwise op, through any view, into every
     kernel that reads it (`emb[ids] * scale` is one kernel); its index is built like any value (fused elementwise ops);
     its table is always realized, since the kernel addresses the table's memory with the loaded index.
  2. A reduce fuses with the elementwise ops that feed it, and with the elementwise consumers of its result when
     they read it through a plain reshape (same element order, same size); several reduces over the same input
     shape and axes share a kernel.
  2b. Row kernels (softmax, log_softmax, layernorm, rmsnorm, var, logsumexp): a reduce over rows of at most
     MAX_ROW_FUSION_SIZE elements, the elementwise ops that read its result broadcast back over the row, further
     reduces over the same rows of those, and the final elementwise value are one kernel, when all of that has one
     output (`_plan_row_kernels`). The kernel reduces each row once per reduce and then stores the row.
  2c. Several outputs: a realized copy of a run of a row kernel's value (`CONTIGUOUS` of a view that reads the
     value's elements [offset, offset + n) in order, e.g. one copy of a vector that every row of a matrix-vector
     kernel recomputes) is stored by that kernel as a second output, a store masked to the run
     (`_slice_store_tracker`), instead of a kernel of its own that would compute the value again. The kernel's
     first output stays DEFINE_GLOBAL 0; the copies follow it. A copy whose buffer the kernel would also read (a
     cycle) keeps its own kernel.
  2d. A custom kernel that also writes a realized buffer in place (an ASSIGN with arg IN_PLACE, made by
     `LazyBuffer.written_by`: a KV-cache append inside a decode attention kernel) has that ASSIGN as a second output
     of its step, with no kernel of its own; readers of the old data are ordered before that step as before any
     ASSIGN.
  3. Everything else is realized (gets a buffer): kernel outputs, reduces read through an expand/permute/pad or
     by a second reduce (outside row kernels), COPY/EMPTY/CONTIGUOUS/ASSIGN/CUSTOM/COLLECTIVE results (and the
     sources of a COPY, CUSTOM or COLLECTIVE: their runners read whole buffers), elementwise values read
     through a stack of more than MAX_INLINED_VIEWS views, and every realized input.
  4. A collective (COLLECTIVE: one node per output device, siblings sharing a CollectiveGroup) is one step over
     every device's buffers: its outputs are the siblings in order, its inputs the sources they read (one per device;
     a broadcast's one, on its root). Asking for one sibling realizes all of them (`with_collective_siblings`); a
     sibling no one holds any more gets a scratch output on its device. Each collective comes right after the steps
     it needs, before any other (`_collectives_after_their_inputs`: no device runs work the rendezvous does not need
     while the others wait there).
  5. Riders (tgrad/schedule_riders.py): once the kernels are built and ordered, a small kernel that nothing orders
     between it and a neighbouring kernel runs inside that kernel, its loops padded to the host's (RIDERS=0: off).
A ScheduleItem holds a kernel AST (a SINK of STOREs over LOADs, CONSTs, ARANGEs, ALU and REDUCE_AXIS nodes, each
memory op carrying a VIEW with its ShapeTracker as its last source; a gather LOAD also has its index value) and the
device Buffers it touches: outputs first, then inputs.
Every realized base gets a Buffer (allocated on first use; an ASSIGN writes its target's), so lowering and running
never see a LazyBuffer. With `commit=True` (what realize does) the bases keep those Buffers and forget their sources;
without, scheduling changes nothing and can be repeated (for inspecting kernels).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generator, Mapping, Optional, Sequence
import numpy as np
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ELEMENTWISE, CollectiveGroup, GatherAxis, identity_of_reduce, symbolic_in_use
from tgrad.shape.sint import unbind, vmax_of
from tgrad.lazy import IN_PLACE, LazyBuffer, holders_of, unrealized_bases, walk
from tgrad.graph_simplify import simplify_graph, commit_replacements
from tgrad.scalars import param_bits, param_name, scalar_param
from tgrad.device import Buffer
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.view import View
from tgrad.helpers import gc_paused, prod, run_nested
from tgrad.schedule_riders import ride_along

NO_VARIABLES: Mapping[str, int] = MappingProxyType({})   # the var_vals of every kernel without variables (shared)
REALIZED_OPS = {Ops.COPY, Ops.EMPTY, Ops.CONTIGUOUS, Ops.ASSIGN, Ops.CUSTOM, Ops.COLLECTIVE}
NOT_KERNELS = (Ops.COPY, Ops.EMPTY, Ops.CUSTOM, Ops.COLLECTIVE)   # realized values whose step is not a kernel AST
WHOLE_SOURCE_OPS = (Ops.COPY, Ops.CUSTOM, Ops.COLLECTIVE)   # their runners read each source's whole buffer
MAX_RECOMPUTE_BUFFERS = 2   # a shared elementwise value reading more buffers than this is realized
MAX_RECOMPUTE_OPS = 8       # ... or computing more ops than this
# An elementwise value read through a stack of more views than this (movement ops that don't merge into one View,
# e.g. a reshape of a transpose) is realized. Composing a stack costs time cubic in its length, and every level of
# a deep chain of such movements adds one: inlined without a limit, 120 alternating reshape/permute/pad ops took
# 27 s to schedule. The test suite's deepest inlined stack has 4 views.
MAX_INLINED_VIEWS = 4
# Row kernels (rule 2b) re-read each row once per reduce and once more for the store: a row of up to this many
# elements (32 KiB of float32) stays in a CPU core's L1/L2 and in a GPU block's L1 between the passes, so the passes
# after the first cost no DRAM traffic. Longer rows keep one kernel per reduce.
MAX_ROW_FUSION_SIZE = 8192
# A kernel takes at most this many lifted Python scalars as parameters (tgrad/scalars.py); the rest stay literals. A
# chain of 50,000 `x * c + d` ops in one kernel would otherwise pass 100,000 arguments (and the schedule cache keys a
# graph with more lifted constants than this by their values, so a literal is never replayed for another value).
MAX_SCALAR_PARAMS = 64

@dataclass(frozen=True)
class ScheduleItem:
  """One step: a kernel (`ast.op is SINK`), a copy (`ast.op is COPY`: from `host_data` when that is set, else from
  bufs[1]), a custom kernel (`ast.op is CUSTOM`, its CustomKernel in `ast.arg`: bufs[0] from bufs[1:]), a collective
  over several devices (`ast.op is COLLECTIVE`, its CollectiveSpec in `ast.arg`: one output per device in rank order,
  then one input per device) or an allocation (`ast.op is EMPTY`). DEFINE_GLOBAL i in a kernel AST is bufs[i];
  outputs come first."""
  ast: UOp
  bufs: tuple[Buffer, ...]
  output_count: int = 1
  host_data: Optional[np.ndarray] = field(default=None, compare=False)
  var_vals: Mapping[str, int] = field(default_factory=lambda: NO_VARIABLES, compare=False)   # the AST's variables'
  @property
  def outputs(self) -> tuple[Buffer, ...]: return self.bufs[:self.output_count]
  @property
  def inputs(self) -> tuple[Buffer, ...]: return self.bufs[self.output_count:]

@dataclass(frozen=True)
class _Step:
  """A ScheduleItem before its Buffers are assigned: the same step over base LazyBuffers."""
  ast: UOp
  outputs: tuple[LazyBuffer, ...]
  inputs: tuple[LazyBuffer, ...]

class _Refuse(Exception):
  """Raised while building a kernel when a reduce can't be fused: the reduce gets realized and the build retried."""
  def __init__(self, base: LazyBuffer): self.base = base

class _Reshape(Exception):
  """Raised when the kernel must index in the shape of a fused reduce's output rather than its own."""
  def __init__(self, shape: tuple[int, ...]): self.shape = shape

class _Unstorable(Exception):
  """Raised while building a kernel when a copy of rule 2c can't be one of its outputs: the copy gets its own kernel."""
  def __init__(self, copy: LazyBuffer): self.copy = copy

class _KernelBuilder:
  """Builds one kernel's AST for `output`, reading realized bases (and bases in `realize_set`) as LOADs."""
  def __init__(self, output: LazyBuffer, realize_set: set[LazyBuffer], kernel_shape: tuple[int, ...],
               row_reduces: frozenset[LazyBuffer] = frozenset(), copies: Sequence[LazyBuffer] = ()):
    self.output, self.realize_set, self.kernel_shape = output, realize_set, kernel_shape
    self.copies = tuple(copies)   # rule 2c: the further outputs, DEFINE_GLOBAL 1.. in this order
    self.row_reduces = row_reduces   # reduces that may be read broadcast over their rows (rule 2b)
    self.inputs: list[LazyBuffer] = []
    self.reduce_signature: Optional[tuple] = None   # (input shape, axes) of the fused reduce(s)
    self.memo: dict[tuple[LazyBuffer, ShapeTracker], UOp] = {}
    self.scalars: list[LazyBuffer] = []   # the lifted constants read, in the order of their kernel parameters

  def global_for(self, base: LazyBuffer) -> UOp:
    assign_target = self.output.srcs[0].base if self.output.op is Ops.ASSIGN else None
    if base is self.output.base or base is assign_target: index = 0
    elif base in self.copies: index = 1 + self.copies.index(base)
    else:
      if base not in self.inputs: self.inputs.append(base)
      index = 1 + len(self.copies) + self.inputs.index(base)
    return UOp(Ops.DEFINE_GLOBAL, base.dtype, (), index)

  def build(self, lb: LazyBuffer, st: ShapeTracker, in_reduce: bool) -> UOp:
    """The AST of `lb` read through `st`. A walk of any depth: `_build` recurses through `run_nested`'s stack."""
    return run_nested(self._build(lb, st, in_reduce))

  def _build(self, lb: LazyBuffer, st: ShapeTracker, in_reduce: bool) -> Generator[Generator, UOp, UOp]:
    if not lb.is_base:
      composed = lb.st + st
      if len(composed.views) > MAX_INLINED_VIEWS and (lb.base.op in ELEMENTWISE or lb.base.op is Ops.GATHER) and \
         lb.base.buffer is None and lb.base not in self.realize_set:
        raise _Refuse(lb.base)   # rule 3: stacked views that don't merge grow with every level inlined
      value = yield self._build(lb.base, composed, in_reduce)
      if lb.base.op in ELEMENTWISE and any(v.mask is not None for v in lb.st.views):
        # padding of a computed value reads 0, whatever the computation gives there (exp(0) is not 0)
        valid = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, dtypes.void, (), composed),), True)
        value = UOp(Ops.WHERE, value.dtype, (valid, value, UOp.const(value.dtype, 0)))
      return value
    key = (lb, st)
    if key in self.memo: return self.memo[key]
    view = UOp(Ops.VIEW, dtypes.void, (), st)
    if lb.buffer is not None or (lb in self.realize_set and lb is not self.output):
      if lb in self.copies: raise _Unstorable(lb)   # rule 2c: a kernel never reads what it stores as a copy
      out = UOp(Ops.LOAD, lb.dtype, (self.global_for(lb), view))
    elif lb.op is Ops.CONST: out = UOp(Ops.CONST, lb.dtype, (view,), self.scalar_param(lb) if lb.lifted else lb.arg)
    elif lb.op is Ops.ARANGE: out = UOp(Ops.ARANGE, lb.dtype, (view,))
    elif lb.op in ELEMENTWISE:
      srcs = []
      for s in lb.srcs: srcs.append((yield self._build(s, st, in_reduce)))
      out = UOp(lb.op, lb.dtype, tuple(srcs), lb.arg)   # arg: an EXP2/LOG2/TANH lowering, None for every other op
    elif lb.op is Ops.REDUCE_AXIS: out = yield from self._build_reduce(lb, st, in_reduce)
    elif lb.op is Ops.GATHER: out = yield from self._build_gather(lb, st, in_reduce)
    elif lb.op in (Ops.CONTIGUOUS, Ops.ASSIGN) and lb is self.output:
      out = yield self._build(lb.srcs[-1], st, in_reduce)
    else: raise _Refuse(lb)   # a COPY/EMPTY/... that is not realized yet: realize it first
    self.memo[key] = out
    return out

  def scalar_param(self, lb: LazyBuffer) -> UOp:
    """The kernel parameter standing for a lifted constant (tgrad/scalars.py), numbered by first use: the same
    structure gives the same parameters whatever the values."""
    if lb not in self.scalars:
      if len(self.scalars) >= MAX_SCALAR_PARAMS: return lb.arg   # past the cap: a literal (schedule_cache keys it)
      self.scalars.append(lb)
    return scalar_param(self.scalars.index(lb), lb.dtype)

  def _build_reduce(self, lb: LazyBuffer, st: ShapeTracker, in_reduce: bool) -> Generator[Generator, UOp, UOp]:
    source = lb.srcs[0]
    op, axes = lb.arg[:2]
    signature = (source.shape, axes)
    plain = st.contiguous and st.size == prod(lb.shape)
    # a row reduce read broadcast over its rows: by the row phase (the store) or by a later reduce over the same rows
    row_read = lb in self.row_reduces and is_row_broadcast(st, lb.shape, source.shape)
    if (in_reduce or not plain) and not row_read or (self.reduce_signature not in (None, signature)): raise _Refuse(lb)
    if st.shape != lb.shape and not row_read:
      if self.reduce_signature is None: raise _Reshape(lb.shape)
      raise _Refuse(lb)
    self.reduce_signature = signature
    if prod(source.shape) == 0: return UOp(Ops.CONST, lb.dtype, (UOp(Ops.VIEW, dtypes.void, (), st),),
                                           identity_of_reduce(op, lb.dtype))
    inner = yield self._build(source, ShapeTracker.from_shape(source.shape), in_reduce=True)
    return UOp(Ops.REDUCE_AXIS, lb.dtype, (inner,), lb.arg)   # (op, axes[, of partial sums])

  def _build_gather(self, lb: LazyBuffer, st: ShapeTracker, in_reduce: bool) -> Generator[Generator, UOp, UOp]:
    """Rule 1b: a LOAD of the realized table through its own view at row 0 of the gathered axis (composed with `st`),
    plus the index value (built through `st` like any value) times the table's stride along the axis."""
    table, index = lb.srcs
    axis = lb.arg
    if table.base.buffer is None and table.base not in self.realize_set: raise _Refuse(table.base)
    first_row = tuple((0, 1) if d == axis else (0, size) for d, size in enumerate(table.shape))
    row_view = table.st.shrink(first_row).expand(lb.shape) + st
    value = yield self._build(index, st, in_reduce)
    gathered = GatherAxis(table.shape[axis], table.st.real_strides()[axis])
    return UOp(Ops.LOAD, lb.dtype, (self.global_for(table.base), value, UOp(Ops.VIEW, dtypes.void, (), row_view)),
               gathered)

def is_row_broadcast(st: ShapeTracker, reduced_shape: tuple[int, ...], row_shape: tuple[int, ...]) -> bool:
  """Whether `st` reads a reduce's result (of `reduced_shape`) at every position of its rows (`row_shape`): the
  result expanded over the reduced axes, nothing else."""
  return st.shape == row_shape and st.views == ShapeTracker.from_shape(reduced_shape).expand(row_shape).views

def _kernel_ast(output: LazyBuffer, realize_set: set[LazyBuffer], row_reduces: frozenset[LazyBuffer] = frozenset(),
                scalars: Optional[list[LazyBuffer]] = None, copies: Sequence[tuple[LazyBuffer, LazyBuffer]] = ()
                ) -> tuple[UOp, list[LazyBuffer], set[LazyBuffer]]:
  """The kernel AST for `output`, its input bases, and every base it inlined (`scalars`, when given, receives the
  lifted constants behind its scalar parameters, in parameter order). An ASSIGN into a region (its arg: a view of the
  target) runs over the value's shape and stores through the region; any other kernel stores in order. `copies`:
  (copy, value) pairs of rule 2c, each stored after the output (raises _Unstorable for a value that doesn't span the
  kernel's loops)."""
  region: Optional[ShapeTracker] = output.arg if output.op is Ops.ASSIGN else None
  value_shape = output.shape if region is None else region.shape
  kernel_shape = value_shape
  while True:
    builder = _KernelBuilder(output, realize_set, kernel_shape, row_reduces, [copy for copy, _ in copies])
    value_st = ShapeTracker.from_shape(value_shape).reshape(kernel_shape)
    store_st = value_st if region is None else region.reshape(kernel_shape)
    try:
      value = builder.build(output, value_st, in_reduce=False)
    except _Reshape as r:
      kernel_shape = r.shape
      continue
    if output.op is Ops.ASSIGN: _check_assign_hazard(output, value, realize_set)
    target = builder.global_for(output)
    stores = [UOp(Ops.STORE, dtypes.void, (target, UOp(Ops.VIEW, dtypes.void, (), store_st), value))]
    loops = builder.reduce_signature[0] if builder.reduce_signature is not None else kernel_shape
    for copy, source in copies:   # rule 2c: the value at every position of the kernel's loops, stored where copied
      if source.shape != loops: raise _Unstorable(copy)
      copied = builder.build(source, ShapeTracker.from_shape(loops), in_reduce=False)
      tracker = _slice_store_tracker(copy.srcs[0], source)
      assert tracker is not None
      stores.append(UOp(Ops.STORE, dtypes.void, (builder.global_for(copy), UOp(Ops.VIEW, dtypes.void, (), tracker),
                                                  copied)))
    if scalars is not None: scalars[:] = builder.scalars
    return UOp(Ops.SINK, dtypes.void, tuple(stores)), builder.inputs, {lb for lb, _ in builder.memo}

def _slice_store_tracker(view: LazyBuffer, source: LazyBuffer) -> Optional[ShapeTracker]:
  """Rule 2c: when `view` reads `source` (a base of known shape) as the run of its elements [offset, offset + n) in
  order, the tracker over source's shape that stores each element of the run at its place in the copy (masked to the
  run); else None."""
  if view.is_base or len(view.st.views) != 1 or view.st.symbolic or not all(isinstance(d, int) for d in source.shape):
    return None
  only = view.st.views[0]
  if only.mask is not None or not isinstance(only.offset, int) or only != View.create(only.shape, None, only.offset):
    return None
  run, total = prod(only.shape), prod(source.shape)
  if only.offset < 0 or only.offset + run > total: return None
  return ShapeTracker.from_shape((run,)).pad(((only.offset, total - only.offset - run),)).reshape(source.shape)

def _check_assign_hazard(output: LazyBuffer, value: UOp, realize_set: set[LazyBuffer]) -> None:
  """An assign whose value reads the target through another view must compute the value into its own buffer."""
  target_index = 0
  for u in value.toposort():
    if u.op is Ops.LOAD and u.src[0].arg == target_index and not u.src[-1].arg.contiguous:
      value = output.srcs[1].base
      if value.buffer is not None or value is output.srcs[0].base:
        raise RuntimeError(f"assign into {output.shape} reads its own target through another view: "
                           "make the value contiguous first (Tensor.assign does)")
      raise _Refuse(value)

def _inlined_region(root: LazyBuffer, realize_set: set[LazyBuffer]) -> list[LazyBuffer]:
  """The unrealized bases a kernel for `root` would inline (stopping at realized values and at `realize_set`)."""
  return list(walk(root.srcs, views=False, realized=False, stop=realize_set.__contains__))

def _is_small(lb: LazyBuffer, realize_set: set[LazyBuffer]) -> bool:
  inputs, ops = set(), 1
  for b in _inlined_region(lb, realize_set):
    if b.op in ELEMENTWISE or b.op is Ops.GATHER: ops += 1   # a gather is one load, its table one more input
    elif b.op not in (Ops.CONST, Ops.ARANGE): return False   # a fused reduce is never worth recomputing
  for b in [lb] + _inlined_region(lb, realize_set):
    inputs.update(id(s.base) for s in b.srcs if s.base.buffer is not None or s.base in realize_set)
  return len(inputs) <= MAX_RECOMPUTE_BUFFERS and ops <= MAX_RECOMPUTE_OPS

def _readers_of(bases: list[LazyBuffer]) -> dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]]:
  """base → [(user, the source as the user reads it: the base or a view of it)]."""
  readers: dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]] = {}
  for b in bases:
    for s in b.srcs: readers.setdefault(s.base, []).append((b, s))
  return readers

def _is_plain_read(view: LazyBuffer, base: LazyBuffer) -> bool:
  return view.is_base or (view.st.contiguous and view.shape == base.shape)

def _row_read(user: LazyBuffer, view: LazyBuffer, member: LazyBuffer, row_shape: tuple[int, ...],
              reduced_shape: tuple[int, ...], axes: tuple[int, ...]) -> Optional[str]:
  """How `user` reads `member` of a row kernel over rows `row_shape` (results `reduced_shape`): "plain" (row-shaped
  values in the same order, or result-sized ones through a reshape that keeps the order: a mean read as (N,) not
  (N, 1)), "broadcast" (a row-shaped op reads a result at every position of its row), "nested" (a reduce over the
  same rows); None when the read can't be part of the row kernel."""
  result_size = prod(reduced_shape)
  in_order = view.is_base or (view.st.contiguous and view.size == member.size)
  # a CONTIGUOUS or an ASSIGN (of the region's value into its target) is realized: it becomes the output
  if user.op in ELEMENTWISE or user.op is Ops.CONTIGUOUS or (user.op is Ops.ASSIGN and user.srcs[1] is view):
    if in_order and (user.shape == member.shape == row_shape or user.size == member.size == result_size):
      return "plain"
    if member.size == result_size and user.shape == row_shape and not view.is_base and \
       is_row_broadcast(view.st, reduced_shape, row_shape): return "broadcast"
  if user.op is Ops.REDUCE_AXIS and len(user.arg) == 2 and user.arg[1] == axes and member.shape == row_shape and \
     user.srcs[0].shape == row_shape and _is_plain_read(view, member): return "nested"
  return None

def _plan_row_kernels(bases: list[LazyBuffer], readers: dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]],
                      realize_set: set[LazyBuffer], copies: Optional[dict[LazyBuffer, list]] = None
                      ) -> frozenset[LazyBuffer]:
  """Rule 2b, decided up front: for each reduce over rows of at most MAX_ROW_FUSION_SIZE elements, follow its
  readers through elementwise ops of the row or result shape and through further reduces over the same rows. When
  every value reached is read only inside that region but for one (the kernel's output) and some read is a broadcast
  or a nested reduce, the output is realized and the region's reduces become row reduces (returned); kernel building
  then inlines them through those reads. Otherwise the reduce keeps the other rules (gradients reading the forward's
  intermediates, for example, leave several outputs). A realized copy of a run of a row-shaped value (rule 2c) is no
  output of its own: `copies`, when given, receives output → [(copy, value)] for the kernel to store them too."""
  row_reduces: set[LazyBuffer] = set()
  for start in bases:
    if start.op is not Ops.REDUCE_AXIS or start in realize_set or start in row_reduces or len(start.arg) != 2: continue
    row_shape, axes = start.srcs[0].shape, start.arg[1]
    if vmax_of(prod(row_shape[a] for a in axes)) > MAX_ROW_FUSION_SIZE: continue   # a symbolic row: its maximum
    members, outputs, reduces, fused_read = {start}, set(), [start], False
    slices: list[tuple[LazyBuffer, LazyBuffer]] = []   # rule 2c: (copy, the row-shaped member it copies a run of)
    stack = [start]
    while stack and len(outputs) <= 1:
      member = stack.pop()
      if member in realize_set:
        outputs.add(member)
        continue
      for user, view in readers.get(member, []):
        kind = _row_read(user, view, member, row_shape, start.shape, axes)
        if kind is None and copies is not None and user.op is Ops.CONTIGUOUS and member.shape == row_shape and \
           user.srcs[0] is view and _slice_store_tracker(view, member) is not None:
          slices.append((user, member))
          continue
        if kind is None:
          outputs.add(member)
          continue
        fused_read = fused_read or kind != "plain"
        if user not in members:
          members.add(user)
          stack.append(user)
          if user.op is Ops.REDUCE_AXIS: reduces.append(user)
    if len(outputs) == 1 and fused_read:
      realize_set.update(outputs)
      row_reduces.update(reduces)
      if slices and copies is not None:   # a region reached from several starting reduces finds its copies again
        known = copies.setdefault(next(iter(outputs)), [])
        known.extend(pair for pair in slices if pair not in known)
  return frozenset(row_reduces)

def _realize_unfusable_reduces(bases: list[LazyBuffer], readers: dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]],
                               realize_set: set[LazyBuffer], row_reduces: frozenset[LazyBuffer] = frozenset()) -> None:
  """A reduce fuses into its reader only when it has one reader, read through a plain reshape, and no other reduce
  sits above it in the same kernel; decide that up front (kernel building double-checks and may still refuse)."""
  def reduce_above(lb: LazyBuffer) -> bool:
    stack, seen = [lb], set()
    while stack:
      node = stack.pop()
      for user, _ in readers.get(node, []):
        if id(user) in seen or user in realize_set: continue
        seen.add(id(user))
        if user.op is Ops.REDUCE_AXIS: return True
        if user.op in ELEMENTWISE: stack.append(user)
    return False
  for b in bases:
    if b.op is not Ops.REDUCE_AXIS or b in realize_set or b in row_reduces: continue
    uses = readers.get(b, [])
    plain = len(uses) == 1 and (uses[0][1].is_base or (uses[0][1].st.contiguous and uses[0][1].size == b.size))
    if not plain or (uses and uses[0][0].op is Ops.REDUCE_AXIS) or reduce_above(b): realize_set.add(b)

def _realize_shared_elementwise(bases: list[LazyBuffer], realize_set: set[LazyBuffer],
                                stored_elsewhere: frozenset[LazyBuffer] = frozenset()) -> None:
  """Realize every elementwise value that several kernels would inline and that is too big to recompute (a copy
  that another kernel stores, rule 2c, is no kernel of its own); then inline again each of those that only one
  kernel reads once its users are decided (`_inline_values_read_once`)."""
  shared: set[LazyBuffer] = set()
  changed = True
  while changed:
    changed = False
    readers: dict[LazyBuffer, int] = {}
    for root in [b for b in bases if b in realize_set and b not in stored_elsewhere]:
      for lb in _inlined_region(root, realize_set): readers[lb] = readers.get(lb, 0) + 1
    # sources first: realizing one may make its users small. It can only add readers to its own sources (already
    # passed), so one pass handles everything above it and the loop repeats only for what lies below.
    for lb in bases:
      if readers.get(lb, 0) > 1 and lb.op in ELEMENTWISE and not _is_small(lb, realize_set):
        realize_set.add(lb)
        shared.add(lb)
        changed = True
  _inline_values_read_once(bases, realize_set, shared, stored_elsewhere)

def _inline_values_read_once(bases: list[LazyBuffer], realize_set: set[LazyBuffer], shared: set[LazyBuffer],
                             stored_elsewhere: frozenset[LazyBuffer]) -> None:
  """Rule 1: a value realized for being shared is inlined again when, with every value above it decided, one kernel
  reads it: a user of it that all its readers shared was realized too (a packed embedding row's block scales, read
  by the kernels of the row only through the row's dequantization, which is realized as well). Inlining a value
  into its only reader merges two kernels and never adds a reader to anything, so all such values go at once."""
  while shared:
    readers: dict[LazyBuffer, set[int]] = {}
    for root in [b for b in bases if b in realize_set and b not in stored_elsewhere]:
      for user in [root] + _inlined_region(root, realize_set):
        for s in user.srcs:
          if s.base in shared: readers.setdefault(s.base, set()).add(id(root))
    once = {lb for lb in shared if len(readers.get(lb, ())) == 1}
    if not once: return
    realize_set.difference_update(once)
    shared.difference_update(once)

@gc_paused()
def create_schedule(outs: list[LazyBuffer], commit: bool = False, buffers: Optional[dict[LazyBuffer, Buffer]] = None,
                    scalar_nodes: Optional[list[tuple[LazyBuffer, ...]]] = None) -> list[ScheduleItem]:
  """Decide which bases are realized, then build one ScheduleItem per realized base, dependencies first. With
  `commit`, each realized base keeps its item's Buffer as `lb.buffer` and drops its sources (see the module doc).
  `buffers`, when given, receives the Buffer of every base the schedule realizes (how a caller that does not commit,
  e.g. a path being measured, finds its outputs)."""
  given = with_collective_siblings([o.base for o in outs if o.base.buffer is None])
  outs, rebuilt = simplify_graph(given)   # constants folded, identities removed (graph_simplify.py)
  bases = unrealized_bases(outs)
  realize_set: set[LazyBuffer] = set(outs) | {b for b in bases if b.op in REALIZED_OPS}
  for b in bases:
    if b.op in WHOLE_SOURCE_OPS: realize_set.update(s.base for s in b.srcs if s.base.buffer is None)
    if b.op is Ops.GATHER and b.srcs[0].base.buffer is None: realize_set.add(b.srcs[0].base)   # rule 1b: tables
  readers = _readers_of(bases)   # who reads each base: the same for both decisions (realizing adds no readers)
  copies: dict[LazyBuffer, list[tuple[LazyBuffer, LazyBuffer]]] = {}   # rule 2c: kernel output → (copy, value)
  row_reduces = _plan_row_kernels(bases, readers, realize_set, copies)
  _realize_unfusable_reduces(bases, readers, realize_set, row_reduces)
  _realize_shared_elementwise(bases, realize_set, frozenset(c for pairs in copies.values() for c, _ in pairs))
  asts: dict[LazyBuffer, tuple[UOp, list[LazyBuffer], set[LazyBuffer]]] = {}
  scalars_of: dict[LazyBuffer, list[LazyBuffer]] = {}   # each kernel's lifted constants, in parameter order
  changed = True
  while changed:   # building a kernel may refuse a reduce: realize it, rebuild only the kernels that inlined it
    changed = False
    stored_by = {copy: b for b, pairs in copies.items() for copy, _ in pairs}
    for b in [b for b in bases if b in realize_set and b not in asts and b not in stored_by and
              b.op not in NOT_KERNELS and not _written_in_place(b)]:
      try:
        scalars_of[b] = []
        asts[b] = _kernel_ast(b, realize_set, row_reduces, scalars_of[b], copies.get(b, ()))
        if (cycle := _copy_read_back(copies.get(b, ()), asts[b][1])) is not None: raise _Unstorable(cycle)
      except _Refuse as refused:
        realize_set.add(refused.base)
        for stale in [k for k, (_, _, inlined) in asts.items() if refused.base in inlined]: del asts[stale]
        changed = True
      except _Unstorable as unstorable:   # the copy gets a kernel of its own; this one is built again without it
        copies[b] = [pair for pair in copies[b] if pair[0] is not unstorable.copy]
        asts.pop(b, None)
        changed = True
  items: list[_Step] = []
  stored_by = {copy: b for b, pairs in copies.items() for copy, _ in pairs}
  members = _collective_members(bases)
  written_by: dict[LazyBuffer, list[LazyBuffer]] = {}   # rule 2d: a CUSTOM value → the ASSIGNs its kernel performs
  for b in bases:
    if _written_in_place(b) and b.srcs[1].buffer is None: written_by.setdefault(b.srcs[1], []).append(b)
  for b in bases:   # `bases` is already in dependency order (a kernel with copies is ordered again below)
    if b not in realize_set or b in stored_by: continue
    if _written_in_place(b):   # a second output of its writer's step; or, the writer already run, nothing to do
      if b.srcs[1].buffer is not None: items.append(_Step(UOp(Ops.EMPTY, b.dtype), (b,), ()))
    elif b.op is Ops.COLLECTIVE:
      if (step := _collective_step(b, members)) is not None: items.append(step)
    elif b.op is Ops.COPY:
      items.append(_Step(UOp(Ops.COPY, b.dtype, (), None), (b,), tuple(s.base for s in b.srcs)))
    elif b.op is Ops.CUSTOM:
      items.append(_Step(UOp(Ops.CUSTOM, b.dtype, (), b.arg), (b, *written_by.get(b, ())),
                         tuple(s.base for s in b.srcs)))
    elif b.op is Ops.EMPTY: items.append(_Step(UOp(Ops.EMPTY, b.dtype), (b,), ()))
    elif prod(b.shape) == 0: items.append(_Step(UOp(Ops.EMPTY, b.dtype), (b,), ()))
    else:
      ast, inputs, _ = asts[b]
      items.append(_Step(ast, (b,) + tuple(copy for copy, _ in copies.get(b, ())), tuple(inputs)))
  buffers = {} if buffers is None else buffers
  items = _snapshot_old_values_read_after_assigns(_order_by_data(items))
  steps = ride_along(_order_assigns_after_readers(_collectives_after_their_inputs(items)), scalars_of, _Step,
                     MAX_SCALAR_PARAMS)   # rules 4 and 5
  if scalar_nodes is not None: scalar_nodes[:] = [tuple(scalars_of.get(step.outputs[0], ())) for step in steps]
  scheduled = [_with_buffers(step, buffers, commit, scalars_of.get(step.outputs[0], ())) for step in steps]
  for old, new in rebuilt:   # the caller's nodes, by the Buffers their simplified copies got
    if new in buffers: buffers[old] = buffers[new]
  if commit: commit_replacements(rebuilt)
  return scheduled

def with_collective_siblings(roots: list[LazyBuffer]) -> list[LazyBuffer]:
  """The roots (bases), and the unrealized siblings of every collective node above them that no root reaches (rule
  4: a collective computes every device's output at once). Free when the process never made a collective."""
  if not CollectiveGroup.made: return roots
  nodes = unrealized_bases(roots)
  present = {id(lb) for lb in nodes}
  missing = [m for lb in nodes if lb.op is Ops.COLLECTIVE for ref in lb.arg.group.members
             if (m := ref()) is not None and m.buffer is None and id(m) not in present]
  if not missing: return roots
  return with_collective_siblings(roots + list({id(m): m for m in missing}.values()))

def _collective_members(bases: list[LazyBuffer]) -> dict[int, dict[int, LazyBuffer]]:
  """id(group) → {rank: node} of the collective nodes among the bases."""
  members: dict[int, dict[int, LazyBuffer]] = {}
  for b in bases:
    if b.op is Ops.COLLECTIVE: members.setdefault(id(b.arg.group), {})[b.arg.rank] = b
  return members

def _collective_step(node: LazyBuffer, members: dict[int, dict[int, LazyBuffer]]) -> Optional[_Step]:
  """Rule 4: the one step of the collective `node` belongs to (None for its siblings after the first): outputs the
  siblings in order (a scratch EMPTY value on its device for one whose node is gone or realized), inputs the
  sources."""
  ranks = members.pop(id(node.arg.group), None)
  if ranks is None: return None
  inputs = tuple(s.base for s in node.srcs)
  outputs = tuple(ranks[rank] if rank in ranks else LazyBuffer.loadop(Ops.EMPTY, node.shape, node.dtype, device)
                  for rank, device in enumerate(node.arg.group.devices))
  return _Step(UOp(Ops.COLLECTIVE, node.dtype, (), node.arg.spec), outputs, inputs)

def _copy_read_back(pairs: Sequence[tuple[LazyBuffer, LazyBuffer]], inputs: list[LazyBuffer]
                    ) -> Optional[LazyBuffer]:
  """A copy of rule 2c that one of the kernel's inputs is computed from (the kernel would have to run before
  itself), or None."""
  if not pairs: return None
  above = {id(lb) for lb in walk(inputs, views=False, realized=False)}
  return next((copy for copy, _ in pairs if id(copy) in above), None)

def _with_buffers(step: _Step, buffers: dict[LazyBuffer, Buffer], commit: bool, scalars: Sequence[LazyBuffer] = ()
                  ) -> ScheduleItem:
  """The step over Buffers: each output gets a new Buffer (an ASSIGN its target's), recorded in `buffers` for the
  steps that read it. A copy from the host keeps the host array in the item. With `commit`, each output keeps its
  Buffer and drops its sources: the graph above a realized value is never walked again."""
  def buffer_of(lb: LazyBuffer) -> Buffer: return lb.buffer if lb.buffer is not None else buffers[lb]
  host_data = step.outputs[0].arg if step.ast.op is Ops.COPY and not step.inputs else None
  for lb in step.outputs:
    if lb.buffer is None:
      if lb.op is Ops.ASSIGN: buffers[lb] = buffer_of(lb.srcs[0].base)
      else:   # a symbolic size is allocated at its maximum (sint.py)
        buffers[lb] = Buffer(lb.device, vmax_of(lb.size), lb.dtype)
        if isinstance(lb.size, UOp): buffers[lb].symbolic_size = unbind(lb.size)[0]
  bufs = tuple(buffer_of(lb) for lb in step.outputs + step.inputs)
  ast, var_vals = unbind_ast(step.ast) if symbolic_in_use() else (step.ast, NO_VARIABLES)
  if step.ast.op is Ops.CUSTOM and symbolic_in_use():   # with the views a kernel reads in place (LazyBuffer.custom)
    var_vals = _shape_variables(step.outputs + step.inputs + step.outputs[0].srcs)
  if scalars: var_vals = {**var_vals, **scalar_values(scalars)}   # read before a commit drops a root's arg
  if commit:
    for lb, buf in zip(step.outputs, bufs): lb.commit(buf, keep_arg=lb.op is Ops.REDUCE_AXIS)
  return ScheduleItem(ast, bufs, len(step.outputs), host_data, var_vals)

def _shape_variables(lbs: Sequence[LazyBuffer]) -> dict[str, int]:
  """The bound variables of these values' shapes: a custom kernel's var_vals (its sizes at this launch; a JIT replay
  sets them like a kernel's)."""
  values: dict[str, int] = {}
  for lb in lbs:
    for size in lb.shape: values.update(unbind(size)[1])
    if not lb.is_base and lb.st.symbolic: values.update(lb.st.unbind()[1])   # a view's offset (a slot)
  return values

def scalar_values(scalars: Sequence[LazyBuffer]) -> dict[str, int]:
  """The var_vals of a kernel's scalar parameters: parameter k carries lifted constant k's value as 64 bits."""
  return {param_name(k): param_bits(lb.arg, lb.dtype) for k, lb in enumerate(scalars)}

def unbind_ast(ast: UOp) -> tuple[UOp, dict[str, int]]:
  """The AST with every bound variable (in its views' ShapeTrackers and in symbolic constants) replaced by the bare
  variable, and the bound values: kernels are compiled and cached for the variables, the values come at launch."""
  values: dict[str, int] = {}
  new: dict[UOp, UOp] = {}
  for u in ast.toposort():   # children first
    arg, found = u.arg, {}
    if u.op is Ops.VIEW and u.arg.symbolic: arg, found = u.arg.unbind()
    elif u.op is Ops.CONST and isinstance(u.arg, UOp): arg, found = unbind(u.arg)
    for name, value in found.items():
      if values.setdefault(name, value) != value:
        raise ValueError(f"variable {name!r} is bound to both {values[name]} and {value} in one kernel")
    src = tuple(new[s] for s in u.src)
    new[u] = u if arg is u.arg and all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, arg)
  return new[ast], values

def keep_old_values(items: list[ScheduleItem], assigns: list[tuple[LazyBuffer, LazyBuffer]]) -> list[ScheduleItem]:
  """Value semantics across realizes (docs/semantics.md). `assigns` are the (target, ASSIGN) pairs of a schedule
  that has committed: an ASSIGN writes its target's Buffer in place, so a value that holds the old data (the target,
  or another realized value in the same Buffer) and that a value this schedule did not compute still reads
  (`pending_readers`: `b = x + 1` before `x[0] = 7`, then `x` realized alone) would read the new data. Such a holder
  alone gets a copy of the Buffer, taken right before the write; when nothing pending reads an old value (the usual
  case: a training or decode step) nothing is added."""
  targets = {id(target) for target, _ in assigns}
  newest = [assign for _, assign in assigns if id(assign) not in targets]   # the ASSIGN each Buffer ends with
  hazards = list({id(holder): (holder, assign.buffer) for assign in newest for holder in holders_of(assign.buffer)
                   if holder not in newest and holder.pending_readers()}.values())
  if not hazards: return items
  items = list(items)
  made_by = {id(assign): target for target, assign in assigns}
  for holder, buffer in hazards:
    # the write that ends the holder's data: the ASSIGNs writing this Buffer run in the order of the chain of values
    # it holds, after the kernel that made its first value when this schedule made that too
    writers = [i for i, item in enumerate(items) if item.ast.op in (Ops.SINK, Ops.CUSTOM) and
               any(out is buffer for out in item.outputs)]   # a kernel's ASSIGN, or one a custom kernel performs
    assign_writers = writers[len(writers) - sum(1 for _, a in assigns if a.buffer is buffer):]
    [copy] = create_schedule([old := LazyBuffer.copy_of_buffer(buffer)], commit=True)
    # right before the first write for a value this schedule did not make, else right after the write that made it
    made_by_write = min(_assign_depth(holder, made_by), len(assign_writers))
    items.insert(assign_writers[0] if made_by_write == 0 else assign_writers[made_by_write - 1] + 1, copy)
    holder.keep_value_in(old.buffer)
  return items

def _assign_depth(value: LazyBuffer, made_by: dict[int, LazyBuffer]) -> int:
  """How many ASSIGNs (`made_by`: id of each ASSIGN → its target) wrote the Buffer before `value` held it (0 for a
  value not made by one)."""
  depth = 0
  while id(value) in made_by:
    value, depth = made_by[id(value)], depth + 1
  return depth

def _order_by_data(items: list[_Step]) -> list[_Step]:
  """A kernel with several outputs (rule 2c) sits where its first output was in the graph's order, which may be after
  a reader of another output: move each such reader (and what depends on it) after its producers, keeping the order
  of everything else."""
  if all(len(item.outputs) == 1 for item in items): return items
  producer = {out: item for item in items for out in item.outputs}
  placed: set[int] = set()
  ordered: list[_Step] = []
  waiting: dict[int, list[_Step]] = {}   # id of a producer not placed yet → the items that wait for it
  def place(item: _Step) -> None:
    ready = [item]
    while ready:
      node = ready.pop()
      ordered.append(node)
      placed.add(id(node))
      for follower in reversed(waiting.pop(id(node), [])): try_place(follower, ready)
  def try_place(item: _Step, ready: list[_Step]) -> None:
    missing = next((producer[b] for b in item.inputs if b in producer and id(producer[b]) not in placed
                    and producer[b] is not item), None)
    if missing is None: ready.append(item)
    else: waiting.setdefault(id(missing), []).append(item)
  for item in items:
    ready: list[_Step] = []
    try_place(item, ready)
    for node in ready: place(node)
  assert len(ordered) == len(items), "a cycle among kernels with several outputs"
  return ordered

def _collectives_after_their_inputs(items: list[_Step]) -> list[_Step]:
  """Rule 4's order: each collective step right after the steps it needs (its inputs, theirs, ...: in their order), and
  the steps that came before it without being needed right after it. A collective is a rendezvous: every device
  waits there for all the others, so a device that runs work the collective does not need before it makes every
  other device wait that long. The graph's order can do that: in a data-parallel step the labels' count was
  all-reduced after one GPU's forward pass and before the other's, which then ran its forward pass while the first
  waited, so the two forward passes ran one after the other. Data order is kept; a schedule without collectives is
  unchanged."""
  collectives = [i for i, item in enumerate(items) if item.ast.op is Ops.COLLECTIVE]
  if not collectives: return items
  producer = {out: i for i, item in enumerate(items) for out in item.outputs}
  placed = [False] * len(items)
  ordered: list[_Step] = []
  def place(indices: Sequence[int]) -> None:
    for i in sorted(indices):   # the original order is a dependency order
      if not placed[i]:
        placed[i] = True
        ordered.append(items[i])
  before = 0   # the steps before this index that are not placed yet wait for the next collective
  for index in collectives:
    needed, stack = {index}, [index]
    while stack:
      for b in items[stack.pop()].inputs:
        if (j := producer.get(b)) is not None and not placed[j] and j not in needed:
          needed.add(j)
          stack.append(j)
    place(needed)
    place(range(before, index))
    before = index + 1
  place(range(before, len(items)))
  return ordered

def _written_in_place(b: LazyBuffer) -> bool:
  """An ASSIGN its value's CUSTOM kernel performs (LazyBuffer.written_by): no kernel of its own (rule 2d)."""
  return b.op is Ops.ASSIGN and b.arg == IN_PLACE

def _assigns_by_target(items: list[_Step]) -> dict[LazyBuffer, _Step]:
  """The step that writes each assigned buffer: an ASSIGN's own, or the custom kernel's that performs it."""
  return {out.srcs[0].base: item for item in items for out in item.outputs if out.op is Ops.ASSIGN}

def _snapshot_old_values_read_after_assigns(items: list[_Step]) -> list[_Step]:
  """A kernel that reads the old value of an assigned buffer but also depends on the assign (it reads the new value
  too, or something computed from it) can't run before the assign: the old value is copied first (a snapshot kernel,
  which runs before the assign as any other reader does) and such kernels read the copy. `x2 = x.contiguous()` of a
  realized x is x's own buffer, so `x2[i] = v; y = x2 - x` reads both (fuzz_ops seed 0 cases 4290, 7915, 9802)."""
  assign_of_target = _assigns_by_target(items)
  if not assign_of_target: return items
  producer = {out: item for item in items for out in item.outputs}
  after: dict[int, frozenset] = {}   # item → ids of the assign items it depends on, transitively (items are in order)
  for item in items:
    found = frozenset().union(*(after.get(id(producer[b]), frozenset()) for b in item.inputs if b in producer))
    after[id(item)] = found | {id(producer[b]) for b in item.inputs
                               if b in producer and any(o.op is Ops.ASSIGN for o in producer[b].outputs)}
  snapshots: dict[LazyBuffer, _Step] = {}
  out: list[_Step] = []
  for item in items:
    stale = [b for b in item.inputs if (a := assign_of_target.get(b)) is not None and a is not item
             and id(a) in after[id(item)]]
    for target in stale:
      if target not in snapshots:
        copy = LazyBuffer.loadop(Ops.CONTIGUOUS, target.shape, target.dtype, target.device, srcs=(target,))
        ast, inputs, _ = _kernel_ast(copy, {target})
        snapshots[target] = _Step(ast, (copy,), tuple(inputs))
        out.insert(next((i for i, x in enumerate(out) if x is assign_of_target[target]), len(out)), snapshots[target])
    if stale:
      old = {target: snapshots[target].outputs[0] for target in stale}
      item = _Step(item.ast, item.outputs, tuple(old.get(b, b) for b in item.inputs))
    out.append(item)
  return out

def _order_assigns_after_readers(items: list[_Step]) -> list[_Step]:
  """An ASSIGN overwrites a buffer that other kernels of the same schedule may still read as its old value (an
  optimizer step reads every parameter for the other parameters' gradients). Reorder, stably, so that every item
  reading an assign's target runs before the assign; the data dependencies of `items` are kept."""
  assign_of_target = _assigns_by_target(items)
  if not assign_of_target: return items
  producer = {out: item for item in items for out in item.outputs}
  must_follow: dict[int, list[_Step]] = {id(item): [] for item in items}   # item → items that run first
  for item in items:
    must_follow[id(item)].extend(producer[b] for b in item.inputs if b in producer)
    for b in item.inputs:
      if (assign := assign_of_target.get(b)) is not None and assign is not item: must_follow[id(assign)].append(item)
  ordered: list[_Step] = []
  state: dict[int, str] = {}
  def visit(item: _Step) -> None:   # depth-first, in the original order: unchanged where nothing conflicts
    stack = [(item, False)]
    while stack:
      node, inputs_done = stack.pop()
      if inputs_done:
        state[id(node)] = "done"
        ordered.append(node)
        continue
      if state.get(id(node)) == "done": continue
      if state.get(id(node)) == "active":
        raise RuntimeError(f"a kernel reads both the old and the new value of an assigned buffer {node.outputs[0]}")
      state[id(node)] = "active"
      stack.append((node, True))
      stack.extend((dep, False) for dep in reversed(must_follow[id(node)]) if state.get(id(dep)) != "done")
  for item in items: visit(item)
  return ordered

