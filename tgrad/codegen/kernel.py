"""Kernel: one AST's iteration space, the role of each axis, and the OptOps that reshape it.

Input: a kernel AST from the scheduler (a SINK of STOREs whose memory ops carry ShapeTrackers) and the target's
renderer. All ShapeTrackers share one rank; axes are ordered by role:

  [ global | local | group-reduce | reduce loops | upcast/unroll ]
   0 ..      ..     first_reduce ..              shape_len - upcasted .. shape_len

An `Opt(op, axis, amount)` splits an axis and moves the piece to its role's place (`shift_to`). An illegal opt
raises KernelOptError, so search can try anything. The linearizer (linearizer.py) turns a Kernel into UOps.
OptOps.TC (tensor cores) lays one warp over a tile of a matmul-like reduce: its legality and layout are in
tensor_cores.py. OptOps.SMEM stages one input's tile in shared memory per step of the reduce loop: staging.py. A gather
LOAD (arg GatherAxis, see ops.py) is a memory op like any other: its VIEW is reshaped by every opt; only its row along
the gathered axis comes from a loaded value, so it is never staged in shared memory nor fed to a tensor core.
"""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ALU, exec_alu, truncate_to, is_gather_load
from tgrad.codegen.staging import apply_stage, stage_plan
from tgrad.codegen.tensor_cores import TensorCoreUse, apply_tensor_core
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import sint, canonical, ceil_div, divides, is_symbolic, render as render_size, vmax_of
from tgrad.helpers import prod, round_up
from tgrad.scalars import is_scalar_param

class KernelOptError(Exception):
  """An optimization that is not legal for this kernel (wrong axis, amount that doesn't divide, …)."""

class OptOps(Enum):
  UPCAST = auto(); UNROLL = auto(); LOCAL = auto(); GROUP = auto(); GROUPTOP = auto()  # noqa: E702
  NOLOCALS = auto(); PADTO = auto(); SWAP = auto(); TC = auto(); THREAD = auto(); SMEM = auto()  # noqa: E702
  def __repr__(self): return f"OptOps.{self.name}"
  def __lt__(self, other): return self.value < other.value

@dataclass(frozen=True, order=True)
class Opt:
  op: OptOps
  axis: Optional[int] = None
  amount: Optional[int] = None
  def to_json(self) -> list: return [self.op.name, self.axis, self.amount]
  @staticmethod
  def from_json(x: list) -> Opt: return Opt(OptOps[x[0]], x[1], x[2])

MEMORY_OPS = (Ops.LOAD, Ops.STORE, Ops.CONST, Ops.ARANGE)
MAX_UPCAST = 512   # largest product of upcast/unroll amounts (an 8×8 register tile × K unrolled by 8): more unrolled
                   # code only bloats compile time
MAX_PADDING_FRACTION = 1   # PADTO adds fewer positions than the axis has: padding never more than doubles its work

# A global axis too big for the grid is split in two so that the outer part fits a grid dimension's limit; at most this
# many splits (each halves the largest axis at least; far more than any buffer a GPU can hold needs).
MAX_GRID_SPLITS = 8

class Kernel:
  def __init__(self, ast: UOp, renderer):
    self.ast, self.renderer = ast, renderer
    nodes = ast.toposort()
    # memory ops (those with a VIEW), stores first; sts[i] is memops[i]'s ShapeTracker
    reads = [u for u in nodes if u.op in MEMORY_OPS and u.op is not Ops.STORE and u.src and u.src[-1].op is Ops.VIEW]
    self.memops = [u for u in nodes if u.op is Ops.STORE] + reads
    self.sts: list[ShapeTracker] = [self.view_of(u) for u in self.memops]
    self.reduceops = [u for u in nodes if u.op is Ops.REDUCE_AXIS]
    self.row_store = self._add_row_reference()
    self.local_dims = self.group_for_reduces = self.upcasted = 0
    self.threads = 0            # THREAD: axis 0 is split across this many CPU threads
    self.dont_use_locals = False
    self.tensor_core: Optional[TensorCoreUse] = None
    self.staged: tuple[tuple[UOp, int], ...] = ()   # SMEM: (load, padding per row) staged in shared memory
    # guarded GROUPs of symbolic reduce axes whose reduces don't ignore padding: one tracker each (in memops/sts, so
    # every opt reshapes it), valid exactly where the split axis is not padding (see _add_padding_guard)
    self.padding_guards: tuple[UOp, ...] = ()
    self.applied_opts: list[Opt] = []
    self._reduce_axes_last()
    self._merge_axes()
    self._fit_grid()
    self.function_name = self.name   # the rendered function's name: the unoptimized shape, the same under any opts

  @staticmethod
  def view_of(u: UOp) -> ShapeTracker: return (u.src[1] if u.op is Ops.STORE else u.src[-1]).arg

  def _add_row_reference(self) -> bool:
    """A row kernel (schedule.py rule 2b) stores the whole row it reduces: its STORE spans the reduce axes. Axis roles
    come from sts[0] (`output_shape`), so such a kernel gets a reference tracker there, of the reduces' result shape
    (the reduce axes have size 1), paired in `memops` with the first reduce; the STORE follows it. Every opt reshapes
    it with the others, so the roles stay right. Returns whether the kernel is one."""
    if not self.reduceops: return False
    axes, store_shape = self.reduceops[0].arg[1], self.sts[0].shape
    if all(store_shape[a] == 1 for a in axes): return False
    self.memops.insert(0, self.reduceops[0])
    self.sts.insert(0, ShapeTracker.from_shape(tuple(1 if i in axes else s for i, s in enumerate(store_shape))))
    return True

  @property
  def row_passes(self) -> int:
    """How many times the kernel walks each row: once per pass of reduces (`reduce_levels`), once more for a row
    store. 1 for a plain reduce kernel, 0 without reduces."""
    return max(self.reduce_levels.values(), default=-1) + 1 + self.row_store

  @property
  def reduce_levels(self) -> dict[UOp, int]:
    """Each reduce's pass over the rows: 0 for one that reads no other reduce, else one more than the latest pass it
    reads (a row kernel's variance reads its mean: passes 0 and 1; its store runs after the last)."""
    levels: dict[UOp, int] = {}
    for r in self.reduceops:   # sources first (toposort order)
      levels[r] = 1 + max((levels[u] for u in r.src[0].toposort() if u.op is Ops.REDUCE_AXIS), default=-1)
    return levels

  def copy(self) -> Kernel:
    other = object.__new__(Kernel)
    other.__dict__.update(self.__dict__)
    other.sts, other.applied_opts = list(self.sts), list(self.applied_opts)
    return other

  # ---- shape facts
  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)
  @property
  def full_shape(self) -> tuple[int, ...]:
    """Per axis the size of the loop: every tracker has it, or 1 (a reduced axis of an output). A symbolic size
    (a variable's expression) is a loop bound the kernel takes as an argument."""
    shapes = [st.shape for st in self.sts]
    if not any(is_symbolic(s) for s in shapes): return tuple(max(s[i] for s in shapes) for i in range(self.shape_len))
    return tuple(next((s[i] for s in shapes if s[i] != 1), 1) for i in range(self.shape_len))
  @property
  def symbolic(self) -> bool: return is_symbolic(self.full_shape)
  @property
  def variables(self) -> list[UOp]:
    """The DEFINE_VARs of the kernel's trackers, by name: every one is a parameter of the program (linearizer)."""
    return sorted({v for st in self.sts for v in st.variables()}, key=lambda v: v.arg[0])
  @property
  def scalar_params(self) -> list[UOp]:
    """The scalar parameters of its lifted constants (tgrad/scalars.py), by name: parameters of the program too."""
    return sorted({u.arg for u in self.ast.toposort() if u.op is Ops.CONST and isinstance(u.arg, UOp) and
                   is_scalar_param(u.arg)}, key=lambda v: v.arg[0])
  @property
  def parameters(self) -> list[UOp]:
    """Every DEFINE_VAR the program takes, in the order renderers and launches pass them (by name)."""
    return sorted(self.variables + self.scalar_params, key=lambda v: v.arg[0])
  @property
  def output_shape(self) -> tuple[int, ...]: return self.sts[0].shape
  @property
  def first_reduce(self) -> int:
    full, out = self.full_shape, self.output_shape
    limit = self.shape_len - self.upcasted
    return next((i for i in range(limit) if full[i] != out[i]), limit)
  @property
  def first_upcast(self) -> int: return self.shape_len - self.upcasted
  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims
  @property
  def upcast_axes(self) -> range: return range(self.first_upcast, self.shape_len)
  def is_reduce_axis(self, axis: int) -> bool: return self.full_shape[axis] != self.output_shape[axis]
  @property
  def upcast_size(self) -> int: return prod(self.full_shape[a] for a in self.upcast_axes)
  @property
  def unrolled_size(self) -> int:
    """The upcast product MAX_UPCAST limits: a tensor core's own axes don't count (the warp's lanes share them)."""
    return prod(self.full_shape[a] for a in self.upcast_axes if a not in self.tc_upcast_axes)
  # With TC the warp's lanes are the last two local axes, (group, tig), and the tile's fragment axes the three upcast
  # axes (rows 2, columns 2, K 16) after those made before TC: later opts keep them there (LOCAL inserts before the
  # lanes, UPCAST and UNROLL append after the fragments).
  @property
  def tc_lane_axes(self) -> tuple[int, ...]:
    return (self.first_reduce - 2, self.first_reduce - 1) if self.tensor_core else ()
  @property
  def tc_upcast_axes(self) -> tuple[int, ...]:
    if self.tensor_core is None: return ()
    return tuple(self.first_upcast + self.tensor_core.upcasts_before + i for i in range(3))
  @property
  def name(self) -> str:
    kind = "r" if self.reduceops else "E"
    def size(s) -> str: return "".join(c if c.isalnum() else "_" for c in render_size(s)).strip("_")
    return kind + "_" + "_".join(size(s) for s in self.full_shape) if self.full_shape else kind

  # ---- reshaping every ShapeTracker at once
  def reshape_and_permute(self, new_shape_fn, order: Optional[list[int]]) -> None:
    new_sts = []
    for st in self.sts:
      if new_shape_fn is not None: st = st.reshape(tuple(new_shape_fn(st.shape)))
      if order is not None: st = st.permute(tuple(order))
      new_sts.append(st)
    self.sts = new_sts

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None) -> None:
    """Split `axis` into (size/amount, amount) — (amount, size/amount) if top — and move the `amount` piece so it
    lands just before `insert_before` (default: the end)."""
    if insert_before is None: insert_before = self.shape_len
    moved = axis if top else axis + 1
    if moved < insert_before: insert_before += 1
    def split(shape):
      size = shape[axis]
      if isinstance(size, int) and size <= 1: return shape[:axis] + (1, 1) + shape[axis + 1:]
      rest = canonical(size // amount)
      piece = (amount, rest) if top else (rest, amount)
      return shape[:axis] + piece + shape[axis + 1:]
    order = [i for i in range(insert_before) if i != moved] + [moved] + \
            [i for i in range(insert_before, self.shape_len + 1) if i != moved]
    self.reshape_and_permute(split, order)

  def _reduce_axes_last(self) -> None:
    reduce_axes = [i for i in range(self.shape_len) if self.is_reduce_axis(i)]
    order = [i for i in range(self.shape_len) if i not in reduce_axes] + reduce_axes
    if order != list(range(self.shape_len)): self.reshape_and_permute(None, order)

  def _merge_axes(self) -> None:
    """Merge neighbouring axes of the same role that every ShapeTracker can merge without a new View."""
    axis = self.shape_len - 2
    while axis >= 0:
      full, out = self.full_shape, self.output_shape
      same_role = self.is_reduce_axis(axis) == self.is_reduce_axis(axis + 1)
      if same_role and self._mergeable(axis):
        def merge(shape, a=axis): return shape[:a] + (prod(shape[a:a + 2]),) + shape[a + 2:]
        self.reshape_and_permute(merge, None)
      elif full[axis] == 1 and out[axis] == 1 and self.shape_len > 1:   # drop size-1 axes
        def drop(shape, a=axis): return shape[:a] + shape[a + 1:]
        self.reshape_and_permute(drop, None)
      axis -= 1

  def _fit_grid(self) -> None:
    """On a target with thread ids, make the global axes fit the grid (launch_dims): while they don't, split the
    largest into (outer, inner) with inner the smallest power of two that leaves outer within the smallest grid
    limit; an axis it doesn't divide is padded first (masked off: the padding's threads store nothing). So an axis of
    2^33 becomes (2^15, 2^18): blockIdx.y and a blockIdx.x the heuristics may still split into blocks."""
    caps = self.renderer
    if not caps.has_local: return
    limits = caps.max_grid[:caps.max_global_dims]
    outer_limit = min(limits)
    for _ in range(MAX_GRID_SPLITS):
      try:
        fold_dims(self.global_axis_sizes, limits)
        return
      except KernelOptError: pass
      axis = max(range(self.global_dims), key=lambda a: vmax_of(self.full_shape[a]))
      size = self.full_shape[axis]
      if not isinstance(size, int): break   # a symbolic axis is not split: its bound must fit the grid
      inner = max(2, 1 << (-(-size // outer_limit) - 1).bit_length())
      if inner > limits[0] or size <= 1: break
      if size % inner:
        padding = tuple((0, round_up(size, inner) - size) if d == axis else (0, 0) for d in range(self.shape_len))
        self.sts = [st.pad(padding) for st in self.sts]
      self.reshape_and_permute(lambda shape: shape[:axis] + (shape[axis] // inner, inner) + shape[axis + 1:], None)
    raise KernelOptError(f"global dims {self.global_axis_sizes} of kernel shape {self.full_shape} do not fit the grid "
                         f"limits {limits} of {type(caps).__name__}")

  def _mergeable(self, axis: int) -> bool:
    for st in self.sts:
      merged = st.reshape(st.shape[:axis] + (prod(st.shape[axis:axis + 2]),) + st.shape[axis + 2:])
      if len(merged.views) > len(st.views): return False
      if len(st.views) > 1 and merged.views[:-1] != st.views[:-1]: return False
    return True

  # ---- optimizations
  def apply_opt(self, opt: Opt) -> None:
    """Apply one Opt or raise KernelOptError; the kernel is unchanged when it raises."""
    before = (list(self.sts), list(self.memops), self.local_dims, self.group_for_reduces, self.upcasted, self.threads,
              self.dont_use_locals, self.tensor_core, self.staged, self.padding_guards)
    try:
      if opt.op is OptOps.TC: apply_tensor_core(self, opt)
      else: self._apply(opt)
      if self.renderer.has_local: self._check_limits()
    except KernelOptError:
      (self.sts, self.memops, self.local_dims, self.group_for_reduces, self.upcasted, self.threads,
       self.dont_use_locals, self.tensor_core, self.staged, self.padding_guards) = before
      raise
    self.applied_opts.append(opt)

  def _check(self, cond: bool, why: str) -> None:
    if not cond: raise KernelOptError(why)

  def _real_axis(self, opt: Opt) -> int:
    if opt.op in (OptOps.UNROLL,): axis = self.first_reduce + (opt.axis or 0)
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP): axis = self.first_reduce + self.group_for_reduces + (opt.axis or 0)
    else: axis = opt.axis if opt.axis is not None else -1
    self._check(axis is not None and 0 <= axis < self.shape_len, f"{opt}: axis out of range for {self.full_shape}")
    return axis

  def _apply(self, opt: Opt) -> None:
    caps = self.renderer
    if opt.op is OptOps.NOLOCALS:
      self._check(self.local_dims == 0 and self.group_for_reduces == 0 and not self.staged, "NOLOCALS after locals")
      self._check(not self.dont_use_locals, "NOLOCALS twice")
      self.dont_use_locals = True
      return
    if opt.op is OptOps.SMEM: return apply_stage(self, opt)
    axis = self._real_axis(opt)
    size = self.full_shape[axis]
    if not isinstance(size, int) and opt.op is OptOps.PADTO:
      self._check(bool(opt.amount), f"{opt}: PADTO of the symbolic axis {axis} needs an amount")
    elif not isinstance(size, int) and opt.op is not OptOps.SWAP:
      self._split_symbolic_axis(opt, axis, size)
      size = self.full_shape[axis]
    amount = opt.amount if opt.amount else size
    self._check(amount > 1 or opt.op is OptOps.SWAP, f"{opt}: amount must be > 1")
    if opt.op not in (OptOps.SWAP, OptOps.PADTO):
      self._check(divides(amount, size), f"{opt}: {amount} doesn't divide axis size {render_size(size)}")
    # the launch runs exactly `threads` copies of axis 0 (launch_dims): its size must never change or move
    self._check(not self.threads or axis != 0, f"{opt}: axis 0 is the THREAD axis of {self.full_shape}")
    self._check(axis not in self.tc_lane_axes + self.tc_upcast_axes, f"{opt}: axis {axis} belongs to the tensor core")
    if opt.op is OptOps.UPCAST:
      self._check(axis < self.first_reduce, f"{opt}: UPCAST needs a non-reduce axis")
      self._check(self.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
      self.shift_to(axis, amount)
      self.upcasted += 1
    elif opt.op is OptOps.UNROLL:
      self._check(self.first_reduce + self.group_for_reduces <= axis < self.first_upcast, f"{opt}: needs a reduce axis")
      self._check(self.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
      self.shift_to(axis, amount)
      self.upcasted += 1
      if self.tensor_core is not None: self.drop_unit_reduce_axis(axis)
    elif opt.op is OptOps.LOCAL:
      self._check(caps.has_local and not self.dont_use_locals, f"{opt}: target has no local memory/threads")
      self._check(axis < self.global_dims, f"{opt}: LOCAL needs a global axis")
      self._check(prod(self.local_axis_sizes) * amount <= caps.max_local_size, f"{opt}: too many local threads")
      self.shift_to(axis, amount, insert_before=self.first_reduce - len(self.tc_lane_axes))   # a warp's lanes stay last
      self.local_dims += 1
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      self._check(caps.has_shared and not self.dont_use_locals, f"{opt}: target has no shared memory")
      self._check(len(self.reduceops) >= 1 and self.first_reduce <= axis < self.first_upcast,
                  f"{opt}: needs a reduce axis")
      self._check(self.group_for_reduces == 0, f"{opt}: only one GROUP")
      self._check(self.tensor_core is None, f"{opt}: a tensor core's accumulators can't be shared (GROUP after TC)")
      self.shift_to(axis, amount, top=opt.op is OptOps.GROUPTOP,
                    insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    elif opt.op is OptOps.THREAD:
      self._check(caps.has_threads, f"{opt}: target has no CPU threads")
      self._check(self.threads == 0 and axis < self.global_dims, f"{opt}: one THREAD, on a global axis")
      self.shift_to(axis, amount, top=True, insert_before=0)
      self.threads = amount
    elif opt.op is OptOps.SWAP:
      other = opt.amount
      self._check(other is not None and axis < other < self.global_dims, f"{opt}: SWAP needs two global axes")
      order = list(range(self.shape_len))
      order[axis], order[other] = order[other], order[axis]
      self.reshape_and_permute(None, order)
    elif opt.op is OptOps.PADTO: self._pad_to(opt, axis, amount)
    else:
      raise KernelOptError(f"{opt.op} is not supported by this kernel")

  def _split_symbolic_axis(self, opt: Opt, axis: int, size) -> None:
    """Legality of splitting an axis of symbolic size, from the bounds: UPCAST, UNROLL, LOCAL and GROUP by an amount
    that divides the size for every value of the variables (n*64 by 4) split it as it is. A LOCAL or UPCAST of any
    other symbolic global axis, or a GROUP of any other symbolic reduce axis, first pads it to a multiple of the amount
    (the guard, `pad_symbolic_axis`): the padded positions load nothing and store nothing (an upcast's replicas each
    test their own position). Where some reduce would change with the padding (a max, a sum of exponentials), a
    padding guard makes every reduce see its identity there instead (_add_padding_guard). An UNROLL of a symbolic
    reduce axis is never guarded."""
    splits = (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP)
    self._check(opt.op in splits and opt.amount is not None and opt.amount > 1,
                f"{opt}: axis {axis} has the symbolic size {render_size(size)}; {opt.op.name} needs a known size")
    amount = opt.amount or 1
    if divides(amount, size): return
    group = opt.op in (OptOps.GROUP, OptOps.GROUPTOP)
    guarded = opt.op in (OptOps.LOCAL, OptOps.UPCAST) and axis < self.global_dims or group and self.is_reduce_axis(axis)
    self._check(guarded, f"{opt}: axis {axis} has the symbolic size {render_size(size)}, not a multiple of {amount} "
                f"for every value; {opt.op.name} needs one (a symbolic reduce axis is never unrolled with a guard)")
    if group and not all(reduce_ignores_padding(r) for r in self.reduceops): self._add_padding_guard(axis, size)
    self.pad_symbolic_axis(axis, amount)

  def pad_symbolic_axis(self, axis: int, amount: int) -> None:
    """The guard of a split of a symbolic axis: pad it to ceil(n/amount)*amount (>= n for every value), the padding
    masked off: loads there read 0 and stores there are skipped. Along a global (output) axis, a tracker that doesn't
    move along it (stride 0: the weights of a matmul along its rows) is stretched instead of masked: a padded position
    reads the same valid memory as the axis' first, so an upcast's replicas share that load, and what the padding
    computes is never stored. Only where its last view is that expand: a later view that splits an earlier one keeps
    its split (stretched, it would be indexed through a flat position divided by symbolic sizes), so it is masked; pad
    every symbolic axis before splitting any (the heuristics do). Along a reduce axis every tracker is masked (the
    padding must add nothing)."""
    size = self.full_shape[axis]
    padded = canonical(ceil_div(size, amount) * amount)
    output_axis = axis < self.global_dims
    def pad(st: ShapeTracker) -> ShapeTracker:
      if st.shape[axis] == 1: return st
      if output_axis and st.views[-1].strides[axis] == 0 and st.real_strides()[axis] == 0:
        try: return st.shrink(tuple((0, 1) if a == axis else (0, s) for a, s in enumerate(st.shape))) \
          .expand(st.shape[:axis] + (padded,) + st.shape[axis + 1:])
        except ValueError: pass   # an axis that may be empty has no first position: masked
      return st.pad_end_to(axis, padded)
    self.sts = [pad(st) for st in self.sts]

  def _add_padding_guard(self, axis: int, size) -> None:
    """A tracker of the kernel's shape that varies along `axis` only (stride 0 elsewhere): padded with the others, its
    valid is exactly "not padding" at any indices. It is no memory op of the AST: the value graph asks it for that
    valid and gives each reduce its identity where it is false (value_graph.ValueBuilder.unrolled_value)."""
    st = ShapeTracker.from_shape(tuple(size if a == axis else 1 for a in range(self.shape_len))).expand(self.full_shape)
    view = UOp(Ops.VIEW, dtypes.void, (), st)
    guard = UOp(Ops.CONST, dtypes.bool, (view,), ("padding guard", len(self.padding_guards)))
    self.memops, self.sts = self.memops + [guard], self.sts + [st]
    self.padding_guards += (guard,)

  def _pad_to(self, opt: Opt, axis: int, amount: int) -> None:
    """PADTO: grow a loop axis to a multiple of `amount` with masked-off positions (loads read 0, stores are skipped).
    A global axis is always safe; a reduce axis only where the padding adds exactly 0 to every reduce. A symbolic
    global axis gets the guard of a split (pad_symbolic_axis; ceil(n/amount)*amount), so that the splits after it
    divide and test one position each: a prompt's rows padded to a 64-row block tile, then upcast by 4 and spread
    over 16 threads, check row < n once per replica."""
    loop_reduce = self.first_reduce + self.group_for_reduces <= axis < self.first_upcast
    self._check(axis < self.global_dims or loop_reduce, f"{opt}: PADTO needs a global or reduce loop axis")
    size = self.full_shape[axis]
    if not isinstance(size, int):
      self._check(axis < self.global_dims, f"{opt}: PADTO of the symbolic reduce axis {axis} ({render_size(size)})")
      self._check(not divides(amount, size), f"{opt}: axis size {render_size(size)} is already a multiple")
      self._check(amount - 1 < vmax_of(size) * MAX_PADDING_FRACTION,
                  f"{opt}: padding axis {axis} of at most {vmax_of(size)} to a multiple of {amount} wastes too much")
      return self.pad_symbolic_axis(axis, amount)
    padded = round_up(size, amount)
    self._check(padded != size, f"{opt}: axis size {size} is already a multiple of {amount}")
    self._check(padded - size < size * MAX_PADDING_FRACTION,
                f"{opt}: padding axis {axis} from {size} to {padded} wastes too much")
    if self.is_reduce_axis(axis):
      self._check(all(reduce_ignores_padding(r) for r in self.reduceops),
                  f"{opt}: padding reduce axis {axis} would change the reduce {[r.arg[0] for r in self.reduceops]}")
    padding = tuple((0, padded - size) if d == axis else (0, 0) for d in range(self.shape_len))
    # an output's reduce axes have size 1 and stay so; every other tracker spans the full axis
    self.sts = [st if st.shape[axis] == 1 else st.pad(padding) for st in self.sts]

  # ---- tensor cores (OptOps.TC, tensor_cores.py)
  def drop_unit_reduce_axis(self, axis: int) -> None:
    """Remove a reduce axis left with size 1: it is no reduce axis any more, so in the loop region it would count as
    a local axis and move the tensor core's lanes."""
    if self.full_shape[axis] == 1: self.reshape_and_permute(lambda shape: shape[:axis] + shape[axis + 1:], None)

  # ---- launch facts
  @property
  def global_axis_sizes(self) -> tuple[int, ...]: return self.full_shape[:self.global_dims]
  @property
  def thread_axes(self) -> list[int]:
    """The block's thread axes, outermost thread id first: group-reduce axes, then local axes, so threadIdx.x is the
    innermost local (output) axis when there is one, else the innermost group axis."""
    group = range(self.first_reduce, self.first_reduce + self.group_for_reduces)
    return list(group) + list(range(self.global_dims, self.first_reduce))
  @property
  def local_axis_sizes(self) -> tuple[int, ...]: return tuple(self.full_shape[a] for a in self.thread_axes)

  def launch_dims(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global_size, local_size) for targets with thread ids, id 0 first: global_size[i] is the size of gidx{i}
    (blockIdx.x, .y, .z), local_size[i] of lidx{i}. ((threads,), (1,)) on the CPU. Raises KernelOptError when the
    axes cannot fit the target's limits (a symbolic size by its bound). A global size may be symbolic (an index UOp
    over the variables): the runner evaluates it per launch."""
    if not self.renderer.has_local: return ((self.threads or 1,), (1,))
    caps = self.renderer
    global_size = fold_dims(self.global_axis_sizes, caps.max_grid[:caps.max_global_dims])
    local_size = fold_dims(self.local_axis_sizes, caps.max_local_dims)
    return tuple(prod(g) for g in global_size) or (1,), tuple(prod(g) for g in local_size) or (1,)

  def _check_limits(self) -> None:
    """Threads per block, grid/block dimension limits and shared memory of a kernel for a target with thread ids."""
    caps = self.renderer
    threads = prod(self.local_axis_sizes)
    self._check(threads <= caps.max_local_size, f"{threads} threads per block > {caps.max_local_size}")
    self.launch_dims()
    nbytes = 0
    if self.group_for_reduces:
      # one shared array per reduce and output upcast replica, one slot per thread (see reduces.group_combine)
      replicas = prod(self.full_shape[a] for a in self.upcast_axes if not self.is_reduce_axis(a))
      nbytes += sum(r.dtype.itemsize for r in self.reduceops) * replicas * threads
    for load, padding in self.staged:
      plan = stage_plan(self, load, padding)
      nbytes += plan.buffer_elements * plan.buffers * load.dtype.itemsize
    self._check(nbytes <= caps.shared_memory_bytes, f"{nbytes} bytes of shared memory > {caps.shared_memory_bytes}")

  def estimate(self) -> tuple[sint, sint]:
    """(flops, bytes moved): ALU nodes × iterations, plus the bytes each buffer spans (read or written once). For a
    symbolic kernel both are expressions of its variables (a gather's, or a load through several Views, count at the
    variables' maximum); CompiledKernel.cost evaluates them per launch."""
    alu_nodes = sum(1 for u in self.ast.toposort() if u.op in ALU)
    nbytes: sint = 0
    for u in self.memops:
      if u.op is Ops.STORE: nbytes = nbytes + prod(self.output_shape) * u.src[2].dtype.itemsize
      elif is_gather_load(u):   # at most one table element per position, within the rows the index can pick
        nbytes = nbytes + min(memory_extent(u, self.view_of(u)), vmax_of(prod(self.full_shape))) * u.dtype.itemsize
      elif u.op is Ops.LOAD: nbytes = nbytes + self.view_of(u).buffer_extent_of_variables() * u.dtype.itemsize
    return canonical(alu_nodes * prod(self.full_shape)), canonical(nbytes)

def _compositions(n: int, parts: int):
  """Ways to cut n consecutive dims into `parts` non-empty runs, larger leading runs first."""
  if parts == 1:
    yield (n,)
    return
  for first in range(n - parts + 1, 0, -1):
    for rest in _compositions(n - first, parts - 1): yield (first,) + rest

def fold_dims(dims: tuple[int, ...], limits: tuple[int, ...]) -> list[tuple[int, ...]]:
  """Group consecutive dims into thread ids: at most len(limits) groups, each group's size within its id's limit.
  Returns the groups innermost first (group i is id i; limits[0] is x, the largest). Prefers one dim per id, then
  folding the leading dims together; the linearizer recovers each dim with // and %. Raises KernelOptError if no
  grouping fits."""
  if not dims: return []
  for n_ids in range(min(len(dims), len(limits)), 0, -1):
    for lengths in _compositions(len(dims), n_ids):
      groups, start = [], 0
      for length in lengths:
        groups.append(tuple(dims[start:start + length]))
        start += length
      groups.reverse()
      if all(vmax_of(prod(g)) <= limit for g, limit in zip(groups, limits)): return groups
  raise KernelOptError(f"dims {dims} do not fit thread ids with limits {limits}")

def memory_extent(memop: UOp, st: ShapeTracker) -> int:
  """1 + the largest element index a memory op may touch (0 if none): a gather's VIEW gives its first row; the loaded
  index may pick any row up to GatherAxis.size - 1."""
  extent = st.buffer_extent()
  if is_gather_load(memop) and extent > 0: extent += max(0, (memop.arg.size - 1) * memop.arg.stride)
  return extent

def reduce_ignores_padding(reduce: UOp) -> bool:
  """Whether a REDUCE_AXIS gives the same result when its axis is padded: it must be an ADD whose source is exactly 0
  where every memory op reads its padding (LOAD, CONST and ARANGE with a view all read 0 there; see the linearizer).
  The source is evaluated on those zeros with the kernels' own semantics (exec_alu); anything else is refused."""
  if reduce.arg[0] is not Ops.ADD: return False
  value = _value_in_padding(reduce.src[0])
  return value is not None and value == 0   # NaN, inf and 1 all refuse; -0.0 and False are zero

def _value_in_padding(root: UOp) -> Optional[object]:
  """The value of `root` where every memory op reads 0, or None when it can't be known."""
  values: dict[UOp, Optional[object]] = {}
  for u in root.toposort():   # sources first
    if u.op in MEMORY_OPS and u.src and u.src[-1].op is Ops.VIEW: out = truncate_to(0, u.dtype)
    elif u.op is Ops.CONST: out = u.arg
    elif u.op in ALU or u.op is Ops.CAST:
      operands = [values[s] for s in u.src]
      if any(x is None for x in operands): out = None
      elif u.op is Ops.CAST: out = truncate_to(operands[0], u.dtype)
      else:
        try: out = exec_alu(u.op, u.dtype, tuple(operands))
        except (KeyError, TypeError, ValueError, OverflowError): out = None
    else: out = None   # BITCAST, nested reduces and anything new: unknown, so padding is refused
    values[u] = out
  return values[root]
