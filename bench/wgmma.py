"""tgrad's matmul kernels on Hopper (OptOps.WGMMA: the warpgroup-MMA kernel of runtime/cuda/wgmma.py) against torch's
matmul (cuBLAS), kernel times by CUDA events, float16 and bfloat16 with float32 accumulation.

Shapes: 4096³, then the prefill projections of gemma-3-270m at 512 tokens (M×K · K×N). Two layouts of B: "a@b" (B is
K×N row-major: wgmma reads it transposed) and "a@w.T" (B is an N×K weight, K contiguous). For each shape, layout and
dtype, the kernel the heuristics pick ("chosen": WGMMA with its default tile for big matmuls on sm_90); with --tma the
heuristics' pick with cp.async loads (WGMMA_TMA=0) and with TMA loads and a producer warpgroup (WGMMA_TMA=1) side by
side; with --sweep also every WGMMA tile (cp.async and TMA; --loader narrows it) and the mma.sync tensor-core kernel the
heuristics pick with WGMMA=0. Every kernel's
output is first written into a buffer poisoned with NaN and checked against torch's result; its time is CUDA events
around REPEATS back-to-back launches (bench/gpu.py `event_seconds`), torch's likewise (torch.matmul into a preallocated
output). Ratios are torch time / tgrad time (1.0: as fast as cuBLAS). Needs an sm_90 GPU (H100/H200).
With --tf32: float32 4096³ a@w.T through the matmul lowering "tf32" (inputs rounded to TF32 in the graph) instead: the
heuristics' pick (the TF32 warpgroup kernel) and the mma.sync TF32 kernel (WGMMA=0), with --sweep every cp.async tile,
against torch's float32 matmul with allow_tf32; each output's max error against the float64 product of the rounded
inputs and of the truncated ones, relative to the largest output (a kernel that rounds is much closer to the first).
Usage: python bench/wgmma.py [--quick] [--tma] [--sweep] [--loader cp.async|tma|both] [--repeats N] [--tf32]
"""
from __future__ import annotations
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds  # noqa: E402
from tgrad import Tensor  # noqa: E402
from tgrad.codegen.compile import compile_kernel  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.codegen.warpgroup_mma import WGMMA_TILES  # noqa: E402
from tgrad.device import Buffer, Device  # noqa: E402
from tgrad.dtype import dtypes  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.runtime.cuda import wgmma  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

# (M, K, N): 4096³, then gemma-3-270m's prefill projections at 512 tokens (q/k/v-style 640→2048, o 2048→640,
# MLP 640→1536 and 1024→640), issue 29's list
SHAPES = [(4096, 4096, 4096), (512, 640, 2048), (512, 2048, 640), (512, 640, 1536), (512, 1024, 640)]
LAYOUTS = ("a@b", "a@w.T")
REPEATS = 50
POISON = 0xFFFF   # NaN in half and bfloat16
# |tgrad - torch| ≤ RTOL·|torch| + ATOL_PER_SQRT_K·√K: one rounding of each result to the 16-bit format plus float32
# sums in another order (a wrong layout gives errors of the size of the values, ~√K)
RTOL = {dtypes.float16: 2 ** -9, dtypes.bfloat16: 2 ** -6}
ATOL_PER_SQRT_K = {dtypes.float16: 2e-3, dtypes.bfloat16: 2e-2}

def torch_event_seconds(fn, repeats: int) -> float:
  """GPU seconds per fn() call: torch's CUDA events around `repeats` calls queued back to back, after a warm call."""
  import torch
  fn()
  torch.cuda.synchronize()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  for _ in range(repeats): fn()
  end.record()
  end.synchronize()
  return start.elapsed_time(end) / 1e3 / repeats

def tgrad_tensor(x) -> Tensor:
  """A realized tgrad CUDA tensor with the values (bits) of the torch tensor x."""
  import torch
  bits = x.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
  dtype = dtypes.float16 if x.dtype == torch.float16 else dtypes.bfloat16
  return Tensor(bits, device="CUDA").bitcast(dtype).realize()

def heuristic_kernel(ast, **settings) -> Kernel:
  with Context(**settings):
    kernel = Kernel(ast, Device["CUDA"].renderer)
    hand_coded_optimizations(kernel)
  return kernel

def kernel_variants(ast, sweep: bool, tma: bool = False, loader: str = "both") -> list[tuple[str, Kernel]]:
  """(label, optimized kernel): what the heuristics pick; with `tma` their picks under WGMMA_TMA=0 and 1; with `sweep`
  every WGMMA tile of `loader` and the WGMMA=0 pick."""
  renderer = Device["CUDA"].renderer
  variants = [("chosen", heuristic_kernel(ast))]
  if tma: variants += [("cp.async (WGMMA_TMA=0)", heuristic_kernel(ast, WGMMA_TMA=0)),
                       ("TMA (WGMMA_TMA=1)", heuristic_kernel(ast, WGMMA_TMA=1))]
  if not sweep: return variants
  with Context(WGMMA=0):
    mma_sync = Kernel(ast, renderer)
    hand_coded_optimizations(mma_sync)
  variants.append(("mma.sync (WGMMA=0)", mma_sync))
  for tile, (warpgroups, block_n, stages, tile_tma) in enumerate(WGMMA_TILES):
    if loader != "both" and tile_tma != (loader == "tma"): continue
    kernel = Kernel(ast, renderer)
    kernel.apply_opt(Opt(OptOps.WGMMA, 0, tile))
    variants.append((f"wgmma {64 * warpgroups}x{block_n}/{stages}" + (" TMA" if tile_tma else ""), kernel))
  return variants

def describe(kernel: Kernel) -> str:
  if (use := kernel.warpgroup_matmul) is not None:
    return f"wgmma {use.block_m}x{use.block_n}x{wgmma.block_k(use.dtype)}/{use.stages}" + \
      (" B K×N" if use.b_n_major else "") + \
      (" TMA" if use.tma else "")
  return ",".join(f"{o.op.name}:{o.axis}:{o.amount}" for o in kernel.applied_opts) or "no opts"

TF32_SHAPE = (4096, 4096, 4096)   # M, K, N
TF32_KEPT_BITS = -8192             # 0xFFFFE000 as an int32: the bits a TF32 value keeps
TF32_ROUNDING = 4096               # half of the dropped bits: round to nearest, ties away (round_to_tf32)

def tf32_values(x, rounded: bool):
  """A torch float32 tensor rounded (as round_to_tf32) or truncated to TF32, as float64."""
  import torch
  bits = x.view(torch.int32)
  bits = ((bits + TF32_ROUNDING) if rounded else bits) & TF32_KEPT_BITS
  return bits.view(torch.float32).double()

def tf32_main(args) -> None:
  """The TF32 case (see the module doc)."""
  import torch
  from tgrad.regions import LOWERINGS
  m, k, n = TF32_SHAPE
  generator = torch.Generator(device="cuda").manual_seed(0)
  a = torch.randn(m, k, device="cuda", generator=generator)
  w = torch.randn(n, k, device="cuda", generator=generator)   # a linear layer's weight: N×K
  flops = 2 * m * n * k
  torch_out = torch.empty(m, n, device="cuda")
  torch.backends.cuda.matmul.allow_tf32 = True
  torch_seconds = torch_event_seconds(lambda: torch.matmul(a, w.T, out=torch_out), args.repeats)
  torch.backends.cuda.matmul.allow_tf32 = False
  rounded = tf32_values(a, True) @ tf32_values(w, True).T
  truncated = tf32_values(a, False) @ tf32_values(w, False).T
  scale = rounded.abs().max().item()
  def errors(result) -> str:   # float32 sums of the rounded products: ~1e-6; of truncated ones: ~1e-4 of the scale
    return f"{(result - rounded).abs().max().item() / scale:.2e} (truncated: " \
           f"{(result - truncated).abs().max().item() / scale:.2e})"
  print(f"torch allow_tf32: {errors(torch_out.double())}")
  ta, tw = (Tensor(x.cpu().numpy(), device="CUDA").realize() for x in (a, w))
  item = create_schedule([LOWERINGS["matmul"]["tf32"].build(ta, tw.T).lazydata])[-1]
  renderer = Device["CUDA"].renderer
  variants = [("chosen", heuristic_kernel(item.ast)), ("mma.sync (WGMMA=0)", heuristic_kernel(item.ast, WGMMA=0))]
  if args.sweep:
    for tile, (warpgroups, block_n, stages, tma) in enumerate(WGMMA_TILES):
      if tma: continue   # TF32 is loaded by cp.async (its operands are rounded in shared memory by the threads)
      kernel = Kernel(item.ast, renderer)
      kernel.apply_opt(Opt(OptOps.WGMMA, 0, tile))
      variants.append((f"wgmma {64 * warpgroups}x{block_n}/{stages}", kernel))
  print(f"{'M×K·(N×K)ᵀ':>16} {'kernel':>40} {'tgrad µs':>9} {'TFLOP/s':>8} {'torch µs':>9} {'TFLOP/s':>8} "
        f"{'ratio':>6}  max err / max |out| (against truncated operands)")
  for label, kernel in variants:
    name = f"{label}: {describe(kernel)}" if label == "chosen" or label.endswith(")") else label
    try: runner = compile_kernel("CUDA", kernel, "bench")
    except Exception as error:   # a variant that fails to build is reported, the others go on  # noqa: BLE001
      print(f"{f'{m}×{k}·{n}×{k}':>16} {name:>40}  FAILED: {error}"[:200])
      continue
    out = Buffer("CUDA", m * n, dtypes.float32).copyin(np.full(m * n, np.nan, np.float32))
    buffers = [out] + list(item.inputs)
    runner(buffers, wait=True)
    result = torch.from_numpy(out.copyout().view(np.float32).copy()).reshape(m, n).cuda().double()
    seconds = event_seconds(runner.prepare([b.handle for b in buffers]), args.repeats)
    print(f"{f'{m}×{k}·{n}×{k}':>16} {name[:40]:>40} {seconds * 1e6:9.1f} {flops / seconds / 1e12:8.1f} "
          f"{torch_seconds * 1e6:9.1f} {flops / torch_seconds / 1e12:8.1f} {torch_seconds / seconds:6.2f}  "
          f"{errors(result)}", flush=True)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="4096³ float16 only")
  parser.add_argument("--sweep", action="store_true", help="also every WGMMA tile and the mma.sync kernel")
  parser.add_argument("--tma", action="store_true", help="the heuristics' cp.async and TMA picks side by side")
  parser.add_argument("--loader", choices=("cp.async", "tma", "both"), default="both",
                      help="which WGMMA tiles --sweep times")
  parser.add_argument("--repeats", type=int, default=REPEATS, help="launches per timing")
  parser.add_argument("--tf32", action="store_true", help="float32 4096³ a@w.T through the tf32 lowering instead")
  args = parser.parse_args()
  import torch
  device = Device["CUDA"]
  if wgmma.wgmma_arch(device.renderer.arch) is None: sys.exit(f"wgmma needs sm_90, this GPU is {device.renderer.arch}")
  print(f"GPU {torch.cuda.get_device_name()}, tgrad arch {device.renderer.arch}, {args.repeats} launches per timing")
  if args.tf32: return tf32_main(args)
  torch_types = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}
  shapes = SHAPES[:1] if args.quick else SHAPES
  print(f"{'M×K·K×N':>16} {'layout':>6} {'dtype':>9} {'kernel':>34} {'tgrad µs':>9} {'TFLOP/s':>8} {'torch µs':>9} "
        f"{'TFLOP/s':>8} {'ratio':>6}  max err/tol")
  for dtype in (dtypes.float16,) if args.quick else (dtypes.float16, dtypes.bfloat16):
    for m, k, n in shapes:
      generator = torch.Generator(device="cuda").manual_seed(0)
      a = torch.randn(m, k, device="cuda", dtype=torch_types[dtype], generator=generator)
      b = torch.randn(k, n, device="cuda", dtype=torch_types[dtype], generator=generator)
      flops = 2 * m * n * k
      for layout in LAYOUTS:
        # the same values either way: a@b with B K×N, or a@w.T with w = Bᵀ stored N×K
        b_arg = b if layout == "a@b" else b.T.contiguous()
        torch_out = torch.empty(m, n, device="cuda", dtype=torch_types[dtype])
        def torch_matmul(): torch.matmul(a, b_arg if layout == "a@b" else b_arg.T, out=torch_out)
        torch_seconds = torch_event_seconds(torch_matmul, args.repeats)
        reference = (a.float() @ b.float())
        ta, tb = tgrad_tensor(a), tgrad_tensor(b_arg)
        items = create_schedule([(ta @ (tb if layout == "a@b" else tb.T)).lazydata])
        item = items[-1]
        tolerance = RTOL[dtype] * reference.abs() + ATOL_PER_SQRT_K[dtype] * k ** 0.5
        for label, kernel in kernel_variants(item.ast, args.sweep, args.tma, args.loader):
          name = f"{label}: {describe(kernel)}" if label == "chosen" or label.endswith(")") else label
          try: runner = compile_kernel("CUDA", kernel, "bench")
          except Exception as error:   # a variant that fails to build is reported, the sweep goes on  # noqa: BLE001
            print(f"{f'{m}×{k}·{k}×{n}':>16} {layout:>6} {dtype.name:>9} {name:>34}  FAILED: {error}"[:200])
            continue
          out = Buffer("CUDA", m * n, dtype).copyin(np.full(m * n, POISON, np.uint16))
          buffers = [out] + list(item.inputs)
          runner(buffers, wait=True)
          result = torch.from_numpy(out.copyout().view(np.uint16).view(np.int16)).view(torch_types[dtype])
          result = result.reshape(m, n).float().cuda()
          ratio_to_tolerance = ((result - reference).abs() / tolerance).nan_to_num(nan=float("inf")).max().item()
          launch = runner.prepare([b.handle for b in buffers])
          seconds = event_seconds(launch, args.repeats)
          flag = "" if ratio_to_tolerance <= 1 else "  WRONG"
          print(f"{f'{m}×{k}·{k}×{n}':>16} {layout:>6} {dtype.name:>9} {name[:34]:>34} {seconds * 1e6:9.1f} "
                f"{flops / seconds / 1e12:8.1f} {torch_seconds * 1e6:9.1f} {flops / torch_seconds / 1e12:8.1f} "
                f"{torch_seconds / seconds:6.2f}  {ratio_to_tolerance:.3g}{flag}", flush=True)

if __name__ == "__main__": main()
