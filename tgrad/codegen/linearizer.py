"""The linearizer: Kernel → a flat list of UOps that a renderer walks top to bottom. It is a pipeline of passes, each
a function of plain values that a test can call alone, in this order:

  1. build_value_graph (value_graph.py): Kernel → ValueGraph, the STOREs of every output replica as a DAG:
     a. axis_indices: an index per axis (RANGE loop, SPECIAL thread id, or a constant per upcast replica);
     b. StagedTiles (staging.py): shared-memory tiles of staged loads and the block's copies into them (OptOps.SMEM);
     c. ValueBuilder: the AST at axis indices. Memory ops by Addressing (ShapeTracker → index, valid); a gather adds
        the index value it reads, clamped into its table (data-dependent loads). Reduces by reduces.py: a REDUCE
        over the loops of its row pass (row kernels: multi-reduce fusion), blocked where a float sum is long, folded
        where its value doesn't vary, then combined across a GROUP's threads through shared memory (split-K).
        A tensor-core reduce by tensor_cores.py: lane fragments, one WMMA per K step, a GEP per output replica;
     d. build_stores: the output's upcast axes expanded into replicas (unrolled), a row kernel's store loops.
  2. decompose: exp2/log2/sin as polynomials where the renderer asks for it (transcendental.py).
  3. emit_program (emit.py): ValueGraph → the program: parameters, thread ids, (on a CPU: what varies along no loop,
     and the scratch values' loops, scratch.py), loops, and each REDUCE as an accumulator, its loop (hoisting what
     doesn't vary), updates and ENDRANGE, then the stores.
  4. hoist_early_loads (early_loads.py, targets with thread blocks): a later pass's loads of read-only inputs moved
     before the block's first barrier.

  DEFINE_GLOBAL 0, DEFINE_GLOBAL 1, RANGE r0 (0..N), DEFINE_ACC a0, RANGE r1 (0..K), LOAD, ADD, ASSIGN a0,
  ENDRANGE r1, REDUCE (reads a0), STORE, ENDRANGE r0
"""
from __future__ import annotations
from tgrad.ops import UOp
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.renderer import Renderer
from tgrad.codegen import transcendental
from tgrad.codegen.value_graph import build_value_graph
from tgrad.codegen.emit import emit_program
from tgrad.codegen.early_loads import hoist_early_loads

def decompose(stores: list[UOp], renderer: Renderer) -> list[UOp]:
  """The stores with transcendental ops rewritten into polynomials (transcendental.py) where the renderer asks for it
  (SIMD CPUs: a vectorizable polynomial beats a libm call per lane) or the op's lowering arg does ("poly")."""
  return transcendental.decompose(stores, renderer.decompose_transcendentals)

def linearize(kernel: Kernel) -> list[UOp]:
  """The kernel's linear program (passes 1-4 above). A CPU kernel's scratch values (scratch.py) are decomposed with
  its stores."""
  graph = build_value_graph(kernel)
  scratch_stores = [store for _, stores in graph.precompute for store in stores]
  decomposed = decompose(list(graph.stores) + list(graph.pass_stores) + scratch_stores, kernel.renderer)
  n_stores, n_pass = len(graph.stores), len(graph.pass_stores)
  stores, pass_stores = decomposed[:n_stores], decomposed[n_stores:n_stores + n_pass]
  scratch = iter(decomposed[n_stores + n_pass:])
  precompute = tuple((loops, tuple(next(scratch) for _ in nest)) for loops, nest in graph.precompute)
  program = emit_program(kernel, graph, stores, pass_stores, precompute)
  return hoist_early_loads(program) if kernel.renderer.has_local else program
