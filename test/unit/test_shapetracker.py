"""View and ShapeTracker against numpy: every op is applied both to a ShapeTracker and to `np.arange(n)` with the
matching numpy op, and `to_indexed` is evaluated at every index (vectorized) to compare element order.
Also: the shape of the generated index math (no // or % when contiguous, exactly the needed comparisons), argument
validation, composition, simplify, real_strides, buffer_extent, and seeded random fuzzers of op chains (set FUZZ_SEED
to run another set of seeds; a failure names the seed and the ops).
"""
import os, random
import numpy as np
import pytest
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import Ops, UOp, exec_alu
from tgrad.shape.shapetracker import ShapeTracker, loop_index, simplify_given_valid
from tgrad.shape.view import View

PAD_VALUE = -1                                   # what numpy puts where the ShapeTracker's mask is off
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))
FUZZ_CHAINS = 600                                # random op chains per fuzz test run
MAX_CHAIN_LENGTH = 8
MAX_FUZZ_SIZE = 1500                             # keep shapes small so checking every index stays fast
INT32_LIMIT = 2 ** 31

# ---------------------------------------------------------------------------------------------------------------
# a vectorized evaluator of index math: C semantics (truncating // and %), checked against exec_alu below

def _c_idiv(a, b):
  safe_b = np.where(b == 0, 1, b)
  quotient = np.abs(a) // np.abs(safe_b) * np.sign(a) * np.sign(safe_b)
  return np.where(b == 0, 0, quotient)

def _c_mod(a, b): return np.where(b == 0, 0, a - _c_idiv(a, b) * b)

NUMPY_OPS = {
  Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.IDIV: _c_idiv, Ops.MOD: _c_mod, Ops.MAX: np.maximum,
  Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or,
  Ops.XOR: np.bitwise_xor, Ops.NEG: np.negative, Ops.WHERE: np.where,
}

def evaluate(root: UOp, env: dict) -> np.ndarray:
  """The value of an int/bool UOp graph with leaves (RANGE, DEFINE_VAR) bound to numpy arrays in `env`."""
  values: dict = {}
  for node in root.toposort():
    if node in env: values[node] = env[node]
    elif node.op is Ops.CONST: values[node] = np.bool_(node.arg) if node.dtype.is_bool else np.int64(node.arg)
    elif node.op in NUMPY_OPS: values[node] = NUMPY_OPS[node.op](*(values[s] for s in node.src))
    elif node.op is Ops.CAST: values[node] = values[node.src[0]].astype(np.bool_ if node.dtype.is_bool else np.int64)
    elif node.op in (Ops.RANGE, Ops.DEFINE_VAR): raise KeyError(f"unbound leaf {node}")
    else: raise NotImplementedError(f"cannot evaluate {node.op}")
    if not node.dtype.is_bool: assert np.all(np.abs(values[node]) < INT32_LIMIT), f"int32 overflow at {node}"
  return values[root]

def test_evaluator_matches_exec_alu():
  rng = np.random.default_rng(0)
  a, b = rng.integers(-50, 50, 200), rng.integers(-9, 9, 200)
  for op in (Ops.IDIV, Ops.MOD, Ops.ADD, Ops.MUL, Ops.MAX):
    got = NUMPY_OPS[op](a, b)
    assert [int(g) for g in got] == [exec_alu(op, dtypes.index, (int(x), int(y))) for x, y in zip(a, b)], op

def index_and_valid(st: ShapeTracker) -> tuple[np.ndarray, np.ndarray]:
  """The memory index and validity of every position of st.shape, as arrays of that shape."""
  idxs = [loop_index(d, s) for d, s in enumerate(st.shape)]
  index, valid = st.to_indexed(idxs)
  grids = np.indices(st.shape, dtype=np.int64) if st.shape else []
  env = dict(zip(idxs, grids))
  return (np.broadcast_to(evaluate(index, env), st.shape), np.broadcast_to(evaluate(valid, env), st.shape))

def gather(st: ShapeTracker, buffer: np.ndarray) -> np.ndarray:
  """What a kernel reading `buffer` through st sees, with PAD_VALUE where the mask is off."""
  index, valid = index_and_valid(st)
  if buffer.size == 0: return np.full(st.shape, PAD_VALUE)
  return np.where(valid, buffer[np.clip(index, 0, buffer.size - 1)], PAD_VALUE)

def assert_matches(st: ShapeTracker, expected: np.ndarray, context: str = ""):
  assert st.shape == expected.shape, f"{context}: shape {st.shape} != numpy {expected.shape}"
  index, valid = index_and_valid(st)
  np.testing.assert_array_equal(valid, expected != PAD_VALUE, err_msg=f"{context}: valid differs\n{st}")
  np.testing.assert_array_equal(np.where(valid, index, PAD_VALUE), expected, err_msg=f"{context}: index differs\n{st}")
  touched = expected[expected != PAD_VALUE]
  true_extent = int(touched.max()) + 1 if touched.size else 0
  if len(st.views) == 1: assert st.buffer_extent() == true_extent, f"{context}: buffer_extent\n{st}"
  else: assert st.buffer_extent() >= true_extent, f"{context}: buffer_extent\n{st}"

class CheckingShapeTracker:
  """A ShapeTracker and the numpy array of flat positions it should produce, moved together."""
  def __init__(self, shape: tuple[int, ...]):
    self.st = ShapeTracker.from_shape(shape)
    self.expected = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    self.ops: list[tuple] = []
  @property
  def shape(self) -> tuple[int, ...]: return self.st.shape
  def _apply(self, name: str, arg, numpy_fn):
    self.ops.append((name, arg))
    self.st = getattr(self.st, name)(arg)
    self.expected = numpy_fn(self.expected)
    return self
  def reshape(self, shape): return self._apply("reshape", shape, lambda t: t.reshape(shape))
  def permute(self, order): return self._apply("permute", order, lambda t: t.transpose(order))
  def expand(self, shape): return self._apply("expand", shape, lambda t: np.broadcast_to(t, shape))
  def pad(self, padding):
    return self._apply("pad", padding, lambda t: np.pad(t, padding, constant_values=PAD_VALUE) if padding else t)
  def shrink(self, bounds): return self._apply("shrink", bounds, lambda t: t[tuple(slice(*b) for b in bounds)])
  def flip(self, axes): return self._apply("flip", axes, lambda t: np.flip(t, [d for d, f in enumerate(axes) if f]))
  def stride(self, steps): return self._apply("stride", steps, lambda t: t[tuple(slice(None, None, k) for k in steps)])
  def check(self):
    assert_matches(self.st, self.expected, f"ops {self.ops}")
    simplified = self.st.simplify()
    assert len(simplified.views) <= len(self.st.views)
    assert_matches(simplified, self.expected, f"simplify() after ops {self.ops}")
    return self

# ---------------------------------------------------------------------------------------------------------------
# each op against numpy

@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 1, 3), (4, 3, 2), (0,), (2, 0, 3), (1, 1)])
def test_from_shape_is_contiguous(shape):
  c = CheckingShapeTracker(shape).check()
  assert c.st.contiguous and len(c.st.views) == 1

@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
def test_permute(order): CheckingShapeTracker((2, 3, 5)).permute(order).check()

@pytest.mark.parametrize("shape,new_shape", [((1, 3), (4, 3)), ((3, 1), (3, 5)), ((1, 1), (2, 3)), ((1,), (0,)),
                                             ((2, 1, 1), (2, 4, 1))])
def test_expand(shape, new_shape): CheckingShapeTracker(shape).expand(new_shape).check()

@pytest.mark.parametrize("padding", [((1, 0), (0, 2)), ((0, 0), (3, 3)), ((2, 2), (0, 0)), ((1, 1), (1, 1))])
def test_pad(padding): CheckingShapeTracker((3, 4)).pad(padding).check()

@pytest.mark.parametrize("bounds", [((0, 3), (1, 3)), ((1, 2), (0, 4)), ((0, 0), (0, 4)), ((2, 3), (3, 4))])
def test_shrink(bounds): CheckingShapeTracker((3, 4)).shrink(bounds).check()

@pytest.mark.parametrize("axes", [(True, False), (False, True), (True, True)])
def test_flip(axes): CheckingShapeTracker((3, 4)).flip(axes).check()

@pytest.mark.parametrize("steps", [(2, 1), (1, 3), (-1, 2), (-2, -3), (5, 5), (3, -4)])
def test_stride(steps): CheckingShapeTracker((5, 7)).stride(steps).check()

def test_zero_size_everywhere():
  CheckingShapeTracker((2, 0, 3)).permute((2, 0, 1)).reshape((0, 6)).pad(((1, 1), (0, 0))).flip((True, False)).check()
  CheckingShapeTracker((4, 5)).shrink(((1, 1), (0, 5))).reshape((0,)).reshape((5, 0, 2)).stride((2, 1, -1)).check()
  CheckingShapeTracker((0,)).pad(((2, 1),)).reshape((3, 1)).expand((3, 4)).check()
  CheckingShapeTracker((3,)).reshape((3, 1)).expand((3, 0)).check()

def test_zero_d():
  CheckingShapeTracker(()).reshape((1, 1)).expand((3, 2)).check()
  CheckingShapeTracker(()).reshape((1,)).pad(((1, 2),)).shrink(((1, 2),)).reshape(()).check()
  CheckingShapeTracker((5,)).shrink(((3, 4),)).reshape(()).check()

def test_padded_then_reshaped_to_0d():
  c = CheckingShapeTracker((1,)).pad(((2, 0),)).shrink(((0, 1),)).reshape(())
  c.check()
  assert c.st.to_indexed([])[1].arg is False

# ---------------------------------------------------------------------------------------------------------------
# reshape: what stays one View, and multi-view trackers

@pytest.mark.parametrize("shape,new_shape", [((2, 3, 4), (6, 4)), ((2, 3, 4), (2, 12)), ((24,), (2, 3, 4)),
                                             ((6, 4), (2, 3, 2, 2)), ((2, 3, 4), (1, 6, 1, 4, 1))])
def test_contiguous_reshape_stays_one_view(shape, new_shape):
  c = CheckingShapeTracker(shape).reshape(new_shape).check()
  assert len(c.st.views) == 1 and c.st.contiguous

def test_reshape_of_strided_dims_that_merge():
  # a permute keeps (3, 4) together: merging them and splitting them differently needs no second view
  c = CheckingShapeTracker((2, 3, 4)).permute((1, 2, 0)).reshape((12, 2)).reshape((2, 6, 2)).check()
  assert len(c.st.views) == 1
  c = CheckingShapeTracker((3, 1)).expand((3, 4)).reshape((3, 2, 2)).check()
  assert len(c.st.views) == 1 and c.st.views[0].strides == (1, 0, 0)

def test_reshape_keeps_mask_when_expressible():
  c = CheckingShapeTracker((3, 4)).pad(((1, 1), (0, 0))).reshape((20,)).check()   # whole padded rows: one range
  assert len(c.st.views) == 1 and c.st.views[0].mask == ((4, 16),)
  c = CheckingShapeTracker((4, 6)).pad(((0, 0), (2, 0))).reshape((4, 4, 2)).check()   # split the padded dim
  assert len(c.st.views) == 1 and c.st.views[0].mask == ((0, 4), (1, 4), (0, 2))
  c = CheckingShapeTracker((4, 6)).pad(((0, 0), (1, 1))).reshape((4, 2, 4)).check()   # [1, 7) is no product range
  assert len(c.st.views) == 2
  c = CheckingShapeTracker((1, 3)).pad(((2, 2), (1, 1))).reshape((25,)).check()   # one valid row: a range
  assert len(c.st.views) == 1 and c.st.views[0].mask == ((11, 14),)

@pytest.mark.parametrize("build", [
  lambda c: c.permute((1, 0)).reshape((12,)),                       # reshape after permute
  lambda c: c.pad(((1, 1), (1, 1))).reshape((30,)),                 # after pad
  lambda c: c.stride((2, 1)).reshape((8,)).reshape((4, 2)),         # after stride
  lambda c: c.permute((1, 0)).reshape((2, 6)).permute((1, 0)).reshape((3, 4)),
  lambda c: c.flip((True, False)).shrink(((0, 3), (1, 4))).reshape((9,)),
  lambda c: c.pad(((1, 0), (0, 1))).reshape((4, 5)).shrink(((1, 3), (0, 5))).reshape((2, 5, 1)).expand((2, 5, 3)),
  lambda c: c.reshape((3, 4, 1)).expand((3, 4, 2)).permute((2, 0, 1)).reshape((6, 4)).pad(((0, 1), (1, 0))),
])
def test_multi_view(build):
  c = build(CheckingShapeTracker((3, 4))).check()
  assert len(c.st.views) >= 1

def test_reshape_after_permute_pushes_a_view():
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,))
  assert len(st.views) == 2 and st.views[-1].contiguous

def test_reshape_back_simplifies_to_one_view():
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).reshape((4, 3))
  assert len(st.simplify().views) == 1
  assert st.simplify() == ShapeTracker.from_shape((3, 4)).permute((1, 0))

def test_simplify_merges_a_run_of_three_views():
  # neither pair of adjacent views folds into one, but all three together are a single strided view
  c = CheckingShapeTracker((8,)).reshape((1, 4, 1, 1, 2)).expand((1, 4, 1, 3, 2)).reshape((2, 6, 2))
  c = c.shrink(((0, 2), (0, 5), (0, 1))).expand((2, 5, 4)).reshape((2, 2, 10)).stride((1, 3, 1)).check()
  assert len(c.st.views) == 3 and len(c.st.simplify().views) == 1

def test_simplify_of_a_fully_masked_tracker():
  c = CheckingShapeTracker((3, 4)).permute((1, 0)).reshape((12,)).shrink(((2, 2),)).pad(((1, 1),)).check()
  assert c.st.simplify().views == (View.create((2,), mask=((0, 0),)),)

# ---------------------------------------------------------------------------------------------------------------
# the shape of the index math

def _ops_in(u: UOp) -> set: return {n.op for n in u.toposort()}

@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 1)])
def test_contiguous_index_is_a_plain_sum(shape):
  st = ShapeTracker.from_shape(shape).reshape((prod(shape),)).reshape(shape)
  idxs = [loop_index(d, s) for d, s in enumerate(shape)]
  index, valid = st.to_indexed(idxs)
  assert not _ops_in(index) & {Ops.IDIV, Ops.MOD}, index.render()
  assert valid.op is Ops.CONST and valid.arg is True
  assert _ops_in(index) <= {Ops.ADD, Ops.MUL, Ops.CONST, Ops.RANGE}
  flat = st.reshape((prod(shape),)).to_indexed([loop_index(0, prod(shape))])[0]
  assert flat is loop_index(0, prod(shape))   # a contiguous load is just the loop index

def test_merged_dims_index_has_no_div_mod():
  # the reshape (2,3,4)->(6,4) of a permuted view is still one View with a linear index
  st = ShapeTracker.from_shape((4, 2, 3)).permute((1, 2, 0)).reshape((6, 4))
  index, valid = st.to_indexed([loop_index(0, 6), loop_index(1, 4)])
  assert len(st.views) == 1 and not _ops_in(index) & {Ops.IDIV, Ops.MOD} and valid.arg is True

def _comparisons(valid: UOp) -> list[UOp]: return [n for n in valid.toposort() if n.op is Ops.CMPLT]

def test_padded_view_has_exactly_the_needed_comparisons():
  st = ShapeTracker.from_shape((3, 4)).pad(((1, 0), (0, 2)))   # dim 0 needs a lower bound, dim 1 an upper bound
  idxs = [loop_index(0, 4), loop_index(1, 6)]
  index, valid = st.to_indexed(idxs)
  assert len(_comparisons(valid)) == 2 and not _ops_in(index) & {Ops.IDIV, Ops.MOD}
  st = ShapeTracker.from_shape((3, 4)).pad(((1, 1), (0, 0)))
  assert len(_comparisons(st.to_indexed([loop_index(0, 5), loop_index(1, 4)])[1])) == 2
  # a loop that only runs inside the valid part needs no check at all
  inner = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 1), UOp.const(dtypes.index, 4)), arg=0)
  assert st.to_indexed([inner, loop_index(1, 4)])[1].arg is True

def test_simplify_given_valid():
  r = loop_index(0, 11)
  x = r * 30 + loop_index(1, 30)
  # the index only matters where valid holds: r < 6 makes (r + 66) % 9 just r + 3, and 0 < (r + 66) % 9 always true
  index, valid = simplify_given_valid((r + 66) % 9, r.lt(6) & UOp.const(dtypes.index, 0).lt((r + 66) % 9))
  assert index is r + 3 and valid is r.lt(6)
  # two bounds on the same expression merge; contradicting bounds make valid False
  assert simplify_given_valid(x, UOp.const(dtypes.index, 0).lt(x) & UOp.const(dtypes.index, 28).lt(x))[1] is \
    UOp.const(dtypes.index, 28).lt(x)
  assert simplify_given_valid(r, r.lt(2) & UOp.const(dtypes.index, 3).lt(r))[1].arg is False

def test_unravel_of_a_merged_contiguous_view_simplifies():
  # two views where the second merely splits the first: the index needs no // or %
  st = ShapeTracker.from_shape((4, 3)).permute((1, 0)).reshape((12,)).reshape((3, 4))
  index, _ = st.to_indexed([loop_index(0, 3), loop_index(1, 4)])
  assert not _ops_in(index) & {Ops.IDIV, Ops.MOD}, index.render()

# ---------------------------------------------------------------------------------------------------------------
# canonical Views, real_strides, unit_stride_axes, buffer_extent

def test_view_create_is_canonical():
  v = View.create((1, 3, 1), (5, 2, 7))
  assert v.strides == (0, 2, 0) and not v.contiguous
  assert View.create((2, 3), mask=((0, 2), (0, 3))).mask is None and View.create((2, 3)).contiguous
  empty = View.create((2, 3), (3, 1), 4, mask=((1, 1), (0, 3)))
  assert empty.mask == ((0, 0), (0, 0)) and empty.strides == (0, 0) and empty.offset == 0
  assert View.create((2, 0, 3), (9, 9, 9), 5).contiguous
  one_row = View.create((3, 4), (4, 1), 0, mask=((1, 2), (0, 4)))
  assert one_row.strides == (0, 1) and one_row.offset == 4

def test_real_strides():
  assert ShapeTracker.from_shape((3, 4)).real_strides() == (4, 1)
  assert ShapeTracker.from_shape((3, 1)).expand((3, 5)).real_strides() == (1, 0)
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).reshape((2, 6))
  assert st.real_strides() == (2, None)   # memory = 2*i + j//3 + 4*(j%3): axis 1 has no constant stride
  st = ShapeTracker.from_shape((2, 3, 4)).permute((0, 2, 1)).reshape((2, 12)).reshape((2, 4, 3))
  assert st.real_strides() == (12, 1, 4)
  padded = ShapeTracker.from_shape((3, 4)).pad(((0, 0), (1, 1)))
  assert padded.real_strides() == (4, None) and padded.real_strides(ignore_valid=True) == (4, 1)
  assert padded.unit_stride_axes() == [] and ShapeTracker.from_shape((3, 4)).unit_stride_axes() == [1]
  assert ShapeTracker.from_shape((3, 4)).permute((1, 0)).unit_stride_axes() == [0]

def test_buffer_extent():
  assert ShapeTracker.from_shape((3, 4)).buffer_extent() == 12
  assert ShapeTracker.from_shape((3, 4)).shrink(((0, 2), (1, 3))).buffer_extent() == 7
  assert ShapeTracker.from_shape((3, 4)).flip((True, True)).buffer_extent() == 12
  assert ShapeTracker.from_shape((3, 4)).pad(((2, 2), (2, 2))).buffer_extent() == 12
  assert ShapeTracker.from_shape((3, 0)).buffer_extent() == 0
  assert ShapeTracker.from_shape((3, 4)).shrink(((1, 1), (0, 4))).pad(((1, 1), (0, 0))).buffer_extent() == 0

# ---------------------------------------------------------------------------------------------------------------
# argument validation: user errors name the shapes

@pytest.mark.parametrize("op,arg", [
  ("permute", (0, 0)), ("permute", (0,)), ("permute", (0, 2)), ("expand", (4, 5)), ("expand", (3,)),
  ("pad", ((0, -1), (0, 0))), ("pad", ((1, 1),)), ("shrink", ((0, 4), (0, 4))), ("shrink", ((2, 1), (0, 4))),
  ("shrink", ((-1, 2), (0, 4))), ("reshape", (5, 2)), ("reshape", (-3, -4)), ("stride", (0, 1)), ("stride", (1,)),
  ("flip", (True,)),
])
def test_bad_arguments_raise_value_error(op, arg):
  with pytest.raises(ValueError, match=r"\(3, 4\)"): getattr(ShapeTracker.from_shape((3, 4)), op)(arg)

def test_non_integer_arguments_raise_type_error():
  with pytest.raises(TypeError): ShapeTracker.from_shape((3, 4)).reshape((2.0, 6))
  with pytest.raises(TypeError): ShapeTracker.from_shape((3.5,))
  assert ShapeTracker.from_shape((np.int64(3), 4)).shape == (3, 4)

def test_compose_rejects_a_tracker_that_reads_too_far():
  with pytest.raises(ValueError, match=r"\(2, 3\)"): ShapeTracker.from_shape((2, 3)) + ShapeTracker.from_shape((7,))

# ---------------------------------------------------------------------------------------------------------------
# composition st1 + st2

def _check_composition(c1: CheckingShapeTracker, c2: CheckingShapeTracker):
  composed = c1.st + c2.st
  flat = c1.expected.reshape(-1)
  expected = np.where(c2.expected == PAD_VALUE, PAD_VALUE, flat[np.clip(c2.expected, 0, max(flat.size - 1, 0))]
                      if flat.size else PAD_VALUE)
  assert_matches(composed, expected, f"{c1.ops} + {c2.ops}")
  return composed

def test_composition():
  c1 = CheckingShapeTracker((4, 6)).permute((1, 0)).pad(((0, 0), (1, 1)))
  c2 = CheckingShapeTracker(c1.shape).reshape((36,)).shrink(((6, 30),)).reshape((4, 6))
  _check_composition(c1, c2)
  base = CheckingShapeTracker((3, 4)).permute((1, 0))
  identity = CheckingShapeTracker(base.shape)
  assert _check_composition(base, identity) == base.st   # composing with a contiguous tracker changes nothing
  assert _check_composition(identity, base) == base.st

def test_composition_merges_into_one_view():
  c1 = CheckingShapeTracker((4, 6)).shrink(((1, 3), (0, 6)))
  c2 = CheckingShapeTracker(c1.shape).permute((1, 0)).stride((2, 1))
  assert len(_check_composition(c1, c2).views) == 1

def test_composing_a_fully_masked_0d_tracker_keeps_it_masked():
  # x.pad(((1, 0),))[0] read x[0] instead of 0: merging [masked (1,), (), ()] made an unmasked 0-d View (found by
  # test/fuzz_ops.py)
  c = CheckingShapeTracker((2,)).pad(((1, 0),)).shrink(((0, 1),)).reshape(())
  composed = _check_composition(c, CheckingShapeTracker(()))
  assert composed.to_indexed([])[1].arg is False

# ---------------------------------------------------------------------------------------------------------------
# the random fuzzer

def _random_shape(rng: random.Random) -> tuple[int, ...]:
  shape = tuple(rng.choice((1, 2, 3, 4, 5, 6, 8)) for _ in range(rng.randint(0, 4)))
  return shape + (0,) if rng.random() < 0.03 else shape

def _factorize(n: int) -> list[int]:
  factors, p = [], 2
  while p * p <= n:
    while n % p == 0: factors, n = factors + [p], n // p
    p += 1
  return factors + [n] if n > 1 else factors

def _random_reshape(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
  size = prod(shape)
  if size == 0:
    dims = [rng.choice((1, 2, 3)) for _ in range(rng.randint(0, 2))]
    return tuple(dims[:(cut := rng.randint(0, len(dims)))] + [0] + dims[cut:])
  dims = [1] * rng.randint(1, 4)
  for f in _factorize(size): dims[rng.randrange(len(dims))] *= f
  if rng.random() < 0.3: dims.insert(rng.randint(0, len(dims)), 1)
  return tuple(dims)

def _random_op(rng: random.Random, shape: tuple[int, ...]):
  n = len(shape)
  op = rng.choice(("reshape", "reshape", "reshape", "permute", "expand", "pad", "shrink", "flip", "stride"))
  if op == "reshape": return op, _random_reshape(rng, shape)
  if op == "permute": return op, tuple(rng.sample(range(n), n))
  if op == "expand":
    return op, tuple(rng.choice((1, 2, 3, 4)) if s == 1 and rng.random() < 0.7 else s for s in shape)
  if op == "pad": return op, tuple((rng.choice((0, 0, 1, 2)), rng.choice((0, 0, 1, 3))) for _ in shape)
  if op == "shrink":
    bounds = []
    for s in shape:
      if rng.random() < 0.5: bounds.append((0, s))
      elif rng.random() < 0.05: bounds.append((lo := rng.randint(0, s), rng.randint(lo, s)))   # maybe empty
      else: bounds.append((lo := rng.randint(0, max(s - 1, 0)), rng.randint(min(lo + 1, s), s)))
    return op, tuple(bounds)
  if op == "flip": return op, tuple(rng.random() < 0.5 for _ in shape)
  return op, tuple(rng.choice((1, 1, 2, 3, -1, -2)) for _ in shape)

def random_chain(rng: random.Random, c: CheckingShapeTracker) -> CheckingShapeTracker:
  """Apply 1 to MAX_CHAIN_LENGTH random legal ops to c (skipping ones that would make it too big)."""
  for _ in range(rng.randint(1, MAX_CHAIN_LENGTH)):
    op, arg = _random_op(rng, c.shape)
    if prod(getattr(View.create(c.shape), op)(arg).shape) <= MAX_FUZZ_SIZE: getattr(c, op)(arg)
  return c

def _fuzz_failure(seed: int, ops: str) -> str:
  return f"fuzz case with seed {seed} failed (FUZZ_SEED={FUZZ_SEED} reruns this run): {ops}"

def test_fuzz_op_chains():
  for chain in range(FUZZ_CHAINS):
    seed = FUZZ_SEED * 1_000_003 + chain
    rng = random.Random(seed)
    c = CheckingShapeTracker(_random_shape(rng))
    try: random_chain(rng, c).check()
    except Exception as e: raise AssertionError(_fuzz_failure(seed, str(c.ops))) from e

def test_fuzz_composition():
  for chain in range(FUZZ_CHAINS // 4):
    seed = FUZZ_SEED * 1_000_003 + chain
    rng = random.Random(seed)
    c1 = CheckingShapeTracker(_random_shape(rng))
    c2 = CheckingShapeTracker(())
    try:
      random_chain(rng, c1)
      c2 = random_chain(rng, CheckingShapeTracker(c1.shape))
      _check_composition(c1, c2)
    except Exception as e: raise AssertionError(_fuzz_failure(seed, f"{c1.ops} + {c2.ops}")) from e

SPLIT_FACTOR = 2   # how an even axis is split into (outer, inner) loops, as an upcast or a thread split would

def test_fuzz_indices_that_are_expressions():
  # the kernel passes index expressions, not just loop variables: axis = outer * 2 + inner, and constants for size 1
  for chain in range(FUZZ_CHAINS // 6):
    seed = FUZZ_SEED * 1_000_003 + chain
    rng = random.Random(seed)
    c = CheckingShapeTracker(_random_shape(rng))
    try:
      random_chain(rng, c)
      idxs, loops, loop_shape = [], [], []
      for size in c.shape:
        if size == 1: idxs.append(UOp.const(dtypes.index, 0))
        elif size % SPLIT_FACTOR == 0:
          outer, inner = loop_index(len(loops), size // SPLIT_FACTOR), loop_index(len(loops) + 1, SPLIT_FACTOR)
          idxs.append(outer * SPLIT_FACTOR + inner)
          loops += [outer, inner]
          loop_shape += [size // SPLIT_FACTOR, SPLIT_FACTOR]
        else:
          idxs.append(loop_index(len(loops), size))
          loops.append(idxs[-1])
          loop_shape.append(size)
      index, valid = c.st.to_indexed(idxs)
      env = dict(zip(loops, np.indices(loop_shape, dtype=np.int64))) if loop_shape else {}
      got_index = np.broadcast_to(evaluate(index, env), loop_shape)
      got_valid = np.broadcast_to(evaluate(valid, env), loop_shape)
      expected = c.expected.reshape(loop_shape)
      np.testing.assert_array_equal(np.where(got_valid, got_index, PAD_VALUE), expected)
    except Exception as e: raise AssertionError(_fuzz_failure(seed, str(c.ops))) from e

# ---------------------------------------------------------------------------------------------------------------
# the random fuzzer with a symbolic dim: one tracker built over a Variable, checked at several values against the
# concrete tracker (and numpy) built with the value in its place

SYMBOLIC_VALUES = (1, 2, 5)
SYMBOLIC_CHAINS = 120

def _concrete(arg, value: int):
  """An op argument with the variable's expressions evaluated at `value`."""
  from tgrad.shape.sint import evaluate
  if isinstance(arg, UOp): return evaluate(arg, {"n": value})
  if isinstance(arg, tuple): return tuple(_concrete(a, value) for a in arg)
  return arg

def _random_symbolic_op(rng: random.Random, shape: tuple):
  """A random op for a shape holding symbolic dims: reshapes regroup the int dims around them (the symbolic dims keep
  their places), shrinks keep [0, n) or [1, n) of a symbolic dim, expands may turn a 1 into the variable."""
  n_var = next(u for s in shape if isinstance(s, UOp) for u in s.toposort() if u.op is Ops.DEFINE_VAR)
  op = rng.choice(("reshape", "reshape", "permute", "expand", "pad", "shrink", "flip", "stride"))
  if op == "reshape":
    ints = [s for s in shape if not isinstance(s, UOp)]
    regrouped = list(_random_reshape(rng, tuple(ints))) if ints else []
    symbols = [(d, s) for d, s in enumerate(shape) if isinstance(s, UOp)]
    for d, s in symbols: regrouped.insert(min(d, len(regrouped)), s)
    return op, tuple(regrouped)
  if op == "permute": return op, tuple(rng.sample(range(len(shape)), len(shape)))
  if op == "flip": return op, tuple(rng.random() < 0.5 for _ in shape)
  if op == "expand":
    return op, tuple((n_var if rng.random() < 0.5 else rng.choice((2, 3))) if s == 1 and rng.random() < 0.7 else s
                     for s in shape)
  if op == "pad": return op, tuple((rng.choice((0, 0, 1, 2)), rng.choice((0, 0, 1, 3))) for _ in shape)
  if op == "shrink":
    bounds = []
    for s in shape:
      if isinstance(s, UOp): bounds.append((rng.choice((0, 1)) if s.vmin >= 1 else 0, s))
      elif rng.random() < 0.5 or s == 0: bounds.append((0, s))
      else: bounds.append((lo := rng.randint(0, s - 1), rng.randint(lo + 1, s)))
    return op, tuple(bounds)
  return op, tuple(1 if isinstance(s, UOp) else rng.choice((1, 2, -1)) for s in shape)

def test_fuzz_symbolic_op_chains():
  n = UOp.variable("n", 1, max(SYMBOLIC_VALUES))
  for chain in range(SYMBOLIC_CHAINS):
    seed = FUZZ_SEED * 1_000_003 + chain
    rng = random.Random(seed)
    shape = list(_random_shape(rng))[:3]
    shape.insert(rng.randint(0, len(shape)), n)
    st, ops = ShapeTracker.from_shape(tuple(shape)), []
    try:
      for _ in range(rng.randint(1, MAX_CHAIN_LENGTH)):
        op, arg = _random_symbolic_op(rng, st.shape)
        if max(prod(_concrete(getattr(View.create(_concrete(st.shape, v)), op)(_concrete(arg, v)).shape, v))
               for v in SYMBOLIC_VALUES) > MAX_FUZZ_SIZE: continue
        st = getattr(st, op)(arg)
        ops.append((op, arg))
      idxs = [loop_index(d, s) for d, s in enumerate(st.shape)]
      index, valid = st.to_indexed(idxs)
      for value in SYMBOLIC_VALUES:
        c = CheckingShapeTracker(tuple(_concrete(s, value) for s in shape))
        for op, arg in ops: getattr(c, op)(_concrete(arg, value))
        concrete_shape = tuple(_concrete(s, value) for s in st.shape)
        assert concrete_shape == c.expected.shape, (concrete_shape, c.expected.shape)
        grids = np.indices(concrete_shape, dtype=np.int64) if concrete_shape else []
        env = {**dict(zip(idxs, grids)), n: np.int64(value)}
        got_valid = np.broadcast_to(evaluate(valid, env), concrete_shape)
        got_index = np.broadcast_to(evaluate(index, env), concrete_shape)
        np.testing.assert_array_equal(got_valid, c.expected != PAD_VALUE)
        np.testing.assert_array_equal(np.where(got_valid, got_index, PAD_VALUE), c.expected)
    except Exception as e: raise AssertionError(_fuzz_failure(seed, f"{shape} {ops}")) from e
