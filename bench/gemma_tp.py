"""Gemma 3 tensor-parallel (Gemma3.shard, tgrad/models/gemma3_parallel.py) over several GPUs next to one GPU.

Input: a reference directory written by gemma_reference.py (config.json, model.safetensors, optional prompt_ids.npy),
or nothing: seeded random weights of --preset built on the first device. Both models are the same weights; the
sharded one is made from the one-device one. Prints, for one device and for the device set:
  prefill    the last position's logits (max abs difference between the two), seconds of a replayed prefill
  decode     greedy generate() with the JIT (the second run: compiled and captured by the first), ms/step and tok/s
             end to end (generate's own timing: one step queued ahead), and whether the greedy ids are the same
  replay     a captured decode step replayed back to back (REPLAYS times, every device synchronized after): ms/step,
             what the devices take when the host keeps ahead
  alone      each instruction of the captured step run alone, every device synchronized before and after: the sum over
             kernels and over the rest (copies and collectives: the all-reduces), so the share of a step spent in
             collectives (each instruction alone also pays its launch and a synchronization: an upper bound)
Usage: python bench/gemma_tp.py [REFERENCE_DIR] [--preset 270m] [--dtype float16] [--devices CUDA:0,CUDA:1]
       [--new-tokens 64] [--prompt-tokens 32]          (--devices LLVM:0,LLVM:1 --preset tiny: a CPU smoke test)
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.codegen.compile import CompiledKernel  # noqa: E402
from tgrad.multi import collectives_for  # noqa: E402
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402

COMPARED_STEPS = 8      # decode steps whose logits are compared (teacher-forced with the one-device ids)
REPLAYS = 50            # back-to-back replays of the captured decode step
ALONE_ROUNDS = 3        # rounds of timing every instruction alone (the best round counts)
PROMPT_SEED = 1

def synchronize(devices) -> None:
  for device in devices: Device[device].synchronize()

def load_model(args, device: str) -> Gemma3:
  if args.reference_dir: return Gemma3.from_pretrained(args.reference_dir, args.dtype, device, progress=False)
  return Gemma3.random(Gemma3Config.preset(args.preset), args.dtype, device, seed=0, progress=False)

def prompt_ids(args, config: Gemma3Config) -> list[int]:
  path = os.path.join(args.reference_dir or "", "prompt_ids.npy")
  if args.reference_dir and os.path.isfile(path): return [int(t) for t in np.load(path).reshape(-1)]
  rng = np.random.default_rng(PROMPT_SEED)
  return [config.bos_token_id] + rng.integers(3, config.vocab_size, args.prompt_tokens - 1).tolist()

def replay_ms(graph, devices) -> float:
  """ms per replay of a captured program, REPLAYS of them queued back to back."""
  graph_call = lambda: [runner() for runner in graph.runners]  # noqa: E731
  graph_call()
  synchronize(devices)
  start = time.perf_counter()
  for _ in range(REPLAYS): graph_call()
  synchronize(devices)
  return (time.perf_counter() - start) / REPLAYS * 1e3

def instructions_alone_ms(graph, devices) -> dict:
  """Each instruction of a captured program run alone between synchronizations: ms in kernels and in the rest."""
  best: dict = {}
  for _ in range(ALONE_ROUNDS):
    sums = {"kernels_ms": 0.0, "collectives_and_copies_ms": 0.0}
    for ins in graph.instructions:
      buffers = [graph.slots[s].buffer for s in ins.args]
      synchronize(devices)
      start = time.perf_counter()
      ins.runner(buffers, False, ins.var_vals)
      synchronize(devices)
      kind = "kernels_ms" if isinstance(ins.runner, CompiledKernel) else "collectives_and_copies_ms"
      sums[kind] += (time.perf_counter() - start) * 1e3
    if not best or sum(sums.values()) < sum(best.values()): best = sums
  kernels = sum(isinstance(ins.runner, CompiledKernel) for ins in graph.instructions)
  others = [ins.runner.name for ins in graph.instructions if not isinstance(ins.runner, CompiledKernel)]
  return {**best, "kernels": kernels, "other_instructions": len(others), "other_names": sorted(set(others))}

def decode_logits(model: Gemma3, prompt: list[int], ids: list[int]) -> np.ndarray:
  """The logits [COMPARED_STEPS, V] of decode steps fed `ids` (the captured step, replayed), after the prompt."""
  model.reset_cache(1, model.cache.max_context)
  model(Tensor(np.array([prompt], np.int32), device=model.device), 0, last_only=True, jit=True)
  rows = []
  for k, token in enumerate(ids[:COMPARED_STEPS]):
    logits = model(Tensor(np.array([[token]], np.int32), device=model.device), len(prompt) + k, last_only=True,
                   jit=True)
    rows.append(logits.numpy()[0, -1].astype(np.float32))
  return np.stack(rows)

def measure(model: Gemma3, prompt: list[int], new_tokens: int, devices) -> dict:
  context = -(-(len(prompt) + new_tokens) // 256) * 256
  model.reset_cache(1, context)
  logits = model(Tensor(np.array([prompt], np.int32), device=model.device), 0, last_only=True).numpy()[0, -1]
  generate(model, prompt, new_tokens, jit=True)   # compiles and captures the prefill and the decode step
  result = generate(model, prompt, new_tokens, jit=True)
  ms_step = result.decode_seconds / max(result.decode_tokens, 1) * 1e3
  prefill_ms = replay_ms(model._prefill_jit.captured, devices)
  decode_graph = model._decode_jit.captured
  return {"devices": list(devices), "ids": result.ids, "logits": logits,
          "decode_logits": decode_logits(model, prompt, result.ids),
          "decode_ms_per_step": ms_step, "decode_tok_s": result.decode_tokens_per_second,
          "prefill_replay_ms": prefill_ms, "decode_replay_ms_per_step": replay_ms(decode_graph, devices),
          "decode_step_alone": instructions_alone_ms(decode_graph, devices)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("reference_dir", nargs="?")
  parser.add_argument("--preset", choices=sorted(PRESETS), default="270m")
  parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float16")
  parser.add_argument("--devices", default="CUDA:0,CUDA:1")
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--prompt-tokens", type=int, default=32)
  args = parser.parse_args()
  devices = tuple(args.devices.split(","))
  one = load_model(args, devices[0])
  prompt = prompt_ids(args, one.config)
  sharded = one.shard(devices)
  print(f"collectives: {type(collectives_for(devices)).__name__}; prompt {len(prompt)} tokens, "
        f"{args.new_tokens} new, {args.dtype}", flush=True)
  results = {}
  for label, model, on in (("one", one, devices[:1]), ("sharded", sharded, devices)):
    results[label] = measure(model, prompt, args.new_tokens, on)
    shown = {k: v for k, v in results[label].items() if k not in ("ids", "logits", "decode_logits")}
    print(json.dumps({label: shown}), flush=True)
  a, b = results["one"], results["sharded"]
  same_ids = a["ids"] == b["ids"]
  first_diff = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y), None)
  alone = b["decode_step_alone"]
  alone_total = alone["kernels_ms"] + alone["collectives_and_copies_ms"]
  collective_share = alone["collectives_and_copies_ms"] / alone_total if alone_total else 0.0
  # the sharded model fed the one-device ids (the greedy ids of random weights often repeat the input token, so the
  # ids alone say little): its logits against the one device's, and whether each step's top-5 tokens agree
  steps = min(len(a["decode_logits"]), len(b["decode_logits"]))
  top5 = [set(np.argsort(-a["decode_logits"][k])[:5]) == set(np.argsort(-b["decode_logits"][k])[:5])
          for k in range(steps)]
  print(json.dumps({"greedy_ids_match": same_ids, "first_different_step": first_diff,
                    "decode_logits_max_abs_diff": float(np.abs(a["decode_logits"][:steps]
                                                               - b["decode_logits"][:steps]).max()),
                    "decode_logits_max_abs": float(np.abs(a["decode_logits"]).max()),
                    "decode_top5_agree_steps": f"{sum(top5)}/{steps}",
                    "prefill_logits_max_abs_diff": float(np.abs(a["logits"].astype(np.float32)
                                                                - b["logits"].astype(np.float32)).max()),
                    "decode_ms_per_step": {"one": a["decode_ms_per_step"], "sharded": b["decode_ms_per_step"]},
                    "decode_tok_s": {"one": a["decode_tok_s"], "sharded": b["decode_tok_s"]},
                    "decode_replay_ms_per_step": {"one": a["decode_replay_ms_per_step"],
                                                  "sharded": b["decode_replay_ms_per_step"]},
                    "sharded_step_share_in_collectives_alone": collective_share}))
  print(f"decode: 1 device {a['decode_ms_per_step']:.3f} ms/step ({a['decode_tok_s']:.1f} tok/s), "
        f"{len(devices)} devices {b['decode_ms_per_step']:.3f} ms/step ({b['decode_tok_s']:.1f} tok/s); "
        f"greedy ids {'match' if same_ids else f'differ from step {first_diff}'}")

if __name__ == "__main__":
  main()
