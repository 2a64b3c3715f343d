"""Tests for the OptOps of tgrad/codegen/opts.py on the LLVM (CPU) device: every op LLVM supports, applied to
elementwise, broadcast, reduce, matmul, padded and odd-sized kernels, gives numpy's result; a seeded fuzzer applies
random legal opt sequences to random small kernels; illegal opts raise KernelOptError and leave the kernel unchanged.
Kernels are built at the LazyBuffer level, scheduled, and run on fresh output buffers.
"""
import random
from dataclasses import dataclass
from typing import Callable
import numpy as np
import pytest
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import compile_kernel, realize
from tgrad.schedule import create_schedule

DEVICE = "LLVM"
FUZZ_CASES = 240          # random (kernel, opt sequence) pairs
FUZZ_MAX_OPTS = 4         # legal opts applied per fuzz case
FUZZ_TRIES_PER_OPT = 12   # random opts tried to find each legal one
RTOL = ATOL = 1e-4        # float32 sums reassociated by UNROLL/UPCAST

@dataclass
class Case:
  """One kernel: its AST, the realized input buffers in parameter order, and numpy's answer."""
  ast: object
  inputs: list
  expected: np.ndarray

def realized(array: np.ndarray) -> LazyBuffer:
  lb = LazyBuffer.from_host(array, DEVICE)
  realize(lb)
  return lb

def make_case(arrays: list[np.ndarray], build: Callable, reference: Callable) -> Case:
  lbs = [realized(a) for a in arrays]
  item = create_schedule([build(*lbs)])[-1]
  return Case(item.ast, list(item.inputs), np.asarray(reference(*arrays)))

def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  (n, k), (_, m) = a.shape, b.shape
  product = a.reshape((n, 1, k)).expand((n, m, k)).alu(Ops.MUL, b.permute((1, 0)).reshape((1, m, k)).expand((n, m, k)))
  return product.r(Ops.ADD, (2,)).reshape((n, m))

def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def kernel_cases() -> dict[str, Case]:
  x, y = rand(12, 20), rand(12, 20, seed=1)
  return {
    "elementwise": make_case([x, y], lambda a, b: a.alu(Ops.MUL, b).alu(Ops.ADD, a), lambda a, b: a * b + a),
    "broadcast": make_case([rand(16, 1), rand(1, 24, seed=1)],
                           lambda a, b: a.expand((16, 24)).alu(Ops.ADD, b.expand((16, 24))), lambda a, b: a + b),
    "reduce_rows": make_case([x], lambda a: a.r(Ops.ADD, (1,)), lambda a: a.sum(axis=1, keepdims=True)),
    "reduce_cols": make_case([x], lambda a: a.r(Ops.ADD, (0,)), lambda a: a.sum(axis=0, keepdims=True)),
    "reduce_all": make_case([x], lambda a: a.r(Ops.ADD, (0, 1)), lambda a: a.sum(keepdims=True)),
    "max_rows": make_case([x], lambda a: a.r(Ops.MAX, (1,)), lambda a: a.max(axis=1, keepdims=True)),
    "matmul": make_case([rand(16, 24), rand(24, 32, seed=1)], matmul, lambda a, b: a @ b),
    "matmul_odd": make_case([rand(7, 13), rand(13, 11, seed=1)], matmul, lambda a, b: a @ b),
    "padded_input": make_case([rand(10, 12)], lambda a: a.pad(((1, 2), (3, 0))).alu(Ops.ADD, a.pad(((1, 2), (3, 0)))),
                              lambda a: 2 * np.pad(a, ((1, 2), (3, 0)))),
    "padded_reduce": make_case([rand(9, 14)], lambda a: a.pad(((0, 0), (2, 3))).r(Ops.ADD, (1,)),
                               lambda a: a.sum(axis=1, keepdims=True)),
    "exp_sum": make_case([rand(6, 10)], lambda a: a.alu(Ops.EXP2).r(Ops.ADD, (1,)),
                         lambda a: np.exp2(a).sum(axis=1, keepdims=True)),
    "odd_elementwise": make_case([rand(7, 11, 5)], lambda a: a.alu(Ops.MUL, a), lambda a: a * a),
  }

@pytest.fixture(scope="module")
def cases() -> dict[str, Case]: return kernel_cases()

def new_kernel(case: Case) -> Kernel: return Kernel(case.ast, Device[DEVICE].renderer)

def run(kernel: Kernel, case: Case) -> np.ndarray:
  runner = compile_kernel(DEVICE, kernel)
  out = Buffer(DEVICE, case.expected.size, dtypes.float32)
  out.copyin(np.full(case.expected.size, np.nan, np.float32))   # an element the kernel forgets stays NaN
  runner([out, *case.inputs])
  return out.copyout().reshape(case.expected.shape)

def check(kernel: Kernel, case: Case) -> None:
  np.testing.assert_allclose(run(kernel, case), case.expected, rtol=RTOL, atol=ATOL,
                             err_msg=f"opts {kernel.applied_opts} on {case.expected.shape}")

def apply_all(case: Case, opts: list[Opt]) -> Kernel:
  kernel = new_kernel(case)
  for opt in opts: kernel.apply_opt(opt)
  return kernel

# every opt the LLVM device supports, as (kernel, opts) pairs that must all be legal
LEGAL = [
  ("elementwise", [Opt(OptOps.UPCAST, 0, 4)]), ("elementwise", [Opt(OptOps.UPCAST, 0, 0)]),
  ("elementwise", [Opt(OptOps.THREAD, 0, 2)]), ("elementwise", [Opt(OptOps.THREAD, 0, 3), Opt(OptOps.UPCAST, 1, 4)]),
  ("elementwise", [Opt(OptOps.PADTO, 0, 32)]), ("elementwise", [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.UPCAST, 0, 16)]),
  ("elementwise", [Opt(OptOps.NOLOCALS)]),
  ("broadcast", [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4)]), ("broadcast", [Opt(OptOps.SWAP, 0, 1)]),
  ("broadcast", [Opt(OptOps.THREAD, 1, 2), Opt(OptOps.SWAP, 1, 2)]),
  ("reduce_rows", [Opt(OptOps.UNROLL, 0, 4)]), ("reduce_rows", [Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UPCAST, 0, 3)]),
  ("reduce_rows", [Opt(OptOps.PADTO, 1, 16)]), ("reduce_rows", [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UNROLL, 0, 8)]),
  ("reduce_rows", [Opt(OptOps.THREAD, 0, 2), Opt(OptOps.UNROLL, 0, 5)]),
  ("reduce_cols", [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 3)]), ("reduce_cols", [Opt(OptOps.PADTO, 0, 8)]),
  ("reduce_all", [Opt(OptOps.UNROLL, 0, 16)]), ("reduce_all", [Opt(OptOps.PADTO, 0, 256), Opt(OptOps.UNROLL, 0, 4)]),
  ("max_rows", [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 0, 2)]), ("max_rows", [Opt(OptOps.PADTO, 0, 8)]),
  ("matmul", [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.THREAD, 0, 2)]),
  ("matmul", [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.SWAP, 0, 1)]),
  ("matmul", [Opt(OptOps.PADTO, 2, 32), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UPCAST, 1, 4)]),
  ("matmul_odd", [Opt(OptOps.PADTO, 1, 4), Opt(OptOps.UPCAST, 1, 4)]),
  ("matmul_odd", [Opt(OptOps.PADTO, 2, 16), Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.PADTO, 0, 8)]),
  ("matmul_odd", [Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UPCAST, 0, 7)]),
  ("padded_input", [Opt(OptOps.PADTO, 1, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 13)]),
  ("padded_reduce", [Opt(OptOps.PADTO, 1, 8), Opt(OptOps.UNROLL, 0, 8)]),
  ("padded_reduce", [Opt(OptOps.UNROLL, 0, 19), Opt(OptOps.PADTO, 0, 4)]),
  ("exp_sum", [Opt(OptOps.UNROLL, 0, 5), Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4)]),
  ("odd_elementwise", [Opt(OptOps.UPCAST, 0, 5), Opt(OptOps.THREAD, 0, 7)]),
  ("odd_elementwise", [Opt(OptOps.PADTO, 0, 16), Opt(OptOps.UPCAST, 0, 8)]),
]

@pytest.mark.parametrize("name,opts", LEGAL, ids=[f"{n}-{'-'.join(o.op.name for o in opts)}" for n, opts in LEGAL])
def test_legal_opts_match_numpy(cases, name, opts):
  case = cases[name]
  kernel = apply_all(case, opts)
  assert kernel.applied_opts == opts
  check(kernel, case)

def test_padto_masks_the_padding(cases):
  case = cases["matmul_odd"]   # 7x11 output, 13-long reduce
  kernel = apply_all(case, [Opt(OptOps.PADTO, 1, 8), Opt(OptOps.PADTO, 2, 16)])
  assert kernel.full_shape == (7, 16, 16) and kernel.output_shape == (7, 16, 1)
  check(kernel, case)
  def guarded_stores(k: Kernel) -> int: return sum(u.op is Ops.STORE and len(u.src) == 4 for u in linearize(k))
  assert guarded_stores(kernel) == 1 and guarded_stores(new_kernel(case)) == 0   # padded columns are not stored

def kernel_state(kernel: Kernel) -> tuple:
  return (list(kernel.sts), list(kernel.applied_opts), kernel.local_dims, kernel.group_for_reduces, kernel.upcasted,
          kernel.threads, kernel.dont_use_locals, kernel.full_shape)

# (kernel, opts applied first, the illegal opt)
ILLEGAL = [
  ("elementwise", [], Opt(OptOps.LOCAL, 0, 4)),                 # LLVM has no local threads
  ("reduce_rows", [], Opt(OptOps.GROUP, 0, 4)),                 # nor shared memory
  ("reduce_rows", [], Opt(OptOps.GROUPTOP, 0, 4)),
  ("matmul", [], Opt(OptOps.TC, 0, 0)),
  ("matmul", [], Opt(OptOps.SMEM, 0, 0)),
  ("elementwise", [], Opt(OptOps.UPCAST, 0, 7)),                # 7 doesn't divide 240
  ("elementwise", [], Opt(OptOps.UPCAST, 5, 2)),                # no axis 5
  ("elementwise", [], Opt(OptOps.UPCAST, None, 2)),
  ("elementwise", [], Opt(OptOps.UPCAST, 0, 1)),                # amount must be > 1
  ("elementwise", [], Opt(OptOps.UPCAST, 0, -2)),
  ("reduce_rows", [], Opt(OptOps.UPCAST, 1, 4)),                # UPCAST of a reduce axis
  ("elementwise", [], Opt(OptOps.UNROLL, 0, 4)),                # no reduce axis to unroll
  ("reduce_rows", [], Opt(OptOps.UNROLL, -1, 4)),               # UNROLL of the output axis
  ("matmul", [Opt(OptOps.UPCAST, 1, 32), Opt(OptOps.UNROLL, 0, 8)], Opt(OptOps.UPCAST, 0, 4)),  # over MAX_UPCAST
  ("matmul", [Opt(OptOps.UPCAST, 1, 32)], Opt(OptOps.UNROLL, 0, 24)),
  ("elementwise", [Opt(OptOps.THREAD, 0, 2)], Opt(OptOps.THREAD, 1, 2)),  # one THREAD
  ("elementwise", [Opt(OptOps.THREAD, 0, 2)], Opt(OptOps.UPCAST, 0, 2)),  # the THREAD axis can't change
  ("broadcast", [Opt(OptOps.THREAD, 0, 2)], Opt(OptOps.SWAP, 0, 1)),      # ... or move
  ("elementwise", [Opt(OptOps.THREAD, 0, 3)], Opt(OptOps.PADTO, 0, 4)),
  ("broadcast", [], Opt(OptOps.SWAP, 1, 0)),                     # SWAP needs axis < other
  ("broadcast", [], Opt(OptOps.SWAP, 0, 2)),                     # ... two global axes
  ("reduce_rows", [], Opt(OptOps.SWAP, 0, 1)),
  ("elementwise", [], Opt(OptOps.PADTO, 0, 16)),                 # 240 is already a multiple of 16
  ("reduce_rows", [], Opt(OptOps.PADTO, 0, 32)),                 # 12 → 32 more than doubles the axis
  ("max_rows", [], Opt(OptOps.PADTO, 1, 16)),                    # padding a MAX reduce changes it
  ("exp_sum", [], Opt(OptOps.PADTO, 1, 16)),                     # exp2(0) = 1 would be summed
  ("reduce_rows", [Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.PADTO, 2, 8)),  # an upcast axis
  ("elementwise", [Opt(OptOps.NOLOCALS)], Opt(OptOps.NOLOCALS)),
]

@pytest.mark.parametrize("name,before,opt", ILLEGAL,
                         ids=[f"{n}-{o.op.name}-{i}" for i, (n, _, o) in enumerate(ILLEGAL)])
def test_illegal_opts_raise_and_leave_the_kernel_unchanged(cases, name, before, opt):
  case = cases[name]
  kernel = apply_all(case, before)
  state = kernel_state(kernel)
  with pytest.raises(KernelOptError):
    kernel.apply_opt(opt)
  assert kernel_state(kernel) == state
  check(kernel, case)   # still a working kernel

# ---- seeded fuzzer: random small kernels, random legal opt sequences

def random_case(rng: random.Random) -> Case:
  """A random small kernel: elementwise, broadcast, reduce over random axes, or matmul, with odd sizes."""
  seed = rng.randrange(1 << 30)
  kind = rng.choice(["elementwise", "broadcast", "reduce", "matmul", "padded"])
  dims = [rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17]) for _ in range(rng.randint(1, 3))]
  x = rand(*dims, seed=seed)
  if kind == "elementwise": return make_case([x], lambda a: a.alu(Ops.MUL, a).alu(Ops.ADD, a), lambda a: a * a + a)
  if kind == "broadcast":
    row = rand(*dims[:-1], 1, seed=seed + 1)
    shape = tuple(dims)
    return make_case([x, row], lambda a, b: a.alu(Ops.ADD, b.expand(shape)), lambda a, b: a + b)
  if kind == "reduce":
    axes = tuple(sorted(rng.sample(range(len(dims)), rng.randint(1, len(dims)))))
    op = rng.choice([Ops.ADD, Ops.MAX])
    numpy_reduce = np.sum if op is Ops.ADD else np.max
    return make_case([x], lambda a: a.r(op, axes), lambda a: numpy_reduce(a, axis=axes, keepdims=True))
  if kind == "padded":
    padding = tuple((rng.randint(0, 2), rng.randint(0, 3)) for _ in dims)
    return make_case([x], lambda a: a.pad(padding).r(Ops.ADD, (len(dims) - 1,)),
                     lambda a: np.pad(a, padding).sum(axis=len(dims) - 1, keepdims=True))
  n, k, m = (rng.choice([1, 3, 4, 5, 8, 12, 16]) for _ in range(3))
  return make_case([rand(n, k, seed=seed), rand(k, m, seed=seed + 1)], matmul, lambda a, b: a @ b)

def random_opt(rng: random.Random, kernel: Kernel) -> Opt:
  op = rng.choice([OptOps.UPCAST, OptOps.UPCAST, OptOps.UNROLL, OptOps.UNROLL, OptOps.THREAD, OptOps.PADTO, OptOps.SWAP,
                   OptOps.NOLOCALS])
  if op is OptOps.NOLOCALS: return Opt(op)
  axis = rng.randrange(0, kernel.shape_len + 1)
  if op is OptOps.SWAP: return Opt(op, axis, rng.randrange(0, kernel.shape_len + 1))
  return Opt(op, axis, rng.choice([0, 2, 2, 3, 4, 5, 8, 16]))

def test_fuzz_random_opt_sequences():
  rng = random.Random(1234)
  applied_ops = set()
  for case_number in range(FUZZ_CASES):
    case = random_case(rng)
    kernel = new_kernel(case)
    for _ in range(FUZZ_MAX_OPTS * FUZZ_TRIES_PER_OPT):
      if len(kernel.applied_opts) == FUZZ_MAX_OPTS: break
      opt = random_opt(rng, kernel)
      state = kernel_state(kernel)
      try: kernel.apply_opt(opt)
      except KernelOptError:
        assert kernel_state(kernel) == state, f"case {case_number}: failed {opt} changed the kernel"
        continue
      applied_ops.add(opt.op)
    check(kernel, case)
  assert applied_ops == {OptOps.UPCAST, OptOps.UNROLL, OptOps.THREAD, OptOps.PADTO, OptOps.SWAP, OptOps.NOLOCALS}
