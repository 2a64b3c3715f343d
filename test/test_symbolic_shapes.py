"""Symbolic shapes (docs/symbolic.md): a bound Variable as a dimension, one compile for every value, JIT replay across
values, memory as a function of the variables. Results are compared with numpy at several values of each variable."""
import random
import numpy as np
import pytest
import sympy
from tgrad import Tensor, TinyJit, Variable, dtypes
from tgrad.ops import UOp, Ops
from tgrad.lazy import LazyBuffer
from tgrad.schedule import create_schedule
from tgrad.scalars import param_bits
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import evaluate, to_sympy
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.linearizer import linearize
from tgrad.runtime.cuda.nvrtc import nvrtc_available
import tgrad.realize as realize_module
import tgrad.schedule_cache as schedule_cache
from tgrad.helpers import prod

MAX_ROWS = 12
ROWS = Variable("rows", 1, MAX_ROWS)
VALUES = (1, 5, MAX_ROWS)

def compiles() -> int: return realize_module._kernel_counter

@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((MAX_ROWS, 8)).astype(np.float32)
  w = rng.standard_normal((8, 6)).astype(np.float32)
  return x, w, Tensor(x).realize(), Tensor(w).realize()

# ---- the Variable API

def test_bind_out_of_range_raises_naming_variable_bounds_and_value():
  with pytest.raises(ValueError, match=r"'rows'.*\[1, 12\].*13"): ROWS.bind(13)
  with pytest.raises(ValueError, match=r"'rows'.*\[1, 12\].*0"): ROWS.bind(0)
  with pytest.raises(TypeError): ROWS.bind(2.5)
  with pytest.raises(ValueError): Variable("bad name", 1, 4)
  with pytest.raises(ValueError): Variable("n", 5, 4)

def test_shape_shows_the_symbol_and_numpy_uses_the_value(data):
  x, _, tx, _ = data
  n = ROWS.bind(4)
  y = tx[:n]
  assert y.shape[0] is n and y.shape[1] == 8 and "rows" in repr(y.shape)
  np.testing.assert_array_equal(y.numpy(), x[:4])
  assert Tensor.zeros(n, 3).numpy().shape == (4, 3)
  assert Tensor.empty(n, 2).shape[0] is n
  np.testing.assert_array_equal(Tensor.full((2, n), 7.0).numpy(), np.full((2, 4), 7.0, np.float32))

def test_symbolic_bounds_must_hold_for_every_value(data):
  _, _, tx, _ = data
  wide = Variable("wide", 1, MAX_ROWS + 1).bind(3)
  with pytest.raises(IndexError, match="every value"): tx[:wide]
  with pytest.raises(ValueError): tx.shrink(((0, wide), None))
  with pytest.raises(RuntimeError): tx[:ROWS.bind(3)].reshape(3, 8)   # rows*8 is not 24 for every value

# ---- symbolic vs concrete: random op chains at several values, against numpy

def _chain(rng: random.Random, depth: int):
  """A random chain of ops, each (tgrad op, numpy op) on a (rows, 8) float tensor; some keep the shape."""
  ops = [
    (lambda t: t * 2 + 1, lambda a: a * 2 + 1),
    (lambda t: t.relu(), lambda a: np.maximum(a, 0)),
    (lambda t: (t * 0.25).exp(), lambda a: np.exp(a * 0.25)),
    (lambda t: (t > 0).where(t, -t), lambda a: np.where(a > 0, a, -a)),
    (lambda t: t - t.max(1, keepdim=True), lambda a: a - a.max(1, keepdims=True)),
    (lambda t: t - t.sum(0, keepdim=True), lambda a: a - a.sum(0, keepdims=True)),
    (lambda t: t / (t.mean(0, keepdim=True).abs() + 1), lambda a: a / (np.abs(a.mean(0, keepdims=True)) + 1)),
    (lambda t: t.reshape(t.shape[0], 2, 4).permute(0, 2, 1).reshape(t.shape[0], 8),
     lambda a: a.reshape(a.shape[0], 2, 4).transpose(0, 2, 1).reshape(a.shape[0], 8)),
    (lambda t: t.flip(0), lambda a: a[::-1]),
    (lambda t: t.softmax(0), lambda a: np.exp(a - a.max(0)) / np.exp(a - a.max(0)).sum(0)),
    (lambda t: t.cat(t * 2, dim=1)[:, 4:12], lambda a: np.concatenate([a, a * 2], 1)[:, 4:12]),
    (lambda t: Tensor.ones(1, 8).expand(t.shape[0], 8) + t, lambda a: a + 1),
    (lambda t: t - t.std(1, keepdim=True), lambda a: a - a.std(1, ddof=1, keepdims=True)),
  ]
  return [rng.choice(ops) for _ in range(depth)]

FINISHERS = [
  ("identity", lambda t, w: t, lambda a, w: a),
  ("sum0", lambda t, w: t.sum(0), lambda a, w: a.sum(0)),
  ("sum1", lambda t, w: t.sum(1), lambda a, w: a.sum(1)),
  ("sum", lambda t, w: t.sum(), lambda a, w: a.sum()),
  ("mean0", lambda t, w: t.mean(0), lambda a, w: a.mean(0)),
  ("matmul", lambda t, w: t @ w, lambda a, w: a @ w),
  ("gram", lambda t, w: t.T @ t, lambda a, w: a.T @ a),
  ("outer", lambda t, w: t @ t.T, lambda a, w: a @ a.T),
  ("pad", lambda t, w: t.pad(((0, MAX_ROWS - t.shape[0]), None)),
   lambda a, w: np.pad(a, ((0, MAX_ROWS - a.shape[0]), (0, 0)))),
  ("argmax0", lambda t, w: t.argmax(0), lambda a, w: a.argmax(0)),
  ("attention", lambda t, w: (t[:, :6].T @ t).softmax(-1) @ t.T,
   lambda a, w: (lambda s: np.exp(s - s.max(-1, keepdims=True)) / np.exp(s - s.max(-1, keepdims=True)).sum(
     -1, keepdims=True))(a[:, :6].T @ a) @ a.T),
  ("cat0", lambda t, w: t.cat(t + 1, dim=0).sum(0), lambda a, w: np.concatenate([a, a + 1], 0).sum(0)),
]

@pytest.mark.parametrize("seed", range(24))
def test_fuzz_symbolic_chains_against_numpy(seed, data):
  x, w, tx, tw = data
  rng = random.Random(seed)
  chain = _chain(rng, rng.randint(1, 4))
  name, finish, finish_np = FINISHERS[seed % len(FINISHERS)]
  for value in VALUES:
    t, a = tx[:ROWS.bind(value)], x[:value]
    for op, op_np in chain: t, a = op(t), op_np(a)
    out, ref = finish(t, tw).numpy(), finish_np(a, w)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"seed {seed} ({name}) at rows={value}")

def test_gather_of_a_symbolic_number_of_indices():
  rng = np.random.default_rng(1)
  table, ids = rng.standard_normal((20, 4)).astype(np.float32), rng.integers(0, 20, MAX_ROWS).astype(np.int32)
  ttable, tids = Tensor(table).realize(), Tensor(ids).realize()
  for value in VALUES:   # an embedding lookup of the first `rows` tokens
    np.testing.assert_array_equal(ttable[tids[:ROWS.bind(value)]].numpy(), table[ids[:value]])

# ---- one compile for every value

def test_second_value_compiles_nothing_and_hits_the_schedule_cache(data):
  x, w, tx, tw = data
  def step(value):
    t = tx[:ROWS.bind(value)]
    return ((t @ tw).relu().sum(0) / t.shape[0] + t.max()).numpy()
  step(3)
  compiled, templates = compiles(), len(schedule_cache._templates)
  for value in (7, 12, 1):
    out = step(value)
    np.testing.assert_allclose(out, np.maximum(x[:value] @ w, 0).sum(0) / value + x[:value].max(), rtol=1e-5)
  assert compiles() == compiled
  assert len(schedule_cache._templates) == templates

def test_kernel_ast_holds_the_variable_not_the_value(data):
  _, _, tx, _ = data
  keys = set()
  for value in (2, 9):
    (item,) = [i for i in create_schedule([(tx[:ROWS.bind(value)] * 3).lazydata]) if i.ast.op is Ops.SINK]
    assert item.var_vals == {"rows": value, "scalar0": param_bits(3.0, dtypes.float32)}   # `* 3`: tgrad/scalars.py
    assert not any(u.op is Ops.BIND for u in item.ast.toposort())
    keys.add(item.ast.key)
  assert len(keys) == 1

# ---- index math with bounds, against brute force

MOVEMENTS = [
  lambda st, n: st.permute((1, 0)),
  lambda st, n: st.shrink(((0, st.shape[0]), (1, 3))),
  lambda st, n: st.pad(((1, 2), (0, 0))),
  lambda st, n: st.flip((True, False)),
  lambda st, n: st.reshape((st.shape[0] * 2, 2)) if st.shape[1] == 4 else st,
]

def _numpy_movement(k: int, a: np.ndarray) -> np.ndarray:
  if k == 0: return a.T
  if k == 1: return a[:, 1:3]
  if k == 2: return np.pad(a, ((1, 2), (0, 0)), constant_values=-1)
  if k == 3: return a[::-1]
  return a.reshape(a.shape[0] * 2, 2) if a.shape[1] == 4 else a

@pytest.mark.parametrize("seed", range(6))
def test_symbolic_index_math_matches_brute_force(seed):
  rng = random.Random(seed)
  ops = [rng.randrange(len(MOVEMENTS)) for _ in range(3)]
  n = Variable("n", 1, 6)
  st = ShapeTracker.from_shape((n, 4))
  for k in ops: st = MOVEMENTS[k](st, n)
  idxs = [UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), s if isinstance(s, UOp) else
              UOp.const(dtypes.index, s)), d) for d, s in enumerate(st.shape)]
  index, valid = st.to_indexed(idxs)
  for value in range(1, 7):
    ref = np.arange(value * 4).reshape(value, 4)
    for k in ops: ref = _numpy_movement(k, ref)
    assert tuple(evaluate(s, {"n": value}) for s in st.shape) == ref.shape
    for position in np.ndindex(*ref.shape):
      env = {"n": value, **{f"i{d}": p for d, p in enumerate(position)}}
      at = {i: UOp.const(dtypes.index, p) for i, p in zip(idxs, position)} | {n: UOp.const(dtypes.index, value)}
      ok = evaluate(valid.substitute(at), env)
      assert (ref[position] != -1) == bool(ok), (ops, value, position)
      if ok: assert evaluate(index.substitute(at), env) == ref[position], (ops, value, position)

def indexed_without_division(st: ShapeTracker, idxs: list) -> tuple:
  """st.to_indexed(idxs), asserting that its index and mask divide only sizes (// and % never take an index)."""
  index, valid = st.to_indexed(idxs)
  divided = [u.src[0] for u in index.toposort() + valid.toposort() if u.op in (Ops.IDIV, Ops.MOD)]
  assert not any(i in d.toposort() for d in divided for i in idxs), "only sizes are divided, never an index"
  return index, valid

def assert_addresses(st, idxs, index, valid, element_of, values=(1, 5, 17, 40)) -> None:
  """At every value of n and every position of st (its shape evaluated there), the indexed tracker is valid exactly
  where element_of(position, shape, value) gives an element, and addresses that element (brute force)."""
  for value in values:
    env = {"n": value}
    shape = tuple(evaluate(size, env) for size in st.shape)
    for position in np.ndindex(*shape):
      at = {i: UOp.const(dtypes.index, p) for i, p in zip(idxs, position)}
      want = element_of(position, shape, value)
      assert bool(evaluate(valid.substitute(at), env)) == (want is not None), (value, position)
      if want is not None: assert evaluate(index.substitute(at), env) == want, (value, position)

@pytest.mark.parametrize("amount,top", [(4, False), (16, True), (3, False)])
def test_guarded_split_is_indexed_without_division(amount, top):
  """A symbolic axis padded to a multiple of `amount` and split (what a guarded GROUP or LOCAL does, then a permute):
  the view before the split gets its indices directly (shapetracker.split_indices), so the index math has no // or %,
  and it addresses the same elements as the unsplit axis, with the padding masked, at every value."""
  from tgrad.shape.sint import canonical, ceil_div
  n = Variable("n", 1, 40)
  padded = canonical(ceil_div(n, amount) * amount)
  base = ShapeTracker.from_shape((3, n)).permute((1, 0)).pad_end_to(0, padded)   # [padded keys, 3], keys stride 1
  pieces = (amount, canonical(padded // amount)) if top else (canonical(padded // amount), amount)
  st = base.reshape(pieces + (3,)).permute((2, 1, 0))
  assert len(st.views) == 2, st
  idxs = [UOp.variable(f"i{d}", 0, 1 << 10) for d in range(3)]
  index, valid = indexed_without_division(st, idxs)
  def element_of(position, shape, value):
    key = position[2] * shape[1] + position[1]   # the split pieces, outer first, permuted behind the 3-dim
    return position[0] * value + key if key < value else None
  assert_addresses(st, idxs, index, valid, element_of)

def test_two_guarded_splits_are_indexed_without_division():
  """Both axes of an [n, n] tracker split with a guard, one after the other (a matmul's LOCALs over queries and keys):
  the second pads the first split's view, whose mask then bounds its padded dim; still no index is divided."""
  from tgrad.shape.sint import canonical, ceil_div
  n = Variable("n", 1, 40)
  st = ShapeTracker.from_shape((n, n))
  for axis, amount in ((0, 4), (2, 8)):   # after the first split the second n is axis 2
    padded = canonical(ceil_div(n, amount) * amount)
    st = st.pad_end_to(axis, padded)
    st = st.reshape(st.shape[:axis] + (canonical(padded // amount), amount) + st.shape[axis + 1:])
  assert len(st.views) == 3, st
  idxs = [UOp.variable(f"i{d}", 0, 1 << 10) for d in range(4)]
  index, valid = indexed_without_division(st, idxs)
  def element_of(position, shape, value):
    row, column = position[0] * 4 + position[1], position[2] * 8 + position[3]
    return row * value + column if row < value and column < value else None
  assert_addresses(st, idxs, index, valid, element_of)

def test_simplification_uses_the_variable_bounds():
  n = Variable("n", 1, 64)
  i = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 0), n), 0)
  st = ShapeTracker.from_shape((n, 16)).reshape((n * 16,)).reshape((n, 4, 4))
  index, valid = st.to_indexed([i, UOp.variable("j", 0, 3), UOp.variable("k", 0, 3)])
  assert valid.op is Ops.CONST and valid.arg is True
  assert index.render().count("//") == 0 and index.render().count("%") == 0, index.render()

# ---- opts: legality from the bounds

def _kernel(out: LazyBuffer, renderer=None) -> Kernel:
  (item,) = [i for i in create_schedule([out]) if i.ast.op is Ops.SINK]
  from tgrad.device import Device
  return Kernel(item.ast, renderer or Device["LLVM"].renderer)

def test_opt_legality_from_the_bounds(data):
  _, _, tx, _ = data
  # (rows, 8) elementwise merges to one axis of rows*8: 2 divides it for every value, 3 doesn't
  kernel = _kernel((tx[:ROWS.bind(5)] * 2).contiguous().lazydata, CUDARenderer())
  axis = next(a for a, s in enumerate(kernel.full_shape) if isinstance(s, UOp))
  kernel.copy().apply_opt(Opt(OptOps.UPCAST, axis, 2))
  with pytest.raises(KernelOptError, match="symbolic"): kernel.copy().apply_opt(Opt(OptOps.THREAD, axis, 2))
  guarded = kernel.copy()
  guarded.apply_opt(Opt(OptOps.LOCAL, axis, 3))   # with a guard: padded to ceil(rows*8/3)*3, masked
  global_size, local_size = guarded.launch_dims()
  assert local_size == (3,) and evaluate(global_size[0], {"rows": 5}) == 14
  upcast = kernel.copy()
  upcast.apply_opt(Opt(OptOps.UPCAST, axis, 3))   # a guarded upcast: the same padding, 3 replicas per thread
  assert upcast.full_shape[-1] == 3 and evaluate(upcast.full_shape[axis], {"rows": 5}) == 14
  padded = kernel.copy()
  padded.apply_opt(Opt(OptOps.PADTO, axis, 32))   # PADTO of a symbolic global axis: the guard alone
  assert evaluate(padded.full_shape[axis], {"rows": 5}) == 64
  padded.apply_opt(Opt(OptOps.UPCAST, axis, 4))   # which 4 now divides
  assert padded.upcasted == 1 and evaluate(padded.full_shape[axis], {"rows": 5}) == 16
  # a reduce over rows: no unroll by what doesn't divide it; a sum groups with a guard (its padding adds 0), a max
  # with a padding guard too (its padding reads the max's identity, -inf)
  total = _kernel(tx[:ROWS.bind(5)].sum(0).lazydata, CUDARenderer())
  with pytest.raises(KernelOptError, match="symbolic"): total.copy().apply_opt(Opt(OptOps.UNROLL, 0, 2))
  with pytest.raises(KernelOptError, match="symbolic"): total.copy().apply_opt(Opt(OptOps.PADTO, total.first_reduce, 8))
  grouped = total.copy()
  grouped.apply_opt(Opt(OptOps.GROUP, 0, 4))
  assert grouped.padding_guards == ()
  maximum = _kernel(tx[:ROWS.bind(5)].max(0).lazydata, CUDARenderer())
  grouped = maximum.copy()
  grouped.apply_opt(Opt(OptOps.GROUP, 0, 4))
  assert len(grouped.padding_guards) == 1 and maximum.padding_guards == () and len(maximum.memops) == \
    len(maximum.sts) == len(grouped.sts) - 1

def _indexed_at(st: ShapeTracker, position: tuple, env: dict) -> tuple[int, bool]:
  """(memory index, valid) of a tracker at one position, with the variables at env's values."""
  idxs = [UOp.variable(f"i{d}", 0, 1 << 20) for d in range(len(st.shape))]
  index, valid = st.to_indexed(idxs)
  at = {i: UOp.const(dtypes.index, p) for i, p in zip(idxs, position)}
  return evaluate(index.substitute(at), env), bool(evaluate(valid.substitute(at), env))

@pytest.mark.parametrize("opt", [Opt(OptOps.LOCAL, 0, 3), Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.UPCAST, 0, 3),
                                 Opt(OptOps.UPCAST, 0, 16)], ids=str)
def test_guarded_local_masks_the_padding_at_every_value(opt, data):
  _, _, tx, _ = data
  kernel = _kernel((tx[:ROWS.bind(5)] * 2).contiguous().lazydata, CUDARenderer())
  kernel.apply_opt(opt)
  for value in VALUES:
    env = {"rows": value}
    shape = tuple(evaluate(s, env) for s in kernel.full_shape)
    assert shape[0] * shape[1] >= value * 8 > (shape[0] - 1) * shape[1]
    for st in [st for u, st in zip(kernel.memops, kernel.sts) if u.op in (Ops.LOAD, Ops.STORE)]:
      for position in np.ndindex(*shape):
        flat = position[0] * shape[1] + position[1]
        index, valid = _indexed_at(st, position, env)
        assert valid == (flat < value * 8) and (not valid or index == flat), (value, position)

def test_guarded_group_of_a_sum_masks_the_padding(data):
  _, _, tx, _ = data
  kernel = _kernel(tx[:ROWS.bind(5)].sum(0).lazydata, CUDARenderer())
  kernel.apply_opt(Opt(OptOps.GROUP, 0, 4))
  load = next(st for u, st in zip(kernel.memops, kernel.sts) if u.op is Ops.LOAD)
  for value in VALUES:
    env = {"rows": value}
    shape = tuple(evaluate(s, env) for s in kernel.full_shape)   # (columns, group, loop)
    seen = []
    for position in np.ndindex(*shape):
      index, valid = _indexed_at(load, position, env)
      if valid: seen.append((index % 8, index // 8, position[0]))
    assert sorted(seen) == sorted((c, r, c) for c in range(8) for r in range(value)), value

@pytest.mark.parametrize("opt", [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 0, 8)], ids=str)
def test_symbolic_kernel_with_opts_runs_at_every_value(opt, data):
  from tgrad.codegen.compile import compile_kernel
  x, _, tx, _ = data
  for value in VALUES:
    (item,) = [i for i in create_schedule([((tx[:ROWS.bind(value)] + 1) * 3).contiguous().lazydata])
               if i.ast.op is Ops.SINK]
    kernel = _kernel_of(item)
    kernel.apply_opt(opt)
    compile_kernel(item.bufs[0].device, kernel)(list(item.bufs), var_vals=item.var_vals)
    out = item.bufs[0].copyout().view(np.float32)[:value * 8].reshape(value, 8)
    np.testing.assert_allclose(out, (x[:value] + 1) * 3, rtol=1e-6)

def _kernel_of(item) -> Kernel:
  from tgrad.device import Device
  return Kernel(item.ast, Device[item.bufs[0].device].renderer)

# ---- TinyJit across values

def test_jit_replays_any_value_without_compiling_or_capturing(data):
  x, w, tx, tw = data
  captures = []
  @TinyJit
  def f(t, n):
    captures.append(1)
    rows = t.shrink(((0, n), None))
    return ((rows @ tw).relu().sum(0) / n).realize()
  for value in (3, 4):
    f(tx, ROWS.bind(value))
  compiled = compiles()
  for value in (1, 9, 12, 2):
    out = f(tx, ROWS.bind(value)).numpy()
    np.testing.assert_allclose(out, np.maximum(x[:value] @ w, 0).sum(0) / value, rtol=1e-5)
  assert len(captures) == 2 and compiles() == compiled

def test_jit_with_symbolic_tensor_input_returns_symbolic_output(data):
  x, _, tx, _ = data
  @TinyJit
  def g(t): return (t * 2).sum(1).realize()
  for value in (3, 6, 10, 1):
    out = g(tx[:ROWS.bind(value)])
    assert out.shape[0].src[1].arg == value
    np.testing.assert_allclose(out.numpy(), (x[:value] * 2).sum(1), rtol=1e-5)

def test_memory_estimate_as_a_sympy_expression_and_offsets_valid_for_every_value(data):
  _, _, tx, tw = data
  @TinyJit
  def h(t):
    hidden = (t @ tw).relu()
    return (hidden.exp() * 2).sum(1).realize()
  for value in (4, 7, 2): h(tx[:ROWS.bind(value)])
  graph = h.captured
  (device, expression), = graph.estimate_memory(symbolic=True).items()
  rows = sympy.Symbol("rows", integer=True, nonnegative=True)
  assert expression.free_symbols == {rows}
  fixed = sum(s.nbytes for s in graph.slots if s.kind != "activation")   # at the maximum
  activations = [s for s in graph.slots if s.kind == "activation"]
  assert activations and all(s.symbolic_size is not None for s in activations)
  for value in range(1, MAX_ROWS + 1):
    # at each value: the symbolic buffers' bytes at that value, and the live activations' largest total
    at = int(expression.subs(rows, value))
    assert at <= graph.estimate_memory()[device]
    sizes = {id(s): int(to_sympy(s.symbolic_size).subs(rows, value)) * s.dtype.itemsize for s in activations}
    assert all(size <= s.nbytes for s, size in zip(activations, sizes.values()))
    # arena offsets: activations live at the same time never overlap at any value
    for i, a in enumerate(activations):
      for b in activations[i + 1:]:
        la, lb = graph.lifetimes[graph.slots.index(a)], graph.lifetimes[graph.slots.index(b)]
        if la.overlaps(lb):
          assert a.offset + sizes[id(a)] <= b.offset or b.offset + sizes[id(b)] <= a.offset
  assert int(expression.subs(rows, MAX_ROWS)) - int(expression.subs(rows, 1)) > 0
  assert fixed > 0

# ---- CUDA: kernels with variables compile with NVRTC

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

@needs_nvrtc
@pytest.mark.parametrize("case", ["elementwise", "reduce_symbolic_axis", "reduce_other_axis", "matmul", "mean",
                                  "softmax_rows", "argmax"])
def test_cuda_kernels_with_variables_compile(case, data):
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  _, _, tx, tw = data
  t = tx[:ROWS.bind(5)]
  out = {"elementwise": lambda: (t * 2 + 1).exp(), "reduce_symbolic_axis": lambda: t.sum(0),
         "reduce_other_axis": lambda: t.max(1), "matmul": lambda: t @ tw, "mean": lambda: t.mean(0),
         "softmax_rows": lambda: t.T.softmax(-1), "argmax": lambda: t.argmax(0)}[case]()
  for item in create_schedule([out.contiguous().lazydata]):
    if item.ast.op is not Ops.SINK: continue
    kernel = Kernel(item.ast, CUDARenderer())
    hand_coded_optimizations(kernel)
    src = kernel.renderer.render("symbolic_kernel", linearize(kernel))
    # a loop over the symbolic axis takes the value as an argument; a grid over it needs none
    if case in ("reduce_symbolic_axis", "mean") and kernel.reduceops: assert "long long rows_arg" in src, src
    assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
    global_size, _ = kernel.launch_dims()
    assert all(evaluate(g, {"rows": 5}) >= 1 for g in global_size)

# ---- BEAM on symbolic kernels

def test_beam_searches_once_for_every_value(data):
  from tgrad import Context
  from tgrad.cache import get_cache
  from tgrad.codegen.search import search_cache_key
  x, w, tx, tw = data
  def step(value):
    t = tx[:ROWS.bind(value)]
    return ((t @ tw).relu().sum(0) / t.shape[0]).numpy()
  with Context(BEAM=2, IGNORE_BEAM_CACHE=1):
    for value in (5, 12):   # searched (timed at rows=12, checked at 1 and 12), then compiled once
      np.testing.assert_allclose(step(value), np.maximum(x[:value] @ w, 0).sum(0) / value, rtol=1e-4)
    compiled = compiles()
    for value in (1, 8):
      np.testing.assert_allclose(step(value), np.maximum(x[:value] @ w, 0).sum(0) / value, rtol=1e-4)
    assert compiles() == compiled
  from tgrad.device import Device
  t = tx[:ROWS.bind(3)]
  items = [i for i in create_schedule([((t @ tw).relu().sum(0) / t.shape[0]).lazydata]) if i.ast.op is Ops.SINK]
  for item in items:   # each winner is cached under the symbolic AST's key
    assert get_cache().get_opts(search_cache_key(Kernel(item.ast, Device[tx.device].renderer), 2)) is not None

# ---- CUDA graphs: a new value patches the kernel nodes' arguments and grid (no GPU: a recording graph)

def test_cuda_graph_runner_patches_variable_args_and_grid(monkeypatch):
  import tgrad.runtime.cuda.graph as cuda_graph
  from tgrad.codegen.compile import CompiledKernel
  from tgrad.jit import Instruction
  class RecordingGraph:
    def __init__(self, launches, dependencies=None): self.launches, self.updates = launches, []
    def update_variables(self, index, values, global_size):
      self.updates.append((index, list(values), tuple(global_size)))
    def launch(self): pass
  monkeypatch.setattr(cuda_graph, "CUDAGraph", RecordingGraph)
  class Program:
    function, shared_bytes = "kernel", 0
  class Slot:
    class buffer: handle, nbytes = 4096, 64
  rows = Variable("rows", 1, 4096)
  blocks = (rows * 8 + 63) // 64
  runner = CompiledKernel("k", Program(), (blocks,), (64,), "", [], 0, 0, "CUDA", ("rows",))
  runner.program = Program()
  instruction = Instruction(runner, (0,), "CUDA", 1, {"rows": 5})
  graph_runner = cuda_graph.CUDAGraphRunner("CUDA", [instruction], [Slot()])
  graph_runner()
  (graph,) = graph_runner.steps
  assert graph.launches[0].grid == (1, 1, 1) and graph.launches[0].args == [4096, 5]
  instruction.var_vals["rows"] = 100
  graph_runner.rebind_variables([instruction])
  assert graph.updates == [(0, [100], (13,))]   # ceil(800 / 64) blocks

def test_cuda_graph_runner_variable_patches_fuzz(monkeypatch):
  """Seeded: a program of kernels taking random subsets of three variables, replayed through the CUDA graph runner
  at random values (each call sets a random subset); after every call each node holds exactly the launch a fresh
  build at the current values would make (pointers, values, grid), and only the kernels taking a changed variable
  are patched."""
  import tgrad.runtime.cuda.graph as cuda_graph
  from tgrad.codegen.compile import CompiledKernel
  from tgrad.jit import Instruction
  class RecordingGraph:
    def __init__(self, launches, dependencies=None):
      self.state, self.patches = [(list(launch.args), launch.grid) for launch in launches], 0
    def update_variables(self, index, values, global_size):
      pointers = len(self.state[index][0]) - len(values)
      grid = tuple(global_size) + (1,) * (3 - len(global_size))
      self.state[index], self.patches = (self.state[index][0][:pointers] + list(values), grid), self.patches + 1
    def launch(self): pass
  monkeypatch.setattr(cuda_graph, "CUDAGraph", RecordingGraph)
  class Program:
    function, shared_bytes = "kernel", 0
  class Slot:
    def __init__(self, handle):
      self.buffer = type("B", (), {"handle": handle, "nbytes": 64})()
  rng = random.Random(13)
  variables = {name: Variable(name, 1, 500) for name in ("a", "b", "c")}
  slots = [Slot(4096 * (i + 1)) for i in range(6)]
  instructions = []
  for k in range(12):
    names = sorted(rng.sample(sorted(variables), rng.randint(0, 3)))
    grid = (variables[names[0]] * 3 + 31) // 32 if names else 4
    runner = CompiledKernel(f"k{k}", Program(), (grid, 2), (32,), "", [], 0, 0, "CUDA", tuple(names))
    runner.program = Program()
    args = tuple(rng.sample(range(len(slots)), rng.randint(1, 3)))
    instructions.append(Instruction(runner, args, "CUDA", 1, {n: 1 for n in names}))
  graph_runner = cuda_graph.CUDAGraphRunner("CUDA", instructions, slots)
  graph_runner()
  graphs = [step for step in graph_runner.steps]
  current = {"a": 1, "b": 1, "c": 1}
  for _ in range(40):
    changed = {n: rng.randint(1, 500) for n in rng.sample(sorted(current), rng.randint(1, 3))}
    current.update(changed)
    touched = [ins for ins in instructions if any(n in ins.var_vals for n in changed)]
    for ins in touched: ins.var_vals.update({n: v for n, v in changed.items() if n in ins.var_vals})
    (graph,) = graphs
    patches = graph.patches
    graph_runner.rebind_variables(touched)
    assert graph.patches == patches + len(touched)
    for index, ins in enumerate(instructions):
      want = graph_runner._launch_of(ins)
      assert graph.state[index] == (want.args, want.grid), (index, ins.var_vals)
      assert want.args[len(ins.args):] == [current[n] for n in ins.runner.variables]

COST_CASES = {
  "matmul": lambda x, w, rows: x[:rows] @ w.T,
  "row_softmax": lambda x, w, rows: x[:rows].softmax(-1),
  "reduce_over_rows": lambda x, w, rows: (x[:rows] * 2).sum(0),
  "padded": lambda x, w, rows: x[:rows].pad(((1, 2), None)).exp() + 1,
}

@pytest.mark.parametrize("case", COST_CASES)
def test_symbolic_kernel_cost_at_a_value_is_the_concrete_kernels(case):
  """A symbolic kernel's (flops, bytes) evaluated at a value (CompiledKernel.cost, what DEBUG and the benches report)
  equal the estimate of the same graph built with that value as a concrete size; without values, the maximum's."""
  rng = np.random.default_rng(5)
  x = Tensor(rng.standard_normal((64, 48), dtype=np.float32)).realize()
  w = Tensor(rng.standard_normal((16, 48), dtype=np.float32)).realize()
  rows = Variable("rows", 1, 64)
  def runners(size):
    items = [i for i in create_schedule([COST_CASES[case](x, w, size).lazydata]) if i.ast.op is Ops.SINK]
    return [realize_module.get_runner("LLVM", i.ast) for i in items]
  symbolic = runners(rows.bind(3))
  assert symbolic and any(not isinstance(r.flops, int) for r in symbolic)
  for value in (1, 7, 64):
    concrete = runners(value)
    assert [r.cost({"rows": value}) for r in symbolic] == [r.cost() for r in concrete], value
  assert [r.cost() for r in symbolic] == [r.cost() for r in runners(64)]

# ---- assign into a region (Tensor.assign_region): a KV-cache write of one slot

def test_assign_region_writes_only_the_region_at_every_position():
  """A write of [pos, pos + 1) along axis 2 of a realized [2, 3, 16, 4] buffer: one kernel over the 24 written
  elements (its store goes through the symbolic shrink), compiled once for every position; reads after it in the
  same graph see the new values, the other slots keep theirs."""
  position = Variable("slot", 0, 15)
  cache = Tensor.zeros(2, 3, 16, 4).contiguous().realize()
  want = np.zeros((2, 3, 16, 4), np.float32)
  rng = np.random.default_rng(0)
  for k, value in enumerate((0, 5, 15, 3, 5)):
    new = rng.standard_normal((2, 3, 1, 4)).astype(np.float32)
    slot = position.bind(value)
    cache.assign_region((None, None, (slot, slot + 1), None), Tensor(new))
    filled = cache.shrink((None, None, (0, slot + 1), None)).sum(2)   # reads the cache after the write
    items = create_schedule([filled.lazydata])
    write = [i for i in items if i.ast.op is Ops.SINK and i.bufs[0] is cache.lazydata.base.srcs[0].base.buffer]
    assert len(write) == 1 and prod(write[0].ast.src[0].src[1].arg.shape) == 24
    if k == 1: compiled = compiles()
    want[:, :, value] = new[:, :, 0]
    np.testing.assert_allclose(filled.numpy(), want[:, :, :value + 1].sum(2), rtol=1e-6)
  assert compiles() == compiled
  np.testing.assert_array_equal(cache.numpy(), want)

def test_assign_region_errors():
  cache = Tensor.zeros(4, 8).contiguous().realize()
  with pytest.raises(ValueError, match="region of"): cache.assign_region((None, (0, 2)), Tensor.ones(4, 3))
  with pytest.raises(ValueError, match="unrealized"): (cache + 1).assign_region((None, (0, 2)), Tensor.ones(4, 2))
  with pytest.raises(ValueError, match="outside shape"): cache.assign_region((None, (6, 9)), Tensor.ones(4, 3))
