"""Float32 matmul on CUDA: the default (on an H100/H200 the 3xTF32 warpgroup-MMA kernel, OptOps.TF32X3), every
3xTF32 tile, the CUDA-core template (OptOps.SGEMM: the heuristics' tile under F32_MATMUL=simt, and with --simt-tiles
every tile of SIMT_TILES), against torch's float32 matmul (cuBLAS, TF32 off), on square, wide and Gemma prefill shapes.

Each kernel's output is poisoned (NaN bytes) before its first run; that run's worst error is measured against a float64
product computed by torch on the GPU: err = max over elements of |got − ref| / (|a|·|b|) (a float32 dot product's error
is a few 2^-24 = 6e-8 of Σ|a·b|), printed beside cuBLAS float32's own err and their ratio ("x cuBLAS err"; 3xTF32 aims
at ≤ 4). A result with NaN or err > GARBAGE is marked WRONG. Times: tgrad's best of KERNEL_RUNS launches between CUDA
events (the bare kernel); torch's best of TORCH_TRIALS batches of KERNEL_RUNS calls between CUDA events. A
configuration that fails (refused, compile error, launch error) prints one line and the run goes on. A summary table
ends the run. The lead's budget: about 3 GPU minutes (--quick: the first two shapes).
Usage: python bench/sgemm.py [--quick] [--simt-tiles]
"""
from __future__ import annotations
import argparse, os, sys, time, traceback
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import poison  # noqa: E402
from tgrad import Tensor  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.simt_matmul import SIMT_TILES  # noqa: E402
from tgrad.codegen.warpgroup_mma import SPLIT_TILES  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

KERNEL_RUNS = 10
TORCH_TRIALS = 3
GARBAGE = 1e-3   # an err this large is no float32 (nor TF32) product: WRONG
# (M, N, K, B stored K×N, label): a plain a·b, a·wᵀ with a linear layer's N×K weight, and Gemma's prefill projections
# of 512 tokens (x·wᵀ: q/o, up, down)
SHAPES = [(4096, 4096, 4096, True, ""), (4096, 4096, 4096, False, ""), (2048, 2048, 2048, True, ""),
          (8192, 8192, 1024, True, ""), (512, 2048, 640, False, "gemma"), (512, 640, 2048, False, "gemma"),
          (512, 1536, 640, False, "gemma"), (512, 640, 1024, False, "gemma")]

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

def bench_shape(m: int, n: int, k: int, b_n_major: bool, label: str, simt_tiles: bool) -> dict:
  """One shape's lines; returns its summary (times in seconds, errs) for the table at the end."""
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
  b_kn = (tb if b_n_major else tb.T).double()
  reference = ta.double() @ b_kn
  scale = ta.double().abs() @ b_kn.abs()
  del b_kn

  def error(got: torch.Tensor) -> float:
    if torch.isnan(got).any(): return float("nan")
    return float(((got.double() - reference).abs() / scale).max())

  cublas_err = error(torch_fn())
  torch_time = torch_seconds(torch_fn)
  flops = 2 * m * n * k
  name = f"{m}x{n}x{k} B {'KxN' if b_n_major else 'NxK'}" + (f" ({label})" if label else "")
  print(f"\n{name}: cuBLAS float32 (TF32 off) {torch_time * 1e6:.0f} us = {flops / torch_time / 1e12:.1f} TFLOP/s, "
        f"err {cublas_err:.2e}", flush=True)
  out = Buffer("CUDA", item.outputs[0].size, item.outputs[0].dtype)
  buffers = [out] + list(item.inputs)
  summary = {"shape": name, "cublas": torch_time, "cublas_err": cublas_err}

  def run(title: str, opts, settings: dict):
    """(seconds, err, opts) of one configuration, its line printed; None where it failed."""
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
      got = torch.from_numpy(out.copyout().reshape(m, n).astype(np.float32)).cuda()
      err = error(got)
      seconds = min(runner(buffers, wait=True) for _ in range(KERNEL_RUNS))
    except Exception as failure:   # one configuration that doesn't apply, compile or run must not end the run
      print(f"  {title:34s} FAILED: {type(failure).__name__}: {str(failure)[:160]}", flush=True)
      if os.environ.get("BENCH_TRACEBACK"): traceback.print_exc()
      return None
    applied = [(o.op.name, o.axis, o.amount) for o in kernel.applied_opts]
    tile = kernel.warpgroup_matmul or kernel.simt_matmul
    tile_text = "" if tile is None else f"{tile.block_m}x{tile.block_n}" + \
      (f"/{tile.stages}" if kernel.warpgroup_matmul is not None else "")
    bad = "  WRONG" if not err <= GARBAGE else ""
    print(f"  {title:34s} {seconds * 1e6:8.0f} us {flops / seconds / 1e12:6.1f} TFLOP/s {torch_time / seconds:5.2f}x "
          f"cuBLAS  err {err:.2e} ({err / cublas_err:5.2f}x cuBLAS err){bad}  tile {tile_text} {applied} "
          f"(built in {time.perf_counter() - start:.1f} s)", flush=True)
    return seconds, err, tile_text

  summary["default"] = run("default (F32_MATMUL=3xtf32)", None, {})
  summary["simt"] = run("SIMT template (F32_MATMUL=simt)", None, {"F32_MATMUL": "simt"})
  best = None
  for index, tile in enumerate(SPLIT_TILES):
    result = run(f"TF32X3 {index} {tile}", [Opt(OptOps.TF32X3, 0, index)], {})
    if result is not None and result[1] <= GARBAGE and (best is None or result[0] < best[0]): best = result
  summary["best_3x"] = best
  if simt_tiles:
    for index, tile in enumerate(SIMT_TILES): run(f"SGEMM {index} {tile}", [Opt(OptOps.SGEMM, 0, index)], {})
  return summary

def table(rows: list[dict]) -> None:
  def cell(result, cublas: float) -> str:
    return "failed" if result is None else f"{result[0] * 1e6:7.0f} us {cublas / result[0]:5.2f}x [{result[2]}]"
  def err(result) -> str: return "-" if result is None else f"{result[1]:.1e}"
  print("\nsummary (x: cuBLAS float32 time / ours; err: max |got - float64| / (|a|.|b|))")
  print(f"{'shape':34s} {'cuBLAS':>8s} | {'default':>28s} | {'best 3xTF32 tile':>28s} | {'SIMT':>28s} | "
        f"err cuBLAS / SIMT / 3xTF32 (3xTF32/cuBLAS)")
  for row in rows:
    default = row["default"]
    ratio = "-" if default is None else f"{default[1] / row['cublas_err']:.2f}"
    print(f"{row['shape']:34s} {row['cublas'] * 1e6:5.0f} us | {cell(default, row['cublas']):>28s} | "
          f"{cell(row['best_3x'], row['cublas']):>28s} | {cell(row['simt'], row['cublas']):>28s} | "
          f"{row['cublas_err']:.1e} / {err(row['simt'])} / {err(default)} ({ratio})", flush=True)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="the first two shapes only (4096³, both B layouts)")
  parser.add_argument("--simt-tiles", action="store_true", help="also every tile of the SIMT template")
  args = parser.parse_args()
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  torch.set_float32_matmul_precision("highest")
  print(f"GPU: {torch.cuda.get_device_name()}", flush=True)
  rows = []
  for shape in SHAPES[:2] if args.quick else SHAPES:
    try: rows.append(bench_shape(*shape, args.simt_tiles))
    except Exception as failure:   # a shape whose setup fails (memory, a torch error) must not end the run
      print(f"\n{shape}: FAILED: {type(failure).__name__}: {str(failure)[:200]}", flush=True)
  table(rows)

if __name__ == "__main__":
  main()
