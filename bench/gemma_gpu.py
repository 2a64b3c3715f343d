"""Gemma 3 on the GPU: parity with Hugging Face on a reference checkpoint, and decode speed next to HF eager.

Input: a directory written by gemma_reference.py (config.json, model.safetensors, prompt_ids.npy,
prefill_logits.npy, decode_ids.npy, decode_logits.npy). Prints, for tgrad on CUDA: float32 prefill/decode max abs
error against HF's logits, float16/bfloat16 top-1 agreement over the prompt's positions, decode tokens/s (batch 1,
NEW_TOKENS new tokens) for float32 and float16, with and without TinyJit, next to HF transformers' eager decode on
the same GPU; where a decode step's time goes without the JIT (graph building, scheduling, launching, GPU kernels)
and with it (wall time per step against the GPU time of its kernels, launch cost per kernel); and the JIT's memory
plans for the prefill and a decode step (planned activation arena vs the sum of all transient sizes,
estimate_memory(), the bytes the graph allocated, and the device memory measured around the capture call). Decode
speeds are end to end on both sides (wall clock of each library's generate(), prefill and the first token excluded
the same way).
Usage: python bench/gemma_gpu.py REFERENCE_DIR [--new-tokens 128] [--device LLVM]
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds  # noqa: E402
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.models.gemma3 import Gemma3  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
import tgrad.realize as realize_module  # noqa: E402
from tgrad.codegen.compile import CompiledKernel  # noqa: E402

DECODE_PROFILE_STEPS = 8
JIT_PROFILE_STEPS = 32   # replayed decode steps timed for the JIT profile
REPLAYS = 50   # back-to-back replays of a captured step whose GPU time is measured with events
DEVICE = "CUDA"   # --device LLVM runs the same checks on the CPU (a smoke test of this script)

def synchronize() -> None:
  if DEVICE == "CUDA":
    import pycuda.driver as cuda
    cuda.Context.synchronize()

def parity_float32(ref: str) -> dict:
  model = Gemma3.from_pretrained(ref, dtypes.float32, DEVICE, progress=False)
  prompt = np.load(os.path.join(ref, "prompt_ids.npy")).astype(np.int32)
  want_prefill = np.load(os.path.join(ref, "prefill_logits.npy"))
  want_ids, want_decode = np.load(os.path.join(ref, "decode_ids.npy")), np.load(os.path.join(ref, "decode_logits.npy"))
  logits = model(Tensor(prompt[None], device=DEVICE), 0).numpy()[0]
  decode_logits, ids = [logits[-1]], [int(logits[-1].argmax())]
  for k in range(1, len(want_ids)):
    step = model(Tensor(np.array([[want_ids[k - 1]]], np.int32), device=DEVICE), len(prompt) + k - 1).numpy()[0, -1]
    decode_logits.append(step)
    ids.append(int(step.argmax()))
  return {"prompt_tokens": len(prompt), "prefill_max_abs": float(np.abs(logits - want_prefill).max()),
          "decode_max_abs": float(np.abs(np.stack(decode_logits) - want_decode).max()),
          "greedy_ids_match": ids == [int(i) for i in want_ids]}

def top1_agreement(ref: str, dtype) -> float:
  model = Gemma3.from_pretrained(ref, dtype, DEVICE, progress=False)
  prompt = np.load(os.path.join(ref, "prompt_ids.npy")).astype(np.int32)
  want = np.load(os.path.join(ref, "prefill_logits.npy")).argmax(-1)
  got = model(Tensor(prompt[None], device=DEVICE), 0).numpy()[0].argmax(-1)
  return float((got == want).mean())

def tgrad_decode_speed(ref: str, dtype, prompt: list[int], new_tokens: int) -> dict:
  """Prefill seconds and decode tok/s with the JIT (the step captured at step 2, replayed after) and without."""
  model = Gemma3.from_pretrained(ref, dtype, DEVICE, progress=False)
  out = {}
  for jit in (True, False):
    generate(model, prompt, 4, jit=jit)   # compile every kernel first
    result = generate(model, prompt, new_tokens, eos_ids=(), jit=jit)
    replayed = result.step_seconds[2:]   # steps 1 and 2 run the function normally and capture it
    out["jit" if jit else "no_jit"] = {"prefill_s": result.prefill_seconds,
                                       "decode_tok_s": (len(result.ids) - 1) / result.decode_seconds,
                                       "steady_decode_tok_s": len(replayed) / sum(replayed) if replayed else 0.0}
  return out

def tgrad_decode_profile(ref: str, prompt: list[int]) -> dict:
  """Time of one decode step split into: building the lazy graph, scheduling, and running (launch + GPU)."""
  model = Gemma3.from_pretrained(ref, dtypes.float32, DEVICE, progress=False)
  generate(model, prompt, 4)
  totals = {"schedule_s": 0.0, "run_s": 0.0, "gpu_kernel_s": 0.0, "kernels": 0}
  original_schedule, original_run = realize_module.schedule, realize_module.run
  original_call = CompiledKernel.__call__
  def timed_schedule(*args, **kwargs):
    start = time.perf_counter()
    out = original_schedule(*args, **kwargs)
    totals["schedule_s"] += time.perf_counter() - start
    return out
  def timed_run(*args, **kwargs):
    synchronize()
    start = time.perf_counter()
    original_run(*args, **kwargs)
    synchronize()
    totals["run_s"] += time.perf_counter() - start
  def timed_call(self, buffers, wait=False, var_vals=None):
    elapsed = original_call(self, buffers, True, var_vals)
    totals["gpu_kernel_s"] += elapsed or 0.0
    totals["kernels"] += 1
  model.reset_cache(1, len(prompt) + DECODE_PROFILE_STEPS + 1)
  model(Tensor(np.array([prompt], np.int32), device=DEVICE), 0, last_only=True).numpy()
  realize_module.schedule, realize_module.run = timed_schedule, timed_run
  CompiledKernel.__call__ = timed_call
  start = time.perf_counter()
  try:
    for k in range(DECODE_PROFILE_STEPS):
      model(Tensor(np.array([[prompt[-1]]], np.int32), device=DEVICE), len(prompt) + k, last_only=True).numpy()
  finally:
    realize_module.schedule, realize_module.run = original_schedule, original_run
    CompiledKernel.__call__ = original_call
  step = (time.perf_counter() - start) / DECODE_PROFILE_STEPS
  per_step = {k: v / DECODE_PROFILE_STEPS for k, v in totals.items()}
  per_step["graph_building_and_other_s"] = step - per_step["schedule_s"] - per_step["run_s"]
  per_step["step_s (kernels timed one by one)"] = step
  return per_step

def device_bytes_in_use() -> int:
  """GPU memory in use (total - free), or this process's resident host memory on LLVM."""
  if DEVICE == "CUDA":
    import pycuda.driver as cuda
    free, total = cuda.mem_get_info()
    return total - free
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def tgrad_jit_decode_profile(ref: str, prompt: list[int], dtype) -> dict:
  """A replayed decode step: its wall time (host prep, replay, reading the logits) against the GPU time of its
  kernels (replays queued back to back, timed with events), the kernel count and the host cost per kernel; the sum
  of the kernels each launched and synchronized alone is reported beside it."""
  model = Gemma3.from_pretrained(ref, dtype, DEVICE, progress=False)
  model.reset_cache(1, len(prompt) + 3 * JIT_PROFILE_STEPS + 8)
  model(Tensor(np.array([prompt], np.int32), device=DEVICE), 0, last_only=True).numpy()
  token = prompt[-1]
  def greedy_step() -> None:   # one step, waited for: the argmax on the device, 4 bytes read back
    nonlocal token
    token = model.decode_greedy([token])[0]
  def logits_step() -> None:   # forward(jit=True) and reading the logits row (1 MB in float32) to the host
    model(Tensor(np.array([[prompt[-1]]], np.int32), device=DEVICE), model.cache.next_position, last_only=True,
          jit=True).numpy()
  def timed(run_steps) -> float:
    synchronize()
    start = time.perf_counter()
    run_steps()
    synchronize()
    return (time.perf_counter() - start) / JIT_PROFILE_STEPS
  for _ in range(3): greedy_step()   # runs normally, captures, replays
  # what generate() does: greedy_tokens keeps one step queued ahead of the one whose token it reads
  wall = timed(lambda: list(model.greedy_tokens([token], JIT_PROFILE_STEPS)))
  wall_waited = timed(lambda: [greedy_step() for _ in range(JIT_PROFILE_STEPS)])
  wall_logits = timed(lambda: [logits_step() for _ in range(JIT_PROFILE_STEPS)])
  graph = model._decode_jit.captured
  kernels = [ins for ins in graph.instructions if isinstance(ins.runner, CompiledKernel)]
  gpu = replayed_gpu_seconds(graph)
  alone = sum(ins.runner([graph.slots[s].buffer for s in ins.args], True, ins.var_vals) or 0.0 for ins in kernels)
  # each kernel's bytes read and written at this step's variable values, as counted for DEBUG
  step_bytes = sum(ins.runner.cost(ins.var_vals)[1] for ins in kernels)
  return {"kernels": len(kernels), "instructions": len(graph.instructions), "step_wall_s": wall, "gpu_kernel_s": gpu,
          "step_bytes": step_bytes, "achieved_GB_s": step_bytes / gpu / 1e9 if gpu else 0.0,
          "wall_over_gpu": wall / gpu if gpu else 0.0,
          "step_wall_each_step_waited_s": wall_waited,
          "wall_each_step_waited_over_gpu": wall_waited / gpu if gpu else 0.0,
          "step_wall_reading_logits_s": wall_logits, "wall_reading_logits_over_gpu": wall_logits / gpu if gpu else 0.0,
          "host_us_per_kernel": (wall - gpu) / max(len(kernels), 1) * 1e6,
          "kernels_timed_alone_s (each launch synchronized)": alone}

def replayed_gpu_seconds(graph) -> float:
  """GPU time of one replay of the captured program's kernels: REPLAYS replays queued back to back between two CUDA
  events (the host queues faster than the GPU runs them, so the GPU never waits), divided by REPLAYS. On LLVM the
  replays run on the host and the same loop is timed with the host clock."""
  replay = lambda: [runner() for runner in graph.runners]  # noqa: E731
  if DEVICE == "CUDA": return event_seconds(replay, REPLAYS)
  replay()
  start = time.perf_counter()
  for _ in range(REPLAYS): replay()
  return (time.perf_counter() - start) / REPLAYS

def memory_plan(graph, before: int, after: int) -> dict:
  parts = graph.memory_breakdown()[DEVICE]
  return {"planned_arena_bytes": parts["activation"], "transient_bytes_sum": parts["activations unplanned"],
          "arena_over_sum": parts["activation"] / max(parts["activations unplanned"], 1),
          "estimate_memory": graph.estimate_memory()[DEVICE], "breakdown": parts,
          "graph_allocated_bytes": graph.allocated_bytes.get(DEVICE, 0),
          "measured_bytes_during_capture_call": after - before}

def tgrad_prefill_profile(ref: str, prompt: list[int], dtype) -> dict:
  """A captured prefill of the prompt replayed: GPU time of its kernels (events) and achieved TFLOP/s, with the FLOPs
  each kernel counts (multiply-adds as 2)."""
  model = Gemma3.from_pretrained(ref, dtype, DEVICE, progress=False)
  tokens = Tensor(np.array([prompt], np.int32), device=DEVICE).realize()
  for _ in range(3): model(tokens, 0, last_only=True, jit=True)   # runs, captures, replays the model's prefill
  graph = model._prefill_jit.captured
  gpu = replayed_gpu_seconds(graph)
  flops = sum(ins.runner.cost(ins.var_vals)[0] for ins in graph.instructions if isinstance(ins.runner, CompiledKernel))
  return {"prompt_tokens": len(prompt), "gpu_kernel_s": gpu, "flops": flops,
          "TFLOP_s": flops / gpu / 1e12 if gpu else 0,
          "kernels": sum(isinstance(ins.runner, CompiledKernel) for ins in graph.instructions)}

def tgrad_memory_plans(ref: str, prompt: list[int]) -> dict:
  """The JIT's memory plans (float32): a captured prefill of the prompt and a captured decode step."""
  model = Gemma3.from_pretrained(ref, dtypes.float32, DEVICE, progress=False)
  tokens = Tensor(np.array([prompt], np.int32), device=DEVICE).realize()
  def prefill() -> None:   # the model's own captured prefill (symbolic: planned for a prompt as long as the cache)
    model.reset_cache(1, len(prompt) + 2)
    model(tokens, 0, last_only=True, jit=True)
  prefill()
  synchronize()
  before = device_bytes_in_use()
  prefill()
  synchronize()
  plans = {"prefill": memory_plan(model._prefill_jit.captured, before, device_bytes_in_use())}
  position = len(prompt)
  model(Tensor(np.array([[prompt[-1]]], np.int32), device=DEVICE), position, last_only=True, jit=True).numpy()
  synchronize()
  before = device_bytes_in_use()
  model(Tensor(np.array([[prompt[-1]]], np.int32), device=DEVICE), position + 1, last_only=True, jit=True).numpy()
  synchronize()
  plans["decode_step"] = memory_plan(model._decode_jit.captured, before, device_bytes_in_use())
  plans["prompt_tokens"] = len(prompt)
  return plans

def hf_decode_speed(ref: str, torch_dtype, prompt: list[int], new_tokens: int, compiled: bool = False) -> dict:
  """HF's generate() measured as tgrad's generate() reports itself, end to end: prefill = the prompt's forward pass and
  the first token (generate with 1 new token); decode = the other tokens over the time they add to it. `compiled`:
  HF's fast path — a static KV cache and the forward compiled with torch.compile (mode "reduce-overhead": CUDA
  graphs), warmed up (compiled) before timing."""
  import torch
  from transformers import Gemma3ForCausalLM
  device = "cuda" if DEVICE == "CUDA" else "cpu"
  model = Gemma3ForCausalLM.from_pretrained(ref, dtype=torch_dtype, attn_implementation="eager").to(device).eval()
  ids = torch.tensor([prompt], device=device)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  extra = {}
  if compiled:
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    extra = {"cache_implementation": "static"}
  def timed_generate(count: int) -> tuple[float, int]:
    sync()
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=count, min_new_tokens=count, do_sample=False, **extra)
    sync()
    return time.perf_counter() - start, out.shape[1] - len(prompt)
  with torch.no_grad():
    for _ in range(3 if compiled else 1): timed_generate(new_tokens if compiled else 4)   # warm-up (and compile)
    prefill, _ = timed_generate(1)
    total, generated = timed_generate(new_tokens)
  return {"prefill_s": prefill, "decode_tok_s": (generated - 1) / max(total - prefill, 1e-9)}

def hf_compiled_in_subprocess(ref: str, dtype_name: str, new_tokens: int) -> object:
  """hf_decode_speed(compiled=True) in a process of its own: torch.compile's CUDA graphs and this process's pycuda
  context do not share a process safely (a segfault was seen), and a crash there must not end this benchmark.
  Inductor's static CUDA launcher is turned off (TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0): on the H100 with torch
  2.13 it segfaulted while autotuning a kernel inside the CUDA-graph tree, even alone in its process."""
  import subprocess
  command = [sys.executable, __file__, ref, "--hf-compile-only", dtype_name, "--new-tokens", str(new_tokens)]
  env = {**os.environ, "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER": "0"}
  done = subprocess.run(command, capture_output=True, text=True, env=env)
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode != 0 or not lines: return f"failed (exit {done.returncode}): {done.stderr[-300:]}"
  return json.loads(lines[-1])

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("reference_dir")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--hf-compile", action="store_true", help="also time HF with a static cache and torch.compile")
  parser.add_argument("--hf-compile-only", default=None, help=argparse.SUPPRESS)   # the subprocess of --hf-compile
  args = parser.parse_args()
  if args.hf_compile_only:
    import torch
    prompt = [int(t) for t in np.load(os.path.join(args.reference_dir, "prompt_ids.npy"))]
    print(json.dumps(hf_decode_speed(args.reference_dir, getattr(torch, args.hf_compile_only), prompt,
                                     args.new_tokens, compiled=True)))
    return
  global DEVICE
  DEVICE = args.device
  import torch
  ref = args.reference_dir
  prompt = [int(t) for t in np.load(os.path.join(ref, "prompt_ids.npy"))]
  report: dict = {"device": torch.cuda.get_device_name() if DEVICE == "CUDA" else "CPU (LLVM)",
                  "method": "decode_*: end to end on both sides (host wall clock of generate(), batch 1, greedy): "
                            "prefill_s = prompt forward + first token, decode_tok_s = later tokens / their seconds; "
                            "decode_step_profile: tgrad only, each kernel synchronized and timed alone"}
  report["float32_parity"] = parity_float32(ref)
  print(json.dumps(report), flush=True)
  for name in ("float16", "bfloat16"): report[f"{name}_top1_agreement"] = top1_agreement(ref, getattr(dtypes, name))
  print(json.dumps(report), flush=True)
  for name, dt, tdt in (("float32", dtypes.float32, torch.float32), ("float16", dtypes.float16, torch.float16),
                        ("bfloat16", dtypes.bfloat16, torch.bfloat16)):
    report[f"decode_{name}"] = {"tgrad": tgrad_decode_speed(ref, dt, prompt, args.new_tokens),
                                "hf_eager": hf_decode_speed(ref, tdt, prompt, args.new_tokens)}
    if args.hf_compile and name != "bfloat16":
      report[f"decode_{name}"]["hf_static_compiled"] = hf_compiled_in_subprocess(ref, name, args.new_tokens)
    print(json.dumps(report), flush=True)
  report["decode_step_profile_float32"] = tgrad_decode_profile(ref, prompt)
  print(json.dumps(report), flush=True)
  for name, dt in (("float32", dtypes.float32), ("float16", dtypes.float16)):
    report[f"jit_decode_step_profile_{name}"] = tgrad_jit_decode_profile(ref, prompt, dt)
    print(json.dumps(report), flush=True)
  for name, dt in (("float32", dtypes.float32), ("float16", dtypes.float16)):
    report[f"prefill_profile_{name}"] = tgrad_prefill_profile(ref, prompt, dt)
  report["jit_memory_plans_float32"] = tgrad_memory_plans(ref, prompt)
  print(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
