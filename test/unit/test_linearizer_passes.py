"""Each pass of the linearizer called alone (linearizer.py lists them in order): axis indices, the value graph with
its row passes, GROUP combine, gathers, staged tiles and tensor cores, the decompositions and the emitter."""
import itertools
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops, UOp
from tgrad.lazy import LazyBuffer
from tgrad.schedule import create_schedule
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.codegen.linearizer import decompose, linearize
from tgrad.codegen.value_graph import axis_indices, build_value_graph, clamp_index
from tgrad.codegen.emit import emit_program
from tgrad.codegen.reduces import (GROUP_LOOP_ARG, PASS_LOOP_ARG, block_ranges, fold_invariant_reduce, group_combine,
                                   group_partial, row_pass_loops)
from tgrad.codegen.staging import StagedTiles, stage_plan
from tgrad.codegen.tensor_cores import tensor_core_choices, tensor_core_operands
from tgrad.codegen.value_graph import Addressing
from tgrad.shape.sint import to_uop

def host(shape: tuple[int, ...], dtype: DType = dtypes.float32) -> LazyBuffer:
  return LazyBuffer.from_host(np.zeros(shape, dtype.np), "LLVM", dtype)

def kernel_of(out: LazyBuffer, opts=(), renderer=None) -> Kernel:
  (item,) = [item for item in create_schedule([out]) if item.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, renderer or CUDARenderer())
  for opt in opts: kernel.apply_opt(opt)
  return kernel

def matmul(a: LazyBuffer, b: LazyBuffer, half: bool = False) -> LazyBuffer:
  (n, k), m = a.shape, b.shape[1]
  product = a.reshape((n, k, 1)).expand((n, k, m)).alu(Ops.MUL, b.reshape((1, k, m)).expand((n, k, m)))
  return (product.cast(dtypes.float32) if half else product).r(Ops.ADD, (1,)).reshape((n, m))

def softmax_rows(x: LazyBuffer) -> LazyBuffer:
  shifted = x.alu(Ops.ADD, x.r(Ops.MAX, (1,)).expand(x.shape).alu(Ops.NEG))
  exp = shifted.alu(Ops.EXP2)
  return exp.alu(Ops.FDIV, exp.r(Ops.ADD, (1,)).expand(x.shape))

def test_axis_indices_give_thread_ids_loops_and_none_for_replicas():
  kernel = kernel_of(host((64, 256)).r(Ops.ADD, (1,)), (Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 16)))
  indices = axis_indices(kernel)
  assert [i.op if i is not None else None for i in indices] == [Ops.SPECIAL, Ops.SPECIAL, Ops.RANGE, None]
  assert indices[0].arg == ("gidx0", 64) and indices[1].arg == ("lidx0", 16) and indices[2].src[1].arg == 4
  cpu = axis_indices(kernel_of(host((64, 256)).r(Ops.ADD, (1,)), renderer=LLVMRenderer()))
  assert [i.op for i in cpu] == [Ops.RANGE, Ops.RANGE]

def test_value_graph_has_one_store_per_output_replica():
  graph = build_value_graph(kernel_of(host((64, 64)).alu(Ops.EXP2), (Opt(OptOps.UPCAST, 0, 4),)))
  assert len(graph.stores) == 4 and graph.gate is None and not graph.gated_loops and not graph.row_loops
  assert sorted(s.src[1].arg if s.src[1].op is Ops.CONST else -1 for s in graph.stores).count(-1) == 4

def test_group_combine_is_gated_to_one_thread_unless_a_row_pass_reads_it():
  graph = build_value_graph(kernel_of(host((64, 256)).r(Ops.ADD, (1,)), (Opt(OptOps.GROUP, 0, 16),)))
  assert graph.gate is not None and [r.arg for r in graph.gated_loops] == [GROUP_LOOP_ARG + 1]
  assert all(len(s.src) == 4 for s in graph.stores), "only the combining thread stores"
  row = build_value_graph(kernel_of(softmax_rows(host((8, 256))), (Opt(OptOps.GROUP, 0, 16),)))
  assert not row.gated_loops, "every thread of a row kernel combines the partials: later passes read them"
  assert row.row_loops and all(r.arg >= PASS_LOOP_ARG for r in row.row_loops)

def test_group_combine_alone():
  kernel = kernel_of(host((64, 256)).r(Ops.ADD, (1,)), (Opt(OptOps.GROUP, 0, 16),))
  indices = axis_indices(kernel)
  shared, store = group_partial(kernel, indices, itertools.count(1), Ops.ADD, dtypes.float32,
                               UOp.const(dtypes.float32, 1.0))
  assert store.op is Ops.STORE and store.src[0] is shared and shared.arg == ("temp1", 16)
  barrier = UOp(Ops.BARRIER, dtypes.void, (store,))
  combined, gated = group_combine(kernel, indices, itertools.count(2), Ops.ADD, dtypes.float32, shared, barrier)
  assert combined.op is Ops.REDUCE and combined.arg[:2] == (Ops.ADD, 1) and len(combined.arg) == 3, \
    "a 256-long sum combines plainly (reduces.long_reduce)"
  kahan, _ = group_combine(kernel, indices, itertools.count(2), Ops.ADD, dtypes.float32, shared, barrier,
                           of_partials=True)
  assert kahan.arg[3], "Kahan: partial sums of an earlier kernel"
  loads = [u for u in combined.toposort() if u.op is Ops.LOAD]
  assert loads and all(u.src[0] is shared and u.src[-1] is barrier for u in loads), "reads wait for the barrier"
  assert gated == combined.src[1:]

def test_row_pass_loops_are_their_own_loops():
  kernel = kernel_of(softmax_rows(host((8, 256))), renderer=LLVMRenderer())
  indices = axis_indices(kernel)
  assert row_pass_loops(kernel, indices, 0) == {1: indices[1]}
  (later,) = row_pass_loops(kernel, indices, 2).values()
  assert later.arg == 2 * PASS_LOOP_ARG + 1 and later.src[1].arg == 256

def test_fold_invariant_reduce_and_block_ranges():
  loops = tuple(UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(n)), a) for a, n in enumerate((3, 5)))
  assert fold_invariant_reduce(Ops.ADD, dtypes.float32, UOp.const(dtypes.float32, 2.0), loops).arg == 30.0
  assert fold_invariant_reduce(Ops.MUL, dtypes.float32, UOp.const(dtypes.float32, 2.0), loops) is None
  blocks, within = block_ranges(0, 10000, 4096)
  assert (blocks.src[1].arg, within.vmin, within.vmax) == (3, 0, 9999)

def test_gather_index_is_clamped_into_the_table():
  loaded = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("i", -100, 100)).cast(dtypes.int32)
  row = clamp_index(loaded, 7)
  assert (row.vmin, row.vmax) == (0, 6)

def test_staged_tiles_alone():
  kernel = kernel_of(matmul(host((64, 64)), host((64, 64))), (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 8),
                                                              Opt(OptOps.SMEM, 0, 0)))
  ((load, padding),) = kernel.staged
  plan = stage_plan(kernel, load, padding)
  assert plan.elements == 8 and plan.buffers == 2
  tiles = StagedTiles(kernel, axis_indices(kernel), Addressing(kernel), itertools.count(1))
  assert [u.arg for u in tiles.stages[load][1:2]] == [("tile1", 16)]
  assert tiles.next_copy is not None and all(s.op is Ops.STORE for s in tiles.first_barrier.src)

def test_tensor_core_choices_and_operands():
  out = matmul(host((64, 32), dtypes.float16), host((32, 48), dtypes.float16), half=True)
  kernel = kernel_of(out)
  operands = tensor_core_operands(kernel.reduceops[0])
  assert operands is not None and all(u.dtype == dtypes.float16 for u in operands)
  choices = tensor_core_choices(kernel, kernel.renderer.tensor_cores[0], operands)
  assert [choice[:3] for choice in choices] == [(0, 1, 2), (1, 0, 2)] and kernel.full_shape == (64, 48, 32)
  assert choices[0][3:] == operands and choices[1][3:] == operands[::-1], "a varies with the rows, b with the columns"
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  graph = build_value_graph(kernel)
  assert any(u.op is Ops.WMMA for s in graph.stores for u in s.toposort())

def test_decompose_and_emit_alone_give_linearize():
  for renderer in (CUDARenderer(), LLVMRenderer()):
    kernel = kernel_of(host((16, 64)).alu(Ops.EXP2).r(Ops.ADD, (1,)), renderer=renderer)
    graph = build_value_graph(kernel)
    stores = decompose(list(graph.stores), renderer)
    has_exp2 = any(u.op is Ops.EXP2 for s in stores for u in s.toposort())
    assert has_exp2 != renderer.decompose_transcendentals
    assert emit_program(kernel, graph, stores) == linearize(kernel)
  program = emit_program(kernel, graph, stores)
  ops = [u.op for u in program]
  assert ops.index(Ops.DEFINE_ACC) < ops.index(Ops.ASSIGN) < ops.index(Ops.ENDRANGE) < ops.index(Ops.STORE)
