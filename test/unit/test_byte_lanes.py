"""Byte lanes (tgrad/runtime/cuda/byte_lanes.py): uint8 chains on the four bytes of a loaded word, computed on the word.

A seeded fuzz builds linear programs by hand: two uchar4 loads, the same random chain of uint8 ops (multiplies,
divisions, remainders, shifts, masks, ORs, XORs, adds, with random constants; some of them not computable on a word)
on each lane, the lanes of the two words combined, and float32 casts of lanes (directly, through an int8 cast or
bitcast, plus an int8 constant). For every group the analysis keeps, its word (byte_lanes.evaluate, the C it renders
to, in Python) must hold in byte k exactly what the lane-k UOp computes (exec_alu, op by op), for random loaded words;
every float cast it takes must equal the value of `__byte_perm` into 2^23's bits minus the bias the renderer writes.
Then the rendered packed kernels: the Q6_K and Q4_K decode rules read their quants through byte lanes (their values
are checked against float64 on the CPU-emulated CUDA in test_packed_matvec.py).
"""
import os, random, re, struct, sys
import numpy as np
import pytest
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, exec_alu, truncate_to
from tgrad.nn.quant import GGMLType
from tgrad.runtime.cuda import byte_lanes as bl
from tgrad.runtime.cuda.vectors import byte_runs, vector_groups
sys.path.insert(0, os.path.dirname(__file__))
from test_packed_matvec import cuda_source  # noqa: E402  (the decode rule's kernel for a packed projection)

SEEDS = range(60)
CHAIN_STEPS = 3
WORDS_PER_PROGRAM = 24
OPS = [Ops.MUL, Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR, Ops.ADD]

def const(value: int, dtype=dtypes.uint8) -> UOp: return UOp(Ops.CONST, dtype, (), value)

def random_step(rng: random.Random, value: UOp) -> UOp:
  op = rng.choice(OPS)
  if op in (Ops.SHL, Ops.SHR): amount = rng.randrange(8)
  elif op in (Ops.MUL, Ops.IDIV, Ops.MOD): amount = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 3, 5, 6, 0])
  else: amount = rng.randrange(256)
  if op in (Ops.IDIV, Ops.MOD) and amount == 0: amount = 1
  operand = const(amount)
  if rng.random() < 0.3 and op in (Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.ADD):   # the constant on the left
    return UOp(op, dtypes.uint8, (operand, value))
  return UOp(op, dtypes.uint8, (value, operand))

def random_program(seed: int):
  """Linear UOps: two uchar4 loads (at 4·lidx0 and 4·lidx0 + 64), on each lane of each the same random chain, the two
  chains combined and cast to float32 (one of four ways) and stored; the lanes written one after the other, in a
  random order. Returns the UOps and the loads by (word, lane)."""
  rng = random.Random(seed)
  buf, out = UOp(Ops.DEFINE_GLOBAL, dtypes.uint8, (), 1), UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  lid = UOp(Ops.SPECIAL, dtypes.index, (), ("lidx0", 8))
  chain_seeds = [rng.randrange(1 << 30) for _ in range(2)]
  combine = rng.choice([Ops.OR, Ops.ADD, Ops.AND, Ops.XOR])
  exit_kind, exit_offset = rng.randrange(5), rng.randrange(-128, 128)
  select = (float(rng.randrange(-64, 64)), float(rng.randrange(-64, 64)))
  loads = {(w, k): UOp(Ops.LOAD, dtypes.uint8, (buf, lid * 4 + (k + 64 * w))) for w in range(2) for k in range(4)}
  uops = [buf, out, lid]
  lanes = list(range(4))
  rng.shuffle(lanes)
  for k in lanes:
    chains = []
    for w in range(2):
      value, step_rng = loads[(w, k)], random.Random(chain_seeds[w])   # the same chain on every lane
      for _ in range(CHAIN_STEPS): value = random_step(step_rng, value)
      chains.append(value)
    result = UOp(combine, dtypes.uint8, tuple(chains))
    if exit_kind in (1, 2, 3):
      result = UOp(Ops.CAST if exit_kind == 1 else Ops.BITCAST, dtypes.int8, (result,))
      if exit_kind == 3: result = UOp(Ops.ADD, dtypes.int8, (result, const(exit_offset, dtypes.int8)))
    result = UOp(Ops.CAST, dtypes.float32, (result,))
    if exit_kind == 4:   # plus a select of two constants on a bit of the other word's byte (Q5_0's fifth bit)
      bit = UOp(Ops.AND, dtypes.uint8, (loads[(1, k)], const(1 << k)))
      condition = UOp(Ops.CMPNE, dtypes.bool, (bit, const(0)))
      chosen = UOp(Ops.WHERE, dtypes.float32, (condition, const(select[0], dtypes.float32),
                                                 const(select[1], dtypes.float32)))
      result = UOp(Ops.ADD, dtypes.float32, (result, chosen))
    index = lid * 4 + k
    for u in [*result.toposort(), *index.toposort()]:
      if u.op is not Ops.CONST and u not in uops: uops.append(u)
    uops.append(UOp(Ops.STORE, dtypes.void, (out, index, result)))
  return uops, loads

def evaluate_uop(u: UOp, loaded: dict[UOp, int]):
  """The value of u (exec_alu op by op), the loads' bytes given."""
  if u in loaded: return loaded[u]
  if u.op is Ops.CONST: return u.arg
  operands = [evaluate_uop(s, loaded) for s in u.src]
  if u.op is Ops.CAST: return truncate_to(operands[0], u.dtype)
  if u.op is Ops.BITCAST:
    return struct.unpack("<b", struct.pack("<B", operands[0]))[0]
  return exec_alu(u.op, u.dtype, tuple(operands))

def byte_perm_float(word: int, lane: int, offset: int, signed: bool, added: float = 0.0) -> float:
  """What the renderer's float exit computes (renderer.lane_float), from the PTX definition of prmt: byte 0 of the
  result is byte `lane` of the word, bytes 1-3 those of 0x4B000000; minus 2^23 less the offset (plus 128 if signed;
  less the selected constant `added` of a folded select), one float32 subtraction."""
  if signed: word ^= bl.SIGN_FLIP
  byte = (word >> (8 * lane)) & 0xFF
  bits = bl.FLOAT_TWO_POW_23_BITS | byte
  bias = bl.FLOAT_TWO_POW_23 - offset + (bl.SIGN_FLIP_BIAS if signed else 0) - added
  value = np.float32(struct.unpack("<f", struct.pack("<I", bits))[0]) - np.float32(bias)
  return float(value)

@pytest.mark.parametrize("seed", SEEDS)
def test_words_compute_every_lane(seed):
  uops, loads = random_program(seed)
  runs = byte_runs(uops)
  vectors = vector_groups(uops, frozenset(runs))
  found = bl.byte_lanes(uops, vectors, runs)
  rng = np.random.default_rng(seed)
  roots = [g for g in found.groups if g.root is not None]
  assert len(roots) == 2, "both uchar4 loads are words"
  for _ in range(WORDS_PER_PROGRAM):
    words_in = [int(w) for w in rng.integers(0, 1 << 32, 2, dtype=np.uint64)]
    loaded = {loads[(w, k)]: (words_in[w] >> (8 * k)) & 0xFF for w in range(2) for k in range(4)}
    words: dict[int, int] = {}
    for group in found.groups:
      if group.root is not None: words[id(group)] = words_in[0 if loads[(0, 0)] in group.lanes else 1]
      else: words[id(group)] = bl.evaluate(group.expr, words)
      for k, lane in enumerate(group.lanes):
        assert (words[id(group)] >> (8 * k)) & 0xFF == evaluate_uop(lane, loaded), (seed, group.expr, k)
        assert evaluate_uop(lane, loaded) <= group.bound
    for cast, exit_ in found.exits.items():
      want = float(np.float32(evaluate_uop(cast, loaded)))
      added = 0.0
      if exit_.select is not None:   # the renderer subtracts (bias - a) or (bias - b)
        condition, a, b = exit_.select
        added = a if evaluate_uop(condition, loaded) else b
      got = byte_perm_float(words[id(exit_.group)], exit_.lane, exit_.offset, exit_.signed, added)
      assert got == want, (seed, exit_)

def test_fuzz_programs_take_groups():
  """The fuzz is not vacuous: across the seeds, chains of several word ops and float exits of every kind are found."""
  computed, exits, signed, selects = 0, 0, 0, 0
  for seed in SEEDS:
    uops, _ = random_program(seed)
    runs = byte_runs(uops)
    found = bl.byte_lanes(uops, vector_groups(uops, frozenset(runs)), runs)
    computed += sum(g.expr is not None for g in found.groups)
    exits += len(found.exits)
    signed += sum(e.signed for e in found.exits.values())
    selects += sum(e.select is not None for e in found.exits.values())
  assert computed >= 2 * len(SEEDS) and exits >= len(SEEDS) and signed > 0 and selects > 0, \
    (computed, exits, signed, selects)

def test_carrying_add_stays_per_byte():
  """An add whose lanes may pass 255 is not a word add (a carry would reach the next byte)."""
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.uint8, (), 0)
  lid = UOp(Ops.SPECIAL, dtypes.index, (), ("lidx0", 8))
  loads = [UOp(Ops.LOAD, dtypes.uint8, (buf, lid * 4 + k)) for k in range(4)]
  uops = [buf, lid]
  for load in loads:
    low = UOp(Ops.MOD, dtypes.uint8, (load, const(16)))
    uops += [load, low, UOp(Ops.ADD, dtypes.uint8, (low, const(240))), UOp(Ops.ADD, dtypes.uint8, (load, const(1)))]
  runs = byte_runs(uops)
  found = bl.byte_lanes(uops, vector_groups(uops, frozenset(runs)), runs)
  ops = sorted(g.expr.op for g in found.groups if g.expr is not None)
  assert ops == ["add", "and"], ops   # low + 240 ≤ 255 is a word add; load + 1 may carry

@pytest.mark.parametrize("ggml_type", ["Q6_K", "Q4_K"])
def test_packed_rules_read_quants_as_byte_lanes(ggml_type):
  """The decode rule's kernel for a Q6_K / Q4_K projection converts each of its 32 quants a thread from a word
  (__byte_perm): Q4_K's from uchar4 loads, Q6_K's (210-byte blocks, unpadded here) from funnel-shifted words."""
  source = cuda_source(GGMLType[ggml_type], 640, 2048)
  assert len(re.findall(r"__byte_perm\(", source)) >= 32
