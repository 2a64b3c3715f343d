"""Tensor-core matmul benchmark: an n×n half matmul on CUDA, tgrad against torch, like against like.

Kernel rows: tgrad's bare kernel (CUDA events around the launch, best of KERNEL_RUNS) against torch's kernel time
(torch profiler, best of KERNEL_RUNS calls). The end-to-end row: host wall clock of `(x @ y).realize()` against the
eager `a @ b`, both from and to a synchronized GPU. Cases: tgrad's default opts (tensor cores, see heuristics.py);
opt lists around TC (tiles per warp, their spread, warps per block, K unroll); b stored transposed; bfloat16 (inputs
cast before timing on both sides); float32 through the matmul lowering "tf32" (TF32 tensor cores) against torch with
TF32 allowed; and with --beam N a BEAM search (its deadline cut to --beam-seconds). Every
kernel's output is poisoned before its first run and that run is checked element by element against torch (err:
worst |got - ref| / tolerance, ≤ 1 passes; WRONG otherwise). TFLOP/s = 2·n³ / time.
Usage: python bench/tc_matmul.py [--size 4096] [--beam 2] [--beam-seconds 45]
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import error_ratio, poison, torch_kernel_time, wall_time  # noqa: E402
from tgrad import Tensor  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.device import Buffer, Device  # noqa: E402
from tgrad.dtype import dtypes  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.realize import compile_kernel  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

KERNEL_RUNS = 20
# per element against torch's float32 result of the same half inputs: |got - ref| <= ATOL_PER_ROOT_K·√n + RTOL·|ref|.
# Both sum exact products in float32 (orders differ: ~1e-4 at n = 4096 near zero); tgrad rounds to half (1 ulp: RTOL)
RTOL, ATOL_PER_ROOT_K = 2e-3, 2e-4
RTOL_BFLOAT16 = 1.6e-2   # 1 ulp of bfloat16 (8 significant bits)
TC = Opt(OptOps.TC, 0, 0)
def _opts(*spec: tuple[str, int, int]) -> list[Opt]:
  return [TC if op == "TC" else Opt(OptOps[op], axis, n) for op, axis, n in spec]
_TC = ("TC", 0, 0)
# axis 0 counts rows, axis 1 columns (after TC: 16-row and 8-column tiles). UPCAST after TC = tiles per warp; an
# UPCAST of the columns before TC spreads a warp's column tiles so each lane's columns are adjacent ("spread");
# LOCAL = warps per block
CONFIGS = {
  "TC only": _opts(_TC),
  "tiles 4x4 warps 2x2": _opts(_TC, ("UPCAST", 0, 4), ("UPCAST", 1, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "tiles 4x8 warps 2x2": _opts(_TC, ("UPCAST", 0, 4), ("UPCAST", 1, 8), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 8, rows 2, warps 2x2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 2), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 4, rows 4, warps 2x2": _opts(("UPCAST", 1, 4), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 8, rows 4, one warp (default)": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4)),
  "spread 8, rows 4, one warp, unroll 2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("UNROLL", 0, 2)),
  "spread 8, rows 4, warps 2x2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 8, rows 4, warps 2x2, unroll 2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 2),
                                                 ("LOCAL", 1, 2), ("UNROLL", 0, 2)),
  "spread 8, rows 4, warps 2x4": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 4)),
  "spread 8, rows 4, warps 4x2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 4), ("LOCAL", 1, 2)),
  "spread 8, rows 8, warps 2x2": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 8), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 16, rows 4, warps 2x2": _opts(("UPCAST", 1, 16), _TC, ("UPCAST", 0, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 2)),
  "spread 8, rows 4, cols 2, warps 2x1": _opts(("UPCAST", 1, 8), _TC, ("UPCAST", 0, 4), ("UPCAST", 1, 2),
                                               ("LOCAL", 0, 2)),
}

def kernel_seconds(item, opts: list[Opt] | None, name: str) -> tuple[float, np.ndarray, list[Opt]]:
  """Best kernel time of the matmul's kernel with `opts` (None: the default heuristics), its output and its opts."""
  from tgrad.codegen.heuristics import hand_coded_optimizations
  kernel = Kernel(item.ast, Device["CUDA"].renderer)
  if opts is None: hand_coded_optimizations(kernel)
  else:
    for opt in opts: kernel.apply_opt(opt)
  runner = compile_kernel("CUDA", kernel, name)
  out = Buffer("CUDA", item.outputs[0].size, item.outputs[0].dtype)
  poison(out)   # a fresh allocation may reuse the last config's memory, with its right answer in it
  buffers = [out] + list(item.inputs)
  runner(buffers, wait=True)
  got = out.copyout()   # the first run's output: checked by the caller
  seconds = min(runner(buffers, wait=True) for _ in range(KERNEL_RUNS))
  return seconds, got, kernel.applied_opts

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--size", type=int, default=4096)
  parser.add_argument("--beam", type=int, default=0)
  parser.add_argument("--beam-seconds", type=int, default=45)
  args = parser.parse_args()
  import torch
  n = args.size
  flops = 2 * n ** 3
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal((n, n), dtype=np.float32).astype(np.float16) for _ in range(2))
  print(f"{n}x{n} fp16 matmul on {torch.cuda.get_device_name()}, torch {torch.__version__}")
  torch_a, torch_b = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
  t_torch = torch_kernel_time(lambda: torch_a @ torch_b, repeats=KERNEL_RUNS)
  t_torch_e2e = wall_time(lambda: torch_a @ torch_b, repeats=KERNEL_RUNS)
  ref = (torch_a.float() @ torch_b.float()).cpu().numpy()
  atol = ATOL_PER_ROOT_K * np.sqrt(n)
  def report(label: str, seconds: float, got: np.ndarray | None = None, extra: str = "", torch_seconds: float = 0.0,
             reference: np.ndarray = ref, rtol: float = RTOL) -> None:
    err = ""
    if got is not None:
      ratio = error_ratio(got.astype(np.float32).reshape(reference.shape), reference, rtol, atol)
      err = f"  err {ratio:.2f}{'' if ratio <= 1 else ' WRONG'}"
    torch_seconds = torch_seconds or t_torch
    print(f"  {label:34s} {seconds * 1e6:9.1f} us {flops / seconds / 1e12:7.1f} TFLOP/s  "
          f"{torch_seconds / seconds:5.2f}x torch{err}{extra}", flush=True)
  report("torch fp16 (cuBLAS), kernel", t_torch)
  report("torch fp16 a @ b end to end", t_torch_e2e, torch_seconds=t_torch_e2e)
  x, y = Tensor(a_np, device="CUDA").realize(), Tensor(b_np, device="CUDA").realize()
  t_tensor = wall_time(lambda: (x @ y).realize(), repeats=KERNEL_RUNS)
  report("tgrad x @ y end to end (default)", t_tensor, (x @ y).numpy(), "  (vs torch end to end)", t_torch_e2e)
  (item,) = [i for i in create_schedule([(x @ y).lazydata]) if i.ast.op is Ops.SINK]
  seconds, got, opts = kernel_seconds(item, None, "tc_default")
  report("tgrad kernel, default opts", seconds, got.view(np.float16),
         f"  {[(o.op.name, o.axis, o.amount) for o in opts]}")
  for label, config in CONFIGS.items():
    try: seconds, got, _ = kernel_seconds(item, config, "tc_config")
    except Exception as error:   # one config that doesn't apply or compile must not end the benchmark
      print(f"  {label:34s} failed: {error!r}", flush=True)
      continue
    report(label, seconds, got.view(np.float16))
  x_t = Tensor(np.ascontiguousarray(b_np.T), device="CUDA").realize()   # x @ y with y stored transposed: y = x_t.T
  (t_item,) = [i for i in create_schedule([(x @ x_t.T).lazydata]) if i.ast.op is Ops.SINK]
  seconds, got, opts = kernel_seconds(t_item, None, "tc_transposed")
  report("default opts, b stored transposed", seconds, got.view(np.float16))
  xb, yb = x.cast(dtypes.bfloat16).realize(), y.cast(dtypes.bfloat16).realize()
  (bf_item,) = [i for i in create_schedule([(xb @ yb).lazydata]) if i.ast.op is Ops.SINK]
  seconds, got, _ = kernel_seconds(bf_item, None, "tc_bf16")
  torch_ab, torch_bb = torch_a.bfloat16(), torch_b.bfloat16()   # cast before timing, as tgrad's inputs are
  t_torch_bf16 = torch_kernel_time(lambda: torch_ab @ torch_bb, repeats=KERNEL_RUNS)
  bf16_values = (got.astype(np.uint32) << 16).view(np.float32)
  report("bf16 default opts (vs torch bf16)", seconds, bf16_values, torch_seconds=t_torch_bf16,
         reference=(torch_ab.float() @ torch_bb.float()).cpu().numpy(), rtol=RTOL_BFLOAT16)
  # TF32: the matmul lowering "tf32" of the same values as float32, against torch's float32 matmul with TF32 allowed
  # (cuBLAS on TF32 tensor cores). Half values are TF32 values (11 significant bits), so the rounding changes nothing
  # and the reference is the fp16 one: both sum the same exact products in float32.
  from tgrad.regions import LOWERINGS
  xf, yf = x.float().realize(), y.float().realize()
  (tf32_item,) = [i for i in create_schedule([LOWERINGS["matmul"]["tf32"].build(xf, yf).lazydata])
                  if i.ast.op is Ops.SINK]
  seconds, got, opts = kernel_seconds(tf32_item, None, "tc_tf32")
  torch_af, torch_bf = torch_a.float(), torch_b.float()
  torch.backends.cuda.matmul.allow_tf32 = True
  t_torch_tf32 = torch_kernel_time(lambda: torch_af @ torch_bf, repeats=KERNEL_RUNS)
  torch.backends.cuda.matmul.allow_tf32 = False
  report("tf32 default opts (vs torch tf32)", seconds, got.view(np.float32), torch_seconds=t_torch_tf32,
         extra=f"  {[(o.op.name, o.axis, o.amount) for o in opts]}")
  if args.beam:
    import tgrad.codegen.search as search
    start = time.perf_counter()
    with Context(BEAM_BUDGET=args.beam_seconds):
      result = search.search_kernel(Kernel(item.ast, Device["CUDA"].renderer), args.beam)
    stats = result.stats
    print(f"  BEAM={args.beam}: {time.perf_counter() - start:.0f} s, {stats.candidates} candidates, "
          f"{stats.rounds} rounds, deadline hit {stats.deadline_hit}, rejected {stats.rejected}, "
          f"opts {[(o.op.name, o.axis, o.amount) for o in result.opts]}", flush=True)
    seconds, got, _ = kernel_seconds(item, result.opts, "tc_beam")
    report(f"tgrad kernel, BEAM={args.beam}", seconds, got.view(np.float16))

if __name__ == "__main__":
  main()
