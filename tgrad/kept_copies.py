"""Packed copies of a matmul's operands kept between calls, while what they were copied from is unchanged.

A CPU matmul runs as a copy of B into column panels, then the product (codegen/cpu_gemm.py). When B is a weight, the
copy makes the same panels on every call: 2-3 ms for a 16 MB weight, a tenth of a 256×1024·1024×4096 product. Here
a copy step gets a Buffer of its own per set of source Buffers (`kept_buffer`), and its runner (`KeptCopy`) copies
only when a source was written since its last copy there: each Buffer counts the writes of its memory
(`Buffer.version`: copies in, and every launch that lists it as an output, in `run`, `ExecItem.run` and TinyJit
replays), and the copy remembers the counts it copied at.

A source is given a kept copy the second time a copy of it is lowered (the first one uses the shared scratch buffer):
a fresh Buffer costs page faults, which an activation, new on every call, would pay each time. At most
KEPT_COPIES_BYTES are kept; the oldest go first, and a copy is dropped with its source.
"""
from __future__ import annotations
import weakref
from typing import Optional, Sequence
from tgrad.codegen.compile import CompiledKernel
from tgrad.device import Buffer
from tgrad.dtype import DType
from tgrad.ops import UOp

KEPT_COPIES_BYTES = 1 << 30   # the packed copies kept at once (a copy is as big as its weight)
SIGHTINGS_KEPT = 1024         # sources whose first copy is remembered, waiting for a second

_kept: dict[tuple, Buffer] = {}                        # (device, copy AST, ids of sources) → its copy, oldest first
_sightings: dict[tuple, tuple[weakref.ref, ...]] = {}  # the same keys, copied once (through scratch)
_copied_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # kept copy → its sources' versions

def kept_buffer(device: str, ast: UOp, sources: Sequence[Buffer], size: int, dtype: DType) -> Optional[Buffer]:
  """The Buffer that keeps the copy `ast` makes of `sources` (size elements of dtype), or None on the first sighting
  of these sources (the caller copies into scratch)."""
  key = (device, ast, tuple(id(b) for b in sources))
  if (buffer := _kept.pop(key, None)) is not None:
    _kept[key] = buffer   # the newest last
    return buffer
  refs = _sightings.pop(key, None)
  if refs is None or any(ref() is not b for ref, b in zip(refs, sources)):   # never seen, or seen another Buffer there
    _sightings[key] = tuple(weakref.ref(b) for b in sources)
    while len(_sightings) > SIGHTINGS_KEPT: del _sightings[next(iter(_sightings))]
    return None
  buffer = _kept[key] = Buffer(device, size, dtype)
  for source in sources: weakref.finalize(source, _kept.pop, key, None)
  total = sum(b.nbytes for b in _kept.values())
  while total > KEPT_COPIES_BYTES and len(_kept) > 1:
    total -= _kept.pop(next(iter(_kept))).nbytes
  return buffer

class KeptCopy:
  """Runs a copy kernel (bufs[0] from bufs[1:]) into a kept Buffer only when a source's version changed since the
  copy last ran there."""
  def __init__(self, kernel: CompiledKernel):
    self.kernel, self.name = kernel, kernel.name
    self.flops, self.nbytes = kernel.cost()
  def __call__(self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Optional[dict[str, int]] = None
               ) -> Optional[float]:
    versions = tuple(b.version for b in bufs[1:])
    if _copied_at.get(bufs[0]) == versions: return 0.0 if wait else None
    seconds = self.kernel(bufs, wait, var_vals)
    _copied_at[bufs[0]] = versions
    return seconds

def forget_kept_copies() -> None:
  """Drop every kept copy (tests; freeing their memory)."""
  _kept.clear()
  _sightings.clear()
