"""The GPU rule for a row kernel whose last pass is a matrix–vector product (matvec_rules.py `_row_matvec`): gemma's
decode step fuses the post-attention norm, the residual add and the pre-feedforward norm into its gate/up kernel, two
2048×640 matvecs (gate and up, whose GELU(gate)·up it stores) whose every block first walks the 640-wide rows.

Without a GPU: a two-layer model with gemma-3-270m's layer shapes (and a small vocabulary) runs one decode step on
LLVM; its gate/up kernel is a row kernel that the rule gives 16-byte weight loads, a group of ROW_MATVEC_GROUP threads
per row and several rows per block, the rendered CUDA compiles with NVRTC, and kernels outside the rule keep their
opts. With a GPU (marked `gpu`): the same decode step's logits on CUDA against LLVM's.
"""
import numpy as np
import pytest
import tgrad.realize as realize_module
import tgrad.schedule_cache as schedule_cache
from tgrad import Tensor
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.matvec_rules import MATVEC_MIN_BLOCKS, ROW_MATVEC_GROUP, ROW_MATVEC_ROWS_PER_BLOCK
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.dtype import dtypes
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
LAYER_SHAPES = {**PRESETS["270m"], "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
                "vocab_size": 1024}
PROMPT = [2, 17, 99, 5, 300]
CACHE = 16

def decode_asts(dtype, device: str = "LLVM") -> tuple[list, np.ndarray]:
  """The kernel ASTs one greedy decode step runs (after a prompt), and that step's logits."""
  model = Gemma3.random(Gemma3Config.from_dict(LAYER_SHAPES), dtype, device, seed=0, progress=False)
  model.reset_cache(1, CACHE)
  model(Tensor(np.array([PROMPT], np.int32), device=device), 0, last_only=True).realize()
  asts, get_runner, seen = [], realize_module.get_runner, realize_module._single_kernels
  def recording(device, ast, *rest):
    asts.append(ast)
    return get_runner(device, ast, *rest)
  realize_module.get_runner = recording
  realize_module._single_kernels = set()   # no kernel run before (by another test) skips get_runner,
  schedule_cache.clear()                   # nor a cached schedule's eager plan
  try:
    logits = model(Tensor(np.array([[7]], np.int32), device=device), len(PROMPT), last_only=True).numpy()
  finally:
    realize_module.get_runner, realize_module._single_kernels = get_runner, seen
  return list({ast.key: ast for ast in asts}.values()), logits

def gate_up_kernels(asts) -> list[Kernel]:
  """The gate/up kernels of the step: one per distinct AST (layer 0's also computes the embedding lookup it reads)."""
  rows = LAYER_SHAPES["intermediate_size"]
  kernels = [Kernel(a, CUDARenderer()) for a in asts]
  found = [k for k in kernels if k.full_shape == (rows, LAYER_SHAPES["hidden_size"])]
  assert found, [k.full_shape for k in kernels]
  return found

@needs_nvrtc
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
def test_gate_up_row_kernel_gets_rows_per_block(dtype):
  asts, _ = decode_asts(dtype)
  for kernel in gate_up_kernels(asts):
    assert kernel.row_passes >= 2
    hand_coded_optimizations(kernel)
    opts = {opt.op: opt.amount for opt in kernel.applied_opts}
    assert opts[OptOps.UNROLL] * dtype.itemsize == 16, kernel.applied_opts   # 16-byte loads of W
    rows_per_block = ROW_MATVEC_ROWS_PER_BLOCK   # halved while that leaves fewer than MATVEC_MIN_BLOCKS blocks
    while rows_per_block > 1 and LAYER_SHAPES["intermediate_size"] // rows_per_block < MATVEC_MIN_BLOCKS:
      rows_per_block //= 2
    assert opts[OptOps.GROUP] == ROW_MATVEC_GROUP and opts.get(OptOps.LOCAL, 1) == rows_per_block > 1, \
      kernel.applied_opts
    compile_cuda(kernel.renderer.render("gate_up", linearize(kernel)), "sm_90")

@needs_nvrtc
def test_single_row_kernels_keep_the_generic_rule():
  """The decode step's 640-wide norm kernels (one output row) are not matvecs: no LOCAL rows."""
  asts, _ = decode_asts(dtypes.float32)
  checked = 0
  for ast in asts:
    kernel = Kernel(ast, CUDARenderer())
    if kernel.row_passes < 2 or kernel.full_shape != (LAYER_SHAPES["hidden_size"],): continue
    checked += 1
    hand_coded_optimizations(kernel)
    assert OptOps.LOCAL not in {opt.op for opt in kernel.applied_opts}, (kernel.full_shape, kernel.applied_opts)
  assert checked >= 1

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(dtypes.float32, 1e-4), (dtypes.float16, 2e-2)])
def test_gpu_decode_step_matches_llvm(dtype, rtol):
  _, cpu = decode_asts(dtype, "LLVM")
  _, gpu = decode_asts(dtype, "CUDA")
  cpu, gpu = cpu.astype(np.float64), gpu.astype(np.float64)
  np.testing.assert_allclose(gpu, cpu, rtol=rtol, atol=rtol * np.abs(cpu).max())

@pytest.mark.parametrize("width,group", [(4096, 128), (8192, 128), (1024, 64), (640, 40)])
def test_softmax_rows_group_grows_with_the_row(width, group):
  """A softmax's rows (one load, varying with its row) are not a matvec: one row per block, its group of threads
  growing with the row up to GPU_ROW_MAX_GROUP (heuristics.py GPU_ROW_STEPS_PER_THREAD)."""
  from tgrad.ops import Ops
  from tgrad.schedule import create_schedule
  x = Tensor.empty(64, width, dtype=dtypes.float32, device="LLVM")
  (item,) = [i for i in create_schedule([x.softmax(-1).lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  hand_coded_optimizations(kernel)
  opts = {opt.op: opt.amount for opt in kernel.applied_opts}
  assert opts.get(OptOps.GROUP) == group and OptOps.LOCAL not in opts, kernel.applied_opts

@pytest.mark.parametrize("rows,width,group", [(1, 640, 160), (8, 640, 160), (2, 1024, 256), (1, 100, 50), (9, 640, 40)])
def test_few_rows_take_a_step_a_thread_in_whole_warps(rows, width, group):
  """A row kernel of at most GPU_FEW_ROWS rows on a GPU whose group combines by warp shuffles: the largest group of
  whole warps that divides the row's steps (float4s from 256 wide), up to GPU_GROUP_THREADS. With no such group
  (100 wide) or more rows (9) the generic rule's: 50 threads of two values, 40 threads of four float4s."""
  from tgrad.codegen.heuristics import GPU_FEW_ROWS
  from tgrad.ops import Ops
  from tgrad.schedule import create_schedule
  assert (rows <= GPU_FEW_ROWS) == (rows != 9)
  x = Tensor.empty(rows, width, dtype=dtypes.float32, device="LLVM")
  normed = x * ((x * x).mean(-1, keepdim=True) + 1e-6).rsqrt()
  (item,) = [i for i in create_schedule([normed.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  hand_coded_optimizations(kernel)
  assert {opt.op: opt.amount for opt in kernel.applied_opts}.get(OptOps.GROUP) == group, kernel.applied_opts

@pytest.mark.parametrize("rows,width", [(1, 640), (3, 1024)])
def test_few_rows_norm_values_on_emulated_cuda(rows, width):
  """The few-rows rule's kernels (a group of whole warps, shuffled combines) against numpy, run on the CPU."""
  from cuda_on_cpu import cpu_available, run_kernel_emulated
  if not cpu_available(): pytest.skip("g++ not found")
  x = np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32)
  t = Tensor(x, device="LLVM").realize()
  got, source = run_kernel_emulated(t * ((t * t).mean(-1, keepdim=True) + 1e-6).rsqrt())
  assert "__shfl_xor_sync" in source
  x64 = x.astype(np.float64)
  want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(got.reshape(x.shape), want, rtol=2e-6, atol=1e-6)
