"""Row kernels (schedule.py rule 2b): softmax, log_softmax, rms_norm and layer_norm over the last axis are one kernel
each while the row fits MAX_ROW_FUSION_SIZE, with the old kernel counts above it; their values match torch (float32 and
float16), gradients still flow; the opts keep them legal; their CUDA renderings compile with NVRTC (and run on a GPU
where there is one); a seeded fuzzer checks random reduce → elementwise → reduce → elementwise chains against numpy.
"""
import random
import numpy as np
import pytest
import torch
from tgrad.tensor import Tensor
from tgrad.dtype import dtypes
from tgrad.ops import Ops
from tgrad.device import Buffer
from tgrad.realize import compile_kernel
from tgrad.schedule import create_schedule, MAX_ROW_FUSION_SIZE
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import LLVMRenderer, reorderable_accumulators
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.helpers import prod

RMS_EPS, LN_EPS = 1e-6, 1e-5
OPS = {   # name → (tgrad, torch, kernels above MAX_ROW_FUSION_SIZE: one per reduce plus the store)
  "softmax": (lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1), 3),
  "log_softmax": (lambda x: x.log_softmax(-1), lambda x: torch.log_softmax(x, -1), 3),
  "rms_norm": (lambda x: x.rmsnorm(-1, RMS_EPS), lambda x: torch.nn.functional.rms_norm(x, x.shape[-1:], eps=RMS_EPS),
               2),
  "layer_norm": (lambda x: x.layernorm(-1, LN_EPS),
                 lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:], eps=LN_EPS), 3),
}
ROW_SIZES = [1, 7, 64, 640, 1000]
RTOL = {np.float32: 1e-5, np.float16: 2e-3}   # float16 inputs: tgrad computes in float32 and rounds once
ATOL = {np.float32: 1e-6, np.float16: 1e-3}
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

def kernel_count(out: Tensor) -> int:
  return sum(1 for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK)

def data(*shape: int, dtype=np.float32, seed: int = 0) -> np.ndarray:
  return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)

def check_against_torch(name: str, x: np.ndarray, device: str = "LLVM") -> None:
  tg, th, _ = OPS[name]
  got = tg(Tensor(x, device=device)).numpy()
  want = th(torch.from_numpy(x.astype(np.float32))).numpy().astype(x.dtype)
  np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=RTOL[x.dtype.type],
                             atol=ATOL[x.dtype.type], err_msg=f"{name} of {x.shape} {x.dtype}")

# ---- kernel counts and values

@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("size", ROW_SIZES)
def test_one_kernel_per_row_op(name, size):
  x = data(5, size)
  assert kernel_count(OPS[name][0](Tensor(x).realize())) == 1
  check_against_torch(name, x)

@pytest.mark.parametrize("name", OPS)
def test_rows_above_the_limit_keep_the_old_schedule(name):
  x = data(3, MAX_ROW_FUSION_SIZE + 8)
  assert kernel_count(OPS[name][0](Tensor(x).realize())) == OPS[name][2]
  check_against_torch(name, x)

@pytest.mark.parametrize("name", OPS)
def test_row_at_the_limit_is_one_kernel(name):
  x = data(2, MAX_ROW_FUSION_SIZE)
  assert kernel_count(OPS[name][0](Tensor(x).realize())) == 1
  check_against_torch(name, x)

@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", [(1, 640), (2, 3, 5, 33), (4, 1, 999), (17, 1), (1, 1)])
def test_odd_sizes_size_one_rows_and_batch_dims(name, shape):
  x = data(*shape, seed=1)
  assert kernel_count(OPS[name][0](Tensor(x).realize())) == 1
  check_against_torch(name, x)

@pytest.mark.parametrize("name", OPS)
def test_float16(name):
  x = data(6, 640, dtype=np.float16, seed=2)
  assert kernel_count(OPS[name][0](Tensor(x).realize())) == 1
  check_against_torch(name, x)

def test_other_row_reductions_are_one_kernel():
  x = data(8, 100, seed=3)
  t, xt = Tensor(x).realize(), torch.from_numpy(x)
  cases = [(t.logsumexp(-1), xt.logsumexp(-1)), (t.var(-1), xt.var(-1)), (t.std(-1), xt.std(-1)),
           (t - t.mean(-1, keepdim=True), xt - xt.mean(-1, keepdim=True)),
           (t.normalize(dim=-1), torch.nn.functional.normalize(xt, dim=-1))]
  for got, want in cases:
    assert kernel_count(got) == 1
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)

def test_contiguous_softmax_is_one_kernel():
  x = data(8, 100, seed=12)
  out = Tensor(x).realize().softmax(-1).contiguous()
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5, atol=1e-7)

def test_a_row_kernel_over_a_middle_axis():
  x = data(4, 50, 6, seed=4)
  out = Tensor(x).realize().softmax(axis=1)
  assert kernel_count(out) == 1
  np.testing.assert_allclose(out.numpy(), torch.softmax(torch.from_numpy(x), 1).numpy(), rtol=1e-5, atol=1e-7)

def test_an_intermediate_output_splits_the_row_kernel():
  """exp(x - max) is an output too: it is one row kernel (max, then the row), the sum and division a second that reads
  it; the first kernel's reduce isn't read outside it."""
  xn = data(4, 32, seed=5)
  x = Tensor(xn).realize()
  shifted = (x - x.max(-1, keepdim=True)).exp()
  out = shifted / shifted.sum(-1, keepdim=True)
  items = create_schedule([out.lazydata, shifted.lazydata])
  assert sum(1 for item in items if item.ast.op is Ops.SINK) == 2
  np.testing.assert_allclose(out.numpy(), torch.softmax(torch.from_numpy(xn), -1).numpy(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(shifted.numpy(), np.exp(xn - xn.max(-1, keepdims=True)), rtol=1e-5)

def test_attention_scores_softmax_is_one_kernel_before_the_matmul():
  rng = np.random.default_rng(6)
  q, k, v = (rng.standard_normal((2, 16, 8)).astype(np.float32) for _ in range(3))
  scores = (Tensor(q) @ Tensor(k).transpose(-1, -2)).realize()
  out = scores.softmax(-1) @ Tensor(v).realize()
  assert kernel_count(out) == 2   # the row kernel, then the matmul that reads its output
  ref = torch.softmax(torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2), -1) @ torch.from_numpy(v)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("name", OPS)
def test_gradients(name):
  x = data(4, 37, seed=7)
  weights = data(4, 37, seed=8)
  t = Tensor(x, requires_grad=True)
  (OPS[name][0](t) * Tensor(weights)).sum().backward()
  xt = torch.tensor(x, requires_grad=True)
  (OPS[name][1](xt) * torch.from_numpy(weights)).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)

# ---- the kernel: its passes, legal and illegal opts

def row_kernel(name: str, shape: tuple[int, ...], renderer) -> Kernel:
  (item,) = [i for i in create_schedule([OPS[name][0](Tensor(data(*shape))).lazydata]) if i.ast.op is Ops.SINK]
  return Kernel(item.ast, renderer)

@pytest.mark.parametrize("name,passes", [("softmax", 3), ("log_softmax", 3), ("rms_norm", 2), ("layer_norm", 3)])
def test_each_pass_is_one_loop_over_the_row(name, passes):
  kernel = row_kernel(name, (4, 96), LLVMRenderer())
  assert kernel.row_store and kernel.row_passes == passes
  assert kernel.output_shape == (4, 1) and kernel.full_shape == (4, 96)
  uops = linearize(kernel)
  row_loops = [u for u in uops if u.op is Ops.RANGE and u.src[1].arg == 96]
  assert len(row_loops) == passes, "the row is walked once per pass"
  # softmax's sum pass stores its exponentials, which the store pass reads back (value_graph.PassStore)
  assert sum(u.op is Ops.STORE for u in uops) == (2 if name == "softmax" else 1)

def test_softmax_on_the_cpu_computes_each_exponential_once():
  uops = linearize(row_kernel("softmax", (4, 96), LLVMRenderer()))
  row_loops = [i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.src[1].arg == 96]
  store_pass = uops[row_loops[-1]:]
  loads = [u for u in store_pass if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL]
  assert loads and all(u.src[0].arg == 0 for u in loads), "the store pass reads the output, not the input"
  assert not any(u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_GLOBAL for u in uops[:row_loops[1]]), \
    "nothing is stored before the sum's pass"
  # where an input is read in the store pass, the exponentials are computed again and not stored (log_softmax)
  assert sum(u.op is Ops.STORE for u in linearize(row_kernel("log_softmax", (4, 96), LLVMRenderer()))) == 1

@pytest.mark.parametrize("shape,opts", [((5, 96), []), ((5, 96), [Opt(OptOps.UNROLL, 0, 4)]),
                                        ((6, 33), [Opt(OptOps.UPCAST, 0, 2)]), ((6, 96), [Opt(OptOps.UPCAST, 0, 3),
                                                                                           Opt(OptOps.UNROLL, 0, 8)]),
                                        ((4, 8191), []), ((3, 8192), [Opt(OptOps.UNROLL, 0, 2)]), ((7, 1), []),
                                        ((4, 96), [Opt(OptOps.THREAD, 0, 2)])])
def test_softmax_stored_in_its_sum_pass_matches_torch(shape, opts):
  """The exponentials stored by the sum's pass (blocked past 4096 values, unrolled, output rows upcast, threads) are
  the ones the store pass divides."""
  x = data(*shape, seed=11)
  (item,) = [i for i in create_schedule([Tensor(x).realize().softmax(-1).lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, LLVMRenderer())
  for opt in opts: kernel.apply_opt(opt)
  want = torch.softmax(torch.from_numpy(x), -1).numpy()
  np.testing.assert_allclose(run_on_cpu(kernel, item, x.size).reshape(shape), want, rtol=1e-5, atol=1e-7)

def test_each_pass_sum_may_be_vectorized_on_the_cpu():
  """layer_norm's mean and variance sums are each the only accumulator of their loop: LLVM may reorder both."""
  uops = linearize(row_kernel("layer_norm", (4, 96), LLVMRenderer()))
  accumulators = {u.arg for u in uops if u.op is Ops.DEFINE_ACC}
  assert len(accumulators) == 2 and reorderable_accumulators(uops) == accumulators

def test_opts_that_would_break_a_row_kernel_are_refused():
  kernel = row_kernel("softmax", (4, 64), CUDARenderer())
  for opt in (Opt(OptOps.SMEM, 0, 0), Opt(OptOps.TC, 0, 0), Opt(OptOps.PADTO, 1, 80)):   # PADTO: a max reduce
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
  assert kernel.applied_opts == []
  rms = row_kernel("rms_norm", (4, 60), CUDARenderer())
  rms.apply_opt(Opt(OptOps.PADTO, 1, 64))   # a sum of squares ignores zero padding: the padded store is masked
  assert rms.full_shape == (4, 64)

def test_padded_unrolled_rms_norm_row_is_right_on_the_cpu():
  x = data(4, 60, seed=9)
  (item,) = [i for i in create_schedule([Tensor(x).realize().rmsnorm(-1, RMS_EPS).lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, LLVMRenderer())
  for opt in (Opt(OptOps.PADTO, 1, 64), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 0, 2)): kernel.apply_opt(opt)
  want = torch.nn.functional.rms_norm(torch.from_numpy(x), (60,), eps=RMS_EPS).numpy()
  np.testing.assert_allclose(run_on_cpu(kernel, item, x.size).reshape(x.shape), want, rtol=1e-5, atol=1e-6)

OPT_FUZZ_CASES = 30
OPT_FUZZ_OPTS = 3

def run_on_cpu(kernel: Kernel, item, size: int) -> np.ndarray:
  """Run `item`'s kernel, with its opts, on its inputs and scalar parameters (item.var_vals) on the LLVM device."""
  out = Buffer("LLVM", size, dtypes.float32)
  out.copyin(np.full(size, np.nan, np.float32))   # an element the kernel forgets stays NaN
  # on a GPU machine the inputs were realized on CUDA: the CPU kernel reads host copies of them
  inputs = [b if b.device == "LLVM" else Buffer("LLVM", b.size, b.dtype).copyin(b.copyout()) for b in item.inputs]
  compile_kernel("LLVM", kernel)([out, *inputs], var_vals=item.var_vals)
  return out.copyout()

@pytest.mark.parametrize("seed", range(OPT_FUZZ_CASES))
def test_random_legal_opts_on_row_kernels_match_torch(seed):
  """Random legal UPCAST/UNROLL/THREAD/PADTO/SWAP sequences on a row kernel (LLVM) keep its values."""
  rng = random.Random(seed)
  name = rng.choice(list(OPS))
  shape = (rng.choice([1, 2, 3, 4, 6, 8]), rng.choice([2, 3, 5, 12, 16, 17, 64]))
  x = data(*shape, seed=seed)
  (item,) = [i for i in create_schedule([OPS[name][0](Tensor(x).realize()).lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, LLVMRenderer())
  for _ in range(OPT_FUZZ_OPTS * 10):
    if len(kernel.applied_opts) == OPT_FUZZ_OPTS: break
    op = rng.choice([OptOps.UPCAST, OptOps.UNROLL, OptOps.UNROLL, OptOps.THREAD, OptOps.PADTO, OptOps.SWAP])
    try: kernel.apply_opt(Opt(op, rng.randrange(kernel.shape_len + 1), rng.choice([0, 2, 3, 4, 8, 16])))
    except KernelOptError: continue
  want = OPS[name][1](torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(run_on_cpu(kernel, item, x.size).reshape(shape), want, rtol=1e-5, atol=1e-5,
                             err_msg=f"{name} {shape} {kernel.applied_opts}")

CUDA_OPTS = [[], [Opt(OptOps.GROUP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 8)],
             [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUP, 0, 32)],
             [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.UNROLL, 1, 2)],
             [Opt(OptOps.NOLOCALS), Opt(OptOps.UNROLL, 0, 8)]]

@needs_nvrtc
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("opts", CUDA_OPTS, ids=lambda opts: "-".join(o.op.name for o in opts) or "none")
def test_cuda_rendering_compiles(name, opts):
  kernel = row_kernel(name, (8, 128), CUDARenderer())
  for opt in opts: kernel.apply_opt(opt)
  src = kernel.renderer.render("row_kernel", linearize(kernel))
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
  if kernel.group_for_reduces:   # every reduce (of each row a thread serves) is combined across the block, then read
    rows = prod(kernel.full_shape[a] for a in kernel.upcast_axes if not kernel.is_reduce_axis(a))   # by every thread
    assert src.count("__syncthreads();") == len(kernel.reduceops) * rows and "if (" not in src

@needs_nvrtc
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("size", ROW_SIZES + [4096, MAX_ROW_FUSION_SIZE])
def test_cuda_heuristics_compile(name, size):
  kernel = row_kernel(name, (3, size), CUDARenderer())
  hand_coded_optimizations(kernel)
  if size >= 64: assert kernel.group_for_reduces == 1, "a block shares each row"
  assert compile_cuda(kernel.renderer.render("row_kernel", linearize(kernel)), "sm_90")[:4] == b"\x7fELF"

@needs_nvrtc
@pytest.mark.parametrize("reduction", ["logsumexp", "var"])
def test_cuda_reduce_of_a_reduce_compiles(reduction):
  """A second reduce reads the first (no row store): every thread combines the first's partials, then its own pass;
  only the block's first thread stores."""
  x = Tensor(data(8, 1000)).realize()
  out = x.logsumexp(-1) if reduction == "logsumexp" else x.var(-1)
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  hand_coded_optimizations(kernel)
  assert not kernel.row_store and kernel.row_passes == 2 and kernel.group_for_reduces == 1
  src = kernel.renderer.render("nested", linearize(kernel))
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
  assert src.count("__syncthreads();") == 2 and src.count("if (") == 1

@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", [(5, 7), (3, 640), (2, 1000), (4, 4096), (2, MAX_ROW_FUSION_SIZE), (1, 1)])
def test_values_on_the_gpu(name, shape):
  check_against_torch(name, data(*shape, seed=10), device="CUDA")
  check_against_torch(name, data(*shape, dtype=np.float16, seed=11), device="CUDA")

# ---- a seeded fuzzer of reduce → elementwise → reduce → elementwise chains

FUZZ_CASES = 40
REDUCES = {"sum": (lambda t: t.sum(-1, keepdim=True), lambda a: a.sum(-1, keepdims=True)),
           "max": (lambda t: t.max(-1, keepdim=True), lambda a: a.max(-1, keepdims=True)),
           "mean": (lambda t: t.mean(-1, keepdim=True), lambda a: a.mean(-1, keepdims=True))}
UNARY = {"id": (lambda t: t, lambda a: a), "square": (lambda t: t * t, lambda a: a * a),
         "abs": (lambda t: t.abs(), np.abs), "tanh": (lambda t: t.tanh(), np.tanh),
         "exp": (lambda t: (t * 0.25).exp(), lambda a: np.exp(a * 0.25))}
BINARY = {"sub": (lambda t, r: t - r, lambda a, r: a - r), "mul": (lambda t, r: t * r, lambda a, r: a * r),
          "div": (lambda t, r: t / (r.abs() + 1), lambda a, r: a / (np.abs(r) + 1)),
          "add": (lambda t, r: t + r, lambda a, r: a + r)}

def random_chain(rng: random.Random):
  """(tgrad function, numpy function, description) of f(x) = g2(h(g1(x, r1)), r2) with r1 = R1(u1(x)),
  r2 = R2(u2(g1(x, r1)))."""
  r1, r2 = rng.choice(list(REDUCES)), rng.choice(list(REDUCES))
  u1, u2, u3 = rng.choice(list(UNARY)), rng.choice(list(UNARY)), rng.choice(list(UNARY))
  g1, g2 = rng.choice(list(BINARY)), rng.choice(list(BINARY))
  def build(side: int):
    def f(x):
      first = BINARY[g1][side](x, REDUCES[r1][side](UNARY[u1][side](x)))
      second = REDUCES[r2][side](UNARY[u2][side](first))
      return BINARY[g2][side](UNARY[u3][side](first), second)
    return f
  return build(0), build(1), f"{g2}({u3}({g1}(x, {r1}({u1}(x)))), {r2}({u2}(...)))"

@pytest.mark.parametrize("seed", range(FUZZ_CASES))
def test_random_chains_against_numpy(seed):
  rng = random.Random(seed)
  tg_fn, np_fn, what = random_chain(rng)
  shape = (rng.randint(1, 6), rng.choice([1, 3, 16, 65, 300]))
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  out = tg_fn(Tensor(x).realize())
  assert kernel_count(out) == 1, what
  want = np_fn(x.astype(np.float64))
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=what)
  if nvrtc_available() and seed % 4 == 0:   # the same kernel for a GPU, grouped where the row allows
    (item,) = [i for i in create_schedule([tg_fn(Tensor(x)).lazydata]) if i.ast.op is Ops.SINK]
    kernel = Kernel(item.ast, CUDARenderer())
    hand_coded_optimizations(kernel)
    compile_cuda(kernel.renderer.render("chain", linearize(kernel)), "sm_90")

def test_row_kernel_assigned_in_place_is_one_kernel():
  """A row kernel whose value is assigned into an existing buffer (a cache write of a normed row) stores straight
  into the target: one kernel, no separate buffer and copy; the values match torch."""
  rng = np.random.default_rng(11)
  x_np, target_np = rng.standard_normal((6, 40)).astype(np.float32), rng.standard_normal((6, 40)).astype(np.float32)
  mask_np = rng.random((6, 1)) < 0.5
  target, x, mask = Tensor(target_np).realize(), Tensor(x_np).realize(), Tensor(mask_np).realize()
  normed = x * (x.square().mean(-1, keepdim=True) + 1e-6).rsqrt()
  assigned = target.assign(mask.where(normed, target))
  items = [i for i in create_schedule([assigned.lazydata]) if i.ast.op is Ops.SINK]
  assert len(items) == 1
  assigned.realize()
  xt = torch.tensor(x_np)
  want = torch.where(torch.tensor(mask_np), xt * torch.rsqrt(xt.square().mean(-1, keepdim=True) + 1e-6),
                     torch.tensor(target_np))
  np.testing.assert_allclose(target.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
