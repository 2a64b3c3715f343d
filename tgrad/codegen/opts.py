"""OptOps as functions: each maps an AxisState (axes.py) and an Opt to a new AxisState, or raises KernelOptError.

`apply_opt(state, opt)` runs the op's function (OPT_FUNCTIONS), checks the target's limits (threads, grid, shared
memory) and records the opt. Nothing changes in place, so a refused opt leaves nothing to undo. Every op but NOLOCALS,
TC and SMEM acts on one axis and makes the same checks first (_split_target): UPCAST, UNROLL, LOCAL, GROUP, GROUPTOP
and THREAD split it and move the piece to its role's place (AxisState.shift_to), SWAP exchanges two global axes,
PADTO pads one. WGMMA, TF32X3 and SGEMM make the whole kernel a hand-written matmul template (warpgroup_mma.py,
simt_matmul.py). TC lays one warp over a tile of a matmul-like reduce (tensor_cores.py says which reduces and axes
qualify); SMEM stages one input's tile in shared memory (staging.py says which loads, and lays the tile out). A
padded reduce axis is legal only where the padding adds 0 to every reduce (reduce_ignores_padding).
"""
from __future__ import annotations
from typing import Callable, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ALU, exec_alu, truncate_to
from tgrad.codegen.axes import MEMORY_OPS, AxisState, KernelOptError, Opt, OptOps, TensorCoreUse
from tgrad.codegen.staging import MAX_ROW_PADDING, stage_plan, stageable_loads
from tgrad.codegen.tensor_cores import operand_format, tensor_core_choices, tensor_core_operands
from tgrad.codegen.simt_matmul import simt_matmul
from tgrad.codegen.warpgroup_mma import split_tf32_matmul, warpgroup_mma
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import sint, canonical, ceil_div, divides, is_symbolic, render as render_size, vmax_of
from tgrad.helpers import prod, round_up

MAX_UPCAST = 512   # largest product of upcast/unroll amounts (an 8×8 register tile × K unrolled by 8): more unrolled
                   # code only bloats compile time
# Reduce axes a GROUP may spread over a block's threads: three let a packed matrix–vector product split a row's blocks,
# each block's bytes and a loop inside the block across threads (group_combine walks every group axis's partials;
# more thread axes than a block has dimensions are folded into them).
MAX_GROUP_AXES = 3
MAX_PADDING_FRACTION = 1   # PADTO adds fewer positions than the axis has: padding never more than doubles its work

def apply_opt(state: AxisState, opt: Opt) -> AxisState:
  """The state with one more Opt, or KernelOptError."""
  if (apply := OPT_FUNCTIONS.get(opt.op)) is None: raise KernelOptError(f"{opt.op} is not supported by this kernel")
  _check(state.warpgroup_matmul is None, f"{opt}: the kernel is a warpgroup matmul (WGMMA, TF32X3): no other opt "
         "applies")
  _check(state.simt_matmul is None, f"{opt}: the kernel is a float32 matmul template (SGEMM): no other opt applies")
  new = apply(state, opt)
  if new.renderer.has_local: _check_limits(new)
  return new.replace(applied_opts=state.applied_opts + (opt,))

def apply_opts(state: AxisState, opts) -> AxisState:
  """The state with every Opt of `opts` applied in order, or KernelOptError for the first one refused."""
  for opt in opts: state = apply_opt(state, opt)
  return state

def _check(cond: bool, why: str) -> None:
  if not cond: raise KernelOptError(why)

# ---- the ops that act on one axis

def _real_axis(state: AxisState, opt: Opt) -> int:
  if opt.op in (OptOps.UNROLL,): axis = state.first_reduce + (opt.axis or 0)
  elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP): axis = state.first_reduce + state.group_for_reduces + (opt.axis or 0)
  else: axis = opt.axis if opt.axis is not None else -1
  _check(axis is not None and 0 <= axis < state.shape_len, f"{opt}: axis out of range for {state.full_shape}")
  return axis

def _split_target(state: AxisState, opt: Opt) -> tuple[AxisState, int, sint]:
  """What every op on one axis checks first. Returns the state (a symbolic axis padded where that is the split's
  guard), the axis the opt names, and the amount (the axis' size where Opt.amount is 0)."""
  axis = _real_axis(state, opt)
  size = state.full_shape[axis]
  if not isinstance(size, int) and opt.op is OptOps.PADTO:
    _check(bool(opt.amount), f"{opt}: PADTO of the symbolic axis {axis} needs an amount")
  elif not isinstance(size, int) and opt.op is not OptOps.SWAP:
    state = _split_symbolic_axis(state, opt, axis, size)
    size = state.full_shape[axis]
  amount = opt.amount if opt.amount else size
  _check(amount > 1 or opt.op is OptOps.SWAP, f"{opt}: amount must be > 1")
  if opt.op not in (OptOps.SWAP, OptOps.PADTO):
    _check(divides(amount, size), f"{opt}: {amount} doesn't divide axis size {render_size(size)}")
  # the launch runs exactly `threads` copies of axis 0 (launch_dims): its size must never change or move
  _check(not state.threads or axis != 0, f"{opt}: axis 0 is the THREAD axis of {state.full_shape}")
  _check(axis not in state.tc_lane_axes + state.tc_upcast_axes, f"{opt}: axis {axis} belongs to the tensor core")
  return state, axis, amount

def upcast(state: AxisState, opt: Opt) -> AxisState:
  """UPCAST: an output axis's piece becomes replicas of the code (registers; vector loads and stores)."""
  state, axis, amount = _split_target(state, opt)
  _check(axis < state.first_reduce, f"{opt}: UPCAST needs a non-reduce axis")
  _check(state.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
  return state.shift_to(axis, amount, upcasted=state.upcasted + 1)

def unroll(state: AxisState, opt: Opt) -> AxisState:
  """UNROLL: a reduce loop's piece becomes replicas of the code (Opt.axis counts from the first reduce axis)."""
  state, axis, amount = _split_target(state, opt)
  _check(state.first_reduce + state.group_for_reduces <= axis < state.first_upcast, f"{opt}: needs a reduce axis")
  _check(state.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
  state = state.shift_to(axis, amount, upcasted=state.upcasted + 1)
  return drop_unit_reduce_axis(state, axis) if state.tensor_core is not None else state

def local(state: AxisState, opt: Opt) -> AxisState:
  """LOCAL: a global axis's piece becomes threads of a block (inserted before a tensor core's lanes, which stay
  last)."""
  caps = state.renderer
  state, axis, amount = _split_target(state, opt)
  _check(caps.has_local and not state.dont_use_locals, f"{opt}: target has no local memory/threads")
  _check(axis < state.global_dims, f"{opt}: LOCAL needs a global axis")
  _check(prod(state.local_axis_sizes) * amount <= caps.max_local_size, f"{opt}: too many local threads")
  return state.shift_to(axis, amount, insert_before=state.first_reduce - len(state.tc_lane_axes),
                        local_dims=state.local_dims + 1)

def group(state: AxisState, opt: Opt) -> AxisState:
  """GROUP and GROUPTOP: a reduce axis's piece (the inner piece; the outer one for GROUPTOP) becomes threads that
  share one reduce, combined through shared memory (Opt.axis counts from the first loop reduce axis)."""
  caps = state.renderer
  state, axis, amount = _split_target(state, opt)
  _check(caps.has_shared and not state.dont_use_locals, f"{opt}: target has no shared memory")
  _check(len(state.reduceops) >= 1 and state.first_reduce <= axis < state.first_upcast, f"{opt}: needs a reduce axis")
  _check(state.group_for_reduces < MAX_GROUP_AXES, f"{opt}: at most {MAX_GROUP_AXES} GROUP axes")
  _check(state.tensor_core is None, f"{opt}: a tensor core's accumulators can't be shared (GROUP after TC)")
  return state.shift_to(axis, amount, top=opt.op is OptOps.GROUPTOP,
                        insert_before=state.first_reduce + state.group_for_reduces,
                        group_for_reduces=state.group_for_reduces + 1)

def thread(state: AxisState, opt: Opt) -> AxisState:
  """THREAD: the outer piece of a global axis is split across CPU threads (it becomes axis 0)."""
  state, axis, amount = _split_target(state, opt)
  _check(state.renderer.has_threads, f"{opt}: target has no CPU threads")
  _check(state.threads == 0 and axis < state.global_dims, f"{opt}: one THREAD, on a global axis")
  return state.shift_to(axis, amount, top=True, insert_before=0, threads=amount)

def swap(state: AxisState, opt: Opt) -> AxisState:
  """SWAP: global axes Opt.axis and Opt.amount change places."""
  state, axis, _ = _split_target(state, opt)
  other = opt.amount
  _check(other is not None and axis < other < state.global_dims, f"{opt}: SWAP needs two global axes")
  order = list(range(state.shape_len))
  order[axis], order[other] = order[other], order[axis]
  return state.reshape_and_permute(None, order)

def padto(state: AxisState, opt: Opt) -> AxisState:
  """PADTO: grow a loop axis to a multiple of `amount` with masked-off positions (loads read 0, stores are skipped).
  A global axis is always safe; a reduce axis only where the padding adds exactly 0 to every reduce. A symbolic
  global axis gets the guard of a split (pad_symbolic_axis; ceil(n/amount)*amount), so that the splits after it
  divide and test one position each: a prompt's rows padded to a 64-row block tile, then upcast by 4 and spread
  over 16 threads, check row < n once per replica."""
  state, axis, amount = _split_target(state, opt)
  loop_reduce = state.first_reduce + state.group_for_reduces <= axis < state.first_upcast
  _check(axis < state.global_dims or loop_reduce, f"{opt}: PADTO needs a global or reduce loop axis")
  size = state.full_shape[axis]
  if not isinstance(size, int):
    _check(axis < state.global_dims, f"{opt}: PADTO of the symbolic reduce axis {axis} ({render_size(size)})")
    _check(not divides(amount, size), f"{opt}: axis size {render_size(size)} is already a multiple")
    _check(amount - 1 < vmax_of(size) * MAX_PADDING_FRACTION,
           f"{opt}: padding axis {axis} of at most {vmax_of(size)} to a multiple of {amount} wastes too much")
    return pad_symbolic_axis(state, axis, amount)
  padded = round_up(size, amount)
  _check(padded != size, f"{opt}: axis size {size} is already a multiple of {amount}")
  _check(padded - size < size * MAX_PADDING_FRACTION,
         f"{opt}: padding axis {axis} from {size} to {padded} wastes too much")
  if state.is_reduce_axis(axis):
    _check(all(reduce_ignores_padding(r) for r in state.reduceops),
           f"{opt}: padding reduce axis {axis} would change the reduce {[r.arg[0] for r in state.reduceops]}")
  padding = tuple((0, padded - size) if d == axis else (0, 0) for d in range(state.shape_len))
  # an output's reduce axes have size 1 and stay so; every other tracker spans the full axis
  return state.replace(sts=tuple(st if st.shape[axis] == 1 else st.pad(padding) for st in state.sts))

def nolocals(state: AxisState, opt: Opt) -> AxisState:
  """NOLOCALS: the kernel runs one thread per block (no LOCAL, GROUP or SMEM after it)."""
  _check(state.local_dims == 0 and state.group_for_reduces == 0 and not state.staged, "NOLOCALS after locals")
  _check(not state.dont_use_locals, "NOLOCALS twice")
  return state.replace(dont_use_locals=True)

# ---- symbolic axes: a split whose amount doesn't divide every value is guarded by padding

def _split_symbolic_axis(state: AxisState, opt: Opt, axis: int, size) -> AxisState:
  """Legality of splitting an axis of symbolic size, from the bounds: UPCAST, UNROLL, LOCAL and GROUP by an amount
  that divides the size for every value of the variables (n*64 by 4) split it as it is. A LOCAL or UPCAST of any
  other symbolic global axis, or a GROUP of any other symbolic reduce axis, first pads it to a multiple of the amount
  (the guard, `pad_symbolic_axis`): the padded positions load nothing and store nothing (an upcast's replicas each
  test their own position). Where some reduce would change with the padding (a max, a sum of exponentials), a
  padding guard makes every reduce see its identity there instead (_add_padding_guard). An UNROLL of a symbolic
  reduce axis is never guarded."""
  splits = (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP)
  _check(opt.op in splits and opt.amount is not None and opt.amount > 1,
         f"{opt}: axis {axis} has the symbolic size {render_size(size)}; {opt.op.name} needs a known size")
  amount = opt.amount or 1
  if divides(amount, size): return state
  grouped = opt.op in (OptOps.GROUP, OptOps.GROUPTOP)
  guarded = opt.op in (OptOps.LOCAL, OptOps.UPCAST) and axis < state.global_dims or \
    grouped and state.is_reduce_axis(axis)
  _check(guarded, f"{opt}: axis {axis} has the symbolic size {render_size(size)}, not a multiple of {amount} "
         f"for every value; {opt.op.name} needs one (a symbolic reduce axis is never unrolled with a guard)")
  if grouped and not all(reduce_ignores_padding(r) for r in state.reduceops):
    state = _add_padding_guard(state, axis, size)
  return pad_symbolic_axis(state, axis, amount)

def pad_symbolic_axis(state: AxisState, axis: int, amount: int) -> AxisState:
  """The guard of a split of a symbolic axis: pad it to ceil(n/amount)*amount (>= n for every value), the padding
  masked off: loads there read 0 and stores there are skipped. Along a global (output) axis, a tracker that doesn't
  move along it (stride 0: the weights of a matmul along its rows) is stretched instead of masked: a padded position
  reads the same valid memory as the axis' first, so an upcast's replicas share that load, and what the padding
  computes is never stored. Only where its last view is that expand: a later view that splits an earlier one keeps
  its split (stretched, it would be indexed through a flat position divided by symbolic sizes), so it is masked; pad
  every symbolic axis before splitting any (the heuristics do). Along a reduce axis every tracker is masked (the
  padding must add nothing)."""
  size = state.full_shape[axis]
  padded = canonical(ceil_div(size, amount) * amount)
  output_axis = axis < state.global_dims
  def pad(st: ShapeTracker) -> ShapeTracker:
    if st.shape[axis] == 1: return st
    if output_axis and st.views[-1].strides[axis] == 0 and st.real_strides()[axis] == 0:
      try: return st.shrink(tuple((0, 1) if a == axis else (0, s) for a, s in enumerate(st.shape))) \
        .expand(st.shape[:axis] + (padded,) + st.shape[axis + 1:])
      except ValueError: pass   # an axis that may be empty has no first position: masked
    return st.pad_end_to(axis, padded)
  return state.replace(sts=tuple(pad(st) for st in state.sts))

def _add_padding_guard(state: AxisState, axis: int, size) -> AxisState:
  """A tracker of the kernel's shape that varies along `axis` only (stride 0 elsewhere): padded with the others, its
  valid is exactly "not padding" at any indices. It is no memory op of the AST: the value graph asks it for that
  valid and gives each reduce its identity where it is false (value_graph.ValueBuilder.unrolled_value)."""
  st = ShapeTracker.from_shape(tuple(size if a == axis else 1 for a in range(state.shape_len))).expand(state.full_shape)
  view = UOp(Ops.VIEW, dtypes.void, (), st)
  guard = UOp(Ops.CONST, dtypes.bool, (view,), ("padding guard", len(state.padding_guards)))
  return state.replace(memops=state.memops + (guard,), sts=state.sts + (st,),
                       padding_guards=state.padding_guards + (guard,))

def drop_unit_reduce_axis(state: AxisState, axis: int) -> AxisState:
  """Remove a reduce axis left with size 1: it is no reduce axis any more, so in the loop region it would count as
  a local axis and move the tensor core's lanes."""
  if state.full_shape[axis] != 1: return state
  return state.reshape_and_permute(lambda shape: shape[:axis] + shape[axis + 1:], None)

# ---- tensor cores (OptOps.TC)

def tensor_core(state: AxisState, opt: Opt) -> AxisState:
  """TC: one warp computes M×N tiles (dims of the tensor core) of a reduce Σ a·b whose loads a and b have the core's
  input dtype and whose sum has its accumulator dtype, K of the reduce per instruction. `opt.axis` picks the (rows,
  columns) pair of global axes from `tensor_core_choices` (0: columns innermost), `opt.amount` (0 or None) the core
  among the renderer's that fit the dtypes. For m16n8k16 the axes become

    rows    → rows/16 (global) · 2 (upcast) · 8 (local: lane group)       row = 8·upcast + group
    columns → columns/8 (global) · 4 (local: lane tig) · 2 (upcast)       column = 2·tig + upcast
    K       → K/16 (reduce loop; dropped when it is 1) · 16 (upcast)

  so each output replica is where the C fragment of lane (group, tig) lies; the linearizer indexes a and b by their
  own fragment layouts. m16n8k8 (TF32) is the same with K/8 · 8; its fragment elements are the operands' rounded
  values (each lane rounds what it loads). TC comes before any LOCAL, GROUP, THREAD or NOLOCALS; PADTO, UPCAST and
  UNROLL may come first (an UPCAST of the columns axis before TC spreads a warp's column tiles so that each lane's
  columns are adjacent in memory: n = (8·tile + column)·amount + upcast)."""
  caps = state.renderer
  _check(not is_symbolic(state.full_shape[state.first_reduce:]), f"{opt}: tensor cores need a reduce of known size")
  _check(bool(caps.tensor_cores), f"{opt}: {type(caps).__name__} {getattr(caps, 'arch', '')} has no tensor core")
  threaded = state.local_dims or state.group_for_reduces or state.threads or state.dont_use_locals
  _check(state.tensor_core is None and not threaded, f"{opt}: TC must come before {list(state.applied_opts)}")
  _check(len(state.reduceops) == 1 and not state.row_store,
         f"{opt}: TC needs exactly one reduce and no row store, the kernel has {len(state.reduceops)}")
  reduce = state.reduceops[0]
  operands = tensor_core_operands(reduce)
  _check(operands is not None, f"{opt}: the reduce is not a sum of products of two loads: {reduce.src[0]}")
  assert operands is not None
  formats = tuple((x.dtype, x.op is not Ops.LOAD) for x in operands)   # (dtype, rounded to TF32)
  cores = [tc for tc in caps.tensor_cores if formats == ((tc.dtype_in, tc.tf32),) * 2 and reduce.dtype == tc.dtype_acc]
  _check(bool(cores), f"{opt}: no tensor core multiplies ({', '.join(operand_format(x) for x in operands)}) into "
                      f"{reduce.dtype}")
  _check(0 <= (opt.amount or 0) < len(cores), f"{opt}: amount picks one of {len(cores)} tensor cores")
  core = cores[opt.amount or 0]
  choices = tensor_core_choices(state, core, operands)
  _check(0 <= (opt.axis or 0) < len(choices),
         f"{opt}: axis picks one of {len(choices)} (rows, columns, K) choices for tile {core.dims} in shape "
         f"{state.full_shape}")
  rows, columns, k_axis, a, b = choices[opt.axis or 0]
  upcasts_before = state.upcasted
  tile_rows, tile_columns, tile_k = core.dims
  # a symbolic rows or columns axis (a prompt's rows) that the tile doesn't divide for every value is padded with the
  # guard of a split: its padded positions' fragment elements load 0 and their outputs are not stored
  for axis, tile in ((rows, tile_rows), (columns, tile_columns)):
    if not divides(tile, state.full_shape[axis]): state = pad_symbolic_axis(state, axis, tile)
  groups, lanes_per_group = core.lanes // core.lanes_per_group, core.lanes_per_group
  # rows → rows/8 · [group]; rows/8 → rows/16 · [2]
  state = state.shift_to(rows, groups, insert_before=state.first_reduce, local_dims=state.local_dims + 1)
  state = state.shift_to(rows, tile_rows // groups, upcasted=state.upcasted + 1)
  # columns → columns/2 · [2]; columns/2 → columns/8 · [tig]
  state = state.shift_to(columns, tile_columns // lanes_per_group, upcasted=state.upcasted + 1)
  state = state.shift_to(columns, lanes_per_group, insert_before=state.first_reduce, local_dims=state.local_dims + 1)
  k_axis += 2   # the two lane axes went in before the reduce axes
  state = state.shift_to(k_axis, tile_k, upcasted=state.upcasted + 1)
  state = drop_unit_reduce_axis(state, k_axis)   # K = 16: no loop is left
  return state.replace(tensor_core=TensorCoreUse(core, reduce, a, b, rows, columns, upcasts_before))

# ---- shared-memory staging (OptOps.SMEM)

def smem(state: AxisState, opt: Opt) -> AxisState:
  """SMEM: Opt.axis picks a load of `stageable_loads`, Opt.amount the padding (elements) after each row of its
  tile. The tile is only laid out when the kernel is linearized (`stage_plan`), so later opts may still reshape it."""
  # a symbolic kernel stages tiles of its known axes: its reduce must be known (the steps of the pipelined copy), its
  # symbolic output axes are block indices (padded and split first, the padding's loads masked like the kernel's)
  _check(not is_symbolic(state.full_shape[state.first_reduce:]), f"{opt}: a reduce of symbolic length stages no tile")
  _check(state.renderer.has_shared and not state.dont_use_locals, f"{opt}: target has no shared memory")
  _check(not state.row_store, f"{opt}: a row kernel's store reads its loads again, outside the staged loop")
  loads = stageable_loads(state)
  _check(opt.axis is not None and 0 <= opt.axis < len(loads),
         f"{opt}: axis picks one of the {len(loads)} loads of a single reduce")
  load = loads[opt.axis or 0]
  _check(all(staged is not load for staged, _ in state.staged), f"{opt}: that load is already staged")
  _check(0 <= (opt.amount or 0) <= MAX_ROW_PADDING, f"{opt}: padding must be 0..{MAX_ROW_PADDING} elements")
  return state.replace(staged=state.staged + ((load, opt.amount or 0),))

OPT_FUNCTIONS: dict[OptOps, Callable[[AxisState, Opt], AxisState]] = {
  OptOps.UPCAST: upcast, OptOps.UNROLL: unroll, OptOps.LOCAL: local, OptOps.GROUP: group, OptOps.GROUPTOP: group,
  OptOps.THREAD: thread, OptOps.SWAP: swap, OptOps.PADTO: padto, OptOps.NOLOCALS: nolocals, OptOps.TC: tensor_core,
  OptOps.SMEM: smem, OptOps.WGMMA: warpgroup_mma, OptOps.SGEMM: simt_matmul, OptOps.TF32X3: split_tf32_matmul}

# ---- the target's limits, checked after every opt

def _check_limits(state: AxisState) -> None:
  """Threads per block, grid/block dimension limits and shared memory of a kernel for a target with thread ids."""
  caps = state.renderer
  threads = prod(state.local_axis_sizes)
  _check(threads <= caps.max_local_size, f"{threads} threads per block > {caps.max_local_size}")
  state.launch_dims()
  nbytes = 0
  if state.group_for_reduces:
    # one shared array per reduce and output upcast replica, one slot per thread (see reduces.group_combine)
    replicas = prod(state.full_shape[a] for a in state.upcast_axes if not state.is_reduce_axis(a))
    nbytes += sum(r.dtype.itemsize for r in state.reduceops) * replicas * threads
  for load, padding in state.staged:
    plan = stage_plan(state, load, padding)
    nbytes += plan.buffer_elements * plan.buffers * load.dtype.itemsize
  _check(nbytes <= caps.shared_memory_bytes, f"{nbytes} bytes of shared memory > {caps.shared_memory_bytes}")

# ---- padding a reduce

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
