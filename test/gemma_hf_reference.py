"""What Hugging Face transformers computes for a small random Gemma 3 checkpoint: the reference the Gemma tests compare
tgrad with. Needs torch, transformers and safetensors (all in the `test` extra); nothing outside the repository.

`write_reference(directory, config, prompt, decode_tokens)`:
  1. draws seeded random weights (norm scales around 0, embeddings and projections scaled by 1/sqrt(fan-in) so the
     activations stay O(1)), rounds them to bfloat16 as the real checkpoints are stored, and writes a Hub-style
     checkpoint: config.json and model.safetensors (no lm_head.weight: it is tied to the embeddings);
  2. loads that directory back with `Gemma3ForCausalLM.from_pretrained` in float32 with eager (plain math) attention,
     so the reference is what HF computes from exactly those files;
  3. runs the prompt and saves prefill_logits.npy [T, V] and prefill_hidden.npy [L+2, T, H] (0: the scaled
     embeddings, 1..L: each decoder layer's output, L+1: the final norm's output), then decodes greedily with HF's KV
     cache: decode_ids.npy [N] and decode_logits.npy [N, V], row k being the logits whose argmax is decode_ids[k]
     (row 0 from the prefill's last position, row k >= 1 from the cached step of decode_ids[k-1] at T + k - 1).
"""
from __future__ import annotations
import json, math, os
from pathlib import Path
import numpy as np

NORM_SCALE_STD = 0.2        # the (1 + w) RMSNorm scales: w ~ N(0, 0.2²)
STORAGE_DTYPE = "bfloat16"  # as google/gemma-3-270m's model.safetensors
NEEDS = ("torch", "transformers", "safetensors")

def random_model(config: dict, seed: int):
  """A Gemma3ForCausalLM in float32 whose weights are seeded random values already rounded to STORAGE_DTYPE."""
  import torch
  from transformers import Gemma3ForCausalLM, Gemma3TextConfig
  model = Gemma3ForCausalLM(Gemma3TextConfig.from_dict(dict(config))).to(torch.float32).eval()
  generator = torch.Generator().manual_seed(seed)
  storage = getattr(torch, STORAGE_DTYPE)
  with torch.no_grad():
    for name, weight in model.named_parameters():   # the tied lm_head is the embedding's parameter: listed once
      if weight.ndim == 1: value = torch.randn(weight.shape, generator=generator) * NORM_SCALE_STD
      elif name == "model.embed_tokens.weight":
        value = torch.randn(weight.shape, generator=generator) / math.sqrt(config["hidden_size"])
      else: value = torch.randn(weight.shape, generator=generator) / math.sqrt(weight.shape[1])   # [out, in]
      weight.copy_(value.to(storage).to(torch.float32))
  if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
    raise RuntimeError("this transformers version does not tie Gemma 3's LM head to the embeddings")
  return model

def save_checkpoint(model, config: dict, directory: Path) -> None:
  import torch, transformers
  from safetensors.torch import save_file
  storage = getattr(torch, STORAGE_DTYPE)
  tensors = {name: value.detach().to(storage).contiguous() for name, value in model.state_dict().items()
             if name != "lm_head.weight"}
  save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
  hub_config = {**config, "torch_dtype": STORAGE_DTYPE, "transformers_version": transformers.__version__}
  (directory / "config.json").write_text(json.dumps(dict(sorted(hub_config.items())), indent=2) + "\n")

def prefill(model, prompt: list[int]):
  """HF's forward over the prompt: (its output, with the KV cache; the hidden states [L+2, T, H])."""
  import torch
  captured: list = []
  def keep(_module, _inputs, output):
    captured.append((output[0] if isinstance(output, tuple) else output).detach().float()[0].clone())
  modules = [model.model.embed_tokens, *model.model.layers, model.model.norm]   # the embedding applies its scale
  hooks = [m.register_forward_hook(keep) for m in modules]
  try:
    with torch.no_grad(): out = model(input_ids=torch.tensor([prompt]), use_cache=True)
  finally:
    for hook in hooks: hook.remove()
  return out, torch.stack(captured).numpy()

def greedy_decode(model, prefill_out, count: int) -> tuple[list[int], np.ndarray]:
  import torch
  cache, logits = prefill_out.past_key_values, prefill_out.logits[0, -1].float()
  ids, rows = [], []
  with torch.no_grad():
    for step in range(count):
      ids.append(int(torch.argmax(logits)))
      rows.append(logits.numpy().copy())
      if step == count - 1: break
      out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=cache, use_cache=True)
      cache, logits = out.past_key_values, out.logits[0, -1].float()
  return ids, np.stack(rows)

def write_reference(directory: Path, config: dict, prompt: list[int], decode_tokens: int, seed: int = 0) -> Path:
  """Write the checkpoint and HF's outputs (see the module docstring) into `directory`; returns it."""
  os.environ.setdefault("HF_HUB_OFFLINE", "1")   # local files only
  import torch
  from transformers import Gemma3ForCausalLM
  directory.mkdir(parents=True, exist_ok=True)
  save_checkpoint(random_model(config, seed), config, directory)
  model = Gemma3ForCausalLM.from_pretrained(str(directory), dtype=torch.float32, attn_implementation="eager").eval()
  out, hidden = prefill(model, prompt)
  np.save(directory / "prefill_logits.npy", out.logits[0].float().numpy())
  np.save(directory / "prefill_hidden.npy", hidden.astype(np.float32))
  ids, rows = greedy_decode(model, out, decode_tokens)
  np.save(directory / "decode_ids.npy", np.array(ids, np.int64))
  np.save(directory / "decode_logits.npy", rows.astype(np.float32))
  return directory
