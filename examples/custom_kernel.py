"""User fused kernels as execution paths: a fused multiply-add-ReLU and a fused RMSNorm, each registered with a
reference in tgrad ops, found in a small graph, verified, profiled into a benchmark database, and selected only if
they win.

  python examples/custom_kernel.py [--budget SECONDS] [--gemma-preset tiny|270m] [--new-tokens N]

The kernels: relu(a·b + c) as CUDA C, LLVM IR and numpy; RMSNorm over the last axis as CUDA C and numpy. On a machine
without a GPU the LLVM IR and numpy versions run; with one, CUDA's too. The database is a temporary file (TGRAD_CACHE)
unless TGRAD_CACHE is already set; `python -m tgrad.paths show` prints what it recorded and chose.
Then the same in Gemma's decode step (random weights of a preset, float32, batch 1): its graphs hold RMSNorm sites
(the model's plain norms) and no multiply-add-ReLU; decode tok/s of the replayed steps is measured without the
kernels registered and with them (profiled, then selected from the records), and what was chosen is printed.
"""
from __future__ import annotations
import argparse, math, os, subprocess, sys, tempfile
import numpy as np

RMS_EPS = 1e-6
CUDA_BLOCK = 256   # threads per block of both CUDA kernels (the RMSNorm reduction assumes a power of two)

FMA_RELU_CUDA = """
extern "C" __global__ void fma_relu(float* out, const float* a, const float* b, const float* c, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaxf(a[i] * b[i] + c[i], 0.0f);
}
"""

# one call per core index (the last argument); this kernel does all n elements in call 0
FMA_RELU_LLVM_IR = """
define void @fma_relu(ptr noalias %out, ptr noalias %a, ptr noalias %b, ptr noalias %c, i64 %n, i32 %core) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %pc = getelementptr float, ptr %c, i64 %i
  %xa = load float, ptr %pa
  %xb = load float, ptr %pb
  %xc = load float, ptr %pc
  %product = fmul float %xa, %xb
  %sum = fadd float %product, %xc
  %positive = fcmp ogt float %sum, 0.0
  %relu = select i1 %positive, float %sum, float 0.0
  %po = getelementptr float, ptr %out, i64 %i
  store float %relu, ptr %po
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

RMS_NORM_CUDA = """
extern "C" __global__ void rms_norm(float* out, const float* x, long long rows, long long cols) {
  __shared__ float partial[%d];
  long long row = blockIdx.x;
  const float* in = x + row * cols;
  float sum = 0.0f;
  for (long long i = threadIdx.x; i < cols; i += blockDim.x) sum += in[i] * in[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  float scale = rsqrtf(partial[0] / (float)cols + %ef);
  for (long long i = threadIdx.x; i < cols; i += blockDim.x) out[row * cols + i] = in[i] * scale;
}
""" % (CUDA_BLOCK, RMS_EPS)

def cuda_launch(*shapes):
  """fma_relu on CUDA: one thread per element; the element count as its scalar."""
  n = math.prod(shapes[0])
  return ((max(1, -(-n // CUDA_BLOCK)),), (CUDA_BLOCK,), (n,))

def llvm_launch(*shapes): return ((1,), (1,), (math.prod(shapes[0]),))

def rms_launch(shape):
  rows, cols = math.prod(shape[:-1]), shape[-1]
  return ((rows,), (CUDA_BLOCK,), (rows, cols))

def fma_relu_reference(a, b, c): return (a * b + c).relu()
def rms_norm_reference(x): return x * ((x * x).mean(-1, keepdim=True) + RMS_EPS).rsqrt()
def fma_relu_numpy(a, b, c): return np.maximum(a * b + c, 0)
def rms_norm_numpy(x): return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS)

def register() -> None:
  from tgrad.paths import register_kernel
  register_kernel("fma_relu", reference=fma_relu_reference, devices=["CUDA", "LLVM"],
                  source={"cuda": FMA_RELU_CUDA, "llvm": FMA_RELU_LLVM_IR},
                  launch={"cuda": cuda_launch, "llvm": llvm_launch}, numpy=fma_relu_numpy)
  register_kernel("rms_norm", reference=rms_norm_reference, devices=["CUDA", "LLVM"], source=RMS_NORM_CUDA,
                  language="cuda", launch=rms_launch, numpy=rms_norm_numpy)

def graphs(device: str, seed: int = 0):
  """The two small graphs: each holds one site of a kernel."""
  from tgrad import Tensor
  rng = np.random.default_rng(seed)
  a, b, c = [Tensor(rng.standard_normal((256, 512)).astype(np.float32), device=device).realize() for _ in range(3)]
  x = Tensor(rng.standard_normal((64, 1024)).astype(np.float32), device=device).realize()
  return [fma_relu_reference(a, b, c) * 2, rms_norm_reference(x) + 1]

GEMMA_PROMPT = [2, 65, 37, 76, 81, 103]   # <bos> + arbitrary ids (inside the tiny preset's 512-token vocabulary)

def gemma_decode_tok_s(device: str, preset: str, new_tokens: int) -> float:
  """tok/s of the replayed decode steps of a fresh random-weight Gemma (what the database selects, if anything)."""
  from tgrad import dtypes
  from tgrad.models.gemma3 import Gemma3, Gemma3Config
  from tgrad.models.generation import generate
  model = Gemma3.random(Gemma3Config.preset(preset), dtypes.float32, device, progress=False)
  generate(model, GEMMA_PROMPT, 4, eos_ids=(), jit=True)   # compiles
  replayed = generate(model, GEMMA_PROMPT, new_tokens, eos_ids=(), jit=True).step_seconds[2:]
  return len(replayed) / sum(replayed)

def gemma(device: str, preset: str, new_tokens: int, budget: float, tolerance: float) -> None:
  """Gemma's decode with and without the two kernels registered (see the module doc), selecting at `tolerance`."""
  from tgrad import dtypes
  from tgrad.helpers import Context
  from tgrad.models.gemma3 import Gemma3, Gemma3Config
  from tgrad.models.generation import generate
  from tgrad.paths import select as path_select, unregister_kernel
  from tgrad.paths.profile import Profiler, watching
  for name in ("fma_relu", "rms_norm"): unregister_kernel(name)
  path_select.forget()
  without = gemma_decode_tok_s(device, preset, new_tokens)
  register()
  with watching(Profiler(budget=budget, progress=False)) as profiler:
    model = Gemma3.random(Gemma3Config.preset(preset), dtypes.float32, device, progress=False)
    generate(model, GEMMA_PROMPT, 3, eos_ids=(), jit=True)
  print(f"gemma {preset}: profiled {len(profiler.graphs_seen)} graphs, {profiler.measured} paths measured")
  path_select.forget()
  with Context(TOLERANCE=tolerance): with_kernels = gemma_decode_tok_s(device, preset, new_tokens)
  for key, what in path_select.applied.items(): print(f"gemma graph {key[:12]}: ran {what}")
  for name in ("fma_relu", "rms_norm"): unregister_kernel(name)   # the baseline once more: the machine's noise
  without = max(without, gemma_decode_tok_s(device, preset, new_tokens))
  print(f"gemma {preset} decode at TOLERANCE {tolerance:g}: {without:.1f} tok/s without the kernels registered "
        f"(best of 2), {with_kernels:.1f} tok/s with them ({with_kernels / without:.2f}x)")

def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--budget", type=float, default=60.0, help="seconds of profiling (default 60)")
  parser.add_argument("--gemma-preset", default="tiny", help="Gemma preset of the decode part (none: skip)")
  parser.add_argument("--new-tokens", type=int, default=16, help="decode tokens timed in the Gemma part")
  parser.add_argument("--tolerance", type=float, default=1e-3,
                      help="TOLERANCE of the Gemma part's selection (a whole model's float32 error is ~1e-4)")
  args = parser.parse_args(argv)
  os.environ.setdefault("TGRAD_CACHE", os.path.join(tempfile.mkdtemp(prefix="tgrad-custom-kernel-"), "cache.db"))
  from tgrad.device import Device
  from tgrad.paths import select as path_select
  from tgrad.paths.profile import Profiler, watching
  path_select.forget()
  register()
  device = Device.default()
  print(f"device {device}; database {os.environ['TGRAD_CACHE']}")
  with watching(Profiler(budget=args.budget, progress=False)) as profiler:
    for out in graphs(device): out.realize()
  print(f"profiled {len(profiler.graphs_seen)} graphs: {profiler.measured} paths measured, {profiler.failed} failed")
  path_select.forget()
  for out in graphs(device, seed=1):   # the same graphs again: now selected from the records
    out.realize()
  for key, what in path_select.applied.items(): print(f"graph {key[:12]}: ran {what}")
  if args.gemma_preset != "none": gemma(device, args.gemma_preset, args.new_tokens, args.budget, args.tolerance)
  shown = subprocess.run([sys.executable, "-m", "tgrad.paths", "show"], capture_output=True, text=True,
                         env=dict(os.environ))
  print(shown.stdout, end="")
  return shown.returncode

if __name__ == "__main__": sys.exit(main())
