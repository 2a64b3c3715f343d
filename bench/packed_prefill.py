"""A prompt times a packed (GGUF-quantized) weight on the GPU: the one-kernel path over the packed blocks and the half
temporary path against a dense float16 weight (and the packed float product), for each projection of gemma-3-270m's
layers as its Q4_K_M file packs them.

Each projection (its ggml type and [out, in] shape) multiplies a float16 prompt of `--rows` tokens (a symbolic length
bound to it, as the model's prefill runs) four ways, each a TinyJit replayed back to back between CUDA events:
- `smem`: packed_linear's default on an sm_90 GPU (PACKED_GEMM=1, tgrad/packed_gemm_kernel.py): one warpgroup-MMA
  kernel that dequantizes each K tile of the packed weight in shared memory (no temporary);
- `temp`: PACKED_GEMM=0 (tgrad/nn/quant.py `runs_as_half_gemm`): the weight dequantized into a float16 temporary by a
  kernel of its own, then the float16 model's matmul on tensor cores (both kernels timed);
- `packed`: HALF_GEMM=0: x times the weight's float32 values inside one kernel (float32 products);
- `dense`: x @ Wᵀ with W already a float16 weight (what `dequant:float16` loads): the speed to match.
Prints one line per projection (µs per call, the kernels each way ran, and each way's largest error against numpy's
float64 product of x and the weight's float32 values, relative to its largest output), then the sums, as JSON; writes
$OUT/packed_prefill.json when OUT is set. The whole model's prefill:
`python bench/gemma_gguf_gpu.py --model Z.gguf --modes dequant:float16 packed:float16 --prefill-tokens 512` (with
PACKED_GEMM=0 for the temporary path, HALF_GEMM=0 for the packed product).
Usage: python bench/packed_prefill.py [--device CUDA] [--rows 512] [--max-rows 520]
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor, TinyJit, Variable, dtypes  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor, runs_as_half_gemm  # noqa: E402
from tgrad.packed_gemm_kernel import unsupported  # noqa: E402

# gemma-3-270m's projections as its Q4_K_M file packs layer 0, stacked as the model stacks them (q and k share a type:
# one buffer; gate and up too): (name, type, out, in)
PROJECTIONS = [("qk", GGMLType.Q5_0, 1280, 640), ("v", GGMLType.Q8_0, 256, 640), ("o", GGMLType.Q4_K, 640, 1024),
               ("gate_up", GGMLType.Q5_0, 4096, 640), ("down", GGMLType.Q6_K, 640, 2048)]
PROMPT_ROWS = 512
MAX_ROWS = 520       # the symbolic length's bound (the prefill's cache length)
REPLAYS = 50
WALL_REPEATS = 5
SCALE_RANGE = (1e-3, 1e-2)   # random float16 block scales: outputs stay well inside float16's range
SCALE_POSITIONS = {GGMLType.Q8_0: (0,), GGMLType.Q5_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,)}

def random_packed(ggml_type: GGMLType, out_features: int, in_features: int, device: str, seed: int
                  ) -> QuantizedTensor:
  rng = np.random.default_rng(seed)
  layout = BLOCK_LAYOUTS[ggml_type]
  raw = rng.integers(0, 256, (out_features * in_features // layout.block_size, layout.block_bytes), dtype=np.uint8)
  scales = rng.uniform(*SCALE_RANGE, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
  for position in SCALE_POSITIONS[ggml_type]: raw[:, position:position + 2] = scales
  return QuantizedTensor.from_bytes(raw.reshape(out_features, -1), ggml_type, (out_features, in_features),
                                    device).realize()

def seconds_per_call(device: str, call) -> float:
  """GPU seconds per call (CUDA events around back-to-back calls), or the best wall time elsewhere."""
  if device == "CUDA":
    from gpu import event_seconds
    return event_seconds(call, REPLAYS)
  call()
  Device[device].synchronize()
  best = float("inf")
  for _ in range(WALL_REPEATS):
    start = time.perf_counter()
    call()
    Device[device].synchronize()
    best = min(best, time.perf_counter() - start)
  return best

def measure(name: str, ggml_type: GGMLType, out_features: int, in_features: int, device: str, rows: int,
            max_rows: int) -> dict:
  weight = random_packed(ggml_type, out_features, in_features, device, seed=out_features + in_features)
  dense = weight.dequantize(dtypes.float16).realize()
  data = np.random.default_rng(rows).standard_normal((max_rows, in_features)).astype(np.float16)
  x = Tensor(data, device=device).realize()[:Variable("prompt_len", 1, max_rows).bind(rows)]
  # (HALF_GEMM, PACKED_GEMM, product) per way
  ways = {"smem": (1, 1, lambda v: weight.linear(v)), "temp": (1, 0, lambda v: weight.linear(v)),
          "packed": (0, 1, lambda v: weight.linear(v)), "dense": (1, 1, lambda v: v @ dense.T)}
  out: dict = {"name": name, "type": ggml_type.name, "shape": [out_features, in_features], "rows": rows}
  if not runs_as_half_gemm(x): out["note"] = f"{device} does not offer the half matmul"
  elif (why := unsupported(x.lazydata, weight.packed.lazydata, ggml_type.name, weight.shape)) is not None:
    out["note"] = f"smem is the temporary path here: {why}"
  reference = data[:rows].astype(np.float64) @ weight.to("LLVM").dequantize().numpy().astype(np.float64).T
  scale = np.abs(reference).max()
  for way, (half_gemm, packed_gemm, product) in ways.items():
    with Context(HALF_GEMM=half_gemm, PACKED_GEMM=packed_gemm):
      step = TinyJit(lambda v, product=product: product(v).realize())
      for _ in range(2): result = step(x).numpy().astype(np.float64)   # run, then capture
      out[f"{way}_us"] = round(seconds_per_call(device, lambda: step(x)) * 1e6, 2)
      out[f"{way}_kernels"] = [instruction.name for instruction in step.captured.instructions]
    out[f"{way}_max_rel_err"] = float(np.abs(result - reference).max() / scale)
  return out

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--rows", type=int, default=PROMPT_ROWS)
  parser.add_argument("--max-rows", type=int, default=MAX_ROWS)
  args = parser.parse_args()
  runs = []
  for projection in PROJECTIONS:
    runs.append(measure(*projection, args.device, args.rows, max(args.rows, args.max_rows)))
    print(json.dumps(runs[-1]), flush=True)
  totals = {f"{way}_us": round(sum(run[f"{way}_us"] for run in runs), 2) for way in ("smem", "temp", "packed", "dense")}
  report = {"device": args.device, "rows": args.rows, "runs": runs, "one_layer_totals": totals}
  print(json.dumps(totals))
  if os.environ.get("OUT"): Path(os.environ["OUT"], "packed_prefill.json").write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
