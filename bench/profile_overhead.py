"""What the trace profiler costs: off (every call site is one flag check) against a tgrad without the hooks, and on.

Measures, in a fresh process per run, (1) an eager op loop: the median host time of `(a + b).realize()` on small
tensors, and (2) a tiny-Gemma decode step through its TinyJit (random weights, the "tiny" preset): the median time of
one step (`model(token, pos, jit=True)` and reading its logits). Modes: `off` (profiler off), `on` (inside
tgrad.profile(), which also writes the trace: its size for STEPS steps is reported). `--baseline DIR` runs `off` with
the tgrad found in DIR too (e.g. `git worktree add /tmp/tgrad_base <commit before the profiler>`), so "off" can be
compared with a build that has no hooks at all. Runs alternate between trees and repeat ROUNDS times; the median of
the runs' medians is reported, with the spread (min..max) that says what is noise on this machine.
Usage: python bench/profile_overhead.py [--device LLVM] [--baseline DIR] [--rounds 5] [--steps 128]
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EAGER_CALLS, EAGER_WARMUP = 2000, 100
DECODE_WARMUP = 4
PROMPT = [2, 17, 301, 5, 88]

CHILD = r'''
import json, os, statistics, sys, time
import numpy as np
mode, steps, eager_calls, eager_warmup, decode_warmup, out_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
  int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
import tgrad
from tgrad import Tensor
from tgrad.models.gemma3 import Gemma3, Gemma3Config
def eager() -> float:
  a, b = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
  for _ in range(eager_warmup): (a + b).realize()
  samples = []
  for _ in range(eager_calls):
    start = time.perf_counter(); (a + b).realize(); samples.append(time.perf_counter() - start)
  return statistics.median(samples)
def decode() -> float:
  model = Gemma3.random(Gemma3Config.preset("tiny"), seed=3, progress=False)
  model.reset_cache(1, steps + len(PROMPT) + decode_warmup + 4)
  model(Tensor(np.array([PROMPT], np.int32)), 0, last_only=True).numpy()
  token, samples = 1, []
  for k in range(decode_warmup + steps):
    start = time.perf_counter()
    logits = model(Tensor(np.array([[token]], np.int32)), len(PROMPT) + k, last_only=True, jit=True).numpy()
    samples.append(time.perf_counter() - start)
    token = int(logits[0, -1].argmax())
  return statistics.median(samples[decode_warmup:])
PROMPT = ''' + repr(PROMPT) + r'''
result = {}
if mode == "on":
  trace_path = out_path + ".trace.json"
  with tgrad.profile(trace_path):
    result["eager_s"] = eager()
  with tgrad.profile(trace_path):   # the decode alone: its trace's size is the one reported
    result["decode_s"] = decode()
  result["trace_bytes"] = os.path.getsize(trace_path)
  result["trace_events"] = len(json.load(open(trace_path))["traceEvents"])
else:
  result["eager_s"], result["decode_s"] = eager(), decode()
json.dump(result, open(out_path, "w"))
'''

def run_child(root: str, mode: str, args: argparse.Namespace) -> dict:
  with tempfile.TemporaryDirectory() as folder:
    out = os.path.join(folder, "result.json")
    # the tree under test first; the rest of PYTHONPATH stays (where a device's packages come from, e.g. pycuda)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
           "DEVICE": args.device}
    env.pop("PROFILE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.steps), str(EAGER_CALLS), str(EAGER_WARMUP),
                           str(DECODE_WARMUP), out], env=env, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0: sys.exit(f"{mode} run with {root} failed:\n{done.stderr[-3000:]}")
    with open(out) as f: return json.load(f)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--device", default="LLVM")
  parser.add_argument("--baseline", default="", help="a tgrad tree without the profiler's hooks")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=128)
  args = parser.parse_args()
  setups = [("off", HERE, "off"), ("on", HERE, "on")] + ([("no hooks", args.baseline, "off")] if args.baseline else [])
  results: dict[str, list[dict]] = {name: [] for name, _, _ in setups}
  for _ in range(args.rounds):
    for name, root, mode in setups: results[name].append(run_child(root, mode, args))
  report: dict = {"device": args.device, "rounds": args.rounds, "decode_steps": args.steps}
  for name, runs in results.items():
    for key in ("eager_s", "decode_s"):
      values = [r[key] * 1e6 for r in runs]
      report[f"{name} {key[:-2]} us"] = {"median": round(statistics.median(values), 2),
                                         "min": round(min(values), 2), "max": round(max(values), 2)}
  on = results["on"][-1]
  report[f"trace bytes for {args.steps} decode steps"] = on["trace_bytes"]
  report["trace events"] = on["trace_events"]
  print(json.dumps(report, indent=1))

if __name__ == "__main__": main()
