"""LLVM IR renderer: linear UOps → the text of an LLVM module with one function (built with llvmlite.ir).

The function is `void name(ptr noalias %buf0, ..., i64 %var0, ..., i32 %core)` (one i64 per DEFINE_VAR, sorted
by name: a symbolic size's value at launch, or a scalar parameter's bits, reinterpreted in the entry block as its
float32/float64: tgrad/scalars.py): RANGE/ENDRANGE become counted loops with phis,
DEFINE_ACC an entry-block alloca (promoted to registers by the optimizer), DEFINE_LOCAL (a thread's scratch array)
an entry-block array alloca, SPECIAL "core" the thread index the
runtime passes. Index math (dtypes.index) is i64, the pointer width, used by loads and stores with no sign extension
(LLVM 22's loop vectorizer miscompiled i32 index math under a sext: a load at t*16 + j%16 was vectorized as t*16 + j),
and exact for any buffer the host can hold. bool lives as i1 in registers and i8 in memory; bfloat16 lives as i16 in
memory and as a float in registers, rounded to bfloat16 after every op, so results match a bfloat16 device bit for bit.
"""
from __future__ import annotations
import functools
import llvmlite.binding as llvm
import llvmlite.ir as ir
from tgrad.dtype import DType, dtypes
from tgrad.ops import ALU, UOp, Ops
from tgrad.codegen.renderer import Renderer

# Lets the loop vectorizer reorder a single float accumulation (a sum over a long axis), as numpy's pairwise sum
# does. With several accumulators (an upcast output tile, e.g. matmul) the tile itself is the vector: reordering the
# reduce loop would only add horizontal sums. Not "nsz": it let LLVM drop the accumulator's +0.0 start, so a sum of
# -0.0s was -0.0 (numpy and torch: +0.0, and x // sum then gave -inf, not inf); the vectorizer needs only reassoc.
REDUCE_FAST_MATH = ("reassoc",)
# The terms of an unrolled reduce axis, summed before they reach the accumulator (reorderable_summands), may also
# ignore the sign of zero: the SLP vectorizer reduces such a chain as one vector only under nsz. Their sum is then
# added to the accumulator, which starts at +0.0 and so is never -0.0: +0.0 + (-0.0) = +0.0, the sign never shows.
SUMMAND_FAST_MATH = ("reassoc", "nsz")
FUSE_MULTIPLY_ADD = ("contract",)   # a*b+c may become one fma: one rounding instead of two, twice the throughput
# A max reduce's update may ignore the sign of zero: x86 then runs llvm.maximum as vmaxps and a NaN test of the
# accumulator (three instructions a vector, the load folded) instead of five with the signed-zero fixup. NaN still
# propagates; which zero a row of -0.0 and +0.0 gives is left open, as numpy's and torch's max leave it (each gives
# either, by order and length). Measured (2-core Zen 4, 2048² float32 row maxes, the kernel alone): 85 → 125 GB/s.
MAX_REDUCE_FAST_MATH = ("nsz",)
SCRATCH_ALIGNMENT = 64   # bytes: a scratch array starts on a cache line (aligned vector loads)
_INTRINSICS = {Ops.EXP2: "llvm.exp2", Ops.LOG2: "llvm.log2", Ops.SIN: "llvm.sin", Ops.SQRT: "llvm.sqrt",
               Ops.TRUNC: "llvm.trunc"}
# TANH has no LLVM intrinsic here: it calls the C library's tanhf/tanh, which the in-process JIT resolves from the
# Python process's own libm (a call: the loop around it does not vectorize)
_LIBM_TANH = {dtypes.float32: "tanhf", dtypes.float64: "tanh"}
_I1, _I8, _I16, _I32, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
# Ops that may come between two masked stores without ending their shared branch (they compute registers only): a
# run of masked stores with one mask (a row of an output tile whose rows are padded) is one branch around all of them,
# so the SLP vectorizer sees the row's stores side by side. One branch per store hid them from it, and it vectorized
# a 4×16 matmul tile across its rows instead (shuffles, half the FMAs per step: a symbolic-row matmul ran 4× slower).
_REGISTER_OPS = ALU | {Ops.CONST, Ops.CAST, Ops.BITCAST, Ops.REDUCE}

@functools.cache
def register_type(dt: DType) -> ir.Type:
  if dt.is_bool: return _I1
  if dt.is_int: return ir.IntType(dt.bits)
  return {dtypes.float16: ir.HalfType(), dtypes.bfloat16: ir.FloatType(), dtypes.float32: ir.FloatType(),
          dtypes.float64: ir.DoubleType()}[dt]

def memory_type(dt: DType) -> ir.Type:
  if dt.is_bool: return _I8
  if dt == dtypes.bfloat16: return _I16
  return register_type(dt)

def reorderable_accumulators(uops: list[UOp]) -> set:
  """The accumulators whose updates may be reordered (REDUCE_FAST_MATH): each one that is the only accumulator
  updated in its loop (the innermost loop around its ASSIGN) when that loop defines no accumulator of its own. A
  register tile's accumulators share a loop (the tile itself is the vector); an outer one (a blocked sum's Kahan
  total and compensation) never is: reordering would cancel the compensation. A row kernel's passes are loops one
  after the other, each with its own accumulator: each may be reordered."""
  loop_of: dict[int, int] = {}   # position of an ASSIGN → position of the innermost RANGE open there
  open_loops: list[int] = []
  for position, u in enumerate(uops):
    if u.op is Ops.RANGE: open_loops.append(position)
    elif u.op is Ops.ENDRANGE: open_loops.pop()
    elif u.op is Ops.ASSIGN and open_loops: loop_of[position] = open_loops[-1]
  body: dict[int, tuple[set, bool]] = {}   # loop position → (accumulators assigned in it, whether it defines one)
  for loop in set(loop_of.values()):
    depth, assigned, defines = 0, set(), False
    for u in uops[loop:]:
      if u.op is Ops.RANGE: depth += 1
      elif u.op is Ops.ENDRANGE:
        depth -= 1
        if depth == 0: break
      elif u.op is Ops.ASSIGN: assigned.add(u.src[0].arg)
      elif u.op is Ops.DEFINE_ACC: defines = True
    body[loop] = (assigned, defines)
  return {uops[position].src[0].arg for position, loop in loop_of.items()
          if body[loop][0] == {uops[position].src[0].arg} and not body[loop][1]}

def reorderable_summands(uops: list[UOp], reorderable: set) -> set:
  """The float ADDs that only sum terms into a reorderable accumulator's update (an unrolled reduce axis's chain
  acc + ((p0 + p1) + p2 ...)): each used once, by the update or by another such ADD. They take SUMMAND_FAST_MATH,
  so the whole sum may be reordered (one reduce, as before, in a different order) and the SLP vectorizer turns an
  unrolled chain into vector products and one horizontal sum per iteration of the loop around it. That loop is not
  loop-vectorized (`unvectorized_loops`): across iterations its loads are strided (a packed weight's blocks), and LLVM
  gathered them four at a time instead."""
  uses: dict[UOp, int] = {}
  for u in uops:
    if u.op is Ops.REDUCE: continue   # it names the summed value but reads the accumulator
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  summands: set = set()
  pending = [u for u in uops if u.op is Ops.ADD and u.dtype.is_float and u.src[0].op is Ops.DEFINE_ACC
             and u.src[0].arg in reorderable]
  while pending:
    for s in pending.pop().src:
      if s.op is Ops.ADD and s.dtype.is_float and uses.get(s) == 1 and s not in summands:
        summands.add(s)
        pending.append(s)
  return summands

def unvectorized_loops(uops: list[UOp], summands: set) -> set:
  """The RANGEs around an update of an accumulator by a chain of summands: an unrolled reduce the SLP vectorizer
  handles within one iteration (see reorderable_summands). Every loop of the nest, not only the innermost: LLVM
  unrolls a short inner loop whole and then vectorized the one outside it (a matvec's rows, gathered). Except, where
  the accumulator sums over two loops or more, the innermost: the values of a packed super-block's sub-blocks, whose
  loads are contiguous along it (heuristics.CPU_VALUE_LOOP_MIN), for the loop vectorizer."""
  loops, open_loops = set(), []
  depth_at_acc: dict[UOp, int] = {}   # loops open where each accumulator is defined
  for u in uops:
    if u.op is Ops.RANGE: open_loops.append(u)
    elif u.op is Ops.ENDRANGE: open_loops.pop()
    elif u.op is Ops.DEFINE_ACC: depth_at_acc[u] = len(open_loops)
    elif u.op is Ops.ASSIGN and open_loops and u.src[1].op is Ops.ADD and any(s in summands for s in u.src[1].src):
      reduce_loops = len(open_loops) - depth_at_acc.get(u.src[0], len(open_loops))
      loops.update(open_loops[:-1] if reduce_loops >= 2 else open_loops)
  return loops

LOOP_SELF = "tgrad.loop.self"   # a loop ID's placeholder first operand: LLVM wants the node itself there (build())
@functools.cache
def host_simd() -> tuple[int, int]:
  """(bytes per SIMD register, SIMD registers) of the host CPU, from the features LLVM compiles for: AVX-512
  (32 registers of 64 bytes), AVX (16 of 32), else SSE (16 of 16)."""
  features = llvm.get_host_cpu_features()
  if features.get("avx512f"): return 64, 32
  if features.get("avx"): return 32, 16
  return 16, 16

class LLVMRenderer(Renderer):
  device = "LLVM"
  has_threads = True
  decompose_transcendentals = True
  def __init__(self, simd: tuple[int, int] | None = None):
    """`simd`: (bytes per SIMD register, SIMD registers) the heuristics size register tiles for; the host's if None."""
    self.vector_bytes, self.vector_registers = simd or host_simd()
  def render(self, name: str, uops: list[UOp]) -> str: return _FunctionBuilder(name, uops).build()

# A kernel that keeps a max in MAX_LANES accumulators or more (an upcast output axis: a column max keeps 128) gets its
# float maxes as a compare and a select: the SLP vectorizer packs those lanes into vectors, where it leaves
# llvm.maximum calls scalar (each expanded into a NaN and signed-zero sequence). A lone accumulator keeps llvm.maximum,
# which the loop vectorizer recognizes as a reduction (the select form it does not). NaN propagates either way; the
# select form gives the later of two zeros of opposite sign, as numpy's max does for one of the two orders. Measured
# (2-core Zen 4, 4096² float32, torch 15.4-15.9 GB/s): the column max 6.5 → 16.9 GB/s.
MAX_LANES = 4

class _FunctionBuilder:
  def __init__(self, name: str, uops: list[UOp]):
    self.uops = uops
    self.module = ir.Module(name=name)
    buffers = [u for u in uops if u.op is Ops.DEFINE_GLOBAL]
    self.variables = sorted({u for u in uops if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
    fn_type = ir.FunctionType(ir.VoidType(),
                              [ir.PointerType() for _ in buffers] + [_I64] * len(self.variables) + [_I32])
    self.fn = ir.Function(self.module, fn_type, name=name)
    for arg in self.fn.args[:len(buffers)]: arg.add_attribute("noalias")
    self.variable_args = dict(zip(self.variables, self.fn.args[len(buffers):-1]))
    self.entry = ir.IRBuilder(self.fn.append_basic_block("entry"))
    self.b = ir.IRBuilder(self.fn.append_basic_block("body"))
    self.values: dict[UOp, ir.Value] = {}
    self.accs: dict[int, ir.Value] = {}
    self.loops: dict[UOp, ir.Block] = {}
    self.reorderable = reorderable_accumulators(uops)
    self.summands = reorderable_summands(uops, self.reorderable)
    self.unvectorized = unvectorized_loops(uops, self.summands)
    self.no_vectorize: ir.MDValue | None = None
    self.masked_stores: list[tuple[ir.Value, ir.Value, ir.Value]] = []   # (mask, address, value), not yet written
    self.max_lanes = sum(1 for u in uops if u.op is Ops.ASSIGN and u.src[1].op is Ops.MAX) >= MAX_LANES

  def build(self) -> str:
    for u in self.uops:
      if self.masked_stores and not (u.op in _REGISTER_OPS or u.op is Ops.STORE and len(u.src) > 3):
        self.write_masked_stores()
      self.emit(u)
    self.write_masked_stores()
    self.b.ret_void()
    self.entry.branch(self.fn.basic_blocks[1])
    text = str(self.module)
    if self.no_vectorize is not None:   # the loop ID refers to itself, which llvmlite's metadata cannot spell
      name = self.no_vectorize.get_reference()
      text = text.replace(f'{name} = !{{ !"{LOOP_SELF}"', f"{name} = distinct !{{ {name}")
    return text

  def loop_id(self) -> ir.MDValue:
    """The metadata of a loop that the loop vectorizer leaves alone (one node for every such loop of the kernel)."""
    if self.no_vectorize is None:
      option = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.vectorize.enable"),
                                         ir.Constant(_I1, 0)])
      self.no_vectorize = self.module.add_metadata([ir.MetaDataString(self.module, LOOP_SELF), option])
    return self.no_vectorize

  def declare(self, name: str, returns: ir.Type, args: list[ir.Type]) -> ir.Function:
    """An intrinsic by its full LLVM name (llvmlite's declare_intrinsic doesn't know every overload)."""
    return self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(returns, args), name=name)

  def value(self, u: UOp) -> ir.Value:
    """u's value in its dtype's register type."""
    return self.as_type(u, register_type(u.dtype))

  def as_type(self, u: UOp, want: ir.Type) -> ir.Value:
    if u.op is Ops.CONST and isinstance(want, ir.IntType) and u.dtype.is_int: return ir.Constant(want, int(u.arg))
    if u.op is Ops.DEFINE_ACC: return self.b.load(self.accs[u.arg], typ=register_type(u.dtype))
    v = self.values[u]
    if v.type == want or not (isinstance(want, ir.IntType) and isinstance(v.type, ir.IntType)): return v
    return self.b.trunc(v, want) if v.type.width > want.width else self.b.sext(v, want)

  def parameter(self, u: UOp) -> ir.Value:
    """A DEFINE_VAR's value from its i64 argument: a symbolic size's or an int scalar's as it is, a float scalar
    parameter's (tgrad/scalars.py) reinterpreted from its bits (a float32's in the low 32)."""
    arg = self.variable_args[u]
    if u.dtype == dtypes.float64: return self.entry.bitcast(arg, ir.DoubleType())
    if u.dtype == dtypes.float32: return self.entry.bitcast(self.entry.trunc(arg, _I32), ir.FloatType())
    return arg

  def emit(self, u: UOp) -> None:
    b = self.b
    if u.op is Ops.DEFINE_GLOBAL: self.values[u] = self.fn.args[u.arg]
    elif u.op is Ops.DEFINE_LOCAL:   # a thread's scratch array (codegen/scratch.py), on its stack
      self.values[u] = self.entry.alloca(memory_type(u.dtype), size=ir.Constant(_I64, u.arg[1]))
      self.values[u].align = SCRATCH_ALIGNMENT
    elif u.op is Ops.DEFINE_VAR: self.values[u] = self.parameter(u)
    elif u.op is Ops.SPECIAL: self.values[u] = b.sext(self.fn.args[-1], _I64)
    elif u.op is Ops.CONST: self.values[u] = const(u.dtype, u.arg)
    elif u.op is Ops.DEFINE_ACC:
      slot = self.entry.alloca(register_type(u.dtype))
      self.accs[u.arg] = slot
      b.store(self.value(u.src[0]), slot)
    elif u.op is Ops.ASSIGN: b.store(self.value(u.src[1]), self.accs[u.src[0].arg])
    elif u.op is Ops.REDUCE: self.values[u] = b.load(self.accs[u.arg[1]], typ=register_type(u.dtype))
    elif u.op is Ops.RANGE:
      preheader = b.block
      loop = self.fn.append_basic_block(f"loop{u.arg}")
      b.branch(loop)
      b.position_at_end(loop)
      counter = b.phi(_I64, name=f"ridx{u.arg}")
      counter.add_incoming(self.as_type(u.src[0], _I64), preheader)
      self.values[u], self.loops[u] = counter, loop
    elif u.op is Ops.ENDRANGE:
      rng = u.src[0]
      counter = self.values[rng]
      following = b.add(counter, ir.Constant(_I64, 1))
      counter.add_incoming(following, b.block)
      done = self.fn.append_basic_block(f"end{rng.arg}")
      branch = b.cbranch(b.icmp_signed("<", following, self.as_type(rng.src[1], _I64)), self.loops[rng], done)
      if rng in self.unvectorized: branch.set_metadata("llvm.loop", self.loop_id())
      b.position_at_end(done)
    elif u.op is Ops.LOAD: self.values[u] = self.load(u)
    elif u.op is Ops.STORE: self.store(u)
    elif u.op is Ops.CAST: self.values[u] = self.cast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
    elif u.op is Ops.BITCAST: self.values[u] = self.bitcast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
    else: self.values[u] = self.alu(u)

  def load(self, u: UOp) -> ir.Value:
    b = self.b
    pointer, index = self.values[u.src[0]], self.as_type(u.src[1], _I64)
    valid = self.value(u.src[2]) if len(u.src) > 2 and u.src[2].dtype == dtypes.bool else None
    if valid is not None: index = b.select(valid, index, ir.Constant(_I64, 0))
    address = b.gep(pointer, [index], inbounds=True, source_etype=memory_type(u.dtype))
    loaded = from_memory(b, b.load(address, typ=memory_type(u.dtype)), u.dtype)
    return b.select(valid, loaded, const(u.dtype, 0)) if valid is not None else loaded

  def store(self, u: UOp) -> None:
    b = self.b
    pointer, index, value = self.values[u.src[0]], self.as_type(u.src[1], _I64), self.value(u.src[2])
    dtype = u.src[2].dtype
    address = b.gep(pointer, [index], inbounds=True, source_etype=memory_type(dtype))
    if len(u.src) > 3: self.masked_stores.append((self.value(u.src[3]), address, to_memory(b, value, dtype)))
    else: b.store(to_memory(b, value, dtype), address)

  def write_masked_stores(self) -> None:
    """The masked stores held back since the last other op: one branch per mask around its stores, in their order.
    Stores of different masks may trade places: the replicas of a kernel's output each write their own position."""
    b, pending, self.masked_stores = self.b, self.masked_stores, []
    by_mask: dict[ir.Value, list[tuple[ir.Value, ir.Value]]] = {}
    for mask, address, value in pending: by_mask.setdefault(mask, []).append((address, value))
    for mask, stores in by_mask.items():
      then_block = self.fn.append_basic_block("store")
      after = self.fn.append_basic_block("stored")
      b.cbranch(mask, then_block, after)
      b.position_at_end(then_block)
      for address, value in stores: b.store(value, address)
      b.branch(after)
      b.position_at_end(after)

  def alu(self, u: UOp) -> ir.Value:
    b = self.b
    dt = u.src[-1].dtype if u.op is Ops.WHERE else u.src[0].dtype
    srcs = [self.value(s) for s in u.src]
    is_float = dt.is_float
    reduce_update = u.op in (Ops.ADD, Ops.MUL) and u.src[0].op is Ops.DEFINE_ACC and u.src[0].arg in self.reorderable
    flags = REDUCE_FAST_MATH + FUSE_MULTIPLY_ADD if reduce_update else FUSE_MULTIPLY_ADD
    if u in self.summands: flags = SUMMAND_FAST_MATH + FUSE_MULTIPLY_ADD
    if u.op in _INTRINSICS or u.op is Ops.TANH:
      compute_type = ir.FloatType() if dt == dtypes.float16 else register_type(dt)
      x = b.fpext(srcs[0], compute_type) if dt == dtypes.float16 else srcs[0]
      if u.op is Ops.TANH:
        name = _LIBM_TANH[dtypes.float64 if compute_type == ir.DoubleType() else dtypes.float32]
        out = b.call(self.declare(name, compute_type, [compute_type]), [x])
      else: out = b.call(self.module.declare_intrinsic(_INTRINSICS[u.op], [compute_type]), [x])
      out = b.fptrunc(out, register_type(dt)) if dt == dtypes.float16 else out
    elif u.op is Ops.NEG: out = b.fneg(srcs[0]) if is_float else b.neg(srcs[0])
    elif u.op is Ops.RECIP: out = b.fdiv(const(dt, 1.0), srcs[0])
    elif u.op is Ops.ADD: out = b.fadd(*srcs, flags=flags) if is_float else b.add(*srcs)
    elif u.op is Ops.MUL: out = b.fmul(*srcs, flags=flags) if is_float else b.mul(*srcs)
    elif u.op is Ops.FDIV: out = b.fdiv(*srcs)
    elif u.op is Ops.MOD and is_float: out = b.frem(*srcs)   # C fmod (a libm call on the CPU), exact
    elif u.op in (Ops.IDIV, Ops.MOD): out = self.int_division(u, dt, *srcs)
    elif u.op is Ops.MAX:
      if is_float and self.max_lanes:   # a compare and a select for NaN: the SLP vectorizer takes these lane by lane
        first = b.select(b.fcmp_unordered(">", *srcs), srcs[0], srcs[1])
        out = b.select(b.fcmp_unordered("uno", srcs[1], srcs[1]), srcs[1], first)
      elif is_float:   # llvm.maximum propagates NaN (IEEE 754-2019 maximum) and vectorizes as a reduction
        maximum = self.declare(f"llvm.maximum.{_float_name(srcs[0].type)}", srcs[0].type, [srcs[0].type] * 2)
        out = b.call(maximum, srcs, fastmath=MAX_REDUCE_FAST_MATH if u.src[0].op is Ops.DEFINE_ACC else ())
      else:
        bigger = b.icmp_unsigned(">", *srcs) if dt.is_unsigned or dt.is_bool else b.icmp_signed(">", *srcs)
        out = b.select(bigger, srcs[0], srcs[1])
    elif u.op is Ops.CMPLT:
      if is_float: out = b.fcmp_ordered("<", *srcs)
      else: out = b.icmp_unsigned("<", *srcs) if dt.is_unsigned or dt.is_bool else b.icmp_signed("<", *srcs)
    elif u.op is Ops.CMPNE: out = b.fcmp_unordered("!=", *srcs) if is_float else b.icmp_unsigned("!=", *srcs)
    elif u.op is Ops.AND: out = b.and_(*srcs)
    elif u.op is Ops.OR: out = b.or_(*srcs)
    elif u.op is Ops.XOR: out = b.xor(*srcs)
    elif u.op is Ops.SHL: out = b.shl(*srcs)
    elif u.op is Ops.SHR: out = b.lshr(*srcs) if dt.is_unsigned else b.ashr(*srcs)
    elif u.op is Ops.WHERE: out = b.select(*srcs)
    else: raise NotImplementedError(f"LLVM renderer: no rule for {u.op}")
    return round_bf16(b, out) if u.dtype == dtypes.bfloat16 else out

  def int_division(self, u: UOp, dt: DType, a: ir.Value, d: ir.Value) -> ir.Value:
    """C division/remainder. A divisor that may be 0 (or -1, which overflows INT_MIN / -1) is guarded: x/0 = 0."""
    b = self.b
    signed = not (dt.is_unsigned or dt.is_bool)
    divide = (b.sdiv if u.op is Ops.IDIV else b.srem) if signed else (b.udiv if u.op is Ops.IDIV else b.urem)
    divisor = u.src[1]
    if divisor.op is Ops.CONST and divisor.arg not in (0, -1): return divide(a, d)
    zero, one = ir.Constant(d.type, 0), ir.Constant(d.type, 1)
    unsafe = b.icmp_unsigned("==", d, zero)
    if signed: unsafe = b.or_(unsafe, b.icmp_signed("==", d, ir.Constant(d.type, -1)))
    safe_result = divide(a, b.select(unsafe, one, d))
    if not signed: return b.select(unsafe, zero, safe_result)
    minus_one_result = b.neg(a) if u.op is Ops.IDIV else zero
    return b.select(b.icmp_unsigned("==", d, zero), zero,
                    b.select(b.icmp_signed("==", d, ir.Constant(d.type, -1)), minus_one_result, safe_result))

  def cast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    b = self.b
    to = register_type(dst)
    if dst.is_bool:
      return b.fcmp_unordered("!=", x, const(src, 0)) if src.is_float else b.icmp_unsigned("!=", x, const(src, 0))
    # half goes through float: x86 without native f16 lowers f64→f16 and f16→int to libcalls that are not in the
    # process (a segfault) or that ignore the saturation (NaN → INT_MIN). f64→f32→f16 rounds twice: within 1 ulp.
    if x.type == ir.HalfType() and to != ir.FloatType(): x, src = b.fpext(x, ir.FloatType()), dtypes.float32
    if to == ir.HalfType() and x.type == ir.DoubleType(): x, src = b.fptrunc(x, ir.FloatType()), dtypes.float32
    if src.is_float and dst.is_float:
      if x.type == to: out = x
      else: out = b.fpext(x, to) if _float_bits(x.type) < _float_bits(to) else b.fptrunc(x, to)
      return round_bf16(b, out) if dst == dtypes.bfloat16 else out
    if src.is_float:   # float → int saturates (NaN → 0): never a fault, never poison
      name = f"llvm.fpto{'u' if dst.is_unsigned else 's'}i.sat.i{dst.bits}.{_float_name(x.type)}"
      return b.call(self.declare(name, to, [x.type]), [x])
    if dst.is_float:
      out = b.uitofp(x, to) if src.is_unsigned or src.is_bool else b.sitofp(x, to)
      return round_bf16(b, out) if dst == dtypes.bfloat16 else out
    if src.bits == dst.bits and not src.is_bool: return x
    if src.bits > dst.bits: return b.trunc(x, to)
    return b.zext(x, to) if src.is_unsigned or src.is_bool else b.sext(x, to)

  def bitcast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    b = self.b
    if src == dtypes.bfloat16: x, src = to_memory(b, x, src), dtypes.uint16
    if dst == dtypes.bfloat16: return from_memory(b, b.bitcast(x, _I16), dst)
    return b.bitcast(x, register_type(dst))

def _float_bits(t: ir.Type) -> int: return {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}[type(t)]
def _float_name(t: ir.Type) -> str: return {ir.HalfType: "f16", ir.FloatType: "f32", ir.DoubleType: "f64"}[type(t)]

def const(dt: DType, value) -> ir.Constant:
  t = register_type(dt)
  if dt.is_bool: return ir.Constant(t, int(bool(value)))
  if dt.is_int: return ir.Constant(t, int(value))
  return ir.Constant(t, float(value))

def from_memory(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
  if dt.is_bool: return b.icmp_unsigned("!=", x, ir.Constant(_I8, 0))
  if dt == dtypes.bfloat16: return b.bitcast(b.shl(b.zext(x, _I32), ir.Constant(_I32, 16)), ir.FloatType())
  return x

def to_memory(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
  if dt.is_bool: return b.zext(x, _I8)
  if dt == dtypes.bfloat16: return b.trunc(b.lshr(_bf16_rounded_bits(b, x), ir.Constant(_I32, 16)), _I16)
  return x

def _bf16_rounded_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
  """float32 bits rounded to the nearest bfloat16 (ties to even); NaN stays a quiet NaN."""
  bits = b.bitcast(x, _I32)
  lsb = b.and_(b.lshr(bits, ir.Constant(_I32, 16)), ir.Constant(_I32, 1))
  rounded = b.and_(b.add(bits, b.add(ir.Constant(_I32, 0x7FFF), lsb)), ir.Constant(_I32, 0xFFFF0000))
  is_nan = b.fcmp_unordered("uno", x, x)
  return b.select(is_nan, ir.Constant(_I32, 0x7FC00000), rounded)

def round_bf16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
  return b.bitcast(_bf16_rounded_bits(b, x), ir.FloatType())
