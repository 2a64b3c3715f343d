"""Global loads issued before a block's first barrier: a later pass's inputs in flight while the block combines.

A kernel with thread blocks runs in passes that barriers separate: a GROUP reduce's partials meet in shared memory
behind a barrier (reduces.py), and only then can a pass that reads the reduce's value start. A fused norm + matvec
kernel's first pass sums the squares of its input; its second reads the residual and the norm's weights, scales
them by that sum and multiplies them into the weight. A GPU compiler does not move a global load across a barrier,
so the second pass's loads leave only after the first pass's combine, and their round trip to L2 adds to it. Yet
they depend on nothing the first pass computes.

`hoist_early_loads` moves such loads, with the index math only they need, to just before the first barrier, where
the compiler schedules them with the first pass's own loads. A LOAD moves when:
- it reads a global buffer that this kernel never writes (nothing a thread stores can change what it reads: two
  parameters of a kernel never share memory, since the scheduler gives each Buffer one parameter and the memory
  planner never overlaps Buffers one kernel uses; nor does another kernel write it meanwhile: a kernel reads its
  inputs after its dependencies finished, and a Programmatic Dependent Launch's wait comes before every load);
- it and the barrier sit outside every loop and branch, so it runs exactly as often and under the same conditions
  (a valid mask moves with it and still guards its address);
- what it depends on after the barrier is index math alone (ELEMENTWISE ops over thread ids, variables and
  constants): no other load, no shared memory, no reduce or accumulator;
- its buffer is not the kernel's largest read-only input. That one is the stream (a matvec's weight): the L2
  prefetch before a dependent launch's wait (runtime/cuda/prefetch.py) already asks for its bytes, and holding it in
  registers across the barrier costs the most. Measured on the packed gate/up kernel of gemma-3-270m (H200, a PDL
  chain of 36 launches): 5.73 µs a launch; its residual's and norm weights' loads moved, 3.91; the weight's words
  too, 5.28 (106 registers a thread instead of 53: fewer blocks fit an SM, a second wave).
- the bytes moved so far stay within EARLY_LOAD_MAX_BYTES a thread (registers held across the barrier), taken in
  program order.
Values are unchanged: each moved load reads the same address of a buffer no one writes during the kernel.
"""
from __future__ import annotations
from tgrad.ops import UOp, Ops, ELEMENTWISE

EARLY_LOAD_MAX_BYTES = 192      # bytes of moved loads a thread holds across the barrier, at most (48 registers)
# ops an index computation is made of (beside ELEMENTWISE): what a moved load may depend on after the barrier
_INDEX_LEAVES = frozenset({Ops.CONST, Ops.SPECIAL, Ops.DEFINE_VAR, Ops.DEFINE_GLOBAL, Ops.VECTORIZE, Ops.GEP})
_OPENS, _CLOSES = (Ops.RANGE, Ops.IF), (Ops.ENDRANGE, Ops.ENDIF)

def _top_level(program: list[UOp]) -> list[bool]:
  """For each position: whether it lies outside every loop and branch."""
  depth, out = 0, []
  for u in program:
    if u.op in _CLOSES: depth -= 1
    out.append(depth == 0 and u.op not in _OPENS)
    if u.op in _OPENS: depth += 1
  return out

def read_only_buffers(program: list[UOp]) -> dict[UOp, list[UOp]]:
  """Each global buffer the program loads and never stores → its loads in program order, the buffers largest first
  by the bytes their loads reach (the first is the kernel's stream; ties by parameter number). The L2 prefetch before
  a dependent launch's wait (runtime/cuda/prefetch.py) walks them in this order too."""
  stored = {u.src[0] for u in program if u.op is Ops.STORE}
  loads: dict[UOp, list[UOp]] = {}
  for u in program:
    if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0] not in stored:
      loads.setdefault(u.src[0], []).append(u)
  def reached(buffer: UOp) -> int: return (max(load.src[1].vmax for load in loads[buffer]) + 1) * buffer.dtype.itemsize
  return {buffer: loads[buffer] for buffer in sorted(loads, key=lambda b: (-reached(b), b.arg))}

def hoist_early_loads(program: list[UOp]) -> list[UOp]:
  """`program` with the loads the module docstring describes moved before its first top-level barrier (the same
  list object's order when nothing moves)."""
  top = _top_level(program)
  barrier = next((pos for pos, u in enumerate(program) if u.op is Ops.BARRIER and top[pos]), None)
  if barrier is None: return program
  read_only = read_only_buffers(program)
  streamed = next(iter(read_only), None)
  position = {u: pos for pos, u in enumerate(program)}
  moved: set[UOp] = set()
  budget = EARLY_LOAD_MAX_BYTES
  for pos in range(barrier + 1, len(program)):
    load = program[pos]
    if load.op is not Ops.LOAD or not top[pos] or load.src[0] not in read_only or load.src[0] is streamed: continue
    if load.dtype.itemsize > budget: continue
    needs = _index_slice(load, position, top, barrier, moved)
    if needs is None: continue
    moved |= needs | {load}
    budget -= load.dtype.itemsize
  if not moved: return program
  early = [u for u in program[barrier:] if u in moved]
  return program[:barrier] + early + [u for u in program[barrier:] if u not in moved]

def _index_slice(load: UOp, position: dict[UOp, int], top: list[bool], barrier: int,
                 moved: set[UOp]) -> set[UOp] | None:
  """The nodes after the barrier that `load`'s address and valid mask need (index math only), or None when they
  need anything else or something not placed at the top level of the program."""
  out: set[UOp] = set()
  stack = list(load.src)
  while stack:
    u = stack.pop()
    pos = position.get(u)
    if u in out or u in moved or pos is None or pos < barrier: continue   # placed before: already available
    if (u.op not in ELEMENTWISE and u.op not in _INDEX_LEAVES) or not top[pos]: return None
    out.add(u)
    stack.extend(u.src)
  return out
