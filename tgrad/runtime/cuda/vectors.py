"""Grouping a kernel's scalar memory accesses into vector ones (CUDA): runs of contiguous, aligned scalar loads or
stores become one float4-style access (`vector_groups`; 16-bit values that ALU ops read are loaded 8 to a uint4), and a
global → shared copy of one vector is one cp.async (`async_copies`, `widen_async_copies`).

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

def _scope_ids(uops: list[UOp]) -> list[int]:
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

def vector_groups(uops: list[UOp]) -> dict[int, VectorAccess]:
  """Find groups of LOADs (STOREs) of lanes consecutive elements of a buffer whose first index is provably a
  multiple of lanes (so the address is aligned), in one loop body, with the same valid. A global buffer that is both
  read and written is left alone; in a shared array no access of the other kind may lie between a group's first and
  last access. Either way, doing the group's accesses at once can't change what a load sees. Global loads that only
  ALU ops read are grouped in WIDE_LOAD_TYPES first (16-byte loads of 16-bit values), the rest in VECTOR_TYPES."""
  kept_whole = {u.src[2] for u in uops if u.op is Ops.STORE} | \
               {s for u in uops if u.op is Ops.VECTORIZE for s in u.src}   # copies and fragments keep their lanes
  def wide(u: UOp) -> bool: return u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and u not in kept_whole
  groups = _vector_groups(uops, WIDE_LOAD_TYPES, wide)
  groups.update(_vector_groups(uops, VECTOR_TYPES, lambda u: True, frozenset(groups)))
  return groups

def _vector_groups(uops: list[UOp], types: dict[DType, VectorType], eligible, taken: frozenset[int] = frozenset()) \
    -> dict[int, VectorAccess]:
  """vector_groups for the accesses `eligible` accepts, not at the positions `taken`, with one table of types."""
  stored = {u.src[0] for u in uops if u.op is Ops.STORE}
  loaded = {u.src[0] for u in uops if u.op is Ops.LOAD}
  scopes = _scope_ids(uops)
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
  scopes = _scope_ids(uops)
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
