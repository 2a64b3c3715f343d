"""The CPU's packed products: a normed product reads x once (the norm a row kernel of its own, then one sum per output
row), an unrolled sum's shared factor goes last in each product (reduces.shared_factors_last; on a GPU it is taken out
of the sum: reduces.factor_shared_out), and the values stay x·Wᵀ against float64 over numpy's view of the dequantized
blocks, at odd row counts."""
import os, sys
from types import SimpleNamespace
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.reduces import factor_shared_out, shared_factors_last
from tgrad.dtype import dtypes
from tgrad.nn.quant import GGMLType, QuantizedTensor, rms_normed_linear, recomputes_rows
from tgrad.ops import Ops, UOp
from tgrad.schedule import create_schedule
sys.path.insert(0, os.path.dirname(__file__))
from test_int8_matvec import packed_weight  # noqa: E402  (random quants, finite float16 scales)

CASES = [(GGMLType.Q8_0, 37, 96), (GGMLType.Q5_0, 45, 160), (GGMLType.Q4_K, 13, 512), (GGMLType.Q6_K, 11, 512)]
RTOL = 1e-5   # of the largest |output|: float32 products and sums against float64
EPS = 1e-6

def _reference(weight, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
  x64 = x.astype(np.float64)
  inverse = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + EPS)
  return (x64 * inverse * scale) @ weight.dequantize().numpy().astype(np.float64).T

@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=str)
def test_normed_product_reads_x_once_on_cpu(ggml_type, rows, columns):
  """On LLVM (no ROW_COPIES) the default is a row kernel that normalizes x and a product kernel with one sum; x given
  as copies per output row with x itself (`vector`) takes the same two kernels. Both match float64."""
  raw, _ = packed_weight(ggml_type, rows, columns, seed=rows)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()   # the CPU on any machine
  rng = np.random.default_rng(columns)
  x, scale = rng.standard_normal((1, columns)).astype(np.float32), rng.uniform(0.5, 1.5, columns).astype(np.float32)
  xt, st = Tensor(x, device="LLVM").realize(), Tensor(scale, device="LLVM").realize()
  reference = _reference(weight, x, scale)
  copies = xt.reshape(1, 1, columns).expand(1, rows, columns)
  for out in (rms_normed_linear(xt, st, weight, EPS), rms_normed_linear(copies, st, weight, EPS, copies=True,
                                                                       vector=xt)):
    kernels = [item.ast for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
    assert len(kernels) == 2 and sum(u.op is Ops.REDUCE_AXIS for u in kernels[-1].toposort()) == 1
    got = out.numpy().astype(np.float64).reshape(reference.shape)
    np.testing.assert_allclose(got, reference, rtol=RTOL, atol=RTOL * np.abs(reference).max())

def test_row_copies_trait():
  """A CUDA x keeps the one-kernel product that recomputes the norm per row; an LLVM x and a sharded one (a tuple
  of devices) do not / do."""
  assert recomputes_rows(SimpleNamespace(device="CUDA")) and recomputes_rows(SimpleNamespace(device="CUDA:1"))
  assert not recomputes_rows(SimpleNamespace(device="LLVM"))
  assert recomputes_rows(SimpleNamespace(device=("LLVM:0", "LLVM:1")))

def _var(name: str, dtype=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_VAR, dtype, (), (name, -8, 8))

def test_shared_factor_goes_last():
  """Σ xᵢ·(d·qᵢ): each product becomes (xᵢ·qᵢ)·d (d in every term, the rest in one); terms with no shared factor,
  and integer terms, are left as they are."""
  d, xs, qs = _var("d"), [_var(f"x{i}") for i in range(3)], [_var(f"q{i}") for i in range(3)]
  terms = [UOp(Ops.MUL, dtypes.float32, (x, UOp(Ops.MUL, dtypes.float32, (d, q)))) for x, q in zip(xs, qs)]
  out = shared_factors_last(terms)
  assert len(out) == 3
  for term, x, q in zip(out, xs, qs):
    assert term.op is Ops.MUL and term.src[1] is d and set(term.src[0].src) == {x, q}
  plain = [UOp(Ops.MUL, dtypes.float32, (x, q)) for x, q in zip(xs, qs)]
  assert shared_factors_last(plain) == plain
  # two scales: the one in more terms goes outermost (a Q6_K block's d, then a sub-block's scale)
  s = _var("s")
  nested = [UOp(Ops.MUL, dtypes.float32, (x, UOp(Ops.MUL, dtypes.float32, (UOp(Ops.MUL, dtypes.float32, (d, s)), q))))
            for x, q in zip(xs[:2], qs[:2])] + [UOp(Ops.MUL, dtypes.float32, (xs[2], d))]
  out = shared_factors_last(nested)
  assert all(term.src[1] is d for term in out) and all(term.src[0].src[1] is s for term in out[:2])

def _evaluate(value: UOp, env: dict[str, float]) -> float:
  if value.op is Ops.DEFINE_VAR: return env[value.arg[0]]
  a, b = (_evaluate(v, env) for v in value.src)
  return a + b if value.op is Ops.ADD else a * b

def _multiplies_by(values: list[UOp], factor: UOp) -> int:
  return sum(1 for u in UOp(Ops.SINK, dtypes.void, tuple(values)).toposort() if u.op is Ops.MUL and factor in u.src)

def test_shared_factor_taken_out_on_gpu():
  """Σ xᵢ·(d·s·qᵢ) over two sub-blocks of scales s, t and a term of d alone: d multiplies once, each sub-block's scale
  once, and the total is the same (random values, float64 evaluation); terms with no shared factor are left alone."""
  d, s, t = _var("d"), _var("s"), _var("t")
  xs, qs = [_var(f"x{i}") for i in range(5)], [_var(f"q{i}") for i in range(5)]
  def mul(*factors: UOp) -> UOp:
    out = factors[0]
    for f in factors[1:]: out = UOp(Ops.MUL, dtypes.float32, (out, f))
    return out
  terms = [mul(xs[i], d, s, qs[i]) for i in range(2)] + [mul(xs[i], d, t, qs[i]) for i in range(2, 4)] + \
          [mul(xs[4], d)]
  out = factor_shared_out(terms)
  assert _multiplies_by(out, d) == 1 and _multiplies_by(out, s) == 1 and _multiplies_by(out, t) == 1
  rng = np.random.default_rng(0)
  for _ in range(5):
    env = {v.arg[0]: float(rng.standard_normal()) for v in [d, s, t] + xs + qs}
    np.testing.assert_allclose(sum(_evaluate(v, env) for v in out), sum(_evaluate(v, env) for v in terms), rtol=1e-12)
  plain = [UOp(Ops.MUL, dtypes.float32, (x, q)) for x, q in zip(xs, qs)]
  assert factor_shared_out(plain) == plain

def test_min_term_distributed_and_taken_out_on_gpu():
  """Σ xᵢ·(a·qᵢ + −(dmin·m)) over two sub-blocks (a K-quant's values, (d·sc)·q − dmin·m): distributed, each
  sub-block's a and −(dmin·m) multiply once ((a·Σ xᵢqᵢ) + (−(dmin·m))·Σ xᵢ), and the total is the same (random values,
  float64 evaluation). A sum x·(p + q) whose p shares nothing stays as it is."""
  def mul(*factors: UOp) -> UOp:
    out = factors[0]
    for f in factors[1:]: out = UOp(Ops.MUL, dtypes.float32, (out, f))
    return out
  def add(p: UOp, q: UOp) -> UOp: return UOp(Ops.ADD, dtypes.float32, (p, q))
  a, b, c, e = _var("a"), _var("b"), _var("c"), _var("e")
  xs, qs = [_var(f"x{i}") for i in range(6)], [_var(f"q{i}") for i in range(6)]
  terms = [mul(xs[i], add(mul(a, qs[i]), b)) for i in range(3)] + \
          [mul(add(mul(c, qs[i]), e), xs[i]) for i in range(3, 6)]   # either operand order
  out = factor_shared_out(terms)
  for factor in (a, b, c, e): assert _multiplies_by(out, factor) == 1, factor
  rng = np.random.default_rng(1)
  for _ in range(5):
    env = {v.arg[0]: float(rng.standard_normal()) for v in [a, b, c, e] + xs + qs}
    np.testing.assert_allclose(sum(_evaluate(v, env) for v in out), sum(_evaluate(v, env) for v in terms), rtol=1e-12)
  lone = [mul(xs[i], add(qs[i], b)) for i in range(3)]   # qᵢ shares no factor: distributing would add multiplies
  assert factor_shared_out(lone) == lone

def test_tied_shared_factors_come_out_in_the_order_written():
  """Two factors shared by the same terms (an embedding's scale and a block's) tie; the one written first comes out
  outermost, whatever the UOps' addresses (they hash by identity: a set of them iterates in memory order, and the
  same kernel rendered two ways from process to process). Fresh factors in shuffled creation order, many times."""
  rng = np.random.default_rng(0)
  for trial in range(40):
    names = [f"first{trial}", f"second{trial}"]
    made = {name: _var(name) for name in (names if rng.random() < 0.5 else names[::-1])}
    first, second = made[names[0]], made[names[1]]
    xs = [_var(f"x{trial}_{i}") for i in range(3)]
    terms = [UOp(Ops.MUL, dtypes.float32, (UOp(Ops.MUL, dtypes.float32, (x, first)), second)) for x in xs]
    (out,) = factor_shared_out(terms)
    assert out.op is Ops.MUL and out.src[1] is first, trial
