"""gemma-3-270m's prefill projections on Hopper as the model schedules them: the prompt length a Variable (one kernel
for every length, bound at --tokens), half inputs, float32 sums; the heuristics' pick (OptOps.WGMMA on sm_90a) against
the mma.sync tensor-core kernel they pick with WGMMA=0, and against torch's matmul (cuBLAS, half in and out).

The four kernels, built as gemma3.py builds them:
  - qkv     x[:T] · W_qkvᵀ (1536×640), half out
  - o_proj  attn · W_oᵀ (640×1024), attn computed as [4 heads, T, 256] (a head T·256 elements after the one before),
            read as T×1024; float32 out (the post-attention norm reads the sums)
  - gate_up x[:T] · W_guᵀ (4096×640), half out
  - down    h[:T] · W_dᵀ (640×2048), float32 out (the post-feedforward norm reads the sums)
Each kernel's output is checked against numpy (float64) at max |error| / max |y|; times are CUDA events around REPEATS
launches (bench/gpu.py event_seconds) of the kernel bound at T. Needs an sm_90 GPU for WGMMA (elsewhere both columns
are the mma.sync kernel).
Usage: python bench/prefill_matmuls.py [--tokens 512] [--bound 520] [--repeats 50]
"""
from __future__ import annotations
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from tgrad import Tensor, Variable  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.kernel import Kernel  # noqa: E402
from tgrad.device import Buffer, Device  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.schedule import ScheduleItem, create_schedule  # noqa: E402

HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE, QKV = 4, 256, 640, 2048, 1536
NORM_EPS = 1e-6
REPEATS = 50

def _half(rng: np.random.Generator, *shape: int) -> np.ndarray:
  return rng.standard_normal(shape).astype(np.float16)

def projections(device: str, bound: int, tokens: int) -> list[tuple[str, ScheduleItem, np.ndarray, int]]:
  """(name, the matmul's schedule item, numpy's float64 result for its first `tokens` rows, K) of each projection."""
  rng = np.random.default_rng(0)
  length = Variable("prompt_len", 1, bound).bind(tokens)
  out = []
  def add(name: str, y: Tensor, a: np.ndarray, w: np.ndarray) -> None:
    items = [i for i in create_schedule([y.lazydata]) if i.ast.op.name == "SINK"]
    kernels = [(i, Kernel(i.ast, Device[device].renderer)) for i in items]
    (item,) = [i for i, k in kernels if len(k.full_shape) == 3 and k.reduceops]
    out.append((name, item, a.astype(np.float64) @ w.T.astype(np.float64), w.shape[1]))
  for name, n, k, float_out in (("qkv", QKV, HIDDEN, False), ("gate_up", 2 * INTERMEDIATE, HIDDEN, False),
                                ("down", HIDDEN, INTERMEDIATE, True)):
    x, w = _half(rng, bound, k), _half(rng, n, k)
    # the inputs realized first: the schedule's matmul item then reads them (a lazy host copy would be an item of its
    # own, not run here, and the kernel would read unwritten buffers)
    y = Tensor(x, device=device).realize()[:length] @ Tensor(w, device=device).realize().T
    add(name, y.float().rms_norm(-1, NORM_EPS) if float_out else y, x[:tokens], w)
  attn_np, w_o = _half(rng, HEADS, bound, HEAD_DIM), _half(rng, HIDDEN, HEADS * HEAD_DIM)
  attn = Tensor(attn_np, device=device)[:, :length, :].contiguous().realize()   # [H, T, D]: a head T·D on
  o = attn.permute(1, 0, 2).reshape(length, HEADS * HEAD_DIM) @ Tensor(w_o, device=device).realize().T
  a_rows = attn_np[:, :tokens, :].transpose(1, 0, 2).reshape(tokens, HEADS * HEAD_DIM)
  add("o_proj", o.float().rms_norm(-1, NORM_EPS), a_rows, w_o)
  return out

def describe(kernel: Kernel) -> str:
  if (use := kernel.warpgroup_matmul) is not None:
    return f"wgmma {use.block_m}x{use.block_n}/{use.stages}" + (" TMA" if use.tma else "") + \
      (f" A in {use.a_segment}-segments" if use.a_segment else "") + (" f32 out" if use.out_dtype else "")
  return ",".join(f"{o.op.name}:{o.axis}:{o.amount}" for o in kernel.applied_opts) or "no opts"

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=512, help="the prompt length the kernels are bound at")
  parser.add_argument("--bound", type=int, default=520, help="the prompt length's maximum (the buffers' rows)")
  parser.add_argument("--repeats", type=int, default=REPEATS)
  args = parser.parse_args()
  import torch
  from gpu import event_seconds
  from wgmma import torch_event_seconds
  from tgrad.codegen.compile import compile_kernel
  device = Device["CUDA"]
  print(f"GPU {torch.cuda.get_device_name()}, tgrad arch {device.renderer.arch}, T = {args.tokens} of {args.bound}, "
        f"{args.repeats} launches per timing")
  print(f"{'kernel':>8} {'M×K·K×N':>16} {'variant':>10} {'opts':>40} {'µs':>8} {'TFLOP/s':>8} {'err':>8}")
  for name, item, want, k in projections("CUDA", args.bound, args.tokens):
    m, n = want.shape
    flops = 2 * m * n * k
    for label, settings in (("chosen", {}), ("WGMMA=0", {"WGMMA": 0})):
      with Context(**settings):
        kernel = Kernel(item.ast, device.renderer)
        hand_coded_optimizations(kernel)
      runner = compile_kernel("CUDA", kernel, f"{name} {label}")
      out = Buffer("CUDA", item.bufs[0].size, item.bufs[0].dtype)
      launch = runner.prepare([out.handle, *[b.handle for b in item.inputs]], (args.tokens,))
      launch()
      got = out.copyout()[:m * n].reshape(m, n).astype(np.float64)
      error = float(np.abs(got - want).max() / np.abs(want).max())
      seconds = event_seconds(launch, args.repeats)
      print(f"{name:>8} {f'{m}×{k}·{k}×{n}':>16} {label:>10} {describe(kernel)[:40]:>40} {seconds * 1e6:8.1f} "
            f"{flops / seconds / 1e12:8.1f} {error:8.1e}", flush=True)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    result = torch.empty(m, n, device="cuda", dtype=torch.float16)
    seconds = torch_event_seconds(lambda: torch.matmul(a, w.T, out=result), args.repeats)
    print(f"{name:>8} {f'{m}×{k}·{k}×{n}':>16} {'torch':>10} {'cuBLAS a @ w.T (half out)':>40} {seconds * 1e6:8.1f} "
          f"{flops / seconds / 1e12:8.1f}", flush=True)

if __name__ == "__main__": main()
