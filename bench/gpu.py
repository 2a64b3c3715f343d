"""GPU benchmark: tgrad (CUDA) vs torch, like against like, in one run; also the timing helpers the other GPU
benchmarks share.

Two comparisons, each after a warm-up call (compiles, cuBLAS heuristics, allocator caches, warm L2), best of REPEATS:
- end to end: host wall-clock seconds of one call, from a synchronized device to a synchronized device, for tgrad
  (`realize()` of the op on already-realized inputs: graph building, scheduling, launching, the kernels) and for
  torch (the eager call);
- kernels: GPU time of the kernels one call launches, summed: tgrad's from CUDA events around each of its launches
  (pycuda; this adds the event gap, ~2 µs per kernel, against tgrad), torch's from its profiler (CUPTI kernel
  durations, memsets and copies included).
Ratios are torch time / tgrad time (> 1: tgrad faster). Each result is checked against torch element by element.
Usage: python bench/gpu.py [--quick]    (BEAM=2 python bench/gpu.py runs the kernel search first)
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.helpers import Context  # noqa: E402

REPEATS = 10
ELEMENTWISE_SIZE = 64 * 1024 * 1024
SOFTMAX_SHAPE = (4096, 4096)
MATMUL_SIZE = 4096
LAUNCH_PROBE_SIZE = 1    # a 1-element kernel: its time is launch overhead
POISON_BYTE = 0xFF       # fills an output before a checked run: NaN in every float format, so unwritten elements show

# ---- timing

def synchronize_all() -> None:
  """Wait until the GPU is idle: tgrad's launches (pycuda) and torch's, both on the primary context of GPU 0."""
  from tgrad.device import Device
  Device["CUDA"].synchronize()
  import torch
  torch.cuda.synchronize()

def event_seconds(queue, repeats: int = REPEATS) -> float:
  """GPU seconds per queue() call: one call first (warm), then `repeats` calls queued back to back between two CUDA
  events on tgrad's stream (the host queues faster than the GPU runs them, so the GPU never waits)."""
  import pycuda.driver as cuda
  from tgrad.device import Device
  queue()
  Device["CUDA"].synchronize()
  start, end = cuda.Event(), cuda.Event()
  start.record()
  for _ in range(repeats): queue()
  end.record()
  end.synchronize()
  return start.time_till(end) / 1e3 / repeats

def wall_time(fn, repeats: int = REPEATS) -> float:
  """End to end: best host seconds of one fn() call, from synchronized devices until the devices are done."""
  fn()
  synchronize_all()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    synchronize_all()
    best = min(best, time.perf_counter() - start)
  return best

def tgrad_kernel_time(fn, repeats: int = REPEATS) -> float:
  """Best over calls of the summed CUDA-event times of the kernels fn() launches (each launch timed alone)."""
  import tgrad.realize as realize_module
  original = realize_module.CompiledKernel.__call__
  total = [0.0]
  def timed(self, buffers, wait=False, var_vals=None):
    total[0] += original(self, buffers, True, var_vals) or 0.0
  fn()
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

def torch_kernel_time(fn, repeats: int = REPEATS) -> float:
  """Best over calls of the summed GPU durations (torch profiler, CUPTI) of the kernels, memsets and copies that one
  fn() call puts on the GPU: torch's kernel time, without its Python dispatch or launch latency."""
  import torch
  from torch.autograd import DeviceType
  from torch.profiler import ProfilerActivity, profile
  fn()
  torch.cuda.synchronize()
  best = float("inf")
  for _ in range(repeats):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
      fn()
      torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not device_events: raise RuntimeError("the torch profiler recorded no GPU activity for this call")
    best = min(best, sum(e.time_range.elapsed_us() for e in device_events) * 1e-6)
  return best

# ---- checking

def poison(buffer) -> None:
  """Fill a tgrad Buffer with POISON_BYTE, so an element a kernel doesn't write reads NaN (or -1) afterwards."""
  buffer.copyin(np.full(buffer.nbytes, POISON_BYTE, np.uint8).view(buffer.dtype.np))

def error_ratio(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> float:
  """max over elements of |got - want| / (atol + rtol·|want|): at most 1 when every element is within its tolerance;
  inf where got is NaN and want isn't (an element never written) or where one is infinite and the other isn't."""
  got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
  if got.shape != want.shape: raise ValueError(f"result has {got.size} elements, the reference {want.size}")
  agree = (got == want) | (np.isnan(got) & np.isnan(want))   # equal infinities included
  with np.errstate(invalid="ignore", divide="ignore"):
    ratio = np.abs(got - want) / (atol + rtol * np.abs(want))
  ratio = np.where(agree, 0.0, np.nan_to_num(ratio, nan=np.inf, posinf=np.inf))
  return float(ratio.max()) if ratio.size else 0.0

# ---- the benchmark

def cases(quick: bool):
  """(name, work per call, unit, host inputs, tgrad fn, torch fn, rtol, atol): tolerances per element against torch."""
  size = ELEMENTWISE_SIZE // (8 if quick else 1)
  rng = np.random.default_rng(0)
  a, b, c = (rng.random(size, dtype=np.float32) for _ in range(3))
  yield (f"(a*b+c).relu() {size >> 20}M fp32", 4 * size * 4, "GB/s", (a, b, c),
         lambda x, y, z: (x * y + z).relu(), lambda x, y, z: (x * y + z).relu(), 1e-6, 1e-7)   # one fma or not
  yield f"sum {size >> 20}M fp32", size * 4, "GB/s", (a,), lambda x: x.sum(), lambda x: x.sum(), 1e-4, 0.0
  shape = (SOFTMAX_SHAPE[0] // (4 if quick else 1), SOFTMAX_SHAPE[1])
  s = rng.standard_normal(shape, dtype=np.float32)
  yield (f"softmax {shape[0]}x{shape[1]} fp32", 2 * s.size * 4, "GB/s", (s,), lambda x: x.softmax(-1),
         lambda x: x.softmax(-1), 1e-5, 1e-9)
  n = MATMUL_SIZE // (4 if quick else 1)
  m1, m2 = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
  # inputs in [0, 1): no cancellation, every element ~n/4; summation order moves it by ~1e-6 relative
  yield (f"matmul {n} fp32 (tf32 off)", 2 * n**3, "TFLOP/s", (m1, m2), lambda x, y: x @ y, lambda x, y: x @ y,
         1e-4, 0.0)
  yield (f"matmul {n} fp16", 2 * n**3, "TFLOP/s", (m1.astype(np.float16), m2.astype(np.float16)),
         lambda x, y: x @ y, lambda x, y: x @ y, 2e-3, 0.0)   # both round float32 sums to half: 1 ulp apart at most

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  print(f"tgrad CUDA vs torch {torch.__version__} on {torch.cuda.get_device_name()}, BEAM={Context.BEAM}")
  print("end to end: host wall clock per call, synchronized; kernels: GPU time of the call's kernels "
        "(tgrad: CUDA events per launch, torch: profiler); ratio = torch / tgrad")
  header = (f"{'case':30s} {'unit':8s} {'tgrad e2e':>10s} {'torch e2e':>10s} {'e2e ratio':>10s} "
            f"{'tgrad kern':>10s} {'torch kern':>10s} {'kern ratio':>10s} {'err/tol':>8s}")
  print(header)
  print("-" * len(header))
  for name, work, unit, inputs, tg_fn, torch_fn, rtol, atol in cases(args.quick):
    scale = 1e12 if unit == "TFLOP/s" else 1e9
    tensors = [Tensor(x, device="CUDA").realize() for x in inputs]
    torch_inputs = [torch.from_numpy(x).cuda() for x in inputs]
    t_tg = wall_time(lambda: tg_fn(*tensors).realize())
    t_torch = wall_time(lambda: torch_fn(*torch_inputs))
    k_tg = tgrad_kernel_time(lambda: tg_fn(*tensors).realize())
    k_torch = torch_kernel_time(lambda: torch_fn(*torch_inputs))
    ours = tg_fn(*tensors).numpy()
    ref = torch_fn(*torch_inputs).float().cpu().numpy()
    ratio = error_ratio(ours.astype(np.float64), ref, rtol, atol)
    print(f"{name:30s} {unit:8s} {work / t_tg / scale:10.2f} {work / t_torch / scale:10.2f} {t_torch / t_tg:9.2f}x "
          f"{work / k_tg / scale:10.2f} {work / k_torch / scale:10.2f} {k_torch / k_tg:9.2f}x {ratio:8.2f}"
          f"{'' if ratio <= 1 else '  WRONG'}")
  # the fused elementwise case against torch.compile, which fuses it into one kernel as tgrad does (kernels only)
  size = ELEMENTWISE_SIZE // (8 if args.quick else 1)
  xs = [torch.rand(size, device="cuda") for _ in range(3)]
  compiled = torch.compile(lambda x, y, z: torch.relu(x * y + z))
  k_compiled = torch_kernel_time(lambda: compiled(*xs))
  tensors = [Tensor(x.cpu().numpy(), device="CUDA").realize() for x in xs]
  k_tg = tgrad_kernel_time(lambda: (tensors[0] * tensors[1] + tensors[2]).relu().realize())
  print(f"{'(a*b+c).relu() vs torch.compile':30s} {'GB/s':8s} {'':>10s} {'':>10s} {'':>10s} "
        f"{16 * size / k_tg / 1e9:10.2f} {16 * size / k_compiled / 1e9:10.2f} {k_compiled / k_tg:9.2f}x")
  probe = Tensor(np.ones(LAUNCH_PROBE_SIZE, np.float32), device="CUDA").realize()
  torch_probe = torch.ones(LAUNCH_PROBE_SIZE, device="cuda")
  t_launch = wall_time(lambda: (probe + 1).realize(), repeats=100)
  t_torch_launch = wall_time(lambda: torch_probe + 1, repeats=100)
  k_launch = tgrad_kernel_time(lambda: (probe + 1).realize(), repeats=100)
  k_torch_launch = torch_kernel_time(lambda: torch_probe + 1, repeats=20)
  print(f"{'1-element add (µs per call)':30s} {'µs':8s} {t_launch * 1e6:10.1f} {t_torch_launch * 1e6:10.1f} "
        f"{t_torch_launch / t_launch:9.2f}x {k_launch * 1e6:10.1f} {k_torch_launch * 1e6:10.1f}")

if __name__ == "__main__":
  main()
