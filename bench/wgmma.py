"""The Hopper wgmma matmul kernel (tgrad/runtime/cuda/wgmma.py) against torch's matmul (cuBLAS), kernel times.

out = a·bᵀ with a: M×K and b: N×K row-major (a linear layer's weight layout), or a·b with b K×N (the configs marked
"B K×N": wgmma reads B transposed), float16 and bfloat16, float32
accumulate. For each shape and tile configuration: tgrad's kernel by CUDA events around REPEATS back-to-back launches
(bench/gpu.py `event_seconds`), torch's `a @ b.T` by its profiler (`torch_kernel_time`); each result is first checked
against torch's on an output poisoned with NaN. Needs an sm_90 GPU (H100/H200): wgmma is sm_90a only.
Usage: python bench/wgmma.py [--quick]
"""
from __future__ import annotations
import argparse, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds, torch_kernel_time  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.dtype import dtypes  # noqa: E402
from tgrad.runtime.cuda import wgmma  # noqa: E402
from tgrad.runtime.cuda.wgmma import WgmmaConfig  # noqa: E402

# (M, N, K): 4096², then the prefill projections of gemma-3-270m at 512 tokens (issue 29's list)
SHAPES = [(4096, 4096, 4096), (512, 2048, 640), (512, 640, 2048), (512, 1536, 640), (512, 640, 1024)]
CONFIGS = [WgmmaConfig(2, 128, 64, 4), WgmmaConfig(2, 256, 64, 3), WgmmaConfig(1, 128, 64, 4),
           WgmmaConfig(2, 128, 64, 5), WgmmaConfig(2, 64, 64, 4), WgmmaConfig(1, 256, 64, 4),
           WgmmaConfig(2, 128, 64, 4, b_n_major=True), WgmmaConfig(2, 256, 64, 3, b_n_major=True)]
POISON = 0xFFFF   # NaN in half and bfloat16

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="4096² float16 only, the default tile only")
  args = parser.parse_args()
  import torch
  from tgrad.runtime.cuda.runtime import CUDAProgram
  device = Device["CUDA"]
  if wgmma.wgmma_arch(device.renderer.arch) is None: sys.exit(f"wgmma needs sm_90, this GPU is {device.renderer.arch}")
  torch_types = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}
  shapes, configs = (SHAPES[:1], CONFIGS[:1]) if args.quick else (SHAPES, CONFIGS)
  print(f"{'shape':>18} {'dtype':>9} {'tile (wg×64, N, K, stages)':>28} {'tgrad µs':>9} {'TFLOP/s':>8} "
        f"{'torch µs':>9} {'TFLOP/s':>8} {'ratio':>6}  max |err|")
  for dtype in (dtypes.float16,) if args.quick else (dtypes.float16, dtypes.bfloat16):
    for m, n, k in shapes:
      generator = torch.Generator(device="cuda").manual_seed(0)
      a = torch.randn(m, k, device="cuda", dtype=torch_types[dtype], generator=generator)
      b = torch.randn(n, k, device="cuda", dtype=torch_types[dtype], generator=generator)
      reference = a @ b.T
      b_rows = b.T.contiguous()
      torch_seconds = torch_kernel_time(lambda: a @ b.T)
      flops = 2 * m * n * k
      for config in configs:
        name = f"wgmma_{m}_{n}_{k}_{config.warpgroups}_{config.block_n}_{config.block_k}_{config.stages}"
        name += "_n" if config.b_n_major else ""
        program = CUDAProgram(name, wgmma.compile_wgmma_matmul(name, m, n, k, dtype, config))
        b_arg = b_rows if config.b_n_major else b   # the same values, K×N row-major: out = a·b_rows
        out = torch.empty(m, n, device="cuda", dtype=torch_types[dtype])
        out.view(torch.int16).fill_(POISON - 65536)
        torch.cuda.synchronize()
        grid, block = wgmma.launch_dims(config, m, n)
        def launch(): program(out.data_ptr(), a.data_ptr(), b_arg.data_ptr(), global_size=grid, local_size=block)
        launch()
        device.synchronize()
        error = (out.float() - reference.float()).abs().max().item()
        seconds = event_seconds(launch)
        tile = f"{config.warpgroups}, {config.block_n}, {config.block_k}, {config.stages}" + \
          (" B K×N" if config.b_n_major else "")
        print(f"{f'{m}×{n}×{k}':>18} {dtype.name:>9} {tile:>28} {seconds * 1e6:9.1f} {flops / seconds / 1e12:8.1f} "
              f"{torch_seconds * 1e6:9.1f} {flops / torch_seconds / 1e12:8.1f} {torch_seconds / seconds:6.2f}  "
              f"{error:.3g}", flush=True)

if __name__ == "__main__": main()
