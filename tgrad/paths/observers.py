"""Observers of Tensor-level realizes: the hooks a profiler installs to see each graph before it is realized.

`observers` holds callables `observe(outs)` (the unrealized LazyBuffers about to be realized); path selection
(select.py) calls each one before it selects (profile.py's `watching` adds the profiler's). `unobserved()` is a scope
whose realizes nobody observes: the checks a profiled program's own machinery makes (the equivalence checker's
random trials, a user kernel's verification) are not the program's graphs.
"""
from __future__ import annotations
import contextlib
from typing import Callable, Iterator, Sequence
from tgrad.lazy import LazyBuffer

observers: list[Callable[[Sequence[LazyBuffer]], None]] = []

@contextlib.contextmanager
def unobserved() -> Iterator[None]:
  """Realizes inside the scope are not observed (profiled)."""
  saved = observers[:]
  observers.clear()
  try: yield
  finally: observers[:] = saved
