"""Grouping a kernel's scalar memory accesses into vector ones (CUDA): runs of contiguous, aligned scalar loads or
stores become one float4-style access (`vector_groups`; 16-bit values that ALU ops read are loaded 8 to a uint4), a
global → shared copy of one vector is one cp.async (`async_copies`, `widen_async_copies`), and runs of bytes read from
a read-only buffer (packed quantized weights) are read as whole words (`byte_runs`, `byte_run_pieces`).

Input: the linear UOps of one kernel; output: program position → the VectorAccess it belongs to. The renderer
(renderer.py) writes each access at its position.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from tgrad.codegen.renderer import MatrixLoad
from tgrad.dtype import DType, dtypes
from tgrad.ops import UOp, Ops, split_terms

VECTOR_BYTES = 16                               # the widest global load/store instruction (ld.global.v4.b32)

@dataclass(frozen=True)
class VectorType:
  name: str        # the CUDA vector type (make_<name> builds one)
  lanes: int
  lane_type: str   # the C type of one lane (.x)
  per_word: int = 1   # lanes packed into each 32-bit word of the vector (2: 16-bit lanes of a uint4)
  def lane(self, vector: str, lane: int) -> str:
    """The C expression of one lane of a loaded vector."""
    if self.per_word == 1: return f"{vector}.{LANES[lane]}"
    bits = 32 // self.per_word
    word, shift = f"{vector}.{LANES[lane // self.per_word]}", bits * (lane % self.per_word)
    return f"({self.lane_type})({word} >> {shift})" if shift else f"({self.lane_type}){word}"

# per dtype: lanes × itemsize ≤ VECTOR_BYTES and lanes ≤ 4, the most an UPCAST of 4 gives one access
VECTOR_TYPES: dict[DType, VectorType] = {
  dtypes.float32: VectorType("float4", 4, "float"), dtypes.int32: VectorType("int4", 4, "int"),
  dtypes.uint32: VectorType("uint4", 4, "unsigned int"), dtypes.float16: VectorType("ushort4", 4, "unsigned short"),
  dtypes.bfloat16: VectorType("ushort4", 4, "unsigned short"), dtypes.int16: VectorType("short4", 4, "short"),
  dtypes.uint16: VectorType("ushort4", 4, "unsigned short"), dtypes.int8: VectorType("char4", 4, "signed char"),
  dtypes.uint8: VectorType("uchar4", 4, "unsigned char"), dtypes.bool: VectorType("uchar4", 4, "unsigned char"),
  dtypes.float64: VectorType("double2", 2, "double"), dtypes.int64: VectorType("longlong2", 2, "long long"),
  dtypes.uint64: VectorType("ulonglong2", 2, "unsigned long long")}
LANES = "xyzw"
# 16-byte loads of 8 16-bit lanes (a uint4, each lane shifted out of its word): the widest load for half/bfloat16. Used
# for global loads that ALU ops read (a matrix–vector product's weight rows); stores, shared memory and tensor-core
# fragments keep VECTOR_TYPES, whose lanes match the copies and fragments built from them.
WIDE_LOAD_TYPES: dict[DType, VectorType] = {
  dt: VectorType("uint4", 8, lane_type, per_word=2)
  for dt, lane_type in ((dtypes.float16, "unsigned short"), (dtypes.bfloat16, "unsigned short"),
                        (dtypes.int16, "short"), (dtypes.uint16, "unsigned short"))}


@dataclass
class VectorAccess:
  """`lanes` scalar LOADs or STOREs (program positions, lane order) on one buffer at base, base+1, …: one vector
  access at `at` (the first load, or the last store, whose operands are all computed by then)."""
  positions: list[int]
  at: int
  vector: VectorType

def scope_ids(uops: list[UOp]) -> list[int]:
  """For each position, an id of the loop body instance it lies in (a closed loop's body never recurs)."""
  stack, counter, out = [0], 0, []
  for u in uops:
    out.append(stack[-1])
    if u.op in (Ops.RANGE, Ops.IF):
      counter += 1
      stack.append(counter)
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF): stack.pop()
  return out

def _aligned_base(index: UOp, lanes: int) -> Optional[tuple[tuple, int]]:
  """index as (the terms, a constant) with every coefficient a multiple of lanes, split into (key of the aligned
  base, lane); None when the base can't be proven a multiple of lanes."""
  terms, constant = split_terms(index)
  if any(coef % lanes for coef in terms.values()): return None
  lane = constant % lanes
  return (tuple(sorted(((t.key, c) for t, c in terms.items()))), constant - lane), lane

def vector_groups(uops: list[UOp], taken: frozenset[int] = frozenset()) -> dict[int, VectorAccess]:
  """Find groups of LOADs (STOREs) of lanes consecutive elements of a buffer whose first index is provably a
  multiple of lanes (so the address is aligned), in one loop body, with the same valid. A global buffer that is both
  read and written is left alone; in a shared array no access of the other kind may lie between a group's first and
  last access. Either way, doing the group's accesses at once can't change what a load sees. Global loads that only
  ALU ops read are grouped in WIDE_LOAD_TYPES first (16-byte loads of 16-bit values), the rest in VECTOR_TYPES. The
positions `taken` (byte runs) are left alone."""
  kept_whole = {u.src[2] for u in uops if u.op is Ops.STORE} | \
               {s for u in uops if u.op is Ops.VECTORIZE for s in u.src}   # copies and fragments keep their lanes
  def wide(u: UOp) -> bool: return u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and u not in kept_whole
  groups = _vector_groups(uops, WIDE_LOAD_TYPES, wide, taken)
  groups.update(_vector_groups(uops, VECTOR_TYPES, lambda u: True, taken | frozenset(groups)))
  return groups

def _vector_groups(uops: list[UOp], types: dict[DType, VectorType], eligible, taken: frozenset[int] = frozenset()) \
    -> dict[int, VectorAccess]:
  """vector_groups for the accesses `eligible` accepts, not at the positions `taken`, with one table of types."""
  stored = {u.src[0] for u in uops if u.op is Ops.STORE}
  loaded = {u.src[0] for u in uops if u.op is Ops.LOAD}
  scopes = scope_ids(uops)
  candidates: dict[tuple, dict[int, int]] = {}
  for pos, u in enumerate(uops):
    if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL): continue
    if u.op is Ops.LOAD and isinstance(u.arg, MatrixLoad): continue
    if pos in taken or not eligible(u): continue
    buffer = u.src[0]
    if buffer.op is Ops.DEFINE_GLOBAL and buffer in stored and buffer in loaded: continue
    dtype = u.dtype if u.op is Ops.LOAD else u.src[2].dtype
    if dtype not in types: continue
    lanes = types[dtype].lanes
    if (split := _aligned_base(u.src[1], lanes)) is None: continue
    base, lane = split
    valid_at = 3 if u.op is Ops.STORE else 2
    valid = u.src[valid_at] if len(u.src) > valid_at else None
    if u.op is Ops.LOAD and valid is not None and valid.dtype != dtypes.bool: valid = None
    key = (u.op, buffer, scopes[pos], valid, base)
    candidates.setdefault(key, {}).setdefault(lane, pos)
  groups: dict[int, VectorAccess] = {}
  for (op, buffer, *_), by_lane in candidates.items():
    vector = types[buffer.dtype]
    if sorted(by_lane) != list(range(vector.lanes)): continue
    positions = [by_lane[lane] for lane in range(vector.lanes)]
    if buffer.op is Ops.DEFINE_LOCAL and any(uops[p].op is not op and uops[p].op in (Ops.LOAD, Ops.STORE) and
                                             uops[p].src[0] is buffer for p in range(min(positions), max(positions))):
      continue
    access = VectorAccess(positions, min(positions) if op is Ops.LOAD else max(positions), vector)
    for pos in positions: groups[pos] = access
  return groups

def async_copies(uops: list[UOp], vectors: dict[int, VectorAccess]) -> dict[int, VectorAccess]:
  """Vector stores into shared memory whose lanes are exactly one unmasked vector load from global memory, read by
  nothing else: id of the store's VectorAccess → the load's. Such a pair is one cp.async (sm_80+)."""
  users: dict[UOp, int] = {}
  for u in uops:
    for s in u.src: users[s] = users.get(s, 0) + 1
  out: dict[int, VectorAccess] = {}
  for pos, access in vectors.items():
    u = uops[pos]
    if id(access) in out or u.op is not Ops.STORE or u.src[0].op is not Ops.DEFINE_LOCAL or pos != access.at: continue
    values = [uops[p].src[2] for p in access.positions]
    if any(v.op is not Ops.LOAD or v.src[0].op is not Ops.DEFINE_GLOBAL or len(v.src) > 2 or users.get(v) != 1
           for v in values): continue
    value_positions = [max(p for p in range(access.at) if uops[p] is v) for v in values]
    load_access = vectors.get(value_positions[0])
    if load_access is not None and load_access.positions == value_positions: out[id(access)] = load_access
  return out

ASYNC_COPY_BYTES = 16   # the widest cp.async

@dataclass
class AsyncCopy:
  """One cp.async: `nbytes` from the global address of `load`'s first lane to the shared address of `store`'s."""
  store: VectorAccess
  load: VectorAccess
  nbytes: int

def widen_async_copies(uops: list[UOp], copies: dict[int, VectorAccess], vectors: dict[int, VectorAccess],
                       ) -> dict[int, Optional[AsyncCopy]]:
  """Pair copies whose shared and global addresses both continue the other's, 16-byte aligned, into one 16-byte
  copy (cp.async is unordered until its wait, so merging never changes what a load sees). Maps id of every copy's
  store access → the copy to issue at its position, or None where its partner issues it."""
  stores = {id(access): access for access in vectors.values()}
  scopes = scope_ids(uops)
  out: dict[int, Optional[AsyncCopy]] = {}
  by_base: dict[tuple, dict[int, int]] = {}
  for key, load in copies.items():
    store = stores[key]
    lanes, itemsize = store.vector.lanes, uops[store.at].src[0].dtype.itemsize
    out[key] = AsyncCopy(store, load, lanes * itemsize)
    if 2 * lanes * itemsize != ASYNC_COPY_BYTES: continue
    first_store, first_load = uops[store.positions[0]], uops[load.positions[0]]
    store_split, load_split = _aligned_base(first_store.src[1], 2 * lanes), _aligned_base(first_load.src[1], 2 * lanes)
    if store_split is None or load_split is None or store_split[1] != load_split[1]: continue
    group = (scopes[store.at], first_store.src[0], first_store.src[3:], first_load.src[0], store_split[0],
             load_split[0])
    by_base.setdefault(group, {})[store_split[1]] = key
  for halves in by_base.values():
    if sorted(halves) != [0, len(halves) and max(halves)] or len(halves) != 2: continue
    low, high = halves[0], halves[max(halves)]
    first, second = out[low], out[high]
    assert first is not None and second is not None
    issue_at_low = first.store.at > second.store.at   # the later position: both copies' operands exist by then
    out[low if issue_at_low else high] = AsyncCopy(first.store, first.load, ASYNC_COPY_BYTES)
    out[high if issue_at_low else low] = None
  return out

# ---- runs of bytes
# A packed quantized weight is bytes, and a thread of a packed matrix–vector product reads runs of neighbouring bytes
# of a block (heuristics._packed_matvec). One load per byte costs one instruction per byte; the run is read instead as
# the widest loads its alignment allows. The alignment is proven from the index (every coefficient and the constant a
# multiple of it; allocations are 16-byte aligned), and never assumed: a block of 34 or 22 bytes leaves the run's
# start only 2-byte aligned (or not at all), and then each 4 bytes are cut from the two aligned 32-bit words that hold
# them by a funnel shift (the shift known only at run time). Every word read lies within the run's own words, so no
# load leaves the buffer.
MAX_BYTE_RUN = 64                 # bytes in one run at most (a whole unrolled block of 32 quants fits)
MAX_PROVEN_ALIGNMENT = 16         # the widest load (uint4)
WORD_BYTES = 4
BYTE_LOAD_TYPES = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}

@dataclass
class ByteRun:
  """`len(positions)` uint8 LOADs (program positions, in byte order) of one read-only global buffer at start, start+1,
  …, whose start is provably a multiple of `alignment` (a power of two up to MAX_PROVEN_ALIGNMENT): read together at
  `at` (the first of them in program order)."""
  positions: list[int]
  at: int
  alignment: int

@dataclass(frozen=True)
class BytePiece:
  """One load of a run: `nbytes` at byte `offset` of it, aligned (a plain load of BYTE_LOAD_TYPES[nbytes]), or, when
  `funnel`, 4 bytes cut from the two aligned words that hold them."""
  offset: int
  nbytes: int
  funnel: bool = False

def _power_of_two_dividing(values, limit: int) -> int:
  alignment = limit
  for v in values:
    while alignment > 1 and v % alignment: alignment //= 2
  return alignment

def byte_runs(uops: list[UOp]) -> dict[int, ByteRun]:
  """Runs of 2 to MAX_BYTE_RUN uint8 LOADs from a global buffer the kernel never writes, unmasked, in one loop body,
  at consecutive indices (the same terms, constants one apart), that only ALU ops read, and that take fewer loads read
  as a run than vector_groups would give them: program position → its run."""
  stored = {u.src[0] for u in uops if u.op is Ops.STORE}
  kept_whole = {u.src[2] for u in uops if u.op is Ops.STORE} | {s for u in uops if u.op is Ops.VECTORIZE for s in u.src}
  scopes = scope_ids(uops)
  candidates: dict[tuple, dict[int, int]] = {}
  terms_of: dict[tuple, dict] = {}
  for pos, u in enumerate(uops):
    if u.op is not Ops.LOAD or u.dtype != dtypes.uint8 or u.src[0].op is not Ops.DEFINE_GLOBAL: continue
    if u.src[0] in stored or u in kept_whole or (len(u.src) > 2 and u.src[2].dtype == dtypes.bool): continue
    terms, constant = split_terms(u.src[1])
    key = (u.src[0], scopes[pos], tuple(sorted((t.key, c) for t, c in terms.items())))
    candidates.setdefault(key, {}).setdefault(constant, pos)
    terms_of[key] = terms
  runs: dict[int, ByteRun] = {}
  for key, by_constant in candidates.items():
    constants = sorted(by_constant)
    start = 0
    while start < len(constants):
      end = start + 1
      while end < len(constants) and constants[end] == constants[end - 1] + 1 and end - start < MAX_BYTE_RUN: end += 1
      alignment = _power_of_two_dividing([*terms_of[key].values(), constants[start]], MAX_PROVEN_ALIGNMENT)
      if end - start >= 2 and len(byte_run_pieces(end - start, alignment)) < _vector_loads(end - start, alignment):
        positions = [by_constant[c] for c in constants[start:end]]
        run = ByteRun(positions, min(positions), alignment)
        for pos in positions: runs[pos] = run
      start = end
  return runs

def _vector_loads(nbytes: int, alignment: int) -> int:
  """Loads vector_groups gives a run of bytes: a uchar4 per aligned 4 where the start is word-aligned, else one per
  byte. A run is a ByteRun only where that takes fewer loads (otherwise uchar4 code stays as it was)."""
  if alignment < WORD_BYTES: return nbytes
  return nbytes // WORD_BYTES + nbytes % WORD_BYTES

def byte_run_pieces(nbytes: int, alignment: int) -> list[BytePiece]:
  """The loads that read a run of `nbytes` whose start is a multiple of `alignment`: the widest aligned loads that fit
  where the start is word-aligned; else funnel-shifted words for each whole 4 bytes, then the rest as aligned 16-bit
  or byte loads."""
  pieces: list[BytePiece] = []
  offset = 0
  if alignment < WORD_BYTES:
    while offset + WORD_BYTES <= nbytes:
      pieces.append(BytePiece(offset, WORD_BYTES, funnel=True))
      offset += WORD_BYTES
  while offset < nbytes:
    here = _power_of_two_dividing([offset], MAX_PROVEN_ALIGNMENT) if offset else MAX_PROVEN_ALIGNMENT
    size = min(alignment, here)
    while offset + size > nbytes: size //= 2
    pieces.append(BytePiece(offset, size))
    offset += size
  return pieces
