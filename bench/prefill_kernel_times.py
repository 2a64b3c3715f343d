"""Where a prefill of gemma-3-270m goes on the GPU, kernel by kernel: each kernel's duration alone, from Nsight
Compute, summed by kernel name.

Run it under ncu, which profiles only the kernels between cuProfilerStart and cuProfilerStop (the second eager
forward() of a 512-token prompt; the first compiles), then summarize the CSV:
  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
      python bench/prefill_kernel_times.py --model Z.gguf --quant packed > times.csv
  python bench/prefill_kernel_times.py --summarize times.csv
`--quant dequant` loads the float16 model; PACKED_GEMM=1 in the environment takes the one-kernel packed GEMM.
"""
from __future__ import annotations
import argparse, collections, csv, ctypes, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT_TOKENS = 512
DURATION_METRIC = "gpu__time_duration.sum"

def profile(model_path: str, quant: str, tokens: int) -> None:
  import numpy as np
  from tgrad import Tensor
  from tgrad.device import Device
  from tgrad.models.gemma3_gguf import load_gemma3_gguf
  model, _ = load_gemma3_gguf(model_path, quant, "float16", "CUDA")
  prompt = [model.config.bos_token_id] + np.random.default_rng(0).integers(1000, 200_000, tokens - 1).tolist()
  ids = Tensor(np.array([prompt], dtype=np.int32), device="CUDA")
  model.reset_cache(1, tokens + 8)
  model(ids, 0, last_only=True, jit=False)   # compiles every kernel
  Device["CUDA"].synchronize()
  cuda = ctypes.CDLL("libcuda.so.1")
  cuda.cuProfilerStart()
  model(ids, 0, last_only=True, jit=False)
  Device["CUDA"].synchronize()
  cuda.cuProfilerStop()

def summarize(path: str, top: int) -> None:
  rows = list(csv.reader(open(path)))
  header_at = next(i for i, row in enumerate(rows) if "Kernel Name" in row)
  header = rows[header_at]
  name_at, metric_at, value_at = header.index("Kernel Name"), header.index("Metric Name"), header.index("Metric Value")
  total: collections.Counter = collections.Counter()
  count: collections.Counter = collections.Counter()
  for row in rows[header_at + 1:]:
    if len(row) <= value_at or row[metric_at] != DURATION_METRIC: continue
    name = re.sub(r"_n\d+$", "", re.sub(r"_[0-9a-f]{8}$", "", row[name_at]))   # one name for a kernel's instances
    total[name] += float(row[value_at].replace(",", "")) / 1000   # ns → µs
    count[name] += 1
  print(f"total {sum(total.values()):.1f} µs over {sum(count.values())} kernels")
  for name, micros in total.most_common(top): print(f"{micros:9.1f} µs {count[name]:4d}  {name[:110]}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (run under ncu)")
  parser.add_argument("--quant", default="packed", choices=["packed", "dequant"])
  parser.add_argument("--tokens", type=int, default=PROMPT_TOKENS)
  parser.add_argument("--summarize", help="an ncu --csv output to sum by kernel name")
  parser.add_argument("--top", type=int, default=30)
  args = parser.parse_args()
  if args.summarize: summarize(args.summarize, args.top)
  elif args.model: profile(args.model, args.quant, args.tokens)
  else: parser.error("--model (under ncu) or --summarize")

if __name__ == "__main__":
  main()
