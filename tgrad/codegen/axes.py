"""AxisState: one kernel at one point of its optimization, as an immutable value, and the vocabulary of opts.

Input: a kernel AST from the scheduler (a SINK of STOREs whose memory ops carry ShapeTrackers) and the target's
renderer (`AxisState.of`). All ShapeTrackers share one rank; axes are ordered by role:

  [ global | local | group-reduce | reduce loops | upcast/unroll ]
   0 ..      ..     first_reduce ..              shape_len - upcasted .. shape_len

An `Opt(op, axis, amount)` maps a state to a new one (opts.py): it splits an axis and moves the piece to its role's
place (`shift_to`), or raises KernelOptError. A state never changes, so a refused opt leaves nothing to undo, a copy
is the state itself, and its shape facts are computed once. A gather LOAD (arg GatherAxis, see ops.py) is a memory op
like any other: its VIEW is reshaped by every opt; only its row along the gathered axis comes from a loaded value.
"""
from __future__ import annotations
import dataclasses
from dataclasses import dataclass
from enum import Enum, auto
from functools import cached_property
from typing import Any, Callable, Optional
from tgrad.dtype import DType
from tgrad.ops import UOp, Ops, ALU, is_gather_load
from tgrad.codegen.renderer import TensorCore
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import sint, canonical, ceil_div, is_symbolic, render as render_size, vmax_of
from tgrad.helpers import prod, round_up
from tgrad.scalars import is_scalar_param

class KernelOptError(Exception):
  """An optimization that is not legal for this kernel (wrong axis, amount that doesn't divide, …)."""

class OptOps(Enum):
  UPCAST = auto(); UNROLL = auto(); LOCAL = auto(); GROUP = auto(); GROUPTOP = auto()  # noqa: E702
  NOLOCALS = auto(); PADTO = auto(); SWAP = auto(); TC = auto(); THREAD = auto(); SMEM = auto()  # noqa: E702
  WGMMA = auto(); SGEMM = auto(); TF32X3 = auto()  # noqa: E702
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
# A global axis too big for the grid is split in two so that the outer part fits a grid dimension's limit; at most this
# many splits (each halves the largest axis at least; far more than any buffer a GPU can hold needs).
MAX_GRID_SPLITS = 8

@dataclass(frozen=True)
class TensorCoreUse:
  """How OptOps.TC maps a kernel's reduce onto a tensor core: `reduce` = Σ a·b where `a` (a load of dtype_in, or for
  a TF32 core a float32 load rounded to TF32) varies with the tile's rows and `b` with its columns; rows_axis and
  columns_axis are the global axes that TC split (what is left of them counts tiles). `upcasts_before` counts the
  upcast axes made before TC (they stay before its own)."""
  core: TensorCore
  reduce: UOp
  a: UOp
  b: UOp
  rows_axis: int
  columns_axis: int
  upcasts_before: int = 0

@dataclass(frozen=True)
class WarpgroupMatmul:
  """How OptOps.WGMMA computes a whole kernel (warpgroup_mma.py): out[M×N] = a[M×K] · b[N×K]ᵀ (b K×N when b_n_major)
  in `dtype` (float32: TF32, the kernel rounding the raw floats; with `split_tf32` 3xTF32, float32-class) with float32
  accumulators, one block per BM×BN tile
  (BM = 64 · warpgroups) over `stages` shared-memory buffers. `arguments` names each kernel parameter's role ("out",
  "a", "b") in parameter order. With `tma` the tiles are loaded through tensor maps by one more warpgroup (the
  producer) beside the `warpgroups` that multiply.
  M may be symbolic (an index expression of `variables`, the kernel's variable parameters after its buffers, sorted);
  A's element (row, kk) is at row·a_row_stride + (kk / a_segment)·a_segment_stride + kk % a_segment (0s: a row-major
  M×K A); the output is `out_dtype` (None: `dtype`; float32: the sums unrounded)."""
  m: sint
  n: int
  k: int
  dtype: DType
  b_n_major: bool
  arguments: tuple[str, ...]
  warpgroups: int = 2
  block_n: int = 256
  stages: int = 4
  tma: bool = False
  a_row_stride: sint = 0
  a_segment: int = 0
  a_segment_stride: sint = 0
  out_dtype: Optional[DType] = None
  variables: tuple[str, ...] = ()
  split_tf32: bool = False   # plain float32 inputs multiplied by 3xTF32 (OptOps.TF32X3: big and small TF32 parts)
  a_registers: bool = False  # 3xTF32 with A's parts in registers (wgmma_split.py)
  WARPGROUP_THREADS = 128
  WARPGROUP_ROWS = 64
  @property
  def block_m(self) -> int: return self.warpgroups * self.WARPGROUP_ROWS
  def launch_dims(self) -> tuple[tuple[sint, ...], tuple[int, ...]]:
    """(global_size, local_size): blockIdx.x over column tiles, .y over row tiles (an expression of the variables for
    a symbolic M: the runner evaluates it per launch); 128 threads per warpgroup (and a producer warpgroup with
    TMA)."""
    warpgroups = self.warpgroups + (1 if self.tma else 0)
    return (-(-self.n // self.block_n), ceil_div(self.m, self.block_m)), (warpgroups * self.WARPGROUP_THREADS,)

@dataclass(frozen=True)
class SimtMatmul:
  """How OptOps.SGEMM computes a whole kernel (simt_matmul.py): out[M×N] = a[M×K] · b[K×N] in float32 FMAs, one block
  per block_m × block_n tile, each thread a thread_m × thread_n tile of accumulators, K in steps of 8 through two
  shared-memory buffers (runtime/cuda/sgemm.py writes it). `a_m_major`: A is stored K×M (M contiguous) instead of
  M×K; `b_n_major`: B is stored K×N instead of N×K. `arguments` names each kernel parameter's role ("out", "a", "b")
  in parameter order. `min_blocks`: the blocks per SM the compiler must leave registers for (__launch_bounds__)."""
  m: int
  n: int
  k: int
  a_m_major: bool
  b_n_major: bool
  arguments: tuple[str, ...]
  block_m: int = 128
  block_n: int = 128
  thread_m: int = 8
  thread_n: int = 8
  min_blocks: int = 1
  @property
  def threads(self) -> int: return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)
  def launch_dims(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global_size, local_size): blockIdx.x over column tiles, .y over row tiles."""
    return (-(-self.n // self.block_n), -(-self.m // self.block_m)), (self.threads,)

@dataclass(frozen=True, eq=False)
class AxisState:
  """A kernel's axes at one point of its optimization: its AST and target, one ShapeTracker per memory op, the roles
  of the axes (counts of local, group and upcast axes, a THREAD split, NOLOCALS), what TC and SMEM laid over them,
  and the opts applied so far. Build one with `AxisState.of(ast, renderer)`; opts.py maps it to new ones."""
  ast: UOp
  renderer: Any
  memops: tuple[UOp, ...]          # memory ops (those with a VIEW), stores first; sts[i] is memops[i]'s ShapeTracker
  sts: tuple[ShapeTracker, ...]
  reduceops: tuple[UOp, ...]
  row_store: bool = False          # a row kernel: sts[0] is a reference tracker (see _with_row_reference)
  function_name: str = ""          # the rendered function's name: the unoptimized shape, the same under any opts
  local_dims: int = 0
  group_for_reduces: int = 0
  upcasted: int = 0
  threads: int = 0                 # THREAD: axis 0 is split across this many CPU threads
  dont_use_locals: bool = False    # NOLOCALS
  tensor_core: Optional[TensorCoreUse] = None
  warpgroup_matmul: Optional[WarpgroupMatmul] = None   # WGMMA: the whole kernel is one warpgroup matmul
  simt_matmul: Optional[SimtMatmul] = None   # SGEMM: the whole kernel is one float32 matmul template
  staged: tuple[tuple[UOp, int], ...] = ()   # SMEM: (load, padding per row) staged in shared memory
  # guarded GROUPs of symbolic reduce axes whose reduces don't ignore padding: one tracker each (in memops/sts, so
  # every opt reshapes it), valid exactly where the split axis is not padding (see opts._add_padding_guard)
  padding_guards: tuple[UOp, ...] = ()
  applied_opts: tuple[Opt, ...] = ()

  @staticmethod
  def of(ast: UOp, renderer) -> AxisState:
    """The unoptimized kernel of an AST: reduce axes last, neighbouring axes of one role merged, global axes fit to
    the grid. Raises KernelOptError when they can't fit."""
    nodes = ast.toposort()
    reads = [u for u in nodes if u.op in MEMORY_OPS and u.op is not Ops.STORE and u.src and u.src[-1].op is Ops.VIEW]
    memops = tuple(u for u in nodes if u.op is Ops.STORE) + tuple(reads)
    state = AxisState(ast, renderer, memops, tuple(AxisState.view_of(u) for u in memops),
                      tuple(u for u in nodes if u.op is Ops.REDUCE_AXIS))
    state = _fit_grid(_merge_axes(_reduce_axes_last(_with_row_reference(state))))
    return state.replace(function_name=state.name)

  def replace(self, **changes) -> AxisState: return dataclasses.replace(self, **changes)

  @staticmethod
  def view_of(u: UOp) -> ShapeTracker: return (u.src[1] if u.op is Ops.STORE else u.src[-1]).arg

  @property
  def row_passes(self) -> int:
    """How many times the kernel walks each row: once per pass of reduces (`reduce_levels`), once more for a row
    store. 1 for a plain reduce kernel, 0 without reduces."""
    return max(self.reduce_levels.values(), default=-1) + 1 + self.row_store

  @cached_property
  def reduce_levels(self) -> dict[UOp, int]:
    """Each reduce's pass over the rows: 0 for one that reads no other reduce, else one more than the latest pass it
    reads (a row kernel's variance reads its mean: passes 0 and 1; its store runs after the last)."""
    levels: dict[UOp, int] = {}
    for r in self.reduceops:   # sources first (toposort order)
      levels[r] = 1 + max((levels[u] for u in r.src[0].toposort() if u.op is Ops.REDUCE_AXIS), default=-1)
    return levels

  # ---- shape facts
  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)
  @cached_property
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
  @cached_property
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
    if self.warpgroup_matmul is not None: return self.warpgroup_matmul.launch_dims()
    if self.simt_matmul is not None: return self.simt_matmul.launch_dims()
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

  # ---- reshaping every ShapeTracker at once (each returns a new state)
  def reshape_and_permute(self, new_shape_fn: Optional[Callable], order: Optional[list[int]], **changes) -> AxisState:
    """Every tracker reshaped by new_shape_fn(its shape), then permuted by `order` (either may be None); `changes`
    are other fields of the new state (a role's count)."""
    new_sts = []
    for st in self.sts:
      if new_shape_fn is not None: st = st.reshape(tuple(new_shape_fn(st.shape)))
      if order is not None: st = st.permute(tuple(order))
      new_sts.append(st)
    return self.replace(sts=tuple(new_sts), **changes)

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None,
               **changes) -> AxisState:
    """Split `axis` into (size/amount, amount) — (amount, size/amount) if top — and move the `amount` piece so it
    lands just before `insert_before` (default: the end); `changes` as in reshape_and_permute."""
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
    return self.reshape_and_permute(split, order, **changes)

# ---- the unoptimized layout (AxisState.of)

def _with_row_reference(state: AxisState) -> AxisState:
  """A row kernel (schedule.py rule 2b) stores the whole row it reduces: its STORE spans the reduce axes. Axis roles
  come from sts[0] (`output_shape`), so such a kernel gets a reference tracker there, of the reduces' result shape
  (the reduce axes have size 1), paired in `memops` with the first reduce; the STORE follows it. Every opt reshapes
  it with the others, so the roles stay right. Sets row_store on the kernel that is one. A kernel with several
  outputs (schedule.py rule 2c) is one when any of its STOREs spans the reduce axes (`stores_rows`)."""
  if not state.reduceops: return state
  axes = state.reduceops[0].arg[1]
  row_stores = [st for u, st in zip(state.memops, state.sts)
                if u.op is Ops.STORE and any(st.shape[a] != 1 for a in axes)]
  if not row_stores: return state
  reference = ShapeTracker.from_shape(tuple(1 if i in axes else s for i, s in enumerate(row_stores[0].shape)))
  return state.replace(memops=(state.reduceops[0],) + state.memops, sts=(reference,) + state.sts, row_store=True)

def _reduce_axes_last(state: AxisState) -> AxisState:
  reduce_axes = [i for i in range(state.shape_len) if state.is_reduce_axis(i)]
  order = [i for i in range(state.shape_len) if i not in reduce_axes] + reduce_axes
  return state.reshape_and_permute(None, order) if order != list(range(state.shape_len)) else state

def _merge_axes(state: AxisState) -> AxisState:
  """Merge neighbouring axes of the same role that every ShapeTracker can merge without a new View."""
  axis = state.shape_len - 2
  while axis >= 0:
    full, out = state.full_shape, state.output_shape
    same_role = state.is_reduce_axis(axis) == state.is_reduce_axis(axis + 1)
    if same_role and _mergeable(state, axis):
      def merge(shape, a=axis): return shape[:a] + (prod(shape[a:a + 2]),) + shape[a + 2:]
      state = state.reshape_and_permute(merge, None)
    elif full[axis] == 1 and out[axis] == 1 and state.shape_len > 1:   # drop size-1 axes
      def drop(shape, a=axis): return shape[:a] + shape[a + 1:]
      state = state.reshape_and_permute(drop, None)
    axis -= 1
  return state

def _mergeable(state: AxisState, axis: int) -> bool:
  for st in state.sts:
    merged = st.reshape(st.shape[:axis] + (prod(st.shape[axis:axis + 2]),) + st.shape[axis + 2:])
    if len(merged.views) > len(st.views): return False
    if len(st.views) > 1 and merged.views[:-1] != st.views[:-1]: return False
  return True

def _fit_grid(state: AxisState) -> AxisState:
  """On a target with thread ids, make the global axes fit the grid (launch_dims): while they don't, split the
  largest into (outer, inner) with inner the smallest power of two that leaves outer within the smallest grid
  limit; an axis it doesn't divide is padded first (masked off: the padding's threads store nothing). So an axis of
  2^33 becomes (2^15, 2^18): blockIdx.y and a blockIdx.x the heuristics may still split into blocks."""
  caps = state.renderer
  if not caps.has_local: return state
  limits = caps.max_grid[:caps.max_global_dims]
  outer_limit = min(limits)
  for _ in range(MAX_GRID_SPLITS):
    try:
      fold_dims(state.global_axis_sizes, limits)
      return state
    except KernelOptError: pass
    axis = max(range(state.global_dims), key=lambda a: vmax_of(state.full_shape[a]))
    size = state.full_shape[axis]
    if not isinstance(size, int): break   # a symbolic axis is not split: its bound must fit the grid
    inner = max(2, 1 << (-(-size // outer_limit) - 1).bit_length())
    if inner > limits[0] or size <= 1: break
    if size % inner:
      padding = tuple((0, round_up(size, inner) - size) if d == axis else (0, 0) for d in range(state.shape_len))
      state = state.replace(sts=tuple(st.pad(padding) for st in state.sts))
    def split(shape, a=axis, piece=inner): return shape[:a] + (shape[a] // piece, piece) + shape[a + 1:]
    state = state.reshape_and_permute(split, None)
  raise KernelOptError(f"global dims {state.global_axis_sizes} of kernel shape {state.full_shape} do not fit the grid "
                       f"limits {limits} of {type(caps).__name__}")

# ---- thread ids and memory extents

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
