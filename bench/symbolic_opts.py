"""The GPU opts the heuristics choose for every symbolic kernel of Gemma 3 (prefill with a symbolic prompt length,
decode over the filled cache slots), without a GPU: the model runs on LLVM (random weights, two layers: one sliding,
one full-attention) and each kernel AST with a variable is optimized for the CUDA renderer.

Prints one Markdown table row per kernel: the unoptimized name, the name after the opts (what a profile shows), the
opts, and the launch dims at the given values (a prompt of --prompt-len tokens, decode at --position).
Usage: python bench/symbolic_opts.py [--preset 270m] [--cache 4096] [--prompt-len 520] [--position 1999]
"""
from __future__ import annotations
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.runtime.cuda.renderer import CUDARenderer  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.kernel import Kernel  # noqa: E402
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS  # noqa: E402
from tgrad.shape.sint import evaluate  # noqa: E402
import tgrad.realize as realize_module  # noqa: E402

PROMPT_TOKENS = 20      # the prompt the model runs (its kernels serve every length)
DECODE_STEPS = 2
SMALL_VOCABULARY = 1024  # the head is a concrete matvec: its size doesn't matter here

def symbolic_asts(preset: str, cache: int) -> list:
  """The kernel ASTs with variables of a jitted prefill and a few greedy decode steps."""
  asts: dict = {}
  get_runner = realize_module.get_runner
  def recording(device, ast, *rest):
    asts.setdefault(ast.key, ast)
    return get_runner(device, ast, *rest)
  realize_module.get_runner = recording
  try:
    config = {**PRESETS[preset], "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
              "vocab_size": SMALL_VOCABULARY,
              "max_position_embeddings": max(cache, PRESETS[preset]["max_position_embeddings"])}
    model = Gemma3.random(Gemma3Config.from_dict(config), dtypes.float32, "LLVM", seed=0, progress=False)
    model.reset_cache(1, cache)
    prompt = Tensor(np.arange(3, 3 + PROMPT_TOKENS, dtype=np.int32).reshape(1, -1), device="LLVM")
    token = int(model(prompt, 0, last_only=True, jit=True).numpy()[0, -1].argmax())
    for _ in model.greedy_tokens([token], DECODE_STEPS): pass
  finally:
    realize_module.get_runner = get_runner
  return [ast for ast in asts.values() if Kernel(ast, CUDARenderer()).symbolic]

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="270m", choices=sorted(PRESETS))
  parser.add_argument("--cache", type=int, default=4096)
  parser.add_argument("--prompt-len", type=int, default=520)
  parser.add_argument("--position", type=int, default=1999)
  args = parser.parse_args()
  ring = PRESETS[args.preset]["sliding_window"]
  values = {"prompt_len": args.prompt_len, "position": args.position, "ring_filled": min(args.position + 1, ring),
            "ring_slot": args.position % ring}
  print("| kernel | after opts | opts | grid | block |\n|---|---|---|---|---|")
  for ast in symbolic_asts(args.preset, args.cache):
    kernel = Kernel(ast, CUDARenderer())
    name = kernel.name
    hand_coded_optimizations(kernel)
    global_size, local_size = kernel.launch_dims()
    grid = tuple(evaluate(g, values) for g in global_size)
    opts = ", ".join(f"{o.op.name} {o.axis} {o.amount}" for o in kernel.applied_opts)
    print(f"| `{name}` | `{kernel.name}` | {opts} | {grid} | {local_size} |")

if __name__ == "__main__":
  main()
