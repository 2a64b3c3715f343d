"""Where a Gemma 3 model's weights come from: a Hugging Face checkpoint folder (config.json and model.safetensors, or
a sharded index whose shards must lie inside the folder), read into host memory and moved to the device once, or
seeded random weights drawn on the device; both checked against the config's names and shapes (`check_weights`).

Input: a folder or a Gemma3Config; output: a dict of HF weight names to realized Tensors, which `Gemma3`
(tgrad/models/gemma3.py) builds its layers from.
"""
from __future__ import annotations
import json, math, os, sys
from typing import Any, Mapping, Optional
from tgrad.tensor import Tensor
from tgrad.dtype import to_dtype
from tgrad.device import canonical_device
from tgrad.nn.state import safe_load
from tgrad.models.gemma3_config import Gemma3Config, weight_shapes

# random weights with the reference harness's standard deviations: embeddings 1/sqrt(H) (scaled inputs ~ unit
# variance), linears 1/sqrt(fan_in), norm offsets 0.2 (so the (1 + w) form is exercised)
RANDOM_NORM_STD = 0.2

def check_weights(config: Gemma3Config, weights: Mapping[str, Any], source: str) -> None:
  """ValueError naming the missing tensors and the wrong shapes, if any (`source`: where the weights came from)."""
  expected = weight_shapes(config)
  missing = [name for name in expected if name not in weights]
  wrong = [f"{name}: expected {expected[name]}, got {tuple(weights[name].shape)}" for name in expected
           if name in weights and tuple(weights[name].shape) != expected[name]]
  if missing or wrong:
    parts = [f"missing tensors {missing}"] if missing else []
    if wrong: parts.append(f"wrong shapes: {'; '.join(wrong)}")
    raise ValueError(f"{source}: {' and '.join(parts)}")

def checkpoint_weights(directory: str, dtype: Any, device: Optional[str],
                       progress: bool) -> tuple[Gemma3Config, dict[str, Tensor]]:
  """The config and the weights of an HF checkpoint folder: every tensor read into host memory (safe_load), moved to
  the device once and cast to `dtype` there; tensors the model does not use are reported and dropped."""
  config_path = os.path.join(directory, "config.json")
  if not os.path.isfile(config_path): raise FileNotFoundError(f"{directory}: no config.json")
  config = Gemma3Config.from_json(config_path)
  tensors: dict[str, Tensor] = {}
  for path in checkpoint_files(directory): tensors.update(safe_load(path, device))
  check_weights(config, tensors, directory)
  unexpected = sorted(set(tensors) - set(weight_shapes(config)) - {"lm_head.weight"})
  if unexpected:
    print(f"gemma3: ignoring {len(unexpected)} unexpected tensors, e.g. {unexpected[:3]}", file=sys.stderr)
  dtype, device = to_dtype(dtype), canonical_device(device)
  weights = {}
  for name in progress_bar(list(weight_shapes(config)), progress, "loading weights"):
    weights[name] = tensors.pop(name).to(device).cast(dtype).realize()
  return config, weights

def random_weights(config: Gemma3Config, dtype: Any, device: Optional[str], seed: int,
                   progress: bool) -> dict[str, Tensor]:
  """Seeded random weights drawn on the device. Uniform rather than normal: Tensor.uniform schedules and runs about 3x
  faster than Box-Muller's Tensor.normal, and the model only needs the right scale (the output is meaningless either
  way)."""
  dtype, device = to_dtype(dtype), canonical_device(device)
  Tensor.manual_seed(seed)
  weights = {}
  for name, shape in progress_bar(list(weight_shapes(config).items()), progress, "random weights"):
    if len(shape) == 1: std = RANDOM_NORM_STD
    elif name.endswith("embed_tokens.weight") or name == "lm_head.weight": std = config.hidden_size ** -0.5
    else: std = shape[1] ** -0.5
    bound = std * math.sqrt(3)   # a uniform in ±√3·std has standard deviation std
    weights[name] = Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device).realize()
  return weights

def checkpoint_files(directory: str) -> list[str]:
  """The safetensors files of a checkpoint folder: model.safetensors, or the shards its index names."""
  single = os.path.join(directory, "model.safetensors")
  if os.path.isfile(single): return [single]
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.isfile(index): return index_shards(directory, index)
  raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")

def index_shards(directory: str, index: str) -> list[str]:
  """The shard files an index's weight_map names, each resolved (links followed) and required to stay inside the
  model folder: an index must not make the loader open files elsewhere."""
  with open(index) as f:
    try: weight_map = json.load(f).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
      raise ValueError(f"{index}: not a JSON object ({e})") from None
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f"{index}: needs a non-empty 'weight_map' object of tensor name -> shard file")
  if bad := [name for name, shard in weight_map.items() if not isinstance(shard, str)]:
    raise ValueError(f"{index}: weight_map entries must be file names, not {weight_map[bad[0]]!r} (for {bad[0]!r})")
  folder = os.path.realpath(directory)
  shards = []
  for shard in sorted(set(weight_map.values())):
    path = os.path.realpath(os.path.join(folder, shard))
    if os.path.commonpath([folder, path]) != folder or path == folder:
      raise ValueError(f"{index}: shard {shard!r} is outside the model folder {folder}")
    shards.append(path)
  return shards

def progress_bar(items: list, enabled: bool, label: str):
  """`items` behind a tqdm bar on stderr when enabled and tqdm is installed, else as they are."""
  if not enabled: return items
  try: from tqdm import tqdm
  except ImportError: return items
  return tqdm(items, desc=label, unit="tensor", leave=False, file=sys.stderr)
