"""The linearizer: Kernel → a flat list of UOps that a renderer walks top to bottom.

Step 1 builds the kernel's value graph: every axis gets an index UOp (a RANGE loop, a SPECIAL thread id, or a
constant per upcast replica), every memory op's ShapeTracker turns into (index, valid) math, and each reduce
becomes a REDUCE node over its loop ranges (unrolled replicas folded in). Step 2 emits that graph in order:
global loops, then per reduce an accumulator (DEFINE_ACC), its loops, the ASSIGN of the update and ENDRANGE,
then the stores. The result reads as a program:

  DEFINE_GLOBAL 0, DEFINE_GLOBAL 1, RANGE r0 (0..N), DEFINE_ACC a0, RANGE r1 (0..K), LOAD, ADD, ASSIGN a0,
  ENDRANGE r1, REDUCE (reads a0), STORE, ENDRANGE r0

A reduce of a value that doesn't change along its loops is no loop (a sum is value × trips: `Tensor.ones(2**40).sum()`
costs nothing). A float sum whose accumulator would add more than ACCUMULATE_BLOCK values sums in blocks: an inner
loop adds one block into a fresh accumulator, an outer loop adds the block totals with compensated (Kahan) summation
(see `accumulation_split`).

A tensor-core kernel (Kernel.tensor_core) reduces with WMMAs instead: per K step each lane gathers its A and B
fragments (VECTORIZE of loads indexed by the core's fragment layouts), one WMMA per tile updates a fragment
accumulator, and each output replica is one element (GEP) of its tile's accumulator.

A gather (a LOAD with arg GatherAxis) adds to its VIEW's address the index value it reads, clamped into the table's
rows (`clamp_index`): a data-dependent load that can never leave the table.

A load staged in shared memory (OptOps.SMEM, Kernel.stage_plan) is read from a DEFINE_LOCAL tile instead: at each
step of the reduce loop the block's threads copy the tile from global memory (STOREs into the tile), a BARRIER
follows, and every read of the load becomes a LOAD of the tile that depends on that barrier.
"""
from __future__ import annotations
import itertools
from typing import Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ALU, simplify, split_terms, build_sum, exec_alu
from tgrad.codegen.transcendental import decompose
from tgrad.codegen.kernel import Kernel, StagePlan, STAGE_COPY_BYTES, fold_dims, is_gather_load
from tgrad.codegen.renderer import FragmentLayout, MatrixLoad, TensorCore
from tgrad.schedule import identity_of_reduce
from tgrad.shape.sint import canonical, ceil_div, to_uop, vmax_of
from tgrad.helpers import prod

BUILT_WHOLE = (Ops.LOAD, Ops.CONST, Ops.ARANGE, Ops.REDUCE_AXIS)   # the AST nodes Linearizer.build_leaf builds
FOLD_MIN_ACCUMULATORS = 4   # from this many accumulators in one loop, unrolled values fold into each one by one
# The most values one float accumulator adds in sequence. A running float32 sum of n values has a rounding error that
# grows like n·ε (a sum of 2^24 ones stops growing at 16,777,216; 65,536 copies of 0.1 are 6e-4 off). Summing blocks of
# at most this many values, then the block totals with Kahan's compensation, bounds it by about block·ε whatever n is
# (4e-5 for 0.1 repeated; random values ~1e-7). The totals' loop costs 4 adds per block; LLVM keeps its vectorized
# block loop (64 lanes of 64 values each). Smaller reduces are untouched.
ACCUMULATE_BLOCK = 1 << 12
# The same limit for a register tile (FOLD_MIN_ACCUMULATORS or more accumulators, e.g. a matmul): each block adds two
# live accumulators per output around the inner loop, so tiles block only past 65,536 values, as BLAS adds K panels
# (matmuls with K ≤ 65,536 keep their code; a column sum over millions of rows still can't stall at 2^24).
TILE_ACCUMULATE_BLOCK = 1 << 16
# how far below ACCUMULATE_BLOCK a block may shrink to divide its axis exactly (a loop end without a min)
BLOCK_DIVISOR_SLACK = 2
BLOCK_LOOP_ARG = 2000   # RANGE arg of the loop over blocks of reduce axis a: BLOCK_LOOP_ARG + a
GROUP_LOOP_ARG = 1000   # RANGE arg of the loop over a GROUP's partials along axis a: GROUP_LOOP_ARG + a
# A row kernel (Kernel.row_store, schedule.py rule 2b) walks its rows in several passes: pass 0 holds the reduces that
# read no other reduce, pass p the reduces reading pass p - 1's results, and the store runs in a pass after the last.
# Each pass has loops of its own (the same loop reused would fuse passes that must run one after the other): pass p's
# RANGE args are those of pass 0 plus PASS_LOOP_ARG·p.
PASS_LOOP_ARG = 10000

def _index_const(value: int) -> UOp: return UOp.const(dtypes.index, value)

def fold_constants(u: UOp) -> UOp:
  """An ALU op of constants is the constant exec_alu computes. Kernels never hand such an op to a device compiler:
  NVRTC's C++ front end treats `0.0f / 0.0f` as undefined and folded `(-(0.0f / 0.0f)) != (-(0.0f / 0.0f))` to
  false (an argmin over the NaN mean of an empty axis answered 1, not 0: fuzz_ops seed 0 case 1302)."""
  if u.op not in ALU or not u.src or any(s.op is not Ops.CONST for s in u.src): return u
  try: return UOp.const(u.dtype, exec_alu(u.op, u.dtype, tuple(s.arg for s in u.src)))
  except (TypeError, OverflowError): return u

def _unfolded_specials(prefix: str, dims: tuple[int, ...], limits: tuple[int, ...]) -> list[UOp]:
  """Thread ids for dims, last dim on id 0 (x: the fastest-varying and the one with the largest limit). Dims that
  share an id (fold_dims: too many dims, or a dim over its id's limit) are recovered with // and %."""
  out: list[UOp] = []
  for id_number, group in reversed(list(enumerate(fold_dims(dims, limits)))):   # outermost group first
    special = UOp(Ops.SPECIAL, dtypes.index, (), (f"{prefix}{id_number}", prod(group)))
    for i, size in enumerate(group):
      out.append(simplify((special // prod(group[i + 1:])) % size) if len(group) > 1 else special)
  return out

def k_order(core: TensorCore, offset: int, tig: UOp) -> UOp:
  """Where the kernel reads the k = tig·stride + offset of a tensor-core step (A's column, B's row). Any order of the
  step's K positions sums the same, as long as A and B agree: lane tig's k (2·tig + 0, 1, 8, 9 for m16n8k16) are
  read at 4·tig + 0, 1, 2, 3, so a K-contiguous operand is one aligned 8-byte load per row."""
  offsets = sorted(set(core.a.cols))
  assert core.a.col_lane == core.b.row_lane and offsets == sorted(set(core.b.rows)), "A and B must share the K layout"
  return simplify(tig * len(offsets) + offsets.index(offset))

class Linearizer:
  def __init__(self, kernel: Kernel):
    self.k = kernel
    self.renderer = kernel.renderer
    self.acc_count = 0
    self.memo: dict[tuple, UOp] = {}
    self.view_of = {u: st for u, st in zip(kernel.memops, kernel.sts)}
    self.group_loops: set[UOp] = set()   # the RANGEs over a GROUP's partials that only the storing thread runs
    self.levels = kernel.reduce_levels    # each reduce's pass (see PASS_LOOP_ARG)
    self.store_pass = max(self.levels.values()) + 1 if kernel.row_store else None
    # every thread of a GROUP needs each reduce's result when a later pass reads it: all of them combine the partials
    self.shared_results = kernel.row_store or any(self.levels.values())
    self.pass_loops: dict[int, dict[int, UOp]] = {}   # pass → reduce loop axis → its RANGE in that pass
    self.reduces: dict[tuple, UOp] = {}   # (REDUCE_AXIS, indices with the reduce axes at 0) → its value
    self.tc_tiles: dict[tuple, UOp] = {}  # a tensor-core tile's accumulated fragment, by (reduce, indices)
    self.stages: dict[UOp, tuple[StagePlan, UOp, UOp]] = {}   # staged load → (plan, its tile, offset of this step's)
    self.stage_barrier: Optional[UOp] = None    # after the first copy of every staged tile
    self.tile_indices: dict[tuple, UOp] = {}   # memo of tile_index's symbolic part
    self.strides: dict[UOp, tuple] = {}         # memory op → its ShapeTracker's real strides
    self.indexings: dict[tuple, tuple[UOp, UOp]] = {}   # memo of `indexed`
    self.stage_next: Optional[tuple[tuple[UOp, ...], UOp]] = None   # (reduce loop ranges, barrier after the next copy)
    self.early_stores: set[UOp] = set()   # next-step copies issued at the top of the body (asynchronous copies)
    self.matrix_loads = False   # tensor-core fragments come from staged tiles as MatrixLoads (K read in its order)
    self.matrix_lane_coords: dict[bool, dict[int, UOp]] = {}   # per operand (B: True): a lane's row coordinates

  # ---- step 1: the value graph
  def axis_indices(self) -> list[Optional[UOp]]:
    """One index per axis; upcast axes get None (they are constants per replica)."""
    k = self.k
    full = k.full_shape
    idx: list[Optional[UOp]] = [None] * k.shape_len
    def loop(axis: int) -> UOp: return UOp(Ops.RANGE, dtypes.index, (_index_const(0), to_uop(full[axis])), axis)
    if self.renderer.has_local:
      caps = self.renderer
      idx[:k.global_dims] = _unfolded_specials("gidx", k.global_axis_sizes, caps.max_grid[:caps.max_global_dims])
      for axis, index in zip(k.thread_axes, _unfolded_specials("lidx", k.local_axis_sizes, caps.max_local_dims)):
        idx[axis] = index
    else:
      for axis in range(k.global_dims):
        idx[axis] = UOp(Ops.SPECIAL, dtypes.index, (), ("core", full[0])) if axis == 0 and k.threads else loop(axis)
    for axis in range(k.first_reduce + k.group_for_reduces, k.first_upcast): idx[axis] = loop(axis)
    return idx

  def pass_indices(self, level: int) -> dict[int, UOp]:
    """The index of each reduce loop axis in pass `level`: pass 0 uses the kernel's own loops (axis_indices), later
    passes loops of their own (PASS_LOOP_ARG)."""
    k = self.k
    if level not in self.pass_loops:
      loop_axes = range(k.first_reduce + k.group_for_reduces, k.first_upcast)
      self.pass_loops[level] = {a: self.base_idx[a] if level == 0 else
                                UOp(Ops.RANGE, dtypes.index, (_index_const(0), to_uop(k.full_shape[a])),
                                    PASS_LOOP_ARG * level + a) for a in loop_axes}
    return self.pass_loops[level]

  def build(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """The value of AST node `node` at axis indices `idxs`. Elementwise ops are walked on an explicit stack, children
    first and in order (any depth of chain); memory ops and reduces are built where the walk meets them (a reduce
    builds its own source with a nested call: one level per reduce inside a kernel)."""
    stack: list[tuple[UOp, bool]] = [(node, False)]
    while stack:
      u, sources_built = stack.pop()
      key = (u, idxs)
      if key in self.memo: continue
      if u.op in BUILT_WHOLE: self.memo[key] = self.build_leaf(u, idxs)
      elif not sources_built:
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(u.src))
      else: self.memo[key] = fold_constants(UOp(u.op, u.dtype, tuple(self.memo[(s, idxs)] for s in u.src), u.arg))
    return self.memo[(node, idxs)]

  def build_leaf(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A memory op (load, constant, arange) or a reduce at `idxs`."""
    if node.op is Ops.LOAD and node in self.stages: return self.staged_load(node, idxs)
    if is_gather_load(node): return self.gather_load(node, idxs)
    if node.op is Ops.LOAD: return self.global_load(node, idxs)
    if node.op is Ops.CONST and not node.src: return node
    if node.op is Ops.CONST and isinstance(node.arg, UOp):   # a symbolic constant (e.g. a mean's count): its value
      _, valid = self.view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(node.arg.cast(node.dtype), UOp.const(node.dtype, 0)))
    if node.op is Ops.CONST:
      _, valid = self.view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(UOp.const(node.dtype, node.arg), UOp.const(node.dtype, 0)))
    if node.op is Ops.ARANGE:
      index, valid = self.view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(index, _index_const(0))).cast(node.dtype)
    # a reduce's result doesn't vary along its own axes: one per position of the others, wherever it is read (a row
    # kernel reads it at every position of the row, and inside later reduces' loops)
    canonical = tuple(_index_const(0) if self.k.is_reduce_axis(a) else x for a, x in enumerate(idxs))
    if (node, canonical) not in self.reduces: self.reduces[(node, canonical)] = self.build_reduce(node, canonical)
    return self.reduces[(node, canonical)]

  def indexed(self, memop: UOp, idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """(index, valid) of a memory op at idxs. Replicas differ in constant indices: along an axis with a constant
    stride (which the mask ignores) a constant only moves the index, so each shape of non-constant indices is
    indexed once (ShapeTracker.to_indexed simplifies, which is most of the linearizer's time) and then offset."""
    st, strides = self.view_of[memop], self.memory_strides(memop)
    base, delta = list(idxs), 0
    for axis, x in enumerate(idxs):
      if x.op is Ops.CONST and x.arg != 0 and strides[axis] is not None:
        base[axis], delta = _index_const(0), delta + x.arg * strides[axis]
    if (key := (memop, tuple(base))) not in self.indexings: self.indexings[key] = st.to_indexed(base)
    index, valid = self.indexings[key]
    return offset_by(index, delta), valid

  def memory_strides(self, memop: UOp) -> tuple:
    if (strides := self.strides.get(memop)) is None: strides = self.strides[memop] = self.view_of[memop].real_strides()
    return strides

  def global_load(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    index, valid = self.indexed(node, idxs)
    if valid.op is Ops.CONST and not valid.arg: return UOp.const(node.dtype, 0)
    return UOp(Ops.LOAD, node.dtype, (node.src[0], index) + (() if valid.op is Ops.CONST and valid.arg else (valid,)))

  def gather_load(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A data-dependent load (ops.GatherAxis): the VIEW's address (row 0 of the gathered axis) plus the index value at
    these idxs, clamped into the table's rows, times the row stride. A masked position loads nothing."""
    row_start, valid = self.indexed(node, idxs)
    if valid.op is Ops.CONST and not valid.arg: return UOp.const(node.dtype, 0)
    row = clamp_index(self.build(node.src[1], idxs), node.arg.size)
    index = simplify(row_start + row * node.arg.stride)
    return UOp(Ops.LOAD, node.dtype, (node.src[0], index) + (() if valid.op is Ops.CONST and valid.arg else (valid,)))

  # ---- shared-memory staging
  def stage_loads(self) -> None:
    """Shared tiles for the staged loads, software-pipelined over the reduce loop: before the loop the block copies
    step 0's tiles into buffer 0 (then a barrier); each step reads its tiles from buffer step % 2, while the global
    loads of step + 1's tiles are issued at the top of the body and stored into the other buffer at its end, followed
    by one barrier (Kernel.StagePlan says why one is enough). A target that copies asynchronously (cp.async) gets the
    stores of unmasked direct copies (runs contiguous in both memories) at the top too: it renders such a load and
    store as one copy that completes by the barrier. Without a reduce loop there is just the first copy."""
    k = self.k
    loop_axes = list(range(k.first_reduce + k.group_for_reduces, k.first_upcast))
    steps = prod(k.full_shape[a] for a in loop_axes)
    step = _index_const(0)
    for a in loop_axes: step = step * k.full_shape[a] + self.base_idx[a]
    plans = [(load, k.stage_plan(load, padding)) for load, padding in k.staged]
    tiles = {}
    for load, plan in plans:
      self.acc_count += 1
      size = plan.buffer_elements * plan.buffers
      tiles[load] = UOp(Ops.DEFINE_LOCAL, load.dtype, (), (f"tile{self.acc_count}", size))
      offset = simplify((step % 2) * plan.buffer_elements) if plan.buffers == 2 else _index_const(0)
      self.stages[load] = (plan, tiles[load], offset)
    def loop_indices(flat_step: UOp) -> dict[int, UOp]:
      out = {}
      for i, a in enumerate(loop_axes):
        out[a] = simplify((flat_step // prod(k.full_shape[b] for b in loop_axes[i + 1:])) % k.full_shape[a])
      return out
    first = [store for load, plan in plans for store in self.copy_tile(load, plan, tiles[load], loop_indices(
      _index_const(0)), _index_const(0))]
    self.stage_barrier = UOp(Ops.BARRIER, dtypes.void, tuple(first))
    if loop_axes and steps > 1:
      # the last step copies step 0 again (in bounds, into the buffer this step doesn't read) instead of a guard
      following = simplify((step + 1) % steps)
      after = []
      for load, plan in plans:
        stores = self.copy_tile(load, plan, tiles[load], loop_indices(following),
                                simplify(((step + 1) % 2) * plan.buffer_elements))
        after += stores
        if plan.direct and self.renderer.async_copy:   # only unmasked runs become cp.async; the rest wait for data
          self.early_stores.update(st for st in stores if st.src[2].op is Ops.LOAD and len(st.src[2].src) == 2)
      self.stage_next = (tuple(self.base_idx[a] for a in loop_axes), UOp(Ops.BARRIER, dtypes.void, tuple(after)))

  def copy_tile(self, load: UOp, plan: StagePlan, tile: UOp, loop_indices: dict[int, UOp], offset: UOp) -> list[UOp]:
    """The STOREs of the block's copy of one tile of `load` (reduce loops at `loop_indices`) into `tile` at
    `offset`: thread t copies runs of `width` consecutive tile elements (one vector access where the renderer can),
    runs t, t + threads, t + 2·threads, …; the copy reads global memory where the kernel would (masks included)."""
    k = self.k
    thread_axes = k.thread_axes
    threads = prod(k.full_shape[a] for a in thread_axes)
    thread = _index_const(0)
    for a in thread_axes: thread = thread * k.full_shape[a] + self.base_idx[a]
    width, covered, part = copy_run(plan, self.memory_strides(load), STAGE_COPY_BYTES // load.dtype.itemsize)
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
      coords = (run_coords[:-1] + [simplify(run_coords[-1] * part)] if outer else []) + [_index_const(0)] * covered
      idxs = list(self.base_idx)
      for a in list(thread_axes) + list(k.upcast_axes): idxs[a] = _index_const(0)   # the load ignores these
      for a, index in loop_indices.items(): idxs[a] = index
      for a, c in zip(plan.axes, coords): idxs[a] = c
      first_value, first_slot = self.global_load(load, tuple(idxs)), self.tile_index(plan, offset, coords)
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

  def staged_load(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    plan, tile, offset = self.stages[node]
    return UOp(Ops.LOAD, node.dtype, (tile, self.tile_index(plan, offset, [idxs[a] for a in plan.axes]),
                                      self.stage_barrier))

  def build_reduce(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    k = self.k
    if k.tensor_core is not None and node is k.tensor_core.reduce: return self.build_tc_reduce(node, idxs)
    op, level = node.arg[0], self.levels[node]
    loops = self.pass_indices(level)
    loop_axes = list(range(k.first_reduce + k.group_for_reduces, k.first_upcast))
    unroll_axes = [a for a in k.upcast_axes if k.is_reduce_axis(a)]
    group_axes = range(k.first_reduce, k.first_reduce + k.group_for_reduces)
    def unrolled_value(loop_indices: dict[int, UOp]) -> UOp:
      """The unrolled replicas of the reduce's source combined with its op (a left chain), at these loop indices."""
      inner = list(idxs)
      for a in group_axes: inner[a] = self.base_idx[a]
      for a, index in loop_indices.items(): inner[a] = index
      values = []
      for combo in itertools.product(*[range(k.full_shape[a]) for a in unroll_axes]):
        for a, v in zip(unroll_axes, combo): inner[a] = _index_const(v)
        values.append(self.build(node.src[0], tuple(inner)))
      combined = values[0]
      for v in values[1:]: combined = UOp(op, node.dtype, (combined, v))
      return combined
    ranges = tuple(loops[a] for a in loop_axes)
    combined = unrolled_value(loops)
    terms = prod(k.full_shape[a] for a in unroll_axes)
    if not ranges:   # a float sum starts from +0.0 as a loop's accumulator does: -0.0 + -0.0 is +0.0, as in numpy
      result = UOp(Ops.ADD, node.dtype, (combined, UOp.const(node.dtype, 0.0))) if compensable(op, node.dtype) \
        else combined
    elif (folded := fold_invariant_reduce(op, node.dtype, combined, ranges)) is not None: result = folded
    elif (split := self.accumulation_split(op, node.dtype, loop_axes, terms)) is not None:
      axis, chunk = split
      block, within = block_ranges(axis, k.full_shape[axis], chunk, PASS_LOOP_ARG * level)
      position = loop_axes.index(axis)
      inner_ranges = (within,) + ranges[position + 1:]
      value = unrolled_value({**loops, axis: within})
      block_total = self.new_reduce(op, node.dtype, value, inner_ranges, terms)
      result = self.new_reduce(op, node.dtype, block_total, ranges[:position] + (block,), compensated=True)
    else: result = self.new_reduce(op, node.dtype, combined, ranges, terms,
                                   compensated=is_sum_of_partials(node) and compensable(op, node.dtype))
    if k.group_for_reduces: result = self.group_reduce(op, node.dtype, result, level)
    return result

  def accumulation_split(self, op: Ops, dtype, loop_axes: list[int], terms: int) -> Optional[tuple[int, int]]:
    """(axis, block size) where a float sum's loops add more than ACCUMULATE_BLOCK (TILE_ACCUMULATE_BLOCK for a
    register tile) values into one accumulator, else None. Counting from the innermost loop (times the `terms` unrolled
    values per iteration), the first axis that takes the run past the limit is cut into blocks, an exact divisor of it
    where one is close below the limit.
    Blocking in the kernel keeps the kernel count and needs no memory for partials, unlike splitting the reduce into
    two kernels (lazy.py's _split_reduce, which is about parallelism). Kernels with staged tiles (SMEM) keep their
    pipelined loop as it is."""
    k = self.k
    if op is not Ops.ADD or not dtype.is_float or k.staged: return None
    accumulators = len(k.reduceops) * prod(k.full_shape[a] for a in k.upcast_axes if not k.is_reduce_axis(a))
    block = ACCUMULATE_BLOCK if accumulators < FOLD_MIN_ACCUMULATORS else TILE_ACCUMULATE_BLOCK
    run = terms
    for axis in reversed(loop_axes):
      size = k.full_shape[axis]   # a symbolic size blocks when its bound could pass the limit
      if run * vmax_of(size) > block:
        limit = max(1, block // run)
        if not isinstance(size, int): return axis, limit
        exact = next((c for c in range(limit, limit // BLOCK_DIVISOR_SLACK, -1) if size % c == 0), None)
        return axis, exact or limit
      run *= vmax_of(size)
    return None

  # ---- tensor cores
  def build_tc_reduce(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """This output replica's element of its tile's accumulator: replicas that differ only in the tensor core's own
    row and column upcasts are the elements of one C fragment (Kernel._apply_tensor_core lays them out so)."""
    k = self.k
    core = k.tensor_core.core
    rows_up, columns_up, _ = k.tc_upcast_axes
    row_offset = idxs[rows_up].arg * (core.lanes // core.lanes_per_group)   # row = 8·upcast + group
    column_offset = idxs[columns_up].arg                                      # column = 2·tig + upcast
    tile = list(idxs)
    tile[rows_up] = tile[columns_up] = _index_const(0)
    key = (node, tuple(tile))
    if key not in self.tc_tiles: self.tc_tiles[key] = self.tc_accumulate(tuple(tile))
    element = list(zip(core.c.rows, core.c.cols)).index((row_offset, column_offset))
    return UOp(Ops.GEP, core.dtype_acc, (self.tc_tiles[key],), element)

  def tc_accumulate(self, tile: tuple[UOp, ...]) -> UOp:
    """One tile's C fragment: a WMMA per K step of 16 (per unrolled replica), inside the reduce loops a REDUCE whose
    value is that chain of WMMAs on the accumulator fragment."""
    k, use = self.k, self.k.tensor_core
    core = use.core
    _, _, k_up = k.tc_upcast_axes
    loop_axes = range(k.first_reduce, k.first_upcast)
    unroll_axes = [a for a in k.upcast_axes if k.is_reduce_axis(a) and a != k_up]
    inner = list(tile)
    for a in loop_axes: inner[a] = self.base_idx[a]
    ranges = tuple(self.base_idx[a] for a in loop_axes)
    zeros = UOp(Ops.VECTORIZE, core.dtype_acc, tuple(UOp.const(core.dtype_acc, 0.0) for _ in core.c.rows))
    if ranges:
      self.acc_count += 1
      fragment = UOp(Ops.DEFINE_ACC, core.dtype_acc, (zeros,), self.acc_count - 1)
    else: fragment = zeros
    accumulator = fragment
    for combo in itertools.product(*[range(k.full_shape[a]) for a in unroll_axes]):
      for a, v in zip(unroll_axes, combo): inner[a] = _index_const(v)
      a_fragment = self.tc_operand(use.a, core.a, tuple(inner), rows_are_k=False)
      b_fragment = self.tc_operand(use.b, core.b, tuple(inner), rows_are_k=True)
      fragment = UOp(Ops.WMMA, core.dtype_acc, (a_fragment, b_fragment, fragment), core)
    return UOp(Ops.REDUCE, core.dtype_acc, (fragment, *ranges), (Ops.WMMA, accumulator.arg)) if ranges else fragment

  # an m16n8k16 A fragment is four 8×8 matrices (rows 0-7 and 8-15 at K 0-7, then at K 8-15); B's is two, K 0-7 and
  # 8-15 of a row-major K×N tile, loaded transposed (see MMA_M16N8K16 in cuda.py)
  MATRIX_LOADS = {False: MatrixLoad(4, False), True: MatrixLoad(2, True)}

  def fragments_are_matrix_loadable(self) -> bool:
    """Whether both operands of an m16n8k16 core with 16-bit inputs are staged so that every 8×8 matrix row is 16
    contiguous, 16-byte aligned bytes of the tile: A's K axis and B's (tig, column upcast) pair must be contiguous,
    every other axis and the buffer size multiples of 8 elements."""
    k, use = self.k, self.k.tensor_core
    if use is None or not self.renderer.matrix_loads or use.core.dims != (16, 8, 16) or use.a not in self.stages or \
       use.b not in self.stages or use.core.dtype_in.itemsize != 2: return False
    rows_up, columns_up, k_up = k.tc_upcast_axes
    _, tig_axis = k.tc_lane_axes
    for operand, contiguous in ((use.a, {k_up: 1}), (use.b, {columns_up: 1, tig_axis: 2})):
      plan = self.stages[operand][0]
      if plan.buffer_elements % 8: return False
      strides = dict(zip(plan.axes, plan.strides))
      if any(strides.get(axis) != stride for axis, stride in contiguous.items()): return False
      if any(stride % 8 for axis, stride in strides.items() if axis not in contiguous): return False
    return True

  def tc_matrix_load(self, operand: UOp, inner: tuple[UOp, ...], rows_are_k: bool) -> UOp:
    """This lane's row address for the MatrixLoad of A (rows_are_k False) or B at the tile position `inner`."""
    k = self.k
    core = k.tensor_core.core
    rows_up, columns_up, k_up = k.tc_upcast_axes
    group_axis, tig_axis = k.tc_lane_axes
    lane = self.base_idx[group_axis] * core.lanes_per_group + self.base_idx[tig_axis]
    groups = core.lanes // core.lanes_per_group
    idxs = list(inner)
    idxs[group_axis] = idxs[rows_up] = idxs[tig_axis] = idxs[columns_up] = _index_const(0)
    if (lane_coords := self.matrix_lane_coords.get(rows_are_k)) is None:
      if rows_are_k: lane_coords = {k_up: lane % 16}                   # B: rows K 0-15, the tile's first column
      else:
        row = lane % 16                                                # A: rows 0-15 at K 0, then again at K 8
        lane_coords = {group_axis: row % groups, rows_up: row // groups, k_up: (lane // 16) * 8}
      lane_coords = self.matrix_lane_coords[rows_are_k] = {a: simplify(x) for a, x in lane_coords.items()}
    for a, x in lane_coords.items(): idxs[a] = x
    plan, tile, offset = self.stages[operand]
    address = self.tile_index(plan, offset, [idxs[a] for a in plan.axes])
    return UOp(Ops.LOAD, operand.dtype, (tile, address, self.stage_barrier), self.MATRIX_LOADS[rows_are_k])

  def tc_operand(self, operand: UOp, layout: FragmentLayout, inner: tuple[UOp, ...], rows_are_k: bool) -> UOp:
    """This lane's fragment of A (rows: the tile's rows, columns: K) or B (rows: K, columns: the tile's columns): each
    element is the operand built at its (row, column) of the tile, put on the kernel's axes. The operand is constant
    along the other output axis (tensor_core_choices checked), which is indexed 0. K is read in `k_order`."""
    k = self.k
    core = k.tensor_core.core
    rows_up, columns_up, k_up = k.tc_upcast_axes
    group_axis, tig_axis = k.tc_lane_axes
    group, tig = self.base_idx[group_axis], self.base_idx[tig_axis]
    groups, column_upcast = core.lanes // core.lanes_per_group, core.dims[1] // core.lanes_per_group
    if self.matrix_loads: return self.tc_matrix_load(operand, inner, rows_are_k)
    elements = []
    for element in range(len(layout.rows)):
      row, column = (simplify(x) for x in layout.position(element, group, tig))
      idxs = list(inner)
      idxs[group_axis] = idxs[rows_up] = idxs[tig_axis] = idxs[columns_up] = _index_const(0)
      idxs[k_up] = k_order(core, layout.rows[element] if rows_are_k else layout.cols[element], tig)
      if rows_are_k: idxs[tig_axis], idxs[columns_up] = column // column_upcast, column % column_upcast   # 2·tig + up
      else: idxs[group_axis], idxs[rows_up] = row % groups, row // groups                                 # 8·up + group
      elements.append(self.build(operand, tuple(simplify(x) for x in idxs)))
    return UOp(Ops.VECTORIZE, operand.dtype, tuple(elements))

  def new_reduce(self, op: Ops, dtype, value: UOp, ranges: tuple[UOp, ...], terms: int = 1,
                 compensated: bool = False) -> UOp:
    """A loop reduce of `value`, which combines `terms` unrolled values as a left chain of `op` (see build_reduce):
    with many accumulators the update folds them in one by one (acc + v0 + v1 + …, FMAs for a matmul). A compensated
    sum carries each addition's rounding error into the next (Kahan; linearize emits it)."""
    self.acc_count += 1
    return UOp(Ops.REDUCE, dtype, (value, *ranges), (op, self.acc_count - 1, terms) + ((True,) if compensated else ()))

  def group_reduce(self, op: Ops, dtype, partial: UOp, level: int = 0) -> UOp:
    """Reduce across the group's threads: each writes its partial to shared memory, then (after a barrier) the
    group's first thread reduces the partials and stores (`group_gate`); the others skip that loop (an IF). A float
    sum combines the partials with Kahan's compensation: they are large (a thread's share of a long axis) and alike,
    the case where a plain running sum rounds at every step; one thread per block runs that loop, so it costs
    nothing measurable. When a later pass of a row kernel reads the result (`shared_results`), every thread combines
    the partials itself (broadcast reads of the same shared words) and no thread skips; each reduce has its own
    array, written once, so the one barrier before the reads is all it needs."""
    k = self.k
    group_axes = list(range(k.first_reduce, k.first_reduce + k.group_for_reduces))
    local_axes = list(range(k.global_dims, k.first_reduce))
    # one slot per thread, consecutive local (output) threads in consecutive slots; each output upcast replica has
    # its own array
    sizes = [k.full_shape[a] for a in group_axes + local_axes]
    def flat(indices: list[UOp]) -> UOp:
      out = _index_const(0)
      for i, size in zip(indices, sizes): out = out * size + i
      return simplify(out)
    self.acc_count += 1
    shared = UOp(Ops.DEFINE_LOCAL, dtype, (), (f"temp{self.acc_count}", prod(sizes)))
    mine = [self.base_idx[a] for a in group_axes + local_axes]
    store = UOp(Ops.STORE, dtypes.void, (shared, flat(mine), partial))
    barrier = UOp(Ops.BARRIER, dtypes.void, (store,))
    group_loops = [UOp(Ops.RANGE, dtypes.index, (_index_const(0), _index_const(k.full_shape[a])),
                       PASS_LOOP_ARG * level + GROUP_LOOP_ARG + a) for a in group_axes]
    if not self.shared_results: self.group_loops.update(group_loops)
    theirs = group_loops + [self.base_idx[a] for a in local_axes]
    load = UOp(Ops.LOAD, dtype, (shared, flat(theirs), barrier))
    return self.new_reduce(op, dtype, load, tuple(group_loops), compensated=compensable(op, dtype))

  def group_gate(self) -> Optional[UOp]:
    k = self.k
    gate = None
    for a in range(k.first_reduce, k.first_reduce + k.group_for_reduces):
      cond = self.base_idx[a].eq(0)
      gate = cond if gate is None else gate & cond
    return gate

  def value_graph(self) -> list[UOp]:
    """The STOREs of every output replica (one per combination of the output's upcast axes). A row kernel stores its
    whole rows: each thread of a GROUP its share, in the store pass's loops, one replica per unrolled position."""
    k = self.k
    self.base_idx = self.axis_indices()
    if k.staged: self.stage_loads()
    self.matrix_loads = self.fragments_are_matrix_loadable()
    stores = []
    out_upcast = [a for a in k.upcast_axes if not k.is_reduce_axis(a) or k.row_store]
    gate = None if k.row_store else self.group_gate()
    row_indices = self.row_store_indices() if k.row_store else {}
    for combo in itertools.product(*[range(k.full_shape[a]) for a in out_upcast]):
      idxs = list(self.base_idx)
      for a in range(k.first_reduce, k.shape_len): idxs[a] = row_indices.get(a, _index_const(0))   # reduce axes
      for a, v in zip(out_upcast, combo): idxs[a] = _index_const(v)
      for store in [u for u in k.memops if u.op is Ops.STORE]:
        value = self.build(store.src[2], tuple(idxs))
        index, valid = self.indexed(store, tuple(idxs))
        if gate is not None: valid = simplify(valid & gate)
        stores.append(UOp(Ops.STORE, dtypes.void, (store.src[0], index, value) +
                          (() if valid.op is Ops.CONST and valid.arg else (valid,))))
    return stores

  def row_store_indices(self) -> dict[int, UOp]:
    """A row kernel's store: the thread ids of a GROUP's axes and the store pass's loops over the rest of the row
    (unrolled axes are replicas, set per store)."""
    k = self.k
    group_axes = range(k.first_reduce, k.first_reduce + k.group_for_reduces)
    assert self.store_pass is not None
    return {**{a: self.base_idx[a] for a in group_axes}, **self.pass_indices(self.store_pass)}

  # ---- step 2: emit in program order
  def linearize(self) -> list[UOp]:
    stores = self.value_graph()
    stores = decompose(stores, self.renderer.decompose_transcendentals)
    program: list[UOp] = []
    emitted: set[UOp] = set()
    scope_stack: list[list[UOp]] = [[]]
    all_nodes = UOp(Ops.SINK, dtypes.void, tuple(stores)).toposort()
    reduces = [u for u in all_nodes if u.op is Ops.REDUCE]
    open_ranges: set[UOp] = set()
    free: dict[UOp, frozenset] = {}   # the RANGEs a node's value depends on (a REDUCE binds its own)
    for u in all_nodes:   # a loop's bounds may depend on outer loops (a block of a blocked sum)
      free[u] = frozenset().union(*(free[s] for s in u.src)) | ({u} if u.op is Ops.RANGE else set())
      if u.op is Ops.REDUCE: free[u] -= set(u.src[1:])

    def place(u: UOp) -> None:
      program.append(u)
      emitted.add(u)
      scope_stack[-1].append(u)

    def emit(root: UOp) -> None:
      """Place `root` after its sources, depth-first in source order (an explicit stack: chains of any length); a
      REDUCE brings its whole loop (emit_reduce_group)."""
      stack: list[tuple[UOp, bool]] = [(root, False)]
      while stack:
        u, sources_placed = stack.pop()
        if sources_placed: place(u)
        elif u in emitted: continue
        elif u.op is Ops.REDUCE: emit_reduce_group(u)
        else:
          stack.append((u, True))
          stack.extend((s, False) for s in reversed(u.src))

    def hoist_invariants(value: UOp) -> None:
      """Emit, before a loop, what its body reads but does not vary with it: index math and loads of outer axes,
      and a GROUP's partial, shared-memory store and barrier, which must run once and not once per iteration."""
      for u in value.toposort():
        if u not in emitted and u.op is not Ops.CONST and free[u] <= open_ranges: emit(u)

    def emit_reduce_group(first: UOp) -> None:
      ranges = first.src[1:]
      group = [r for r in reduces if r.src[1:] == ranges and r not in emitted]
      for r in ranges: emit(r.src[0]); emit(r.src[1])  # noqa: E702
      for r in group: hoist_invariants(r.src[0])
      accs, compensations, corrections = {}, {}, {}
      for r in group:
        if r.arg[0] is Ops.WMMA:   # the fragment accumulator is part of the value (hoisted above): it is replaced
          accs[r] = next(u for u in r.src[0].toposort() if u.op is Ops.DEFINE_ACC and u.arg == r.arg[1])
          emit(accs[r])
          continue
        init = UOp.const(r.dtype, identity_of_reduce(r.arg[0], r.dtype))
        emit(init)
        accs[r] = UOp(Ops.DEFINE_ACC, r.dtype, (init,), r.arg[1])
        place(accs[r])
        if is_compensated(r):   # the running rounding error of a Kahan sum: an accumulator of its own
          self.acc_count += 1
          compensations[r] = UOp(Ops.DEFINE_ACC, r.dtype, (init,), self.acc_count - 1)
          place(compensations[r])
      # only the thread that stores reduces a GROUP's partials: for the others the accumulator stays the identity
      branch = UOp(Ops.IF, dtypes.void, (simplify(self.group_gate()),)) if set(ranges) & self.group_loops else None
      if branch is not None:
        emit(branch.src[0])
        place(branch)
      for r in ranges: place(r)
      open_ranges.update(ranges)
      scope_stack.append([])
      prefetch = self.stage_next[1] if self.stage_next is not None and self.stage_next[0] == ranges else None
      if prefetch is not None:   # the next step's global loads first: the body's math hides their latency
        for store in prefetch.src: emit(store if store in self.early_stores else store.src[2])
      # with several accumulators (a register tile), every one takes its first unrolled value, then its second, …:
      # an outer product per unrolled step (FMAs into the accumulators, one step's operands live). A lone
      # accumulator combines the step's values first, so only one op per step depends on the last step. A compensated
      # sum adds its unrolled values one by one, each with compensation.
      fold = sum(1 for r in group if r.arg[0] is not Ops.WMMA) >= FOLD_MIN_ACCUMULATORS
      updates = {r: r.src[0] if r.arg[0] is Ops.WMMA else accs[r] for r in group}
      terms = {r: [] if r.arg[0] is Ops.WMMA else reduce_terms(r) if fold or is_compensated(r) else [r.src[0]]
               for r in group}
      for r in group:
        if r.arg[0] is Ops.WMMA: emit(r.src[0])
      for step in range(max((len(t) for t in terms.values()), default=0)):
        for r in group:
          if step >= len(terms[r]): continue
          emit(terms[r][step])
          if r in compensations:
            updates[r], corrections[r] = kahan_step(updates[r], corrections.get(r, compensations[r]), terms[r][step])
            emit(corrections[r])
            continue
          updates[r] = UOp(r.arg[0], r.dtype, (updates[r], terms[r][step]))
          if updates[r] not in emitted: place(updates[r])
      for r in group: place(UOp(Ops.ASSIGN, r.dtype, (accs[r], updates[r])))
      for r, correction in corrections.items(): place(UOp(Ops.ASSIGN, r.dtype, (compensations[r], correction)))
      if prefetch is not None: emit(prefetch)   # their stores into the other buffer, then the step's one barrier
      for rng in reversed(ranges): program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
      if branch is not None: program.append(UOp(Ops.ENDIF, dtypes.void, (branch,)))
      open_ranges.difference_update(ranges)
      for u in scope_stack.pop(): emitted.discard(u)
      for r in group: place(r)

    # every buffer of the kernel is a parameter, even one whose loads all turned into constants (fully masked):
    # renderers number parameters by DEFINE_GLOBAL index, and the launch passes every buffer
    kernel_buffers = {m.src[0] for m in self.k.memops if m.op in (Ops.LOAD, Ops.STORE)}
    globals_ = sorted({u for u in all_nodes if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)} | kernel_buffers,
                      key=lambda u: (u.op is Ops.DEFINE_LOCAL, u.arg if u.op is Ops.DEFINE_GLOBAL else u.arg[0]))
    for g in globals_: place(g)
    # every variable of the kernel is a parameter too, used or not (a grid over a symbolic axis may need no value in
    # the code): the launch passes the values of all of them, in name order (CompiledKernel.variables)
    for v in self.k.variables: place(v)
    # every thread id, used or not: a renderer sizes the launch (e.g. __launch_bounds__) from them
    specials = {u for i in self.base_idx if i is not None for u in i.toposort() if u.op is Ops.SPECIAL}
    for s in sorted(specials | {u for u in all_nodes if u.op is Ops.SPECIAL}, key=lambda u: u.arg[0]): place(s)
    outer_loops = [i for i in self.base_idx[:self.k.global_dims] if i is not None and i.op is Ops.RANGE]
    for rng in outer_loops:
      emit(rng.src[0]); emit(rng.src[1])  # noqa: E702
      place(rng)
      open_ranges.add(rng)
    # a row kernel: every pass's reduces (and whatever else doesn't vary along the row) first, then the store pass's
    # loops around the stores
    row_loops = list(self.pass_loops.get(self.store_pass, {}).values()) if self.store_pass is not None else []
    if row_loops:
      for store in stores: hoist_invariants(store)
    for rng in row_loops:
      emit(rng.src[0]); emit(rng.src[1])  # noqa: E702
      place(rng)
      open_ranges.add(rng)
    for store in stores: emit(store)
    for rng in reversed(outer_loops + row_loops): program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
    return program

def is_compensated(reduce: UOp) -> bool: return len(reduce.arg) > 3 and reduce.arg[3]

def compensable(op: Ops, dtype) -> bool:
  """Whether a reduce adds with Kahan's compensation where it combines partial sums: float sums only."""
  return op is Ops.ADD and dtype.is_float

def is_sum_of_partials(reduce_axis: UOp) -> bool:
  """Whether a REDUCE_AXIS adds partial sums (lazy.py's _split_reduce marks the reduce of its partials)."""
  return len(reduce_axis.arg) > 2 and reduce_axis.arg[2]

def kahan_step(total: UOp, compensation: UOp, value: UOp) -> tuple[UOp, UOp]:
  """(new total, new compensation) of Kahan summation: the value corrected by the error carried so far is added, and
  what that addition rounded away, (new − total) − corrected, is carried to the next. Renderers must not reassociate
  these ops (llvmir.py allows reordering only for a lone innermost accumulator).
  Once the total is ±inf or NaN the carried error is 0: (inf − total) − corrected would be inf − inf = NaN, and a sum
  holding one inf came out NaN (a 10,000-element float32 sum on the CPU; a grouped GPU gather, fuzz_ops seed 0
  case 499). `t − t != 0` is exactly "t is not finite"."""
  def minus(x: UOp) -> UOp: return UOp(Ops.NEG, x.dtype, (x,))
  def add(x: UOp, y: UOp) -> UOp: return UOp(Ops.ADD, value.dtype, (x, y))
  corrected = add(value, minus(compensation))
  new_total = add(total, corrected)
  error = add(add(new_total, minus(total)), minus(corrected))
  zero = UOp.const(value.dtype, 0.0)
  not_finite = UOp(Ops.CMPNE, dtypes.bool, (add(new_total, minus(new_total)), zero))
  return new_total, UOp(Ops.WHERE, value.dtype, (not_finite, zero, error))

def fold_invariant_reduce(op: Ops, dtype, value: UOp, ranges: tuple[UOp, ...]) -> Optional[UOp]:
  """A reduce over loops of a value that none of them changes: a sum is value × trips, a max is the value. None when
  the value varies or the op is MUL. Ints multiply in their own dtype (wrapping exactly as the loop's adds would);
  floats in float64, where the trip count is exact, then round to the dtype (2^-10 × 2^20 is 1024 in float16, though
  2^20 itself is not a float16). A float sum starts from +0.0, as the loop's accumulator (and numpy's and torch's
  sums) do, so -0.0 × trips is +0.0."""
  if op not in (Ops.ADD, Ops.MAX) or dtype.is_bool or any(r in ranges for r in value.toposort()): return None
  if op is Ops.MAX: return value
  trips = prod(canonical(r.src[1] - r.src[0]) for r in ranges)   # symbolic with a variable's loop
  compute = dtypes.float64 if dtype.is_float else dtype
  if value.op is Ops.CONST and isinstance(trips, int):
    return UOp.const(dtype, exec_alu(Ops.MUL, compute, (value.arg, trips)) + 0)
  count = UOp.const(compute, trips) if isinstance(trips, int) else trips.cast(compute)
  total = UOp(Ops.MUL, compute, (value.cast(compute), count))
  if dtype.is_float: total = UOp(Ops.ADD, compute, (total, UOp.const(compute, 0.0)))
  return total.cast(dtype)

def block_ranges(axis: int, size: int, block: int, pass_arg: int = 0) -> tuple[UOp, UOp]:
  """(loop over the blocks, loop within one) for a reduce axis of `size` cut into blocks of `block`: the inner loop runs
  over [start, min(start + block, size)), so the axis's index is the inner loop itself and keeps its range [0, size).
  `pass_arg` offsets the loops' args in a row kernel's later passes (PASS_LOOP_ARG). A symbolic size blocks the same
  way, with a symbolic count of blocks and the min always taken."""
  blocks = UOp(Ops.RANGE, dtypes.index, (_index_const(0), to_uop(ceil_div(size, block))),
               pass_arg + BLOCK_LOOP_ARG + axis)
  start = simplify(blocks * block)
  # min(start + block, size) as size - max(size - block - start, 0): its range is exactly [block, size]
  end = start + block if isinstance(size, int) and size % block == 0 else \
    to_uop(size) - (to_uop(canonical(size - block)) - start).maximum(0)
  return blocks, UOp(Ops.RANGE, dtypes.index, (start, simplify(end)), pass_arg + axis)

def clamp_index(value: UOp, size: int) -> UOp:
  """An int value read from memory as an index in [0, size): cast to the index dtype, then clamped, so a gather never
  reads outside its table whatever the index buffer holds. min(x, size - 1) is written -max(-x, 1 - size): the range
  analysis then knows exactly [0, size - 1] and nothing more (the value itself is only known at run time)."""
  nonnegative = value.cast(dtypes.index).maximum(_index_const(0))
  return simplify((nonnegative * -1).maximum(_index_const(1 - size)) * -1)

def offset_by(index: UOp, delta: int) -> UOp:
  """index + delta, with the constant folded into index's own sum."""
  if delta == 0: return index
  terms, constant = split_terms(index)
  return build_sum(terms, constant + delta, index.dtype)

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

def reduce_terms(reduce: UOp) -> list[UOp]:
  """The unrolled values a loop REDUCE combines (its source is their left chain, see Linearizer.new_reduce)."""
  terms, value = [], reduce.src[0]
  for _ in range(reduce.arg[2] - 1):
    terms.append(value.src[1])
    value = value.src[0]
  return [value] + terms[::-1]

def linearize(kernel: Kernel) -> list[UOp]: return Linearizer(kernel).linearize()

