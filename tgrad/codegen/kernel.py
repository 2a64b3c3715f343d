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
from typing import Optional
from tgrad.ops import UOp, Ops, ALU, is_gather_load
from tgrad.codegen.axes import MEMORY_OPS, KernelOptError, Opt, OptOps, TensorCoreUse, fold_dims, memory_extent
from tgrad.codegen.opts import MAX_UPCAST, apply, reduce_ignores_padding
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import sint, canonical, is_symbolic, render as render_size, vmax_of
from tgrad.helpers import prod, round_up
from tgrad.scalars import is_scalar_param

# re-exported: the vocabulary of opts lives in axes.py and opts.py; callers import it from here too
__all__ = ["Kernel", "KernelOptError", "Opt", "OptOps", "MAX_UPCAST", "fold_dims", "memory_extent",
           "reduce_ignores_padding", "is_gather_load"]

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
    try: apply(self, opt)
    except KernelOptError:
      (self.sts, self.memops, self.local_dims, self.group_for_reduces, self.upcasted, self.threads,
       self.dont_use_locals, self.tensor_core, self.staged, self.padding_guards) = before
      raise
    self.applied_opts.append(opt)

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
