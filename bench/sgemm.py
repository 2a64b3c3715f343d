"""Float32 matmul template (OptOps.SGEMM) on CUDA: every tile of SIMT_TILES, the heuristics' choice and the staged
kernel it replaced (SGEMM=0), against torch's float32 matmul (cuBLAS, TF32 off), on a few shapes and both B layouts.

Each kernel's output is poisoned (NaN bytes) before its first run and that run is checked element by element against
torch (err = worst |got - ref| / tolerance, at most 1 passes; WRONG otherwise). Times: tgrad's best of KERNEL_RUNS
launches between CUDA events (the bare kernel); torch's best of TORCH_TRIALS batches of KERNEL_RUNS calls between
CUDA events. One run prints every configuration; the lead's budget: about 2 GPU minutes.
Usage: python bench/sgemm.py [--quick]   (--quick: 4096³ only)
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import error_ratio, poison  # noqa: E402
from tgrad import Tensor  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.simt_matmul import SIMT_TILES  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

KERNEL_RUNS = 10
TORCH_TRIALS = 3
# (M, N, K, B stored K×N): a plain a·b, and a·wᵀ with a linear layer's N×K weight at 4096³
SHAPES = [(4096, 4096, 4096, True), (4096, 4096, 4096, False), (2048, 2048, 2048, True), (8192, 8192, 1024, True)]
TOLERANCE = (1e-4, 2e-4)   # rtol, atol per √K: bench/matmul_sweep.py's float32 tolerance

def torch_seconds(fn) -> float:
  import torch
  fn()
  torch.cuda.synchronize()
  best = float("inf")
  for _ in range(TORCH_TRIALS):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(KERNEL_RUNS): fn()
    end.record()
    end.synchronize()
    best = min(best, start.elapsed_time(end) / 1e3 / KERNEL_RUNS)
  return best

def bench_shape(m: int, n: int, k: int, b_n_major: bool) -> list[tuple[str, float, float]]:
  import torch
  from tgrad.device import Buffer, Device
  from tgrad.realize import compile_kernel
  rng = np.random.default_rng(0)
  a_np = rng.standard_normal((m, k), dtype=np.float32)
  b_np = rng.standard_normal((k, n) if b_n_major else (n, k), dtype=np.float32)
  a, b = Tensor(a_np, device="CUDA").realize(), Tensor(b_np, device="CUDA").realize()
  (item,) = [i for i in create_schedule([(a @ (b if b_n_major else b.T)).lazydata]) if i.ast.op is Ops.SINK]
  ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
  torch_fn = (lambda: ta @ tb) if b_n_major else (lambda: ta @ tb.T)
  ref = torch_fn().cpu().numpy()
  torch_time = torch_seconds(torch_fn)
  flops = 2 * m * n * k
  label = f"{m}x{n}x{k} B {'KxN' if b_n_major else 'NxK'}"
  print(f"\n{label}: torch float32 (TF32 off) {torch_time * 1e6:.0f} us = {flops / torch_time / 1e12:.1f} TFLOP/s",
        flush=True)
  out = Buffer("CUDA", item.outputs[0].size, item.outputs[0].dtype)
  buffers = [out] + list(item.inputs)
  rows = []

  def run(name: str, opts, settings: dict) -> None:
    start = time.perf_counter()
    try:
      with Context(**settings):
        kernel = Kernel(item.ast, Device["CUDA"].renderer)
        if opts is None: hand_coded_optimizations(kernel)
        else:
          for opt in opts: kernel.apply_opt(opt)
        runner = compile_kernel("CUDA", kernel, "sgemm")
      poison(out)
      runner(buffers, wait=True)
      err = error_ratio(out.copyout().reshape(m, n), ref, TOLERANCE[0], TOLERANCE[1] * np.sqrt(k))
      seconds = min(runner(buffers, wait=True) for _ in range(KERNEL_RUNS))
    except Exception as error:   # a configuration that doesn't apply or compile must not end the run
      print(f"  {name:40s} skipped: {type(error).__name__}: {str(error)[:120]}", flush=True)
      return
    opts_text = [(o.op.name, o.axis, o.amount) for o in kernel.applied_opts]
    bad = "" if err <= 1 else "  WRONG"
    print(f"  {name:40s} {seconds * 1e6:8.0f} us {flops / seconds / 1e12:6.1f} TFLOP/s {torch_time / seconds:5.2f}x "
          f"torch  err {err:.2f}{bad}  (built in {time.perf_counter() - start:.1f} s) {opts_text}", flush=True)
    rows.append((name, seconds, err))

  run("default heuristics", None, {})
  run("staged kernel (SGEMM=0)", None, {"SGEMM": 0})
  for index, tile in enumerate(SIMT_TILES): run(f"SGEMM {index} {tile}", [Opt(OptOps.SGEMM, 0, index)], {})
  good = sorted((r for r in rows if r[2] <= 1), key=lambda r: r[1])
  if good: print(f"  best: {good[0][0]} at {torch_time / good[0][1]:.2f}x torch", flush=True)
  return rows

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  print(f"GPU: {torch.cuda.get_device_name()}", flush=True)
  for shape in SHAPES[:2] if args.quick else SHAPES: bench_shape(*shape)

if __name__ == "__main__":
  main()
