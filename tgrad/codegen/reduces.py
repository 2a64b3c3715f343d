"""Reduces in the linear program: how a REDUCE_AXIS becomes loops, accumulators and shared-memory combines.

The value graph (value_graph.py) builds each reduce from the pieces here, in this order:

  1. row-kernel passes (`reduce_levels`, `row_pass_loops`): a row kernel (multi-reduce fusion, schedule.py rule 2b)
     walks its rows once per pass of reduces and once more for its store, each pass with loops of its own;
  2. the loop reduce: a REDUCE node over the pass's loops whose source is the unrolled replicas' left chain
     (`new_reduce`, `reduce_terms`); a value none of the loops changes is no loop (`fold_invariant_reduce`); a long
     float sum adds in blocks whose totals add with Kahan's compensation (`accumulation_split`, `block_ranges`);
  3. the group combine (split-K, OptOps.GROUP): each thread's partial is combined with its warp's other partials of
     the same output by xor-shuffles where the block's layout allows (`warp_combine`), goes to shared memory, and after
     a barrier the group's first thread (or, in a row kernel, every thread) reduces one partial a warp
     (`group_partial`, `group_combine`, `group_gate`), with Kahan's compensation when the reduce is long
     (`long_reduce`) or adds partial sums. Reduces of one pass share their barrier (value_graph.py), so every partial
     of the pass is computed before any thread waits.

The emitter (emit.py) turns each REDUCE into its accumulator and loop, with `kahan_step` for compensated sums and
`online_step`/`online_merge`/`online_result` for a LOGADDEXP reduce (log Σ exp, the online softmax's one pass).
A reduce of a value that doesn't change along its loops is no loop (a sum is value × trips: `Tensor.ones(2**40).sum()`
costs nothing). A float sum whose accumulator would add more than ACCUMULATE_BLOCK values sums in blocks: an inner
loop adds one block into a fresh accumulator, an outer loop adds the block totals with compensated (Kahan) summation.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, simplify, exec_alu
from tgrad.shape.sint import canonical, ceil_div, to_uop, vmax_of
from tgrad.helpers import prod
if TYPE_CHECKING:
  from tgrad.codegen.kernel import Kernel

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
GROUP_RESCALE_LOOP_ARG = 1500   # a LOGADDEXP combine's second loop over the partials (logaddexp_of_partials)
# A row kernel (Kernel.row_store, schedule.py rule 2b) walks its rows in several passes: pass 0 holds the reduces that
# read no other reduce, pass p the reduces reading pass p - 1's results, and the store runs in a pass after the last.
# Each pass has loops of its own (the same loop reused would fuse passes that must run one after the other): pass p's
# RANGE args are those of pass 0 plus PASS_LOOP_ARG·p.
PASS_LOOP_ARG = 10000

LOG2_E, LN2 = 1 / math.log(2), math.log(2)
WARP_SHUFFLE_OPS = (Ops.ADD, Ops.MAX)   # the reduces a GROUP's partials combine by xor-shuffles inside a warp first

def loop_axes(kernel: Kernel) -> list[int]:
  """The reduce axes that are loops (not a GROUP's threads, not unrolled)."""
  return list(range(kernel.first_reduce + kernel.group_for_reduces, kernel.first_upcast))

def group_axes(kernel: Kernel) -> list[int]:
  """The reduce axes a GROUP spreads over the block's threads."""
  return list(range(kernel.first_reduce, kernel.first_reduce + kernel.group_for_reduces))

# ---- 1. row-kernel passes

def store_pass(kernel: Kernel) -> Optional[int]:
  """The pass of a row kernel's store (after its last pass of reduces); None for a kernel that stores no rows."""
  return max(kernel.reduce_levels.values()) + 1 if kernel.row_store else None

def shares_results(kernel: Kernel) -> bool:
  """Whether every thread of a GROUP needs each reduce's result (a later pass, or the row store, reads it): then all of
  them combine the partials."""
  return kernel.row_store or any(kernel.reduce_levels.values())

def row_pass_loops(kernel: Kernel, indices: list[Optional[UOp]], level: int) -> dict[int, UOp]:
  """The index of each reduce loop axis in pass `level`: pass 0 uses the kernel's own loops (axis_indices), later
  passes loops of their own (PASS_LOOP_ARG)."""
  return {a: indices[a] if level == 0 else
          UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(kernel.full_shape[a])), PASS_LOOP_ARG * level + a)
          for a in loop_axes(kernel)}

def row_store_indices(kernel: Kernel, indices: list[Optional[UOp]]) -> dict[int, UOp]:
  """A row kernel's store: the thread ids of a GROUP's axes and the store pass's loops over the rest of the row
  (unrolled axes are replicas, set per store)."""
  level = store_pass(kernel)
  assert level is not None
  return {**{a: indices[a] for a in group_axes(kernel)}, **row_pass_loops(kernel, indices, level)}

# ---- 2. the loop reduce

def new_reduce(ids: Iterator[int], op: Ops, dtype, value: UOp, ranges: tuple[UOp, ...], terms: int = 1,
               compensated: bool = False) -> UOp:
  """A loop reduce of `value`, which combines `terms` unrolled values as a left chain of `op` (see
  ValueBuilder.loop_reduce): with many accumulators the update folds them in one by one (acc + v0 + v1 + …, FMAs for
  a matmul). A compensated sum carries each addition's rounding error into the next (Kahan; the emitter emits it)."""
  return UOp(Ops.REDUCE, dtype, (value, *ranges), (op, next(ids) - 1, terms) + ((True,) if compensated else ()))

def reduce_terms(reduce: UOp) -> list[UOp]:
  """The unrolled values a loop REDUCE combines (its source is their left chain, see new_reduce)."""
  return chain_terms(reduce.src[0], reduce.arg[2])

def chain_terms(chain: UOp, count: int) -> list[UOp]:
  """The `count` values of a left chain of binary ops, first to last."""
  terms, value = [], chain
  for _ in range(count - 1):
    terms.append(value.src[1])
    value = value.src[0]
  return [value] + terms[::-1]

# An unrolled float sum whose terms are integers converted to float times a common factor, Σ float(aᵢ)·s (an int8
# product's group: the integer products of a block's values times the block's scale), is summed as float(Σ aᵢ)·s: the
# aᵢ added in int32 (where their bounds show the sum cannot overflow), one conversion and one multiply per group. The
# value is the exact sum rounded once, where the float chain rounds every product and every addition; and the integer
# sum is what a CPU's widening multiply-adds compute (LLVM makes vpmaddwd of int32 products of sign-extended bytes).
INTEGER_SUM_LIMIT = 2 ** 31   # |Σ aᵢ| stays below this (int32) by the terms' bounds, or the terms are left as they are

def _additive_terms(value: UOp) -> list[UOp]:
  """The summands of a tree of float ADDs (one term if value is no ADD)."""
  if value.op is not Ops.ADD: return [value]
  return _additive_terms(value.src[0]) + _additive_terms(value.src[1])

def _scaled_integer(term: UOp) -> Optional[tuple[UOp, UOp]]:
  """(integer a, factor s) when term is float(a)·s (either operand order), else None."""
  if term.op is not Ops.MUL or not term.dtype.is_float: return None
  for converted, factor in (term.src, term.src[::-1]):
    if converted.op is Ops.CAST and converted.src[0].dtype.is_int and not converted.src[0].dtype.is_bool:
      return converted.src[0], factor
  return None

def factor_integer_terms(values: list[UOp]) -> list[UOp]:
  """The unrolled values of a float sum, with the integer terms that share a factor summed in int32 first (see
  INTEGER_SUM_LIMIT): [float(Σ aᵢ)·s per factor s, then every other term]. Values with no two such terms come back
  as they are."""
  groups: dict[UOp, list[UOp]] = {}
  others: list[UOp] = []
  for term in (t for v in values for t in _additive_terms(v)):
    if (scaled := _scaled_integer(term)) is None: others.append(term)
    else: groups.setdefault(scaled[1], []).append(scaled[0])
  if not any(len(integers) > 1 for integers in groups.values()): return values
  out = []
  for factor, integers in groups.items():
    bound = sum(max(abs(a.vmin), abs(a.vmax)) for a in integers)
    if len(integers) == 1 or bound >= INTEGER_SUM_LIMIT:
      out.extend(UOp(Ops.MUL, factor.dtype, (UOp(Ops.CAST, factor.dtype, (a,)), factor)) for a in integers)
      continue
    total = None
    for a in integers:
      wide = a if a.dtype == dtypes.int32 else UOp(Ops.CAST, dtypes.int32, (a,))
      total = wide if total is None else UOp(Ops.ADD, dtypes.int32, (total, wide))
    out.append(UOp(Ops.MUL, factor.dtype, (UOp(Ops.CAST, factor.dtype, (total,)), factor)))
  return out + others

# An unrolled float sum whose products share a factor, Σ aᵢ·s (a packed weight's block: x times the block's scale times
# each quant), has each product rewritten as (aᵢ)·s, the shared factor last: the chain's additions may be reordered
# (the LLVM renderer's reorderable summands), so LLVM factors the sum into (Σ aᵢ)·s, one multiply per group and not
# one per value (measured on Zen 3: a Q8_0 matvec's CPU time halves, bench/cpu_packed_matvec.py). A factor shared by
# more terms goes outermost first (a Q6_K block's d, then each sub-block's scale).
def _factors(term: UOp) -> list[UOp]:
  """The factors of a tree of float MULs of one dtype (the term itself if it is no MUL)."""
  if term.op is not Ops.MUL or not term.dtype.is_float or any(s.dtype != term.dtype for s in term.src): return [term]
  return _factors(term.src[0]) + _factors(term.src[1])

def _product(factors: list[UOp]) -> UOp:
  product = factors[0]
  for factor in factors[1:]: product = UOp(Ops.MUL, product.dtype, (product, factor))
  return product

def _terms_with(factors: list[list[UOp]]) -> dict[UOp, int]:
  """How many terms each factor appears in, given every term's factors (a factor twice in one term counts once), in
  the order the factors first appear: a UOp hashes by identity, so iterating a set of them would follow memory
  addresses, and a tie between two factors (an embedding's scale and a block's, shared by the same terms) was broken
  differently from process to process (the same kernel rendered two ways, rounding differently)."""
  counts: dict[UOp, int] = {}
  for term_factors in factors:
    for factor in dict.fromkeys(term_factors): counts[factor] = counts.get(factor, 0) + 1
  return counts

def shared_factors_last(values: list[UOp]) -> list[UOp]:
  """The unrolled values of a float sum with every product that shares a factor with another term ordered as
  (the other factors)·(the shared ones, the most shared outermost); values with no shared factor come back as they
  are."""
  terms = [t for v in values for t in _additive_terms(v)]
  factors = [_factors(t) for t in terms]
  counts = _terms_with(factors)
  if not any(count > 1 for count in counts.values()): return values
  out = []
  for term, term_factors in zip(terms, factors):
    if len(term_factors) < 2 or all(counts[f] == 1 for f in term_factors): out.append(term)
    else: out.append(_product(sorted(term_factors, key=lambda f: counts[f])))   # stable: ties keep their order
  return out

# Where floats are added in the order written (CUDA: no reassociation), an unrolled sum's shared factors are factored
# out explicitly: Σ aᵢ·s becomes (Σ aᵢ)·s, the factor shared by the most terms first, then within each group again (a
# Q6_K block's d, then each sub-block's scale). A packed matvec thread's values of one block then cost one fused
# multiply-add each (x·q + acc) and the block one multiply, not a multiply by the scale per value.
def factor_shared_out(values: list[UOp]) -> list[UOp]:
  """The unrolled values of a float sum with every factor shared by two terms or more taken out of their sum: a list
  of values with the same total (fewer where factors were shared; as they are where none is). A term x·(p + q) whose
  p and q both share a factor with other terms is distributed first (_distributed)."""
  terms = [t for v in values for t in _additive_terms(v)]
  return _factored(_distributed(terms)) if len(terms) > 1 else values

# A K-quant's value is (d·sc)·q − dmin·m: a packed matvec's terms are x·((d·sc)·q + −(dmin·m)), whose sum keeps a
# multiply and an add a value. Distributed, the sub-block's terms share d·sc and −(dmin·m), which come out of their
# sums: (d·sc)·Σ x·q + −(dmin·m)·Σ x, a fused multiply-add and an add a value (llama.cpp sums x per sub-block alike).
def _distributed(terms: list[UOp]) -> list[UOp]:
  """The terms, each x·(p + q) (a float MUL of an ADD) whose summands p and q both have a factor that a summand of
  another term has too written as x·p and x·q; the others as they are."""
  split: list[Optional[tuple[UOp, UOp, UOp]]] = []
  for term in terms:
    found = None
    if term.op is Ops.MUL and term.dtype.is_float:
      for outer, inner in (term.src, term.src[::-1]):
        if inner.op is Ops.ADD and inner.dtype == term.dtype and outer.dtype == term.dtype:
          found = (outer, inner.src[0], inner.src[1])
          break
    split.append(found)
  counts = _terms_with([_factors(part) for found in split if found is not None for part in found[1:]])
  out: list[UOp] = []
  for term, found in zip(terms, split):
    if found is not None and all(any(counts[f] > 1 for f in _factors(part)) for part in found[1:]):
      outer, p, q = found
      out += [UOp(Ops.MUL, term.dtype, (outer, p)), UOp(Ops.MUL, term.dtype, (outer, q))]
    else: out.append(term)
  return out

def _factored(terms: list[UOp]) -> list[UOp]:
  factors = [_factors(t) for t in terms]
  counts = _terms_with(factors)
  shared = max(counts, key=lambda f: counts[f], default=None)
  if shared is None or counts[shared] < 2: return terms
  inside, outside = [], []
  for term, term_factors in zip(terms, factors):
    if shared not in term_factors or len(term_factors) < 2:
      outside.append(term)
      continue
    rest = list(term_factors)
    rest.remove(shared)
    inside.append(_product(rest))
  if len(inside) < 2: return terms
  total = None
  for value in _factored(inside): total = value if total is None else UOp(Ops.ADD, value.dtype, (total, value))
  return [UOp(Ops.MUL, shared.dtype, (total, shared))] + _factored(outside)

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
  these ops (runtime/llvm/renderer.py allows reordering only for a lone innermost accumulator).
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

def chain_op(op: Ops) -> Ops:
  """The op that chains a loop REDUCE's unrolled values (see new_reduce): the reduce op itself, except for LOGADDEXP,
  which is no ALU op: its chain is their MAX (the step's running max, online_step), and the emitter splits it again."""
  return Ops.MAX if op is Ops.LOGADDEXP else op

# ---- LOGADDEXP: log Σ exp in one pass, the online softmax's reduce
# A LOGADDEXP REDUCE keeps the streaming state of the online softmax in two accumulators: m, the running max, and d,
# the sum of exp(x − m) rescaled whenever m grows, both in the source's dtype; its value is m + log(d) in the REDUCE's
# dtype, which may be wider (the online softmax takes it in float64, so x − lse keeps no rounding of lse). Folding the
# state into one float l = m + log(d) and combining with log(e^l + e^x) loses the small terms: l's rounding (ulp(20) ≈
# 2e-6 for normal·5 rows) swallows each exp(x − l) below it, and a 4096-long row drifted 2e-4 relative. With (m, d) the
# sum d rounds relative to itself (a float sum), and m is exact. A step's unrolled values first make a state of their
# own (online_step: their max and the sum of their exponentials), which is merged with one more exponential
# (online_merge): exp(−|m − m'|) rescales whichever side had the smaller max. A GROUP's partials are results
# m + log(d) (each thread's one rounding, not one per element), combined by their max and a float32 sum of
# exponentials (logaddexp_of_partials). Infinities: a side at −inf adds nothing (exp(−inf) = 0), equal infinities add
# as equals (the difference inf − inf would be NaN), +inf wins; NaN propagates through MAX and the exponential.

def _alu(op: Ops, dtype, *src: UOp) -> UOp:
  """An ALU node, or the constant exec_alu gives when every source is one (no device compiler sees an op of
  constants: see value_graph.fold_constants)."""
  if all(s.op is Ops.CONST for s in src):
    try: return UOp.const(dtype, exec_alu(op, dtype, tuple(s.arg for s in src)))
    except (TypeError, OverflowError): pass
  return UOp(op, dtype, src)

def _exp(x: UOp) -> UOp: return _alu(Ops.EXP2, x.dtype, _alu(Ops.MUL, x.dtype, x, UOp.const(x.dtype, LOG2_E)))
def _log(x: UOp) -> UOp: return _alu(Ops.MUL, x.dtype, _alu(Ops.LOG2, x.dtype, x), UOp.const(x.dtype, LN2))
def _sub(x: UOp, y: UOp) -> UOp: return _alu(Ops.ADD, x.dtype, x, _alu(Ops.NEG, y.dtype, y))

def _exp_below(x: UOp, peak: UOp) -> UOp:
  """exp(x − peak) for x <= peak, 1 where they are equal (also both −inf or both +inf, where x − peak is NaN)."""
  return _alu(Ops.WHERE, x.dtype, _alu(Ops.CMPNE, dtypes.bool, x, peak), _exp(_sub(x, peak)), UOp.const(x.dtype, 1.0))

def _tree(op: Ops, values: list[UOp]) -> UOp:
  """The values combined pairwise (a balanced tree: log2(n) ops deep, where a chain would be n − 1)."""
  while len(values) > 1:
    values = [_alu(op, values[i].dtype, values[i], values[i + 1]) if i + 1 < len(values) else values[i]
              for i in range(0, len(values), 2)]
  return values[0]

def online_step(terms: list[UOp]) -> tuple[UOp, UOp]:
  """(max, Σ exp(value − max)) of one step's unrolled values: the state of those values alone, both reduced as
  balanced trees (independent of the accumulators, so the CPU overlaps steps; the tree keeps each step short)."""
  peak = _tree(Ops.MAX, terms)
  if len(terms) == 1: return peak, UOp.const(peak.dtype, 1.0)
  return peak, _tree(Ops.ADD, [_exp_below(t, peak) for t in terms])

def online_merge(peak: UOp, total: UOp, step_peak: UOp, step_total: UOp) -> tuple[UOp, UOp]:
  """The state (m, d) after merging the state of a step: the new max, and both sums rescaled to it. The smaller side
  is scaled by exp(−|m − m'|), one exponential per merge."""
  dtype = peak.dtype
  grows = _alu(Ops.CMPLT, dtypes.bool, peak, step_peak)
  gap = _alu(Ops.WHERE, dtype, grows, _sub(peak, step_peak), _sub(step_peak, peak))   # −|m − m'|
  scale = _alu(Ops.WHERE, dtype, _alu(Ops.CMPNE, dtypes.bool, peak, step_peak), _exp(gap), UOp.const(dtype, 1.0))
  def scaled_sum(small: UOp, large: UOp) -> UOp:   # a step of one value has the sum 1: its scaled sum is the scale
    scaled = scale if small.op is Ops.CONST and small.arg == 1.0 else _alu(Ops.MUL, dtype, small, scale)
    return _alu(Ops.ADD, dtype, scaled, large)
  new_total = _alu(Ops.WHERE, dtype, grows, scaled_sum(total, step_total), scaled_sum(step_total, total))
  return _alu(Ops.MAX, dtype, peak, step_peak), new_total

def _cast(x: UOp, dtype) -> UOp:
  if x.dtype == dtype: return x
  return UOp.const(dtype, x.arg) if x.op is Ops.CONST else UOp(Ops.CAST, dtype, (x,))

def online_result(peak: UOp, total: UOp, dtype) -> UOp:
  """log Σ exp from the state, in the reduce's dtype (which may be wider than the state's): m + log(d) (−inf for no
  values: d = 0)."""
  return _alu(Ops.ADD, dtype, _cast(peak, dtype), _log(_cast(total, dtype)))

def _reads_any(value: UOp, wanted: set[UOp]) -> bool:
  """Whether any of `wanted` is below or at `value`: a walk that stops at the first one found (a register tile's
  values reach their loop's index a few nodes down; a full toposort per accumulator walked the shared graph again)."""
  seen: set[UOp] = set()
  stack = [value]
  while stack:
    u = stack.pop()
    if u in wanted: return True
    if u in seen: continue
    seen.add(u)
    stack.extend(u.src)
  return False

def fold_invariant_reduce(op: Ops, dtype, value: UOp, ranges: tuple[UOp, ...]) -> Optional[UOp]:
  """A reduce over loops of a value that none of them changes: a sum is value × trips, a max is the value. None when
  the value varies or the op is MUL. Ints multiply in their own dtype (wrapping exactly as the loop's adds would);
  floats in float64, where the trip count is exact, then round to the dtype (2^-10 × 2^20 is 1024 in float16, though
  2^20 itself is not a float16). A float sum starts from +0.0, as the loop's accumulator (and numpy's and torch's
  sums) do, so -0.0 × trips is +0.0. One trip is the value + 0.0 in its own dtype: no float64 (a GPU converts to and
  from it at a quarter of its float32 rate, and every GROUP'd reduce's partial used to go through it)."""
  if op not in (Ops.ADD, Ops.MAX) or dtype.is_bool or _reads_any(value, set(ranges)): return None
  if op is Ops.MAX: return value
  trips = prod(canonical(r.src[1] - r.src[0]) for r in ranges)   # symbolic with a variable's loop
  if isinstance(trips, int) and trips == 1:   # one value, exactly: a GROUP's own partial, loops of size 1
    return UOp(Ops.ADD, dtype, (value, UOp.const(dtype, 0.0))) if dtype.is_float else value
  compute = dtypes.float64 if dtype.is_float else dtype
  if value.op is Ops.CONST and isinstance(trips, int):
    return UOp.const(dtype, exec_alu(Ops.MUL, compute, (value.arg, trips)) + 0)
  count = UOp.const(compute, trips) if isinstance(trips, int) else trips.cast(compute)
  total = UOp(Ops.MUL, compute, (value.cast(compute), count))
  if dtype.is_float: total = UOp(Ops.ADD, compute, (total, UOp.const(compute, 0.0)))
  return total.cast(dtype)

def accumulation_split(kernel: Kernel, op: Ops, dtype, loops: list[int], terms: int) -> Optional[tuple[int, int]]:
  """(axis, block size) where a float sum's loops add more than ACCUMULATE_BLOCK (TILE_ACCUMULATE_BLOCK for a
  register tile) values into one accumulator, else None. Counting from the innermost loop (times the `terms` unrolled
  values per iteration), the first axis that takes the run past the limit is cut into blocks, an exact divisor of it
  where one is close below the limit.
  Blocking in the kernel keeps the kernel count and needs no memory for partials, unlike splitting the reduce into
  two kernels (lazy.py's _split_reduce, which is about parallelism). Kernels with staged tiles (SMEM) keep their
  pipelined loop as it is."""
  k = kernel
  if op is not Ops.ADD or not dtype.is_float or k.staged: return None
  accumulators = len(k.reduceops) * prod(k.full_shape[a] for a in k.upcast_axes if not k.is_reduce_axis(a))
  block = ACCUMULATE_BLOCK if accumulators < FOLD_MIN_ACCUMULATORS else TILE_ACCUMULATE_BLOCK
  run = terms
  for axis in reversed(loops):
    size = k.full_shape[axis]   # a symbolic size blocks when its bound could pass the limit
    if run * vmax_of(size) > block:
      limit = max(1, block // run)
      if not isinstance(size, int): return axis, limit
      exact = next((c for c in range(limit, limit // BLOCK_DIVISOR_SLACK, -1) if size % c == 0), None)
      return axis, exact or limit
    run *= vmax_of(size)
  return None

def block_ranges(axis: int, size, block: int, pass_arg: int = 0) -> tuple[UOp, UOp]:
  """(loop over the blocks, loop within one) for a reduce axis of `size` cut into blocks of `block`: the inner loop runs
  over [start, min(start + block, size)), so the axis's index is the inner loop itself and keeps its range [0, size).
  `pass_arg` offsets the loops' args in a row kernel's later passes (PASS_LOOP_ARG). A symbolic size blocks the same
  way, with a symbolic count of blocks and the min always taken."""
  blocks = UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(ceil_div(size, block))), pass_arg + BLOCK_LOOP_ARG + axis)
  start = simplify(blocks * block)
  # min(start + block, size) as size - max(size - block - start, 0): its range is exactly [block, size]
  end = start + block if isinstance(size, int) and size % block == 0 else \
    to_uop(size) - (to_uop(canonical(size - block)) - start).maximum(0)
  return blocks, UOp(Ops.RANGE, dtypes.index, (start, simplify(end)), pass_arg + axis)

# ---- 3. the group combine (split-K)

@dataclass(frozen=True)
class WarpCombine:
  """How a GROUP's partials are first reduced inside each warp, by xor-shuffles (`warp_combine`): `masks` are the
  lane-id bits whose partner lane holds another partial of the same output, so after one shuffle and op per mask
  every lane holds its warp's combined partial; `spans[a]` is how many consecutive values of GROUP axis a one warp's
  lanes cover (1: none; the axis' size: all of it). The shared-memory combine then reads one partial per span."""
  masks: tuple[int, ...]
  spans: dict[int, int]

def warp_combine(kernel: Kernel, op: Ops, dtype) -> Optional[WarpCombine]:
  """The in-warp reduction of a GROUP's partials, or None where the target has no warp shuffles, the op is not one a
  shuffle tree computes as a loop would up to the order of a sum (ADD, MAX), the dtype is not a 32- or 64-bit
  register, or no lane bit separates partials of one output (`warp_lane_masks`)."""
  k, lanes = kernel, kernel.renderer.warp_lanes
  if not lanes or op not in WARP_SHUFFLE_OPS or dtype.itemsize not in (4, 8) or dtype.is_bool: return None
  sizes = [k.full_shape[a] for a in k.thread_axes]
  if not all(isinstance(size, int) for size in sizes): return None
  grouped = set(group_axes(k))
  found = warp_lane_masks(sizes, [a in grouped for a in k.thread_axes], lanes)
  if found is None: return None
  masks, spans = found
  return WarpCombine(masks, {a: span for a, span in zip(k.thread_axes, spans) if a in grouped})

def warp_lane_masks(sizes: list[int], grouped: list[bool], lanes: int) -> Optional[tuple[tuple[int, ...], list[int]]]:
  """For a block whose threads are numbered by axes of these sizes (the last fastest, as CUDA numbers lanes), the
  lane-id bits whose flip moves only `grouped` axes' indices, and per axis how many consecutive values of it one
  warp's lanes cover; None if there are no such bits or a warp would not be full (threads not a multiple of lanes).
  Walking the axes from the fastest: an axis of size s takes gcd(s, lanes left) of the lane bits (a power of two
  dividing s, so flipping those bits only moves its index within [0, s)); an axis that takes fewer than all its values
  ends the walk, since lane bits above it mix its rest with the next axis."""
  if prod(sizes) % lanes: return None
  masks, spans, covered = [], [1] * len(sizes), 1
  for i in reversed(range(len(sizes))):
    if covered == lanes: break
    take = math.gcd(sizes[i], lanes // covered)
    if grouped[i]:
      masks += [covered << bit for bit in range(take.bit_length() - 1)]
      spans[i] = take
    covered *= take
    if take < sizes[i]: break
  return (tuple(masks), spans) if masks else None

def group_partial(kernel: Kernel, indices: list[Optional[UOp]], ids: Iterator[int], op: Ops, dtype,
                  partial: UOp) -> tuple[UOp, UOp]:
  """A thread's partial of a GROUP reduce written to shared memory: (the shared array, the STORE). One slot per
  thread, consecutive local (output) threads in consecutive slots; each reduce and output upcast replica has its own
  array. Where `warp_combine` allows, the partial is first combined with its warp's other partials of the same output
  (xor-shuffles, every lane ends with the warp's total), so the combine reads one slot per warp. The combine
  (`group_combine`) reads the array after a barrier over this store (and its siblings')."""
  k = kernel
  if (warp := warp_combine(k, op, dtype)) is not None:
    for mask in warp.masks: partial = UOp(op, dtype, (partial, UOp(Ops.SHUFFLE_XOR, dtype, (partial,), mask)))
  shared = UOp(Ops.DEFINE_LOCAL, dtype, (), (f"temp{next(ids)}", prod(k.full_shape[a] for a in _slot_axes(k))))
  return shared, UOp(Ops.STORE, dtypes.void, (shared, _slot(k, [indices[a] for a in _slot_axes(k)]), partial))

def _slot_axes(k: Kernel) -> list[int]:
  """The axes a partial's slot is numbered by: the GROUP axes, then the local (output) axes, the last fastest."""
  return group_axes(k) + list(range(k.global_dims, k.first_reduce))

def _slot(k: Kernel, slot_indices: list[UOp]) -> UOp:
  """The flat slot of the partial at these indices of _slot_axes."""
  out = to_uop(0)
  for i, a in zip(slot_indices, _slot_axes(k)): out = out * k.full_shape[a] + i
  return simplify(out)

def group_combine(kernel: Kernel, indices: list[Optional[UOp]], ids: Iterator[int], op: Ops, dtype, shared: UOp,
                  barrier: UOp, level: int = 0, of_partials: bool = False) -> tuple[UOp, tuple[UOp, ...]]:
  """Reduce across the group's threads the partials each wrote to `shared` (group_partial): after `barrier` (over
  that store, and over its sibling reduces' stores where they share one: value_graph), the group's first thread
  reduces the partials and stores (`group_gate`); the others skip that loop (an IF). Returns (the combined value, the
  loops over the partials that only the gated thread runs). A long float sum (`long_reduce`, or `of_partials`: a
  reduce of an earlier kernel's partial sums) combines the partials with Kahan's compensation: they are large (a
  thread's share of a long axis) and alike, the case where a plain running sum rounds at every step. When a later
  pass of a row kernel reads the result (`shares_results`), every thread combines the partials itself (broadcast reads
  of the same shared words), no thread skips and no loop is gated; each reduce has its own array, written once, so the
  one barrier before the reads is all it needs."""
  k = kernel
  local_axes = list(range(k.global_dims, k.first_reduce))
  spans = warp.spans if (warp := warp_combine(k, op, dtype)) is not None else {a: 1 for a in group_axes(k)}
  def partials(loop_arg: int) -> tuple[list[UOp], UOp]:   # loops over the group's partials, and the partial they read
    loops = {a: UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(k.full_shape[a] // span)),
                    PASS_LOOP_ARG * level + loop_arg + a) for a, span in spans.items() if span < k.full_shape[a]}
    slots = [loops[a] * spans[a] if a in loops else to_uop(0) for a in group_axes(k)]
    return list(loops.values()), UOp(Ops.LOAD, dtype, (shared, _slot(k, slots + [indices[a] for a in local_axes]),
                                                        barrier))
  group_loops, load = partials(GROUP_LOOP_ARG)
  if not group_loops: return load, ()   # the whole group in one warp: its shuffles combined every partial
  if op is Ops.LOGADDEXP:
    rescale_loops, again = partials(GROUP_RESCALE_LOOP_ARG)
    combined = logaddexp_of_partials(new_reduce(ids, Ops.MAX, dtype, load, tuple(group_loops)), again,
                                     lambda term: new_reduce(ids, Ops.ADD, term.dtype, term, tuple(rescale_loops)))
    group_loops += rescale_loops
  else: combined = new_reduce(ids, op, dtype, load, tuple(group_loops),
                              compensated=compensable(op, dtype) and (of_partials or long_reduce(k)))
  return combined, () if shares_results(k) else tuple(group_loops)

def long_reduce(kernel: Kernel) -> bool:
  """Whether the kernel's reduce adds more than ACCUMULATE_BLOCK values per output: only then do its GROUP's partials
  combine with Kahan's compensation. A shorter sum is within the block bound (block·ε) in any order, and its combine
  (a decode matvec's 40-128 partials of 8-32 values each) is the serial tail of a few-µs kernel: compensated, each
  partial is a chain of five dependent adds (~0.5 µs for 40 partials on an H100), plain one."""
  reduce_axes = [a for a in range(kernel.shape_len) if kernel.is_reduce_axis(a)]
  return vmax_of(prod(kernel.full_shape[a] for a in reduce_axes)) > ACCUMULATE_BLOCK

def logaddexp_of_partials(peak: UOp, partial: UOp, sum_of: Callable[[UOp], UOp]) -> UOp:
  """log Σ exp of a GROUP's partial results (each a thread's m + log d, in the reduce's dtype, float64 for the online
  softmax) from two loops over them: their max M, then Σ exp(partial − M) with the difference taken in the partials'
  dtype and the exponentials in float32 (`sum_of` makes that sum a reduce over the second loop); M + log Σ in the
  partials' dtype. Each term is within float32's relative error and adds to a sum of at most the group's size, so the
  result is off by about float32's epsilon in absolute terms, the accuracy of the float32 softmax it feeds — where a
  LOGADDEXP over the partials would take one exponential in the partials' dtype per partial in every thread (a
  float64 exp2 is a long software routine on a GPU). Infinities and NaN as online_merge: a partial equal to M adds
  exactly 1 (both −inf, both +inf), NaN propagates through the max and the difference."""
  dtype = partial.dtype
  term_dtype = dtypes.float32 if dtype.itemsize >= 4 else dtype
  difference = _cast(_sub(partial, peak), term_dtype)
  term = _alu(Ops.WHERE, term_dtype, _alu(Ops.CMPNE, dtypes.bool, partial, peak), _exp(difference),
              UOp.const(term_dtype, 1.0))
  return _alu(Ops.ADD, dtype, peak, _log(_cast(sum_of(term), dtype)))

def group_gate(kernel: Kernel, indices: list[Optional[UOp]]) -> Optional[UOp]:
  """The condition of the one thread of a GROUP that combines the partials and stores: every group thread id is 0."""
  gate = None
  for a in group_axes(kernel):
    cond = indices[a].eq(0)
    gate = cond if gate is None else gate & cond
  return gate
