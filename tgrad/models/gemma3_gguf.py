"""Gemma 3 from a GGUF file (llama.cpp's format): its config, its tensor names, and two ways to hold quantized weights.

Input: a .gguf path whose `general.architecture` is `gemma3` (e.g. gemma-3-270m Q4_K_M). Output: `load_gemma3_gguf`
→ (`Gemma3`, the file's metadata), the model equal to transformers' `from_pretrained(..., gguf_file=...)` of the file.
- Config: the `gemma3.*` keys (`config_from_gguf`). What the file leaves out comes from transformers' Gemma3TextConfig
  defaults, as its GGUF loader and llama.cpp take them: sliding layers use RoPE base 10,000 (`rope.freq_base` is the
  global layers' 1,000,000), every 6th layer is global, and the attention scale is head_dim^-0.5.
- Names: `blk.N.attn_q.weight` → `model.layers.N.self_attn.q_proj.weight` and so on (GGUF_TO_HF); llama.cpp does not
  permute Gemma's q/k rows, and [out, in] shapes are the checkpoint's.
- Norms: llama.cpp stores Gemma's RMSNorm weights as 1 + w (convert_hf_to_gguf adds 1); 1 is subtracted here in
  float32, as transformers does, and the norm weights stay float32 whatever the compute dtype.
- `quant="dequant"`: every block-quantized tensor is dequantized once at load into the compute dtype. `quant="packed"`:
  the projections and the embedding stay QuantizedTensors (their blocks, on the device); every projection dequantizes
  inside its matmul each step and the embedding dequantizes only the gathered rows (gemma3.py: `project`,
  `weight_values`, `Gemma3Embedding.rows`).
- The file is read as a snapshot (tgrad/nn/file_snapshot.py): all its bytes are copied at load into memory this
  process owns, so rewriting or deleting the file later changes nothing (docs/gemma.md has the measured cost).
"""
from __future__ import annotations
import re
from typing import Any, Optional, Union
import numpy as np
from tgrad.tensor import Tensor
from tgrad.dtype import dtypes, to_dtype
from tgrad.device import canonical_device
from tgrad.nn.file_snapshot import FileSnapshot
from tgrad.nn.gguf import GGUFError, GGUFFile
from tgrad.nn.quant import DEQUANTIZERS, PLAIN_DTYPES, QuantizedTensor, held_type
from tgrad.models.gemma3 import Gemma3, Gemma3Config, Weight, weight_shapes

ARCHITECTURE = "gemma3"
QUANT_MODES = ("dequant", "packed")
# transformers' Gemma3TextConfig defaults for what a gemma3 GGUF file does not say (its GGUF loader keeps them too)
LOCAL_ROPE_BASE = 10_000.0
SLIDING_WINDOW_PATTERN = 6
# llama.cpp scales Gemma 3 27B's attention by (hidden / heads)^-0.5 (its query_pre_attn_scalar, 168), every other
# size by head_dim^-0.5 (llama-model.cpp, LLM_ARCH_GEMMA3); 27B is the one with 62 blocks
GEMMA3_27B_BLOCKS = 62
NORM_SUFFIX = "norm.weight"      # llama.cpp's Gemma norm weights: stored as 1 + w
LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

GGUF_TO_HF = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
GGUF_LAYER_TO_HF = {
  "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
  "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
  "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm"}

def hf_name(gguf_name: str) -> str:
  """The Hugging Face checkpoint name of a gemma3 GGUF tensor; GGUFError for a name Gemma 3 does not have."""
  if gguf_name in GGUF_TO_HF: return GGUF_TO_HF[gguf_name]
  match = LAYER_NAME.fullmatch(gguf_name)
  if match is None or match.group(2) not in GGUF_LAYER_TO_HF:
    raise GGUFError(f"tensor {gguf_name!r} is not part of a Gemma 3 text model")
  return f"model.layers.{match.group(1)}.{GGUF_LAYER_TO_HF[match.group(2)]}.weight"

def _metadata_int(metadata: dict, key: str) -> int:
  """An integer `gemma3.<key>`; an array must hold one value for every layer (what Gemma 3 has)."""
  full = f"{ARCHITECTURE}.{key}"
  if full not in metadata: raise GGUFError(f"GGUF metadata has no {full}")
  value = metadata[full]
  if isinstance(value, np.ndarray):
    if value.size == 0 or (value != value.flat[0]).any():
      raise GGUFError(f"{full} differs between layers ({value.tolist()}); Gemma 3 has one value")
    value = value.flat[0]
  if isinstance(value, (bool, str, list)) or int(value) != value:
    raise GGUFError(f"{full} must be an integer, got {value!r}")
  return int(value)

def config_from_gguf(metadata: dict, embedding_shape: tuple[int, ...], has_output: bool = False) -> Gemma3Config:
  """A Gemma3Config from gemma3 GGUF metadata; the vocabulary is the embedding's rows (the tokenizer may list more
  ids). `has_output`: the file has its own LM head (`output.weight`), so the embedding is not tied."""
  if metadata.get("general.architecture") != ARCHITECTURE:
    raise GGUFError(f"general.architecture is {metadata.get('general.architecture')!r}, expected {ARCHITECTURE!r}")
  head_dim = _metadata_int(metadata, "attention.key_length")
  value_dim = _metadata_int(metadata, "attention.value_length")
  if value_dim != head_dim:
    raise GGUFError(f"attention.key_length {head_dim} != attention.value_length {value_dim}; Gemma 3 has one head_dim")
  hidden, heads = _metadata_int(metadata, "embedding_length"), _metadata_int(metadata, "attention.head_count")
  blocks = _metadata_int(metadata, "block_count")
  if len(embedding_shape) != 2 or embedding_shape[1] != hidden:
    raise GGUFError(f"token_embd.weight has shape {embedding_shape}, expected [vocab, {hidden}]")
  raw: dict[str, Any] = {
    "vocab_size": embedding_shape[0], "hidden_size": hidden,
    "intermediate_size": _metadata_int(metadata, "feed_forward_length"), "num_hidden_layers": blocks,
    "num_attention_heads": heads, "num_key_value_heads": _metadata_int(metadata, "attention.head_count_kv"),
    "head_dim": head_dim, "query_pre_attn_scalar": hidden // heads if blocks == GEMMA3_27B_BLOCKS else head_dim,
    "sliding_window": _metadata_int(metadata, "attention.sliding_window"),
    "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
    "rope_theta": float(metadata.get(f"{ARCHITECTURE}.rope.freq_base", 0)) or None,
    "rope_local_base_freq": LOCAL_ROPE_BASE,
    "rms_norm_eps": float(metadata.get(f"{ARCHITECTURE}.attention.layer_norm_rms_epsilon", 0)) or None,
    "max_position_embeddings": _metadata_int(metadata, "context_length"),
    "tie_word_embeddings": not has_output}
  scaling = metadata.get(f"{ARCHITECTURE}.rope.scaling.type")
  if scaling not in (None, "none"):
    factor = float(metadata.get(f"{ARCHITECTURE}.rope.scaling.factor", 1))
    raw["rope_scaling"] = {"rope_type": scaling, "factor": factor}
  for ours, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id")):
    if f"tokenizer.ggml.{key}" in metadata: raw[ours] = int(metadata[f"tokenizer.ggml.{key}"])
  try: return Gemma3Config.from_dict(raw)
  except ValueError as e: raise GGUFError(f"GGUF metadata is not a Gemma 3 config: {e}") from None

def read_snapshot(path: str) -> np.ndarray:
  """The whole file as an owned uint8 array (GGUFFile's data source): a snapshot, never a memory map."""
  with FileSnapshot(path) as snapshot: return snapshot.read(0, snapshot.size)

def load_gemma3_gguf(path: str, quant: str = "dequant", dtype: Any = dtypes.float32, device: Optional[str] = None
                     ) -> tuple[Gemma3, dict]:
  """(model, metadata) from a gemma3 GGUF file. `quant`: "dequant" (block-quantized tensors dequantized once into
  `dtype`) or "packed" (projections and the embedding kept as their blocks; `dtype` is then the compute dtype).
  Every weight is realized on `device` before this returns; the file's bytes are not kept."""
  if quant not in QUANT_MODES: raise ValueError(f"quant must be one of {QUANT_MODES}, got {quant!r}")
  dtype, device = to_dtype(dtype), canonical_device(device)
  if not dtype.is_float: raise ValueError(f"the compute dtype must be a float dtype, got {dtype}")
  gguf = GGUFFile(path, expect_architecture=ARCHITECTURE, data_source=read_snapshot)
  if "token_embd.weight" not in gguf.tensors: raise GGUFError(f"{gguf.path}: no token_embd.weight")
  config = config_from_gguf(gguf.metadata, gguf.tensors["token_embd.weight"].shape, "output.weight" in gguf.tensors)
  unusable = [f"{info.name} ({info.ggml_type.name})" for info in gguf.tensors.values()
              if info.ggml_type not in PLAIN_DTYPES and info.ggml_type not in DEQUANTIZERS]
  if unusable: raise GGUFError(f"{gguf.path}: tgrad cannot dequantize {unusable[:5]}")
  names = {hf_name(name): name for name in gguf.tensors}
  missing = sorted(set(weight_shapes(config)) - set(names))
  if missing: raise GGUFError(f"{gguf.path}: missing tensors {[_gguf_name(n, names) for n in missing][:5]}")
  weights: dict[str, Weight] = {}
  for name, gguf_name in names.items():
    weights[name] = _load_weight(gguf.tensor(gguf_name, device), gguf_name, quant, dtype).realize()
  metadata = gguf.metadata
  del gguf   # the snapshot: every weight now lives on the device
  return Gemma3(config, weights, dtype), metadata

def _gguf_name(name: str, names: dict[str, str]) -> str:
  reverse = {hf: gguf for gguf, hf in GGUF_TO_HF.items()}
  return names.get(name, reverse.get(name, name))

def _load_weight(loaded: Union[Tensor, QuantizedTensor], gguf_name: str, quant: str, dtype: Any) -> Weight:
  """One tensor as the model holds it: norms as float32 offsets w (the file's 1 + w, minus 1), projections and the
  embedding in `dtype`, or packed (in the type the device holds it in: nn/quant.py held_type)."""
  if gguf_name.endswith(NORM_SUFFIX):
    values = loaded.dequantize(dtypes.float32) if isinstance(loaded, QuantizedTensor) else loaded.float()
    return values - 1.0
  if isinstance(loaded, QuantizedTensor):
    if quant != "packed": return loaded.dequantize(dtype)
    held = held_type(loaded.ggml_type, loaded.device)
    return loaded if held == loaded.ggml_type else loaded.widened(held)
  return loaded.cast(dtype)

def weight_nbytes(model: Gemma3) -> int:
  """Bytes of the device buffers that hold the model's weights (each buffer counted once: stacked projections are
  views of one buffer)."""
  buffers = {}
  for weight in model.state_dict().values():
    tensor = weight.storage if isinstance(weight, QuantizedTensor) else weight
    buffer = tensor.lazydata.base.buffer
    if buffer is None: raise ValueError(f"weight {weight} is not realized")
    buffer = buffer.base or buffer
    buffers[id(buffer)] = buffer.nbytes
  return sum(buffers.values())
