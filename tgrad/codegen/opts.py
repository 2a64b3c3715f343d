"""The OptOps: applying one Opt to a Kernel, and the legality checks that refuse it with a KernelOptError.

Every op but TC and SMEM splits an axis and moves the piece to its role's place (Kernel.shift_to). TC lays one warp
over a tile of a matmul-like reduce (its qualifying reduces and axis choices are in tensor_cores.py); SMEM stages one
input's tile in shared memory per step of the reduce loop (its loads and layout are in staging.py). A padded reduce
axis is legal only where the padding adds 0 to every reduce (reduce_ignores_padding).
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ALU, exec_alu, truncate_to
from tgrad.codegen.axes import MEMORY_OPS, KernelOptError, Opt, OptOps, TensorCoreUse
from tgrad.codegen.staging import MAX_ROW_PADDING, stage_plan, stageable_loads
from tgrad.codegen.tensor_cores import _operand_format, tensor_core_choices, tensor_core_operands
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import canonical, ceil_div, divides, is_symbolic, render as render_size, vmax_of
from tgrad.helpers import prod, round_up
if TYPE_CHECKING:
  from tgrad.codegen.kernel import Kernel

MAX_UPCAST = 512   # largest product of upcast/unroll amounts (an 8×8 register tile × K unrolled by 8): more unrolled
                   # code only bloats compile time
MAX_PADDING_FRACTION = 1   # PADTO adds fewer positions than the axis has: padding never more than doubles its work

def apply(kernel: Kernel, opt: Opt) -> None:
  """Apply one Opt to the kernel in place, or raise KernelOptError (Kernel.apply_opt then restores the kernel)."""
  if opt.op is OptOps.TC: apply_tensor_core(kernel, opt)
  else: _apply(kernel, opt)
  if kernel.renderer.has_local: _check_limits(kernel)

def _check(cond: bool, why: str) -> None:
  if not cond: raise KernelOptError(why)

def _real_axis(kernel: Kernel, opt: Opt) -> int:
  if opt.op in (OptOps.UNROLL,): axis = kernel.first_reduce + (opt.axis or 0)
  elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
    axis = kernel.first_reduce + kernel.group_for_reduces + (opt.axis or 0)
  else: axis = opt.axis if opt.axis is not None else -1
  _check(axis is not None and 0 <= axis < kernel.shape_len, f"{opt}: axis out of range for {kernel.full_shape}")
  return axis

def _apply(kernel: Kernel, opt: Opt) -> None:
  caps = kernel.renderer
  if opt.op is OptOps.NOLOCALS:
    _check(kernel.local_dims == 0 and kernel.group_for_reduces == 0 and not kernel.staged, "NOLOCALS after locals")
    _check(not kernel.dont_use_locals, "NOLOCALS twice")
    kernel.dont_use_locals = True
    return
  if opt.op is OptOps.SMEM: return apply_stage(kernel, opt)
  axis = _real_axis(kernel, opt)
  size = kernel.full_shape[axis]
  if not isinstance(size, int) and opt.op is OptOps.PADTO:
    _check(bool(opt.amount), f"{opt}: PADTO of the symbolic axis {axis} needs an amount")
  elif not isinstance(size, int) and opt.op is not OptOps.SWAP:
    _split_symbolic_axis(kernel, opt, axis, size)
    size = kernel.full_shape[axis]
  amount = opt.amount if opt.amount else size
  _check(amount > 1 or opt.op is OptOps.SWAP, f"{opt}: amount must be > 1")
  if opt.op not in (OptOps.SWAP, OptOps.PADTO):
    _check(divides(amount, size), f"{opt}: {amount} doesn't divide axis size {render_size(size)}")
  # the launch runs exactly `threads` copies of axis 0 (launch_dims): its size must never change or move
  _check(not kernel.threads or axis != 0, f"{opt}: axis 0 is the THREAD axis of {kernel.full_shape}")
  _check(axis not in kernel.tc_lane_axes + kernel.tc_upcast_axes, f"{opt}: axis {axis} belongs to the tensor core")
  if opt.op is OptOps.UPCAST:
    _check(axis < kernel.first_reduce, f"{opt}: UPCAST needs a non-reduce axis")
    _check(kernel.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
    kernel.shift_to(axis, amount)
    kernel.upcasted += 1
  elif opt.op is OptOps.UNROLL:
    _check(kernel.first_reduce + kernel.group_for_reduces <= axis < kernel.first_upcast, f"{opt}: needs a reduce axis")
    _check(kernel.unrolled_size * amount <= MAX_UPCAST, f"{opt}: upcast product over {MAX_UPCAST}")
    kernel.shift_to(axis, amount)
    kernel.upcasted += 1
    if kernel.tensor_core is not None: drop_unit_reduce_axis(kernel, axis)
  elif opt.op is OptOps.LOCAL:
    _check(caps.has_local and not kernel.dont_use_locals, f"{opt}: target has no local memory/threads")
    _check(axis < kernel.global_dims, f"{opt}: LOCAL needs a global axis")
    _check(prod(kernel.local_axis_sizes) * amount <= caps.max_local_size, f"{opt}: too many local threads")
    # a warp's lanes stay last
    kernel.shift_to(axis, amount, insert_before=kernel.first_reduce - len(kernel.tc_lane_axes))
    kernel.local_dims += 1
  elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
    _check(caps.has_shared and not kernel.dont_use_locals, f"{opt}: target has no shared memory")
    _check(len(kernel.reduceops) >= 1 and kernel.first_reduce <= axis < kernel.first_upcast,
           f"{opt}: needs a reduce axis")
    _check(kernel.group_for_reduces == 0, f"{opt}: only one GROUP")
    _check(kernel.tensor_core is None, f"{opt}: a tensor core's accumulators can't be shared (GROUP after TC)")
    kernel.shift_to(axis, amount, top=opt.op is OptOps.GROUPTOP,
                    insert_before=kernel.first_reduce + kernel.group_for_reduces)
    kernel.group_for_reduces += 1
  elif opt.op is OptOps.THREAD:
    _check(caps.has_threads, f"{opt}: target has no CPU threads")
    _check(kernel.threads == 0 and axis < kernel.global_dims, f"{opt}: one THREAD, on a global axis")
    kernel.shift_to(axis, amount, top=True, insert_before=0)
    kernel.threads = amount
  elif opt.op is OptOps.SWAP:
    other = opt.amount
    _check(other is not None and axis < other < kernel.global_dims, f"{opt}: SWAP needs two global axes")
    order = list(range(kernel.shape_len))
    order[axis], order[other] = order[other], order[axis]
    kernel.reshape_and_permute(None, order)
  elif opt.op is OptOps.PADTO: _pad_to(kernel, opt, axis, amount)
  else:
    raise KernelOptError(f"{opt.op} is not supported by this kernel")

def _split_symbolic_axis(kernel: Kernel, opt: Opt, axis: int, size) -> None:
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
  if divides(amount, size): return
  group = opt.op in (OptOps.GROUP, OptOps.GROUPTOP)
  guarded = opt.op in (OptOps.LOCAL, OptOps.UPCAST) and axis < kernel.global_dims or \
    group and kernel.is_reduce_axis(axis)
  _check(guarded, f"{opt}: axis {axis} has the symbolic size {render_size(size)}, not a multiple of {amount} "
              f"for every value; {opt.op.name} needs one (a symbolic reduce axis is never unrolled with a guard)")
  if group and not all(reduce_ignores_padding(r) for r in kernel.reduceops): _add_padding_guard(kernel, axis, size)
  pad_symbolic_axis(kernel, axis, amount)

def pad_symbolic_axis(kernel: Kernel, axis: int, amount: int) -> None:
  """The guard of a split of a symbolic axis: pad it to ceil(n/amount)*amount (>= n for every value), the padding
  masked off: loads there read 0 and stores there are skipped. Along a global (output) axis, a tracker that doesn't
  move along it (stride 0: the weights of a matmul along its rows) is stretched instead of masked: a padded position
  reads the same valid memory as the axis' first, so an upcast's replicas share that load, and what the padding
  computes is never stored. Only where its last view is that expand: a later view that splits an earlier one keeps
  its split (stretched, it would be indexed through a flat position divided by symbolic sizes), so it is masked; pad
  every symbolic axis before splitting any (the heuristics do). Along a reduce axis every tracker is masked (the
  padding must add nothing)."""
  size = kernel.full_shape[axis]
  padded = canonical(ceil_div(size, amount) * amount)
  output_axis = axis < kernel.global_dims
  def pad(st: ShapeTracker) -> ShapeTracker:
    if st.shape[axis] == 1: return st
    if output_axis and st.views[-1].strides[axis] == 0 and st.real_strides()[axis] == 0:
      try: return st.shrink(tuple((0, 1) if a == axis else (0, s) for a, s in enumerate(st.shape))) \
        .expand(st.shape[:axis] + (padded,) + st.shape[axis + 1:])
      except ValueError: pass   # an axis that may be empty has no first position: masked
    return st.pad_end_to(axis, padded)
  kernel.sts = [pad(st) for st in kernel.sts]

def _add_padding_guard(kernel: Kernel, axis: int, size) -> None:
  """A tracker of the kernel's shape that varies along `axis` only (stride 0 elsewhere): padded with the others, its
  valid is exactly "not padding" at any indices. It is no memory op of the AST: the value graph asks it for that
  valid and gives each reduce its identity where it is false (value_graph.ValueBuilder.unrolled_value)."""
  st = ShapeTracker.from_shape(tuple(size if a == axis else 1 for a in range(kernel.shape_len)))
  st = st.expand(kernel.full_shape)
  view = UOp(Ops.VIEW, dtypes.void, (), st)
  guard = UOp(Ops.CONST, dtypes.bool, (view,), ("padding guard", len(kernel.padding_guards)))
  kernel.memops, kernel.sts = kernel.memops + [guard], kernel.sts + [st]
  kernel.padding_guards += (guard,)

def _pad_to(kernel: Kernel, opt: Opt, axis: int, amount: int) -> None:
  """PADTO: grow a loop axis to a multiple of `amount` with masked-off positions (loads read 0, stores are skipped).
  A global axis is always safe; a reduce axis only where the padding adds exactly 0 to every reduce. A symbolic
  global axis gets the guard of a split (pad_symbolic_axis; ceil(n/amount)*amount), so that the splits after it
  divide and test one position each: a prompt's rows padded to a 64-row block tile, then upcast by 4 and spread
  over 16 threads, check row < n once per replica."""
  loop_reduce = kernel.first_reduce + kernel.group_for_reduces <= axis < kernel.first_upcast
  _check(axis < kernel.global_dims or loop_reduce, f"{opt}: PADTO needs a global or reduce loop axis")
  size = kernel.full_shape[axis]
  if not isinstance(size, int):
    _check(axis < kernel.global_dims, f"{opt}: PADTO of the symbolic reduce axis {axis} ({render_size(size)})")
    _check(not divides(amount, size), f"{opt}: axis size {render_size(size)} is already a multiple")
    _check(amount - 1 < vmax_of(size) * MAX_PADDING_FRACTION,
                f"{opt}: padding axis {axis} of at most {vmax_of(size)} to a multiple of {amount} wastes too much")
    return pad_symbolic_axis(kernel, axis, amount)
  padded = round_up(size, amount)
  _check(padded != size, f"{opt}: axis size {size} is already a multiple of {amount}")
  _check(padded - size < size * MAX_PADDING_FRACTION,
              f"{opt}: padding axis {axis} from {size} to {padded} wastes too much")
  if kernel.is_reduce_axis(axis):
    _check(all(reduce_ignores_padding(r) for r in kernel.reduceops),
                f"{opt}: padding reduce axis {axis} would change the reduce {[r.arg[0] for r in kernel.reduceops]}")
  padding = tuple((0, padded - size) if d == axis else (0, 0) for d in range(kernel.shape_len))
  # an output's reduce axes have size 1 and stay so; every other tracker spans the full axis
  kernel.sts = [st if st.shape[axis] == 1 else st.pad(padding) for st in kernel.sts]

def drop_unit_reduce_axis(kernel: Kernel, axis: int) -> None:
  """Remove a reduce axis left with size 1: it is no reduce axis any more, so in the loop region it would count as
  a local axis and move the tensor core's lanes."""
  if kernel.full_shape[axis] == 1: kernel.reshape_and_permute(lambda shape: shape[:axis] + shape[axis + 1:], None)

def _check_limits(kernel: Kernel) -> None:
  """Threads per block, grid/block dimension limits and shared memory of a kernel for a target with thread ids."""
  caps = kernel.renderer
  threads = prod(kernel.local_axis_sizes)
  _check(threads <= caps.max_local_size, f"{threads} threads per block > {caps.max_local_size}")
  kernel.launch_dims()
  nbytes = 0
  if kernel.group_for_reduces:
    # one shared array per reduce and output upcast replica, one slot per thread (see reduces.group_combine)
    replicas = prod(kernel.full_shape[a] for a in kernel.upcast_axes if not kernel.is_reduce_axis(a))
    nbytes += sum(r.dtype.itemsize for r in kernel.reduceops) * replicas * threads
  for load, padding in kernel.staged:
    plan = stage_plan(kernel, load, padding)
    nbytes += plan.buffer_elements * plan.buffers * load.dtype.itemsize
  _check(nbytes <= caps.shared_memory_bytes, f"{nbytes} bytes of shared memory > {caps.shared_memory_bytes}")

# ---- tensor cores (OptOps.TC)

def apply_tensor_core(kernel: Kernel, opt: Opt) -> None:
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
  k, caps = kernel, kernel.renderer
  _check(not is_symbolic(k.full_shape[k.first_reduce:]), f"{opt}: tensor cores need a reduce of known size")
  _check(bool(caps.tensor_cores), f"{opt}: {type(caps).__name__} {getattr(caps, 'arch', '')} has no tensor core")
  threaded = k.local_dims or k.group_for_reduces or k.threads or k.dont_use_locals
  _check(k.tensor_core is None and not threaded, f"{opt}: TC must come before {k.applied_opts}")
  _check(len(k.reduceops) == 1 and not k.row_store,
           f"{opt}: TC needs exactly one reduce and no row store, the kernel has {len(k.reduceops)}")
  reduce = k.reduceops[0]
  operands = tensor_core_operands(reduce)
  _check(operands is not None, f"{opt}: the reduce is not a sum of products of two loads: {reduce.src[0]}")
  assert operands is not None
  formats = tuple((x.dtype, x.op is not Ops.LOAD) for x in operands)   # (dtype, rounded to TF32)
  cores = [tc for tc in caps.tensor_cores if formats == ((tc.dtype_in, tc.tf32),) * 2 and reduce.dtype == tc.dtype_acc]
  _check(bool(cores), f"{opt}: no tensor core multiplies ({', '.join(_operand_format(x) for x in operands)}) into "
                        f"{reduce.dtype}")
  _check(0 <= (opt.amount or 0) < len(cores), f"{opt}: amount picks one of {len(cores)} tensor cores")
  core = cores[opt.amount or 0]
  choices = tensor_core_choices(k, core, operands)
  _check(0 <= (opt.axis or 0) < len(choices),
           f"{opt}: axis picks one of {len(choices)} (rows, columns, K) choices for tile {core.dims} in shape "
           f"{k.full_shape}")
  rows, columns, k_axis, a, b = choices[opt.axis or 0]
  upcasts_before = k.upcasted
  tile_rows, tile_columns, tile_k = core.dims
  # a symbolic rows or columns axis (a prompt's rows) that the tile doesn't divide for every value is padded with the
  # guard of a split: its padded positions' fragment elements load 0 and their outputs are not stored
  for axis, tile in ((rows, tile_rows), (columns, tile_columns)):
    if not divides(tile, k.full_shape[axis]): pad_symbolic_axis(k, axis, tile)
  groups = core.lanes // core.lanes_per_group
  k.shift_to(rows, groups, insert_before=k.first_reduce)              # rows → rows/8 · [group]
  k.local_dims += 1
  k.shift_to(rows, tile_rows // groups)                               # rows/8 → rows/16 · [2]
  k.upcasted += 1
  k.shift_to(columns, tile_columns // core.lanes_per_group)           # columns → columns/2 · [2]
  k.upcasted += 1
  k.shift_to(columns, core.lanes_per_group, insert_before=k.first_reduce)   # columns/2 → columns/8 · [tig]
  k.local_dims += 1
  k_axis += 2   # the two lane axes went in before the reduce axes
  k.shift_to(k_axis, tile_k)
  k.upcasted += 1
  drop_unit_reduce_axis(k, k_axis)   # K = 16: no loop is left
  k.tensor_core = TensorCoreUse(core, reduce, a, b, rows, columns, upcasts_before)

# ---- shared-memory staging (OptOps.SMEM)

def apply_stage(kernel: Kernel, opt: Opt) -> None:
  """SMEM: Opt.axis picks a load of `stageable_loads`, Opt.amount the padding (elements) after each row of its
  tile. The tile is only laid out when the kernel is linearized (`stage_plan`), so later opts may still reshape it."""
  # a symbolic kernel stages tiles of its known axes: its reduce must be known (the steps of the pipelined copy), its
  # symbolic output axes are block indices (padded and split first, the padding's loads masked like the kernel's)
  _check(not is_symbolic(kernel.full_shape[kernel.first_reduce:]),
                f"{opt}: a reduce of symbolic length stages no tile")
  _check(kernel.renderer.has_shared and not kernel.dont_use_locals, f"{opt}: target has no shared memory")
  _check(not kernel.row_store, f"{opt}: a row kernel's store reads its loads again, outside the staged loop")
  loads = stageable_loads(kernel)
  _check(opt.axis is not None and 0 <= opt.axis < len(loads),
                f"{opt}: axis picks one of the {len(loads)} loads of a single reduce")
  load = loads[opt.axis or 0]
  _check(all(staged is not load for staged, _ in kernel.staged), f"{opt}: that load is already staged")
  _check(0 <= (opt.amount or 0) <= MAX_ROW_PADDING, f"{opt}: padding must be 0..{MAX_ROW_PADDING} elements")
  kernel.staged += ((load, opt.amount or 0),)

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
