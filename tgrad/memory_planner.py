"""Static memory planning: the transient buffers of a flat instruction list packed by offset into one arena.

Input: each transient's size in bytes and its live interval (the first and last instruction that use it,
inclusive: an instruction's inputs and outputs are live together, so they never share bytes). Output: a byte offset
per transient and the arena's size, such that two transients whose intervals overlap never overlap in memory, and
every offset is a multiple of the alignment. A device's memory is planned on its own (one arena per device).

Two greedy packings are tried and the smaller arena kept:
  * best fit in time order: walk the instructions; free what died, then place each new transient in the smallest
    free gap that holds it (or at the end of the arena), merging neighbouring gaps when buffers die;
  * largest first: place transients from the biggest down, each at the lowest offset that is free throughout its
    interval (big buffers get the low offsets; small ones fill the holes between them).
"""
from __future__ import annotations
import bisect, heapq
from dataclasses import dataclass
from typing import Any, Sequence
from tgrad.helpers import round_up

# Offsets and sizes are rounded up to this: cudaMalloc's alignment (256 bytes), so a view is as aligned as an
# allocation on a GPU, and a multiple of the CPU's vector width and cache line (64 bytes).
ARENA_ALIGNMENT = 256

@dataclass(frozen=True)
class Lifetime:
  """One transient: live from instruction `first` through `last` (inclusive), `nbytes` long."""
  first: int
  last: int
  nbytes: int
  def overlaps(self, other: Lifetime) -> bool: return self.first <= other.last and other.first <= self.last

@dataclass(frozen=True)
class ArenaPlan:
  offsets: tuple[int, ...]   # byte offset of each transient, in the order given
  size: int                  # bytes the arena needs
  strategy: str              # which packing won

def liveness(uses: Sequence[Sequence[int]]) -> dict[int, tuple[int, int]]:
  """For instructions that each use some buffer ids, the (first, last) instruction of every id."""
  out: dict[int, tuple[int, int]] = {}
  for i, ids in enumerate(uses):
    for b in ids: out[b] = (out[b][0], i) if b in out else (i, i)
  return out

def symbolic_peak(lifetimes: Sequence[Lifetime], nbytes: Sequence[Any]) -> Any:
  """The most bytes live at once over the instructions, as a sympy expression: the Max over instructions of the
  sum of the live transients' sizes (`nbytes`: sympy expressions in the symbolic variables, one per lifetime). What
  an ideal packing needs at each value of the variables (alignment not counted); the planned arena is sized for the
  variables' maximum, so its offsets hold for every value."""
  import sympy
  steps = sorted({t.first for t in lifetimes})
  sums = {sum((b for t, b in zip(lifetimes, nbytes) if t.first <= i <= t.last), sympy.Integer(0)) for i in steps}
  return sympy.Max(*sums) if sums else sympy.Integer(0)

def plan_arena(lifetimes: Sequence[Lifetime], alignment: int = ARENA_ALIGNMENT) -> ArenaPlan:
  """Offsets for the transients; see the module doc. An empty list needs an arena of 0 bytes."""
  for t in lifetimes:
    if t.nbytes < 0 or t.first > t.last: raise ValueError(f"invalid lifetime {t}")
  sizes = [round_up(max(t.nbytes, 1), alignment) for t in lifetimes]
  candidates = [_best_fit_in_time_order(lifetimes, sizes), _largest_first(lifetimes, sizes)]
  offsets, size, strategy = min(candidates, key=lambda c: c[1])
  return ArenaPlan(tuple(offsets), size, strategy)

def _best_fit_in_time_order(lifetimes: Sequence[Lifetime], sizes: list[int]) -> tuple[list[int], int, str]:
  offsets, gaps, end = [0] * len(lifetimes), [], 0   # gaps: sorted (offset, size) of free bytes below `end`
  live: list[tuple[int, int]] = []                    # heap of (last instruction, transient)
  for i in sorted(range(len(lifetimes)), key=lambda i: (lifetimes[i].first, -sizes[i])):
    while live and live[0][0] < lifetimes[i].first:
      _, dead = heapq.heappop(live)
      _release(gaps, offsets[dead], sizes[dead])
    fitting = [g for g in gaps if g[1] >= sizes[i]]
    if fitting:
      gap = min(fitting, key=lambda g: (g[1], g[0]))
      gaps.remove(gap)
      offsets[i] = gap[0]
      if gap[1] > sizes[i]: bisect.insort(gaps, (gap[0] + sizes[i], gap[1] - sizes[i]))
    elif gaps and gaps[-1][0] + gaps[-1][1] == end:   # grow the arena from the free bytes at its end
      offsets[i] = gaps.pop()[0]
      end = offsets[i] + sizes[i]
    else: offsets[i], end = end, end + sizes[i]
    heapq.heappush(live, (lifetimes[i].last, i))
  return offsets, end, "best fit in time order"

def _release(gaps: list[tuple[int, int]], offset: int, size: int) -> None:
  """Free [offset, offset + size), merged with the gaps next to it."""
  index = bisect.bisect(gaps, (offset, size))
  if index < len(gaps) and gaps[index][0] == offset + size: size += gaps.pop(index)[1]
  if index > 0 and gaps[index - 1][0] + gaps[index - 1][1] == offset:
    offset, size = gaps[index - 1][0], gaps[index - 1][1] + size
    gaps.pop(index - 1)
  bisect.insort(gaps, (offset, size))

def _largest_first(lifetimes: Sequence[Lifetime], sizes: list[int]) -> tuple[list[int], int, str]:
  offsets, placed, end = [0] * len(lifetimes), [], 0
  for i in sorted(range(len(lifetimes)), key=lambda i: (-sizes[i], lifetimes[i].first)):
    busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed if lifetimes[j].overlaps(lifetimes[i]))
    offset = 0
    for start, stop in busy:   # the lowest gap between the busy ranges that holds this transient
      if start - offset >= sizes[i]: break
      offset = max(offset, stop)
    offsets[i] = offset
    end = max(end, offset + sizes[i])
    placed.append(i)
  return offsets, end, "largest first"
