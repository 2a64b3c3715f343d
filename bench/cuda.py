"""GPU benchmark: tgrad's CUDA kernels (default heuristics, or BEAM) against torch, timed with CUDA events.

Each case is a LazyBuffer graph on realized CUDA inputs; every kernel of its schedule is timed alone (best of REPEATS
launches after a warm-up, CUDA events) and the kernel times are summed. torch runs the same math eagerly.
Prints per case: tgrad time, GB/s (bytes the kernels must move), opts of each kernel, torch time, ratio.
Usage: python bench/cuda.py
"""
from __future__ import annotations
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad.ops import Ops  # noqa: E402
from tgrad.lazy import LazyBuffer  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.realize import get_runner, run_schedule, realize  # noqa: E402

REPEATS = 20
ELEMENTS = 64 * 1024 * 1024   # 64M float32: 256 MB per array, far beyond the 50 MB L2 of an H100
SOFTMAX_SHAPE = (8192, 4096)
MATMUL_SIZE = 2048

def tgrad_kernels(out: LazyBuffer) -> list[tuple[str, float, int, list]]:
  """(name, best seconds, bytes, opts) of each kernel that computes out; out is realized afterwards."""
  timings = []
  for item in create_schedule([out], commit=True):
    if item.ast.op is not Ops.SINK:
      run_schedule([item])
      continue
    runner = get_runner(item.outputs[0].device, item.ast)
    buffers = [item.outputs[0]] + list(item.inputs)
    runner(buffers, wait=True)
    best = min(runner(buffers, wait=True) for _ in range(REPEATS))
    timings.append((runner.name, best, runner.nbytes, runner.opts))
  return timings

def torch_time(fn) -> float:
  import torch
  fn()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  best = float("inf")
  for _ in range(REPEATS):
    start.record()
    fn()
    end.record()
    end.synchronize()
    best = min(best, start.elapsed_time(end) * 1e-3)
  return best

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

  cases = [
    ("64M (a*b+c).relu()", a.alu(Ops.MUL, b).alu(Ops.ADD, c).alu(Ops.MAX, a.const(0.0)),
     lambda: (ta * tb + tc).relu()),
    ("64M sum", a.r(Ops.ADD, (0,)), lambda: ta.sum()),
    ("64M max", a.r(Ops.MAX, (0,)), lambda: ta.max()),
    (f"softmax {SOFTMAX_SHAPE}", softmax(x), lambda: torch.softmax(tx, dim=1)),
    (f"matmul {MATMUL_SIZE}² fp32", matmul(ma, mb), lambda: tma @ tmb),
  ]
  for name, out, torch_fn in cases:
    kernels = tgrad_kernels(out)
    total = sum(t for _, t, _, _ in kernels)
    nbytes = sum(n for _, _, n, _ in kernels)
    reference = torch_time(torch_fn)
    print(f"{name:28s} tgrad {total*1e6:9.1f} us {nbytes/total/1e9:7.0f} GB/s  torch {reference*1e6:9.1f} us  "
          f"tgrad/torch {total/reference:5.2f}")
    for kname, t, n, opts in kernels: print(f"    {kname:40s} {t*1e6:9.1f} us {n/t/1e9:7.0f} GB/s  {opts}")
  check = matmul(ma, mb)
  realize(check)
  error = np.abs(check.base.buffer.copyout().reshape(MATMUL_SIZE, MATMUL_SIZE) - m_host[0] @ m_host[1]).max()
  print(f"matmul max abs error vs numpy: {error:.2e}")

if __name__ == "__main__": main()
