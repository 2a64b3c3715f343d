"""Where the flash-decoding kernel's time goes inside the decode step: the step timed with the kernel cut short.

A stage of a kernel that runs inside a CUDA graph with PDL can't be timed alone (its neighbours overlap it), so this
times the whole captured decode step (CUDA events over back-to-back replays) with every flash-decoding launch
returning early: right after its PDL wait ("wait"), after its prologue (q and k norm, RoPE, the cache write:
"prologue"), after its key loop ("loop"), or not at all ("whole"); the differences are the stages' costs in the
graph. The values a cut kernel leaves are wrong: only the times mean anything. Each variant runs in a process of
its own (the kernel's source is edited before the model is loaded).
Usage: python bench/flash_decoding_stages.py --model FILE [--quant dequant] [--positions 40 100]
       [--stages wait prologue loop whole]
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys

CUTS = {"wait": ("DEPENDENT_LAUNCH\n", "DEPENDENT_LAUNCH\n  if (tid >= 0) return;\n"),
        "prologue": ("  // this lane's D/32 elements", "  if (tid >= 0) return;\n  // this lane's D/32 elements"),
        "loop": ("  // the warps' states combined", "  if (tid >= 0) return;\n  // the warps' states combined"),
        "whole": None}

def step_times(model_path: str, quant: str, stage: str, positions: list[int]) -> dict[int, float]:
  """ms per replayed decode step at each position, with flash decoding cut after `stage` (in this process)."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import tgrad.runtime.cuda.flash_decoding as flash
  if (cut := CUTS[stage]) is not None:
    assert cut[0] in flash.BODY, f"the kernel's source has no {cut[0]!r}"
    flash.BODY = flash.BODY.replace(cut[0], cut[1])
  from tgrad.models.gemma3_gguf import load_gemma3_gguf
  from gpu import event_seconds
  model, _ = load_gemma3_gguf(model_path, quant, "float16", "CUDA")
  times = {}
  for position in positions:
    model.reset_cache(1, position + 1)
    at = model.cache.decode_variables(position)
    for _ in range(3): model._replay_decode(None, at)
    times[position] = min(event_seconds(lambda: model._replay_decode(None, at), 50) for _ in range(3)) * 1e3
  return times

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="a Gemma 3 GGUF file")
  parser.add_argument("--quant", default="dequant", help="dequant or packed (float16 compute)")
  parser.add_argument("--positions", type=int, nargs="+", default=[40, 100])
  parser.add_argument("--stages", nargs="+", default=list(CUTS), choices=list(CUTS))
  parser.add_argument("--one", help=argparse.SUPPRESS)   # the child process: one stage, its times as JSON
  args = parser.parse_args()
  if args.one:
    print(json.dumps(step_times(args.model, args.quant, args.one, args.positions)))
    return
  print(f"flash decoding cut after each stage: the {args.quant} float16 decode step, ms at positions {args.positions}")
  for stage in args.stages:
    out = subprocess.run([sys.executable, __file__, "--model", args.model, "--quant", args.quant, "--one", stage,
                          "--positions", *map(str, args.positions)], capture_output=True, text=True, check=True)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{stage:10s} " + "  ".join(f"{float(ms):.4f}" for ms in times.values()))

if __name__ == "__main__":
  main()
