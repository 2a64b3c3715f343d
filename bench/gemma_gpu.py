"""Gemma 3 on the GPU: parity with Hugging Face on a reference checkpoint, and decode speed next to HF eager.

Input: a directory written by gemma_reference.py (config.json, model.safetensors, prompt_ids.npy,
prefill_logits.npy, decode_ids.npy, decode_logits.npy). Prints, for tgrad on CUDA: float32 prefill/decode max abs
error against HF's logits, float16/bfloat16 top-1 agreement over the prompt's positions, decode tokens/s (batch 1,
NEW_TOKENS new tokens) for float32 and float16 next to HF transformers' eager decode on the same GPU, and where a
tgrad decode step's time goes (graph building, scheduling, launching, GPU kernels). Decode speeds are end to end on
both sides (wall clock of each library's generate(), prefill and the first token excluded the same way).
Usage: python bench/gemma_gpu.py REFERENCE_DIR [--new-tokens 128]
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.models.gemma3 import Gemma3, generate  # noqa: E402
import tgrad.realize as realize_module  # noqa: E402

DECODE_PROFILE_STEPS = 8
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
  model = Gemma3.from_pretrained(ref, dtype, DEVICE, progress=False)
  generate(model, prompt, 4)   # compile every kernel first
  result = generate(model, prompt, new_tokens, eos_ids=())
  return {"prefill_s": result.prefill_seconds, "decode_tok_s": (len(result.ids) - 1) / result.decode_seconds}

def tgrad_decode_profile(ref: str, prompt: list[int]) -> dict:
  """Time of one decode step split into: building the lazy graph, scheduling, and running (launch + GPU)."""
  model = Gemma3.from_pretrained(ref, dtypes.float32, DEVICE, progress=False)
  generate(model, prompt, 4)
  totals = {"schedule_s": 0.0, "run_s": 0.0, "gpu_kernel_s": 0.0, "kernels": 0}
  original_schedule, original_run = realize_module.create_schedule, realize_module.run_schedule
  original_call = realize_module.CompiledKernel.__call__
  def timed_schedule(*args):
    start = time.perf_counter()
    out = original_schedule(*args)
    totals["schedule_s"] += time.perf_counter() - start
    return out
  def timed_run(*args):
    synchronize()
    start = time.perf_counter()
    original_run(*args)
    synchronize()
    totals["run_s"] += time.perf_counter() - start
  def timed_call(self, buffers, wait=False):
    elapsed = original_call(self, buffers, wait=True)
    totals["gpu_kernel_s"] += elapsed or 0.0
    totals["kernels"] += 1
  model.reset_cache(1, len(prompt) + DECODE_PROFILE_STEPS + 1)
  model(Tensor(np.array([prompt], np.int32), device=DEVICE), 0, last_only=True).numpy()
  realize_module.create_schedule, realize_module.run_schedule = timed_schedule, timed_run
  realize_module.CompiledKernel.__call__ = timed_call
  start = time.perf_counter()
  try:
    for k in range(DECODE_PROFILE_STEPS):
      model(Tensor(np.array([[prompt[-1]]], np.int32), device=DEVICE), len(prompt) + k, last_only=True).numpy()
  finally:
    realize_module.create_schedule, realize_module.run_schedule = original_schedule, original_run
    realize_module.CompiledKernel.__call__ = original_call
  step = (time.perf_counter() - start) / DECODE_PROFILE_STEPS
  per_step = {k: v / DECODE_PROFILE_STEPS for k, v in totals.items()}
  per_step["graph_building_and_other_s"] = step - per_step["schedule_s"] - per_step["run_s"]
  per_step["step_s (kernels timed one by one)"] = step
  return per_step

def hf_decode_speed(ref: str, torch_dtype, prompt: list[int], new_tokens: int) -> dict:
  """HF's generate() measured as tgrad's generate() reports itself, end to end: prefill = the prompt's forward pass and
  the first token (generate with 1 new token); decode = the other tokens over the time they add to it."""
  import torch
  from transformers import Gemma3ForCausalLM
  device = "cuda" if DEVICE == "CUDA" else "cpu"
  model = Gemma3ForCausalLM.from_pretrained(ref, dtype=torch_dtype, attn_implementation="eager").to(device).eval()
  ids = torch.tensor([prompt], device=device)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  def timed_generate(count: int) -> tuple[float, int]:
    sync()
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=count, min_new_tokens=count, do_sample=False)
    sync()
    return time.perf_counter() - start, out.shape[1] - len(prompt)
  with torch.no_grad():
    timed_generate(4)   # warm-up
    prefill, _ = timed_generate(1)
    total, generated = timed_generate(new_tokens)
  return {"prefill_s": prefill, "decode_tok_s": (generated - 1) / max(total - prefill, 1e-9)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("reference_dir")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--device", default="CUDA")
  args = parser.parse_args()
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
  for name, dt, tdt in (("float32", dtypes.float32, torch.float32), ("float16", dtypes.float16, torch.float16)):
    report[f"decode_{name}"] = {"tgrad": tgrad_decode_speed(ref, dt, prompt, args.new_tokens),
                                "hf_eager": hf_decode_speed(ref, tdt, prompt, args.new_tokens)}
    print(json.dumps(report), flush=True)
  report["decode_step_profile_float32"] = tgrad_decode_profile(ref, prompt)
  print(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
