"""Byte lanes: the same uint8 arithmetic on the four bytes of a 32-bit word, done once on the word (CUDA).

A thread of a packed matrix–vector product reads four neighbouring bytes of a block at once (a uchar4 vector load, or
one word of a byte run: vectors.py) and computes the same chain of uint8 ops on each byte: the bit fields of the
quants, cut out by multiplies and divisions by powers of two, masks, ORs and small adds (tgrad/nn/quant.py writes
them so). Written per byte, each op of the chain is one instruction per byte (plus the byte's extraction), and each
quant then costs an integer-to-float conversion. Here each such op on the four bytes becomes one op on the word: a
shift with a mask repeated in every byte keeps each lane's bits out of its neighbours, a constant is repeated in every
byte, and an add is taken only where the lanes' bounds prove that no byte carries into the next. A lane leaves the
word as a byte (a shift) where a per-byte op reads it, or, converted to float32, as `__byte_perm` of the word into the
low byte of 2^23's float bits, minus 2^23 (exact for any byte), with an int8 constant added on the way (a quant's
offset, such as Q6_K's −32) folded into that subtraction. A Q6_K 640×2048 decode projection went from 2.25 to 1.87 µs a
launch in a PDL chain of 150 (H200; docs/benchmarks.md, "Byte lanes").

Input: a kernel's linear UOps and the word loads found for it (vectors.vector_groups' uchar4 accesses, the word pieces
of vectors.byte_runs). Output: `ByteLanes`: the groups of four lane UOps computed as one word, their word expressions
(`WordExpr`, which `evaluate` computes in Python for the tests and the renderer writes as C), and the float32 casts
computed from a word.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Optional, Union
from tgrad.dtype import dtypes
from tgrad.ops import ALU, UOp, Ops, exec_alu, truncate_to
from tgrad.runtime.cuda.vectors import ByteRun, VectorAccess, WORD_BYTES, byte_run_pieces, scope_ids

LANES = WORD_BYTES
BYTE_MAX = 0xFF
WORD_MASK = 0xFFFFFFFF
BYTE_BITS = 8
# A byte b as a float: the float whose bits are 2^23's with b as the low byte of its mantissa is 2^23 + b, exactly
FLOAT_TWO_POW_23_BITS = 0x4B000000
FLOAT_TWO_POW_23 = 8388608
SIGN_FLIP = 0x80808080   # xor: each lane's int8 value v becomes the byte v + 128
SIGN_FLIP_BIAS = 128
# __byte_perm selector of lane k into byte 0, with bytes 1-3 taken from the second operand's bytes 0, 1 and 3
# (0x00, 0x00, 0x4B): 0x7540 + k
BYTE_PERM_INTO_FLOAT = 0x7540
INT8_MIN, INT8_MAX = -128, 127

def repeated(byte: int) -> int:
  """A byte in each of a word's four lanes."""
  return (byte & BYTE_MAX) * 0x01010101

@dataclass(frozen=True)
class WordExpr:
  """One 32-bit op of a lane group: op in shl / shr (by `amount`), and / or / xor / add / mul (of `left` and `right`),
  or same (the word `left` itself: a cast to uint8, a select by a constant), whose operands are groups (LaneGroup),
  other ops, or constants (ints: a mask or addend already repeated in every byte, a multiplier as it is)."""
  op: str
  left: Union["LaneGroup", "WordExpr", int]
  right: Union["LaneGroup", int, None] = None
  amount: int = 0

@dataclass(eq=False)
class LaneGroup:
  """Four UOps, lane k the value of byte k, computed as one word. A root is a word that is loaded (`expr` None; `root`
  the VectorAccess, or the ByteRun and the word's index in it); otherwise `expr` computes it from other groups.
  `bound`: the largest value any lane can hold. `at`: the program position of its first lane (its word is written
  there: every group it reads is written by then)."""
  lanes: tuple[UOp, ...]
  bound: int
  at: int
  expr: Optional[WordExpr] = None
  root: Optional[tuple] = None
  operands: list["LaneGroup"] = field(default_factory=list)

@dataclass
class FloatExit:
  """A float32 CAST whose value is lane `lane` of `group` (read as int8 where `signed`) plus `offset` (an int8
  constant added before it). With `select` (condition, a, b), an ADD of that cast and WHERE(condition, a, b) of two
  small integral float constants, which only it reads (Q5_0's fifth bit: 0 or −16): the same value, the constant
  folded into the exit's subtraction (one add fewer)."""
  group: LaneGroup
  lane: int
  offset: int
  signed: bool = False
  select: Optional[tuple[UOp, float, float]] = None

@dataclass
class ByteLanes:
  groups: list[LaneGroup]              # in the order of their positions (operands before their users)
  member: dict[UOp, tuple[LaneGroup, int]]   # a lane UOp of a computed group → (group, lane)
  exits: dict[UOp, FloatExit]

def evaluate(expr: WordExpr, words: dict[int, int]) -> int:
  """The word an expression computes, from its operand groups' words (keyed by id of the group): the C it renders to,
  in Python (for the tests)."""
  def value(x) -> int:
    if isinstance(x, WordExpr): return evaluate(x, words)
    return words[id(x)] if isinstance(x, LaneGroup) else x
  left = value(expr.left)
  if expr.op == "same": return left
  if expr.op == "shl": return (left << expr.amount) & WORD_MASK
  if expr.op == "shr": return left >> expr.amount
  right = value(expr.right)
  if expr.op == "and": return left & right
  if expr.op == "or": return left | right
  if expr.op == "xor": return left ^ right
  if expr.op == "add": return (left + right) & WORD_MASK
  if expr.op == "mul": return (left * right) & WORD_MASK
  raise ValueError(f"unknown word op {expr.op}")

def _integral(u: UOp) -> bool: return u.dtype.is_int or u.dtype.is_bool

def _constant(u: UOp, memo: dict[UOp, Optional[int]]) -> Optional[int]:
  """u's value where it depends on integer constants only (an unrolled index's arithmetic, as the linearizer leaves
  it), else None."""
  if u in memo: return memo[u]
  value: Optional[int] = None
  if u.op is Ops.CONST and _integral(u) and not isinstance(u.arg, float): value = int(u.arg)
  elif (u.op in ALU or u.op is Ops.CAST) and u.src and _integral(u) and all(_integral(s) for s in u.src):
    operands = [_constant(s, memo) for s in u.src]
    if all(v is not None for v in operands):
      value = int(truncate_to(operands[0], u.dtype) if u.op is Ops.CAST else exec_alu(u.op, u.dtype, tuple(operands)))
  memo[u] = value
  return value

def _power_of_two(value: int) -> Optional[int]:
  return value.bit_length() - 1 if value > 0 and value & (value - 1) == 0 else None

def _bits_below(bound: int) -> int:
  """The smallest all-ones value at least `bound` (an upper bound of an OR or XOR of values up to these)."""
  return (1 << bound.bit_length()) - 1

def _word_op(u: UOp, operands: list, bounds: list[int]) -> Optional[tuple[WordExpr, int]]:
  """u (a uint8 op of lanes) as one op of words, and its lanes' bound; None where no word op computes it exactly.
  `operands`: per source a LaneGroup or a constant int; `bounds`: each operand's bound."""
  op = u.op
  if op is Ops.CAST: return (WordExpr("same", operands[0]), bounds[0]) if u.src[0].dtype == dtypes.uint8 else None
  if op is Ops.WHERE:
    if isinstance(operands[0], LaneGroup): return None
    chosen = 1 if operands[0] else 2
    if isinstance(operands[chosen], LaneGroup): return WordExpr("same", operands[chosen]), bounds[chosen]
    return None
  if len(operands) != 2: return None
  left, right = operands
  if not isinstance(left, LaneGroup):   # a constant on the left of a commutative op: swap
    if op not in (Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR) or not isinstance(right, LaneGroup): return None
    left, right, bounds = right, left, bounds[::-1]
  bound = bounds[0]
  if isinstance(right, LaneGroup):
    if op is Ops.AND: return WordExpr("and", left, right), min(bound, bounds[1])
    if op is Ops.OR: return WordExpr("or", left, right), _bits_below(max(bound, bounds[1]))
    if op is Ops.XOR: return WordExpr("xor", left, right), _bits_below(max(bound, bounds[1]))
    if op is Ops.ADD and bound + bounds[1] <= BYTE_MAX: return WordExpr("add", left, right), bound + bounds[1]
    return None
  c = right & BYTE_MAX
  if (op in (Ops.ADD, Ops.OR, Ops.XOR) and c == 0) or (op is Ops.AND and c == BYTE_MAX):   # the lanes themselves
    return WordExpr("same", left), bound
  if op is Ops.AND: return WordExpr("and", left, repeated(c)), min(bound, c)
  if op is Ops.OR: return WordExpr("or", left, repeated(c)), _bits_below(max(bound, c))
  if op is Ops.XOR: return WordExpr("xor", left, repeated(c)), _bits_below(max(bound, c))
  if op is Ops.ADD and bound + c <= BYTE_MAX: return WordExpr("add", left, repeated(c)), bound + c
  if op in (Ops.MUL, Ops.SHL):
    shift = _power_of_two(c) if op is Ops.MUL else (right if 0 <= right < BYTE_BITS else None)
    if op is Ops.MUL and c == 0: return WordExpr("and", left, 0), 0
    if shift == 0: return WordExpr("same", left), bound
    if shift is not None:
      kept = (BYTE_MAX << shift) & BYTE_MAX
      if bound << shift <= BYTE_MAX: return WordExpr("shl", left, amount=shift), bound << shift
      return WordExpr("and", WordExpr("shl", left, amount=shift), repeated(kept)), kept
    if op is Ops.MUL and bound * c <= BYTE_MAX: return WordExpr("mul", left, c), bound * c
    return None
  if op in (Ops.IDIV, Ops.SHR):
    shift = _power_of_two(c) if op is Ops.IDIV else (right if 0 <= right < BYTE_BITS else None)
    if shift is None: return None
    if shift == 0: return WordExpr("same", left), bound
    return WordExpr("and", WordExpr("shr", left, amount=shift), repeated(BYTE_MAX >> shift)), bound >> shift
  if op is Ops.MOD and (shift := _power_of_two(c)) is not None:
    return WordExpr("and", left, repeated(c - 1)), min(bound, c - 1)
  return None

def _word_roots(uops: list[UOp], vectors: dict[int, VectorAccess], runs: dict[int, ByteRun]) -> dict[UOp, tuple]:
  """Each uint8 LOAD that is byte k of a loaded word → (the word's key, k): the lanes of a uchar4 vector load, and the
  bytes of a byte run's whole aligned words (4-byte or wider pieces, or funnel-shifted words)."""
  out: dict[UOp, tuple] = {}
  for pos, access in vectors.items():
    if access.vector.lanes == LANES and uops[pos].dtype == dtypes.uint8:
      out[uops[pos]] = (("vector", id(access)), access.positions.index(pos))
  for pos, run in runs.items():
    index = run.positions.index(pos)
    for piece in byte_run_pieces(len(run.positions), run.alignment):
      if piece.offset <= index < piece.offset + piece.nbytes and (piece.funnel or piece.nbytes >= WORD_BYTES):
        out[uops[pos]] = (("run", id(run), index // WORD_BYTES), index % WORD_BYTES)
  return out

def byte_lanes(uops: list[UOp], vectors: dict[int, VectorAccess], runs: dict[int, ByteRun]) -> ByteLanes:
  """The lane groups of a kernel and its float casts of lanes (the module docstring). A group is kept only where all
  four lanes exist, each once, in one loop body, and every group it reads is kept."""
  scopes = scope_ids(uops)
  roots = _word_roots(uops, vectors, runs)
  constants: dict[UOp, Optional[int]] = {}
  position = {u: pos for pos, u in enumerate(uops)}
  # each uint8 value derived from a loaded word → (a structural key of its computation, its lane)
  keyed: dict[UOp, tuple[tuple, int]] = {}
  by_key: dict[tuple, dict[int, list[UOp]]] = {}
  for u in uops:
    if u.dtype != dtypes.uint8: continue
    if u in roots: key, lane = roots[u]
    elif u.op in ALU or u.op is Ops.CAST:
      lanes, parts = set(), []
      for s in u.src:
        if s in keyed:
          lanes.add(keyed[s][1])
          parts.append(("lane", keyed[s][0]))
        elif (c := _constant(s, constants)) is not None: parts.append(("const", c))
        else: break
      else:
        if len(lanes) != 1: continue
        key, lane = (u.op, u.dtype, u.arg, tuple(parts)), lanes.pop()
      if len(parts) != len(u.src) or not any(p[0] == "lane" for p in parts): continue
    else: continue
    keyed[u] = (key, lane)
    by_key.setdefault(key, {}).setdefault(lane, []).append(u)
  groups: dict[tuple, LaneGroup] = {}
  for key, by_lane in sorted(by_key.items(), key=lambda kv: min(position[u] for us in kv[1].values() for u in us)):
    if sorted(by_lane) != list(range(LANES)) or any(len(us) != 1 for us in by_lane.values()): continue
    lanes = tuple(by_lane[k][0] for k in range(LANES))
    if len({scopes[position[u]] for u in lanes}) != 1: continue
    at = min(position[u] for u in lanes)
    if lanes[0] in roots:
      groups[key] = LaneGroup(lanes, BYTE_MAX, at, root=key)
      continue
    operands: list = []
    bounds: list[int] = []
    for part in key[3]:
      if part[0] == "lane":
        if part[1] not in groups: break
        operands.append(groups[part[1]])
        bounds.append(groups[part[1]].bound)
      else:
        operands.append(part[1])
        bounds.append(part[1] & BYTE_MAX)
    else:
      if (made := _word_op(lanes[0], operands, bounds)) is not None:
        expr, bound = made
        groups[key] = LaneGroup(lanes, bound, at, expr, operands=[o for o in operands if isinstance(o, LaneGroup)])
  member = {u: (g, k) for g in groups.values() if g.expr is not None for k, u in enumerate(g.lanes)}
  lane_of = {u: (g, k) for g in groups.values() for k, u in enumerate(g.lanes)}
  exits: dict[UOp, FloatExit] = {}
  for u in uops:
    if u.op is not Ops.CAST or u.dtype != dtypes.float32: continue
    if (found := _float_exit(u.src[0], lane_of, constants)) is not None: exits[u] = FloatExit(*found)
  users: dict[UOp, int] = {}
  for u in uops:
    for s in u.src: users[s] = users.get(s, 0) + 1
  for u in uops:   # an exit plus a select of two constants, which only this add reads
    if u.op is not Ops.ADD or u.dtype != dtypes.float32: continue
    for cast, select in (u.src, u.src[::-1]):
      if cast in exits and users.get(cast) == 1 and users.get(select) == 1 and (fold := _select(select)) is not None:
        exit_ = exits[cast]
        exits[u] = FloatExit(exit_.group, exit_.lane, exit_.offset, exit_.signed, fold)
        break
  return ByteLanes(sorted(groups.values(), key=lambda g: g.at), member, exits)

# the largest |constant| a folded select may add: the exit's bias stays an integer float32 represents exactly
SELECT_CONSTANT_MAX = 1 << 16

def _select(u: UOp) -> Optional[tuple[UOp, float, float]]:
  """(condition, a, b) of WHERE(condition, a, b) over two integral float32 constants small enough that 2^23 plus or
  minus them stays exact, else None."""
  if u.op is not Ops.WHERE or u.dtype != dtypes.float32: return None
  condition, a, b = u.src
  if a.op is not Ops.CONST or b.op is not Ops.CONST: return None
  if not all(float(v.arg).is_integer() and abs(v.arg) <= SELECT_CONSTANT_MAX for v in (a, b)): return None
  return condition, float(a.arg), float(b.arg)

def _float_exit(x: UOp, lane_of: dict, constants: dict) -> Optional[tuple[LaneGroup, int, int, bool]]:
  """(group, lane, offset, signed) where x, converted to float32, is a lane plus an int8 constant exactly: the lane
  itself, the lane as int8 (a cast or a bitcast: `signed` where the lane's bound passes 127, the byte then read as
  two's complement), or that plus a constant that wraps no value."""
  if x in lane_of: return (*lane_of[x], 0, False)
  offset = 0
  if x.op is Ops.ADD and x.dtype == dtypes.int8:
    values = [_constant(s, constants) for s in x.src]
    if sorted(v is None for v in values) != [False, True]: return None
    offset = next(v for v in values if v is not None)
    x = next(s for s, v in zip(x.src, values) if v is None)
  if x.op in (Ops.CAST, Ops.BITCAST) and x.dtype == dtypes.int8 and x.src[0] in lane_of:
    group, lane = lane_of[x.src[0]]
    signed = group.bound > INT8_MAX
    low, high = (INT8_MIN, INT8_MAX) if signed else (0, group.bound)
    if INT8_MIN <= low + offset and high + offset <= INT8_MAX: return group, lane, offset, signed
  return None
