"""Graph simplification before scheduling: constant folding and identity removal on the lazy graph.

Input: the bases to realize. Output: the same number of bases, each computing the same values, over a graph with
fewer ops. The scheduler (schedule.py) runs this first, so it costs nothing on a schedule-cache hit: graph building
(lazy.py) stays as cheap as it is, and only a graph's first schedule pays one walk. Rules, each value-preserving
(tests: test/test_graph_simplify.py):
  - an elementwise op or CAST over unrealized, unpadded constants is the constant `exec_alu` gives (the kernels'
    semantics: ints wrap, float16 rounds); symbolic constants (UOps), lifted scalars (kernel parameters, whose
    values the schedule cache does not key on) and BITCAST are left alone;
  - x + 0 on ints (and x + −0.0 on floats: +0.0 would turn −0.0 into +0.0), x | False, x & True, x · 1, x / 1,
    x · 0 on ints only (on floats NaN · 0 and inf · 0 are NaN), −(−x), where(constant, a, b);
  - a COPY of a constant is that constant on the copy's device (nothing to copy);
  - a COPY, CUSTOM or COLLECTIVE reads whole buffers: a source that simplified to a view (a broadcast constant, say)
    is given a buffer of its own (CONTIGUOUS) first; a custom kernel's source that was a view (LazyBuffer.custom
    with views) stays that view over its rebuilt base.
Movement identities need nothing here: a reshape, permute or expand to the base's own layout already returns the
base, and chains of views compose into one ShapeTracker as they are built.
The given bases keep their identity: a base whose sources change is rebuilt as a new node with the same op, and
`commit_replacements` hands the Buffers the schedule gives the new nodes back to the old ones.
"""
from __future__ import annotations
import math
from typing import Optional
from tgrad.lazy import LazyBuffer, unrealized_bases
from tgrad.ops import Ops, UOp, ALU, exec_alu, truncate_to

FOLDABLE = ALU | {Ops.CAST}
WHOLE_BUFFER_READERS = (Ops.COPY, Ops.CUSTOM, Ops.COLLECTIVE)
# is_constant_expression looks at no more nodes than this: a bigger constant expression counts as data (its Python
# scalars become kernel parameters: correct, only not folded). Far above any chain of a few composite ops (~60).
MAX_CONSTANT_EXPRESSION_NODES = 256

def _const_value(lb: LazyBuffer) -> Optional[object]:
  """The value of an unrealized constant read without padding (a padded view reads 0 outside), else None. A lifted
  scalar (a kernel parameter: tgrad/scalars.py) has no value here: the schedule cache keys it without one."""
  base = lb.base
  if base.op is not Ops.CONST or base.buffer is not None or base.lifted or isinstance(base.arg, UOp): return None
  if lb is not base and any(v.mask is not None for v in lb.st.views): return None
  return base.arg

def is_constant_expression(lb: LazyBuffer) -> bool:
  """Whether `lb` is computed from literal constants only, so that simplify_graph folds it into one constant: then a
  Python scalar operand beside it stays a literal too (Tensor._operands), and `Tensor.full(s, 3.0).exp() * 2` folds.
  A walk that stops at the first realized value, padded view or op that doesn't fold (data: the common case, one
  step) and at MAX_CONSTANT_EXPRESSION_NODES."""
  # a bounded search, not lazy.walk's full pre-order: it looks at each node's last source first, where an eager op's
  # Python scalar operand sits, so a chain of ops on data answers in a step or two however long the chain is
  if (lb if lb._base is None else lb._base).buffer is not None: return False   # realized data: every eager `t + 1`
  stack, seen = [lb], set()
  while stack:
    node = stack.pop()
    if id(node) in seen or _const_value(node) is not None: continue
    seen.add(id(node))
    base = node.base
    if len(seen) > MAX_CONSTANT_EXPRESSION_NODES or base.buffer is not None or base.op not in FOLDABLE or \
       (node is not base and any(v.mask is not None for v in node.st.views)): return False
    stack.extend(base.srcs)
  return True

def _is_zero(value, dtype) -> bool:
  """x + value == x for every x: 0 on ints, only −0.0 on floats."""
  return value == 0 and (not dtype.is_float or math.copysign(1.0, value) < 0)

def _seen_through(value: LazyBuffer, reader: LazyBuffer) -> LazyBuffer:
  """`value` (which replaces reader's base, with that base's shape) read the way `reader` reads the base."""
  if reader.is_base: return value
  if value.is_base: return LazyBuffer(reader.device, reader.st, reader.dtype, base=value)
  st = value.st + reader.st
  if st.shape == value.base.shape and st.contiguous: return value.base
  return LazyBuffer(reader.device, st, reader.dtype, base=value.base)

def _simplified(lb: LazyBuffer) -> Optional[LazyBuffer]:
  """What the (rebuilt) base `lb` simplifies to, with its shape, or None."""
  op, srcs, dtype = lb.op, lb.srcs, lb.dtype
  if op is Ops.COPY and srcs and (value := _const_value(srcs[0])) is not None:
    return LazyBuffer.const_of(value, dtype, lb.device, lb.shape)
  if op not in FOLDABLE: return None
  values = [_const_value(s) for s in srcs]
  if all(v is not None for v in values):
    try: folded = truncate_to(values[0], dtype) if op is Ops.CAST else exec_alu(op, dtype, tuple(values))
    except (TypeError, OverflowError, ValueError): return None
    return LazyBuffer.const_of(folded, dtype, lb.device, lb.shape)
  if op is Ops.WHERE and values[0] is not None: return srcs[1] if values[0] else srcs[2]
  if op is Ops.NEG and srcs[0].is_base and srcs[0].op is Ops.NEG and srcs[0].buffer is None: return srcs[0].srcs[0]
  if len(srcs) != 2: return None
  for x, value in ((srcs[0], values[1]), (srcs[1], values[0])):
    if value is None or (x is srcs[1] and op not in (Ops.ADD, Ops.MUL, Ops.OR, Ops.AND)): continue
    if op is Ops.ADD and _is_zero(value, dtype): return x
    if op is Ops.OR and value is False: return x
    if op is Ops.AND and value is True: return x
    if op is Ops.MUL and value == 1 and not dtype.is_bool: return x
    if op is Ops.MUL and value == 0 and dtype.is_int: return lb.const(0)
    if op is Ops.FDIV and x is srcs[0] and value == 1: return x
  return None

def _reads_in_place(new: LazyBuffer, old: LazyBuffer) -> bool:
  """Whether a whole-buffer reader may keep `new` (the simplified `old`) as its source: a base that is no constant,
  or the same view as `old` (a custom kernel built with views reads them in place) over a rebuilt base."""
  if new.base.op is Ops.CONST: return False
  return new.is_base or (not old.is_base and new.st == old.st)

def simplify_graph(roots: list[LazyBuffer]) -> tuple[list[LazyBuffer], list[tuple[LazyBuffer, LazyBuffer]]]:
  """(the roots over the simplified graph, [(old base, its rebuilt node)]). A root is never replaced by what it
  simplifies to, only rebuilt over simplified sources: it must get a Buffer of its own. Nothing changes in place."""
  root_ids = {id(r) for r in roots}
  replacement: dict[int, LazyBuffer] = {}   # id(old base) -> its value in the new graph (a base or a view)
  rebuilt: list[tuple[LazyBuffer, LazyBuffer]] = []
  for lb in unrealized_bases(roots):
    srcs = tuple(_seen_through(replacement[id(s.base)], s) if id(s.base) in replacement else s for s in lb.srcs)
    if lb.op in WHOLE_BUFFER_READERS:   # their runners read each source's whole buffer, in order
      srcs = tuple(new if new is old or _reads_in_place(new, old) else new.contiguous(alias=False)
                   for new, old in zip(srcs, lb.srcs))
    node = lb
    if any(a is not b for a, b in zip(srcs, lb.srcs)):
      node = lb.with_sources(srcs)   # every field (op, arg, dtype, view, whatever else a base carries), new sources
      rebuilt.append((lb, node))
    if id(lb) not in root_ids and (value := _simplified(node)) is not None: node = value
    if node is not lb: replacement[id(lb)] = node
  return [replacement.get(id(r), r) for r in roots], rebuilt

def commit_replacements(rebuilt: list[tuple[LazyBuffer, LazyBuffer]]) -> None:
  """After a committed schedule: an old base whose rebuilt node got a Buffer takes it, and forgets its sources, as
  the scheduler's commit does (a reduce keeps its arg), so the caller's graph shows what was realized."""
  for old, new in rebuilt:
    if new.buffer is not None and old.buffer is None: old.commit(new.buffer, keep_arg=old.op is Ops.REDUCE_AXIS)
