"""The CPU matmul (codegen/cpu_gemm.py, heuristics._cpu_gemm): packed panels of B and the register tile, checked
against numpy on random shapes: odd sizes, a single row or column, batched, transposed operands, fused epilogues."""
import re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.cpu_gemm import PACK_MIN_ROWS, gemm_axes, gemm_tile, pack_plan
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.device import Device
from tgrad.ops import Ops
from tgrad.realize import lower_schedule
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.schedule import create_schedule

AVX2, AVX512 = (32, 16), (64, 32)
# float32 sums of K products of values in [-1, 1): each output is off by a few ulps of √K-sized partial sums
RTOL, ATOL = 1e-5, 1e-4

def _rand(rng, *shape) -> np.ndarray: return rng.uniform(-1, 1, shape).astype(np.float32)

def _kernel_items(out: Tensor):
  return [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]

def _packed(out: Tensor) -> bool:
  """Whether the kernel that makes `out` runs with B packed on this machine's CPU (nothing is run)."""
  return pack_plan(_kernel_items(out)[-1].ast, Device["LLVM"].renderer) is not None

def _check(out: Tensor, expected: np.ndarray) -> None:
  np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)

def test_tile_sized_for_the_registers():
  assert gemm_tile(*AVX2, Tensor([1.0]).dtype) == gemm_tile(32, 16, Tensor([1.0]).dtype)
  avx2, avx512 = gemm_tile(*AVX2, Tensor([1.0]).dtype), gemm_tile(*AVX512, Tensor([1.0]).dtype)
  assert (avx2.rows, avx2.columns) == (4, 16) and (avx512.rows, avx512.columns) == (8, 32)
  # accumulators + the B registers + a broadcast fit the register file
  for simd, tile in ((AVX2, avx2), (AVX512, avx512)):
    assert tile.rows * tile.columns * 4 // simd[0] + tile.columns * 4 // simd[0] + 1 <= simd[1]

def test_heuristic_opts_of_a_matmul():
  rng = np.random.default_rng(0)
  a, b = Tensor(_rand(rng, 128, 96)).realize(), Tensor(_rand(rng, 96, 64)).realize()
  (item,) = _kernel_items(a @ b)
  kernel = Kernel(item.ast, LLVMRenderer(AVX2))
  axes = gemm_axes(kernel.state)
  assert axes is not None and (axes.rows, axes.columns) == (0, 1)
  hand_coded_optimizations(kernel)
  ops = [(o.op, o.axis, o.amount) for o in kernel.applied_opts]
  assert ops[:3] == [(OptOps.UPCAST, 1, 16), (OptOps.UPCAST, 0, 4), (OptOps.SWAP, 0, 1)]

def test_matvec_is_not_a_gemm():
  rng = np.random.default_rng(1)
  x, w = Tensor(_rand(rng, 1, 256)).realize(), Tensor(_rand(rng, 256, 512)).realize()
  (item,) = _kernel_items(x @ w)
  assert gemm_axes(Kernel(item.ast, LLVMRenderer(AVX2)).state) is None
  assert pack_plan(item.ast, LLVMRenderer(AVX2)) is None

@pytest.mark.parametrize("m, k, n, packed", [(PACK_MIN_ROWS, 256, 256, True), (PACK_MIN_ROWS - 1, 256, 256, False),
                                             (128, 64, 96, False), (128, 256, 264, False)])
def test_pack_plan_when_it_pays(m, k, n, packed):
  """Packed: enough rows reuse B, B is big, its columns divide into panels (264 = 16·16 + 8 doesn't)."""
  rng = np.random.default_rng(2)
  a, b = Tensor(_rand(rng, m, k)).realize(), Tensor(_rand(rng, k, n)).realize()
  (item,) = _kernel_items(a @ b)
  plan = pack_plan(item.ast, LLVMRenderer(AVX2))
  assert (plan is not None) == packed
  if packed:
    assert plan.scratch[0][0] == k * n and len(plan.steps) == 2
    assert len(lower_schedule([item])) == 2   # the copy into panels, then the product

def test_packed_layout_is_panels():
  """The pack kernel alone writes B as [N/16, K, 16]."""
  rng = np.random.default_rng(3)
  b_np = _rand(rng, 256, 512)
  a, b = Tensor(_rand(rng, 64, 256)).realize(), Tensor(b_np).realize()
  (item,) = _kernel_items(a @ b)
  if not isinstance(Device["LLVM"].renderer, LLVMRenderer): pytest.skip("the default CPU device is not LLVM")
  pack, _ = lower_schedule([item])
  pack.run()
  tile = gemm_tile(Device["LLVM"].renderer.vector_bytes, Device["LLVM"].renderer.vector_registers, b.dtype)
  got = np.frombuffer(pack.bufs[0].copyout(), dtype=np.float32).reshape(512 // tile.columns, 256, tile.columns)
  np.testing.assert_array_equal(got, b_np.reshape(256, 512 // tile.columns, tile.columns).transpose(1, 0, 2))

def test_panel_copy_steps_over_several_panels():
  """The copy into panels reads CPU_COPY_PANELS panels' width of each row of B per step (UPCAST of the panels)."""
  from tgrad.codegen.heuristics import CPU_COPY_PANELS
  rng = np.random.default_rng(10)
  a, b = Tensor(_rand(rng, 64, 256)).realize(), Tensor(_rand(rng, 256, 512)).realize()
  (item,) = _kernel_items(a @ b)
  copy = Kernel(pack_plan(item.ast, LLVMRenderer(AVX2)).steps[0][0], LLVMRenderer(AVX2))
  assert copy.full_shape == (512 // 16, 256, 16)
  hand_coded_optimizations(copy)
  assert (copy.applied_opts[0].op, copy.applied_opts[0].axis, copy.applied_opts[0].amount) == \
    (OptOps.UPCAST, 0, CPU_COPY_PANELS)

SHAPES = [(64, 256, 256), (100, 300, 512), (67, 129, 256), (256, 64, 1024), (1, 256, 256), (256, 256, 1),
          (64, 1, 256), (5, 7, 3), (96, 256, 48)]

@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matmul_shapes(m, k, n):
  rng = np.random.default_rng(m * 7 + k * 3 + n)
  a, b = _rand(rng, m, k), _rand(rng, k, n)
  _check(Tensor(a) @ Tensor(b), a @ b)

@pytest.mark.parametrize("transpose_a, transpose_b", [(False, True), (True, False), (True, True)])
def test_transposed_operands(transpose_a, transpose_b):
  rng = np.random.default_rng(4)
  a_np, b_np = _rand(rng, 96, 192), _rand(rng, 192, 512)
  a = Tensor(np.ascontiguousarray(a_np.T)).T if transpose_a else Tensor(a_np)
  b = Tensor(np.ascontiguousarray(b_np.T)).T if transpose_b else Tensor(b_np)
  assert _packed(a @ b)
  _check(a @ b, a_np @ b_np)

def test_batched_and_broadcast_weights():
  rng = np.random.default_rng(5)
  x, y, w = _rand(rng, 3, 80, 128), _rand(rng, 3, 128, 256), _rand(rng, 128, 512)
  assert _packed(Tensor(x) @ Tensor(y)) and _packed(Tensor(x) @ Tensor(w))
  _check(Tensor(x) @ Tensor(y), x @ y)   # B differs per batch: one set of panels per batch
  _check(Tensor(x) @ Tensor(w), x @ w)   # B shared by the batch: packed once

def test_fused_epilogues():
  rng = np.random.default_rng(6)
  x, w, bias, res = _rand(rng, 128, 256), _rand(rng, 256, 512), _rand(rng, 512), _rand(rng, 128, 512)
  tx, tw, tb, tr = (Tensor(v) for v in (x, w, bias, res))
  product = x @ w
  assert _packed((tx @ tw + tb).relu())
  _check((tx @ tw + tb).relu(), np.maximum(product + bias, 0))
  _check(tx @ tw + tr, product + res)
  gelu = 0.5 * product * (1 + np.tanh(np.sqrt(2 / np.pi) * (product + 0.044715 * product ** 3)))
  np.testing.assert_allclose((tx @ tw).gelu().numpy(), gelu, rtol=1e-4, atol=1e-4)
  _check(tx.linear(tw, tb), product + bias)
  # nn.Linear's layout: x @ W.T with W [out, in]
  _check(tx @ Tensor(np.ascontiguousarray(w.T)).T, product)

def test_computed_a_is_materialized():
  """A relu'd A fused into the matmul is computed once into its own scratch buffer: three kernels, numpy's values."""
  rng = np.random.default_rng(9)
  h, w = _rand(rng, 128, 256), _rand(rng, 256, 256)
  out = Tensor(h).relu() @ Tensor(w)
  (item,) = _kernel_items(out)
  plan = pack_plan(item.ast, LLVMRenderer(AVX2))
  assert plan is not None and len(plan.steps) == 3 and plan.scratch[1][0] == 128 * 256
  _check(out, np.maximum(h, 0) @ w)
  x, y = _rand(rng, 96, 128), _rand(rng, 128, 512)   # both sides computed, an epilogue too
  _check(((Tensor(x) * 2).exp() @ Tensor(y).relu() + 1).relu(), np.maximum(np.exp(x * 2) @ np.maximum(y, 0) + 1, 0))

def test_fuzz_random_shapes():
  """Random sizes around the packing and tiling thresholds, some batched, against numpy."""
  rng = np.random.default_rng(7)
  for _ in range(12):
    m, k = int(rng.integers(1, 160)), int(rng.integers(1, 300))
    n = int(rng.choice([16, 32, 48, 64, 256, 512])) if rng.random() < 0.7 else int(rng.integers(1, 300))
    batch = (int(rng.integers(1, 3)),) if rng.random() < 0.3 else ()
    a, b = _rand(rng, *batch, m, k), _rand(rng, *batch, k, n)
    _check(Tensor(a) @ Tensor(b), a @ b)

def test_matmul_in_a_jit():
  """The packed buffer is part of the captured launches: replays give the product of the new inputs."""
  from tgrad.jit import TinyJit
  rng = np.random.default_rng(8)
  step = TinyJit(lambda x, w: (x @ w).realize())
  w = Tensor(_rand(rng, 256, 256)).realize()
  for _ in range(3):
    x = _rand(rng, 64, 256)
    _check(step(Tensor(x).realize(), w), x @ w.numpy())

# ---- packed copies of unchanged weights kept between calls (tgrad/kept_copies.py)

def _kept_copy_launches(out: Tensor) -> tuple[int, int]:
  """(copies run, copies skipped) by the kept copies while `out` is realized."""
  from tgrad import kept_copies
  calls = {"ran": 0, "skipped": 0}
  original = kept_copies.KeptCopy.__call__
  def counting(self, bufs, wait=False, var_vals=None):
    before = kept_copies._copied_at.get(bufs[0])
    result = original(self, bufs, wait, var_vals)
    calls["skipped" if before == kept_copies._copied_at.get(bufs[0]) else "ran"] += 1
    return result
  kept_copies.KeptCopy.__call__ = counting
  try: out.realize()
  finally: kept_copies.KeptCopy.__call__ = original
  return calls["ran"], calls["skipped"]

def test_a_weights_panels_are_kept_while_it_is_unchanged():
  """The second product with a weight packs it into a Buffer of its own, later ones reuse it; every way of writing
  the weight (an in-place assign, a copy in, a TinyJit replay that assigns it) makes the next product copy again."""
  from tgrad.jit import TinyJit
  from tgrad.kept_copies import forget_kept_copies
  forget_kept_copies()
  rng = np.random.default_rng(10)
  x, w = _rand(rng, 128, 256), _rand(rng, 256, 512)
  tx, tw = Tensor(x).realize(), Tensor(w).realize()
  assert _kept_copy_launches(tx @ tw) == (0, 0)   # first sighting: the shared scratch buffer
  assert _kept_copy_launches(product := tx @ tw) == (1, 0)
  _check(product, x @ w)
  for _ in range(2):
    assert _kept_copy_launches(product := tx @ tw) == (0, 1)
    _check(product, x @ w)
  tw.assign(tw * 2).realize()
  assert _kept_copy_launches(product := tx @ tw) == (1, 0)
  _check(product, x @ (w * 2))
  tw.lazydata.base.buffer.copyin(w * 3)
  _check(tx @ tw, x @ (w * 3))
  scale = TinyJit(lambda s: tw.assign(tw * s).realize())
  expected = w * 3
  for _ in range(3):   # capture, then replays that write the weight outside `run`
    scale(Tensor(np.full(1, 0.5, np.float32)).realize())
    expected = expected * 0.5
    _check(tx @ tw, x @ expected)
  forget_kept_copies()

def test_kept_copies_in_a_jit_only_from_weights():
  """Inside a TinyJit, a weight's panel copy is kept (replays skip it until the weight is written); a copy of an input
  or of a value the program computes runs in every replay."""
  from tgrad.jit import TinyJit
  from tgrad.kept_copies import KeptCopy, forget_kept_copies
  forget_kept_copies()
  rng = np.random.default_rng(11)
  w = Tensor(_rand(rng, 256, 256)).realize()
  def products(x: Tensor, y: Tensor) -> Tensor:   # each product its own kernel
    return ((x @ w).realize() + (x @ (y * 2)).realize() + (x @ (x.T @ x)).realize() / 100).realize()
  step = TinyJit(products)
  for call in range(5):
    x, y = _rand(rng, 128, 256), _rand(rng, 256, 256)
    if call == 4: w.assign(w * 2).realize()
    expected = x @ w.numpy() + x @ (y * 2) + x @ (x.T @ x) / 100
    np.testing.assert_allclose(step(Tensor(x).realize(), Tensor(y).realize()).numpy(), expected, rtol=1e-4,
                               atol=1e-3)
  kept = [ins for ins in step.captured.instructions if isinstance(ins.runner, KeptCopy)]
  assert len(kept) == 1 and step.captured.slots[kept[0].args[1]].buffer is w.lazydata.base.buffer
  forget_kept_copies()

# ---- a symbolic row count (a prompt's tokens): rows padded to whole tiles, no guard

def _symbolic_rows(a: np.ndarray, rows: int) -> Tensor:
  from tgrad.shape.sint import Variable
  return Tensor(a).realize().shrink(((0, Variable("n", 1, a.shape[0]).bind(rows)), None))

@pytest.mark.parametrize("rows", [1, 5, 67, 128])
def test_symbolic_rows_are_padded_to_the_tile(rows):
  """The matmul of a prompt of any length packs B, copies A with its rows padded to the register tile's, and runs the
  whole tile with no padding guard; the rows past the prompt are never stored."""
  rng = np.random.default_rng(12)
  a, b = _rand(rng, 131, 640), _rand(rng, 640, 256)
  out = _symbolic_rows(a, rows) @ Tensor(b).realize()
  plan = pack_plan(_kernel_items(out)[-1].ast, LLVMRenderer(AVX2))
  assert plan is not None and len(plan.steps) == 3   # B's panels, A's padded copy, the matmul
  kernel = Kernel(plan.steps[-1][0], LLVMRenderer(AVX2))
  hand_coded_optimizations(kernel)
  assert [(o.op, o.amount) for o in kernel.applied_opts][:3] == [(OptOps.UPCAST, 16), (OptOps.UPCAST, 4),
                                                                  (OptOps.SWAP, 1)]
  assert not kernel.padding_guards
  got = out.numpy()
  assert got.shape == (rows, 256)
  np.testing.assert_allclose(got, a[:rows] @ b, rtol=RTOL, atol=ATOL)

def test_padded_tile_rows_store_in_one_branch_each():
  """The LLVM renderer puts the masked stores of one row of a padded tile in one branch: 4 branches for a 4×16 tile,
  not one per store (which kept the SLP vectorizer from the row's stores)."""
  from tgrad.codegen.linearizer import linearize
  rng = np.random.default_rng(13)
  out = _symbolic_rows(_rand(rng, 100, 256), 50) @ Tensor(_rand(rng, 256, 256)).realize()
  plan = pack_plan(_kernel_items(out)[-1].ast, LLVMRenderer(AVX2))
  kernel = Kernel(plan.steps[-1][0], LLVMRenderer(AVX2))
  hand_coded_optimizations(kernel)
  source = kernel.renderer.render("gemm", linearize(kernel))
  assert len(re.findall(r'^"?store(\.\d+)?"?:', source, re.MULTILINE)) == gemm_tile(*AVX2, out.dtype).rows

@pytest.mark.parametrize("keys", [1, 7, 40])
def test_symbolic_reduce_gets_the_register_tile(keys):
  """Attention's probabilities times values over a prompt: rows (heads × queries) and the summed keys both symbolic,
  the head dim known. The register tile applies (rows by 4: 4·keys rows is a multiple of the tile), and the values
  match numpy at every length."""
  from tgrad.shape.sint import Variable
  rng = np.random.default_rng(14)
  heads, most, dim = 4, 48, 256
  p_np, v_np = _rand(rng, heads, most, most), _rand(rng, most, dim)
  n = Variable("n", 1, most).bind(keys)
  p = Tensor(p_np).realize().shrink((None, (0, n), (0, n))).reshape(heads * n, n)
  v = Tensor(v_np).realize().shrink(((0, n), None))
  out = p @ v
  kernel = Kernel(_kernel_items(out)[-1].ast, LLVMRenderer(AVX2))
  assert gemm_axes(kernel.state) is not None
  hand_coded_optimizations(kernel)
  assert [(o.op, o.amount) for o in kernel.applied_opts][:3] == [(OptOps.UPCAST, 16), (OptOps.UPCAST, 4),
                                                                  (OptOps.SWAP, 1)]
  expected = (p_np[:, :keys, :keys] @ v_np[:keys]).reshape(heads * keys, dim)
  np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=ATOL)

def test_symbolic_reduce_into_known_outputs_keeps_its_opts():
  """Decode attention's probabilities times values (4 heads × one query over the filled cache slots): outputs of
  known count, a symbolic reduce. It keeps the generic rules (the register tile was slower there), not the matmul's."""
  from tgrad.shape.sint import Variable
  rng = np.random.default_rng(15)
  p_np, v_np = _rand(rng, 4, 64), _rand(rng, 64, 256)
  n = Variable("n", 1, 64).bind(30)
  out = Tensor(p_np).realize().shrink((None, (0, n))) @ Tensor(v_np).realize().shrink(((0, n), None))
  kernel = Kernel(_kernel_items(out)[-1].ast, LLVMRenderer(AVX2))
  hand_coded_optimizations(kernel)
  assert not any(o.op is OptOps.SWAP or (o.op is OptOps.UPCAST and o.amount == 4) for o in kernel.applied_opts)
  np.testing.assert_allclose(out.numpy(), p_np[:, :30] @ v_np[:30], rtol=RTOL, atol=ATOL)
