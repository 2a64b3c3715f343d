"""OptOps.SGEMM (the float32 matmul template, runtime/cuda/sgemm.py) on a GPU: tgrad's float32 matmul kernels with
every tile of SIMT_TILES in all four operand layouts, into outputs poisoned with NaN, against numpy; and realize (the
heuristics pick SGEMM) on a big product. Skipped without a GPU; the CPU-side checks are test/unit/test_sgemm.py."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.compile import compile_kernel
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.simt_matmul import SIMT_TILES
from tgrad.device import Buffer, Device
from tgrad.dtype import dtypes
from tgrad.helpers import Context
from tgrad.realize import run_schedule
from tgrad.schedule import create_schedule

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(32)
SHAPES = [(512, 640, 1024), (200, 136, 44), (72, 260, 12)]   # (M, N, K): whole tiles, partial tiles, K not of 8

def operands(m: int, n: int, k: int, a_m_major: bool, b_n_major: bool):
  """(a as M×K, b as K×N) tensors on CUDA, each realized in the layout asked for, and their numpy values."""
  a_np = RNG.standard_normal((k, m) if a_m_major else (m, k)).astype(np.float32)
  b_np = RNG.standard_normal((k, n) if b_n_major else (n, k)).astype(np.float32)
  a, b = Tensor(a_np, device="CUDA"), Tensor(b_np, device="CUDA")
  a_view, b_view = (a.T if a_m_major else a), (b if b_n_major else b.T)
  return a_view, b_view, (a_np.T if a_m_major else a_np), (b_np if b_n_major else b_np.T)

@pytest.mark.parametrize("a_m_major", [False, True], ids=["a_MxK", "a_KxM"])
@pytest.mark.parametrize("b_n_major", [False, True], ids=["b_NxK", "b_KxN"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("tile", range(len(SIMT_TILES)), ids=lambda i: "x".join(map(str, SIMT_TILES[i])))
def test_sgemm_opt_matches_numpy(tile, shape, a_m_major, b_n_major):
  a, b, a_np, b_np = operands(*shape, a_m_major, b_n_major)
  items = create_schedule([(a @ b).lazydata])
  run_schedule(items[:-1])
  kernel = Kernel(items[-1].ast, Device["CUDA"].renderer)
  kernel.apply_opt(Opt(OptOps.SGEMM, 0, tile))
  runner = compile_kernel("CUDA", kernel, "sgemm_opt")
  out = Buffer("CUDA", items[-1].outputs[0].size, dtypes.float32).copyin(
    np.full(items[-1].outputs[0].size, np.nan, np.float32))
  runner([out] + list(items[-1].inputs), wait=True)
  got = out.copyout().view(np.float32).reshape(shape[0], shape[1])
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  np.testing.assert_allclose(got, a_np.astype(np.float64) @ b_np, rtol=1e-4, atol=1e-4 * np.sqrt(shape[2]))

@Context(F32_MATMUL="simt")   # on an sm_90 GPU the default is the 3xTF32 warpgroup kernel (test_wgmma_split_gpu.py)
def test_realize_picks_sgemm_for_a_big_float32_matmul():
  a, b, a_np, b_np = operands(2048, 1024, 512, False, True)
  out = a @ b
  kernel = Kernel(create_schedule([out.lazydata])[-1].ast, Device["CUDA"].renderer)
  hand_coded_optimizations(kernel)
  assert kernel.simt_matmul is not None
  got = out.numpy()
  np.testing.assert_allclose(got, a_np.astype(np.float64) @ b_np, rtol=1e-4, atol=1e-4 * np.sqrt(512))
