"""Shared-memory staging (OptOps.SMEM): one input's tile per step of the reduce loop, copied by the block, read from
shared memory. Everything about it is here, in the order it is used:

  1. the opt's loads: `stageable_loads` numbers the loads SMEM may pick (OptOps.SMEM, opts.py, records one in
     AxisState.staged);
  2. the layout: `stage_plan` lays a staged load's tile out under the kernel's current axes (a StagePlan);
  3. the lowering (linearizer): `StagedTiles` defines the tiles, builds the block's copies of step 0 and of the next
     step (software pipelining, one barrier per step), and turns every read of a staged load into a tile LOAD.

The opts (opts.py) import this module for the loads and the layout (a tile's bytes count against shared memory);
the linearizer's value graph (value_graph.py) hands StagedTiles its memory addressing. Neither is imported here.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Iterator, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, simplify, is_gather_load
from tgrad.codegen.axes import AxisState
from tgrad.shape.sint import offset_by, to_uop
from tgrad.helpers import prod

# A staged tile is copied by each thread in runs of this many bytes (one 16-byte vector access where aligned).
STAGE_COPY_BYTES = 16
MAX_ROW_PADDING = 64   # the most unused elements SMEM may put after each tile row (bank-conflict padding)

@dataclass(frozen=True)
class StagePlan:
  """How OptOps.SMEM lays out one load's tile in shared memory. The tile is the load's values over the block's thread
  axes and the upcast axes it depends on, at one step of the reduce loops (the global and loop indices are fixed).
  `axes` are in the order of the load's memory strides (outermost first): the block copies the tile in that order,
  so neighbouring threads read neighbouring global addresses. The shared layout serves the reads: a kernel of ALU
  ops reads, per unrolled reduce step, every output replica's value (an outer product), so the reduce axes go
  outermost and a row is one step's slice. A tensor core's operands keep global memory's order (copies move runs as
  they are, asynchronously where the target can; a row is the innermost axes contiguous there). After each row
  `padding` unused elements shift the next row to other banks. With a reduce loop there are two buffers, alternated
  by the loop's parity, so one barrier per step separates every write of a buffer from the reads of its previous
  contents."""
  axes: tuple[int, ...]
  sizes: tuple[int, ...]
  strides: tuple[int, ...]       # each axis's element stride in the shared tile
  row: int
  padding: int
  buffers: int
  direct: bool = False           # the innermost axis is contiguous in both memories: copies move runs as they are
  @property
  def elements(self) -> int: return prod(self.sizes)
  @property
  def buffer_elements(self) -> int: return self.elements // self.row * (self.row + self.padding)

# ---- 1. the loads SMEM may pick

def stageable_loads(kernel: AxisState) -> list[UOp]:
  """The loads SMEM can stage, numbered by Opt.axis: global loads that feed the kernel's only reduce."""
  if len(kernel.reduceops) != 1 or kernel.row_store: return []
  under_reduce = set(kernel.reduceops[0].src[0].toposort())
  return [u for u in kernel.memops if u.op is Ops.LOAD and u in under_reduce and not is_gather_load(u)]

# ---- 2. the layout

def stage_plan(kernel: AxisState, load: UOp, padding: int) -> StagePlan:
  """The shared tile of a staged load under the kernel's current axes (see StagePlan)."""
  st = kernel.sts[kernel.memops.index(load)]
  full = kernel.full_shape
  strides = st.real_strides()
  tile_axes = [a for a in kernel.thread_axes + list(kernel.upcast_axes) if strides[a] != 0 and full[a] > 1]
  # memory order: the largest stride outermost; an axis without one constant stride (a mask, a reshape) counts as
  # outermost, and equal strides keep the kernel's axis order
  def order(axis: int): return (-(strides[axis] if strides[axis] is not None else 1 << 62), axis)
  axes = sorted(tile_axes, key=order)
  reduce_axes = [a for a in axes if kernel.is_reduce_axis(a)]
  other_axes = [a for a in axes if not kernel.is_reduce_axis(a)]
  if kernel.tensor_core is None: layout_axes, row_axes = reduce_axes + other_axes, len(other_axes)
  else:   # global memory's order: runs are copied as they are (cp.async on every GPU with tensor cores)
    layout_axes, row_axes, expected = axes, 0, 1
    for axis in reversed(axes):
      if strides[axis] != expected: break
      row_axes, expected = row_axes + 1, expected * full[axis]
  row = prod(full[a] for a in layout_axes[len(layout_axes) - row_axes:])
  padding = padding if row > 1 and row_axes < len(axes) else 0
  layout, stride = {}, 1
  for i in reversed(range(len(layout_axes))):
    layout[layout_axes[i]] = stride
    stride *= full[layout_axes[i]]
    if i == len(layout_axes) - row_axes: stride = stride // row * (row + padding)   # the row just closed is padded
  loops = kernel.first_reduce + kernel.group_for_reduces < kernel.first_upcast
  direct = bool(axes) and layout[axes[-1]] == 1 and strides[axes[-1]] == 1
  return StagePlan(tuple(axes), tuple(full[a] for a in axes), tuple(layout[a] for a in axes), row, padding,
                   2 if loops else 1, direct)

def copy_run(plan: StagePlan, memory_strides: tuple, limit: int) -> tuple[int, int, int]:
  """How many consecutive tile elements (at most `limit`) one thread copies: the innermost axes whose elements are
  consecutive in global memory (one vector load; the stores are one vector too where the tile keeps that order).
  Returns (width, axes wholly covered, part of the next axis covered; 1 if none)."""
  width, covered, expected = 1, 0, 1
  for axis, size in zip(reversed(plan.axes), reversed(plan.sizes)):
    if memory_strides[axis] != expected: break
    if limit % (width * size) == 0:
      width, covered, expected = width * size, covered + 1, expected * size
      continue
    part = max(d for d in range(1, size + 1) if size % d == 0 and limit % (width * d) == 0)
    return width * part, covered, part
  return width, covered, 1

# ---- 3. the lowering

class StagedTiles:
  """The shared tiles of a kernel's staged loads, software-pipelined over the reduce loop: before the loop the block
  copies step 0's tiles into buffer 0 (then `first_barrier`); each step reads its tiles from buffer step % 2, while
  the global loads of step + 1's tiles are issued at the top of the body and stored into the other buffer at its
  end, followed by one barrier (`next_copy`; StagePlan says why one is enough). A target that copies asynchronously
  (cp.async) gets the stores of unmasked direct copies (runs contiguous in both memories) at the top too
  (`early_stores`): it renders such a load and store as one copy that completes by the barrier. Without a reduce loop
  there is just the first copy.

  Input: the kernel, its axis indices, the memory addressing of its loads (global_load, memory_strides) and the
  kernel's counter of accumulator and array numbers. `read(load, idxs)` is a staged load's value at idxs."""
  def __init__(self, kernel: AxisState, indices: list[Optional[UOp]], addressing, ids: Iterator[int]):
    self.kernel, self.indices, self.addressing = kernel, indices, addressing
    self.tile_indices: dict[tuple, UOp] = {}   # memo of tile_index's symbolic part
    self.stages: dict[UOp, tuple[StagePlan, UOp, UOp]] = {}   # staged load → (plan, its tile, offset of this step's)
    self.next_copy: Optional[tuple[tuple[UOp, ...], UOp]] = None   # (reduce loop ranges, barrier after the next copy)
    self.early_stores: set[UOp] = set()   # next-step copies issued at the top of the body (asynchronous copies)
    k = kernel
    loop_axes = list(range(k.first_reduce + k.group_for_reduces, k.first_upcast))
    steps = prod(k.full_shape[a] for a in loop_axes)
    step = to_uop(0)
    for a in loop_axes: step = step * k.full_shape[a] + indices[a]
    plans = [(load, stage_plan(k, load, padding)) for load, padding in k.staged]
    tiles = {}
    for load, plan in plans:
      size = plan.buffer_elements * plan.buffers
      tiles[load] = UOp(Ops.DEFINE_LOCAL, load.dtype, (), (f"tile{next(ids)}", size))
      offset = simplify((step % 2) * plan.buffer_elements) if plan.buffers == 2 else to_uop(0)
      self.stages[load] = (plan, tiles[load], offset)
    first = [store for load, plan in plans
             for store in self.copy_tile(load, plan, tiles[load], self.loop_indices(loop_axes, to_uop(0)), to_uop(0))]
    self.first_barrier = UOp(Ops.BARRIER, dtypes.void, tuple(first))
    if loop_axes and steps > 1:
      # the last step copies step 0 again (in bounds, into the buffer this step doesn't read) instead of a guard
      following = simplify((step + 1) % steps)
      after = []
      for load, plan in plans:
        stores = self.copy_tile(load, plan, tiles[load], self.loop_indices(loop_axes, following),
                                simplify(((step + 1) % 2) * plan.buffer_elements))
        after += stores
        if plan.direct and k.renderer.async_copy:   # only unmasked runs become cp.async; the rest wait for data
          self.early_stores.update(st for st in stores if st.src[2].op is Ops.LOAD and len(st.src[2].src) == 2)
      self.next_copy = (tuple(indices[a] for a in loop_axes), UOp(Ops.BARRIER, dtypes.void, tuple(after)))

  def loop_indices(self, loop_axes: list[int], flat_step: UOp) -> dict[int, UOp]:
    """Each reduce loop's index at a step of the flattened loops (the last loop fastest)."""
    full = self.kernel.full_shape
    return {a: simplify((flat_step // prod(full[b] for b in loop_axes[i + 1:])) % full[a])
            for i, a in enumerate(loop_axes)}

  def copy_tile(self, load: UOp, plan: StagePlan, tile: UOp, loop_indices: dict[int, UOp], offset: UOp) -> list[UOp]:
    """The STOREs of the block's copy of one tile of `load` (reduce loops at `loop_indices`) into `tile` at
    `offset`: thread t copies runs of `width` consecutive tile elements (one vector access where the renderer can),
    runs t, t + threads, t + 2·threads, …; the copy reads global memory where the kernel would (masks included)."""
    k = self.kernel
    thread_axes = k.thread_axes
    threads = prod(k.full_shape[a] for a in thread_axes)
    thread = to_uop(0)
    for a in thread_axes: thread = thread * k.full_shape[a] + self.indices[a]
    width, covered, part = copy_run(plan, self.addressing.memory_strides(load), STAGE_COPY_BYTES // load.dtype.itemsize)
    # the run's position: the axes it doesn't cover, the partly covered one counted in parts of `part`
    outer = len(plan.axes) - covered
    run_sizes = plan.sizes[:outer - 1] + (plan.sizes[outer - 1] // part,) if outer else ()
    runs = plan.elements // width
    stores = []
    for copy in range(-(-runs // threads)):
      run = simplify(thread + copy * threads)
      in_tile = simplify(run.lt(runs)) if (copy + 1) * threads > runs else None
      run_coords, rest = [], run
      for size in reversed(run_sizes):
        run_coords.append(simplify(rest % size))   # always in range: the load needs no gate
        rest = simplify(rest // size)
      run_coords.reverse()
      # the run's first element is indexed in full; the others lie `lane` further in global memory (copy_run) and a
      # constant further in the tile, under the same mask (a masked axis has no constant stride, so no run covers it)
      coords = (run_coords[:-1] + [simplify(run_coords[-1] * part)] if outer else []) + [to_uop(0)] * covered
      idxs = list(self.indices)
      for a in list(thread_axes) + list(k.upcast_axes): idxs[a] = to_uop(0)   # the load ignores these
      for a, index in loop_indices.items(): idxs[a] = index
      for a, c in zip(plan.axes, coords): idxs[a] = c
      first_value, first_slot = self.addressing.global_load(load, tuple(idxs)), self.tile_index(plan, offset, coords)
      for lane in range(width):
        tile_offset, rest_lane = 0, lane
        for size, stride in zip(reversed(plan.sizes[outer:]), reversed(plan.strides[outer:])):
          tile_offset += (rest_lane % size) * stride
          rest_lane //= size
        if outer: tile_offset += rest_lane * plan.strides[outer - 1]
        value = first_value if first_value.op is not Ops.LOAD else \
          UOp(Ops.LOAD, load.dtype, (first_value.src[0], offset_by(first_value.src[1], lane)) + first_value.src[2:])
        stores.append(UOp(Ops.STORE, dtypes.void, (tile, offset_by(first_slot, tile_offset), value) +
                          (() if in_tile is None else (in_tile,))))
    return stores

  def tile_index(self, plan: StagePlan, offset: UOp, coords: list[UOp]) -> UOp:
    """offset + Σ coordinate·stride: the part of symbolic coordinates simplified once (replicas of a kernel differ
    only in constant coordinates), the constant part added to it."""
    constant = sum(c.arg * stride for c, stride in zip(coords, plan.strides) if c.op is Ops.CONST)
    symbolic = tuple((c, stride) for c, stride in zip(coords, plan.strides) if c.op is not Ops.CONST)
    if (key := (offset, symbolic)) not in self.tile_indices:
      index = offset
      for c, stride in symbolic: index = index + c * stride
      self.tile_indices[key] = simplify(index)
    return offset_by(self.tile_indices[key], constant)

  def read(self, load: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A staged load at idxs: a LOAD of its tile that depends on the first copy's barrier."""
    plan, tile, offset = self.stages[load]
    return UOp(Ops.LOAD, load.dtype, (tile, self.tile_index(plan, offset, [idxs[a] for a in plan.axes]),
                                      self.first_barrier))
