"""Path selection at realize time: the fastest recorded path within TOLERANCE, else today's default.

A pre-realize pass (tgrad/realize.py), registered by tgrad/paths/__init__.py: every Tensor-level realize asks
`context_for(lbs)` for the context to realize in. While the benchmark database
holds no record for this hardware (the usual case until `python -m tgrad.paths profile` ran), that is a no-op and
costs one flag check. Otherwise round trips to another device that the database says are slower than computing on
the CPU are rewritten first (coalesce.py), then the graph's regions are found, its canonical key is looked up, and
`db.select` picks
the fastest verified path whose max relative error is within the tolerance — `TOLERANCE` (environment or
`Context`), or the default for the outputs' dtype — on this hardware, tgrad version and settings. Its lowerings are
applied to the graph (and BEAM=2 set when the path's kernels were searched) before scheduling. With no usable
record the graph runs as built: the documented guess is today's default lowering with heuristic opts, never an
unmeasured path. Selections are remembered per (graph key, tolerance) for the process, so a decode loop pays the
lookup once; a new tolerance re-selects from the same records without measuring. DEBUG=2 prints, per composite,
the lowering chosen and why (which record, or "guess").
"""
from __future__ import annotations
import contextlib
from typing import Iterator, Optional, Sequence
from tgrad.lazy import LazyBuffer
from tgrad.helpers import Context, code_settings, current_settings
from tgrad.realize import is_capturing
from tgrad.regions import DEFAULT, apply_lowering, regions_above
from tgrad.paths import coalesce
from tgrad.paths.db import PathsDB, Selection, default_tolerance, get_paths_db, select
from tgrad.paths.fingerprint import hardware_fingerprint, tgrad_version
from tgrad.paths.observers import observers
from tgrad.paths.path import ExecutionPath, PathSpace
from tgrad.paths.user_kernels import USER_KERNELS

_has_records: dict[str, bool] = {}
_memo: dict[tuple[str, float], tuple[Selection, Optional[tuple[str, ...]], str]] = {}
applied: dict[str, str] = {}   # graph key → what the last realize of it chose (the path's description, or why none)

def database() -> PathsDB:
  """The database selection reads: the process-wide one of the current TGRAD_CACHE (db.get_paths_db)."""
  return get_paths_db()

def forget() -> None:
  """Drop what this process remembers of the database (after it changed, or to use another file)."""
  database().recheck()
  _has_records.clear()
  _memo.clear()
  applied.clear()
  coalesce.forget()

def active(device: str) -> bool:
  """Whether a realize on `device` may select anything: a profiler watches, or the database has records."""
  if observers: return True
  if (known := _has_records.get(device)) is None: known = _has_records[device] = database().has_records(device)
  return known

def tolerance_for(outs: Sequence[LazyBuffer]) -> float:
  """TOLERANCE if set, else the default of the narrowest float dtype among the outputs."""
  if (tolerance := Context.TOLERANCE) is not None: return float(tolerance)
  floats = [o.dtype for o in outs if o.dtype.is_float]
  return min((default_tolerance(d) for d in floats), default=default_tolerance(outs[0].dtype))

def usable(space: PathSpace, choices: Sequence[str], opts: str, path_id: str) -> bool:
  """Whether a record can be used here: it is a path of this space's regions, with lowerings still offered (a user
  kernel that failed verification in this process never is)."""
  return len(choices) == len(space.regions) and all(c in o for c, o in zip(choices, space.options)) and \
    ExecutionPath(tuple(choices), space.names, opts, space.device).id == path_id

def choose(space: PathSpace, tolerance: float) -> tuple[Selection, Optional[tuple[str, ...]], str]:
  """(the selection, the chosen path's lowerings or None for the default, its opts) for a space."""
  memo_key = (space.key, tolerance)
  if (known := _memo.get(memo_key)) is not None: return known
  runs = [r for r in database().runs(space.key, space.device) if usable(space, r.choices, r.opts, r.path_id)]
  selection = select(runs, tolerance, hardware_fingerprint, tgrad_version(), code_settings())
  choices, opts = None, "heuristic"
  if selection.chosen is not None: choices, opts = tuple(selection.chosen.choices), selection.chosen.opts
  _memo[memo_key] = (selection, choices, opts)
  return _memo[memo_key]

def _print_choice(space: PathSpace, selection: Selection, choices: Optional[tuple[str, ...]]) -> None:
  why = selection.reason if choices is not None else f"guess (default lowering): {selection.reason}"
  print(f"paths: graph {space.key[:12]} on {space.device}: {why}")
  for i, region in enumerate(space.regions):
    lowering = choices[i] if choices is not None else DEFAULT
    source = f"record {selection.chosen.path_id}" if choices is not None and selection.chosen else "guess"
    print(f"  {region.name}#{i} {dict(region.params)} → {lowering} ({source})")

def context_for(lbs: Sequence[LazyBuffer]):
  """The context to realize lbs in (see realize_context), or None when nothing can be selected (the fast case)."""
  for lb in lbs:
    if (lb if lb._base is None else lb._base).buffer is None:   # lb.base, inline: every realize asks
      if not observers and _has_records.get(lb.device) is False: return None   # `active`, answered from its memo
      return realize_context(lbs) if active(lb.device) else None
  return None

def _may_have_paths(outs: Sequence[LazyBuffer]) -> bool:
  """Whether the graph can have more than one path: a composite region, or a registered user kernel (whose sites
  need no region). A plain eager op has neither: its realize then pays one short walk, not a graph key."""
  return bool(USER_KERNELS) or bool(regions_above(*outs))

@contextlib.contextmanager
def realize_context(lbs: Sequence[LazyBuffer]) -> Iterator[None]:
  """Apply the selected path's lowerings (and BEAM) around a realize of lbs; nothing when there is no record."""
  outs = [lb for lb in lbs if lb.base.buffer is None]
  if not outs or not active(outs[0].device) or not _may_have_paths(outs):
    yield
    return
  if not is_capturing():   # a TinyJit capture records what the first call (profiled then) already ran
    for observe in list(observers): observe(outs)
  log: Optional[list[str]] = [] if current_settings().DEBUG >= 2 else None
  coalesce.coalesce_copies(outs, database(), log=log)   # the planner's copy coalescing, decided from the database first
  for line in log or []: print(f"paths: copy coalescing: {line}")
  space = PathSpace(outs)
  if not space.regions:
    yield
    return
  selection, choices, opts = choose(space, tolerance_for(outs))
  if current_settings().DEBUG >= 2: _print_choice(space, selection, choices)
  applied[space.key] = selection.chosen.path_desc if choices is not None and selection.chosen else \
    f"default (guess: {selection.reason})"
  if choices is None:
    yield
    return
  for region, name in zip(space.regions, choices):
    if name != DEFAULT: apply_lowering(region, name)
  with Context(BEAM=2 if opts == "beam2" else current_settings().BEAM): yield
