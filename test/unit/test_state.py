"""tgrad.nn.state: safetensors files (checked against the `safetensors` package both ways), loading as a snapshot
(test/unit/test_file_snapshot.py has the rewrite, truncation and deletion cases), corrupted files, and state dicts
(discovery on nested objects, strict and non-strict loading in place)."""
import json, struct
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as numpy_save_file, load_file as numpy_load_file
from safetensors.torch import save_file as torch_save_file, load_file as torch_load_file
from tgrad import Tensor, dtypes
from tgrad.ops import Ops
import tgrad.nn as nn
from tgrad.nn.state import (SafetensorsError, safe_save, safe_load, safe_load_metadata, get_state_dict,
                            get_parameters, load_state_dict)

RNG = np.random.default_rng(0)
TORCH_DTYPES = {dtypes.float32: torch.float32, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
                dtypes.float64: torch.float64, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8,
                dtypes.int16: torch.int16, dtypes.int32: torch.int32, dtypes.int64: torch.int64,
                dtypes.bool: torch.bool}

def _values(dtype, shape=(3, 4)) -> np.ndarray:
  if dtype == dtypes.bool: return RNG.random(shape) < 0.5
  if dtype.is_int: return RNG.integers(dtypes.min(dtype), dtypes.max(dtype), shape, endpoint=True, dtype=dtype.np)
  return RNG.standard_normal(shape).astype(np.float32)   # floats go through float32, then are rounded by the cast

@pytest.mark.parametrize("dtype", list(TORCH_DTYPES), ids=lambda d: d.name)
def test_round_trip_with_the_safetensors_package(tmp_path, dtype):
  values = _values(dtype)
  ours = Tensor(values).cast(dtype)
  safe_save({"t": ours, "scalar": ours[0, 0], "empty": ours[:0]}, str(tmp_path / "ours.safetensors"),
            metadata={"format": "pt"})
  read_by_them = torch_load_file(str(tmp_path / "ours.safetensors"))
  want = torch.tensor(values).to(TORCH_DTYPES[dtype])
  assert read_by_them["t"].dtype == TORCH_DTYPES[dtype] and read_by_them["empty"].shape == (0, 4)
  assert torch.equal(read_by_them["t"], want) and torch.equal(read_by_them["scalar"], want[0, 0])
  torch_save_file({"t": want, "empty": want[:0]}, str(tmp_path / "theirs.safetensors"))
  read_by_us = safe_load(str(tmp_path / "theirs.safetensors"))
  assert read_by_us["t"].dtype == dtype and read_by_us["empty"].shape == (0, 4)
  np.testing.assert_array_equal(read_by_us["t"].numpy(), want.float().numpy() if dtype == dtypes.bfloat16 else
                                want.numpy())
  assert safe_load_metadata(str(tmp_path / "ours.safetensors")) == {"format": "pt"}

@pytest.mark.parametrize("dtype", [dtypes.uint16, dtypes.uint32, dtypes.uint64], ids=lambda d: d.name)
def test_unsigned_round_trip_with_safetensors_numpy(tmp_path, dtype):   # torch lacks most unsigned types
  values = _values(dtype)
  safe_save({"t": Tensor(values)}, str(tmp_path / "ours.safetensors"))
  np.testing.assert_array_equal(numpy_load_file(str(tmp_path / "ours.safetensors"))["t"], values)
  numpy_save_file({"t": values}, str(tmp_path / "theirs.safetensors"))
  read_by_us = safe_load(str(tmp_path / "theirs.safetensors"))["t"]
  assert read_by_us.dtype == dtype
  np.testing.assert_array_equal(read_by_us.numpy(), values)

def test_loading_is_a_snapshot(tmp_path):
  """The loaded tensors hold the bytes read at load: rewriting the file in place afterwards changes nothing."""
  path = tmp_path / "snapshot.safetensors"
  torch_save_file({"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2, dtype=torch.bfloat16)}, str(path))
  loaded = safe_load(str(path))
  for t in loaded.values():
    lb = t.lazydata
    assert lb.op is Ops.COPY and lb.buffer is None and type(lb.arg) is np.ndarray and type(lb.arg.base) is np.ndarray
  header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
  with open(path, "r+b") as f:
    f.seek(8 + header_length)
    f.write(np.full(6, 9.0, np.float32).tobytes())
  assert loaded["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and loaded["b"].tolist() == [1.0, 1.0]

def _write_raw(path, header, data: bytes = b"", header_length=None) -> str:
  encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
  length = len(encoded) if header_length is None else header_length
  path.write_bytes(struct.pack("<Q", length) + encoded + data)
  return str(path)

ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CORRUPTIONS = [  # id, header, data, header length override, words the message must contain
  ("too_short", None, b"", None, "too short"),
  ("header_past_end", {"t": ENTRY}, bytes(8), 10_000, "past the end"),
  ("huge_header_length", {"t": ENTRY}, bytes(8), 1 << 62, "exceeds"),
  ("not_json", b"{not json", b"", None, "not JSON"),
  ("not_an_object", [1, 2], b"", None, "JSON object"),
  ("unknown_dtype", {"t": {**ENTRY, "dtype": "F8_E9"}}, bytes(8), None, "unknown dtype"),
  ("offsets_past_end", {"t": {**ENTRY, "data_offsets": [0, 8]}}, bytes(4), None, "outside"),
  ("truncated_data", {"t": ENTRY, "u": {**ENTRY, "data_offsets": [8, 16]}}, bytes(12), None, "outside"),
  ("negative_offset", {"t": {**ENTRY, "data_offsets": [-4, 4]}}, bytes(8), None, "outside"),
  ("reversed_offsets", {"t": {**ENTRY, "data_offsets": [8, 0]}}, bytes(8), None, "outside"),
  ("shape_bytes_mismatch", {"t": {**ENTRY, "shape": [3]}}, bytes(8), None, "needs 12"),
  ("bad_shape", {"t": {**ENTRY, "shape": [-2]}}, bytes(8), None, "bad shape"),
  ("missing_key", {"t": {"dtype": "F32", "shape": [2]}}, bytes(8), None, "data_offsets"),
]

@pytest.mark.parametrize("name, header, data, header_length, message", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupted_files_raise_a_clear_error(tmp_path, name, header, data, header_length, message):
  path = tmp_path / f"{name}.safetensors"
  if header is None: path.write_bytes(b"\x01\x02")
  else: _write_raw(path, header, data, header_length)
  with pytest.raises(SafetensorsError, match=message) as error: safe_load(str(path))
  assert isinstance(error.value, ValueError) and str(path) in str(error.value)

# ---- state dicts

class _Net:
  def __init__(self):
    self.features = [nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)]
    self.head = {"fc": nn.Linear(8, 2)}
    self.tied = self.head["fc"].weight        # the same Tensor under a second name
    self.name, self.depth = "net", 2           # non-Tensor attributes are skipped

def test_get_state_dict_and_parameters_on_nested_objects():
  net = _Net()
  names = list(get_state_dict(net))
  assert names == ["features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                   "features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked",
                   "head.fc.weight", "head.fc.bias", "tied"]
  parameters = get_parameters(net)
  assert len(parameters) == len(names) - 1 and parameters[-1] is net.head["fc"].bias   # `tied` counted once

def test_load_state_dict_strict_and_in_place(tmp_path):
  source, target = nn.Linear(3, 2), nn.Linear(3, 2)
  target.weight.realize()
  weight_tensor, weight_buffer = target.weight, target.weight.lazydata.base.buffer
  safe_save(get_state_dict(source), str(tmp_path / "linear.safetensors"))
  load_state_dict(target, safe_load(str(tmp_path / "linear.safetensors")))
  assert target.weight is weight_tensor and target.weight.lazydata.base.buffer is weight_buffer   # written in place
  np.testing.assert_array_equal(target.weight.numpy(), source.weight.numpy())
  np.testing.assert_array_equal(target.bias.numpy(), source.bias.numpy())

def test_load_state_dict_errors_and_non_strict():
  model = nn.Linear(3, 2)
  before = model.bias.numpy()
  weight = np.ones((2, 3), np.float32)
  with pytest.raises(RuntimeError, match="missing key.*bias"): load_state_dict(model, {"weight": Tensor(weight)})
  with pytest.raises(RuntimeError, match="unexpected key.*extra"):
    load_state_dict(model, {"weight": Tensor(weight), "bias": Tensor.zeros(2), "extra": Tensor.zeros(1)})
  with pytest.raises(RuntimeError, match=r"size mismatch for weight.*\(2, 3\).*\(3, 2\)"):
    load_state_dict(model, {"weight": Tensor.ones(3, 2)}, strict=False)
  load_state_dict(model, {"weight": Tensor(weight, dtype=dtypes.float16), "extra": Tensor.zeros(1)}, strict=False)
  assert model.weight.dtype == dtypes.float32   # cast to the parameter's dtype
  np.testing.assert_array_equal(model.weight.numpy(), weight)
  np.testing.assert_array_equal(model.bias.numpy(), before)   # not given: left alone

def test_a_model_survives_a_save_and_load(tmp_path):
  Tensor.manual_seed(0)
  net, copy = _Net(), _Net()
  x = Tensor(RNG.standard_normal((1, 1, 4, 4)).astype(np.float32))
  def forward(model):
    features = model.features[1](model.features[0](x)).relu().reshape(1, -1)
    return model.head["fc"](features)
  safe_save(get_state_dict(net), str(tmp_path / "net.safetensors"))
  load_state_dict(copy, safe_load(str(tmp_path / "net.safetensors")))
  # the two forwards may fuse differently (loaded weights arrive through an assign), so allow float32 rounding
  np.testing.assert_allclose(forward(copy).numpy(), forward(net).numpy(), rtol=1e-6, atol=1e-6)
