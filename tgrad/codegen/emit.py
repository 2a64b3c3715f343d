"""Order and emit: a ValueGraph's stores (value_graph.py) → the flat program a renderer walks top to bottom.

`emit_program` places, in order: the kernel's parameters (every buffer, every variable), its thread ids, the global
loops, a row kernel's store loops (with every pass's reduces hoisted above them), then each store after its sources,
depth-first. A REDUCE brings its whole loop (`ProgramEmitter.emit_reduce_group`): the reduces over the same ranges
share one loop; their loop-invariant inputs are hoisted above it; each gets an accumulator (DEFINE_ACC, plus the
running error of a Kahan sum, or a LOGADDEXP's state: running max and rescaled sum), the loop (behind an IF for a
GROUP's gated combine), the staged tiles' next-step copy at the top of the body, the updates (folded term by term for a
register tile), the ASSIGNs, the next copy's stores and barrier, ENDRANGE (and a LOGADDEXP's m + log d into its
accumulator). The result reads as a program:

  DEFINE_GLOBAL 0, DEFINE_GLOBAL 1, RANGE r0 (0..N), DEFINE_ACC a0, RANGE r1 (0..K), LOAD, ADD, ASSIGN a0,
  ENDRANGE r1, REDUCE (reads a0), STORE, ENDRANGE r0
"""
from __future__ import annotations
import itertools
from typing import Iterator, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, simplify, identity_of_reduce
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.value_graph import ValueGraph
from tgrad.codegen.reduces import (FOLD_MIN_ACCUMULATORS, is_compensated, kahan_step, online_merge, online_result,
                                   online_step, reduce_terms)
from tgrad.codegen.transcendental import decompose

class ProgramEmitter:
  """Places UOps into one program. `emitted` is what the current scope may reuse (a loop body's values are forgotten
  when the loop ends); `open_ranges` the loops around the current position; `free` the RANGEs each node's value
  depends on (a REDUCE binds its own). `decompose_by_default`: the renderer's choice for the EXP2/LOG2 the emitter
  itself builds (a LOGADDEXP's updates), as linearizer.decompose for the value graph's."""
  def __init__(self, graph: ValueGraph, stores: list[UOp], ids: Iterator[int], decompose_by_default: bool = False,
               pass_stores: tuple[UOp, ...] = ()):
    self.graph, self.ids, self.decompose_by_default = graph, ids, decompose_by_default
    self.online_states: dict[UOp, tuple[UOp, UOp]] = {}   # a LOGADDEXP's (running max, rescaled sum) accumulators
    self.program: list[UOp] = []
    self.emitted: set[UOp] = set()
    self.scopes: list[list[UOp]] = [[]]
    self.open_ranges: set[UOp] = set()
    self.pass_stores = list(pass_stores)
    self.nodes = UOp(Ops.SINK, dtypes.void, tuple(stores) + tuple(pass_stores)).toposort()
    self.reduces = [u for u in self.nodes if u.op is Ops.REDUCE]
    self.free: dict[UOp, frozenset] = {}
    for u in self.nodes:   # a loop's bounds may depend on outer loops (a block of a blocked sum)
      self.free[u] = frozenset().union(*(self.free[s] for s in u.src)) | ({u} if u.op is Ops.RANGE else set())
      if u.op is Ops.REDUCE: self.free[u] -= set(u.src[1:])

  def place(self, u: UOp) -> None:
    self.program.append(u)
    self.emitted.add(u)
    self.scopes[-1].append(u)

  def emit(self, root: UOp) -> None:
    """Place `root` after its sources, depth-first in source order (an explicit stack: chains of any length); a
    REDUCE brings its whole loop (emit_reduce_group)."""
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
      u, sources_placed = stack.pop()
      if sources_placed: self.place(u)
      elif u in self.emitted: continue
      elif u.op is Ops.REDUCE: self.emit_reduce_group(u)
      else:
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(u.src))

  def open_loop(self, rng: UOp) -> None:
    self.emit(rng.src[0])
    self.emit(rng.src[1])
    self.place(rng)
    self.open_ranges.add(rng)

  def emit_loop_nest(self, loops: tuple[UOp, ...], stores: list[UOp]) -> None:
    """`stores` inside loops of their own (a CPU kernel's scratch values, scratch.py), placed here."""
    for rng in loops: self.open_loop(rng)
    self.scopes.append([])
    for store in stores: self.emit(store)
    for rng in reversed(loops): self.program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
    self.open_ranges.difference_update(loops)
    for u in self.scopes.pop(): self.emitted.discard(u)

  def hoist_invariants(self, *values: UOp, stores_too: bool = True) -> None:
    """Emit, before a loop, what its body reads but does not vary with it: index math and loads of outer axes,
    and a GROUP's partial, shared-memory store and barrier, which must run once and not once per iteration
    (`stores_too`: before a CPU kernel's global loops, values only). The values are walked in order, each node once
    (a register tile's accumulators share their index math)."""
    for u in UOp(Ops.SINK, dtypes.void, values).toposort()[:-1]:
      if u not in self.emitted and u.op is not Ops.CONST and self.free[u] <= self.open_ranges and \
         (stores_too or u.op is not Ops.STORE): self.emit(u)

  def emit_reduce_group(self, first: UOp) -> None:
    """`first` and every other REDUCE over the same ranges: one loop, its invariants hoisted above it, an accumulator
    each, the staged tiles' next copy around the body where the loop is the staged one."""
    ranges = first.src[1:]
    # (a reduce hoisted above a CPU kernel's global loops leaves behind the ones that vary along them)
    group = [r for r in self.reduces if r.src[1:] == ranges and r not in self.emitted and
             (r is first or self.free[r] <= self.open_ranges)]
    for r in ranges: self.emit(r.src[0]); self.emit(r.src[1])  # noqa: E702
    self.hoist_invariants(*(r.src[0] for r in group))
    accs, partners = self.define_accumulators(group)
    # only the thread that stores reduces a GROUP's partials: for the others the accumulator stays the identity
    branch = UOp(Ops.IF, dtypes.void, (simplify(self.graph.gate),)) if set(ranges) & self.graph.gated_loops else None
    if branch is not None:
      self.emit(branch.src[0])
      self.place(branch)
    for r in ranges: self.place(r)
    self.open_ranges.update(ranges)
    self.scopes.append([])
    next_copy = self.graph.next_copy
    prefetch = next_copy[1] if next_copy is not None and next_copy[0] == ranges else None
    if prefetch is not None:   # the next step's global loads first: the body's math hides their latency
      for store in prefetch.src: self.emit(store if store in self.graph.early_stores else store.src[2])
    self.emit_updates(group, accs, partners)
    for store in self.pass_stores:   # a row pass's stores (value_graph.PassStore): in the body of the loop they index
      if set(ranges) & self.free[store] and self.free[store] <= self.open_ranges: self.emit(store)
    if prefetch is not None: self.emit(prefetch)   # their stores into the other buffer, then the step's one barrier
    for rng in reversed(ranges): self.program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
    if branch is not None: self.program.append(UOp(Ops.ENDIF, dtypes.void, (branch,)))
    self.open_ranges.difference_update(ranges)
    for u in self.scopes.pop(): self.emitted.discard(u)
    for r in group:   # a LOGADDEXP's value: log Σ exp = m + log d, into the accumulator its REDUCE reads
      if r.arg[0] is Ops.LOGADDEXP: self.assign(accs[r], self.built(online_result(*self.online_states[r], r.dtype)))
    for r in group: self.place(r)

  def built(self, value: UOp) -> UOp:
    """An update value the emitter built, its EXP2/LOG2 decomposed as the renderer wants (transcendental.py), placed
    after its sources."""
    [value] = decompose([value], self.decompose_by_default)
    self.emit(value)
    return value

  def assign(self, acc: UOp, value: UOp) -> None: self.place(UOp(Ops.ASSIGN, acc.dtype, (acc, value)))

  def define_accumulators(self, group: list[UOp]) -> tuple[dict[UOp, UOp], dict[UOp, UOp]]:
    """Each reduce's accumulator, starting at its identity (a WMMA's fragment accumulator is part of its value,
    hoisted above, and only emitted here), and a Kahan sum's partner, its running rounding error. A LOGADDEXP's
    accumulator takes its result after the loop; its state (running max from −inf, rescaled sum from 0) has two more,
    in its source's dtype (`online_states`)."""
    accs, partners = {}, {}
    for r in group:
      if r.arg[0] is Ops.WMMA:
        accs[r] = next(u for u in r.src[0].toposort() if u.op is Ops.DEFINE_ACC and u.arg == r.arg[1])
        self.emit(accs[r])
        continue
      init = UOp.const(r.dtype, identity_of_reduce(r.arg[0], r.dtype))
      self.emit(init)
      accs[r] = UOp(Ops.DEFINE_ACC, r.dtype, (init,), r.arg[1])
      self.place(accs[r])
      if is_compensated(r):
        partners[r] = UOp(Ops.DEFINE_ACC, r.dtype, (init,), next(self.ids) - 1)
        self.place(partners[r])
      if r.arg[0] is Ops.LOGADDEXP:
        state_dtype = r.src[0].dtype
        starts = [UOp.const(state_dtype, identity_of_reduce(Ops.LOGADDEXP, state_dtype)), UOp.const(state_dtype, 0.0)]
        for start in starts: self.emit(start)
        state = tuple(UOp(Ops.DEFINE_ACC, state_dtype, (start,), next(self.ids) - 1) for start in starts)
        for acc in state: self.place(acc)
        self.online_states[r] = state
    return accs, partners

  def emit_updates(self, group: list[UOp], accs: dict[UOp, UOp], partners: dict[UOp, UOp]) -> None:
    """The loop body: each reduce's update and its ASSIGN. With several accumulators (a register tile), every one
    takes its first unrolled value, then its second, …: an outer product per unrolled step (FMAs into the
    accumulators, one step's operands live). A lone accumulator combines the step's values first, so only one op per
    step depends on the last step. A compensated sum adds its unrolled values one by one, each with compensation. A
    LOGADDEXP makes the state of the step's values and merges it into (max, rescaled sum) (reduces.online_merge)."""
    fold = sum(1 for r in group if r.arg[0] is not Ops.WMMA) >= FOLD_MIN_ACCUMULATORS
    online = [r for r in group if r.arg[0] is Ops.LOGADDEXP]
    updates = {r: r.src[0] if r.arg[0] is Ops.WMMA else accs[r] for r in group}
    terms = {r: [] if r.arg[0] in (Ops.WMMA, Ops.LOGADDEXP) else reduce_terms(r) if fold or is_compensated(r) else
             [r.src[0]] for r in group}
    corrections: dict[UOp, UOp] = {}
    online_updates: list[tuple[UOp, UOp]] = []   # (state accumulator, its new value), assigned after every update
    for r in online:
      for term in reduce_terms(r): self.emit(term)
      peak, total = online_merge(*self.online_states[r], *online_step(reduce_terms(r)))
      online_updates += [(acc, self.built(value)) for acc, value in zip(self.online_states[r], (peak, total))]
    for r in group:
      if r.arg[0] is Ops.WMMA: self.emit(r.src[0])
    for step in range(max((len(t) for t in terms.values()), default=0)):
      for r in group:
        if step >= len(terms[r]): continue
        self.emit(terms[r][step])
        if r in partners:
          updates[r], corrections[r] = kahan_step(updates[r], corrections.get(r, partners[r]), terms[r][step])
          self.emit(corrections[r])
          continue
        updates[r] = UOp(r.arg[0], r.dtype, (updates[r], terms[r][step]))
        if updates[r] not in self.emitted: self.place(updates[r])
    for r in group:
      if r.arg[0] is not Ops.LOGADDEXP: self.assign(accs[r], updates[r])
    for r, correction in corrections.items(): self.assign(partners[r], correction)
    for acc, value in online_updates: self.assign(acc, value)

def _parameters(kernel: Kernel, graph: ValueGraph, nodes: list[UOp]) -> list[UOp]:
  """The program's head: buffers, variables and thread ids, in the order renderers number them."""
  # every buffer of the kernel is a parameter, even one whose loads all turned into constants (fully masked):
  # renderers number parameters by DEFINE_GLOBAL index, and the launch passes every buffer
  kernel_buffers = {m.src[0] for m in kernel.memops if m.op in (Ops.LOAD, Ops.STORE)}
  buffers = sorted({u for u in nodes if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)} | kernel_buffers,
                   key=lambda u: (u.op is Ops.DEFINE_LOCAL, u.arg if u.op is Ops.DEFINE_GLOBAL else u.arg[0]))
  # every variable and scalar parameter of the kernel is a parameter too, used or not (a grid over a symbolic axis may
  # need no value in the code): the launch passes the values of all of them, in name order (CompiledKernel.variables)
  # every thread id, used or not: a renderer sizes the launch (e.g. __launch_bounds__) from them
  specials = {u for i in graph.indices if i is not None for u in i.toposort() if u.op is Ops.SPECIAL}
  specials |= {u for u in nodes if u.op is Ops.SPECIAL}
  return buffers + kernel.parameters + sorted(specials, key=lambda u: u.arg[0])

def emit_program(kernel: Kernel, graph: ValueGraph, stores: Optional[list[UOp]] = None,
                 pass_stores: Optional[list[UOp]] = None, precompute: Optional[tuple] = None) -> list[UOp]:
  """The linear program of a value graph: `stores` (default graph.stores; the decomposed ones where a renderer wants
  them) inside the global loops and a row kernel's store loops, `pass_stores` (default graph.pass_stores, decomposed
  likewise) in their row pass's loop. A Kahan sum's compensation and a LOGADDEXP's state take the next accumulator
  numbers after the graph's. On a CPU (global loops, no thread blocks) what varies along no loop comes first (a norm's
  sum of squares that a matvec's rows read), then the scratch values' loop nests (`precompute`, default
  graph.precompute: scratch.py), then the global loops."""
  stores = list(graph.stores) if stores is None else stores
  pass_stores = list(graph.pass_stores) if pass_stores is None else pass_stores
  precompute = graph.precompute if precompute is None else precompute
  scratch_stores = [store for _, nest in precompute for store in nest]
  emitter = ProgramEmitter(graph, stores + scratch_stores, itertools.count(graph.accumulators + 1),
                           kernel.renderer.decompose_transcendentals, tuple(pass_stores))
  for u in _parameters(kernel, graph, emitter.nodes): emitter.place(u)
  outer_loops = [i for i in graph.indices[:kernel.global_dims] if i is not None and i.op is Ops.RANGE]
  if outer_loops and not kernel.renderer.has_local:   # the scratch's inputs, the scratch, then what may read it
    for store in scratch_stores: emitter.hoist_invariants(store, stores_too=False)
    for loops, nest in precompute: emitter.emit_loop_nest(loops, list(nest))
    for store in stores: emitter.hoist_invariants(store, stores_too=False)
  for rng in outer_loops: emitter.open_loop(rng)
  # a row kernel: every pass's reduces (and whatever else doesn't vary along the row) first, then the store pass's
  # loops around the stores
  if graph.row_loops:
    for store in stores: emitter.hoist_invariants(store)
  branch = None
  row_stores = [s for s in stores if s not in emitter.emitted]
  if kernel.renderer.has_local and (gate := _row_pass_gate(emitter, row_stores, graph.row_loops)) is not None:
    emitter.emit(gate)
    emitter.place(branch := UOp(Ops.IF, dtypes.void, (gate,)))
  for rng in graph.row_loops: emitter.open_loop(rng)
  for store in stores: emitter.emit(store)
  for rng in reversed(graph.row_loops): emitter.program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
  if branch is not None: emitter.program.append(UOp(Ops.ENDIF, dtypes.void, (branch,)))
  for rng in reversed(outer_loops): emitter.program.append(UOp(Ops.ENDRANGE, dtypes.void, (rng,)))
  return emitter.program

def _row_pass_gate(emitter: ProgramEmitter, row_stores: list[UOp], row_loops: tuple[UOp, ...]) -> Optional[UOp]:
  """The condition under which a row kernel's store pass stores anything, when every store in it has the same one and
  it does not vary along the pass (a copy of one row's run, schedule.py rule 2c: only the first row's threads store):
  the pass then runs behind it, so other threads skip its loads (on targets with thread blocks, whose renderers
  branch). None when the pass holds a barrier (every thread must reach it) or the stores differ."""
  if not row_loops or not row_stores or any(len(s.src) != 4 for s in row_stores): return None
  gates = {s.src[3] for s in row_stores}
  if len(gates) != 1: return None
  (gate,) = gates
  if emitter.free[gate] & set(row_loops): return None
  if any(u.op is Ops.BARRIER and u not in emitter.emitted for s in row_stores for u in s.toposort()): return None
  return gate
