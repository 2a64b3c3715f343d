"""OptOps.SGEMM (codegen/simt_matmul.py, runtime/cuda/sgemm.py) without a GPU: which kernels qualify, the opt's rules,
what the heuristics and BEAM's actions do with it, that every tile's source compiles with NVRTC for sm_80 and sm_90,
and that the rendered kernel of every tile, run on the CPU (test/cuda_on_cpu.py) into a NaN-poisoned output, computes
numpy's float32 matmul on sizes that leave partial tiles on M, N and K, for each of the four operand layouts.
The GPU timing of every tile against torch is bench/sgemm.py."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.helpers import Context
from tgrad.schedule import create_schedule
from tgrad.codegen.axes import SimtMatmul
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.search import ACTIONS
from tgrad.codegen.simt_matmul import SIMT_TILES, default_tile, matmul_of
from tgrad.runtime.cuda import sgemm
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import LLVMRenderer

def data(*shape, dtype=dtypes.float32, seed=0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device="LLVM").cast(dtype) \
    .realize()

def last_kernel(out: Tensor, renderer=None) -> Kernel:
  return Kernel(create_schedule([out.lazydata])[-1].ast, renderer or CUDARenderer("sm_90"))

def product(m: int, n: int, k: int, a_m_major: bool, b_n_major: bool, seed: int = 0):
  """(a · b as a lazy tensor, a as M×K, b as K×N): each operand realized in the layout asked for."""
  a = data(k, m, seed=seed) if a_m_major else data(m, k, seed=seed)
  b = data(k, n, seed=seed + 1) if b_n_major else data(n, k, seed=seed + 1)
  a_view, b_view = (a.T if a_m_major else a), (b if b_n_major else b.T)
  return a_view @ b_view, a_view.numpy(), b_view.numpy(), a, b

@pytest.mark.parametrize("a_m_major", [False, True], ids=["a_MxK", "a_KxM"])
@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
def test_plain_float32_matmuls_qualify_in_every_layout(a_m_major, b_n_major):
  out = product(256, 192, 96, a_m_major, b_n_major)[0]
  use = matmul_of(last_kernel(out).state)
  assert isinstance(use, SimtMatmul), use
  assert (use.m, use.n, use.k, use.a_m_major, use.b_n_major) == (256, 192, 96, a_m_major, b_n_major)
  assert sorted(use.arguments) == ["a", "b", "out"]

@pytest.mark.parametrize("build,why", [
  (lambda: (data(256, 128) @ data(128, 256, seed=1)).relu(), "stores one"),   # max with a constant
  (lambda: data(256, 128, dtype=dtypes.float16) @ data(128, 256, dtype=dtypes.float16, seed=1), "products"),
  (lambda: data(4, 64, 32) @ data(4, 32, 64, seed=1), "output axes"),
  (lambda: data(64, 30) @ data(30, 64, seed=1).T.contiguous().realize().T, "multiple of 4"),   # K rows of 30
  (lambda: data(64, 32) @ data(32, 66, seed=1), "multiple of 4"),                              # K×N B, N = 66
  (lambda: data(64, 32) @ data(64, 32, seed=1)[::2].T, "contiguous"),                          # a strided B
], ids=["epilogue", "half", "batched", "odd_k", "odd_n", "strided"])
def test_other_kernels_are_refused_with_a_reason(build, why):
  kernel = last_kernel(build())
  assert why in matmul_of(kernel.state)
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.SGEMM, 0, 0))

def test_only_cuda_has_it():
  kernel = last_kernel(data(256, 128) @ data(128, 256, seed=1), LLVMRenderer())
  with pytest.raises(KernelOptError, match="no float32 matmul template"): kernel.apply_opt(Opt(OptOps.SGEMM, 0, 0))

def test_sgemm_is_the_first_and_only_opt():
  kernel = last_kernel(data(512, 256) @ data(256, 512, seed=1))
  with pytest.raises(KernelOptError, match="tile index"): kernel.copy().apply_opt(Opt(OptOps.SGEMM, 0, len(SIMT_TILES)))
  upcast = kernel.copy()
  upcast.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  with pytest.raises(KernelOptError, match="first"): upcast.apply_opt(Opt(OptOps.SGEMM, 0, 0))
  kernel.apply_opt(Opt(OptOps.SGEMM, 0, SIMT_TILES.index((128, 256, 8, 16, 1))))
  assert kernel.launch_dims() == ((2, 4), (256,))   # 512/256 column tiles, 512/128 row tiles, 16×16 threads
  for opt in (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SGEMM, 0, 0)):
    with pytest.raises(KernelOptError, match="float32 matmul template"): kernel.copy().apply_opt(opt)

def test_every_tile_is_a_valid_configuration_and_an_action():
  for tile in SIMT_TILES:
    config = sgemm.SgemmConfig(*tile)   # raises if the kernel can't take it
    assert config.threads in (64, 128, 256) and config.shared_bytes <= 48 * 1024   # static shared memory
  assert [opt for opt in ACTIONS if opt.op is OptOps.SGEMM] == [Opt(OptOps.SGEMM, 0, i) for i in range(len(SIMT_TILES))]
  with pytest.raises(ValueError): sgemm.SgemmConfig(128, 128, 8, 6)
  with pytest.raises(ValueError): sgemm.SgemmConfig(64, 32, 8, 8)   # 4 thread columns: not a warp's 8

def test_heuristics_pick_it_for_big_float32_matmuls_on_every_cuda_arch():
  big = data(1024, 512) @ data(512, 1024, seed=1)
  for arch in ("sm_90", "sm_80", "sm_75"):
    kernel = last_kernel(big, CUDARenderer(arch))
    hand_coded_optimizations(kernel)
    assert kernel.applied_opts == [Opt(OptOps.SGEMM, 0, default_tile(1024, 1024))] and kernel.simt_matmul
  with Context(SGEMM=0):   # the generic opts (a register tile)
    off = last_kernel(big)
    hand_coded_optimizations(off)
    assert off.simt_matmul is None and off.applied_opts and all(o.op is not OptOps.SGEMM for o in off.applied_opts)
  for other in (data(128, 64) @ data(64, 128, seed=1),                 # below MIN_MULTIPLY_ADDS
                (data(1024, 512) @ data(512, 1024, seed=1)).relu()):   # an epilogue
    kernel = last_kernel(other)
    hand_coded_optimizations(kernel)
    assert kernel.simt_matmul is None and Opt(OptOps.SGEMM, 0, 0) not in kernel.applied_opts

def test_default_tile_keeps_a_wave_of_blocks():
  assert SIMT_TILES[default_tile(4096, 4096)] == (128, 128, 8, 8, 2)   # 1024 blocks
  assert SIMT_TILES[default_tile(1024, 1024)] == (128, 64, 8, 8, 2)    # 128 blocks of 128×64 (64 of 128×128)
  assert SIMT_TILES[default_tile(256, 512)] == (64, 64, 8, 8, 2)       # the smallest: 32 blocks

def test_every_tile_compiles_with_nvrtc_for_sm_80_and_sm_90():
  nvrtc = pytest.importorskip("tgrad.runtime.cuda.nvrtc")
  if not nvrtc.nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")
  shapes = [sgemm.SgemmShape(4096, 4096, 4096, False, True), sgemm.SgemmShape(200, 132, 44, True, False)]
  for tile in SIMT_TILES:
    for shape in shapes:
      source = sgemm.sgemm_source("sgemm", shape, sgemm.SgemmConfig(*tile), ("a", "out", "b"))
      assert "sgemm(const float* __restrict__ a, float* __restrict__ out, const float* __restrict__ b)" in source
      for arch in ("sm_80", "sm_90"): assert len(nvrtc.compile_cuda(source, arch)) > 1000

# ---- the rendered kernel itself, run on the CPU (test/cuda_on_cpu.py: one OS thread per CUDA thread)

# one case per tile (each compiles its kernel with g++ for a few seconds): every layout, sizes that are whole tiles
# and sizes that leave partial tiles on M, N and K (K a multiple of 4, not of 8), N not a multiple of 4 (scalar stores)
CPU_CASES = [
  ((128, 256, 64), (128, 128, 8, 8, 1), False, True),
  ((200, 136, 44), (128, 128, 8, 8, 2), False, False),
  ((136, 260, 40), (128, 256, 8, 16, 1), True, True),
  ((260, 124, 36), (256, 128, 16, 8, 1), True, False),
  ((100, 70, 20), (128, 64, 8, 8, 2), False, False),
  ((72, 132, 12), (64, 128, 8, 8, 2), True, True),
  ((128, 64, 8), (64, 64, 8, 8, 2), False, True),
]

@pytest.mark.parametrize("shape,tile,a_m_major,b_n_major", CPU_CASES, ids=str)
def test_rendered_kernel_runs_on_cpu_and_matches_numpy(shape, tile, a_m_major, b_n_major):
  """The C source OptOps.SGEMM renders (the operands' copies, transposed stores, double buffer, bounds checks,
  epilogue), compiled for the CPU, into an output poisoned with NaN: numpy's float32 product of the same inputs."""
  from cuda_on_cpu import cpu_available, run_on_cpu
  if not cpu_available(): pytest.skip("no g++")
  m, n, k = shape
  out, a_view, b_view, a, b = product(m, n, k, a_m_major, b_n_major, seed=sum(shape))
  kernel = last_kernel(out)
  kernel.apply_opt(Opt(OptOps.SGEMM, 0, SIMT_TILES.index(tile)))
  use = kernel.simt_matmul
  assert (use.a_m_major, use.b_n_major) == (a_m_major, b_n_major)
  src, uops = render_source(kernel)
  assert uops == []
  buffers = {"out": np.full(m * n, np.nan, np.float32), "a": np.ascontiguousarray(a.numpy()),
             "b": np.ascontiguousarray(b.numpy())}
  run_on_cpu(src, kernel.function_name, *kernel.launch_dims(), [buffers[role] for role in use.arguments], [])
  got = buffers["out"].reshape(m, n)
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  expected = a_view.astype(np.float64) @ b_view.astype(np.float64)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(k))
