"""GPU benchmark: tgrad (CUDA) vs torch, both timed with CUDA events, in one run.

tgrad is timed two ways, after a warm-up run that compiles: "end to end", pycuda events around `realize()` of the
op on already-realized inputs, which includes tgrad's Python graph building, scheduling and launching (there is no
JIT yet, so the GPU idles meanwhile); and "kernels", the sum of CUDA-event times of the op's kernels alone. torch is
timed with torch.cuda.Event around the eager call. Ratios are torch time / tgrad time (> 1: tgrad faster).
Usage: python bench/gpu.py [--quick]    (BEAM=2 python bench/gpu.py runs the kernel search first)
"""
from __future__ import annotations
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.helpers import Context  # noqa: E402

REPEATS = 10
ELEMENTWISE_SIZE = 64 * 1024 * 1024
SOFTMAX_SHAPE = (4096, 4096)
MATMUL_SIZE = 4096
LAUNCH_PROBE_SIZE = 1    # a 1-element kernel: its time is launch overhead

def cuda_event_time(fn, repeats: int = REPEATS) -> float:
  """Best seconds of fn() between two pycuda events (tgrad runs on pycuda's context)."""
  import pycuda.driver as cuda
  fn()
  cuda.Context.synchronize()
  best = float("inf")
  for _ in range(repeats):
    start, end = cuda.Event(), cuda.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    best = min(best, end.time_since(start) / 1e3)
  return best

def kernel_only_time(fn, repeats: int = REPEATS) -> float:
  """Best over runs of the summed CUDA-event times of the kernels fn() launches (each launch timed alone)."""
  import tgrad.realize as realize_module
  original = realize_module.CompiledKernel.__call__
  total = [0.0]
  def timed(self, buffers, wait=False):
    total[0] += original(self, buffers, wait=True) or 0.0
  realize_module.CompiledKernel.__call__ = timed
  try:
    best = float("inf")
    for _ in range(repeats):
      total[0] = 0.0
      fn()
      best = min(best, total[0])
  finally:
    realize_module.CompiledKernel.__call__ = original
  return best

def torch_event_time(fn, repeats: int = REPEATS) -> float:
  import torch
  fn()
  torch.cuda.synchronize()
  best = float("inf")
  for _ in range(repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    best = min(best, start.elapsed_time(end) / 1e3)
  return best

def cases(quick: bool):
  size = ELEMENTWISE_SIZE // (8 if quick else 1)
  rng = np.random.default_rng(0)
  a, b, c = (rng.random(size, dtype=np.float32) for _ in range(3))
  yield (f"(a*b+c).relu() {size >> 20}M fp32", 4 * size * 4, "GB/s", (a, b, c),
         lambda x, y, z: (x * y + z).relu(), lambda x, y, z: (x * y + z).relu())
  yield f"sum {size >> 20}M fp32", size * 4, "GB/s", (a,), lambda x: x.sum(), lambda x: x.sum()
  shape = (SOFTMAX_SHAPE[0] // (4 if quick else 1), SOFTMAX_SHAPE[1])
  s = rng.standard_normal(shape, dtype=np.float32)
  yield (f"softmax {shape[0]}x{shape[1]} fp32", 2 * s.size * 4, "GB/s", (s,), lambda x: x.softmax(-1),
         lambda x: x.softmax(-1))
  n = MATMUL_SIZE // (4 if quick else 1)
  m1, m2 = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
  yield f"matmul {n} fp32 (tf32 off)", 2 * n**3, "TFLOP/s", (m1, m2), lambda x, y: x @ y, lambda x, y: x @ y
  yield (f"matmul {n} fp16", 2 * n**3, "TFLOP/s", (m1.astype(np.float16), m2.astype(np.float16)),
         lambda x, y: x @ y, lambda x, y: x @ y)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  print(f"tgrad CUDA vs torch {torch.__version__} on {torch.cuda.get_device_name()}, BEAM={Context.BEAM}")
  header = (f"{'case':30s} {'unit':8s} {'end to end':>10s} {'kernels':>9s} {'torch':>9s} {'e2e ratio':>10s} "
            f"{'kernel ratio':>12s} {'max rel err':>12s}")
  print(header)
  print("-" * len(header))
  for name, work, unit, inputs, tg_fn, torch_fn in cases(args.quick):
    scale = 1e12 if unit == "TFLOP/s" else 1e9
    tensors = [Tensor(x, device="CUDA").realize() for x in inputs]
    t_tg = cuda_event_time(lambda: tg_fn(*tensors).realize())
    t_kernels = kernel_only_time(lambda: tg_fn(*tensors).realize())
    torch_inputs = [torch.from_numpy(x).cuda() for x in inputs]
    t_torch = torch_event_time(lambda: torch_fn(*torch_inputs))
    ours = tg_fn(*tensors).numpy().astype(np.float64)
    ref = torch_fn(*torch_inputs).float().cpu().numpy().astype(np.float64)
    err = float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
    print(f"{name:30s} {unit:8s} {work / t_tg / scale:10.2f} {work / t_kernels / scale:9.2f} "
          f"{work / t_torch / scale:9.2f} {t_torch / t_tg:9.2f}x {t_torch / t_kernels:11.2f}x {err:12.2e}")
  # the fused elementwise case against torch.compile, which fuses it into one kernel as tgrad does
  size = ELEMENTWISE_SIZE // (8 if args.quick else 1)
  xs = [torch.rand(size, device="cuda") for _ in range(3)]
  compiled = torch.compile(lambda x, y, z: torch.relu(x * y + z))
  t_compiled = torch_event_time(lambda: compiled(*xs))
  tensors = [Tensor(x.cpu().numpy(), device="CUDA").realize() for x in xs]
  t_kernels = kernel_only_time(lambda: (tensors[0] * tensors[1] + tensors[2]).relu().realize())
  print(f"{'(a*b+c).relu() vs torch.compile':30s} {'GB/s':8s} {'':>10s} {16 * size / t_kernels / 1e9:9.2f} "
        f"{16 * size / t_compiled / 1e9:9.2f} {'':>10s} {t_compiled / t_kernels:11.2f}x")
  probe = Tensor(np.ones(LAUNCH_PROBE_SIZE, np.float32), device="CUDA").realize()
  t_launch = cuda_event_time(lambda: (probe + 1).realize(), repeats=100)
  torch_probe = torch.ones(LAUNCH_PROBE_SIZE, device="cuda")
  t_torch_launch = torch_event_time(lambda: torch_probe + 1, repeats=100)
  t_launch_kernel = kernel_only_time(lambda: (probe + 1).realize(), repeats=100)
  print(f"{'launch overhead (1-elem add)':30s} {'us':8s} {t_launch * 1e6:10.1f} {t_launch_kernel * 1e6:9.1f} "
        f"{t_torch_launch * 1e6:9.1f}")

if __name__ == "__main__":
  main()
