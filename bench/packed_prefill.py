"""A prompt times a packed (GGUF-quantized) weight on the GPU: the half matmul against the packed product and a dense
float16 weight, for each projection of gemma-3-270m's layers as its Q4_K_M file packs them.

Each projection (its ggml type and [out, in] shape) multiplies a float16 prompt of `--rows` tokens (a symbolic length
bound to it, as the model's prefill runs) three ways, each a TinyJit replayed back to back between CUDA events:
- `half_gemm`: packed_linear's default on CUDA (tgrad/nn/quant.py `runs_as_half_gemm`): the weight dequantized into a
  float16 temporary by a kernel of its own, then the float16 model's matmul on tensor cores;
- `packed`: the same under HALF_GEMM=0: x times the weight's float32 values inside one kernel (float32 products);
- `dense`: x @ Wᵀ with W already a float16 weight (what `dequant:float16` loads): the speed to match.
Prints one line per projection (milliseconds per call, and the largest difference of `half_gemm` and `packed` from
`dense`, relative to dense's largest output), then the sums, as JSON; writes $OUT/packed_prefill.json when OUT is
set. The whole model's prefill: `python bench/gemma_gguf_gpu.py --modes packed:float16 dequant:float16` (and with
HALF_GEMM=0 for the packed product).
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
  ways = {"half_gemm": (1, lambda v: weight.linear(v)), "packed": (0, lambda v: weight.linear(v)),
          "dense": (1, lambda v: v @ dense.T)}
  out: dict = {"name": name, "type": ggml_type.name, "shape": [out_features, in_features], "rows": rows}
  results = {}
  for way, (half_gemm, product) in ways.items():
    with Context(HALF_GEMM=half_gemm):
      if way == "half_gemm" and not runs_as_half_gemm(x): out["note"] = f"{device} does not offer the half matmul"
      step = TinyJit(lambda v, product=product: product(v).realize())
      for _ in range(2): results[way] = step(x).numpy().astype(np.float64)   # run, then capture
      out[f"{way}_ms"] = round(seconds_per_call(device, lambda: step(x)) * 1e3, 4)
  scale = np.abs(results["dense"]).max()
  for way in ("half_gemm", "packed"):
    out[f"{way}_vs_dense_max_rel"] = float(np.abs(results[way] - results["dense"]).max() / scale)
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
  totals = {f"{way}_ms": round(sum(run[f"{way}_ms"] for run in runs), 4) for way in ("half_gemm", "packed", "dense")}
  report = {"device": args.device, "rows": args.rows, "runs": runs, "one_layer_totals": totals}
  print(json.dumps(totals))
  if os.environ.get("OUT"): Path(os.environ["OUT"], "packed_prefill.json").write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
