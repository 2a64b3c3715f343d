"""Gemma 3's configuration: `Gemma3Config` (read from a Hugging Face config.json, with transformers' defaults where
a key is left out, validated), the named presets (google/gemma-3-270m and the reference harness's tiny model) and
`weight_shapes`, every checkpoint tensor a config implies. tgrad/models/gemma3.py builds the model from it.
"""
from __future__ import annotations
import json
from dataclasses import dataclass, field
from typing import Any, Optional
from tgrad.models.gemma3_cache import SLIDING, FULL, LAYER_TYPES

# transformers' Gemma3TextConfig defaults (configuration_gemma3.py), used where a config.json leaves a key out
DEFAULT_SLIDING_WINDOW_PATTERN = 6       # every 6th layer is global when `layer_types` is absent
DEFAULT_QUERY_PRE_ATTN_SCALAR = 256
DEFAULT_SLIDING_WINDOW = 4096
DEFAULT_ROPE_THETA = 1_000_000.0         # global (full-attention) layers
DEFAULT_ROPE_LOCAL_BASE_FREQ = 10_000.0  # sliding layers
DEFAULT_RMS_NORM_EPS = 1e-6
DEFAULT_ACTIVATION = "gelu_pytorch_tanh"
DEFAULT_MAX_POSITIONS = 131072
DEFAULT_BOS, DEFAULT_EOS, DEFAULT_PAD = 2, 1, 0
GELU_TANH_NAMES = ("gelu_pytorch_tanh", "gelu_new")   # both are 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
ROPE_TYPES = ("default", "linear")                    # what the Gemma 3 family uses; others raise

S, F = SLIDING, FULL
PRESETS: dict[str, dict[str, Any]] = {
  # google/gemma-3-270m's config.json (spec section 1)
  "270m": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
           "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
           "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
           "layer_types": [S, S, S, S, S, F] * 3, "_sliding_window_pattern": 6, "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-06,
           "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": None, "final_logit_softcapping": None,
           "attention_bias": False, "max_position_embeddings": 32768, "bos_token_id": 2, "eos_token_id": 1,
           "pad_token_id": 0, "torch_dtype": "bfloat16", "use_bidirectional_attention": False},
  # the reference harness's 'tiny': same structure, nq*D != H, query_pre_attn_scalar != head_dim, W = 8
  "tiny": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 512,
           "hidden_size": 80, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 48, "sliding_window": 8,
           "layer_types": [S, S, F, S], "_sliding_window_pattern": 3, "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-06,
           "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": None, "final_logit_softcapping": None,
           "attention_bias": False, "max_position_embeddings": 1024, "bos_token_id": 2, "eos_token_id": 1,
           "pad_token_id": 0, "torch_dtype": "bfloat16", "use_bidirectional_attention": False},
}



def _rope_entry(entry: Optional[dict], theta: float, where: str) -> tuple[float, float]:
  """(theta, linear factor) from one rope dict: {"rope_type": "default"|"linear", "factor": f, "rope_theta": t}."""
  if not entry: return theta, 1.0
  rope_type = entry.get("rope_type", entry.get("type", "default"))
  if rope_type not in ROPE_TYPES: raise ValueError(f"{where}: rope_type {rope_type!r} is not supported ({ROPE_TYPES})")
  factor = float(entry.get("factor", 1.0)) if rope_type == "linear" else 1.0
  if factor <= 0: raise ValueError(f"{where}: rope factor must be positive, got {factor}")
  return float(entry.get("rope_theta", theta)), factor

# sizes that must be ints >= 1 when a config gives them (0 layers or a negative vocabulary would fail far later)
POSITIVE_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "sliding_window", "max_position_embeddings")

def _check_positive_int(key: str, value: Any) -> None:
  """ValueError naming the key unless value is an int >= 1 (a float with an int value, as JSON may write, passes)."""
  integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
  if isinstance(value, bool) or not integral or value < 1:
    raise ValueError(f"config {key} must be a positive int, got {value!r}")

@dataclass(frozen=True)
class Gemma3Config:
  """Every size and switch of a Gemma 3 text model, read from an HF config.json by `from_dict`."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  query_pre_attn_scalar: float
  sliding_window: int
  layer_types: tuple[str, ...]
  rope_theta: dict[str, float]          # per layer type
  rope_factor: dict[str, float]         # linear RoPE scaling per layer type (1.0: none)
  rms_norm_eps: float = DEFAULT_RMS_NORM_EPS
  hidden_activation: str = DEFAULT_ACTIVATION
  final_logit_softcapping: Optional[float] = None
  attn_logit_softcapping: Optional[float] = None
  tie_word_embeddings: bool = True
  max_position_embeddings: int = DEFAULT_MAX_POSITIONS
  bos_token_id: int = DEFAULT_BOS
  eos_token_ids: tuple[int, ...] = (DEFAULT_EOS,)
  pad_token_id: int = DEFAULT_PAD
  extra: dict = field(default_factory=dict, compare=False, repr=False)   # the raw dict, for reference

  @staticmethod
  def from_dict(raw: dict) -> Gemma3Config:
    """Interpret a config dict as transformers 5.x does (spec 1.1): `layer_types` first, else every
    `sliding_window_pattern`-th layer is global; RoPE from `rope_parameters` (5.x) or the legacy keys
    `rope_theta` / `rope_local_base_freq` / `rope_scaling` (the last applies to global layers only)."""
    if "text_config" in raw: raw = {**raw["text_config"]}
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if raw.get(k) is None]
    if missing: raise ValueError(f"config is missing {missing}")
    for key in POSITIVE_INT_KEYS:
      if raw.get(key) is not None: _check_positive_int(key, raw[key])
    layers, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    if heads % kv_heads:
      raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
    if head_dim % 2: raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    if raw.get("use_bidirectional_attention"):
      raise ValueError("use_bidirectional_attention=true (EmbeddingGemma) is not supported")
    if raw.get("layer_types"): layer_types = tuple(raw["layer_types"])
    else:
      pattern = int(raw.get("sliding_window_pattern", DEFAULT_SLIDING_WINDOW_PATTERN))
      layer_types = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    if len(layer_types) != layers or any(t not in LAYER_TYPES for t in layer_types):
      raise ValueError(f"layer_types {list(layer_types)} must be {layers} entries of {LAYER_TYPES}")
    parameters = raw.get("rope_parameters")
    if isinstance(parameters, dict) and (SLIDING in parameters or FULL in parameters):
      ropes = {t: _rope_entry(parameters.get(t), DEFAULT_ROPE_THETA if t == FULL else DEFAULT_ROPE_LOCAL_BASE_FREQ,
                              f"rope_parameters[{t!r}]") for t in LAYER_TYPES}
    else:
      global_theta = float(raw.get("rope_theta") or DEFAULT_ROPE_THETA)
      if isinstance(parameters, dict): global_theta = float(parameters.get("rope_theta", global_theta))
      local_theta = float(raw.get("rope_local_base_freq") or DEFAULT_ROPE_LOCAL_BASE_FREQ)
      ropes = {FULL: _rope_entry(raw.get("rope_scaling"), global_theta, "rope_scaling"), SLIDING: (local_theta, 1.0)}
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or DEFAULT_ACTIVATION
    if activation not in GELU_TANH_NAMES:
      raise ValueError(f"hidden_activation {activation!r} is not supported; known: {GELU_TANH_NAMES}")
    eos = raw.get("eos_token_id", DEFAULT_EOS)
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]))
    def optional_float(key: str) -> Optional[float]: return float(raw[key]) if raw.get(key) is not None else None
    return Gemma3Config(
      vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
      intermediate_size=int(raw["intermediate_size"]), num_hidden_layers=layers, num_attention_heads=heads,
      num_key_value_heads=kv_heads, head_dim=head_dim,
      query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or DEFAULT_QUERY_PRE_ATTN_SCALAR),
      sliding_window=int(raw.get("sliding_window") or DEFAULT_SLIDING_WINDOW), layer_types=layer_types,
      rope_theta={t: ropes[t][0] for t in LAYER_TYPES}, rope_factor={t: ropes[t][1] for t in LAYER_TYPES},
      rms_norm_eps=float(raw.get("rms_norm_eps") or DEFAULT_RMS_NORM_EPS), hidden_activation=activation,
      final_logit_softcapping=optional_float("final_logit_softcapping"),
      attn_logit_softcapping=optional_float("attn_logit_softcapping"),
      tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
      max_position_embeddings=int(raw.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS),
      bos_token_id=int(raw.get("bos_token_id", DEFAULT_BOS)), eos_token_ids=eos_ids,
      pad_token_id=int(raw.get("pad_token_id", DEFAULT_PAD) or 0), extra=dict(raw))

  @staticmethod
  def from_json(path: str) -> Gemma3Config:
    with open(path) as f: return Gemma3Config.from_dict(json.load(f))

  @staticmethod
  def preset(name: str) -> Gemma3Config:
    if name not in PRESETS: raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return Gemma3Config.from_dict(PRESETS[name])

def weight_shapes(config: Gemma3Config) -> dict[str, tuple[int, ...]]:
  """Every checkpoint tensor (HF names, PyTorch [out, in] layout) and its shape."""
  H, D, I = config.hidden_size, config.head_dim, config.intermediate_size
  q_width, kv_width = config.num_attention_heads * D, config.num_key_value_heads * D
  shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, H)}
  for i in range(config.num_hidden_layers):
    p = f"model.layers.{i}."
    shapes.update({
      p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (q_width, H),
      p + "self_attn.k_proj.weight": (kv_width, H), p + "self_attn.v_proj.weight": (kv_width, H),
      p + "self_attn.o_proj.weight": (H, q_width), p + "self_attn.q_norm.weight": (D,),
      p + "self_attn.k_norm.weight": (D,), p + "post_attention_layernorm.weight": (H,),
      p + "pre_feedforward_layernorm.weight": (H,), p + "mlp.gate_proj.weight": (I, H),
      p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
      p + "post_feedforward_layernorm.weight": (H,)})
  shapes["model.norm.weight"] = (H,)
  if not config.tie_word_embeddings: shapes["lm_head.weight"] = (config.vocab_size, H)
  return shapes
