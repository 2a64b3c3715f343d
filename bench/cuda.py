"""GPU benchmark: the kernel time of tgrad's CUDA kernels (default heuristics, or BEAM) against torch's kernel time.

Each case is a LazyBuffer graph on realized CUDA inputs. tgrad: every kernel of its schedule is timed alone (CUDA
events around the launch, best of REPEATS after a checked first run into a poisoned output) and the kernel times are
summed. torch: the same math eagerly, its kernels' GPU time from the torch profiler (best of REPEATS calls, see
gpu.torch_kernel_time). Both are kernel time only, with warm caches; neither includes Python or launch overhead.
Prints per case: tgrad kernel time, GB/s (bytes the kernels must move), opts of each kernel, torch kernel time,
their ratio, and the worst element's error against torch in units of its tolerance (≤ 1 passes).
Usage: python bench/cuda.py
"""
from __future__ import annotations
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import error_ratio, poison, torch_kernel_time  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.lazy import LazyBuffer  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.realize import get_runner, run_schedule, realize  # noqa: E402

REPEATS = 20
ELEMENTS = 64 * 1024 * 1024   # 64M float32: 256 MB per array, far beyond the 50 MB L2 of an H100
SOFTMAX_SHAPE = (8192, 4096)
MATMUL_SIZE = 2048

def tgrad_kernels(out: LazyBuffer) -> list[tuple[str, float, int, list]]:
  """(name, best seconds, bytes, opts) of each kernel that computes out; out is realized afterwards. Each kernel's
  output is poisoned before its first run, so an element it never writes shows in the result."""
  timings = []
  for item in create_schedule([out], commit=True):
    if item.ast.op is not Ops.SINK:
      run_schedule([item])
      continue
    runner = get_runner(item.outputs[0].device, item.ast)
    poison(item.outputs[0])
    buffers = [item.outputs[0]] + list(item.inputs)
    runner(buffers, wait=True)   # what later kernels and the comparison read
    best = min(runner(buffers, wait=True) for _ in range(REPEATS))
    timings.append((runner.name, best, runner.cost(item.var_vals)[1], runner.opts))
  return timings

def cuda_input(data: np.ndarray) -> LazyBuffer:
  lb = LazyBuffer.from_host(data, "CUDA")
  realize(lb)
  return lb

def main() -> None:
  import torch
  rng = np.random.default_rng(0)
  host = [rng.standard_normal(ELEMENTS, dtype=np.float32) for _ in range(3)]
  a, b, c = (cuda_input(x) for x in host)
  ta, tb, tc = (torch.from_numpy(x).cuda() for x in host)
  x_host = rng.standard_normal(SOFTMAX_SHAPE, dtype=np.float32)
  x, tx = cuda_input(x_host), torch.from_numpy(x_host).cuda()
  m_host = [rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32) for _ in range(2)]
  ma, mb = (cuda_input(m) for m in m_host)
  tma, tmb = (torch.from_numpy(m).cuda() for m in m_host)
  torch.backends.cuda.matmul.allow_tf32 = False

  def softmax(v: LazyBuffer) -> LazyBuffer:
    shifted = v.alu(Ops.ADD, v.r(Ops.MAX, (1,)).expand(v.shape).alu(Ops.NEG))
    e = shifted.alu(Ops.MUL, v.const(1 / np.log(2))).alu(Ops.EXP2)
    return e.alu(Ops.FDIV, e.r(Ops.ADD, (1,)).expand(v.shape))

  def matmul(p: LazyBuffer, q: LazyBuffer) -> LazyBuffer:
    n = MATMUL_SIZE
    product = p.reshape((n, n, 1)).expand((n, n, n)).alu(Ops.MUL, q.reshape((1, n, n)).expand((n, n, n)))
    return product.r(Ops.ADD, (1,)).reshape((n, n))

  # (name, tgrad graph, torch call, rtol, atol): per-element tolerances against torch. Sums of random normals cancel:
  # their atol follows the sum's size (√terms · a few float32 roundoffs)
  cases = [
    ("64M (a*b+c).relu()", a.alu(Ops.MUL, b).alu(Ops.ADD, c).alu(Ops.MAX, a.const(0.0)),
     lambda: (ta * tb + tc).relu(), 1e-6, 1e-6),
    ("64M sum", a.r(Ops.ADD, (0,)), lambda: ta.sum(), 1e-4, 1e-5 * np.sqrt(ELEMENTS)),
    ("64M max", a.r(Ops.MAX, (0,)), lambda: ta.max(), 0.0, 0.0),
    (f"softmax {SOFTMAX_SHAPE}", softmax(x), lambda: torch.softmax(tx, dim=1), 1e-5, 1e-9),
    (f"matmul {MATMUL_SIZE}² fp32", matmul(ma, mb), lambda: tma @ tmb, 1e-4, 1e-5 * np.sqrt(MATMUL_SIZE)),
  ]
  print("kernel time only: tgrad's from CUDA events per kernel, torch's from its profiler; ratio = tgrad / torch "
        "(< 1: tgrad faster)")
  for name, out, torch_fn, rtol, atol in cases:
    kernels = tgrad_kernels(out)
    total = sum(t for _, t, _, _ in kernels)
    nbytes = sum(n for _, _, n, _ in kernels)
    reference = torch_kernel_time(torch_fn, REPEATS)
    got = out.base.buffer.copyout().reshape(out.shape)
    ratio = error_ratio(got, torch_fn().cpu().numpy().reshape(out.shape), rtol, atol)
    print(f"{name:28s} tgrad kernels {total*1e6:9.1f} us {nbytes/total/1e9:7.0f} GB/s  torch kernels "
          f"{reference*1e6:9.1f} us  tgrad/torch {total/reference:5.2f}  err/tol {ratio:.2f}"
          f"{'' if ratio <= 1 else '  WRONG'}")
    for kname, t, n, opts in kernels: print(f"    {kname:40s} {t*1e6:9.1f} us {n/t/1e9:7.0f} GB/s  {opts}")

if __name__ == "__main__": main()
