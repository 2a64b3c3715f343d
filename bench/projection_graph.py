"""Each decode projection of gemma-3-270m timed as it runs in a decode step: many launches in one CUDA graph, against
the floor of the hardware for the same bytes and kernel count.

For each case (a ggml type and a projection shape, or a dense float16 weight of that shape), COPIES distinct weights
are built on the GPU (random blocks, as bench/packed_matvec.py makes them; together at least MIN_TOTAL_BYTES, past
the H100's 50 MB L2, so every launch streams its weight from DRAM as a decode step does), and a TinyJit captures one
step that multiplies the same float16 x by each of them: COPIES dependent-free kernels in one CUDA graph, replayed
back to back (CUDA events). The time per projection is the replay's time over COPIES.

The floor is `../shared/anchors/launch_floor.cu`'s measurement on the same kind of card (N dependent kernels in one
graph, each streaming its share of the bytes: 240 and 536 MB over 30 to 155 kernels), fitted by a line: a kernel costs
a fixed time plus its bytes at a bandwidth (FLOORS, plain graph and PDL; H100 2026-11-26, H200 2026-11-28, the card
named by the driver picks; points within 2% (H100) and 7% (H200) of their line). "of floor" is floor time / measured
time: the share of the floor probe's bandwidth the projection reaches at the same bytes and kernel count (issue
target: >= 0.8).
Each row also names the kernel's opts (the heuristics', or BEAM's winner where BEAM is set). `--set
[MODULE.]NAME=V1,V2,...` (repeatable) measures every case once per combination of values of the code generator's
integer rule constants (bench/rule_settings.py: matvec_rules' unless a module is named; e.g.
PACKED_MATVEC_ROW_THREADS=64,128 PACKED_MATVEC_BLOCK_THREADS=128,256), set for the run: the rules swept in the graph.
Usage: python bench/projection_graph.py [--cases Q5_0:2048x640,...] [--copies 64] [--pdl 0|1] [--set NAME=V,...]
"""
from __future__ import annotations
import argparse, itertools, json, os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor, TinyJit  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.nn.quant import GGMLType, QuantizedTensor, packed_nbytes  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from gpu import event_seconds  # noqa: E402
from packed_matvec import random_blocks  # noqa: E402
import rule_settings  # noqa: E402

# the floor probe's line per card (fitted to launch_floor.cu's points): {PDL off/on: (µs per kernel, bytes per µs)}
FLOORS = {"H100": {0: (1.55, 2.37e6), 1: (1.20, 2.35e6)}, "H200": {0: (1.66, 3.23e6), 1: (1.33, 3.23e6)}}
# gemma-3-270m's decode projections in its Q4_K_M file (type, out × in): q, k, v, o, gate/up, down; the tied head
CASES = ("Q5_0:1024x640", "Q8_0:256x640", "Q4_K:640x1024", "Q5_0:2048x640", "Q6_K:640x2048", "Q4_K:640x2048",
         "F16:1024x640", "F16:640x1024", "F16:2048x640", "F16:640x2048")
MIN_TOTAL_BYTES = 160 << 20
MAX_COPIES = 256
REPLAYS = 20

def card() -> str:
  """The floor's card: the first of FLOORS that the GPU's name contains."""
  import pycuda.driver as driver
  name = driver.Context.get_device().name()
  for known in FLOORS:
    if known in name: return known
  raise SystemExit(f"no floor probe line for {name!r}: measure launch_floor.cu there and add it to FLOORS")

def floor_us(nbytes: int, pdl: int, on: str) -> float:
  kernel_us, bandwidth = FLOORS[on][pdl]
  return kernel_us + nbytes / bandwidth

def weights(type_name: str, rows: int, columns: int, copies: int) -> tuple[list, int]:
  """`copies` distinct weights on the GPU and one weight's bytes."""
  made = []
  for seed in range(copies):
    if type_name == "F16":
      values = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float16)
      made.append(Tensor(values, device="CUDA").realize())
    else:
      raw = random_blocks(type_name, rows, columns, seed)
      made.append(QuantizedTensor.from_bytes(raw, GGMLType[type_name], (rows, columns), "CUDA").realize())
  nbytes = rows * columns * 2 if type_name == "F16" else made[0].nbytes
  return made, nbytes

def measure(case: str, copies: int, pdl: int) -> dict:
  type_name, shape = case.split(":")
  rows, columns = map(int, shape.split("x"))
  one = rows * columns * 2 if type_name == "F16" else packed_nbytes(GGMLType[type_name], (rows, columns))
  if copies == 0: copies = min(MAX_COPIES, max(8, -(-MIN_TOTAL_BYTES // one)))   # enough to pass the L2
  made, nbytes = weights(type_name, rows, columns, copies)
  x = Tensor(np.random.default_rng(1).standard_normal((1, columns)).astype(np.float16), device="CUDA").realize()
  def step(x: Tensor) -> list[Tensor]:
    outs = [x.linear(w.transpose()) if type_name == "F16" else w.linear(x) for w in made]
    Tensor.realize(*outs)
    return outs
  with Context(PDL=pdl):
    jitted = TinyJit(step)
    for _ in range(3): jitted(x)
    seconds = event_seconds(lambda: jitted(x), REPLAYS)
  per = seconds * 1e6 / copies
  floor = floor_us(nbytes, pdl, card())
  first = made[0]
  items = lower_schedule((x.linear(first.transpose()) if type_name == "F16" else first.linear(x)).schedule())
  opts = " | ".join(" ".join(f"{o.op.name}:{o.axis}:{o.amount}" for o in getattr(i.runner, "opts", [])) for i in items)
  return {"case": case, "card": card(), "copies": copies, "bytes": nbytes, "us": round(per, 3),
          "GB/s": round(nbytes / per / 1e3, 1),
          "floor_us": round(floor, 3), "of_floor": round(floor / per, 3), "opts": opts}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--copies", type=int, default=0, help="weights per case (0: enough to pass the L2)")
  parser.add_argument("--pdl", type=int, default=1, choices=(0, 1))
  parser.add_argument("--set", action="append", default=[], metavar="[MODULE.]NAME=V1,V2",
                      help="values of a code generator rule constant to sweep (bench/rule_settings.py); repeatable")
  args = parser.parse_args()
  sweeps = []   # (name, the settings of its values), each checked before anything runs
  for item in args.set:
    name, _, listed = item.partition("=")
    sweeps.append((name, [rule_settings.parse([f"{name}={value}"])[0] for value in listed.split(",")]))
  rows = []
  print(f"{'case':16s} {'setting':>12s} {'copies':>6s} {'bytes':>9s} {'us':>7s} {'GB/s':>7s} {'floor us':>8s} "
        f"{'of floor':>8s}  opts")
  for case in args.cases.split(","):
    for chosen in itertools.product(*[choices for _, choices in sweeps]):
      rule_settings.apply(list(chosen))
      r = measure(case, args.copies, args.pdl)
      r.update({name: value for (name, _), (_, _, value) in zip(sweeps, chosen)})
      rows.append(r)
      setting = "/".join(str(value) for _, _, value in chosen) or "rule"
      print(f"{r['case']:16s} {setting:>12s} {r['copies']:6d} {r['bytes']:9d} {r['us']:7.2f} {r['GB/s']:7.1f} "
            f"{r['floor_us']:8.2f} {r['of_floor']:8.2f}  {r['opts']}", flush=True)
  if os.environ.get("OUT"): Path(os.environ["OUT"], "projection_graph.json").write_text(json.dumps(rows, indent=1))

if __name__ == "__main__":
  main()
