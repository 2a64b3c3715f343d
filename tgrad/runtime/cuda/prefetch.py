"""L2 prefetch ahead of a dependent launch's wait: which bytes of its largest read-only input a block will read.

Under Programmatic Dependent Launch (renderer.py, DEPENDENT_LAUNCH_PROLOGUE) a kernel launches while its predecessor
still runs, but `griddepcontrol.wait` holds it until the predecessor has finished, so a matrix–vector product starts
streaming its weight only then. Before the wait, each block may instead ask for the weight's bytes it will read with
`prefetch.global.L2`: a hint that moves lines from DRAM into L2 and nothing into registers or L1. L2 is the GPU's
point of coherence, so a line prefetched before the predecessor wrote it is still read fresh after the wait; the
prefetch changes no value, only when bytes arrive.

`block_prefetch(uops)` finds the read-only buffer (loaded, never stored) with the largest byte extent and derives,
from its loads' index expressions, the elements one block reads: each index is split into terms (ops.split_terms);
terms over block indices (gidx) and kernel variables stay symbolic (known before the wait: they are launch
coordinates and parameters), terms over thread indices and loop counters (lidx, RANGE) are replaced by their least and
greatest values (vmin/vmax). The result is one interval per block, `first(gidx) .. last(gidx)`, or a few (a
block reading two separate parts of one buffer: PREFETCH_MAX_RANGES), each exact when:
- every term mixes no block index with a thread/loop index, and every load of the buffer has the same block part;
- each thread/loop term is monotone (ADD, MUL and IDIV by constants, MOD that never wraps), or an index modulo a
  constant over whole periods (lidx % 4 over 32 lanes: least and greatest where the index is), over indices whose
  whole range runs, and an index variable's terms all have coefficients of one sign, so the bounds are values some
  thread really loads;
- only loads that always run count: one under an IF, inside a loop whose bounds are not constants, or with a valid
  mask (a padded edge) may not run, so its index may point past the buffer; it is left out of the interval (its bytes
  are just not prefetched). A buffer with no such load, or whose index reads memory (a gather), gets no prefetch.
Every address in the interval then lies between two addresses the block loads, so inside the buffer. A buffer read in
parts whose block parts differ (a planar weight's quants and scales planes, nn/quant.py) has no such interval and gives
way to the next largest buffer; measured on an H200, gemma-3-270m's planar head (262144×640 Q8_0, many waves of
blocks) with both planes prefetched by hand took 59.4 µs a launch against 50.1 without.

It pays only where the block reads most of its interval and the interval is small: at most PREFETCH_MAX_BLOCK_BYTES
per block (a decode matvec's block reads 2 KB to 64 KB; the cap is per block, so a 335 MB head whose blocks each read
a few KB is prefetched too), and at most PREFETCH_MAX_SPARSITY interval elements per element the block's loads can
touch (a transposed read whose block touches one element a row is not prefetched). `prefetch_statements` writes the
loop: the block's threads walk the interval's 128-byte lines (PREFETCH_LINE_BYTES), thread t from line t on.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import UOp, Ops, split_terms
from tgrad.codegen.early_loads import read_only_buffers

PREFETCH_LINE_BYTES = 128             # an L2 cache line: one prefetch.global.L2 brings in one
PREFETCH_MAX_BLOCK_BYTES = 256 * 1024  # a block's interval above this is not prefetched
PREFETCH_MAX_SPARSITY = 4             # interval elements per element the block can touch, at most
PREFETCH_MAX_RANGES = 4               # separate parts of one buffer a block prefetches, at most (more: one interval)
PREFETCH_INSTRUCTION = "prefetch.global.L2 [%0];"
# index math the interval is derived through; anything else (a loaded value, a comparison) leaves the buffer alone
_INDEX_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.CONST, Ops.SPECIAL, Ops.RANGE, Ops.DEFINE_VAR})

@dataclass(frozen=True)
class BlockPrefetch:
  """Elements `first + lo .. first + hi` of `buffer` (a DEFINE_GLOBAL) for each (lo, hi) of `ranges` (sorted,
  disjoint) are what one block reads; `first` is index math over gidx SPECIALs, DEFINE_VARs and constants, the bounds
  are constants. Several ranges where the block reads separate parts of the buffer (two views of one stacked weight:
  a kernel computing gate and up from their rows of one buffer)."""
  buffer: UOp
  first: UOp
  ranges: tuple[tuple[int, int], ...]
  @property
  def low(self) -> int: return self.ranges[0][0]
  @property
  def high(self) -> int: return self.ranges[-1][1]
  @property
  def itemsize(self) -> int: return self.buffer.dtype.itemsize
  @property
  def elements(self) -> int: return sum(hi - lo + 1 for lo, hi in self.ranges)
  @property
  def block_bytes(self) -> int: return self.elements * self.itemsize

def _is_block_symbol(u: UOp) -> bool:
  return (u.op is Ops.SPECIAL and u.arg[0].startswith("gidx")) or u.op is Ops.DEFINE_VAR

def _is_thread_symbol(u: UOp) -> bool:
  if u.op is Ops.SPECIAL: return u.arg[0].startswith("lidx")
  return u.op is Ops.RANGE and all(s.op is Ops.CONST for s in u.src[:2]) and u.src[1].arg > u.src[0].arg >= 0

def _whole_periods(mod: UOp) -> bool:
  """Whether `mod` is a thread/loop index modulo a constant over whole periods (the index from 0, its count a multiple
  of the divisor: a thread's place in a group of threads, lidx % 4 over 32 lanes). Not monotone, but at its least (0)
  where the index is, and at its greatest (divisor − 1) where the index is at its greatest, as the index's other
  monotone terms are: the interval's ends are still addresses the block loads."""
  index, divisor = mod.src
  return _is_thread_symbol(index) and index.vmin == 0 and (index.vmax + 1) % divisor.arg == 0

def _monotone(term: UOp) -> bool:
  """Whether `term` (over nonnegative thread/loop indices) takes its least and greatest values where every index does:
  sums, products and floor divisions by positive constants, MODs whose dividend never reaches the divisor, and
  indices modulo a constant over whole periods (`_whole_periods`), all over nonnegative values."""
  for u in term.toposort():
    if u.op in (Ops.MUL, Ops.IDIV, Ops.MOD) and not (u.src[1].op is Ops.CONST and u.src[1].arg > 0): return False
    if u.op is Ops.MOD and not (0 <= u.src[0].vmin and u.src[0].vmax < u.src[1].arg) and not _whole_periods(u):
      return False
    if u.op is Ops.CONST and u.arg < 0: return False
  return True

def _split_index(index: UOp) -> Optional[tuple[dict[UOp, int], int, int, dict[UOp, int]]]:
  """(block terms, least and greatest value of the rest, thread-symbol extents) of an element index, or None when it
  can't be split exactly (see the module docstring)."""
  terms, constant = split_terms(index)
  block: dict[UOp, int] = {}
  low = high = constant
  signs: dict[UOp, int] = {}
  extents: dict[UOp, int] = {}
  for term, coefficient in terms.items():
    nodes = term.toposort()
    if any(u.op not in _INDEX_OPS for u in nodes): return None
    symbols = [u for u in nodes if u.op in (Ops.SPECIAL, Ops.RANGE, Ops.DEFINE_VAR)]
    if all(_is_block_symbol(s) for s in symbols):
      block[term] = coefficient
      continue
    if not all(_is_thread_symbol(s) for s in symbols) or not _monotone(term): return None
    for s in symbols:
      if signs.setdefault(s, coefficient > 0) != (coefficient > 0): return None
      extents[s] = s.vmax - s.vmin + 1
    low, high = low + min(coefficient * term.vmin, coefficient * term.vmax), \
                high + max(coefficient * term.vmin, coefficient * term.vmax)
  return block, low, high, extents

def always_run_loads(uops: list[UOp]) -> set[UOp]:
  """The LOADs every thread of every block runs: outside IFs, inside loops with constant nonempty bounds only, with no
  valid mask."""
  out: set[UOp] = set()
  open_blocks: list[bool] = []   # per open RANGE/IF: whether what it encloses always runs
  for u in uops:
    if u.op is Ops.RANGE: open_blocks.append(_is_thread_symbol(u))
    elif u.op is Ops.IF: open_blocks.append(False)
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF): open_blocks.pop()
    elif u.op is Ops.LOAD and all(open_blocks) and not (len(u.src) > 2 and u.src[2].dtype == dtypes.bool): out.add(u)
  return out

def block_prefetch(uops: list[UOp]) -> Optional[BlockPrefetch]:
  """What one block of this kernel prefetches into L2 before waiting for its predecessor, or None: the read-only
  buffer with the largest byte extent whose interval can be derived and pays (the module docstring's rules). A buffer
  whose interval can't be derived (a gather's table, a loop over a symbolic count) gives way to the next largest."""
  always = always_run_loads(uops)
  for buffer, loads in read_only_buffers(uops).items():
    if (plan := _buffer_prefetch(buffer, [load for load in loads if load in always])) is not None: return plan
  return None

def _buffer_prefetch(buffer: UOp, loads: list[UOp]) -> Optional[BlockPrefetch]:
  """The ranges one block reads of `buffer` through `loads` (those that always run), if they are exact and pay: each
  load's interval, those that overlap or lie within a line of each other joined, up to PREFETCH_MAX_RANGES ranges
  (more are joined into one)."""
  block: Optional[dict[UOp, int]] = None
  intervals: list[tuple[int, int]] = []
  touched = 0
  for load in loads:
    if (split := _split_index(load.src[1])) is None: return None
    terms, load_low, load_high, extents = split
    if block is not None and terms != block: return None
    block = terms
    intervals.append((load_low, load_high))
    touched += prod(extents.values())
  if block is None: return None
  line_elements = max(1, PREFETCH_LINE_BYTES // buffer.dtype.itemsize)
  ranges: list[tuple[int, int]] = []
  for lo, hi in sorted(intervals):
    if ranges and lo - ranges[-1][1] <= line_elements: ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
    else: ranges.append((lo, hi))
  if len(ranges) > PREFETCH_MAX_RANGES: ranges = [(ranges[0][0], max(hi for _, hi in ranges))]
  plan = BlockPrefetch(buffer, _block_index(block), tuple(ranges))
  if plan.block_bytes > PREFETCH_MAX_BLOCK_BYTES or plan.elements > PREFETCH_MAX_SPARSITY * touched: return None
  return plan

def _block_index(terms: dict[UOp, int]) -> UOp:
  """Σ coefficient·term, the constant 0 for none."""
  pieces = [term * UOp.const(dtypes.index, coefficient) for term, coefficient in terms.items()]
  out = pieces[0] if pieces else UOp.const(dtypes.index, 0)
  for piece in pieces[1:]: out = out + piece
  return out

# ---------------------------------------------------------------------------------------------------------------
# CUDA C

_C_OPERATORS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%"}

def c_index(u: UOp, names: dict[UOp, str]) -> str:
  """A block part's index math as a 64-bit C expression; `names` gives the C text of each SPECIAL and DEFINE_VAR.
  Divisors are positive constants and C's division truncates, as IDIV/MOD do."""
  if u.op is Ops.CONST: return f"{u.arg}ll"
  if u in names: return f"((long long){names[u]})"
  return f"({c_index(u.src[0], names)} {_C_OPERATORS[u.op]} {c_index(u.src[1], names)})"

def prefetch_statements(plan: BlockPrefetch, buffer: str, names: dict[UOp, str], thread: str,
                        threads: int) -> list[str]:
  """The C statements that prefetch `plan`'s ranges of `buffer` (a parameter's name): for each range, thread `thread`
  (an expression, 0..threads-1) takes lines thread, thread + threads, ... of the 128-byte lines from the one holding
  its first byte through the one holding its last."""
  line = f"{PREFETCH_LINE_BYTES}ull"
  block = c_index(plan.first, names)
  def walk(lo: int, hi: int, indent: str) -> list[str]:
    first = f"({block} + {lo}ll) * {plan.itemsize}ll"
    last = f"({block} + {hi}ll) * {plan.itemsize}ll + {plan.itemsize - 1}ll"
    return [f"{indent}const unsigned long long prefetch_last = (unsigned long long)((const char*){buffer} + {last});",
            f"{indent}for (unsigned long long prefetch_line = ((unsigned long long)((const char*){buffer} + {first}) & "
            f"~({line} - 1ull)) + {line} * ({thread}); prefetch_line <= prefetch_last; prefetch_line += {line} * "
            f"{threads}ull)",
            f'{indent}  asm volatile("{PREFETCH_INSTRUCTION}" :: "l"(prefetch_line));']
  out = [f"{{  // L2 prefetch of the {plan.block_bytes} bytes of {buffer} this block reads"]
  if len(plan.ranges) == 1: out += walk(*plan.ranges[0], "  ")
  else:
    for lo, hi in plan.ranges: out += ["  {", *walk(lo, hi, "    "), "  }"]
  return out + ["}"]
